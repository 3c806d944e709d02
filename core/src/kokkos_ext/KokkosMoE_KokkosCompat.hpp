/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_KOKKOSCOMPAT_HPP
#define KOKKOSMOE_KOKKOSCOMPAT_HPP

// The one place where Kokkos 3.4 and 4.x differences are bridged (docs/conventions.md §1): there is no ScopedRegion
// in 3.4, no bit_cast, no partition_space, and the Kokkos Tools device id has no device field. It also holds the
// execution policies every KokkosMoE kernel launches with.

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

/// The launch hint of every KokkosMoE kernel (docs/router.md §17): the functor travels as a kernel argument. Without
/// it Kokkos' Cuda and HIP backends copy a functor of 512 bytes or more (the router's operands are) into constant
/// memory, and each such launch first waits on the host until the previous one has finished: back-to-back calls
/// could not be queued, and the device idled between them. Both Kokkos 3.4 and 4.x spell it this way.
using LightWeight = Kokkos::Experimental::WorkItemProperty::HintLightWeight_t;
template <class ExecSpace, class... Traits>
using TeamPolicy = Kokkos::TeamPolicy<ExecSpace, LightWeight, Traits...>;
template <class ExecSpace, class... Traits>
using RangePolicy = Kokkos::RangePolicy<ExecSpace, LightWeight, Traits...>;

/// True for execution spaces whose memory the host can read (Serial, OpenMP, Threads): one team thread per token.
template <class ExecSpace>
constexpr bool is_host_space() {
  return Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename ExecSpace::memory_space>::accessible;
}

/// Independent Kokkos::Serial instances that several host threads may drive at once (Kokkos >= 4: each instance
/// owns its scratch); Kokkos 3.4's Serial shares one, so host threads cannot each play a rank there.
#if KOKKOS_VERSION >= 40000 && defined(KOKKOS_ENABLE_SERIAL)
#define KOKKOSMOE_HAVE_SERIAL_INSTANCES 1
inline Kokkos::Serial new_serial_instance() { return Kokkos::Serial(Kokkos::NewInstance{}); }
#endif

/// An execution space instance of its own on \p base's backend where this Kokkos makes one (Kokkos >= 4:
/// partition_space, which gives Kokkos::Cuda a new stream), else \p base itself (Kokkos 3.4 has no partition_space).
template <class ExecSpace>
ExecSpace partitioned_instance(const ExecSpace& base) {
#if KOKKOS_VERSION >= 40000
  return Kokkos::Experimental::partition_space(base, 1)[0];
#else
  return base;
#endif
}

/// The fields of a Kokkos Tools device id (the devID of the begin_parallel_* and begin_fence callbacks,
/// Kokkos::Tools::Experimental::device_id(exec)): the backend (Kokkos::Tools::Experimental::DeviceType), the device
/// and the instance. Kokkos 3.4 packs 8 type bits over 24 instance bits and has no device field (0 here).
struct ToolsDeviceId {
  std::uint32_t type = 0, device = 0, instance = 0;
};
inline ToolsDeviceId decode_tools_device_id(std::uint32_t id) {
  ToolsDeviceId d;
#if KOKKOS_VERSION >= 40000
  const auto x = Kokkos::Tools::Experimental::identifier_from_devid(id);
  d.type = static_cast<std::uint32_t>(x.type);
  d.device = x.device_id;
  d.instance = x.instance_id;
#else
  constexpr std::uint32_t bits = Kokkos::Tools::Experimental::instance_bits;
  d.type = id >> bits;
  d.instance = id & ((std::uint32_t(1) << bits) - 1u);
#endif
  return d;
}

}  // namespace Impl
}  // namespace KokkosMoE

#endif
