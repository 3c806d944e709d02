/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTER_HPP
#define KOKKOSMOE_ROUTER_HPP

/// \file KokkosMoE_Router.hpp
/// \brief Fused top-k MoE router: forward (routing map, dense indices or compact output) and backward.
///
/// The contract is docs/router.md (TransformerEngine's fused router, with KokkosMoE's tie-breaking and
/// non-finite rules). Every function takes the execution space instance first, then a RouterConfig, then input
/// Views, then preallocated output Views. All tensors are rank 2, row-major, contiguous. Calls validate on the host,
/// enqueue on \p exec and return without fencing; nothing is allocated per call. On Kokkos::Cuda the hand-tuned
/// CUDA kernels run (config.implementation = Auto); Implementation::Portable forces the generic Kokkos kernels.
/// Every function also has an overload without \p exec, which runs on Kokkos::DefaultExecutionSpace{}, and every
/// forward one without \p expert_bias.

#include <KokkosMoE_Config.hpp>
#include <KokkosMoE_Error.hpp>
#include <KokkosMoE_RouterConfig.hpp>

#include <Kokkos_Core.hpp>
#include <kokkos_ext/KokkosMoE_Float16.hpp>

#include <impl/KokkosMoE_Router_Entry.hpp>

namespace KokkosMoE {

/// \brief Top-k routing with a routing map (Bytemap or BitmapU8, per config.map_format).
///
/// \param exec          execution space instance that runs the kernels
/// \param config        topk, score function, pre-softmax, grouping, scaling, map format
/// \param logits        [T, E] float, fp16_t or bf16_t
/// \param expert_bias   [E] float/fp16_t/bf16_t, or an empty View for none (Sigmoid/SqrtSoftplus only)
/// \param probs         [T, E] output, logits' type, non-zero only at the selected experts
/// \param routing_map   [T, E] uint8 (Bytemap) or [T, ceil(E/8)] uint8 (BitmapU8, LSB-first, zero padding)
/// \param intermediate  [T, E] float output, saved for the backward pass (docs/router.md §5.1, §8)
/// \throws KokkosMoE::InvalidArgument if a shape, type or attribute violates docs/router.md §4
/// \throws KokkosMoE::NonFiniteInput if config.check_finite and the logits hold a non-finite value
template <class ExecSpace, class LogitsView, class BiasView, class ProbsView, class MapView, class InterView>
void topk_router(const ExecSpace& exec, const RouterConfig& config, const LogitsView& logits,
                 const BiasView& expert_bias, const ProbsView& probs, const MapView& routing_map,
                 const InterView& intermediate) {
  Impl::topk_router_with(Impl::KernelChoice{}, exec, config, logits, expert_bias, probs, routing_map, intermediate);
}

/// \brief topk_router without an expert bias.
template <class ExecSpace, class LogitsView, class ProbsView, class MapView, class InterView>
void topk_router(const ExecSpace& exec, const RouterConfig& config, const LogitsView& logits, const ProbsView& probs,
                 const MapView& routing_map, const InterView& intermediate) {
  topk_router(exec, config, logits, Impl::no_bias<LogitsView>(), probs, routing_map, intermediate);
}

/// \brief Top-k routing with dense indices [T, k] (int16_t, int32_t or int64_t) in selection order
/// (slot 0 = best expert) instead of a routing map. config.map_format is ignored.
/// \throws KokkosMoE::InvalidArgument as topk_router; int16_t indices require E <= 32767
template <class ExecSpace, class LogitsView, class BiasView, class ProbsView, class IndicesView, class InterView>
void topk_router_indices(const ExecSpace& exec, const RouterConfig& config, const LogitsView& logits,
                         const BiasView& expert_bias, const ProbsView& probs, const IndicesView& indices,
                         const InterView& intermediate) {
  Impl::topk_router_indices_with(Impl::KernelChoice{}, exec, config, logits, expert_bias, probs, indices, intermediate);
}

/// \brief topk_router_indices without an expert bias.
template <class ExecSpace, class LogitsView, class ProbsView, class IndicesView, class InterView>
void topk_router_indices(const ExecSpace& exec, const RouterConfig& config, const LogitsView& logits,
                         const ProbsView& probs, const IndicesView& indices, const InterView& intermediate) {
  topk_router_indices(exec, config, logits, Impl::no_bias<LogitsView>(), probs, indices, intermediate);
}

/// \brief Compact forward for inference (docs/router.md §5.5): ids [T, k] int32 in selection order and
/// weights [T, k] float (= scaling_factor * v[i] in FP32). No probs, map or intermediate is written.
template <class ExecSpace, class LogitsView, class BiasView, class IdsView, class WeightsView>
void topk_router_compact(const ExecSpace& exec, const RouterConfig& config, const LogitsView& logits,
                         const BiasView& expert_bias, const IdsView& ids, const WeightsView& weights) {
  Impl::topk_router_compact_with(Impl::KernelChoice{}, exec, config, logits, expert_bias, ids, weights);
}

/// \brief topk_router_compact without an expert bias.
template <class ExecSpace, class LogitsView, class IdsView, class WeightsView>
void topk_router_compact(const ExecSpace& exec, const RouterConfig& config, const LogitsView& logits,
                         const IdsView& ids, const WeightsView& weights) {
  topk_router_compact(exec, config, logits, Impl::no_bias<LogitsView>(), ids, weights);
}

/// \brief Backward of topk_router (docs/router.md §9) from the saved routing map (config.map_format) and
/// intermediate. grad_logits has grad_probs' type. Bytemap and BitmapU8 give bit-identical gradients.
/// Uses config.topk, score_function, use_pre_softmax and scaling_factor (grouping and bias play no part).
template <class ExecSpace, class MapView, class InterView, class GradProbsView, class GradLogitsView>
void topk_router_backward(const ExecSpace& exec, const RouterConfig& config, const MapView& routing_map,
                          const InterView& intermediate, const GradProbsView& grad_probs,
                          const GradLogitsView& grad_logits) {
  Impl::topk_router_backward_with(Impl::KernelChoice{}, exec, config, routing_map, intermediate, grad_probs,
                                  grad_logits);
}

/// \brief Backward of topk_router_indices: sums run over the k slots (within tolerance of the map path).
template <class ExecSpace, class IndicesView, class InterView, class GradProbsView, class GradLogitsView>
void topk_router_indices_backward(const ExecSpace& exec, const RouterConfig& config, const IndicesView& indices,
                                  const InterView& intermediate, const GradProbsView& grad_probs,
                                  const GradLogitsView& grad_logits) {
  Impl::topk_router_indices_backward_with(Impl::KernelChoice{}, exec, config, indices, intermediate, grad_probs,
                                          grad_logits);
}

/// \brief Backward of topk_router_compact (docs/router.md §5.5): recomputes the activations from the logits.
/// \param logits        [T, E] the forward's logits, unchanged
/// \param ids           [T, k] int32 from the compact forward
/// \param grad_weights  [T, k] float or the logits' type
/// \param grad_logits   [T, E] output in the logits' type; non-routed entries +0.0 (Softmax pre excepted)
template <class ExecSpace, class LogitsView, class IdsView, class GradWeightsView, class GradLogitsView>
void topk_router_compact_backward(const ExecSpace& exec, const RouterConfig& config, const LogitsView& logits,
                                  const IdsView& ids, const GradWeightsView& grad_weights,
                                  const GradLogitsView& grad_logits) {
  Impl::topk_router_compact_backward_with(Impl::KernelChoice{}, exec, config, logits, ids, grad_weights, grad_logits);
}

/// \brief Debug check (docs/router.md §7.1): scans a [T, E] float/fp16_t/bf16_t View and throws
/// KokkosMoE::NonFiniteInput naming the first non-finite element in row-major order. Fences \p exec.
template <class ExecSpace, class View, std::enable_if_t<Kokkos::is_execution_space<ExecSpace>::value, int> = 0>
void check_finite(const ExecSpace& exec, const View& values, const char* parameter = "logits") {
  Impl::static_check_view<ExecSpace, View, 2>();
  using Scalar = typename View::non_const_value_type;
  static_assert(Impl::is_router_float<Scalar>::value, "KokkosMoE::check_finite: float, fp16_t or bf16_t only");
  Impl::check_contiguous("check_finite", parameter, values);
  Impl::run_check_finite(exec, "check_finite", parameter, values);
}

// ---- the same operations on Kokkos::DefaultExecutionSpace{} ----------------------------------------------------

/// \brief topk_router on Kokkos::DefaultExecutionSpace{}.
template <class LogitsView, class BiasView, class ProbsView, class MapView, class InterView>
void topk_router(const RouterConfig& config, const LogitsView& logits, const BiasView& expert_bias,
                 const ProbsView& probs, const MapView& routing_map, const InterView& intermediate) {
  topk_router(Kokkos::DefaultExecutionSpace{}, config, logits, expert_bias, probs, routing_map, intermediate);
}

/// \brief topk_router without an expert bias on Kokkos::DefaultExecutionSpace{}.
template <class LogitsView, class ProbsView, class MapView, class InterView>
void topk_router(const RouterConfig& config, const LogitsView& logits, const ProbsView& probs,
                 const MapView& routing_map, const InterView& intermediate) {
  topk_router(Kokkos::DefaultExecutionSpace{}, config, logits, probs, routing_map, intermediate);
}

/// \brief topk_router_indices on Kokkos::DefaultExecutionSpace{}.
template <class LogitsView, class BiasView, class ProbsView, class IndicesView, class InterView>
void topk_router_indices(const RouterConfig& config, const LogitsView& logits, const BiasView& expert_bias,
                         const ProbsView& probs, const IndicesView& indices, const InterView& intermediate) {
  topk_router_indices(Kokkos::DefaultExecutionSpace{}, config, logits, expert_bias, probs, indices, intermediate);
}

/// \brief topk_router_indices without an expert bias on Kokkos::DefaultExecutionSpace{}.
template <class LogitsView, class ProbsView, class IndicesView, class InterView>
void topk_router_indices(const RouterConfig& config, const LogitsView& logits, const ProbsView& probs,
                         const IndicesView& indices, const InterView& intermediate) {
  topk_router_indices(Kokkos::DefaultExecutionSpace{}, config, logits, probs, indices, intermediate);
}

/// \brief topk_router_compact on Kokkos::DefaultExecutionSpace{}.
template <class LogitsView, class BiasView, class IdsView, class WeightsView>
void topk_router_compact(const RouterConfig& config, const LogitsView& logits, const BiasView& expert_bias,
                         const IdsView& ids, const WeightsView& weights) {
  topk_router_compact(Kokkos::DefaultExecutionSpace{}, config, logits, expert_bias, ids, weights);
}

/// \brief topk_router_compact without an expert bias on Kokkos::DefaultExecutionSpace{}.
template <class LogitsView, class IdsView, class WeightsView>
void topk_router_compact(const RouterConfig& config, const LogitsView& logits, const IdsView& ids,
                         const WeightsView& weights) {
  topk_router_compact(Kokkos::DefaultExecutionSpace{}, config, logits, ids, weights);
}

/// \brief topk_router_backward on Kokkos::DefaultExecutionSpace{}.
template <class MapView, class InterView, class GradProbsView, class GradLogitsView>
void topk_router_backward(const RouterConfig& config, const MapView& routing_map, const InterView& intermediate,
                          const GradProbsView& grad_probs, const GradLogitsView& grad_logits) {
  topk_router_backward(Kokkos::DefaultExecutionSpace{}, config, routing_map, intermediate, grad_probs, grad_logits);
}

/// \brief topk_router_indices_backward on Kokkos::DefaultExecutionSpace{}.
template <class IndicesView, class InterView, class GradProbsView, class GradLogitsView>
void topk_router_indices_backward(const RouterConfig& config, const IndicesView& indices, const InterView& intermediate,
                                  const GradProbsView& grad_probs, const GradLogitsView& grad_logits) {
  topk_router_indices_backward(Kokkos::DefaultExecutionSpace{}, config, indices, intermediate, grad_probs, grad_logits);
}

/// \brief topk_router_compact_backward on Kokkos::DefaultExecutionSpace{}.
template <class LogitsView, class IdsView, class GradWeightsView, class GradLogitsView>
void topk_router_compact_backward(const RouterConfig& config, const LogitsView& logits, const IdsView& ids,
                                  const GradWeightsView& grad_weights, const GradLogitsView& grad_logits) {
  topk_router_compact_backward(Kokkos::DefaultExecutionSpace{}, config, logits, ids, grad_weights, grad_logits);
}

/// \brief check_finite on Kokkos::DefaultExecutionSpace{}.
template <class View, std::enable_if_t<Kokkos::is_view<View>::value, int> = 0>
void check_finite(const View& values, const char* parameter = "logits") {
  check_finite(Kokkos::DefaultExecutionSpace{}, values, parameter);
}

}  // namespace KokkosMoE

#endif
