/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTER_BACKWARDLAUNCH_CUH
#define KOKKOSMOE_ROUTER_BACKWARDLAUNCH_CUH

// The launchers of the backward operations (cuda/KokkosMoE_Router_Cuda_Backward.hpp): each lowers its typed argument
// struct to the kernel parameters, picks the kernel for the shape and launches it. Templates over the element
// types, instantiated per element type by KokkosMoE_Router_{F32,F16,BF16}.cu (KOKKOSMOE_ROUTER_INSTANTIATE_BACKWARD).

#include <cuda/KokkosMoE_Router_BackwardDense.cuh>
#include <cuda/KokkosMoE_Router_BackwardSparse.cuh>

namespace KokkosMoE {
namespace Impl {
namespace CudaKernels {
namespace detail {

template <class K, class Params>
cudaError_t launch_warps(K kern, const Params& P, int tpt, const Queue& q) {
  const int block = 128;
  const long long tok_per_block = 4LL * (32 / tpt);
  const long long work = (P.T + tok_per_block - 1) / tok_per_block;
  const int grid = persistent_grid(q.device, reinterpret_cast<const void*>(kern), block, 0, work);
  kern<<<grid, block, 0, q.stream>>>(P);
  return cudaGetLastError();
}

/// Lane layout of a row in vector chunks of 8 experts: TPT lanes per token, NC chunks per lane.
template <int TPT_, int NC_>
struct RowLayout {
  static constexpr int TPT = TPT_, NC = NC_;
};
/// Calls launch(RowLayout) with the smallest layout that holds E experts in one register tile (E <= 1024; longer
/// rows take the largest layout in tiles).
template <class Launch>
cudaError_t by_row_layout(int E, const Launch& launch) {
  if (E <= 8) return launch(RowLayout<1, 1>{});
  if (E <= 16) return launch(RowLayout<2, 1>{});
  if (E <= 32) return launch(RowLayout<4, 1>{});
  if (E <= 64) return launch(RowLayout<8, 1>{});
  if (E <= 128) return launch(RowLayout<16, 1>{});
  if (E <= 256) return launch(RowLayout<32, 1>{});
  if (E <= 512) return launch(RowLayout<32, 2>{});
  return launch(RowLayout<32, 4>{});
}

/// bwd_sparse with the lanes per token for k, vector stores where the rows allow them.
template <class Params>
cudaError_t sparse_dispatch(const Params& P, bool vec, const Queue& q) {
  const int k = P.k;
  if (vec) {
    if (k <= 2) return launch_warps(bwd_sparse<Params, 2, true>, P, 2, q);
    if (k <= 8) return launch_warps(bwd_sparse<Params, 8, true>, P, 8, q);
    return launch_warps(bwd_sparse<Params, 32, true>, P, 32, q);
  }
  if (k <= 2) return launch_warps(bwd_sparse<Params, 2, false>, P, 2, q);
  if (k <= 8) return launch_warps(bwd_sparse<Params, 8, false>, P, 8, q);
  return launch_warps(bwd_sparse<Params, 32, false>, P, 32, q);
}

/// Vector stores of the sparse kernels: E a multiple of the output's 16-byte width, the output and the
/// intermediate (where read) 16-byte aligned.
template <class G>
bool sparse_vec(int E, const void* out, const void* inter) {
  constexpr int VO = 16 / static_cast<int>(sizeof(typename Elem<G>::S));
  return E % VO == 0 && aligned16(out) && (inter == nullptr || aligned16(inter));
}

}  // namespace detail

template <class G>
cudaError_t backward(const MapBackward<G>& a, const Queue& q, const KernelChoice& choice) {
  if (!handles(a)) return cudaErrorInvalidValue;
  if (a.num_tokens <= 0) return cudaSuccess;
  const detail::DeviceGuard device(q);
  if (device.status() != cudaSuccess) return device.status();
  detail::DenseBwdParams<G, G> P;
  static_cast<detail::BwdRule&>(P) = detail::lower_rule(a.num_tokens, a.num_experts, a.rule);
  P.map_kind = a.bitmap ? 1 : 0;
  P.map = a.routing_map;
  P.inter = a.intermediate;
  P.gin = detail::storage(a.grad_probs);
  P.gout = detail::storage(a.grad_logits);
  // Sigmoid, SqrtSoftplus and Softmax post with E <= 1024 gather the routed entries, unless the choice asks for the
  // streaming kernel (both give the same bits); Softmax pre needs every entry and streams the rows.
  const bool sparse = !(P.fn == kFnSoftmax && P.pre) && P.E <= 1024;
  if (sparse && !choice.backward_streaming)
    return detail::by_row_layout(P.E, [&](auto L) {
      using Lay = decltype(L);
      return detail::launch_warps(detail::bwd_map_sparse<G, G, Lay::TPT, Lay::NC, 8>, P, Lay::TPT, q);
    });
  return detail::by_row_layout(P.E, [&](auto L) {
    using Lay = decltype(L);
    return detail::launch_warps(detail::bwd_dense<G, G, Lay::TPT, Lay::NC, 8>, P, Lay::TPT, q);
  });
}

template <class G, class I>
cudaError_t backward(const IndicesBackward<G, I>& a, const Queue& q) {
  if (a.num_tokens <= 0) return cudaSuccess;
  const detail::DeviceGuard device(q);
  if (device.status() != cudaSuccess) return device.status();
  detail::IndicesBwdParams<G, I> P;
  static_cast<detail::BwdRule&>(P) = detail::lower_rule(a.num_tokens, a.num_experts, a.rule);
  P.indices = a.indices;
  P.inter = a.intermediate;
  P.gin = detail::storage(a.grad_probs);
  P.gout = detail::storage(a.grad_logits);
  return detail::sparse_dispatch(P, detail::sparse_vec<G>(P.E, P.gout, P.inter), q);
}

template <class L, class GW>
cudaError_t backward(const CompactBackward<L, GW>& a, const Queue& q) {
  if (a.num_tokens <= 0) return cudaSuccess;
  const detail::DeviceGuard device(q);
  if (device.status() != cudaSuccess) return device.status();
  detail::CompactBwdParams<L, GW> P;
  static_cast<detail::BwdRule&>(P) = detail::lower_rule(a.num_tokens, a.num_experts, a.rule);
  P.logits = detail::storage(a.logits);
  P.ids = a.ids;
  P.gw = detail::storage(a.grad_weights);
  P.gout = detail::storage(a.grad_logits);
  return detail::sparse_dispatch(P, detail::sparse_vec<L>(P.E, P.gout, nullptr), q);
}

template <class G>
cudaError_t backward(const AuxScoresBackward<G>& a, const Queue& q) {
  if (!handles(a)) return cudaErrorInvalidValue;
  if (a.num_tokens <= 0) return cudaSuccess;
  const detail::DeviceGuard device(q);
  if (device.status() != cudaSuccess) return device.status();
  detail::DenseBwdParams<float, G> P;
  BackwardRule rule;
  rule.topk = 2;  // unused: the aux path always normalizes
  rule.score_function = a.score_function;
  static_cast<detail::BwdRule&>(P) = detail::lower_rule(a.num_tokens, a.num_experts, rule);
  P.aux = 1;
  P.inter = a.intermediate;
  P.gin = a.grad_scores;
  P.gout = detail::storage(a.grad_logits);
  // Every chunk is read. 32 lanes per token at every E: a lane sums its chunks in the same order whatever their
  // count, so up to 1024 experts are one register tile (one read of the row) with the bits of eight-expert tiles.
  if (P.E <= 256) return detail::launch_warps(detail::bwd_dense<float, G, 32, 1, 8>, P, 32, q);
  if (P.E <= 512) return detail::launch_warps(detail::bwd_dense<float, G, 32, 2, 8>, P, 32, q);
  return detail::launch_warps(detail::bwd_dense<float, G, 32, 4, 8>, P, 32, q);
}

}  // namespace CudaKernels
}  // namespace Impl
}  // namespace KokkosMoE

/// The backward launchers of one grad / logits element type G, as explicit instantiation definitions (inside
/// namespace KokkosMoE::Impl::CudaKernels); a 16-bit G adds its compact form with G gradient weights.
#define KOKKOSMOE_ROUTER_INSTANTIATE_BACKWARD(G)                                           \
  template cudaError_t backward(const MapBackward<G>&, const Queue&, const KernelChoice&); \
  template cudaError_t backward(const IndicesBackward<G, std::int16_t>&, const Queue&);    \
  template cudaError_t backward(const IndicesBackward<G, std::int32_t>&, const Queue&);    \
  template cudaError_t backward(const IndicesBackward<G, std::int64_t>&, const Queue&);    \
  template cudaError_t backward(const CompactBackward<G, float>&, const Queue&);           \
  template cudaError_t backward(const AuxScoresBackward<G>&, const Queue&)

#endif
