/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_TOPOLOGY_SCAN_HPP
#define KOKKOSMOE_TOPOLOGY_SCAN_HPP

// Plain-data intermediate results of the two sources (hwloc, NVML) and the pure functions that turn them into an
// NvlinkTopology. Nothing here includes hwloc or NVML headers, so the model-building rules (docs/topology.md §4.2,
// §5.2) are unit-tested and fuzzed without either library.

#include <KokkosMoE_Topology.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace KokkosMoE::Impl {

/// Names of the hwloc infos our captures write (docs/topology-notes.md). Root infos first.
namespace InfoName {
inline constexpr const char* kNvswitchHidden = "NVSwitchHidden";
inline constexpr const char* kNvlinkVersion = "NVLinkVersion";
inline constexpr const char* kPerLinkMbps = "NVLinkPerLinkMBps";
inline constexpr const char* kDriverVersion = "NVIDIADriverVersion";
inline constexpr const char* kNvmlStatus = "KokkosMoENVMLStatus";
inline constexpr const char* kCaptureTool = "KokkosMoECapture";
inline constexpr const char* kLinkRateUnknown = "KokkosMoELinkRateUnknown";  // matrix values are link counts
// On a GPU's PCIDev: hwloc saw it, the live model did not include it (not visible to NVML); loaders skip it.
inline constexpr const char* kGpuExcluded = "KokkosMoEGpuExcluded";
// per GPU (on the GPU's PCIDev object)
inline constexpr const char* kGpuModel = "GPUModel";
inline constexpr const char* kGpuUuid = "NVIDIAUUID";
inline constexpr const char* kNvmlIndex = "NVMLIndex";
inline constexpr const char* kComputeCapability = "CUDAComputeCapability";
inline constexpr const char* kLinksActive = "NVLinkActive";
inline constexpr const char* kLinksToSwitch = "NVLinkToSwitch";
inline constexpr const char* kLinksToCpu = "NVLinkToCPU";
inline constexpr const char* kLinksDirect = "NVLinkDirect";
inline constexpr const char* kFabricCluster = "NVLinkFabricClusterUUID";
inline constexpr const char* kFabricClique = "NVLinkFabricCliqueId";
}  // namespace InfoName

inline constexpr const char* kNvlinkMatrixName = "NVLinkBandwidth";
inline constexpr const char* kP2pMatrixName = "KokkosMoENVLinkP2P";

/// A GPU as hwloc sees it (a PCI device, possibly with an NVML/CUDA OS device below it).
struct ScannedGpu {
  PciAddress pci;
  std::uint16_t device_id = 0;
  std::string model;                         // GPUModel info, else the PCI device name, else empty
  std::string uuid;                          // NVIDIAUUID info, if any
  std::vector<int> numa_nodes;               // CPU-side local NUMA nodes (OS indices)
  std::string cpuset;                        // hwloc list syntax
  std::map<std::string, std::string> infos;  // infos of the PCI object and of its OS devices
  std::map<std::string, std::vector<std::string>> info_conflicts;  // names given with different values
};

/// One end of a distances-matrix row/column, resolved against the scanned objects.
struct MatrixObject {
  enum class Kind { Gpu, Switch, Cpu, Other };
  Kind kind = Kind::Other;
  int index = -1;  // GPU index / switch index / OS index of the CPU-side object
  std::string description;
};

struct ScannedMatrix {
  std::vector<MatrixObject> objects;
  std::vector<std::uint64_t> values;  // n*n row-major
  unsigned long kind = 0;
};

/// What the hwloc side of detection found (live tree or XML fixture).
struct HostScan {
  std::vector<ScannedGpu> gpus;        // sorted by PCI address
  std::vector<PciAddress> nvswitches;  // visible NVSwitch PCI functions, sorted
  std::vector<PcieLevel> pcie;         // n*n over gpus
  std::map<std::string, std::string> root_infos;
  std::map<std::string, std::vector<std::string>> root_info_conflicts;  // names given with different values
  std::string hwloc_version;
  std::string hostname;
  std::optional<ScannedMatrix> nvlink_matrix;
  std::optional<ScannedMatrix> p2p_matrix;
  std::vector<std::string> warnings;

  std::optional<int> find_gpu(const PciAddress& pci) const;
  bool is_nvswitch(const PciAddress& pci) const;
};

/// One NVLink of a GPU as NVML reports it.
struct NvmlLink {
  unsigned index = 0;
  bool active = false;
  bool p2p_capable = false;  // nvmlDeviceGetNvLinkCapability(P2P_SUPPORTED); true if the query is unavailable
  unsigned version = 0;      // 0 = query failed
  bool remote_ok = false;    // nvmlDeviceGetNvLinkRemotePciInfo_v2 succeeded
  std::uint32_t remote_domain = 0;
  std::string remote_bus_id;       // busId as NVML printed it (may be the sentinel or garbage)
  std::optional<int> remote_type;  // GPU 0, IBMNPU 1, SWITCH 2, UNKNOWN 255
};

struct NvmlGpu {
  int nvml_index = 0;
  std::string bus_id;  // NVML's busId string
  std::optional<PciAddress> pci;
  std::uint16_t device_id = 0;
  std::string uuid, name;
  std::optional<int> compute_capability;
  std::vector<NvmlLink> links;
  int link_stop_code = 0;       // the NVML return code that ended the link loop
  std::string cpuset;           // NVML CPU affinity (list syntax), empty = unknown
  std::vector<int> numa_nodes;  // NVML memory affinity / NUMA id / sysfs, empty = unknown
  std::optional<FabricIdentity> fabric;
};

/// What NVML reported (live), in plain data.
struct NvmlSnapshot {
  bool available = false;
  std::string status;  // why NVML is unavailable, or "ok"
  std::string driver_version;
  std::vector<NvmlGpu> gpus;                        // NVML (physical) order
  std::vector<std::optional<bool>> p2p;             // n*n over gpus (NVML order): P2P status over NVLink == OK
  std::vector<std::optional<int>> common_ancestor;  // n*n, NVML topology levels
  std::vector<std::string> warnings;
};

/// Per-GPU, per-visible-switch link counts computed by topology_from_live (needed to write a capture matrix).
using SwitchLinkTable = std::vector<std::map<PciAddress, int>>;

/// Per-link rate in MB/s for an NVML NVLink version enum (docs/topology.md §4.2 step 4); 0 for unknown values.
std::uint64_t nvlink_rate_mbps(int version_enum);
/// Per-link rate for a GPU model name (P100 20000; V100/A100/H100/H200 25000; B200/GB200 50000); 0 = unknown.
std::uint64_t nvlink_rate_for_model(const std::string& model);
/// NVLink version enum implied by a model name (0 = unknown).
int nvlink_version_for_model(const std::string& model);
/// True for NVML's hidden-switch sentinel spellings ("FFFFFFFF:FF:FF.0", "fffffff:ff:ff.0"), empty or
/// non-printable bus ids.
bool is_nvml_sentinel(std::uint32_t domain, const std::string& bus_id);

/// Builds the model from an XML fixture scan (docs/topology.md §5.2).
NvlinkTopology topology_from_scan(const HostScan& scan);
/// Builds the model from a live hwloc scan plus an NVML snapshot (docs/topology.md §4).
NvlinkTopology topology_from_live(const HostScan& scan, const NvmlSnapshot& nvml, SwitchLinkTable* switch_links);
/// Live detection without NVML: GPUs from hwloc's PCI devices, NVLinks unknown, a warning that says why.
NvlinkTopology topology_from_hwloc_only(const HostScan& scan, const std::string& reason);
/// `in` with every byte that is not part of valid UTF-8 replaced by '?'.
std::string valid_utf8(const std::string& in);
/// Makes every string valid UTF-8, fills ids, the canonical diagonal, islands and cliques; de-duplicates warnings.
void finalize_topology(NvlinkTopology& topo);

}  // namespace KokkosMoE::Impl

#endif
