/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// The NVLink-clique resource gate over a given topology (no detection here; see ..._ResourceGateLive.cpp).

#include <KokkosMoE_ResourceGate.hpp>

#include <impl/KokkosMoE_Planner_Internal.hpp>

#include <algorithm>
#include <string>

namespace KokkosMoE {

GateResult nvlink_clique_gate(const NvlinkTopology& topo, int min_gpus) {
  if (min_gpus < 1)
    throw InvalidArgument("nvlink_clique_gate", "min_gpus", Rule::ConfigValue,
                          "min_gpus (" + std::to_string(min_gpus) + ") must be >= 1");
  Impl::validate_node("nvlink_clique_gate", topo);
  GateResult r;
  r.required = min_gpus;
  const int n = topo.num_gpus();
  const std::string need =
      "need " + std::to_string(min_gpus) + " GPU" + (min_gpus == 1 ? "" : "s") + " in one NVLink clique";
  if (n < min_gpus) {
    r.reason = (n == 0 ? std::string("no GPU detected")
                       : "only " + std::to_string(n) + " GPU" + (n == 1 ? "" : "s") + " detected") +
               " (" + need + ")";
    if (!topo.warnings.empty()) r.reason += "; topology: " + topo.warnings.front();
    for (int i = 0; i < n; ++i) r.gpus.push_back(i);
    return r;
  }
  const auto cliques = Impl::node_cliques(topo, nullptr);
  const std::vector<int>* largest = nullptr;
  for (const auto& c : cliques)
    if (!largest || c.size() > largest->size()) largest = &c;  // first largest: lowest ids
  if (largest && static_cast<int>(largest->size()) >= min_gpus) {
    r.satisfied = true;
    r.gpus.assign(largest->begin(), largest->begin() + min_gpus);
    r.reason = "GPUs " + Impl::ids_text(*largest) + " form an NVLink clique of " + std::to_string(largest->size()) +
               " (" + need + ")";
    return r;
  }
  if (largest) r.gpus = *largest;
  const int size = largest ? static_cast<int>(largest->size()) : 0;
  if (!topo.nvlink_known && topo.source != NvlinkTopology::Source::None)
    r.reason = std::to_string(n) +
               " GPUs, but their NVLinks are unknown (no NVML, or a fixture without an "
               "NVLinkBandwidth matrix), so no NVLink clique can be confirmed (" +
               need + ")";
  else if (size <= 1)
    r.reason = "the " + std::to_string(n) + " GPUs have no NVLink peers (PCIe only); " + need;
  else
    r.reason = "the largest NVLink clique is GPUs " + Impl::ids_text(*largest) + " (" + std::to_string(size) +
               " GPUs); " + need;
  return r;
}

}  // namespace KokkosMoE
