/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// The value-type parts of the topology API: PCI addresses, pair access, islands and cliques (docs/topology.md §10.1-2)
// and the `nvidia-smi topo -m`-style report. Detection lives in impl/.

#include <KokkosMoE_Topology.hpp>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <numeric>
#include <sstream>

#include "impl/KokkosMoE_Topology_Scan.hpp"

namespace KokkosMoE {

namespace {

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Parses exactly the hex digits of `s` (1 to 8 of them) into `out`.
bool parse_hex(std::string_view s, std::uint32_t& out) {
  if (s.empty() || s.size() > 8) return false;
  std::uint32_t v = 0;
  for (char c : s) {
    const int h = hex_value(c);
    if (h < 0) return false;
    v = (v << 4) | static_cast<std::uint32_t>(h);
  }
  out = v;
  return true;
}

void check_index(const char* fn, const NvlinkTopology& t, int i, const char* param) {
  if (i < 0 || i >= t.num_gpus())
    throw InvalidArgument(
        fn, param, Rule::GpuIndexRange,
        std::string(param) + " (" + std::to_string(i) + ") must be in [0, " + std::to_string(t.num_gpus()) + ")");
}

}  // namespace

// --- PciAddress ------------------------------------------------------------------------------------------------

std::string PciAddress::str() const {
  char buf[32];
  if (domain > 0xffffu)
    (void)std::snprintf(buf, sizeof buf, "%08x:%02x:%02x.%x", static_cast<unsigned>(domain), bus, device, function);
  else
    (void)std::snprintf(buf, sizeof buf, "%04x:%02x:%02x.%x", static_cast<unsigned>(domain), bus, device, function);
  return buf;
}

std::optional<PciAddress> PciAddress::parse(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  while (!text.empty() && (std::isspace(static_cast<unsigned char>(text.back())) || text.back() == '\0'))
    text.remove_suffix(1);
  // [domain:]bus:device.function
  const auto dot = text.rfind('.');
  if (dot == std::string_view::npos) return std::nullopt;
  const std::string_view fn = text.substr(dot + 1);
  std::string_view head = text.substr(0, dot);
  const auto c2 = head.rfind(':');
  if (c2 == std::string_view::npos) return std::nullopt;
  const std::string_view dev = head.substr(c2 + 1);
  head = head.substr(0, c2);
  std::string_view bus = head, dom;
  const auto c1 = head.rfind(':');
  if (c1 != std::string_view::npos) {
    bus = head.substr(c1 + 1);
    dom = head.substr(0, c1);
    // 4 digits (lspci, hwloc), 8 (NVML), 7 (NCCL's spelling of the sentinel).
    if (dom.size() < 4) return std::nullopt;
  }
  std::uint32_t d = 0, b = 0, v = 0, f = 0;
  if (!dom.empty() && !parse_hex(dom, d)) return std::nullopt;
  if (bus.size() != 2 || !parse_hex(bus, b)) return std::nullopt;
  if (dev.size() != 2 || !parse_hex(dev, v)) return std::nullopt;  // lenient: the sentinel has device ff
  if (fn.size() != 1 || !parse_hex(fn, f) || f > 7) return std::nullopt;
  PciAddress a;
  a.domain = d;
  a.bus = static_cast<std::uint8_t>(b);
  a.device = static_cast<std::uint8_t>(v);
  a.function = static_cast<std::uint8_t>(f);
  return a;
}

bool PciAddress::operator<(const PciAddress& o) const {
  if (domain != o.domain) return domain < o.domain;
  if (bus != o.bus) return bus < o.bus;
  if (device != o.device) return device < o.device;
  return function < o.function;
}

// --- enums ------------------------------------------------------------------------------------------------------

const char* to_string(PcieLevel level) noexcept {
  switch (level) {
    case PcieLevel::Internal:
      return "INT";
    case PcieLevel::Pix:
      return "PIX";
    case PcieLevel::Pxb:
      return "PXB";
    case PcieLevel::Phb:
      return "PHB";
    case PcieLevel::Node:
      return "NODE";
    case PcieLevel::Sys:
      return "SYS";
    case PcieLevel::Unknown:
      return "N/A";
  }
  return "N/A";
}

std::optional<PcieLevel> pcie_level_from_string(std::string_view token) {
  for (PcieLevel l : {PcieLevel::Internal, PcieLevel::Pix, PcieLevel::Pxb, PcieLevel::Phb, PcieLevel::Node,
                      PcieLevel::Sys, PcieLevel::Unknown})
    if (token == to_string(l)) return l;
  return std::nullopt;
}

const char* to_string(NvlinkTopology::Source source) noexcept {
  switch (source) {
    case NvlinkTopology::Source::HwlocXml:
      return "hwloc-xml";
    case NvlinkTopology::Source::Live:
      return "live";
    case NvlinkTopology::Source::NcclXml:
      return "nccl-xml";
    case NvlinkTopology::Source::None:
      return "none";
  }
  return "none";
}

// --- model ------------------------------------------------------------------------------------------------------

bool GpuInfo::operator==(const GpuInfo& o) const {
  return id == o.id && pci == o.pci && pci_device_id == o.pci_device_id && uuid == o.uuid && model == o.model &&
         nvml_index == o.nvml_index && compute_capability == o.compute_capability &&
         nvlink_version == o.nvlink_version && link_mbps == o.link_mbps && active_links == o.active_links &&
         links_to_switch == o.links_to_switch && links_to_cpu == o.links_to_cpu && numa_nodes == o.numa_nodes &&
         cpuset == o.cpuset && fabric == o.fabric;
}

bool NvlinkTopology::operator==(const NvlinkTopology& o) const {
  return gpus == o.gpus && pairs == o.pairs && nvswitch_visible == o.nvswitch_visible &&
         nvswitch_hidden == o.nvswitch_hidden && nvlink_known == o.nvlink_known && islands == o.islands &&
         cliques == o.cliques && source == o.source && hwloc_version == o.hwloc_version &&
         driver_version == o.driver_version && hostname == o.hostname && warnings == o.warnings;
}

const GpuPair& NvlinkTopology::pair(int i, int j) const {
  check_index("NvlinkTopology::pair", *this, i, "i");
  check_index("NvlinkTopology::pair", *this, j, "j");
  return pairs.at(static_cast<std::size_t>(i) * gpus.size() + static_cast<std::size_t>(j));
}

GpuPair& NvlinkTopology::pair(int i, int j) {
  check_index("NvlinkTopology::pair", *this, i, "i");
  check_index("NvlinkTopology::pair", *this, j, "j");
  return pairs.at(static_cast<std::size_t>(i) * gpus.size() + static_cast<std::size_t>(j));
}

std::optional<int> NvlinkTopology::find_gpu(const PciAddress& pci) const {
  for (const auto& g : gpus)
    if (g.pci == pci) return g.id;
  return std::nullopt;
}

std::optional<int> NvlinkTopology::find_gpu_by_uuid(std::string_view uuid) const {
  if (uuid.empty()) return std::nullopt;
  for (const auto& g : gpus)
    if (g.uuid == uuid) return g.id;
  return std::nullopt;
}

// --- islands and cliques ----------------------------------------------------------------------------------------

namespace {

std::vector<std::vector<bool>> adjacency(const NvlinkTopology& t) {
  const int n = t.num_gpus();
  if (t.pairs.size() != static_cast<std::size_t>(n) * static_cast<std::size_t>(n))
    throw TopologyError("KokkosMoE topology: pairs has " + std::to_string(t.pairs.size()) + " entries, expected " +
                        std::to_string(n) + "*" + std::to_string(n));
  std::vector<std::vector<bool>> adj(static_cast<std::size_t>(n), std::vector<bool>(static_cast<std::size_t>(n)));
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j)
      if (i != j) {
        // Symmetric by construction; a hand-edited asymmetric model is treated as connected only if both agree.
        adj[i][j] = t.pairs[static_cast<std::size_t>(i) * n + j].nvlink_p2p &&
                    t.pairs[static_cast<std::size_t>(j) * n + i].nvlink_p2p;
      }
  return adj;
}

// Bron-Kerbosch with pivoting (Tomita): R current clique, P candidates, X excluded.
struct CliqueSearch {
  const std::vector<std::vector<bool>>& adj;
  std::vector<std::vector<int>>& out;
  std::size_t limit;
  bool truncated = false;

  void run(std::vector<int>& r, std::vector<int> p, std::vector<int> x) {
    if (truncated) return;
    if (p.empty() && x.empty()) {
      if (out.size() >= limit) {
        truncated = true;
        return;
      }
      auto c = r;
      std::sort(c.begin(), c.end());
      out.push_back(std::move(c));
      return;
    }
    // Pivot: the vertex of P u X with the most neighbours in P.
    int pivot = -1;
    std::size_t best = 0;
    for (const auto* set : {&p, &x})
      for (int u : *set) {
        std::size_t cnt = 0;
        for (int v : p) cnt += adj[u][v] ? 1 : 0;
        if (pivot < 0 || cnt > best) {
          pivot = u;
          best = cnt;
        }
      }
    std::vector<int> candidates;
    for (int v : p)
      if (!adj[pivot][v]) candidates.push_back(v);
    for (int v : candidates) {
      std::vector<int> p2, x2;
      for (int w : p)
        if (adj[v][w]) p2.push_back(w);
      for (int w : x)
        if (adj[v][w]) x2.push_back(w);
      r.push_back(v);
      run(r, std::move(p2), std::move(x2));
      r.pop_back();
      p.erase(std::find(p.begin(), p.end(), v));
      x.push_back(v);
    }
  }
};

}  // namespace

std::vector<std::vector<int>> nvlink_islands(const NvlinkTopology& topo) {
  const auto adj = adjacency(topo);
  const int n = topo.num_gpus();
  std::vector<int> comp(static_cast<std::size_t>(n), -1);
  std::vector<std::vector<int>> islands;
  for (int s = 0; s < n; ++s) {
    if (comp[s] >= 0) continue;
    const int c = static_cast<int>(islands.size());
    islands.emplace_back();
    std::vector<int> stack{s};
    comp[s] = c;
    while (!stack.empty()) {
      const int u = stack.back();
      stack.pop_back();
      islands[c].push_back(u);
      for (int v = 0; v < n; ++v)
        if (adj[u][v] && comp[v] < 0) {
          comp[v] = c;
          stack.push_back(v);
        }
    }
    std::sort(islands[c].begin(), islands[c].end());
  }
  return islands;  // ordered by smallest member, because s increases
}

namespace Impl {
// Internal entry with a cap on the number of maximal cliques (pathological graphs have 3^(n/3) of them).
std::vector<std::vector<int>> nvlink_cliques_capped(const NvlinkTopology& topo, std::size_t limit, bool* truncated) {
  const auto adj = adjacency(topo);
  std::vector<std::vector<int>> out;
  CliqueSearch search{adj, out, limit};
  for (const auto& island : nvlink_islands(topo)) {
    // Short-circuit (docs/topology.md §10.2): a fully connected island (every NVSwitch island) is its own clique.
    bool complete = true;
    for (std::size_t a = 0; a < island.size() && complete; ++a)
      for (std::size_t b = a + 1; b < island.size() && complete; ++b) complete = adj[island[a]][island[b]];
    if (complete) {
      if (out.size() >= limit) {
        search.truncated = true;
        break;
      }
      out.push_back(island);
      continue;
    }
    std::vector<int> r;
    search.run(r, island, {});
  }
  std::sort(out.begin(), out.end());
  if (truncated) *truncated = search.truncated;
  return out;
}
}  // namespace Impl

std::vector<std::vector<int>> nvlink_cliques(const NvlinkTopology& topo) {
  return Impl::nvlink_cliques_capped(topo, std::size_t(1) << 20, nullptr);
}

// --- report -----------------------------------------------------------------------------------------------------

std::string pair_token(const NvlinkTopology& topo, int i, int j) {
  const GpuPair& p = topo.pair(i, j);
  if (i == j) return "X";
  if (p.nvlink_count() > 0) return "NV" + std::to_string(p.nvlink_count());
  return to_string(p.pcie);
}

namespace {

std::string join_ints(const std::vector<int>& v, const char* sep) {
  std::string s;
  for (std::size_t k = 0; k < v.size(); ++k) s += (k ? sep : "") + std::to_string(v[k]);
  return s;
}

std::string nvlink_version_name(int e) {
  switch (e) {
    case 1:
      return "NVLink 1.0";
    case 2:
      return "NVLink 2.0";
    case 3:
      return "NVLink 2.2";
    case 4:
      return "NVLink 3.0";
    case 5:
      return "NVLink 3.1";
    case 6:
      return "NVLink 4.0";
    case 7:
      return "NVLink 5.0";
    case 8:
      return "NVLink 6.0";
    default:
      return e == 0 ? "NVLink version unknown" : "NVLink enum " + std::to_string(e);
  }
}

std::string pad(std::string s, std::size_t w) {
  if (s.size() < w) s.append(w - s.size(), ' ');
  return s;
}

}  // namespace

std::string topology_report(const NvlinkTopology& topo) {
  std::ostringstream os;
  const int n = topo.num_gpus();
  os << "Source: " << to_string(topo.source);
  if (!topo.hostname.empty()) os << ", host " << topo.hostname;
  if (!topo.hwloc_version.empty()) os << ", hwloc " << topo.hwloc_version;
  if (!topo.driver_version.empty()) os << ", driver " << topo.driver_version;
  os << "\n";
  if (n == 0) {
    os << "No GPUs found.\n";
  } else {
    const std::size_t w = 8;
    os << pad("", w);
    for (int j = 0; j < n; ++j) os << pad("GPU" + std::to_string(j), w);
    os << pad("CPU Affinity", 16) << "NUMA Affinity\n";
    for (int i = 0; i < n; ++i) {
      os << pad("GPU" + std::to_string(i), w);
      for (int j = 0; j < n; ++j) {
        std::string tok = pair_token(topo, i, j);
        if (tok == "X") tok = " X";
        os << pad(tok, w);
      }
      const auto& g = topo.gpus[static_cast<std::size_t>(i)];
      os << pad(g.cpuset.empty() ? "N/A" : g.cpuset, 16)
         << (g.numa_nodes.empty() ? std::string("N/A") : join_ints(g.numa_nodes, ",")) << "\n";
    }
    // Tokens as in `nvidia-smi topo -m`, wording from docs/topology.md §7.
    os << "\nLegend:\n\n"
       << "  X    = self\n"
       << "  SYS  = PCIe plus the SMP interconnect between NUMA nodes (QPI/UPI)\n"
       << "  NODE = PCIe plus the interconnect between PCIe host bridges within one NUMA node\n"
       << "  PHB  = PCIe plus a PCIe host bridge (typically the CPU)\n"
       << "  PXB  = multiple PCIe bridges, without a host bridge\n"
       << "  PIX  = at most one PCIe bridge\n"
       << "  NV#  = a bonded set of # NVLinks (on NVSwitch systems: the fabric links both GPUs have)\n"
       << "  N/A  = PCIe path unknown\n";
    os << "\nGPUs:\n";
    for (const auto& g : topo.gpus) {
      os << "  GPU" << g.id << "  " << g.pci.str() << "  " << (g.model.empty() ? "(model unknown)" : g.model);
      if (!g.uuid.empty()) os << "  " << g.uuid;
      if (g.nvml_index) os << "  nvml " << *g.nvml_index;
      if (g.compute_capability) os << "  sm_" << *g.compute_capability;
      os << "\n        ";
      if (topo.nvlink_known) {
        os << nvlink_version_name(g.nvlink_version) << ": " << g.active_links << " active, " << g.links_to_switch
           << " to NVSwitch, " << g.links_to_cpu << " to CPU";
        if (g.link_mbps) os << ", " << g.link_mbps << " MB/s per link";
      } else {
        os << "NVLinks unknown";
      }
      if (g.fabric) os << ", NVLink clique " << g.fabric->clique_id;
      os << "\n";
    }
    os << "\nNVSwitch: " << topo.nvswitch_visible << " visible on PCI";
    if (topo.nvswitch_hidden) os << ", hidden fabric (links to switches that are not on PCI)";
    os << "\n";
  }
  auto sets = [](const std::vector<std::vector<int>>& v) {
    std::string s;
    for (const auto& c : v) s += " {" + join_ints(c, ",") + "}";
    return s.empty() ? std::string(" none") : s;
  };
  os << "Islands (" << topo.islands.size() << "):" << sets(topo.islands) << "\n";
  os << "Cliques (" << topo.cliques.size() << "):" << sets(topo.cliques) << "\n";
  if (!topo.warnings.empty()) {
    os << "Warnings:\n";
    for (const auto& w : topo.warnings) os << "  - " << w << "\n";
  }
  return os.str();
}

}  // namespace KokkosMoE
