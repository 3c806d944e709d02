/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_EP_STATE_HPP
#define KOKKOSMOE_EP_STATE_HPP

// The EP layer's execution space facts, group and handle state, configuration checks and the group's construction
// (docs/ep.md §2, §4-§6).

#include <KokkosMoE_Communicator.hpp>
#include <KokkosMoE_EpConfig.hpp>
#include <KokkosMoE_Error.hpp>

#include <Kokkos_Core.hpp>
#include <kokkos_ext/KokkosMoE_Float16.hpp>
#include <kokkos_ext/KokkosMoE_KokkosCompat.hpp>

#include <impl/KokkosMoE_EP_Decode.hpp>
#include <impl/KokkosMoE_EP_Kernels.hpp>
#include <impl/KokkosMoE_EP_Lane.hpp>
#include <impl/KokkosMoE_EP_Signal.hpp>
#include <impl/KokkosMoE_Transport.hpp>

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

// ----- execution space facts ---------------------------------------------------------------------------------------

template <class Exec>
struct ExecTraits {
  static constexpr CommTransport transport = CommTransport::Mpi;
  static bool serves(CommTransport t) {
    return t == CommTransport::Mpi || t == CommTransport::MpiShm || t == CommTransport::Loopback;
  }
  static void* stream(const Exec&) { return nullptr; }
  static int device(const Exec&) { return -1; }
  /// What EpGroupConfig::max_sms counts: the threads the instance runs.
  static int processors(const Exec& e) { return e.concurrency(); }
  static constexpr const char* processor_name = "threads";
  /// Host memory the instance copies into asynchronously (the eager layout's counts); host spaces read theirs.
  using staging_space = Kokkos::HostSpace;
};
#if defined(KOKKOS_ENABLE_CUDA)
template <>
struct ExecTraits<Kokkos::Cuda> {
  static constexpr CommTransport transport = CommTransport::Nccl;
  static bool serves(CommTransport t) {
    return t == CommTransport::Nccl || t == CommTransport::CudaIpc || t == CommTransport::Loopback;
  }
  static void* stream(const Kokkos::Cuda& e) { return static_cast<void*>(e.cuda_stream()); }
  static int device(const Kokkos::Cuda& e) { return e.cuda_device(); }
  /// What EpGroupConfig::max_sms counts: the device's streaming multiprocessors.
  static int processors(const Kokkos::Cuda& e) {
    int n = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, e.cuda_device()) != cudaSuccess) n = 0;
    return n;
  }
  static constexpr const char* processor_name = "SMs";
  using staging_space = Kokkos::CudaHostPinnedSpace;
};
#endif

template <class T>
struct is_ep_row_type : std::integral_constant<bool, std::is_same<T, float>::value || std::is_same<T, bf16_t>::value> {
};
template <class T>
struct is_ep_index_type
    : std::integral_constant<bool, std::is_same<T, std::int16_t>::value || std::is_same<T, std::int32_t>::value ||
                                       std::is_same<T, std::int64_t>::value> {};

[[noreturn]] inline void ep_fail(const char* fn, const std::string& param, Rule rule, const std::string& msg) {
  throw InvalidArgument(fn, param, rule, msg);
}

template <class Exec, class View, int Rank>
constexpr void ep_static_view() {
  static_assert(Kokkos::is_view<View>::value, "KokkosMoE EP: arguments must be Kokkos::Views");
  static_assert(static_cast<int>(View::rank) == Rank, "KokkosMoE EP: a View has the wrong rank (see docs/ep.md §3)");
  static_assert(Kokkos::SpaceAccessibility<Exec, typename View::memory_space>::accessible,
                "KokkosMoE EP: a View's memory space is not accessible from the execution space");
}

/// Row-major contiguous (LayoutRight, or a stride that equals it); empty Views pass.
template <class View>
bool is_row_major_contiguous(const View& v) {
  if (v.size() == 0) return true;
  if (View::rank == 1) return v.stride(0) == 1 || v.extent(0) == 1;
  if (v.extent(1) > 1 && v.stride(1) != 1) return false;
  return v.extent(0) <= 1 || static_cast<std::size_t>(v.stride(0)) == v.extent(1);
}

template <class View>
void ep_check_view(const char* fn, const char* name, const View& v, std::int64_t rows, std::int64_t cols,
                   bool rows_at_least) {
  const std::int64_t r = static_cast<std::int64_t>(v.extent(0));
  const bool rows_ok = rows_at_least ? r >= rows : r == rows;
  const std::int64_t c = View::rank > 1 ? static_cast<std::int64_t>(v.extent(1)) : 1;
  if (!rows_ok || (View::rank > 1 && c != cols)) {
    std::string want = std::string(rows_at_least ? ">= " : "") + std::to_string(rows);
    if (View::rank > 1) want = "[" + want + ", " + std::to_string(cols) + "]";
    std::string got = std::to_string(r);
    if (View::rank > 1) got = "[" + got + ", " + std::to_string(c) + "]";
    ep_fail(fn, name, Rule::ShapeMismatch, std::string(name) + " has extents " + got + ", expected " + want);
  }
  if (!is_row_major_contiguous(v))
    ep_fail(fn, name, Rule::NotContiguous, std::string(name) + " must be contiguous row-major (LayoutRight)");
}

inline bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

inline std::size_t pad16(std::size_t bytes) { return (bytes + 15) / 16 * 16; }

/// Bytes between consecutive token rows of \p row_bytes each in a stage or window: the row padded to 16 bytes, then,
/// for an operation whose token rows carry their slots' floats (dispatch's weights, the Weighted combine backward's
/// weights, the dispatch backward's weight gradients), a trailer of K floats padded to 16 bytes (docs/ep.md §3.2).
/// The pitch depends on the operation only, never on whether a rank's float View is empty, so peers always agree.
inline std::size_t token_pitch(std::size_t row_bytes, int top_k, bool with_floats) {
  return pad16(row_bytes) + (with_floats ? pad16(static_cast<std::size_t>(top_k) * sizeof(float)) : 0);
}

/// Host memory the EP layer reads or fills through an instance. It is not Kokkos-owned on purpose: Kokkos 4 fences
/// every execution space when it frees a HostSpace allocation, and in a process driving several ranks (loopback) that
/// fence waits for a peer's kernels that wait for this rank (docs/ep.md §7.3). Viewed through an unmanaged View.
template <class View>
class HostCopy {
 public:
  using value_type = typename View::non_const_value_type;
  using host_view = Kokkos::View<typename View::non_const_data_type, typename View::array_layout, Kokkos::HostSpace,
                                 Kokkos::MemoryUnmanaged>;
  explicit HostCopy(const View& like) : m_data(like.span()), m_view(m_data.data(), like.layout()) {}
  HostCopy(const HostCopy&) = delete;
  HostCopy& operator=(const HostCopy&) = delete;
  HostCopy(HostCopy&&) noexcept = default;  // the vector's buffer, and with it the View's pointer, moves along
  template <class... I>
  value_type& operator()(I... i) const {
    return m_view(i...);
  }
  value_type* data() const { return m_view.data(); }
  const host_view& view() const { return m_view; }

 private:
  std::vector<value_type> m_data;
  host_view m_view;
};

/// A host copy of \p v through \p exec alone: no global fence, no Kokkos host allocation (see HostCopy).
template <class Exec, class View>
HostCopy<View> to_host(const Exec& exec, const View& v) {
  HostCopy<View> h(v);
  Kokkos::deep_copy(exec, h.view(), v);
  exec.fence();
  return h;
}

/// \p values into the device View \p v through \p exec alone (see HostCopy).
template <class Exec, class View>
void from_host(const Exec& exec, const View& v, const std::vector<typename View::non_const_value_type>& values) {
  using T = typename View::non_const_value_type;
  Kokkos::View<const T*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged> h(values.data(), values.size());
  Kokkos::deep_copy(exec, v, h);
  exec.fence();
}

/// Zeroes \p v on \p exec with a kernel: Kokkos 4's deep_copy of a scalar into host memory fences, and the statistics
/// resets promise not to.
template <class Exec, class View>
void zero_on(const Exec& exec, const View& v) {
  Kokkos::parallel_for(
      "KokkosMoE::ep::reset_statistics", light(Kokkos::RangePolicy<Exec>(exec, 0, v.extent(0))),
      KOKKOS_LAMBDA(std::size_t i) { v(i) = 0; });
}

// ----- state -------------------------------------------------------------------------------------------------------

/// Where each kind of token row for (or back to) each peer is written: one address per peer. The message transports
/// write into their own stages (every entry is the same local buffer, moved by the transfer); direct writes go to
/// the peers' windows.
template <class Mem>
struct EpPeers {
  Kokkos::View<std::uintptr_t*, Mem> fwd, ret, fwd_f, ret_f, meta, counts;
};

template <class Exec>
struct EpHandleState;

/// One set of the group's buffers for remote rows (EpGroupConfig::wire_buffers; docs/ep.md §14): an operation that
/// moves rows takes a free set for its duration, a split send holds its set until its hook runs.
template <class Exec>
struct EpWire {
  using Mem = typename Exec::memory_space;
  // Message transports: the source stage (forward sends, returned rows) and the destination stage (arrivals, return
  // sends), each R * B token rows; float rows (combine's weights, the combine backward's dots) and the layout's
  // meta (K ints per token row) have their own.
  Kokkos::View<Chunk16*, Mem> src_stage, dst_stage;
  Kokkos::View<float*, Mem> src_flt, dst_flt;
  Kokkos::View<int*, Mem> src_meta;
  EpPeers<Mem> peers;
  // Direct writes (docs/ep.md §7.2): the window, its signals, and where arrivals and returned rows sit in this rank's
  // memory (the stages above otherwise).
  std::shared_ptr<PeerWindow> window;
  WindowSignals<Mem> signals;
  const char *in_fwd = nullptr, *in_ret = nullptr, *in_fwd_f = nullptr, *in_ret_f = nullptr, *in_meta = nullptr,
             *in_counts = nullptr;
  const EpHandleState<Exec>* holder = nullptr;  // the handle whose split send holds this set until its hook
};

template <class Exec>
struct EpGroupState {
  using Mem = typename Exec::memory_space;
  EpGroupConfig config;
  EpShape shape;  // T = 0 here; the handle's copy carries the step's T
  std::shared_ptr<Transport> transport;
  int recv_rows_fixed = 0;          // capacity mode: receive rows of every layout
  std::size_t stage_pitch_max = 0;  // an FP32 row padded to 16 bytes plus the K floats' trailer
  std::int64_t stage_rows = 0;      // token rows per stage: R * B (0 at R = 1): at most B per peer
  // The sets of wire buffers (declared after the transport, so their windows are released before it).
  std::vector<EpWire<Exec>> wires;
  bool windows = false;          // direct writes (every set has a window) or messages (stages)
  std::size_t window_bytes = 0;  // of one set's window
  // The group's error word (a peer that never signalled, in any set's window) and the per-peer wait times.
  Kokkos::View<std::int64_t*, Mem> err;
  Kokkos::View<std::int64_t*, Mem> wait_ns;
  EpLane<Exec> lane;  // where the operations run (docs/ep.md §13)
  // Teams of a one-kernel step over the windows (docs/ep.md §15): they wait for each other and for the peers' kernels,
  // so every team of every rank that shares the device must be resident at once.
  int resident_league = 1;
  bool capacity_mode() const {
    return config.max_recv_tokens_per_rank > 0 || config.layout == RecvLayout::ExpertMajorFixed;
  }
};

template <class Exec>
struct EpHandleState {
  using Mem = typename Exec::memory_space;
  std::shared_ptr<EpGroupState<Exec>> group;
  EpHandleOptions options;
  EpLayoutViews<Mem> v;
  EpShape shape;
  int recv_rows = 0;          // rows of the receive Views the last layout needs
  std::int64_t arrivals = 0;  // arrival indices in use (eager: exact; capacity: R * B)
  std::vector<std::int64_t> send_tok, recv_tok, send_off, recv_off;  // eager, per peer, in token rows
  bool laid_out = false, backward_done = true;
  bool decoded = false;  // the last layout was the decode path's (ids repeated within a token count as invalid)
  std::int64_t recv_rows_alloc = 0;
  std::vector<Kokkos::View<int*, Mem>> outgrown;  // receive maps the eager layout replaced: freed with the handle
  // The eager layout's host view of the gathered counts and of the group's error word (device memory spaces only:
  // one asynchronous copy each behind the kernels, then one bounded wait).
  Kokkos::View<int*, typename ExecTraits<Exec>::staging_space> gathered_host;
  Kokkos::View<std::int64_t*, typename ExecTraits<Exec>::staging_space> err_host;
  /// The receive half of a split operation (docs/ep.md §14) until its hook runs: it owns the Views it writes.
  std::function<void(const Exec&)> receive;
  EpWire<Exec>* held = nullptr;      // the set of wire buffers the pending receive holds
  const char* receive_of = nullptr;  // the send that left it
  std::uint64_t sends = 0;           // split sends so far: a hook runs only the receive of its own send

  EpHandleState(const EpHandleState&) = delete;
  EpHandleState& operator=(const EpHandleState&) = delete;
  ~EpHandleState() {
    if (held) held->holder = nullptr;  // a receive never run gives its set back with the handle
  }

  EpHandleState(std::shared_ptr<EpGroupState<Exec>> g, const EpHandleOptions& o) : group(std::move(g)), options(o) {
    const EpShape& s = group->shape;
    const EpGroupConfig& c = group->config;
    const std::int64_t B = c.max_tokens_per_rank, BK = B * c.topk, RB = static_cast<std::int64_t>(s.R) * B;
    const int nch = (c.max_tokens_per_rank + s.chunk - 1) / s.chunk;
    auto a = [](const char* n, std::int64_t len) {
      return Kokkos::View<int*, Mem>(std::string("KokkosMoE::ep::") + n, static_cast<std::size_t>(len));
    };
    auto bytes = [](const char* n, std::int64_t len) {
      return Kokkos::View<std::uint8_t*, Mem>(std::string("KokkosMoE::ep::") + n, static_cast<std::size_t>(len));
    };
    v.local_pos = a("local_pos", BK);
    v.chunk_prefix = a("chunk_prefix", static_cast<std::int64_t>(nch) * s.E);
    v.chunk_tokens = a("chunk_tokens", static_cast<std::int64_t>(nch) * s.R);
    v.chunk_bad = a("chunk_bad", nch);
    v.tok_local = a("tok_local", B * s.R);
    v.gather_send = a("gather_send", s.E + 1 + s.R);
    v.gathered = a("gathered", static_cast<std::int64_t>(s.R) * (s.E + 1 + s.R));
    if (!group->capacity_mode() && !Kokkos::SpaceAccessibility<Kokkos::HostSpace, Mem>::accessible) {
      using Staging = typename ExecTraits<Exec>::staging_space;
      gathered_host = Kokkos::View<int*, Staging>("KokkosMoE::ep::gathered_host", v.gathered.extent(0));
      err_host = Kokkos::View<std::int64_t*, Staging>("KokkosMoE::ep::err_host", kErrWords);
    }
    v.token_in_rank = bytes("token_in_rank", B * s.R);
    v.tok_pos = a("tok_pos", B * s.R);
    v.counts = a("counts", static_cast<std::int64_t>(s.R) * (s.E + 1));
    v.dest_base = a("dest_base", s.E);
    v.dest_limit = a("dest_limit", s.E);
    v.expert_offsets = a("expert_offsets", s.L + 1);
    v.recv_count = a("recv_count", s.L);
    v.send_base = a("send_base", s.R);
    v.fwd_base = a("fwd_base", s.R);
    v.arrive_base = a("arrive_base", s.R);
    v.arrive_count = a("arrive_count", s.R);
    v.ret_base = a("ret_base", s.R);
    v.slot_row = a("slot_row", BK);
    v.slot_rank = a("slot_rank", BK);
    v.slot_kept = bytes("slot_kept", BK);
    v.fwd_rows = a("fwd_rows", s.R > 1 ? RB * c.topk : 0);
    v.arrive_rank = a("arrive_rank", s.R > 1 ? RB : 0);
    v.sent_rows = a("sent_rows", s.R);
    v.ret_rows = a("ret_rows", s.R);
    v.traffic = Kokkos::View<std::int64_t*, Mem>("KokkosMoE::ep::traffic", 2 * kEpOps);
    v.expert_load = Kokkos::View<std::int64_t*, Mem>("KokkosMoE::ep::expert_load", s.L);
    v.status = a("status", 4);
    v.rank_status = a("rank_status", 2 * static_cast<std::int64_t>(s.R));
    recv_rows_alloc = group->capacity_mode() ? group->recv_rows_fixed : BK;
    // With windows a reallocation in eager mode would free device memory (an implicit device synchronization) while
    // peers' kernels may wait for this rank: such groups size the receive maps for the most rows a layout can need.
    if (group->windows && !group->capacity_mode())
      recv_rows_alloc = std::min<std::int64_t>(std::numeric_limits<int>::max(),
                                               RB * c.topk + static_cast<std::int64_t>(s.L) * (s.align - 1));
    alloc_recv_maps();
  }

  /// The receive maps, recv_rows_alloc rows each, zero-filled when they are made (at the handle's creation).
  void alloc_recv_maps() {
    make_recv_maps([](const std::string& label, std::size_t n) { return Kokkos::View<int*, Mem>(label, n); });
  }

  /// The same inside an operation: zero-filled by \p exec, after which the operation's kernels use them (a View's
  /// own initialization would run on the default instance, whatever instance view_alloc names, in Kokkos 3.4).
  void alloc_recv_maps(const Exec& exec) {
    make_recv_maps([&](const std::string& label, std::size_t n) {
      Kokkos::View<int*, Mem> m(Kokkos::view_alloc(Kokkos::WithoutInitializing, label), n);
      Kokkos::deep_copy(exec, m, 0);
      return m;
    });
  }

  template <class Make>
  void make_recv_maps(const Make& make) {
    const auto n = static_cast<std::size_t>(recv_rows_alloc);
    v.recv_expert = make("KokkosMoE::ep::recv_expert", n);
    v.recv_src = make("KokkosMoE::ep::recv_src", n);
    v.recv_k = make("KokkosMoE::ep::recv_k", n);
  }

  /// Eager mode only: the exact receive rows are known after the layout's one host wait. Maps too small for them
  /// are replaced by maps of at least twice their rows; the outgrown ones stay allocated until the handle goes
  /// (at most as many ints as the live maps), since freeing memory inside an operation fences every instance (Kokkos
  /// 4 before it frees; cudaFree waits for the device) and docs/ep.md §7.4 promises no such fence.
  void ensure_eager_rows(const Exec& exec, std::int64_t recv) {
    if (recv <= recv_rows_alloc) return;
    outgrown.push_back(v.recv_expert);
    outgrown.push_back(v.recv_src);
    outgrown.push_back(v.recv_k);
    recv_rows_alloc = std::min<std::int64_t>(std::numeric_limits<int>::max(), std::max(2 * recv_rows_alloc, recv));
    alloc_recv_maps(exec);
  }
};

/// Device bytes of one handle (docs/ep.md §6): B = max_tokens_per_rank, nch = ceil(B / chunk), N = the receive
/// rows (capacity: the capacity; eager: B * K, grown on demand).
template <class Exec>
std::size_t handle_bytes(const EpGroupState<Exec>& g) {
  const EpShape& s = g.shape;
  const std::size_t B = static_cast<std::size_t>(g.config.max_tokens_per_rank), BK = B * s.K;
  const std::size_t nch = (B + s.chunk - 1) / s.chunk, R = s.R, E = s.E, L = s.L;
  const std::size_t N = g.capacity_mode() ? static_cast<std::size_t>(g.recv_rows_fixed) : BK;
  const std::size_t RB = R > 1 ? R * B : 0;
  const std::size_t ints = BK + nch * E + nch * R + nch + 2 * B * R + (E + 1 + R) + R * (E + 1 + R) + R * (E + 1) +
                           2 * E + (L + 1) + L + 5 * R + 2 * BK + RB * s.K + RB + 3 * N + 4 + 2 * R + 2 * R;
  // + token_in_rank, slot_kept, the traffic counters and the expert load
  return ints * sizeof(int) + B * R + BK + 2 * kEpOps * 8 + L * 8;
}

template <class Exec>
std::size_t buffer_bytes(const EpGroupState<Exec>& g) {
  if (g.windows) return g.window_bytes * g.wires.size();
  std::size_t bytes = 0;
  for (const EpWire<Exec>& w : g.wires)
    bytes += 2 * static_cast<std::size_t>(w.src_stage.extent(0)) * 16 +
             sizeof(float) * (w.src_flt.extent(0) + w.dst_flt.extent(0)) + sizeof(int) * w.src_meta.extent(0);
  return bytes;
}

template <class Exec>
std::vector<const void*> handle_buffers(const EpHandleState<Exec>& h) {
  const auto& v = h.v;
  return {
      v.local_pos.data(),   v.chunk_prefix.data(), v.chunk_tokens.data(),   v.chunk_bad.data(),   v.tok_local.data(),
      v.gather_send.data(), v.gathered.data(),     v.token_in_rank.data(),  v.tok_pos.data(),     v.counts.data(),
      v.dest_base.data(),   v.dest_limit.data(),   v.expert_offsets.data(), v.recv_count.data(),  v.send_base.data(),
      v.fwd_base.data(),    v.arrive_base.data(),  v.arrive_count.data(),   v.ret_base.data(),    v.slot_row.data(),
      v.slot_rank.data(),   v.slot_kept.data(),    v.fwd_rows.data(),       v.arrive_rank.data(), v.recv_expert.data(),
      v.recv_src.data(),    v.recv_k.data(),       v.status.data(),         v.rank_status.data(), v.expert_load.data()};
}

template <class Exec>
CommStats group_stats(const EpGroupState<Exec>& g) {
  return stats_of(*g.transport);
}

/// The most sets of wire buffers a group takes (EpGroupConfig::wire_buffers).
constexpr int kMaxWireBuffers = 8;

/// FNV-1a over the configuration fields, in a fixed order.
inline std::uint64_t config_digest(const EpGroupConfig& c) {
  const std::int64_t fields[] = {c.ep_size,
                                 c.num_experts,
                                 c.hidden_size,
                                 c.topk,
                                 c.max_tokens_per_rank,
                                 c.max_recv_tokens_per_rank,
                                 c.expert_alignment,
                                 c.drop_on_overflow ? 1 : 0,
                                 static_cast<std::int64_t>(c.layout),
                                 c.wire_buffers};
  std::uint64_t h = 1469598103934665603ull;
  for (std::int64_t f : fields) {
    for (int b = 0; b < 8; ++b) {
      h ^= static_cast<std::uint64_t>((f >> (8 * b)) & 0xff);
      h *= 1099511628211ull;
    }
  }
  return h;
}

/// \p c with the deprecated aliases (EpGroupConfig::hidden, ::top_k) resolved: an alias set where its field is 0
/// gives the field its value; set beside a different value is InvalidArgument (Rule::ConfigValue) naming the alias.
/// Both names then hold the field's value.
inline EpGroupConfig resolve_config_aliases(const char* fn, EpGroupConfig c) {
  auto resolve = [&](const char* alias, const char* field, int& value, int& old) {
    if (old != 0 && value != 0 && old != value)
      ep_fail(fn, alias, Rule::ConfigValue,
              std::string(alias) + " (" + std::to_string(old) + ", deprecated) and " + field + " (" +
                  std::to_string(value) + ") name the same field: set " + field + " only");
    if (value == 0) value = old;
    old = value;
  };
  resolve("hidden", "hidden_size", c.hidden_size, c.hidden.value);
  resolve("top_k", "topk", c.topk, c.top_k.value);
  return c;
}

inline void check_group_config(const char* fn, const EpGroupConfig& c, int comm_size, int processors,
                               const char* processor_name) {
  auto range = [&](const char* name, std::int64_t v, std::int64_t lo, std::int64_t hi) {
    if (v < lo || v > hi)
      ep_fail(fn, name, Rule::ConfigValue,
              std::string(name) + " (" + std::to_string(v) + ") must be in [" + std::to_string(lo) + ", " +
                  std::to_string(hi) + "]");
  };
  constexpr std::int64_t imax = std::numeric_limits<int>::max();
  range("ep_size", c.ep_size, 1, 1 << 16);
  if (c.ep_size != comm_size)
    ep_fail(fn, "ep_size", Rule::CommSize,
            "ep_size (" + std::to_string(c.ep_size) + ") must equal the communicator's size (" +
                std::to_string(comm_size) + ")");
  range("num_experts", c.num_experts, 1, 1 << 20);
  if (c.num_experts % c.ep_size != 0)
    ep_fail(fn, "num_experts", Rule::ConfigValue,
            "num_experts (" + std::to_string(c.num_experts) + ") must be a multiple of ep_size (" +
                std::to_string(c.ep_size) + ")");
  range("hidden_size", c.hidden_size, 1, 1 << 24);
  range("topk", c.topk, 1, c.num_experts);
  range("max_tokens_per_rank", c.max_tokens_per_rank, 1, imax / c.topk);
  range("max_recv_tokens_per_rank", c.max_recv_tokens_per_rank, 0, imax);
  range("expert_alignment", c.expert_alignment, 1, 1 << 16);
  range("wire_buffers", c.wire_buffers, 1, kMaxWireBuffers);
  if (c.layout != RecvLayout::ExpertMajor && c.layout != RecvLayout::ExpertMajorFixed)
    ep_fail(fn, "layout", Rule::ConfigValue, "layout is not a RecvLayout enumerator");
  if (c.max_sms != -1 && (c.max_sms < 1 || c.max_sms > processors))
    ep_fail(fn, "max_sms", Rule::ConfigValue,
            "max_sms (" + std::to_string(c.max_sms) + ") must be -1 (no cap) or in [1, " + std::to_string(processors) +
                "], the execution space's " + processor_name);
  if (c.sm_cap != SmCap::Auto && c.sm_cap != SmCap::Partition && c.sm_cap != SmCap::Teams)
    ep_fail(fn, "sm_cap", Rule::ConfigValue, "sm_cap is not an SmCap enumerator");
  if (c.layout == RecvLayout::ExpertMajorFixed) {
    if (c.max_recv_tokens_per_rank != 0)
      ep_fail(fn, "max_recv_tokens_per_rank", Rule::ConfigValue,
              "ExpertMajorFixed sizes itself (num_local_experts * ep_size * max_tokens_per_rank rows): "
              "max_recv_tokens_per_rank must be 0");
    const std::int64_t rows = static_cast<std::int64_t>(c.num_experts / c.ep_size) * c.ep_size * c.max_tokens_per_rank;
    if (rows > imax)
      ep_fail(fn, "max_tokens_per_rank", Rule::ConfigValue,
              "ExpertMajorFixed needs " + std::to_string(rows) + " receive rows, more than 2^31 - 1");
  }
}

/// Fills one set of wire buffers: the addresses of the peers' window parts, or this rank's stages (messages).
template <class Exec, class Table>
void make_wire(const EpShape& s, EpGroupState<Exec>& g, EpWire<Exec>& w, const Table& table, std::size_t rows_bytes,
               std::size_t floats_bytes, std::size_t ctrl_bytes) {
  using Mem = typename Exec::memory_space;
  const std::size_t RB = static_cast<std::size_t>(g.stage_rows);
  if (w.window) {
    // Every token row goes straight to its place in the peer's window: no stages.
    const auto& base = w.window->base;
    const std::size_t o_fwd = ctrl_bytes, o_ret = o_fwd + rows_bytes, o_fwd_f = o_ret + rows_bytes,
                      o_ret_f = o_fwd_f + floats_bytes, o_meta = o_ret_f + floats_bytes,
                      o_counts = o_meta + floats_bytes;
    w.peers.fwd = table("fwd", [&](int r) { return base[r] + o_fwd; });
    w.peers.ret = table("ret", [&](int r) { return base[r] + o_ret; });
    w.peers.fwd_f = table("fwd_f", [&](int r) { return base[r] + o_fwd_f; });
    w.peers.ret_f = table("ret_f", [&](int r) { return base[r] + o_ret_f; });
    w.peers.meta = table("meta", [&](int r) { return base[r] + o_meta; });
    w.peers.counts = table("counts", [&](int r) { return base[r] + o_counts; });
    const char* mine = reinterpret_cast<const char*>(base[s.me]);
    w.in_fwd = mine + o_fwd;
    w.in_ret = mine + o_ret;
    w.in_fwd_f = mine + o_fwd_f;
    w.in_ret_f = mine + o_ret_f;
    w.in_meta = mine + o_meta;
    w.in_counts = mine + o_counts;
    w.signals.ctrl = table("ctrl", [&](int r) { return base[r]; });
    w.signals.epoch = Kokkos::View<std::uint64_t*, Mem>("KokkosMoE::ep::window_epoch", kWindowRegions);
    w.signals.err = g.err;
    w.signals.wait_ns = g.wait_ns;
    w.signals.tickets = Kokkos::View<int*, Mem>("KokkosMoE::ep::window_tickets", 3);
    w.signals.R = s.R;
    w.signals.me = s.me;
    w.signals.timeout_ns = static_cast<std::uint64_t>(g.transport->timeout_seconds() * 1e9);
  } else {
    const auto alloc_rows = [&](const char* name) {
      return Kokkos::View<Chunk16*, Mem>(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(name)),
                                         rows_bytes / 16);
    };
    const std::size_t floats = RB * s.K;
    w.src_stage = alloc_rows("KokkosMoE::ep::src_stage");
    w.dst_stage = alloc_rows("KokkosMoE::ep::dst_stage");
    w.src_flt = Kokkos::View<float*, Mem>("KokkosMoE::ep::src_flt", floats);
    w.dst_flt = Kokkos::View<float*, Mem>("KokkosMoE::ep::dst_flt", floats);
    w.src_meta = Kokkos::View<int*, Mem>("KokkosMoE::ep::src_meta", floats);
    // Message transports: every token row is written into this rank's own stage; the transfer moves it.
    const auto own = [](const void* p) { return [p](int) { return reinterpret_cast<std::uintptr_t>(p); }; };
    w.peers.fwd = table("fwd", own(w.src_stage.data()));
    w.peers.ret = table("ret", own(w.dst_stage.data()));
    w.peers.fwd_f = table("fwd_f", own(w.src_flt.data()));
    w.peers.ret_f = table("ret_f", own(w.dst_flt.data()));
    w.peers.meta = table("meta", own(w.src_meta.data()));
    w.in_fwd = reinterpret_cast<const char*>(w.dst_stage.data());
    w.in_ret = reinterpret_cast<const char*>(w.src_stage.data());
    w.in_fwd_f = reinterpret_cast<const char*>(w.dst_flt.data());
    w.in_ret_f = reinterpret_cast<const char*>(w.src_flt.data());
  }
}

template <class Exec>
std::shared_ptr<EpGroupState<Exec>> make_group_state(const Exec& exec, const Communicator& comm,
                                                     const EpGroupConfig& given) {
  constexpr const char* fn = "EpGroup";
  using Mem = typename Exec::memory_space;
  if (!comm.valid()) ep_fail(fn, "comm", Rule::ConfigValue, "the communicator is empty");
  const std::shared_ptr<Transport>& t = comm.impl_transport();
  if (!ExecTraits<Exec>::serves(t->kind()))
    ep_fail(fn, "comm", Rule::TransportMismatch,
            std::string("a ") + to_string(t->kind()) + " communicator cannot serve " + Exec::name() +
                " (host execution spaces take an MPI or loopback communicator, Kokkos::Cuda an NCCL, CUDA-IPC or "
                "loopback one)");
  if (t->device() != ExecTraits<Exec>::device(exec))
    ep_fail(fn, "exec", Rule::TransportMismatch,
            "the execution space runs on device " + std::to_string(ExecTraits<Exec>::device(exec)) +
                " but the communicator's rank uses device " + std::to_string(t->device()));
  // A configuration that is invalid on this rank alone must not leave the peers waiting in the digest exchange
  // until their timeout: the rank still takes part, with an "invalid" marker, and every rank throws at once
  // (docs/ep.md §2). Errors above this point need the communicator itself and stay local.
  std::exception_ptr invalid;
  EpLane<Exec> lane;
  EpGroupConfig config = given;
  try {
    config = resolve_config_aliases(fn, given);
    check_group_config(fn, config, t->size(), ExecTraits<Exec>::processors(exec), ExecTraits<Exec>::processor_name);
    lane = EpLane<Exec>::make(fn, exec, config);
  } catch (const InvalidArgument&) {
    invalid = std::current_exception();
  } catch (const DeviceError&) {
    invalid = std::current_exception();
  }
  {
    const int R = t->size();
    // Per rank: invalid marker, config digest, the communicator's window setting (make_window is collective).
    constexpr int kWords = 3;
    Kokkos::View<std::uint64_t*, Mem> mine("KokkosMoE::ep::digest", kWords), all("KokkosMoE::ep::digests", kWords * R);
    from_host(exec, mine, {invalid ? 1u : 0u, config_digest(config), static_cast<std::uint64_t>(t->peer_windows())});
    t->allgather(fn, mine.data(), all.data(), kWords * sizeof(std::uint64_t), ExecTraits<Exec>::stream(exec));
    t->wait(fn, ExecTraits<Exec>::stream(exec));
    auto host = to_host(exec, all);
    if (invalid) std::rethrow_exception(invalid);
    std::string bad, differ, windows;
    for (int r = 0; r < R; ++r) {
      if (host(kWords * r) != 0) bad += (bad.empty() ? "" : ", ") + std::to_string(r);
      if (host(kWords * r + 1) != host(1)) differ += (differ.empty() ? "" : ", ") + std::to_string(r);
      if (host(kWords * r + 2) != host(2)) windows += (windows.empty() ? "" : ", ") + std::to_string(r);
    }
    if (!windows.empty())
      ep_fail(fn, "comm", Rule::CommConfigMismatch,
              "the ranks' communicators were made with different CommConfig::peer_windows: rank(s) " + windows +
                  " differ from rank 0");
    if (!bad.empty())
      ep_fail(fn, "config", Rule::CommConfigMismatch,
              "rank(s) " + bad +
                  " of the EP group passed an invalid EpGroupConfig (their own InvalidArgument names the field); "
                  "every rank must pass the same valid config");
    if (!differ.empty())
      ep_fail(fn, "config", Rule::CommConfigMismatch,
              "the ranks of the EP group passed different EpGroupConfig values: rank(s) " + differ +
                  " differ from rank 0 (every rank must pass the same config)");
  }

  auto g = std::make_shared<EpGroupState<Exec>>();
  g->config = config;
  g->transport = t;
  g->lane = std::move(lane);
  EpShape& s = g->shape;
  s.K = config.topk;
  s.E = config.num_experts;
  s.R = config.ep_size;
  s.chunk = layout_chunk(config.topk);
  s.L = s.E / s.R;
  s.me = t->rank();
  s.align = config.layout == RecvLayout::ExpertMajor ? config.expert_alignment : 1;
  s.fixed = config.layout == RecvLayout::ExpertMajorFixed;
  s.slab = s.fixed ? s.R * config.max_tokens_per_rank : 0;
  s.capacity = s.fixed ? 0 : config.max_recv_tokens_per_rank;
  s.B = config.max_tokens_per_rank;
  // Under an SM partition every kernel launches its uncapped grid on the partition's stream.
  s.max_teams = g->lane.partitioned() ? -1 : config.max_sms;
  // The processors the kernels run on: the device's SMs (or threads), within an SM partition.
  int procs = ExecTraits<Exec>::processors(exec);
  if (g->lane.partitioned()) procs = std::min(procs, g->lane.partition_sms());
  if (!Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename Exec::memory_space>::accessible)
    s.wave_teams = procs * kResidentTeamsPerSm;
  s.capacity_mode = g->capacity_mode();
  if (s.capacity_mode) g->recv_rows_fixed = s.fixed ? s.L * s.slab : config.max_recv_tokens_per_rank;
  g->stage_pitch_max = token_pitch(static_cast<std::size_t>(config.hidden_size) * sizeof(float), s.K, true);
  g->stage_rows = s.R > 1 ? static_cast<std::int64_t>(s.R) * s.B : 0;
  const std::size_t RB = static_cast<std::size_t>(g->stage_rows);
  const std::size_t rows_bytes = RB * g->stage_pitch_max, floats_bytes = pad16(RB * s.K * sizeof(float));
  const std::size_t ctrl_bytes = pad16(static_cast<std::size_t>(kWindowRegions) * 2 * s.R * sizeof(std::uint64_t));
  const std::size_t counts_bytes = pad16(static_cast<std::size_t>(s.R) * (s.E + 1 + s.R) * sizeof(int));
  auto table = [&](const char* name, auto&& addr) {
    Kokkos::View<std::uintptr_t*, Mem> tv(std::string("KokkosMoE::ep::peers_") + name, static_cast<std::size_t>(s.R));
    std::vector<std::uintptr_t> hv(static_cast<std::size_t>(s.R));
    for (int r = 0; r < s.R; ++r) hv[r] = addr(r);
    from_host(exec, tv, hv);
    return tv;
  };
  // One error word and one set of wait times for the whole group: a peer silent in any set stops every later wait.
  g->err = Kokkos::View<std::int64_t*, Mem>("KokkosMoE::ep::window_error", kErrWords);
  g->wait_ns = Kokkos::View<std::int64_t*, Mem>("KokkosMoE::ep::peer_wait_ns", s.R);
  if (s.R > 1 && t->peer_windows() != PeerWindows::Off)
    g->window_bytes = ctrl_bytes + 2 * rows_bytes + 3 * floats_bytes + counts_bytes;
  g->wires.resize(static_cast<std::size_t>(config.wire_buffers));
  for (EpWire<Exec>& w : g->wires) {
    // make_window is collective and answers alike on every rank and every call: every set has a window, or none.
    if (g->window_bytes > 0) w.window = t->make_window(fn, g->window_bytes);
    g->windows = static_cast<bool>(w.window);
    make_wire(s, *g, w, table, rows_bytes, floats_bytes, ctrl_bytes);
  }
  s.windows = g->windows;
  if (g->windows) {
    // kResidentTeamsPerSm teams per processor, the processors split among the ranks that share the device (all of
    // them when the window does not say), within the partition; under the teams cap, max_sms teams.
    const int sharers = g->wires.front().window->device_sharers > 0 ? g->wires.front().window->device_sharers : s.R;
    // One team fewer per rank leaves room for the small signal kernels of other operations.
    g->resident_league = std::max(1, procs * kResidentTeamsPerSm / sharers - 1);
    if (s.max_teams > 0) g->resident_league = std::min(g->resident_league, s.max_teams);
  }
  exec.fence();
  return g;
}

}  // namespace Impl
}  // namespace KokkosMoE

#endif
