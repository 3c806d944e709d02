/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// EP groups inside one node (docs/topology.md §10, docs/planner.md §2): disjoint groups of R GPUs, chosen
// lexicographically: (1) every pair an NVLink peer (hard: GPUs that fit no NVLink group are left out and named,
// unless every GPU must be used), (2) as many groups as possible, (3) the largest minimum pair bandwidth, (4) the
// fewest groups straddling NUMA nodes, (5) the lowest GPU ids first. A depth-first search that decides the lowest
// undecided GPU first (its group's companions in increasing order, or leaving it out) finds the lexicographically
// smallest solution first, so (5) comes for free; (2) descends from an upper bound (components of the NVLink graph,
// the largest clique), (3) is a binary search over the distinct pair rates (feasibility is monotone in the
// threshold), (4) ascends from a lower bound. Candidate sets are bit sets.
//
// Bounded time (an unbounded exact search takes 24 s on a random 96-GPU NVLink graph): every probe shares one step
// budget (EpGroupOptions::step_limit, 200000 steps, ~10-50 ms). Past it the best solution found so far is kept -- a
// greedy one (the lowest undecided GPU with the companions that keep its slowest pair fastest) when the exact search
// found none -- and search_limited is reported: the groups are valid NVLink groups, perhaps fewer or slower than
// optimal.

#include <impl/KokkosMoE_Planner_Internal.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
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

std::vector<std::vector<int>> node_cliques(const NvlinkTopology& node, bool* truncated) {
  if (truncated) *truncated = false;
  if (!node.cliques.empty()) {  // the loaders fill them (capped at 65536, with a warning); plans keep fewer
    if (node.cliques.size() <= kMaxPlannerCliques) return node.cliques;
    if (truncated) *truncated = true;
    return {node.cliques.begin(), node.cliques.begin() + static_cast<std::ptrdiff_t>(kMaxPlannerCliques)};
  }
  // In-memory topologies: the same enumeration, capped (a dense 128-GPU graph has over a million maximal cliques).
  return nvlink_cliques_capped(node, kMaxPlannerCliques, truncated);
}

namespace {

// --- bit sets over the GPUs of a node ---------------------------------------------------------------------------

using Bits = std::vector<std::uint64_t>;
inline void set_bit(Bits& b, int i) { b[static_cast<std::size_t>(i) >> 6] |= std::uint64_t(1) << (i & 63); }
inline void clear_bit(Bits& b, int i) { b[static_cast<std::size_t>(i) >> 6] &= ~(std::uint64_t(1) << (i & 63)); }
inline bool test_bit(const Bits& b, int i) { return (b[static_cast<std::size_t>(i) >> 6] >> (i & 63)) & 1; }
int popcount(const Bits& b) {
  int c = 0;
  for (std::uint64_t w : b) c += __builtin_popcountll(w);
  return c;
}
int lowest_bit(const Bits& b) {
  for (std::size_t k = 0; k < b.size(); ++k)
    if (b[k]) return static_cast<int>(k * 64 + static_cast<std::size_t>(__builtin_ctzll(b[k])));
  return -1;
}

// Depth-first search for `target` disjoint groups of R GPUs whose pairs are all edges of `adj`, with at most
// `straddle_budget` groups spanning NUMA nodes. It decides the lowest undecided GPU first: put it in a group with
// companions in increasing order, or (only if enough GPUs remain) leave it out; so the first solution found is the
// lexicographically smallest one. Every call of next()/extend() costs one step of the shared budget; past it the
// search reports `limited` and fails. Candidate sets are bit sets: a step costs O(n / 64).
class GroupSearch {
 public:
  GroupSearch(int n, int R, const std::vector<int>& numa, long& budget)
      : m_n(n), m_R(R), m_words((static_cast<std::size_t>(n) + 63) / 64), m_numa(numa), m_budget(budget) {
    // Per NUMA key, the GPUs a group of that key may still take without straddling (that key, or unknown).
    for (int i = 0; i < n; ++i)
      if (numa[i] >= 0 && !m_same_numa.count(numa[i])) m_same_numa[numa[i]] = Bits(m_words, 0);
    for (auto& [key, bits] : m_same_numa)
      for (int i = 0; i < n; ++i)
        if (numa[i] == key || numa[i] < 0) set_bit(bits, i);
  }

  bool run(const std::vector<Bits>& adj, int target, int straddle_budget) {
    m_adj = &adj;
    m_target = target;
    m_straddle_budget = straddle_budget;
    m_straddles = 0;
    m_free.assign(m_words, 0);
    for (int i = 0; i < m_n; ++i) set_bit(m_free, i);
    m_free_count = m_n;
    groups.clear();
    limited = false;
    return next();
  }

  std::vector<std::vector<int>> groups;
  bool limited = false;

  bool straddles(const std::vector<int>& g) const {
    int key = -1;
    for (int v : g) {
      if (m_numa[v] < 0) continue;
      if (key >= 0 && m_numa[v] != key) return true;
      key = m_numa[v];
    }
    return false;
  }

 private:
  bool spend() {
    if (--m_budget >= 0) return true;
    limited = true;
    return false;
  }

  bool next() {
    const int formed = static_cast<int>(groups.size());
    if (formed == m_target) return true;  // the GPUs still undecided are left out
    if (!spend()) return false;
    const int need = (m_target - formed) * m_R;
    if (m_free_count < need) return false;
    const int u = lowest_bit(m_free);
    clear_bit(m_free, u);
    --m_free_count;
    std::vector<int> g{u};
    Bits cand = (*m_adj)[u];
    for (std::size_t k = 0; k < m_words; ++k) cand[k] &= m_free[k];
    if (extend(g, cand)) return true;
    if (!limited && m_free_count >= need && next()) return true;  // leave u out
    set_bit(m_free, u);
    ++m_free_count;
    return false;
  }

  bool extend(std::vector<int>& g, const Bits& cand) {
    if (static_cast<int>(g.size()) == m_R) {
      const int s = straddles(g) ? 1 : 0;
      if (m_straddles + s > m_straddle_budget) return false;
      for (std::size_t k = 1; k < g.size(); ++k) clear_bit(m_free, g[k]);
      m_free_count -= m_R - 1;
      m_straddles += s;
      groups.push_back(g);
      if (next()) return true;
      groups.pop_back();
      m_straddles -= s;
      m_free_count += m_R - 1;
      for (std::size_t k = 1; k < g.size(); ++k) set_bit(m_free, g[k]);
      return false;
    }
    if (!spend()) return false;
    const int need = m_R - static_cast<int>(g.size());
    // No straddle left to spend: only GPUs of the group's NUMA node (or of unknown locality) can complete it.
    const Bits* numa_mask = nullptr;
    if (m_straddles >= m_straddle_budget)
      for (int v : g)
        if (m_numa[v] >= 0) {
          numa_mask = &m_same_numa.at(m_numa[v]);
          break;
        }
    int remaining = 0;
    for (std::size_t q = 0; q < m_words; ++q)
      remaining += __builtin_popcountll(numa_mask ? cand[q] & (*numa_mask)[q] : cand[q]);
    Bits next_cand(m_words);
    for (std::size_t k = 0; k < m_words && remaining >= need; ++k)
      for (std::uint64_t w = numa_mask ? cand[k] & (*numa_mask)[k] : cand[k]; w && remaining >= need; w &= w - 1) {
        const int v = static_cast<int>(k * 64 + static_cast<std::size_t>(__builtin_ctzll(w)));
        --remaining;                 // candidates after v
        if (!spend()) return false;  // every companion tried is a step
        const Bits& av = (*m_adj)[v];
        int count = 0;
        for (std::size_t q = 0; q < m_words; ++q) {
          std::uint64_t x = q < k ? 0 : cand[q] & av[q] & (numa_mask ? (*numa_mask)[q] : ~std::uint64_t(0));
          if (q == k) x &= (v & 63) == 63 ? 0 : ~((std::uint64_t(2) << (v & 63)) - 1);  // only companions > v
          next_cand[q] = x;
          count += __builtin_popcountll(x);
        }
        if (count < need - 1) continue;
        g.push_back(v);
        const bool done = extend(g, next_cand);
        g.pop_back();
        if (done) return true;
        if (limited) return false;
      }
    return false;
  }

  int m_n, m_R;
  std::size_t m_words;
  const std::vector<int>& m_numa;
  long& m_budget;
  const std::vector<Bits>* m_adj = nullptr;
  int m_target = 0, m_straddle_budget = 0, m_straddles = 0, m_free_count = 0;
  Bits m_free;
  std::map<int, Bits> m_same_numa;
};

}  // namespace

NodeGrouping group_node(const NvlinkTopology& node, int R, const CostModel& cost, bool every_gpu, long step_limit,
                        const std::vector<std::vector<int>>& cliques) {
  const int n = node.num_gpus();
  NodeGrouping out;
  if (R == 1) {
    for (int i = 0; i < n; ++i) out.groups.push_back({i});
    out.all_nvlink = n > 0;
    return out;
  }
  const std::size_t words = (static_cast<std::size_t>(n) + 63) / 64;
  std::vector<double> gbps(static_cast<std::size_t>(n) * n, 0);
  std::vector<char> nvl(static_cast<std::size_t>(n) * n, 0);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j)
      if (i != j) {
        const PairLink l = pair_link(node, i, j, cost);
        gbps[static_cast<std::size_t>(i) * n + j] = l.gbps;
        nvl[static_cast<std::size_t>(i) * n + j] = l.nvlink && pair_link(node, j, i, cost).nvlink;
      }
  auto at = [n](int i, int j) { return static_cast<std::size_t>(i) * n + static_cast<std::size_t>(j); };
  std::vector<int> numa(n);
  bool numa_known = false, numa_all_known = true;
  for (int i = 0; i < n; ++i) {
    numa[i] = numa_key(node, i);
    numa_known = numa_known || numa[i] >= 0;
    numa_all_known = numa_all_known && numa[i] >= 0;
  }
  if (!numa_known) std::fill(numa.begin(), numa.end(), -1);
  int largest_clique = 1;
  std::vector<int> clique_of(n, 1);  // the largest NVLink clique each GPU belongs to
  for (const auto& c : cliques) {
    largest_clique = std::max<int>(largest_clique, static_cast<int>(c.size()));
    for (int v : c)
      if (v >= 0 && v < n) clique_of[v] = std::max<int>(clique_of[v], static_cast<int>(c.size()));
  }
  long budget = step_limit;
  GroupSearch search(n, R, numa, budget);

  // Edges of a pass: NVLink pairs (or every pair) at least theta GB/s fast.
  auto edges = [&](bool nvlink_only, double theta) {
    std::vector<Bits> adj(n, Bits(words, 0));
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j)
        if (i != j && (!nvlink_only || nvl[at(i, j)]) && gbps[at(i, j)] >= theta) set_bit(adj[i], j);
    return adj;
  };
  auto min_gbps = [&](const std::vector<std::vector<int>>& gs) {
    double m = std::numeric_limits<double>::infinity();
    for (const auto& g : gs)
      for (std::size_t a = 0; a < g.size(); ++a)
        for (std::size_t b = a + 1; b < g.size(); ++b) m = std::min(m, gbps[at(g[a], g[b])]);
    return std::isfinite(m) ? m : 0.0;
  };
  auto count_straddles = [&](const std::vector<std::vector<int>>& gs) {
    int c = 0;
    for (const auto& g : gs) c += search.straddles(g) ? 1 : 0;
    return c;
  };
  // Fewest groups that must span NUMA nodes when `t` groups are formed (every NUMA node known): a lower bound.
  auto straddle_bound = [&](int t) {
    if (!numa_known || !numa_all_known) return 0;
    std::map<int, int> per;
    for (int k : numa) ++per[k];
    int inside = 0;
    for (const auto& [k, c] : per) inside += c / R;
    return std::max(0, t - inside);
  };
  // Refines a feasible solution with `t` groups: the largest minimum pair bandwidth (binary search over the
  // distinct pair rates: feasibility is monotone in the threshold), then the fewest NUMA straddles, each probe a
  // budget-bounded search; the last success is kept (lexicographically smallest under its constraints).
  auto refine = [&](bool nvlink_only, int t, std::vector<std::vector<int>> sol) {
    std::set<double, std::greater<double>> rates;
    for (int i = 0; i < n; ++i)
      for (int j = i + 1; j < n; ++j)
        if (!nvlink_only || nvl[at(i, j)]) rates.insert(gbps[at(i, j)]);
    const std::vector<double> thr(rates.begin(), rates.end());
    const double m0 = min_gbps(sol);
    std::size_t lo = 0, hi = static_cast<std::size_t>(
                            std::lower_bound(thr.begin(), thr.end(), m0, std::greater<double>()) - thr.begin());
    double theta = hi < thr.size() ? thr[hi] : m0;
    while (lo < hi && !search.limited) {
      const std::size_t mid = (lo + hi) / 2;
      if (search.run(edges(nvlink_only, thr[mid]), t, t)) {
        sol = search.groups;
        hi = mid;
        theta = thr[mid];
      } else {
        lo = mid + 1;
      }
    }
    out.search_limited = out.search_limited || search.limited;
    const auto adj = edges(nvlink_only, theta);
    const int s0 = count_straddles(sol);
    for (int b = straddle_bound(t); b < s0 && !search.limited; ++b)
      if (search.run(adj, t, b)) {
        sol = search.groups;
        break;
      }
    out.search_limited = out.search_limited || search.limited;
    return sol;
  };
  auto finish = [&](std::vector<std::vector<int>> sol) {
    for (auto& g : sol) std::sort(g.begin(), g.end());
    std::sort(sol.begin(), sol.end());
    out.groups = std::move(sol);
    std::vector<char> used(n, 0);
    for (const auto& g : out.groups)
      for (int v : g) used[v] = 1;
    for (int i = 0; i < n; ++i)
      if (!used[i]) out.unused.push_back(i);
    out.all_nvlink = !out.groups.empty();
    for (const auto& g : out.groups)
      for (std::size_t a = 0; a < g.size(); ++a)
        for (std::size_t b = a + 1; b < g.size(); ++b) out.all_nvlink = out.all_nvlink && nvl[at(g[a], g[b])];
    out.min_pair_gbps = min_gbps(out.groups);
    out.numa_straddles = count_straddles(out.groups);
    // Why each left-out GPU is left out, GPUs with the same reason together.
    std::map<std::string, std::vector<int>> why;
    for (int i : out.unused) {
      bool peer = false;
      for (int j = 0; j < n && !peer; ++j) peer = j != i && nvl[at(i, j)];
      if (!peer)
        why["no NVLink peer"].push_back(i);
      else if (clique_of[i] < R)
        why["in no NVLink clique of " + std::to_string(R) + " GPUs (largest: " + std::to_string(clique_of[i]) + ")"]
            .push_back(i);
      else
        why["left over: the NVLink cliques of " + std::to_string(R) + " it belongs to overlap the chosen groups"]
            .push_back(i);
    }
    for (const auto& [text, ids] : why)
      out.unused_reason += (out.unused_reason.empty() ? "" : "; ") + std::string(ids.size() == 1 ? "GPU " : "GPUs ") +
                           ids_text(ids) + ": " + text;
  };

  // Pass 1: NVLink groups only, as many as possible.
  const auto nvl_adj = edges(true, 0.0);
  int t_max = 0;
  if (largest_clique >= R) {
    std::vector<char> seen(n, 0);  // components of the NVLink graph bound the number of groups
    for (int s = 0; s < n; ++s) {
      if (seen[s]) continue;
      int size = 0;
      std::vector<int> stack{s};
      seen[s] = 1;
      while (!stack.empty()) {
        const int v = stack.back();
        stack.pop_back();
        ++size;
        for (int w = 0; w < n; ++w)
          if (!seen[w] && test_bit(nvl_adj[v], w)) seen[w] = 1, stack.push_back(w);
      }
      t_max += size / R;
    }
  }
  // Greedy baseline (always valid): the lowest undecided GPU with the companions that keep the slowest pair fastest.
  std::vector<std::vector<int>> greedy;
  if (t_max > 0) {
    std::vector<char> used(n, 0);
    for (int u = 0; u < n && static_cast<int>(greedy.size()) < t_max; ++u) {
      if (used[u]) continue;
      std::vector<int> g{u};
      Bits cand = nvl_adj[u];
      for (int v = 0; v < n; ++v)
        if (used[v]) clear_bit(cand, v);
      while (static_cast<int>(g.size()) < R) {
        int best = -1;
        double best_bw = -1;
        for (int v = lowest_bit(cand); v >= 0 && v < n; ++v) {
          if (!test_bit(cand, v)) continue;
          double bw = std::numeric_limits<double>::infinity();
          for (int x : g) bw = std::min(bw, gbps[at(x, v)]);
          if (bw > best_bw) best = v, best_bw = bw;
        }
        if (best < 0) break;
        g.push_back(best);
        for (std::size_t k = 0; k < words; ++k) cand[k] &= nvl_adj[best][k];
        clear_bit(cand, best);
      }
      if (static_cast<int>(g.size()) < R) continue;
      for (int v : g) used[v] = 1;
      greedy.push_back(g);
    }
  }
  const int t_greedy = static_cast<int>(greedy.size());
  const int t_need = every_gpu ? n / R : 0;  // use_every_gpu: only a partition of every GPU will do
  int t_found = 0;
  std::vector<std::vector<int>> sol;
  // The exact search down to the greedy count (inclusive: there it gives the lexicographically smallest solution).
  for (int t = t_max; t >= std::max({t_greedy, t_need, 1}); --t) {
    if (search.run(nvl_adj, t, t)) {
      t_found = t;
      sol = search.groups;
      break;
    }
    if (search.limited) break;
  }
  out.search_limited = search.limited;
  if (t_found == 0 && t_greedy > 0 && t_greedy >= t_need) {
    t_found = t_greedy;
    sol = greedy;
  }
  if (t_found > 0 && t_found >= t_need) {
    finish(refine(true, t_found, sol));
    if (!out.unused.empty())
      out.note = std::to_string(out.unused.size()) + " of " + std::to_string(n) + " GPUs per node left out (" +
                 out.unused_reason + ")";
    if (out.search_limited)
      out.note += (out.note.empty() ? "" : "; ") + std::string("the group search hit its step limit");
    return out;
  }
  if (!every_gpu) {
    finish({});
    out.note = "no NVLink clique of " + std::to_string(R) +
               " GPUs (largest NVLink clique: " + std::to_string(largest_clique) + " GPUs)";
    return out;
  }

  // Pass 2 (every GPU, R divides n): a partition over any pairs, the fastest slowest pair first. Every pair is an
  // edge at the lowest threshold, so the GPUs in id order are always a solution to start from.
  std::vector<std::vector<int>> ids;
  for (int i = 0; i + R <= n; i += R) {
    std::vector<int> g;
    for (int j = i; j < i + R; ++j) g.push_back(j);
    ids.push_back(g);
  }
  search.limited = false;
  finish(refine(false, n / R, ids));
  int nvl_pairs = 0, pairs = 0;
  for (const auto& g : out.groups)
    for (std::size_t a = 0; a < g.size(); ++a)
      for (std::size_t b = a + 1; b < g.size(); ++b, ++pairs) nvl_pairs += nvl[at(g[a], g[b])] ? 1 : 0;
  out.note = "no partition of a node's " + std::to_string(n) + " GPUs into NVLink cliques of " + std::to_string(R) +
             " (largest NVLink clique: " + std::to_string(largest_clique) + " GPUs); " +
             std::to_string(pairs - nvl_pairs) + " of " + std::to_string(pairs) + " group pairs use PCIe";
  if (out.search_limited) out.note += " (the group search hit its step limit)";
  return out;
}

}  // namespace Impl

EpGroupPlan ep_groups(const NvlinkTopology& topo, int group_size, const EpGroupOptions& options) {
  constexpr const char* fn = "ep_groups";
  const int n = topo.num_gpus();
  if (group_size < 1)
    throw InvalidArgument(fn, "group_size", Rule::ConfigValue,
                          "group_size (" + std::to_string(group_size) + ") must be >= 1");
  if (options.use_every_gpu && n % group_size != 0)
    throw InvalidArgument(fn, "group_size", Rule::ConfigValue,
                          "use_every_gpu needs group_size (" + std::to_string(group_size) + ") to divide the " +
                              std::to_string(n) + " GPUs");
  Impl::validate_node(fn, topo);
  CostModel cost;
  cost.nvlink_link_gbps = options.nvlink_link_gbps;
  cost.nvlink_efficiency = options.nvlink_efficiency;
  cost.pcie_gbps = options.pcie_gbps;
  cost.pcie_efficiency = options.pcie_efficiency;
  const Impl::NodeGrouping ng = Impl::group_node(topo, group_size, cost, options.use_every_gpu,
                                                 std::max(0L, options.step_limit), Impl::node_cliques(topo, nullptr));
  EpGroupPlan plan;
  plan.group_size = group_size;
  plan.unused = ng.unused;
  plan.unused_reason = ng.unused_reason;
  plan.all_nvlink = ng.all_nvlink;
  plan.numa_straddles = ng.numa_straddles;
  plan.search_limited = ng.search_limited;
  for (const auto& g : ng.groups) {
    NodeEpGroup e;
    e.gpus = g;
    e.nvlink = true;
    std::vector<int> numa;
    for (std::size_t a = 0; a < g.size(); ++a) {
      const int k = Impl::numa_key(topo, g[a]);
      if (k >= 0 && std::find(numa.begin(), numa.end(), k) == numa.end()) numa.push_back(k);
      for (std::size_t b = a + 1; b < g.size(); ++b) {
        const Impl::PairLink l = Impl::pair_link(topo, g[a], g[b], cost);
        e.nvlink = e.nvlink && l.nvlink;
        e.min_pair_gbps = (a == 0 && b == 1) ? l.gbps : std::min(e.min_pair_gbps, l.gbps);
      }
    }
    e.numa_nodes = static_cast<int>(numa.size());
    plan.groups.push_back(e);
  }
  if (ng.groups.empty() || !ng.all_nvlink || !ng.unused.empty()) plan.reason = ng.note;
  return plan;
}

}  // namespace KokkosMoE
