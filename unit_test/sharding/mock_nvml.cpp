/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// A stand-in for libnvidia-ml.so.1, loaded by the topology detector through DetectOptions::nvml_library, so that the
// dlopen path (symbol resolution, link loop, classification, capture) is tested on machines without GPUs.
// The machine it pretends to be is chosen per nvmlInit_v2 call by KOKKOSMOE_MOCK_NVML_SCENARIO:
//   h200_vm, h200_1gpu, hgx, mesh, container, partition, unknown_version, fabric, weird_peer, asym_direct,
//   no_devices, init_fails.
// Built twice: full, and with KOKKOSMOE_MOCK_NVML_MINIMAL (only the symbols the detector requires).
// It models NVML's documented behaviour (docs/topology.md §4.2, §8), e.g. INVALID_ARGUMENT past the last link.

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr int kSuccess = 0, kUninitialized = 1, kInvalidArgument = 2, kNotSupported = 3, kDriverNotLoaded = 9;

struct PciInfo {
  char busIdLegacy[16];
  unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
};

struct Link {
  std::string remote;  // busId NVML would print
  unsigned remote_domain = 0;
  int type = 2;  // GPU 0, IBMNPU 1, SWITCH 2, UNKNOWN 255
  bool remote_ok = true;
  unsigned version = 6;
  bool active = true;
};

struct Gpu {
  std::string bus_id;  // "00000000:00:06.0"
  unsigned domain = 0, bus = 0, device = 0;
  unsigned device_id = 0x2335;
  std::string uuid, name = "NVIDIA H200";
  int cc_major = 9, cc_minor = 0;
  std::vector<Link> links;
  std::vector<int> cpus;  // empty: affinity query NOT_SUPPORTED
  std::vector<int> nodes;
  bool fabric = false;
  unsigned char cluster[16] = {0};
  unsigned clique = 0;
};

struct Machine {
  int init_ret = kSuccess;
  std::string driver = "580.159.04";
  std::vector<Gpu> gpus;
  std::vector<std::vector<int>> p2p;  // status per pair (0 = OK); empty = OK everywhere
  int ancestor = 30;
};

Machine g_machine;
int g_init_refs = 0;

std::string bus_string(unsigned domain, unsigned bus, unsigned dev) {
  char b[40];
  std::snprintf(b, sizeof b, "%08X:%02X:%02X.0", domain, bus, dev);
  return b;
}

Gpu make_gpu(unsigned bus, unsigned dev, int k, const char* name, unsigned device_id) {
  Gpu g;
  g.bus = bus;
  g.device = dev;
  g.bus_id = bus_string(0, bus, dev);
  char u[64];
  std::snprintf(u, sizeof u, "GPU-6d6f636b-0000-4000-8000-%012x", 0xa00 + k);
  g.uuid = u;
  g.name = name;
  g.device_id = device_id;
  return g;
}

Link sentinel_link(unsigned version = 6) {
  Link l;
  l.remote = "FFFFFFFF:FF:FF.0";
  l.remote_domain = 0xFFFFFFFFu;
  l.type = 2;
  l.version = version;
  return l;
}

Link peer_link(const Gpu& peer, int type, unsigned version) {
  Link l;
  l.remote = peer.bus_id;
  l.type = type;
  l.version = version;
  return l;
}

void h200(Machine& m, int n, unsigned version) {
  for (int k = 0; k < n; ++k) {
    Gpu g = make_gpu(0, 6 + static_cast<unsigned>(k), k, "NVIDIA H200", 0x2335);
    for (int l = 0; l < 18; ++l) g.links.push_back(sentinel_link(version));
    for (int c = 0; c < 32; ++c) g.cpus.push_back(c);
    m.gpus.push_back(g);
  }
}

void load(const std::string& s) {
  Machine m;
  if (s == "h200_vm" || s.empty()) {
    h200(m, 2, 6);
  } else if (s == "h200_1gpu") {
    h200(m, 1, 6);
  } else if (s == "unknown_version") {
    h200(m, 2, 42);
  } else if (s == "fabric") {
    h200(m, 1, 6);
    for (int b = 0; b < 16; ++b) m.gpus[0].cluster[b] = static_cast<unsigned char>(0x10 + b);
    m.gpus[0].clique = 7;
    m.gpus[0].fabric = true;
  } else if (s == "hgx") {
    // Bus numbers of unit_test/fixtures/hgx_h100_8gpu_4sw.xml; links 5/5/4/4 to the switches e1..e4.
    const unsigned buses[8] = {0x1b, 0x1f, 0x5b, 0x5f, 0x9b, 0x9f, 0xdb, 0xdf};
    const int per_switch[4] = {5, 5, 4, 4};
    for (int k = 0; k < 8; ++k) {
      Gpu g = make_gpu(buses[k], 0, k, "NVIDIA H100 80GB HBM3", 0x2330);
      g.cc_minor = 0;
      for (int s2 = 0; s2 < 4; ++s2)
        for (int l = 0; l < per_switch[s2]; ++l) {
          Link link;
          link.remote = bus_string(0, 0xe1 + static_cast<unsigned>(s2), 0);
          link.type = 2;
          g.links.push_back(link);
        }
      m.gpus.push_back(g);
    }
    m.ancestor = 50;
  } else if (s == "mesh") {
    // unit_test/fixtures/dgx1_like_mesh_8gpu.xml; each pair's links as in the generator's DGX1_LINKS.
    const unsigned buses[8] = {0x06, 0x07, 0x46, 0x47, 0x86, 0x87, 0xc6, 0xc7};
    const int links[][3] = {{0, 1, 1}, {0, 2, 1}, {0, 3, 2}, {0, 4, 2}, {1, 2, 2}, {1, 3, 1}, {1, 5, 2}, {2, 3, 2},
                            {2, 6, 1}, {3, 7, 1}, {4, 5, 1}, {4, 6, 1}, {4, 7, 2}, {5, 6, 2}, {5, 7, 1}, {6, 7, 2}};
    for (int k = 0; k < 8; ++k) {
      Gpu g = make_gpu(buses[k], 0, k, "Tesla V100-SXM2-16GB", 0x1db1);
      g.cc_major = 7;
      m.gpus.push_back(g);
    }
    for (const auto& e : links)
      for (int c = 0; c < e[2]; ++c) {
        m.gpus[e[0]].links.push_back(peer_link(m.gpus[e[1]], 0, 2));
        m.gpus[e[1]].links.push_back(peer_link(m.gpus[e[0]], 0, 2));
      }
    // An inactive link on GPU0 (counted nowhere) before the end of its links.
    Link off;
    off.active = false;
    m.gpus[0].links.push_back(off);
  } else if (s == "container") {
    h200(m, 2, 6);
    for (auto& g : m.gpus) g.links.clear();
    for (int l = 0; l < 2; ++l) {
      m.gpus[0].links.push_back(peer_link(m.gpus[1], 0, 6));
      m.gpus[1].links.push_back(peer_link(m.gpus[0], 0, 6));
    }
    Gpu hidden = make_gpu(0x99, 0, 9, "NVIDIA H200", 0x2335);  // a GPU the container does not show
    for (int l = 0; l < 4; ++l) m.gpus[0].links.push_back(peer_link(hidden, 0, 6));
  } else if (s == "partition") {
    h200(m, 4, 6);
    m.p2p.assign(4, std::vector<int>(4, 0));
    for (int a = 0; a < 4; ++a)
      for (int b = 0; b < 4; ++b)
        if (a / 2 != b / 2) m.p2p[a][b] = 4;  // NVML_P2P_STATUS_NOT_SUPPORTED
  } else if (s == "weird_peer") {
    h200(m, 1, 6);
    m.gpus[0].links.resize(2);
    m.gpus[0].links[0].remote = "garbage";
    m.gpus[0].links[0].remote_domain = 0;
    m.gpus[0].links[0].type = 255;
    m.gpus[0].links[1].remote_ok = false;
  } else if (s == "asym_direct") {
    h200(m, 2, 6);
    for (auto& g : m.gpus) g.links.clear();
    m.gpus[0].links = {peer_link(m.gpus[1], 0, 6), peer_link(m.gpus[1], 0, 6)};
    m.gpus[1].links = {peer_link(m.gpus[0], 0, 6)};
  } else if (s == "no_devices") {
  } else if (s == "init_fails") {
    m.init_ret = kDriverNotLoaded;
  } else {
    m.init_ret = 999;  // unknown scenario: make it visible
  }
  g_machine = m;
}

Gpu* dev(void* h) { return static_cast<Gpu*>(h); }
int index_of(void* h) { return static_cast<int>(dev(h) - g_machine.gpus.data()); }

void fill_pci(PciInfo* p, const std::string& bus_id, unsigned domain, unsigned bus, unsigned device,
              unsigned device_id) {
  std::memset(p, 0, sizeof *p);
  std::snprintf(p->busId, sizeof p->busId, "%s", bus_id.c_str());
  std::snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "%s", bus_id.c_str() + (bus_id.size() > 12 ? 4 : 0));
  p->domain = domain;
  p->bus = bus;
  p->device = device;
  p->pciDeviceId = (device_id << 16) | 0x10de;
}

int write_mask(const std::vector<int>& bits, unsigned size, unsigned long* out) {
  if (bits.empty()) return kNotSupported;
  std::memset(out, 0, size * sizeof(unsigned long));
  for (int b : bits) out[b / 64] |= 1ul << (b % 64);
  return kSuccess;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int nvmlInit_v2() {
  const char* s = std::getenv("KOKKOSMOE_MOCK_NVML_SCENARIO");
  load(s ? s : "");
  if (g_machine.init_ret == kSuccess) ++g_init_refs;
  return g_machine.init_ret;
}
__attribute__((visibility("default"))) int nvmlShutdown() {
  if (g_init_refs == 0) return kUninitialized;
  --g_init_refs;
  return kSuccess;
}
// For the tests: NVML must be shut down as often as it was initialized.
__attribute__((visibility("default"))) int kokkosmoe_mock_nvml_refs() { return g_init_refs; }

__attribute__((visibility("default"))) int nvmlDeviceGetCount_v2(unsigned* n) {
  *n = static_cast<unsigned>(g_machine.gpus.size());
  return kSuccess;
}
__attribute__((visibility("default"))) int nvmlDeviceGetHandleByIndex_v2(unsigned i, void** h) {
  if (i >= g_machine.gpus.size()) return kInvalidArgument;
  *h = &g_machine.gpus[i];
  return kSuccess;
}
__attribute__((visibility("default"))) int nvmlDeviceGetPciInfo_v3(void* h, PciInfo* p) {
  const Gpu* g = dev(h);
  fill_pci(p, g->bus_id, g->domain, g->bus, g->device, g->device_id);
  return kSuccess;
}
__attribute__((visibility("default"))) int nvmlDeviceGetNvLinkState(void* h, unsigned l, int* state) {
  const Gpu* g = dev(h);
  if (l >= g->links.size()) return kInvalidArgument;  // as H200 does at index 18
  *state = g->links[l].active ? 1 : 0;
  return kSuccess;
}

#ifndef KOKKOSMOE_MOCK_NVML_MINIMAL
__attribute__((visibility("default"))) const char* nvmlErrorString(int r) {
  return r == kDriverNotLoaded ? "Driver Not Loaded" : "Mock Error";
}
__attribute__((visibility("default"))) int nvmlSystemGetDriverVersion(char* buf, unsigned len) {
  std::snprintf(buf, len, "%s", g_machine.driver.c_str());
  return kSuccess;
}
__attribute__((visibility("default"))) int nvmlDeviceGetUUID(void* h, char* buf, unsigned len) {
  std::snprintf(buf, len, "%s", dev(h)->uuid.c_str());
  return kSuccess;
}
__attribute__((visibility("default"))) int nvmlDeviceGetName(void* h, char* buf, unsigned len) {
  std::snprintf(buf, len, "%s", dev(h)->name.c_str());
  return kSuccess;
}
__attribute__((visibility("default"))) int nvmlDeviceGetCudaComputeCapability(void* h, int* major, int* minor) {
  *major = dev(h)->cc_major;
  *minor = dev(h)->cc_minor;
  return kSuccess;
}
__attribute__((visibility("default"))) int nvmlDeviceGetNvLinkCapability(void* h, unsigned l, int cap, unsigned* v) {
  if (l >= dev(h)->links.size()) return kInvalidArgument;
  *v = cap == 0 ? 1u : 0u;
  return kSuccess;
}
__attribute__((visibility("default"))) int nvmlDeviceGetNvLinkVersion(void* h, unsigned l, unsigned* v) {
  if (l >= dev(h)->links.size()) return kInvalidArgument;
  *v = dev(h)->links[l].version;
  return kSuccess;
}
__attribute__((visibility("default"))) int nvmlDeviceGetNvLinkRemotePciInfo_v2(void* h, unsigned l, PciInfo* p) {
  if (l >= dev(h)->links.size()) return kInvalidArgument;
  const Link& k = dev(h)->links[l];
  if (!k.remote_ok) return kNotSupported;
  fill_pci(p, k.remote, k.remote_domain, 0xff, 0xff, 0xffff);
  return kSuccess;
}
__attribute__((visibility("default"))) int nvmlDeviceGetNvLinkRemoteDeviceType(void* h, unsigned l, int* t) {
  if (l >= dev(h)->links.size()) return kInvalidArgument;
  *t = dev(h)->links[l].type;
  return kSuccess;
}
__attribute__((visibility("default"))) int nvmlDeviceGetP2PStatus(void* a, void* b, int index, int* status) {
  if (index != 2) return kInvalidArgument;
  if (!g_machine.p2p.empty()) {
    *status = g_machine.p2p[index_of(a)][index_of(b)];
    return kSuccess;
  }
  // As NVML answers: OK when the GPUs share a direct link or both reach the switch fabric, else NOT_SUPPORTED.
  auto has_switch = [](const Gpu* g) {
    for (const auto& l : g->links)
      if (l.active && l.type == 2) return true;
    return false;
  };
  bool direct = false;
  for (const auto& l : dev(a)->links) direct = direct || (l.active && l.type == 0 && l.remote == dev(b)->bus_id);
  *status = (direct || (has_switch(dev(a)) && has_switch(dev(b)))) ? 0 : 4;
  return kSuccess;
}
__attribute__((visibility("default"))) int nvmlDeviceGetTopologyCommonAncestor(void*, void*, int* level) {
  *level = g_machine.ancestor;
  return kSuccess;
}
__attribute__((visibility("default"))) int nvmlDeviceGetCpuAffinityWithinScope(void* h, unsigned n, unsigned long* s,
                                                                               unsigned) {
  return write_mask(dev(h)->cpus, n, s);
}
__attribute__((visibility("default"))) int nvmlDeviceGetMemoryAffinity(void* h, unsigned n, unsigned long* s,
                                                                       unsigned) {
  return write_mask(dev(h)->nodes, n, s);
}
struct FabricV2 {
  unsigned version;
  unsigned char clusterUuid[16];
  int status;
  unsigned cliqueId;
  unsigned char state;
  unsigned healthMask;
};
__attribute__((visibility("default"))) int nvmlDeviceGetGpuFabricInfoV(void* h, FabricV2* f) {
  if (f->version != (sizeof(FabricV2) | (2u << 24))) return 25;  // NVML_ERROR_ARGUMENT_VERSION_MISMATCH
  const Gpu* g = dev(h);
  f->state = 3;  // COMPLETED; a zero cluster UUID means "no multi-node NVLink" (the 2xH200 VM answers so)
  f->status = kSuccess;
  std::memcpy(f->clusterUuid, g->cluster, 16);
  f->cliqueId = g->clique;
  return kSuccess;
}
#endif

}  // extern "C"
