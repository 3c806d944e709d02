/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTER_KERNELCHOICE_HPP
#define KOKKOSMOE_ROUTER_KERNELCHOICE_HPP

// Which kernel runs where several give the same bits (docs/router.md §17): data passed by value down the dispatch
// (TopkSpec, AuxSpec, PortableTopk and the native planners of cuda/), so that nothing process-wide steers a launch.
// The public entry points pass the default, the library's own choice; the unit tests pass the others through the
// specs to compare the variants bit for bit. Plain C++: the native CUDA sources read it without Kokkos.

namespace KokkosMoE {
namespace Impl {

struct KernelChoice {
  /// Portable kernels on a device: every token on a team thread's vector lanes (the ThreadVector variant), also
  /// where the library puts a token of at most 16 experts on one thread. The same bits, except the forward of
  /// Softmax pre, whose row sum runs in another order.
  bool portable_lanes_only = false;
  /// Native forward: the candidate/threshold register kernel wherever it applies, instead of the lane kernel or the
  /// rounds kernel the library would pick.
  bool forward_threshold_only = false;
  /// Native forward: the lane kernel's chunk width (experts per lane, 4 or 8); 0 lets the library choose. A width
  /// for which the lane kernel does not apply makes it step aside for the register kernels.
  int forward_lane_width = 0;
  /// Native map backward: the streaming kernel (every chunk of the row loaded) where the library would run the
  /// sparse one (map read first, then only the routed entries gathered).
  bool backward_streaming = false;
};

}  // namespace Impl
}  // namespace KokkosMoE

#endif
