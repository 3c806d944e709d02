/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_PARTITION_HPP
#define KOKKOSMOE_PARTITION_HPP

/// \file KokkosMoE_Partition.hpp
/// \brief Partition rules of the router operations and their shard callables (docs/router.md §13, §14; contract:
/// docs/planner.md §5).
///
/// partition_router() takes a mesh, the operation with its configuration and the input shardings, and returns
/// the required argument shardings, the output shardings (router_sharding_rule) and a type-erased callable that
/// runs the operation on one device's local shard. **The callable owns copies of every configuration value it
/// uses** (routing-map format, score function, top-k, scaling, grouping, the global token count, ...): it stays
/// valid after the mesh, the spec, the shardings and the builder's temporaries are gone (docs/router.md §14).

#include <KokkosMoE_AuxLoss.hpp>
#include <KokkosMoE_Error.hpp>
#include <KokkosMoE_Mesh.hpp>
#include <KokkosMoE_Router.hpp>
#include <KokkosMoE_RouterConfig.hpp>

#include <Kokkos_Core.hpp>

#include <impl/KokkosMoE_Partition_Rules.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace KokkosMoE {

/// \brief The operands of a router operation on one device (or, for a whole-mesh driver, the global tensors).
/// Every field is optional; an operation reads its arguments and writes its outputs (RouterOp lists them).
/// Shapes are the local ones: rows = the device's tokens.
template <class ExecSpace, class Scalar = float>
struct RouterOperands {
  using execution_space = ExecSpace;
  using memory_space = typename ExecSpace::memory_space;
  using scalar_type = Scalar;
  template <class T>
  using Matrix = Kokkos::View<T**, Kokkos::LayoutRight, memory_space>;
  template <class T>
  using Vector = Kokkos::View<T*, Kokkos::LayoutRight, memory_space>;
  template <class T>
  using Value = Kokkos::View<T, Kokkos::LayoutRight, memory_space>;

  Matrix<Scalar> logits;                   ///< [T, E]
  Vector<float> expert_bias;               ///< [E], or empty for none
  Matrix<Scalar> probs;                    ///< [T, E] forward output; aux_loss input [T, C]
  Matrix<std::uint8_t> routing_map;        ///< [T, E] Bytemap or [T, ceil(E/8)] BitmapU8
  Matrix<std::int32_t> indices;            ///< [T, k]
  Matrix<float> intermediate;              ///< [T, E]
  Matrix<std::int32_t> ids;                ///< [T, k] compact
  Matrix<float> weights;                   ///< [T, k] compact
  Matrix<Scalar> grad_probs;               ///< [T, E] router backward input; aux_loss_backward output [T, C]
  Matrix<Scalar> grad_logits;              ///< [T, E]
  Matrix<float> grad_weights;              ///< [T, k] compact backward input
  Matrix<float> scores;                    ///< [T, E] aux_scores output
  Matrix<float> grad_scores;               ///< [T, E] aux_scores_backward input
  Vector<std::int64_t> tokens_per_expert;  ///< [C] global counts
  Value<Scalar> loss;                      ///< aux_loss output
  Vector<float> const_buf;                 ///< [2] {Const, FP32 loss accumulator}
  Value<float> grad_loss;                  ///< aux_loss_backward input
  Vector<float> workspace;                 ///< aux_loss scratch, >= aux_loss_workspace_size(rows, C) floats
};

/// \brief The type-erased shard callable: runs the operation on \p exec over one device's local operands.
/// Enqueues like the underlying operation (no fence) and throws what it throws.
template <class ExecSpace, class Scalar = float>
using ShardFunction = std::function<void(const ExecSpace&, const RouterOperands<ExecSpace, Scalar>&)>;

/// \brief The result of partition_router().
template <class ExecSpace, class Scalar = float>
struct RouterPartition {
  ShardingDecision sharding;                   ///< required argument shardings, output shardings, psum axes
  ShardFunction<ExecSpace, Scalar> run_shard;  ///< owns its configuration (a copy of the RouterOpSpec)
};

namespace Impl {

/// Everything a shard callable uses, by value.
struct ShardConfig {
  RouterOpSpec spec;
};

[[noreturn]] inline void expert_extent_fail(const RouterOpSpec& s, const char* param, std::int64_t local) {
  throw InvalidArgument(
      std::string("partitioned ") + to_string(s.op), param, Rule::ShardingRule,
      std::string(param) + " has " + std::to_string(local) +
          " experts on this shard, but the operation is configured for num_experts = " + std::to_string(s.num_experts) +
          ": the expert axis was split. Keep it whole on every shard (docs/router.md §13)");
}

template <class ExecSpace, class Scalar>
void run_shard(const ExecSpace& exec, const ShardConfig& cfg, const RouterOperands<ExecSpace, Scalar>& o) {
  const RouterOpSpec& s = cfg.spec;
  auto check_e = [&](const char* param, std::int64_t local) {
    if (local != s.num_experts) expert_extent_fail(s, param, local);
  };
  switch (s.op) {
    case RouterOp::Forward:
      check_e("logits", o.logits.extent(1));
      topk_router(exec, s.router, o.logits, o.expert_bias, o.probs, o.routing_map, o.intermediate);
      return;
    case RouterOp::ForwardIndices:
      check_e("logits", o.logits.extent(1));
      topk_router_indices(exec, s.router, o.logits, o.expert_bias, o.probs, o.indices, o.intermediate);
      return;
    case RouterOp::ForwardCompact:
      check_e("logits", o.logits.extent(1));
      topk_router_compact(exec, s.router, o.logits, o.expert_bias, o.ids, o.weights);
      return;
    case RouterOp::Backward:
      check_e("intermediate", o.intermediate.extent(1));
      topk_router_backward(exec, s.router, o.routing_map, o.intermediate, o.grad_probs, o.grad_logits);
      return;
    case RouterOp::BackwardIndices:
      check_e("intermediate", o.intermediate.extent(1));
      topk_router_indices_backward(exec, s.router, o.indices, o.intermediate, o.grad_probs, o.grad_logits);
      return;
    case RouterOp::BackwardCompact:
      check_e("logits", o.logits.extent(1));
      topk_router_compact_backward(exec, s.router, o.logits, o.ids, o.grad_weights, o.grad_logits);
      return;
    case RouterOp::AuxScores:
      check_e("logits", o.logits.extent(1));
      aux_scores(exec, s.aux_scores, o.logits, o.scores, o.routing_map, o.intermediate);
      return;
    case RouterOp::AuxScoresBackward:
      check_e("intermediate", o.intermediate.extent(1));
      aux_scores_backward(exec, s.aux_scores, o.intermediate, o.grad_scores, o.grad_logits);
      return;
    case RouterOp::AuxLoss:
      aux_loss(exec, s.aux_loss, o.probs, o.tokens_per_expert, s.global_num_tokens, o.loss, o.const_buf, o.workspace);
      return;
    case RouterOp::AuxLossBackward:
      aux_loss_backward(exec, s.aux_loss, o.const_buf, o.tokens_per_expert, o.grad_loss, o.grad_probs);
      return;
  }
}

inline bool uses_router_config(RouterOp op) {
  return op != RouterOp::AuxScores && op != RouterOp::AuxScoresBackward && op != RouterOp::AuxLoss &&
         op != RouterOp::AuxLossBackward;
}

// Builds the callable. The configuration is copied into the closure (docs/router.md §14): the callable is stored
// and runs after the caller's spec, mesh and shardings may be gone.
template <class ExecSpace, class Scalar>
ShardFunction<ExecSpace, Scalar> make_shard_function(const RouterOpSpec& spec) {
  ShardConfig cfg{spec};
  return [cfg](const ExecSpace& exec, const RouterOperands<ExecSpace, Scalar>& o) { run_shard(exec, cfg, o); };
}

}  // namespace Impl

/// \brief Partitions a router operation over \p mesh (docs/router.md §13).
///
/// \param mesh    the device mesh
/// \param spec    the operation and its configuration; spec.num_experts (E >= 1) is required for the top-k and
///                aux-score operations (each shard checks that its expert extent is E), spec.global_num_tokens
///                for aux_loss
/// \param inputs  one ShardingSpec per argument, in the operation's argument order (see RouterOp)
/// \returns the sharding decision and the shard callable, which owns a copy of \p spec
/// \throws KokkosMoE::InvalidArgument: Rule::ShardingRule (router_sharding_rule), the router's configuration rules
///         (topk range, grouping, scaling, ...) checked eagerly, Rule::NumExpertsPositive without num_experts
template <class ExecSpace, class Scalar = float>
RouterPartition<ExecSpace, Scalar> partition_router(const Mesh& mesh, const RouterOpSpec& spec,
                                                    const std::vector<ShardingSpec>& inputs) {
  RouterPartition<ExecSpace, Scalar> p;
  p.sharding = router_sharding_rule(mesh, spec, inputs);
  const std::string fn = std::string("partition_router(") + to_string(spec.op) + ")";
  if (spec.op != RouterOp::AuxLoss && spec.op != RouterOp::AuxLossBackward) {
    if (spec.num_experts < 1)
      Impl::fail(fn.c_str(), "num_experts", Rule::NumExpertsPositive,
                 "spec.num_experts (" + std::to_string(spec.num_experts) +
                     ") must be the layer's E (>= 1): every shard checks that its expert axis is whole");
    if (Impl::uses_router_config(spec.op)) {
      Impl::check_router_config(fn.c_str(), spec.router, spec.num_experts, false);
      Impl::check_map_format(fn.c_str(), spec.router.map_format);
    } else {
      Impl::check_score_function(fn.c_str(), spec.aux_scores.score_function);
      Impl::check_map_format(fn.c_str(), spec.aux_scores.map_format);
      Impl::check_topk(fn.c_str(), spec.aux_scores.topk, spec.num_experts);
    }
  } else {
    if (spec.aux_loss.num_experts < 1)
      Impl::fail(fn.c_str(), "aux_loss.num_experts", Rule::NumExpertsPositive,
                 "aux_loss.num_experts (" + std::to_string(spec.aux_loss.num_experts) + ") must be >= 1");
    Impl::check_topk(fn.c_str(), spec.aux_loss.topk, spec.aux_loss.num_experts);
  }
  p.run_shard = Impl::make_shard_function<ExecSpace, Scalar>(spec);
  return p;
}

}  // namespace KokkosMoE

#endif
