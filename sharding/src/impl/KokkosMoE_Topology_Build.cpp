/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// Turns the plain-data scans of hwloc (fixtures, live locality) and NVML (live links) into an NvlinkTopology.
// Rules: docs/topology.md §2 (modeling), §4.2 (NVML link classification), §5.2 (reading a matrix).

#include <algorithm>
#include <cctype>
#include <limits>
#include <set>

#include "KokkosMoE_Topology_Scan.hpp"

namespace KokkosMoE::Impl {

std::vector<std::vector<int>> nvlink_cliques_capped(const NvlinkTopology& topo, std::size_t limit, bool* truncated);

namespace {

// No real machine has more links per GPU than this; larger counts come from corrupt input.
constexpr std::uint64_t kMaxLinkCount = 4096;
constexpr std::size_t kMaxCliques = 1u << 16;

[[noreturn]] void fail(const std::string& msg) { throw TopologyError("KokkosMoE topology: " + msg); }

std::optional<std::uint64_t> parse_u64(const std::string& s) {
  if (s.empty() || s.size() > 20) return std::nullopt;
  std::uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    const std::uint64_t d = static_cast<std::uint64_t>(c - '0');
    if (v > (std::numeric_limits<std::uint64_t>::max() - d) / 10) return std::nullopt;
    v = v * 10 + d;
  }
  return v;
}

std::uint64_t add_checked(std::uint64_t a, std::uint64_t b, const char* what) {
  if (a > std::numeric_limits<std::uint64_t>::max() - b) fail(std::string("NVLink bandwidth overflow in ") + what);
  return a + b;
}

const std::string* find_info(const std::map<std::string, std::string>& infos, const char* name) {
  auto it = infos.find(name);
  return it == infos.end() ? nullptr : &it->second;
}

// An info that must be a small non-negative integer if present.
std::optional<int> int_info(const std::map<std::string, std::string>& infos, const char* name, const std::string& owner,
                            std::uint64_t max_value = kMaxLinkCount) {
  const std::string* s = find_info(infos, name);
  if (!s) return std::nullopt;
  const auto v = parse_u64(*s);
  if (!v || *v > max_value)
    fail(owner + ": info " + name + "=\"" + *s + "\" is not an integer in [0, " + std::to_string(max_value) + "]");
  return static_cast<int>(*v);
}

std::optional<int> cc_info(const std::map<std::string, std::string>& infos, const std::string& owner) {
  const std::string* s = find_info(infos, InfoName::kComputeCapability);
  if (!s) return std::nullopt;
  const auto dot = s->find('.');
  const auto major = parse_u64(s->substr(0, dot));
  const auto minor = dot == std::string::npos ? std::optional<std::uint64_t>(0) : parse_u64(s->substr(dot + 1));
  if (!major || !minor || *major > 99 || *minor > 9)
    fail(owner + ": info " + InfoName::kComputeCapability + "=\"" + *s + "\" is not \"major.minor\"");
  return static_cast<int>(*major * 10 + *minor);
}

std::optional<FabricIdentity> fabric_info(const std::map<std::string, std::string>& infos, const std::string& owner) {
  const std::string* u = find_info(infos, InfoName::kFabricCluster);
  if (!u) return std::nullopt;
  FabricIdentity f;
  std::string hex;
  for (char c : *u)
    if (c != '-') hex += c;
  if (hex.size() != 32) fail(owner + ": info " + InfoName::kFabricCluster + " must hold 32 hex digits");
  for (std::size_t k = 0; k < 16; ++k) {
    unsigned v = 0;
    for (std::size_t h = 0; h < 2; ++h) {
      const char c = static_cast<char>(std::tolower(static_cast<unsigned char>(hex[2 * k + h])));
      const int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
      if (d < 0) fail(owner + ": info " + InfoName::kFabricCluster + " must hold 32 hex digits");
      v = v * 16 + static_cast<unsigned>(d);
    }
    f.cluster_uuid[k] = static_cast<std::uint8_t>(v);
  }
  f.clique_id = static_cast<std::uint32_t>(int_info(infos, InfoName::kFabricClique, owner, 0xffffffffu).value_or(0));
  return f;
}

void add_warning(NvlinkTopology& t, std::string w) {
  if (std::find(t.warnings.begin(), t.warnings.end(), w) == t.warnings.end()) t.warnings.push_back(std::move(w));
}

std::string gpu_name(const NvlinkTopology& t, int i) {
  return "GPU" + std::to_string(i) + " (" + t.gpus[static_cast<std::size_t>(i)].pci.str() + ")";
}

// Link count implied by a bandwidth: exact multiples of the per-link rate; other values are rounded and noted.
int links_from_mbps(NvlinkTopology& t, std::uint64_t mbps, std::uint64_t rate, const std::string& what) {
  if (mbps == 0 || rate == 0) return 0;
  // round to nearest without mbps + rate / 2, which wraps for a corrupt value near 2^64
  const std::uint64_t links = mbps / rate + (mbps % rate >= rate - rate / 2 ? 1 : 0);
  if (links > kMaxLinkCount)
    fail(what + ": " + std::to_string(mbps) + " MB/s implies " + std::to_string(links) + " links at " +
         std::to_string(rate) + " MB/s per link (implausible)");
  if (links * rate != mbps)
    add_warning(t, what + ": " + std::to_string(mbps) + " MB/s is not a multiple of the per-link rate " +
                       std::to_string(rate) + " MB/s; rounded to " + std::to_string(links) + " links");
  return static_cast<int>(links);
}

std::size_t idx(std::size_t n, int i, int j) { return static_cast<std::size_t>(i) * n + static_cast<std::size_t>(j); }

}  // namespace

// --- small helpers ---------------------------------------------------------------------------------------------

std::uint64_t nvlink_rate_mbps(int v) {
  if (v == 1) return 20000;
  if (v >= 2 && v <= 6) return 25000;
  if (v == 7) return 50000;
  return 0;  // 8 (NVLink 6.0) and anything newer: rate not documented here, keep counts only
}

std::uint64_t nvlink_rate_for_model(const std::string& model) {
  auto has = [&](const char* s) { return model.find(s) != std::string::npos; };
  if (has("B200") || has("GB200") || has("B300") || has("GB300")) return 50000;
  if (has("H100") || has("H200") || has("H800") || has("A100") || has("A800") || has("V100")) return 25000;
  if (has("P100")) return 20000;
  return 0;
}

int nvlink_version_for_model(const std::string& model) {
  auto has = [&](const char* s) { return model.find(s) != std::string::npos; };
  if (has("B200") || has("GB200") || has("B300") || has("GB300")) return 7;
  if (has("H100") || has("H200") || has("H800")) return 6;
  if (has("A100") || has("A800")) return 5;
  if (has("V100")) return 2;
  if (has("P100")) return 1;
  return 0;
}

bool is_nvml_sentinel(std::uint32_t domain, const std::string& bus_id) {
  if (domain == 0xffffffffu) return true;
  if (bus_id.empty()) return true;
  for (char c : bus_id)
    if (!std::isprint(static_cast<unsigned char>(c))) return true;
  std::string lower;
  for (char c : bus_id) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  // NVML "FFFFFFFF:FF:FF.0", NCCL "fffffff:ff:ff.0": an all-F domain and bus.
  const auto colon = lower.find(':');
  if (colon == std::string::npos || colon == 0) return false;
  const std::string dom = lower.substr(0, colon);
  return dom.find_first_not_of('f') == std::string::npos && lower.compare(colon, 4, ":ff:") == 0;
}

std::optional<int> HostScan::find_gpu(const PciAddress& pci) const {
  for (std::size_t i = 0; i < gpus.size(); ++i)
    if (gpus[i].pci == pci) return static_cast<int>(i);
  return std::nullopt;
}

bool HostScan::is_nvswitch(const PciAddress& pci) const {
  return std::binary_search(nvswitches.begin(), nvswitches.end(), pci);
}

std::string valid_utf8(const std::string& in) {
  // Strings come from hwloc infos, NVML buffers and files: keep valid UTF-8, replace every other byte by '?', so a
  // model always serializes to JSON (and back) unchanged.
  std::string out;
  out.reserve(in.size());
  const auto* p = reinterpret_cast<const unsigned char*>(in.data());
  const std::size_t n = in.size();
  for (std::size_t k = 0; k < n;) {
    const unsigned char c = p[k];
    std::size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    bool ok = len > 0 && k + len <= n;
    for (std::size_t q = 1; ok && q < len; ++q) ok = (p[k + q] & 0xc0) == 0x80;
    if (ok && len > 1) {  // reject overlong forms, surrogates and code points past U+10FFFF
      std::uint32_t cp = c & (0xff >> (len + 1));
      for (std::size_t q = 1; q < len; ++q) cp = (cp << 6) | (p[k + q] & 0x3f);
      const std::uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
      ok = cp >= min[len] && cp <= 0x10ffff && (cp < 0xd800 || cp > 0xdfff);
    }
    if (ok) {
      out.append(in, k, len);
      k += len;
    } else {
      out += '?';
      ++k;
    }
  }
  return out;
}

void finalize_topology(NvlinkTopology& t) {
  for (auto* s : {&t.hwloc_version, &t.driver_version, &t.hostname}) *s = valid_utf8(*s);
  for (auto& g : t.gpus)
    for (auto* s : {&g.uuid, &g.model, &g.cpuset}) *s = valid_utf8(*s);
  for (auto& w : t.warnings) w = valid_utf8(w);
  const std::size_t n = t.gpus.size();
  for (std::size_t i = 0; i < n; ++i) t.gpus[i].id = static_cast<int>(i);
  if (t.pairs.size() == n * n)
    for (std::size_t i = 0; i < n; ++i) {  // the diagonal is unused; keep it canonical so models compare equal
      t.pairs[i * n + i] = GpuPair{};
      t.pairs[i * n + i].pcie = PcieLevel::Internal;
    }
  t.islands = nvlink_islands(t);
  bool truncated = false;
  t.cliques = nvlink_cliques_capped(t, kMaxCliques, &truncated);
  if (truncated) add_warning(t, "more than " + std::to_string(kMaxCliques) + " maximal NVLink cliques: list truncated");
  std::vector<std::string> unique;
  for (auto& w : t.warnings)
    if (std::find(unique.begin(), unique.end(), w) == unique.end()) unique.push_back(w);
  t.warnings = std::move(unique);
}

// --- fixtures (docs/topology.md §5.2) -------------------------------------------------------------------------------

NvlinkTopology topology_from_scan(const HostScan& scan) {
  NvlinkTopology t;
  t.source = NvlinkTopology::Source::HwlocXml;
  t.hwloc_version = scan.hwloc_version;
  t.hostname = scan.hostname;
  t.warnings = scan.warnings;
  const std::size_t n = scan.gpus.size();
  t.nvswitch_visible = static_cast<int>(scan.nvswitches.size());
  t.pairs.assign(n * n, GpuPair{});
  for (std::size_t k = 0; k < n * n && k < scan.pcie.size(); ++k) t.pairs[k].pcie = scan.pcie[k];

  // An info given twice with different values: hwloc answers the first, silently. For the infos that change the
  // model (links, rates, the hidden fabric, identities) that is an error; for any other a warning.
  const auto interpreted = [](const std::string& name) {
    for (const char* k :
         {InfoName::kNvswitchHidden, InfoName::kNvlinkVersion, InfoName::kPerLinkMbps, InfoName::kLinkRateUnknown,
          InfoName::kGpuExcluded, InfoName::kNvmlIndex, InfoName::kComputeCapability, InfoName::kLinksActive,
          InfoName::kLinksToSwitch, InfoName::kLinksToCpu, InfoName::kLinksDirect, InfoName::kFabricCluster,
          InfoName::kFabricClique, InfoName::kGpuUuid})
      if (name == k) return true;
    return false;
  };
  const auto conflicts = [&](const std::map<std::string, std::vector<std::string>>& c, const std::string& owner) {
    for (const auto& [name, values] : c) {
      std::string list;
      for (const auto& v : values) list += (list.empty() ? "\"" : ", \"") + v + "\"";
      if (interpreted(name))
        fail(owner + ": info " + name + " is given " + std::to_string(values.size()) +
             " times with different values (" + list + "); keep one");
      add_warning(t, owner + ": info " + name + " has different values (" + list + "); the first is used");
    }
  };
  conflicts(scan.root_info_conflicts, "root");
  for (const auto& g : scan.gpus) conflicts(g.info_conflicts, "GPU " + g.pci.str());

  const auto& root = scan.root_infos;
  if (const std::string* d = find_info(root, InfoName::kDriverVersion)) t.driver_version = *d;
  if (const std::string* h = find_info(root, InfoName::kNvswitchHidden)) {
    if (*h != "0" && *h != "1") fail("root info NVSwitchHidden=\"" + *h + "\" must be 0 or 1");
    t.nvswitch_hidden = *h == "1";
  }
  std::uint64_t root_rate = 0;
  if (const std::string* r = find_info(root, InfoName::kPerLinkMbps)) {
    const auto v = parse_u64(*r);
    if (!v || *v == 0 || *v > 10000000)
      fail("root info NVLinkPerLinkMBps=\"" + *r + "\" must be a positive number of MB/s");
    root_rate = *v;
  }
  const int root_version = int_info(root, InfoName::kNvlinkVersion, "root", 255).value_or(0);
  // Our captures of machines whose per-link rate NVML could not tell store link counts (rate 1) and say so.
  const bool rate_is_count = int_info(root, InfoName::kLinkRateUnknown, "root", 1).value_or(0) == 1;

  // Per-GPU identity and the infos our captures write.
  std::vector<std::optional<int>> info_active(n), info_switch(n), info_cpu(n);
  std::vector<std::uint64_t> rate(n, 0);
  bool any_link_info = false;
  for (std::size_t i = 0; i < n; ++i) {
    const ScannedGpu& s = scan.gpus[i];
    GpuInfo g;
    g.id = static_cast<int>(i);
    g.pci = s.pci;
    g.pci_device_id = s.device_id;
    g.model = s.model;
    g.uuid = s.uuid;
    g.numa_nodes = s.numa_nodes;
    g.cpuset = s.cpuset;
    const std::string owner = "GPU " + s.pci.str();
    g.nvml_index = int_info(s.infos, InfoName::kNvmlIndex, owner, 1u << 20);
    g.compute_capability = cc_info(s.infos, owner);
    g.fabric = fabric_info(s.infos, owner);
    info_active[i] = int_info(s.infos, InfoName::kLinksActive, owner);
    info_switch[i] = int_info(s.infos, InfoName::kLinksToSwitch, owner);
    info_cpu[i] = int_info(s.infos, InfoName::kLinksToCpu, owner);
    any_link_info = any_link_info || info_active[i] || info_switch[i] || info_cpu[i];
    g.nvlink_version = int_info(s.infos, InfoName::kNvlinkVersion, owner, 255).value_or(0);
    if (g.nvlink_version == 0) g.nvlink_version = root_version;
    if (g.nvlink_version == 0) g.nvlink_version = nvlink_version_for_model(g.model);
    rate[i] = root_rate ? root_rate : nvlink_rate_for_model(g.model);
    t.gpus.push_back(std::move(g));
  }

  // The matrix: GPU-GPU entries are direct links (or, with NVSwitchHidden, the hidden fabric), GPU-switch entries
  // are summed into the GPU's switch bandwidth, GPU-package entries are CPU links.
  std::vector<std::uint64_t> gg(n * n, 0), sw_mbps(n, 0), cpu_mbps(n, 0);
  std::vector<int> p2p(n * n, -1);
  if (scan.nvlink_matrix) {
    const ScannedMatrix& m = *scan.nvlink_matrix;
    const std::size_t mo = m.objects.size();
    if (m.values.size() != mo * mo) fail("NVLinkBandwidth matrix has a value count that does not match its objects");
    bool asymmetric = false;
    for (std::size_t a = 0; a < mo; ++a)
      for (std::size_t b = 0; b < mo; ++b) {
        if (a == b) continue;  // the diagonal is 0 or 1000000 depending on the writer: always ignored
        const MatrixObject& oa = m.objects[a];
        const MatrixObject& ob = m.objects[b];
        if (oa.kind != MatrixObject::Kind::Gpu) continue;
        const std::uint64_t vab = m.values[a * mo + b], vba = m.values[b * mo + a];
        if (vab != vba) asymmetric = true;
        const std::uint64_t v = std::min(vab, vba);
        const int ga = oa.index;
        switch (ob.kind) {
          case MatrixObject::Kind::Gpu:
            if (ob.index == ga) {
              if (v) add_warning(t, "NVLinkBandwidth matrix lists " + gpu_name(t, ga) + " twice; entry ignored");
            } else {
              gg[idx(n, ga, ob.index)] = add_checked(gg[idx(n, ga, ob.index)], v, "a GPU pair");
            }
            break;
          case MatrixObject::Kind::Switch:
            sw_mbps[ga] = add_checked(sw_mbps[ga], v, "GPU-to-NVSwitch entries");
            break;
          case MatrixObject::Kind::Cpu:
            cpu_mbps[ga] = add_checked(cpu_mbps[ga], v, "GPU-to-CPU entries");
            break;
          case MatrixObject::Kind::Other:
            if (v)
              add_warning(t, "NVLinkBandwidth entry between " + gpu_name(t, ga) + " and " + ob.description +
                                 " ignored (neither GPU, NVSwitch nor CPU package)");
            break;
        }
      }
    if (asymmetric) add_warning(t, "NVLinkBandwidth matrix is asymmetric; the smaller value of each pair is used");
    // A GPU the matrix does not list has no NVLink entries at all: say so instead of treating it as PCIe-only.
    std::vector<char> listed(n, 0);
    for (const auto& o : m.objects)
      if (o.kind == MatrixObject::Kind::Gpu && o.index >= 0 && static_cast<std::size_t>(o.index) < n)
        listed[o.index] = 1;
    for (std::size_t i = 0; i < n; ++i)
      if (!listed[i] && !info_active[i] && !info_switch[i])
        add_warning(t, gpu_name(t, static_cast<int>(i)) +
                           " is not in the NVLinkBandwidth matrix and has no NVLink infos: its NVLinks are unknown "
                           "(planned as none)");
  }
  if (scan.p2p_matrix) {
    const ScannedMatrix& m = *scan.p2p_matrix;
    const std::size_t mo = m.objects.size();
    if (m.values.size() != mo * mo) fail("KokkosMoENVLinkP2P matrix has a value count that does not match");
    for (std::size_t a = 0; a < mo; ++a)
      for (std::size_t b = 0; b < mo; ++b)
        if (a != b && m.objects[a].kind == MatrixObject::Kind::Gpu && m.objects[b].kind == MatrixObject::Kind::Gpu)
          p2p[idx(n, m.objects[a].index, m.objects[b].index)] =
              (m.values[a * mo + b] != 0 && m.values[b * mo + a] != 0) ? 1 : 0;
  }

  t.nvlink_known = scan.nvlink_matrix.has_value() || any_link_info;
  if (n > 0 && !t.nvlink_known)
    add_warning(t, "no NVLinkBandwidth matrix in the fixture: NVLinks unknown (treated as none)");
  bool rate_unknown = false;
  for (std::size_t i = 0; i < n; ++i)
    if (rate[i] == 0 &&
        (sw_mbps[i] || cpu_mbps[i] ||
         std::any_of(gg.begin() + static_cast<std::ptrdiff_t>(i * n),
                     gg.begin() + static_cast<std::ptrdiff_t>((i + 1) * n), [](std::uint64_t v) { return v != 0; })))
      rate_unknown = true;
  if (rate_unknown)
    add_warning(t,
                "per-link NVLink rate unknown (no NVLinkPerLinkMBps info, model not recognized): link counts "
                "unknown, MB/s kept");

  // Links to the fabric, per GPU.
  std::vector<int> lts(n, 0);
  std::vector<std::uint64_t> fabric_mbps(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    const std::string who = gpu_name(t, static_cast<int>(i));
    std::uint64_t hidden_mbps = 0;
    if (t.nvswitch_hidden)
      for (std::size_t j = 0; j < n; ++j) hidden_mbps = std::max(hidden_mbps, gg[idx(n, int(i), int(j))]);
    if (info_switch[i]) {
      lts[i] = *info_switch[i];
    } else if (sw_mbps[i]) {
      lts[i] = links_from_mbps(t, sw_mbps[i], rate[i], who + " NVSwitch bandwidth");
    } else if (hidden_mbps) {
      lts[i] = links_from_mbps(t, hidden_mbps, rate[i], who + " hidden-fabric bandwidth");
    }
    fabric_mbps[i] = rate[i] ? static_cast<std::uint64_t>(lts[i]) * rate[i] : std::max(sw_mbps[i], hidden_mbps);
    t.gpus[i].links_to_switch = lts[i];
    t.gpus[i].links_to_cpu =
        info_cpu[i] ? *info_cpu[i] : links_from_mbps(t, cpu_mbps[i], rate[i], who + " NVLink-to-CPU bandwidth");
    t.gpus[i].link_mbps = rate[i];
  }

  // Pairs.
  std::vector<int> direct_total(n, 0);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = i + 1; j < n; ++j) {
      GpuPair p = t.pairs[idx(n, int(i), int(j))];
      const std::uint64_t e = std::min(gg[idx(n, int(i), int(j))], gg[idx(n, int(j), int(i))]);
      const bool on_fabric = lts[i] > 0 && lts[j] > 0;
      p.switch_links = on_fabric ? static_cast<std::uint16_t>(std::min(lts[i], lts[j])) : 0;
      const std::uint64_t switch_mbps = on_fabric ? std::min(fabric_mbps[i], fabric_mbps[j]) : 0;
      std::uint64_t direct_mbps = e;
      if (t.nvswitch_hidden) direct_mbps = e > switch_mbps ? e - switch_mbps : 0;  // GPU-GPU entries hold the fabric
      const std::uint64_t r = std::min(rate[i], rate[j]) ? std::min(rate[i], rate[j]) : std::max(rate[i], rate[j]);
      const int direct =
          links_from_mbps(t, direct_mbps, r, "direct NVLinks " + gpu_name(t, int(i)) + " - " + gpu_name(t, int(j)));
      p.direct_links = static_cast<std::uint16_t>(direct);
      p.nvlink_mbps = add_checked(direct_mbps, switch_mbps, "a GPU pair");
      const int q = p2p[idx(n, int(i), int(j))] >= 0 ? p2p[idx(n, int(i), int(j))] : p2p[idx(n, int(j), int(i))];
      p.nvlink_p2p = q >= 0 ? q == 1 : (p.direct_links > 0 || p.switch_links > 0 || p.nvlink_mbps > 0);
      direct_total[i] += direct;
      direct_total[j] += direct;
      t.pairs[idx(n, int(i), int(j))] = p;
      t.pairs[idx(n, int(j), int(i))] = p;
    }
  for (std::size_t i = 0; i < n; ++i) {
    GpuInfo& g = t.gpus[i];
    g.active_links = info_active[i] ? *info_active[i] : direct_total[i] + g.links_to_switch + g.links_to_cpu;
  }
  if (rate_is_count) {
    for (auto& g : t.gpus) g.link_mbps = 0;
    for (auto& p : t.pairs) p.nvlink_mbps = 0;
  }
  if (t.nvswitch_hidden) add_warning(t, "NVSwitch hidden: fabric assumed");
  finalize_topology(t);
  return t;
}

// --- live: hwloc locality + NVML links (docs/topology.md §4) ---------------------------------------------------------

NvlinkTopology topology_from_live(const HostScan& scan, const NvmlSnapshot& nvml, SwitchLinkTable* switch_links) {
  NvlinkTopology t;
  t.source = NvlinkTopology::Source::Live;
  t.hwloc_version = scan.hwloc_version;
  t.hostname = scan.hostname;
  t.driver_version = nvml.driver_version;
  t.warnings = scan.warnings;
  for (const auto& w : nvml.warnings) add_warning(t, w);
  t.nvswitch_visible = static_cast<int>(scan.nvswitches.size());
  t.nvlink_known = true;

  // GPUs: NVML's devices, ordered by PCI address; hwloc supplies their locality.
  std::vector<int> order;  // model id -> NVML position
  for (std::size_t k = 0; k < nvml.gpus.size(); ++k) {
    if (nvml.gpus[k].pci)
      order.push_back(static_cast<int>(k));
    else
      add_warning(t, "NVML device " + std::to_string(nvml.gpus[k].nvml_index) + " has an unparsable PCI bus id \"" +
                         nvml.gpus[k].bus_id + "\": ignored");
  }
  std::sort(order.begin(), order.end(), [&](int a, int b) { return *nvml.gpus[a].pci < *nvml.gpus[b].pci; });
  const std::size_t n = order.size();
  std::vector<int> scan_of(n, -1);
  for (std::size_t i = 0; i < n; ++i) {
    const NvmlGpu& d = nvml.gpus[static_cast<std::size_t>(order[i])];
    GpuInfo g;
    g.id = static_cast<int>(i);
    g.pci = *d.pci;
    g.pci_device_id = d.device_id;
    g.uuid = d.uuid;
    g.model = d.name;
    g.nvml_index = d.nvml_index;
    g.compute_capability = d.compute_capability;
    g.fabric = d.fabric;
    if (auto s = scan.find_gpu(g.pci)) {
      scan_of[i] = *s;
      const ScannedGpu& sg = scan.gpus[static_cast<std::size_t>(*s)];
      g.numa_nodes = sg.numa_nodes;
      g.cpuset = sg.cpuset;
      if (!g.pci_device_id) g.pci_device_id = sg.device_id;
    } else {
      add_warning(t, "GPU " + g.pci.str() + " is not among hwloc's PCI devices: locality from NVML/sysfs");
    }
    if (g.numa_nodes.empty()) g.numa_nodes = d.numa_nodes;
    if (g.cpuset.empty()) g.cpuset = d.cpuset;
    t.gpus.push_back(std::move(g));
  }
  for (const auto& sg : scan.gpus) {
    bool seen = false;
    for (const auto& g : t.gpus) seen = seen || g.pci == sg.pci;
    if (!seen)
      add_warning(t, "GPU " + sg.pci.str() +
                         " is visible to hwloc but not to NVML (container or permissions): "
                         "not included");
  }

  // Links.
  std::vector<int> direct_seen(n * n, 0);  // links reported by GPU i towards GPU j
  std::vector<std::map<PciAddress, int>> per_switch(n);
  for (std::size_t i = 0; i < n; ++i) {
    const NvmlGpu& d = nvml.gpus[static_cast<std::size_t>(order[i])];
    GpuInfo& g = t.gpus[i];
    const std::string who = gpu_name(t, static_cast<int>(i));
    std::map<unsigned, int> versions;
    for (const NvmlLink& l : d.links) {
      if (!l.active) continue;
      ++g.active_links;
      if (l.version) ++versions[l.version];
      if (!l.p2p_capable) continue;
      const std::string link = who + " NVLink " + std::to_string(l.index);
      if (!l.remote_ok) {
        ++g.links_to_switch;
        t.nvswitch_hidden = true;
        add_warning(t, link + ": remote PCI info unavailable; counted as an NVSwitch link");
        continue;
      }
      if (is_nvml_sentinel(l.remote_domain, l.remote_bus_id)) {
        ++g.links_to_switch;
        t.nvswitch_hidden = true;
        continue;
      }
      const auto peer = PciAddress::parse(l.remote_bus_id);
      if (peer) {
        int peer_gpu = -1;
        for (std::size_t j = 0; j < n; ++j)
          if (t.gpus[j].pci == *peer) peer_gpu = static_cast<int>(j);
        if (peer_gpu == static_cast<int>(i)) {
          add_warning(t, link + ": loops back to the same GPU; ignored");
          continue;
        }
        if (peer_gpu >= 0) {
          ++direct_seen[idx(n, int(i), peer_gpu)];
          continue;
        }
      }
      const bool visible_switch = peer && scan.is_nvswitch(*peer);
      const int type = l.remote_type.value_or(-1);
      if (type == 2 || visible_switch) {
        ++g.links_to_switch;
        if (visible_switch)
          ++per_switch[i][*peer];
        else
          t.nvswitch_hidden = true;
      } else if (type == 1) {
        ++g.links_to_cpu;
      } else if (type == 0) {
        add_warning(t, link + ": peer GPU " + l.remote_bus_id +
                           " is not visible (container or cgroup); counted as active only");
      } else {
        ++g.links_to_switch;
        t.nvswitch_hidden = true;
        add_warning(
            t, link + ": unrecognized peer \"" + l.remote_bus_id + "\"; counted as an NVSwitch link (as NCCL does)");
      }
    }
    // Generation: the most common version among the active links.
    int version = 0, best = 0;
    for (const auto& [v, c] : versions)
      if (c > best) {
        best = c;
        version = static_cast<int>(v);
      }
    if (versions.size() > 1) add_warning(t, who + ": active NVLinks report different versions; using the majority");
    g.nvlink_version = version;
    g.link_mbps = nvlink_rate_mbps(version);
    if (g.active_links > 0 && version != 0 && g.link_mbps == 0)
      add_warning(t, who + ": NVLink version enum " + std::to_string(version) +
                         " unknown; per-link rate unknown, link counts kept");
    if (g.active_links > 0 && version == 0)
      add_warning(t, who + ": NVLink version query failed; per-link rate unknown, link counts kept");
  }

  t.pairs.assign(n * n, GpuPair{});
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = i + 1; j < n; ++j) {
      GpuPair p;
      // Each direct link is counted once, from the lower id (docs/topology.md §4.2 step 5).
      const int direct = direct_seen[idx(n, int(i), int(j))];
      if (direct != direct_seen[idx(n, int(j), int(i))])
        add_warning(t, "direct NVLinks " + gpu_name(t, int(i)) + " - " + gpu_name(t, int(j)) + ": the GPUs report " +
                           std::to_string(direct) + " and " + std::to_string(direct_seen[idx(n, int(j), int(i))]) +
                           "; using the lower id's count");
      p.direct_links = static_cast<std::uint16_t>(direct);
      const GpuInfo& a = t.gpus[i];
      const GpuInfo& b = t.gpus[j];
      if (a.links_to_switch > 0 && b.links_to_switch > 0)
        p.switch_links = static_cast<std::uint16_t>(std::min(a.links_to_switch, b.links_to_switch));
      const std::uint64_t r = std::min(a.link_mbps, b.link_mbps);
      p.nvlink_mbps = r * static_cast<std::uint64_t>(p.direct_links + p.switch_links);
      const std::size_t na = static_cast<std::size_t>(order[i]), nb = static_cast<std::size_t>(order[j]);
      const std::size_t nn = nvml.gpus.size();
      std::optional<bool> status;
      if (nvml.p2p.size() == nn * nn) {
        status = nvml.p2p[na * nn + nb];
        if (!status) status = nvml.p2p[nb * nn + na];
      }
      const bool derived = p.direct_links > 0 || p.switch_links > 0;
      p.nvlink_p2p = status.value_or(derived);
      if (status && *status && !derived)
        add_warning(t, gpu_name(t, int(i)) + " and " + gpu_name(t, int(j)) +
                           ": NVML reports P2P over NVLink, but no NVLink between them was found");
      if (status && !*status && derived)
        add_warning(t, gpu_name(t, int(i)) + " and " + gpu_name(t, int(j)) +
                           " have NVLinks but NVML reports no P2P over NVLink (fabric partition?)");
      if (scan_of[i] >= 0 && scan_of[j] >= 0 && scan.pcie.size() == scan.gpus.size() * scan.gpus.size()) {
        p.pcie = scan.pcie[idx(scan.gpus.size(), scan_of[i], scan_of[j])];
      } else if (nvml.common_ancestor.size() == nn * nn && nvml.common_ancestor[na * nn + nb]) {
        const int lvl = *nvml.common_ancestor[na * nn + nb];
        for (PcieLevel l :
             {PcieLevel::Internal, PcieLevel::Pix, PcieLevel::Pxb, PcieLevel::Phb, PcieLevel::Node, PcieLevel::Sys})
          if (static_cast<int>(l) == lvl) p.pcie = l;
      }
      t.pairs[idx(n, int(i), int(j))] = p;
      t.pairs[idx(n, int(j), int(i))] = p;
    }
  if (t.nvswitch_hidden) add_warning(t, "NVSwitch hidden: fabric assumed");
  if (switch_links) *switch_links = std::move(per_switch);
  finalize_topology(t);
  return t;
}

// --- live without NVML (docs/topology.md §4.1 step 5)
// --------------------------------------------------------------------

NvlinkTopology topology_from_hwloc_only(const HostScan& scan, const std::string& reason) {
  NvlinkTopology t;
  t.source = NvlinkTopology::Source::Live;
  t.hwloc_version = scan.hwloc_version;
  t.hostname = scan.hostname;
  t.warnings = scan.warnings;
  t.nvswitch_visible = static_cast<int>(scan.nvswitches.size());
  t.nvlink_known = false;
  const std::size_t n = scan.gpus.size();
  for (std::size_t i = 0; i < n; ++i) {
    const ScannedGpu& s = scan.gpus[i];
    GpuInfo g;
    g.id = static_cast<int>(i);
    g.pci = s.pci;
    g.pci_device_id = s.device_id;
    g.model = s.model;
    g.uuid = s.uuid;
    g.numa_nodes = s.numa_nodes;
    g.cpuset = s.cpuset;
    t.gpus.push_back(std::move(g));
  }
  t.pairs.assign(n * n, GpuPair{});
  for (std::size_t k = 0; k < n * n && k < scan.pcie.size(); ++k) t.pairs[k].pcie = scan.pcie[k];
  add_warning(t, "NVML unavailable (" + reason + "): " +
                     (n ? "GPUs from hwloc's PCI devices, NVLinks unknown" : std::string("no NVIDIA GPU on PCI")));
  finalize_topology(t);
  return t;
}

}  // namespace KokkosMoE::Impl
