/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTERQB_CUDASPEC_HPP
#define KOKKOSMOE_ROUTERQB_CUDASPEC_HPP

// Kokkos::Cuda specialization of the Quantile Balancing pass (impl/KokkosMoE_RouterQB_Impl.hpp, QbSpec): the native
// forward writes the cutoff where its kernel can (the lane kernel, cuda/KokkosMoE_Router_Cuda_ForwardLane.cuh), and
// the histogram runs the native sliced kernel of cuda/KokkosMoE_RouterQB.cu, in both histogram modes.

#include <Kokkos_Macros.hpp>
#if defined(KOKKOS_ENABLE_CUDA)

#include <Kokkos_Core.hpp>
#include <kokkos_ext/KokkosMoE_KokkosCompat.hpp>

#include <cuda/KokkosMoE_Router_Cuda.hpp>
#include <cuda/KokkosMoE_Router_CudaSpec.hpp>
#include <cuda/KokkosMoE_Router_Kernels.hpp>

namespace KokkosMoE {
namespace Impl {

template <>
struct QbSpec<Kokkos::Cuda> {
  /// The router's forward; true when it also wrote the cutoff.
  template <class Ops>
  static bool forward(const Kokkos::Cuda& exec, const RouterConfig& config, const Ops& o, float* cutoff) {
    return TopkSpec<Kokkos::Cuda>::forward_with_cutoff(exec, config, o, cutoff);
  }

  template <class Ops>
  static void histogram(const Kokkos::Cuda& exec, const Ops& h) {
    CudaKernels::QbHistogramArgs a;
    a.num_tokens = h.num_tokens;
    a.num_experts = h.num_experts;
    a.num_bins = static_cast<int>(h.hist.extent(1));
    a.intermediate = h.inter.data();
    a.cutoff = h.cutoff.data();
    a.bin_bounds = h.bounds.data();
    a.histogram = h.hist.data();
    ScopedRegion region("KokkosMoE::qb_histogram_accumulate[cuda]");
    throw_on_cuda_error(CudaKernels::qb_histogram(a, cuda_queue(exec)), "qb_histogram_accumulate");
  }
};

}  // namespace Impl
}  // namespace KokkosMoE

#endif
#endif
