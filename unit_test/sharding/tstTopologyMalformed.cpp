/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// Malformed fixtures fail with a TopologyError that names the file, the line and what is wrong (docs/topology.md §3,
// §6).

#include <KokkosMoE_Topology.hpp>

#include <boost/test/unit_test.hpp>

#include "impl/KokkosMoE_Topology_XmlCheck.hpp"
#include "tstTopologyHelpers.hpp"

namespace {

// Loads the fixture file and returns the error message; fails the test if nothing is thrown.
std::string error_of_file(const std::string& name) {
  try {
    (void)KokkosMoETest::load(name);
  } catch (const KokkosMoE::TopologyError& e) {
    return e.what();
  }
  BOOST_ERROR(name << " loaded without a TopologyError");
  return {};
}

std::string error_of_buffer(const std::string& xml) {
  try {
    (void)KokkosMoE::load_topology_xml(xml);
  } catch (const KokkosMoE::TopologyError& e) {
    return e.what();
  }
  BOOST_ERROR("buffer loaded without a TopologyError");
  return {};
}

bool contains(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }

// Replaces the first <u64values> element by one holding `text`, with a correct length= attribute.
std::string with_values(std::string xml, const std::string& text) {
  const auto b = xml.find("<u64values");
  const std::string close = "</u64values>";
  const auto e = xml.find(close, b);
  BOOST_TEST_REQUIRE((b != std::string::npos && e != std::string::npos));
  return xml.replace(b, e + close.size() - b,
                     "<u64values length=\"" + std::to_string(text.size()) + "\">" + text + close);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(topology_malformed)

BOOST_AUTO_TEST_CASE(wrong_length_attribute) {
  const std::string e = error_of_file("malformed_wrong_length");
  BOOST_TEST(contains(e, "malformed_wrong_length.xml"), e);
  BOOST_TEST(contains(e, "<u64values>"), e);
  BOOST_TEST(contains(e, "length=\"19\" but the text has 18 characters"), e);
  BOOST_TEST(contains(e, "line 40"), e);
}

BOOST_AUTO_TEST_CASE(unknown_version) {
  const std::string e = error_of_file("malformed_version_3");
  BOOST_TEST(contains(e, "unsupported hwloc XML version \"3.0\""), e);
  BOOST_TEST(contains(e, "v2xml"), e);
  const std::string v1 = error_of_file("malformed_v1_no_version");
  BOOST_TEST(contains(v1, "hwloc v1 XML is not supported"), v1);
}

BOOST_AUTO_TEST_CASE(truncated_file) {
  const std::string e = error_of_file("malformed_truncated");
  BOOST_TEST(contains(e, "truncated"), e);
  // Every proper prefix of a valid fixture is rejected (never silently loaded as a smaller machine).
  const std::string full = KokkosMoETest::read_fixture("pcie_pairs_4gpu");
  const std::string closing = "</topology>\n";
  for (std::size_t cut = 0; cut + closing.size() < full.size(); cut += 97)
    BOOST_CHECK_THROW(KokkosMoE::load_topology_xml(full.substr(0, cut)), KokkosMoE::TopologyError);
}

BOOST_AUTO_TEST_CASE(index_naming_no_object) {
  // hwloc would drop this matrix silently; we refuse the file instead.
  const std::string e = error_of_file("malformed_unknown_index");
  BOOST_TEST(contains(e, "index 99999 names no PCIDev object"), e);
  const std::string t = error_of_file("malformed_index_type");
  BOOST_TEST(contains(t, "index 1 names a Machine object, not a PCIDev"), t);
}

BOOST_AUTO_TEST_CASE(nbobjs_mismatch) {
  const std::string e = error_of_file("malformed_nbobjs_mismatch");
  BOOST_TEST(contains(e, "nbobjs=\"3\" but <indexes> holds 2 tokens"), e);
}

BOOST_AUTO_TEST_CASE(value_count_mismatch) {
  const std::string xml = with_values(KokkosMoETest::read_fixture("asymmetric_matrix"), "0 100000 50000 ");
  const std::string e = error_of_buffer(xml);
  BOOST_TEST(contains(e, "needs 4 values, <u64values> holds 3"), e);
  const std::string text = error_of_buffer(with_values(KokkosMoETest::read_fixture("asymmetric_matrix"), "0 1 x 0 "));
  BOOST_TEST(contains(text, "value \"x\" is not an unsigned 64-bit integer"), text);
}

BOOST_AUTO_TEST_CASE(bad_info_value) {
  const std::string e = error_of_file("malformed_bad_info");
  BOOST_TEST(contains(e, "NVLinkToSwitch=\"many\""), e);
  BOOST_TEST(contains(e, "0000:01:00.0"), e);
}

BOOST_AUTO_TEST_CASE(not_xml_empty_and_mismatched) {
  BOOST_TEST(contains(error_of_file("malformed_not_xml"), "text outside the root element"));
  BOOST_TEST(contains(error_of_file("malformed_empty"), "no <topology> element"));
  BOOST_TEST(contains(error_of_file("malformed_mismatched_tag"), "does not match the open element <topology>"));
  BOOST_TEST(contains(error_of_buffer("<topology version=\"2.0\"><object type=\"Blob\" gp_index=\"1\"/></topology>"),
                      "unknown object type \"Blob\""));
  BOOST_TEST(contains(error_of_buffer("<other version=\"2.0\"/>"), "root element must be <topology>"));
}

BOOST_AUTO_TEST_CASE(duplicate_gp_index) {
  const std::string xml =
      "<topology version=\"2.0\">\n<object type=\"Machine\" gp_index=\"1\">\n<object type=\"Misc\" "
      "gp_index=\"1\"/>\n</object>\n</topology>\n";
  BOOST_TEST(contains(error_of_buffer(xml), "line 3: <object>: gp_index 1 already used on line 2"));
}

BOOST_AUTO_TEST_CASE(half_cpuset_pair_is_refused_before_hwloc) {
  // hwloc 2.9 segfaults on an object with a cpuset but no complete_cpuset (found by the fuzz target).
  std::string xml = KokkosMoETest::read_fixture("pcie_pairs_4gpu");
  const std::string core = "<object type=\"Core\" os_index=\"3\" cpuset=\"0x00000008\" complete_cpuset=\"0x00000008\"";
  const auto at = xml.find(core);
  BOOST_TEST_REQUIRE(at != std::string::npos);
  xml.replace(at, core.size(), "<object type=\"Core\" os_index=\"3\" cpuset=\"0x00000008\"");
  BOOST_TEST(contains(error_of_buffer(xml), "<object>: cpuset without complete_cpuset"));
  std::string bad_set = KokkosMoETest::read_fixture("pcie_pairs_4gpu");
  bad_set.replace(bad_set.find("cpuset=\"0x00000008\""), 21, "cpuset=\"0x0000000g\"");
  BOOST_TEST(contains(error_of_buffer(bad_set), "is not an hwloc bitmap"));
}

BOOST_AUTO_TEST_CASE(pu_without_os_index_is_refused_before_hwloc) {
  // hwloc 2.9 turns a missing PU os_index into 0xffffffff and sets it in a bitmap (found by the fuzz target).
  std::string xml = KokkosMoETest::read_fixture("pcie_pairs_4gpu");
  const std::string pu = "<object type=\"PU\" os_index=\"3\"";
  xml.replace(xml.find(pu), pu.size(), "<object type=\"PU\"");
  BOOST_TEST(contains(error_of_buffer(xml), "a PU needs an os_index"));
}

BOOST_AUTO_TEST_CASE(unknown_bridge_type_is_refused) {
  // hwloc stores bridge_type="2-1" as an out-of-range enum value (found by the fuzz target, UBSan).
  std::string xml = KokkosMoETest::read_fixture("pcie_pairs_4gpu");
  xml.replace(xml.find("bridge_type=\"1-1\""), 17, "bridge_type=\"2-1\"");
  BOOST_TEST(contains(error_of_buffer(xml), "bridge_type=\"2-1\" is not 0-1 or 1-1"));
}

BOOST_AUTO_TEST_CASE(missing_file_names_path) {
  try {
    (void)KokkosMoE::load_topology_xml_file("/nonexistent/topo.xml");
    BOOST_FAIL("no exception");
  } catch (const KokkosMoE::TopologyError& e) {
    BOOST_TEST(contains(e.what(), "cannot read /nonexistent/topo.xml"), e.what());
  }
}

BOOST_AUTO_TEST_CASE(buffer_with_or_without_nul) {
  const std::string xml = KokkosMoETest::read_fixture("pcie_pairs_4gpu");
  BOOST_TEST(KokkosMoE::load_topology_xml(xml).num_gpus() == 4);
  BOOST_TEST(KokkosMoE::load_topology_xml(std::string_view(xml.c_str(), xml.size() + 1)).num_gpus() == 4);
  std::string embedded = xml;
  embedded.insert(10, 1, '\0');
  BOOST_TEST(contains(error_of_buffer(embedded), "NUL byte"));
}

BOOST_AUTO_TEST_CASE(scanner_reports_declared_matrices) {
  const auto r = KokkosMoE::Impl::check_hwloc_xml(KokkosMoETest::read_fixture("hgx_h100_8gpu_4sw"), "hgx");
  BOOST_TEST(r.version == "2.0");
  BOOST_TEST_REQUIRE(r.matrices.size() == 1u);
  BOOST_TEST(r.matrices[0].name == "NVLinkBandwidth");
  BOOST_TEST(r.matrices[0].nbobjs == 12u);
  BOOST_TEST(r.matrices[0].hetero);
  BOOST_TEST(r.num_objects > 50u);
}

BOOST_AUTO_TEST_CASE(implausible_link_counts) {
  // 2^60 MB/s between two GPUs is not a machine: refuse rather than invent 4.6e13 links.
  const std::string xml =
      with_values(KokkosMoETest::read_fixture("asymmetric_matrix"), "0 1152921504606846976 1152921504606846976 0 ");
  BOOST_TEST(contains(error_of_buffer(xml), "implausible"));
}

BOOST_AUTO_TEST_SUITE_END()
