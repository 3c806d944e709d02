/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_KOKKOSCOMPAT_HPP
#define KOKKOSMOE_KOKKOSCOMPAT_HPP

// The one place where Kokkos 3.4 and 4.x differences are bridged (docs/conventions.md §1): math functions moved from
// Kokkos::Experimental to Kokkos in 3.7, there is no ScopedRegion in 3.4, and no bit_cast.

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>

namespace KokkosMoE {
namespace Impl {

#if KOKKOS_VERSION >= 30700
#define KOKKOSMOE_IMPL_MATH_NS Kokkos
#else
#define KOKKOSMOE_IMPL_MATH_NS Kokkos::Experimental
#endif

KOKKOS_INLINE_FUNCTION float kexp(float x) { return KOKKOSMOE_IMPL_MATH_NS::exp(x); }
KOKKOS_INLINE_FUNCTION float klog1p(float x) { return KOKKOSMOE_IMPL_MATH_NS::log1p(x); }
KOKKOS_INLINE_FUNCTION float ksqrt(float x) { return KOKKOSMOE_IMPL_MATH_NS::sqrt(x); }

/// RAII profiling region (Kokkos 3.4 has no Kokkos::Profiling::ScopedRegion).
class ScopedRegion {
 public:
  explicit ScopedRegion(const std::string& name) { Kokkos::Profiling::pushRegion(name); }
  ~ScopedRegion() { Kokkos::Profiling::popRegion(); }
  ScopedRegion(const ScopedRegion&) = delete;
  ScopedRegion& operator=(const ScopedRegion&) = delete;
};

/// True for execution spaces whose memory the host can read (Serial, OpenMP, Threads): one team thread per token.
template <class ExecSpace>
constexpr bool is_host_space() {
  return Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename ExecSpace::memory_space>::accessible;
}

}  // namespace Impl
}  // namespace KokkosMoE

#endif
