/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// Forward kernels (topk_router, aux_scores) instantiated for f32 logits.

#include <cuda/KokkosMoE_Router_Cuda_ForwardLaunch.cuh>

namespace KokkosMoE {
namespace Impl {
namespace CudaKernels {
namespace detail {

bool fwd_launch_f32(FwdParams& P, const Queue* q, cudaError_t* err) { return fwd_launch<kDtF32>(P, q, err); }

}  // namespace detail
}  // namespace CudaKernels
}  // namespace Impl
}  // namespace KokkosMoE
