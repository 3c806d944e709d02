/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// kokkosmoe-plan: plans the DP x EP layout of a MoE layer on this machine (or a fixture) times a node count.
// A thin CLI over KokkosMoE_Planner.hpp: human-readable by default, --json for tools.

#include <KokkosMoE_Planner.hpp>
#include <KokkosMoE_RouterPresets.hpp>
#include <KokkosMoE_Topology.hpp>

#include <cstdint>
#include <iostream>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "KokkosMoE_Cli.hpp"

namespace {

constexpr double kDefaultInterNodeGbps = 48.0;  // one CX7 NDR NIC per GPU, achievable (docs/ep.md §10)

const char* kUsage =
    "usage: kokkosmoe-plan [--preset NAME] [--nodes N] [--tokens-per-rank T] [--xml FILE] [--json] [options]\n"
    "\n"
    "  --preset NAME            router preset: deepseek-v3 (default), qwen3-moe, mixtral, llama4-scout,\n"
    "                           llama4-maverick, large, kimi-k2\n"
    "  --nodes N                identical nodes (default 1)\n"
    "  --tokens-per-rank T      tokens each rank routes per step (default 4096)\n"
    "  --xml FILE               plan on an hwloc v2 XML fixture instead of this machine\n"
    "  --json                   print the plan as JSON (format kokkosmoe-plan, version 1)\n"
    "  --inter-node-gbps X      effective GB/s per GPU per direction between nodes (default 48 when --nodes > 1)\n"
    "  --ep N                   force this EP size          --max-ep N     no EP size above N\n"
    "  --align N                experts per rank must be a multiple of N\n"
    "  --use-every-gpu          every GPU joins the EP mesh (default: GPUs that fit no NVLink group of the EP size\n"
    "                           are left out and reported)\n"
    "  --dispatch-dtype D       bf16 (default), fp16, fp32, fp8      --combine-dtype D   (default bf16)\n"
    "  --routing-model M        auto (default), uniform, group-quota, group-uniform-experts\n"
    "  --experts E --topk K --groups G --group-topk GK --hidden H   override the preset's layer\n"
    "  --nvlink-link-gbps X     NVLink line rate per link per direction (default 25, NVLink 4)\n"
    "  --nvlink-efficiency X    (default 0.82)   --pcie-gbps X (default 63)   --pcie-efficiency X (default 0.8)\n"
    "  --no-env                 ignore KOKKOSMOE_TOPO_XML and HWLOC_XMLFILE\n"
    "  -h, --help               this text\n"
    "\n"
    "exit status: 0 ok, 1 error (infeasible request, unreadable topology), 2 usage error (one line naming the\n"
    "option and its accepted range)\n";

const std::vector<KokkosMoE::Impl::CliFlag> kFlags = {
    {"--preset", true, ""},
    {"--nodes", true, ""},
    {"--tokens-per-rank", true, ""},
    {"--xml", true, ""},
    {"--json", false, ""},
    {"--inter-node-gbps", true, ""},
    {"--ep", true, ""},
    {"--max-ep", true, ""},
    {"--align", true, ""},
    {"--dispatch-dtype", true, ""},
    {"--combine-dtype", true, ""},
    {"--routing-model", true, ""},
    {"--experts", true, ""},
    {"--topk", true, ""},
    {"--groups", true, ""},
    {"--group-topk", true, ""},
    {"--hidden", true, ""},
    {"--nvlink-link-gbps", true, ""},
    {"--nvlink-efficiency", true, ""},
    {"--pcie-gbps", true, ""},
    {"--pcie-efficiency", true, ""},
    {"--no-env", false, ""},
    {"--use-every-gpu", false, ""},
    {"--help", false, "-h"},
};

constexpr std::int64_t kIntMax = std::numeric_limits<int>::max();

int run(int argc, char** argv) {
  using namespace KokkosMoE;
  const Impl::CliArgs cli = Impl::parse_command_line(argc, argv, kFlags);
  if (cli.has("--help")) {
    std::cout << kUsage;
    return 0;
  }
  const std::vector<std::string> dtypes{"bf16", "fp16", "fp32", "fp8"};
  const std::vector<std::string> models{"auto", "uniform", "group-quota", "group-uniform-experts"};
  // Every value is range-checked in 64 bits before it is narrowed to the planner's int fields.
  const std::string preset = cli.choice("--preset", router_preset_names(), "deepseek-v3");
  const std::int64_t nodes = cli.integer("--nodes", 1, kMaxPlanWorldSize, 1);
  const std::int64_t tokens = cli.integer("--tokens-per-rank", 0, std::numeric_limits<std::int64_t>::max(), 4096);
  DetectOptions detect;
  detect.xml_path = cli.input_file("--xml", Impl::kCliMaxInputBytes);
  detect.honor_env = !cli.has("--no-env");
  const bool json = cli.has("--json");
  const std::optional<double> inter = cli.number("--inter-node-gbps", kMinPlanGbps, kMaxPlanGbps, false, false);
  PlanConstraints constraints;
  constraints.fixed_ep_size = static_cast<int>(cli.integer("--ep", 1, kMaxPlanWorldSize, 0));
  constraints.max_ep_size = static_cast<int>(cli.integer("--max-ep", 1, kMaxPlanWorldSize, 0));
  constraints.local_expert_alignment = static_cast<int>(cli.integer("--align", 1, kIntMax, 1));
  constraints.use_every_gpu = cli.has("--use-every-gpu");
  CostModel cost;
  // The planner's own bounds (KokkosMoE_Planner.hpp): every predicted time stays finite.
  const double g0 = kMinPlanGbps, g1 = kMaxPlanGbps, e0 = kMinPlanEfficiency;
  cost.nvlink_link_gbps = cli.number("--nvlink-link-gbps", g0, g1, false, false, cost.nvlink_link_gbps);
  cost.nvlink_efficiency = cli.number("--nvlink-efficiency", e0, 1, false, false, cost.nvlink_efficiency);
  cost.pcie_gbps = cli.number("--pcie-gbps", g0, g1, false, false, cost.pcie_gbps);
  cost.pcie_efficiency = cli.number("--pcie-efficiency", e0, 1, false, false, cost.pcie_efficiency);
  const auto experts = cli.integer("--experts", 1, kMaxPlanExperts);
  const auto topk = cli.integer("--topk", 1, kMaxPlanExperts);
  const auto groups = cli.integer("--groups", 0, kMaxPlanExperts);
  const auto group_topk = cli.integer("--group-topk", 0, kMaxPlanExperts);
  const auto hidden = cli.integer("--hidden", 1, kIntMax);
  const std::string dispatch = cli.choice("--dispatch-dtype", dtypes, "bf16");
  const std::string combine = cli.choice("--combine-dtype", dtypes, "bf16");
  const std::string model = cli.choice("--routing-model", models, "auto");

  PlanRequest req;
  req.layer = moe_layer_from_preset(router_preset(preset), tokens);
  if (experts) req.layer.num_experts = static_cast<int>(*experts);
  if (topk) req.layer.topk = static_cast<int>(*topk);
  if (groups) req.layer.num_groups = static_cast<int>(*groups);
  if (group_topk) req.layer.group_topk = static_cast<int>(*group_topk);
  if (hidden) req.layer.hidden_size = static_cast<int>(*hidden);
  if (experts || topk || groups || group_topk || hidden) req.layer.name = preset + " (modified)";
  req.layer.dispatch_dtype = *token_dtype_from_string(dispatch);
  req.layer.combine_dtype = *token_dtype_from_string(combine);
  req.layer.routing_model = *routing_model_from_string(model);
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
}

}  // namespace

int main(int argc, char** argv) {
  return KokkosMoE::Impl::cli_main("kokkosmoe-plan", [&] { return run(argc, argv); });
}
