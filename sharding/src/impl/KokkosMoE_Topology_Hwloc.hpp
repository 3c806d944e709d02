/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_TOPOLOGY_HWLOC_HPP
#define KOKKOSMOE_TOPOLOGY_HWLOC_HPP

// hwloc side of detection: loading (XML fixture or live machine, with the I/O filter set), scanning the tree into
// a HostScan (GPUs, NVSwitches, locality, PCIe levels by walking parents, the NVLinkBandwidth matrix), and writing
// captures. hwloc types stay inside the .cpp (pimpl).

#include <memory>
#include <string>
#include <string_view>

#include "KokkosMoE_Topology_Scan.hpp"

namespace KokkosMoE::Impl {

class HwlocTree {
 public:
  /// Loads an hwloc v2 XML text after check_hwloc_xml(); every I/O object is kept. Verifies that hwloc kept every
  /// NVLink matrix the text declares. as_live: the XML stands in for the live machine (tests), so NVSwitches are
  /// also recognized by class as on a live tree; fixtures name them by subtype only. \throws TopologyError
  static HwlocTree from_xml(std::string_view xml, const std::string& source, bool as_live = false);
  /// Discovers the live machine. keep_all: every I/O object (captures); otherwise the important ones plus every
  /// PCI device (NVSwitches have class 0x0680, which older hwloc releases do not count as important).
  /// The OpenCL, GL and CUDA components are blacklisted (they create GPU contexts and are slow).
  static HwlocTree live(bool keep_all);

  HwlocTree(HwlocTree&&) noexcept;
  HwlocTree& operator=(HwlocTree&&) noexcept;
  ~HwlocTree();

  HostScan scan() const;
  /// True when hwloc discovered this machine (false if HWLOC_XMLFILE or similar redirected it).
  bool is_this_system() const;

  /// Adds our NVLink description of `topo` (root infos, per-GPU infos, FROM_USER NVLinkBandwidth matrix over the
  /// GPU PCI objects and visible NVSwitches, optional P2P matrix) and exports hwloc v2 XML.
  std::string export_capture(const NvlinkTopology& topo, const SwitchLinkTable& switch_links,
                             const std::string& nvml_status);

 private:
  struct State;
  explicit HwlocTree(std::unique_ptr<State> s);
  std::unique_ptr<State> m_state;
};

/// The hwloc release this library was compiled against, e.g. "2.9.0".
std::string hwloc_compiled_version();

}  // namespace KokkosMoE::Impl

#endif
