/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_EP_LAYOUTSTEP_HPP
#define KOKKOSMOE_EP_LAYOUTSTEP_HPP

// The layout step and the synchronization that reads what it found (docs/ep.md §3.1, §5).

#include <impl/KokkosMoE_EP_Transfer.hpp>

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

// ----- layout ------------------------------------------------------------------------------------------------------

/// The checks every layout runs (ep_layout, ep_decode_dispatch); nothing changes.
template <class Exec, class IdxView>
void check_layout(const char* fn, const EpHandleState<Exec>& h, const IdxView& idx) {
  require_no_receive(fn, h);
  ep_static_view<Exec, IdxView, 2>();
  static_assert(is_ep_index_type<typename IdxView::non_const_value_type>::value,
                "KokkosMoE EP: topk_idx must hold int16_t, int32_t or int64_t expert ids");
  const EpGroupConfig& c = h.group->config;
  if (idx.extent(0) > static_cast<std::size_t>(c.max_tokens_per_rank) ||
      idx.extent(1) != static_cast<std::size_t>(c.topk))
    ep_fail(fn, "topk_idx", Rule::ShapeMismatch,
            "topk_idx has extents [" + std::to_string(idx.extent(0)) + ", " + std::to_string(idx.extent(1)) +
                "], expected [T <= max_tokens_per_rank = " + std::to_string(c.max_tokens_per_rank) +
                ", top_k = " + std::to_string(c.topk) + "]");
  if (h.options.training && !h.backward_done)
    ep_fail(fn, "handle", Rule::HandleReuse,
            "the handle" + (h.options.name.empty() ? std::string() : " '" + h.options.name + "'") +
                " still holds a training step whose backward has not run (ep_dispatch_backward); use one EpHandle "
                "per layer, or EpHandleOptions::training = false for inference");
  (void)take_wire(fn, h);
}

/// The step's shape into the handle, once every rank's checks passed.
template <class Exec, class IdxView>
void begin_layout(EpHandleState<Exec>& h, const IdxView& idx) {
  h.shape = h.group->shape;
  h.shape.T = static_cast<int>(idx.extent(0));
}

/// The layout after begin_layout checked its arguments (ep_decode_dispatch's message-transport form: \p unique_ids).
template <class Exec, class IdxView>
void run_layout(const Exec& exec, EpHandleState<Exec>& h, const IdxView& idx, const char* fn, bool unique_ids) {
  ScopedRegion region("KokkosMoE::ep_layout");
  EpGroupState<Exec>& g = *h.group;
  h.shape.unique_ids = unique_ids;
  h.decoded = unique_ids;
  const EpShape& s = h.shape;
  void* stream = ExecTraits<Exec>::stream(exec);
  const int W = s.E + 1 + s.R;

  EpWire<Exec>& wire = take_wire(fn, h);
  enter_op(fn, g, s);
  layout_count(exec, s, idx, h.v);  // at one rank it writes the gathered vector too
  if (s.R == 1) {
    // Nothing to exchange.
  } else if (g.windows) {
    // The counts travel through the windows too, so that capacity mode waits on the device only.
    wire_acquire(exec, fn, g, wire, kRegionCounts);
    gather_pack(exec, s, h.v, wire.peers.counts);
    wire_move(exec, fn, h, wire, kRegionCounts, 0);
    using Unmanaged = Kokkos::View<const int*, typename Exec::memory_space, Kokkos::MemoryUnmanaged>;
    Kokkos::deep_copy(exec, h.v.gathered,
                      Unmanaged(reinterpret_cast<const int*>(wire.in_counts), h.v.gathered.extent(0)));
    wire_release(exec, g, wire, kRegionCounts);
  } else {
    // MPI reads what the kernels wrote.
    if (ExecTraits<Exec>::transport == CommTransport::Mpi) exec.fence();
    g.transport->allgather(fn, h.v.gather_send.data(), h.v.gathered.data(), sizeof(int) * W, stream);
  }

  if (!s.capacity_mode) {
    // Eager: the one host wait of the step, bounded by the communicator's timeout. The counts (and the error word
    // of the windows' waits; one rank waits for nobody) come back in that wait: copies into pinned host memory. The
    // place kernel is queued before it, on the receive maps the handle holds (it derives the receive rows from the
    // counts itself), so that the device does not idle through the host's read; where the layout needs more rows
    // than the maps hold, the maps grow and place runs again.
    constexpr bool host = Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename Exec::memory_space>::accessible;
    const bool err_word = g.windows && s.R > 1;
    if constexpr (!host) {
      Kokkos::deep_copy(exec, h.gathered_host, h.v.gathered);
      if (err_word) Kokkos::deep_copy(exec, h.err_host, g.err);
    }
    layout_place(exec, s, idx, h.v, PlaceRows{h.recv_rows_alloc, true, true});
    g.transport->wait(fn, stream);
    exec.fence();  // the instance is idle by now: the documented fence (docs/ep.md §7.4) costs no wait
    const std::int64_t* err = host ? g.err.data() : h.err_host.data();
    if (err_word && err[0] != 0) throw_window_error(fn, g, err);
    const int* m = host ? h.v.gathered.data() : h.gathered_host.data();
    auto cnt = [&](int i, int e) { return static_cast<std::int64_t>(m[static_cast<std::size_t>(i) * W + e]); };
    auto tok = [&](int i, int r) { return cnt(i, s.E + 1 + r); };
    std::string bad;
    for (int i = 0; i < s.R; ++i)
      if (cnt(i, s.E) > 0)
        bad += (bad.empty() ? "" : ", ") + std::string("rank ") + std::to_string(i) + " (" +
               std::to_string(cnt(i, s.E)) + ")";
    if (!bad.empty())
      ep_fail(fn, "topk_idx", Rule::ExpertIdRange,
              "topk_idx holds expert ids outside [-1, num_experts = " + std::to_string(s.E) + ") on " + bad);
    h.send_tok.assign(s.R, 0);
    h.recv_tok.assign(s.R, 0);
    h.send_off.assign(s.R, 0);
    h.recv_off.assign(s.R, 0);
    std::int64_t padded = 0, so = 0, d_o = 0;
    for (int l = 0; l < s.L; ++l) {
      std::int64_t n = 0;
      for (int i = 0; i < s.R; ++i) n += cnt(i, s.me * s.L + l);
      padded += (n + s.align - 1) / s.align * s.align;
    }
    for (int p = 0; p < s.R; ++p) {
      if (p == s.me) continue;
      h.send_tok[p] = tok(s.me, p);
      h.recv_tok[p] = tok(p, s.me);
      h.send_off[p] = so;
      h.recv_off[p] = d_o;
      so += h.send_tok[p];
      d_o += h.recv_tok[p];
    }
    if (padded > std::numeric_limits<int>::max())
      throw CommError(fn, s.me, s.R, CommFailure::Library,
                      "the layout needs " + std::to_string(padded) + " receive rows, more than 2^31 - 1");
    h.recv_rows = static_cast<int>(padded);
    h.arrivals = d_o;
    if (padded > h.recv_rows_alloc) {
      h.ensure_eager_rows(exec, padded);
      layout_place(exec, s, idx, h.v, PlaceRows{padded, false, false});
    }
    // Ranks that share a device meet again before the meta's wait kernels: no rank's kernel spins while a peer's
    // thread is still in this host section (docs/ep.md §7.3).
    if (g.windows && s.R > 1) g.transport->rendezvous("ep_layout (receive rows known)");
  } else {
    h.recv_rows = g.recv_rows_fixed;
    h.arrivals = g.stage_rows;
    layout_place(exec, s, idx, h.v, PlaceRows{h.recv_rows, false, true});
  }
  // The receivers learn which of their rows each arriving token feeds: K ints per token row, one transfer.
  const std::size_t meta_pitch = static_cast<std::size_t>(s.K) * sizeof(int);
  wire_acquire(exec, fn, g, wire, kRegionMeta);
  meta_pack(exec, s, h.v, PeerRows<typename Exec::memory_space>{wire.peers.meta, h.v.fwd_base, meta_pitch});
  wire_move(exec, fn, h, wire, kRegionMeta, meta_pitch);
  if (g.windows && s.R > 1) {
    using Unmanaged = Kokkos::View<const int*, typename Exec::memory_space, Kokkos::MemoryUnmanaged>;
    Kokkos::deep_copy(exec, h.v.fwd_rows,
                      Unmanaged(reinterpret_cast<const int*>(wire.in_meta), h.v.fwd_rows.extent(0)));
  }
  wire_release(exec, g, wire, kRegionMeta);
  meta_scatter(exec, s, h.v);
  account_layout(exec, s, h.v, !g.windows && s.capacity_mode ? s.B : 0,
                 g.windows ? 32 * static_cast<std::int64_t>(s.R - 1) : 0);  // counts and meta: two regions
  h.laid_out = true;
  h.backward_done = !h.options.training;
}

template <class Exec, class IdxView>
void layout(const Exec& exec, EpHandleState<Exec>& h, const IdxView& idx) {
  constexpr const char* fn = "ep_layout";
  check_on_every_rank(fn, *h.group, [&] { check_layout(fn, h, idx); });
  begin_layout(h, idx);
  run_layout(exec, h, idx, fn, false);
}

/// No operation but the hook may run on a handle whose split send waits for its receive.
template <class Exec>
void require_no_receive(const char* fn, const EpHandleState<Exec>& h) {
  if (h.receive)
    ep_fail(fn, "handle", Rule::HandleState,
            std::string("the receive hook of ") + h.receive_of +
                " has not run: call it before the handle's next operation (docs/ep.md §14)");
}

template <class Exec>
void require_layout(const char* fn, const EpHandleState<Exec>& h) {
  require_no_receive(fn, h);
  if (!h.laid_out) ep_fail(fn, "handle", Rule::HandleState, "the handle has no layout yet: call ep_layout first");
}

template <class Unit, class Mem, class View>
Unmanaged2<std::conditional_t<std::is_const<typename View::value_type>::value, const Unit, Unit>, Mem> rows_view(
    const View& v, int hidden) {
  using T = std::conditional_t<std::is_const<typename View::value_type>::value, const Unit, Unit>;
  using Scalar = typename View::non_const_value_type;
  const int units = static_cast<int>(static_cast<std::int64_t>(hidden) * sizeof(Scalar) / sizeof(Unit));
  return Unmanaged2<T, Mem>(reinterpret_cast<T*>(v.data()), v.extent(0), v.extent(0) == 0 ? 0 : units);
}

template <class Mem, class View>
Unmanaged2<const float, Mem> floats2(const View& v) {
  return Unmanaged2<const float, Mem>(v.data(), v.extent(0), v.extent(1));
}
template <class Mem, class View>
Unmanaged2<float, Mem> floats2_out(const View& v) {
  return Unmanaged2<float, Mem>(v.data(), v.extent(0), v.extent(1));
}
template <class Mem, class View>
Unmanaged1<float, Mem> floats1_out(const View& v) {
  return Unmanaged1<float, Mem>(v.data(), v.extent(0));
}
template <class Mem, class View>
Unmanaged1<const float, Mem> floats1(const View& v) {
  return Unmanaged1<const float, Mem>(v.data(), v.extent(0));
}

/// Calls f.template operator()<Unit>() with Chunk16 when every pointer and the row size are 16-byte aligned.
template <class Scalar, class F>
void with_unit(int hidden, std::initializer_list<const void*> ptrs, F&& f) {
  bool vec = (static_cast<std::size_t>(hidden) * sizeof(Scalar)) % 16 == 0;
  for (const void* p : ptrs) vec = vec && aligned16(p);
  if (vec) {
    f(Chunk16{});
  } else {
    f(Scalar{});
  }
}

// ----- synchronization ---------------------------------------------------------------------------------------------

template <class Exec>
EpStatus synchronize(const Exec& exec, EpHandleState<Exec>& h) {
  constexpr const char* fn = "ep_synchronize";
  require_no_receive(fn, h);
  EpGroupState<Exec>& g = *h.group;
  g.transport->wait(fn, ExecTraits<Exec>::stream(exec));
  exec.fence();
  EpStatus st;
  if (g.windows) check_window_word(exec, fn, g);
  if (!h.laid_out) return st;
  const EpShape& s = h.shape;
  {
    // The traffic since the last synchronization joins the communicator's counters.
    auto traffic = to_host(exec, h.v.traffic);
    for (int op = 0; op < kEpOps; ++op) {
      ByteCount& b = g.transport->bytes[kEpOpNames[op]];
      b.logical += traffic(2 * op);
      b.wire += traffic(2 * op + 1);
    }
    Kokkos::deep_copy(exec, h.v.traffic, std::int64_t(0));
  }
  auto status = to_host(exec, h.v.status);
  auto m = to_host(exec, h.v.counts);
  std::string bad;
  for (int i = 0; i < s.R; ++i) {
    const int n = m(static_cast<std::size_t>(i) * (s.E + 1) + s.E);
    if (n > 0)
      bad += (bad.empty() ? "" : ", ") + std::string("rank ") + std::to_string(i) + " (" + std::to_string(n) + ")";
  }
  if (!bad.empty())
    ep_fail(h.decoded ? "ep_decode_dispatch" : "ep_layout", "topk_idx", Rule::ExpertIdRange,
            "topk_idx held expert ids outside [-1, num_experts = " + std::to_string(s.E) + ")" +
                (h.decoded ? std::string(" or repeated within a token") : std::string()) + " on " + bad +
                " (found at ep_synchronize; those slots were treated as -1)");
  auto ranks = to_host(exec, h.v.rank_status);
  st.recv_demand = status(2);
  st.dropped_slots = status(1);
  st.dropped_recv_slots = ranks(2 * s.me + 1);
  if (g.config.drop_on_overflow) return st;
  // Every rank holds every rank's receive drops (from the same counts), so every rank of the group throws here and
  // none goes on alone into the next collective. The exception reports this rank's own overflow when it had one,
  // else the lowest rank that overflowed.
  const std::int64_t cap = s.fixed ? s.slab : g.recv_rows_fixed;
  int first = -1;
  std::string list;
  for (int j = 0; j < s.R; ++j) {
    const int dropped = ranks(2 * j + 1);
    if (dropped == 0) continue;
    if (first < 0) first = j;
    list += (list.empty() ? "" : ", ") + std::string("rank ") + std::to_string(j) + " (demand " +
            std::to_string(ranks(2 * j)) + ", " + std::to_string(dropped) + " slot(s) past the capacity)";
  }
  if (first < 0) return st;
  if (st.dropped_recv_slots > 0) first = s.me;
  throw CapacityOverflow("ep_synchronize", ranks(2 * first), cap, first,
                         std::string(s.fixed ? "an expert slab" : "the receive rows") + " of " + list +
                             " overflowed in the last ep_layout of this handle" +
                             (h.options.name.empty() ? std::string() : " ('" + h.options.name + "')") +
                             "; this rank's own slots dropped: " + std::to_string(st.dropped_slots));
}

}  // namespace Impl
}  // namespace KokkosMoE

#endif
