/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// libFuzzer target over the plan JSON reader. Any exception other than InvalidArgument, a crash, a
// sanitizer report or a broken invariant (a plan that was read must survive plan_to_json -> plan_from_json and be
// printable) is a finding. Seeds: unit_test/sharding/fuzz_corpus/plan_json (plans of the fixtures).

#include <KokkosMoE_Planner.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  KokkosMoE::Plan p;
  try {
    p = KokkosMoE::plan_from_json(in);
  } catch (const KokkosMoE::InvalidArgument&) {
    return 0;
  }
  const KokkosMoE::Plan back = KokkosMoE::plan_from_json(KokkosMoE::plan_to_json(p));
  if (!(back == p)) {
    std::fprintf(stderr, "plan JSON round trip changed the plan\n");
    std::abort();
  }
  (void)KokkosMoE::plan_report(p);
  return 0;
}
