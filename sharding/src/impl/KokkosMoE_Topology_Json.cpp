/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// JSON form of NvlinkTopology (format "kokkosmoe-topology", version 1; docs/topology-notes.md). nlohmann_json is a
// private, header-only dependency: no JSON type appears in the public API.

#include <KokkosMoE_Topology.hpp>

#include <nlohmann/json.hpp>

#include <set>

#include "KokkosMoE_Topology_Scan.hpp"

namespace KokkosMoE {

namespace {

using nlohmann::json;

constexpr const char* kFormat = "kokkosmoe-topology";
constexpr int kVersion = 1;
constexpr std::int64_t kMaxGpus = 4096;  // bounds n*n allocations for hostile input

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw TopologyError("KokkosMoE topology JSON: " + path + ": " + what);
}

const json& member(const json& obj, const char* key, const std::string& path) {
  auto it = obj.find(key);
  if (it == obj.end()) fail(path + "." + key, "missing");
  return *it;
}

std::int64_t get_int(const json& obj, const char* key, const std::string& path, std::int64_t lo, std::int64_t hi) {
  const json& v = member(obj, key, path);
  if (!v.is_number_integer()) fail(path + "." + key, "expected an integer");
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(hi)) fail(path + "." + key, "out of range");
    return static_cast<std::int64_t>(u);
  }
  const auto x = v.get<std::int64_t>();
  if (x < lo || x > hi) fail(path + "." + key, "out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return x;
}

std::uint64_t get_u64(const json& obj, const char* key, const std::string& path) {
  const json& v = member(obj, key, path);
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<std::int64_t>() >= 0))
    fail(path + "." + key, "expected a non-negative integer");
  return v.get<std::uint64_t>();
}

std::optional<int> get_opt_int(const json& obj, const char* key, const std::string& path, std::int64_t hi) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::nullopt;
  return static_cast<int>(get_int(obj, key, path, 0, hi));
}

std::string get_string(const json& obj, const char* key, const std::string& path) {
  const json& v = member(obj, key, path);
  if (!v.is_string()) fail(path + "." + key, "expected a string");
  return v.get<std::string>();
}

bool get_bool(const json& obj, const char* key, const std::string& path) {
  const json& v = member(obj, key, path);
  if (!v.is_boolean()) fail(path + "." + key, "expected true or false");
  return v.get<bool>();
}

const json& get_array(const json& obj, const char* key, const std::string& path) {
  const json& v = member(obj, key, path);
  if (!v.is_array()) fail(path + "." + key, "expected an array");
  return v;
}

std::string uuid_hex(const FabricIdentity& f) {
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (auto b : f.cluster_uuid) {
    s += hex[b >> 4];
    s += hex[b & 15];
  }
  return s;
}

}  // namespace

std::string topology_to_json(const NvlinkTopology& t, int indent) {
  json j;
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["source"] = to_string(t.source);
  j["hwloc_version"] = t.hwloc_version;
  j["driver_version"] = t.driver_version;
  j["hostname"] = t.hostname;
  j["nvswitch_visible"] = t.nvswitch_visible;
  j["nvswitch_hidden"] = t.nvswitch_hidden;
  j["nvlink_known"] = t.nvlink_known;
  json gpus = json::array();
  for (const auto& g : t.gpus) {
    json x;
    x["id"] = g.id;
    x["pci"] = g.pci.str();
    x["pci_device_id"] = g.pci_device_id;
    x["uuid"] = g.uuid;
    x["model"] = g.model;
    x["nvml_index"] = g.nvml_index ? json(*g.nvml_index) : json(nullptr);
    x["compute_capability"] = g.compute_capability ? json(*g.compute_capability) : json(nullptr);
    x["nvlink_version"] = g.nvlink_version;
    x["link_mbps"] = g.link_mbps;
    x["active_links"] = g.active_links;
    x["links_to_switch"] = g.links_to_switch;
    x["links_to_cpu"] = g.links_to_cpu;
    x["numa_nodes"] = g.numa_nodes;
    x["cpuset"] = g.cpuset;
    if (g.fabric)
      x["fabric"] = json{{"cluster_uuid", uuid_hex(*g.fabric)}, {"clique_id", g.fabric->clique_id}};
    else
      x["fabric"] = nullptr;
    gpus.push_back(std::move(x));
  }
  j["gpus"] = std::move(gpus);
  json pairs = json::array();
  const int n = t.num_gpus();
  for (int a = 0; a < n; ++a)
    for (int b = a + 1; b < n; ++b) {
      const GpuPair& p = t.pair(a, b);
      pairs.push_back(json{{"i", a},
                           {"j", b},
                           {"token", pair_token(t, a, b)},
                           {"direct_links", p.direct_links},
                           {"switch_links", p.switch_links},
                           {"nvlink_mbps", p.nvlink_mbps},
                           {"nvlink_p2p", p.nvlink_p2p},
                           {"pcie", to_string(p.pcie)}});
    }
  j["pairs"] = std::move(pairs);
  j["islands"] = t.islands;
  j["cliques"] = t.cliques;
  j["warnings"] = t.warnings;
  // Models built by this library hold valid UTF-8 (finalize_topology); replace, never throw, for hand-made ones.
  return j.dump(indent, ' ', false, json::error_handler_t::replace) + "\n";
}

NvlinkTopology topology_from_json(std::string_view text) {
  json j;
  try {
    j = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    fail("document", std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) fail("document", "expected an object");
  if (get_string(j, "format", "$") != kFormat) fail("$.format", std::string("expected \"") + kFormat + "\"");
  if (get_int(j, "version", "$", 0, 1 << 20) != kVersion)
    fail("$.version", "unsupported version (this library reads " + std::to_string(kVersion) + ")");
  NvlinkTopology t;
  const std::string source = get_string(j, "source", "$");
  bool known_source = false;
  for (auto s : {NvlinkTopology::Source::HwlocXml, NvlinkTopology::Source::Live, NvlinkTopology::Source::NcclXml,
                 NvlinkTopology::Source::None})
    if (source == to_string(s)) {
      t.source = s;
      known_source = true;
    }
  if (!known_source) fail("$.source", "unknown source \"" + source + "\"");
  t.hwloc_version = get_string(j, "hwloc_version", "$");
  t.driver_version = get_string(j, "driver_version", "$");
  t.hostname = get_string(j, "hostname", "$");
  t.nvswitch_visible = static_cast<int>(get_int(j, "nvswitch_visible", "$", 0, 1 << 20));
  t.nvswitch_hidden = get_bool(j, "nvswitch_hidden", "$");
  t.nvlink_known = get_bool(j, "nvlink_known", "$");

  const json& gpus = get_array(j, "gpus", "$");
  if (static_cast<std::int64_t>(gpus.size()) > kMaxGpus) fail("$.gpus", "more than " + std::to_string(kMaxGpus));
  std::set<PciAddress> seen;
  for (std::size_t k = 0; k < gpus.size(); ++k) {
    const std::string path = "$.gpus[" + std::to_string(k) + "]";
    const json& x = gpus[k];
    if (!x.is_object()) fail(path, "expected an object");
    GpuInfo g;
    g.id = static_cast<int>(get_int(x, "id", path, 0, kMaxGpus));
    if (g.id != static_cast<int>(k)) fail(path + ".id", "ids must be 0..n-1 in order");
    const std::string pci = get_string(x, "pci", path);
    const auto addr = PciAddress::parse(pci);
    if (!addr) fail(path + ".pci", "\"" + pci + "\" is not a PCI address");
    g.pci = *addr;
    if (!seen.insert(g.pci).second) fail(path + ".pci", "duplicate PCI address " + pci);
    if (k > 0 && !(t.gpus.back().pci < g.pci)) fail(path + ".pci", "GPUs must be ordered by PCI address");
    g.pci_device_id = static_cast<std::uint16_t>(get_int(x, "pci_device_id", path, 0, 0xffff));
    g.uuid = get_string(x, "uuid", path);
    g.model = get_string(x, "model", path);
    g.nvml_index = get_opt_int(x, "nvml_index", path, 1 << 20);
    g.compute_capability = get_opt_int(x, "compute_capability", path, 999);
    g.nvlink_version = static_cast<int>(get_int(x, "nvlink_version", path, 0, 255));
    g.link_mbps = get_u64(x, "link_mbps", path);
    g.active_links = static_cast<int>(get_int(x, "active_links", path, 0, 4096));
    g.links_to_switch = static_cast<int>(get_int(x, "links_to_switch", path, 0, 4096));
    g.links_to_cpu = static_cast<int>(get_int(x, "links_to_cpu", path, 0, 4096));
    const json& numa = get_array(x, "numa_nodes", path);
    for (std::size_t q = 0; q < numa.size(); ++q) {
      if (!numa[q].is_number_integer() || numa[q].get<std::int64_t>() < 0 || numa[q].get<std::int64_t>() > 65535)
        fail(path + ".numa_nodes[" + std::to_string(q) + "]", "expected a NUMA node number");
      g.numa_nodes.push_back(numa[q].get<int>());
    }
    g.cpuset = get_string(x, "cpuset", path);
    const json& f = member(x, "fabric", path);
    if (!f.is_null()) {
      if (!f.is_object()) fail(path + ".fabric", "expected an object or null");
      const std::string hex = get_string(f, "cluster_uuid", path + ".fabric");
      FabricIdentity id;
      if (hex.size() != 32) fail(path + ".fabric.cluster_uuid", "expected 32 hex digits");
      for (std::size_t b = 0; b < 16; ++b) {
        unsigned v = 0;
        for (std::size_t h = 0; h < 2; ++h) {
          const char c = hex[2 * b + h];
          const int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
          if (d < 0) fail(path + ".fabric.cluster_uuid", "expected lower-case hex digits");
          v = v * 16 + static_cast<unsigned>(d);
        }
        id.cluster_uuid[b] = static_cast<std::uint8_t>(v);
      }
      id.clique_id = static_cast<std::uint32_t>(get_int(f, "clique_id", path + ".fabric", 0, 0xffffffffLL));
      g.fabric = id;
    }
    t.gpus.push_back(std::move(g));
  }
  const std::size_t n = t.gpus.size();
  t.pairs.assign(n * n, GpuPair{});
  for (std::size_t i = 0; i < n; ++i) t.pairs[i * n + i].pcie = PcieLevel::Internal;
  const json& pairs = get_array(j, "pairs", "$");
  std::vector<bool> given(n * n, false);
  for (std::size_t k = 0; k < pairs.size(); ++k) {
    const std::string path = "$.pairs[" + std::to_string(k) + "]";
    const json& x = pairs[k];
    if (!x.is_object()) fail(path, "expected an object");
    const auto a = static_cast<std::size_t>(get_int(x, "i", path, 0, kMaxGpus));
    const auto b = static_cast<std::size_t>(get_int(x, "j", path, 0, kMaxGpus));
    if (a >= n || b >= n || a >= b) fail(path, "needs 0 <= i < j < number of GPUs");
    if (given[a * n + b]) fail(path, "pair (" + std::to_string(a) + ", " + std::to_string(b) + ") given twice");
    given[a * n + b] = true;
    GpuPair p;
    p.direct_links = static_cast<std::uint16_t>(get_int(x, "direct_links", path, 0, 4096));
    p.switch_links = static_cast<std::uint16_t>(get_int(x, "switch_links", path, 0, 4096));
    p.nvlink_mbps = get_u64(x, "nvlink_mbps", path);
    p.nvlink_p2p = get_bool(x, "nvlink_p2p", path);
    const std::string pcie = get_string(x, "pcie", path);
    const auto level = pcie_level_from_string(pcie);
    if (!level) fail(path + ".pcie", "unknown PCIe level \"" + pcie + "\"");
    p.pcie = *level;
    t.pairs[a * n + b] = p;
    t.pairs[b * n + a] = p;
  }
  const json& warnings = get_array(j, "warnings", "$");
  for (std::size_t k = 0; k < warnings.size(); ++k) {
    if (!warnings[k].is_string()) fail("$.warnings[" + std::to_string(k) + "]", "expected a string");
    t.warnings.push_back(warnings[k].get<std::string>());
  }
  // islands and cliques are derived data: recomputed, never trusted.
  Impl::finalize_topology(t);
  return t;
}

}  // namespace KokkosMoE
