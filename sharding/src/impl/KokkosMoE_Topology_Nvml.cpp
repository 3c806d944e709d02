/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// NVML through dlopen (docs/topology.md §4.2). The declarations below mirror the public NVML ABI for the handful of
// functions we call; the plain names of nvml.h are macros for the versioned symbols resolved here.

#include "KokkosMoE_Topology_Nvml.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>

namespace KokkosMoE::Impl {

namespace {

// --- the NVML ABI we rely on --------------------------------------------------------------------------------------
using nvmlReturn_t = int;
using nvmlDevice_t = struct nvmlDevice_st*;

constexpr nvmlReturn_t NVML_SUCCESS = 0;
constexpr int NVML_FEATURE_ENABLED = 1;
constexpr int NVML_NVLINK_CAP_P2P_SUPPORTED = 0;
constexpr int NVML_P2P_CAPS_INDEX_NVLINK = 2;
constexpr int NVML_P2P_STATUS_OK = 0;
constexpr unsigned NVML_AFFINITY_SCOPE_NODE = 0;
constexpr unsigned char NVML_GPU_FABRIC_STATE_COMPLETED = 3;
constexpr unsigned kMaxLinkIndex = 64;  // never trust a compile-time NVML_NVLINK_MAX_LINKS (18, 36, ...)
constexpr unsigned kDeviceBufferSize = 96;
constexpr unsigned kDriverBufferSize = 80;
constexpr unsigned kAffinityWords = 64;  // 64 * 64 = 4096 CPUs / NUMA nodes

struct NvmlPciInfo {  // nvmlPciInfo_t (v3 layout)
  char busIdLegacy[16];
  unsigned domain;
  unsigned bus;
  unsigned device;
  unsigned pciDeviceId;  // (device id << 16) | vendor id
  unsigned pciSubSystemId;
  char busId[32];
};
static_assert(sizeof(NvmlPciInfo) == 68, "nvmlPciInfo_t layout");

struct NvmlFabricInfoV2 {  // nvmlGpuFabricInfo_v2_t
  unsigned version;
  unsigned char clusterUuid[16];
  nvmlReturn_t status;
  unsigned cliqueId;
  unsigned char state;
  unsigned healthMask;
};
static_assert(sizeof(NvmlFabricInfoV2) == 36, "nvmlGpuFabricInfo_v2_t layout");

struct Api {
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  const char* (*error_string)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*driver_version)(char*, unsigned) = nullptr;
  nvmlReturn_t (*count)(unsigned*) = nullptr;
  nvmlReturn_t (*handle_by_index)(unsigned, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*pci_info)(nvmlDevice_t, NvmlPciInfo*) = nullptr;
  nvmlReturn_t (*uuid)(nvmlDevice_t, char*, unsigned) = nullptr;
  nvmlReturn_t (*name)(nvmlDevice_t, char*, unsigned) = nullptr;
  nvmlReturn_t (*cuda_cc)(nvmlDevice_t, int*, int*) = nullptr;
  nvmlReturn_t (*link_state)(nvmlDevice_t, unsigned, int*) = nullptr;
  nvmlReturn_t (*link_capability)(nvmlDevice_t, unsigned, int, unsigned*) = nullptr;
  nvmlReturn_t (*link_version)(nvmlDevice_t, unsigned, unsigned*) = nullptr;
  nvmlReturn_t (*link_remote_pci)(nvmlDevice_t, unsigned, NvmlPciInfo*) = nullptr;
  nvmlReturn_t (*link_remote_type)(nvmlDevice_t, unsigned, int*) = nullptr;
  nvmlReturn_t (*p2p_status)(nvmlDevice_t, nvmlDevice_t, int, int*) = nullptr;
  nvmlReturn_t (*common_ancestor)(nvmlDevice_t, nvmlDevice_t, int*) = nullptr;
  nvmlReturn_t (*cpu_affinity_scope)(nvmlDevice_t, unsigned, unsigned long*, unsigned) = nullptr;
  nvmlReturn_t (*cpu_affinity)(nvmlDevice_t, unsigned, unsigned long*) = nullptr;
  nvmlReturn_t (*memory_affinity)(nvmlDevice_t, unsigned, unsigned long*, unsigned) = nullptr;
  nvmlReturn_t (*fabric_info)(nvmlDevice_t, NvmlFabricInfoV2*) = nullptr;
};

std::mutex& nvml_mutex() {
  // NVML has had thread-safety bugs (docs/topology.md §4.2): one lock around every call we make.
  static std::mutex m;
  return m;
}

class Library {
 public:
  explicit Library(const std::string& path) {
    dlerror();
    m_handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!m_handle) {
      const char* e = dlerror();
      m_error = e ? e : "dlopen failed";
    }
  }
  ~Library() {
    if (m_handle) dlclose(m_handle);
  }
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;
  bool ok() const { return m_handle != nullptr; }
  const std::string& error() const { return m_error; }
  template <class F>
  bool resolve(F& fn, const char* symbol) const {
    void* p = dlsym(m_handle, symbol);
    std::memcpy(&fn, &p, sizeof p);  // object pointer -> function pointer, as POSIX allows
    return p != nullptr;
  }

 private:
  void* m_handle = nullptr;
  std::string m_error;
};

std::string c_string(const char* buf, std::size_t cap) {
  std::size_t len = 0;
  while (len < cap && buf[len] != '\0') ++len;
  return std::string(buf, len);
}

std::string mask_to_list(const unsigned long* words, unsigned nwords) {
  std::string out;
  const unsigned bits = static_cast<unsigned>(sizeof(unsigned long) * 8);
  int start = -1;
  const int total = static_cast<int>(nwords * bits);
  for (int b = 0; b <= total; ++b) {
    const bool set = b < total && ((words[b / bits] >> (b % bits)) & 1ul);
    if (set && start < 0) start = b;
    if (!set && start >= 0) {
      if (!out.empty()) out += ",";
      out += std::to_string(start);
      if (b - 1 > start) out += "-" + std::to_string(b - 1);
      start = -1;
    }
  }
  return out;
}

std::vector<int> mask_to_ints(const unsigned long* words, unsigned nwords) {
  std::vector<int> out;
  const unsigned bits = static_cast<unsigned>(sizeof(unsigned long) * 8);
  for (unsigned b = 0; b < nwords * bits; ++b)
    if ((words[b / bits] >> (b % bits)) & 1ul) out.push_back(static_cast<int>(b));
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) return {};
  std::stringstream ss;
  ss << f.rdbuf();
  std::string s = ss.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

NvmlSnapshot read_nvml(const std::string& library, bool query_p2p, bool query_fabric) {
  NvmlSnapshot snap;
  std::lock_guard<std::mutex> lock(nvml_mutex());
  Library lib(library);
  if (!lib.ok()) {
    snap.status = "cannot load " + library + ": " + lib.error();
    return snap;
  }
  Api api;
  const char* missing = nullptr;
  auto need = [&](auto& fn, const char* sym) {
    if (!lib.resolve(fn, sym) && !missing) missing = sym;
  };
  need(api.init, "nvmlInit_v2");
  need(api.shutdown, "nvmlShutdown");
  need(api.count, "nvmlDeviceGetCount_v2");
  need(api.handle_by_index, "nvmlDeviceGetHandleByIndex_v2");
  need(api.pci_info, "nvmlDeviceGetPciInfo_v3");
  need(api.link_state, "nvmlDeviceGetNvLinkState");
  if (missing) {
    snap.status = library + " lacks the symbol " + std::string(missing);
    return snap;
  }
  lib.resolve(api.error_string, "nvmlErrorString");
  lib.resolve(api.driver_version, "nvmlSystemGetDriverVersion");
  lib.resolve(api.uuid, "nvmlDeviceGetUUID");
  lib.resolve(api.name, "nvmlDeviceGetName");
  lib.resolve(api.cuda_cc, "nvmlDeviceGetCudaComputeCapability");
  lib.resolve(api.link_capability, "nvmlDeviceGetNvLinkCapability");
  lib.resolve(api.link_version, "nvmlDeviceGetNvLinkVersion");
  lib.resolve(api.link_remote_pci, "nvmlDeviceGetNvLinkRemotePciInfo_v2");
  lib.resolve(api.link_remote_type, "nvmlDeviceGetNvLinkRemoteDeviceType");
  lib.resolve(api.p2p_status, "nvmlDeviceGetP2PStatus");
  lib.resolve(api.common_ancestor, "nvmlDeviceGetTopologyCommonAncestor");
  lib.resolve(api.cpu_affinity_scope, "nvmlDeviceGetCpuAffinityWithinScope");
  lib.resolve(api.cpu_affinity, "nvmlDeviceGetCpuAffinity");
  lib.resolve(api.memory_affinity, "nvmlDeviceGetMemoryAffinity");
  lib.resolve(api.fabric_info, "nvmlDeviceGetGpuFabricInfoV");

  auto err = [&](nvmlReturn_t r) {
    std::string s = "NVML error " + std::to_string(r);
    if (api.error_string)
      if (const char* e = api.error_string(r)) s += " (" + std::string(e) + ")";
    return s;
  };

  const nvmlReturn_t init = api.init();
  if (init != NVML_SUCCESS) {
    snap.status = "nvmlInit_v2 failed: " + err(init);
    return snap;
  }
  // From here on every exit path must call nvmlShutdown (nvmlInit is reference counted).
  struct Shutdown {
    Api& api;
    ~Shutdown() { api.shutdown(); }
  } shutdown{api};

  snap.available = true;
  snap.status = "ok";
  if (api.driver_version) {
    char buf[kDriverBufferSize] = {0};
    if (api.driver_version(buf, kDriverBufferSize) == NVML_SUCCESS) snap.driver_version = c_string(buf, sizeof buf);
  }
  unsigned count = 0;
  if (const nvmlReturn_t r = api.count(&count); r != NVML_SUCCESS) {
    snap.warnings.push_back("nvmlDeviceGetCount_v2 failed: " + err(r) + "; no GPUs from NVML");
    count = 0;
  }
  std::vector<nvmlDevice_t> handles;
  for (unsigned k = 0; k < count; ++k) {
    nvmlDevice_t dev = nullptr;
    if (const nvmlReturn_t r = api.handle_by_index(k, &dev); r != NVML_SUCCESS) {
      snap.warnings.push_back("NVML device " + std::to_string(k) + ": no handle (" + err(r) + "); skipped");
      continue;
    }
    NvmlGpu g;
    g.nvml_index = static_cast<int>(k);
    NvmlPciInfo pci{};
    if (const nvmlReturn_t r = api.pci_info(dev, &pci); r != NVML_SUCCESS) {
      snap.warnings.push_back("NVML device " + std::to_string(k) + ": no PCI info (" + err(r) + "); skipped");
      continue;
    }
    g.bus_id = c_string(pci.busId, sizeof pci.busId);
    g.pci = PciAddress::parse(g.bus_id);
    if (!g.pci) {
      PciAddress a;  // fall back to the numeric fields
      a.domain = pci.domain;
      a.bus = static_cast<std::uint8_t>(pci.bus);
      a.device = static_cast<std::uint8_t>(pci.device);
      if (pci.bus <= 0xff && pci.device <= 0x1f) g.pci = a;
    }
    g.device_id = static_cast<std::uint16_t>(pci.pciDeviceId >> 16);
    char buf[kDeviceBufferSize];
    if (api.uuid) {
      std::memset(buf, 0, sizeof buf);
      if (api.uuid(dev, buf, kDeviceBufferSize) == NVML_SUCCESS) g.uuid = c_string(buf, sizeof buf);
    }
    if (api.name) {
      std::memset(buf, 0, sizeof buf);
      if (api.name(dev, buf, kDeviceBufferSize) == NVML_SUCCESS) g.name = c_string(buf, sizeof buf);
    }
    if (api.cuda_cc) {
      int major = 0, minor = 0;
      if (api.cuda_cc(dev, &major, &minor) == NVML_SUCCESS && major >= 0 && minor >= 0 && minor < 10)
        g.compute_capability = major * 10 + minor;
    }
    // Links: stop at the first non-SUCCESS. Past the end NVML answers INVALID_ARGUMENT (index 18 on H200), and
    // newer headers' maxima are not what older or newer GPUs have.
    for (unsigned l = 0; l < kMaxLinkIndex; ++l) {
      int state = 0;
      const nvmlReturn_t r = api.link_state(dev, l, &state);
      if (r != NVML_SUCCESS) {
        g.link_stop_code = r;
        break;
      }
      NvmlLink link;
      link.index = l;
      link.active = state == NVML_FEATURE_ENABLED;
      if (link.active) {
        unsigned cap = 1;
        link.p2p_capable = true;
        if (api.link_capability && api.link_capability(dev, l, NVML_NVLINK_CAP_P2P_SUPPORTED, &cap) == NVML_SUCCESS)
          link.p2p_capable = cap != 0;
        unsigned v = 0;
        if (api.link_version && api.link_version(dev, l, &v) == NVML_SUCCESS) link.version = v;
        if (api.link_remote_pci) {
          NvmlPciInfo rp{};
          if (api.link_remote_pci(dev, l, &rp) == NVML_SUCCESS) {
            link.remote_ok = true;
            link.remote_domain = rp.domain;
            link.remote_bus_id = c_string(rp.busId, sizeof rp.busId);
          }
        }
        int type = 0;
        if (api.link_remote_type && api.link_remote_type(dev, l, &type) == NVML_SUCCESS) link.remote_type = type;
      }
      g.links.push_back(link);
    }
    // Locality fallback (the live hwloc result is preferred, see topology_from_live).
    unsigned long words[kAffinityWords];
    std::memset(words, 0, sizeof words);
    bool have_cpus = api.cpu_affinity_scope &&
                     api.cpu_affinity_scope(dev, kAffinityWords, words, NVML_AFFINITY_SCOPE_NODE) == NVML_SUCCESS;
    if (!have_cpus && api.cpu_affinity) {
      std::memset(words, 0, sizeof words);
      have_cpus = api.cpu_affinity(dev, kAffinityWords, words) == NVML_SUCCESS;
    }
    if (have_cpus) g.cpuset = mask_to_list(words, kAffinityWords);
    std::memset(words, 0, sizeof words);
    if (api.memory_affinity &&
        api.memory_affinity(dev, kAffinityWords, words, NVML_AFFINITY_SCOPE_NODE) == NVML_SUCCESS)
      g.numa_nodes = mask_to_ints(words, kAffinityWords);
    if (g.pci && g.pci->domain <= 0xffff && (g.cpuset.empty() || g.numa_nodes.empty())) {
      const std::string dir = "/sys/bus/pci/devices/" + g.pci->str() + "/";  // sysfs spells 4-digit domains
      if (g.cpuset.empty()) g.cpuset = read_file(dir + "local_cpulist");
      if (g.numa_nodes.empty()) {
        const std::string node = read_file(dir + "numa_node");
        if (!node.empty() && node.size() < 6 && node.find_first_not_of("0123456789") == std::string::npos)
          g.numa_nodes.push_back(std::stoi(node));  // -1 (common in VMs) means unknown
      }
    }
    if (query_fabric && api.fabric_info) {
      NvmlFabricInfoV2 fi{};
      fi.version = static_cast<unsigned>(sizeof(NvmlFabricInfoV2)) | (2u << 24);
      if (api.fabric_info(dev, &fi) == NVML_SUCCESS && fi.state == NVML_GPU_FABRIC_STATE_COMPLETED &&
          fi.status == NVML_SUCCESS) {
        FabricIdentity f;
        std::copy(std::begin(fi.clusterUuid), std::end(fi.clusterUuid), f.cluster_uuid.begin());
        f.clique_id = fi.cliqueId;
        const bool nonzero = std::any_of(f.cluster_uuid.begin(), f.cluster_uuid.end(), [](auto b) { return b != 0; });
        if (nonzero) g.fabric = f;
      }
    }
    handles.push_back(dev);
    snap.gpus.push_back(std::move(g));
  }
  const std::size_t n = handles.size();
  if (query_p2p && api.p2p_status) {
    snap.p2p.assign(n * n, std::nullopt);
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = i + 1; j < n; ++j) {
        int status = -1;
        if (api.p2p_status(handles[i], handles[j], NVML_P2P_CAPS_INDEX_NVLINK, &status) == NVML_SUCCESS)
          snap.p2p[i * n + j] = snap.p2p[j * n + i] = status == NVML_P2P_STATUS_OK;
      }
  }
  if (api.common_ancestor) {
    snap.common_ancestor.assign(n * n, std::nullopt);
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = i + 1; j < n; ++j) {
        int level = -1;
        if (api.common_ancestor(handles[i], handles[j], &level) == NVML_SUCCESS)
          snap.common_ancestor[i * n + j] = snap.common_ancestor[j * n + i] = level;
      }
  }
  return snap;
}

}  // namespace KokkosMoE::Impl
