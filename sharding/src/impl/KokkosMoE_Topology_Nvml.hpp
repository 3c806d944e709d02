/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_TOPOLOGY_NVML_HPP
#define KOKKOSMOE_TOPOLOGY_NVML_HPP

// NVML loaded at run time with dlopen (docs/topology.md §4.2): never linked, no nvml.h. The few types and versioned
// symbols we need are declared in the .cpp.

#include <string>

#include "KokkosMoE_Topology_Scan.hpp"

namespace KokkosMoE::Impl {

/// Opens `library`, initializes NVML, reads every GPU (identity, links until the first error, locality fallback,
/// optional P2P status and fabric identity), shuts NVML down and closes the library. All NVML calls of the
/// process made through this function are serialized behind one mutex. Never throws for a missing library,
/// driver or symbol: the snapshot then has available = false and `status` says why.
NvmlSnapshot read_nvml(const std::string& library, bool query_p2p, bool query_fabric);

}  // namespace KokkosMoE::Impl

#endif
