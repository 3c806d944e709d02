/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// Router partition rules (docs/router.md §13), virtual-mesh execution (sharded == unsharded, bitwise), the deferred
// callable survival test of docs/router.md §14 (its AddressSanitizer variant and negative control are the separate
// executables of tstPartitionDeferred.cpp), and the planner's routing models against the real router.

#include <KokkosMoE_EnableDeviceTypes.hpp>
#include <KokkosMoE_Partition.hpp>
#include <KokkosMoE_Planner.hpp>

#include <Kokkos_Core.hpp>

#include <boost/test/unit_test.hpp>

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "tstPartitionHelpers.hpp"

// Virtual-mesh execution runs the shards on host backends, so these cases take the
// host-accessible entries of KOKKOSMOE_DEVICE_TYPES only.
template <class Tuple>
struct KokkosMoEHostDevices;
template <class... Ds>
struct KokkosMoEHostDevices<std::tuple<Ds...>> {
  using type = decltype(std::tuple_cat(
      std::declval<
          std::conditional_t<Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename Ds::memory_space>::accessible,
                             std::tuple<Ds>, std::tuple<>>>()...));
};
using KOKKOSMOE_HOST_DEVICE_TYPES = typename KokkosMoEHostDevices<KOKKOSMOE_DEVICE_TYPES>::type;

namespace tt = boost::test_tools;
using namespace KokkosMoE;
using namespace KokkosMoE::Test;

namespace {

constexpr int kE = 36;  // BitmapU8 rows of 5 bytes, the last one partial
constexpr int kT = 37;  // not a multiple of the shard counts: uneven row blocks

const std::vector<std::string> kMeshes = {"dp2", "ep2", "dp2xep2", "dp2xfsdp2xtp2"};

template <class F>
void check_rule(F&& f, Rule rule, const std::string& param, const std::string& needle) {
  try {
    f();
    BOOST_ERROR("expected InvalidArgument with rule " << rule_name(rule));
  } catch (const InvalidArgument& e) {
    BOOST_TEST(rule_name(e.rule()) == rule_name(rule));
    BOOST_TEST(e.parameter() == param);
    BOOST_TEST(std::string(e.what()).find(needle) != std::string::npos, "message: " << e.what());
  }
}

RouterOpSpec forward_spec(RoutingMapFormat f = RoutingMapFormat::Bytemap) {
  RouterOpSpec s;
  s.op = RouterOp::Forward;
  s.num_experts = kE;
  s.router.topk = 4;
  s.router.map_format = f;
  return s;
}

// Runs `s` on every mesh and compares with the eager result: outputs bitwise, no replica mismatch, row blocks.
template <class Exec, class Scalar>
void check_sharded_equals_unsharded(const RouterOpSpec& s_in, bool bias, unsigned seed) {
  Exec exec;
  for (const std::string& m : kMeshes) {
    const Mesh mesh = Mesh::parse(m);
    const auto axes = token_axes_of(mesh);
    RouterOpSpec s = s_in;
    s.global_num_tokens = kT;
    s.output_token_axes = axes;
    const auto ops = make_operands<Exec, Scalar>(exec, s, kT, seed, bias);
    const bool gathered = s.op == RouterOp::AuxLoss && s.aux_loss_mode == AuxLossMode::GatherInputs;
    const int shards = gathered ? 1 : num_shards(mesh, axes);
    const auto ref = eager_reference(exec, s, ops, shards);
    const auto part = partition_router<Exec, Scalar>(mesh, s, input_shardings(s, axes));
    BOOST_TEST(part.sharding.token_axes == (gathered ? std::vector<std::string>{} : axes), tt::per_element());
    auto got = with_fresh_outputs(ops, s);
    const VirtualMeshReport rep = run_on_virtual_mesh(exec, mesh, part, got);
    BOOST_TEST_CONTEXT(to_string(s.op) << " on " << m) {
      BOOST_TEST(rep.devices == mesh.num_devices());
      BOOST_TEST(rep.token_shards == shards);
      BOOST_TEST(rep.replica_mismatches == 0);
      std::int64_t rows = 0;
      for (int d = 0; d < rep.devices; ++d) rows += rep.device_rows[d];
      BOOST_TEST(rows == std::int64_t(kT) * rep.devices / shards);  // every token once per replica
      const auto diff = differing_outputs(ref, got, s);
      BOOST_TEST(diff.empty(), "outputs that differ from eager: " << (diff.empty() ? "" : diff.front()));
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(partition_rules)

BOOST_AUTO_TEST_CASE(token_axis_splits_expert_axis_whole) {
  const Mesh mesh = Mesh::parse("dp2xep2");
  const auto d = router_sharding_rule(mesh, forward_spec(),
                                      {ShardingSpec::split_dim0({"dp", "ep"}, 2), ShardingSpec::replicated(1)});
  BOOST_TEST(d.token_axes == (std::vector<std::string>{"dp", "ep"}), tt::per_element());
  BOOST_TEST(d.output_names == (std::vector<std::string>{"probs", "routing_map", "intermediate"}), tt::per_element());
  for (const auto& o : d.outputs) BOOST_TEST(o.str() == "P(('dp', 'ep'), None)");
  BOOST_TEST(d.psum_axes.empty());
  BOOST_TEST(d.resharded.empty());
  BOOST_TEST(d.explanation.find("4 shards") != std::string::npos, d.explanation);
}

BOOST_AUTO_TEST_CASE(expert_axis_split_is_rejected_with_an_explanation) {
  const Mesh mesh = Mesh::parse("dp2xep2");
  ShardingSpec bad = ShardingSpec::split_dim0({"dp"}, 2);
  bad.dims[1] = {"ep"};
  check_rule(
      [&] {
        router_sharding_rule(mesh, forward_spec(), {bad, ShardingSpec::replicated(1)});
      },
      Rule::ShardingRule, "logits", "need all E experts of a row");
  ShardingSpec bias{{{"ep"}}, {}};
  check_rule(
      [&] {
        router_sharding_rule(mesh, forward_spec(), {ShardingSpec::split_dim0({"dp"}, 2), bias});
      },
      Rule::ShardingRule, "expert_bias", "expert axis of expert_bias");
  // the shard callable itself refuses a shard whose expert extent is not E (the §13 wrapper check)
  const auto part = partition_router<Kokkos::DefaultHostExecutionSpace>(
      mesh, forward_spec(), {ShardingSpec::split_dim0({"dp"}, 2), ShardingSpec::replicated(1)});
  RouterOperands<Kokkos::DefaultHostExecutionSpace> o;
  o.logits = decltype(o.logits)("logits", 4, kE / 2);
  o.probs = decltype(o.probs)("probs", 4, kE / 2);
  o.routing_map = decltype(o.routing_map)("map", 4, kE / 2);
  o.intermediate = decltype(o.intermediate)("inter", 4, kE / 2);
  check_rule([&] { part.run_shard(Kokkos::DefaultHostExecutionSpace{}, o); }, Rule::ShardingRule, "logits",
             "the expert axis was split");
}

BOOST_AUTO_TEST_CASE(bitmap_bytes_replicated_tokens_not_over_tp) {
  const Mesh mesh = Mesh::parse("dp2xtp2");
  RouterOpSpec b = forward_spec(RoutingMapFormat::BitmapU8);
  b.op = RouterOp::Backward;
  ShardingSpec map = ShardingSpec::split_dim0({"dp"}, 2);
  map.dims[1] = {"tp"};
  const ShardingSpec rows = ShardingSpec::split_dim0({"dp"}, 2);
  check_rule(
      [&] {
        router_sharding_rule(mesh, b, {map, rows, rows});
      },
      Rule::ShardingRule, "routing_map", "packed byte axis of the BitmapU8 routing_map");
  check_rule(
      [&] {
        router_sharding_rule(mesh, forward_spec(),
                             {ShardingSpec::split_dim0({"dp", "tp"}, 2), ShardingSpec::replicated(1)});
      },
      Rule::ShardingRule, "logits", "tensor-parallel ranks hold the same tokens");
  // BitmapU8 with tokens over dp: outputs replicated along tp, bytes replicated
  const auto d =
      router_sharding_rule(mesh, forward_spec(RoutingMapFormat::BitmapU8), {rows, ShardingSpec::replicated(1)});
  BOOST_TEST(d.outputs[1].str() == "P('dp', None)");
  BOOST_TEST(d.explanation.find("replicated along 'tp'") != std::string::npos, d.explanation);
  BOOST_TEST(d.explanation.find("BitmapU8 bytes replicated") != std::string::npos, d.explanation);
}

BOOST_AUTO_TEST_CASE(malformed_shardings_are_rejected) {
  const Mesh mesh = Mesh::parse("dp2xep2");
  check_rule([&] { router_sharding_rule(mesh, forward_spec(), {ShardingSpec::split_dim0({"dp"}, 2)}); },
             Rule::ShardingRule, "inputs", "takes 2 arguments (logits, expert_bias)");
  check_rule(
      [&] {
        router_sharding_rule(mesh, forward_spec(), {ShardingSpec::split_dim0({"xp"}, 2), ShardingSpec::replicated(1)});
      },
      Rule::ShardingRule, "logits", "'xp', which is not an axis of the mesh");
  check_rule(
      [&] {
        router_sharding_rule(mesh, forward_spec(),
                             {ShardingSpec::split_dim0({"dp", "dp"}, 2), ShardingSpec::replicated(1)});
      },
      Rule::ShardingRule, "logits", "uses mesh axis 'dp' twice");
  check_rule(
      [&] {
        router_sharding_rule(mesh, forward_spec(), {ShardingSpec::replicated(3), ShardingSpec::replicated(1)});
      },
      Rule::ShardingRule, "logits", "has rank 2");
  ShardingSpec partial = ShardingSpec::split_dim0({"dp"}, 2);
  partial.partial = {"ep"};
  check_rule(
      [&] {
        router_sharding_rule(mesh, forward_spec(), {partial, ShardingSpec::replicated(1)});
      },
      Rule::ShardingRule, "logits", "reduce (psum) it");
  check_rule([] { Mesh::parse("dp2xdp2"); }, Rule::ConfigValue, "axes", "appears twice");
  check_rule([] { Mesh::parse("dp"); }, Rule::ConfigValue, "text", "is not <name><size>");
}

BOOST_AUTO_TEST_CASE(mismatched_token_splits_are_resharded) {
  const Mesh mesh = Mesh::parse("dp2xep2");
  RouterOpSpec b = forward_spec();
  b.op = RouterOp::Backward;
  const auto d = router_sharding_rule(
      mesh, b,
      {ShardingSpec::split_dim0({"dp", "ep"}, 2), ShardingSpec::split_dim0({"dp"}, 2), ShardingSpec::replicated(2)});
  BOOST_TEST(d.resharded == (std::vector<std::string>{"intermediate", "grad_probs"}), tt::per_element());
  for (const auto& a : d.arguments) BOOST_TEST(a.str() == "P(('dp', 'ep'), None)");
}

BOOST_AUTO_TEST_CASE(aux_loss_global_or_psum_with_global_count) {
  const Mesh mesh = Mesh::parse("dp2xep2");
  RouterOpSpec s;
  s.op = RouterOp::AuxLoss;
  s.aux_loss.num_experts = kE;
  s.aux_loss.topk = 4;
  const ShardingSpec rows = ShardingSpec::split_dim0({"dp", "ep"}, 2);
  check_rule(
      [&] {
        router_sharding_rule(mesh, s, {rows, ShardingSpec::replicated(1)});
      },
      Rule::TotalTokensPositive, "global_num_tokens", "local row count of a token shard is wrong");
  s.global_num_tokens = 4096;
  auto d = router_sharding_rule(mesh, s, {rows, ShardingSpec::replicated(1)});
  BOOST_TEST(d.psum_axes == (std::vector<std::string>{"dp", "ep"}), tt::per_element());
  BOOST_TEST(d.outputs[0].str() == "P() partial('dp', 'ep')");
  BOOST_TEST(d.explanation.find("global T_total = 4096") != std::string::npos, d.explanation);
  ShardingSpec cols = ShardingSpec::replicated(1);
  cols.dims[0] = {"ep"};
  check_rule(
      [&] {
        router_sharding_rule(mesh, s, {rows, cols});
      },
      Rule::ShardingRule, "tokens_per_expert", "keep it whole");
  s.aux_loss_mode = AuxLossMode::GatherInputs;
  d = router_sharding_rule(mesh, s, {rows, ShardingSpec::replicated(1)});
  BOOST_TEST(d.psum_axes.empty());
  BOOST_TEST(d.arguments[0].fully_replicated());
  BOOST_TEST(d.resharded == std::vector<std::string>{"probs"}, tt::per_element());
  BOOST_TEST(d.outputs[0].fully_replicated());
  // the backward is shard-local; const_buf may carry the forward's partial marker
  RouterOpSpec b = s;
  b.op = RouterOp::AuxLossBackward;
  b.output_token_axes = {"dp", "ep"};
  ShardingSpec cb = ShardingSpec::replicated(1);
  cb.partial = {"dp", "ep"};
  d = router_sharding_rule(mesh, b, {cb, ShardingSpec::replicated(1), ShardingSpec::replicated(0)});
  BOOST_TEST(d.outputs[0].str() == "P(('dp', 'ep'), None)");
  b.output_token_axes = {"tp"};
  check_rule(
      [&] {
        router_sharding_rule(mesh, b, {cb, ShardingSpec::replicated(1), ShardingSpec::replicated(0)});
      },
      Rule::ShardingRule, "output_token_axes", "not an axis");
}

BOOST_AUTO_TEST_CASE(partition_checks_the_configuration_eagerly) {
  const Mesh mesh = Mesh::parse("dp2");
  const std::vector<ShardingSpec> in = {ShardingSpec::split_dim0({"dp"}, 2), ShardingSpec::replicated(1)};
  RouterOpSpec s = forward_spec();
  s.router.topk = kE + 1;
  check_rule([&] { partition_router<Kokkos::DefaultHostExecutionSpace>(mesh, s, in); }, Rule::TopkRange, "topk",
             "must be in [1, num_experts = 36]");
  s = forward_spec();
  s.num_experts = 0;
  check_rule([&] { partition_router<Kokkos::DefaultHostExecutionSpace>(mesh, s, in); }, Rule::NumExpertsPositive,
             "num_experts", "every shard checks");
  s = forward_spec();
  s.router.num_groups = 5;
  s.router.group_topk = 2;
  check_rule([&] { partition_router<Kokkos::DefaultHostExecutionSpace>(mesh, s, in); }, Rule::GroupDivisibility,
             "num_groups", "");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(partition_virtual_mesh)

BOOST_AUTO_TEST_CASE_TEMPLATE(topk_forward_backward_every_score_function_and_form, DeviceType,
                              KOKKOSMOE_HOST_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  unsigned seed = 11;
  for (const ScoreCase& c : score_cases()) {
    BOOST_TEST_CONTEXT(c.name) {
      for (RoutingMapFormat f : {RoutingMapFormat::Bytemap, RoutingMapFormat::BitmapU8}) {
        RouterOpSpec s = forward_spec(f);
        s.router = c.router;
        s.router.map_format = f;
        s.op = RouterOp::Forward;
        check_sharded_equals_unsharded<Exec, float>(s, c.bias, ++seed);
        s.op = RouterOp::Backward;
        check_sharded_equals_unsharded<Exec, float>(s, c.bias, ++seed);
      }
      RouterOpSpec s = forward_spec();
      s.router = c.router;
      for (RouterOp op :
           {RouterOp::ForwardIndices, RouterOp::BackwardIndices, RouterOp::ForwardCompact, RouterOp::BackwardCompact}) {
        s.op = op;
        check_sharded_equals_unsharded<Exec, float>(s, c.bias, ++seed);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(aux_scores_forward_backward, DeviceType, KOKKOSMOE_HOST_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  unsigned seed = 101;
  for (ScoreFunction fn : {ScoreFunction::Sigmoid, ScoreFunction::Softmax, ScoreFunction::SqrtSoftplus})
    for (RoutingMapFormat f : {RoutingMapFormat::Bytemap, RoutingMapFormat::BitmapU8}) {
      RouterOpSpec s;
      s.num_experts = kE;
      s.aux_scores.topk = 4;
      s.aux_scores.score_function = fn;
      s.aux_scores.map_format = f;
      s.op = RouterOp::AuxScores;
      check_sharded_equals_unsharded<Exec, float>(s, false, ++seed);
      s.op = RouterOp::AuxScoresBackward;
      check_sharded_equals_unsharded<Exec, float>(s, false, ++seed);
    }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(aux_loss_psum_gather_and_backward, DeviceType, KOKKOSMOE_HOST_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  RouterOpSpec s;
  s.aux_loss.num_experts = kE;
  s.aux_loss.topk = 4;
  s.aux_loss.coeff = 0.01f;
  for (AuxLossMode mode : {AuxLossMode::PartialSum, AuxLossMode::GatherInputs}) {
    s.aux_loss_mode = mode;
    s.op = RouterOp::AuxLoss;
    // psum: bitwise equal to the per-shard eager partials summed in shard order; gather: to the global eager loss
    check_sharded_equals_unsharded<Exec, float>(s, false, 7);
    s.op = RouterOp::AuxLossBackward;
    check_sharded_equals_unsharded<Exec, float>(s, false, 8);
  }
  // The psum result agrees with the unsharded loss within the aux-loss tolerance (docs/router.md §16.1, C = 2E)...
  Exec exec;
  s.op = RouterOp::AuxLoss;
  s.aux_loss_mode = AuxLossMode::PartialSum;
  s.global_num_tokens = kT;
  const Mesh mesh = Mesh::parse("dp2xep2");
  const auto ops = make_operands<Exec, float>(exec, s, kT, 7, false);
  const auto whole = eager_reference(exec, s, ops, 1);
  const auto part = partition_router<Exec, float>(mesh, s, input_shardings(s, {"dp", "ep"}));
  auto got = with_fresh_outputs(ops, s);
  run_on_virtual_mesh(exec, mesh, part, got);
  const double C = 2 * kE, tol = std::max(1e-5, 4e-7 * C);
  BOOST_TEST(std::abs(got.loss() - whole.loss()) <= tol + tol * std::abs(whole.loss()));
  BOOST_TEST(got.const_buf(0) == whole.const_buf(0));
  // ... while the local row count as T_total (the bug §13 warns about) is off by the shard count squared.
  RouterOpSpec wrong = s;
  wrong.global_num_tokens = (kT + 3) / 4;
  const auto bad = partition_router<Exec, float>(mesh, wrong, input_shardings(wrong, {"dp", "ep"}));
  auto got_bad = with_fresh_outputs(ops, wrong);
  run_on_virtual_mesh(exec, mesh, bad, got_bad);
  BOOST_TEST(got_bad.loss() / whole.loss() > 10.0);
}

BOOST_AUTO_TEST_CASE(bf16_and_fp16_logits) {
  using Exec = Kokkos::DefaultHostExecutionSpace;
  for (const ScoreCase& c : score_cases()) {
    RouterOpSpec s = forward_spec(RoutingMapFormat::BitmapU8);
    s.router = c.router;
    s.router.map_format = RoutingMapFormat::BitmapU8;
    for (RouterOp op : {RouterOp::Forward, RouterOp::Backward}) {
      s.op = op;
      check_sharded_equals_unsharded<Exec, bf16_t>(s, c.bias, 5);
      check_sharded_equals_unsharded<Exec, fp16_t>(s, c.bias, 6);
    }
  }
}

BOOST_AUTO_TEST_CASE(empty_shards_are_valid) {
  // 3 tokens over 4 shards: one shard has no rows (docs/router.md §4.3: T = 0 is valid)
  using Exec = Kokkos::DefaultHostExecutionSpace;
  Exec exec;
  RouterOpSpec s = forward_spec();
  const Mesh mesh = Mesh::parse("dp2xep2");
  const auto ops = make_operands<Exec, float>(exec, s, 3, 1, false);
  const auto ref = eager_reference(exec, s, ops, 1);
  const auto part = partition_router<Exec, float>(mesh, s, input_shardings(s, {"dp", "ep"}));
  auto got = with_fresh_outputs(ops, s);
  const auto rep = run_on_virtual_mesh(exec, mesh, part, got);
  BOOST_TEST(rep.device_rows == (std::vector<std::int64_t>{1, 1, 1, 0}), tt::per_element());
  BOOST_TEST(differing_outputs(ref, got, s).empty());
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(partition_deferred)

// docs/router.md §14 without AddressSanitizer (scribbled memory); tstPartitionDeferred runs it under ASan with
// detect_stack_use_after_return=1, plus the dangling negative control that must fail.
BOOST_AUTO_TEST_CASE(callables_survive_their_sources) {
  using Exec = Kokkos::DefaultHostExecutionSpace;
  unsigned seed = 1000;
  for (const RouterOpSpec& s : deferred_specs(kE)) {
    const std::string err = deferred_survival<Exec, float>(Exec{}, s, kT, ++seed);
    BOOST_TEST(err.empty(), err);
  }
}

BOOST_AUTO_TEST_CASE(callable_is_independent_of_later_spec_changes) {
  // Built from one spec object that is then reused for another operation: the first callable keeps its own copy.
  using Exec = Kokkos::DefaultHostExecutionSpace;
  Exec exec;
  RouterOpSpec s = forward_spec(RoutingMapFormat::BitmapU8);
  const Mesh mesh = Mesh::parse("dp2");
  const auto p1 = partition_router<Exec, float>(mesh, s, input_shardings(s, {"dp"}));
  const auto ops = make_operands<Exec, float>(exec, s, kT, 3, false);
  const auto ref = eager_reference(exec, s, ops, 2);
  s.router.map_format = RoutingMapFormat::Bytemap;
  s.router.topk = 2;
  const auto p2 = partition_router<Exec, float>(mesh, s, input_shardings(s, {"dp"}));
  auto got = with_fresh_outputs(ops, forward_spec(RoutingMapFormat::BitmapU8));
  run_on_virtual_mesh(exec, mesh, p1, got);
  BOOST_TEST(differing_outputs(ref, got, forward_spec(RoutingMapFormat::BitmapU8)).empty());
  (void)p2;
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(partition_routing_stats)

// The planner's routing models against the real router: DeepSeek-V3's layout (E = 256, top-8, 8 groups, top-4
// groups) on independent random logits. The exact group models bracket the measured destinations per token
// (GroupUniformExperts below, GroupQuota above); uniform routing matches its closed form.
BOOST_AUTO_TEST_CASE(models_bracket_the_router) {
  using Exec = Kokkos::DefaultHostExecutionSpace;
  Exec exec;
  const int T = 8192, E = 256, k = 8;
  for (bool grouped : {true, false}) {
    RouterConfig c;
    c.topk = k;
    c.score_function = ScoreFunction::Sigmoid;
    if (grouped) {
      c.num_groups = 8;
      c.group_topk = 4;
    }
    Kokkos::View<float**, Kokkos::LayoutRight, Exec::memory_space> logits("logits", T, E), probs("probs", T, E),
        inter("inter", T, E);
    Kokkos::View<std::int32_t**, Kokkos::LayoutRight, Exec::memory_space> idx("idx", T, k);
    std::mt19937 rng(grouped ? 2024 : 2025);
    fill_uniform(logits, rng, -4.0f, 4.0f);
    topk_router_indices(exec, c, logits, Kokkos::View<const float*, Exec::memory_space>(), probs, idx, inter);
    exec.fence();
    MoeLayerConfig l;
    l.num_experts = E;
    l.topk = k;
    l.num_groups = grouped ? 8 : 0;
    l.group_topk = grouped ? 4 : 0;
    l.hidden_size = 7168;
    for (int R : {2, 4, 8, 16, 32, 64}) {
      double measured = 0;
      for (int t = 0; t < T; ++t) {
        std::set<int> ranks;
        for (int i = 0; i < k; ++i) ranks.insert(idx(t, i) / (E / R));
        measured += ranks.size();
      }
      measured /= T;
      auto model = [&](RoutingModel m) {
        l.routing_model = m;
        double d = 0;
        for (double p : rank_hit_probabilities(l, R)) d += p;
        return d;
      };
      BOOST_TEST_MESSAGE("destinations per token, R = " << R << (grouped ? " grouped" : " ungrouped") << ": router "
                                                        << measured << ", GroupQuota "
                                                        << model(RoutingModel::GroupQuota) << ", GroupUniformExperts "
                                                        << model(RoutingModel::GroupUniformExperts) << ", Uniform "
                                                        << expected_destinations_uniform(E, k, R));
      BOOST_TEST_CONTEXT("R = " << R << (grouped ? " grouped" : " uniform") << ", measured " << measured) {
        if (grouped) {
          BOOST_TEST(measured >= model(RoutingModel::GroupUniformExperts) * 0.99);
          BOOST_TEST(measured <= model(RoutingModel::GroupQuota) * 1.01);
          BOOST_TEST(std::abs(measured - model(RoutingModel::GroupQuota)) <= 0.07 * measured);
        } else {
          BOOST_TEST(std::abs(measured - expected_destinations_uniform(E, k, R)) <= 0.01 * measured);
        }
      }
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
