/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// The convenience overloads of the public entry points (docs/conventions.md §3): every forward without an expert
// bias, and every operation without the execution space (Kokkos::DefaultExecutionSpace). Each must give exactly
// the bits of the full form it forwards to: an empty bias View, and an explicit DefaultExecutionSpace instance.

#include <KokkosMoE_AuxLoss.hpp>
#include <KokkosMoE_EnableDeviceTypes.hpp>
#include <KokkosMoE_Router.hpp>

#include <Kokkos_Core.hpp>

#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "RouterTestUtils.hpp"

using namespace KokkosMoETest;

namespace {

constexpr int kT = 37, kE = 32, kK = 4;

template <class D, class S>
V2<D, S> random_logits(std::uint64_t seed) {
  return device_values<D, S>("logits", kT, kE, random_values<S>(static_cast<std::size_t>(kT) * kE, seed, -4.0, 4.0));
}

KokkosMoE::RouterConfig sigmoid_config(KokkosMoE::Implementation impl) {
  KokkosMoE::RouterConfig c;
  c.topk = kK;
  c.score_function = KokkosMoE::ScoreFunction::Sigmoid;
  c.num_groups = 4;
  c.group_topk = 2;
  c.scaling_factor = 2.5f;
  c.implementation = impl;
  return c;
}

template <class V>
void expect_same_bits(const V& a, const V& b, const char* what) {
  Kokkos::fence();
  BOOST_TEST(bytes_equal(download(a), download(b)), what << ": the overload's output differs from the full form's");
}

}  // namespace

BOOST_AUTO_TEST_SUITE(router_overloads)

// Every forward without a bias equals the same forward given an empty bias View, on every backend and both
// implementations, for a score function that takes a bias and for Softmax (which rejects one).
BOOST_AUTO_TEST_CASE_TEMPLATE(forwards_without_bias, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using D = DeviceType;
  using Exec = typename D::execution_space;
  const Exec exec;
  const auto logits = random_logits<D, float>(11);
  const V1<D, const float> no_bias;
  for (const auto impl : kImpls)
    for (const bool softmax : {false, true}) {
      KokkosMoE::RouterConfig cfg = sigmoid_config(impl);
      if (softmax) cfg.score_function = KokkosMoE::ScoreFunction::Softmax;
      for (const auto fmt : {KokkosMoE::RoutingMapFormat::Bytemap, KokkosMoE::RoutingMapFormat::BitmapU8}) {
        cfg.map_format = fmt;
        const int mcols = fmt == KokkosMoE::RoutingMapFormat::BitmapU8 ? (kE + 7) / 8 : kE;
        auto p0 = make2<D, float>("p0", kT, kE, -1.f), p1 = make2<D, float>("p1", kT, kE, -2.f);
        auto m0 = make2<D, std::uint8_t>("m0", kT, mcols, 7), m1 = make2<D, std::uint8_t>("m1", kT, mcols, 9);
        auto i0 = make2<D, float>("i0", kT, kE, -1.f), i1 = make2<D, float>("i1", kT, kE, -2.f);
        KokkosMoE::topk_router(exec, cfg, logits, no_bias, p0, m0, i0);
        KokkosMoE::topk_router(exec, cfg, logits, p1, m1, i1);
        expect_same_bits(p0, p1, "topk_router probs");
        expect_same_bits(m0, m1, "topk_router routing_map");
        expect_same_bits(i0, i1, "topk_router intermediate");
      }
      auto p0 = make2<D, float>("p0", kT, kE, -1.f), p1 = make2<D, float>("p1", kT, kE, -2.f);
      auto x0 = make2<D, std::int64_t>("x0", kT, kK, -1), x1 = make2<D, std::int64_t>("x1", kT, kK, -2);
      auto i0 = make2<D, float>("i0", kT, kE, -1.f), i1 = make2<D, float>("i1", kT, kE, -2.f);
      KokkosMoE::topk_router_indices(exec, cfg, logits, no_bias, p0, x0, i0);
      KokkosMoE::topk_router_indices(exec, cfg, logits, p1, x1, i1);
      expect_same_bits(p0, p1, "topk_router_indices probs");
      expect_same_bits(x0, x1, "topk_router_indices indices");
      expect_same_bits(i0, i1, "topk_router_indices intermediate");
      auto d0 = make2<D, std::int32_t>("d0", kT, kK, -1), d1 = make2<D, std::int32_t>("d1", kT, kK, -2);
      auto w0 = make2<D, float>("w0", kT, kK, -1.f), w1 = make2<D, float>("w1", kT, kK, -2.f);
      KokkosMoE::topk_router_compact(exec, cfg, logits, no_bias, d0, w0);
      KokkosMoE::topk_router_compact(exec, cfg, logits, d1, w1);
      expect_same_bits(d0, d1, "topk_router_compact ids");
      expect_same_bits(w0, w1, "topk_router_compact weights");
    }
}

// Every operation without the execution space runs on Kokkos::DefaultExecutionSpace: the same bits as the call
// given DefaultExecutionSpace{}. One chain through every entry point (forwards with and without bias, backwards,
// aux scores, aux loss with both totals, the finite check), with bf16 logits for the 16-bit paths.
BOOST_AUTO_TEST_CASE(default_execution_space) {
  using Exec = Kokkos::DefaultExecutionSpace;
  using D = Exec::device_type;
  using S = KokkosMoE::bf16_t;
  const Exec exec;
  const auto logits = random_logits<D, S>(12);
  const auto bias = device_vector<D, float>("bias", random_values<float>(kE, 13, -0.5, 0.5));
  for (const auto impl : kImpls) {
    const KokkosMoE::RouterConfig cfg = sigmoid_config(impl);
    // forwards
    auto p0 = make2<D, S>("p0", kT, kE, S(-1.f)), p1 = make2<D, S>("p1", kT, kE, S(-2.f));
    auto m0 = make2<D, std::uint8_t>("m0", kT, kE, 7), m1 = make2<D, std::uint8_t>("m1", kT, kE, 9);
    auto i0 = make2<D, float>("i0", kT, kE, -1.f), i1 = make2<D, float>("i1", kT, kE, -2.f);
    KokkosMoE::topk_router(exec, cfg, logits, bias, p0, m0, i0);
    KokkosMoE::topk_router(cfg, logits, bias, p1, m1, i1);
    expect_same_bits(p0, p1, "topk_router probs");
    expect_same_bits(m0, m1, "topk_router routing_map");
    expect_same_bits(i0, i1, "topk_router intermediate");
    {
      auto q0 = make2<D, S>("q0", kT, kE, S(-1.f)), q1 = make2<D, S>("q1", kT, kE, S(-2.f));
      auto n0 = make2<D, std::uint8_t>("n0", kT, kE, 7), n1 = make2<D, std::uint8_t>("n1", kT, kE, 9);
      auto j0 = make2<D, float>("j0", kT, kE, -1.f), j1 = make2<D, float>("j1", kT, kE, -2.f);
      KokkosMoE::topk_router(exec, cfg, logits, q0, n0, j0);
      KokkosMoE::topk_router(cfg, logits, q1, n1, j1);
      expect_same_bits(q0, q1, "topk_router (no bias) probs");
      expect_same_bits(n0, n1, "topk_router (no bias) routing_map");
      expect_same_bits(j0, j1, "topk_router (no bias) intermediate");
    }
    auto x0 = make2<D, std::int32_t>("x0", kT, kK, -1), x1 = make2<D, std::int32_t>("x1", kT, kK, -2);
    auto k0 = make2<D, S>("k0", kT, kE, S(-1.f)), k1 = make2<D, S>("k1", kT, kE, S(-2.f));
    auto l0 = make2<D, float>("l0", kT, kE, -1.f), l1 = make2<D, float>("l1", kT, kE, -2.f);
    KokkosMoE::topk_router_indices(exec, cfg, logits, bias, k0, x0, l0);
    KokkosMoE::topk_router_indices(cfg, logits, bias, k1, x1, l1);
    expect_same_bits(x0, x1, "topk_router_indices indices");
    expect_same_bits(k0, k1, "topk_router_indices probs");
    KokkosMoE::topk_router_indices(cfg, logits, k1, x1, l1);
    KokkosMoE::topk_router_indices(exec, cfg, logits, k0, x0, l0);
    expect_same_bits(x0, x1, "topk_router_indices (no bias) indices");
    expect_same_bits(l0, l1, "topk_router_indices (no bias) intermediate");
    auto d0 = make2<D, std::int32_t>("d0", kT, kK, -1), d1 = make2<D, std::int32_t>("d1", kT, kK, -2);
    auto w0 = make2<D, float>("w0", kT, kK, -1.f), w1 = make2<D, float>("w1", kT, kK, -2.f);
    KokkosMoE::topk_router_compact(exec, cfg, logits, bias, d0, w0);
    KokkosMoE::topk_router_compact(cfg, logits, bias, d1, w1);
    expect_same_bits(d0, d1, "topk_router_compact ids");
    expect_same_bits(w0, w1, "topk_router_compact weights");
    KokkosMoE::topk_router_compact(exec, cfg, logits, d0, w0);
    KokkosMoE::topk_router_compact(cfg, logits, d1, w1);
    expect_same_bits(w0, w1, "topk_router_compact (no bias) weights");

    // backwards, from the biased forward's saved state
    const auto grad = device_values<D, S>("grad", kT, kE, random_values<S>(static_cast<std::size_t>(kT) * kE, 14));
    auto g0 = make2<D, S>("g0", kT, kE, S(-1.f)), g1 = make2<D, S>("g1", kT, kE, S(-2.f));
    KokkosMoE::topk_router_backward(exec, cfg, m0, i0, grad, g0);
    KokkosMoE::topk_router_backward(cfg, m0, i0, grad, g1);
    expect_same_bits(g0, g1, "topk_router_backward grad_logits");
    KokkosMoE::topk_router_indices_backward(exec, cfg, x0, l0, grad, g0);
    KokkosMoE::topk_router_indices_backward(cfg, x0, l0, grad, g1);
    expect_same_bits(g0, g1, "topk_router_indices_backward grad_logits");
    const auto gw = device_values<D, float>("gw", kT, kK, random_values<float>(static_cast<std::size_t>(kT) * kK, 15));
    KokkosMoE::topk_router_compact_backward(exec, cfg, logits, d0, gw, g0);
    KokkosMoE::topk_router_compact_backward(cfg, logits, d0, gw, g1);
    expect_same_bits(g0, g1, "topk_router_compact_backward grad_logits");

    // aux scores and their backward
    KokkosMoE::AuxScoresConfig acfg;
    acfg.topk = kK;
    acfg.score_function = KokkosMoE::ScoreFunction::SqrtSoftplus;
    acfg.implementation = impl;
    auto s0 = make2<D, float>("s0", kT, kE, -1.f), s1 = make2<D, float>("s1", kT, kE, -2.f);
    KokkosMoE::aux_scores(exec, acfg, logits, s0, m0, i0);
    KokkosMoE::aux_scores(acfg, logits, s1, m1, i1);
    expect_same_bits(s0, s1, "aux_scores scores");
    expect_same_bits(m0, m1, "aux_scores routing_map");
    expect_same_bits(i0, i1, "aux_scores intermediate");
    const auto gs = device_values<D, float>("gs", kT, kE, random_values<float>(static_cast<std::size_t>(kT) * kE, 16));
    KokkosMoE::aux_scores_backward(exec, acfg, i0, gs, g0);
    KokkosMoE::aux_scores_backward(acfg, i0, gs, g1);
    expect_same_bits(g0, g1, "aux_scores_backward grad_logits");

    // aux loss, host and device totals, and its backward
    KokkosMoE::AuxLossConfig lcfg;
    lcfg.num_experts = kE;
    lcfg.topk = kK;
    lcfg.coeff = 0.01f;
    lcfg.implementation = impl;
    std::vector<std::int64_t> counts(kE);
    for (int e = 0; e < kE; ++e) counts[e] = 1 + (e * 37) % 101;
    const auto tpe = make1<D, std::int64_t>("tpe", kE, 0);
    upload(tpe, counts);
    V1<D, float> ws("ws", KokkosMoE::aux_loss_workspace_size(kT, kE));
    V0<D, S> loss0("loss0"), loss1("loss1");
    auto c0 = make1<D, float>("c0", 2, -1.f), c1 = make1<D, float>("c1", 2, -2.f);
    KokkosMoE::aux_loss(exec, lcfg, p0, tpe, std::int64_t(kT), loss0, c0, ws);
    KokkosMoE::aux_loss(lcfg, p0, tpe, std::int64_t(kT), loss1, c1, ws);
    expect_same_bits(c0, c1, "aux_loss const_buf");
    expect_same_bits(loss0, loss1, "aux_loss loss");
    V0<D, std::int64_t> total("total");
    Kokkos::deep_copy(total, std::int64_t(kT));
    KokkosMoE::aux_loss(exec, lcfg, p0, tpe, total, loss0, c0, ws);
    KokkosMoE::aux_loss(lcfg, p0, tpe, total, loss1, c1, ws);
    expect_same_bits(c0, c1, "aux_loss (device total) const_buf");
    expect_same_bits(loss0, loss1, "aux_loss (device total) loss");
    V0<D, float> gl("gl");
    Kokkos::deep_copy(gl, 0.75f);
    auto h0 = make2<D, S>("h0", kT, kE, S(-1.f)), h1 = make2<D, S>("h1", kT, kE, S(-2.f));
    KokkosMoE::aux_loss_backward(exec, lcfg, c0, tpe, gl, h0);
    KokkosMoE::aux_loss_backward(lcfg, c0, tpe, gl, h1);
    expect_same_bits(h0, h1, "aux_loss_backward grad_probs");
  }

  // the finite check, with and without the instance
  auto bad = random_logits<D, float>(17);
  KokkosMoE::check_finite(bad);
  KokkosMoE::check_finite(bad, "scores");
  std::vector<float> h = download(bad);
  h[5 * kE + 3] = std::numeric_limits<float>::quiet_NaN();
  upload(bad, h);
  BOOST_CHECK_THROW(KokkosMoE::check_finite(bad), KokkosMoE::NonFiniteInput);
  BOOST_CHECK_THROW(KokkosMoE::check_finite(exec, bad), KokkosMoE::NonFiniteInput);
}

BOOST_AUTO_TEST_SUITE_END()
