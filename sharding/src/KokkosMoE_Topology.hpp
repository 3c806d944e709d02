/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_TOPOLOGY_HPP
#define KOKKOSMOE_TOPOLOGY_HPP

/// \file KokkosMoE_Topology.hpp
/// \brief The NVLink topology of one host: data model, detection (hwloc + NVML loaded at run time), hwloc XML
/// fixtures, JSON and the `nvidia-smi topo -m`-style report (contract: docs/topology.md).
///
/// Nothing here depends on Kokkos, hwloc, NVML or CUDA headers; the library links libhwloc only and opens
/// `libnvidia-ml.so.1` with dlopen when live detection asks for it.

#include <KokkosMoE_Error.hpp>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace KokkosMoE {

/// \brief A PCI address (domain:bus:device.function): the key of a GPU everywhere in the library.
struct PciAddress {
  std::uint32_t domain = 0;
  std::uint8_t bus = 0;
  std::uint8_t device = 0;
  std::uint8_t function = 0;

  /// \brief Canonical form with a 4-digit domain and lower-case hex, e.g. "0000:18:00.0" (8 digits when the
  /// domain does not fit in 4).
  std::string str() const;
  /// \brief Parses "dddd:bb:dd.f" with a 4- or 8-digit domain (NVML's "00000000:18:00.0"), any case, or
  /// "bb:dd.f" (domain 0). Returns std::nullopt for anything else (including NVML's hidden-switch sentinel
  /// "FFFFFFFF:FF:FF.0", which is a valid syntax: callers test is_nvml_sentinel() first).
  static std::optional<PciAddress> parse(std::string_view text);
  bool operator==(const PciAddress& o) const {
    return domain == o.domain && bus == o.bus && device == o.device && function == o.function;
  }
  bool operator!=(const PciAddress& o) const { return !(*this == o); }
  /// \brief Orders by (domain, bus, device, function); GPU ids follow this order.
  bool operator<(const PciAddress& o) const;
};

/// \brief PCIe path between two GPUs; the values are NVML's common-ancestor levels (docs/topology.md §4.1, §7).
enum class PcieLevel : std::uint8_t {
  Internal = 0,  ///< same board
  Pix = 10,      ///< at most one PCIe switch
  Pxb = 20,      ///< several PCIe switches, no host bridge
  Phb = 30,      ///< through a PCIe host bridge
  Node = 40,     ///< between host bridges inside one NUMA node / package
  Sys = 50,      ///< across NUMA nodes (SMP interconnect)
  Unknown = 255
};

/// \brief "PIX", "PXB", "PHB", "NODE", "SYS", "INT" or "N/A" (the `nvidia-smi topo -m` tokens).
const char* to_string(PcieLevel level) noexcept;
/// \brief Inverse of to_string(PcieLevel); std::nullopt for an unknown token.
std::optional<PcieLevel> pcie_level_from_string(std::string_view token);

/// \brief Multi-node NVLink identity (NVML fabric info, state COMPLETED, non-zero cluster UUID).
struct FabricIdentity {
  std::array<std::uint8_t, 16> cluster_uuid{};
  std::uint32_t clique_id = 0;
  bool operator==(const FabricIdentity& o) const { return cluster_uuid == o.cluster_uuid && clique_id == o.clique_id; }
  bool operator!=(const FabricIdentity& o) const { return !(*this == o); }
};

/// \brief One GPU of the host.
struct GpuInfo {
  int id = 0;                             ///< dense 0..n-1, ordered by PCI address
  PciAddress pci;                         ///< the key (see docs/topology.md §2: never key by index)
  std::uint16_t pci_device_id = 0;        ///< PCI device id (e.g. 0x2335), 0 = unknown
  std::string uuid;                       ///< "GPU-...", empty = unknown
  std::string model;                      ///< "NVIDIA H200", empty = unknown
  std::optional<int> nvml_index;          ///< physical NVML index (not CUDA order)
  std::optional<int> compute_capability;  ///< major*10 + minor
  int nvlink_version = 0;                 ///< NVML enum (6 = NVLink 4.0, 7 = 5.0), 0 = unknown
  std::uint64_t link_mbps = 0;            ///< per-link, per-direction rate claimed by the source (MB/s), 0 = unknown
  int active_links = 0;                   ///< all active NVLinks
  int links_to_switch = 0;                ///< links whose peer is an NVSwitch, visible or hidden
  int links_to_cpu = 0;                   ///< NVLink-to-CPU links (POWER-style)
  std::vector<int> numa_nodes;            ///< OS indices of the CPU-side local NUMA nodes; empty = unknown
  std::string cpuset;                     ///< local CPUs in hwloc list syntax ("0-31"); empty = unknown
  std::optional<FabricIdentity> fabric;   ///< multi-node NVLink identity, if any

  bool operator==(const GpuInfo& o) const;
  bool operator!=(const GpuInfo& o) const { return !(*this == o); }
};

/// \brief What connects two GPUs. Stored n*n, symmetric; the diagonal is unused.
struct GpuPair {
  std::uint16_t direct_links = 0;  ///< dedicated GPU-to-GPU NVLinks
  std::uint16_t switch_links = 0;  ///< min(links_to_switch) of both GPUs when both are on the fabric
  std::uint64_t nvlink_mbps = 0;   ///< per-direction NVLink bandwidth as claimed by the source (MB/s)
  bool nvlink_p2p = false;         ///< NVML P2P status over NVLink, else derived: direct || switch
  PcieLevel pcie = PcieLevel::Unknown;

  /// \brief direct_links + switch_links: the `NV#` of `nvidia-smi topo -m`.
  int nvlink_count() const { return int(direct_links) + int(switch_links); }
  bool operator==(const GpuPair& o) const {
    return direct_links == o.direct_links && switch_links == o.switch_links && nvlink_mbps == o.nvlink_mbps &&
           nvlink_p2p == o.nvlink_p2p && pcie == o.pcie;
  }
  bool operator!=(const GpuPair& o) const { return !(*this == o); }
};

/// \brief The GPUs of one host and how they are connected (docs/topology.md §2).
struct NvlinkTopology {
  enum class Source { HwlocXml, Live, NcclXml, None };

  std::vector<GpuInfo> gpus;              ///< ordered by PCI address; gpus[i].id == i
  std::vector<GpuPair> pairs;             ///< n*n, row-major, symmetric; diagonal unused
  int nvswitch_visible = 0;               ///< NVSwitch PCI functions seen
  bool nvswitch_hidden = false;           ///< switch links whose peer is the sentinel or not on PCI
  bool nvlink_known = false;              ///< false when no source could enumerate NVLinks (no NVML, no matrix)
  std::vector<std::vector<int>> islands;  ///< connected components of the NVLink graph (singletons included)
  std::vector<std::vector<int>> cliques;  ///< maximal sets with nvlink_p2p on every pair
  Source source = Source::None;
  std::string hwloc_version;          ///< hwloc library version that produced/read the topology
  std::string driver_version;         ///< NVIDIA driver version (live, or captured), empty = unknown
  std::string hostname;               ///< host name recorded by hwloc, empty = unknown
  std::vector<std::string> warnings;  ///< what could not be determined, e.g. "NVSwitch hidden: fabric assumed"

  int num_gpus() const { return static_cast<int>(gpus.size()); }
  /// \brief The pair (i, j), i != j allowed in any order.
  /// \throws KokkosMoE::InvalidArgument (Rule::GpuIndexRange) if i or j is outside [0, num_gpus()).
  const GpuPair& pair(int i, int j) const;
  GpuPair& pair(int i, int j);
  /// \brief The id of the GPU with this PCI address, if present (map a CUDA device's bus id to a GPU).
  std::optional<int> find_gpu(const PciAddress& pci) const;
  /// \brief The id of the GPU with this UUID ("GPU-..."), if present.
  std::optional<int> find_gpu_by_uuid(std::string_view uuid) const;

  /// \brief Compares everything, including warnings and the derived islands/cliques.
  bool operator==(const NvlinkTopology& o) const;
  bool operator!=(const NvlinkTopology& o) const { return !(*this == o); }
};

/// \brief "hwloc-xml", "live", "nccl-xml" or "none".
const char* to_string(NvlinkTopology::Source source) noexcept;

/// \brief Where detect_topology() takes the topology from.
struct DetectOptions {
  std::optional<std::string> xml_path;    ///< explicit fixture file (hwloc v2 XML)
  std::optional<std::string> xml_buffer;  ///< explicit fixture text (hwloc v2 XML)
  bool honor_env = true;                  ///< KOKKOSMOE_TOPO_XML, then HWLOC_XMLFILE, name a fixture file
  bool allow_nvml = true;                 ///< live: enumerate NVLinks through NVML (dlopen)
  std::string nvml_library = "libnvidia-ml.so.1";
  bool query_p2p_status = true;  ///< live: O(n^2) nvmlDeviceGetP2PStatus(NVLINK) queries
  bool query_fabric = false;     ///< live: multi-node NVLink identity (nvmlDeviceGetGpuFabricInfoV)
};

/// \brief Detects the topology: an explicit fixture (xml_path / xml_buffer), else a fixture named by the
/// environment (honor_env), else the live machine (hwloc for locality, NVML for NVLinks).
///
/// A missing NVML library or driver is not an error: GPUs then come from hwloc's PCI devices, with
/// nvlink_known = false and a warning. Synchronous; NVML calls are serialized behind one mutex.
/// \throws KokkosMoE::TopologyError if a fixture is malformed or hwloc cannot load the live topology
/// \throws KokkosMoE::InvalidArgument (Rule::ConfigValue) if both xml_path and xml_buffer are set
NvlinkTopology detect_topology(const DetectOptions& options = {});

/// \brief Loads an hwloc v2 XML fixture from memory (with or without a terminating NUL).
/// \throws KokkosMoE::TopologyError naming the failing element on malformed input (wrong length=, version other
/// than 2.x, truncated text, a distances matrix whose size or indexes do not match the objects, ...)
NvlinkTopology load_topology_xml(std::string_view xml);

/// \brief Loads an hwloc v2 XML fixture file. \throws KokkosMoE::TopologyError (message names the file)
NvlinkTopology load_topology_xml_file(const std::string& path);

/// \brief Captures the live machine as a fixture: the hwloc tree (all I/O objects kept), a FROM_USER
/// `NVLinkBandwidth` matrix built from NVML, root infos (NVSwitchHidden, NVLinkVersion, NVLinkPerLinkMBps,
/// NVIDIADriverVersion) and per-GPU infos (docs/topology-notes.md), exported as hwloc v2 XML.
/// Works without NVML (then the file has no matrix and says so in an info). xml_path/xml_buffer are ignored.
/// \throws KokkosMoE::TopologyError if hwloc cannot load or export the topology
std::string capture_topology_xml(const DetectOptions& options = {});

/// \brief Connected components of the graph "nvlink_p2p" (each GPU in exactly one island; sorted).
std::vector<std::vector<int>> nvlink_islands(const NvlinkTopology& topo);
/// \brief Maximal cliques of the graph "nvlink_p2p" (Bron-Kerbosch with pivoting; an isolated GPU is a clique of
/// one); members ascending, cliques in lexicographic order.
std::vector<std::vector<int>> nvlink_cliques(const NvlinkTopology& topo);

/// \brief Planning constants and limits of ep_groups() (docs/topology.md §10; the same defaults as the planner's
/// CostModel).
struct EpGroupOptions {
  double nvlink_link_gbps = 25.0;   ///< NVLink line rate per link per direction
  double nvlink_efficiency = 0.82;  ///< achievable fraction of it
  double pcie_gbps = 63.0;          ///< PCIe per direction (pairs without NVLink)
  double pcie_efficiency = 0.8;
  /// Partition every GPU (group_size must divide the GPU count): groups that cannot be NVLink cliques are formed over
  /// PCIe and flagged (NodeEpGroup::nvlink = false). Default: only NVLink groups; GPUs that fit none are left out.
  bool use_every_gpu = false;
  /// Search budget in steps (one step: one group member tried). Past it the best groups found so far are returned
  /// (a greedy choice if the exact search found none) with search_limited = true: valid, perhaps not optimal.
  long step_limit = 200000;
};

/// \brief One EP group of a node.
struct NodeEpGroup {
  std::vector<int> gpus;     ///< GPU ids, ascending
  bool nvlink = false;       ///< every pair is an NVLink peer (nvlink_p2p)
  double min_pair_gbps = 0;  ///< effective bandwidth of its slowest pair, GB/s (0 for a group of one)
  int numa_nodes = 0;        ///< distinct NUMA nodes of its GPUs (0 = unknown)
  bool operator==(const NodeEpGroup& o) const {
    return gpus == o.gpus && nvlink == o.nvlink && min_pair_gbps == o.min_pair_gbps && numa_nodes == o.numa_nodes;
  }
  bool operator!=(const NodeEpGroup& o) const { return !(*this == o); }
};

/// \brief Disjoint EP groups of one size on one node (docs/topology.md §10.3-§10.6).
struct EpGroupPlan {
  int group_size = 0;
  std::vector<NodeEpGroup> groups;  ///< ordered by their first GPU
  std::vector<int> unused;          ///< GPUs in no group, ascending
  std::string unused_reason;        ///< why each unused GPU is left out ("GPU 8: no NVLink peer; ..."), empty if none
  bool all_nvlink = false;          ///< at least one group, and every group an NVLink clique
  int numa_straddles = 0;           ///< groups whose GPUs sit in more than one NUMA node
  bool search_limited = false;      ///< the search hit EpGroupOptions::step_limit (the groups are still valid)
  std::string reason;               ///< when no NVLink group of this size exists (or not every GPU fits): why
};

/// \brief Partitions the node's GPUs into disjoint EP groups of \p group_size, choosing lexicographically: every
/// pair an NVLink peer (hard; GPUs that fit no such group are left out, unless use_every_gpu), as many groups as
/// possible, the largest minimum pair bandwidth, the fewest groups spanning NUMA nodes, the lowest GPU ids first.
/// Bounded: at most EpGroupOptions::step_limit search steps (then the best valid groups found so far).
/// \throws KokkosMoE::InvalidArgument (Rule::ConfigValue) if group_size < 1, or use_every_gpu and group_size does
/// not divide the GPU count; (Rule::TopologyMalformed) if pairs is not n*n
EpGroupPlan ep_groups(const NvlinkTopology& topo, int group_size, const EpGroupOptions& options = {});

/// \brief The `nvidia-smi topo -m` token of a pair: "X" on the diagonal, "NV#" when NVLinks connect the pair,
/// otherwise the PCIe level ("PIX", ..., "SYS", "N/A"). \throws InvalidArgument (Rule::GpuIndexRange)
std::string pair_token(const NvlinkTopology& topo, int i, int j);

/// \brief Human-readable report: the GPU matrix with the `nvidia-smi topo -m` legend, CPU/NUMA affinity, GPU
/// identities, NVLink and NVSwitch summary, islands, cliques and warnings.
std::string topology_report(const NvlinkTopology& topo);

/// \brief Serializes to JSON (format "kokkosmoe-topology", version 1; see docs/topology-notes.md).
std::string topology_to_json(const NvlinkTopology& topo, int indent = 2);
/// \brief Parses topology_to_json() output; islands and cliques are recomputed from the pairs.
/// \throws KokkosMoE::TopologyError if the text is not valid JSON or violates the schema
NvlinkTopology topology_from_json(std::string_view json);

}  // namespace KokkosMoE

#endif
