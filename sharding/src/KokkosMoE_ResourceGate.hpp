/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_RESOURCEGATE_HPP
#define KOKKOSMOE_RESOURCEGATE_HPP

/// \file KokkosMoE_ResourceGate.hpp
/// \brief "Are there >= N GPUs in one NVLink clique here?" for multi-GPU tests and launchers (docs/planner.md §7).
///
/// A test that cannot run for lack of hardware reports *skipped* with the gate's reason, never *passed*: a Boost.Test
/// precondition plus ctest's SKIP_REGULAR_EXPRESSION, or exit code 77 with SKIP_RETURN_CODE 77 for a whole
/// executable. Plain C++, no Kokkos.

#include <KokkosMoE_Topology.hpp>

#include <string>
#include <vector>

namespace KokkosMoE {

/// \brief The answer of a resource gate.
struct GateResult {
  bool satisfied = false;
  int required = 0;       ///< N
  std::vector<int> gpus;  ///< the clique that satisfies the gate (its first N members), or the largest clique
  std::string reason;     ///< why (not): "GPUs 0-1 are connected over PCIe only; the largest NVLink clique has 1 GPU"
  explicit operator bool() const { return satisfied; }
};

/// \brief Whether \p topo has at least \p min_gpus GPUs that are pairwise NVLink peers (one clique). The clique
/// comes from topo.cliques when filled, else from the pairs. Synchronous, no side effects.
/// \throws KokkosMoE::InvalidArgument (Rule::ConfigValue) if min_gpus < 1
GateResult nvlink_clique_gate(const NvlinkTopology& topo, int min_gpus);

/// \brief The same question about the live machine (or the fixture named by KOKKOSMOE_TOPO_XML / HWLOC_XMLFILE,
/// per \p options): detect_topology() then the gate. Detection failures become an unsatisfied gate whose reason
/// names the error, never an exception. NVML sees every GPU of the host: CUDA_VISIBLE_DEVICES is not applied.
GateResult nvlink_clique_gate(int min_gpus, const DetectOptions& options = {});

}  // namespace KokkosMoE

#endif
