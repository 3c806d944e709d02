/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_TST_PLANNER_HELPERS_HPP
#define KOKKOSMOE_TST_PLANNER_HELPERS_HPP

// In-memory node topologies with the content of the fixtures of docs/topology.md §6 (the planner logic does not
// depend on the XML loader; tstPlannerFixtures.cpp runs the same expectations on the fixture files).

#include <KokkosMoE_Planner.hpp>
#include <KokkosMoE_Topology.hpp>

#include <cstdint>
#include <utility>
#include <vector>

namespace KokkosMoE::Test {

inline NvlinkTopology empty_node(int n) {
  NvlinkTopology t;
  t.gpus.resize(n);
  for (int i = 0; i < n; ++i) {
    t.gpus[i].id = i;
    t.gpus[i].pci = PciAddress{0, static_cast<std::uint8_t>(0x18 + 0x10 * i), 0, 0};
    t.gpus[i].model = "NVIDIA H100 80GB HBM3";
    t.gpus[i].nvlink_version = 6;
    t.gpus[i].link_mbps = 25000;
  }
  t.pairs.assign(static_cast<std::size_t>(n) * n, GpuPair{});
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) t.pairs[i * n + j].pcie = i == j ? PcieLevel::Internal : PcieLevel::Sys;
  t.nvlink_known = true;
  return t;
}

inline GpuPair& pair_ref(NvlinkTopology& t, int i, int j) { return t.pairs[i * t.num_gpus() + j]; }

inline void set_direct(NvlinkTopology& t, int i, int j, int links) {
  for (auto [a, b] : {std::pair{i, j}, std::pair{j, i}}) {
    GpuPair& p = pair_ref(t, a, b);
    p.direct_links = static_cast<std::uint16_t>(links);
    p.nvlink_mbps = 25000ull * links;
    p.nvlink_p2p = true;
  }
  t.gpus[i].active_links += links;
  t.gpus[j].active_links += links;
}

/// NVSwitch node: every GPU has `links` links to the fabric (HGX H100/H200: 18; the 2-GPU VM: 18, hidden).
inline NvlinkTopology switch_node(int n, int links, bool hidden = false) {
  NvlinkTopology t = empty_node(n);
  for (int i = 0; i < n; ++i) {
    t.gpus[i].links_to_switch = links;
    t.gpus[i].active_links = links;
    t.gpus[i].numa_nodes = {i < n / 2 || n < 4 ? 0 : 1};
  }
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j)
      if (i != j) {
        GpuPair& p = pair_ref(t, i, j);
        p.switch_links = static_cast<std::uint16_t>(links);
        p.nvlink_mbps = 25000ull * links;
        p.nvlink_p2p = true;
        p.pcie = hidden ? PcieLevel::Phb : PcieLevel::Sys;
      }
  t.nvswitch_visible = hidden ? 0 : 4;
  t.nvswitch_hidden = hidden;
  std::vector<int> all(n);
  for (int i = 0; i < n; ++i) all[i] = i;
  t.islands = {all};
  t.cliques = {all};
  return t;
}

/// hgx_h100_8gpu_4sw: 8 GPUs, 18 fabric links each.
inline NvlinkTopology hgx8() { return switch_node(8, 18); }

/// h200_2gpu_vm_hidden_switch: 2 GPUs, 18 links to a hidden fabric.
inline NvlinkTopology vm2() {
  NvlinkTopology t = switch_node(2, 18, true);
  t.gpus[0].pci = PciAddress{0, 0, 6, 0};
  t.gpus[1].pci = PciAddress{0, 0, 7, 0};
  t.gpus[0].model = t.gpus[1].model = "NVIDIA H200";
  t.warnings = {"NVSwitch hidden: fabric assumed"};
  return t;
}

/// pcie_pairs_4gpu: NVLink bridges 0-1 and 2-3 (4 links each), everything else PCIe.
inline NvlinkTopology pcie_pairs4() {
  NvlinkTopology t = empty_node(4);
  set_direct(t, 0, 1, 4);
  set_direct(t, 2, 3, 4);
  for (int i = 0; i < 4; ++i) t.gpus[i].numa_nodes = {i / 2};
  t.islands = {{0, 1}, {2, 3}};
  t.cliques = {{0, 1}, {2, 3}};
  return t;
}

/// dgx1_like_mesh_8gpu: the DGX-1V hybrid cube mesh (nvidia-smi topo -m of a DGX-1V), 6 links per GPU.
inline NvlinkTopology dgx1() {
  NvlinkTopology t = empty_node(8);
  const int links[8][8] = {{0, 1, 1, 2, 2, 0, 0, 0}, {1, 0, 2, 1, 0, 2, 0, 0}, {1, 2, 0, 2, 0, 0, 1, 0},
                           {2, 1, 2, 0, 0, 0, 0, 1}, {2, 0, 0, 0, 0, 1, 1, 2}, {0, 2, 0, 0, 1, 0, 2, 1},
                           {0, 0, 1, 0, 1, 2, 0, 2}, {0, 0, 0, 1, 2, 1, 2, 0}};
  for (int i = 0; i < 8; ++i)
    for (int j = i + 1; j < 8; ++j)
      if (links[i][j]) set_direct(t, i, j, links[i][j]);
  for (int i = 0; i < 8; ++i) t.gpus[i].numa_nodes = {i / 4};
  t.islands = {{0, 1, 2, 3, 4, 5, 6, 7}};
  t.cliques = {{0, 1, 2, 3}, {0, 4}, {1, 5}, {2, 6}, {3, 7}, {4, 5, 6, 7}};
  return t;
}

/// DeepSeek-V3's MoE layer (docs/router.md §15): E = 256, top-8, 8 groups / top-4, hidden 7168.
inline MoeLayerConfig deepseek_v3(std::int64_t tokens) {
  MoeLayerConfig l;
  l.name = "deepseek-v3";
  l.num_experts = 256;
  l.topk = 8;
  l.num_groups = 8;
  l.group_topk = 4;
  l.hidden_size = 7168;
  l.tokens_per_rank = tokens;
  return l;
}

inline PlanRequest request(NvlinkTopology node, MoeLayerConfig layer, int nodes = 1, double inter_gbps = 0) {
  PlanRequest r;
  r.cluster.node = std::move(node);
  r.cluster.num_nodes = nodes;
  r.cluster.inter_node_gbps = inter_gbps;
  r.layer = std::move(layer);
  return r;
}

}  // namespace KokkosMoE::Test

#endif
