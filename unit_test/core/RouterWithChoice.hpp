/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_TEST_ROUTERWITHCHOICE_HPP
#define KOKKOSMOE_TEST_ROUTERWITHCHOICE_HPP

// The router operations with a kernel choice (impl/KokkosMoE_Router_KernelChoice.hpp) other than the library's: the
// public entry points lower their Views to the canonical operands and run the spec with the default choice; these
// do the same lowering (without the public functions' alias and shape checks, which the tests do not exercise here)
// and hand the spec the choice under test, so that tests compare kernel variants that must give the same bits.

#include <KokkosMoE_AuxLoss.hpp>
#include <KokkosMoE_Router.hpp>

#include <cstdint>

namespace KokkosMoETest {

using KokkosMoE::Impl::KernelChoice;

/// topk_router: the routing map (config.map_format), probs and intermediate; \p bias may be empty.
template <class Exec, class LogitsView, class BiasView, class ProbsView, class MapView, class InterView>
void topk_router_with(const KernelChoice& choice, const Exec& exec, const KokkosMoE::RouterConfig& config,
                      const LogitsView& logits, const BiasView& bias, const ProbsView& probs, const MapView& map,
                      const InterView& inter) {
  namespace Impl = KokkosMoE::Impl;
  using S = typename LogitsView::non_const_value_type;
  using Ops = Impl::TopkForwardOperands<Exec, S, typename BiasView::non_const_value_type, std::int32_t>;
  Ops o = Impl::lower_topk_forward<Ops, Exec>("topk_router", config, logits, bias);
  o.output = config.map_format == KokkosMoE::RoutingMapFormat::BitmapU8 ? Impl::RoutingOutput::BitmapU8
                                                                        : Impl::RoutingOutput::Bytemap;
  o.probs = Impl::canonical2<decltype(o.probs)>(probs);
  o.map = Impl::canonical2<decltype(o.map)>(map);
  o.inter = Impl::canonical2<decltype(o.inter)>(inter);
  Impl::run_topk_forward("topk_router", exec, config, o, logits, choice);
}

/// topk_router_indices.
template <class Exec, class LogitsView, class BiasView, class ProbsView, class IndicesView, class InterView>
void topk_router_indices_with(const KernelChoice& choice, const Exec& exec, const KokkosMoE::RouterConfig& config,
                              const LogitsView& logits, const BiasView& bias, const ProbsView& probs,
                              const IndicesView& indices, const InterView& inter) {
  namespace Impl = KokkosMoE::Impl;
  using S = typename LogitsView::non_const_value_type;
  using Ops =
      Impl::TopkForwardOperands<Exec, S, typename BiasView::non_const_value_type, typename IndicesView::value_type>;
  Ops o = Impl::lower_topk_forward<Ops, Exec>("topk_router_indices", config, logits, bias);
  o.output = Impl::RoutingOutput::Indices;
  o.probs = Impl::canonical2<decltype(o.probs)>(probs);
  o.indices = Impl::canonical2<decltype(o.indices)>(indices);
  o.inter = Impl::canonical2<decltype(o.inter)>(inter);
  Impl::run_topk_forward("topk_router_indices", exec, config, o, logits, choice);
}

/// topk_router_compact.
template <class Exec, class LogitsView, class BiasView, class IdsView, class WeightsView>
void topk_router_compact_with(const KernelChoice& choice, const Exec& exec, const KokkosMoE::RouterConfig& config,
                              const LogitsView& logits, const BiasView& bias, const IdsView& ids,
                              const WeightsView& weights) {
  namespace Impl = KokkosMoE::Impl;
  using S = typename LogitsView::non_const_value_type;
  using Ops = Impl::TopkForwardOperands<Exec, S, typename BiasView::non_const_value_type, std::int32_t>;
  Ops o = Impl::lower_topk_forward<Ops, Exec>("topk_router_compact", config, logits, bias);
  o.output = Impl::RoutingOutput::Compact;
  o.ids = Impl::canonical2<decltype(o.ids)>(ids);
  o.weights = Impl::canonical2<decltype(o.weights)>(weights);
  Impl::run_topk_forward("topk_router_compact", exec, config, o, logits, choice);
}

/// topk_router_backward (config.map_format).
template <class Exec, class MapView, class InterView, class GradView, class GradLogitsView>
void topk_router_backward_with(const KernelChoice& choice, const Exec& exec, const KokkosMoE::RouterConfig& config,
                               const MapView& map, const InterView& inter, const GradView& grad_probs,
                               const GradLogitsView& grad_logits) {
  namespace Impl = KokkosMoE::Impl;
  using Ops = Impl::TopkBackwardOperands<Exec, typename GradView::non_const_value_type, std::int32_t>;
  Ops o = Impl::lower_topk_backward<Ops, Exec>("topk_router_backward", config, inter, grad_probs, grad_logits);
  o.output = config.map_format == KokkosMoE::RoutingMapFormat::BitmapU8 ? Impl::RoutingOutput::BitmapU8
                                                                        : Impl::RoutingOutput::Bytemap;
  o.map = Impl::canonical2<decltype(o.map)>(map);
  Impl::run_topk_backward(exec, config, o, choice);
}

/// topk_router_indices_backward.
template <class Exec, class IndicesView, class InterView, class GradView, class GradLogitsView>
void topk_router_indices_backward_with(const KernelChoice& choice, const Exec& exec,
                                       const KokkosMoE::RouterConfig& config, const IndicesView& indices,
                                       const InterView& inter, const GradView& grad_probs,
                                       const GradLogitsView& grad_logits) {
  namespace Impl = KokkosMoE::Impl;
  using Ops = Impl::TopkBackwardOperands<Exec, typename GradView::non_const_value_type,
                                         typename IndicesView::non_const_value_type>;
  Ops o = Impl::lower_topk_backward<Ops, Exec>("topk_router_indices_backward", config, inter, grad_probs, grad_logits);
  o.output = Impl::RoutingOutput::Indices;
  o.indices = Impl::canonical2<decltype(o.indices)>(indices);
  Impl::run_topk_backward(exec, config, o, choice);
}

/// topk_router_compact_backward.
template <class Exec, class LogitsView, class IdsView, class GradWeightsView, class GradLogitsView>
void topk_router_compact_backward_with(const KernelChoice& choice, const Exec& exec,
                                       const KokkosMoE::RouterConfig& config, const LogitsView& logits,
                                       const IdsView& ids, const GradWeightsView& grad_weights,
                                       const GradLogitsView& grad_logits) {
  namespace Impl = KokkosMoE::Impl;
  using Ops = Impl::CompactBackwardOperands<Exec, typename LogitsView::non_const_value_type,
                                            typename GradWeightsView::non_const_value_type>;
  Ops o;
  o.params = Impl::token_params(config, static_cast<int>(logits.extent(1)), false);
  o.num_tokens = static_cast<std::int64_t>(logits.extent(0));
  o.logits = Impl::canonical2<decltype(o.logits)>(logits);
  o.ids = Impl::canonical2<decltype(o.ids)>(ids);
  o.grad_weights = Impl::canonical2<decltype(o.grad_weights)>(grad_weights);
  o.grad_logits = Impl::canonical2<decltype(o.grad_logits)>(grad_logits);
  Impl::run_compact_backward(exec, config, o, choice);
}

/// aux_scores (config.map_format).
template <class Exec, class LogitsView, class ScoresView, class MapView, class InterView>
void aux_scores_with(const KernelChoice& choice, const Exec& exec, const KokkosMoE::AuxScoresConfig& config,
                     const LogitsView& logits, const ScoresView& scores, const MapView& map, const InterView& inter) {
  namespace Impl = KokkosMoE::Impl;
  Impl::AuxScoresOperands<Exec, typename LogitsView::non_const_value_type> o;
  o.num_tokens = static_cast<std::int64_t>(logits.extent(0));
  o.num_experts = static_cast<int>(logits.extent(1));
  o.topk = config.topk;
  o.score_function = config.score_function;
  o.output = config.map_format == KokkosMoE::RoutingMapFormat::BitmapU8 ? Impl::RoutingOutput::BitmapU8
                                                                        : Impl::RoutingOutput::Bytemap;
  o.logits = Impl::canonical2<decltype(o.logits)>(logits);
  o.scores = Impl::canonical2<decltype(o.scores)>(scores);
  o.map = Impl::canonical2<decltype(o.map)>(map);
  o.inter = Impl::canonical2<decltype(o.inter)>(inter);
  if (o.num_tokens > 0) Impl::run_aux_scores_forward(exec, config.implementation, o, choice);
}

}  // namespace KokkosMoETest

#endif
