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

KOKKOSMOE_ROUTER_INSTANTIATE_FORWARD(float);
KOKKOSMOE_ROUTER_INSTANTIATE_BACKWARD(float);

}  // namespace CudaKernels
}  // namespace Impl
}  // namespace KokkosMoE
