/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_EP_NATIVE_HPP
#define KOKKOSMOE_EP_NATIVE_HPP

// Native EP kernels of an execution space (docs/ep.md §3.6): an operation's portable kernel first offers its
// arguments to EpNative<Exec>; where the space has a native kernel that takes them it runs, with the same bits, and
// the portable kernel does not. The primary template has none. cuda/KokkosMoE_EP_Native_Cuda.hpp specializes it for
// Kokkos::Cuda in builds whose comm library holds the native kernels (KOKKOSMOE_HAVE_EP_NATIVE_CUDA).

#include <Kokkos_Core.hpp>

namespace KokkosMoE {
namespace Impl {

template <class Exec>
struct EpNative {
  /// The FP8 pack (impl/KokkosMoE_EP_Fp8Kernels.hpp, pack_fp8_tokens' arguments): false, run the portable kernel.
  template <class... Args>
  static bool pack_fp8(const Exec&, const Args&...) {
    return false;
  }
  /// The Weighted combine backward's expert side (impl/KokkosMoE_EP_ArrivalKernels.hpp, expand_with_dots' arguments):
  /// false, run the portable kernel.
  template <class Scalar, class Unit, class... Args>
  static bool expand_with_dots(const Exec&, const Args&...) {
    return false;
  }
};

}  // namespace Impl
}  // namespace KokkosMoE

#if defined(KOKKOS_ENABLE_CUDA) && defined(KOKKOSMOE_HAVE_EP_NATIVE_CUDA)
#include <cuda/KokkosMoE_EP_Native_Cuda.hpp>
#endif

#endif
