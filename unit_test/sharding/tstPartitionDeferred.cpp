/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// docs/router.md §14 under AddressSanitizer: every stored shard callable is invoked after the mesh, spec, shardings
// and builder temporaries it was made from are destroyed, and must reproduce the eager result bitwise. Built
// twice (unit_test/sharding/CMakeLists.txt), both with -fsanitize=address and run with
// ASAN_OPTIONS=detect_stack_use_after_return=1:
//  * KokkosMoE_PartitionDeferred_ASan: the library as shipped; must pass.
//  * KokkosMoE_PartitionDeferred_Dangling: compiled with KOKKOSMOE_TEST_DANGLING_PARTITION_CAPTURE, which replaces
//    each stored callable by one that captures its builder's local configuration by reference (the reference's
//    bug, tstPartitionHelpers.hpp); must fail (WILL_FAIL), and a second test requires ASan's
//    "stack-use-after-return" report, so it fails for the right reason.
// Plain main (no Boost): the smallest program that shows the bug class. Exit 0 = every case matched.

#include <Kokkos_Core.hpp>

#include <cstdio>
#include <string>

#include "tstPartitionHelpers.hpp"

int main(int argc, char* argv[]) {
  Kokkos::ScopeGuard guard(argc, argv);
  using Exec = Kokkos::Serial;
  int failures = 0, cases = 0;
  unsigned seed = 77;
  for (const KokkosMoE::RouterOpSpec& s : KokkosMoE::Test::deferred_specs(36)) {
    const std::string err = KokkosMoE::Test::deferred_survival<Exec, float>(Exec{}, s, 37, ++seed);
    ++cases;
    if (!err.empty()) {
      ++failures;
      std::printf("FAILED %s\n", err.c_str());
    }
  }
  std::printf("deferred callables: %d of %d cases match the eager result bitwise\n", cases - failures, cases);
  return failures == 0 ? 0 : 1;
}
