/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// topk_forward and aux_scores_forward: lower the Args to the kernel parameters and dispatch on the logits dtype.

#include <cuda/KokkosMoE_Router_Kernels.hpp>

#include <cuda/KokkosMoE_Router_Cuda_Forward.cuh>

namespace KokkosMoE {
namespace Impl {
namespace CudaKernels {

namespace {
/// fwd_launch for the logits dtype; q == nullptr only asks whether a native kernel applies.
bool dispatch(detail::FwdParams& P, DType dt, const Queue* q, cudaError_t* err) {
  switch (dt) {
    case DType::F32:
      return detail::fwd_launch_f32(P, q, err);
    case DType::F16:
      return detail::fwd_launch_f16(P, q, err);
    case DType::BF16:
      return detail::fwd_launch_bf16(P, q, err);
    default:
      return false;
  }
}

detail::FwdParams lower_aux(const AuxScoresArgs& a) {
  detail::FwdParams P;
  P.T = a.num_tokens;
  P.E = a.num_experts;
  P.k = a.topk;
  P.fn = static_cast<int>(a.score_function);
  P.pre = 0;
  P.aux = 1;
  P.out = static_cast<int>(a.output);
  P.logits = a.logits;
  P.scores = a.scores;
  P.map = a.routing_map;
  P.inter = a.intermediate;
  return P;
}

/// Launches P on q; a shape without a native kernel is a caller error (handles() said so first).
cudaError_t launch(detail::FwdParams& P, DType dt, const Queue& q) {
  const detail::DeviceGuard device(q);
  if (device.status() != cudaSuccess) return device.status();
  cudaError_t err = cudaSuccess;
  if (!dispatch(P, dt, &q, &err)) return cudaErrorInvalidValue;
  return err;
}
}  // namespace

namespace detail {
FwdParams lower_forward(const TopkForwardArgs& a) {
  FwdParams P;
  P.T = a.num_tokens;
  P.E = a.num_experts;
  P.k = a.config.topk;
  P.fn = static_cast<int>(a.config.score_function);
  P.pre = (a.config.score_function == ScoreFunction::Softmax && a.config.use_pre_softmax) ? 1 : 0;
  P.aux = 0;
  if (a.config.group_topk > 0) {
    P.G = a.config.num_groups;
    P.gk = a.config.group_topk;
    P.gs = P.E / P.G;
    P.kg = P.k / P.gk;
  }
  P.scale = a.config.scaling_factor;
  P.out = static_cast<int>(a.output);
  P.idx_type = static_cast<int>(a.indices_type);
  P.bias_type = static_cast<int>(a.bias_type);
  P.logits = a.logits;
  P.bias = (a.config.score_function == ScoreFunction::Softmax) ? nullptr : a.bias;
  if (a.output == RoutingOutput::Compact) {
    P.ids = a.ids;
    P.weights = a.weights;
  } else {
    P.probs = a.probs;
    P.inter = a.intermediate;
    if (a.output == RoutingOutput::Indices)
      P.indices = a.indices;
    else
      P.map = a.routing_map;
  }
  return P;
}
}  // namespace detail

bool handles(const TopkForwardArgs& a) {
  detail::FwdParams P = detail::lower_forward(a);
  cudaError_t unused = cudaSuccess;
  return dispatch(P, a.logits_type, nullptr, &unused);
}

bool handles(const AuxScoresArgs& a) {
  detail::FwdParams P = lower_aux(a);
  cudaError_t unused = cudaSuccess;
  return dispatch(P, a.logits_type, nullptr, &unused);
}

cudaError_t topk_forward(const TopkForwardArgs& a, const Queue& q) {
  if (a.num_tokens <= 0) return cudaSuccess;  // nothing per-token is launched (docs/router.md §4.3)
  detail::FwdParams P = detail::lower_forward(a);
  return launch(P, a.logits_type, q);
}

cudaError_t aux_scores_forward(const AuxScoresArgs& a, const Queue& q) {
  if (a.num_tokens <= 0) return cudaSuccess;
  detail::FwdParams P = lower_aux(a);
  return launch(P, a.logits_type, q);
}

}  // namespace CudaKernels
}  // namespace Impl
}  // namespace KokkosMoE
