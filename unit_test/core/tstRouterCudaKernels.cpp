/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// The native CUDA map backward has two kernels for the score functions whose gradient needs only the routed entries
// (Sigmoid, SqrtSoftplus, Softmax post): the sparse one the library runs (map first, then the routed entries
// gathered) and the streaming one (every chunk of the row loaded), which the test seam can force. They must give the
// same bits (docs/router.md §9, §17), for both map formats, every gradient type and every lane layout (E from 8 to
// 1024); the gradients of the default kernel are checked against the oracle by router_backward. The portable kernels
// route a token of at most 16 experts on one thread and larger ones on a thread's vector lanes; on small E the two
// variants must give the same bits too (the one-thread map backward sums in the lane reduction's order).

#include <KokkosMoE_Router.hpp>

#include <Kokkos_Core.hpp>

#include <boost/test/unit_test.hpp>
#include <impl/KokkosMoE_TestSeam.hpp>

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
namespace Seam = KokkosMoE::Impl::TestSeam;

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
    const Seam::Scoped<Seam::CudaBackwardKernel> guard(Seam::cuda_backward_kernel,
                                                       Seam::CudaBackwardKernel{streaming == 1});
    auto grad_logits = make2<D, G>("grad_logits", T, E, G(7.f));
    KokkosMoE::topk_router_backward(exec, cfg, map, inter, grad, grad_logits);
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

/// Runs f once with the portable kernels' default device geometry (a token of at most 16 experts on one thread) and
/// once with every token on a thread's vector lanes, and returns both results.
template <class F>
auto both_variants(const F& f) {
  using R = decltype(f());
  R r[2];
  for (int lanes = 0; lanes < 2; ++lanes) {
    const Seam::Scoped<Seam::PortableDeviceTokens> guard(Seam::portable_device_tokens,
                                                         Seam::PortableDeviceTokens{lanes == 1});
    r[lanes] = f();
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
  auto gradients = [&](const auto& backward) {
    return both_variants([&] {
      auto gl = make2<D, G>("grad_logits", T, E, G(7.f));
      backward(gl);
      exec.fence();
      return download(gl);
    });
  };
  BOOST_TEST_CONTEXT("E=" << E << " k=" << k << " score " << static_cast<int>(a.f) << (a.pre ? " pre" : "") << " map "
                          << map_cols << " cols, logits " << sizeof(S) << " B, grad " << sizeof(G) << " B") {
    const auto fwd = both_variants([&] {
      KokkosMoE::topk_router(exec, cfg, logits, probs, map, inter);
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
    expect_same(gradients([&](const auto& gl) { KokkosMoE::topk_router_backward(exec, cfg, map, inter, grad, gl); }),
                "map backward");
    KokkosMoE::topk_router_indices(exec, cfg, logits, probs, idx, inter);
    expect_same(
        gradients([&](const auto& gl) { KokkosMoE::topk_router_indices_backward(exec, cfg, idx, inter, grad, gl); }),
        "indices backward");
    const auto cw = both_variants([&] {
      KokkosMoE::topk_router_compact(exec, cfg, logits, ids, weights);
      exec.fence();
      return download(weights);
    });
    if (!softmax_pre) expect_same(cw, "compact weights");
    KokkosMoE::topk_router_compact(exec, cfg, logits, ids, weights);
    const auto cb = both_variants([&] {
      auto gl = make2<D, S>("grad_logits", T, E, S(7.f));
      KokkosMoE::topk_router_compact_backward(exec, cfg, logits, ids, grad_w, gl);
      exec.fence();
      return download(gl);
    });
    if (!softmax_pre) expect_same(cb, "compact backward");
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

BOOST_AUTO_TEST_SUITE_END()

#endif
