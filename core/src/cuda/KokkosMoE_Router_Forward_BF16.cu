/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// Forward kernels (topk_router, aux_scores) instantiated for bf16 logits.

#include <cuda/KokkosMoE_Router_Cuda_ForwardLaunch.cuh>

namespace KokkosMoE {
namespace Impl {
namespace CudaKernels {
namespace detail {

FwdKernel choose_forward_bf16(FwdParams& P) { return choose_forward<kDtBF16>(P); }

}  // namespace detail
}  // namespace CudaKernels
}  // namespace Impl
}  // namespace KokkosMoE
