/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// The same XML gives the same model or the same error whichever XML importer hwloc uses: the loader
// hands hwloc its own canonical form of the document (KokkosMoE_Topology_XmlCheck.cpp). ctest runs this suite, and
// every other topology suite, twice: as installed (hwloc's libxml2 importer where libhwloc-plugins is present) and
// with HWLOC_LIBXML_IMPORT=0 (hwloc's built-in importer). Each case below once differed between the two.

#include <KokkosMoE_Topology.hpp>

#include <boost/test/unit_test.hpp>

#include <functional>
#include <string>
#include <vector>

#include "impl/KokkosMoE_Topology_XmlCheck.hpp"
#include "tstTopologyHelpers.hpp"

namespace {

using KokkosMoE::NvlinkTopology;

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (std::size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size()))
    s.replace(p, from.size(), to);
  return s;
}

std::string replace_first(std::string s, const std::string& from, const std::string& to) {
  const auto p = s.find(from);
  BOOST_REQUIRE_MESSAGE(p != std::string::npos, "fixture lacks '" << from << "'");
  return s.replace(p, from.size(), to);
}

std::string error_of(const std::string& xml) {
  try {
    (void)KokkosMoE::load_topology_xml(xml);
  } catch (const KokkosMoE::TopologyError& e) {
    return e.what();
  }
  return "(no error)";
}

const char* const kValidFixtures[] = {"hgx_h100_8gpu_4sw",
                                      "h200_2gpu_vm_hidden_switch",
                                      "dgx2_like_16gpu_12sw",
                                      "pcie_pairs_4gpu",
                                      "dgx1_like_mesh_8gpu",
                                      "power8_like_gpu_cpu",
                                      "no_gpu",
                                      "h200_2gpu_live_capture",
                                      "h200_2gpu_vm_machine_only",
                                      "asymmetric_matrix",
                                      "gpu_without_matrix"};

}  // namespace

BOOST_AUTO_TEST_SUITE(topology_importers)

BOOST_AUTO_TEST_CASE(canonical_form_is_a_fixed_point_and_loads_the_same_model) {
  for (const char* name : kValidFixtures) {
    const std::string xml = KokkosMoETest::read_fixture(name);
    const std::string canon = KokkosMoE::Impl::check_hwloc_xml(xml, name).canonical;
    BOOST_TEST(canon.rfind("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<!DOCTYPE topology SYSTEM \"hwloc2.dtd\">\n"
                           "<topology version=\"2.",
                           0) == 0u,
               name);
    BOOST_TEST(KokkosMoE::Impl::check_hwloc_xml(canon, name).canonical == canon, name);
    BOOST_TEST((KokkosMoE::load_topology_xml(canon) == KokkosMoE::load_topology_xml(xml)), name);
  }
}

BOOST_AUTO_TEST_CASE(syntax_variants_give_the_same_model) {
  // Each variant is valid XML that libxml2 reads and that hwloc's built-in importer, given the bytes as they are,
  // misreads or refuses (or, for the DOCTYPE without a system id, hwloc 2.9's libxml2 path dereferences NULL).
  const std::string base = KokkosMoETest::read_fixture("hgx_h100_8gpu_4sw");
  const NvlinkTopology expected = KokkosMoE::load_topology_xml(base);
  BOOST_REQUIRE(expected.num_gpus() == 8);
  const std::string body = base.substr(base.find("<topology"));
  const std::vector<std::pair<std::string, std::function<std::string(std::string)>>> variants = {
      {"CRLF line ends", [](std::string s) { return replace_all(s, "\n", "\r\n"); }},
      {"no declaration, no DOCTYPE", [&](std::string) { return body; }},
      {"DOCTYPE without a system id",
       [&](std::string) { return "<?xml version=\"1.0\"?>\n<!DOCTYPE topology>\n" + body; }},
      {"byte-order mark", [](std::string s) { return "\xEF\xBB\xBF" + s; }},
      {"comment before <topology>", [&](std::string) { return "<!-- saved by hand -->\n" + body; }},
      {"comments and a processing instruction inside the tree",
       [](std::string s) { return replace_all(s, "<info name=", "<!-- info follows --><?hint x?><info name="); }},
      {"single quotes and spaces around =",
       [](std::string s) { return replace_all(s, "type=\"PCIDev\"", "type = 'PCIDev'"); }},
      {"tabs and new lines between attributes", [](std::string s) { return replace_all(s, "\" ", "\"\n\t "); }},
      {"character references",
       [](std::string s) { return replace_all(s, "type=\"PCIDev\"", "type=\"PCI&#68;&#x65;v\""); }},
      {"userdata (ignored)",
       [](std::string s) {
         return replace_first(s, "<info name=", "<userdata name=\"app\" length=\"3\">a&lt;c</userdata><info name=");
       }},
  };
  for (const auto& [what, mutate] : variants) {
    const std::string xml = mutate(base);
    NvlinkTopology t;
    try {
      t = KokkosMoE::load_topology_xml(xml);
    } catch (const std::exception& e) {
      BOOST_ERROR(what << ": " << e.what());
      continue;
    }
    BOOST_TEST((t == expected), what);
  }
}

BOOST_AUTO_TEST_CASE(odd_characters_in_values_are_replaced_alike) {
  // libxml2 rejects control characters (also as references), U+FFFE and invalid UTF-8; the built-in importer
  // passes them through. Both now see '?' (and white space normalized as XML requires).
  std::string xml = KokkosMoETest::read_fixture("h200_2gpu_vm_hidden_switch");
  const std::string from = "value=\"NVIDIA H200\"";
  xml = replace_first(xml, from,
                      "value=\"A\x01"
                      "B&#1;C\tD&#9;E\xEF\xBF\xBE"
                      "F&#xFFFE;G&apos;&gt;H\"");
  const NvlinkTopology t = KokkosMoE::load_topology_xml(xml);
  BOOST_TEST(t.gpus[0].model == "A?B?C D\tE?F?G'>H");
}

BOOST_AUTO_TEST_CASE(ambiguous_documents_are_refused_alike) {
  const std::string base = KokkosMoETest::read_fixture("h200_2gpu_vm_hidden_switch");
  struct Bad {
    const char* what;
    std::string xml;
    const char* needle;
  };
  std::string deep = base;
  {
    std::string open, close;
    for (int d = 0; d < 130; ++d) {
      open += "<object type=\"Misc\" name=\"m\">";
      close += "</object>";
    }
    deep = replace_first(deep, "<info name=", open + close + "<info name=");
  }
  const std::vector<Bad> bad = {
      {"version 2 without a minor (libxml2 path: read as v1)", replace_first(base, "version=\"2.0\"", "version=\"2\""),
       "unsupported hwloc XML version \"2\""},
      {"a non-UTF-8 encoding (libxml2 transcodes, built-in does not)",
       replace_first(base, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>",
                     "<?xml version=\"1.0\" encoding=\"ISO-8859-1\"?>"),
       "encoding \"ISO-8859-1\" is not read"},
      {"an upper-case attribute (built-in stops reading attributes there)",
       replace_first(base, "type=\"PCIDev\"", "Class=\"x\" type=\"PCIDev\""),
       "attribute Class: hwloc attribute names are lower-case letters and '_'"},
      {"an attribute with a digit", replace_first(base, "type=\"PCIDev\"", "pci2=\"x\" type=\"PCIDev\""),
       "attribute pci2: hwloc attribute names"},
      {"another attribute on <topology> (built-in refuses)",
       replace_first(base, "<topology version=\"2.0\">", "<topology version=\"2.0\" xmlns=\"x\">"),
       "attribute xmlns is not part of hwloc v2 XML"},
      {"nesting deeper than libxml2's limit", deep, "nesting deeper than 128"},
      {"a reference inside <u64values> (its length differs between importers)",
       replace_first(base, "<u64values length=\"18\">0 450000 450000 0 </u64values>",
                     "<u64values length=\"22\">0 450000 450000&#32;0 </u64values>"),
       "character references are not allowed here"},
  };
  for (const auto& b : bad) {
    const std::string e = error_of(b.xml);
    BOOST_TEST(e.find(b.needle) != std::string::npos, b.what << ": " << e);
  }
}

BOOST_AUTO_TEST_SUITE_END()
