/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// kokkosmoe-plan: plans the DP x EP layout of a MoE layer on this machine (or a fixture) times a node count.
// A thin CLI over KokkosMoE_Planner.hpp: human-readable by default, --json for tools.

#include <KokkosMoE_Planner.hpp>
#include <KokkosMoE_RouterPresets.hpp>
#include <KokkosMoE_Topology.hpp>

#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>

namespace {

constexpr double kDefaultInterNodeGbps = 48.0;  // one CX7 NDR NIC per GPU, achievable (docs/ep.md §10)

const char* kUsage =
    "usage: kokkosmoe-plan [--preset NAME] [--nodes N] [--tokens-per-rank T] [--xml FILE] [--json] [options]\n"
    "\n"
    "  --preset NAME            router preset: deepseek-v3 (default), qwen3-moe, mixtral, llama4-scout,\n"
    "                           llama4-maverick, large\n"
    "  --nodes N                identical nodes (default 1)\n"
    "  --tokens-per-rank T      tokens each rank routes per step (default 4096)\n"
    "  --xml FILE               plan on an hwloc v2 XML fixture instead of this machine\n"
    "  --json                   print the plan as JSON (format kokkosmoe-plan, version 1)\n"
    "  --inter-node-gbps X      effective GB/s per GPU per direction between nodes (default 48 when --nodes > 1)\n"
    "  --ep N                   force this EP size          --max-ep N     no EP size above N\n"
    "  --align N                experts per rank must be a multiple of N\n"
    "  --dispatch-dtype D       bf16 (default), fp16, fp32, fp8      --combine-dtype D   (default bf16)\n"
    "  --routing-model M        auto (default), uniform, group-quota, group-uniform-experts\n"
    "  --experts E --topk K --groups G --group-topk GK --hidden H   override the preset's layer\n"
    "  --nvlink-link-gbps X     NVLink line rate per link per direction (default 25, NVLink 4)\n"
    "  --nvlink-efficiency X    (default 0.82)   --pcie-gbps X (default 63)   --pcie-efficiency X (default 0.8)\n"
    "  --no-env                 ignore KOKKOSMOE_TOPO_XML and HWLOC_XMLFILE\n"
    "  -h, --help               this text\n"
    "\n"
    "exit status: 0 ok, 1 error (infeasible request, unreadable topology), 2 usage\n";

[[noreturn]] void usage_error(const std::string& msg) {
  std::cerr << "kokkosmoe-plan: " << msg << "\n" << kUsage;
  std::exit(2);
}

long long to_int(const std::string& flag, const std::string& v) {
  try {
    std::size_t end = 0;
    const long long x = std::stoll(v, &end);
    if (end == v.size()) return x;
  } catch (const std::exception&) {
  }
  usage_error(flag + " needs an integer, got '" + v + "'");
}

double to_double(const std::string& flag, const std::string& v) {
  try {
    std::size_t end = 0;
    const double x = std::stod(v, &end);
    if (end == v.size()) return x;
  } catch (const std::exception&) {
  }
  usage_error(flag + " needs a number, got '" + v + "'");
}

}  // namespace

int main(int argc, char** argv) {
  using namespace KokkosMoE;
  std::string preset = "deepseek-v3";
  long long nodes = 1, tokens = 4096;
  std::optional<double> inter;
  bool json = false;
  DetectOptions detect;
  PlanConstraints constraints;
  CostModel cost;
  std::optional<TokenDType> dispatch, combine;
  std::optional<RoutingModel> model;
  std::optional<long long> experts, topk, groups, group_topk, hidden;
  for (int k = 1; k < argc; ++k) {
    const std::string a = argv[k];
    auto value = [&]() -> std::string {
      if (k + 1 >= argc) usage_error(a + " needs a value");
      return argv[++k];
    };
    if (a == "--preset")
      preset = value();
    else if (a == "--nodes")
      nodes = to_int(a, value());
    else if (a == "--tokens-per-rank")
      tokens = to_int(a, value());
    else if (a == "--xml")
      detect.xml_path = value();
    else if (a == "--json")
      json = true;
    else if (a == "--inter-node-gbps")
      inter = to_double(a, value());
    else if (a == "--ep")
      constraints.fixed_ep_size = static_cast<int>(to_int(a, value()));
    else if (a == "--max-ep")
      constraints.max_ep_size = static_cast<int>(to_int(a, value()));
    else if (a == "--align")
      constraints.local_expert_alignment = static_cast<int>(to_int(a, value()));
    else if (a == "--dispatch-dtype" || a == "--combine-dtype") {
      const std::string v = value();
      const auto t = token_dtype_from_string(v);
      if (!t) usage_error(a + ": unknown dtype '" + v + "' (bf16, fp16, fp32, fp8)");
      (a == "--dispatch-dtype" ? dispatch : combine) = *t;
    } else if (a == "--routing-model") {
      const std::string v = value();
      model = routing_model_from_string(v);
      if (!model) usage_error(a + ": unknown model '" + v + "'");
    } else if (a == "--experts")
      experts = to_int(a, value());
    else if (a == "--topk")
      topk = to_int(a, value());
    else if (a == "--groups")
      groups = to_int(a, value());
    else if (a == "--group-topk")
      group_topk = to_int(a, value());
    else if (a == "--hidden")
      hidden = to_int(a, value());
    else if (a == "--nvlink-link-gbps")
      cost.nvlink_link_gbps = to_double(a, value());
    else if (a == "--nvlink-efficiency")
      cost.nvlink_efficiency = to_double(a, value());
    else if (a == "--pcie-gbps")
      cost.pcie_gbps = to_double(a, value());
    else if (a == "--pcie-efficiency")
      cost.pcie_efficiency = to_double(a, value());
    else if (a == "--no-env")
      detect.honor_env = false;
    else if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      return 0;
    } else
      usage_error("unknown argument " + a);
  }
  try {
    PlanRequest req;
    req.layer = moe_layer_from_preset(router_preset(preset), tokens);
    if (experts) req.layer.num_experts = static_cast<int>(*experts);
    if (topk) req.layer.topk = static_cast<int>(*topk);
    if (groups) req.layer.num_groups = static_cast<int>(*groups);
    if (group_topk) req.layer.group_topk = static_cast<int>(*group_topk);
    if (hidden) req.layer.hidden_size = static_cast<int>(*hidden);
    if (experts || topk || groups || group_topk || hidden) req.layer.name = preset + " (modified)";
    if (dispatch) req.layer.dispatch_dtype = *dispatch;
    if (combine) req.layer.combine_dtype = *combine;
    if (model) req.layer.routing_model = *model;
    req.cluster.node = detect_topology(detect);
    req.cluster.num_nodes = static_cast<int>(nodes);
    req.cluster.inter_node_gbps = inter ? *inter : (nodes > 1 ? kDefaultInterNodeGbps : 0.0);
    req.constraints = constraints;
    req.cost_model = cost;
    const Plan plan = make_plan(req);
    if (json) {
      std::cout << plan_to_json(plan) << "\n";
    } else {
      if (nodes > 1 && !inter)
        std::cout << "note: --inter-node-gbps not given; assuming " << kDefaultInterNodeGbps
                  << " GB/s per GPU per direction (one 400 Gb/s NIC per GPU)\n";
      std::cout << plan_report(plan);
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "kokkosmoe-plan: " << e.what() << "\n";
    return 1;
  }
}
