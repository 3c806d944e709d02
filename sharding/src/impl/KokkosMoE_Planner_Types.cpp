/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// The planner's value types (KokkosMoE_Planner.hpp): their names, equality, and the layer of a router preset.

#include <impl/KokkosMoE_Planner_Internal.hpp>

namespace KokkosMoE {

const char* to_string(LinkClass c) noexcept {
  switch (c) {
    case LinkClass::Local:
      return "local";
    case LinkClass::NvlinkDirect:
      return "nvlink-direct";
    case LinkClass::NvlinkSwitch:
      return "nvlink-switch";
    case LinkClass::Pcie:
      return "pcie";
    case LinkClass::Network:
      return "network";
  }
  return "unknown";
}

MoeLayerConfig moe_layer_from_preset(const RouterPreset& preset, std::int64_t tokens_per_rank) {
  MoeLayerConfig l;
  l.num_experts = preset.num_experts;
  l.topk = preset.config.topk;
  l.num_groups = preset.config.grouped() ? preset.config.num_groups : 0;
  l.group_topk = preset.config.grouped() ? preset.config.group_topk : 0;
  l.hidden_size = preset.hidden_size;
  l.tokens_per_rank = tokens_per_rank;
  l.name = preset.name;
  return l;
}

bool MoeLayerConfig::operator==(const MoeLayerConfig& o) const {
  return num_experts == o.num_experts && topk == o.topk && num_groups == o.num_groups && group_topk == o.group_topk &&
         hidden_size == o.hidden_size && dispatch_dtype == o.dispatch_dtype && combine_dtype == o.combine_dtype &&
         tokens_per_rank == o.tokens_per_rank && routing_model == o.routing_model && name == o.name;
}
bool ClusterSummary::operator==(const ClusterSummary& o) const {
  return num_nodes == o.num_nodes && gpus_per_node == o.gpus_per_node && inter_node_gbps == o.inter_node_gbps &&
         gpu_model == o.gpu_model && topology_source == o.topology_source && gpu_pci == o.gpu_pci &&
         node_cliques == o.node_cliques;
}
bool RankPlacement::operator==(const RankPlacement& o) const {
  return rank == o.rank && node == o.node && gpu == o.gpu && pci == o.pci && dp_index == o.dp_index &&
         ep_index == o.ep_index && first_expert == o.first_expert && num_local_experts == o.num_local_experts &&
         dispatch_bytes_sent == o.dispatch_bytes_sent && dispatch_bytes_received == o.dispatch_bytes_received &&
         combine_bytes_sent == o.combine_bytes_sent && combine_bytes_received == o.combine_bytes_received;
}
bool EpGroupInfo::operator==(const EpGroupInfo& o) const {
  return ranks == o.ranks && nvlink_clique == o.nvlink_clique && num_nodes == o.num_nodes &&
         min_pair_gbps == o.min_pair_gbps && numa_nodes == o.numa_nodes;
}
bool PhaseEstimate::operator==(const PhaseEstimate& o) const {
  return row_bytes == o.row_bytes && bytes_sent == o.bytes_sent && bytes_received == o.bytes_received &&
         bytes_local == o.bytes_local && bytes_nvlink == o.bytes_nvlink && bytes_pcie == o.bytes_pcie &&
         bytes_network == o.bytes_network && time_us == o.time_us && bottleneck == o.bottleneck;
}
bool TrafficEstimate::operator==(const TrafficEstimate& o) const {
  return model == o.model && destinations_per_token == o.destinations_per_token &&
         remote_destinations_per_token == o.remote_destinations_per_token && dispatch == o.dispatch &&
         combine == o.combine && time_us == o.time_us;
}
bool PlanCandidate::operator==(const PlanCandidate& o) const {
  return dp_size == o.dp_size && ep_size == o.ep_size && local_experts == o.local_experts &&
         nvlink_clique_groups == o.nvlink_clique_groups && nodes_per_group == o.nodes_per_group &&
         node_groups == o.node_groups && gpus_used == o.gpus_used && unused_gpus == o.unused_gpus &&
         traffic == o.traffic && note == o.note;
}
bool Plan::operator==(const Plan& o) const {
  return layer == o.layer && constraints == o.constraints && cost_model == o.cost_model && cluster == o.cluster &&
         mesh == o.mesh && local_experts == o.local_experts && ranks == o.ranks && ep_groups == o.ep_groups &&
         traffic == o.traffic && router_shardings == o.router_shardings && global_num_tokens == o.global_num_tokens &&
         unused_gpus == o.unused_gpus && unused_reason == o.unused_reason && alternatives == o.alternatives &&
         reason == o.reason && warnings == o.warnings;
}

}  // namespace KokkosMoE
