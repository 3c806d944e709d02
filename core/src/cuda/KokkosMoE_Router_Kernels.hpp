/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTER_KERNELS_HPP
#define KOKKOSMOE_ROUTER_KERNELS_HPP

// Native CUDA router kernels (Hopper-tuned) behind a raw-pointer + stream interface that needs no Kokkos.
// Implemented in the .cu files of this folder. Every launcher only enqueues work on the queue's stream: no host
// synchronization, no allocation (aux_loss uses the caller's workspace), so all of them are capturable in a
// CUDA graph. Arguments are validated by the public entry points before they get here.

#include <cuda/KokkosMoE_AuxLoss_Cuda.hpp>          // the aux_loss operations
#include <cuda/KokkosMoE_Router_Cuda_Backward.hpp>  // the backward operations
#include <cuda/KokkosMoE_Router_Cuda_Forward.hpp>   // the forward operations
#include <cuda_runtime_api.h>

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

/// The Quantile Balancing histogram pass (docs/router.md §19.5): one count per (token, expert) pair of
/// intermediate [T, E] (row-major) in bin qb_bin(cutoff[t] - intermediate[t, e]) of histogram [E, num_bins],
/// added to what it holds. bin_bounds [2] = {lower, upper} is read on the device (validated by the caller).
struct QbHistogramArgs {
  long long num_tokens = 0;
  int num_experts = 0;
  int num_bins = 0;
  const float* intermediate = nullptr;
  const float* cutoff = nullptr;
  const float* bin_bounds = nullptr;
  int* histogram = nullptr;
};
cudaError_t qb_histogram(const QbHistogramArgs& args, const Queue& queue);

}  // namespace CudaKernels
}  // namespace Impl
}  // namespace KokkosMoE

#endif
