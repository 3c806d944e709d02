/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_EP_HPP
#define KOKKOSMOE_EP_HPP

/// \file KokkosMoE_EP.hpp
/// \brief Expert-parallel dispatch and combine, forward and backward (contract: docs/ep.md).
///
/// An EpGroup is created once per EP communicator and sized by the maximum shapes; an EpHandle holds one layer's
/// device-side layout; the per-step free functions take the execution space first, then the handle, then Views:
///
///     ep_layout(exec, handle, topk_idx);                              // [T, K] expert ids, -1 = none
///     ep_dispatch(exec, handle, x, topk_w, recv_x, recv_w);           // [T, H] rows -> [N, H] expert-major rows
///     // or as FP8 rows: ep_dispatch(exec, handle, x, topk_w, fp8_rows(recv_q, recv_scales), recv_w);
///     ep_combine(exec, handle, mode, out, topk_w, y);                 // [N, H] -> [T, H]
///     // or in two halves: auto hook = ep_dispatch_send(exec, handle, ...); (other work); hook(exec);
///     ep_combine_backward(exec, handle, mode, grad_y, topk_w, out, grad_out, grad_w);
///     ep_dispatch_backward(exec, handle, grad_recv_x, grad_recv_w, grad_x, grad_w);
///     // decode (fixed layout, <= 256 tokens): ep_decode_dispatch(exec, handle, topk_idx, x, topk_w, recv_x, recv_w);
///
/// Host execution spaces run over an MPI communicator, Kokkos::Cuda over an NCCL communicator. Operations enqueue on
/// the instance; nothing allocates per call in capacity mode. Fences (docs/ep.md §7.4):
/// fence-rule:
/// No EP operation fences, except the eager layout and `ep_synchronize`, which wait for the caller's instance (under an
/// SM partition, for the group's partition instance, which the operation ordered after the caller's). On host execution
/// spaces in a group of two or more ranks, every operation that moves rows (the layout, every dispatch and combine,
/// both backwards, the send of a split form) also fences the caller's instance before MPI or a peer reads what its
/// kernels wrote, and over shared windows so does the hook of a split send. `ep_reset_statistics` never fences. No
/// operation fences another instance or all of them.
/// (end of fence-rule)

#include <KokkosMoE_Communicator.hpp>
#include <KokkosMoE_EpConfig.hpp>
#include <KokkosMoE_Error.hpp>
#include <KokkosMoE_Fp8Quantize.hpp>

#include <Kokkos_Core.hpp>

#include <impl/KokkosMoE_EP_Impl.hpp>

#include <cstdint>
#include <memory>
#include <string>

namespace KokkosMoE {

template <class ExecSpace>
class EpHandle;

/// \brief The EP group: communicator, configuration, the buffers of remote rows (EpGroupConfig::wire_buffers sets,
/// shared by the group's handles one operation at a time: docs/ep.md §14). Move-only.
template <class ExecSpace>
class EpGroup {
 public:
  using execution_space = ExecSpace;
  using memory_space = typename ExecSpace::memory_space;

  /// \brief Collective over \p comm: checks that every rank passed the same config (a digest compared across ranks;
  /// a mismatch throws on every rank), then allocates the stages.
  /// \throws InvalidArgument for a config out of range (Rule::ConfigValue), a transport that cannot serve ExecSpace
  /// (Rule::TransportMismatch), ep_size != comm.size() (Rule::CommSize), differing configs (CommConfigMismatch);
  /// CommError when a peer does not answer within the communicator's timeout
  EpGroup(const ExecSpace& exec, const Communicator& comm, const EpGroupConfig& config)
      : m_state(Impl::make_group_state<ExecSpace>(exec, comm, config)) {}

  const EpGroupConfig& config() const noexcept { return m_state->config; }
  int rank() const noexcept { return m_state->shape.me; }
  int size() const noexcept { return m_state->shape.R; }
  int num_local_experts() const noexcept { return m_state->shape.L; }
  bool capacity_mode() const noexcept { return m_state->capacity_mode(); }
  /// Receive rows of dispatch in capacity mode (the receive Views' first extent); 0 in eager mode.
  int capacity_rows() const noexcept { return m_state->capacity_mode() ? m_state->recv_rows_fixed : 0; }
  /// Device bytes one handle allocates (docs/ep.md §6: every buffer sized once).
  std::size_t handle_bytes() const { return Impl::handle_bytes(*m_state); }
  /// Bytes of the group's buffers for remote rows on this rank (docs/ep.md §6): its window where the transport has
  /// windows, else its source and destination stages.
  std::size_t buffer_bytes() const { return Impl::buffer_bytes(*m_state); }
  /// Whether token rows go straight into the peers' windows (shm, loopback) rather than through stages and messages.
  bool direct_writes() const noexcept { return m_state->windows; }
  /// SMs of the group's SM partition (docs/ep.md §13: SmCap::Partition, or Auto where the device makes one); 0 when
  /// the operations run on the caller's instance (no cap, SmCap::Teams, a host space).
  int partition_sms() const noexcept { return m_state->lane.partition_sms(); }
  /// [R] nanoseconds this rank's operations spent waiting for each peer's signal since creation or the last
  /// ep_reset_statistics (device memory, updated on the device; direct writes only: 0 over messages).
  Kokkos::View<const std::int64_t*, memory_space> peer_wait_ns() const { return m_state->wait_ns; }

  /// \brief A handle for one layer. Two handles never share their layouts; they share the group's wire buffers, one
  /// set per operation (a split send keeps its set until its hook ran; docs/ep.md §14).
  EpHandle<ExecSpace> make_handle(const EpHandleOptions& options = {}) const {
    return EpHandle<ExecSpace>(m_state, options);
  }

  /// The communicator's counters (docs/ep.md §12 cases 6 and 7).
  CommStats stats() const;

  std::shared_ptr<Impl::EpGroupState<ExecSpace>> impl_state() const noexcept { return m_state; }

 private:
  std::shared_ptr<Impl::EpGroupState<ExecSpace>> m_state;
};

/// \brief One layer's device-side layout (counts, offsets, slot maps). Move-only; made by EpGroup::make_handle.
template <class ExecSpace>
class EpHandle {
 public:
  using memory_space = typename ExecSpace::memory_space;
  EpHandle(std::shared_ptr<Impl::EpGroupState<ExecSpace>> group, const EpHandleOptions& options)
      : m_state(std::make_shared<Impl::EpHandleState<ExecSpace>>(std::move(group), options)) {}
  EpHandle(EpHandle&&) noexcept = default;
  EpHandle& operator=(EpHandle&&) noexcept = default;
  EpHandle(const EpHandle&) = delete;
  EpHandle& operator=(const EpHandle&) = delete;

  /// Receive rows of the last layout: exact in eager mode (padded to the alignment), the capacity otherwise.
  int num_recv_rows() const { return m_state->recv_rows; }
  /// Tokens of the last layout.
  int num_tokens() const { return m_state->shape.T; }
  /// [R] tokens this rank sends to each rank (a token counts once per destination rank), on the device.
  Kokkos::View<const int*, memory_space> tokens_per_rank() const {
    const int E = m_state->shape.E;
    return Kokkos::subview(m_state->v.gather_send, std::make_pair(E + 1, E + 1 + m_state->shape.R));
  }
  /// [E] this rank's (token, slot) pairs per expert; equals the column sums of the routing map.
  Kokkos::View<const int*, memory_space> tokens_per_expert() const {
    return Kokkos::subview(m_state->v.gather_send, std::make_pair(0, m_state->shape.E));
  }
  /// [T * R] 1 iff token t sends to rank r (row-major [T, R]).
  Kokkos::View<const std::uint8_t*, memory_space> token_in_rank() const {
    return Kokkos::subview(m_state->v.token_in_rank, std::make_pair(0, m_state->shape.T * m_state->shape.R));
  }
  /// [L + 1] receive row offsets of the local experts: expert l's rows are [off(l), off(l + 1)), its kept slots
  /// first (min(recv_counts(l), off(l + 1) - off(l)) of them), then zeroed padding. Never past num_recv_rows():
  /// capacity mode clips them to the capacity. ExpertMajorFixed: off(l) = l * ep_size * max_tokens_per_rank.
  Kokkos::View<const int*, memory_space> expert_offsets() const { return m_state->v.expert_offsets; }
  /// [L] slots addressed to each local expert before any drop (the demand; dropped slots included).
  Kokkos::View<const int*, memory_space> recv_counts() const { return m_state->v.recv_count; }
  /// [N] local expert of every receive row, -1 for padding and dropped rows (the valid-slot mask).
  Kokkos::View<const int*, memory_space> recv_expert() const {
    return Kokkos::subview(m_state->v.recv_expert, std::make_pair(0, m_state->recv_rows));
  }
  /// [T * K] 1 iff slot (t, k) of this rank has an expert and reached it (0: empty, invalid or dropped for
  /// capacity), row-major [T, K]: what combine and the backwards counted.
  Kokkos::View<const std::uint8_t*, memory_space> slot_kept() const {
    return Kokkos::subview(m_state->v.slot_kept, std::make_pair(0, m_state->shape.T * m_state->shape.K));
  }
  /// [R * (E + 1)] the all-gathered counts: slots from rank i to expert e at i * (E + 1) + e, rank i's count of
  /// invalid expert ids at i * (E + 1) + E.
  Kokkos::View<const int*, memory_space> count_matrix() const { return m_state->v.counts; }
  /// [L] slots addressed to each local expert (the demand: dropped ones included), summed over every layout of this
  /// handle since creation or the last ep_reset_statistics: a device View updated on the device (no host wait, and
  /// a captured layout keeps counting at each replay). Read it after ep_synchronize.
  Kokkos::View<const std::int64_t*, memory_space> expert_load() const { return m_state->v.expert_load; }
  /// Pointers of the handle's device memory (tests: two handles never alias).
  std::vector<const void*> impl_buffers() const { return Impl::handle_buffers(*m_state); }

  std::shared_ptr<Impl::EpHandleState<ExecSpace>> impl_state() const noexcept { return m_state; }

 private:
  std::shared_ptr<Impl::EpHandleState<ExecSpace>> m_state;
};

template <class ExecSpace>
CommStats EpGroup<ExecSpace>::stats() const {
  return Impl::group_stats(*m_state);
}

/// \brief Computes the layout of \p topk_idx ([T, K], int16/int32/int64, -1 = no selection, T <= B) into
/// \p handle: per-rank and per-expert counts, the count exchange, every slot's row (docs/ep.md §3.1).
///
/// Eager mode waits once for the count exchange (bounded) and sets handle.num_recv_rows() exactly. Capacity mode
/// neither waits nor allocates (CUDA-graph capturable).
/// \throws InvalidArgument naming topk_idx for a wrong extent or layout, an expert id >= E or < -1 (eager: here;
/// capacity mode: at ep_synchronize), Rule::HandleReuse for a training handle whose backward has not run;
/// CommError on a communication failure
template <class ExecSpace, class IdxView>
void ep_layout(const ExecSpace& exec, EpHandle<ExecSpace>& handle, const IdxView& topk_idx) {
  Impl::EpLaneScope<ExecSpace> lane(handle.impl_state()->group->lane, exec);
  Impl::layout(lane.exec(), *handle.impl_state(), topk_idx);
}

/// \brief Sends each token row x[t] ([T, H], float or bf16_t) to the expert of every valid slot; the slot's
/// weight topk_w[t,k] ([T, K] float) travels with it. recv_x ([>= N, H], x's type) and recv_w ([>= N] float)
/// receive the rows expert-major, in the fixed slot order (source rank, token, k) within each expert; padding and
/// dropped rows are zeroed. topk_w may be an empty View (then recv_w is not written and may be empty too).
/// \throws InvalidArgument naming the View for a wrong extent, layout or type; Rule::HandleState before a layout
template <class ExecSpace, class XView, class WView, class RecvXView, class RecvWView>
void ep_dispatch(const ExecSpace& exec, const EpHandle<ExecSpace>& handle, const XView& x, const WView& topk_w,
                 const RecvXView& recv_x, const RecvWView& recv_w) {
  Impl::EpLaneScope<ExecSpace> lane(handle.impl_state()->group->lane, exec);
  Impl::dispatch(lane.exec(), *handle.impl_state(), x, topk_w, recv_x, recv_w);
}

/// \brief The decode path (docs/ep.md §15): ep_layout and ep_dispatch in one step whose counts travel with the rows
/// through the peer windows: a send kernel and a receive kernel, no count exchange ahead of the rows, no host wait
/// (CUDA-graph capturable). For groups with layout = ExpertMajorFixed, max_tokens_per_rank <= 256, ep_size <= 64
/// and num_experts <= 4096. The results are those of ep_layout + ep_dispatch (every handle accessor, then combine and
/// the backwards as after any dispatch), with two differences: an expert id repeated within a token counts as
/// invalid (reported at ep_synchronize like an id out of range, that slot treated as -1), and a slab's rows past its
/// recv_counts(l) are not written over the windows (recv_expert() marks them -1: the masked slab; zero recv_x once
/// where a grouped GEMM reads whole slabs). Over windows count_matrix() holds this rank's own experts' columns and the
/// invalid column only. Over a message transport (or at one rank) it runs as ep_layout + ep_dispatch with the same
/// contract. \throws InvalidArgument as ep_layout and ep_dispatch; Rule::ConfigValue naming the handle for a group
/// outside the limits above
template <class ExecSpace, class IdxView, class XView, class WView, class RecvXView, class RecvWView>
void ep_decode_dispatch(const ExecSpace& exec, EpHandle<ExecSpace>& handle, const IdxView& topk_idx, const XView& x,
                        const WView& topk_w, const RecvXView& recv_x, const RecvWView& recv_w) {
  Impl::EpLaneScope<ExecSpace> lane(handle.impl_state()->group->lane, exec);
  Impl::decode_dispatch(lane.exec(), *handle.impl_state(), topk_idx, x, topk_w, recv_x, recv_w);
}

/// \brief The decode path with FP8 rows (docs/ep.md §15, §3.5): ep_decode_dispatch whose rows travel as FP8 E4M3
/// codes with one FP32 scale per 128 channels, quantized in the send kernel from x ([T, H] float or bf16_t, H a
/// multiple of 128) by the rules of quantize_fp8_rows and \p config. recv = fp8_rows(recv_q, recv_scales) as for the
/// FP8 ep_dispatch: the same codes and scales, in the decode path's rows (a slab's rows past its count not written).
/// \throws InvalidArgument as ep_decode_dispatch and the FP8 ep_dispatch
template <class ExecSpace, class IdxView, class XView, class WView, class RecvQView, class RecvSView, class RecvWView>
void ep_decode_dispatch(const ExecSpace& exec, EpHandle<ExecSpace>& handle, const IdxView& topk_idx, const XView& x,
                        const WView& topk_w, const Fp8Rows<RecvQView, RecvSView>& recv, const RecvWView& recv_w,
                        const Fp8QuantizeConfig& config = {}) {
  Impl::EpLaneScope<ExecSpace> lane(handle.impl_state()->group->lane, exec);
  Impl::decode_dispatch_fp8(lane.exec(), *handle.impl_state(), topk_idx, x, topk_w, recv.q, recv.scales, recv_w,
                            config);
}

/// \brief The decode path with FP8 rows the caller quantized: x = fp8_rows(x_q, x_scales) ([T, H] fp8_e4m3_t,
/// 16-byte aligned, and [T, H / 128] float); codes and scales arrive unchanged in recv.
template <class ExecSpace, class IdxView, class XQView, class XSView, class WView, class RecvQView, class RecvSView,
          class RecvWView>
void ep_decode_dispatch(const ExecSpace& exec, EpHandle<ExecSpace>& handle, const IdxView& topk_idx,
                        const Fp8Rows<XQView, XSView>& x, const WView& topk_w,
                        const Fp8Rows<RecvQView, RecvSView>& recv, const RecvWView& recv_w) {
  Impl::EpLaneScope<ExecSpace> lane(handle.impl_state()->group->lane, exec);
  Impl::decode_dispatch_fp8(lane.exec(), *handle.impl_state(), topk_idx, x, topk_w, recv.q, recv.scales, recv_w,
                            Fp8QuantizeConfig{});
}

/// \brief FP8 dispatch (docs/ep.md §3.5): as above, but each token row travels as FP8 E4M3 codes with one FP32 scale
/// per 128 channels, quantized in the pack from x ([T, H] float or bf16_t, H a multiple of 128) by the rules of
/// quantize_fp8_rows and \p config. recv = fp8_rows(recv_q, recv_scales): recv_q [>= N, H] fp8_e4m3_t and
/// recv_scales [>= N, H / 128] float, expert-major as recv_x above, each receive row's scales contiguous (the layout
/// grouped FP8 GEMMs read); padding and dropped rows get zero codes and zero scales. The backward passes take
/// float or bf16_t gradients as after any dispatch.
/// \throws InvalidArgument naming the argument: ShapeMismatch (H not a multiple of 128, extents), NotContiguous,
/// Alignment (recv_q not 16-byte aligned), ConfigValue (\p config); Rule::HandleState before a layout
template <class ExecSpace, class XView, class WView, class RecvQView, class RecvSView, class RecvWView>
void ep_dispatch(const ExecSpace& exec, const EpHandle<ExecSpace>& handle, const XView& x, const WView& topk_w,
                 const Fp8Rows<RecvQView, RecvSView>& recv, const RecvWView& recv_w,
                 const Fp8QuantizeConfig& config = {}) {
  Impl::EpLaneScope<ExecSpace> lane(handle.impl_state()->group->lane, exec);
  Impl::dispatch_fp8(lane.exec(), *handle.impl_state(), x, topk_w, recv.q, recv.scales, recv_w, config);
}

/// \brief FP8 dispatch of rows the caller quantized: x = fp8_rows(x_q, x_scales) ([T, H] fp8_e4m3_t, 16-byte
/// aligned, and [T, H / 128] float); codes and scales arrive unchanged in recv as above.
template <class ExecSpace, class XQView, class XSView, class WView, class RecvQView, class RecvSView, class RecvWView>
void ep_dispatch(const ExecSpace& exec, const EpHandle<ExecSpace>& handle, const Fp8Rows<XQView, XSView>& x,
                 const WView& topk_w, const Fp8Rows<RecvQView, RecvSView>& recv, const RecvWView& recv_w) {
  Impl::EpLaneScope<ExecSpace> lane(handle.impl_state()->group->lane, exec);
  Impl::dispatch_fp8(lane.exec(), *handle.impl_state(), x, topk_w, recv.q, recv.scales, recv_w, Fp8QuantizeConfig{});
}

/// \brief The receive half of a split send (docs/ep.md §14), returned by ep_dispatch_send (rows or FP8),
/// ep_combine_send, ep_combine_backward_send and ep_dispatch_backward_send.
/// Between the send and its hook the caller's instances are free for other work (the experts of another
/// micro-batch); the hook must run once, before the handle's next operation.
template <class ExecSpace>
class EpReceiveHook {
 public:
  EpReceiveHook(std::shared_ptr<Impl::EpHandleState<ExecSpace>> state, std::uint64_t ticket)
      : m_state(std::move(state)), m_ticket(ticket) {}
  /// Waits on \p exec (bounded by the timeout) for the peers' rows of the send and finishes the operation there:
  /// the dispatch's expansion of the arrived rows, the combine's reduction of the returned ones. \p exec must be
  /// ordered after the send's instance (that instance, or one that waited for it).
  /// \throws InvalidArgument (Rule::HandleState) when this hook already ran; CommError on a peer's timeout
  void operator()(const ExecSpace& exec) const {
    Impl::EpLaneScope<ExecSpace> lane(m_state->group->lane, exec);
    Impl::run_receive(lane.exec(), *m_state, m_ticket);
  }

 private:
  std::shared_ptr<Impl::EpHandleState<ExecSpace>> m_state;
  std::uint64_t m_ticket;
};

/// \brief ep_dispatch in two halves (docs/ep.md §14): this call packs x's rows and sends them (the local slots'
/// rows are written into recv_x here), the returned hook receives the peers' rows into recv_x and recv_w. Same
/// arguments, results and errors as ep_dispatch; until the hook ran, every other operation on \p handle throws
/// InvalidArgument (Rule::HandleState) naming the handle. The send holds one of the group's wire buffer sets until
/// the hook ran: another handle's operation that finds no free set throws the same, naming both handles.
template <class ExecSpace, class XView, class WView, class RecvXView, class RecvWView>
[[nodiscard]] EpReceiveHook<ExecSpace> ep_dispatch_send(const ExecSpace& exec, const EpHandle<ExecSpace>& handle,
                                                        const XView& x, const WView& topk_w, const RecvXView& recv_x,
                                                        const RecvWView& recv_w) {
  Impl::EpLaneScope<ExecSpace> lane(handle.impl_state()->group->lane, exec);
  Impl::dispatch(lane.exec(), *handle.impl_state(), x, topk_w, recv_x, recv_w, true);
  return {handle.impl_state(), handle.impl_state()->sends};
}

/// \brief ep_combine in two halves (docs/ep.md §14): this call reduces this rank's experts' slots of every arrived
/// token and sends the partial rows back; the hook adds the returned partials into y. As ep_combine otherwise.
template <class ExecSpace, class OutView, class WView, class YView>
[[nodiscard]] EpReceiveHook<ExecSpace> ep_combine_send(const ExecSpace& exec, const EpHandle<ExecSpace>& handle,
                                                       CombineMode mode, const OutView& out, const WView& topk_w,
                                                       const YView& y) {
  Impl::EpLaneScope<ExecSpace> lane(handle.impl_state()->group->lane, exec);
  Impl::combine(lane.exec(), *handle.impl_state(), mode, out, topk_w, y, true);
  return {handle.impl_state(), handle.impl_state()->sends};
}

/// \brief y[t] = sum over valid k of c(t,k) * out[slot(t,k)] (FP32 accumulation in k order), c = 1 (Sum) or
/// topk_w[t,k] (Weighted; topk_w may be empty for Sum). out: [>= N, H] expert outputs in the receive layout.
/// \brief FP8 ep_dispatch in two halves (docs/ep.md §14): the send quantizes, packs and sends as the FP8
/// ep_dispatch does; the hook receives the peers' codes and scales into recv. As ep_dispatch_send otherwise.
template <class ExecSpace, class XView, class WView, class RecvQView, class RecvSView, class RecvWView>
[[nodiscard]] EpReceiveHook<ExecSpace> ep_dispatch_send(const ExecSpace& exec, const EpHandle<ExecSpace>& handle,
                                                        const XView& x, const WView& topk_w,
                                                        const Fp8Rows<RecvQView, RecvSView>& recv,
                                                        const RecvWView& recv_w, const Fp8QuantizeConfig& config = {}) {
  Impl::EpLaneScope<ExecSpace> lane(handle.impl_state()->group->lane, exec);
  Impl::dispatch_fp8(lane.exec(), *handle.impl_state(), x, topk_w, recv.q, recv.scales, recv_w, config, true);
  return {handle.impl_state(), handle.impl_state()->sends};
}

/// \brief The split send of FP8 rows the caller quantized (x = fp8_rows(x_q, x_scales)).
template <class ExecSpace, class XQView, class XSView, class WView, class RecvQView, class RecvSView, class RecvWView>
[[nodiscard]] EpReceiveHook<ExecSpace> ep_dispatch_send(const ExecSpace& exec, const EpHandle<ExecSpace>& handle,
                                                        const Fp8Rows<XQView, XSView>& x, const WView& topk_w,
                                                        const Fp8Rows<RecvQView, RecvSView>& recv,
                                                        const RecvWView& recv_w) {
  Impl::EpLaneScope<ExecSpace> lane(handle.impl_state()->group->lane, exec);
  Impl::dispatch_fp8(lane.exec(), *handle.impl_state(), x, topk_w, recv.q, recv.scales, recv_w, Fp8QuantizeConfig{},
                     true);
  return {handle.impl_state(), handle.impl_state()->sends};
}

/// \brief ep_combine_backward in two halves (docs/ep.md §14). Sum: the send packs grad_y's rows to the experts'
/// ranks, the hook receives them into grad_out. Weighted: the send also waits for the peers' rows, writes grad_out
/// and sends the slots' dot products back; the hook receives the dots into grad_w. As ep_combine_backward otherwise.
template <class ExecSpace, class GradYView, class WView, class OutView, class GradOutView, class GradWView>
[[nodiscard]] EpReceiveHook<ExecSpace> ep_combine_backward_send(const ExecSpace& exec,
                                                                const EpHandle<ExecSpace>& handle, CombineMode mode,
                                                                const GradYView& grad_y, const WView& topk_w,
                                                                const OutView& out, const GradOutView& grad_out,
                                                                const GradWView& grad_w) {
  Impl::EpLaneScope<ExecSpace> lane(handle.impl_state()->group->lane, exec);
  Impl::combine_backward(lane.exec(), *handle.impl_state(), mode, grad_y, topk_w, out, grad_out, grad_w, true);
  return {handle.impl_state(), handle.impl_state()->sends};
}

/// \brief ep_dispatch_backward in two halves (docs/ep.md §14): the send reduces this rank's experts' slot gradients
/// of every arrived token and sends them back; the hook adds the returned partials into grad_x (and grad_w). As
/// ep_dispatch_backward otherwise.
template <class ExecSpace, class GradRecvXView, class GradRecvWView, class GradXView, class GradWView>
[[nodiscard]] EpReceiveHook<ExecSpace> ep_dispatch_backward_send(const ExecSpace& exec,
                                                                 const EpHandle<ExecSpace>& handle,
                                                                 const GradRecvXView& grad_recv_x,
                                                                 const GradRecvWView& grad_recv_w,
                                                                 const GradXView& grad_x, const GradWView& grad_w) {
  Impl::EpLaneScope<ExecSpace> lane(handle.impl_state()->group->lane, exec);
  Impl::dispatch_backward(lane.exec(), *handle.impl_state(), grad_recv_x, grad_recv_w, grad_x, grad_w, true);
  return {handle.impl_state(), handle.impl_state()->sends};
}

template <class ExecSpace, class OutView, class WView, class YView>
void ep_combine(const ExecSpace& exec, const EpHandle<ExecSpace>& handle, CombineMode mode, const OutView& out,
                const WView& topk_w, const YView& y) {
  Impl::EpLaneScope<ExecSpace> lane(handle.impl_state()->group->lane, exec);
  Impl::combine(lane.exec(), *handle.impl_state(), mode, out, topk_w, y);
}

/// \brief Backward of ep_combine: grad_out[slot(t,k)] = c(t,k) * grad_y[t]; Weighted also gives
/// grad_w[t,k] = dot(grad_y[t], out[slot(t,k)]) ([T, K] float; 0 for invalid and dropped slots), an FP32 sum in
/// the order of the execution space's team reduction over the row (docs/ep.md §3.4). For Sum, topk_w, out and
/// grad_w may be empty Views. Padding and dropped rows of grad_out are zeroed.
template <class ExecSpace, class GradYView, class WView, class OutView, class GradOutView, class GradWView>
void ep_combine_backward(const ExecSpace& exec, const EpHandle<ExecSpace>& handle, CombineMode mode,
                         const GradYView& grad_y, const WView& topk_w, const OutView& out, const GradOutView& grad_out,
                         const GradWView& grad_w) {
  Impl::EpLaneScope<ExecSpace> lane(handle.impl_state()->group->lane, exec);
  Impl::combine_backward(lane.exec(), *handle.impl_state(), mode, grad_y, topk_w, out, grad_out, grad_w);
}

/// \brief Backward of ep_dispatch: grad_x[t] = sum over kept k, in k order, of grad_recv_x[slot(t,k)] (FP32
/// accumulation from +0, rounded once to the row type); grad_w[t,k] = grad_recv_w[slot(t,k)] (0 for invalid and
/// dropped slots). grad_recv_w and grad_w may both be empty.
template <class ExecSpace, class GradRecvXView, class GradRecvWView, class GradXView, class GradWView>
void ep_dispatch_backward(const ExecSpace& exec, const EpHandle<ExecSpace>& handle, const GradRecvXView& grad_recv_x,
                          const GradRecvWView& grad_recv_w, const GradXView& grad_x, const GradWView& grad_w) {
  Impl::EpLaneScope<ExecSpace> lane(handle.impl_state()->group->lane, exec);
  Impl::dispatch_backward(lane.exec(), *handle.impl_state(), grad_recv_x, grad_recv_w, grad_x, grad_w);
}

/// \brief The natural synchronization of a step (docs/ep.md §5): waits for \p exec (bounded by the timeout),
/// then reports the last layout's findings. Collective in effect: every rank reaches the same verdict from the
/// same all-gathered counts, so either every rank of the group throws or none does.
/// \throws CapacityOverflow on every rank when any rank's receive rows overflowed without drop_on_overflow (its
/// demand(), capacity() and rank() are this rank's own when it overflowed, else the lowest overflowing rank's);
/// InvalidArgument (Rule::ExpertIdRange) on every rank for invalid ids found in capacity mode; CommError on a
/// communication failure or timeout
template <class ExecSpace>
EpStatus ep_synchronize(const ExecSpace& exec, const EpHandle<ExecSpace>& handle) {
  Impl::EpLaneScope<ExecSpace> lane(handle.impl_state()->group->lane, exec);
  return Impl::synchronize(lane.exec(), *handle.impl_state());
}

/// \brief Zeroes \p handle's expert_load() on \p exec (ordered after the work already enqueued there).
template <class ExecSpace>
void ep_reset_statistics(const ExecSpace& exec, const EpHandle<ExecSpace>& handle) {
  Impl::zero_on(exec, handle.impl_state()->v.expert_load);
}

/// \brief Zeroes \p group's peer_wait_ns() on \p exec.
template <class ExecSpace>
void ep_reset_statistics(const ExecSpace& exec, const EpGroup<ExecSpace>& group) {
  Impl::zero_on(exec, group.impl_state()->wait_ns);
}

}  // namespace KokkosMoE

#endif
