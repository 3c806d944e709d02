/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTER_CUDA_HPP
#define KOKKOSMOE_ROUTER_CUDA_HPP

// Kokkos::Cuda specialization of the router: the hand-tuned native kernels of this folder, launched on the
// instance's stream (exec.cuda_stream()). No fence, no allocation, CUDA-graph capturable.

#include <Kokkos_Macros.hpp>
#if defined(KOKKOS_ENABLE_CUDA)

#include <KokkosMoE_Error.hpp>

#include <Kokkos_Core.hpp>

#include <cuda/KokkosMoE_Router_Kernels.hpp>
#include <impl/KokkosMoE_Router_Args.hpp>

#include <string>

namespace KokkosMoE {
namespace Impl {

inline void throw_on_cuda_error(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw DeviceError(std::string("KokkosMoE::") + what + ": CUDA launch failed: " + cudaGetErrorString(err));
}

template <>
struct RouterImpl<Kokkos::Cuda> {
  static constexpr bool is_specialized = true;
  static void topk_forward(const Kokkos::Cuda& exec, const TopkForwardArgs& a) {
    throw_on_cuda_error(CudaKernels::topk_forward(a, exec.cuda_stream()), "topk_router");
  }
  static void topk_backward(const Kokkos::Cuda& exec, const TopkBackwardArgs& a) {
    throw_on_cuda_error(CudaKernels::topk_backward(a, exec.cuda_stream()), "topk_router_backward");
  }
  static void aux_scores_forward(const Kokkos::Cuda& exec, const AuxScoresArgs& a) {
    throw_on_cuda_error(CudaKernels::aux_scores_forward(a, exec.cuda_stream()), "aux_scores");
  }
  static void aux_scores_backward(const Kokkos::Cuda& exec, const AuxScoresBackwardArgs& a) {
    throw_on_cuda_error(CudaKernels::aux_scores_backward(a, exec.cuda_stream()), "aux_scores_backward");
  }
  static void aux_loss_forward(const Kokkos::Cuda& exec, const AuxLossArgs& a) {
    throw_on_cuda_error(CudaKernels::aux_loss_forward(a, exec.cuda_stream()), "aux_loss");
  }
  static void aux_loss_backward(const Kokkos::Cuda& exec, const AuxLossBackwardArgs& a) {
    throw_on_cuda_error(CudaKernels::aux_loss_backward(a, exec.cuda_stream()), "aux_loss_backward");
  }
};

}  // namespace Impl
}  // namespace KokkosMoE

#endif
#endif
