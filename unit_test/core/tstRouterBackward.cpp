/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// topk_router backward (docs/router.md §9) and the compact backward (§5.5) for every forward variant: the grid of §16.3
// with gradients against the oracle (Bytemap vs BitmapU8 bit-identical, indices within tolerance, compact == dense
// backward of the scattered gradient, non-routed entries exactly +0.0 except Softmax pre, NaN upstream gradients at
// non-routed positions never read, a zero upstream gradient gives +0.0 everywhere), more routed experts per token than
// the host's block lists hold, plus finite-difference checks of the library's own FP32 forward.

#include <KokkosMoE_EnableDeviceTypes.hpp>

#include <boost/test/unit_test.hpp>

#include "RouterGrid.hpp"

using namespace KokkosMoETest;
using Oracle::Score;

namespace {

/// Library FP32 forward (dense probs with Bytemap, and compact weights) at logits x.
template <class D>
struct FwdProbe {
  std::vector<float> probs, weights;
  std::vector<std::uint8_t> map;
};
template <class D>
FwdProbe<D> probe(const KokkosMoE::RouterConfig& cfg, int T, int E, const std::vector<double>& x,
                  const V1<D, const float>& bias) {
  const auto logits = device_values<D, float>("logits", T, E, x);
  const auto dense = run_forward<D, float, float>(cfg, Out::Bytemap, logits, bias);
  const auto compact = run_forward<D, float, float>(cfg, Out::Compact, logits, bias);
  FwdProbe<D> p;
  p.probs = download(dense.probs);
  p.map = download(dense.map);
  p.weights = download(compact.weights);
  return p;
}

/// Central differences of the library's FP32 forward against its backward (map, int32 indices and compact).
template <class D>
void library_fd_case(const Oracle::Attr& a, bool with_bias, std::uint64_t seed) {
  using Exec = typename D::execution_space;
  const int T = 4, E = 16, k = a.topk;
  // decision margins far above the step's effect (h = 1e-3 moves a score by at most ~1e-3 * 0.5) keep the routing
  // fixed; asserted below
  const RouterInputs in = generate_router_inputs<float>(a, T, E, with_bias, seed, 4e-3);
  const std::vector<double> gp = random_values<float>(static_cast<std::size_t>(T) * E, seed + 1);
  const std::vector<double> gw = random_values<float>(static_cast<std::size_t>(T) * k, seed + 2);
  V1<D, const float> bias;
  if (with_bias) bias = device_vector<D, float>("bias", in.b);
  for (const auto impl : kImpls) {
    KokkosMoE::RouterConfig cfg = to_config(a);
    cfg.implementation = impl;
    BOOST_TEST_CONTEXT(describe(a, T, E, with_bias, "float") << " " << impl_name(impl) << " [" << Exec::name() << "]") {
      Exec exec{};
      const auto logits = device_values<D, float>("logits", T, E, in.x);
      const auto dense = run_forward<D, float, float>(cfg, Out::Bytemap, logits, bias);
      const auto idx = run_forward<D, float, float>(cfg, Out::I32, logits, bias);
      const auto comp = run_forward<D, float, float>(cfg, Out::Compact, logits, bias);
      const auto gpd = device_values<D, float>("grad_probs", T, E, gp);
      const auto gwd = device_values<D, float>("grad_weights", T, k, gw);
      auto g_map = make2<D, float>("g", T, E, kSentinel), g_idx = make2<D, float>("g", T, E, kSentinel),
           g_cmp = make2<D, float>("g", T, E, kSentinel);
      KokkosMoE::topk_router_backward(exec, cfg, dense.map, dense.inter, gpd, g_map);
      KokkosMoE::topk_router_indices_backward(exec, cfg, idx.i32, idx.inter, gpd, g_idx);
      KokkosMoE::topk_router_compact_backward(exec, cfg, logits, comp.ids, gwd, g_cmp);
      exec.fence();
      const auto an_map = download(g_map), an_idx = download(g_idx), an_cmp = download(g_cmp);
      const auto base_map = download(dense.map);
      Mismatches m("finite differences vs backward");
      for (int e = 0; e < E; ++e) {
        std::vector<double> xp = in.x, xm = in.x;
        for (int t = 0; t < T; ++t) {
          const std::size_t i = static_cast<std::size_t>(t) * E + e;
          xp[i] = static_cast<float>(in.x[i] + 1e-3);
          xm[i] = static_cast<float>(in.x[i] - 1e-3);
        }
        const FwdProbe<D> P = probe<D>(cfg, T, E, xp, bias), M = probe<D>(cfg, T, E, xm, bias);
        BOOST_TEST_REQUIRE(bytes_equal(P.map, base_map), "the step changed the routing (e=" << e << ")");
        BOOST_TEST_REQUIRE(bytes_equal(M.map, base_map), "the step changed the routing (e=" << e << ")");
        for (int t = 0; t < T; ++t) {
          const std::size_t i = static_cast<std::size_t>(t) * E + e;
          double lp = 0, lm = 0, cp = 0, cm = 0;
          for (int j = 0; j < E; ++j) {
            lp += gp[t * E + j] * P.probs[t * E + j];
            lm += gp[t * E + j] * M.probs[t * E + j];
          }
          for (int j = 0; j < k; ++j) {
            cp += gw[t * k + j] * P.weights[t * k + j];
            cm += gw[t * k + j] * M.weights[t * k + j];
          }
          const double h2 = xp[i] - xm[i];
          const double fd = (lp - lm) / h2, fdc = (cp - cm) / h2;
          auto ok = [](double f, double g) { return std::fabs(f - g) <= 2e-3 + 2e-2 * std::fabs(g); };
          if (!ok(fd, an_map[i]) || !ok(fd, an_idx[i]) || !ok(fdc, an_cmp[i]))
            m.add([&](std::ostream& os) {
              os << "(t=" << t << ", e=" << e << ") fd " << fd << " map " << an_map[i] << " indices " << an_idx[i]
                 << " | compact fd " << fdc << " compact " << an_cmp[i];
            });
        }
      }
      m.report();
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(router_backward)

BOOST_AUTO_TEST_CASE_TEMPLATE(grid_float, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  run_router_grid<DeviceType, float>(RunFlags{true, true}, 0xBF32);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(grid_fp16, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  run_router_grid<DeviceType, fp16_t>(RunFlags{true, true}, 0xBF16);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(grid_bf16, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  run_router_grid<DeviceType, bf16_t>(RunFlags{true, true}, 0xBB16);
}

// More routed experts per token than the host map backward's per-token lists hold (32): such tokens take the
// per-token path, the others the interleaved one; 23 tokens leave a partial block of tokens.
BOOST_AUTO_TEST_CASE_TEMPLATE(many_routed_experts, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  std::uint64_t seed = 0xB10C;
  for (const Score f : {Score::Sigmoid, Score::Softmax})
    for (const int k : {32, 33, 48}) {
      const auto c = make_random_case<DeviceType, float>(make_attr(f, false, k), 23, 256, false, ++seed);
      run_router_case(c, RunFlags{true, true});
    }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(finite_differences, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  std::uint64_t seed = 1;
  for (const Mode& m : kModes)
    for (int k : {1, 2, 4})
      for (int grouped = 0; grouped < 2; ++grouped) {
        const Oracle::Attr a = make_attr(m.f, m.pre, k, grouped ? 4 : 0, grouped ? 2 : 0, 1.2);
        if (!grouping_valid(16, k, a.G, a.gk)) continue;
        library_fd_case<DeviceType>(a, m.bias, ++seed * 7919);
      }
}

// grad_probs in another type than the forward's logits (grad_logits follows grad_probs, docs/router.md §2).
BOOST_AUTO_TEST_CASE_TEMPLATE(gradient_type_independent_of_logits_type, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using D = DeviceType;
  using Exec = typename D::execution_space;
  const int T = 50, E = 64;
  for (const Mode& m : kModes) {
    const Oracle::Attr a = make_attr(m.f, m.pre, 4, 0, 0, 1.2);
    const auto c = make_random_case<D, float>(a, T, E, m.bias, 0xAB + static_cast<int>(m.f));
    const auto fwd = run_forward<D, float, float>(to_config(a), Out::Bitmap, c.logits, c.bias);
    const std::vector<double> gp = random_values<bf16_t>(static_cast<std::size_t>(T) * E, 5);
    const auto gpd = device_values<D, bf16_t>("grad_probs", T, E, gp);
    auto gl = make2<D, bf16_t>("grad_logits", T, E, Num<bf16_t>::make(kSentinel));
    KokkosMoE::RouterConfig cfg = to_config(a);
    cfg.map_format = KokkosMoE::RoutingMapFormat::BitmapU8;
    Exec exec{};
    KokkosMoE::topk_router_backward(exec, cfg, fwd.map, fwd.inter, gpd, gl);
    exec.fence();
    std::vector<std::vector<double>> ref(T);
    for (int t = 0; t < T; ++t)
      ref[t] = Oracle::backward_row(a, c.ref[t].routed, c.ref[t].inter, gp.data() + static_cast<std::size_t>(t) * E);
    check_grad(c.name + " bf16 gradients of a float forward", download(gl), ref, c.ref, m.f == Score::Softmax && m.pre,
               T, E);
  }
}

// Non-finite values of the saved intermediate and of grad_probs at non-routed positions never leak (docs/router.md §9):
// the gradients are bitwise those of a clean run.
BOOST_AUTO_TEST_CASE_TEMPLATE(non_routed_values_never_read, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using D = DeviceType;
  using Exec = typename D::execution_space;
  const int T = 40, E = 32;
  for (const Mode& m : kModes) {
    if (m.f == Score::Softmax && m.pre) continue;  // Softmax pre reads the whole row by definition
    const Oracle::Attr a = make_attr(m.f, m.pre, 4, 0, 0, 1.0);
    const auto c = make_random_case<D, float>(a, T, E, m.bias, 0x515 + static_cast<int>(m.f));
    for (const Out out : {Out::Bytemap, Out::Bitmap, Out::I64}) {
      KokkosMoE::RouterConfig cfg = to_config(a);
      cfg.map_format =
          out == Out::Bitmap ? KokkosMoE::RoutingMapFormat::BitmapU8 : KokkosMoE::RoutingMapFormat::Bytemap;
      const auto fwd = run_forward<D, float, float>(cfg, out, c.logits, c.bias);
      std::vector<double> gp = random_values<float>(static_cast<std::size_t>(T) * E, 11);
      std::vector<float> inter = download(fwd.inter);
      std::vector<double> gp_dirty = gp;
      for (int t = 0; t < T; ++t)
        for (int e = 0; e < E; ++e)
          if (!c.ref[t].routed[e]) {
            const std::size_t i = static_cast<std::size_t>(t) * E + e;
            gp_dirty[i] = (e % 2) ? Oracle::qnan() : Oracle::inf();
            gp[i] = 0.0;
            inter[i] = (e % 3) ? std::numeric_limits<float>::quiet_NaN() : -std::numeric_limits<float>::infinity();
          }
      const auto inter_dirty = make2<D, float>("inter", T, E, 0.0f);
      upload(inter_dirty, inter);
      std::vector<float> g[2];
      for (int dirty = 0; dirty < 2; ++dirty) {
        const auto gpd = device_values<D, float>("grad_probs", T, E, dirty ? gp_dirty : gp);
        auto gl = make2<D, float>("grad_logits", T, E, kSentinel);
        Exec exec{};
        const V2<D, const float> in_inter = dirty ? V2<D, const float>(inter_dirty) : V2<D, const float>(fwd.inter);
        if (out == Out::I64)
          KokkosMoE::topk_router_indices_backward(exec, cfg, fwd.i64, in_inter, gpd, gl);
        else
          KokkosMoE::topk_router_backward(exec, cfg, fwd.map, in_inter, gpd, gl);
        exec.fence();
        g[dirty] = download(gl);
      }
      BOOST_TEST(bytes_equal(g[0], g[1]), c.name << " " << out_name(out) << ": non-routed NaN/inf leaked");
      int nonzero = 0;
      for (int t = 0; t < T; ++t)
        for (int e = 0; e < E; ++e)
          if (!c.ref[t].routed[e]) nonzero += !is_plus_zero(g[1][static_cast<std::size_t>(t) * E + e]);
      BOOST_TEST(nonzero == 0);
    }
  }
}

// A zero upstream gradient at every routed position (and at every slot of the compact form) makes every term of §9
// zero: the sums are +0, so every gradient, Softmax pre's non-routed `a * (0 - P)` included, is exactly +0.0, never
// -0.0 (as `-a * P` would give). grad_probs is non-zero at the non-routed positions, which §9 never reads.
template <class D, class S>
void zero_upstream_case(const Mode& m, int T, int E, int k, std::uint64_t seed) {
  using Exec = typename D::execution_space;
  const Oracle::Attr a = make_attr(m.f, m.pre, k, 0, 0, 1.5);
  const auto c = make_random_case<D, S>(a, T, E, m.bias, seed);
  std::vector<double> gp = random_values<S>(static_cast<std::size_t>(T) * E, seed + 1);
  for (int t = 0; t < T; ++t)
    for (int e = 0; e < E; ++e)
      if (c.ref[t].routed[e]) gp[static_cast<std::size_t>(t) * E + e] = 0.0;
  const auto gpd = device_values<D, S>("grad_probs", T, E, gp);
  const auto gwd = make2<D, S>("grad_weights", T, k, Num<S>::make(0.0f));
  for (const auto impl : kImpls)
    for (const Out out : {Out::Bytemap, Out::Bitmap, Out::I32, Out::Compact}) {
      KokkosMoE::RouterConfig cfg = to_config(a);
      cfg.implementation = impl;
      cfg.map_format =
          out == Out::Bitmap ? KokkosMoE::RoutingMapFormat::BitmapU8 : KokkosMoE::RoutingMapFormat::Bytemap;
      const auto fwd = run_forward<D, S, S>(cfg, out, c.logits, c.bias);
      auto gl = make2<D, S>("grad_logits", T, E, Num<S>::make(kSentinel));
      Exec exec{};
      if (out == Out::Compact)
        KokkosMoE::topk_router_compact_backward(exec, cfg, c.logits, fwd.ids, gwd, gl);
      else if (out == Out::I32)
        KokkosMoE::topk_router_indices_backward(exec, cfg, fwd.i32, fwd.inter, gpd, gl);
      else
        KokkosMoE::topk_router_backward(exec, cfg, fwd.map, fwd.inter, gpd, gl);
      exec.fence();
      const std::vector<S> g = download(gl);
      Mismatches z(c.name + " " + impl_name(impl) + " " + out_name(out) + ": a zero upstream gradient gives +0.0");
      for (std::size_t i = 0; i < g.size(); ++i)
        if (!is_plus_zero(g[i]))
          z.add([&](std::ostream& os) { os << "(t=" << i / E << ", e=" << i % E << ") got " << Num<S>::value(g[i]); });
      z.report();
    }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(zero_upstream_gradient_is_plus_zero, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  static const int kEk[][2] = {{8, 2}, {96, 4}, {256, 8}};
  std::uint64_t seed = 0x2E80;
  for (const Mode& m : kModes)
    for (const auto& ek : kEk) {
      zero_upstream_case<DeviceType, float>(m, 33, ek[0], ek[1], ++seed);
      zero_upstream_case<DeviceType, bf16_t>(m, 33, ek[0], ek[1], ++seed);
    }
}

BOOST_AUTO_TEST_SUITE_END()
