/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTER_KERNELS_HPP
#define KOKKOSMOE_ROUTER_KERNELS_HPP

// Native CUDA router kernels (Hopper-tuned) behind a raw-pointer + stream interface that needs no Kokkos.
// Implemented in the .cu files of this folder. Every launcher only enqueues work on the queue's stream: no host
// synchronization, no allocation (aux_loss uses the caller's workspace), so all of them are capturable in a
// CUDA graph. Arguments are validated by the public entry points before they get here.

#include <cuda_runtime_api.h>
#include <impl/KokkosMoE_Router_Args.hpp>

namespace KokkosMoE {
namespace Impl {
namespace CudaKernels {

/// Where a launcher enqueues: the execution space instance's stream and the device it belongs to
/// (Kokkos::Cuda::cuda_stream() and cuda_device()). Device properties are queried for that device, never for
/// whichever device happens to be current, and the launchers make it current before they launch, as Kokkos does
/// before its own launches.
struct Queue {
  cudaStream_t stream = nullptr;
  int device = 0;
};

/// Whether the native forward kernels handle this topk_router forward; when not, the caller runs the portable
/// path (PortableTopk / PortableAux<Kokkos::Cuda>) instead. A host-only decision on the shape, the dtype and the
/// alignment.
bool handles(const TopkForwardArgs& args);
/// Whether the native forward kernels handle this aux_scores forward (as above).
bool handles(const AuxScoresArgs& args);

/// Precondition of topk_forward and aux_scores_forward: handles(args) (otherwise cudaErrorInvalidValue, nothing
/// enqueued). The other operations have native kernels for every shape.
cudaError_t topk_forward(const TopkForwardArgs& args, const Queue& queue);
cudaError_t topk_backward(const TopkBackwardArgs& args, const Queue& queue);
cudaError_t aux_scores_forward(const AuxScoresArgs& args, const Queue& queue);
cudaError_t aux_scores_backward(const AuxScoresBackwardArgs& args, const Queue& queue);
cudaError_t aux_loss_forward(const AuxLossArgs& args, const Queue& queue);
cudaError_t aux_loss_backward(const AuxLossBackwardArgs& args, const Queue& queue);

}  // namespace CudaKernels
}  // namespace Impl
}  // namespace KokkosMoE

#endif
