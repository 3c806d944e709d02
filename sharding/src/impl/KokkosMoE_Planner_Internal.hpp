/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_PLANNER_INTERNAL_HPP
#define KOKKOSMOE_PLANNER_INTERNAL_HPP

// Internals shared by the planner's translation units (not API).

#include <KokkosMoE_Planner.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace KokkosMoE {
namespace Impl {

[[noreturn]] inline void plan_fail(const char* param, Rule rule, const std::string& msg) {
  throw InvalidArgument("make_plan", param, rule, msg);
}

/// Validates a layer (docs/router.md §4 rules plus the planner's own). \p fn names the public function.
void validate_layer(const char* fn, const MoeLayerConfig& layer);

/// The pair (i, j) of a topology whose pairs vector make_plan() has validated (n*n). The planner reads the data
/// members only, so it needs no symbol of the topology library.
inline const GpuPair& pair_of(const NvlinkTopology& t, int i, int j) {
  return t.pairs[static_cast<std::size_t>(i) * t.gpus.size() + static_cast<std::size_t>(j)];
}

/// Checks the parts of a node topology the planner reads (pairs is n*n, ids dense) and throws
/// InvalidArgument(Rule::TopologyMalformed) naming what is wrong.
void validate_node(const char* fn, const NvlinkTopology& node);

/// Bytes of one token row in 64 bits (token_row_bytes() without the double).
std::int64_t token_row_bytes_exact(TokenDType t, int hidden);

/// a * b, or std::nullopt when the product does not fit in 64 bits.
std::optional<std::int64_t> checked_mul(std::int64_t a, std::int64_t b);

/// The routing model actually used for a layer (Auto resolved).
RoutingModel resolve_model(const MoeLayerConfig& layer);

/// How two GPUs of one node exchange data and at what effective rate. For the shared classes (switch, PCIe) `gbps`
/// is the pair's width (switch_links * rate * efficiency, or the PCIe rate); the cost model shares a GPU's port.
struct PairLink {
  LinkClass cls = LinkClass::Pcie;
  double gbps = 0;
  bool nvlink = false;  ///< nvlink_p2p
};
PairLink pair_link(const NvlinkTopology& node, int i, int j, const CostModel& cost);

/// A GPU's shared egress/ingress rate for switch traffic: its links to the fabric * rate * efficiency.
double switch_port_gbps(const NvlinkTopology& node, int gpu, const CostModel& cost);

/// Disjoint EP groups of one node.
struct NodeGrouping {
  std::vector<std::vector<int>> groups;  ///< ascending members; groups ordered by their first member
  std::vector<int> unused;               ///< GPUs in no group (NVLink mode), ascending
  std::string unused_reason;             ///< per unused GPU (grouped), why
  bool all_nvlink = false;               ///< at least one group, every pair of every group an NVLink peer
  double min_pair_gbps = 0;              ///< the slowest pair over all groups (0 for groups of one)
  int numa_straddles = 0;                ///< groups whose GPUs sit in more than one NUMA node
  bool search_limited = false;           ///< the search hit its step limit (the result is still valid)
  std::string note;                      ///< why not NVLink cliques, or which GPUs are left out and why
};

/// The default step budget of one group_node() call (EpGroupOptions::step_limit).
inline constexpr long kGroupStepLimit = 200000;
/// The most maximal cliques the planner enumerates for an in-memory topology (the loaders cap at 65536).
inline constexpr std::size_t kMaxPlannerCliques = 4096;

/// EP groups of R GPUs (docs/topology.md §10). every_gpu = false: NVLink groups only, as many as possible, GPUs that
/// fit none left out (no group at all when no NVLink clique of R exists). every_gpu = true (R divides n): a partition
/// of every GPU, NVLink cliques when possible, else over any pairs (PCIe), flagged. Lexicographic choice: as many
/// groups, then the largest minimum pair bandwidth, then the fewest groups straddling NUMA nodes, then the lowest
/// GPU ids. At most \p step_limit search steps; \p cliques are the node's maximal NVLink cliques.
NodeGrouping group_node(const NvlinkTopology& node, int group_size, const CostModel& cost, bool every_gpu,
                        long step_limit, const std::vector<std::vector<int>>& cliques);

/// The node's maximal NVLink cliques: node.cliques when the loader filled them, computed from the pairs otherwise
/// (capped at kMaxPlannerCliques; *truncated says so).
std::vector<std::vector<int>> node_cliques(const NvlinkTopology& node, bool* truncated = nullptr);

/// Bron-Kerbosch enumeration with a cap (KokkosMoE_Topology.cpp).
std::vector<std::vector<int>> nvlink_cliques_capped(const NvlinkTopology& topo, std::size_t limit, bool* truncated);

/// The distinct NUMA key of a GPU (its first local NUMA node), -1 when unknown.
int numa_key(const NvlinkTopology& node, int gpu);

/// "0-3", "0,2,5".
std::string ids_text(const std::vector<int>& ids);

/// Fixed-notation number with \p digits decimals.
std::string fmt(double v, int digits);
/// Bytes as "272.4 MB" (decimal units).
std::string fmt_bytes(double b);

}  // namespace Impl
}  // namespace KokkosMoE

#endif
