/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// hwloc reading and writing (docs/topology.md §4.1, §5, §9). The only translation unit that includes hwloc.

#include "KokkosMoE_Topology_Hwloc.hpp"

#include <KokkosMoE_Error.hpp>

#include <hwloc.h>
#include <hwloc/export.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <set>

#include "KokkosMoE_Topology_XmlCheck.hpp"

namespace KokkosMoE::Impl {

namespace {

[[noreturn]] void fail(const std::string& msg) { throw TopologyError("KokkosMoE topology: " + msg); }

std::string errno_text(int e) { return e ? std::string(std::strerror(e)) : std::string("unknown error"); }

bool is_nvidia_gpu_class(hwloc_obj_t o) {
  return o->attr->pcidev.vendor_id == 0x10de && (o->attr->pcidev.class_id >> 8) == 0x03;
}

bool has_subtype(hwloc_obj_t o, const char* s) { return o->subtype && std::strcmp(o->subtype, s) == 0; }

bool is_nvidia_bridge_class(hwloc_obj_t o) {
  return o->attr->pcidev.vendor_id == 0x10de && o->attr->pcidev.class_id == 0x0680;
}

// NVSwitches. In fixtures by subtype only (docs/topology.md §5.2: published files store some switches with class 0000,
// and an NVIDIA class-0680 function is not necessarily a switch); on the live machine also an NVIDIA bridge-class
// 0x0680 function, since older hwloc releases set no subtype (captures add it, so the fixture says the same).
bool is_nvswitch(hwloc_obj_t o, bool by_class) {
  if (o->type != HWLOC_OBJ_PCI_DEVICE) return false;
  return has_subtype(o, "NVSwitch") || (by_class && is_nvidia_bridge_class(o));
}

bool is_gpu_osdev(hwloc_obj_t o) {
  if (o->type != HWLOC_OBJ_OS_DEVICE) return false;
  if (has_subtype(o, "NVML") || has_subtype(o, "CUDA")) return true;
  return o->name && (std::strncmp(o->name, "nvml", 4) == 0 || std::strncmp(o->name, "cuda", 4) == 0);
}

// GPUs: NVIDIA display/3D-class PCI functions, or any PCI function carrying an NVML/CUDA OS device (name prefix or
// subtype, never the OS-device type code: published files disagree on it).
bool is_gpu(hwloc_obj_t o, bool by_class) {
  if (o->type != HWLOC_OBJ_PCI_DEVICE || is_nvswitch(o, by_class)) return false;
  if (is_nvidia_gpu_class(o)) return true;
  for (hwloc_obj_t c = o->io_first_child; c; c = c->next_sibling)
    if (is_gpu_osdev(c)) return true;
  return false;
}

PciAddress pci_of(hwloc_obj_t o) {
  PciAddress a;
  a.domain = o->attr->pcidev.domain;
  a.bus = o->attr->pcidev.bus;
  a.device = o->attr->pcidev.dev;
  a.function = o->attr->pcidev.func;
  return a;
}

const char* info(hwloc_obj_t o, const char* name) { return hwloc_obj_get_info_by_name(o, name); }

std::string bitmap_list(hwloc_const_bitmap_t b) {
  if (!b || hwloc_bitmap_iszero(b)) return {};
  char* s = nullptr;
  if (hwloc_bitmap_list_asprintf(&s, b) < 0 || !s) return {};
  std::string r(s);
  std::free(s);
  return r;
}

// --- PCIe levels (docs/topology.md §4.1 step 4; walk parents ourselves, see §11) ------------------------------------

// The bridge type is read as a plain integer: hwloc stores whatever number a file holds, and an enum object with a
// value outside its enumerators is undefined behaviour in C++ (found by the fuzz target with bridge_type="2-1").
unsigned upstream_type(hwloc_obj_t o) {
  unsigned v = 0;
  static_assert(sizeof(o->attr->bridge.upstream_type) <= sizeof v, "enum wider than unsigned");
  std::memcpy(&v, &o->attr->bridge.upstream_type, sizeof(o->attr->bridge.upstream_type));
  return v;
}
bool is_host_bridge(hwloc_obj_t o) {
  return o->type == HWLOC_OBJ_BRIDGE && upstream_type(o) == static_cast<unsigned>(HWLOC_OBJ_BRIDGE_HOST);
}
bool is_pci_bridge(hwloc_obj_t o) {
  return o->type == HWLOC_OBJ_BRIDGE && upstream_type(o) == static_cast<unsigned>(HWLOC_OBJ_BRIDGE_PCI);
}

// hwloc shows a PCIe switch as an upstream-port bridge whose children are its downstream-port bridges; both
// carry the switch's vendor:device id, while a root port carries the CPU's. A PCI bridge whose parent is a PCI
// bridge with the same (known) id belongs to its parent's switch.
hwloc_obj_t switch_of(hwloc_obj_t b) {
  while (b->parent && is_pci_bridge(b->parent)) {
    const auto& mine = b->attr->bridge.upstream.pci;
    const auto& up = b->parent->attr->bridge.upstream.pci;
    if (mine.vendor_id == 0 || mine.vendor_id != up.vendor_id || mine.device_id != up.device_id) break;
    b = b->parent;
  }
  return b;
}

PcieLevel pcie_level(hwloc_obj_t a, hwloc_obj_t b) {
  if (a == b) return PcieLevel::Internal;
  std::vector<hwloc_obj_t> up_a, up_b;  // ancestors, nearest first
  for (hwloc_obj_t p = a->parent; p; p = p->parent) up_a.push_back(p);
  for (hwloc_obj_t p = b->parent; p; p = p->parent) up_b.push_back(p);
  hwloc_obj_t lca = nullptr;
  std::size_t ia = 0, ib = 0;
  for (ia = 0; ia < up_a.size() && !lca; ++ia)
    for (ib = 0; ib < up_b.size(); ++ib)
      if (up_a[ia] == up_b[ib]) {
        lca = up_a[ia];
        break;
      }
  if (!lca) return PcieLevel::Unknown;
  --ia;  // the loop advanced once past the match
  // Paths strictly below the common ancestor.
  const std::vector<hwloc_obj_t> path_a(up_a.begin(), up_a.begin() + static_cast<std::ptrdiff_t>(ia));
  const std::vector<hwloc_obj_t> path_b(up_b.begin(), up_b.begin() + static_cast<std::ptrdiff_t>(ib));
  if (hwloc_obj_type_is_io(lca->type)) {
    if (is_host_bridge(lca)) return PcieLevel::Phb;
    if (lca->type != HWLOC_OBJ_BRIDGE) return PcieLevel::Internal;  // one GPU below another PCI function
    std::set<hwloc_obj_t> switches{switch_of(lca)};
    for (const auto* path : {&path_a, &path_b})
      for (hwloc_obj_t p : *path)
        if (is_pci_bridge(p)) switches.insert(switch_of(p));
    return switches.size() <= 1 ? PcieLevel::Pix : PcieLevel::Pxb;
  }
  bool host_bridge = false;
  for (const auto* path : {&path_a, &path_b})
    for (hwloc_obj_t p : *path) host_bridge = host_bridge || is_host_bridge(p);
  hwloc_obj_t na = hwloc_get_non_io_ancestor_obj(nullptr, a);
  hwloc_obj_t nb = hwloc_get_non_io_ancestor_obj(nullptr, b);
  if (na == nb) return host_bridge ? PcieLevel::Node : PcieLevel::Phb;  // VMs: GPUs straight under the machine
  const bool one_numa = !lca->nodeset || hwloc_bitmap_weight(lca->nodeset) <= 1;
  return (lca->type == HWLOC_OBJ_PACKAGE || one_numa) ? PcieLevel::Node : PcieLevel::Sys;
}

// Infos by name; a name given twice with different values (on one object, or on a GPU's PCI object and its OS
// devices) is recorded in `conflicts` (hwloc itself would silently answer the first).
void merge_infos(hwloc_obj_t o, std::map<std::string, std::string>& out,
                 std::map<std::string, std::vector<std::string>>& conflicts) {
  for (unsigned k = 0; k < o->infos_count; ++k) {
    if (!o->infos[k].name || !o->infos[k].value) continue;
    const auto [it, inserted] = out.emplace(o->infos[k].name, o->infos[k].value);
    if (!inserted && it->second != o->infos[k].value) {
      auto& values = conflicts[it->first];
      if (values.empty()) values.push_back(it->second);
      if (std::find(values.begin(), values.end(), o->infos[k].value) == values.end())
        values.push_back(o->infos[k].value);
    }
  }
}

}  // namespace

std::string hwloc_compiled_version() {
#ifdef HWLOC_VERSION
  return HWLOC_VERSION;
#else
  const unsigned v = hwloc_get_api_version();
  return std::to_string(v >> 16) + "." + std::to_string((v >> 8) & 0xff) + " (API)";
#endif
}

struct HwlocTree::State {
  hwloc_topology_t topo = nullptr;
  bool from_xml = false;
  bool switches_by_class = true;  // live trees (and fixtures standing in for one): NVSwitches by class too
  std::string source;
  ~State() {
    if (topo) hwloc_topology_destroy(topo);
  }
};

HwlocTree::HwlocTree(std::unique_ptr<State> s) : m_state(std::move(s)) {}
HwlocTree::HwlocTree(HwlocTree&&) noexcept = default;
HwlocTree& HwlocTree::operator=(HwlocTree&&) noexcept = default;
HwlocTree::~HwlocTree() = default;

HwlocTree HwlocTree::from_xml(std::string_view xml, const std::string& source, bool as_live) {
  const XmlCheckResult checked = check_hwloc_xml(xml, source);
  auto st = std::make_unique<State>();
  st->from_xml = true;
  st->switches_by_class = as_live;
  st->source = source;
  if (hwloc_topology_init(&st->topo) != 0) fail("hwloc_topology_init failed: " + errno_text(errno));
  // hwloc 2.x drops I/O objects by default, also for XML: without this the GPUs vanish and the NVLinkBandwidth
  // matrix is dropped or truncated, silently (docs/topology.md §5.1). Keep everything the file contains.
  hwloc_topology_set_io_types_filter(st->topo, HWLOC_TYPE_FILTER_KEEP_ALL);
  // hwloc gets our canonical form of the document, never the caller's bytes: the same input then gives the same
  // model or the same error whichever XML importer hwloc has (built-in or libxml2; KokkosMoE_Topology_XmlCheck.cpp).
  // hwloc reads the buffer as a C string of `size` bytes including the terminating NUL.
  const std::string& text = checked.canonical;
  if (text.size() >= static_cast<std::size_t>(std::numeric_limits<int>::max()))
    fail(source + ": the XML text is too large for hwloc (" + std::to_string(text.size()) + " bytes)");
  if (hwloc_topology_set_xmlbuffer(st->topo, text.c_str(), static_cast<int>(text.size() + 1)) != 0)
    fail(source + ": hwloc rejected the XML buffer: " + errno_text(errno));
  if (hwloc_topology_load(st->topo) != 0)
    fail(source + ": hwloc could not import the XML (" + errno_text(errno) +
         "); run with HWLOC_XML_VERBOSE=1 for hwloc's reason");
  // A matrix entry that names an object hwloc cannot find makes hwloc drop the whole matrix silently (§11).
  for (const auto& m : checked.matrices) {
    if (m.name != kNvlinkMatrixName && m.name != kP2pMatrixName) continue;
    unsigned nr = 0;
    hwloc_distances_get_by_name(st->topo, m.name.c_str(), &nr, nullptr, 0);
    if (nr == 0)
      fail(source + ": line " + std::to_string(m.line) + ": distances matrix \"" + m.name + "\" (" +
           std::to_string(m.nbobjs) + " objects) was dropped by hwloc: its objects were filtered or are invalid");
  }
  return HwlocTree(std::move(st));
}

HwlocTree HwlocTree::live(bool keep_all) {
  auto st = std::make_unique<State>();
  st->source = "live machine";
  if (hwloc_topology_init(&st->topo) != 0) fail("hwloc_topology_init failed: " + errno_text(errno));
  if (keep_all) {
    hwloc_topology_set_io_types_filter(st->topo, HWLOC_TYPE_FILTER_KEEP_ALL);
  } else {
    hwloc_topology_set_io_types_filter(st->topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    hwloc_topology_set_type_filter(st->topo, HWLOC_OBJ_PCI_DEVICE, HWLOC_TYPE_FILTER_KEEP_ALL);
  }
#if HWLOC_API_VERSION >= 0x00020100
  // OpenCL initializes the NVIDIA ICD (slow, creates GPU contexts); CUDA creates contexts; GL talks to X.
  for (const char* c : {"opencl", "gl", "cuda"})
    hwloc_topology_set_components(st->topo, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, c);
#endif
  if (hwloc_topology_load(st->topo) != 0) fail("hwloc could not discover this machine: " + errno_text(errno));
  return HwlocTree(std::move(st));
}

bool HwlocTree::is_this_system() const { return hwloc_topology_is_thissystem(m_state->topo) != 0; }

HostScan HwlocTree::scan() const {
  hwloc_topology_t topo = m_state->topo;
  HostScan s;
  hwloc_obj_t root = hwloc_get_root_obj(topo);
  const bool by_class = m_state->switches_by_class;
  merge_infos(root, s.root_infos, s.root_info_conflicts);
  if (const char* v = info(root, "hwlocVersion"))
    s.hwloc_version = v;
  else
    s.hwloc_version = hwloc_compiled_version();
  if (const char* h = info(root, "HostName")) s.hostname = h;

  std::vector<std::pair<ScannedGpu, hwloc_obj_t>> gpus;
  for (hwloc_obj_t o = hwloc_get_next_pcidev(topo, nullptr); o; o = hwloc_get_next_pcidev(topo, o)) {
    if (is_nvswitch(o, by_class)) {
      s.nvswitches.push_back(pci_of(o));
      continue;
    }
    if (!by_class && is_nvidia_bridge_class(o))
      s.warnings.push_back("PCI device " + pci_of(o).str() +
                           " is an NVIDIA bridge-class (0680) function without subtype=\"NVSwitch\": not counted as "
                           "an NVSwitch (fixtures name switches by subtype, docs/topology.md §5.2)");
    if (!is_gpu(o, by_class)) continue;
    if (const char* why = info(o, InfoName::kGpuExcluded)) {
      s.warnings.push_back("GPU " + pci_of(o).str() + " excluded by the capture: " + why);
      continue;
    }
    ScannedGpu g;
    g.pci = pci_of(o);
    g.device_id = o->attr->pcidev.device_id;
    merge_infos(o, g.infos, g.info_conflicts);
    for (hwloc_obj_t c = o->io_first_child; c; c = c->next_sibling) {
      if (c->type != HWLOC_OBJ_OS_DEVICE) continue;
      merge_infos(c, g.infos, g.info_conflicts);
      // hwloc's NVML component names its devices nvml<NVML index>.
      if (c->name && std::strncmp(c->name, "nvml", 4) == 0 && c->name[4] != '\0' && std::strlen(c->name) < 12 &&
          std::strspn(c->name + 4, "0123456789") == std::strlen(c->name + 4))
        g.infos.emplace(InfoName::kNvmlIndex, c->name + 4);
    }
    if (auto it = g.infos.find("GPUModel"); it != g.infos.end())
      g.model = it->second;
    else if (auto it2 = g.infos.find("PCIDevice"); it2 != g.infos.end())
      g.model = it2->second;
    if (auto it = g.infos.find("NVIDIAUUID"); it != g.infos.end()) g.uuid = it->second;
    // Locality: the first non-I/O ancestor gives the CPU set; its NUMA nodes (except GPU memory exposed as NUMA on
    // Grace-Hopper / POWER9) are the CPU-side affinity.
    hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(topo, o);
    if (anc) {
      g.cpuset = bitmap_list(anc->cpuset);
      if (anc->nodeset)
        for (hwloc_obj_t n = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_NUMANODE, nullptr); n;
             n = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_NUMANODE, n)) {
          if (has_subtype(n, "GPUMemory")) continue;
          if (hwloc_bitmap_isset(anc->nodeset, n->os_index)) g.numa_nodes.push_back(static_cast<int>(n->os_index));
        }
      std::sort(g.numa_nodes.begin(), g.numa_nodes.end());
      g.numa_nodes.erase(std::unique(g.numa_nodes.begin(), g.numa_nodes.end()), g.numa_nodes.end());
    }
    gpus.emplace_back(std::move(g), o);
  }
  std::sort(gpus.begin(), gpus.end(), [](const auto& x, const auto& y) { return x.first.pci < y.first.pci; });
  for (std::size_t k = 1; k < gpus.size(); ++k)
    if (gpus[k].first.pci == gpus[k - 1].first.pci) fail("two GPUs with PCI address " + gpus[k].first.pci.str());
  std::sort(s.nvswitches.begin(), s.nvswitches.end());
  const std::size_t n = gpus.size();
  s.pcie.assign(n * n, PcieLevel::Unknown);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < n; ++j)
      s.pcie[i * n + j] = i == j ? PcieLevel::Internal : pcie_level(gpus[i].second, gpus[j].second);
  for (auto& g : gpus) s.gpus.push_back(std::move(g.first));

  auto read_matrix = [&](const char* name) -> std::optional<ScannedMatrix> {
    unsigned nr = 1;
    hwloc_distances_s* d[2] = {nullptr, nullptr};
    nr = 2;
    if (hwloc_distances_get_by_name(topo, name, &nr, d, 0) != 0 || nr == 0) return std::nullopt;
    if (nr > 1) s.warnings.push_back(std::string("several distances matrices named ") + name + "; using the first");
    ScannedMatrix m;
    m.kind = d[0]->kind;
    const unsigned no = d[0]->nbobjs;
    for (unsigned k = 0; k < no; ++k) {
      MatrixObject mo;
      hwloc_obj_t o = d[0]->objs[k];
      if (!o) {
        mo.description = "a removed object";
      } else {
        hwloc_obj_t pci = o;
        while (pci && pci->type == HWLOC_OBJ_OS_DEVICE) pci = pci->parent;  // nvmlN -> its GPU
        char type[64] = {0};
        hwloc_obj_type_snprintf(type, sizeof type, o, 0);
        mo.description = std::string(type) + " (gp_index " + std::to_string(o->gp_index) + ")";
        if (pci && pci->type == HWLOC_OBJ_PCI_DEVICE && is_gpu(pci, by_class)) {
          for (std::size_t i = 0; i < n; ++i)
            if (s.gpus[i].pci == pci_of(pci)) mo.index = static_cast<int>(i);
          mo.kind = MatrixObject::Kind::Gpu;
        } else if (pci && pci->type == HWLOC_OBJ_PCI_DEVICE && is_nvswitch(pci, by_class)) {
          const auto it = std::lower_bound(s.nvswitches.begin(), s.nvswitches.end(), pci_of(pci));
          mo.index = static_cast<int>(it - s.nvswitches.begin());
          mo.kind = MatrixObject::Kind::Switch;
        } else if (!hwloc_obj_type_is_io(o->type)) {
          mo.index = static_cast<int>(o->os_index);
          mo.kind = MatrixObject::Kind::Cpu;
        }
      }
      m.objects.push_back(std::move(mo));
    }
    m.values.assign(d[0]->values, d[0]->values + static_cast<std::size_t>(no) * no);
    for (unsigned k = 0; k < nr; ++k) hwloc_distances_release(topo, d[k]);
    return m;
  };
  s.nvlink_matrix = read_matrix(kNvlinkMatrixName);
  s.p2p_matrix = read_matrix(kP2pMatrixName);
  return s;
}

std::string HwlocTree::export_capture(const NvlinkTopology& t, const SwitchLinkTable& switch_links,
                                      const std::string& nvml_status) {
  hwloc_topology_t topo = m_state->topo;
  hwloc_obj_t root = hwloc_get_root_obj(topo);
  auto add_root = [&](const char* name, const std::string& value) {
    if (!info(root, name)) hwloc_obj_add_info(root, name, value.c_str());
  };
  add_root(InfoName::kCaptureTool, "kokkosmoe-topo (KokkosMoE sharding), model version 1");
  add_root(InfoName::kNvmlStatus, nvml_status);
  if (!t.driver_version.empty()) add_root(InfoName::kDriverVersion, t.driver_version);
  const std::size_t n = t.gpus.size();
  if (t.nvlink_known) add_root(InfoName::kNvswitchHidden, t.nvswitch_hidden ? "1" : "0");

  // One rate and version for the file (they are per host in practice); per-GPU versions are infos below.
  std::uint64_t rate = 0;
  std::map<int, int> versions;
  for (const auto& g : t.gpus) {
    if (g.link_mbps && (rate == 0 || g.link_mbps < rate)) rate = g.link_mbps;
    if (g.nvlink_version) ++versions[g.nvlink_version];
  }
  const bool rate_known = rate != 0;
  if (!rate_known) rate = 1;  // matrix in units of links; flagged below so the loader reports the rate unknown
  if (t.nvlink_known) add_root(InfoName::kPerLinkMbps, std::to_string(rate));
  if (!rate_known && t.nvlink_known) add_root(InfoName::kLinkRateUnknown, "1");
  if (!versions.empty()) {
    const auto best = std::max_element(versions.begin(), versions.end(),
                                       [](const auto& a, const auto& b) { return a.second < b.second; });
    add_root(InfoName::kNvlinkVersion, std::to_string(best->first));
  }

  // Switches found by class get the subtype, so that the fixture (read by subtype only) has the same switches.
  for (hwloc_obj_t o = hwloc_get_next_pcidev(topo, nullptr); o; o = hwloc_get_next_pcidev(topo, o))
    if (is_nvswitch(o, true) && !has_subtype(o, "NVSwitch")) {
      char* subtype = static_cast<char*>(std::malloc(sizeof "NVSwitch"));  // hwloc frees it with free()
      if (!subtype) fail("out of memory");
      std::memcpy(subtype, "NVSwitch", sizeof "NVSwitch");
      std::free(o->subtype);
      o->subtype = subtype;
    }
  // GPUs hwloc sees that the model left out (e.g. not visible to NVML) are marked, so the fixture reproduces the model.
  for (hwloc_obj_t o = hwloc_get_next_pcidev(topo, nullptr); o; o = hwloc_get_next_pcidev(topo, o))
    if (is_gpu(o, true) && !t.find_gpu(pci_of(o)) && !info(o, InfoName::kGpuExcluded))
      hwloc_obj_add_info(o, InfoName::kGpuExcluded,
                         t.nvlink_known ? "visible to hwloc but not to NVML" : "not in the captured model");
  std::vector<hwloc_obj_t> gpu_obj(n, nullptr);
  for (std::size_t i = 0; i < n; ++i) {
    const GpuInfo& g = t.gpus[i];
    hwloc_obj_t o = hwloc_get_pcidev_by_busid(topo, g.pci.domain, g.pci.bus, g.pci.device, g.pci.function);
    if (!o) {
      add_root("KokkosMoECaptureWarning", "GPU " + g.pci.str() + " is not among hwloc's PCI devices; not captured");
      continue;
    }
    gpu_obj[i] = o;
    // The model's value, once: an info of that name on the GPU's PCI object or its OS devices (hwloc's NVML
    // component writes GPUModel and NVIDIAUUID there) is overwritten, so the loader never sees two values.
    auto add = [&](const char* name, const std::string& value) {
      if (value.empty()) return;
      bool present = false;
      auto overwrite = [&](hwloc_obj_t x) {
        for (unsigned k = 0; k < x->infos_count; ++k)
          if (x->infos[k].name && std::strcmp(x->infos[k].name, name) == 0) {
            if (x == o) present = true;
            if (x->infos[k].value && value == x->infos[k].value) continue;
            char* v = static_cast<char*>(std::malloc(value.size() + 1));  // hwloc frees infos with free()
            if (!v) fail("out of memory");
            std::memcpy(v, value.c_str(), value.size() + 1);
            std::free(x->infos[k].value);
            x->infos[k].value = v;
          }
      };
      overwrite(o);
      for (hwloc_obj_t c = o->io_first_child; c; c = c->next_sibling)
        if (c->type == HWLOC_OBJ_OS_DEVICE) overwrite(c);
      if (!present) hwloc_obj_add_info(o, name, value.c_str());
    };
    add(InfoName::kGpuModel, g.model);
    add(InfoName::kGpuUuid, g.uuid);
    if (g.nvml_index) add(InfoName::kNvmlIndex, std::to_string(*g.nvml_index));
    if (g.compute_capability)
      add(InfoName::kComputeCapability,
          std::to_string(*g.compute_capability / 10) + "." + std::to_string(*g.compute_capability % 10));
    if (t.nvlink_known) {
      if (g.nvlink_version) add(InfoName::kNvlinkVersion, std::to_string(g.nvlink_version));
      add(InfoName::kLinksActive, std::to_string(g.active_links));
      add(InfoName::kLinksToSwitch, std::to_string(g.links_to_switch));
      add(InfoName::kLinksToCpu, std::to_string(g.links_to_cpu));
    }
    if (g.fabric) {
      static const char* hex = "0123456789abcdef";
      std::string u;
      for (auto b : g.fabric->cluster_uuid) {
        u += hex[b >> 4];
        u += hex[b & 15];
      }
      add(InfoName::kFabricCluster, u);
      add(InfoName::kFabricClique, std::to_string(g.fabric->clique_id));
    }
  }

  // The FROM_USER matrix over GPU PCI objects (+ visible NVSwitches). GPU-GPU entries: direct links, plus the
  // hidden fabric's share when switches are hidden (then NVSwitchHidden=1 tells the loader so, docs/topology.md §5.2).
#if HWLOC_API_VERSION >= 0x00020500
  // Replace, never duplicate, a matrix of the same name (hwloc's own nvml component, or a fixture used as base).
  for (const char* name : {kNvlinkMatrixName, kP2pMatrixName}) {
    for (;;) {
      unsigned nr = 1;
      hwloc_distances_s* d = nullptr;
      if (hwloc_distances_get_by_name(topo, name, &nr, &d, 0) != 0 || nr == 0 || !d) break;
      if (hwloc_distances_release_remove(topo, d) != 0) fail(std::string("cannot remove the old ") + name + " matrix");
    }
  }
#endif
  if (t.nvlink_known) {
    std::vector<hwloc_obj_t> objs;
    std::vector<int> gpu_slot(n, -1);
    for (std::size_t i = 0; i < n; ++i)
      if (gpu_obj[i]) {
        gpu_slot[i] = static_cast<int>(objs.size());
        objs.push_back(gpu_obj[i]);
      }
    std::map<PciAddress, int> switch_slot;
    for (std::size_t i = 0; i < n && i < switch_links.size(); ++i)
      for (const auto& [addr, cnt] : switch_links[i]) {
        if (cnt <= 0 || switch_slot.count(addr)) continue;
        hwloc_obj_t o = hwloc_get_pcidev_by_busid(topo, addr.domain, addr.bus, addr.device, addr.function);
        if (!o) continue;
        switch_slot[addr] = static_cast<int>(objs.size());
        objs.push_back(o);
      }
    const std::size_t m = objs.size();
    if (m >= 2) {
      std::vector<hwloc_uint64_t> values(m * m, 0);
      std::vector<hwloc_uint64_t> p2p(m * m, 0);
      bool p2p_differs = false;
      std::vector<int> hidden_links(n, 0);
      for (std::size_t i = 0; i < n; ++i) {
        int visible = 0;
        if (i < switch_links.size())
          for (const auto& [addr, cnt] : switch_links[i]) visible += cnt;
        hidden_links[i] = std::max(0, t.gpus[i].links_to_switch - visible);
      }
      for (std::size_t i = 0; i < n; ++i) {
        if (gpu_slot[i] < 0) continue;
        const std::size_t a = static_cast<std::size_t>(gpu_slot[i]);
        values[a * m + a] = 0;
        for (std::size_t j = 0; j < n; ++j) {
          if (j == i || gpu_slot[j] < 0) continue;
          const std::size_t b = static_cast<std::size_t>(gpu_slot[j]);
          const GpuPair& p = t.pairs[i * n + j];
          std::uint64_t links = p.direct_links;
          if (t.nvswitch_hidden && hidden_links[i] > 0 && hidden_links[j] > 0)
            links += static_cast<std::uint64_t>(std::min(hidden_links[i], hidden_links[j]));
          values[a * m + b] = links * rate;
          p2p[a * m + b] = p.nvlink_p2p ? 1 : 0;
          if (p.nvlink_p2p != (p.direct_links > 0 || p.switch_links > 0)) p2p_differs = true;
        }
        if (i < switch_links.size())
          for (const auto& [addr, cnt] : switch_links[i]) {
            auto it = switch_slot.find(addr);
            if (it == switch_slot.end()) continue;
            const std::size_t b = static_cast<std::size_t>(it->second);
            values[a * m + b] = values[b * m + a] = static_cast<std::uint64_t>(cnt) * rate;
          }
      }
#if HWLOC_API_VERSION >= 0x00020500
      auto add_matrix = [&](const char* name, std::vector<hwloc_uint64_t>& vals, unsigned long kind) {
        hwloc_distances_add_handle_t h = hwloc_distances_add_create(topo, name, kind, 0);
        if (!h) fail(std::string("hwloc_distances_add_create(") + name + ") failed: " + errno_text(errno));
        if (hwloc_distances_add_values(topo, h, static_cast<unsigned>(m), objs.data(), vals.data(), 0) != 0)
          fail(std::string("hwloc_distances_add_values(") + name + ") failed: " + errno_text(errno));
        if (hwloc_distances_add_commit(topo, h, 0) != 0)
          fail(std::string("hwloc_distances_add_commit(") + name + ") failed: " + errno_text(errno));
      };
      add_matrix(kNvlinkMatrixName, values, HWLOC_DISTANCES_KIND_FROM_USER | HWLOC_DISTANCES_KIND_MEANS_BANDWIDTH);
      // hwloc wants a "means" kind; the P2P matrix holds 1 (reachable over NVLink) or 0.
      if (p2p_differs)
        add_matrix(kP2pMatrixName, p2p, HWLOC_DISTANCES_KIND_FROM_USER | HWLOC_DISTANCES_KIND_MEANS_BANDWIDTH);
#else
      add_root("KokkosMoECaptureWarning", "hwloc older than 2.5 cannot add distances: no NVLinkBandwidth matrix");
#endif
    }
  }

  char* buf = nullptr;
  int len = 0;
  unsigned long flags = 0;
#if HWLOC_API_VERSION >= 0x00030000
  flags |= HWLOC_TOPOLOGY_EXPORT_XML_FLAG_V2;  // hwloc 2.x cannot read 3.0 files (docs/topology.md §5.1)
#endif
  if (hwloc_topology_export_xmlbuffer(topo, &buf, &len, flags) != 0 || !buf)
    fail("hwloc could not export the topology as XML: " + errno_text(errno));
  std::string out(buf, len > 0 ? static_cast<std::size_t>(len - 1) : 0);  // len counts the NUL
  hwloc_free_xmlbuffer(topo, buf);
  return out;
}

}  // namespace KokkosMoE::Impl
