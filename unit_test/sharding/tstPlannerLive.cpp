/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// The planner on the live machine, behind the resource gate: runs only where >= 2 GPUs share one NVLink clique
// (or where KOKKOSMOE_TOPO_XML names a fixture that has them). Otherwise every case is skipped with the gate's
// reason, printed as "skipped: <reason>", which ctest's SKIP_REGULAR_EXPRESSION turns into a skipped test.

#include <KokkosMoE_Planner.hpp>
#include <KokkosMoE_ResourceGate.hpp>
#include <KokkosMoE_Topology.hpp>

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <iostream>
#include <string>

#include "tstPlannerHelpers.hpp"

namespace utf = boost::unit_test;
using namespace KokkosMoE;

namespace {

// A Boost.Test precondition over the gate; prints the reason once when the gate is closed.
struct CliqueGate {
  int min_gpus;
  boost::test_tools::assertion_result operator()(utf::test_unit_id) const {
    static const GateResult gate = nvlink_clique_gate(min_gpus);
    static bool printed = false;
    if (!gate.satisfied && !printed) {
      std::cout << "skipped: " << gate.reason << std::endl;
      printed = true;
    }
    boost::test_tools::assertion_result r(gate.satisfied);
    r.message() << gate.reason;
    return r;
  }
};

}  // namespace

BOOST_AUTO_TEST_SUITE(planner_live, *utf::precondition(CliqueGate{2}))

BOOST_AUTO_TEST_CASE(live_plan_keeps_ep_groups_in_the_clique) {
  const NvlinkTopology node = detect_topology();
  const GateResult gate = nvlink_clique_gate(node, 2);
  BOOST_TEST_REQUIRE(gate.satisfied);
  const Plan p = make_plan(Test::request(node, Test::deepseek_v3(4096)));
  BOOST_TEST(p.ep_size() >= 2);
  for (const auto& g : p.ep_groups) BOOST_TEST(g.nvlink_clique);
  // every GPU of rank 0's group is in one maximal clique of the machine
  bool inside = false;
  for (const auto& c : node.cliques) {
    bool all = true;
    for (int r : p.ep_groups[0].ranks) all = all && std::count(c.begin(), c.end(), p.ranks[r].gpu) == 1;
    inside = inside || all;
  }
  BOOST_TEST(inside);
  // a CUDA device maps to its rank through its PCI bus id
  for (const auto& rp : p.ranks) BOOST_TEST(node.find_gpu(*PciAddress::parse(rp.pci)).value() == rp.gpu);
}

BOOST_AUTO_TEST_SUITE_END()
