/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_PLANNER_HPP
#define KOKKOSMOE_PLANNER_HPP

/// \file KokkosMoE_Planner.hpp
/// \brief Topology-aware expert-parallel sharding planner (contract: docs/planner.md).
///
/// Input: one node's NVLink topology times a node count plus an inter-node bandwidth, a MoE layer and optional
/// constraints. Output: a Plan with the DP x EP mesh, the rank -> GPU assignment, EP groups placed inside NVLink
/// cliques whenever they fit (otherwise the best alternative and the reason), the expert placement, the expected
/// bytes per dispatch and combine from the routing statistics, a predicted time from the link bandwidths, the
/// router sharding specs and the ranked alternatives. Plain C++: no Kokkos, no CUDA; synchronous and deterministic.

#include <KokkosMoE_Error.hpp>
#include <KokkosMoE_Mesh.hpp>
#include <KokkosMoE_RouterPresets.hpp>
#include <KokkosMoE_Topology.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace KokkosMoE {

/// \brief The largest world (num_nodes * GPUs per node) make_plan() plans; larger requests throw InvalidArgument
/// (Rule::ConfigValue). 64 Ki GPUs: far beyond today's largest EP deployments, small enough that every plan stays
/// within the time and memory budget of docs/planner.md §9.
inline constexpr int kMaxPlanWorldSize = 65536;
/// \brief The most experts make_plan() and the routing statistics accept (Rule::ConfigValue above it).
inline constexpr int kMaxPlanExperts = 65536;

/// \brief Bounds of every bandwidth make_plan() accepts (GB/s per direction: CostModel, inter_node_gbps) and the
/// smallest efficiency: together with 64-bit byte counts they keep every predicted time finite.
inline constexpr double kMinPlanGbps = 1e-3;
inline constexpr double kMaxPlanGbps = 1e6;
inline constexpr double kMinPlanEfficiency = 1e-3;

/// \brief Element format of the token rows moved by dispatch or combine (docs/ep.md §9).
enum class TokenDType : int {
  BF16 = 0,  ///< 2 bytes per element
  FP16 = 1,  ///< 2 bytes per element
  FP32 = 2,  ///< 4 bytes per element
  FP8 = 3,   ///< e4m3, 1 byte per element plus one FP32 scale per 128 elements
};
/// \brief "bf16", "fp16", "fp32", "fp8".
const char* to_string(TokenDType t) noexcept;
/// \brief Inverse of to_string(TokenDType).
std::optional<TokenDType> token_dtype_from_string(std::string_view s);
/// \brief Bytes of one token row of \p hidden elements: 2H (bf16, fp16), 4H (fp32), H + 4*ceil(H/128) (fp8).
double token_row_bytes(TokenDType t, int hidden);

/// \brief Which routing statistics give the expected traffic (docs/planner.md §3). Every model is evaluated exactly.
enum class RoutingModel : int {
  /// GroupQuota when the layer is group-limited (group_topk > 0), Uniform otherwise.
  Auto = 0,
  /// Uniform top-k over all E experts, grouping ignored: R * (1 - C(E - E/R, k) / C(E, k)) destinations.
  Uniform = 1,
  /// Group-limited: the token's group_topk groups are a uniformly random subset of the num_groups groups, and each
  /// selected group contributes exactly topk/group_topk experts, uniform within the group. This is what DeepSeek-V3's
  /// group ranking (sum of the top topk/group_topk scores) produces for independent scores, up to the rare token
  /// whose final top-k skips a selected group; it bounds the simulated traffic from above by a few percent.
  GroupQuota = 2,
  /// Group-limited: groups as in GroupQuota, then the k experts a uniformly random k-subset of the group_topk *
  /// E/num_groups eligible experts (a lower estimate: selected groups may then contribute nothing).
  GroupUniformExperts = 3,
};
/// \brief "auto", "uniform", "group-quota", "group-uniform-experts".
const char* to_string(RoutingModel m) noexcept;
std::optional<RoutingModel> routing_model_from_string(std::string_view s);

/// \brief The MoE layer being planned.
struct MoeLayerConfig {
  int num_experts = 0;  ///< E
  int topk = 1;         ///< k, 1 <= k <= E
  int num_groups = 0;   ///< G (used when group_topk > 0)
  int group_topk = 0;   ///< gk; group-limited routing iff > 0 (docs/router.md §5.3 rules apply)
  int hidden_size = 0;  ///< H, elements per token row
  TokenDType dispatch_dtype = TokenDType::BF16;
  TokenDType combine_dtype = TokenDType::BF16;
  std::int64_t tokens_per_rank = 0;  ///< T, tokens each rank routes per step
  RoutingModel routing_model = RoutingModel::Auto;
  std::string name;  ///< a label (the preset name), informational

  bool grouped() const noexcept { return group_topk > 0; }
  bool operator==(const MoeLayerConfig& o) const;
  bool operator!=(const MoeLayerConfig& o) const { return !(*this == o); }
};

/// \brief The layer of a router preset: E, k, grouping and the hidden size of the model.
MoeLayerConfig moe_layer_from_preset(const RouterPreset& preset, std::int64_t tokens_per_rank);

/// \brief The machines: \p num_nodes identical copies of \p node.
struct ClusterSpec {
  NvlinkTopology node;           ///< one node (detected, or loaded from a fixture)
  int num_nodes = 1;             ///< >= 1
  double inter_node_gbps = 0.0;  ///< effective GB/s per GPU per direction between nodes; > 0 when num_nodes > 1
};

/// \brief Optional restrictions on the plan.
struct PlanConstraints {
  int fixed_ep_size = 0;           ///< > 0: exactly this EP size (forcing also allows groups across nodes/PCIe)
  int max_ep_size = 0;             ///< > 0: no EP size above this
  int local_expert_alignment = 1;  ///< E / EP must be a multiple of this (>= 1)
  /// Every GPU joins the EP mesh (EP sizes inside a node must divide it; groups that cannot be NVLink cliques go
  /// over PCIe, flagged). Default: GPUs that fit no NVLink group of the EP size are left out and reported.
  bool use_every_gpu = false;
  bool operator==(const PlanConstraints& o) const {
    return fixed_ep_size == o.fixed_ep_size && max_ep_size == o.max_ep_size &&
           local_expert_alignment == o.local_expert_alignment && use_every_gpu == o.use_every_gpu;
  }
  bool operator!=(const PlanConstraints& o) const { return !(*this == o); }
};

/// \brief The bandwidth constants of the cost model (docs/planner.md §4). Defaults: Hopper NVLink 4 and PCIe Gen5.
struct CostModel {
  double nvlink_link_gbps = 25.0;   ///< NVLink line rate per link per direction (NVLink 4; 50 for NVLink 5)
  double nvlink_efficiency = 0.82;  ///< achievable fraction: 20.5 GB/s per link, 369 GB/s for 18 links
  double pcie_gbps = 63.0;          ///< PCIe Gen5 x16 per direction
  double pcie_efficiency = 0.8;     ///< achievable fraction: 50.4 GB/s
  bool operator==(const CostModel& o) const {
    return nvlink_link_gbps == o.nvlink_link_gbps && nvlink_efficiency == o.nvlink_efficiency &&
           pcie_gbps == o.pcie_gbps && pcie_efficiency == o.pcie_efficiency;
  }
  bool operator!=(const CostModel& o) const { return !(*this == o); }
};

/// \brief Everything make_plan() needs.
struct PlanRequest {
  ClusterSpec cluster;
  MoeLayerConfig layer;
  PlanConstraints constraints;
  CostModel cost_model;
};

/// \brief How a byte travels between two ranks.
enum class LinkClass : int {
  Local = 0,         ///< the rank itself (no link time)
  NvlinkDirect = 1,  ///< dedicated GPU-to-GPU NVLinks (bridges, cube mesh)
  NvlinkSwitch = 2,  ///< through the NVSwitch fabric (a GPU's switch links are shared by all its peers)
  Pcie = 3,          ///< PCIe (the GPU's x16 link is shared by all its PCIe peers)
  Network = 4,       ///< another node (the GPU's inter-node bandwidth is shared by all remote peers)
};
/// \brief "local", "nvlink-direct", "nvlink-switch", "pcie", "network".
const char* to_string(LinkClass c) noexcept;

/// \brief The summary of the machines kept in a plan.
struct ClusterSummary {
  int num_nodes = 1;
  int gpus_per_node = 0;
  double inter_node_gbps = 0.0;
  std::string gpu_model;                       ///< of GPU 0, empty if unknown
  std::string topology_source;                 ///< to_string(NvlinkTopology::Source)
  std::vector<std::string> gpu_pci;            ///< per node-local GPU id
  std::vector<std::vector<int>> node_cliques;  ///< maximal NVLink cliques of one node (GPU ids)
  bool operator==(const ClusterSummary& o) const;
  bool operator!=(const ClusterSummary& o) const { return !(*this == o); }
};

/// \brief One rank of the plan. Ranks are numbered rank = dp_index * ep_size + ep_index.
struct RankPlacement {
  int rank = 0;
  int node = 0;          ///< node index
  int gpu = 0;           ///< node-local GPU id (NvlinkTopology::gpus index)
  std::string pci;       ///< the GPU's PCI address: map a CUDA device to its rank by bus id
  int dp_index = 0;      ///< coordinate along "dp"
  int ep_index = 0;      ///< coordinate along "ep"
  int first_expert = 0;  ///< experts [first_expert, first_expert + num_local_experts) live here
  int num_local_experts = 0;
  double dispatch_bytes_sent = 0;      ///< expected, remote only, per dispatch
  double dispatch_bytes_received = 0;  ///< expected, remote only, per dispatch
  double combine_bytes_sent = 0;       ///< expected, remote only, per combine
  double combine_bytes_received = 0;   ///< expected, remote only, per combine
  bool operator==(const RankPlacement& o) const;
  bool operator!=(const RankPlacement& o) const { return !(*this == o); }
};

/// \brief One EP group (an "ep" slice of the mesh).
struct EpGroupInfo {
  std::vector<int> ranks;      ///< global ranks, in ep_index order
  bool nvlink_clique = false;  ///< every pair is an NVLink peer on one node
  int num_nodes = 1;           ///< nodes the group spans
  double min_pair_gbps = 0;    ///< effective bandwidth of its slowest pair (0 for a group of one)
  int numa_nodes = 0;          ///< distinct NUMA nodes of its GPUs (0 = unknown)
  bool operator==(const EpGroupInfo& o) const;
  bool operator!=(const EpGroupInfo& o) const { return !(*this == o); }
};

/// \brief Expected traffic and predicted time of one dispatch or one combine, per rank.
struct PhaseEstimate {
  double row_bytes = 0;       ///< bytes of one token row (token_row_bytes of the phase's dtype)
  double bytes_sent = 0;      ///< remote bytes one rank sends (maximum over ranks)
  double bytes_received = 0;  ///< remote bytes one rank receives (maximum over ranks)
  double bytes_local = 0;     ///< bytes that stay on the rank (its own experts); logical bandwidth counts them
  double bytes_nvlink = 0;    ///< of bytes_sent, over NVLink (slowest rank)
  double bytes_pcie = 0;      ///< of bytes_sent, over PCIe (slowest rank)
  double bytes_network = 0;   ///< of bytes_sent, between nodes (slowest rank)
  double time_us = 0;         ///< predicted: the slowest rank's slowest shared or dedicated link
  std::string bottleneck;     ///< which link bounds time_us
  bool operator==(const PhaseEstimate& o) const;
  bool operator!=(const PhaseEstimate& o) const { return !(*this == o); }
};

/// \brief Routing statistics and the two phases.
struct TrafficEstimate {
  RoutingModel model = RoutingModel::Uniform;  ///< the model actually used (Auto resolved)
  double destinations_per_token = 0;           ///< expected distinct EP ranks a token goes to, its own rank included
  double remote_destinations_per_token = 0;
  PhaseEstimate dispatch;
  PhaseEstimate combine;
  double time_us = 0;  ///< dispatch + combine
  bool operator==(const TrafficEstimate& o) const;
  bool operator!=(const TrafficEstimate& o) const { return !(*this == o); }
};

/// \brief One DP x EP configuration that was considered.
struct PlanCandidate {
  int dp_size = 1;
  int ep_size = 1;
  int local_experts = 0;                      ///< E / ep_size
  bool nvlink_clique_groups = true;           ///< every EP group inside one NVLink clique
  int nodes_per_group = 1;                    ///< > 1: EP groups span nodes
  std::vector<std::vector<int>> node_groups;  ///< EP groups of node 0 as node-local GPU ids (nodes_per_group == 1)
  int gpus_used = 0;                          ///< GPUs in the EP mesh (all nodes): dp_size * ep_size
  std::vector<int> unused_gpus;               ///< node-local GPUs left out on every node (no NVLink group fits them)
  TrafficEstimate traffic;
  std::string note;  ///< why this candidate ranks where it does (fallbacks, what does not fit)
  bool operator==(const PlanCandidate& o) const;
  bool operator!=(const PlanCandidate& o) const { return !(*this == o); }
};

/// \brief A router operand and its sharding on the plan's mesh.
struct RouterShardingEntry {
  std::string op;      ///< "topk_router", "aux_loss", ...
  std::string tensor;  ///< "logits", "probs", ...
  ShardingSpec spec;
  bool operator==(const RouterShardingEntry& o) const { return op == o.op && tensor == o.tensor && spec == o.spec; }
  bool operator!=(const RouterShardingEntry& o) const { return !(*this == o); }
};

/// \brief The result of make_plan().
struct Plan {
  // the request
  MoeLayerConfig layer;
  PlanConstraints constraints;
  CostModel cost_model;
  ClusterSummary cluster;
  // the chosen configuration
  Mesh mesh;  ///< {"dp", DP} x {"ep", EP}; "ep" varies fastest
  int local_experts = 0;
  std::vector<RankPlacement> ranks;  ///< one per rank, rank order
  std::vector<EpGroupInfo> ep_groups;
  TrafficEstimate traffic;
  std::vector<RouterShardingEntry> router_shardings;  ///< from the router partition rules on `mesh`
  std::int64_t global_num_tokens = 0;                 ///< T_total for the aux loss psum (tokens_per_rank * ranks)
  std::vector<int> unused_gpus;             ///< node-local GPUs left out of the mesh on every node (see unused_reason)
  std::string unused_reason;                ///< why ("GPUs 8,9: no NVLink peer"); empty when every GPU has a rank
  std::vector<PlanCandidate> alternatives;  ///< ranked; alternatives[0] is the chosen configuration
  std::string reason;                       ///< why this configuration, including any fallback
  std::vector<std::string> warnings;

  int dp_size() const { return mesh.axis_size("dp"); }
  int ep_size() const { return mesh.axis_size("ep"); }
  int world_size() const { return mesh.num_devices(); }
  bool operator==(const Plan& o) const;
  bool operator!=(const Plan& o) const { return !(*this == o); }
};

/// \brief Plans the DP x EP layout of a MoE layer (docs/planner.md).
///
/// Candidates are the EP sizes that divide E and the world, respect the constraints and either divide the node
/// (groups inside a node) or are a multiple of it (groups of whole nodes). Ranking: EP groups inside NVLink cliques
/// first, larger EP first among them (fewer experts per GPU); then EP groups over PCIe or the network, fastest
/// first; EP = 1 (experts replicated) last. Deterministic: equal requests give equal plans.
/// \throws KokkosMoE::InvalidArgument with Rule::PlanInfeasible (what to change: E not divisible, EP larger than
/// the world, no GPUs, ...), Rule::TopkRange, Rule::NumExpertsPositive, the grouping rules of docs/router.md §4.6, or
/// Rule::ConfigValue for a non-positive size, bandwidth or efficiency
Plan make_plan(const PlanRequest& request);

/// \brief Expected distinct EP ranks a token is sent to (its own included) under uniform top-k routing with
/// contiguous expert placement: R * (1 - C(E - E/R, k) / C(E, k)), evaluated as a product of k ratios.
/// \throws KokkosMoE::InvalidArgument (Rule::PlanInfeasible) unless 1 <= k <= E and R divides E
double expected_destinations_uniform(int num_experts, int topk, int ep_size);

/// \brief Per EP rank r, the exact probability that a token sends to rank r (contiguous placement: rank r holds
/// experts [r*E/R, (r+1)*E/R)), under \p model. Computed by a DP over the groups overlapping each rank (no sampling).
/// The expected destinations per token is the sum. \throws InvalidArgument as make_plan for a bad layer
std::vector<double> rank_hit_probabilities(const MoeLayerConfig& layer, int ep_size);

/// \brief C(a, k) / C(b, k) for 0 <= a <= b as a product of k ratios (0 when a < k): no overflowing binomials.
double binomial_ratio(std::int64_t a, std::int64_t b, std::int64_t k);

/// \brief Human-readable report of a plan (what kokkosmoe-plan prints).
std::string plan_report(const Plan& plan);

/// \brief JSON (format "kokkosmoe-plan", version 1; docs/planner.md §6).
std::string plan_to_json(const Plan& plan, int indent = 2);
/// \brief Parses plan_to_json() output back; plan_from_json(plan_to_json(p)) == p.
/// \throws KokkosMoE::InvalidArgument (Rule::ConfigValue) naming the offending field for malformed input
Plan plan_from_json(std::string_view json);

}  // namespace KokkosMoE

#endif
