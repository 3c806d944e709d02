/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_TST_PARTITION_HELPERS_HPP
#define KOKKOSMOE_TST_PARTITION_HELPERS_HPP

// Shared by tstPartition.cpp (Boost.Test) and tstPartitionDeferred.cpp (the AddressSanitizer executables):
// deterministic operands for every router operation (docs/router.md §16.2: per-row permutations of well-separated
// values plus noise below the separation, so rows are tie-free and select different experts), the eager
// (unsharded) reference through the public API, and bitwise comparison of outputs.

#include <KokkosMoE_AuxLoss.hpp>
#include <KokkosMoE_Partition.hpp>
#include <KokkosMoE_Router.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "tstVirtualMesh.hpp"

namespace KokkosMoE::Test {

/// A named router configuration (score function, grouping, bias, scaling).
struct ScoreCase {
  std::string name;
  RouterConfig router;
  bool bias = false;
};

/// E = 36 (BitmapU8 rows of 5 bytes, the last one partial), k = 4; grouped: 6 groups of 6, top-2 groups.
inline std::vector<ScoreCase> score_cases() {
  std::vector<ScoreCase> v;
  RouterConfig c;
  c.topk = 4;
  c.score_function = ScoreFunction::Sigmoid;
  v.push_back({"sigmoid", c, false});
  c.num_groups = 6;
  c.group_topk = 2;
  c.scaling_factor = 2.5f;
  v.push_back({"sigmoid-grouped-bias", c, true});
  c = RouterConfig{};
  c.topk = 4;
  c.score_function = ScoreFunction::Softmax;
  v.push_back({"softmax-post", c, false});
  c.use_pre_softmax = true;
  v.push_back({"softmax-pre", c, false});
  c = RouterConfig{};
  c.topk = 4;
  c.score_function = ScoreFunction::SqrtSoftplus;
  c.scaling_factor = 1.2f;
  v.push_back({"sqrtsoftplus-bias", c, true});
  return v;
}

inline std::vector<std::string> token_axes_of(const Mesh& mesh) {
  std::vector<std::string> axes;
  for (const auto& a : mesh.axes())
    if (a.kind != AxisKind::Tensor) axes.push_back(a.name);
  return axes;
}

/// Input shardings for \p spec with the token axis split over \p token_axes.
inline std::vector<ShardingSpec> input_shardings(const RouterOpSpec& spec, const std::vector<std::string>& token_axes) {
  std::vector<ShardingSpec> v;
  for (const auto& a : Impl::describe(spec).args) {
    const int rank = static_cast<int>(a.dims.size());
    const bool tok = rank > 0 && a.dims[0] == Impl::DimKind::Token;
    v.push_back(tok ? ShardingSpec::split_dim0(token_axes, rank) : ShardingSpec::replicated(rank));
  }
  return v;
}

template <class V>
void fill_logits(const V& v, std::mt19937& rng, float spread) {
  auto h = Kokkos::create_mirror_view(v);
  const int T = static_cast<int>(v.extent(0)), E = static_cast<int>(v.extent(1));
  std::uniform_real_distribution<float> noise(-0.2f, 0.2f);
  std::vector<int> perm(E);
  for (int t = 0; t < T; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int e = 0; e < E; ++e) h(t, e) = static_cast<typename V::value_type>((perm[e] - E / 2 + noise(rng)) * spread);
  }
  Kokkos::deep_copy(v, h);
}

template <class V>
void fill_uniform(const V& v, std::mt19937& rng, float lo, float hi) {
  auto h = Kokkos::create_mirror_view(v);
  std::uniform_real_distribution<float> d(lo, hi);
  if constexpr (V::rank == 0) {
    h() = static_cast<typename V::value_type>(d(rng));
  } else if constexpr (V::rank == 1) {
    for (std::size_t i = 0; i < v.extent(0); ++i) h(i) = static_cast<typename V::value_type>(d(rng));
  } else {
    for (std::size_t i = 0; i < v.extent(0); ++i)
      for (std::size_t j = 0; j < v.extent(1); ++j) h(i, j) = static_cast<typename V::value_type>(d(rng));
  }
  Kokkos::deep_copy(v, h);
}

/// Runs \p spec eagerly on whole tensors through the public API (the unsharded reference).
template <class Exec, class Scalar>
void run_eager(const Exec& exec, const RouterOpSpec& s, const RouterOperands<Exec, Scalar>& o) {
  switch (s.op) {
    case RouterOp::Forward:
      topk_router(exec, s.router, o.logits, o.expert_bias, o.probs, o.routing_map, o.intermediate);
      break;
    case RouterOp::ForwardIndices:
      topk_router_indices(exec, s.router, o.logits, o.expert_bias, o.probs, o.indices, o.intermediate);
      break;
    case RouterOp::ForwardCompact:
      topk_router_compact(exec, s.router, o.logits, o.expert_bias, o.ids, o.weights);
      break;
    case RouterOp::Backward:
      topk_router_backward(exec, s.router, o.routing_map, o.intermediate, o.grad_probs, o.grad_logits);
      break;
    case RouterOp::BackwardIndices:
      topk_router_indices_backward(exec, s.router, o.indices, o.intermediate, o.grad_probs, o.grad_logits);
      break;
    case RouterOp::BackwardCompact:
      topk_router_compact_backward(exec, s.router, o.logits, o.ids, o.grad_weights, o.grad_logits);
      break;
    case RouterOp::AuxScores:
      aux_scores(exec, s.aux_scores, o.logits, o.scores, o.routing_map, o.intermediate);
      break;
    case RouterOp::AuxScoresBackward:
      aux_scores_backward(exec, s.aux_scores, o.intermediate, o.grad_scores, o.grad_logits);
      break;
    case RouterOp::AuxLoss:
      aux_loss(exec, s.aux_loss, o.probs, o.tokens_per_expert, s.global_num_tokens, o.loss, o.const_buf, o.workspace);
      break;
    case RouterOp::AuxLossBackward:
      aux_loss_backward(exec, s.aux_loss, o.const_buf, o.tokens_per_expert, o.grad_loss, o.grad_probs);
      break;
  }
  exec.fence();
}

/// The forward operation whose outputs a backward operation consumes.
inline RouterOpSpec forward_of(const RouterOpSpec& s) {
  RouterOpSpec f = s;
  switch (s.op) {
    case RouterOp::Backward:
      f.op = RouterOp::Forward;
      break;
    case RouterOp::BackwardIndices:
      f.op = RouterOp::ForwardIndices;
      break;
    case RouterOp::BackwardCompact:
      f.op = RouterOp::ForwardCompact;
      break;
    case RouterOp::AuxScoresBackward:
      f.op = RouterOp::AuxScores;
      break;
    case RouterOp::AuxLossBackward:
      f.op = RouterOp::AuxLoss;
      break;
    default:
      break;
  }
  return f;
}

/// Operands for \p s over T tokens: inputs filled deterministically from \p seed (a backward operation's saved
/// state produced by its forward, eagerly), outputs allocated. E = s.num_experts (aux_loss: C = 2 * E columns).
template <class Exec, class Scalar>
RouterOperands<Exec, Scalar> make_operands(const Exec& exec, const RouterOpSpec& s, int T, unsigned seed, bool bias) {
  using Ops = RouterOperands<Exec, Scalar>;
  std::mt19937 rng(seed);
  Ops o;
  const int E = s.op == RouterOp::AuxLoss || s.op == RouterOp::AuxLossBackward ? s.aux_loss.num_experts : s.num_experts;
  const int k = s.op == RouterOp::AuxScores || s.op == RouterOp::AuxScoresBackward ? s.aux_scores.topk : s.router.topk;
  const bool bitmap = (s.op == RouterOp::AuxScores || s.op == RouterOp::AuxScoresBackward
                           ? s.aux_scores.map_format
                           : s.router.map_format) == RoutingMapFormat::BitmapU8;
  const int map_cols = bitmap ? (E + 7) / 8 : E;
  const bool sigmoid_like = s.router.score_function != ScoreFunction::Softmax;
  o.logits = typename Ops::template Matrix<Scalar>("logits", T, E);
  fill_logits(o.logits, rng, sigmoid_like ? 0.15f : 0.5f);
  if (bias) {
    o.expert_bias = typename Ops::template Vector<float>("bias", E);
    fill_uniform(o.expert_bias, rng, -0.5f, 0.5f);
  }
  o.probs = typename Ops::template Matrix<Scalar>("probs", T, E);
  o.routing_map = typename Ops::template Matrix<std::uint8_t>("routing_map", T, map_cols);
  o.indices = typename Ops::template Matrix<std::int32_t>("indices", T, k);
  o.intermediate = typename Ops::template Matrix<float>("intermediate", T, E);
  o.ids = typename Ops::template Matrix<std::int32_t>("ids", T, k);
  o.weights = typename Ops::template Matrix<float>("weights", T, k);
  o.grad_probs = typename Ops::template Matrix<Scalar>("grad_probs", T, E);
  fill_uniform(o.grad_probs, rng, -1.0f, 1.0f);
  o.grad_logits = typename Ops::template Matrix<Scalar>("grad_logits", T, E);
  o.grad_weights = typename Ops::template Matrix<float>("grad_weights", T, k);
  fill_uniform(o.grad_weights, rng, -1.0f, 1.0f);
  o.scores = typename Ops::template Matrix<float>("scores", T, E);
  o.grad_scores = typename Ops::template Matrix<float>("grad_scores", T, E);
  fill_uniform(o.grad_scores, rng, -1.0f, 1.0f);
  if (s.op == RouterOp::AuxLoss || s.op == RouterOp::AuxLossBackward) {
    const int C = 2 * E;  // two sequences side by side (docs/router.md §11)
    o.probs = typename Ops::template Matrix<Scalar>("aux_probs", T, C);
    fill_uniform(o.probs, rng, 0.0f, 1.0f);
    o.grad_probs = typename Ops::template Matrix<Scalar>("aux_grad_probs", T, C);
    o.tokens_per_expert = typename Ops::template Vector<std::int64_t>("tpe", C);
    auto h = Kokkos::create_mirror_view(o.tokens_per_expert);
    std::uniform_int_distribution<int> d(1, 999);
    for (int c = 0; c < C; ++c) h(c) = d(rng);
    Kokkos::deep_copy(o.tokens_per_expert, h);
    o.loss = typename Ops::template Value<Scalar>("loss");
    o.const_buf = typename Ops::template Vector<float>("const_buf", 2);
    o.grad_loss = typename Ops::template Value<float>("grad_loss");
    fill_uniform(o.grad_loss, rng, 0.5f, 2.0f);
    o.workspace = typename Ops::template Vector<float>("workspace", aux_loss_workspace_size(T, C));
  }
  const RouterOpSpec f = forward_of(s);
  if (f.op != s.op) run_eager(exec, f, o);
  return o;
}

/// A copy of \p o whose outputs for \p s are fresh allocations (inputs shared).
template <class Ops>
Ops with_fresh_outputs(const Ops& base, const RouterOpSpec& s) {
  Ops o = base;
  for (const auto& out : Impl::describe(s).outs)
    with_operand(o, out.name, [&](auto& v) {
      using V = std::decay_t<decltype(v)>;
      if constexpr (V::rank == 0)
        v = V("fresh." + out.name);
      else if constexpr (V::rank == 1)
        v = V("fresh." + out.name, v.extent(0));
      else
        v = V("fresh." + out.name, v.extent(0), v.extent(1));
    });
  if (s.op == RouterOp::AuxLoss) o.workspace = decltype(o.workspace)("fresh.workspace", base.workspace.extent(0));
  return o;
}

/// Names of the outputs of \p s that differ bitwise between \p a and \p b (empty: all equal).
template <class Ops>
std::vector<std::string> differing_outputs(const Ops& a, const Ops& b, const RouterOpSpec& s) {
  std::vector<std::string> diff;
  for (const auto& out : Impl::describe(s).outs) {
    bool same = true;
    with_operand(a, out.name, [&](auto& va) {
      using V = std::decay_t<decltype(va)>;
      with_operand(b, out.name, [&](auto& vb) {
        if constexpr (std::is_same_v<std::decay_t<decltype(vb)>, V>) same = bitwise_equal(va, vb);
      });
    });
    if (!same) diff.push_back(out.name);
  }
  return diff;
}

/// Overwrites freshly allocated heap memory and a deep stack region with a pattern, so that a callable that
/// refers to destroyed state reads garbage instead of the old values (docs/router.md §14).
inline void scribble_memory() {
  for (int i = 0; i < 64; ++i) {
    std::vector<unsigned char> junk(4096 + 64 * i, static_cast<unsigned char>(0xA5 ^ i));
    volatile unsigned char sink = junk[i];
    (void)sink;
  }
  volatile unsigned char stack[65536];
  for (std::size_t i = 0; i < sizeof stack; ++i) stack[i] = static_cast<unsigned char>(0x5A ^ i);
}

/// The op specs of the deferred-callable survival test: every routing output form (Bytemap, BitmapU8, dense
/// indices, compact), forward and backward, the aux-score helper in both formats and the aux loss (psum) with its
/// backward, each with a non-default value of every configuration field the callable uses.
inline std::vector<RouterOpSpec> deferred_specs(int E) {
  std::vector<RouterOpSpec> v;
  RouterOpSpec s;
  s.num_experts = E;
  s.router.topk = 4;
  s.router.score_function = ScoreFunction::Sigmoid;
  s.router.num_groups = 6;
  s.router.group_topk = 2;
  s.router.scaling_factor = 2.5f;
  for (RoutingMapFormat f : {RoutingMapFormat::Bytemap, RoutingMapFormat::BitmapU8}) {
    s.router.map_format = f;
    for (RouterOp op : {RouterOp::Forward, RouterOp::Backward}) {
      s.op = op;
      v.push_back(s);
    }
  }
  s.router.map_format = RoutingMapFormat::Bytemap;
  for (RouterOp op :
       {RouterOp::ForwardIndices, RouterOp::BackwardIndices, RouterOp::ForwardCompact, RouterOp::BackwardCompact}) {
    s.op = op;
    v.push_back(s);
  }
  RouterOpSpec a;
  a.num_experts = E;
  a.aux_scores.topk = 3;
  a.aux_scores.score_function = ScoreFunction::SqrtSoftplus;
  for (RoutingMapFormat f : {RoutingMapFormat::Bytemap, RoutingMapFormat::BitmapU8}) {
    a.aux_scores.map_format = f;
    for (RouterOp op : {RouterOp::AuxScores, RouterOp::AuxScoresBackward}) {
      a.op = op;
      v.push_back(a);
    }
  }
  RouterOpSpec l;
  l.aux_loss.num_experts = E;
  l.aux_loss.topk = 4;
  l.aux_loss.coeff = 0.01f;
  l.aux_loss_mode = AuxLossMode::PartialSum;
  for (RouterOp op : {RouterOp::AuxLoss, RouterOp::AuxLossBackward}) {
    l.op = op;
    v.push_back(l);
  }
  return v;
}

/// The eager reference of \p s on a token-split mesh: what an unsharded run gives, except for the psum aux loss,
/// whose reference is the per-shard eager partials (global T_total) summed in shard order.
template <class Exec, class Scalar>
RouterOperands<Exec, Scalar> eager_reference(const Exec& exec, const RouterOpSpec& s,
                                             const RouterOperands<Exec, Scalar>& ops, int shards) {
  auto ref = with_fresh_outputs(ops, s);
  if (s.op != RouterOp::AuxLoss || shards == 1 || s.aux_loss_mode == AuxLossMode::GatherInputs) {
    run_eager(exec, s, ref);
    return ref;
  }
  const std::int64_t T = ops.probs.extent(0), C = ops.probs.extent(1);
  float sum = 0.0f, c0 = 0.0f;
  for (int i = 0; i < shards; ++i) {
    const auto [b, e] = shard_range(T, shards, i);
    auto part = with_fresh_outputs(ops, s);
    part.probs = decltype(part.probs)("part.probs", e - b, C);
    Kokkos::deep_copy(part.probs, Kokkos::subview(ops.probs, Kokkos::make_pair(b, e), Kokkos::ALL));
    part.workspace = decltype(part.workspace)("part.workspace", aux_loss_workspace_size(e - b, C));
    run_eager(exec, s, part);
    if (i == 0) c0 = part.const_buf(0);
    sum += part.const_buf(1);
  }
  ref.const_buf(0) = c0;
  ref.const_buf(1) = sum;
  ref.loss() = static_cast<Scalar>(sum);
  return ref;
}

#if defined(KOKKOSMOE_TEST_DANGLING_PARTITION_CAPTURE)
/// The negative control of docs/router.md §14: the shard callable built the wrong way, capturing this function's
/// local copy of the configuration by reference (the reference's historical bug). The copy dies when the function
/// returns, so the callable reads a dead stack frame and AddressSanitizer (detect_stack_use_after_return=1) must
/// report it. Only the KokkosMoE_PartitionDeferred_Dangling build defines the macro; the library has no such path.
template <class Exec, class Scalar>
[[gnu::noinline]] ShardFunction<Exec, Scalar> dangling_shard_function(const RouterOpSpec& spec) {
  Impl::ShardConfig cfg{spec};
  return [&cfg](const Exec& exec, const RouterOperands<Exec, Scalar>& o) { Impl::run_shard(exec, cfg, o); };
}
#endif

/// The survival test of docs/router.md §14 for one operation: the partition (mesh, spec, shardings, builder
/// temporaries) is built in a scope whose objects are overwritten and destroyed, memory is scribbled over, then the
/// stored callable runs on two logical shards and must match the eager result bitwise. Returns "" or what failed.
template <class Exec, class Scalar>
std::string deferred_survival(const Exec& exec, RouterOpSpec spec, int T, unsigned seed) {
  spec.global_num_tokens = T;
  spec.output_token_axes = {"dp"};
  const auto ops = make_operands<Exec, Scalar>(exec, spec, T, seed, false);
  const auto ref = eager_reference(exec, spec, ops, 2);
  RouterPartition<Exec, Scalar> part;
  {
    auto mesh = std::make_unique<Mesh>(Mesh::parse("dp2"));
    auto sp = std::make_unique<RouterOpSpec>(spec);
    auto in = std::make_unique<std::vector<ShardingSpec>>(input_shardings(*sp, {"dp"}));
    part = partition_router<Exec, Scalar>(*mesh, *sp, *in);
#if defined(KOKKOSMOE_TEST_DANGLING_PARTITION_CAPTURE)
    part.run_shard = dangling_shard_function<Exec, Scalar>(*sp);
#endif
    // Overwrite every source before destroying it: a callable that still refers to any of them would see these.
    sp->router.map_format =
        sp->router.map_format == RoutingMapFormat::Bytemap ? RoutingMapFormat::BitmapU8 : RoutingMapFormat::Bytemap;
    sp->router.topk = sp->aux_scores.topk = sp->aux_loss.topk = 1;
    sp->router.score_function = sp->aux_scores.score_function = ScoreFunction::Softmax;
    sp->router.scaling_factor = -7.0f;
    sp->global_num_tokens = 1;
    *mesh = Mesh::parse("tp3");
    in->clear();
  }
  scribble_memory();
  auto got = with_fresh_outputs(ops, spec);
  const VirtualMeshReport rep = run_on_virtual_mesh(exec, Mesh::parse("dp2"), part, got);
  std::string err;
  for (const auto& name : differing_outputs(ref, got, spec)) err += " " + name;
  if (rep.replica_mismatches != 0) err += " (replica mismatches: " + std::to_string(rep.replica_mismatches) + ")";
  return err.empty() ? err : std::string(to_string(spec.op)) + ": outputs differ from eager:" + err;
}

}  // namespace KokkosMoE::Test

#endif
