/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_TST_VIRTUAL_MESH_HPP
#define KOKKOSMOE_TST_VIRTUAL_MESH_HPP

// Test support: a virtual mesh that runs a partitioned router operation (partition_router, KokkosMoE_Partition.hpp)
// over every device of a mesh on one host execution space, so that the sharded path is checked against the unsharded
// call without GPUs (docs/router.md §14, docs/planner.md §5). Not part of the library.

#include <KokkosMoE_AuxLoss.hpp>
#include <KokkosMoE_Error.hpp>
#include <KokkosMoE_Mesh.hpp>
#include <KokkosMoE_Partition.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace KokkosMoE::Test {

/// \brief What run_on_virtual_mesh() did.
struct VirtualMeshReport {
  int devices = 0;                        ///< mesh.num_devices()
  int token_shards = 1;                   ///< distinct token shards (devices / replicas)
  std::vector<std::int64_t> device_rows;  ///< local token rows per device
  int replica_mismatches = 0;             ///< replicated outputs that differ bitwise between replicas (must be 0)
};

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
                "run_on_virtual_mesh runs on host-accessible memory");
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
      with_operand(g, d.argument_names[i], [&](auto& v) {
        if constexpr (std::decay_t<decltype(v)>::rank >= 2) T = static_cast<std::int64_t>(v.extent(0));
      });
  for (std::size_t i = 0; i < d.output_names.size() && T < 0; ++i)
    with_operand(g, d.output_names[i], [&](auto& v) {
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
      with_operand(g, name, [&](auto& gv) {
        using V = std::decay_t<decltype(gv)>;
        with_operand(l, name, [&](auto& lv) {
          if constexpr (std::is_same_v<std::decay_t<decltype(lv)>, V>) {
            if constexpr (V::rank == 0) {
              lv = V(tag + name);
              Kokkos::deep_copy(lv, gv);
            } else if (gv.size() == 0 && !tok) {
              lv = V();  // an absent optional argument (no expert bias)
            } else {
              const std::int64_t rows = tok ? e - b : static_cast<std::int64_t>(gv.extent(0));
              lv = like(gv, rows, tag + name);
              if (tok)
                Kokkos::deep_copy(lv, row_slice(gv, b, e));
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
      with_operand(g, name, [&](auto& gv) {
        using V = std::decay_t<decltype(gv)>;
        with_operand(l, name, [&](auto& lv) {
          if constexpr (std::is_same_v<std::decay_t<decltype(lv)>, V>) {
            const std::int64_t rows = V::rank == 0 ? 0 : (tok ? e - b : static_cast<std::int64_t>(gv.extent(0)));
            lv = like(gv, rows, tag + name);
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
    with_operand(g, name, [&](auto& gv) {
      using V = std::decay_t<decltype(gv)>;
      std::vector<int> first_of_shard(nshards, -1);
      for (int dev = 0; dev < ndev; ++dev) {
        V lv;
        with_operand(locals[dev], name, [&](auto& x) {
          if constexpr (std::is_same_v<std::decay_t<decltype(x)>, V>) lv = x;
        });
        const int shard = shard_index(mesh, d.token_axes, dev);
        if (tok) {
          if constexpr (V::rank >= 1) {
            if (first_of_shard[shard] < 0) {
              first_of_shard[shard] = dev;
              const auto [b, e] = shard_range(T, nshards, shard);
              Kokkos::deep_copy(row_slice(gv, b, e), lv);
            } else {
              V ref;
              with_operand(locals[first_of_shard[shard]], name, [&](auto& x) {
                if constexpr (std::is_same_v<std::decay_t<decltype(x)>, V>) ref = x;
              });
              rep.replica_mismatches += bitwise_equal(lv, ref) ? 0 : 1;
            }
          }
        } else if (!partial) {
          if (dev == 0)
            Kokkos::deep_copy(gv, lv);
          else {
            V ref;
            with_operand(locals[0], name, [&](auto& x) {
              if constexpr (std::is_same_v<std::decay_t<decltype(x)>, V>) ref = x;
            });
            rep.replica_mismatches += bitwise_equal(lv, ref) ? 0 : 1;
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
        rep.replica_mismatches += bitwise_equal(locals[dev].const_buf, locals[first_of_shard[s]].const_buf) ? 0 : 1;
    }
    global.const_buf(0) = c0;
    global.const_buf(1) = sum;
    global.loss() = static_cast<Scalar>(sum);
  }
  return rep;
}

}  // namespace KokkosMoE::Test

#endif
