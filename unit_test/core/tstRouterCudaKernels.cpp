/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// The native CUDA map backward has two kernels for the score functions whose gradient needs only the routed entries
// (Sigmoid, SqrtSoftplus, Softmax post): the sparse one the library runs (map first, then the routed entries
// gathered) and the streaming one (every chunk of the row loaded), which the test seam can force. They must give the
// same bits (docs/router.md §9, §17), for both map formats, every gradient type and every lane layout (E from 8 to
// 1024); the gradients of the default kernel are checked against the oracle by router_backward.

#include <KokkosMoE_Router.hpp>

#include <Kokkos_Core.hpp>

#include <boost/test/unit_test.hpp>
#include <impl/KokkosMoE_TestSeam.hpp>

#include <cstdint>
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

}  // namespace

BOOST_AUTO_TEST_SUITE(router_cuda_kernels)

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
