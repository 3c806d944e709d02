/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_PARTITION_HPP
#define KOKKOSMOE_PARTITION_HPP

/// \file KokkosMoE_Partition.hpp
/// \brief Partition rules of the router operations and their shard callables (docs/router.md §13, §14; contract:
/// docs/planner.md §5), plus a virtual mesh that runs a partitioned operation over N shards of one host backend.
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
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace KokkosMoE {

/// \brief The operands of a router operation on one device (or, for run_on_virtual_mesh, the global tensors).
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

// Builds the callable. The configuration is copied into the closure (docs/router.md §14). The negative control of
// §14 compiles this header with KOKKOSMOE_IMPL_TEST_DANGLING_PARTITION_CAPTURE, which reintroduces the seed's bug
// (the closure refers to this function's local copy, dead once it returns); only the test tstPartitionDeferred's
// dangling build defines it, and AddressSanitizer must report it.
template <class ExecSpace, class Scalar>
ShardFunction<ExecSpace, Scalar> make_shard_function(const RouterOpSpec& spec) {
  ShardConfig cfg{spec};
#if defined(KOKKOSMOE_IMPL_TEST_DANGLING_PARTITION_CAPTURE)
  return [&cfg](const ExecSpace& exec, const RouterOperands<ExecSpace, Scalar>& o) { run_shard(exec, cfg, o); };
#else
  return [cfg](const ExecSpace& exec, const RouterOperands<ExecSpace, Scalar>& o) { run_shard(exec, cfg, o); };
#endif
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

/// \brief What run_on_virtual_mesh() did.
struct VirtualMeshReport {
  int devices = 0;                        ///< mesh.num_devices()
  int token_shards = 1;                   ///< distinct token shards (devices / replicas)
  std::vector<std::int64_t> device_rows;  ///< local token rows per device
  int replica_mismatches = 0;             ///< replicated outputs that differ bitwise between replicas (must be 0)
};

namespace Impl {

// Calls f(view) on the operand called `name` (names of router_sharding_rule).
template <class Ops, class F>
void with_operand(Ops& o, const std::string& name, F&& f) {
  if (name == "logits") return f(o.logits);
  if (name == "expert_bias") return f(o.expert_bias);
  if (name == "probs") return f(o.probs);
  if (name == "routing_map") return f(o.routing_map);
  if (name == "indices") return f(o.indices);
  if (name == "intermediate") return f(o.intermediate);
  if (name == "ids") return f(o.ids);
  if (name == "weights") return f(o.weights);
  if (name == "grad_probs") return f(o.grad_probs);
  if (name == "grad_logits") return f(o.grad_logits);
  if (name == "grad_weights") return f(o.grad_weights);
  if (name == "scores") return f(o.scores);
  if (name == "grad_scores") return f(o.grad_scores);
  if (name == "tokens_per_expert") return f(o.tokens_per_expert);
  if (name == "loss") return f(o.loss);
  if (name == "const_buf") return f(o.const_buf);
  if (name == "grad_loss") return f(o.grad_loss);
  throw InvalidArgument("run_on_virtual_mesh", name, Rule::ConfigValue, "unknown operand " + name);
}

// A fresh View shaped like `v` but with `rows` rows (rank >= 1) in the same memory space.
template <class V>
V like(const V& v, std::int64_t rows, const std::string& label) {
  if constexpr (V::rank == 0) {
    (void)rows;
    return V(label);
  } else if constexpr (V::rank == 1) {
    return V(label, rows);
  } else {
    return V(label, rows, v.extent(1));
  }
}

template <class V>
auto row_slice(const V& v, std::int64_t b, std::int64_t e) {
  if constexpr (V::rank == 1)
    return Kokkos::subview(v, Kokkos::make_pair(b, e));
  else
    return Kokkos::subview(v, Kokkos::make_pair(b, e), Kokkos::ALL);
}

template <class V>
bool bitwise_equal(const V& a, const V& b) {
  if (a.span() != b.span()) return false;
  return a.span() == 0 || std::memcmp(a.data(), b.data(), a.span() * sizeof(typename V::value_type)) == 0;
}

}  // namespace Impl

/// \brief Runs a partitioned operation over every device of \p mesh on one host execution space and reassembles
/// the global outputs into \p global.
///
/// Per device: token-bearing arguments are cut into its row block (ShardingDecision::arguments, shard_range of
/// the token axes) and copied into device-private buffers, other arguments are copied whole; outputs get private
/// buffers; aux_loss gets a private workspace. The shard callable runs; then token-split outputs are written back
/// by token shard (replicas, e.g. along "tp", are compared bitwise with the first one), replicated outputs are taken
/// from device 0 (others compared bitwise) and partial outputs are summed over the psum axes in shard order: the
/// FP32 loss accumulators const_buf[1] are summed and `loss` is that sum rounded once to the loss type;
/// const_buf[0] (Const) must agree on every shard. Fences \p exec. Host-accessible memory only.
/// \throws what the shard callable throws; InvalidArgument (Rule::ShapeMismatch) if a global operand is missing
template <class ExecSpace, class Scalar>
VirtualMeshReport run_on_virtual_mesh(const ExecSpace& exec, const Mesh& mesh,
                                      const RouterPartition<ExecSpace, Scalar>& part,
                                      const RouterOperands<ExecSpace, Scalar>& global) {
  using Ops = RouterOperands<ExecSpace, Scalar>;
  static_assert(Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename Ops::memory_space>::accessible,
                "KokkosMoE::run_on_virtual_mesh runs on host-accessible memory");
  const ShardingDecision& d = part.sharding;
  const int ndev = mesh.num_devices();
  const int nshards = num_shards(mesh, d.token_axes);
  VirtualMeshReport rep;
  rep.devices = ndev;
  rep.token_shards = nshards;
  auto is_token = [](const ShardingSpec& s) { return s.rank() > 0 && !s.dims[0].empty(); };
  // The global row count: from the first token-bearing argument (or output, for aux_loss_backward).
  std::int64_t T = -1;
  const Ops& g = global;  // Views are handles: writing elements through a const View is allowed
  for (std::size_t i = 0; i < d.argument_names.size() && T < 0; ++i)
    if (d.arguments[i].rank() > 0)
      Impl::with_operand(g, d.argument_names[i], [&](auto& v) {
        if constexpr (std::decay_t<decltype(v)>::rank >= 2) T = static_cast<std::int64_t>(v.extent(0));
      });
  for (std::size_t i = 0; i < d.output_names.size() && T < 0; ++i)
    Impl::with_operand(g, d.output_names[i], [&](auto& v) {
      if constexpr (std::decay_t<decltype(v)>::rank >= 2) T = static_cast<std::int64_t>(v.extent(0));
    });
  if (T < 0) T = 0;

  std::vector<Ops> locals(ndev);
  for (int dev = 0; dev < ndev; ++dev) {
    Ops& l = locals[dev];
    const int shard = shard_index(mesh, d.token_axes, dev);
    const auto [b, e] = shard_range(T, nshards, shard);
    rep.device_rows.push_back(e - b);
    const std::string tag = "device" + std::to_string(dev) + ".";
    for (std::size_t i = 0; i < d.argument_names.size(); ++i) {
      const std::string& name = d.argument_names[i];
      const bool tok = is_token(d.arguments[i]);
      Impl::with_operand(g, name, [&](auto& gv) {
        using V = std::decay_t<decltype(gv)>;
        Impl::with_operand(l, name, [&](auto& lv) {
          if constexpr (std::is_same_v<std::decay_t<decltype(lv)>, V>) {
            if constexpr (V::rank == 0) {
              lv = V(tag + name);
              Kokkos::deep_copy(lv, gv);
            } else if (gv.size() == 0 && !tok) {
              lv = V();  // an absent optional argument (no expert bias)
            } else {
              const std::int64_t rows = tok ? e - b : static_cast<std::int64_t>(gv.extent(0));
              lv = Impl::like(gv, rows, tag + name);
              if (tok)
                Kokkos::deep_copy(lv, Impl::row_slice(gv, b, e));
              else
                Kokkos::deep_copy(lv, gv);
            }
          }
        });
      });
    }
    for (std::size_t i = 0; i < d.output_names.size(); ++i) {
      const std::string& name = d.output_names[i];
      const bool tok = is_token(d.outputs[i]);
      Impl::with_operand(g, name, [&](auto& gv) {
        using V = std::decay_t<decltype(gv)>;
        Impl::with_operand(l, name, [&](auto& lv) {
          if constexpr (std::is_same_v<std::decay_t<decltype(lv)>, V>) {
            const std::int64_t rows = V::rank == 0 ? 0 : (tok ? e - b : static_cast<std::int64_t>(gv.extent(0)));
            lv = Impl::like(gv, rows, tag + name);
          }
        });
      });
    }
    if (d.output_names.size() == 2 && d.output_names[1] == "const_buf") {  // aux_loss
      l.workspace =
          typename Ops::template Vector<float>(tag + "workspace", aux_loss_workspace_size(e - b, l.probs.extent(1)));
    }
    part.run_shard(exec, l);
  }
  exec.fence();

  // Reassemble.
  for (std::size_t i = 0; i < d.output_names.size(); ++i) {
    const std::string& name = d.output_names[i];
    const ShardingSpec& spec = d.outputs[i];
    const bool tok = is_token(spec);
    const bool partial = !spec.partial.empty();
    Impl::with_operand(g, name, [&](auto& gv) {
      using V = std::decay_t<decltype(gv)>;
      std::vector<int> first_of_shard(nshards, -1);
      for (int dev = 0; dev < ndev; ++dev) {
        V lv;
        Impl::with_operand(locals[dev], name, [&](auto& x) {
          if constexpr (std::is_same_v<std::decay_t<decltype(x)>, V>) lv = x;
        });
        const int shard = shard_index(mesh, d.token_axes, dev);
        if (tok) {
          if constexpr (V::rank >= 1) {
            if (first_of_shard[shard] < 0) {
              first_of_shard[shard] = dev;
              const auto [b, e] = shard_range(T, nshards, shard);
              Kokkos::deep_copy(Impl::row_slice(gv, b, e), lv);
            } else {
              V ref;
              Impl::with_operand(locals[first_of_shard[shard]], name, [&](auto& x) {
                if constexpr (std::is_same_v<std::decay_t<decltype(x)>, V>) ref = x;
              });
              rep.replica_mismatches += Impl::bitwise_equal(lv, ref) ? 0 : 1;
            }
          }
        } else if (!partial) {
          if (dev == 0)
            Kokkos::deep_copy(gv, lv);
          else {
            V ref;
            Impl::with_operand(locals[0], name, [&](auto& x) {
              if constexpr (std::is_same_v<std::decay_t<decltype(x)>, V>) ref = x;
            });
            rep.replica_mismatches += Impl::bitwise_equal(lv, ref) ? 0 : 1;
          }
        }
      }
    });
  }
  if (!d.psum_axes.empty()) {
    // Sum the FP32 partials of one replica per token shard, in shard order; Const must agree everywhere.
    std::vector<int> first_of_shard(nshards, -1);
    for (int dev = 0; dev < ndev; ++dev) {
      const int shard = shard_index(mesh, d.token_axes, dev);
      if (first_of_shard[shard] < 0) first_of_shard[shard] = dev;
    }
    float sum = 0.0f;
    const float c0 = locals[first_of_shard[0]].const_buf(0);
    for (int s = 0; s < nshards; ++s) sum += locals[first_of_shard[s]].const_buf(1);
    for (int dev = 0; dev < ndev; ++dev) {
      const float c = locals[dev].const_buf(0);
      rep.replica_mismatches += std::memcmp(&c, &c0, sizeof c) == 0 ? 0 : 1;
      const int s = shard_index(mesh, d.token_axes, dev);
      if (dev != first_of_shard[s])
        rep.replica_mismatches +=
            Impl::bitwise_equal(locals[dev].const_buf, locals[first_of_shard[s]].const_buf) ? 0 : 1;
    }
    global.const_buf(0) = c0;
    global.const_buf(1) = sum;
    global.loss() = static_cast<Scalar>(sum);
  }
  return rep;
}

}  // namespace KokkosMoE

#endif
