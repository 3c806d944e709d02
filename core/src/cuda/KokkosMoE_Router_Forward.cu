/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// topk_forward and aux_scores_forward: lower the Args to the kernel parameters, choose the kernel for the logits
// dtype (the plan), launch it.

#include <cuda/KokkosMoE_Router_Kernels.hpp>

#include <cuda/KokkosMoE_Router_Cuda_Forward.cuh>

namespace KokkosMoE {
namespace Impl {
namespace CudaKernels {

namespace {
/// choose_forward for the logits dtype.
detail::FwdKernel choose(detail::FwdParams& P, DType dt, const KernelChoice& choice) {
  switch (dt) {
    case DType::F32:
      return detail::choose_forward_f32(P, choice);
    case DType::F16:
      return detail::choose_forward_f16(P, choice);
    case DType::BF16:
      return detail::choose_forward_bf16(P, choice);
    default:
      return detail::FwdKernel{};
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
    P.cutoff = a.qb_cutoff;
    if (a.output == RoutingOutput::Indices)
      P.indices = a.indices;
    else
      P.map = a.routing_map;
  }
  return P;
}

cudaError_t launch_forward_kernel(const FwdKernel& K, const FwdParams& P, const Queue& q) {
  const void* kernel = reinterpret_cast<const void*>(K.kernel);
  cudaError_t err = cudaSuccess;
  if (K.max_shared) {
    err = prefer_max_shared(q.device, kernel);
    if (err != cudaSuccess) return err;
  }
  err = ensure_smem(kernel, K.smem);
  if (err != cudaSuccess) return err;
  const long long tok_per_block = static_cast<long long>(K.warps) * K.tpw;
  const long long work = (P.T + tok_per_block - 1) / tok_per_block;
  const int grid = persistent_grid(q.device, kernel, K.warps * 32, K.smem, work);
  K.kernel<<<grid, K.warps * 32, K.smem, q.stream>>>(P);
  return cudaGetLastError();
}
}  // namespace detail

ForwardPlan plan_forward(const TopkForwardArgs& a, const KernelChoice& choice) {
  ForwardPlan plan;
  plan.params = detail::lower_forward(a);
  plan.kernel = choose(plan.params, a.logits_type, choice);
  return plan;
}

ForwardPlan plan_forward(const AuxScoresArgs& a, const KernelChoice& choice) {
  ForwardPlan plan;
  plan.params = lower_aux(a);
  plan.kernel = choose(plan.params, a.logits_type, choice);
  return plan;
}

cudaError_t run_forward(const ForwardPlan& plan, const Queue& q) {
  if (plan.params.T <= 0) return cudaSuccess;  // nothing per-token is launched (docs/router.md §4.3)
  if (!plan.native()) return cudaErrorInvalidValue;
  const detail::DeviceGuard device(q);
  if (device.status() != cudaSuccess) return device.status();
  return detail::launch_forward_kernel(plan.kernel, plan.params, q);
}

bool handles(const TopkForwardArgs& a) { return plan_forward(a).native(); }

bool handles(const AuxScoresArgs& a) { return plan_forward(a).native(); }

cudaError_t topk_forward(const TopkForwardArgs& a, const Queue& q) { return run_forward(plan_forward(a), q); }

cudaError_t aux_scores_forward(const AuxScoresArgs& a, const Queue& q) { return run_forward(plan_forward(a), q); }

}  // namespace CudaKernels
}  // namespace Impl
}  // namespace KokkosMoE
