/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTER_SPEC_HPP
#define KOKKOSMOE_ROUTER_SPEC_HPP

// Dispatch layer between the public entry points and the implementations (docs/conventions.md §4).
//
// `TopkSpec<ExecSpace>` (top-k router) and `AuxSpec<ExecSpace>` (aux loss) are primary templates whose generic
// specialization is the portable Kokkos implementation (reference and fallback on every backend);
// cuda/KokkosMoE_Router_CudaSpec.hpp specializes both for Kokkos::Cuda with the native kernels. `PortableTopk` and
// `PortableAux` stay callable directly (Implementation::Portable) for tests and benchmarks.

#include <KokkosMoE_RouterConfig.hpp>

#include <Kokkos_Core.hpp>

#include <impl/KokkosMoE_Router_ETI.hpp>  // extern template declarations (KOKKOSMOE_ENABLE_ETI)
#include <impl/KokkosMoE_Router_KernelChoice.hpp>
#include <impl/KokkosMoE_Router_Operands.hpp>
#include <impl/KokkosMoE_Router_Portable.hpp>
#include <impl/KokkosMoE_Router_PortableTopk.hpp>
#include <impl/KokkosMoE_Router_Validate.hpp>

namespace KokkosMoE {
namespace Impl {

/// Top-k router operations: the generic specialization is the portable path; a vendor specialization
/// (cuda/KokkosMoE_Router_CudaSpec.hpp) replaces it where one exists. Operands are the canonical typed Views of
/// impl/KokkosMoE_Router_Operands.hpp; the config is passed along for specializations that need its raw fields, and
/// the kernel choice (impl/KokkosMoE_Router_KernelChoice.hpp) picks among kernels that give the same bits.
template <class ExecSpace>
struct TopkSpec {
  static constexpr bool is_specialized = false;
  template <class Ops>
  static void forward(const ExecSpace& exec, const RouterConfig&, const Ops& o, const KernelChoice& choice = {}) {
    PortableTopk<ExecSpace>::forward(exec, o, choice);
  }
  template <class Ops>
  static void backward(const ExecSpace& exec, const RouterConfig&, const Ops& o, const KernelChoice& choice = {}) {
    PortableTopk<ExecSpace>::backward(exec, o, choice);
  }
  template <class Ops>
  static void compact_backward(const ExecSpace& exec, const RouterConfig&, const Ops& o,
                               const KernelChoice& choice = {}) {
    PortableTopk<ExecSpace>::compact_backward(exec, o, choice);
  }
};

/// Aux-loss operations: the same pattern over the canonical typed operands of impl/KokkosMoE_Router_Operands.hpp.
template <class ExecSpace>
struct AuxSpec {
  static constexpr bool is_specialized = false;
  template <class Ops>
  static void aux_scores_forward(const ExecSpace& exec, const Ops& o, const KernelChoice& = {}) {
    PortableAux<ExecSpace>::aux_scores_forward(exec, o);
  }
  template <class Ops>
  static void aux_scores_backward(const ExecSpace& exec, const Ops& o) {
    PortableAux<ExecSpace>::aux_scores_backward(exec, o);
  }
  template <class Ops>
  static void aux_loss_forward(const ExecSpace& exec, const Ops& o) {
    PortableAux<ExecSpace>::aux_loss_forward(exec, o);
  }
  template <class Ops>
  static void aux_loss_backward(const ExecSpace& exec, const Ops& o) {
    PortableAux<ExecSpace>::aux_loss_backward(exec, o);
  }
};

}  // namespace Impl
}  // namespace KokkosMoE

#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda/KokkosMoE_Router_CudaSpec.hpp>
#endif

namespace KokkosMoE {
namespace Impl {

/// An empty bias View of the logits' memory space (the "no bias" argument).
template <class LogitsView>
Kokkos::View<const float*, typename LogitsView::memory_space> no_bias() {
  return {};
}

/// Validates logits, bias and config of a forward call and fills the common part of the canonical operands.
template <class Ops, class ExecSpace, class LogitsView, class BiasView>
Ops lower_topk_forward(const char* fn, const RouterConfig& config, const LogitsView& logits, const BiasView& bias) {
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
  Ops o;
  o.params = token_params(config, static_cast<int>(E), has_bias);
  o.num_tokens = T;
  o.logits = canonical2<decltype(o.logits)>(logits);
  if (has_bias) o.bias = canonical1<decltype(o.bias)>(bias);
  return o;
}

/// Validates intermediate, grad_probs, grad_logits and the config of a map/indices backward call.
template <class Ops, class ExecSpace, class InterView, class GradProbsView, class GradLogitsView>
Ops lower_topk_backward(const char* fn, const RouterConfig& config, const InterView& intermediate,
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
  Ops o;
  o.params = token_params(config, static_cast<int>(E), false);
  o.num_tokens = T;
  o.inter = canonical2<decltype(o.inter)>(intermediate);
  o.grad_probs = canonical2<decltype(o.grad_probs)>(grad_probs);
  o.grad_logits = canonical2<decltype(o.grad_logits)>(grad_logits);
  return o;
}

/// check_finite on a validated, contiguous [rows, cols] View (fences: a debug check).
template <class ExecSpace, class View>
void run_check_finite(const ExecSpace& exec, const char* fn, const char* param, const View& values) {
  using Scalar = typename View::non_const_value_type;
  using Canonical = typename CanonicalViews<ExecSpace>::template In2<Scalar>;
  const Canonical v = canonical2<Canonical>(values);
  const std::int64_t first = PortableChecks<ExecSpace>::first_non_finite(exec, v);
  if (first >= 0) {
    const std::int64_t cols = static_cast<std::int64_t>(v.extent(1));
    throw NonFiniteInput(fn, param, first / cols, first % cols, PortableChecks<ExecSpace>::read_one(exec, v, first));
  }
}

/// The operation on validated operands: the portable kernels for Implementation::Portable, else the spec. The public
/// entry points pass the default choice; the unit tests pass others.
template <class ExecSpace, class Ops, class LogitsView>
void run_topk_forward(const char* fn, const ExecSpace& exec, const RouterConfig& config, const Ops& o,
                      const LogitsView& logits, const KernelChoice& choice = {}) {
  if (config.check_finite) run_check_finite(exec, fn, "logits", logits);
  if (o.num_tokens == 0) return;
  if (config.implementation == Implementation::Portable)
    PortableTopk<ExecSpace>::forward(exec, o, choice);
  else
    TopkSpec<ExecSpace>::forward(exec, config, o, choice);
}

template <class ExecSpace, class Ops>
void run_topk_backward(const ExecSpace& exec, const RouterConfig& config, const Ops& o,
                       const KernelChoice& choice = {}) {
  if (o.num_tokens == 0) return;
  if (config.implementation == Implementation::Portable)
    PortableTopk<ExecSpace>::backward(exec, o, choice);
  else
    TopkSpec<ExecSpace>::backward(exec, config, o, choice);
}

template <class ExecSpace, class Ops>
void run_compact_backward(const ExecSpace& exec, const RouterConfig& config, const Ops& o,
                          const KernelChoice& choice = {}) {
  if (o.num_tokens == 0) return;
  if (config.implementation == Implementation::Portable)
    PortableTopk<ExecSpace>::compact_backward(exec, o, choice);
  else
    TopkSpec<ExecSpace>::compact_backward(exec, config, o, choice);
}

}  // namespace Impl
}  // namespace KokkosMoE

#endif
