/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// Plan <-> JSON (format "kokkosmoe-plan", version 1; docs/planner.md §6). nlohmann-json is a private dependency:
// no nlohmann type appears in a public header. Doubles are written in nlohmann's shortest round-trip form, so
// plan_from_json(plan_to_json(p)) == p holds exactly.

#include <impl/KokkosMoE_Planner_Internal.hpp>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace KokkosMoE {
namespace {

using nlohmann::json;
constexpr const char* kFormat = "kokkosmoe-plan";
constexpr int kVersion = 1;

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw InvalidArgument("plan_from_json", path, Rule::ConfigValue, "plan JSON: " + path + ": " + what);
}

// An integer of type T (int or int64) from a JSON number, range-checked: nlohmann's get<int>() narrows silently.
template <class T>
T integer_of(const json& v, const std::string& path) {
  if (!v.is_number_integer()) bad(path, "expected an integer");
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<T>::max())) bad(path, "integer out of range");
    return static_cast<T>(u);
  }
  const auto x = v.get<std::int64_t>();
  if (x < static_cast<std::int64_t>(std::numeric_limits<T>::min()) ||
      x > static_cast<std::int64_t>(std::numeric_limits<T>::max()))
    bad(path, "integer out of range");
  return static_cast<T>(x);
}

// Typed field access with the JSON path in every error.
template <class T>
T field(const json& j, const char* key, const std::string& path) {
  const std::string p = path.empty() ? key : path + "." + key;
  if (!j.is_object()) bad(path.empty() ? "(root)" : path, "expected an object");
  auto it = j.find(key);
  if (it == j.end()) bad(p, "missing");
  try {
    if constexpr (std::is_same_v<T, double>) {
      if (!it->is_number()) bad(p, "expected a number");
    } else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      return integer_of<T>(*it, p);
    } else if constexpr (std::is_same_v<T, bool>) {
      if (!it->is_boolean()) bad(p, "expected true or false");
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!it->is_string()) bad(p, "expected a string");
    }
    return it->get<T>();
  } catch (const nlohmann::json::exception& e) {
    bad(p, e.what());
  }
}

const json& array_field(const json& j, const char* key, const std::string& path) {
  const std::string p = path.empty() ? key : path + "." + key;
  if (!j.is_object()) bad(path, "expected an object");
  auto it = j.find(key);
  if (it == j.end()) bad(p, "missing");
  if (!it->is_array()) bad(p, "expected an array");
  return *it;
}

template <class E, class F>
E enum_field(const json& j, const char* key, const std::string& path, F from_string) {
  const std::string s = field<std::string>(j, key, path);
  const auto v = from_string(s);
  if (!v) bad(path + "." + key, "unknown value \"" + s + "\"");
  return *v;
}

std::vector<std::string> string_list(const json& a, const std::string& path) {
  std::vector<std::string> v;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!a[i].is_string()) bad(path + "[" + std::to_string(i) + "]", "expected a string");
    v.push_back(a[i].get<std::string>());
  }
  return v;
}

std::vector<int> int_list(const json& a, const std::string& path) {
  std::vector<int> v;
  for (std::size_t i = 0; i < a.size(); ++i) v.push_back(integer_of<int>(a[i], path + "[" + std::to_string(i) + "]"));
  return v;
}

std::vector<std::vector<int>> int_lists(const json& a, const std::string& path) {
  std::vector<std::vector<int>> v;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const std::string p = path + "[" + std::to_string(i) + "]";
    if (!a[i].is_array()) bad(p, "expected an array");
    v.push_back(int_list(a[i], p));
  }
  return v;
}

json spec_json(const ShardingSpec& s) { return {{"dims", s.dims}, {"partial", s.partial}, {"text", s.str()}}; }
ShardingSpec spec_from(const json& j, const std::string& path) {
  ShardingSpec s;
  const json& dims = array_field(j, "dims", path);
  for (std::size_t i = 0; i < dims.size(); ++i) {
    const std::string p = path + ".dims[" + std::to_string(i) + "]";
    if (!dims[i].is_array()) bad(p, "expected an array of axis names");
    s.dims.push_back(string_list(dims[i], p));
  }
  s.partial = string_list(array_field(j, "partial", path), path + ".partial");
  return s;
}

json phase_json(const PhaseEstimate& p) {
  return {{"row_bytes", p.row_bytes},         {"bytes_sent", p.bytes_sent},     {"bytes_received", p.bytes_received},
          {"bytes_local", p.bytes_local},     {"bytes_nvlink", p.bytes_nvlink}, {"bytes_pcie", p.bytes_pcie},
          {"bytes_network", p.bytes_network}, {"time_us", p.time_us},           {"bottleneck", p.bottleneck}};
}
PhaseEstimate phase_from(const json& j, const std::string& path) {
  PhaseEstimate p;
  p.row_bytes = field<double>(j, "row_bytes", path);
  p.bytes_sent = field<double>(j, "bytes_sent", path);
  p.bytes_received = field<double>(j, "bytes_received", path);
  p.bytes_local = field<double>(j, "bytes_local", path);
  p.bytes_nvlink = field<double>(j, "bytes_nvlink", path);
  p.bytes_pcie = field<double>(j, "bytes_pcie", path);
  p.bytes_network = field<double>(j, "bytes_network", path);
  p.time_us = field<double>(j, "time_us", path);
  p.bottleneck = field<std::string>(j, "bottleneck", path);
  return p;
}

json traffic_json(const TrafficEstimate& t) {
  return {{"model", to_string(t.model)},
          {"destinations_per_token", t.destinations_per_token},
          {"remote_destinations_per_token", t.remote_destinations_per_token},
          {"dispatch", phase_json(t.dispatch)},
          {"combine", phase_json(t.combine)},
          {"time_us", t.time_us}};
}
TrafficEstimate traffic_from(const json& j, const std::string& path) {
  TrafficEstimate t;
  t.model = enum_field<RoutingModel>(j, "model", path, routing_model_from_string);
  t.destinations_per_token = field<double>(j, "destinations_per_token", path);
  t.remote_destinations_per_token = field<double>(j, "remote_destinations_per_token", path);
  if (!j.contains("dispatch")) bad(path + ".dispatch", "missing");
  if (!j.contains("combine")) bad(path + ".combine", "missing");
  t.dispatch = phase_from(j.at("dispatch"), path + ".dispatch");
  t.combine = phase_from(j.at("combine"), path + ".combine");
  t.time_us = field<double>(j, "time_us", path);
  return t;
}

json candidate_json(const PlanCandidate& c) {
  return {{"dp_size", c.dp_size},
          {"ep_size", c.ep_size},
          {"local_experts", c.local_experts},
          {"nvlink_clique_groups", c.nvlink_clique_groups},
          {"nodes_per_group", c.nodes_per_group},
          {"node_groups", c.node_groups},
          {"gpus_used", c.gpus_used},
          {"unused_gpus", c.unused_gpus},
          {"traffic", traffic_json(c.traffic)},
          {"note", c.note}};
}
PlanCandidate candidate_from(const json& j, const std::string& path) {
  PlanCandidate c;
  c.dp_size = field<int>(j, "dp_size", path);
  c.ep_size = field<int>(j, "ep_size", path);
  c.local_experts = field<int>(j, "local_experts", path);
  c.nvlink_clique_groups = field<bool>(j, "nvlink_clique_groups", path);
  c.nodes_per_group = field<int>(j, "nodes_per_group", path);
  c.node_groups = int_lists(array_field(j, "node_groups", path), path + ".node_groups");
  // Optional: a plan file without them uses every GPU.
  if (j.contains("gpus_used")) c.gpus_used = field<int>(j, "gpus_used", path);
  if (j.contains("unused_gpus")) c.unused_gpus = int_list(array_field(j, "unused_gpus", path), path + ".unused_gpus");
  if (!j.contains("traffic")) bad(path + ".traffic", "missing");
  c.traffic = traffic_from(j.at("traffic"), path + ".traffic");
  c.note = field<std::string>(j, "note", path);
  return c;
}

}  // namespace

std::string plan_to_json(const Plan& p, int indent) {
  json j;
  j["format"] = kFormat;
  j["version"] = kVersion;
  const MoeLayerConfig& l = p.layer;
  j["layer"] = {{"name", l.name},
                {"num_experts", l.num_experts},
                {"topk", l.topk},
                {"num_groups", l.num_groups},
                {"group_topk", l.group_topk},
                {"hidden_size", l.hidden_size},
                {"dispatch_dtype", to_string(l.dispatch_dtype)},
                {"combine_dtype", to_string(l.combine_dtype)},
                {"tokens_per_rank", l.tokens_per_rank},
                {"routing_model", to_string(l.routing_model)}};
  j["constraints"] = {{"fixed_ep_size", p.constraints.fixed_ep_size},
                      {"max_ep_size", p.constraints.max_ep_size},
                      {"local_expert_alignment", p.constraints.local_expert_alignment},
                      {"use_every_gpu", p.constraints.use_every_gpu}};
  j["cost_model"] = {{"nvlink_link_gbps", p.cost_model.nvlink_link_gbps},
                     {"nvlink_efficiency", p.cost_model.nvlink_efficiency},
                     {"pcie_gbps", p.cost_model.pcie_gbps},
                     {"pcie_efficiency", p.cost_model.pcie_efficiency}};
  const ClusterSummary& c = p.cluster;
  j["cluster"] = {
      {"num_nodes", c.num_nodes},      {"gpus_per_node", c.gpus_per_node},     {"inter_node_gbps", c.inter_node_gbps},
      {"gpu_model", c.gpu_model},      {"topology_source", c.topology_source}, {"gpu_pci", c.gpu_pci},
      {"node_cliques", c.node_cliques}};
  json mesh = json::array();
  for (const auto& a : p.mesh.axes()) mesh.push_back({{"name", a.name}, {"size", a.size}, {"kind", to_string(a.kind)}});
  j["mesh"] = mesh;
  j["dp_size"] = p.dp_size();
  j["ep_size"] = p.ep_size();
  j["local_experts"] = p.local_experts;
  json ranks = json::array();
  for (const auto& r : p.ranks)
    ranks.push_back({{"rank", r.rank},
                     {"node", r.node},
                     {"gpu", r.gpu},
                     {"pci", r.pci},
                     {"dp_index", r.dp_index},
                     {"ep_index", r.ep_index},
                     {"first_expert", r.first_expert},
                     {"num_local_experts", r.num_local_experts},
                     {"dispatch_bytes_sent", r.dispatch_bytes_sent},
                     {"dispatch_bytes_received", r.dispatch_bytes_received},
                     {"combine_bytes_sent", r.combine_bytes_sent},
                     {"combine_bytes_received", r.combine_bytes_received}});
  j["ranks"] = ranks;
  json groups = json::array();
  for (const auto& g : p.ep_groups)
    groups.push_back({{"ranks", g.ranks},
                      {"nvlink_clique", g.nvlink_clique},
                      {"num_nodes", g.num_nodes},
                      {"min_pair_gbps", g.min_pair_gbps},
                      {"numa_nodes", g.numa_nodes}});
  j["ep_groups"] = groups;
  j["traffic"] = traffic_json(p.traffic);
  json rs = json::array();
  for (const auto& r : p.router_shardings)
    rs.push_back({{"op", r.op}, {"tensor", r.tensor}, {"spec", spec_json(r.spec)}});
  j["router_shardings"] = rs;
  j["global_num_tokens"] = p.global_num_tokens;
  j["unused_gpus"] = p.unused_gpus;
  j["unused_reason"] = p.unused_reason;
  json alts = json::array();
  for (const auto& a : p.alternatives) alts.push_back(candidate_json(a));
  j["alternatives"] = alts;
  j["reason"] = p.reason;
  j["warnings"] = p.warnings;
  return j.dump(indent);
}

Plan plan_from_json(std::string_view text) {
  json j;
  try {
    j = json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for numbers such as 1e999
    bad("(root)", std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) bad("(root)", "expected an object");
  const std::string format = field<std::string>(j, "format", "");
  if (format != kFormat) bad("format", "expected \"" + std::string(kFormat) + "\", got \"" + format + "\"");
  const int version = field<int>(j, "version", "");
  if (version != kVersion)
    bad("version", "this library reads version " + std::to_string(kVersion) + ", got " + std::to_string(version));
  Plan p;
  auto object = [&](const char* key) -> const json& {
    auto it = j.find(key);
    if (it == j.end()) bad(key, "missing");
    if (!it->is_object()) bad(key, "expected an object");
    return *it;
  };
  const json& l = object("layer");
  p.layer.name = field<std::string>(l, "name", "layer");
  p.layer.num_experts = field<int>(l, "num_experts", "layer");
  p.layer.topk = field<int>(l, "topk", "layer");
  p.layer.num_groups = field<int>(l, "num_groups", "layer");
  p.layer.group_topk = field<int>(l, "group_topk", "layer");
  p.layer.hidden_size = field<int>(l, "hidden_size", "layer");
  p.layer.dispatch_dtype = enum_field<TokenDType>(l, "dispatch_dtype", "layer", token_dtype_from_string);
  p.layer.combine_dtype = enum_field<TokenDType>(l, "combine_dtype", "layer", token_dtype_from_string);
  p.layer.tokens_per_rank = field<std::int64_t>(l, "tokens_per_rank", "layer");
  p.layer.routing_model = enum_field<RoutingModel>(l, "routing_model", "layer", routing_model_from_string);
  const json& k = object("constraints");
  p.constraints.fixed_ep_size = field<int>(k, "fixed_ep_size", "constraints");
  p.constraints.max_ep_size = field<int>(k, "max_ep_size", "constraints");
  p.constraints.local_expert_alignment = field<int>(k, "local_expert_alignment", "constraints");
  if (k.contains("use_every_gpu")) p.constraints.use_every_gpu = field<bool>(k, "use_every_gpu", "constraints");
  const json& cm = object("cost_model");
  p.cost_model.nvlink_link_gbps = field<double>(cm, "nvlink_link_gbps", "cost_model");
  p.cost_model.nvlink_efficiency = field<double>(cm, "nvlink_efficiency", "cost_model");
  p.cost_model.pcie_gbps = field<double>(cm, "pcie_gbps", "cost_model");
  p.cost_model.pcie_efficiency = field<double>(cm, "pcie_efficiency", "cost_model");
  const json& c = object("cluster");
  p.cluster.num_nodes = field<int>(c, "num_nodes", "cluster");
  p.cluster.gpus_per_node = field<int>(c, "gpus_per_node", "cluster");
  p.cluster.inter_node_gbps = field<double>(c, "inter_node_gbps", "cluster");
  p.cluster.gpu_model = field<std::string>(c, "gpu_model", "cluster");
  p.cluster.topology_source = field<std::string>(c, "topology_source", "cluster");
  p.cluster.gpu_pci = string_list(array_field(c, "gpu_pci", "cluster"), "cluster.gpu_pci");
  p.cluster.node_cliques = int_lists(array_field(c, "node_cliques", "cluster"), "cluster.node_cliques");

  std::vector<MeshAxis> axes;
  const json& mesh = array_field(j, "mesh", "");
  for (std::size_t i = 0; i < mesh.size(); ++i) {
    const std::string path = "mesh[" + std::to_string(i) + "]";
    axes.push_back({field<std::string>(mesh[i], "name", path), field<int>(mesh[i], "size", path),
                    enum_field<AxisKind>(mesh[i], "kind", path, axis_kind_from_string)});
  }
  try {
    p.mesh = Mesh(axes);
  } catch (const InvalidArgument& e) {
    bad("mesh", e.what());
  }
  if (field<int>(j, "dp_size", "") != p.dp_size() || field<int>(j, "ep_size", "") != p.ep_size())
    bad("dp_size", "dp_size/ep_size disagree with the mesh " + p.mesh.str());
  p.local_experts = field<int>(j, "local_experts", "");
  const json& ranks = array_field(j, "ranks", "");
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const std::string path = "ranks[" + std::to_string(i) + "]";
    const json& r = ranks[i];
    RankPlacement rp;
    rp.rank = field<int>(r, "rank", path);
    rp.node = field<int>(r, "node", path);
    rp.gpu = field<int>(r, "gpu", path);
    rp.pci = field<std::string>(r, "pci", path);
    rp.dp_index = field<int>(r, "dp_index", path);
    rp.ep_index = field<int>(r, "ep_index", path);
    rp.first_expert = field<int>(r, "first_expert", path);
    rp.num_local_experts = field<int>(r, "num_local_experts", path);
    rp.dispatch_bytes_sent = field<double>(r, "dispatch_bytes_sent", path);
    rp.dispatch_bytes_received = field<double>(r, "dispatch_bytes_received", path);
    rp.combine_bytes_sent = field<double>(r, "combine_bytes_sent", path);
    rp.combine_bytes_received = field<double>(r, "combine_bytes_received", path);
    if (rp.rank != static_cast<int>(i)) bad(path + ".rank", "ranks must be listed in order");
    p.ranks.push_back(rp);
  }
  if (static_cast<int>(p.ranks.size()) != p.world_size())
    bad("ranks", std::to_string(p.ranks.size()) + " entries for a mesh of " + std::to_string(p.world_size()));
  const json& groups = array_field(j, "ep_groups", "");
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const std::string path = "ep_groups[" + std::to_string(i) + "]";
    EpGroupInfo g;
    g.ranks = int_list(array_field(groups[i], "ranks", path), path + ".ranks");
    g.nvlink_clique = field<bool>(groups[i], "nvlink_clique", path);
    g.num_nodes = field<int>(groups[i], "num_nodes", path);
    g.min_pair_gbps = field<double>(groups[i], "min_pair_gbps", path);
    g.numa_nodes = field<int>(groups[i], "numa_nodes", path);
    p.ep_groups.push_back(g);
  }
  p.traffic = traffic_from(object("traffic"), "traffic");
  const json& rs = array_field(j, "router_shardings", "");
  for (std::size_t i = 0; i < rs.size(); ++i) {
    const std::string path = "router_shardings[" + std::to_string(i) + "]";
    if (!rs[i].contains("spec")) bad(path + ".spec", "missing");
    p.router_shardings.push_back({field<std::string>(rs[i], "op", path), field<std::string>(rs[i], "tensor", path),
                                  spec_from(rs[i].at("spec"), path + ".spec")});
  }
  p.global_num_tokens = field<std::int64_t>(j, "global_num_tokens", "");
  if (j.contains("unused_gpus")) p.unused_gpus = int_list(array_field(j, "unused_gpus", ""), "unused_gpus");
  if (j.contains("unused_reason")) p.unused_reason = field<std::string>(j, "unused_reason", "");
  const json& alts = array_field(j, "alternatives", "");
  for (std::size_t i = 0; i < alts.size(); ++i)
    p.alternatives.push_back(candidate_from(alts[i], "alternatives[" + std::to_string(i) + "]"));
  p.reason = field<std::string>(j, "reason", "");
  p.warnings = string_list(array_field(j, "warnings", ""), "warnings");
  return p;
}

}  // namespace KokkosMoE
