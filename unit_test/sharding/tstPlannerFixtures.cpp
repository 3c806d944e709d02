/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// Expected plans on the topology fixtures of unit_test/fixtures (docs/topology.md §6), loaded through the public
// loader, and the agreement of the in-memory stand-ins of tstPlannerHelpers.hpp with them.

#include <KokkosMoE_Planner.hpp>
#include <KokkosMoE_ResourceGate.hpp>
#include <KokkosMoE_Topology.hpp>

#include <boost/test/unit_test.hpp>

#include <string>
#include <vector>

#include "tstPlannerHelpers.hpp"

namespace tt = boost::test_tools;
using namespace KokkosMoE;
using namespace KokkosMoE::Test;

namespace {

NvlinkTopology fixture(const std::string& name) {
  return load_topology_xml_file(std::string(KOKKOSMOE_TEST_FIXTURES) + "/" + name + ".xml");
}

// The parts of two plans that depend only on the link structure (not on PCI addresses, models or sources).
void check_same_structure(const Plan& a, const Plan& b) {
  BOOST_TEST_REQUIRE(a.alternatives.size() == b.alternatives.size());
  for (std::size_t i = 0; i < a.alternatives.size(); ++i) {
    const PlanCandidate &x = a.alternatives[i], &y = b.alternatives[i];
    BOOST_TEST(x.ep_size == y.ep_size);
    BOOST_TEST(x.nvlink_clique_groups == y.nvlink_clique_groups);
    BOOST_TEST((x.node_groups == y.node_groups));
    BOOST_TEST(x.traffic.time_us == y.traffic.time_us, tt::tolerance(1e-12));
    BOOST_TEST(x.traffic.dispatch.bytes_sent == y.traffic.dispatch.bytes_sent, tt::tolerance(1e-12));
  }
}

std::vector<int> ep_order(const Plan& p) {
  std::vector<int> v;
  for (const auto& a : p.alternatives) v.push_back(a.ep_size);
  return v;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(planner_fixtures)

BOOST_AUTO_TEST_CASE(hgx_h100_8gpu_4sw_is_ep8_in_one_clique) {
  const NvlinkTopology node = fixture("hgx_h100_8gpu_4sw");
  const Plan p = make_plan(request(node, deepseek_v3(4096)));
  BOOST_TEST(p.mesh.str() == "dp1 x ep8");
  BOOST_TEST(p.ep_groups[0].nvlink_clique);
  BOOST_TEST(p.ep_groups[0].min_pair_gbps == 18 * 25.0 * 0.82, tt::tolerance(1e-12));
  BOOST_TEST(p.ep_groups[0].numa_nodes == 2);
  BOOST_TEST(p.cluster.topology_source == "hwloc-xml");
  BOOST_TEST(p.cluster.gpu_model == node.gpus[0].model);
  for (int r = 0; r < 8; ++r) BOOST_TEST(p.ranks[r].pci == node.gpus[r].pci.str());
  BOOST_TEST(ep_order(p) == (std::vector<int>{8, 4, 2, 1}), tt::per_element());
  BOOST_TEST((p.alternatives[1].node_groups == std::vector<std::vector<int>>{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  check_same_structure(p, make_plan(request(hgx8(), deepseek_v3(4096))));
}

BOOST_AUTO_TEST_CASE(h200_2gpu_vm_is_ep2) {
  const Plan p = make_plan(request(fixture("h200_2gpu_vm_hidden_switch"), deepseek_v3(4096)));
  BOOST_TEST(p.mesh.str() == "dp1 x ep2");
  BOOST_TEST(p.ep_groups[0].nvlink_clique);
  BOOST_TEST(p.ranks[0].pci == "0000:00:06.0");
  BOOST_TEST(p.ranks[1].pci == "0000:00:07.0");
  bool hidden_warning = false;
  for (const auto& w : p.warnings) hidden_warning = hidden_warning || w.find("NVSwitch hidden") != std::string::npos;
  BOOST_TEST(hidden_warning);
  check_same_structure(p, make_plan(request(vm2(), deepseek_v3(4096))));
}

BOOST_AUTO_TEST_CASE(pcie_pairs_4gpu_ep2_per_island_or_cross_island) {
  const NvlinkTopology node = fixture("pcie_pairs_4gpu");
  const Plan p = make_plan(request(node, deepseek_v3(4096)));
  BOOST_TEST(p.mesh.str() == "dp2 x ep2");
  BOOST_TEST(ep_order(p) == (std::vector<int>{2, 4, 1}), tt::per_element());
  BOOST_TEST(!p.alternatives[1].nvlink_clique_groups);
  BOOST_TEST(p.alternatives[1].traffic.time_us > p.traffic.time_us);
  BOOST_TEST(p.alternatives[1].traffic.dispatch.bytes_pcie > 0.0);
  check_same_structure(p, make_plan(request(pcie_pairs4(), deepseek_v3(4096))));
  PlanRequest r = request(node, deepseek_v3(4096));
  r.constraints.fixed_ep_size = 4;
  const Plan f = make_plan(r);
  BOOST_TEST(f.ep_size() == 4);
  BOOST_TEST(f.reason.find("largest NVLink clique: 2 GPUs") != std::string::npos, f.reason);
}

BOOST_AUTO_TEST_CASE(dgx1_like_mesh_cliques_of_four) {
  const Plan p = make_plan(request(fixture("dgx1_like_mesh_8gpu"), deepseek_v3(4096)));
  BOOST_TEST(p.mesh.str() == "dp2 x ep4");
  BOOST_TEST(p.ep_groups[0].nvlink_clique);
  BOOST_TEST(p.ep_groups[1].nvlink_clique);
  for (int r = 0; r < 8; ++r) BOOST_TEST(p.ranks[r].gpu == r);
  BOOST_TEST(ep_order(p) == (std::vector<int>{4, 2, 8, 1}), tt::per_element());
  BOOST_TEST((p.alternatives[1].node_groups == std::vector<std::vector<int>>{{0, 3}, {1, 2}, {4, 7}, {5, 6}}));
  check_same_structure(p, make_plan(request(dgx1(), deepseek_v3(4096))));
}

BOOST_AUTO_TEST_CASE(two_hgx_nodes_ep_inside_dp_across_unless_forced) {
  const NvlinkTopology node = fixture("hgx_h100_8gpu_4sw");
  const Plan p = make_plan(request(node, deepseek_v3(4096), 2, 48.0));
  BOOST_TEST(p.mesh.str() == "dp2 x ep8");
  for (const auto& g : p.ep_groups) {
    BOOST_TEST(g.num_nodes == 1);
    BOOST_TEST(g.nvlink_clique);
  }
  BOOST_TEST(p.traffic.dispatch.bytes_network == 0.0);
  BOOST_TEST(ep_order(p) == (std::vector<int>{8, 4, 2, 16, 1}), tt::per_element());
  PlanRequest r = request(node, deepseek_v3(4096), 2, 48.0);
  r.constraints.fixed_ep_size = 16;
  const Plan f = make_plan(r);
  BOOST_TEST(f.mesh.str() == "dp1 x ep16");
  BOOST_TEST(f.ep_groups[0].num_nodes == 2);
  BOOST_TEST(f.traffic.dispatch.bytes_network > 0.0);
  BOOST_TEST(f.ranks[8].node == 1);
  BOOST_TEST(f.ranks[8].gpu == 0);
}

BOOST_AUTO_TEST_CASE(dgx2_like_16gpu_is_one_clique_of_16) {
  const Plan p = make_plan(request(fixture("dgx2_like_16gpu_12sw"), deepseek_v3(4096)));
  BOOST_TEST(p.mesh.str() == "dp1 x ep16");
  BOOST_TEST(p.ep_groups[0].nvlink_clique);
  BOOST_TEST(p.ep_groups[0].min_pair_gbps == 6 * 25.0 * 0.82, tt::tolerance(1e-12));
}

BOOST_AUTO_TEST_CASE(no_gpu_and_unknown_links) {
  try {
    make_plan(request(fixture("no_gpu"), deepseek_v3(4096)));
    BOOST_ERROR("a topology without GPUs must be rejected");
  } catch (const InvalidArgument& e) {
    BOOST_TEST(rule_name(e.rule()) == std::string("plan_infeasible"));
  }
  const Plan p = make_plan(request(fixture("gpu_without_matrix"), deepseek_v3(4096)));
  bool warned = false;
  for (const auto& w : p.warnings) warned = warned || w.find("no NVLink information") != std::string::npos;
  BOOST_TEST(warned);
  BOOST_TEST(!p.alternatives[0].nvlink_clique_groups);
}

BOOST_AUTO_TEST_CASE(plans_from_fixtures_round_trip_through_json) {
  for (const char* name : {"hgx_h100_8gpu_4sw", "h200_2gpu_vm_hidden_switch", "pcie_pairs_4gpu", "dgx1_like_mesh_8gpu",
                           "dgx2_like_16gpu_12sw", "power8_like_gpu_cpu"}) {
    const Plan p = make_plan(request(fixture(name), deepseek_v3(4096), 2, 25.0));
    BOOST_TEST((plan_from_json(plan_to_json(p)) == p), name);
  }
}

BOOST_AUTO_TEST_CASE(gate_on_fixtures) {
  BOOST_TEST(nvlink_clique_gate(fixture("hgx_h100_8gpu_4sw"), 8).satisfied);
  BOOST_TEST(nvlink_clique_gate(fixture("h200_2gpu_vm_hidden_switch"), 2).satisfied);
  const GateResult pcie = nvlink_clique_gate(fixture("pcie_pairs_4gpu"), 4);
  BOOST_TEST(!pcie.satisfied);
  BOOST_TEST(pcie.reason.find("largest NVLink clique is GPUs 0,1") != std::string::npos, pcie.reason);
  DetectOptions o;
  o.xml_path = std::string(KOKKOSMOE_TEST_FIXTURES) + "/dgx1_like_mesh_8gpu.xml";
  BOOST_TEST(nvlink_clique_gate(4, o).satisfied);  // the detecting overload, on a fixture
  BOOST_TEST(!nvlink_clique_gate(5, o).satisfied);
  o.xml_path = std::string(KOKKOSMOE_TEST_FIXTURES) + "/malformed_truncated.xml";
  const GateResult bad = nvlink_clique_gate(2, o);
  BOOST_TEST(!bad.satisfied);
  BOOST_TEST(bad.reason.find("topology detection failed") != std::string::npos, bad.reason);
}

BOOST_AUTO_TEST_SUITE_END()
