/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// The full tier of docs/router.md §16.3 (FP32 forward, every routing output kind, against the double-precision
// oracle) at the reference's token counts. Hours on the 2-core CPU machine, minutes on a GPU host, so it runs only
// when KOKKOSMOE_TEST_TIER=full (the fulltier phase of perf_test/scripts/gpu_tests_bench.sh sets it); otherwise every
// case reports as skipped. It runs the library's default implementation (the Cuda specialization on a GPU); the
// generic path and the backward run the scaled grid of RouterGrid.hpp in every tier. Not a ctest entry: run it with
// --run_test=router_full_tier.

#include <KokkosMoE_EnableDeviceTypes.hpp>

#include <boost/test/unit_test.hpp>

#include <cstdlib>
#include <cstring>

#include "RouterGrid.hpp"

using namespace KokkosMoETest;

namespace {

struct FullTierEnabled {
  boost::test_tools::assertion_result operator()(boost::unit_test::test_unit_id) const {
    const char* tier = std::getenv("KOKKOSMOE_TEST_TIER");
    boost::test_tools::assertion_result r(tier != nullptr && std::strcmp(tier, "full") == 0);
    r.message() << "KOKKOSMOE_TEST_TIER=full not set";
    return r;
  }
};

/// One function's grid: T x E x k x grouping {off, 4 of 8} x scale {1.0, 1.2} x modes, skipping k >= E and
/// k/gk >= E/G (docs/router.md §16.3).
template <class D>
void run_full_tier(Oracle::Score f, std::initializer_list<int> tokens, std::uint64_t salt) {
  const bool softmax = f == Oracle::Score::Softmax;
  int cases = 0, redrawn = 0;
  std::uint64_t n = 0;
  for (const int T : tokens)
    for (const int E : {32, 128, 1024})
      for (const int k : {4, 8, 16, 32})
        for (int grouped = 0; grouped < 2; ++grouped)
          for (const double scale : {1.0, 1.2})
            for (int variant = 0; variant < 2; ++variant) {  // Softmax: post/pre; else bias off/on
              const int G = grouped ? 8 : 0, gk = grouped ? 4 : 0;
              if (k >= E || (grouped && k / gk >= E / G)) continue;
              const Oracle::Attr a = make_attr(f, softmax && variant == 1, k, G, gk, scale);
              const auto c = make_random_case<D, float>(a, T, E, !softmax && variant == 1, mix_seed(salt, ++n));
              redrawn += c.in.redrawn_rows;
              run_router_case(c, RunFlags{true, false, false});
              ++cases;
            }
  BOOST_TEST_MESSAGE(D::execution_space::name()
                     << ": " << cases << " full-tier cases, " << redrawn << " rows redrawn for conditioning");
  BOOST_TEST(cases > 100);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(router_full_tier, *boost::unit_test::precondition(FullTierEnabled{}))

BOOST_AUTO_TEST_CASE_TEMPLATE(sigmoid, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  run_full_tier<DeviceType>(Oracle::Score::Sigmoid, {2048, 7168, 8992}, 0xF11A);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(sqrtsoftplus, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  run_full_tier<DeviceType>(Oracle::Score::SqrtSoftplus, {2048, 7168, 8992}, 0xF11B);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(softmax, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  run_full_tier<DeviceType>(Oracle::Score::Softmax, {2048, 7168, 14234}, 0xF11C);
}

BOOST_AUTO_TEST_SUITE_END()
