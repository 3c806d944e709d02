/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// The resource gate on the live machine: needs the topology library (detect_topology), so it is built only when
// that library is part of the build.

#include <KokkosMoE_ResourceGate.hpp>

#include <exception>
#include <string>

namespace KokkosMoE {

GateResult nvlink_clique_gate(int min_gpus, const DetectOptions& options) {
  NvlinkTopology topo;
  try {
    topo = detect_topology(options);
  } catch (const std::exception& e) {
    GateResult r;
    r.required = min_gpus;
    r.reason = std::string("topology detection failed: ") + e.what();
    return r;
  }
  return nvlink_clique_gate(topo, min_gpus);
}

}  // namespace KokkosMoE
