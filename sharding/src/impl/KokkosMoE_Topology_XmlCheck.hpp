/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_TOPOLOGY_XMLCHECK_HPP
#define KOKKOSMOE_TOPOLOGY_XMLCHECK_HPP

// Our own structural check of an hwloc v2 XML text before hwloc sees it. hwloc answers a malformed file with a
// bare EINVAL (details only with HWLOC_XML_VERBOSE=1) and silently drops a distances matrix whose indexes name no
// object; this check turns those cases into a TopologyError that names the element, the line and the rule
// (docs/topology.md §5.1-5.2, §11).

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace KokkosMoE::Impl {

struct XmlDeclaredMatrix {
  std::string name;        // e.g. "NVLinkBandwidth"
  std::size_t nbobjs = 0;  // declared size
  int line = 0;            // line of the <distances2...> element
  bool hetero = false;
};

struct XmlCheckResult {
  std::string version;                      // the <topology version="..."> attribute
  std::vector<XmlDeclaredMatrix> matrices;  // every distances matrix, in file order
  std::size_t num_objects = 0;
  /// The document in the canonical form both hwloc XML importers read alike (see the .cpp); what hwloc is given.
  std::string canonical;
};

/// Checks well-formedness (balanced tags, quoted attributes, nothing truncated), the root element and its
/// version (2.x only), unique numeric gp_index values, and each distances matrix: nbobjs, index tokens naming
/// existing objects of the right type, the exact length= of every <indexes>/<u64values> text, and the value count.
/// \throws KokkosMoE::TopologyError "KokkosMoE topology: <source>: line N: <element>: <what is wrong>"
XmlCheckResult check_hwloc_xml(std::string_view xml, const std::string& source);

}  // namespace KokkosMoE::Impl

#endif
