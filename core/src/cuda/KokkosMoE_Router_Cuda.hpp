/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTER_CUDA_HPP
#define KOKKOSMOE_ROUTER_CUDA_HPP

// Launchers of the hand-tuned native kernels of this folder on a Kokkos::Cuda instance's stream and device
// (exec.cuda_stream(), exec.cuda_device()), over the typed argument structs of cuda/KokkosMoE_Router_Cuda_Forward.hpp
// (the forward operations, over their plans), cuda/KokkosMoE_Router_Cuda_Backward.hpp and
// cuda/KokkosMoE_AuxLoss_Cuda.hpp.
// No fence, no allocation, CUDA-graph capturable. Each native launch runs inside a Kokkos profiling region named
// "KokkosMoE::<op>[cuda]", so Kokkos Tools see it. The specs of cuda/KokkosMoE_Router_CudaSpec.hpp lower the typed
// operands to those structs and call these; forward shapes the native kernels do not handle (a plan that is not
// native) run the portable path there instead, whose regions say "[portable]".

#include <Kokkos_Macros.hpp>
#if defined(KOKKOS_ENABLE_CUDA)

#include <KokkosMoE_Error.hpp>

#include <Kokkos_Core.hpp>
#include <kokkos_ext/KokkosMoE_KokkosCompat.hpp>

#include <cuda/KokkosMoE_Router_Kernels.hpp>

#include <string>

namespace KokkosMoE {
namespace Impl {

inline void throw_on_cuda_error(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw DeviceError(std::string("KokkosMoE::") + what + ": CUDA launch failed: " + cudaGetErrorString(err));
}

/// The instance's stream and device, for the native launchers.
inline CudaKernels::Queue cuda_queue(const Kokkos::Cuda& exec) {
  CudaKernels::Queue q;
  q.stream = exec.cuda_stream();
  q.device = exec.cuda_device();
  return q;
}

struct CudaRouter {
  template <class L>
  static void topk_forward(const Kokkos::Cuda& exec, const CudaKernels::ForwardPlan<L>& plan) {
    ScopedRegion region("KokkosMoE::topk_router[cuda]");
    throw_on_cuda_error(CudaKernels::run_forward(plan, cuda_queue(exec)), "topk_router");
  }
  /// A backward operation of cuda/KokkosMoE_Router_Cuda_Backward.hpp (CudaKernels::handles(a) holds); \p op names it.
  template <class Args>
  static void backward(const Kokkos::Cuda& exec, const char* op, const Args& a, const KernelChoice& choice) {
    ScopedRegion region(std::string("KokkosMoE::") + op + "[cuda]");
    throw_on_cuda_error(launch_backward(a, cuda_queue(exec), choice), op);
  }
  /// The map backward takes the kernel choice; the other backward operations have one kernel per shape.
  template <class G>
  static cudaError_t launch_backward(const CudaKernels::MapBackward<G>& a, const CudaKernels::Queue& q,
                                     const KernelChoice& choice) {
    return CudaKernels::backward(a, q, choice);
  }
  template <class Args>
  static cudaError_t launch_backward(const Args& a, const CudaKernels::Queue& q, const KernelChoice&) {
    return CudaKernels::backward(a, q);
  }
  template <class L>
  static void aux_scores_forward(const Kokkos::Cuda& exec, const CudaKernels::ForwardPlan<L>& plan) {
    ScopedRegion region("KokkosMoE::aux_scores[cuda]");
    throw_on_cuda_error(CudaKernels::run_forward(plan, cuda_queue(exec)), "aux_scores");
  }
  template <class Args>
  static void aux_loss_forward(const Kokkos::Cuda& exec, const Args& a) {
    ScopedRegion region("KokkosMoE::aux_loss[cuda]");
    throw_on_cuda_error(CudaKernels::aux_loss_forward(a, cuda_queue(exec)), "aux_loss");
  }
  template <class Args>
  static void aux_loss_backward(const Kokkos::Cuda& exec, const Args& a) {
    ScopedRegion region("KokkosMoE::aux_loss_backward[cuda]");
    throw_on_cuda_error(CudaKernels::aux_loss_backward(a, cuda_queue(exec)), "aux_loss_backward");
  }
};

}  // namespace Impl
}  // namespace KokkosMoE

#endif
#endif
