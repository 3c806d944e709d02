/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTER_SPEC_HPP
#define KOKKOSMOE_ROUTER_SPEC_HPP

// Dispatch layer between the public entry points and the implementations (docs/conventions.md §4).
//
// `RouterImpl<ExecSpace>` is the primary template: the portable Kokkos implementation (reference and fallback on
// every backend). cuda/KokkosMoE_Router_Cuda.hpp specializes it for Kokkos::Cuda with the native kernels.
// `PortableRouter<ExecSpace>` stays callable directly (Implementation::Portable) for tests and benchmarks.

#include <KokkosMoE_RouterConfig.hpp>

#include <Kokkos_Core.hpp>

#include <impl/KokkosMoE_Router_Args.hpp>
#include <impl/KokkosMoE_Router_Portable.hpp>
#include <impl/KokkosMoE_Router_Validate.hpp>

namespace KokkosMoE {
namespace Impl {

template <class ExecSpace>
struct RouterImpl {
  static constexpr bool is_specialized = false;
  static void topk_forward(const ExecSpace& exec, const TopkForwardArgs& a) {
    PortableRouter<ExecSpace>::topk_forward(exec, a);
  }
  static void topk_backward(const ExecSpace& exec, const TopkBackwardArgs& a) {
    PortableRouter<ExecSpace>::topk_backward(exec, a);
  }
  static void aux_scores_forward(const ExecSpace& exec, const AuxScoresArgs& a) {
    PortableRouter<ExecSpace>::aux_scores_forward(exec, a);
  }
  static void aux_scores_backward(const ExecSpace& exec, const AuxScoresBackwardArgs& a) {
    PortableRouter<ExecSpace>::aux_scores_backward(exec, a);
  }
  static void aux_loss_forward(const ExecSpace& exec, const AuxLossArgs& a) {
    PortableRouter<ExecSpace>::aux_loss_forward(exec, a);
  }
  static void aux_loss_backward(const ExecSpace& exec, const AuxLossBackwardArgs& a) {
    PortableRouter<ExecSpace>::aux_loss_backward(exec, a);
  }
};

}  // namespace Impl
}  // namespace KokkosMoE

#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda/KokkosMoE_Router_Cuda.hpp>
#endif

namespace KokkosMoE {
namespace Impl {

/// An empty bias View of the logits' memory space (the "no bias" argument).
template <class LogitsView>
Kokkos::View<const float*, typename LogitsView::memory_space> no_bias() {
  return {};
}

/// Validates logits, bias and config of a forward call and fills the common part of the args.
template <class ExecSpace, class LogitsView, class BiasView>
TopkForwardArgs lower_topk_forward(const char* fn, const RouterConfig& config, const LogitsView& logits,
                                   const BiasView& bias) {
  static_check_view<ExecSpace, LogitsView, 2>();
  static_check_view<ExecSpace, BiasView, 1>();
  using Scalar = typename LogitsView::non_const_value_type;
  using BiasScalar = typename BiasView::non_const_value_type;
  static_assert(is_router_float<Scalar>::value, "KokkosMoE: logits must be float, fp16_t or bf16_t (no double)");
  static_assert(is_router_float<BiasScalar>::value, "KokkosMoE: expert_bias must be float, fp16_t or bf16_t");
  const std::int64_t T = logits.extent(0), E = logits.extent(1);
  check_counts(fn, T, E);
  check_contiguous(fn, "logits", logits);
  const bool has_bias = bias.size() > 0;
  check_router_config(fn, config, E, has_bias);
  if (has_bias) check_shape1(fn, "expert_bias", bias, E);
  TopkForwardArgs a;
  a.num_tokens = T;
  a.num_experts = static_cast<int>(E);
  a.config = config;
  if (a.config.group_topk <= 0) a.config.group_topk = 0;
  a.logits_type = dtype_of<Scalar>();
  a.logits = logits.data();
  a.bias_type = dtype_of<BiasScalar>();
  a.bias = has_bias ? bias.data() : nullptr;
  return a;
}

/// Validates intermediate, grad_probs, grad_logits and the config of a map/indices backward call.
template <class ExecSpace, class InterView, class GradProbsView, class GradLogitsView>
TopkBackwardArgs lower_topk_backward(const char* fn, const RouterConfig& config, const InterView& intermediate,
                                     const GradProbsView& grad_probs, const GradLogitsView& grad_logits) {
  static_check_view<ExecSpace, InterView, 2>();
  static_check_view<ExecSpace, GradProbsView, 2>();
  static_check_view<ExecSpace, GradLogitsView, 2>();
  using G = typename GradProbsView::non_const_value_type;
  static_assert(std::is_same_v<typename InterView::non_const_value_type, float>,
                "KokkosMoE: intermediate must be float");
  static_assert(is_router_float<G>::value, "KokkosMoE: grad_probs must be float, fp16_t or bf16_t");
  static_assert(std::is_same_v<typename GradLogitsView::value_type, G>,
                "KokkosMoE: grad_logits must have grad_probs' element type");
  const std::int64_t T = intermediate.extent(0), E = intermediate.extent(1);
  check_counts(fn, T, E);
  check_contiguous(fn, "intermediate", intermediate);
  check_router_config(fn, config, E, false);
  check_shape2(fn, "grad_probs", grad_probs, T, E);
  check_shape2(fn, "grad_logits", grad_logits, T, E);
  TopkBackwardArgs a;
  a.num_tokens = T;
  a.num_experts = static_cast<int>(E);
  a.config = config;
  a.intermediate = intermediate.data();
  a.grad_type = dtype_of<G>();
  a.grad_probs = grad_probs.data();
  a.grad_logits = grad_logits.data();
  return a;
}

template <class ExecSpace>
void run_check_finite(const ExecSpace& exec, const char* fn, const char* param, const void* data, DType type,
                      std::int64_t rows, std::int64_t cols) {
  const std::int64_t first = PortableRouter<ExecSpace>::first_non_finite(exec, data, type, rows, cols);
  if (first >= 0) {
    const float v = PortableRouter<ExecSpace>::read_one(exec, data, type, first);
    throw NonFiniteInput(fn, param, first / cols, first % cols, v);
  }
}
template <class ExecSpace, class Scalar>
void run_check_finite(const ExecSpace& exec, const char* fn, const char* param, const Scalar* data, std::int64_t rows,
                      std::int64_t cols) {
  run_check_finite(exec, fn, param, static_cast<const void*>(data), dtype_of<Scalar>(), rows, cols);
}

template <class ExecSpace, class LogitsView>
void run_topk_forward(const char* fn, const ExecSpace& exec, const TopkForwardArgs& a, const LogitsView& logits) {
  if (a.config.check_finite) run_check_finite(exec, fn, "logits", logits.data(), a.num_tokens, a.num_experts);
  if (a.num_tokens == 0) return;
  if (a.config.implementation == Implementation::Portable)
    PortableRouter<ExecSpace>::topk_forward(exec, a);
  else
    RouterImpl<ExecSpace>::topk_forward(exec, a);
}

template <class ExecSpace>
void run_topk_backward(const ExecSpace& exec, const TopkBackwardArgs& a) {
  if (a.num_tokens == 0) return;
  if (a.config.implementation == Implementation::Portable)
    PortableRouter<ExecSpace>::topk_backward(exec, a);
  else
    RouterImpl<ExecSpace>::topk_backward(exec, a);
}

}  // namespace Impl
}  // namespace KokkosMoE

#endif
