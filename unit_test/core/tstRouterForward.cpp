/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// topk_router forward (docs/router.md §5) against the double-precision oracle: the parameter grid of §16.3 over every
// output kind, both implementations and the three logits types; the reference's patterns as a compatibility case;
// the named presets of §15.

#include <KokkosMoE_EnableDeviceTypes.hpp>
#include <KokkosMoE_RouterPresets.hpp>

#include <boost/test/unit_test.hpp>

#include "RouterGrid.hpp"

using namespace KokkosMoETest;

BOOST_AUTO_TEST_SUITE(router_forward)

BOOST_AUTO_TEST_CASE_TEMPLATE(grid_float, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  run_router_grid<DeviceType, float>(RunFlags{true, false}, 0xF0F32);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(grid_fp16, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  run_router_grid<DeviceType, fp16_t>(RunFlags{true, false}, 0xF0F16);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(grid_bf16, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  run_router_grid<DeviceType, bf16_t>(RunFlags{true, false}, 0xF0B16);
}

// The reference's own input patterns (docs/router.md §16.2): degenerate (every token picks the same experts), kept as a
// compatibility case only. Shapes from the quick/extended tiers of §16.3.
BOOST_AUTO_TEST_CASE_TEMPLATE(reference_patterns_compat, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  const int shapes[][3] = {{128, 32, 4}, {256, 128, 8}, {97, 1024, 16}};
  for (const auto& sh : shapes)
    for (const Mode& m : kModes)
      for (int grouped = 0; grouped < 2; ++grouped) {
        const int T = sh[0], E = sh[1], k = sh[2];
        if (!grouping_valid(E, k, grouped ? 8 : 0, grouped ? 4 : 0)) continue;
        const Oracle::Attr a = make_attr(m.f, m.pre, k, grouped ? 8 : 0, grouped ? 4 : 0, 1.2);
        RouterInputs in = reference_pattern_inputs(a, T, E, m.bias);
        for (int t = 0; t < T; ++t)
          BOOST_TEST_REQUIRE(well_conditioned(a, in.x.data() + static_cast<std::size_t>(t) * E,
                                              in.b.empty() ? nullptr : in.b.data(), E),
                             "reference pattern row " << t << " is ill-conditioned");
        run_router_case(make_case<DeviceType, float>(a, std::move(in)), RunFlags{true, true});
      }
}

// Shapes the native CUDA forward kernels leave to the portable path (more than 1024 experts; a group size no lane
// layout fits; more than 8 experts scoring a group), against the oracle on every backend: on Kokkos::Cuda, Auto
// runs the portable kernels through the specialization's fallback (tstRouterKokkosTools.cpp checks which
// path ran).
BOOST_AUTO_TEST_CASE_TEMPLATE(native_fallback_shapes, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  struct Shape {
    int T, E, k, G, gk;
  };
  const Shape shapes[] = {{37, 2048, 8, 0, 0}, {64, 96, 4, 4, 2}, {64, 256, 16, 4, 1}};
  std::uint64_t n = 0;
  for (const Shape& s : shapes)
    for (const Mode& m : kModes) {
      const Oracle::Attr a = make_attr(m.f, m.pre, s.k, s.G, s.gk, 1.2);
      run_router_case(make_random_case<DeviceType, float>(a, s.T, s.E, m.bias, mix_seed(0xFA11, ++n)),
                      RunFlags{true, true});
    }
  BOOST_TEST(n == 18u);
}

// The named presets (docs/router.md §15): the library's table against the spec's, then a routed batch of each.
BOOST_AUTO_TEST_CASE_TEMPLATE(presets, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  struct Row {
    const char* name;
    int E, k;
    Oracle::Score f;
    bool bias;
    int G, gk;
    double scale;
  };
  const Row spec[] = {{"deepseek-v3", 256, 8, Oracle::Score::Sigmoid, true, 8, 4, 2.5},
                      {"qwen3-moe", 128, 8, Oracle::Score::Softmax, false, 0, 0, 1.0},
                      {"mixtral", 8, 2, Oracle::Score::Softmax, false, 0, 0, 1.0},
                      {"llama4-scout", 16, 1, Oracle::Score::Sigmoid, false, 0, 0, 1.0},
                      {"llama4-maverick", 128, 1, Oracle::Score::Sigmoid, false, 0, 0, 1.0},
                      {"large", 1024, 32, Oracle::Score::Softmax, false, 0, 0, 1.0},
                      {"kimi-k2", 384, 8, Oracle::Score::Sigmoid, true, 0, 0, 2.827}};
  const auto names = KokkosMoE::router_preset_names();
  BOOST_TEST(names.size() == 7u);
  for (const Row& r : spec) {
    BOOST_TEST_CONTEXT("preset " << r.name) {
      const KokkosMoE::RouterPreset p = KokkosMoE::router_preset(r.name);
      BOOST_TEST(p.num_experts == r.E);
      BOOST_TEST(p.config.topk == r.k);
      BOOST_TEST(static_cast<int>(p.config.score_function) == static_cast<int>(r.f));
      BOOST_TEST(p.config.use_pre_softmax == false);
      BOOST_TEST(p.has_bias == r.bias);
      BOOST_TEST(p.config.grouped() == (r.gk > 0));
      if (r.gk > 0) {
        BOOST_TEST(p.config.num_groups == r.G);
        BOOST_TEST(p.config.group_topk == r.gk);
      }
      BOOST_TEST(p.config.scaling_factor == static_cast<float>(r.scale));
      const Oracle::Attr a = make_attr(r.f, false, r.k, r.G, r.gk, r.scale);
      run_router_case(make_random_case<DeviceType, float>(a, 77, r.E, r.bias, 0x9E5E7 + r.E), RunFlags{true, true});
    }
  }
  expect_rule(KokkosMoE::Rule::ConfigValue, "unknown preset", [] { KokkosMoE::router_preset("no-such-model"); });
}

BOOST_AUTO_TEST_SUITE_END()
