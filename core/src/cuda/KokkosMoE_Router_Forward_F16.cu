/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// Forward kernels (topk_router, aux_scores) instantiated for f16 logits.

#include <cuda/KokkosMoE_Router_Cuda_ForwardLaunch.cuh>

namespace KokkosMoE {
namespace Impl {
namespace CudaKernels {
namespace detail {

FwdKernel choose_forward_f16(FwdParams& P) { return choose_forward<kDtF16>(P); }

}  // namespace detail
}  // namespace CudaKernels
}  // namespace Impl
}  // namespace KokkosMoE
