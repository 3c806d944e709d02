/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// Kernel variants that must give the same bits, forced through the kernel choice the specs take (KernelChoice, passed
// to the operations' Impl entries, impl/KokkosMoE_Router_Entry.hpp), each against the library's own choice:
// - the native CUDA map backward's sparse kernel (map first, then the routed entries gathered) and its streaming
//   one (every chunk of the row loaded), for Sigmoid, SqrtSoftplus and Softmax post (docs/router.md §9, §17), both
//   map formats, every gradient type and every lane layout (E from 8 to 1024);
// - the native forward's kernels: the lane kernel at chunk widths 8 and 4, the rounds and the candidate/threshold
//   register kernels, every output kind and aux_scores, on ties (a few distinct logit values) and on distinct values;
// - the portable kernels' one-thread and lane variants on small E (the one-thread map backward sums in the lane
//   reduction's order).
// The default kernels' outputs are checked against the oracle by the other router suites.

#include <KokkosMoE_AuxLoss.hpp>
#include <KokkosMoE_Router.hpp>

#include <Kokkos_Core.hpp>

#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "RouterTestUtils.hpp"

#if defined(KOKKOS_ENABLE_CUDA)

using namespace KokkosMoETest;

namespace {

using D = Kokkos::Cuda::device_type;
using KokkosMoE::Impl::aux_scores_with;
using KokkosMoE::Impl::KernelChoice;
using KokkosMoE::Impl::topk_router_backward_with;
using KokkosMoE::Impl::topk_router_compact_backward_with;
using KokkosMoE::Impl::topk_router_compact_with;
using KokkosMoE::Impl::topk_router_indices_backward_with;
using KokkosMoE::Impl::topk_router_indices_with;
using KokkosMoE::Impl::topk_router_with;

struct Mode {
  KokkosMoE::ScoreFunction f;
  int k;  ///< top-k, capped at E / 2
  float scale;
};

template <class G>
void compare_kernels(int T, int E, const Mode& m, KokkosMoE::RoutingMapFormat format, std::uint64_t seed) {
  KokkosMoE::RouterConfig cfg;
  cfg.topk = std::min(m.k, E / 2);
  cfg.score_function = m.f;
  cfg.scaling_factor = m.scale;
  cfg.map_format = format;
  const std::int64_t map_cols = format == KokkosMoE::RoutingMapFormat::BitmapU8 ? (E + 7) / 8 : E;
  Kokkos::Cuda exec;
  const auto logits = device_values<D, float>("logits", T, E, random_values<float>(std::size_t(T) * E, seed));
  auto probs = make2<D, float>("probs", T, E, 0.f);
  auto inter = make2<D, float>("inter", T, E, 0.f);
  auto map = make2<D, std::uint8_t>("map", T, map_cols, 0);
  KokkosMoE::topk_router(exec, cfg, logits, probs, map, inter);
  const auto grad = device_values<D, G>("grad_probs", T, E, random_values<G>(std::size_t(T) * E, seed + 1));
  std::vector<G> out[2];
  for (int streaming = 0; streaming < 2; ++streaming) {
    KernelChoice choice;
    choice.backward_streaming = streaming == 1;
    auto grad_logits = make2<D, G>("grad_logits", T, E, G(7.f));
    topk_router_backward_with(choice, exec, cfg, map, inter, grad, grad_logits);
    exec.fence();
    out[streaming] = download(grad_logits);
  }
  int nonzero = 0;
  for (const G& v : out[0]) nonzero += static_cast<float>(v) != 0.f;
  BOOST_TEST_CONTEXT("E=" << E << " k=" << cfg.topk << " score " << static_cast<int>(m.f) << " map "
                          << (format == KokkosMoE::RoutingMapFormat::BitmapU8 ? "BitmapU8" : "Bytemap") << " grad "
                          << sizeof(G) << " B") {
    BOOST_TEST(nonzero > 0);  // the comparison is not between two untouched outputs
    BOOST_TEST(bytes_equal(out[0], out[1]), "the sparse and the streaming map backward differ");
  }
}

/// Runs f(choice) once with the portable kernels' default device geometry (a token of at most 16 experts on one
/// thread) and once with every token on a thread's vector lanes, and returns both results.
template <class F>
auto both_variants(const F& f) {
  using R = decltype(f(KernelChoice{}));
  R r[2];
  for (int lanes = 0; lanes < 2; ++lanes) {
    KernelChoice choice;
    choice.portable_lanes_only = lanes == 1;
    r[lanes] = f(choice);
  }
  return std::pair<R, R>(r[0], r[1]);
}

/// Both results bit for bit; every element of a float output written (none left at the sentinel 7 the Views were
/// filled with), so that the comparison is never between two untouched outputs.
template <class T>
void expect_same(const std::pair<std::vector<T>, std::vector<T>>& r, const char* what) {
  if constexpr (!std::is_integral_v<T>) {
    int untouched = 0;
    for (const T& v : r.first) untouched += static_cast<float>(v) == 7.f;
    BOOST_TEST(untouched == 0, what << ": " << untouched << " elements not written");
  }
  BOOST_TEST(bytes_equal(r.first, r.second), what << ": the thread and the lane variant differ");
}

/// The portable kernels on one thread per token against their lane variant (E <= 16): every output bit for bit,
/// except the forward of Softmax pre (its row sum runs in the variant's order, docs/router.md §17).
template <class S, class G>
void compare_portable_variants(int T, int E, const Oracle::Attr& a, KokkosMoE::RoutingMapFormat format,
                               std::uint64_t seed) {
  KokkosMoE::RouterConfig cfg = to_config(a);
  cfg.map_format = format;
  cfg.implementation = KokkosMoE::Implementation::Portable;
  const int k = a.topk;
  const bool softmax_pre = a.f == Oracle::Score::Softmax && a.pre;
  const std::int64_t map_cols = format == KokkosMoE::RoutingMapFormat::BitmapU8 ? (E + 7) / 8 : E;
  Kokkos::Cuda exec;
  const auto logits = device_values<D, S>("logits", T, E, random_values<S>(std::size_t(T) * E, seed, -3, 3));
  const auto grad = device_values<D, G>("grad_probs", T, E, random_values<G>(std::size_t(T) * E, seed + 1));
  const auto grad_w = device_values<D, float>("grad_weights", T, k, random_values<float>(std::size_t(T) * k, seed + 2));
  auto probs = make2<D, S>("probs", T, E, S(7.f));
  auto inter = make2<D, float>("inter", T, E, 7.f);
  auto map = make2<D, std::uint8_t>("map", T, map_cols, 0xA5);
  auto idx = make2<D, std::int32_t>("indices", T, k, -3);
  auto ids = make2<D, std::int32_t>("ids", T, k, -3);
  auto weights = make2<D, float>("weights", T, k, 7.f);
  // the backward of both variants on the same inputs, into a fresh gradient View each
  const V1<D, const float> no_bias;
  auto gradients = [&](const auto& backward) {
    return both_variants([&](const KernelChoice& choice) {
      auto gl = make2<D, G>("grad_logits", T, E, G(7.f));
      backward(choice, gl);
      exec.fence();
      return download(gl);
    });
  };
  BOOST_TEST_CONTEXT("E=" << E << " k=" << k << " score " << static_cast<int>(a.f) << (a.pre ? " pre" : "") << " map "
                          << map_cols << " cols, logits " << sizeof(S) << " B, grad " << sizeof(G) << " B") {
    const auto fwd = both_variants([&](const KernelChoice& choice) {
      topk_router_with(choice, exec, cfg, logits, no_bias, probs, map, inter);
      exec.fence();
      return std::make_tuple(download(probs), download(inter), download(map));
    });
    if (!softmax_pre) {
      expect_same(std::make_pair(std::get<0>(fwd.first), std::get<0>(fwd.second)), "forward probs");
      expect_same(std::make_pair(std::get<1>(fwd.first), std::get<1>(fwd.second)), "forward intermediate");
      expect_same(std::make_pair(std::get<2>(fwd.first), std::get<2>(fwd.second)), "forward map");
    }
    // the backwards of both variants read the same forward outputs: the default variant's, left in the Views
    KokkosMoE::topk_router(exec, cfg, logits, probs, map, inter);
    expect_same(gradients([&](const KernelChoice& c, const auto& gl) {
                  topk_router_backward_with(c, exec, cfg, map, inter, grad, gl);
                }),
                "map backward");
    KokkosMoE::topk_router_indices(exec, cfg, logits, probs, idx, inter);
    expect_same(gradients([&](const KernelChoice& c, const auto& gl) {
                  topk_router_indices_backward_with(c, exec, cfg, idx, inter, grad, gl);
                }),
                "indices backward");
    const auto cw = both_variants([&](const KernelChoice& choice) {
      topk_router_compact_with(choice, exec, cfg, logits, no_bias, ids, weights);
      exec.fence();
      return download(weights);
    });
    if (!softmax_pre) expect_same(cw, "compact weights");
    KokkosMoE::topk_router_compact(exec, cfg, logits, ids, weights);
    const auto cb = both_variants([&](const KernelChoice& choice) {
      auto gl = make2<D, S>("grad_logits", T, E, S(7.f));
      topk_router_compact_backward_with(choice, exec, cfg, logits, ids, grad_w, gl);
      exec.fence();
      return download(gl);
    });
    if (!softmax_pre) expect_same(cb, "compact backward");
  }
}

/// The native forward's outputs (every kind, and aux_scores where the config has no grouping) under \p choice.
template <class S>
struct ForwardOutputs {
  std::vector<S> probs, probs_idx;
  std::vector<float> inter, weights, scores, aux_inter;
  std::vector<std::uint8_t> map, bitmap, aux_map;
  std::vector<std::int32_t> indices, ids;
};

template <class S, class Logits, class Bias>
ForwardOutputs<S> forward_outputs(const KernelChoice& choice, const KokkosMoE::RouterConfig& config,
                                  const Logits& logits, const Bias& bias) {
  const std::int64_t T = logits.extent(0), E = logits.extent(1);
  const int k = config.topk;
  Kokkos::Cuda exec;
  ForwardOutputs<S> r;
  KokkosMoE::RouterConfig cfg = config;
  auto probs = make2<D, S>("probs", T, E, S(7.f));
  auto inter = make2<D, float>("inter", T, E, 7.f);
  auto map = make2<D, std::uint8_t>("map", T, E, 0xA5);
  cfg.map_format = KokkosMoE::RoutingMapFormat::Bytemap;
  topk_router_with(choice, exec, cfg, logits, bias, probs, map, inter);
  r.probs = download(probs);
  r.inter = download(inter);
  r.map = download(map);
  auto bitmap = make2<D, std::uint8_t>("bitmap", T, (E + 7) / 8, 0xA5);
  cfg.map_format = KokkosMoE::RoutingMapFormat::BitmapU8;
  topk_router_with(choice, exec, cfg, logits, bias, probs, bitmap, inter);
  r.bitmap = download(bitmap);
  auto idx = make2<D, std::int32_t>("indices", T, k, -3);
  topk_router_indices_with(choice, exec, config, logits, bias, probs, idx, inter);
  r.indices = download(idx);
  r.probs_idx = download(probs);
  auto ids = make2<D, std::int32_t>("ids", T, k, -3);
  auto weights = make2<D, float>("weights", T, k, 7.f);
  topk_router_compact_with(choice, exec, config, logits, bias, ids, weights);
  r.ids = download(ids);
  r.weights = download(weights);
  if (!config.grouped() && bias.size() == 0 &&
      !(config.score_function == KokkosMoE::ScoreFunction::Softmax && config.use_pre_softmax)) {
    KokkosMoE::AuxScoresConfig acfg;
    acfg.topk = k;
    acfg.score_function = config.score_function;
    auto scores = make2<D, float>("scores", T, E, 7.f);
    auto aux_inter = make2<D, float>("aux_inter", T, E, 7.f);
    auto aux_map = make2<D, std::uint8_t>("aux_map", T, E, 0xA5);
    aux_scores_with(choice, exec, acfg, logits, scores, aux_map, aux_inter);
    r.scores = download(scores);
    r.aux_inter = download(aux_inter);
    r.aux_map = download(aux_map);
  }
  exec.fence();
  return r;
}

/// Every forward output of \p choice bit for bit equal to the library's choice; with \p selection_only (Softmax
/// pre, whose row sum each kernel associates in its own lane layout, docs/design.md) the selections only.
template <class S>
void expect_same_forward(const ForwardOutputs<S>& a, const ForwardOutputs<S>& b, bool selection_only) {
  BOOST_TEST(bytes_equal(a.map, b.map), "Bytemap differs");
  BOOST_TEST(bytes_equal(a.bitmap, b.bitmap), "BitmapU8 differs");
  BOOST_TEST(bytes_equal(a.indices, b.indices), "indices differ");
  BOOST_TEST(bytes_equal(a.ids, b.ids), "compact ids differ");
  if (selection_only) return;
  BOOST_TEST(bytes_equal(a.probs, b.probs), "probs differ");
  BOOST_TEST(bytes_equal(a.inter, b.inter), "intermediate differs");
  BOOST_TEST(bytes_equal(a.probs_idx, b.probs_idx), "probs (indices form) differ");
  BOOST_TEST(bytes_equal(a.weights, b.weights), "compact weights differ");
  // aux_scores: the selection; its scores and (Softmax) intermediate are full-row sums, which each register kernel
  // associates in its own lane layout (the small-E 4-wide layout or the 8-wide one), so they are checked against the
  // oracle by the aux_scores suite instead
  BOOST_TEST(bytes_equal(a.aux_map, b.aux_map), "aux map differs");
}

/// The native forward under each forced kernel choice against the library's choice, on distinct logits and on
/// logits with many exact ties (four distinct values), so that the tie rule of each kernel is compared too.
template <class S>
void compare_forward_kernels(int T, int E, const KokkosMoE::RouterConfig& config, bool with_bias, std::uint64_t seed) {
  std::vector<KernelChoice> forced(3);
  forced[0].forward_threshold_only = true;
  forced[1].forward_lane_width = 8;
  forced[2].forward_lane_width = 4;
  const auto bias = with_bias ? device_vector<D, float>("bias", random_values<float>(E, seed + 7, -0.5, 0.5))
                              : V1<D, float>("bias", 0);
  const V1<D, const float> cbias = bias;
  for (const bool ties : {false, true}) {
    std::vector<double> values = random_values<S>(std::size_t(T) * E, seed, -3, 3);
    if (ties)
      for (double& v : values) v = std::floor((v + 3.0) * 4.0 / 6.0) * 0.5 - 1.0;  // {-1, -0.5, 0, 0.5}
    const auto logits = device_values<D, S>("logits", T, E, values);
    const ForwardOutputs<S> library = forward_outputs<S>(KernelChoice{}, config, logits, cbias);
    for (const KernelChoice& c : forced)
      BOOST_TEST_CONTEXT("E=" << E << " k=" << config.topk << " score " << static_cast<int>(config.score_function)
                              << (config.use_pre_softmax ? " pre" : "") << " G=" << config.num_groups
                              << " gk=" << config.group_topk << (with_bias ? " bias" : "") << (ties ? " ties" : "")
                              << " logits " << sizeof(S) << " B, threshold_only " << c.forward_threshold_only
                              << " lane_width " << c.forward_lane_width) {
        expect_same_forward(library, forward_outputs<S>(c, config, logits, cbias),
                            config.score_function == KokkosMoE::ScoreFunction::Softmax && config.use_pre_softmax);
      }
  }
}
}  // namespace

BOOST_AUTO_TEST_SUITE(router_cuda_kernels)

BOOST_AUTO_TEST_CASE(portable_thread_and_lane_variants_agree) {
  using F = Oracle::Score;
  std::uint64_t seed = 0x7e;
  for (const int E : {1, 2, 3, 5, 8, 11, 16})
    for (const int k : {1, 2, 3, 5, 16}) {
      if (k > E) continue;
      for (const auto format : {KokkosMoE::RoutingMapFormat::Bytemap, KokkosMoE::RoutingMapFormat::BitmapU8}) {
        compare_portable_variants<float, float>(301, E, make_attr(F::Sigmoid, false, k, 0, 0, 2.5), format, ++seed);
        compare_portable_variants<KokkosMoE::bf16_t, KokkosMoE::bf16_t>(301, E, make_attr(F::SqrtSoftplus, false, k),
                                                                        format, ++seed);
        compare_portable_variants<float, KokkosMoE::bf16_t>(301, E, make_attr(F::Softmax, false, k, 0, 0, 1.3), format,
                                                            ++seed);
        compare_portable_variants<KokkosMoE::bf16_t, KokkosMoE::bf16_t>(301, E, make_attr(F::Softmax, true, k), format,
                                                                        ++seed);
      }
    }
}

BOOST_AUTO_TEST_CASE(map_backward_sparse_equals_streaming) {
  const Mode modes[] = {{KokkosMoE::ScoreFunction::Sigmoid, 8, 2.5f},
                        {KokkosMoE::ScoreFunction::Sigmoid, 1, 1.f},
                        {KokkosMoE::ScoreFunction::SqrtSoftplus, 6, 1.f},
                        {KokkosMoE::ScoreFunction::Softmax, 2, 1.f},
                        {KokkosMoE::ScoreFunction::Softmax, 32, 1.3f}};
  std::uint64_t seed = 0xb3;
  for (const int E : {8, 16, 24, 32, 64, 128, 200, 256, 384, 512, 1024})
    for (const Mode& m : modes)
      for (const auto format : {KokkosMoE::RoutingMapFormat::Bytemap, KokkosMoE::RoutingMapFormat::BitmapU8}) {
        compare_kernels<float>(301, E, m, format, ++seed);
        compare_kernels<KokkosMoE::bf16_t>(301, E, m, format, ++seed);
        compare_kernels<KokkosMoE::fp16_t>(301, E, m, format, ++seed);
      }
}

BOOST_AUTO_TEST_CASE(forward_kernel_choices_agree) {
  using SF = KokkosMoE::ScoreFunction;
  std::uint64_t seed = 0xf0;
  for (const int E : {4, 8, 16, 24, 32, 64, 96, 128, 130, 256, 384, 512, 768, 1024}) {
    struct Case {
      SF f;
      bool pre;
      int k, G, gk;
      bool bias;
    };
    const Case cases[] = {{SF::Sigmoid, false, 8, 0, 0, true},   {SF::Softmax, false, 2, 0, 0, false},
                          {SF::Softmax, true, 4, 0, 0, false},   {SF::SqrtSoftplus, false, 6, 0, 0, false},
                          {SF::Softmax, false, 32, 0, 0, false}, {SF::Sigmoid, false, 8, 8, 4, true}};
    for (const Case& c : cases) {
      if (c.k > E / 2 && E > 2) continue;
      if (c.G > 0 && (E % c.G != 0 || E / c.G < 2)) continue;
      KokkosMoE::RouterConfig cfg;
      cfg.topk = c.k;
      cfg.score_function = c.f;
      cfg.use_pre_softmax = c.pre;
      cfg.num_groups = c.G;
      cfg.group_topk = c.gk;
      cfg.scaling_factor = 1.5f;
      compare_forward_kernels<float>(257, E, cfg, c.bias, ++seed);
      compare_forward_kernels<KokkosMoE::bf16_t>(257, E, cfg, c.bias, ++seed);
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

#endif
