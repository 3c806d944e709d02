/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// libFuzzer target over our loading and validation layer: the XML pre-check, hwloc import (not instrumented),
// the scan-to-model rules and the JSON reader. Any exception other than TopologyError, a crash, a sanitizer report
// or a broken invariant (a loaded model must survive the JSON round trip) is a finding.

#include <KokkosMoE_Topology.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace {

void check_invariants(const KokkosMoE::NvlinkTopology& t) {
  const auto back = KokkosMoE::topology_from_json(KokkosMoE::topology_to_json(t));
  if (!(back == t)) {
    std::fprintf(stderr, "JSON round trip changed the model\n");
    std::abort();
  }
  for (int i = 0; i < t.num_gpus(); ++i)
    for (int j = 0; j < t.num_gpus(); ++j)
      if (!(t.pair(i, j) == t.pair(j, i))) {
        std::fprintf(stderr, "asymmetric pair (%d, %d)\n", i, j);
        std::abort();
      }
  (void)KokkosMoE::topology_report(t);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  try {
    check_invariants(KokkosMoE::load_topology_xml(in));
  } catch (const KokkosMoE::TopologyError&) {
  }
  try {
    check_invariants(KokkosMoE::topology_from_json(in));
  } catch (const KokkosMoE::TopologyError&) {
  }
  return 0;
}
