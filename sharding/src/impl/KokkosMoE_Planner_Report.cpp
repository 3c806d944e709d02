/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// plan_report(): the human-readable form printed by kokkosmoe-plan.

#include <impl/KokkosMoE_Planner_Internal.hpp>

#include <algorithm>
#include <sstream>
#include <string>

namespace KokkosMoE {
namespace {

using Impl::fmt;
using Impl::fmt_bytes;

std::string mesh_text(int dp, int ep) { return "DP" + std::to_string(dp) + " x EP" + std::to_string(ep); }

std::string pad(std::string s, std::size_t w) {
  if (s.size() < w) s.append(w - s.size(), ' ');
  return s;
}

std::string phase_line(const char* name, const PhaseEstimate& p) {
  return std::string("    ") + name + ": sends " + fmt_bytes(p.bytes_sent) + ", receives " +
         fmt_bytes(p.bytes_received) + ", keeps " + fmt_bytes(p.bytes_local) + " local; predicted " +
         fmt(p.time_us, 1) + " us, bound by " + p.bottleneck + "\n";
}

}  // namespace

std::string plan_report(const Plan& p) {
  std::ostringstream os;
  const MoeLayerConfig& l = p.layer;
  os << "KokkosMoE plan" << (l.name.empty() ? "" : " for " + l.name) << ": E = " << l.num_experts << ", top-" << l.topk;
  if (l.grouped()) os << ", group-limited (" << l.group_topk << " of " << l.num_groups << " groups)";
  os << ", hidden " << l.hidden_size << ", " << l.tokens_per_rank << " tokens per rank\n";
  os << "  dispatch " << to_string(l.dispatch_dtype) << " (" << fmt(token_row_bytes(l.dispatch_dtype, l.hidden_size), 0)
     << " B/token), combine " << to_string(l.combine_dtype) << " ("
     << fmt(token_row_bytes(l.combine_dtype, l.hidden_size), 0) << " B/token)\n";
  const ClusterSummary& c = p.cluster;
  os << "cluster: " << c.num_nodes << (c.num_nodes == 1 ? " node" : " nodes") << " x " << c.gpus_per_node << " GPUs";
  if (!c.gpu_model.empty()) os << " (" << c.gpu_model << ")";
  os << ", topology from " << c.topology_source << "; NVLink cliques per node:";
  for (const auto& q : c.node_cliques) os << " {" << Impl::ids_text(q) << "}";
  if (c.num_nodes > 1) os << "; inter-node " << fmt(c.inter_node_gbps, 1) << " GB/s per GPU";
  os << "\n";
  const CostModel& m = p.cost_model;
  os << "cost model: NVLink " << fmt(m.nvlink_link_gbps, 1) << " GB/s x " << fmt(m.nvlink_efficiency, 2)
     << " per link per direction, PCIe " << fmt(m.pcie_gbps, 1) << " GB/s x " << fmt(m.pcie_efficiency, 2) << "\n\n";

  os << "plan: " << mesh_text(p.dp_size(), p.ep_size()) << " = " << p.world_size() << " ranks, " << p.local_experts
     << " experts per rank\n";
  os << "  why: " << p.reason << "\n";
  if (!p.unused_gpus.empty())
    os << "  unused GPUs (each node): " << Impl::ids_text(p.unused_gpus) << " -- " << p.unused_reason << "\n";
  os << "  EP groups:\n";
  const std::size_t show_groups = p.ep_groups.size() <= 8 ? p.ep_groups.size() : 4;
  for (std::size_t i = 0; i < show_groups; ++i) {
    const EpGroupInfo& g = p.ep_groups[i];
    os << "    dp " << i << ": ranks " << Impl::ids_text(g.ranks) << " on ";
    std::string where;
    int last_node = -1;
    std::vector<int> gpus;
    auto flush = [&]() {
      if (last_node >= 0)
        where += (where.empty() ? "" : " + ") + std::string("node ") + std::to_string(last_node) + " GPUs " +
                 Impl::ids_text(gpus);
      gpus.clear();
    };
    for (int r : g.ranks) {
      const RankPlacement& rp = p.ranks[r];
      if (rp.node != last_node) {
        flush();
        last_node = rp.node;
      }
      gpus.push_back(rp.gpu);
    }
    flush();
    os << where << (g.nvlink_clique ? ", NVLink clique" : ", not an NVLink clique");
    if (g.ranks.size() > 1) os << ", slowest pair " << fmt(g.min_pair_gbps, 1) << " GB/s";
    if (g.numa_nodes > 0) os << ", " << g.numa_nodes << " NUMA node" << (g.numa_nodes == 1 ? "" : "s");
    os << "\n";
  }
  if (show_groups < p.ep_groups.size()) os << "    ... " << p.ep_groups.size() - show_groups << " more groups\n";
  os << "  ranks (rank: node GPU pci -> experts):\n";
  const std::size_t show_ranks = p.ranks.size() <= 16 ? p.ranks.size() : 8;
  for (std::size_t i = 0; i < show_ranks; ++i) {
    const RankPlacement& r = p.ranks[i];
    os << "    " << r.rank << ": node " << r.node << " GPU " << r.gpu << " " << r.pci << " -> experts "
       << r.first_expert;
    if (r.num_local_experts > 1) os << "-" << r.first_expert + r.num_local_experts - 1;
    os << "\n";
  }
  if (show_ranks < p.ranks.size()) os << "    ... " << p.ranks.size() - show_ranks << " more ranks\n";
  const TrafficEstimate& t = p.traffic;
  os << "  traffic per rank (routing model " << to_string(t.model) << ": " << fmt(t.destinations_per_token, 3)
     << " destination ranks per token, " << fmt(t.remote_destinations_per_token, 3) << " remote):\n";
  os << phase_line("dispatch", t.dispatch) << phase_line("combine ", t.combine);
  os << "    dispatch + combine: " << fmt(t.time_us, 1) << " us\n";
  os << "  router sharding on " << p.mesh.str() << ":\n";
  for (const auto& r : p.router_shardings) os << "    " << pad(r.op, 22) << pad(r.tensor, 19) << r.spec.str() << "\n";
  if (p.global_num_tokens > 0)
    os << "    aux_loss T_total = " << p.global_num_tokens
       << " (tokens_per_rank x ranks), partials summed over dp, ep\n";

  os << "\nalternatives (ranked):\n";
  os << "    #  " << pad("mesh", 14) << pad("clique", 8) << pad("dest/tok", 10) << pad("dispatch", 12)
     << pad("combine", 12) << pad("total", 12) << "note\n";
  for (std::size_t i = 0; i < p.alternatives.size(); ++i) {
    const PlanCandidate& a = p.alternatives[i];
    os << "    " << pad(std::to_string(i + 1), 3) << pad(mesh_text(a.dp_size, a.ep_size), 14)
       << pad(a.ep_size == 1 ? "-" : (a.nvlink_clique_groups ? "yes" : "no"), 8)
       << pad(fmt(a.traffic.destinations_per_token, 2), 10) << pad(fmt(a.traffic.dispatch.time_us, 1) + " us", 12)
       << pad(fmt(a.traffic.combine.time_us, 1) + " us", 12) << pad(fmt(a.traffic.time_us, 1) + " us", 12) << a.note
       << "\n";
  }
  for (const auto& w : p.warnings) os << "warning: " << w << "\n";
  return os.str();
}

}  // namespace KokkosMoE
