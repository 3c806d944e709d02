/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_EP_LANE_HPP
#define KOKKOSMOE_EP_LANE_HPP

// Where an EP group's operations run (docs/ep.md §13). Without an SM partition: on the caller's instance. With one
// (SmCap::Partition on Kokkos::Cuda): on the group's instance over the partition's stream, ordered after the caller's
// earlier work and before its later work by two events (fork, join), so the operation keeps the caller's stream
// semantics, graph capture included, while its kernels occupy only the partition's SMs.

#include <KokkosMoE_EpConfig.hpp>
#include <KokkosMoE_Error.hpp>

#include <string>

namespace KokkosMoE {
namespace Impl {

/// A host space or a device without SM partitions: the operations run on the caller's instance, and the cap is kept
/// by teams (EpShape::max_teams).
template <class Exec>
class EpLane {
 public:
  /// \throws InvalidArgument (Rule::ConfigValue, sm_cap) for SmCap::Partition: \p Exec has no SM partitions
  static EpLane make(const char* fn, const Exec&, const EpGroupConfig& c) {
    if (c.max_sms > 0 && c.sm_cap == SmCap::Partition)
      throw InvalidArgument(fn, "sm_cap", Rule::ConfigValue,
                            std::string("sm_cap = partition: ") + Exec::name() + " has no SM partitions");
    return {};
  }
  bool partitioned() const noexcept { return false; }
  int partition_sms() const noexcept { return 0; }
};

/// The operation's instance for its scope: the caller's, or the group's partition instance forked off the caller's
/// stream and joined back into it when the scope ends.
template <class Exec>
class EpLaneScope {
 public:
  EpLaneScope(const EpLane<Exec>&, const Exec& caller) : m_exec(caller) {}
  const Exec& exec() const noexcept { return m_exec; }

 private:
  Exec m_exec;
};

}  // namespace Impl
}  // namespace KokkosMoE

#if defined(KOKKOS_ENABLE_CUDA) && defined(KOKKOSMOE_HAVE_SM_PARTITION)
#include <cuda/KokkosMoE_EpLane_Cuda.hpp>
#endif

#endif
