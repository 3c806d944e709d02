/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_EP_IMPL_HPP
#define KOKKOSMOE_EP_IMPL_HPP

// Group and handle state, boundary validation and the step drivers of the EP layer (docs/ep.md §3-§6). Each public
// function validates on the host, then enqueues kernels and transfers on the execution space instance; the stream
// handed to the transport is the instance's stream, so every EP kernel and library call runs on it.

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
    const std::int64_t B = c.max_tokens_per_rank, BK = B * c.top_k, RB = static_cast<std::int64_t>(s.R) * B;
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
    v.fwd_rows = a("fwd_rows", s.R > 1 ? RB * c.top_k : 0);
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
                                               RB * c.top_k + static_cast<std::int64_t>(s.L) * (s.align - 1));
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
                                 c.hidden,
                                 c.top_k,
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
  range("hidden", c.hidden, 1, 1 << 24);
  range("top_k", c.top_k, 1, c.num_experts);
  range("max_tokens_per_rank", c.max_tokens_per_rank, 1, imax / c.top_k);
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
                                                     const EpGroupConfig& config) {
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
  try {
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
  s.K = config.top_k;
  s.chunk = layout_chunk(config.top_k);
  s.E = config.num_experts;
  s.R = config.ep_size;
  s.L = s.E / s.R;
  s.me = t->rank();
  s.align = config.layout == RecvLayout::ExpertMajor ? config.expert_alignment : 1;
  s.fixed = config.layout == RecvLayout::ExpertMajorFixed;
  s.slab = s.fixed ? s.R * config.max_tokens_per_rank : 0;
  s.capacity = s.fixed ? 0 : config.max_recv_tokens_per_rank;
  s.B = config.max_tokens_per_rank;
  // Under an SM partition every kernel launches its uncapped grid on the partition's stream.
  s.max_teams = g->lane.partitioned() ? -1 : config.max_sms;
  s.capacity_mode = g->capacity_mode();
  if (s.capacity_mode) g->recv_rows_fixed = s.fixed ? s.L * s.slab : config.max_recv_tokens_per_rank;
  g->stage_pitch_max = token_pitch(static_cast<std::size_t>(config.hidden) * sizeof(float), s.K, true);
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
  exec.fence();
  return g;
}

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
      idx.extent(1) != static_cast<std::size_t>(c.top_k))
    ep_fail(fn, "topk_idx", Rule::ShapeMismatch,
            "topk_idx has extents [" + std::to_string(idx.extent(0)) + ", " + std::to_string(idx.extent(1)) +
                "], expected [T <= max_tokens_per_rank = " + std::to_string(c.max_tokens_per_rank) +
                ", top_k = " + std::to_string(c.top_k) + "]");
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
  layout_count(exec, s, idx, h.v);
  if (g.windows) {
    // The counts travel through the windows too, so that capacity mode waits on the device only.
    wire_acquire(exec, fn, g, wire, kRegionCounts);
    gather_pack(exec, s, h.v, wire.peers.counts);
    wire_move(exec, fn, h, wire, kRegionCounts, 0);
    using Unmanaged = Kokkos::View<const int*, typename Exec::memory_space, Kokkos::MemoryUnmanaged>;
    Kokkos::deep_copy(exec, h.v.gathered,
                      Unmanaged(reinterpret_cast<const int*>(wire.in_counts), h.v.gathered.extent(0)));
    wire_release(exec, g, wire, kRegionCounts);
  } else {
    // MPI reads what the kernels wrote. One rank's all-gather is a copy on this thread, after the kernels: host
    // execution spaces (Serial, OpenMP) have finished a kernel when its launch returns.
    if (ExecTraits<Exec>::transport == CommTransport::Mpi && s.R > 1) exec.fence();
    g.transport->allgather(fn, h.v.gather_send.data(), h.v.gathered.data(), sizeof(int) * W, stream);
  }

  if (!s.capacity_mode) {
    // Eager: the one host wait of the step, bounded by the communicator's timeout.
    g.transport->wait(fn, stream);
    if (g.windows) check_window_word(exec, fn, g);
    auto m = to_host(exec, h.v.gathered);
    auto cnt = [&](int i, int e) { return static_cast<std::int64_t>(m(static_cast<std::size_t>(i) * W + e)); };
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
    h.ensure_eager_rows(exec, padded);
    h.recv_rows = static_cast<int>(padded);
    h.arrivals = d_o;
    // Ranks that share a device meet again before the meta's wait kernels: no rank's kernel spins while a peer's
    // thread is still in this host section (docs/ep.md §7.3).
    if (g.windows && s.R > 1) g.transport->rendezvous("ep_layout (receive rows known)");
  } else {
    h.recv_rows = g.recv_rows_fixed;
    h.arrivals = g.stage_rows;
  }
  layout_offsets(exec, s, h.v);
  accumulate_load(exec, s, h.v);
  layout_slots(exec, s, idx, h.v, h.recv_rows);
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

// ----- dispatch ----------------------------------------------------------------------------------------------------

/// The weight arguments of every dispatch form: topk_w [T, K] float (may be empty), recv_w [N] float.
template <class Exec, class WView, class RecvWView>
constexpr void dispatch_weights_static() {
  ep_static_view<Exec, WView, 2>();
  ep_static_view<Exec, RecvWView, 1>();
  static_assert(std::is_same<typename WView::non_const_value_type, float>::value,
                "KokkosMoE::ep_dispatch: topk_w must hold float");
  static_assert(std::is_same<typename RecvWView::value_type, float>::value,
                "KokkosMoE::ep_dispatch: recv_w must be non-const float");
}

/// The row arguments of a dispatch (ep_dispatch, its split send, ep_decode_dispatch): their types, then their extents
/// against T and \p rows receive rows. Returns whether weights travel (topk_w non-empty).
template <class Exec, class XView, class WView, class RecvXView, class RecvWView>
bool check_dispatch_rows(const char* fn, const EpShape& s, int H, int rows, const XView& x, const WView& w,
                         const RecvXView& recv_x, const RecvWView& recv_w) {
  using Scalar = typename XView::non_const_value_type;
  ep_static_view<Exec, XView, 2>();
  ep_static_view<Exec, RecvXView, 2>();
  dispatch_weights_static<Exec, WView, RecvWView>();
  static_assert(is_ep_row_type<Scalar>::value, "KokkosMoE::ep_dispatch: x must hold float or KokkosMoE::bf16_t");
  static_assert(std::is_same<typename RecvXView::value_type, Scalar>::value,
                "KokkosMoE::ep_dispatch: recv_x must be non-const with x's element type");
  ep_check_view(fn, "x", x, s.T, H, false);
  const bool with_w = w.extent(0) > 0 || w.extent(1) > 0;
  if (with_w) ep_check_view(fn, "topk_w", w, s.T, s.K, false);
  ep_check_view(fn, "recv_x", recv_x, rows, H, true);
  if (with_w) ep_check_view(fn, "recv_w", recv_w, rows, 1, true);
  return with_w;
}

template <class Exec, class XView, class WView, class RecvXView, class RecvWView>
void dispatch(const Exec& exec, EpHandleState<Exec>& h, const XView& x, const WView& w, const RecvXView& recv_x,
              const RecvWView& recv_w, bool split = false) {
  const char* fn = split ? "ep_dispatch_send" : "ep_dispatch";
  using Mem = typename Exec::memory_space;
  using Scalar = typename XView::non_const_value_type;
  ScopedRegion region("KokkosMoE::ep_dispatch");
  EpGroupState<Exec>& g = *h.group;
  const EpShape& s = h.shape;
  const int H = g.config.hidden;
  bool with_w = false;
  check_on_every_rank(fn, g, [&] {
    require_layout(fn, h);
    with_w = check_dispatch_rows<Exec>(fn, s, H, h.recv_rows, x, w, recv_x, recv_w);
    (void)take_wire(fn, h);
  });
  EpWire<Exec>& wire = take_wire(fn, h);
  enter_op(fn, g, s);
  const std::size_t row_bytes = static_cast<std::size_t>(H) * sizeof(Scalar);
  const std::size_t pitch = token_pitch(row_bytes, s.K, true);
  with_unit<Scalar>(H, {x.data(), recv_x.data()}, [&](auto unit) {
    using Unit = decltype(unit);
    const auto src_w = with_w ? floats2<Mem>(w) : Unmanaged2<const float, Mem>();
    const auto rw = with_w ? floats1_out<Mem>(recv_w) : Unmanaged1<float, Mem>();
    auto rx = rows_view<Unit, Mem>(recv_x, H);
    wire_acquire(exec, fn, g, wire, kRegionFwd);
    pack_tokens<Exec, Scalar, Unit>(exec, s, rows_view<Unit, Mem>(x, H), src_w, true, false, h.v, rx, rw,
                                    PeerRows<Mem>{wire.peers.fwd, h.v.fwd_base, pitch}, pad16(row_bytes),
                                    "KokkosMoE::ep_dispatch::pack");
    wire_send(exec, fn, h, wire, kRegionFwd, pitch);
    EpHandleState<Exec>* hp = &h;
    EpWire<Exec>* wp = &wire;
    const LocalRows in{wire.in_fwd, pitch};
    const std::size_t trailer = pad16(row_bytes);
    finish_or_defer(
        exec, h, wire, fn, split,
        [hp, wp, fn, s, in, trailer, rx, rw](const Exec& e) {
          wire_wait(e, fn, *hp, *wp, kRegionFwd);
          expand_arrivals<Exec, Scalar, Unit>(e, s, hp->arrivals, hp->recv_rows, in, trailer, hp->v, rx, rw,
                                              "KokkosMoE::ep_dispatch::expand");
          wire_release(e, *hp->group, *wp, kRegionFwd);
        },
        recv_x, recv_w);
  });
  account(exec, h, kOpDispatch, true, pitch, row_bytes);
}

// ----- decode ------------------------------------------------------------------------------------------------------

/// ep_decode_dispatch (docs/ep.md §15): the layout fused into the dispatch over the peer windows; without windows (a
/// message transport, one rank) the same contract as ep_layout + ep_dispatch.
template <class Exec, class IdxView, class XView, class WView, class RecvXView, class RecvWView>
void decode_dispatch(const Exec& exec, EpHandleState<Exec>& h, const IdxView& idx, const XView& x, const WView& w,
                     const RecvXView& recv_x, const RecvWView& recv_w) {
  constexpr const char* fn = "ep_decode_dispatch";
  using Mem = typename Exec::memory_space;
  using Scalar = typename XView::non_const_value_type;
  EpGroupState<Exec>& g = *h.group;
  const EpGroupConfig& c = g.config;
  using Lim = EpDecodeLimits;
  // Every argument is checked before the first communication, on either path, and on every rank.
  const int H = c.hidden;
  const int N = g.recv_rows_fixed;
  bool with_w = false;
  check_on_every_rank(fn, g, [&] {
    if (c.layout != RecvLayout::ExpertMajorFixed || c.max_tokens_per_rank > Lim::max_tokens_per_rank ||
        c.ep_size > Lim::max_ep_size || c.num_experts > Lim::max_experts)
      ep_fail(fn, "handle", Rule::ConfigValue,
              "the decode path needs a group with layout = ExpertMajorFixed, max_tokens_per_rank <= " +
                  std::to_string(Lim::max_tokens_per_rank) + ", ep_size <= " + std::to_string(Lim::max_ep_size) +
                  " and num_experts <= " + std::to_string(Lim::max_experts) + " (this one: " + to_string(c.layout) +
                  ", " + std::to_string(c.max_tokens_per_rank) + ", " + std::to_string(c.ep_size) + ", " +
                  std::to_string(c.num_experts) + ")");
    check_layout(fn, h, idx);
    EpShape t = g.shape;
    t.T = static_cast<int>(idx.extent(0));
    with_w = check_dispatch_rows<Exec>(fn, t, H, N, x, w, recv_x, recv_w);
  });
  begin_layout(h, idx);
  const EpShape& s = h.shape;
  if (!g.windows) {
    run_layout(exec, h, idx, fn, true);
    dispatch(exec, h, x, w, recv_x, recv_w);
    return;
  }
  ScopedRegion region("KokkosMoE::ep_decode_dispatch");
  h.shape.unique_ids = true;
  h.recv_rows = N;
  h.arrivals = g.stage_rows;
  EpWire<Exec>& wire = take_wire(fn, h);
  enter_op(fn, g, s);
  const std::size_t row_bytes = static_cast<std::size_t>(H) * sizeof(Scalar);
  DecodeWire<Mem> d{wire.peers.fwd,
                    wire.peers.meta,
                    wire.peers.counts,
                    wire.in_fwd,
                    reinterpret_cast<const int*>(wire.in_meta),
                    reinterpret_cast<const int*>(wire.in_counts),
                    token_pitch(row_bytes, s.K, true),
                    pad16(row_bytes),
                    row_bytes};
  with_unit<Scalar>(H, {x.data(), recv_x.data()}, [&](auto unit) {
    using Unit = decltype(unit);
    g.transport->require_open(fn);
    window_acquire_regions(exec, wire.signals, kDecodeRegions);
    check_window(exec, fn, g);
    decode_send<Exec, Unit>(exec, s, idx, rows_view<Unit, Mem>(x, H),
                            with_w ? floats2<Mem>(w) : Unmanaged2<const float, Mem>(), h.v, d,
                            "KokkosMoE::ep_decode_dispatch::send");
    if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, Mem>::accessible)
      exec.fence();  // the rows of every host thread are written before the counters say so
    window_post_regions(exec, wire.signals, kDecodeRegions);
    check_window(exec, fn, g);
    decode_receive<Exec, Unit>(exec, s, h.v, d, rows_view<Unit, Mem>(recv_x, H),
                               with_w ? floats1_out<Mem>(recv_w) : Unmanaged1<float, Mem>(),
                               "KokkosMoE::ep_decode_dispatch::receive");
    window_release_regions(exec, wire.signals, kDecodeRegions);
  });
  h.laid_out = true;
  h.decoded = true;
  h.backward_done = !h.options.training;
}

// ----- FP8 dispatch ------------------------------------------------------------------------------------------------

template <class Exec, class XView, class Mem = typename Exec::memory_space>
QuantizingRows<typename XView::non_const_value_type, Mem> fp8_source(const char*, const XView& x, int, int,
                                                                     const Fp8QuantizeConfig& config) {
  using Scalar = typename XView::non_const_value_type;
  static_assert(is_ep_row_type<Scalar>::value, "KokkosMoE::ep_dispatch: x must hold float or KokkosMoE::bf16_t");
  return {Unmanaged2<const Scalar, Mem>(x.data(), x.extent(0), x.extent(1)), config.min_amax,
          config.scale_format == Fp8ScaleFormat::Ue8m0, aligned16(x.data())};
}

template <class Exec, class QView, class SView, class Mem = typename Exec::memory_space>
QuantizedRows<Mem> fp8_source(const char* fn, const Fp8Rows<QView, SView>& x, int T, int H, const Fp8QuantizeConfig&) {
  ep_static_view<Exec, SView, 2>();
  static_assert(std::is_same<typename QView::non_const_value_type, fp8_e4m3_t>::value,
                "KokkosMoE::ep_dispatch: the FP8 rows' codes must hold fp8_e4m3_t");
  static_assert(std::is_same<typename SView::non_const_value_type, float>::value,
                "KokkosMoE::ep_dispatch: the FP8 rows' scales must hold float");
  ep_check_view(fn, "x.scales", x.scales, T, H / kFp8BlockChannels, false);
  if (!aligned16(x.q.data()))
    ep_fail(fn, "x.q", Rule::Alignment, "x.q must be 16-byte aligned (codes move 16 channels at a time)");
  return {Unmanaged2<const Chunk16, Mem>(reinterpret_cast<const Chunk16*>(x.q.data()), x.q.extent(0), H / 16),
          Unmanaged2<const float, Mem>(x.scales.data(), x.scales.extent(0), x.scales.extent(1))};
}

template <class XView>
const char* fp8_x_name(const XView&) {
  return "x";
}
template <class QView, class SView>
const char* fp8_x_name(const Fp8Rows<QView, SView>&) {
  return "x.q";
}
template <class XView>
const XView& fp8_x_rows(const XView& x) {
  return x;
}
template <class QView, class SView>
const QView& fp8_x_rows(const Fp8Rows<QView, SView>& x) {
  return x.q;
}

/// ep_dispatch's FP8 forms: x float or bf16 rows (quantized in the pack) or Fp8Rows (sent as they are).
template <class Exec, class XArg, class WView, class RecvQView, class RecvSView, class RecvWView>
void dispatch_fp8(const Exec& exec, EpHandleState<Exec>& h, const XArg& x, const WView& w, const RecvQView& recv_q,
                  const RecvSView& recv_scales, const RecvWView& recv_w, const Fp8QuantizeConfig& config,
                  bool split = false) {
  const char* fn = split ? "ep_dispatch_send" : "ep_dispatch";
  using Mem = typename Exec::memory_space;
  const auto& xr = fp8_x_rows(x);
  ep_static_view<Exec, typename std::decay<decltype(xr)>::type, 2>();
  ep_static_view<Exec, RecvQView, 2>();
  ep_static_view<Exec, RecvSView, 2>();
  dispatch_weights_static<Exec, WView, RecvWView>();
  static_assert(std::is_same<typename RecvQView::value_type, fp8_e4m3_t>::value,
                "KokkosMoE::ep_dispatch: recv_q must be non-const fp8_e4m3_t");
  static_assert(std::is_same<typename RecvSView::value_type, float>::value,
                "KokkosMoE::ep_dispatch: recv_scales must be non-const float");
  ScopedRegion region("KokkosMoE::ep_dispatch");
  EpGroupState<Exec>& g = *h.group;
  const EpShape& s = h.shape;
  const int H = g.config.hidden;
  const bool with_w = w.extent(0) > 0 || w.extent(1) > 0;
  check_on_every_rank(fn, g, [&] {
    require_layout(fn, h);
    if (H % kFp8BlockChannels != 0)
      ep_fail(fn, fp8_x_name(x), Rule::ShapeMismatch,
              "FP8 rows need the hidden size (" + std::to_string(H) + ") to be a multiple of " +
                  std::to_string(kFp8BlockChannels) + " (one scale per block)");
    ep_check_view(fn, fp8_x_name(x), xr, s.T, H, false);
    fp8_check_config(fn, config);
    if (with_w) ep_check_view(fn, "topk_w", w, s.T, s.K, false);
    ep_check_view(fn, "recv_q", recv_q, h.recv_rows, H, true);
    ep_check_view(fn, "recv_scales", recv_scales, h.recv_rows, H / kFp8BlockChannels, true);
    if (with_w) ep_check_view(fn, "recv_w", recv_w, h.recv_rows, 1, true);
    if (!aligned16(recv_q.data()))
      ep_fail(fn, "recv_q", Rule::Alignment, "recv_q must be 16-byte aligned (codes move 16 channels at a time)");
    (void)fp8_source<Exec>(fn, x, s.T, H, config);
    (void)take_wire(fn, h);
  });
  const auto src = fp8_source<Exec>(fn, x, s.T, H, config);
  EpWire<Exec>& wire = take_wire(fn, h);
  enter_op(fn, g, s);
  const int units = H / 16, blocks = H / kFp8BlockChannels;
  const std::size_t scales_off = static_cast<std::size_t>(H);
  const std::size_t row_bytes = scales_off + static_cast<std::size_t>(blocks) * sizeof(float);
  const std::size_t pitch = token_pitch(row_bytes, s.K, true);
  const auto src_w = with_w ? floats2<Mem>(w) : Unmanaged2<const float, Mem>();
  const auto rw = with_w ? floats1_out<Mem>(recv_w) : Unmanaged1<float, Mem>();
  const Unmanaged2<Chunk16, Mem> rq(reinterpret_cast<Chunk16*>(recv_q.data()), recv_q.extent(0), units);
  const Unmanaged2<float, Mem> rs(recv_scales.data(), recv_scales.extent(0), blocks);
  wire_acquire(exec, fn, g, wire, kRegionFwd);
  pack_fp8_tokens<Exec>(exec, s, src, units, src_w, h.v, rq, rs, rw, PeerRows<Mem>{wire.peers.fwd, h.v.fwd_base, pitch},
                        scales_off, pad16(row_bytes), "KokkosMoE::ep_dispatch::pack_fp8");
  wire_send(exec, fn, h, wire, kRegionFwd, pitch);
  EpHandleState<Exec>* hp = &h;
  EpWire<Exec>* wp = &wire;
  const LocalRows in{wire.in_fwd, pitch};
  const std::size_t trailer = pad16(row_bytes);
  finish_or_defer(
      exec, h, wire, fn, split,
      [hp, wp, fn, s, in, trailer, rq, rw, scales_off, rs](const Exec& e) {
        wire_wait(e, fn, *hp, *wp, kRegionFwd);
        expand_arrivals<Exec, fp8_e4m3_t, Chunk16>(e, s, hp->arrivals, hp->recv_rows, in, trailer, hp->v, rq, rw,
                                                   "KokkosMoE::ep_dispatch::expand_fp8", scales_off, rs);
        wire_release(e, *hp->group, *wp, kRegionFwd);
      },
      recv_q, recv_scales, recv_w);
  account(exec, h, kOpDispatch, true, pitch, row_bytes);
}

/// The hook of a split send: runs the receive of send number \p ticket once.
template <class Exec>
void run_receive(const Exec& exec, EpHandleState<Exec>& h, std::uint64_t ticket) {
  if (!h.receive || ticket != h.sends)
    ep_fail("EpReceiveHook", "hook", Rule::HandleState,
            "this receive hook already ran (a hook runs once, for the send that returned it)");
  ScopedRegion region("KokkosMoE::ep_receive");
  auto finish = std::move(h.receive);
  h.receive = nullptr;
  h.receive_of = nullptr;
  EpWire<Exec>* held = h.held;  // given back even when the receive throws (its communicator is aborted then)
  h.held = nullptr;
  held->holder = nullptr;
  finish(exec);
}

// ----- combine -----------------------------------------------------------------------------------------------------

template <class Exec, class OutView, class WView, class YView>
void combine(const Exec& exec, EpHandleState<Exec>& h, CombineMode mode, const OutView& out, const WView& w,
             const YView& y, bool split = false) {
  const char* fn = split ? "ep_combine_send" : "ep_combine";
  using Mem = typename Exec::memory_space;
  using Scalar = typename OutView::non_const_value_type;
  ep_static_view<Exec, OutView, 2>();
  ep_static_view<Exec, WView, 2>();
  ep_static_view<Exec, YView, 2>();
  static_assert(is_ep_row_type<Scalar>::value, "KokkosMoE::ep_combine: out must hold float or KokkosMoE::bf16_t");
  static_assert(std::is_same<typename YView::value_type, Scalar>::value,
                "KokkosMoE::ep_combine: y must be non-const with out's element type");
  static_assert(std::is_same<typename WView::non_const_value_type, float>::value,
                "KokkosMoE::ep_combine: topk_w must hold float");
  ScopedRegion region("KokkosMoE::ep_combine");
  EpGroupState<Exec>& g = *h.group;
  const EpShape& s = h.shape;
  const int H = g.config.hidden;
  const bool weighted = mode == CombineMode::Weighted;
  check_on_every_rank(fn, g, [&] {
    require_layout(fn, h);
    if (mode != CombineMode::Sum && mode != CombineMode::Weighted)
      ep_fail(fn, "mode", Rule::ConfigValue, "mode is not a CombineMode enumerator");
    ep_check_view(fn, "out", out, h.recv_rows, H, true);
    if (weighted) ep_check_view(fn, "topk_w", w, s.T, s.K, false);
    ep_check_view(fn, "y", y, s.T, H, false);
    (void)take_wire(fn, h);
  });
  EpWire<Exec>& wire = take_wire(fn, h);
  enter_op(fn, g, s);
  const std::size_t pitch = token_pitch(static_cast<std::size_t>(H) * sizeof(Scalar), s.K, false);
  const std::size_t fpitch = static_cast<std::size_t>(s.K) * sizeof(float);
  if (weighted) {
    // The expert's rank weighs the slots it reduces: the K weights of each token row go there first.
    wire_acquire(exec, fn, g, wire, kRegionFwdF);
    pack_weights(exec, s, floats2<Mem>(w), h.v, PeerRows<Mem>{wire.peers.fwd_f, h.v.fwd_base, fpitch});
    wire_move(exec, fn, h, wire, kRegionFwdF, fpitch);
    account(exec, h, kOpCombine, true, fpitch, 0);
  }
  with_unit<Scalar>(H, {out.data(), y.data()}, [&](auto unit) {
    using Unit = decltype(unit);
    wire_acquire(exec, fn, g, wire, kRegionRet);
    reduce_arrivals<Exec, Scalar, Unit>(
        exec, s, h.arrivals, rows_view<Unit, Mem>(out, H), weighted ? LocalRows{wire.in_fwd_f, fpitch} : LocalRows{},
        Unmanaged1<const float, Mem>(), h.v, PeerRows<Mem>{wire.peers.ret, h.v.ret_base, pitch}, 0,
        "KokkosMoE::ep_combine::reduce_experts");
    wire_send(exec, fn, h, wire, kRegionRet, pitch);
    if (weighted) wire_release(exec, g, wire, kRegionFwdF);
    EpHandleState<Exec>* hp = &h;
    EpWire<Exec>* wp = &wire;
    const auto o = rows_view<Unit, Mem>(out, H);
    const auto cw = weighted ? floats2<Mem>(w) : Unmanaged2<const float, Mem>();
    const auto yv = rows_view<Unit, Mem>(y, H);
    const LocalRows ret{wire.in_ret, pitch};
    finish_or_defer(
        exec, h, wire, fn, split,
        [hp, wp, fn, s, o, cw, yv, ret](const Exec& e) {
          wire_wait(e, fn, *hp, *wp, kRegionRet);
          reduce_ranks<Exec, Scalar, Unit>(e, s, o, cw, Unmanaged1<const float, Mem>(), ret, 0, hp->v, yv,
                                           Unmanaged2<float, Mem>(), "KokkosMoE::ep_combine::reduce_ranks");
          wire_release(e, *hp->group, *wp, kRegionRet);
        },
        out, w, y);
  });
  account(exec, h, kOpCombine, false, pitch, static_cast<std::size_t>(H) * sizeof(Scalar));
}

template <class Exec, class GradYView, class WView, class OutView, class GradOutView, class GradWView>
void combine_backward(const Exec& exec, EpHandleState<Exec>& h, CombineMode mode, const GradYView& grad_y,
                      const WView& w, const OutView& out, const GradOutView& grad_out, const GradWView& grad_w,
                      bool split = false) {
  const char* fn = split ? "ep_combine_backward_send" : "ep_combine_backward";
  using Mem = typename Exec::memory_space;
  using Scalar = typename GradYView::non_const_value_type;
  ep_static_view<Exec, GradYView, 2>();
  ep_static_view<Exec, WView, 2>();
  ep_static_view<Exec, OutView, 2>();
  ep_static_view<Exec, GradOutView, 2>();
  ep_static_view<Exec, GradWView, 2>();
  static_assert(is_ep_row_type<Scalar>::value,
                "KokkosMoE::ep_combine_backward: grad_y must hold float or KokkosMoE::bf16_t");
  static_assert(std::is_same<typename OutView::non_const_value_type, Scalar>::value,
                "KokkosMoE::ep_combine_backward: out must have grad_y's element type");
  static_assert(std::is_same<typename GradOutView::value_type, Scalar>::value,
                "KokkosMoE::ep_combine_backward: grad_out must be non-const with grad_y's element type");
  static_assert(std::is_same<typename WView::non_const_value_type, float>::value &&
                    std::is_same<typename GradWView::value_type, float>::value,
                "KokkosMoE::ep_combine_backward: topk_w and grad_w must hold float (grad_w non-const)");
  ScopedRegion region("KokkosMoE::ep_combine_backward");
  EpGroupState<Exec>& g = *h.group;
  const EpShape& s = h.shape;
  const int H = g.config.hidden;
  const bool weighted = mode == CombineMode::Weighted;
  check_on_every_rank(fn, g, [&] {
    require_layout(fn, h);
    if (mode != CombineMode::Sum && mode != CombineMode::Weighted)
      ep_fail(fn, "mode", Rule::ConfigValue, "mode is not a CombineMode enumerator");
    ep_check_view(fn, "grad_y", grad_y, s.T, H, false);
    ep_check_view(fn, "grad_out", grad_out, h.recv_rows, H, true);
    if (weighted) {
      ep_check_view(fn, "topk_w", w, s.T, s.K, false);
      ep_check_view(fn, "out", out, h.recv_rows, H, true);
      ep_check_view(fn, "grad_w", grad_w, s.T, s.K, false);
    }
    (void)take_wire(fn, h);
  });
  EpWire<Exec>& wire = take_wire(fn, h);
  enter_op(fn, g, s);
  const std::size_t row_bytes = static_cast<std::size_t>(H) * sizeof(Scalar);
  // Weighted: grad_y travels with the token's weights in its trailer, and the dots come back as K floats per token.
  const std::size_t pitch = token_pitch(row_bytes, s.K, weighted);
  const std::size_t fpitch = static_cast<std::size_t>(s.K) * sizeof(float);
  with_unit<Scalar>(H, {grad_y.data(), grad_out.data(), out.data()}, [&](auto unit) {
    using Unit = decltype(unit);
    auto go = rows_view<Unit, Mem>(grad_out, H);
    auto gy = rows_view<Unit, Mem>(grad_y, H);
    const PeerRows<Mem> dst{wire.peers.fwd, h.v.fwd_base, pitch};
    EpHandleState<Exec>* hp = &h;
    EpWire<Exec>* wp = &wire;
    if (!weighted) {
      wire_acquire(exec, fn, g, wire, kRegionFwd);
      pack_tokens<Exec, Scalar, Unit>(exec, s, gy, Unmanaged2<const float, Mem>(), true, false, h.v, go,
                                      Unmanaged1<float, Mem>(), dst, 0, "KokkosMoE::ep_combine_backward::pack");
      wire_send(exec, fn, h, wire, kRegionFwd, pitch);
      const LocalRows in{wire.in_fwd, pitch};
      finish_or_defer(
          exec, h, wire, fn, split,
          [hp, wp, fn, s, in, go](const Exec& e) {
            wire_wait(e, fn, *hp, *wp, kRegionFwd);
            expand_arrivals<Exec, Scalar, Unit>(e, s, hp->arrivals, hp->recv_rows, in, 0, hp->v, go,
                                                Unmanaged1<float, Mem>(), "KokkosMoE::ep_combine_backward::expand");
            wire_release(e, *hp->group, *wp, kRegionFwd);
          },
          grad_out);
      return;
    }
    auto o = rows_view<Unit, Mem>(out, H);
    local_dots<Exec, Scalar, Unit>(exec, s, gy, floats2<Mem>(w), o, h.v, go, floats2_out<Mem>(grad_w));
    wire_acquire(exec, fn, g, wire, kRegionFwd);
    pack_tokens<Exec, Scalar, Unit>(exec, s, gy, floats2<Mem>(w), false, false, h.v, go, Unmanaged1<float, Mem>(), dst,
                                    pad16(row_bytes), "KokkosMoE::ep_combine_backward::pack");
    wire_move(exec, fn, h, wire, kRegionFwd, pitch);
    wire_acquire(exec, fn, g, wire, kRegionRetF);
    expand_with_dots<Exec, Scalar, Unit>(exec, s, h.arrivals, h.recv_rows, LocalRows{wire.in_fwd, pitch},
                                         pad16(row_bytes), o, h.v,
                                         PeerRows<Mem>{wire.peers.ret_f, h.v.ret_base, fpitch}, go);
    wire_send(exec, fn, h, wire, kRegionRetF, fpitch);
    wire_release(exec, g, wire, kRegionFwd);
    const LocalRows dots{wire.in_ret_f, fpitch};
    const auto gw = floats2_out<Mem>(grad_w);
    finish_or_defer(
        exec, h, wire, fn, split,
        [hp, wp, fn, s, dots, gw](const Exec& e) {
          wire_wait(e, fn, *hp, *wp, kRegionRetF);
          scatter_dots<Exec>(e, s, dots, hp->v, gw);
          wire_release(e, *hp->group, *wp, kRegionRetF);
        },
        grad_out, grad_w);
  });
  account(exec, h, kOpCombineBackward, true, pitch, row_bytes);
  if (weighted) account(exec, h, kOpCombineBackward, false, fpitch, 0);
}

// ----- dispatch backward -------------------------------------------------------------------------------------------

template <class Exec, class GradRecvXView, class GradRecvWView, class GradXView, class GradWView>
void dispatch_backward(const Exec& exec, EpHandleState<Exec>& h, const GradRecvXView& grad_recv_x,
                       const GradRecvWView& grad_recv_w, const GradXView& grad_x, const GradWView& grad_w,
                       bool split = false) {
  const char* fn = split ? "ep_dispatch_backward_send" : "ep_dispatch_backward";
  using Mem = typename Exec::memory_space;
  using Scalar = typename GradRecvXView::non_const_value_type;
  ep_static_view<Exec, GradRecvXView, 2>();
  ep_static_view<Exec, GradRecvWView, 1>();
  ep_static_view<Exec, GradXView, 2>();
  ep_static_view<Exec, GradWView, 2>();
  static_assert(is_ep_row_type<Scalar>::value,
                "KokkosMoE::ep_dispatch_backward: grad_recv_x must hold float or KokkosMoE::bf16_t");
  static_assert(std::is_same<typename GradXView::value_type, Scalar>::value,
                "KokkosMoE::ep_dispatch_backward: grad_x must be non-const with grad_recv_x's element type");
  static_assert(std::is_same<typename GradRecvWView::non_const_value_type, float>::value &&
                    std::is_same<typename GradWView::value_type, float>::value,
                "KokkosMoE::ep_dispatch_backward: grad_recv_w and grad_w must hold float (grad_w non-const)");
  ScopedRegion region("KokkosMoE::ep_dispatch_backward");
  EpGroupState<Exec>& g = *h.group;
  const EpShape& s = h.shape;
  const int H = g.config.hidden;
  const bool with_w = grad_w.extent(0) > 0 || grad_w.extent(1) > 0;
  check_on_every_rank(fn, g, [&] {
    require_layout(fn, h);
    ep_check_view(fn, "grad_recv_x", grad_recv_x, h.recv_rows, H, true);
    if (with_w) {
      ep_check_view(fn, "grad_recv_w", grad_recv_w, h.recv_rows, 1, true);
      ep_check_view(fn, "grad_w", grad_w, s.T, s.K, false);
    }
    ep_check_view(fn, "grad_x", grad_x, s.T, H, false);
    (void)take_wire(fn, h);
  });
  EpWire<Exec>& wire = take_wire(fn, h);
  enter_op(fn, g, s);
  const std::size_t row_bytes = static_cast<std::size_t>(H) * sizeof(Scalar);
  const std::size_t pitch = token_pitch(row_bytes, s.K, true);
  with_unit<Scalar>(H, {grad_recv_x.data(), grad_x.data()}, [&](auto unit) {
    using Unit = decltype(unit);
    const auto grw = with_w ? floats1<Mem>(grad_recv_w) : Unmanaged1<const float, Mem>();
    auto grx = rows_view<Unit, Mem>(grad_recv_x, H);
    wire_acquire(exec, fn, g, wire, kRegionRet);
    reduce_arrivals<Exec, Scalar, Unit>(exec, s, h.arrivals, grx, LocalRows{}, grw, h.v,
                                        PeerRows<Mem>{wire.peers.ret, h.v.ret_base, pitch}, pad16(row_bytes),
                                        "KokkosMoE::ep_dispatch_backward::reduce_experts");
    wire_send(exec, fn, h, wire, kRegionRet, pitch);
    EpHandleState<Exec>* hp = &h;
    EpWire<Exec>* wp = &wire;
    const LocalRows ret{wire.in_ret, pitch};
    const std::size_t trailer = pad16(row_bytes);
    const auto gx = rows_view<Unit, Mem>(grad_x, H);
    const auto gw = with_w ? floats2_out<Mem>(grad_w) : Unmanaged2<float, Mem>();
    finish_or_defer(
        exec, h, wire, fn, split,
        [hp, wp, fn, s, grx, grw, ret, trailer, gx, gw](const Exec& e) {
          wire_wait(e, fn, *hp, *wp, kRegionRet);
          reduce_ranks<Exec, Scalar, Unit>(e, s, grx, Unmanaged2<const float, Mem>(), grw, ret, trailer, hp->v, gx, gw,
                                           "KokkosMoE::ep_dispatch_backward::reduce_ranks");
          wire_release(e, *hp->group, *wp, kRegionRet);
        },
        grad_recv_x, grad_recv_w, grad_x, grad_w);
  });
  account(exec, h, kOpDispatchBackward, false, pitch, row_bytes);
  h.backward_done = true;
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
