/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_KOKKOSCOMPAT_HPP
#define KOKKOSMOE_KOKKOSCOMPAT_HPP

// The one place where Kokkos 3.4 and 4.x differences are bridged (docs/conventions.md §1): there is no ScopedRegion
// in 3.4, and no bit_cast.

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>

namespace KokkosMoE {
namespace Impl {

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
