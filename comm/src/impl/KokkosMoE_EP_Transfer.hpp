/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_EP_TRANSFER_HPP
#define KOKKOSMOE_EP_TRANSFER_HPP

// How the EP steps move rows and agree (docs/ep.md §2, §7): transfers over messages or windows, the window checks,
// the per-call vote of every rank, the wire buffer sets and the split forms' deferred receive, traffic counters.

#include <impl/KokkosMoE_EP_State.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace KokkosMoE {
namespace Impl {

// ----- transfers ---------------------------------------------------------------------------------------------------

enum class Direction { Forward, Return };

/// Moves token rows of \p pitch bytes each between the ranks: Forward from each rank's \p src buffer (its token rows
/// for rank r from index S(me, r)) to the peers' \p dst buffers (rank i's rows from index A(me, i)), Return the
/// reverse. One library call: an equal-block all-to-all of B token rows per peer in capacity mode, one grouped
/// exchange of exact segments in eager mode. Host transports need the kernels finished first.
template <class Exec>
void transfer(const Exec& exec, const char* fn, EpHandleState<Exec>& h, Direction dir, const void* src, const void* dst,
              std::size_t pitch) {
  EpGroupState<Exec>& g = *h.group;
  const EpShape& s = h.shape;
  if (s.R == 1 || pitch == 0) return;
  if (ExecTraits<Exec>::transport == CommTransport::Mpi) exec.fence();
  void* stream = ExecTraits<Exec>::stream(exec);
  char* src_b = static_cast<char*>(const_cast<void*>(src));
  char* dst_b = static_cast<char*>(const_cast<void*>(dst));
  const bool fwd = dir == Direction::Forward;
  if (s.capacity_mode) {
    g.transport->alltoall(fn, fwd ? src_b : dst_b, fwd ? dst_b : src_b, static_cast<std::size_t>(s.B) * pitch, stream);
    return;
  }
  std::vector<PeerSegment> segs;
  for (int p = 0; p < s.R; ++p) {
    if (p == s.me) continue;
    const std::size_t so = static_cast<std::size_t>(h.send_off[p]) * pitch;
    const std::size_t sn = static_cast<std::size_t>(h.send_tok[p]) * pitch;
    const std::size_t d_o = static_cast<std::size_t>(h.recv_off[p]) * pitch;
    const std::size_t dn = static_cast<std::size_t>(h.recv_tok[p]) * pitch;
    if (fwd) {
      segs.push_back({p, src_b + so, sn, dst_b + d_o, dn});
    } else {
      segs.push_back({p, dst_b + d_o, dn, src_b + so, sn});
    }
  }
  g.transport->exchange(fn, segs, stream);
}

/// A peer that never signalled in the window: the host sees the error word after the wait (host spaces: at once;
/// devices: at ep_synchronize) and aborts the communicator.
template <class Exec>
void throw_window_error(const char* fn, EpGroupState<Exec>& g, const std::int64_t* err) {
  const int region = static_cast<int>(err[1]);
  const std::string what = region >= 0 && region < kWindowRegions ? kWindowRegionNames[region] : "?";
  g.transport->fail_and_abort(fn, CommFailure::Timeout,
                              "rank " + std::to_string(err[2]) + " did not signal " +
                                  (err[4] == 0 ? "its " + what : "that it consumed this rank's " + what) + " (epoch " +
                                  std::to_string(err[3]) + ", its counter here at " + std::to_string(err[5]) +
                                  ") in the window within " + std::to_string(g.transport->timeout_seconds()) +
                                  " s (stalled or dead peer); the communicator is aborted");
}

/// The error word read through the instance, after the work that sets it: CommError when a peer never signalled.
template <class Exec>
void check_window_word(const Exec& exec, const char* fn, EpGroupState<Exec>& g) {
  auto err = to_host(exec, g.err);
  if (err(0) != 0) throw_window_error(fn, g, err.data());
}

template <class Exec>
void check_window(const Exec& exec, const char* fn, EpGroupState<Exec>& g) {
  if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename Exec::memory_space>::accessible) {
    exec.fence();
    if (g.err(0) != 0) throw_window_error(fn, g, g.err.data());
  }
}

/// The start of an operation that waits for peers in the windows (after its arguments are validated).
template <class Exec>
void enter_op(const char* fn, EpGroupState<Exec>& g, const EpShape& s) {
  if (g.windows && s.R > 1) g.transport->rendezvous(fn);
}

/// "handle 'name'" or "an unnamed handle", for messages that name two handles.
template <class Exec>
std::string handle_label(const EpHandleState<Exec>& h) {
  return h.options.name.empty() ? std::string("an unnamed handle") : "handle '" + h.options.name + "'";
}

/// The set of wire buffers an operation of \p h uses (docs/ep.md §14): the lowest one no pending receive holds. Every
/// rank runs the group's operations in the same order, so every rank takes the same set, or throws the same error
/// here, before anything is communicated.
template <class Exec>
EpWire<Exec>& take_wire(const char* fn, const EpHandleState<Exec>& h) {
  EpGroupState<Exec>& g = *h.group;
  for (EpWire<Exec>& w : g.wires)
    if (!w.holder) return w;
  std::string held;
  for (const EpWire<Exec>& w : g.wires)
    held += (held.empty() ? "" : ", ") + std::string(w.holder->receive_of) + " of " + handle_label(*w.holder);
  const int n = static_cast<int>(g.wires.size());
  ep_fail(fn, "handle", Rule::HandleState,
          handle_label(h) + " needs one of its group's wire buffers (EpGroupConfig::wire_buffers = " +
              std::to_string(n) + "), but the pending receive of " + held + (n == 1 ? " holds it" : " hold them") +
              ": call that hook first, or make the group with wire_buffers = " + std::to_string(n + 1) +
              " (docs/ep.md §14)");
}

/// A rank's verdict on its own arguments of one call, as it travels in the vote.
struct CallVerdict {
  std::int32_t invalid = 0;
  std::int32_t rule = 0;
  char parameter[56] = {};
};

/// The per-call validation of an operation on every rank (docs/ep.md §2): runs \p check (this rank's argument and
/// handle-state checks), then joins every rank's verdict in one vote, before the operation communicates or changes any
/// state. A rank whose check failed throws its own InvalidArgument; every other rank throws InvalidArgument
/// (Rule::PeerInvalidArgument) naming the failed rank(s) and the argument. Nothing was sent and no epoch advanced, so
/// the group and the handles serve the next call on every rank.
template <class Exec, class Check>
void check_on_every_rank(const char* fn, EpGroupState<Exec>& g, Check&& check) {
  CallVerdict mine;
  std::exception_ptr error;
  try {
    check();
  } catch (const InvalidArgument& e) {
    error = std::current_exception();
    mine.invalid = 1;
    mine.rule = static_cast<std::int32_t>(e.rule());
    std::strncpy(mine.parameter, e.parameter().c_str(), sizeof(mine.parameter) - 1);
  }
  const int R = g.shape.R;
  if (R == 1) {
    if (error) std::rethrow_exception(error);
    return;
  }
  std::vector<CallVerdict> all(static_cast<std::size_t>(R));
  try {
    g.transport->vote(fn, &mine, all.data(), sizeof(CallVerdict));
  } catch (...) {
    if (error) std::rethrow_exception(error);  // this rank's own mistake first, even on an aborted communicator
    throw;
  }
  if (error) std::rethrow_exception(error);
  std::string bad, first;
  for (int r = 0; r < R; ++r) {
    if (all[r].invalid == 0) continue;
    const std::string param(all[r].parameter, strnlen(all[r].parameter, sizeof(all[r].parameter)));
    if (first.empty()) first = param;
    bad += (bad.empty() ? "" : ", ") + std::string("rank ") + std::to_string(r) + " (" + param + ", " +
           rule_name(static_cast<Rule>(all[r].rule)) + ")";
  }
  if (!bad.empty())
    ep_fail(fn, first, Rule::PeerInvalidArgument,
            "the same call failed its own argument checks on " + bad +
                " (their InvalidArgument says why); nothing was communicated, and the handle serves the next call");
}

/// Before an operation writes \p region: with windows, every peer has consumed the previous rows there.
template <class Exec>
void wire_acquire(const Exec& exec, const char* fn, EpGroupState<Exec>& g, EpWire<Exec>& w, int region) {
  if (!g.windows) return;
  g.transport->require_open(fn);
  window_acquire(exec, w.signals, region);
  check_window(exec, fn, g);
}

/// The rows of \p region are written: windows post and wait for every peer's; the message transports move them
/// (pitch bytes per token row) from the stage they were written into.
template <class Exec>
void wire_move(const Exec& exec, const char* fn, EpHandleState<Exec>& h, EpWire<Exec>& w, int region,
               std::size_t pitch) {
  EpGroupState<Exec>& g = *h.group;
  if (h.shape.R == 1) return;
  if (g.windows) {
    if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename Exec::memory_space>::accessible)
      exec.fence();  // the rows of every host thread are written before the counter says so
    window_post(exec, w.signals, region);
    check_window(exec, fn, g);
    return;
  }
  switch (region) {
    case kRegionMeta:
      transfer(exec, fn, h, Direction::Forward, w.src_meta.data(), h.v.fwd_rows.data(), pitch);
      break;
    case kRegionFwd:
      transfer(exec, fn, h, Direction::Forward, w.src_stage.data(), w.dst_stage.data(), pitch);
      break;
    case kRegionFwdF:
      transfer(exec, fn, h, Direction::Forward, w.src_flt.data(), w.dst_flt.data(), pitch);
      break;
    case kRegionRet:
      transfer(exec, fn, h, Direction::Return, w.src_stage.data(), w.dst_stage.data(), pitch);
      break;
    default:
      transfer(exec, fn, h, Direction::Return, w.src_flt.data(), w.dst_flt.data(), pitch);
      break;
  }
}

/// The send half of wire_move (split operations): windows raise this rank's counters in the peers, the message
/// transports move the rows at once.
template <class Exec>
void wire_send(const Exec& exec, const char* fn, EpHandleState<Exec>& h, EpWire<Exec>& w, int region,
               std::size_t pitch) {
  EpGroupState<Exec>& g = *h.group;
  if (h.shape.R == 1) return;
  if (!g.windows) {
    wire_move(exec, fn, h, w, region, pitch);
    return;
  }
  if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename Exec::memory_space>::accessible) exec.fence();
  window_raise(exec, w.signals, region);
  check_window(exec, fn, g);
}

/// The receive half of wire_move: windows wait for every peer's rows of \p region (the message transports moved
/// them at the send).
template <class Exec>
void wire_wait(const Exec& exec, const char* fn, EpHandleState<Exec>& h, EpWire<Exec>& w, int region) {
  EpGroupState<Exec>& g = *h.group;
  if (h.shape.R == 1 || !g.windows) return;
  window_wait(exec, w.signals, region);
  check_window(exec, fn, g);
}

/// Runs \p finish now (one call) or leaves it as the handle's receive (split): \p owned are the caller's Views it
/// writes, kept alive with it.
template <class Exec, class Finish, class... Owned>
void finish_or_defer(const Exec& exec, EpHandleState<Exec>& h, EpWire<Exec>& wire, const char* fn, bool split,
                     Finish&& finish, const Owned&... owned) {
  if (!split) {
    finish(exec);
    return;
  }
  h.receive = [finish = std::forward<Finish>(finish), owned...](const Exec& e) { finish(e); };
  h.receive_of = fn;
  ++h.sends;
  // The set stays the handle's until the hook ran: no other handle's operation writes or reads it meanwhile.
  wire.holder = &h;
  h.held = &wire;
}

/// After the rows of \p region were consumed here: with windows, the peers may write there again.
template <class Exec>
void wire_release(const Exec& exec, const EpGroupState<Exec>& g, EpWire<Exec>& w, int region) {
  if (g.windows) window_release(exec, w.signals, region);
}

/// Counts one transfer of \p op (docs/ep.md §9): logical row bytes and what went on the wire.
template <class Exec>
void account(const Exec& exec, EpHandleState<Exec>& h, int op, bool forward, std::size_t pitch, std::size_t row_bytes) {
  const EpGroupState<Exec>& g = *h.group;
  const std::int64_t block = !g.windows && h.shape.capacity_mode ? h.shape.B : 0;
  const std::int64_t signals = g.windows ? 16 * static_cast<std::int64_t>(h.shape.R - 1) : 0;
  account_transfer(exec, h.shape, h.v, op, forward, static_cast<std::int64_t>(pitch),
                   static_cast<std::int64_t>(row_bytes), block, signals);
}

}  // namespace Impl
}  // namespace KokkosMoE

#endif
