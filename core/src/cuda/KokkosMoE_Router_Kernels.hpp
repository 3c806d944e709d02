/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTER_KERNELS_HPP
#define KOKKOSMOE_ROUTER_KERNELS_HPP

// Native CUDA router kernels (Hopper-tuned) behind a raw-pointer + cudaStream_t interface that needs no Kokkos.
// Implemented in the .cu files of this folder. Every launcher only enqueues work on `stream`: no host
// synchronization, no allocation (aux_loss uses the caller's workspace), so all of them are capturable in a
// CUDA graph. Arguments are validated by the public entry points before they get here.

#include <cuda_runtime_api.h>
#include <impl/KokkosMoE_Router_Args.hpp>

namespace KokkosMoE {
namespace Impl {
namespace CudaKernels {

cudaError_t topk_forward(const TopkForwardArgs& args, cudaStream_t stream);
cudaError_t topk_backward(const TopkBackwardArgs& args, cudaStream_t stream);
cudaError_t aux_scores_forward(const AuxScoresArgs& args, cudaStream_t stream);
cudaError_t aux_scores_backward(const AuxScoresBackwardArgs& args, cudaStream_t stream);
cudaError_t aux_loss_forward(const AuxLossArgs& args, cudaStream_t stream);
cudaError_t aux_loss_backward(const AuxLossBackwardArgs& args, cudaStream_t stream);

}  // namespace CudaKernels
}  // namespace Impl
}  // namespace KokkosMoE

#endif
