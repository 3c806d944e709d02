/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTER_ENTRY_HPP
#define KOKKOSMOE_ROUTER_ENTRY_HPP

// The top-k router operations of KokkosMoE_Router.hpp with the kernel choice as an argument: each validates its
// Views, lowers them to the canonical operands and runs the spec with \p choice
// (impl/KokkosMoE_Router_KernelChoice.hpp). The public functions call these with the library's choice; tests that
// compare kernel variants giving the same bits call them with another.

#include <KokkosMoE_Config.hpp>
#include <KokkosMoE_Error.hpp>
#include <KokkosMoE_RouterConfig.hpp>

#include <Kokkos_Core.hpp>
#include <kokkos_ext/KokkosMoE_Float16.hpp>

#include <impl/KokkosMoE_Router_KernelChoice.hpp>
#include <impl/KokkosMoE_Router_Spec.hpp>
#include <impl/KokkosMoE_Router_Validate.hpp>

#include <cstdint>
#include <string>
#include <type_traits>

namespace KokkosMoE {
namespace Impl {

/// topk_router (KokkosMoE_Router.hpp) run with \p choice.
template <class ExecSpace, class LogitsView, class BiasView, class ProbsView, class MapView, class InterView>
void topk_router_with(const KernelChoice& choice, const ExecSpace& exec, const RouterConfig& config,
                      const LogitsView& logits, const BiasView& expert_bias, const ProbsView& probs,
                      const MapView& routing_map, const InterView& intermediate) {
  constexpr const char* fn = "topk_router";
  using Scalar = typename LogitsView::non_const_value_type;
  using Bias = typename BiasView::non_const_value_type;
  static_check_view<ExecSpace, ProbsView, 2>();
  static_check_view<ExecSpace, MapView, 2>();
  static_check_view<ExecSpace, InterView, 2>();
  static_assert(std::is_same_v<typename ProbsView::value_type, Scalar>,
                "KokkosMoE::topk_router: probs must have the logits' element type");
  static_assert(std::is_same_v<typename MapView::value_type, std::uint8_t>,
                "KokkosMoE::topk_router: routing_map must be uint8_t");
  static_assert(std::is_same_v<typename InterView::value_type, float>,
                "KokkosMoE::topk_router: intermediate must be float");
  using Ops = MapForwardOperands<ExecSpace, Scalar, Bias>;
  Ops o = lower_topk_forward<Ops, ExecSpace>(fn, config, logits, expert_bias);
  check_map_format(fn, config.map_format);
  const auto T = o.num_tokens, E = static_cast<std::int64_t>(o.params.num_experts);
  check_shape2(fn, "probs", probs, T, E);
  o.bitmap = config.map_format == RoutingMapFormat::BitmapU8;
  check_shape2(fn, "routing_map", routing_map, T, o.bitmap ? bitmap_row_bytes(E) : E);
  check_shape2(fn, "intermediate", intermediate, T, E);
  const Span in[] = {span_of("logits", logits), span_of("expert_bias", expert_bias)};
  const Span out[] = {span_of("probs", probs), span_of("routing_map", routing_map),
                      span_of("intermediate", intermediate)};
  check_no_alias(fn, in, out);
  o.probs = canonical2<decltype(o.probs)>(probs);
  o.map = canonical2<decltype(o.map)>(routing_map);
  o.inter = canonical2<decltype(o.inter)>(intermediate);
  run_topk_forward(fn, exec, config, o, logits, choice);
}

/// topk_router_indices (KokkosMoE_Router.hpp) run with \p choice.
template <class ExecSpace, class LogitsView, class BiasView, class ProbsView, class IndicesView, class InterView>
void topk_router_indices_with(const KernelChoice& choice, const ExecSpace& exec, const RouterConfig& config,
                              const LogitsView& logits, const BiasView& expert_bias, const ProbsView& probs,
                              const IndicesView& indices, const InterView& intermediate) {
  constexpr const char* fn = "topk_router_indices";
  using Scalar = typename LogitsView::non_const_value_type;
  using Index = typename IndicesView::value_type;
  static_assert(is_index_type<Index>::value,
                "KokkosMoE::topk_router_indices: indices must be int16_t, int32_t or int64_t");
  using Ops = IndicesForwardOperands<ExecSpace, Scalar, typename BiasView::non_const_value_type, Index>;
  Ops o = lower_topk_forward<Ops, ExecSpace>(fn, config, logits, expert_bias);
  static_check_view<ExecSpace, ProbsView, 2>();
  static_check_view<ExecSpace, IndicesView, 2>();
  static_check_view<ExecSpace, InterView, 2>();
  static_assert(std::is_same_v<typename ProbsView::value_type, Scalar>,
                "KokkosMoE::topk_router_indices: probs must have the logits' element type");
  static_assert(std::is_same_v<typename InterView::value_type, float>,
                "KokkosMoE::topk_router_indices: intermediate must be float");
  const auto T = o.num_tokens, E = static_cast<std::int64_t>(o.params.num_experts);
  check_index_range<Index>(fn, E);
  check_shape2(fn, "probs", probs, T, E);
  check_shape2(fn, "indices", indices, T, config.topk);
  check_shape2(fn, "intermediate", intermediate, T, E);
  const Span in[] = {span_of("logits", logits), span_of("expert_bias", expert_bias)};
  const Span out[] = {span_of("probs", probs), span_of("indices", indices), span_of("intermediate", intermediate)};
  check_no_alias(fn, in, out);
  o.probs = canonical2<decltype(o.probs)>(probs);
  o.indices = canonical2<decltype(o.indices)>(indices);
  o.inter = canonical2<decltype(o.inter)>(intermediate);
  run_topk_forward(fn, exec, config, o, logits, choice);
}

/// topk_router_compact (KokkosMoE_Router.hpp) run with \p choice.
template <class ExecSpace, class LogitsView, class BiasView, class IdsView, class WeightsView>
void topk_router_compact_with(const KernelChoice& choice, const ExecSpace& exec, const RouterConfig& config,
                              const LogitsView& logits, const BiasView& expert_bias, const IdsView& ids,
                              const WeightsView& weights) {
  constexpr const char* fn = "topk_router_compact";
  using Scalar = typename LogitsView::non_const_value_type;
  using Ops = CompactForwardOperands<ExecSpace, Scalar, typename BiasView::non_const_value_type>;
  Ops o = lower_topk_forward<Ops, ExecSpace>(fn, config, logits, expert_bias);
  static_check_view<ExecSpace, IdsView, 2>();
  static_check_view<ExecSpace, WeightsView, 2>();
  static_assert(std::is_same_v<typename IdsView::value_type, std::int32_t>,
                "KokkosMoE::topk_router_compact: ids must be int32_t");
  static_assert(std::is_same_v<typename WeightsView::value_type, float>,
                "KokkosMoE::topk_router_compact: weights must be float");
  check_shape2(fn, "ids", ids, o.num_tokens, config.topk);
  check_shape2(fn, "weights", weights, o.num_tokens, config.topk);
  const Span in[] = {span_of("logits", logits), span_of("expert_bias", expert_bias)};
  const Span out[] = {span_of("ids", ids), span_of("weights", weights)};
  check_no_alias(fn, in, out);
  o.ids = canonical2<decltype(o.ids)>(ids);
  o.weights = canonical2<decltype(o.weights)>(weights);
  run_topk_forward(fn, exec, config, o, logits, choice);
}

/// topk_router_backward (KokkosMoE_Router.hpp) run with \p choice.
template <class ExecSpace, class MapView, class InterView, class GradProbsView, class GradLogitsView>
void topk_router_backward_with(const KernelChoice& choice, const ExecSpace& exec, const RouterConfig& config,
                               const MapView& routing_map, const InterView& intermediate,
                               const GradProbsView& grad_probs, const GradLogitsView& grad_logits) {
  constexpr const char* fn = "topk_router_backward";
  static_check_view<ExecSpace, MapView, 2>();
  static_assert(std::is_same_v<typename MapView::non_const_value_type, std::uint8_t>,
                "KokkosMoE::topk_router_backward: routing_map must be uint8_t");
  using Ops = TopkBackwardOperands<ExecSpace, typename GradProbsView::non_const_value_type, std::int32_t>;
  Ops o = lower_topk_backward<Ops, ExecSpace>(fn, config, intermediate, grad_probs, grad_logits);
  check_map_format(fn, config.map_format);
  const bool bitmap = config.map_format == RoutingMapFormat::BitmapU8;
  const auto E = static_cast<std::int64_t>(o.params.num_experts);
  check_shape2(fn, "routing_map", routing_map, o.num_tokens, bitmap ? bitmap_row_bytes(E) : E);
  const Span in[] = {span_of("routing_map", routing_map), span_of("intermediate", intermediate),
                     span_of("grad_probs", grad_probs)};
  const Span out[] = {span_of("grad_logits", grad_logits)};
  check_no_alias(fn, in, out);
  o.output = bitmap ? RoutingOutput::BitmapU8 : RoutingOutput::Bytemap;
  o.map = canonical2<decltype(o.map)>(routing_map);
  run_topk_backward(exec, config, o, choice);
}

/// topk_router_indices_backward (KokkosMoE_Router.hpp) run with \p choice.
template <class ExecSpace, class IndicesView, class InterView, class GradProbsView, class GradLogitsView>
void topk_router_indices_backward_with(const KernelChoice& choice, const ExecSpace& exec, const RouterConfig& config,
                                       const IndicesView& indices, const InterView& intermediate,
                                       const GradProbsView& grad_probs, const GradLogitsView& grad_logits) {
  constexpr const char* fn = "topk_router_indices_backward";
  static_check_view<ExecSpace, IndicesView, 2>();
  using Index = typename IndicesView::non_const_value_type;
  static_assert(is_index_type<Index>::value,
                "KokkosMoE::topk_router_indices_backward: indices must be int16_t, int32_t or int64_t");
  using Ops = TopkBackwardOperands<ExecSpace, typename GradProbsView::non_const_value_type, Index>;
  Ops o = lower_topk_backward<Ops, ExecSpace>(fn, config, intermediate, grad_probs, grad_logits);
  check_index_range<Index>(fn, o.params.num_experts);
  check_shape2(fn, "indices", indices, o.num_tokens, config.topk);
  const Span in[] = {span_of("indices", indices), span_of("intermediate", intermediate),
                     span_of("grad_probs", grad_probs)};
  const Span out[] = {span_of("grad_logits", grad_logits)};
  check_no_alias(fn, in, out);
  o.output = RoutingOutput::Indices;
  o.indices = canonical2<decltype(o.indices)>(indices);
  run_topk_backward(exec, config, o, choice);
}

/// topk_router_compact_backward (KokkosMoE_Router.hpp) run with \p choice.
template <class ExecSpace, class LogitsView, class IdsView, class GradWeightsView, class GradLogitsView>
void topk_router_compact_backward_with(const KernelChoice& choice, const ExecSpace& exec, const RouterConfig& config,
                                       const LogitsView& logits, const IdsView& ids,
                                       const GradWeightsView& grad_weights, const GradLogitsView& grad_logits) {
  constexpr const char* fn = "topk_router_compact_backward";
  static_check_view<ExecSpace, LogitsView, 2>();
  static_check_view<ExecSpace, IdsView, 2>();
  static_check_view<ExecSpace, GradWeightsView, 2>();
  static_check_view<ExecSpace, GradLogitsView, 2>();
  using Scalar = typename LogitsView::non_const_value_type;
  using GW = typename GradWeightsView::non_const_value_type;
  static_assert(is_router_float<Scalar>::value, "KokkosMoE: logits must be float, fp16_t or bf16_t");
  static_assert(std::is_same_v<typename IdsView::non_const_value_type, std::int32_t>,
                "KokkosMoE::topk_router_compact_backward: ids must be int32_t");
  static_assert(std::is_same_v<GW, float> || std::is_same_v<GW, Scalar>,
                "KokkosMoE::topk_router_compact_backward: grad_weights must be float or the logits' type");
  static_assert(std::is_same_v<typename GradLogitsView::value_type, Scalar>,
                "KokkosMoE::topk_router_compact_backward: grad_logits must have the logits' type");
  const std::int64_t T = logits.extent(0), E = logits.extent(1);
  check_counts(fn, T, E);
  check_contiguous(fn, "logits", logits);
  check_router_config(fn, config, E, false);
  check_shape2(fn, "ids", ids, T, config.topk);
  check_shape2(fn, "grad_weights", grad_weights, T, config.topk);
  check_shape2(fn, "grad_logits", grad_logits, T, E);
  const Span in[] = {span_of("logits", logits), span_of("ids", ids), span_of("grad_weights", grad_weights)};
  const Span out[] = {span_of("grad_logits", grad_logits)};
  check_no_alias(fn, in, out);
  using Ops = CompactBackwardOperands<ExecSpace, Scalar, GW>;
  Ops o;
  o.params = token_params(config, static_cast<int>(E), false);
  o.num_tokens = T;
  o.logits = canonical2<decltype(o.logits)>(logits);
  o.ids = canonical2<decltype(o.ids)>(ids);
  o.grad_weights = canonical2<decltype(o.grad_weights)>(grad_weights);
  o.grad_logits = canonical2<decltype(o.grad_logits)>(grad_logits);
  run_compact_backward(exec, config, o, choice);
}

}  // namespace Impl
}  // namespace KokkosMoE

#endif
