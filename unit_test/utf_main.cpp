/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// Boost.Test main shared by every KokkosMoE test executable: Kokkos is initialized once by a global fixture, which
// works with the static and the shared Boost.Test library alike. Kokkos options (--kokkos-num-threads=N, ...) are
// taken from KOKKOS_NUM_THREADS / the environment, so Boost.Test's own argument parser sees no foreign flags. A run
// whose every test case skips exits 77 with the reasons (SkipReport.hpp).
#define BOOST_TEST_MODULE KokkosMoE
#include <Kokkos_Core.hpp>

#include <SkipReport.hpp>
#include <boost/test/unit_test.hpp>

namespace {
struct KokkosEnvironment {
  KokkosEnvironment() { Kokkos::initialize(); }
  ~KokkosEnvironment() { Kokkos::finalize(); }
};
KokkosMoETest::SkipReport skip_report;
}  // namespace

BOOST_TEST_GLOBAL_FIXTURE(KokkosEnvironment);
