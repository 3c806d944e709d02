/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_AUXLOSS_HPP
#define KOKKOSMOE_AUXLOSS_HPP

/// \file KokkosMoE_AuxLoss.hpp
/// \brief Load-balancing auxiliary loss: the score helper (docs/router.md §10) and the loss (docs/router.md §11).
///
/// Execution space first, config, input Views, output Views; validation on the host, work enqueued on \p exec,
/// no fence, no allocation (aux_loss takes a caller-provided workspace sized by aux_loss_workspace_size()).
/// The loss reduction is a fixed-order two-stage sum: bitwise reproducible per backend and thread count. Every
/// function also has an overload without \p exec, which runs on Kokkos::DefaultExecutionSpace{}.

#include <KokkosMoE_Config.hpp>
#include <KokkosMoE_Error.hpp>
#include <KokkosMoE_RouterConfig.hpp>

#include <Kokkos_Core.hpp>
#include <kokkos_ext/KokkosMoE_Float16.hpp>

#include <impl/KokkosMoE_Router_Spec.hpp>
#include <impl/KokkosMoE_Router_Validate.hpp>

namespace KokkosMoE {

namespace Impl {
template <class T>
struct is_tpe_type
    : std::bool_constant<std::is_same_v<T, std::int16_t> || std::is_same_v<T, std::int32_t> ||
                         std::is_same_v<T, std::int64_t> || std::is_same_v<T, bf16_t> || std::is_same_v<T, float>> {};

/// Runs one aux operation on its typed operands: the portable path when forced, the spec (vendor or generic)
/// otherwise.
template <class ExecSpace, class Ops>
void run_aux_scores_forward(const ExecSpace& exec, Implementation impl, const Ops& o, const KernelChoice& choice = {}) {
  if (impl == Implementation::Portable)
    PortableAux<ExecSpace>::aux_scores_forward(exec, o);
  else
    AuxSpec<ExecSpace>::aux_scores_forward(exec, o, choice);
}
template <class ExecSpace, class Ops>
void run_aux_scores_backward(const ExecSpace& exec, Implementation impl, const Ops& o) {
  if (impl == Implementation::Portable)
    PortableAux<ExecSpace>::aux_scores_backward(exec, o);
  else
    AuxSpec<ExecSpace>::aux_scores_backward(exec, o);
}
template <class ExecSpace, class Ops>
void run_aux_loss_forward(const ExecSpace& exec, Implementation impl, const Ops& o) {
  if (impl == Implementation::Portable)
    PortableAux<ExecSpace>::aux_loss_forward(exec, o);
  else
    AuxSpec<ExecSpace>::aux_loss_forward(exec, o);
}
template <class ExecSpace, class Ops>
void run_aux_loss_backward(const ExecSpace& exec, Implementation impl, const Ops& o) {
  if (impl == Implementation::Portable)
    PortableAux<ExecSpace>::aux_loss_backward(exec, o);
  else
    AuxSpec<ExecSpace>::aux_loss_backward(exec, o);
}

/// Validates the operands of aux_loss and converts them to the canonical operands (all but the total).
template <class ExecSpace, class ProbsView, class TpeView, class LossView, class ConstView, class WorkView>
auto lower_aux_loss(const char* fn, const AuxLossConfig& config, const ProbsView& probs,
                    const TpeView& tokens_per_expert, const LossView& loss, const ConstView& const_buf,
                    const WorkView& workspace) {
  static_check_view<ExecSpace, ProbsView, 2>();
  static_check_view<ExecSpace, TpeView, 1>();
  static_check_view<ExecSpace, LossView, 0>();
  static_check_view<ExecSpace, ConstView, 1>();
  static_check_view<ExecSpace, WorkView, 1>();
  using P = typename ProbsView::non_const_value_type;
  using Tpe = typename TpeView::non_const_value_type;
  static_assert(is_router_float<P>::value, "KokkosMoE::aux_loss: probs must be float, fp16_t or bf16_t");
  static_assert(is_tpe_type<Tpe>::value,
                "KokkosMoE::aux_loss: tokens_per_expert must be int16_t, int32_t, int64_t, bf16_t or float");
  static_assert(std::is_same_v<typename LossView::value_type, P>, "KokkosMoE::aux_loss: loss has the probs' type");
  static_assert(std::is_same_v<typename ConstView::value_type, float>, "KokkosMoE::aux_loss: const_buf is float");
  static_assert(std::is_same_v<typename WorkView::value_type, float>, "KokkosMoE::aux_loss: workspace is float");
  const std::int64_t R = probs.extent(0), C = probs.extent(1);
  check_implementation(fn, config.implementation);
  if (config.num_experts < 1)
    fail(fn, "num_experts", Rule::NumExpertsPositive,
         "num_experts (" + std::to_string(config.num_experts) + ") must be >= 1");
  check_topk(fn, config.topk, config.num_experts);
  if (C < 1 || C % config.num_experts != 0)
    fail(fn, "probs", Rule::AuxColumnsMultiple,
         "probs has " + std::to_string(C) + " columns; expected a positive multiple of num_experts (" +
             std::to_string(config.num_experts) + ")");
  if (R >= (std::int64_t(1) << 31))
    fail(fn, "probs", Rule::TokenCountRange, "rows (" + std::to_string(R) + ") must be < 2^31");
  if (!std::isfinite(config.coeff))
    fail(fn, "coeff", Rule::CoeffFinite, "coeff (" + std::to_string(config.coeff) + ") must be finite");
  check_contiguous(fn, "probs", probs);
  check_shape1(fn, "tokens_per_expert", tokens_per_expert, C);
  check_shape1(fn, "const_buf", const_buf, 2);
  check_contiguous(fn, "workspace", workspace);
  const std::size_t need = aux_loss_workspace_floats(R, C);
  if (workspace.extent(0) < need)
    fail(fn, "workspace", Rule::WorkspaceTooSmall,
         "workspace has " + std::to_string(workspace.extent(0)) +
             " floats; aux_loss_workspace_size() = " + std::to_string(need));
  const Span in[] = {span_of("probs", probs), span_of("tokens_per_expert", tokens_per_expert)};
  const Span out[] = {span_of("loss", loss), span_of("const_buf", const_buf), span_of("workspace", workspace)};
  check_no_alias(fn, in, out);
  AuxLossOperands<ExecSpace, P, Tpe> o;
  o.rows = R;
  o.cols = C;
  o.num_experts = config.num_experts;
  o.topk = config.topk;
  o.coeff = config.coeff;
  o.probs = canonical2<decltype(o.probs)>(probs);
  o.tokens_per_expert = canonical1<decltype(o.tokens_per_expert)>(tokens_per_expert);
  o.loss = canonical0<decltype(o.loss)>(loss);
  o.const_buf = canonical1<decltype(o.const_buf)>(const_buf);
  o.workspace = canonical1<decltype(o.workspace)>(workspace);
  return o;
}

/// aux_scores with the kernel choice as an argument (the public function passes the library's; tests that compare
/// kernel variants giving the same bits pass another).
template <class ExecSpace, class LogitsView, class ScoresView, class MapView, class InterView>
void aux_scores_with(const KernelChoice& choice, const ExecSpace& exec, const AuxScoresConfig& config,
                     const LogitsView& logits, const ScoresView& scores, const MapView& routing_map,
                     const InterView& intermediate) {
  constexpr const char* fn = "aux_scores";
  Impl::static_check_view<ExecSpace, LogitsView, 2>();
  Impl::static_check_view<ExecSpace, ScoresView, 2>();
  Impl::static_check_view<ExecSpace, MapView, 2>();
  Impl::static_check_view<ExecSpace, InterView, 2>();
  using Scalar = typename LogitsView::non_const_value_type;
  static_assert(Impl::is_router_float<Scalar>::value, "KokkosMoE: logits must be float, fp16_t or bf16_t");
  static_assert(std::is_same_v<typename ScoresView::value_type, float>, "KokkosMoE::aux_scores: scores is float");
  static_assert(std::is_same_v<typename MapView::value_type, std::uint8_t>,
                "KokkosMoE::aux_scores: routing_map is uint8_t");
  static_assert(std::is_same_v<typename InterView::value_type, float>, "KokkosMoE::aux_scores: intermediate is float");
  const std::int64_t T = logits.extent(0), E = logits.extent(1);
  Impl::check_counts(fn, T, E);
  Impl::check_contiguous(fn, "logits", logits);
  Impl::check_score_function(fn, config.score_function);
  Impl::check_map_format(fn, config.map_format);
  Impl::check_implementation(fn, config.implementation);
  Impl::check_topk(fn, config.topk, E);
  const bool bitmap = config.map_format == RoutingMapFormat::BitmapU8;
  Impl::check_shape2(fn, "scores", scores, T, E);
  Impl::check_shape2(fn, "routing_map", routing_map, T, bitmap ? Impl::bitmap_row_bytes(E) : E);
  Impl::check_shape2(fn, "intermediate", intermediate, T, E);
  const Impl::Span in[] = {Impl::span_of("logits", logits)};
  const Impl::Span out[] = {Impl::span_of("scores", scores), Impl::span_of("routing_map", routing_map),
                            Impl::span_of("intermediate", intermediate)};
  Impl::check_no_alias(fn, in, out);
  if (T == 0) return;
  Impl::AuxScoresOperands<ExecSpace, Scalar> o;
  o.num_tokens = T;
  o.num_experts = static_cast<int>(E);
  o.topk = config.topk;
  o.score_function = config.score_function;
  o.output = bitmap ? Impl::RoutingOutput::BitmapU8 : Impl::RoutingOutput::Bytemap;
  o.logits = Impl::canonical2<decltype(o.logits)>(logits);
  o.scores = Impl::canonical2<decltype(o.scores)>(scores);
  o.map = Impl::canonical2<decltype(o.map)>(routing_map);
  o.inter = Impl::canonical2<decltype(o.inter)>(intermediate);
  Impl::run_aux_scores_forward(exec, config.implementation, o, choice);
}
}  // namespace Impl

/// \brief Aux-loss score helper (docs/router.md §10): dense FP32 scores, a routing map of the top-k of the scores,
/// and the FP32 intermediate saved for the backward. Sigmoid/SqrtSoftplus normalize over all E (even k = 1).
/// \param logits        [T, E] float, fp16_t or bf16_t
/// \param scores        [T, E] float output
/// \param routing_map   [T, E] (Bytemap) or [T, ceil(E/8)] (BitmapU8) uint8 output, per config.map_format
/// \param intermediate  [T, E] float output
template <class ExecSpace, class LogitsView, class ScoresView, class MapView, class InterView>
void aux_scores(const ExecSpace& exec, const AuxScoresConfig& config, const LogitsView& logits,
                const ScoresView& scores, const MapView& routing_map, const InterView& intermediate) {
  Impl::aux_scores_with(Impl::KernelChoice{}, exec, config, logits, scores, routing_map, intermediate);
}

/// \brief Backward of aux_scores (docs/router.md §10): no routing mask, all experts take part.
/// \param intermediate  [T, E] float from aux_scores
/// \param grad_scores   [T, E] float
/// \param grad_logits   [T, E] output, float, fp16_t or bf16_t (the logits' type)
template <class ExecSpace, class InterView, class GradScoresView, class GradLogitsView>
void aux_scores_backward(const ExecSpace& exec, const AuxScoresConfig& config, const InterView& intermediate,
                         const GradScoresView& grad_scores, const GradLogitsView& grad_logits) {
  constexpr const char* fn = "aux_scores_backward";
  Impl::static_check_view<ExecSpace, InterView, 2>();
  Impl::static_check_view<ExecSpace, GradScoresView, 2>();
  Impl::static_check_view<ExecSpace, GradLogitsView, 2>();
  using G = typename GradLogitsView::value_type;
  static_assert(std::is_same_v<typename InterView::non_const_value_type, float>, "intermediate must be float");
  static_assert(std::is_same_v<typename GradScoresView::non_const_value_type, float>, "grad_scores must be float");
  static_assert(Impl::is_router_float<G>::value, "KokkosMoE: grad_logits must be float, fp16_t or bf16_t");
  const std::int64_t T = intermediate.extent(0), E = intermediate.extent(1);
  Impl::check_counts(fn, T, E);
  Impl::check_contiguous(fn, "intermediate", intermediate);
  Impl::check_score_function(fn, config.score_function);
  Impl::check_implementation(fn, config.implementation);
  Impl::check_topk(fn, config.topk, E);
  Impl::check_shape2(fn, "grad_scores", grad_scores, T, E);
  Impl::check_shape2(fn, "grad_logits", grad_logits, T, E);
  const Impl::Span in[] = {Impl::span_of("intermediate", intermediate), Impl::span_of("grad_scores", grad_scores)};
  const Impl::Span out[] = {Impl::span_of("grad_logits", grad_logits)};
  Impl::check_no_alias(fn, in, out);
  if (T == 0) return;
  Impl::AuxScoresBackwardOperands<ExecSpace, G> o;
  o.num_tokens = T;
  o.num_experts = static_cast<int>(E);
  o.score_function = config.score_function;
  o.inter = Impl::canonical2<decltype(o.inter)>(intermediate);
  o.grad_scores = Impl::canonical2<decltype(o.grad_scores)>(grad_scores);
  o.grad_logits = Impl::canonical2<decltype(o.grad_logits)>(grad_logits);
  Impl::run_aux_scores_backward(exec, config.implementation, o);
}

/// \brief Floats of workspace aux_loss needs for probs [rows, cols] (the same on every backend).
inline std::size_t aux_loss_workspace_size(std::int64_t rows, std::int64_t cols) {
  return Impl::aux_loss_workspace_floats(rows, cols);
}

/// \brief Aux loss (docs/router.md §11) with a host-side total token count.
///
/// Const = ((E * coeff) / topk) / T_total / T_total;  loss = Const * sum_c (sum_r probs[r,c]) * tpe[c].
/// \param probs              [R, C] float/fp16_t/bf16_t, C = m * E (m sequences side by side)
/// \param tokens_per_expert  [C] int16_t, int32_t, int64_t, bf16_t or float
/// \param total_num_tokens   T_total >= 1
/// \param loss               rank-0 output, probs' type
/// \param const_buf          [2] float output: {Const, the FP32 loss before the cast}; read by aux_loss_backward
/// \param workspace          [>= aux_loss_workspace_size(R, C)] float scratch
/// R = 0 is valid: loss = 0 and Const are still written.
template <class ExecSpace, class ProbsView, class TpeView, class LossView, class ConstView, class WorkView>
void aux_loss(const ExecSpace& exec, const AuxLossConfig& config, const ProbsView& probs,
              const TpeView& tokens_per_expert, std::int64_t total_num_tokens, const LossView& loss,
              const ConstView& const_buf, const WorkView& workspace) {
  constexpr const char* fn = "aux_loss";
  auto o = Impl::lower_aux_loss<ExecSpace>(fn, config, probs, tokens_per_expert, loss, const_buf, workspace);
  if (total_num_tokens < 1)
    Impl::fail(fn, "total_num_tokens", Rule::TotalTokensPositive,
               "total_num_tokens (" + std::to_string(total_num_tokens) + ") must be >= 1");
  o.total_num_tokens = total_num_tokens;
  Impl::run_aux_loss_forward(exec, config.implementation, o);
}

/// \brief Aux loss with the total token count read on the device from a rank-0 int64_t View, on every launch:
/// a captured CUDA graph stays correct when the total changes between replays. The value cannot be checked on
/// the host; a total < 1 makes Const non-finite.
template <class ExecSpace, class ProbsView, class TpeView, class TotalView, class LossView, class ConstView,
          class WorkView, std::enable_if_t<Kokkos::is_view<TotalView>::value, int> = 0>
void aux_loss(const ExecSpace& exec, const AuxLossConfig& config, const ProbsView& probs,
              const TpeView& tokens_per_expert, const TotalView& total_num_tokens, const LossView& loss,
              const ConstView& const_buf, const WorkView& workspace) {
  constexpr const char* fn = "aux_loss";
  Impl::static_check_view<ExecSpace, TotalView, 0>();
  static_assert(std::is_same_v<typename TotalView::non_const_value_type, std::int64_t>,
                "KokkosMoE::aux_loss: the device total must be a rank-0 int64_t View");
  auto o = Impl::lower_aux_loss<ExecSpace>(fn, config, probs, tokens_per_expert, loss, const_buf, workspace);
  o.total_num_tokens_device = Impl::canonical0<decltype(o.total_num_tokens_device)>(total_num_tokens);
  Impl::run_aux_loss_forward(exec, config.implementation, o);
}

/// \brief Backward of aux_loss: grad_probs[r, c] = const_buf[0] * tpe[c] * grad_loss (FP32 math, one cast).
/// \param const_buf          [2] float from aux_loss
/// \param tokens_per_expert  [C] as in aux_loss
/// \param grad_loss          rank-0, float or the gradient's type
/// \param grad_probs         [R, C] output, float/fp16_t/bf16_t
template <class ExecSpace, class ConstView, class TpeView, class GradLossView, class GradProbsView>
void aux_loss_backward(const ExecSpace& exec, const AuxLossConfig& config, const ConstView& const_buf,
                       const TpeView& tokens_per_expert, const GradLossView& grad_loss,
                       const GradProbsView& grad_probs) {
  constexpr const char* fn = "aux_loss_backward";
  Impl::static_check_view<ExecSpace, ConstView, 1>();
  Impl::static_check_view<ExecSpace, TpeView, 1>();
  Impl::static_check_view<ExecSpace, GradLossView, 0>();
  Impl::static_check_view<ExecSpace, GradProbsView, 2>();
  using G = typename GradProbsView::value_type;
  using GL = typename GradLossView::non_const_value_type;
  using Tpe = typename TpeView::non_const_value_type;
  static_assert(std::is_same_v<typename ConstView::non_const_value_type, float>, "const_buf must be float");
  static_assert(Impl::is_tpe_type<Tpe>::value, "tokens_per_expert: int16_t, int32_t, int64_t, bf16_t or float");
  static_assert(Impl::is_router_float<G>::value, "grad_probs must be float, fp16_t or bf16_t");
  static_assert(std::is_same_v<GL, float> || std::is_same_v<GL, G>, "grad_loss must be float or grad_probs' type");
  const std::int64_t R = grad_probs.extent(0), C = grad_probs.extent(1);
  Impl::check_implementation(fn, config.implementation);
  if (config.num_experts < 1)
    Impl::fail(fn, "num_experts", Rule::NumExpertsPositive,
               "num_experts (" + std::to_string(config.num_experts) + ") must be >= 1");
  if (C < 1 || C % config.num_experts != 0)
    Impl::fail(fn, "grad_probs", Rule::AuxColumnsMultiple,
               "grad_probs has " + std::to_string(C) + " columns; expected a positive multiple of num_experts (" +
                   std::to_string(config.num_experts) + ")");
  if (R >= (std::int64_t(1) << 31))
    Impl::fail(fn, "grad_probs", Rule::TokenCountRange, "rows (" + std::to_string(R) + ") must be < 2^31");
  Impl::check_contiguous(fn, "grad_probs", grad_probs);
  Impl::check_shape1(fn, "const_buf", const_buf, 2);
  Impl::check_shape1(fn, "tokens_per_expert", tokens_per_expert, C);
  const Impl::Span in[] = {Impl::span_of("const_buf", const_buf), Impl::span_of("tokens_per_expert", tokens_per_expert),
                           Impl::span_of("grad_loss", grad_loss)};
  const Impl::Span out[] = {Impl::span_of("grad_probs", grad_probs)};
  Impl::check_no_alias(fn, in, out);
  if (R == 0) return;
  Impl::AuxLossBackwardOperands<ExecSpace, G, GL, Tpe> o;
  o.rows = R;
  o.cols = C;
  o.const_buf = Impl::canonical1<decltype(o.const_buf)>(const_buf);
  o.tokens_per_expert = Impl::canonical1<decltype(o.tokens_per_expert)>(tokens_per_expert);
  o.grad_loss = Impl::canonical0<decltype(o.grad_loss)>(grad_loss);
  o.grad_probs = Impl::canonical2<decltype(o.grad_probs)>(grad_probs);
  Impl::run_aux_loss_backward(exec, config.implementation, o);
}

// ---- the same operations on Kokkos::DefaultExecutionSpace{} ----------------------------------------------------

/// \brief aux_scores on Kokkos::DefaultExecutionSpace{}.
template <class LogitsView, class ScoresView, class MapView, class InterView>
void aux_scores(const AuxScoresConfig& config, const LogitsView& logits, const ScoresView& scores,
                const MapView& routing_map, const InterView& intermediate) {
  aux_scores(Kokkos::DefaultExecutionSpace{}, config, logits, scores, routing_map, intermediate);
}

/// \brief aux_scores_backward on Kokkos::DefaultExecutionSpace{}.
template <class InterView, class GradScoresView, class GradLogitsView>
void aux_scores_backward(const AuxScoresConfig& config, const InterView& intermediate,
                         const GradScoresView& grad_scores, const GradLogitsView& grad_logits) {
  aux_scores_backward(Kokkos::DefaultExecutionSpace{}, config, intermediate, grad_scores, grad_logits);
}

/// \brief aux_loss with a host-side total on Kokkos::DefaultExecutionSpace{}.
template <class ProbsView, class TpeView, class LossView, class ConstView, class WorkView>
void aux_loss(const AuxLossConfig& config, const ProbsView& probs, const TpeView& tokens_per_expert,
              std::int64_t total_num_tokens, const LossView& loss, const ConstView& const_buf,
              const WorkView& workspace) {
  aux_loss(Kokkos::DefaultExecutionSpace{}, config, probs, tokens_per_expert, total_num_tokens, loss, const_buf,
           workspace);
}

/// \brief aux_loss with a device-side total on Kokkos::DefaultExecutionSpace{}.
template <class ProbsView, class TpeView, class TotalView, class LossView, class ConstView, class WorkView,
          std::enable_if_t<Kokkos::is_view<TotalView>::value, int> = 0>
void aux_loss(const AuxLossConfig& config, const ProbsView& probs, const TpeView& tokens_per_expert,
              const TotalView& total_num_tokens, const LossView& loss, const ConstView& const_buf,
              const WorkView& workspace) {
  aux_loss(Kokkos::DefaultExecutionSpace{}, config, probs, tokens_per_expert, total_num_tokens, loss, const_buf,
           workspace);
}

/// \brief aux_loss_backward on Kokkos::DefaultExecutionSpace{}.
template <class ConstView, class TpeView, class GradLossView, class GradProbsView>
void aux_loss_backward(const AuxLossConfig& config, const ConstView& const_buf, const TpeView& tokens_per_expert,
                       const GradLossView& grad_loss, const GradProbsView& grad_probs) {
  aux_loss_backward(Kokkos::DefaultExecutionSpace{}, config, const_buf, tokens_per_expert, grad_loss, grad_probs);
}

}  // namespace KokkosMoE

#endif
