/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_EP_DISPATCHSTEPS_HPP
#define KOKKOSMOE_EP_DISPATCHSTEPS_HPP

// The forward direction's step drivers (docs/ep.md §3.2, §3.5, §15): dispatch of rows, the decode path's fused layout
// and dispatch, and the FP8 dispatch.

#include <impl/KokkosMoE_EP_LayoutStep.hpp>

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
  const int H = g.config.hidden_size;
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

/// The static rules of ep_dispatch's and ep_decode_dispatch's FP8 forms.
template <class Exec, class XArg, class WView, class RecvQView, class RecvSView, class RecvWView>
constexpr void fp8_dispatch_static() {
  ep_static_view<Exec, typename std::decay<decltype(fp8_x_rows(std::declval<const XArg&>()))>::type, 2>();
  ep_static_view<Exec, RecvQView, 2>();
  ep_static_view<Exec, RecvSView, 2>();
  dispatch_weights_static<Exec, WView, RecvWView>();
  static_assert(std::is_same<typename RecvQView::value_type, fp8_e4m3_t>::value,
                "KokkosMoE::ep_dispatch: recv_q must be non-const fp8_e4m3_t");
  static_assert(std::is_same<typename RecvSView::value_type, float>::value,
                "KokkosMoE::ep_dispatch: recv_scales must be non-const float");
}

/// The arguments of an FP8 dispatch against T tokens and \p rows receive rows. Returns whether weights travel.
template <class Exec, class XArg, class WView, class RecvQView, class RecvSView, class RecvWView>
bool check_fp8_rows(const char* fn, int T, int K, int H, int rows, const XArg& x, const WView& w,
                    const RecvQView& recv_q, const RecvSView& recv_scales, const RecvWView& recv_w,
                    const Fp8QuantizeConfig& config) {
  const bool with_w = w.extent(0) > 0 || w.extent(1) > 0;
  if (H % kFp8BlockChannels != 0)
    ep_fail(fn, fp8_x_name(x), Rule::ShapeMismatch,
            "FP8 rows need the hidden size (" + std::to_string(H) + ") to be a multiple of " +
                std::to_string(kFp8BlockChannels) + " (one scale per block)");
  ep_check_view(fn, fp8_x_name(x), fp8_x_rows(x), T, H, false);
  fp8_check_config(fn, config);
  if (with_w) ep_check_view(fn, "topk_w", w, T, K, false);
  ep_check_view(fn, "recv_q", recv_q, rows, H, true);
  ep_check_view(fn, "recv_scales", recv_scales, rows, H / kFp8BlockChannels, true);
  if (with_w) ep_check_view(fn, "recv_w", recv_w, rows, 1, true);
  if (!aligned16(recv_q.data()))
    ep_fail(fn, "recv_q", Rule::Alignment, "recv_q must be 16-byte aligned (codes move 16 channels at a time)");
  (void)fp8_source<Exec>(fn, x, T, H, config);
  return with_w;
}

/// ep_dispatch's FP8 forms: x float or bf16 rows (quantized in the pack) or Fp8Rows (sent as they are).
template <class Exec, class XArg, class WView, class RecvQView, class RecvSView, class RecvWView>
void dispatch_fp8(const Exec& exec, EpHandleState<Exec>& h, const XArg& x, const WView& w, const RecvQView& recv_q,
                  const RecvSView& recv_scales, const RecvWView& recv_w, const Fp8QuantizeConfig& config,
                  bool split = false) {
  const char* fn = split ? "ep_dispatch_send" : "ep_dispatch";
  using Mem = typename Exec::memory_space;
  fp8_dispatch_static<Exec, XArg, WView, RecvQView, RecvSView, RecvWView>();
  ScopedRegion region("KokkosMoE::ep_dispatch");
  EpGroupState<Exec>& g = *h.group;
  const EpShape& s = h.shape;
  const int H = g.config.hidden_size;
  bool with_w = false;
  check_on_every_rank(fn, g, [&] {
    require_layout(fn, h);
    with_w = check_fp8_rows<Exec>(fn, s.T, s.K, H, h.recv_rows, x, w, recv_q, recv_scales, recv_w, config);
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

// ----- decode ------------------------------------------------------------------------------------------------------

/// The groups the decode path serves (docs/ep.md §15).
template <class Exec>
void check_decode_group(const char* fn, const EpGroupState<Exec>& g) {
  using Lim = EpDecodeLimits;
  const EpGroupConfig& c = g.config;
  if (c.layout != RecvLayout::ExpertMajorFixed || c.max_tokens_per_rank > Lim::max_tokens_per_rank ||
      c.ep_size > Lim::max_ep_size || c.num_experts > Lim::max_experts)
    ep_fail(fn, "handle", Rule::ConfigValue,
            "the decode path needs a group with layout = ExpertMajorFixed, max_tokens_per_rank <= " +
                std::to_string(Lim::max_tokens_per_rank) + ", ep_size <= " + std::to_string(Lim::max_ep_size) +
                " and num_experts <= " + std::to_string(Lim::max_experts) + " (this one: " + to_string(c.layout) +
                ", " + std::to_string(c.max_tokens_per_rank) + ", " + std::to_string(c.ep_size) + ", " +
                std::to_string(c.num_experts) + ")");
}

/// ep_decode_dispatch after its checks, for rows of either kind (DecodeRows, DecodeFp8Rows; a wire row of \p
/// row_bytes, an FP8 row's scales at \p scales_off): at one rank one kernel (nothing travels); over the windows one
/// kernel; without windows at more ranks (messages) the layout, then \p dispatch (the matching ep_dispatch).
template <class Exec, class IdxView, class Rows, class Dispatch>
void decode_rows(const Exec& exec, EpHandleState<Exec>& h, const IdxView& idx, const Rows& rows,
                 const Unmanaged2<const float, typename Exec::memory_space>& w,
                 const Unmanaged1<float, typename Exec::memory_space>& recv_w, std::size_t row_bytes,
                 std::size_t scales_off, const Dispatch& dispatch) {
  constexpr const char* fn = "ep_decode_dispatch";
  using Mem = typename Exec::memory_space;
  EpGroupState<Exec>& g = *h.group;
  begin_layout(h, idx);
  const EpShape& s = h.shape;
  if (s.R > 1 && !g.windows) {
    run_layout(exec, h, idx, fn, true);
    dispatch();
    return;
  }
  ScopedRegion region("KokkosMoE::ep_decode_dispatch");
  h.shape.unique_ids = true;
  h.recv_rows = g.recv_rows_fixed;
  if (s.R == 1) {
    h.arrivals = 0;
    (void)take_wire(fn, h);
    decode_local<Exec>(exec, s, idx, rows, w, h.v, recv_w, "KokkosMoE::ep_decode_dispatch::local");
  } else {
    h.arrivals = g.stage_rows;
    EpWire<Exec>& wire = take_wire(fn, h);
    enter_op(fn, g, s);
    const DecodeWire<Mem> d{wire.peers.fwd,
                            wire.peers.meta,
                            wire.peers.counts,
                            wire.in_fwd,
                            reinterpret_cast<const int*>(wire.in_meta),
                            reinterpret_cast<const int*>(wire.in_counts),
                            token_pitch(row_bytes, s.K, true),
                            pad16(row_bytes),
                            scales_off,
                            row_bytes};
    g.transport->require_open(fn);
    // One team per token (a column block of it at fewer tokens than teams).
    const DecodeDispatch<Exec, Rows, IdxView> f{s, idx, rows, w, h.v, d, recv_w, rows.split(s.T, g.resident_league)};
    decode_step(exec, f, wire.signals, g.resident_league, "KokkosMoE::ep_decode_dispatch");
    check_window(exec, fn, g);
  }
  h.laid_out = true;
  h.decoded = true;
  h.backward_done = !h.options.training;
}

/// ep_decode_dispatch (docs/ep.md §15): the layout fused into the dispatch over the peer windows; without windows (a
/// message transport) the same contract as ep_layout + ep_dispatch. Every argument is checked before the first
/// communication, on either path, and on every rank.
template <class Exec, class IdxView, class XView, class WView, class RecvXView, class RecvWView>
void decode_dispatch(const Exec& exec, EpHandleState<Exec>& h, const IdxView& idx, const XView& x, const WView& w,
                     const RecvXView& recv_x, const RecvWView& recv_w) {
  constexpr const char* fn = "ep_decode_dispatch";
  using Mem = typename Exec::memory_space;
  using Scalar = typename XView::non_const_value_type;
  EpGroupState<Exec>& g = *h.group;
  const int H = g.config.hidden_size;
  bool with_w = false;
  check_on_every_rank(fn, g, [&] {
    check_decode_group(fn, g);
    check_layout(fn, h, idx);
    EpShape t = g.shape;
    t.T = static_cast<int>(idx.extent(0));
    with_w = check_dispatch_rows<Exec>(fn, t, H, g.recv_rows_fixed, x, w, recv_x, recv_w);
  });
  with_unit<Scalar>(H, {x.data(), recv_x.data()}, [&](auto unit) {
    using Unit = decltype(unit);
    decode_rows(exec, h, idx, DecodeRows<Exec, Unit>{rows_view<Unit, Mem>(x, H), rows_view<Unit, Mem>(recv_x, H)},
                with_w ? floats2<Mem>(w) : Unmanaged2<const float, Mem>(),
                with_w ? floats1_out<Mem>(recv_w) : Unmanaged1<float, Mem>(),
                static_cast<std::size_t>(H) * sizeof(Scalar), 0, [&] { dispatch(exec, h, x, w, recv_x, recv_w); });
  });
}

/// ep_decode_dispatch's FP8 forms (docs/ep.md §15, §3.5): the rows quantized in the send kernel (x float or bf16) or
/// given (Fp8Rows); the codes and scales of ep_dispatch's FP8 forms.
template <class Exec, class IdxView, class XArg, class WView, class RecvQView, class RecvSView, class RecvWView>
void decode_dispatch_fp8(const Exec& exec, EpHandleState<Exec>& h, const IdxView& idx, const XArg& x, const WView& w,
                         const RecvQView& recv_q, const RecvSView& recv_scales, const RecvWView& recv_w,
                         const Fp8QuantizeConfig& config) {
  constexpr const char* fn = "ep_decode_dispatch";
  using Mem = typename Exec::memory_space;
  fp8_dispatch_static<Exec, XArg, WView, RecvQView, RecvSView, RecvWView>();
  EpGroupState<Exec>& g = *h.group;
  const int H = g.config.hidden_size, T = static_cast<int>(idx.extent(0));
  bool with_w = false;
  check_on_every_rank(fn, g, [&] {
    check_decode_group(fn, g);
    check_layout(fn, h, idx);
    with_w = check_fp8_rows<Exec>(fn, T, g.shape.K, H, g.recv_rows_fixed, x, w, recv_q, recv_scales, recv_w, config);
  });
  const int units = H / 16, blocks = H / kFp8BlockChannels;
  const auto src = fp8_source<Exec>(fn, x, T, H, config);
  const DecodeFp8Rows<Exec, std::decay_t<decltype(src)>> rows{
      src, Unmanaged2<Chunk16, Mem>(reinterpret_cast<Chunk16*>(recv_q.data()), recv_q.extent(0), units),
      Unmanaged2<float, Mem>(recv_scales.data(), recv_scales.extent(0), blocks), H};
  decode_rows(exec, h, idx, rows, with_w ? floats2<Mem>(w) : Unmanaged2<const float, Mem>(),
              with_w ? floats1_out<Mem>(recv_w) : Unmanaged1<float, Mem>(),
              static_cast<std::size_t>(H) + static_cast<std::size_t>(blocks) * sizeof(float),
              static_cast<std::size_t>(H), [&] { dispatch_fp8(exec, h, x, w, recv_q, recv_scales, recv_w, config); });
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

}  // namespace Impl
}  // namespace KokkosMoE

#endif
