/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTER_CUDASPEC_HPP
#define KOKKOSMOE_ROUTER_CUDASPEC_HPP

// Kokkos::Cuda specializations of the top-k router and aux-loss specs: lower the canonical typed operands to the
// typed argument structs of the native kernels (the only place where the router's Views become pointers) and
// launch them through CudaRouter (cuda/KokkosMoE_Router_Cuda.hpp). Shapes the native kernels do not handle (a
// CudaKernels::ForwardPlan that is not native; a backward whose CudaKernels::handles is false) run the portable path.

#include <Kokkos_Macros.hpp>
#if defined(KOKKOS_ENABLE_CUDA)

#include <Kokkos_Core.hpp>

#include <cuda/KokkosMoE_Router_Cuda.hpp>
#include <impl/KokkosMoE_Router_Operands.hpp>
#include <impl/KokkosMoE_Router_Portable.hpp>
#include <impl/KokkosMoE_Router_PortableTopk.hpp>

namespace KokkosMoE {
namespace Impl {

/// Runs the native operation \p a where its kernels take it (CudaKernels::handles), else \p portable.
template <class Args, class Portable>
void native_or_portable(const Kokkos::Cuda& exec, const char* op, const Args& a, const Portable& portable,
                        const KernelChoice& choice = {}) {
  if (CudaKernels::handles(a))
    CudaRouter::backward(exec, op, a, choice);
  else
    portable();
}

template <>
struct TopkSpec<Kokkos::Cuda> {
  static constexpr bool is_specialized = true;

  static RouterConfig lowered_config(const RouterConfig& config) {
    RouterConfig c = config;
    if (c.group_topk <= 0) c.group_topk = 0;
    return c;
  }

  /// A forward operation's operands (MapForwardOperands, IndicesForwardOperands, CompactForwardOperands) lowered to
  /// the argument struct of the native forward kernels, which the operations share: its output kind tells them which
  /// outputs there are.
  template <class Ops>
  static CudaKernels::TopkForward<typename Ops::scalar_type> forward_args(const RouterConfig& config, const Ops& o) {
    CudaKernels::TopkForward<typename Ops::scalar_type> a;
    a.num_tokens = o.num_tokens;
    a.num_experts = o.params.num_experts;
    a.config = lowered_config(config);
    a.output = o.output();
    a.logits = o.logits.data();
    if (o.params.has_bias) a.bias = CudaKernels::ExpertBias(o.bias.data());
    if constexpr (Ops::op == TopkForwardOp::Compact) {
      a.ids = o.ids.data();
      a.weights = o.weights.data();
    } else {
      a.probs = o.probs.data();
      a.intermediate = o.inter.data();
      if constexpr (Ops::op == TopkForwardOp::Indices)
        a.indices = CudaKernels::IndexOutput(o.indices.data());
      else
        a.routing_map = o.map.data();
    }
    return a;
  }

  template <class Ops>
  static void forward(const Kokkos::Cuda& exec, const RouterConfig& config, const Ops& o,
                      const KernelChoice& choice = {}) {
    forward_with_cutoff(exec, config, o, nullptr, choice);
  }

  /// The forward, asking the native kernel for the QB cutoff [T] too when \p cutoff is not null: true when the
  /// planned kernel wrote it.
  template <class Ops>
  static bool forward_with_cutoff(const Kokkos::Cuda& exec, const RouterConfig& config, const Ops& o, float* cutoff,
                                  const KernelChoice& choice = {}) {
    auto a = forward_args(config, o);
    a.qb_cutoff = cutoff;
    const auto plan = CudaKernels::plan_forward(a, choice);
    if (!plan.native()) {
      PortableTopk<Kokkos::Cuda>::forward(exec, o, choice);
      return false;
    }
    CudaRouter::topk_forward(exec, plan);
    return plan.writes_cutoff();
  }

  /// What the map and the dense-indices backward share, lowered to the native struct A.
  template <class A, class Ops>
  static A backward_args(const RouterConfig& config, const Ops& o) {
    A a;
    a.num_tokens = o.num_tokens;
    a.num_experts = o.params.num_experts;
    a.rule = CudaKernels::BackwardRule::of(config);
    a.intermediate = o.inter.data();
    a.grad_probs = o.grad_probs.data();
    a.grad_logits = o.grad_logits.data();
    return a;
  }

  /// The map and dense-indices backward: the native kernel where it takes the shape (CudaKernels::handles), else
  /// the portable one on the same instance.
  template <class Ops>
  static void backward(const Kokkos::Cuda& exec, const RouterConfig& config, const Ops& o,
                       const KernelChoice& choice = {}) {
    using G = typename Ops::grad_type;
    const auto portable = [&] { PortableTopk<Kokkos::Cuda>::backward(exec, o, choice); };
    if (o.output == RoutingOutput::Indices) {
      auto a = backward_args<CudaKernels::IndicesBackward<G, typename Ops::index_type>>(config, o);
      a.indices = o.indices.data();
      return native_or_portable(exec, "topk_router_backward", a, portable, choice);
    }
    auto a = backward_args<CudaKernels::MapBackward<G>>(config, o);
    a.bitmap = o.output == RoutingOutput::BitmapU8;
    a.routing_map = o.map.data();
    native_or_portable(exec, "topk_router_backward", a, portable, choice);
  }

  template <class Ops>
  static void compact_backward(const Kokkos::Cuda& exec, const RouterConfig& config, const Ops& o,
                               const KernelChoice& choice = {}) {
    CudaKernels::CompactBackward<typename Ops::scalar_type, typename Ops::grad_weights_type> a;
    a.num_tokens = o.num_tokens;
    a.num_experts = o.params.num_experts;
    a.rule = CudaKernels::BackwardRule::of(config);
    a.logits = o.logits.data();
    a.ids = o.ids.data();
    a.grad_weights = o.grad_weights.data();
    a.grad_logits = o.grad_logits.data();
    native_or_portable(
        exec, "topk_router_backward", a, [&] { PortableTopk<Kokkos::Cuda>::compact_backward(exec, o, choice); },
        choice);
  }
};

template <>
struct AuxSpec<Kokkos::Cuda> {
  static constexpr bool is_specialized = true;

  template <class Ops>
  static void aux_scores_forward(const Kokkos::Cuda& exec, const Ops& o, const KernelChoice& choice = {}) {
    CudaKernels::AuxScoresForward<typename Ops::scalar_type> a;
    a.num_tokens = o.num_tokens;
    a.num_experts = o.num_experts;
    a.topk = o.topk;
    a.score_function = o.score_function;
    a.output = o.output;
    a.logits = o.logits.data();
    a.scores = o.scores.data();
    a.routing_map = o.map.data();
    a.intermediate = o.inter.data();
    const auto plan = CudaKernels::plan_forward(a, choice);
    if (!plan.native()) return PortableAux<Kokkos::Cuda>::aux_scores_forward(exec, o);
    CudaRouter::aux_scores_forward(exec, plan);
  }

  template <class Ops>
  static void aux_scores_backward(const Kokkos::Cuda& exec, const Ops& o) {
    CudaKernels::AuxScoresBackward<typename Ops::grad_type> a;
    a.num_tokens = o.num_tokens;
    a.num_experts = o.num_experts;
    a.score_function = o.score_function;
    a.intermediate = o.inter.data();
    a.grad_scores = o.grad_scores.data();
    a.grad_logits = o.grad_logits.data();
    native_or_portable(exec, "aux_scores_backward", a,
                       [&] { PortableAux<Kokkos::Cuda>::aux_scores_backward(exec, o); });
  }

  template <class Ops>
  static void aux_loss_forward(const Kokkos::Cuda& exec, const Ops& o) {
    CudaKernels::AuxLossForward<typename Ops::probs_type, typename Ops::tpe_type> a;
    a.rows = o.rows;
    a.cols = o.cols;
    a.num_experts = o.num_experts;
    a.topk = o.topk;
    a.coeff = o.coeff;
    a.probs = o.probs.data();
    a.tokens_per_expert = o.tokens_per_expert.data();
    a.total_num_tokens = o.total_num_tokens;
    a.total_num_tokens_device = o.total_num_tokens_device.data();
    a.loss = o.loss.data();
    a.const_buf = o.const_buf.data();
    a.workspace = o.workspace.data();
    CudaRouter::aux_loss_forward(exec, a);
  }

  template <class Ops>
  static void aux_loss_backward(const Kokkos::Cuda& exec, const Ops& o) {
    CudaKernels::AuxLossBackward<typename Ops::grad_type, typename Ops::grad_loss_type, typename Ops::tpe_type> a;
    a.rows = o.rows;
    a.cols = o.cols;
    a.const_buf = o.const_buf.data();
    a.tokens_per_expert = o.tokens_per_expert.data();
    a.grad_loss = o.grad_loss.data();
    a.grad_probs = o.grad_probs.data();
    CudaRouter::aux_loss_backward(exec, a);
  }
};

}  // namespace Impl
}  // namespace KokkosMoE

#endif
#endif
