/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// The router's kernels for one element type (float): the forward (topk_router, aux_scores) for float logits, the
// backward operations for float gradients (and, in compact form, float logits).

#include <cuda/KokkosMoE_Router_BackwardLaunch.cuh>
#include <cuda/KokkosMoE_Router_Cuda_ForwardLaunch.cuh>

namespace KokkosMoE {
namespace Impl {
namespace CudaKernels {
namespace detail {

FwdKernel choose_forward_f32(FwdParams& P, const KernelChoice& choice) { return choose_forward<kDtF32>(P, choice); }

}  // namespace detail

KOKKOSMOE_ROUTER_INSTANTIATE_BACKWARD(float);

}  // namespace CudaKernels
}  // namespace Impl
}  // namespace KokkosMoE
