/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// make_plan(): candidate EP sizes, EP groups, the cost model and the ranking (docs/planner.md §2, §4).
//
// Cost model of one dispatch (combine is the same with the directions swapped and the combine dtype): rank s sends
// T * row_bytes * P[t] to every peer t of its EP group, where P[t] is the probability that a token goes to rank t
// (rank_hit_probabilities, deduplicated per destination rank as in DeepEP's normal kernels). A rank's time is its
// slowest resource: a dedicated NVLink bundle to one peer (bytes / bundle rate), or a shared port (the sum over
// the peers it serves / port rate): the NVSwitch links of the GPU, its PCIe x16 link, its inter-node bandwidth.
// Egress and ingress are both checked; the phase takes the slowest rank. Local bytes (own experts) cost nothing.

#include <impl/KokkosMoE_Partition_Rules.hpp>
#include <impl/KokkosMoE_Planner_Internal.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

namespace KokkosMoE {

namespace {

using Impl::fmt;
using Impl::plan_fail;

// Bandwidths and efficiencies are bounded on both sides so that every predicted time is finite: with at most
// 2^63 bytes per phase and rank (checked below) over at least kMinPlanGbps * kMinPlanEfficiency, a time stays
// below 1e28 us.
bool in_range(double v, double lo, double hi) { return std::isfinite(v) && v >= lo && v <= hi; }

void validate_request(const PlanRequest& r) {
  Impl::validate_layer("make_plan", r.layer);
  const ClusterSpec& c = r.cluster;
  if (c.num_nodes < 1)
    plan_fail("num_nodes", Rule::ConfigValue, "num_nodes (" + std::to_string(c.num_nodes) + ") must be >= 1");
  if (c.node.num_gpus() < 1)
    plan_fail("cluster", Rule::PlanInfeasible,
              "the node topology has no GPUs (source: " + std::string(to_string(c.node.source)) +
                  "); load a fixture with GPUs (kokkosmoe-plan --xml FILE) or plan on a machine that has them");
  Impl::validate_node("make_plan", c.node);
  const std::int64_t world = std::int64_t(c.num_nodes) * c.node.num_gpus();
  if (world > kMaxPlanWorldSize)
    plan_fail("num_nodes", Rule::ConfigValue,
              "the world (" + std::to_string(c.num_nodes) + " nodes x " + std::to_string(c.node.num_gpus()) +
                  " GPUs = " + std::to_string(world) + ") exceeds " + std::to_string(kMaxPlanWorldSize) +
                  " GPUs (kMaxPlanWorldSize); plan fewer nodes");
  if (!std::isfinite(c.inter_node_gbps) || c.inter_node_gbps < 0 ||
      (c.inter_node_gbps > 0 && !in_range(c.inter_node_gbps, kMinPlanGbps, kMaxPlanGbps)))
    plan_fail("inter_node_gbps", Rule::ConfigValue,
              "inter_node_gbps (" + fmt(c.inter_node_gbps, 6) + ") must be 0 (single node) or in [" +
                  fmt(kMinPlanGbps, 3) + ", " + fmt(kMaxPlanGbps, 0) + "] GB/s");
  if (c.num_nodes > 1 && c.inter_node_gbps <= 0)
    plan_fail("inter_node_gbps", Rule::ConfigValue,
              "planning " + std::to_string(c.num_nodes) +
                  " nodes needs the inter-node bandwidth: set inter_node_gbps to the effective GB/s per GPU per "
                  "direction (e.g. 48 for one 400 Gb/s NIC per GPU; kokkosmoe-plan --inter-node-gbps)");
  const PlanConstraints& k = r.constraints;
  if (k.fixed_ep_size < 0)
    plan_fail("fixed_ep_size", Rule::ConfigValue,
              "fixed_ep_size (" + std::to_string(k.fixed_ep_size) + ") must be >= 0 (0 = choose)");
  if (k.max_ep_size < 0)
    plan_fail("max_ep_size", Rule::ConfigValue,
              "max_ep_size (" + std::to_string(k.max_ep_size) + ") must be >= 0 (0 = no limit)");
  if (k.local_expert_alignment < 1)
    plan_fail("local_expert_alignment", Rule::ConfigValue,
              "local_expert_alignment (" + std::to_string(k.local_expert_alignment) + ") must be >= 1");
  const CostModel& m = r.cost_model;
  if (!in_range(m.nvlink_link_gbps, kMinPlanGbps, kMaxPlanGbps) || !in_range(m.pcie_gbps, kMinPlanGbps, kMaxPlanGbps))
    plan_fail("cost_model", Rule::ConfigValue,
              "cost-model bandwidths must be in [" + fmt(kMinPlanGbps, 3) + ", " + fmt(kMaxPlanGbps, 0) +
                  "] GB/s (nvlink_link_gbps = " + fmt(m.nvlink_link_gbps, 6) + ", pcie_gbps = " + fmt(m.pcie_gbps, 6) +
                  ")");
  if (!in_range(m.nvlink_efficiency, kMinPlanEfficiency, 1.0) || !in_range(m.pcie_efficiency, kMinPlanEfficiency, 1.0))
    plan_fail("cost_model", Rule::ConfigValue,
              "cost-model efficiencies must be in [" + fmt(kMinPlanEfficiency, 3) + ", 1] (nvlink_efficiency = " +
                  fmt(m.nvlink_efficiency, 6) + ", pcie_efficiency = " + fmt(m.pcie_efficiency, 6) + ")");
  // 64-bit counts: T_total = T * world for the aux loss, and the bytes a rank moves per phase (T * row bytes; the
  // remote share is smaller). Requests whose counts do not fit are refused, never wrapped.
  const std::int64_t T = r.layer.tokens_per_rank;
  if (!Impl::checked_mul(T, world))
    plan_fail("tokens_per_rank", Rule::ConfigValue,
              "tokens_per_rank (" + std::to_string(T) + ") times the " + std::to_string(world) +
                  " ranks overflows 64 bits (global_num_tokens); lower tokens_per_rank");
  for (TokenDType t : {r.layer.dispatch_dtype, r.layer.combine_dtype}) {
    const std::int64_t row = Impl::token_row_bytes_exact(t, r.layer.hidden_size);
    if (!Impl::checked_mul(T, row))
      plan_fail("tokens_per_rank", Rule::ConfigValue,
                "tokens_per_rank (" + std::to_string(T) + ") x " + std::to_string(row) + " bytes per " + to_string(t) +
                    " token row (hidden_size " + std::to_string(r.layer.hidden_size) +
                    ") overflows 64-bit byte counts; lower tokens_per_rank or hidden_size");
  }
}

// bytes / (GB/s) in seconds; 0 bytes take no time on any link (also one of 0 GB/s, e.g. the network of a single
// node), so no time is ever inf or NaN.
double seconds(double bytes, double gbps) {
  if (!(bytes > 0)) return 0.0;
  if (!(gbps > 0))
    throw InvalidArgument("make_plan", "cost_model", Rule::PlanInfeasible,
                          "internal: " + fmt(bytes, 0) + " bytes routed over a link of " + fmt(gbps, 3) + " GB/s");
  return bytes / gbps / 1e9;
}

// One member of an EP group: (node, node-local GPU), in ep_index order.
struct Member {
  int node = 0;
  int gpu = 0;
};
using Group = std::vector<Member>;

struct RankLoad {
  double out[5] = {0, 0, 0, 0, 0};  // by LinkClass
  double in[5] = {0, 0, 0, 0, 0};
  double direct_out_time = 0, direct_in_time = 0;
  int direct_out_peer = -1, direct_in_peer = -1;
};

class CostEvaluator {
 public:
  CostEvaluator(const PlanRequest& r) : m_req(r), m_node(r.cluster.node), m_n(r.cluster.node.num_gpus()) {
    const CostModel& c = r.cost_model;
    m_link.assign(m_n, std::vector<Impl::PairLink>(m_n));
    for (int i = 0; i < m_n; ++i) {
      m_port.push_back(Impl::switch_port_gbps(m_node, i, c));
      for (int j = 0; j < m_n; ++j)
        if (i != j) m_link[i][j] = Impl::pair_link(m_node, i, j, c);
    }
    m_pcie = c.pcie_gbps * c.pcie_efficiency;
    m_net = r.cluster.inter_node_gbps;
  }

  // One phase over the representative groups. reverse = combine (rows flow back to their source ranks).
  PhaseEstimate phase(const std::vector<Group>& groups, const std::vector<double>& P, double row_bytes,
                      bool reverse) const {
    PhaseEstimate ph;
    ph.row_bytes = row_bytes;
    const double unit = static_cast<double>(m_req.layer.tokens_per_rank) * row_bytes;
    double worst = -1;
    double total_p = 0;
    for (double p : P) total_p += p;
    for (const Group& g : groups) {
      const int R = static_cast<int>(g.size());
      // members per node: a rank's NVLink/PCIe peers are the members on its node (O(R * n), not O(R^2))
      std::map<int, std::vector<int>> by_node;
      for (int b = 0; b < R; ++b) by_node[g[b].node].push_back(b);
      for (int a = 0; a < R; ++a) {
        const Member s = g[a];
        RankLoad L;
        double on_node_p = 0;
        int on_node = 0;
        for (int b : by_node[s.node]) {
          if (b == a) continue;
          ++on_node;
          on_node_p += P[b];
          const double out = unit * (reverse ? P[a] : P[b]), in = unit * (reverse ? P[b] : P[a]);
          const Impl::PairLink& lk = m_link[s.gpu][g[b].gpu];
          const int cls = static_cast<int>(lk.cls);
          L.out[cls] += out;
          L.in[cls] += in;
          if (lk.cls == LinkClass::NvlinkDirect) {
            const double to = seconds(out, lk.gbps), ti = seconds(in, lk.gbps);
            if (to > L.direct_out_time) L.direct_out_time = to, L.direct_out_peer = b;
            if (ti > L.direct_in_time) L.direct_in_time = ti, L.direct_in_peer = b;
          }
        }
        const int off = R - 1 - on_node;
        // Without peers on other nodes nothing crosses the network: total_p - P[a] - on_node_p is then a rounding
        // residue (1e-16, either sign), which over a single node's 0 GB/s network once gave an infinite time.
        const double off_p = off > 0 ? std::max(0.0, total_p - P[a] - on_node_p) : 0.0;
        const int net = static_cast<int>(LinkClass::Network);
        L.out[net] = unit * (reverse ? P[a] * off : off_p);
        L.in[net] = unit * (reverse ? off_p : P[a] * off);
        // The rank's slowest resource: the time and (lazily, for the phase's worst rank only) what it is.
        const int sw = static_cast<int>(LinkClass::NvlinkSwitch), pc = static_cast<int>(LinkClass::Pcie);
        enum Kind { Direct, Switch, Pcie, Net };
        double t = 0;
        Kind kind = Direct;
        int peer = -1;
        bool egress = true;
        auto consider = [&](double x, Kind k, int p, bool out) {
          if (x > t) t = x, kind = k, peer = p, egress = out;
        };
        consider(L.direct_out_time, Direct, L.direct_out_peer, true);
        consider(L.direct_in_time, Direct, L.direct_in_peer, false);
        consider(seconds(L.out[sw], m_port[s.gpu]), Switch, -1, true);
        consider(seconds(L.in[sw], m_port[s.gpu]), Switch, -1, false);
        consider(seconds(L.out[pc], m_pcie), Pcie, -1, true);
        consider(seconds(L.in[pc], m_pcie), Pcie, -1, false);
        consider(seconds(L.out[net], m_net), Net, -1, true);
        consider(seconds(L.in[net], m_net), Net, -1, false);
        auto describe = [&]() {
          const std::string where = "GPU " + std::to_string(s.gpu) +
                                    (m_req.cluster.num_nodes > 1 ? " of node " + std::to_string(s.node) : "");
          std::string what;
          double gbps = 0;
          switch (kind) {
            case Direct:
              gbps = m_link[s.gpu][g[peer].gpu].gbps;
              what = "NVLink " + where + " <-> GPU " + std::to_string(g[peer].gpu);
              break;
            case Switch:
              gbps = m_port[s.gpu];
              what = "NVSwitch port of " + where;
              break;
            case Pcie:
              gbps = m_pcie;
              what = "PCIe of " + where;
              break;
            case Net:
              gbps = m_net;
              what = "inter-node link of " + where;
              break;
          }
          return what + " (" + fmt(gbps, 1) + " GB/s), " + (egress ? "egress" : "ingress");
        };
        double sent = 0, recv = 0;
        for (int c = 1; c < 5; ++c) sent += L.out[c], recv += L.in[c];
        ph.bytes_sent = std::max(ph.bytes_sent, sent);
        ph.bytes_received = std::max(ph.bytes_received, recv);
        ph.bytes_local = std::max(ph.bytes_local, unit * P[a]);
        if (t > worst) {
          worst = t;
          ph.time_us = t * 1e6;
          ph.bottleneck = t > 0 ? describe() : std::string();
          ph.bytes_nvlink = L.out[1] + L.out[2];
          ph.bytes_pcie = L.out[pc];
          ph.bytes_network = L.out[net];
        }
      }
    }
    if (ph.time_us == 0) ph.bottleneck = "none (no remote traffic)";
    return ph;
  }

 private:
  const PlanRequest& m_req;
  const NvlinkTopology& m_node;
  int m_n;
  std::vector<std::vector<Impl::PairLink>> m_link;
  std::vector<double> m_port;
  double m_pcie = 0, m_net = 0;
};

struct Candidate {
  PlanCandidate c;
  std::vector<Group> groups;  // representative groups (node 0 for in-node, the first group across nodes)
  std::vector<double> P;
  int tier = 0;
  std::string unused_reason;
};

int tier_of(const PlanCandidate& c) { return c.ep_size > 1 ? (c.nvlink_clique_groups ? 0 : 1) : 2; }

bool ranks_before(const Candidate& x, const Candidate& y) {
  if (x.tier != y.tier) return x.tier < y.tier;
  if (x.c.gpus_used != y.c.gpus_used) return x.c.gpus_used > y.c.gpus_used;  // more of the machine first
  const double tx = x.c.traffic.time_us, ty = y.c.traffic.time_us;
  if (x.tier == 0 && x.c.ep_size != y.c.ep_size) return x.c.ep_size > y.c.ep_size;
  if (tx != ty) return tx < ty;
  return x.c.ep_size > y.c.ep_size;
}

std::string us(double t) { return fmt(t, 1) + " us"; }

// Post-condition: no field of a plan is inf or NaN (its JSON would hold null, which plan_from_json rejects).
void check_finite(const Plan& p) {
  std::vector<std::pair<const char*, double>> v;
  auto phase = [&](const PhaseEstimate& ph) {
    for (double x : {ph.row_bytes, ph.bytes_sent, ph.bytes_received, ph.bytes_local, ph.bytes_nvlink, ph.bytes_pcie,
                     ph.bytes_network, ph.time_us})
      v.push_back({"traffic", x});
  };
  auto traffic = [&](const TrafficEstimate& t) {
    v.push_back({"traffic", t.destinations_per_token});
    v.push_back({"traffic", t.remote_destinations_per_token});
    v.push_back({"traffic", t.time_us});
    phase(t.dispatch);
    phase(t.combine);
  };
  traffic(p.traffic);
  for (const auto& a : p.alternatives) traffic(a.traffic);
  for (const auto& r : p.ranks)
    for (double x : {r.dispatch_bytes_sent, r.dispatch_bytes_received, r.combine_bytes_sent, r.combine_bytes_received})
      v.push_back({"ranks", x});
  for (const auto& g : p.ep_groups) v.push_back({"ep_groups", g.min_pair_gbps});
  for (const auto& [what, x] : v)
    if (!std::isfinite(x) || x < 0)
      throw InvalidArgument("make_plan", what, Rule::PlanInfeasible,
                            std::string("internal: a ") + what + " value of the plan is " + fmt(x, 3) +
                                " (every plan value must be finite and non-negative)");
}

}  // namespace

Plan make_plan(const PlanRequest& req) {
  validate_request(req);
  const MoeLayerConfig& layer = req.layer;
  const NvlinkTopology& node = req.cluster.node;
  const PlanConstraints& k = req.constraints;
  const int n = node.num_gpus(), nodes = req.cluster.num_nodes, W = n * nodes, E = layer.num_experts;
  const std::string Etext = std::to_string(E), Wtext = std::to_string(W) + " GPUs (" + std::to_string(nodes) +
                                                       (nodes == 1 ? " node" : " nodes") + " x " + std::to_string(n) +
                                                       ")";

  bool cliques_truncated = false;
  const auto cliques = Impl::node_cliques(node, &cliques_truncated);
  int largest_clique = 1;
  for (const auto& c : cliques) largest_clique = std::max<int>(largest_clique, static_cast<int>(c.size()));
  const bool every = k.use_every_gpu;
  // EP groups inside a node, per size (docs/topology.md §10): NVLink groups only unless every GPU must be used; when no
  // NVLink group of the size exists and it divides the node, a partition over any pairs is the (PCIe) fallback.
  std::map<std::pair<int, bool>, Impl::NodeGrouping> groupings;
  auto grouping = [&](int R, bool all) -> const Impl::NodeGrouping& {
    auto it = groupings.find({R, all});
    if (it == groupings.end())
      it = groupings
               .emplace(std::make_pair(R, all),
                        Impl::group_node(node, R, req.cost_model, all, Impl::kGroupStepLimit, cliques))
               .first;
    return it->second;
  };

  // Why an EP size is not a candidate ("" when it is).
  auto exclusion = [&](int R) -> std::string {
    const std::string ep = "EP" + std::to_string(R);
    if (E % R != 0) return "num_experts (" + Etext + ") is not a multiple of " + std::to_string(R);
    if ((E / R) % k.local_expert_alignment != 0)
      return "E/EP = " + std::to_string(E / R) + " local experts is not a multiple of local_expert_alignment (" +
             std::to_string(k.local_expert_alignment) + ")";
    if (R > n && R % n != 0)
      return ep + " neither fits in a node's " + std::to_string(n) +
             " GPUs nor is a multiple of it (EP groups are node subsets or whole nodes)";
    if (R > n && W % R != 0) return ep + " does not divide the " + Wtext;
    if (k.max_ep_size > 0 && R > k.max_ep_size && R != k.fixed_ep_size)
      return ep + " exceeds max_ep_size (" + std::to_string(k.max_ep_size) + ")";
    if (R <= n && R > 1) {
      if (every && n % R != 0) return ep + " does not divide a node's " + std::to_string(n) + " GPUs (use_every_gpu)";
      if (!every && grouping(R, false).groups.empty() && n % R != 0)
        return ep + ": " + grouping(R, false).note + ", and " + std::to_string(R) + " does not divide a node's " +
               std::to_string(n) + " GPUs for a PCIe partition";
    }
    return {};
  };

  if (k.fixed_ep_size > 0) {
    const int R = k.fixed_ep_size;
    if (R > W)
      plan_fail("fixed_ep_size", Rule::PlanInfeasible,
                "fixed_ep_size (" + std::to_string(R) + ") exceeds the " + Wtext + "; lower it to a divisor of " +
                    std::to_string(W) + " or plan more nodes");
    if (k.max_ep_size > 0 && R > k.max_ep_size)
      plan_fail("fixed_ep_size", Rule::PlanInfeasible,
                "fixed_ep_size (" + std::to_string(R) + ") exceeds max_ep_size (" + std::to_string(k.max_ep_size) +
                    "); drop one of the two constraints");
    const std::string why = exclusion(R);
    if (!why.empty()) {
      std::string ok;
      for (int r = 1; r <= W; ++r)
        if ((r <= n || W % r == 0) && exclusion(r).empty()) ok += (ok.empty() ? "" : ", ") + std::to_string(r);
      plan_fail("fixed_ep_size", Rule::PlanInfeasible,
                "fixed_ep_size (" + std::to_string(R) + ") is infeasible: " + why +
                    "; feasible EP sizes here: " + (ok.empty() ? "none" : ok));
    }
  }

  CostEvaluator cost(req);
  const RoutingModel model = Impl::resolve_model(layer);
  const double bd = token_row_bytes(layer.dispatch_dtype, layer.hidden_size);
  const double bc = token_row_bytes(layer.combine_dtype, layer.hidden_size);

  std::vector<Candidate> cands;
  std::map<int, std::string> excluded;
  std::vector<std::string> warnings;
  if (cliques_truncated)
    warnings.push_back("more than " + std::to_string(Impl::kMaxPlannerCliques) +
                       " maximal NVLink cliques: the clique list is truncated");
  for (int R = 1; R <= W; ++R) {
    if (R > n && W % R != 0) continue;       // EP sizes inside a node need not divide the world (GPUs may stay unused)
    if (E % R != 0 && W % R != 0) continue;  // neither divides: not worth a line in the reasons
    const std::string why = exclusion(R);
    if (!why.empty()) {
      excluded[R] = why;
      continue;
    }
    Candidate cd;
    PlanCandidate& c = cd.c;
    c.ep_size = R;
    c.local_experts = E / R;
    if (R <= n) {
      const bool fallback = R > 1 && !every && grouping(R, false).groups.empty();
      const Impl::NodeGrouping& ng = grouping(R, every || fallback);
      c.node_groups = ng.groups;
      c.unused_gpus = ng.unused;
      cd.unused_reason = ng.unused_reason;
      c.dp_size = static_cast<int>(ng.groups.size()) * nodes;
      c.gpus_used = c.dp_size * R;
      c.nvlink_clique_groups = ng.all_nvlink;
      c.nodes_per_group = 1;
      for (const auto& g : ng.groups) {
        Group grp;
        for (int v : g) grp.push_back({0, v});
        cd.groups.push_back(grp);
      }
      if (R == 1) {
        c.note = "EP1: every GPU holds all " + Etext + " experts; no dispatch/combine traffic";
      } else if (ng.all_nvlink) {
        std::string gs;
        for (const auto& g : ng.groups) gs += (gs.empty() ? "{" : ", {") + Impl::ids_text(g) + "}";
        c.note =
            "groups inside NVLink cliques: " + gs + " per node (slowest pair " + fmt(ng.min_pair_gbps, 1) + " GB/s)";
        if (ng.numa_straddles > 0) c.note += "; " + std::to_string(ng.numa_straddles) + " group(s) span NUMA nodes";
        if (!ng.unused.empty())
          c.note += "; GPU" + std::string(ng.unused.size() == 1 ? " " : "s ") + Impl::ids_text(ng.unused) +
                    " of each node unused";
      } else {
        c.note = ng.note;
      }
      if (ng.search_limited)
        warnings.push_back("EP" + std::to_string(R) +
                           ": the group search hit its step limit; the groups are valid but may not be optimal");
    } else {
      c.dp_size = W / R;
      c.gpus_used = W;
      c.nodes_per_group = R / n;
      c.nvlink_clique_groups = false;
      Group grp;
      for (int d = 0; d < c.nodes_per_group; ++d)
        for (int v = 0; v < n; ++v) grp.push_back({d, v});
      cd.groups.push_back(grp);
      c.note = "EP groups span " + std::to_string(c.nodes_per_group) + " nodes: " + fmt(100.0 * (R - n) / (R - 1), 0) +
               "% of the remote traffic crosses the network at " + fmt(req.cluster.inter_node_gbps, 1) +
               " GB/s per GPU";
    }
    cd.P = rank_hit_probabilities(layer, R);
    TrafficEstimate& tr = c.traffic;
    tr.model = model;
    double D = 0;
    for (double p : cd.P) D += p;
    tr.destinations_per_token = D;
    double remote = 0;  // the largest over ranks of the others' hit probabilities (equal P: D * (R - 1) / R)
    for (int a = 0; a < R && R > 1; ++a) remote = std::max(remote, std::max(0.0, D - cd.P[a]));
    tr.remote_destinations_per_token = remote;
    tr.dispatch = cost.phase(cd.groups, cd.P, bd, false);
    tr.combine = cost.phase(cd.groups, cd.P, bc, true);
    tr.time_us = tr.dispatch.time_us + tr.combine.time_us;
    cd.tier = tier_of(c);
    cands.push_back(std::move(cd));
  }
  if (cands.empty()) {
    std::string all;
    for (const auto& [R, why] : excluded) all += "; " + why;
    plan_fail("constraints", Rule::PlanInfeasible,
              "no EP size is feasible for num_experts = " + Etext + " on " + Wtext + all +
                  ". Change local_expert_alignment or num_experts");
  }
  std::stable_sort(cands.begin(), cands.end(), ranks_before);
  std::size_t chosen = 0;
  if (k.fixed_ep_size > 0)
    for (std::size_t i = 0; i < cands.size(); ++i)
      if (cands[i].c.ep_size == k.fixed_ep_size) chosen = i;
  if (chosen != 0) std::rotate(cands.begin(), cands.begin() + chosen, cands.begin() + chosen + 1);
  const Candidate& best = cands[0];
  const int R = best.c.ep_size, DP = best.c.dp_size, L = best.c.local_experts;

  Plan plan;
  plan.layer = layer;
  plan.constraints = k;
  plan.cost_model = req.cost_model;
  ClusterSummary& cs = plan.cluster;
  cs.num_nodes = nodes;
  cs.gpus_per_node = n;
  cs.inter_node_gbps = req.cluster.inter_node_gbps;
  cs.gpu_model = node.gpus[0].model;
  cs.topology_source = to_string(node.source);
  for (const auto& g : node.gpus) cs.gpu_pci.push_back(g.pci.str());
  cs.node_cliques = cliques;
  plan.mesh = Mesh({{"dp", DP, AxisKind::Data}, {"ep", R, AxisKind::Expert}});
  plan.local_experts = L;
  plan.traffic = best.c.traffic;
  for (const Candidate& c : cands) plan.alternatives.push_back(c.c);

  // Ranks and EP groups. In-node groups: node-major, groups in node order; cross-node groups: whole nodes.
  std::vector<Group> all_groups;
  if (R <= n) {
    for (int d = 0; d < nodes; ++d)
      for (const auto& g : best.c.node_groups) {
        Group grp;
        for (int v : g) grp.push_back({d, v});
        all_groups.push_back(grp);
      }
  } else {
    const int m = R / n;
    for (int q = 0; q < nodes / m; ++q) {
      Group grp;
      for (int d = q * m; d < (q + 1) * m; ++d)
        for (int v = 0; v < n; ++v) grp.push_back({d, v});
      all_groups.push_back(grp);
    }
  }
  double sumP = 0;
  for (double p : best.P) sumP += p;
  const double T = static_cast<double>(layer.tokens_per_rank);
  const int used = static_cast<int>(all_groups.size()) * R;  // GPUs in the mesh (GPUs that fit no group have none)
  plan.ranks.resize(used);
  plan.unused_gpus = best.c.unused_gpus;
  plan.unused_reason = best.unused_reason;
  for (int q = 0; q < static_cast<int>(all_groups.size()); ++q) {
    EpGroupInfo info;
    const Group& g = all_groups[q];
    std::vector<std::pair<int, int>> numa;
    double min_bw = 0;
    bool first = true, nvl = true;
    for (int a = 0; a < R; ++a) {
      RankPlacement& rp = plan.ranks[q * R + a];
      rp.rank = q * R + a;
      rp.node = g[a].node;
      rp.gpu = g[a].gpu;
      rp.pci = cs.gpu_pci[g[a].gpu];
      rp.dp_index = q;
      rp.ep_index = a;
      rp.first_expert = a * L;
      rp.num_local_experts = L;
      const double pa = best.P[a];
      const double others = std::max(0.0, sumP - pa);  // never a negative rounding residue
      rp.dispatch_bytes_sent = T * bd * others;
      rp.dispatch_bytes_received = T * bd * (R - 1) * pa;
      rp.combine_bytes_sent = T * bc * (R - 1) * pa;
      rp.combine_bytes_received = T * bc * others;
      info.ranks.push_back(rp.rank);
      const int nk = Impl::numa_key(node, g[a].gpu);
      if (nk >= 0 && std::find(numa.begin(), numa.end(), std::make_pair(g[a].node, nk)) == numa.end())
        numa.push_back({g[a].node, nk});
      // members are node-major: the pairs on a's node follow it; pairs across nodes all use the network
      for (int b = a + 1; b < R && g[b].node == g[a].node; ++b) {
        const Impl::PairLink lk = Impl::pair_link(node, g[a].gpu, g[b].gpu, req.cost_model);
        nvl = nvl && lk.nvlink;
        min_bw = first ? lk.gbps : std::min(min_bw, lk.gbps);
        first = false;
      }
    }
    info.num_nodes = 1;  // node-major members: count the node changes
    for (int b = 1; b < R; ++b) info.num_nodes += g[b].node != g[b - 1].node ? 1 : 0;
    if (info.num_nodes > 1) {
      nvl = false;
      min_bw = first ? req.cluster.inter_node_gbps : std::min(min_bw, req.cluster.inter_node_gbps);
    }
    info.nvlink_clique = nvl;
    info.min_pair_gbps = min_bw;
    info.numa_nodes = static_cast<int>(numa.size());
    plan.ep_groups.push_back(info);
  }

  // Router sharding specs from the partition rules on the plan's mesh: tokens split over (dp, ep).
  {
    const std::vector<std::string> tok{"dp", "ep"};
    const ShardingSpec rows = ShardingSpec::split_dim0(tok, 2);
    auto add = [&](const RouterOpSpec& op, const std::vector<ShardingSpec>& in) {
      const ShardingDecision d = router_sharding_rule(plan.mesh, op, in);
      for (std::size_t i = 0; i < d.arguments.size(); ++i)
        plan.router_shardings.push_back({to_string(op.op), d.argument_names[i], d.arguments[i]});
      for (std::size_t i = 0; i < d.outputs.size(); ++i)
        plan.router_shardings.push_back({to_string(op.op), d.output_names[i], d.outputs[i]});
    };
    RouterOpSpec fwd;
    fwd.op = RouterOp::Forward;
    add(fwd, {rows, ShardingSpec::replicated(1)});
    RouterOpSpec bwd;
    bwd.op = RouterOp::Backward;
    add(bwd, {rows, rows, rows});
    plan.global_num_tokens = *Impl::checked_mul(layer.tokens_per_rank, used);  // validate_request checked T * W
    if (plan.global_num_tokens >= 1) {
      RouterOpSpec aux;
      aux.op = RouterOp::AuxLoss;
      aux.global_num_tokens = plan.global_num_tokens;
      add(aux, {rows, ShardingSpec::replicated(1)});
    }
  }

  // Why.
  std::string reason;
  const std::string eptext = "EP" + std::to_string(R);
  auto best_of_tier = [&](int tier, int not_R) -> const Candidate* {
    for (const Candidate& c : cands)
      if (c.tier == tier && c.c.ep_size != not_R) return &c;
    return nullptr;
  };
  if (k.fixed_ep_size > 0) {
    reason = eptext + " forced by fixed_ep_size";
    if (R > 1 && !best.c.nvlink_clique_groups) reason += ": " + best.c.note;
    const Candidate* alt = cands.size() > 1 ? &cands[1] : nullptr;
    if (alt)
      reason += "; predicted " + us(best.c.traffic.time_us) + " per dispatch + combine, vs " +
                us(alt->c.traffic.time_us) + " for the best unforced plan (DP" + std::to_string(alt->c.dp_size) +
                " x EP" + std::to_string(alt->c.ep_size) + ")";
  } else if (best.tier == 0) {
    const Candidate* larger = nullptr;  // a larger EP size in NVLink cliques that uses fewer GPUs
    for (const Candidate& c : cands)
      if (c.tier == 0 && c.c.ep_size > R && (!larger || c.c.ep_size > larger->c.ep_size)) larger = &c;
    if (!larger)
      reason = eptext + ": the largest feasible EP size whose groups fit inside NVLink cliques (largest clique: " +
               std::to_string(largest_clique) + " GPUs per node)";
    else
      reason = eptext + ": the largest EP size whose NVLink-clique groups use " + std::to_string(best.c.gpus_used) +
               " GPUs (largest clique: " + std::to_string(largest_clique) + " GPUs per node); EP" +
               std::to_string(larger->c.ep_size) + " fits in NVLink cliques too but uses only " +
               std::to_string(larger->c.gpus_used) + " (force it with fixed_ep_size)";
    std::string limits;
    for (const auto& [r, why] : excluded)
      if (r > R && r <= std::min(n, largest_clique)) limits += "; " + why;
    reason += limits;
    if (nodes > 1) {
      reason += "; DP" + std::to_string(DP) + " across the " + std::to_string(nodes) +
                " nodes keeps dispatch and combine on NVLink";
      for (const Candidate& c : cands)
        if (c.c.nodes_per_group > 1) {
          reason += " (EP" + std::to_string(c.c.ep_size) + " across nodes: " + us(c.c.traffic.time_us) + " vs " +
                    us(best.c.traffic.time_us) + "; force it with fixed_ep_size)";
          break;
        }
    }
  } else if (best.tier == 1) {
    reason = "no EP size > 1 fits inside an NVLink clique (largest clique: " + std::to_string(largest_clique) +
             " GPUs per node); " + eptext + " is the fastest alternative: " + best.c.note;
  } else {
    reason = "EP1 (experts replicated): no EP size > 1 is feasible";
    for (const auto& [r, why] : excluded) reason += "; " + why;
  }
  if (const Candidate* c1 = best_of_tier(1, R); best.tier == 0 && c1 && nodes == 1)
    reason +=
        "; the best non-clique alternative is EP" + std::to_string(c1->c.ep_size) + " at " + us(c1->c.traffic.time_us);
  if (!plan.unused_gpus.empty())
    reason += "; " + std::to_string(plan.unused_gpus.size()) + " of each node's " + std::to_string(n) +
              " GPUs left out of the EP mesh (" + plan.unused_reason +
              "); set use_every_gpu to include them (EP sizes dividing the node, PCIe groups allowed)";
  plan.reason = reason;

  if (!node.nvlink_known && node.source != NvlinkTopology::Source::None)
    warnings.push_back(
        "the topology has no NVLink information (no NVML or no NVLinkBandwidth matrix): every pair "
        "is planned as PCIe");
  for (const auto& w : node.warnings) warnings.push_back("topology: " + w);
  plan.warnings = warnings;
  check_finite(plan);
  return plan;
}

}  // namespace KokkosMoE
