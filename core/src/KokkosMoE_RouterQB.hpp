/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTERQB_HPP
#define KOKKOSMOE_ROUTERQB_HPP

/// \file KokkosMoE_RouterQB.hpp
/// \brief Quantile Balancing (QB) router (docs/router.md §19): the Sigmoid router with an expert bias, plus for every
/// token the biased score of the best expert it was not routed to (the cutoff) and, for every (token, expert) pair,
/// one count in a caller-owned histogram [E, num_bins] of the required bias cutoff - sigmoid(x[e]) over
/// [lower, upper]. The routing, the weights, `intermediate` and the backward (topk_router_backward /
/// topk_router_indices_backward with the same Sigmoid config) are exactly those of topk_router.
///
/// Calls validate on the host in docs/router.md §19.3's order (InvalidArgument with the rule), enqueue on \p exec and
/// return without allocating. With QbConfig::validate_bin_bounds (the default) they read the two bounds back and
/// fence \p exec; with it off they read the bounds on the device only and can be captured in a CUDA graph
/// (validate once with validate_qb_bin_bounds before capture). The histogram is accumulated, never cleared.
/// Every function also has an overload without \p exec (Kokkos::DefaultExecutionSpace{}).

#include <KokkosMoE_Router.hpp>

#include <impl/KokkosMoE_RouterQB_Impl.hpp>

namespace KokkosMoE {

namespace Impl {

/// The checks and the QB pass shared by the routing-map and dense-index forms (outputs already in \p o).
template <class ExecSpace, class Ops, class QbOps, class LogitsView>
void run_topk_router_qb(const char* fn, const ExecSpace& exec, const RouterConfig& config, const QbConfig& qb, Ops& o,
                        QbOps& q, const LogitsView& logits) {
  check_qb_config(fn, qb);
  if (qb.validate_bin_bounds) check_bin_bounds(fn, exec, q.bounds);
  // The forward; with both implementations Auto it may write the cutoff too (the native lane kernel on Cuda).
  bool cutoff_written = false;
  if (config.implementation == Implementation::Auto && qb.implementation == Implementation::Auto) {
    if (config.check_finite) run_check_finite(exec, fn, "logits", logits);
    if (o.num_tokens == 0) return;
    cutoff_written = QbSpec<ExecSpace>::forward(exec, config, o, q.cutoff.data());
  } else {
    run_topk_forward(fn, exec, config, o, logits);
    if (o.num_tokens == 0) return;
  }
  q.output = o.output();
  q.num_tokens = o.num_tokens;
  q.num_experts = o.params.num_experts;
  q.topk = config.topk;
  q.inter = o.inter;
  q.bias = o.bias;
  if constexpr (Ops::op == TopkForwardOp::Indices)
    q.indices = o.indices;
  else
    q.map = o.map;
  if (!cutoff_written) PortableQb<ExecSpace>::cutoff(exec, q);
  // Both modes count in the histogram pass (docs/router.md §19.8).
  qb_histogram_pass(exec, qb.implementation, histogram_operands(q));
}

/// Rule 1 of §19.3 for the operands every QB forward has, then rules 2-7.
template <class LogitsView, class BiasView, class BoundsView, class InterView, class CutoffView, class HistView>
void check_qb_forward(const char* fn, const RouterConfig& config, const LogitsView& logits, const BiasView& bias,
                      const BoundsView& bounds, const InterView& intermediate, const CutoffView& cutoff,
                      const HistView& histogram) {
  const std::int64_t T = logits.extent(0), E = logits.extent(1);
  check_counts(fn, T, E);
  check_contiguous(fn, "logits", logits);
  if (bias.size() > 0) check_shape1(fn, "expert_bias", bias, E);
  check_shape1(fn, "bin_bounds", bounds, 2);
  check_shape2(fn, "intermediate", intermediate, T, E);
  check_shape1(fn, "cutoff", cutoff, T);
  check_shape2(fn, "histogram", histogram, E, static_cast<std::int64_t>(histogram.extent(1)));
  check_qb_rules(fn, config, E, bias.size() > 0, static_cast<std::int64_t>(histogram.extent(1)));
}

}  // namespace Impl

/// \brief QB routing with a routing map (Bytemap or BitmapU8, per config.map_format).
///
/// \param exec          execution space instance that runs the kernels
/// \param config        topk (1 <= topk <= E - 1), score_function = Sigmoid, scaling_factor, map_format; no
///                      grouping, no pre-softmax
/// \param qb            histogram mode and whether the bin bounds are validated
/// \param logits        [T, E] float, fp16_t or bf16_t
/// \param expert_bias   [E] float/fp16_t/bf16_t, required
/// \param bin_bounds    [2] float {lower, upper} in the execution space's memory
/// \param probs         [T, E] output, logits' type, non-zero only at the routed experts
/// \param routing_map   [T, E] uint8 (Bytemap) or [T, ceil(E/8)] uint8 (BitmapU8)
/// \param intermediate  [T, E] float output y = sigmoid(x), saved for the backward
/// \param cutoff        [T] float output: the biased score of the (topk+1)-th expert
/// \param histogram     [E, num_bins] int32, num_bins >= 1: one count added per (token, expert)
/// \throws KokkosMoE::InvalidArgument for any rule of docs/router.md §19.3
template <class ExecSpace, class LogitsView, class BiasView, class BoundsView, class ProbsView, class MapView,
          class InterView, class CutoffView, class HistView>
void topk_router_qb(const ExecSpace& exec, const RouterConfig& config, const QbConfig& qb, const LogitsView& logits,
                    const BiasView& expert_bias, const BoundsView& bin_bounds, const ProbsView& probs,
                    const MapView& routing_map, const InterView& intermediate, const CutoffView& cutoff,
                    const HistView& histogram) {
  constexpr const char* fn = "topk_router_qb";
  using Scalar = typename LogitsView::non_const_value_type;
  using BiasScalar = typename BiasView::non_const_value_type;
  Impl::static_check_view<ExecSpace, LogitsView, 2>();
  Impl::static_check_view<ExecSpace, BiasView, 1>();
  Impl::static_check_view<ExecSpace, ProbsView, 2>();
  Impl::static_check_view<ExecSpace, MapView, 2>();
  Impl::static_check_view<ExecSpace, InterView, 2>();
  Impl::static_check_qb_views<ExecSpace, BoundsView, CutoffView, HistView>();
  static_assert(std::is_same_v<typename ProbsView::value_type, Scalar>,
                "KokkosMoE::topk_router_qb: probs must have the logits' element type");
  static_assert(std::is_same_v<typename MapView::value_type, std::uint8_t>,
                "KokkosMoE::topk_router_qb: routing_map must be uint8_t");
  static_assert(std::is_same_v<typename InterView::value_type, float>,
                "KokkosMoE::topk_router_qb: intermediate must be float");
  static_assert(std::is_same_v<typename CutoffView::value_type, float>,
                "KokkosMoE::topk_router_qb: cutoff must be float");
  // §19.3 rule 1: every operand's shape (the map's needs a valid map format), then rules 2-7.
  Impl::check_map_format(fn, config.map_format);
  const std::int64_t T = logits.extent(0), E = logits.extent(1);
  const bool bitmap = config.map_format == RoutingMapFormat::BitmapU8;
  Impl::check_shape2(fn, "probs", probs, T, E);
  Impl::check_shape2(fn, "routing_map", routing_map, T, bitmap ? Impl::bitmap_row_bytes(E) : E);
  Impl::check_qb_forward(fn, config, logits, expert_bias, bin_bounds, intermediate, cutoff, histogram);
  // Rule 8: the router's remaining configuration rules, aliasing, the mode.
  using Ops = Impl::MapForwardOperands<ExecSpace, Scalar, BiasScalar>;
  Ops o = Impl::lower_topk_forward<Ops, ExecSpace>(fn, config, logits, expert_bias);
  const Impl::Span in[] = {Impl::span_of("logits", logits), Impl::span_of("expert_bias", expert_bias),
                           Impl::span_of("bin_bounds", bin_bounds)};
  const Impl::Span out[] = {Impl::span_of("probs", probs), Impl::span_of("routing_map", routing_map),
                            Impl::span_of("intermediate", intermediate), Impl::span_of("cutoff", cutoff),
                            Impl::span_of("histogram", histogram)};
  Impl::check_no_alias(fn, in, out);
  o.bitmap = bitmap;
  o.probs = Impl::canonical2<decltype(o.probs)>(probs);
  o.map = Impl::canonical2<decltype(o.map)>(routing_map);
  o.inter = Impl::canonical2<decltype(o.inter)>(intermediate);
  Impl::QbOperands<ExecSpace, BiasScalar, std::int32_t> q;
  q.bounds = Impl::canonical1<decltype(q.bounds)>(bin_bounds);
  q.cutoff = Impl::canonical1<decltype(q.cutoff)>(cutoff);
  q.hist = Impl::canonical2<decltype(q.hist)>(histogram);
  Impl::run_topk_router_qb(fn, exec, config, qb, o, q, logits);
}

/// \brief QB routing with dense indices [T, k] (int16_t, int32_t or int64_t) in slot order instead of a map;
/// otherwise as topk_router_qb. config.map_format is ignored.
template <class ExecSpace, class LogitsView, class BiasView, class BoundsView, class ProbsView, class IndicesView,
          class InterView, class CutoffView, class HistView>
void topk_router_qb_indices(const ExecSpace& exec, const RouterConfig& config, const QbConfig& qb,
                            const LogitsView& logits, const BiasView& expert_bias, const BoundsView& bin_bounds,
                            const ProbsView& probs, const IndicesView& indices, const InterView& intermediate,
                            const CutoffView& cutoff, const HistView& histogram) {
  constexpr const char* fn = "topk_router_qb_indices";
  using Scalar = typename LogitsView::non_const_value_type;
  using BiasScalar = typename BiasView::non_const_value_type;
  using Index = typename IndicesView::value_type;
  static_assert(Impl::is_index_type<Index>::value,
                "KokkosMoE::topk_router_qb_indices: indices must be int16_t, int32_t or int64_t");
  Impl::static_check_view<ExecSpace, LogitsView, 2>();
  Impl::static_check_view<ExecSpace, BiasView, 1>();
  Impl::static_check_view<ExecSpace, ProbsView, 2>();
  Impl::static_check_view<ExecSpace, IndicesView, 2>();
  Impl::static_check_view<ExecSpace, InterView, 2>();
  Impl::static_check_qb_views<ExecSpace, BoundsView, CutoffView, HistView>();
  static_assert(std::is_same_v<typename ProbsView::value_type, Scalar>,
                "KokkosMoE::topk_router_qb_indices: probs must have the logits' element type");
  static_assert(std::is_same_v<typename InterView::value_type, float>,
                "KokkosMoE::topk_router_qb_indices: intermediate must be float");
  static_assert(std::is_same_v<typename CutoffView::value_type, float>,
                "KokkosMoE::topk_router_qb_indices: cutoff must be float");
  const std::int64_t T = logits.extent(0), E = logits.extent(1);
  Impl::check_shape2(fn, "probs", probs, T, E);
  Impl::check_shape2(fn, "indices", indices, T, config.topk);
  Impl::check_qb_forward(fn, config, logits, expert_bias, bin_bounds, intermediate, cutoff, histogram);
  using Ops = Impl::IndicesForwardOperands<ExecSpace, Scalar, BiasScalar, Index>;
  Ops o = Impl::lower_topk_forward<Ops, ExecSpace>(fn, config, logits, expert_bias);
  Impl::check_index_range<Index>(fn, E);
  const Impl::Span in[] = {Impl::span_of("logits", logits), Impl::span_of("expert_bias", expert_bias),
                           Impl::span_of("bin_bounds", bin_bounds)};
  const Impl::Span out[] = {Impl::span_of("probs", probs), Impl::span_of("indices", indices),
                            Impl::span_of("intermediate", intermediate), Impl::span_of("cutoff", cutoff),
                            Impl::span_of("histogram", histogram)};
  Impl::check_no_alias(fn, in, out);
  o.probs = Impl::canonical2<decltype(o.probs)>(probs);
  o.indices = Impl::canonical2<decltype(o.indices)>(indices);
  o.inter = Impl::canonical2<decltype(o.inter)>(intermediate);
  Impl::QbOperands<ExecSpace, BiasScalar, Index> q;
  q.bounds = Impl::canonical1<decltype(q.bounds)>(bin_bounds);
  q.cutoff = Impl::canonical1<decltype(q.cutoff)>(cutoff);
  q.hist = Impl::canonical2<decltype(q.hist)>(histogram);
  Impl::run_topk_router_qb(fn, exec, config, qb, o, q, logits);
}

/// \brief Adds one count per (token, expert) to \p histogram from a QB forward's saved \p intermediate [T, E] and
/// \p cutoff [T] (docs/router.md §19.5): the TwoPass histogram on its own. Only qb.validate_bin_bounds is read.
template <class ExecSpace, class InterView, class CutoffView, class BoundsView, class HistView>
void qb_histogram_accumulate(const ExecSpace& exec, const QbConfig& qb, const InterView& intermediate,
                             const CutoffView& cutoff, const BoundsView& bin_bounds, const HistView& histogram) {
  constexpr const char* fn = "qb_histogram_accumulate";
  Impl::static_check_view<ExecSpace, InterView, 2>();
  Impl::static_check_qb_views<ExecSpace, BoundsView, CutoffView, HistView>();
  static_assert(std::is_same_v<typename InterView::non_const_value_type, float>,
                "KokkosMoE::qb_histogram_accumulate: intermediate must be float");
  static_assert(std::is_same_v<typename CutoffView::non_const_value_type, float>,
                "KokkosMoE::qb_histogram_accumulate: cutoff must be float");
  const std::int64_t T = intermediate.extent(0), E = intermediate.extent(1);
  Impl::check_counts(fn, T, E);
  Impl::check_contiguous(fn, "intermediate", intermediate);
  Impl::check_shape1(fn, "cutoff", cutoff, T);
  Impl::check_shape1(fn, "bin_bounds", bin_bounds, 2);
  Impl::check_shape2(fn, "histogram", histogram, E, static_cast<std::int64_t>(histogram.extent(1)));
  if (histogram.extent(1) < 1)
    Impl::fail(fn, "histogram", Rule::QbBinCountPositive, "histogram must have at least one bin per expert");
  const Impl::Span in[] = {Impl::span_of("intermediate", intermediate), Impl::span_of("cutoff", cutoff),
                           Impl::span_of("bin_bounds", bin_bounds)};
  const Impl::Span out[] = {Impl::span_of("histogram", histogram)};
  Impl::check_no_alias(fn, in, out);
  Impl::check_qb_config(fn, qb);
  if (qb.validate_bin_bounds) Impl::check_bin_bounds(fn, exec, bin_bounds);
  if (T == 0) return;
  Impl::QbHistogramOperands<ExecSpace> h;
  h.num_tokens = T;
  h.num_experts = static_cast<int>(E);
  h.inter = Impl::canonical2<decltype(h.inter)>(intermediate);
  h.cutoff = Impl::canonical1<decltype(h.cutoff)>(cutoff);
  h.bounds = Impl::canonical1<decltype(h.bounds)>(bin_bounds);
  h.hist = Impl::canonical2<decltype(h.hist)>(histogram);
  Impl::qb_histogram_pass(exec, qb.implementation, h);
}

/// \brief Throws InvalidArgument (Rule::QbBinBounds) unless both bounds of \p bin_bounds [2] are finite and
/// lower < upper (docs/router.md §19.6). Reads them back and fences \p exec: call it before capturing unchecked QB
/// calls in a CUDA graph.
template <class ExecSpace, class BoundsView, std::enable_if_t<Kokkos::is_execution_space<ExecSpace>::value, int> = 0>
void validate_qb_bin_bounds(const ExecSpace& exec, const BoundsView& bin_bounds) {
  constexpr const char* fn = "validate_qb_bin_bounds";
  Impl::static_check_view<ExecSpace, BoundsView, 1>();
  static_assert(std::is_same_v<typename BoundsView::non_const_value_type, float>,
                "KokkosMoE::validate_qb_bin_bounds: bin_bounds must be float");
  Impl::check_shape1(fn, "bin_bounds", bin_bounds, 2);
  Impl::check_bin_bounds(fn, exec, bin_bounds);
}

// ---- the same operations on Kokkos::DefaultExecutionSpace{} ----------------------------------------------------

/// \brief topk_router_qb on Kokkos::DefaultExecutionSpace{}.
template <class LogitsView, class BiasView, class BoundsView, class ProbsView, class MapView, class InterView,
          class CutoffView, class HistView>
void topk_router_qb(const RouterConfig& config, const QbConfig& qb, const LogitsView& logits,
                    const BiasView& expert_bias, const BoundsView& bin_bounds, const ProbsView& probs,
                    const MapView& routing_map, const InterView& intermediate, const CutoffView& cutoff,
                    const HistView& histogram) {
  topk_router_qb(Kokkos::DefaultExecutionSpace{}, config, qb, logits, expert_bias, bin_bounds, probs, routing_map,
                 intermediate, cutoff, histogram);
}

/// \brief topk_router_qb_indices on Kokkos::DefaultExecutionSpace{}.
template <class LogitsView, class BiasView, class BoundsView, class ProbsView, class IndicesView, class InterView,
          class CutoffView, class HistView>
void topk_router_qb_indices(const RouterConfig& config, const QbConfig& qb, const LogitsView& logits,
                            const BiasView& expert_bias, const BoundsView& bin_bounds, const ProbsView& probs,
                            const IndicesView& indices, const InterView& intermediate, const CutoffView& cutoff,
                            const HistView& histogram) {
  topk_router_qb_indices(Kokkos::DefaultExecutionSpace{}, config, qb, logits, expert_bias, bin_bounds, probs, indices,
                         intermediate, cutoff, histogram);
}

/// \brief qb_histogram_accumulate on Kokkos::DefaultExecutionSpace{}.
template <class InterView, class CutoffView, class BoundsView, class HistView>
void qb_histogram_accumulate(const QbConfig& qb, const InterView& intermediate, const CutoffView& cutoff,
                             const BoundsView& bin_bounds, const HistView& histogram) {
  qb_histogram_accumulate(Kokkos::DefaultExecutionSpace{}, qb, intermediate, cutoff, bin_bounds, histogram);
}

/// \brief validate_qb_bin_bounds on Kokkos::DefaultExecutionSpace{}.
template <class BoundsView, std::enable_if_t<Kokkos::is_view<BoundsView>::value, int> = 0>
void validate_qb_bin_bounds(const BoundsView& bin_bounds) {
  validate_qb_bin_bounds(Kokkos::DefaultExecutionSpace{}, bin_bounds);
}

}  // namespace KokkosMoE

#endif
