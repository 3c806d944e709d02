/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_TOPOLOGY_DETECT_HPP
#define KOKKOSMOE_TOPOLOGY_DETECT_HPP

// Internal entry points behind detect_topology() and capture_topology_xml() that let tests substitute the
// machine: an hwloc XML text plays the live hwloc tree, DetectOptions::nvml_library may name a mock NVML.

#include <KokkosMoE_Topology.hpp>

#include <string>

namespace KokkosMoE::Impl {

/// Live detection (hwloc + NVML); `hwloc_xml`, if non-null, replaces the live hwloc discovery.
NvlinkTopology detect_live(const DetectOptions& options, const std::string* hwloc_xml);
/// Capture; `hwloc_xml`, if non-null, replaces the live hwloc discovery as the base tree.
std::string capture_xml(const DetectOptions& options, const std::string* hwloc_xml);

}  // namespace KokkosMoE::Impl

#endif
