/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_EP_COMBINESTEPS_HPP
#define KOKKOSMOE_EP_COMBINESTEPS_HPP

// The return direction's step drivers and the backwards (docs/ep.md §3.3, §3.4): combine, combine backward and
// dispatch backward.

#include <impl/KokkosMoE_EP_CombineStep.hpp>
#include <impl/KokkosMoE_EP_DispatchSteps.hpp>

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
  const int H = g.config.hidden_size;
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
  if (g.windows && s.R > 1 && h.decoded && !split) {
    // A decode-sized step over the windows: one kernel (docs/ep.md §15).
    with_unit<Scalar>(H, {out.data(), y.data()}, [&](auto unit) {
      using Unit = decltype(unit);
      g.transport->require_open(fn);
      const Unmanaged1<const float, Mem> none;
      const auto o = rows_view<Unit, Mem>(out, H);
      const auto cw = weighted ? floats2<Mem>(w) : Unmanaged2<const float, Mem>();
      const CombineStep<Exec, Scalar, Unit> f{
          s,
          weighted,
          cw,
          h.v.tok_pos,
          PeerRows<Mem>{wire.peers.fwd_f, h.v.fwd_base, fpitch},
          ReduceArrivals<Exec, Scalar, Unit>(s, h.arrivals, o,
                                             weighted ? LocalRows{wire.in_fwd_f, fpitch} : LocalRows{}, none, h.v,
                                             PeerRows<Mem>{wire.peers.ret, h.v.ret_base, pitch}, 0),
          ReduceRanks<Exec, Scalar, Unit>(s, o, cw, none, LocalRows{wire.in_ret, pitch}, 0, h.v,
                                          rows_view<Unit, Mem>(y, H), Unmanaged2<float, Mem>(), g.resident_league),
          h.v.sent_rows,
          h.v.ret_rows,
          h.v.traffic,
          static_cast<std::int64_t>(fpitch),
          static_cast<std::int64_t>(pitch),
          static_cast<std::int64_t>(H) * static_cast<std::int64_t>(sizeof(Scalar))};
      combine_step(exec, f, wire.signals, g.resident_league, "KokkosMoE::ep_combine");
      check_window(exec, fn, g);
    });
    return;
  }
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
  const int H = g.config.hidden_size;
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
  const int H = g.config.hidden_size;
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

}  // namespace Impl
}  // namespace KokkosMoE

#endif
