/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// Hostile and huge planner inputs: every request gives a finite plan that survives JSON, or an
// InvalidArgument naming the field; plans are the same from several threads.

#include <KokkosMoE_Planner.hpp>
#include <KokkosMoE_RouterPresets.hpp>
#include <KokkosMoE_Topology.hpp>

#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tstPlannerHelpers.hpp"

namespace {

using namespace KokkosMoE;
using namespace KokkosMoE::Test;

template <class F>
std::string invalid_argument_of(F&& f, Rule& rule) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    rule = e.rule();
    return e.what();
  }
  return "(no error)";
}

bool all_finite(const PhaseEstimate& p) {
  for (double x : {p.row_bytes, p.bytes_sent, p.bytes_received, p.bytes_local, p.bytes_nvlink, p.bytes_pcie,
                   p.bytes_network, p.time_us})
    if (!std::isfinite(x) || x < 0) return false;
  return true;
}

bool all_finite(const TrafficEstimate& t) {
  return std::isfinite(t.time_us) && std::isfinite(t.destinations_per_token) &&
         std::isfinite(t.remote_destinations_per_token) && t.remote_destinations_per_token >= 0 &&
         all_finite(t.dispatch) && all_finite(t.combine);
}

bool all_finite(const Plan& p) {
  if (!all_finite(p.traffic)) return false;
  for (const auto& a : p.alternatives)
    if (!all_finite(a.traffic)) return false;
  for (const auto& r : p.ranks)
    for (double x : {r.dispatch_bytes_sent, r.dispatch_bytes_received, r.combine_bytes_sent, r.combine_bytes_received})
      if (!std::isfinite(x) || x < 0) return false;
  for (const auto& g : p.ep_groups)
    if (!std::isfinite(g.min_pair_gbps)) return false;
  return true;
}

// The property under test: finite everywhere, and JSON gives back the same plan.
void check_plan(const Plan& p, const std::string& what) {
  BOOST_TEST(all_finite(p), what);
  const std::string text = plan_to_json(p);
  BOOST_TEST(text.find("null") == std::string::npos, what);
  Plan back;
  try {
    back = plan_from_json(text);
  } catch (const std::exception& e) {
    BOOST_ERROR(what << ": plan_from_json threw " << e.what());
    return;
  }
  BOOST_TEST((back == p), what);
}

MoeLayerConfig layer(int E, int k, int G, int gk, int H, std::int64_t T) {
  MoeLayerConfig l;
  l.name = "test";
  l.num_experts = E;
  l.topk = k;
  l.num_groups = G;
  l.group_topk = gk;
  l.hidden_size = H;
  l.tokens_per_rank = T;
  return l;
}

// A random node: n GPUs, each pair NVLink-direct, through a fabric, or PCIe; random NUMA nodes.
NvlinkTopology random_node(std::mt19937_64& rng, int n) {
  NvlinkTopology t = empty_node(n);
  const int style = static_cast<int>(rng() % 3);
  std::uniform_int_distribution<int> links(1, 18);
  for (int i = 0; i < n; ++i) {
    t.gpus[i].numa_nodes = {static_cast<int>(rng() % 2)};
    if (style == 1) t.gpus[i].links_to_switch = links(rng);
  }
  for (int i = 0; i < n; ++i)
    for (int j = i + 1; j < n; ++j) {
      if (style == 0 && rng() % 2) set_direct(t, i, j, links(rng) % 4 + 1);
      if (style == 1) {
        const int l = std::min(t.gpus[i].links_to_switch, t.gpus[j].links_to_switch);
        pair_ref(t, i, j).switch_links = pair_ref(t, j, i).switch_links = static_cast<std::uint16_t>(l);
        pair_ref(t, i, j).nvlink_p2p = pair_ref(t, j, i).nvlink_p2p = true;
      }
      if (style == 2 && rng() % 3 == 0) {  // NVLink peers whose link count is unknown
        for (auto [a, b] : {std::pair{i, j}, std::pair{j, i}}) {
          pair_ref(t, a, b).nvlink_p2p = true;
          pair_ref(t, a, b).nvlink_mbps = 1 + rng() % 900000;
        }
      }
    }
  t.islands = nvlink_islands(t);
  t.cliques = nvlink_cliques(t);
  return t;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(planner_hostile)

BOOST_AUTO_TEST_CASE(single_node_rounding_residue_is_not_an_infinite_time) {
  // E = 24 in 3 groups, top-2 from 1 group: the ranks' hit probabilities differ, and on one node the "network"
  // share sum(P) - P[a] - sum(P on the node) was a residue of 2.2e-16 divided by the 0 GB/s inter-node rate: an
  // infinite combine time, null in the JSON and a plan_from_json that threw.
  PlanRequest r = request(hgx8(), layer(24, 2, 3, 1, 7168, 4096));
  r.constraints.fixed_ep_size = 8;
  const Plan p = make_plan(r);
  BOOST_TEST(p.ep_size() == 8);
  BOOST_TEST(p.traffic.combine.bytes_network == 0.0);
  BOOST_TEST(p.traffic.combine.time_us > 0.0);
  BOOST_TEST(std::isfinite(p.traffic.time_us));
  check_plan(p, "E24 G3 gk1 k2 on HGX-8");
}

BOOST_AUTO_TEST_CASE(huge_hidden_keeps_exact_row_bytes) {
  // H + 4 * ceil(H / 128) in int overflowed for H near 2^31 (the CLI's --hidden 4294967297 also wrapped to 1).
  const int H = std::numeric_limits<int>::max();
  const double H64 = static_cast<double>(H);
  BOOST_TEST(token_row_bytes(TokenDType::FP8, H) == H64 + 4.0 * std::ceil(H64 / 128));
  BOOST_TEST(token_row_bytes(TokenDType::FP32, H) == 4.0 * H64);
  PlanRequest r = request(hgx8(), layer(256, 8, 8, 4, H, 4096));
  r.layer.dispatch_dtype = TokenDType::FP8;
  const Plan p = make_plan(r);
  BOOST_TEST(p.traffic.dispatch.row_bytes == H64 + 4.0 * std::ceil(H64 / 128));
  check_plan(p, "hidden 2^31-1, fp8");
}

BOOST_AUTO_TEST_CASE(huge_counts_are_refused_not_wrapped) {
  Rule rule{};
  // T * world overflowed int64 (UBSan: signed integer overflow) for a huge tokens_per_rank.
  PlanRequest r = request(hgx8(), deepseek_v3(std::numeric_limits<std::int64_t>::max()), 2, 48);
  std::string e = invalid_argument_of([&] { make_plan(r); }, rule);
  BOOST_TEST(e.find("times the 16 ranks overflows 64 bits") != std::string::npos, e);
  BOOST_TEST(rule_name(rule) == std::string("config_value"));
  // T * row bytes: a per-rank byte count beyond 2^63.
  r = request(vm2(), deepseek_v3(std::int64_t(1) << 61));
  e = invalid_argument_of([&] { make_plan(r); }, rule);
  BOOST_TEST(
      e.find("x 14336 bytes per bf16 token row (hidden_size 7168) overflows 64-bit byte counts") != std::string::npos,
      e);
  // ... while 2^40 tokens still plan, with finite times.
  r = request(vm2(), deepseek_v3(std::int64_t(1) << 40));
  check_plan(make_plan(r), "2^40 tokens per rank");
  // The world: num_nodes * GPUs per node in 64 bits.
  r = request(hgx8(), deepseek_v3(16), std::numeric_limits<int>::max(), 48);
  e = invalid_argument_of([&] { make_plan(r); }, rule);
  BOOST_TEST(e.find("exceeds 65536 GPUs") != std::string::npos, e);
  // Experts beyond the planner's limit; bandwidths and efficiencies that would make a time infinite.
  r = request(hgx8(), layer(1 << 20, 8, 0, 0, 128, 16));
  e = invalid_argument_of([&] { make_plan(r); }, rule);
  BOOST_TEST(e.find("exceeds the planner's limit of 65536 experts") != std::string::npos, e);
  for (double bad :
       {1e-300, 0.0, -1.0, 1e300, std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    r = request(hgx8(), deepseek_v3(4096));
    r.cost_model.nvlink_link_gbps = bad;
    e = invalid_argument_of([&] { make_plan(r); }, rule);
    BOOST_TEST(e.find("cost-model bandwidths must be in [0.001, 1000000] GB/s") != std::string::npos, e);
    r = request(hgx8(), deepseek_v3(4096));
    r.cost_model.pcie_efficiency = bad;
    e = invalid_argument_of([&] { make_plan(r); }, rule);
    BOOST_TEST(e.find("efficiencies must be in [0.001, 1]") != std::string::npos, e);
    r = request(hgx8(), deepseek_v3(4096), 2, bad);
    e = invalid_argument_of([&] { make_plan(r); }, rule);
    BOOST_TEST(e.find("inter_node_gbps") != std::string::npos, e);
  }
  // Group statistics whose DP would take minutes are refused with what to change.
  MoeLayerConfig wide = layer(65536, 32768, 65536, 32768, 128, 16);
  wide.routing_model = RoutingModel::GroupUniformExperts;
  e = invalid_argument_of([&] { rank_hit_probabilities(wide, 2); }, rule);
  BOOST_TEST(e.find("need more than 2^26 steps") != std::string::npos, e);
}

BOOST_AUTO_TEST_CASE(json_reader_refuses_narrowing_and_overflow) {
  const std::string text = plan_to_json(make_plan(request(hgx8(), deepseek_v3(4096))));
  Rule rule{};
  auto with = [&](const std::string& from, const std::string& to) {
    std::string t = text;
    const auto p = t.find(from);
    BOOST_REQUIRE_MESSAGE(p != std::string::npos, from);
    return t.replace(p, from.size(), to);
  };
  std::string e =
      invalid_argument_of([&] { plan_from_json(with("\"hidden_size\": 7168", "\"hidden_size\": 4294967297")); }, rule);
  BOOST_TEST(e.find("layer.hidden_size: integer out of range") != std::string::npos, e);
  e = invalid_argument_of([&] { plan_from_json(with("\"hidden_size\": 7168", "\"hidden_size\": -4294967297")); }, rule);
  BOOST_TEST(e.find("integer out of range") != std::string::npos, e);
  e = invalid_argument_of([&] { plan_from_json(with("\"time_us\": ", "\"time_us\": 1e999, \"x\": ")); }, rule);
  BOOST_TEST(e.find("not valid JSON") != std::string::npos, e);
  // a mesh of more than 2^31 - 1 devices (its product overflowed int in num_devices())
  e = invalid_argument_of([&] { Mesh({{"dp", 65536, AxisKind::Data}, {"ep", 65536, AxisKind::Expert}}); }, rule);
  BOOST_TEST(e.find("more than 2^31 - 1 devices") != std::string::npos, e);
  e = invalid_argument_of([&] { Mesh::parse("dp99999999999xep2"); }, rule);
  BOOST_TEST(e.find("size too large") != std::string::npos, e);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(planner_roundtrip)

BOOST_AUTO_TEST_CASE(every_fixture_and_preset_round_trips) {
  int plans = 0;
  for (const char* f : {"hgx_h100_8gpu_4sw", "h200_2gpu_vm_hidden_switch", "dgx2_like_16gpu_12sw", "pcie_pairs_4gpu",
                        "dgx1_like_mesh_8gpu", "power8_like_gpu_cpu", "h200_2gpu_live_capture",
                        "h200_2gpu_vm_machine_only", "asymmetric_matrix", "gpu_without_matrix"}) {
    const NvlinkTopology node = load_topology_xml_file(std::string(KOKKOSMOE_TEST_FIXTURES) + "/" + f + ".xml");
    for (const std::string& preset : router_preset_names())
      for (int nodes : {1, 2})
        for (TokenDType dt : {TokenDType::BF16, TokenDType::FP8})
          for (std::int64_t T : {std::int64_t(0), std::int64_t(1), std::int64_t(4096), std::int64_t(1) << 36}) {
            PlanRequest r = request(node, moe_layer_from_preset(router_preset(preset), T), nodes, nodes > 1 ? 48 : 0);
            r.layer.dispatch_dtype = dt;
            const std::string what = std::string(f) + " " + preset + " x" + std::to_string(nodes) + " " +
                                     to_string(dt) + " T=" + std::to_string(T);
            try {
              check_plan(make_plan(r), what);
              ++plans;
            } catch (const InvalidArgument& e) {
              BOOST_TEST(rule_name(e.rule()) == std::string("plan_infeasible"), what << ": " << e.what());
            }
          }
  }
  BOOST_TEST(plans > 500);
}

BOOST_AUTO_TEST_CASE(random_requests_round_trip_or_throw_invalid_argument) {
  std::mt19937_64 rng(20240514);
  int plans = 0, refused = 0;
  for (int it = 0; it < 400; ++it) {
    const int n = 1 + static_cast<int>(rng() % 12);
    PlanRequest r;
    r.cluster.node = random_node(rng, n);
    r.cluster.num_nodes = 1 + static_cast<int>(rng() % 3);
    r.cluster.inter_node_gbps = r.cluster.num_nodes > 1 || rng() % 4 == 0 ? 1 + (rng() % 400) : 0;
    static const int Es[] = {1, 2, 6, 8, 16, 24, 60, 64, 128, 256, 384, 1024};
    const int E = Es[rng() % (sizeof Es / sizeof Es[0])];
    r.layer = layer(E, 1 + static_cast<int>(rng() % std::min(E, 16)), 0, 0, 1 + static_cast<int>(rng() % 20000),
                    static_cast<std::int64_t>(rng() % (std::uint64_t(1) << (rng() % 44))));
    if (rng() % 2) {  // group-limited: G divides E, gk <= G, k a multiple of gk with k/gk <= E/G
      std::vector<int> divisors;
      for (int g = 1; g <= E; ++g)
        if (E % g == 0) divisors.push_back(g);
      const int G = divisors[rng() % divisors.size()];
      const int gk = 1 + static_cast<int>(rng() % G);
      const int per = 1 + static_cast<int>(rng() % std::min(E / G, 4));
      r.layer.num_groups = G;
      r.layer.group_topk = gk;
      r.layer.topk = std::min(gk * per, E);
      r.layer.routing_model = static_cast<RoutingModel>(rng() % 4);
    }
    r.layer.dispatch_dtype = static_cast<TokenDType>(rng() % 4);
    r.layer.combine_dtype = static_cast<TokenDType>(rng() % 4);
    if (rng() % 3 == 0) r.constraints.fixed_ep_size = 1 + static_cast<int>(rng() % (n * r.cluster.num_nodes));
    if (rng() % 4 == 0) r.constraints.max_ep_size = 1 + static_cast<int>(rng() % 16);
    if (rng() % 5 == 0) r.constraints.local_expert_alignment = 1 + static_cast<int>(rng() % 4);
    r.cost_model.nvlink_link_gbps = 0.001 + (rng() % 100000) / 10.0;
    r.cost_model.nvlink_efficiency = 0.001 + (rng() % 999) / 1000.0;
    try {
      check_plan(make_plan(r), "random request " + std::to_string(it));
      ++plans;
    } catch (const InvalidArgument& e) {
      ++refused;
      const std::string rule = rule_name(e.rule());
      BOOST_TEST((rule == "plan_infeasible" || rule == "topk_range" || rule == "config_value"),
                 "random request " << it << ": " << e.what());
    }
  }
  BOOST_TEST_MESSAGE("random requests: " << plans << " plans, " << refused << " refused");
  BOOST_TEST(plans > 200);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(planner_threads)

BOOST_AUTO_TEST_CASE(plans_from_several_threads_are_identical) {
  // make_plan used std::lgamma, which writes the global signgam: a data race (and, under a race detector, a
  // report) when two threads plan at once. Every thread must produce the same JSON as the sequential run.
  std::vector<PlanRequest> reqs;
  for (const std::string& preset : router_preset_names())
    for (int nodes : {1, 2}) {
      reqs.push_back(request(hgx8(), moe_layer_from_preset(router_preset(preset), 4096), nodes, 48));
      reqs.push_back(request(dgx1(), moe_layer_from_preset(router_preset(preset), 512), nodes, 48));
    }
  std::vector<std::string> expected;
  for (const auto& r : reqs) expected.push_back(plan_to_json(make_plan(r)));
  constexpr int kThreads = 4, kRounds = 5;
  std::vector<std::vector<std::string>> got(kThreads);
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t)
    pool.emplace_back([t, &reqs, &got] {
      for (int round = 0; round < kRounds; ++round)
        for (std::size_t i = 0; i < reqs.size(); ++i) {
          const std::size_t k = (i + static_cast<std::size_t>(t)) % reqs.size();  // threads plan different requests
          got[t].push_back(std::to_string(k) + ":" + plan_to_json(make_plan(reqs[k])));
        }
    });
  for (auto& th : pool) th.join();
  for (int t = 0; t < kThreads; ++t) {
    BOOST_TEST(got[t].size() == reqs.size() * kRounds);
    for (const std::string& g : got[t]) {
      const std::size_t k = std::stoul(g.substr(0, g.find(':')));
      BOOST_TEST((g.substr(g.find(':') + 1) == expected[k]), "thread " << t << " request " << k);
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
