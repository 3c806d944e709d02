/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// Validation at the public boundary (docs/router.md §4): every rule asserted by its stable rule id (docs/conventions.md
// §5), for every entry point — forward (map, indices, compact), backward (map, indices, compact), aux_scores (fwd/bwd),
// aux_loss (host and device total, fwd/bwd). Each case starts from a valid call and breaks exactly one thing.
// Rejected calls must not have launched anything: outputs keep their sentinel.

#include <KokkosMoE_EnableDeviceTypes.hpp>

#include <boost/test/unit_test.hpp>

#include "RouterRunner.hpp"

using namespace KokkosMoETest;
using KokkosMoE::Rule;

namespace {

/// Valid operands of topk_router / topk_router_indices / topk_router_compact with T = 4, E = 8, k = 2.
template <class D>
struct ForwardOperands {
  static constexpr int T = 4, E = 8, k = 2;
  V2<D, float> logits = make2<D, float>("logits", T, E, 0.5f);
  V1<D, float> bias = make1<D, float>("bias", E, 0.0f);
  V1<D, float> no_bias;
  V2<D, float> probs = make2<D, float>("probs", T, E, kSentinel);
  V2<D, std::uint8_t> map = make2<D, std::uint8_t>("map", T, E, kMapSentinel);
  V2<D, std::uint8_t> bitmap = make2<D, std::uint8_t>("bitmap", T, 1, kMapSentinel);
  V2<D, float> inter = make2<D, float>("inter", T, E, kSentinel);
  V2<D, std::int32_t> idx = make2<D, std::int32_t>("idx", T, k, -3);
  V2<D, std::int32_t> ids = make2<D, std::int32_t>("ids", T, k, -3);
  V2<D, float> weights = make2<D, float>("weights", T, k, kSentinel);
  KokkosMoE::RouterConfig cfg() const {
    KokkosMoE::RouterConfig c;
    c.topk = k;
    c.score_function = KokkosMoE::ScoreFunction::Sigmoid;
    return c;
  }
};

template <class D>
bool untouched(const V2<D, float>& v) {
  for (float x : download(v))
    if (x != kSentinel) return false;
  return true;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(router_validation)

BOOST_AUTO_TEST_CASE_TEMPLATE(forward_attribute_rules, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using D = DeviceType;
  using Exec = typename D::execution_space;
  ForwardOperands<D> o;
  const Exec exec{};
  auto fwd = [&](KokkosMoE::RouterConfig c, bool with_bias = false) {
    return [&o, &exec, c, with_bias] {
      KokkosMoE::topk_router(exec, c, o.logits, with_bias ? o.bias : o.no_bias, o.probs, o.map, o.inter);
    };
  };
  // the base call is valid; so is grouping "off" (group_topk <= 0, the reference's -1) with any num_groups
  fwd(o.cfg(), true)();
  auto off = o.cfg();
  off.num_groups = 3;
  off.group_topk = -1;
  fwd(off)();
  exec.fence();
  o.probs = make2<D, float>("probs", o.T, o.E, kSentinel);
  auto c = o.cfg();
  c.topk = 0;
  expect_rule(Rule::TopkRange, "topk = 0", fwd(c), "topk_router", "topk");
  c.topk = 9;
  expect_rule(Rule::TopkRange, "topk = E + 1", fwd(c), "topk_router", "topk");
  c.topk = -1;
  expect_rule(Rule::TopkRange, "topk = -1", fwd(c), "topk_router", "topk");
  c = o.cfg();
  c.use_pre_softmax = true;
  expect_rule(Rule::PreSoftmaxRequiresSoftmax, "pre-softmax with Sigmoid", fwd(c), "topk_router", "use_pre_softmax");
  c.score_function = KokkosMoE::ScoreFunction::SqrtSoftplus;
  expect_rule(Rule::PreSoftmaxRequiresSoftmax, "pre-softmax with SqrtSoftplus", fwd(c));
  c = o.cfg();
  c.score_function = KokkosMoE::ScoreFunction::Softmax;
  expect_rule(Rule::BiasRequiresSigmoidOrSqrtSoftplus, "bias with Softmax post", fwd(c, true), "topk_router",
              "expert_bias");
  c.use_pre_softmax = true;
  expect_rule(Rule::BiasRequiresSigmoidOrSqrtSoftplus, "bias with Softmax pre", fwd(c, true));
  c = o.cfg();
  c.group_topk = 1;
  c.num_groups = 0;
  expect_rule(Rule::GroupCountPositive, "grouping with num_groups = 0", fwd(c), "topk_router", "num_groups");
  c.num_groups = -2;
  expect_rule(Rule::GroupCountPositive, "grouping with num_groups < 0", fwd(c));
  c.num_groups = 2;
  c.group_topk = 3;
  expect_rule(Rule::GroupTopkRange, "group_topk > num_groups", fwd(c), "topk_router", "group_topk");
  c.num_groups = 3;
  c.group_topk = 1;
  expect_rule(Rule::GroupDivisibility, "E % num_groups != 0", fwd(c), "topk_router", "num_groups");
  c.num_groups = 4;
  c.group_topk = 2;
  c.topk = 3;
  expect_rule(Rule::TopkGroupDivisibility, "topk % group_topk != 0", fwd(c), "topk_router", "group_topk");
  c.topk = 6;  // kg = 3 > gs = 2
  expect_rule(Rule::TopkPerGroupRange, "topk / group_topk > E / num_groups", fwd(c), "topk_router", "group_topk");
  c = o.cfg();
  c.scaling_factor = std::numeric_limits<float>::quiet_NaN();
  expect_rule(Rule::ScalingFactorFinite, "scaling_factor NaN", fwd(c), "topk_router", "scaling_factor");
  c.scaling_factor = std::numeric_limits<float>::infinity();
  expect_rule(Rule::ScalingFactorFinite, "scaling_factor +inf", fwd(c));
  c.scaling_factor = -std::numeric_limits<float>::infinity();
  expect_rule(Rule::ScalingFactorFinite, "scaling_factor -inf", fwd(c));
  c = o.cfg();
  c.score_function = static_cast<KokkosMoE::ScoreFunction>(3);
  expect_rule(Rule::ScoreFunctionValue, "score_function 3", fwd(c), "topk_router", "score_function");
  c.score_function = static_cast<KokkosMoE::ScoreFunction>(-1);
  expect_rule(Rule::ScoreFunctionValue, "score_function -1", fwd(c));
  c = o.cfg();
  c.map_format = static_cast<KokkosMoE::RoutingMapFormat>(2);
  expect_rule(Rule::MapFormatValue, "map_format 2", fwd(c), "topk_router", "map_format");
  c = o.cfg();
  c.implementation = static_cast<KokkosMoE::Implementation>(7);
  expect_rule(Rule::ConfigValue, "implementation 7", fwd(c), "topk_router", "implementation");
  exec.fence();
  BOOST_TEST(untouched(o.probs), "a rejected call wrote its outputs");
}

BOOST_AUTO_TEST_CASE_TEMPLATE(forward_shape_rules, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using D = DeviceType;
  using Exec = typename D::execution_space;
  ForwardOperands<D> o;
  const int T = o.T, E = o.E;
  const Exec exec{};
  const auto c = o.cfg();
  auto bitmap_cfg = c;
  bitmap_cfg.map_format = KokkosMoE::RoutingMapFormat::BitmapU8;
  KokkosMoE::topk_router(exec, bitmap_cfg, o.logits, o.probs, o.bitmap, o.inter);  // valid
  exec.fence();
  o.probs = make2<D, float>("probs", T, E, kSentinel);
  expect_rule(
      Rule::ShapeMismatch, "probs [T, E+1]",
      [&] { KokkosMoE::topk_router(exec, c, o.logits, make2<D, float>("p", T, E + 1, 0.f), o.map, o.inter); },
      "topk_router", "probs");
  expect_rule(Rule::ShapeMismatch, "probs [T+1, E]",
              [&] { KokkosMoE::topk_router(exec, c, o.logits, make2<D, float>("p", T + 1, E, 0.f), o.map, o.inter); });
  expect_rule(
      Rule::ShapeMismatch, "intermediate [T, E-1]",
      [&] { KokkosMoE::topk_router(exec, c, o.logits, o.probs, o.map, make2<D, float>("i", T, E - 1, 0.f)); },
      "topk_router", "intermediate");
  expect_rule(
      Rule::ShapeMismatch, "Bytemap given a bitmap-shaped map",
      [&] { KokkosMoE::topk_router(exec, c, o.logits, o.probs, o.bitmap, o.inter); }, "topk_router", "routing_map");
  expect_rule(
      Rule::ShapeMismatch, "BitmapU8 given a bytemap-shaped map",
      [&] { KokkosMoE::topk_router(exec, bitmap_cfg, o.logits, o.probs, o.map, o.inter); }, "topk_router",
      "routing_map");
  expect_rule(
      Rule::ShapeMismatch, "bias extent E + 1",
      [&] { KokkosMoE::topk_router(exec, c, o.logits, make1<D, float>("b", E + 1, 0.f), o.probs, o.map, o.inter); },
      "topk_router", "expert_bias");
  expect_rule(
      Rule::ShapeMismatch, "indices [T, k+1]",
      [&] {
        KokkosMoE::topk_router_indices(exec, c, o.logits, o.no_bias, o.probs, make2<D, std::int64_t>("i", T, 3, 0),
                                       o.inter);
      },
      "topk_router_indices", "indices");
  expect_rule(
      Rule::ShapeMismatch, "indices probs [T, E+1]",
      [&] {
        KokkosMoE::topk_router_indices(exec, c, o.logits, o.no_bias, make2<D, float>("p", T, E + 1, 0.f), o.idx,
                                       o.inter);
      },
      "topk_router_indices", "probs");
  expect_rule(
      Rule::ShapeMismatch, "compact ids [T, k+1]",
      [&] {
        KokkosMoE::topk_router_compact(exec, c, o.logits, o.no_bias, make2<D, std::int32_t>("i", T, 3, 0), o.weights);
      },
      "topk_router_compact", "ids");
  expect_rule(
      Rule::ShapeMismatch, "compact weights [T-1, k]",
      [&] { KokkosMoE::topk_router_compact(exec, c, o.logits, o.no_bias, o.ids, make2<D, float>("w", T - 1, 2, 0.f)); },
      "topk_router_compact", "weights");
  // E = 0, T >= 2^31, E >= 2^31 (unmanaged Views over a small allocation: validation never dereferences them)
  expect_rule(
      Rule::NumExpertsPositive, "E = 0",
      [&] {
        KokkosMoE::topk_router(exec, c, make2<D, float>("l", T, 0, 0.f), make2<D, float>("p", T, 0, 0.f),
                               make2<D, std::uint8_t>("m", T, 0, 0), make2<D, float>("i", T, 0, 0.f));
      },
      "topk_router", "logits");
  const auto scratch = make1<D, float>("scratch", 16, 0.f);
  const std::int64_t big = std::int64_t(1) << 31;
  const V2<D, float> tall(scratch.data(), big, 1), wide(scratch.data(), 1, big);
  const V2<D, std::uint8_t> tall_map(reinterpret_cast<std::uint8_t*>(scratch.data()), big, 1);
  auto c1 = c;
  c1.topk = 1;
  expect_rule(
      Rule::TokenCountRange, "T = 2^31",
      [&] { KokkosMoE::topk_router(exec, c1, V2<D, const float>(tall), tall, tall_map, tall); }, "topk_router",
      "logits");
  expect_rule(
      Rule::ExpertCountRange, "E = 2^31",
      [&] {
        KokkosMoE::topk_router_compact(exec, c1, V2<D, const float>(wide), o.no_bias,
                                       make2<D, std::int32_t>("i", 1, 1, 0), make2<D, float>("w", 1, 1, 0.f));
      },
      "topk_router_compact", "logits");
  // int16 dense indices need E <= 32767 (forward and backward)
  auto cw = c;
  const auto l32k = make2<D, float>("l", 1, 32768, 0.f);
  const auto p32k = make2<D, float>("p", 1, 32768, 0.f), i32k = make2<D, float>("i", 1, 32768, 0.f);
  expect_rule(
      Rule::IndexTypeRange, "int16 indices, E = 32768",
      [&] {
        KokkosMoE::topk_router_indices(exec, cw, l32k, o.no_bias, p32k, make2<D, std::int16_t>("x", 1, 2, 0), i32k);
      },
      "topk_router_indices", "indices");
  expect_rule(
      Rule::IndexTypeRange, "int16 indices backward, E = 32768",
      [&] {
        KokkosMoE::topk_router_indices_backward(exec, cw, make2<D, std::int16_t>("x", 1, 2, 0), i32k, p32k,
                                                make2<D, float>("g", 1, 32768, 0.f));
      },
      "topk_router_indices_backward", "indices");
  // non-contiguous operands: a column range of a wider View is LayoutStride with row stride 16
  const auto wide_logits = make2<D, float>("wide", T, 16, 0.f);
  const auto strided = Kokkos::subview(wide_logits, Kokkos::ALL(), std::make_pair(0, E));
  expect_rule(
      Rule::NotContiguous, "strided logits", [&] { KokkosMoE::topk_router(exec, c, strided, o.probs, o.map, o.inter); },
      "topk_router", "logits");
  expect_rule(
      Rule::NotContiguous, "strided probs",
      [&] {
        KokkosMoE::topk_router(exec, c, o.logits, Kokkos::subview(wide_logits, Kokkos::ALL(), std::make_pair(0, E)),
                               o.map, o.inter);
      },
      "topk_router", "probs");
  exec.fence();
  BOOST_TEST(untouched(o.probs), "a rejected call wrote its outputs");
}

BOOST_AUTO_TEST_CASE_TEMPLATE(aliasing_rules, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using D = DeviceType;
  using Exec = typename D::execution_space;
  ForwardOperands<D> o;
  const int T = o.T, E = o.E;
  const Exec exec{};
  const auto c = o.cfg();
  expect_rule(
      Rule::Aliasing, "probs aliases logits",
      [&] { KokkosMoE::topk_router(exec, c, o.logits, o.logits, o.map, o.inter); }, "topk_router", "probs");
  expect_rule(
      Rule::Aliasing, "intermediate aliases probs",
      [&] { KokkosMoE::topk_router(exec, c, o.logits, o.probs, o.map, o.probs); }, "topk_router");
  const V2<D, std::uint8_t> map_in_probs(reinterpret_cast<std::uint8_t*>(o.probs.data()), T, E);
  expect_rule(
      Rule::Aliasing, "routing map overlaps probs",
      [&] { KokkosMoE::topk_router(exec, c, o.logits, o.probs, map_in_probs, o.inter); }, "topk_router");
  const V1<D, float> bias_in_inter(o.inter.data() + E, E);  // overlaps row 1 of intermediate
  expect_rule(
      Rule::Aliasing, "intermediate overlaps the bias",
      [&] { KokkosMoE::topk_router(exec, c, o.logits, bias_in_inter, o.probs, o.map, o.inter); }, "topk_router",
      "intermediate");
  const V2<D, std::int32_t> idx_in_probs(reinterpret_cast<std::int32_t*>(o.probs.data()) + 3, T, 2);
  expect_rule(
      Rule::Aliasing, "indices overlap probs",
      [&] { KokkosMoE::topk_router_indices(exec, c, o.logits, o.no_bias, o.probs, idx_in_probs, o.inter); },
      "topk_router_indices");
  const V2<D, float> weights_in_ids(reinterpret_cast<float*>(o.ids.data()), T, 2);
  expect_rule(
      Rule::Aliasing, "compact weights alias ids",
      [&] { KokkosMoE::topk_router_compact(exec, c, o.logits, o.no_bias, o.ids, weights_in_ids); },
      "topk_router_compact");
  // backward: in-place gradient
  auto g = make2<D, float>("g", T, E, 0.f);
  expect_rule(
      Rule::Aliasing, "grad_logits aliases grad_probs",
      [&] { KokkosMoE::topk_router_backward(exec, c, o.map, o.inter, g, g); }, "topk_router_backward", "grad_logits");
  expect_rule(
      Rule::Aliasing, "grad_logits aliases intermediate",
      [&] { KokkosMoE::topk_router_indices_backward(exec, c, o.idx, o.inter, g, o.inter); },
      "topk_router_indices_backward");
  expect_rule(
      Rule::Aliasing, "compact grad_logits aliases logits",
      [&] { KokkosMoE::topk_router_compact_backward(exec, c, o.logits, o.ids, o.weights, o.logits); },
      "topk_router_compact_backward");
  // disjoint Views over one allocation are fine: adjacent, non-overlapping ranges
  const auto block = make1<D, float>("block", 2 * T * E, 0.f);
  const V2<D, float> first(block.data(), T, E), second(block.data() + T * E, T, E);
  KokkosMoE::topk_router(exec, c, o.logits, first, o.map, second);
  exec.fence();
}

BOOST_AUTO_TEST_CASE_TEMPLATE(backward_rules, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using D = DeviceType;
  using Exec = typename D::execution_space;
  ForwardOperands<D> o;
  const int T = o.T, E = o.E;
  const Exec exec{};
  auto c = o.cfg();
  const auto g = make2<D, float>("g", T, E, 0.f);
  auto gl = make2<D, float>("gl", T, E, kSentinel);
  KokkosMoE::topk_router_backward(exec, c, o.map, o.inter, g, gl);  // valid
  exec.fence();
  gl = make2<D, float>("gl", T, E, kSentinel);
  expect_rule(
      Rule::ShapeMismatch, "grad_probs [T, E+1]",
      [&] { KokkosMoE::topk_router_backward(exec, c, o.map, o.inter, make2<D, float>("g", T, E + 1, 0.f), gl); },
      "topk_router_backward", "grad_probs");
  expect_rule(
      Rule::ShapeMismatch, "grad_logits [T+1, E]",
      [&] { KokkosMoE::topk_router_backward(exec, c, o.map, o.inter, g, make2<D, float>("g", T + 1, E, 0.f)); },
      "topk_router_backward", "grad_logits");
  auto cb = c;
  cb.map_format = KokkosMoE::RoutingMapFormat::BitmapU8;
  expect_rule(
      Rule::ShapeMismatch, "BitmapU8 backward with a bytemap",
      [&] { KokkosMoE::topk_router_backward(exec, cb, o.map, o.inter, g, gl); }, "topk_router_backward", "routing_map");
  cb.map_format = static_cast<KokkosMoE::RoutingMapFormat>(9);
  expect_rule(
      Rule::MapFormatValue, "backward map_format 9",
      [&] { KokkosMoE::topk_router_backward(exec, cb, o.map, o.inter, g, gl); }, "topk_router_backward");
  auto ck = c;
  ck.topk = 9;
  expect_rule(
      Rule::TopkRange, "backward topk > E", [&] { KokkosMoE::topk_router_backward(exec, ck, o.map, o.inter, g, gl); },
      "topk_router_backward", "topk");
  auto cp = c;
  cp.use_pre_softmax = true;
  expect_rule(
      Rule::PreSoftmaxRequiresSoftmax, "backward pre-softmax with Sigmoid",
      [&] { KokkosMoE::topk_router_backward(exec, cp, o.map, o.inter, g, gl); }, "topk_router_backward");
  auto cs = c;
  cs.scaling_factor = std::numeric_limits<float>::quiet_NaN();
  expect_rule(
      Rule::ScalingFactorFinite, "backward scaling NaN",
      [&] { KokkosMoE::topk_router_indices_backward(exec, cs, o.idx, o.inter, g, gl); },
      "topk_router_indices_backward");
  expect_rule(
      Rule::ShapeMismatch, "indices backward, indices [T, k+1]",
      [&] { KokkosMoE::topk_router_indices_backward(exec, c, make2<D, std::int32_t>("i", T, 3, 0), o.inter, g, gl); },
      "topk_router_indices_backward", "indices");
  expect_rule(
      Rule::ShapeMismatch, "compact backward, grad_weights [T, k+1]",
      [&] { KokkosMoE::topk_router_compact_backward(exec, c, o.logits, o.ids, make2<D, float>("w", T, 3, 0.f), gl); },
      "topk_router_compact_backward", "grad_weights");
  expect_rule(
      Rule::ShapeMismatch, "compact backward, ids [T-1, k]",
      [&] {
        KokkosMoE::topk_router_compact_backward(exec, c, o.logits, make2<D, std::int32_t>("i", T - 1, 2, 0), o.weights,
                                                gl);
      },
      "topk_router_compact_backward", "ids");
  expect_rule(
      Rule::ShapeMismatch, "compact backward, grad_logits [T, E-1]",
      [&] {
        KokkosMoE::topk_router_compact_backward(exec, c, o.logits, o.ids, o.weights,
                                                make2<D, float>("g", T, E - 1, 0.f));
      },
      "topk_router_compact_backward", "grad_logits");
  auto cg = c;
  cg.group_topk = 3;
  cg.num_groups = 2;
  expect_rule(
      Rule::GroupTopkRange, "compact backward checks grouping",
      [&] { KokkosMoE::topk_router_compact_backward(exec, cg, o.logits, o.ids, o.weights, gl); },
      "topk_router_compact_backward");
  expect_rule(
      Rule::NumExpertsPositive, "backward E = 0",
      [&] {
        KokkosMoE::topk_router_backward(exec, c, make2<D, std::uint8_t>("m", T, 0, 0), make2<D, float>("i", T, 0, 0.f),
                                        make2<D, float>("g", T, 0, 0.f), make2<D, float>("gl", T, 0, 0.f));
      },
      "topk_router_backward");
  exec.fence();
  BOOST_TEST(untouched(gl), "a rejected backward wrote grad_logits");
}

BOOST_AUTO_TEST_CASE_TEMPLATE(aux_scores_rules, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using D = DeviceType;
  using Exec = typename D::execution_space;
  const int T = 4, E = 8;
  const Exec exec{};
  const auto logits = make2<D, float>("logits", T, E, 0.5f);
  auto scores = make2<D, float>("scores", T, E, kSentinel), inter = make2<D, float>("inter", T, E, kSentinel);
  const auto map = make2<D, std::uint8_t>("map", T, E, 0);
  KokkosMoE::AuxScoresConfig c;
  c.topk = 2;
  c.score_function = KokkosMoE::ScoreFunction::Sigmoid;
  auto ck = c;
  ck.topk = 9;
  expect_rule(
      Rule::TopkRange, "aux_scores topk > E", [&] { KokkosMoE::aux_scores(exec, ck, logits, scores, map, inter); },
      "aux_scores", "topk");
  ck.topk = 0;
  expect_rule(Rule::TopkRange, "aux_scores topk = 0",
              [&] { KokkosMoE::aux_scores(exec, ck, logits, scores, map, inter); });
  auto cf = c;
  cf.score_function = static_cast<KokkosMoE::ScoreFunction>(5);
  expect_rule(
      Rule::ScoreFunctionValue, "aux_scores score_function 5",
      [&] { KokkosMoE::aux_scores(exec, cf, logits, scores, map, inter); }, "aux_scores");
  expect_rule(
      Rule::ShapeMismatch, "aux_scores scores [T, E+1]",
      [&] { KokkosMoE::aux_scores(exec, c, logits, make2<D, float>("s", T, E + 1, 0.f), map, inter); }, "aux_scores",
      "scores");
  auto cb = c;
  cb.map_format = KokkosMoE::RoutingMapFormat::BitmapU8;
  expect_rule(
      Rule::ShapeMismatch, "aux_scores BitmapU8 with a bytemap",
      [&] { KokkosMoE::aux_scores(exec, cb, logits, scores, map, inter); }, "aux_scores", "routing_map");
  expect_rule(
      Rule::Aliasing, "aux_scores intermediate aliases scores",
      [&] { KokkosMoE::aux_scores(exec, c, logits, scores, map, scores); }, "aux_scores");
  expect_rule(
      Rule::NumExpertsPositive, "aux_scores E = 0",
      [&] {
        KokkosMoE::aux_scores(exec, c, make2<D, float>("l", T, 0, 0.f), make2<D, float>("s", T, 0, 0.f),
                              make2<D, std::uint8_t>("m", T, 0, 0), make2<D, float>("i", T, 0, 0.f));
      },
      "aux_scores");
  const auto gs = make2<D, float>("gs", T, E, 0.f);
  auto gl = make2<D, float>("gl", T, E, kSentinel);
  expect_rule(
      Rule::ShapeMismatch, "aux_scores_backward grad_scores [T-1, E]",
      [&] { KokkosMoE::aux_scores_backward(exec, c, inter, make2<D, float>("g", T - 1, E, 0.f), gl); },
      "aux_scores_backward", "grad_scores");
  expect_rule(
      Rule::Aliasing, "aux_scores_backward grad_logits aliases grad_scores",
      [&] { KokkosMoE::aux_scores_backward(exec, c, inter, gs, gs); }, "aux_scores_backward");
  expect_rule(
      Rule::TopkRange, "aux_scores_backward topk > E", [&] { KokkosMoE::aux_scores_backward(exec, ck, inter, gs, gl); },
      "aux_scores_backward");
  exec.fence();
  BOOST_TEST(untouched(scores));
  BOOST_TEST(untouched(gl));
}

BOOST_AUTO_TEST_CASE_TEMPLATE(aux_loss_rules, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using D = DeviceType;
  using Exec = typename D::execution_space;
  const int R = 5, E = 8, C = 16;
  const Exec exec{};
  const auto probs = make2<D, float>("probs", R, C, 0.25f);
  const auto tpe = make1<D, std::int32_t>("tpe", C, 3);
  auto loss = V0<D, float>("loss");
  auto cbuf = make1<D, float>("const_buf", 2, kSentinel);
  const auto ws = make1<D, float>("ws", static_cast<std::int64_t>(KokkosMoE::aux_loss_workspace_size(R, C)), 0.f);
  const auto total = V0<D, std::int64_t>("total");
  KokkosMoE::AuxLossConfig c;
  c.num_experts = E;
  c.topk = 2;
  c.coeff = 0.01f;
  KokkosMoE::aux_loss(exec, c, probs, tpe, 100, loss, make1<D, float>("cb", 2, 0.f), ws);  // valid, m = 2
  exec.fence();
  auto call = [&](KokkosMoE::AuxLossConfig cc, std::int64_t tot = 100) {
    return [&, cc, tot] { KokkosMoE::aux_loss(exec, cc, probs, tpe, tot, loss, cbuf, ws); };
  };
  auto ce = c;
  ce.num_experts = 6;  // 16 % 6 != 0
  expect_rule(Rule::AuxColumnsMultiple, "C not a multiple of E", call(ce), "aux_loss", "probs");
  ce.num_experts = 32;  // C < E
  expect_rule(Rule::AuxColumnsMultiple, "C < E", call(ce));
  ce.num_experts = 0;
  expect_rule(Rule::NumExpertsPositive, "num_experts = 0", call(ce), "aux_loss", "num_experts");
  auto ck = c;
  ck.topk = 9;
  expect_rule(Rule::TopkRange, "aux_loss topk > E", call(ck), "aux_loss", "topk");
  ck.topk = 0;
  expect_rule(Rule::TopkRange, "aux_loss topk = 0", call(ck));
  auto cc = c;
  cc.coeff = std::numeric_limits<float>::quiet_NaN();
  expect_rule(Rule::CoeffFinite, "coeff NaN", call(cc), "aux_loss", "coeff");
  cc.coeff = std::numeric_limits<float>::infinity();
  expect_rule(Rule::CoeffFinite, "coeff inf", call(cc));
  expect_rule(Rule::TotalTokensPositive, "total_num_tokens = 0", call(c, 0), "aux_loss", "total_num_tokens");
  expect_rule(Rule::TotalTokensPositive, "total_num_tokens = -3", call(c, -3));
  expect_rule(
      Rule::WorkspaceTooSmall, "workspace one float short",
      [&] {
        KokkosMoE::aux_loss(exec, c, probs, tpe, 100, loss, cbuf,
                            Kokkos::subview(ws, std::make_pair<std::size_t, std::size_t>(0, ws.extent(0) - 1)));
      },
      "aux_loss", "workspace");
  expect_rule(
      Rule::ShapeMismatch, "tokens_per_expert [C-1]",
      [&] { KokkosMoE::aux_loss(exec, c, probs, make1<D, std::int32_t>("t", C - 1, 1), 100, loss, cbuf, ws); },
      "aux_loss", "tokens_per_expert");
  expect_rule(
      Rule::ShapeMismatch, "const_buf [3]",
      [&] { KokkosMoE::aux_loss(exec, c, probs, tpe, 100, loss, make1<D, float>("cb", 3, 0.f), ws); }, "aux_loss",
      "const_buf");
  expect_rule(
      Rule::Aliasing, "workspace overlaps probs",
      [&] {
        const V1<D, float> w(probs.data(), ws.extent(0));
        KokkosMoE::aux_loss(exec, c, probs, tpe, 100, loss, cbuf, w);
      },
      "aux_loss", "workspace");
  expect_rule(
      Rule::Aliasing, "loss inside const_buf",
      [&] {
        const V0<D, float> l(cbuf.data() + 1);
        KokkosMoE::aux_loss(exec, c, probs, tpe, 100, l, cbuf, ws);
      },
      "aux_loss");
  ce.num_experts = 6;
  expect_rule(
      Rule::AuxColumnsMultiple, "device total: C not a multiple of E",
      [&] { KokkosMoE::aux_loss(exec, ce, probs, tpe, total, loss, cbuf, ws); }, "aux_loss", "probs");
  expect_rule(
      Rule::WorkspaceTooSmall, "device total: workspace too small",
      [&] { KokkosMoE::aux_loss(exec, c, probs, tpe, total, loss, cbuf, make1<D, float>("w", 1, 0.f)); }, "aux_loss",
      "workspace");
  // backward
  const V0<D, float> gloss("grad_loss");
  auto gp = make2<D, float>("gp", R, C, kSentinel);
  expect_rule(
      Rule::AuxColumnsMultiple, "backward C not a multiple of E",
      [&] {
        auto b = c;
        b.num_experts = 6;
        KokkosMoE::aux_loss_backward(exec, b, cbuf, tpe, gloss, gp);
      },
      "aux_loss_backward", "grad_probs");
  expect_rule(
      Rule::NumExpertsPositive, "backward num_experts = 0",
      [&] {
        auto b = c;
        b.num_experts = 0;
        KokkosMoE::aux_loss_backward(exec, b, cbuf, tpe, gloss, gp);
      },
      "aux_loss_backward");
  expect_rule(
      Rule::ShapeMismatch, "backward const_buf [1]",
      [&] { KokkosMoE::aux_loss_backward(exec, c, make1<D, float>("cb", 1, 0.f), tpe, gloss, gp); },
      "aux_loss_backward", "const_buf");
  expect_rule(
      Rule::ShapeMismatch, "backward tokens_per_expert [C+1]",
      [&] { KokkosMoE::aux_loss_backward(exec, c, cbuf, make1<D, std::int32_t>("t", C + 1, 1), gloss, gp); },
      "aux_loss_backward", "tokens_per_expert");
  expect_rule(
      Rule::Aliasing, "backward grad_probs overlaps tokens_per_expert",
      [&] {
        const auto ftpe = make1<D, float>("ftpe", R * C, 1.f);
        const V1<D, const float> t(ftpe.data(), C);
        const V2<D, float> g(ftpe.data(), R, C);
        KokkosMoE::aux_loss_backward(exec, c, cbuf, t, gloss, g);
      },
      "aux_loss_backward", "grad_probs");
  expect_rule(
      Rule::ConfigValue, "aux_loss implementation 3",
      [&] {
        auto b = c;
        b.implementation = static_cast<KokkosMoE::Implementation>(3);
        KokkosMoE::aux_loss(exec, b, probs, tpe, 100, loss, cbuf, ws);
      },
      "aux_loss", "implementation");
  exec.fence();
  BOOST_TEST(untouched(gp));
  const auto cb = download(cbuf);
  BOOST_TEST((cb[0] == kSentinel && cb[1] == kSentinel), "a rejected aux_loss wrote const_buf");
}

// Contiguity of every operand (docs/router.md §4.1), row limits of the aux loss, and options documented as ignored.
BOOST_AUTO_TEST_CASE_TEMPLATE(contiguity_limits_and_ignored_options, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using D = DeviceType;
  using Exec = typename D::execution_space;
  const Exec exec{};
  const int T = 4, E = 8;
  // a LayoutLeft [T, E] View is column-major
  ForwardOperands<D> o;
  const Kokkos::View<float**, Kokkos::LayoutLeft, D> left("left", T, E);
  expect_rule(
      Rule::NotContiguous, "LayoutLeft probs",
      [&] { KokkosMoE::topk_router(exec, o.cfg(), o.logits, left, o.map, o.inter); }, "topk_router", "probs");
  expect_rule(
      Rule::NotContiguous, "LayoutLeft intermediate (backward)",
      [&] {
        KokkosMoE::topk_router_backward(exec, o.cfg(), o.map, left, make2<D, float>("g", T, E, 0.f),
                                        make2<D, float>("gl", T, E, 0.f));
      },
      "topk_router_backward", "intermediate");
  // a bias with stride 2
  const auto bias_mem = make1<D, float>("bias_mem", 2 * E, 0.f);
  const Kokkos::View<float*, Kokkos::LayoutStride, D> bias2(bias_mem.data(), Kokkos::LayoutStride(E, 2));
  expect_rule(
      Rule::NotContiguous, "strided expert_bias",
      [&] { KokkosMoE::topk_router(exec, o.cfg(), o.logits, bias2, o.probs, o.map, o.inter); }, "topk_router",
      "expert_bias");
  // aux loss: tokens_per_expert and workspace with stride 2
  const int R = 5, C = 8;
  KokkosMoE::AuxLossConfig c;
  c.num_experts = E;
  c.topk = 2;
  c.coeff = 0.01f;
  const auto probs = make2<D, float>("probs", R, C, 0.1f);
  const std::size_t need = KokkosMoE::aux_loss_workspace_size(R, C);
  const auto ws_mem = make1<D, float>("ws_mem", static_cast<std::int64_t>(2 * need), 0.f);
  const auto tpe_mem = make1<D, std::int32_t>("tpe_mem", 2 * C, 1);
  const auto tpe = make1<D, std::int32_t>("tpe", C, 1);
  const auto cbuf = make1<D, float>("cb", 2, 0.f);
  V0<D, float> loss("loss");
  const Kokkos::View<std::int32_t*, Kokkos::LayoutStride, D> tpe2(tpe_mem.data(), Kokkos::LayoutStride(C, 2));
  const Kokkos::View<float*, Kokkos::LayoutStride, D> ws2(ws_mem.data(), Kokkos::LayoutStride(need, 2));
  expect_rule(
      Rule::NotContiguous, "strided tokens_per_expert",
      [&] {
        KokkosMoE::aux_loss(exec, c, probs, tpe2, std::int64_t(10), loss, cbuf, make1<D, float>("ws", need, 0.f));
      },
      "aux_loss", "tokens_per_expert");
  expect_rule(
      Rule::NotContiguous, "strided workspace",
      [&] { KokkosMoE::aux_loss(exec, c, probs, tpe, std::int64_t(10), loss, cbuf, ws2); }, "aux_loss", "workspace");
  // R >= 2^31 rows (unmanaged Views over a small allocation: never dereferenced)
  const std::int64_t big = std::int64_t(1) << 31;
  const auto scratch = make1<D, float>("scratch", 16, 0.f);
  const V2<D, float> tall(scratch.data(), big, 1);
  auto c1 = c;
  c1.num_experts = 1;
  c1.topk = 1;
  expect_rule(
      Rule::TokenCountRange, "aux_loss R = 2^31",
      [&] {
        const V1<D, float> ws(scratch.data(), big);  // large enough by extent
        KokkosMoE::aux_loss(exec, c1, V2<D, const float>(tall), make1<D, std::int32_t>("t", 1, 1), std::int64_t(10),
                            loss, cbuf, ws);
      },
      "aux_loss", "probs");
  expect_rule(
      Rule::TokenCountRange, "aux_loss_backward R = 2^31",
      [&] { KokkosMoE::aux_loss_backward(exec, c1, cbuf, make1<D, std::int32_t>("t", 1, 1), V0<D, float>("g"), tall); },
      "aux_loss_backward", "grad_probs");
  expect_rule(
      Rule::TokenCountRange, "aux_scores T = 2^31",
      [&] {
        KokkosMoE::AuxScoresConfig ac;
        KokkosMoE::aux_scores(exec, ac, V2<D, const float>(tall), tall, V2<D, std::uint8_t>("m", 1, 1), tall);
      },
      "aux_scores", "logits");
  // config.map_format is ignored by the dense-indices and compact variants (KokkosMoE_Router.hpp)
  auto cm = o.cfg();
  cm.map_format = static_cast<KokkosMoE::RoutingMapFormat>(7);
  try {
    KokkosMoE::topk_router_indices(exec, cm, o.logits, o.no_bias, o.probs, o.idx, o.inter);
    KokkosMoE::topk_router_compact(exec, cm, o.logits, o.no_bias, o.ids, o.weights);
    exec.fence();
  } catch (const std::exception& e) {
    BOOST_TEST(false, "map_format must be ignored by the indices/compact variants: " << e.what());
  }
}

BOOST_AUTO_TEST_SUITE_END()
