/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTER_CUDA_FORWARD_HPP
#define KOKKOSMOE_ROUTER_CUDA_FORWARD_HPP

// The native forward operations (docs/router.md §5, §10), typed by the logits' element type L in {float, fp16_t,
// bf16_t}: the expert bias and the dense indices keep their own types (ExpertBias, IndexOutput). The Kokkos::Cuda
// spec (cuda/KokkosMoE_Router_CudaSpec.hpp) fills them from the canonical Views. The kernel choice is a host-only
// decision on the shape and the alignment, made once by plan_forward: when no native kernel handles the call
// (ForwardPlan::native() is false) the spec runs the portable kernel instead. The launchers are templates explicitly
// instantiated per logits type (KokkosMoE_Router_{F32,F16,BF16}.cu); like every launcher here they only enqueue on
// the queue's stream. Everything is validated already (docs/router.md §4): rows are contiguous, row offsets 64-bit.

#include <KokkosMoE_RouterConfig.hpp>

#include <cuda/KokkosMoE_Router_Cuda_Params.hpp>
#include <cuda_runtime_api.h>
#include <impl/KokkosMoE_Router_Args.hpp>  // RoutingOutput
#include <impl/KokkosMoE_Router_KernelChoice.hpp>

#include <cstdint>

namespace KokkosMoE {
namespace Impl {
namespace CudaKernels {

struct Queue;

/// topk_router forward, every output kind. Pointers the output kind does not use are null.
template <class L>
struct TopkForward {
  using logits_type = L;
  std::int64_t num_tokens = 0;  ///< T (may be 0)
  int num_experts = 0;          ///< E >= 1
  RouterConfig config;          ///< validated; grouping is on iff config.group_topk > 0
  RoutingOutput output = RoutingOutput::Bytemap;
  const L* logits = nullptr;            ///< [T, E]
  ExpertBias bias;                      ///< [E], or none
  L* probs = nullptr;                   ///< [T, E] (Bytemap, BitmapU8, Indices)
  std::uint8_t* routing_map = nullptr;  ///< [T, E] (Bytemap) or [T, ceil(E/8)] (BitmapU8)
  IndexOutput indices;                  ///< [T, k] (Indices)
  float* intermediate = nullptr;        ///< [T, E] (Bytemap, BitmapU8, Indices)
  std::int32_t* ids = nullptr;          ///< [T, k] (Compact)
  float* weights = nullptr;             ///< [T, k] (Compact)
  /// Quantile Balancing (docs/router.md §19.4): [T] the score of order[k] per token, written by the forward kernels
  /// that can (ForwardPlan::writes_cutoff); null otherwise.
  float* qb_cutoff = nullptr;
};

/// aux_scores forward (docs/router.md §10): scores [T, E] F32, routing map, intermediate [T, E] F32.
template <class L>
struct AuxScoresForward {
  using logits_type = L;
  std::int64_t num_tokens = 0;
  int num_experts = 0;
  int topk = 1;
  ScoreFunction score_function = ScoreFunction::Softmax;
  RoutingOutput output = RoutingOutput::Bytemap;  ///< Bytemap or BitmapU8
  const L* logits = nullptr;
  float* scores = nullptr;
  std::uint8_t* routing_map = nullptr;
  float* intermediate = nullptr;
};

/// A forward call lowered to the kernel parameters, with the native kernel chosen for it.
template <class L>
struct ForwardPlan {
  detail::FwdParams<L> params;
  detail::FwdKernel<L> kernel;
  bool native() const { return kernel.kernel != nullptr; }
  /// The planned kernel also writes the QB cutoff (TopkForward::qb_cutoff).
  bool writes_cutoff() const { return native() && kernel.writes_cutoff && params.cutoff != nullptr; }
};

/// \p choice: the kernel among those that give the same bits (default: the library's; KernelChoice).
template <class L>
ForwardPlan<L> plan_forward(const TopkForward<L>& args, const KernelChoice& choice = {});
template <class L>
ForwardPlan<L> plan_forward(const AuxScoresForward<L>& args, const KernelChoice& choice = {});
/// Enqueues the planned kernel. Precondition: plan.native() (otherwise cudaErrorInvalidValue, nothing enqueued).
template <class L>
cudaError_t run_forward(const ForwardPlan<L>& plan, const Queue& queue);

}  // namespace CudaKernels
}  // namespace Impl
}  // namespace KokkosMoE

#endif
