/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTER_CUDA_BACKWARD_HPP
#define KOKKOSMOE_ROUTER_CUDA_BACKWARD_HPP

// The native backward operations (docs/router.md §9, §10), one argument struct each, typed by the element types of
// their operands: grad G in {float, fp16_t, bf16_t}, dense indices I in {int16_t, int32_t, int64_t}, the compact
// form's logits L and gradient weights GW in {float, L}. cuda/KokkosMoE_Router_CudaSpec.hpp fills them from the
// canonical Views; `handles()` says whether the native kernels take the call (host-side, no CUDA call), and where they
// do not the spec runs the portable kernel on the same instance. The launchers are templates explicitly instantiated
// per element type (KokkosMoE_Router_{F32,F16,BF16}.cu); like every launcher here they only enqueue on the queue's
// stream. Everything is validated already (docs/router.md §4): rows are contiguous, row offsets 64-bit.

#include <KokkosMoE_RouterConfig.hpp>

#include <cuda/KokkosMoE_Router_Cuda_Params.hpp>  // aligned16
#include <cuda_runtime_api.h>
#include <impl/KokkosMoE_Router_KernelChoice.hpp>

#include <cstdint>

namespace KokkosMoE {
namespace Impl {
namespace CudaKernels {

struct Queue;

/// What every backward takes from the RouterConfig.
struct BackwardRule {
  int topk = 1;
  ScoreFunction score_function = ScoreFunction::Softmax;
  bool pre_softmax = false;  ///< Softmax with use_pre_softmax
  float scaling_factor = 1.0f;

  static BackwardRule of(const RouterConfig& c) {
    BackwardRule r;
    r.topk = c.topk;
    r.score_function = c.score_function;
    r.pre_softmax = c.score_function == ScoreFunction::Softmax && c.use_pre_softmax;
    r.scaling_factor = c.scaling_factor;
    return r;
  }
};

/// topk_router_backward: routing map (Bytemap [T, E] or BitmapU8 [T, ceil(E/8)]) + intermediate + grad_probs ->
/// grad_logits.
template <class G>
struct MapBackward {
  std::int64_t num_tokens = 0;
  int num_experts = 0;
  BackwardRule rule;
  bool bitmap = false;
  const std::uint8_t* routing_map = nullptr;
  const float* intermediate = nullptr;
  const G* grad_probs = nullptr;
  G* grad_logits = nullptr;
};

/// topk_router_indices_backward: dense indices [T, k] + intermediate + grad_probs -> grad_logits.
template <class G, class I>
struct IndicesBackward {
  std::int64_t num_tokens = 0;
  int num_experts = 0;
  BackwardRule rule;
  const I* indices = nullptr;
  const float* intermediate = nullptr;
  const G* grad_probs = nullptr;
  G* grad_logits = nullptr;
};

/// topk_router_compact_backward: logits + ids [T, k] + grad_weights [T, k] -> grad_logits (the logits' type).
template <class L, class GW>
struct CompactBackward {
  std::int64_t num_tokens = 0;
  int num_experts = 0;
  BackwardRule rule;
  const L* logits = nullptr;
  const std::int32_t* ids = nullptr;
  const GW* grad_weights = nullptr;
  L* grad_logits = nullptr;
};

/// aux_scores_backward: intermediate [T, E] + grad_scores [T, E] (FP32) -> grad_logits.
template <class G>
struct AuxScoresBackward {
  std::int64_t num_tokens = 0;
  int num_experts = 0;
  ScoreFunction score_function = ScoreFunction::Softmax;
  const float* intermediate = nullptr;
  const float* grad_scores = nullptr;
  G* grad_logits = nullptr;
};

/// The map and aux-score kernels move rows in chunks of eight experts: E a multiple of 8 and every row array 16-byte
/// aligned. Other shapes run the portable kernel.
template <class G>
bool handles(const MapBackward<G>& a) {
  using detail::aligned16;
  return a.num_experts % 8 == 0 && aligned16(a.routing_map) && aligned16(a.intermediate) && aligned16(a.grad_probs) &&
         aligned16(a.grad_logits);
}
template <class G>
bool handles(const AuxScoresBackward<G>& a) {
  using detail::aligned16;
  return a.num_experts % 8 == 0 && aligned16(a.intermediate) && aligned16(a.grad_scores) && aligned16(a.grad_logits);
}
/// The dense-indices and compact kernels take every shape (vector stores where the rows allow them).
template <class G, class I>
bool handles(const IndicesBackward<G, I>&) {
  return true;
}
template <class L, class GW>
bool handles(const CompactBackward<L, GW>&) {
  return true;
}

/// Enqueue the operation. Precondition: handles(args) (otherwise cudaErrorInvalidValue, nothing enqueued).
template <class G>
cudaError_t backward(const MapBackward<G>& args, const Queue& queue, const KernelChoice& choice = {});
template <class G, class I>
cudaError_t backward(const IndicesBackward<G, I>& args, const Queue& queue);
template <class L, class GW>
cudaError_t backward(const CompactBackward<L, GW>& args, const Queue& queue);
template <class G>
cudaError_t backward(const AuxScoresBackward<G>& args, const Queue& queue);

}  // namespace CudaKernels
}  // namespace Impl
}  // namespace KokkosMoE

#endif
