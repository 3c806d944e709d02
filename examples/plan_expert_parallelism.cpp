/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// From the machine to an expert-parallel layout: detect the NVLink topology (hwloc, and NVML when a driver is
// there; or the hwloc XML fixture that KOKKOSMOE_TOPO_XML names), then plan the DP x EP mesh of a DeepSeek-V3 layer
// on it (docs/planner.md). Plain C++: the planner needs no Kokkos.
#include <KokkosMoE_Error.hpp>
#include <KokkosMoE_Planner.hpp>
#include <KokkosMoE_RouterPresets.hpp>
#include <KokkosMoE_Topology.hpp>

#include <iostream>

int main() {
  try {
    //! [plan]
    KokkosMoE::PlanRequest request;
    request.cluster.node = KokkosMoE::detect_topology();  // hwloc + NVML (or a fixture)
    request.layer = KokkosMoE::moe_layer_from_preset(KokkosMoE::router_preset("deepseek-v3"), /*tokens_per_rank=*/4096);
    const KokkosMoE::Plan plan = KokkosMoE::make_plan(request);  // DP x EP mesh, rank -> GPU, EP groups
    std::cout << KokkosMoE::plan_report(plan);
    //! [plan]
    std::cout << "plan_expert_parallelism: OK (" << plan.world_size() << " ranks)\n";
    return 0;
  } catch (const std::exception& e) {  // no GPU here, a malformed fixture, ...
    std::cout << "plan_expert_parallelism: no plan: " << e.what() << "\n";
    return 1;
  }
}
