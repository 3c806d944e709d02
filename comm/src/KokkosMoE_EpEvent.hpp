/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_EPEVENT_HPP
#define KOKKOSMOE_EPEVENT_HPP

/// \file KokkosMoE_EpEvent.hpp
/// \brief A point in one execution space instance's work that another instance of the same space waits for without
/// a host fence (docs/ep.md §16): EP operations on a communication instance, the expert compute on another.
///
///     auto sent = ep_record_event(comm_exec);   // after everything enqueued on comm_exec so far
///     ep_wait_event(compute_exec, sent);         // compute_exec's later work starts after that point
///
/// Kokkos::Cuda: a CUDA event recorded on the instance's stream and waited for on the other's (cudaStreamWaitEvent):
/// no host wait. Host execution spaces (Serial, OpenMP, Threads) run an instance's kernels from the calling thread,
/// so the documented equivalent is a fence of the recording instance in ep_record_event (never of the waiting one)
/// and nothing in ep_wait_event.

#include <KokkosMoE_Error.hpp>

#include <Kokkos_Core.hpp>

#include <memory>
#include <string>

namespace KokkosMoE {

/// \brief An event of \p ExecSpace: empty (default-constructed) or recorded by ep_record_event. Copies share it.
template <class ExecSpace>
class EpEvent {
 public:
  EpEvent() = default;
  bool valid() const noexcept { return m_recorded; }
  /// Implementation access; not part of the API.
  static EpEvent recorded() {
    EpEvent e;
    e.m_recorded = true;
    return e;
  }

 private:
  bool m_recorded = false;
};

/// \brief Records the point after everything enqueued on \p exec so far (host spaces: fences \p exec).
template <class ExecSpace>
EpEvent<ExecSpace> ep_record_event(const ExecSpace& exec) {
  exec.fence();
  return EpEvent<ExecSpace>::recorded();
}

/// \brief \p exec's later work runs after \p event's point (host spaces: that point has passed already).
/// \throws InvalidArgument (Rule::HandleState) naming `event` for an event never recorded
template <class ExecSpace>
void ep_wait_event(const ExecSpace& /*exec*/, const EpEvent<ExecSpace>& event) {
  if (!event.valid())
    throw InvalidArgument("ep_wait_event", "event", Rule::HandleState,
                          "the event was never recorded (ep_record_event)");
}

}  // namespace KokkosMoE

#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda/KokkosMoE_EpEvent_Cuda.hpp>
#endif

#endif
