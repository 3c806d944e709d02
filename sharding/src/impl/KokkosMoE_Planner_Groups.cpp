/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// EP groups inside one node (docs/topology.md §10, docs/planner.md §2): partition the node's GPUs into disjoint groups
// of R, choosing lexicographically (1) every pair an NVLink peer, (2) the largest minimum pair bandwidth,
// (3) the fewest groups straddling NUMA nodes, (4) the lowest GPU ids first. A depth-first search that always
// completes the group of the lowest unassigned GPU and tries companions in increasing order finds the
// lexicographically smallest partition first, so (4) comes for free; (2) and (3) are outer loops over a bandwidth
// threshold (descending) and a straddle budget (ascending). Node sizes are small (8-16, 72 for NVL72) and complete
// graphs (NVSwitch) succeed on the first path; a step limit bounds pathological graphs.

#include <impl/KokkosMoE_Planner_Internal.hpp>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <set>
#include <string>
#include <vector>

namespace KokkosMoE {
namespace Impl {

void validate_node(const char* fn, const NvlinkTopology& node) {
  const std::size_t n = node.gpus.size();
  if (node.pairs.size() != n * n)
    throw InvalidArgument(fn, "node", Rule::TopologyMalformed,
                          "the node topology has " + std::to_string(n) + " GPUs but " +
                              std::to_string(node.pairs.size()) +
                              " pair entries; expected n*n = " + std::to_string(n * n));
  for (std::size_t i = 0; i < n; ++i)
    if (node.gpus[i].id != static_cast<int>(i))
      throw InvalidArgument(fn, "node", Rule::TopologyMalformed,
                            "GPU " + std::to_string(i) + " has id " + std::to_string(node.gpus[i].id) +
                                "; ids must be dense 0..n-1 in PCI order");
  for (const auto& c : node.cliques)
    for (int g : c)
      if (g < 0 || g >= static_cast<int>(n))
        throw InvalidArgument(fn, "node", Rule::TopologyMalformed,
                              "a clique names GPU " + std::to_string(g) + " of " + std::to_string(n));
}

PairLink pair_link(const NvlinkTopology& node, int i, int j, const CostModel& cost) {
  const GpuPair& p = pair_of(node, i, j);
  const double link = cost.nvlink_link_gbps * cost.nvlink_efficiency;
  PairLink r;
  r.nvlink = p.nvlink_p2p;
  if (p.direct_links > 0) {
    r.cls = LinkClass::NvlinkDirect;
    r.gbps = p.direct_links * link;
  } else if (p.switch_links > 0) {
    r.cls = LinkClass::NvlinkSwitch;
    r.gbps = p.switch_links * link;
  } else if (p.nvlink_p2p && p.nvlink_mbps > 0) {
    // NVLink peers whose link count is unknown: the source's claimed rate, scaled by the same efficiency
    r.cls = LinkClass::NvlinkDirect;
    r.gbps = p.nvlink_mbps / 1000.0 * cost.nvlink_efficiency;
  } else {
    r.cls = LinkClass::Pcie;
    r.gbps = cost.pcie_gbps * cost.pcie_efficiency;
  }
  return r;
}

double switch_port_gbps(const NvlinkTopology& node, int gpu, const CostModel& cost) {
  int links = node.gpus[gpu].links_to_switch;
  for (int j = 0; j < node.num_gpus(); ++j)
    if (j != gpu) links = std::max<int>(links, pair_of(node, gpu, j).switch_links);
  return links * cost.nvlink_link_gbps * cost.nvlink_efficiency;
}

int numa_key(const NvlinkTopology& node, int gpu) {
  const auto& n = node.gpus[gpu].numa_nodes;
  return n.empty() ? -1 : *std::min_element(n.begin(), n.end());
}

std::string ids_text(const std::vector<int>& ids) {
  std::string s;
  for (std::size_t i = 0; i < ids.size();) {
    std::size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    s += (s.empty() ? "" : ",") + std::to_string(ids[i]);
    if (j >= i + 2)
      s += "-" + std::to_string(ids[j]);
    else if (j == i + 1)
      s += "," + std::to_string(ids[j]);
    i = j + 1;
  }
  return s;
}

std::string fmt(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string fmt_bytes(double b) {
  if (b >= 1e9) return fmt(b / 1e9, 2) + " GB";
  if (b >= 1e6) return fmt(b / 1e6, 1) + " MB";
  if (b >= 1e3) return fmt(b / 1e3, 1) + " kB";
  return fmt(b, 0) + " B";
}

std::vector<std::vector<int>> node_cliques(const NvlinkTopology& node) {
  return node.cliques.empty() ? nvlink_cliques(node) : node.cliques;  // the loaders fill them; in-memory may not
}

namespace {

constexpr long kStepLimit = 2000000;

struct Search {
  int n = 0, R = 0;
  std::vector<std::vector<char>> allowed;  // edge predicate of the current pass
  std::vector<int> numa;
  bool numa_known = false;
  int budget = 0;  // NUMA straddles allowed
  long steps = 0;
  bool limited = false;
  std::vector<char> used;
  std::vector<std::vector<int>> groups;

  bool straddles(const std::vector<int>& g) const {
    if (!numa_known) return false;
    std::set<int> keys;
    for (int v : g)
      if (numa[v] >= 0) keys.insert(numa[v]);
    return keys.size() > 1;
  }

  // Completes the group `g` (its first member is the lowest unassigned GPU) with companions > `from`.
  bool extend(std::vector<int>& g, int from, int straddled) {
    if (++steps > kStepLimit) {
      limited = true;
      return false;
    }
    if (static_cast<int>(g.size()) == R) {
      const int s = straddled + (straddles(g) ? 1 : 0);
      if (s > budget) return false;
      groups.push_back(g);
      for (int v : g) used[v] = 1;
      if (next(s)) return true;
      for (int v : g) used[v] = 0;
      groups.pop_back();
      return false;
    }
    const int need = R - static_cast<int>(g.size());
    for (int v = from; v < n; ++v) {
      if (used[v]) continue;
      int left = 0;  // prune: not enough candidates left
      for (int w = v; w < n; ++w) left += used[w] ? 0 : 1;
      if (left < need) return false;
      bool ok = true;
      for (int u : g) ok = ok && allowed[u][v];
      if (!ok) continue;
      g.push_back(v);
      const bool done = extend(g, v + 1, straddled);
      g.pop_back();
      if (done) return true;
      if (limited) return false;
    }
    return false;
  }

  bool next(int straddled) {
    int u = 0;
    while (u < n && used[u]) ++u;
    if (u == n) return true;
    std::vector<int> g{u};
    return extend(g, u + 1, straddled);
  }

  bool run(const std::vector<std::vector<char>>& edges, int straddle_budget) {
    allowed = edges;
    budget = straddle_budget;
    used.assign(n, 0);
    groups.clear();
    return next(0);
  }
};

}  // namespace

NodeGrouping group_node(const NvlinkTopology& node, int R, const CostModel& cost) {
  const int n = node.num_gpus();
  NodeGrouping out;
  if (R == 1) {
    for (int i = 0; i < n; ++i) out.groups.push_back({i});
    out.all_nvlink = true;
    return out;
  }
  std::vector<std::vector<PairLink>> link(n, std::vector<PairLink>(n));
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j)
      if (i != j) link[i][j] = pair_link(node, i, j, cost);

  Search s;
  s.n = n;
  s.R = R;
  for (int i = 0; i < n; ++i) {
    s.numa.push_back(numa_key(node, i));
    s.numa_known = s.numa_known || s.numa.back() >= 0;
  }
  int largest_clique = 1;
  for (const auto& c : node_cliques(node)) largest_clique = std::max<int>(largest_clique, static_cast<int>(c.size()));
  // NUMA straddles, all-NVLink and the slowest pair of the chosen groups
  auto summarize = [&] {
    out.all_nvlink = true;
    out.min_pair_gbps = 0;
    bool first = true;
    for (const auto& g : out.groups) {
      out.numa_straddles += s.straddles(g) ? 1 : 0;
      for (std::size_t a = 0; a < g.size(); ++a)
        for (std::size_t b = a + 1; b < g.size(); ++b) {
          const PairLink& l = link[g[a]][g[b]];
          out.all_nvlink = out.all_nvlink && l.nvlink;
          out.min_pair_gbps = first ? l.gbps : std::min(out.min_pair_gbps, l.gbps);
          first = false;
        }
    }
  };

  for (int pass = 0; pass < 2; ++pass) {  // pass 0: NVLink pairs only; pass 1: any pair (fallback)
    std::set<double, std::greater<double>> thresholds;
    for (int i = 0; i < n; ++i)
      for (int j = i + 1; j < n; ++j)
        if (pass == 1 || link[i][j].nvlink) thresholds.insert(link[i][j].gbps);
    for (double theta : thresholds) {
      std::vector<std::vector<char>> edges(n, std::vector<char>(n, 0));
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j)
          edges[i][j] = i != j && (pass == 1 || link[i][j].nvlink) && link[i][j].gbps >= theta;
      const int max_budget = s.numa_known ? n / R : 0;
      for (int budget = 0; budget <= max_budget; ++budget) {
        if (!s.run(edges, budget)) {
          out.search_limited = out.search_limited || s.limited;
          if (s.limited) break;
          continue;
        }
        out.groups = s.groups;
        summarize();
        if (!out.all_nvlink) {
          int nvl_pairs = 0, pairs = 0;
          for (const auto& g : out.groups)
            for (std::size_t a = 0; a < g.size(); ++a)
              for (std::size_t b = a + 1; b < g.size(); ++b, ++pairs) nvl_pairs += link[g[a]][g[b]].nvlink ? 1 : 0;
          out.note = "no partition of a node's " + std::to_string(n) + " GPUs into NVLink cliques of " +
                     std::to_string(R) + " (largest NVLink clique: " + std::to_string(largest_clique) + " GPUs); " +
                     std::to_string(pairs - nvl_pairs) + " of " + std::to_string(pairs) + " group pairs use PCIe";
          if (out.search_limited) out.note += " (the clique search hit its step limit)";
        }
        return out;
      }
      if (s.limited) break;
    }
  }
  // Unreachable for a divisor R of n (pass 1 allows every pair), except after the step limit.
  for (int i = 0; i < n; i += R) {
    std::vector<int> g;
    for (int j = i; j < i + R; ++j) g.push_back(j);
    out.groups.push_back(g);
  }
  out.search_limited = true;
  summarize();
  out.note = "the group search hit its step limit; GPUs grouped in id order";
  return out;
}

}  // namespace Impl
}  // namespace KokkosMoE
