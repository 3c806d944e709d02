/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// The router's kernels for one element type (bf16_t): the forward (topk_router, aux_scores) for bf16_t logits, the
// backward operations for bf16_t gradients (and, in compact form, bf16_t logits).

#include <cuda/KokkosMoE_Router_BackwardLaunch.cuh>
#include <cuda/KokkosMoE_Router_Cuda_ForwardLaunch.cuh>

namespace KokkosMoE {
namespace Impl {
namespace CudaKernels {

KOKKOSMOE_ROUTER_INSTANTIATE_FORWARD(bf16_t);
KOKKOSMOE_ROUTER_INSTANTIATE_BACKWARD(bf16_t);
template cudaError_t backward(const CompactBackward<bf16_t, bf16_t>&, const Queue&);

}  // namespace CudaKernels
}  // namespace Impl
}  // namespace KokkosMoE
