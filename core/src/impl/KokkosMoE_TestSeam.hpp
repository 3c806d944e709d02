/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_IMPL_TESTSEAM_HPP
#define KOKKOSMOE_IMPL_TESTSEAM_HPP

// The internal test seam (docs/conventions.md §6): settings through which tests and test harnesses force a choice
// the library otherwise makes by itself, so that production structs carry no test-only fields. Only test code
// writes them; the library reads them on the host when it chooses a kernel, and their defaults change nothing.
// They are process-wide and not synchronized: set them before the calls under test and restore them afterwards
// (the Scoped* guards do both). Plain C++, so the native CUDA sources (compiled without Kokkos) can read them.

namespace KokkosMoE {
namespace Impl {
namespace TestSeam {

/// Kernel choice of the native CUDA topk_router forward (cuda/KokkosMoE_Router_Cuda_ForwardLaunch.cuh), read when a
/// call is planned (CudaKernels::plan_forward): a setting under which no native kernel applies to a shape sends that
/// call to the portable path, like any shape the native kernels do not handle. (Implementation::Portable forces the
/// portable path for any shape; no setting forces a native kernel onto a shape it does not handle.)
struct CudaForwardKernel {
  /// Run the candidate/threshold register kernel wherever it applies, instead of the lane kernel or the rounds
  /// kernel the library would pick (both must give bit-identical outputs, which is what tests compare).
  bool threshold_kernel_only = false;
  /// Chunk width (experts per lane, 4 or 8) of the lane kernel; 0 lets the library choose. A width for which the
  /// lane kernel does not apply makes it step aside for the register kernels.
  int lane_width = 0;
};

/// The current setting (default: the library's own choice).
inline CudaForwardKernel cuda_forward_kernel{};

/// Kernel choice of the native CUDA map backward (cuda/KokkosMoE_Router_Backward.cu).
struct CudaBackwardKernel {
  /// Run the streaming kernel (every chunk of the row loaded) where the library would run the sparse one (map read
  /// first, then only the routed entries gathered). Both must give bit-identical gradients, which tests compare.
  bool streaming_only = false;
};

/// The current setting (default: the library's own choice).
inline CudaBackwardKernel cuda_backward_kernel{};

/// Device geometry of the portable kernels (impl/KokkosMoE_Router_PortableTokens.hpp, TokenGeometry).
struct PortableDeviceTokens {
  /// Route every token on a team thread's vector lanes (the ThreadVector variant), also where the library would put
  /// a token of at most 16 experts on one thread. Tests compare the two variants: the same bits, except the forward
  /// of Softmax pre, whose row sum runs in another order.
  bool lanes_only = false;
};

/// The current setting (default: the library's own choice).
inline PortableDeviceTokens portable_device_tokens{};

/// Sets one of the settings above for the lifetime of the guard and restores the previous value.
template <class Setting>
class Scoped {
 public:
  Scoped(Setting& slot, const Setting& value) : m_slot(slot), m_saved(slot) { m_slot = value; }
  ~Scoped() { m_slot = m_saved; }
  Scoped(const Scoped&) = delete;
  Scoped& operator=(const Scoped&) = delete;

 private:
  Setting& m_slot;
  Setting m_saved;
};

}  // namespace TestSeam
}  // namespace Impl
}  // namespace KokkosMoE

#endif
