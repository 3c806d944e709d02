/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// Planner tests on in-memory topologies with the content of the fixtures of docs/topology.md §6: routing statistics
// against brute-force enumeration and exact binomials, the cost model against hand calculations, expected plans,
// JSON round trips, bad requests and the resource gate.

#include <KokkosMoE_Planner.hpp>
#include <KokkosMoE_ResourceGate.hpp>

#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "tstPlannerHelpers.hpp"

namespace tt = boost::test_tools;
using namespace KokkosMoE;
using namespace KokkosMoE::Test;

namespace {

// Exact C(n, k) in 64 bits (inputs small enough that every intermediate C(n, i) * n fits).
std::uint64_t choose(std::uint64_t n, std::uint64_t k) {
  if (k > n) return 0;
  std::uint64_t c = 1;
  for (std::uint64_t i = 1; i <= k; ++i) c = c * (n - k + i) / i;
  return c;
}

// All r-subsets of {0..n-1}, in lexicographic order.
void subsets(int n, int r, const std::function<void(const std::vector<int>&)>& f) {
  std::vector<int> s;
  std::function<void(int)> rec = [&](int from) {
    if (static_cast<int>(s.size()) == r) return f(s);
    for (int v = from; v < n; ++v) {
      s.push_back(v);
      rec(v + 1);
      s.pop_back();
    }
  };
  rec(0);
}

// Brute-force P(rank hit) by enumerating every equally likely routing outcome of the model.
std::vector<double> brute_force_hits(const MoeLayerConfig& l, int R, RoutingModel model) {
  const int E = l.num_experts, L = E / R;
  std::vector<double> hits(R, 0.0);
  double outcomes = 0;
  auto count = [&](const std::vector<int>& experts) {
    std::set<int> ranks;
    for (int e : experts) ranks.insert(e / L);
    for (int r : ranks) hits[r] += 1;
    outcomes += 1;
  };
  if (model == RoutingModel::Uniform) {
    subsets(E, l.topk, count);
  } else {
    const int G = l.num_groups, gk = l.group_topk, gs = E / G;
    subsets(G, gk, [&](const std::vector<int>& groups) {
      if (model == RoutingModel::GroupUniformExperts) {
        std::vector<int> eligible;
        for (int g : groups)
          for (int e = g * gs; e < (g + 1) * gs; ++e) eligible.push_back(e);
        subsets(static_cast<int>(eligible.size()), l.topk, [&](const std::vector<int>& pick) {
          std::vector<int> experts;
          for (int i : pick) experts.push_back(eligible[i]);
          count(experts);
        });
      } else {  // GroupQuota: k/gk experts from each selected group, independently and uniformly
        const int kg = l.topk / gk;
        std::vector<std::vector<int>> per_group;
        subsets(gs, kg, [&](const std::vector<int>& s) { per_group.push_back(s); });
        std::vector<int> choice(groups.size(), 0);
        while (true) {
          std::vector<int> experts;
          for (std::size_t i = 0; i < groups.size(); ++i)
            for (int x : per_group[choice[i]]) experts.push_back(groups[i] * gs + x);
          count(experts);
          std::size_t i = 0;
          while (i < choice.size() && ++choice[i] == static_cast<int>(per_group.size())) choice[i++] = 0;
          if (i == choice.size()) break;
        }
      }
    });
  }
  for (double& h : hits) h /= outcomes;
  return hits;
}

MoeLayerConfig small_layer(int E, int k, int G, int gk) {
  MoeLayerConfig l;
  l.num_experts = E;
  l.topk = k;
  l.num_groups = G;
  l.group_topk = gk;
  l.hidden_size = 128;
  l.tokens_per_rank = 16;
  return l;
}

std::vector<int> iota(int b, int e) {
  std::vector<int> v;
  for (int i = b; i < e; ++i) v.push_back(i);
  return v;
}

const double kSwitchPort = 18 * 25.0 * 0.82;  // GB/s: 18 NVLink 4 links at the 0.82 effective factor
const double kPcie = 63.0 * 0.8;              // GB/s: PCIe Gen5 x16 at 0.8

template <class F>
void check_throws(F&& f, Rule rule, const std::string& param, const std::string& needle) {
  try {
    f();
    BOOST_ERROR("expected InvalidArgument with rule " << rule_name(rule));
  } catch (const InvalidArgument& e) {
    BOOST_TEST(rule_name(e.rule()) == rule_name(rule));
    BOOST_TEST(e.parameter() == param);
    BOOST_TEST(std::string(e.what()).find(needle) != std::string::npos, "message: " << e.what());
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(planner_routing)

BOOST_AUTO_TEST_CASE(binomial_ratio_matches_exact_binomials) {
  for (int b : {8, 20, 64, 256})
    for (int k : {1, 2, 4, 8})
      for (int a : {0, k - 1, k, b / 2, b - 1, b}) {
        if (a < 0 || a > b || k > b) continue;
        const double exact = double(choose(a, k)) / double(choose(b, k));
        BOOST_TEST(binomial_ratio(a, b, k) == exact, tt::tolerance(1e-14));
      }
  // DeepSeek-V3 at EP8: C(224, 8) / C(256, 8), both exact in 64 bits.
  BOOST_TEST(choose(256, 8) == 409663695276000ull);
  BOOST_TEST(binomial_ratio(224, 256, 8) == double(choose(224, 8)) / double(choose(256, 8)), tt::tolerance(1e-14));
}

BOOST_AUTO_TEST_CASE(binomial_ratio_is_stable_where_binomials_overflow) {
  // C(1024, 32) ~ 5e60 and C(2^20, 64) overflow every integer type; compare with log-gamma in extended precision
  // (double lgamma of ~1e6 loses ~1e-9 to cancellation, which is why the library multiplies ratios instead).
  auto lg = [](long double a, long double b, long double k) {
    return static_cast<double>(
        std::exp(std::lgamma(a + 1) - std::lgamma(a - k + 1) - std::lgamma(b + 1) + std::lgamma(b - k + 1)));
  };
  BOOST_TEST(binomial_ratio(1024 - 4, 1024, 32) == lg(1020, 1024, 32), tt::tolerance(1e-10));
  BOOST_TEST(binomial_ratio((1 << 20) - 1024, 1 << 20, 64) == lg((1 << 20) - 1024, 1 << 20, 64), tt::tolerance(1e-10));
  BOOST_TEST(binomial_ratio(5, 100, 6) == 0.0);
  BOOST_TEST(std::isfinite(expected_destinations_uniform(1 << 20, 1024, 1 << 10)));
}

BOOST_AUTO_TEST_CASE(uniform_closed_form_matches_enumeration_and_doc) {
  for (int R : {1, 2, 4, 8, 16}) {
    const MoeLayerConfig l = small_layer(16, 3, 0, 0);
    const auto brute = brute_force_hits(l, R, RoutingModel::Uniform);
    double d = 0;
    for (double h : brute) d += h;
    BOOST_TEST(expected_destinations_uniform(16, 3, R) == d, tt::tolerance(1e-12));
    const auto p = rank_hit_probabilities(l, R);
    for (int r = 0; r < R; ++r) BOOST_TEST(p[r] == brute[r], tt::tolerance(1e-12));
  }
  // docs/ep.md §11: DeepSeek-V3 at EP8 without the group limit: 8 * (1 - C(224,8)/C(256,8)) = 5.29
  const double d = expected_destinations_uniform(256, 8, 8);
  BOOST_TEST(d == 8.0 * (1.0 - double(choose(224, 8)) / double(choose(256, 8))), tt::tolerance(1e-13));
  BOOST_TEST(std::abs(d - 5.29) < 0.005);
}

BOOST_AUTO_TEST_CASE(group_models_match_enumeration) {
  struct Case {
    int E, k, G, gk;
  };
  // aligned (groups on ranks), groups spanning ranks, ranks spanning groups, and misaligned (E=12, G=4 -> 3 per
  // group; R=3 -> 4 per rank, R=6 -> 2 per rank)
  for (const Case c : {Case{16, 4, 4, 2}, Case{16, 2, 4, 2}, Case{12, 2, 4, 2}, Case{12, 4, 4, 2}, Case{12, 3, 4, 3}}) {
    for (int R = 1; R <= c.E; ++R) {
      if (c.E % R != 0) continue;
      for (RoutingModel m : {RoutingModel::GroupQuota, RoutingModel::GroupUniformExperts}) {
        MoeLayerConfig l = small_layer(c.E, c.k, c.G, c.gk);
        l.routing_model = m;
        const auto brute = brute_force_hits(l, R, m);
        const auto p = rank_hit_probabilities(l, R);
        BOOST_TEST_REQUIRE(p.size() == static_cast<std::size_t>(R));
        BOOST_TEST_CONTEXT("E=" << c.E << " k=" << c.k << " G=" << c.G << " gk=" << c.gk << " R=" << R
                                << " model=" << to_string(m)) {
          for (int r = 0; r < R; ++r) BOOST_TEST(p[r] == brute[r], tt::tolerance(1e-12));
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(group_models_hand_values_for_deepseek) {
  MoeLayerConfig l = deepseek_v3(4096);
  // GroupQuota at EP8: one group per rank, each selected group hits its rank: 4 of 8 ranks.
  double d = 0;
  for (double p : rank_hit_probabilities(l, 8)) d += p;
  BOOST_TEST(d == 4.0, tt::tolerance(1e-12));
  // GroupQuota at EP16: a group spans 2 ranks of 16 experts; 2 picks per selected group miss a given rank with
  // probability C(16,2)/C(32,2): 16 * 1/2 * (1 - 120/496)
  d = 0;
  for (double p : rank_hit_probabilities(l, 16)) d += p;
  BOOST_TEST(d == 16 * 0.5 * (1.0 - 120.0 / 496.0), tt::tolerance(1e-12));
  // GroupUniformExperts at EP8: 8 of the 128 eligible experts: 4 * (1 - C(96,8)/C(128,8))
  l.routing_model = RoutingModel::GroupUniformExperts;
  d = 0;
  for (double p : rank_hit_probabilities(l, 8)) d += p;
  BOOST_TEST(d == 4.0 * (1.0 - double(choose(96, 8)) / double(choose(128, 8))), tt::tolerance(1e-12));
  // Grouping off: the uniform closed form
  l.routing_model = RoutingModel::Uniform;
  d = 0;
  for (double p : rank_hit_probabilities(l, 8)) d += p;
  BOOST_TEST(d == expected_destinations_uniform(256, 8, 8), tt::tolerance(1e-12));
  // every model: at most min(R, k) destinations, and with R = E exactly k
  for (RoutingModel m : {RoutingModel::Uniform, RoutingModel::GroupQuota, RoutingModel::GroupUniformExperts}) {
    l.routing_model = m;
    for (int R : {1, 2, 4, 8, 16, 32, 64, 128, 256}) {
      d = 0;
      for (double p : rank_hit_probabilities(l, R)) d += p;
      BOOST_TEST(d <= std::min(R, 8) + 1e-12);
      if (R == 256) BOOST_TEST(d == 8.0, tt::tolerance(1e-12));
      if (R == 1) BOOST_TEST(d == 1.0);
    }
  }
}

BOOST_AUTO_TEST_CASE(token_row_bytes_follow_ep_md) {
  BOOST_TEST(token_row_bytes(TokenDType::BF16, 7168) == 14336.0);
  BOOST_TEST(token_row_bytes(TokenDType::FP16, 7168) == 14336.0);
  BOOST_TEST(token_row_bytes(TokenDType::FP32, 7168) == 28672.0);
  BOOST_TEST(token_row_bytes(TokenDType::FP8, 7168) == 7392.0);  // H * (1 + 4/128)
  BOOST_TEST(token_row_bytes(TokenDType::FP8, 100) == 104.0);    // one scale for a partial block
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(planner_cost)

BOOST_AUTO_TEST_CASE(hgx8_deepseek_uniform_matches_ep_md_table) {
  PlanRequest r = request(hgx8(), deepseek_v3(4096));
  r.layer.routing_model = RoutingModel::Uniform;
  const Plan p = make_plan(r);
  BOOST_TEST_REQUIRE(p.ep_size() == 8);
  const double D = 8.0 * (1.0 - double(choose(224, 8)) / double(choose(256, 8)));
  const double sent_all = 4096.0 * 14336.0 * D, remote = sent_all * 7.0 / 8.0;
  BOOST_TEST(p.traffic.destinations_per_token == D, tt::tolerance(1e-12));
  BOOST_TEST(p.traffic.dispatch.bytes_sent == remote, tt::tolerance(1e-12));
  BOOST_TEST(p.traffic.dispatch.bytes_received == remote, tt::tolerance(1e-12));
  BOOST_TEST(p.traffic.dispatch.bytes_local == sent_all / 8.0, tt::tolerance(1e-12));
  // docs/ep.md §11: 311 MB per rank, 272 MB remote, 735 us at 370 GB/s (here 369 GB/s = 18 x 25 x 0.82)
  BOOST_TEST(std::abs(sent_all / 1e6 - 311.0) < 0.5);
  BOOST_TEST(std::abs(remote / 1e6 - 272.0) < 0.5);
  const double t = remote / (kSwitchPort * 1e9) * 1e6;
  BOOST_TEST(p.traffic.dispatch.time_us == t, tt::tolerance(1e-12));
  BOOST_TEST(std::abs(t - 735.0 * 370.0 / 369.0) < 1.0);
  BOOST_TEST(p.traffic.combine.time_us == t, tt::tolerance(1e-12));
  BOOST_TEST(p.traffic.time_us == 2 * t, tt::tolerance(1e-12));
  BOOST_TEST(p.traffic.dispatch.bytes_nvlink == remote, tt::tolerance(1e-12));
  BOOST_TEST(p.traffic.dispatch.bytes_network == 0.0);
  BOOST_TEST(p.traffic.dispatch.bottleneck.find("NVSwitch port") != std::string::npos);
  // FP8 dispatch, BF16 combine
  r.layer.dispatch_dtype = TokenDType::FP8;
  const Plan q = make_plan(r);
  BOOST_TEST(q.traffic.dispatch.bytes_sent == 4096.0 * 7392.0 * D * 7.0 / 8.0, tt::tolerance(1e-12));
  BOOST_TEST(std::abs(q.traffic.dispatch.bytes_sent / 1e6 - 140.0) < 0.5);  // docs/ep.md: FP8 remote 140 MB
  BOOST_TEST(q.traffic.combine.bytes_sent == remote, tt::tolerance(1e-12));
}

BOOST_AUTO_TEST_CASE(hgx8_deepseek_group_limited_by_hand) {
  const Plan p = make_plan(request(hgx8(), deepseek_v3(4096)));
  BOOST_TEST(to_string(p.traffic.model) == std::string("group-quota"));
  BOOST_TEST(p.traffic.destinations_per_token == 4.0, tt::tolerance(1e-12));
  BOOST_TEST(p.traffic.remote_destinations_per_token == 3.5, tt::tolerance(1e-12));
  const double remote = 4096.0 * 14336.0 * 3.5;  // 205.5 MB
  BOOST_TEST(p.traffic.dispatch.bytes_sent == remote, tt::tolerance(1e-12));
  BOOST_TEST(p.traffic.dispatch.time_us == remote / (kSwitchPort * 1e9) * 1e6, tt::tolerance(1e-12));
  for (const RankPlacement& rp : p.ranks) {
    BOOST_TEST(rp.dispatch_bytes_sent == remote, tt::tolerance(1e-12));
    BOOST_TEST(rp.dispatch_bytes_received == remote, tt::tolerance(1e-12));
    BOOST_TEST(rp.combine_bytes_sent == remote, tt::tolerance(1e-12));
  }
}

BOOST_AUTO_TEST_CASE(dgx1_direct_links_bound_by_single_link_peer) {
  MoeLayerConfig l = small_layer(64, 2, 0, 0);
  l.hidden_size = 4096;
  l.tokens_per_rank = 8192;
  const Plan p = make_plan(request(dgx1(), l));
  BOOST_TEST_REQUIRE(p.ep_size() == 4);
  const double P = 1.0 - double(choose(48, 2)) / double(choose(64, 2));
  const double per_peer = 8192.0 * 8192.0 * P;  // T * 2H bytes * P
  // peers of GPU 0 in {0..3}: GPU 1 and 2 over one link (20.5 GB/s), GPU 3 over two
  BOOST_TEST(p.traffic.dispatch.time_us == per_peer / (25.0 * 0.82 * 1e9) * 1e6, tt::tolerance(1e-12));
  BOOST_TEST(p.traffic.dispatch.bytes_sent == 3 * per_peer, tt::tolerance(1e-12));
  BOOST_TEST(p.traffic.dispatch.bottleneck.find("NVLink GPU 0 <-> GPU 1") != std::string::npos,
             p.traffic.dispatch.bottleneck);
}

BOOST_AUTO_TEST_CASE(pcie_pairs_cross_island_bound_by_pcie) {
  MoeLayerConfig l = small_layer(64, 2, 0, 0);
  l.hidden_size = 4096;
  l.tokens_per_rank = 1024;
  PlanRequest r = request(pcie_pairs4(), l);
  r.constraints.fixed_ep_size = 4;
  const Plan p = make_plan(r);
  const double P = 1.0 - double(choose(48, 2)) / double(choose(64, 2));
  const double per_peer = 1024.0 * 8192.0 * P;
  // GPU 0: peer 1 over the 4-link bridge (82 GB/s, dedicated); peers 2 and 3 share its PCIe link (50.4 GB/s)
  BOOST_TEST(p.traffic.dispatch.time_us == 2 * per_peer / (kPcie * 1e9) * 1e6, tt::tolerance(1e-12));
  BOOST_TEST(p.traffic.dispatch.bytes_pcie == 2 * per_peer, tt::tolerance(1e-12));
  BOOST_TEST(p.traffic.dispatch.bytes_nvlink == per_peer, tt::tolerance(1e-12));
  // the cost model constants are overridable
  r.cost_model.pcie_gbps = 32.0;
  r.cost_model.pcie_efficiency = 0.5;
  BOOST_TEST(make_plan(r).traffic.dispatch.time_us == 2 * per_peer / (16.0 * 1e9) * 1e6, tt::tolerance(1e-12));
}

BOOST_AUTO_TEST_CASE(two_nodes_ep16_bound_by_network) {
  PlanRequest r = request(hgx8(), deepseek_v3(4096), 2, 48.0);
  r.layer.routing_model = RoutingModel::Uniform;
  r.constraints.fixed_ep_size = 16;
  const Plan p = make_plan(r);
  const double P = 1.0 - double(choose(240, 8)) / double(choose(256, 8));
  const double unit = 4096.0 * 14336.0 * P;
  // 7 peers on the node over the fabric, 8 on the other node over 48 GB/s
  BOOST_TEST(p.traffic.dispatch.bytes_network == 8 * unit, tt::tolerance(1e-12));
  BOOST_TEST(p.traffic.dispatch.bytes_nvlink == 7 * unit, tt::tolerance(1e-12));
  BOOST_TEST(p.traffic.dispatch.time_us == 8 * unit / 48e9 * 1e6, tt::tolerance(1e-12));
  BOOST_TEST(p.traffic.dispatch.bottleneck.find("inter-node") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(nvlink_constants_are_overridable) {
  PlanRequest r = request(hgx8(), deepseek_v3(4096));
  r.cost_model.nvlink_link_gbps = 50.0;  // NVLink 5
  r.cost_model.nvlink_efficiency = 0.9;
  const Plan p = make_plan(r);
  BOOST_TEST(p.traffic.dispatch.time_us == 4096.0 * 14336.0 * 3.5 / (18 * 50.0 * 0.9 * 1e9) * 1e6,
             tt::tolerance(1e-12));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(planner_plans)

BOOST_AUTO_TEST_CASE(hgx8_is_ep8_in_one_clique) {
  const Plan p = make_plan(request(hgx8(), deepseek_v3(4096)));
  BOOST_TEST(p.mesh.str() == "dp1 x ep8");
  BOOST_TEST(p.local_experts == 32);
  BOOST_TEST_REQUIRE(p.ep_groups.size() == 1u);
  BOOST_TEST(p.ep_groups[0].nvlink_clique);
  BOOST_TEST(p.ep_groups[0].ranks == iota(0, 8), tt::per_element());
  BOOST_TEST(p.ep_groups[0].min_pair_gbps == kSwitchPort, tt::tolerance(1e-12));
  BOOST_TEST(p.ep_groups[0].numa_nodes == 2);
  for (int r = 0; r < 8; ++r) {
    BOOST_TEST(p.ranks[r].gpu == r);
    BOOST_TEST(p.ranks[r].ep_index == r);
    BOOST_TEST(p.ranks[r].first_expert == 32 * r);
  }
  BOOST_TEST(p.ranks[3].pci == "0000:48:00.0");
  std::vector<int> order;
  for (const auto& a : p.alternatives) order.push_back(a.ep_size);
  BOOST_TEST(order == (std::vector<int>{8, 4, 2, 1}), tt::per_element());
  BOOST_TEST((p.alternatives[0].traffic == p.traffic));
  BOOST_TEST((p.alternatives[1].node_groups == std::vector<std::vector<int>>{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  BOOST_TEST(p.alternatives[3].traffic.time_us == 0.0);
  BOOST_TEST(p.reason.find("largest feasible EP size") != std::string::npos, p.reason);
  // the router specs: tokens over (dp, ep), expert axis whole, aux loss psum with the global token count
  bool saw_logits = false, saw_loss = false;
  for (const auto& e : p.router_shardings) {
    if (e.op == "topk_router" && e.tensor == "logits") {
      saw_logits = true;
      BOOST_TEST(e.spec.str() == "P(('dp', 'ep'), None)");
    }
    if (e.op == "aux_loss" && e.tensor == "loss") {
      saw_loss = true;
      BOOST_TEST(e.spec.partial == (std::vector<std::string>{"dp", "ep"}), tt::per_element());
    }
  }
  BOOST_TEST(saw_logits);
  BOOST_TEST(saw_loss);
  BOOST_TEST(p.global_num_tokens == 4096 * 8);
}

BOOST_AUTO_TEST_CASE(vm2_is_ep2) {
  const Plan p = make_plan(request(vm2(), deepseek_v3(4096)));
  BOOST_TEST(p.mesh.str() == "dp1 x ep2");
  BOOST_TEST(p.ep_groups[0].nvlink_clique);
  BOOST_TEST(p.ranks[0].pci == "0000:00:06.0");
  BOOST_TEST(p.ranks[1].pci == "0000:00:07.0");
  BOOST_TEST(p.local_experts == 128);
  BOOST_TEST(p.warnings.size() == 1u);  // the topology's "NVSwitch hidden" warning is passed on
}

BOOST_AUTO_TEST_CASE(pcie_pairs_ep2_per_island_or_cross_island_with_cost) {
  const Plan p = make_plan(request(pcie_pairs4(), deepseek_v3(4096)));
  BOOST_TEST(p.mesh.str() == "dp2 x ep2");
  BOOST_TEST_REQUIRE(p.ep_groups.size() == 2u);
  BOOST_TEST(p.ranks[0].gpu == 0);
  BOOST_TEST(p.ranks[1].gpu == 1);
  BOOST_TEST(p.ranks[2].gpu == 2);
  BOOST_TEST(p.ep_groups[1].nvlink_clique);
  BOOST_TEST(p.ep_groups[0].min_pair_gbps == 4 * 25.0 * 0.82, tt::tolerance(1e-12));
  BOOST_TEST_REQUIRE(p.alternatives.size() == 3u);
  BOOST_TEST(p.alternatives[1].ep_size == 4);  // cross-island, listed with its predicted cost
  BOOST_TEST(!p.alternatives[1].nvlink_clique_groups);
  BOOST_TEST(p.alternatives[1].traffic.time_us > p.traffic.time_us);
  BOOST_TEST(p.alternatives[1].note.find("largest NVLink clique: 2") != std::string::npos, p.alternatives[1].note);
  BOOST_TEST(p.alternatives[2].ep_size == 1);
  // forcing EP4: the best alternative, with the reason
  PlanRequest r = request(pcie_pairs4(), deepseek_v3(4096));
  r.constraints.fixed_ep_size = 4;
  const Plan f = make_plan(r);
  BOOST_TEST(f.ep_size() == 4);
  BOOST_TEST(!f.ep_groups[0].nvlink_clique);
  BOOST_TEST(f.reason.find("forced") != std::string::npos);
  BOOST_TEST(f.reason.find("PCIe") != std::string::npos, f.reason);
  BOOST_TEST(f.alternatives[1].ep_size == 2);
}

BOOST_AUTO_TEST_CASE(dgx1_cliques_of_four) {
  const Plan p = make_plan(request(dgx1(), deepseek_v3(4096)));
  BOOST_TEST(p.mesh.str() == "dp2 x ep4");
  BOOST_TEST_REQUIRE(p.ep_groups.size() == 2u);
  for (int r = 0; r < 8; ++r) BOOST_TEST(p.ranks[r].gpu == r);
  BOOST_TEST(p.ep_groups[0].nvlink_clique);
  BOOST_TEST(p.ep_groups[0].numa_nodes == 1);
  BOOST_TEST(p.ep_groups[0].min_pair_gbps == 25.0 * 0.82, tt::tolerance(1e-12));
  // EP2: the pairs with two bonded links (largest minimum pair bandwidth), lowest ids first
  const PlanCandidate* ep2 = nullptr;
  const PlanCandidate* ep8 = nullptr;
  for (const auto& a : p.alternatives) {
    if (a.ep_size == 2) ep2 = &a;
    if (a.ep_size == 8) ep8 = &a;
  }
  BOOST_TEST_REQUIRE(ep2);
  BOOST_TEST((ep2->node_groups == std::vector<std::vector<int>>{{0, 3}, {1, 2}, {4, 7}, {5, 6}}));
  BOOST_TEST_REQUIRE(ep8);
  BOOST_TEST(!ep8->nvlink_clique_groups);
  BOOST_TEST(p.alternatives[0].ep_size == 4);
  BOOST_TEST(p.alternatives[1].ep_size == 2);
  BOOST_TEST(p.alternatives[2].ep_size == 8);
}

BOOST_AUTO_TEST_CASE(two_hgx_nodes_ep_inside_dp_across_unless_forced) {
  const Plan p = make_plan(request(hgx8(), deepseek_v3(4096), 2, 48.0));
  BOOST_TEST(p.mesh.str() == "dp2 x ep8");
  BOOST_TEST_REQUIRE(p.ep_groups.size() == 2u);
  for (int r = 0; r < 16; ++r) {
    BOOST_TEST(p.ranks[r].node == r / 8);
    BOOST_TEST(p.ranks[r].gpu == r % 8);
    BOOST_TEST(p.ranks[r].dp_index == r / 8);
  }
  BOOST_TEST(p.ep_groups[1].num_nodes == 1);
  BOOST_TEST(p.traffic.dispatch.bytes_network == 0.0);
  BOOST_TEST(p.reason.find("DP2 across the 2 nodes") != std::string::npos, p.reason);
  std::vector<int> order;
  for (const auto& a : p.alternatives) order.push_back(a.ep_size);
  BOOST_TEST(order == (std::vector<int>{8, 4, 2, 16, 1}), tt::per_element());
  BOOST_TEST(p.alternatives[3].nodes_per_group == 2);
  BOOST_TEST(!p.alternatives[3].nvlink_clique_groups);
  // forced EP16 spans both nodes
  PlanRequest r = request(hgx8(), deepseek_v3(4096), 2, 48.0);
  r.constraints.fixed_ep_size = 16;
  const Plan f = make_plan(r);
  BOOST_TEST(f.mesh.str() == "dp1 x ep16");
  BOOST_TEST(f.ep_groups[0].num_nodes == 2);
  BOOST_TEST(!f.ep_groups[0].nvlink_clique);
  BOOST_TEST(f.ep_groups[0].min_pair_gbps == 48.0);
  BOOST_TEST(f.traffic.time_us > p.traffic.time_us);
  BOOST_TEST(f.reason.find("forced") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(constraints_shape_the_choice) {
  PlanRequest r = request(hgx8(), deepseek_v3(4096));
  r.constraints.max_ep_size = 4;
  BOOST_TEST(make_plan(r).ep_size() == 4);
  r.constraints = {};
  r.constraints.local_expert_alignment = 64;  // E/EP multiple of 64: EP <= 4
  BOOST_TEST(make_plan(r).ep_size() == 4);
  r.constraints = {};
  r.layer.num_experts = 96;  // 96 = 32 * 3: EP8 still divides
  r.layer.num_groups = 8;
  BOOST_TEST(make_plan(r).ep_size() == 8);
  r.layer.num_experts = 100;  // EP4 is the largest divisor of both 100 and 8
  r.layer.group_topk = 0;
  r.layer.num_groups = 0;
  const Plan p = make_plan(r);
  BOOST_TEST(p.ep_size() == 4);
  BOOST_TEST(p.reason.find("num_experts (100) is not a multiple of 8") != std::string::npos, p.reason);
}

BOOST_AUTO_TEST_CASE(plans_are_deterministic_and_scale_to_1024_gpus) {
  for (int nodes : {1, 2, 16, 128}) {
    const PlanRequest r = request(hgx8(), deepseek_v3(4096), nodes, 48.0);
    const Plan a = make_plan(r), b = make_plan(r);
    BOOST_TEST((a == b));
    BOOST_TEST(plan_to_json(a) == plan_to_json(b));
    BOOST_TEST(a.world_size() == 8 * nodes);
    BOOST_TEST(a.ep_size() == 8);
  }
  // sub-node worlds
  for (int n : {1, 2, 4}) BOOST_TEST(make_plan(request(switch_node(n, 18), deepseek_v3(128))).ep_size() == n);
}

BOOST_AUTO_TEST_CASE(report_names_the_plan) {
  const std::string text = plan_report(make_plan(request(hgx8(), deepseek_v3(4096), 2, 48.0)));
  for (const char* needle : {"plan: DP2 x EP8 = 16 ranks", "NVLink clique", "alternatives (ranked)",
                             "dispatch:", "P(('dp', 'ep'), None)", "node 1 GPUs 0-7"})
    BOOST_TEST(text.find(needle) != std::string::npos, needle << " in\n" << text);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(planner_json)

BOOST_AUTO_TEST_CASE(round_trip_is_exact) {
  std::vector<PlanRequest> reqs = {request(hgx8(), deepseek_v3(4096)), request(vm2(), deepseek_v3(128)),
                                   request(pcie_pairs4(), deepseek_v3(4096)), request(dgx1(), deepseek_v3(4096)),
                                   request(hgx8(), deepseek_v3(4096), 2, 48.0)};
  reqs.back().constraints.fixed_ep_size = 16;
  reqs[0].layer.dispatch_dtype = TokenDType::FP8;
  reqs[3].layer.routing_model = RoutingModel::GroupUniformExperts;
  for (const auto& r : reqs) {
    const Plan p = make_plan(r);
    const std::string j = plan_to_json(p);
    const Plan q = plan_from_json(j);
    BOOST_TEST((q == p), "round trip differs for " << p.mesh.str());
    BOOST_TEST(plan_to_json(q) == j);
    BOOST_TEST(plan_to_json(q, -1) == plan_to_json(p, -1));
  }
}

BOOST_AUTO_TEST_CASE(malformed_json_is_a_typed_error) {
  const std::string good = plan_to_json(make_plan(request(hgx8(), deepseek_v3(64))));
  check_throws([] { plan_from_json("{"); }, Rule::ConfigValue, "(root)", "not valid JSON");
  check_throws([] { plan_from_json("[]"); }, Rule::ConfigValue, "(root)", "expected an object");
  std::string s = good;
  s.replace(s.find("kokkosmoe-plan"), 14, "kokkosmoe-topo");
  check_throws([&] { plan_from_json(s); }, Rule::ConfigValue, "format", "kokkosmoe-topo");
  s = good;
  s.replace(s.find("\"version\": 1"), 12, "\"version\": 7");
  check_throws([&] { plan_from_json(s); }, Rule::ConfigValue, "version", "got 7");
  s = good;
  s.replace(s.find("\"dispatch_dtype\": \"bf16\""), 24, "\"dispatch_dtype\": \"fp4\"");
  check_throws([&] { plan_from_json(s); }, Rule::ConfigValue, "layer.dispatch_dtype", "fp4");
  s = good;
  s.replace(s.find("\"topk\": 8"), 9, "\"topk\": \"8\"");
  check_throws([&] { plan_from_json(s); }, Rule::ConfigValue, "layer.topk", "expected an integer");
  s = good;
  const auto at = s.find("\"reason\"");
  s.replace(at, 8, "\"reasons\"");
  check_throws([&] { plan_from_json(s); }, Rule::ConfigValue, "reason", "missing");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(planner_errors)

BOOST_AUTO_TEST_CASE(bad_requests_say_what_to_change) {
  auto plan = [](PlanRequest r) { return [r] { make_plan(r); }; };
  PlanRequest r = request(hgx8(), deepseek_v3(4096));
  r.layer.topk = 300;
  check_throws(plan(r), Rule::TopkRange, "topk", "must be in [1, num_experts = 256]");
  r = request(hgx8(), deepseek_v3(4096));
  r.layer.num_experts = 250;
  check_throws(plan(r), Rule::GroupDivisibility, "num_groups", "multiple of num_groups (8)");
  r = request(hgx8(), deepseek_v3(4096));
  r.layer.topk = 6;
  check_throws(plan(r), Rule::TopkGroupDivisibility, "group_topk", "multiple of group_topk (4)");
  r = request(hgx8(), deepseek_v3(4096));
  r.layer.num_experts = 0;
  check_throws(plan(r), Rule::NumExpertsPositive, "num_experts", "must be >= 1");
  r = request(hgx8(), deepseek_v3(4096));
  r.constraints.fixed_ep_size = 16;
  check_throws(plan(r), Rule::PlanInfeasible, "fixed_ep_size", "exceeds the 8 GPUs (1 node x 8); lower it");
  r.cluster.num_nodes = 2;
  r.cluster.inter_node_gbps = 48;
  r.layer.num_experts = 264;  // 33 groups of 8
  r.layer.num_groups = 33;
  r.layer.group_topk = 4;
  check_throws(plan(r), Rule::PlanInfeasible, "fixed_ep_size",
               "num_experts (264) is not a multiple of 16; feasible EP sizes here: 1, 2, 3, 4, 6, 8");
  r = request(hgx8(), deepseek_v3(4096));
  r.constraints.fixed_ep_size = 8;
  r.constraints.max_ep_size = 4;
  check_throws(plan(r), Rule::PlanInfeasible, "fixed_ep_size", "exceeds max_ep_size (4)");
  r = request(hgx8(), deepseek_v3(4096));
  r.constraints.local_expert_alignment = 3;  // 256 / EP is a power of two
  check_throws(plan(r), Rule::PlanInfeasible, "constraints", "local_expert_alignment (3)");
  r = request(hgx8(), deepseek_v3(4096), 2, 0.0);
  check_throws(plan(r), Rule::ConfigValue, "inter_node_gbps", "set inter_node_gbps");
  r = request(NvlinkTopology{}, deepseek_v3(4096));
  check_throws(plan(r), Rule::PlanInfeasible, "cluster", "has no GPUs");
  r = request(hgx8(), deepseek_v3(4096));
  r.cluster.node.pairs.pop_back();
  check_throws(plan(r), Rule::TopologyMalformed, "node", "expected n*n = 64");
  r = request(hgx8(), deepseek_v3(4096));
  r.cost_model.nvlink_efficiency = 0;
  check_throws(plan(r), Rule::ConfigValue, "cost_model", "efficiencies must be in [0.001, 1]");
  r = request(hgx8(), deepseek_v3(-1));
  check_throws(plan(r), Rule::ConfigValue, "tokens_per_rank", ">= 0");
  r = request(hgx8(), deepseek_v3(4096));
  r.layer.hidden_size = 0;
  check_throws(plan(r), Rule::ConfigValue, "hidden_size", ">= 1");
  r = request(hgx8(), deepseek_v3(4096));
  r.cluster.num_nodes = 0;
  check_throws(plan(r), Rule::ConfigValue, "num_nodes", ">= 1");
  check_throws([] { rank_hit_probabilities(deepseek_v3(1), 3); }, Rule::PlanInfeasible, "ep_size", "must divide");
  check_throws([] { expected_destinations_uniform(8, 9, 2); }, Rule::PlanInfeasible, "num_experts, topk, ep_size",
               "k = 9");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(planner_gate)

BOOST_AUTO_TEST_CASE(clique_gate_answers_with_reasons) {
  const GateResult a = nvlink_clique_gate(hgx8(), 8);
  BOOST_TEST(a.satisfied);
  BOOST_TEST(static_cast<bool>(a));
  BOOST_TEST(a.gpus == iota(0, 8), tt::per_element());
  const GateResult b = nvlink_clique_gate(hgx8(), 9);
  BOOST_TEST(!b.satisfied);
  BOOST_TEST(b.reason.find("only 8 GPUs detected") != std::string::npos, b.reason);
  const GateResult c = nvlink_clique_gate(pcie_pairs4(), 2);
  BOOST_TEST(c.satisfied);
  BOOST_TEST(c.gpus == (std::vector<int>{0, 1}), tt::per_element());
  const GateResult d = nvlink_clique_gate(pcie_pairs4(), 3);
  BOOST_TEST(!d.satisfied);
  BOOST_TEST(d.reason.find("largest NVLink clique is GPUs 0,1 (2 GPUs)") != std::string::npos, d.reason);
  const GateResult e = nvlink_clique_gate(NvlinkTopology{}, 2);
  BOOST_TEST(!e.satisfied);
  BOOST_TEST(e.reason.find("no GPU detected") != std::string::npos, e.reason);
  NvlinkTopology pcie = empty_node(2);
  const GateResult f = nvlink_clique_gate(pcie, 2);
  BOOST_TEST(!f.satisfied);
  BOOST_TEST(f.reason.find("PCIe only") != std::string::npos, f.reason);
  pcie.nvlink_known = false;
  pcie.source = NvlinkTopology::Source::Live;
  BOOST_TEST(nvlink_clique_gate(pcie, 2).reason.find("NVLinks are unknown") != std::string::npos);
  const GateResult g = nvlink_clique_gate(dgx1(), 4);
  BOOST_TEST(g.satisfied);
  BOOST_TEST(g.gpus == iota(0, 4), tt::per_element());
  BOOST_TEST(!nvlink_clique_gate(dgx1(), 5).satisfied);
  check_throws([] { nvlink_clique_gate(hgx8(), 0); }, Rule::ConfigValue, "min_gpus", ">= 1");
}

BOOST_AUTO_TEST_SUITE_END()
