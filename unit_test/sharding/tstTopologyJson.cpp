/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// JSON round trip of every fixture and of synthetic models; schema violations are TopologyErrors.

#include <KokkosMoE_Topology.hpp>

#include <boost/test/unit_test.hpp>
#include <nlohmann/json.hpp>

#include "tstTopologyHelpers.hpp"

using KokkosMoE::NvlinkTopology;

namespace {

const char* kFixtures[] = {"hgx_h100_8gpu_4sw",
                           "h200_2gpu_vm_hidden_switch",
                           "dgx2_like_16gpu_12sw",
                           "pcie_pairs_4gpu",
                           "dgx1_like_mesh_8gpu",
                           "power8_like_gpu_cpu",
                           "no_gpu",
                           "gpu_without_matrix",
                           "asymmetric_matrix",
                           "h200_2gpu_vm_machine_only"};

std::string json_error(const std::string& text) {
  try {
    (void)KokkosMoE::topology_from_json(text);
  } catch (const KokkosMoE::TopologyError& e) {
    return e.what();
  }
  BOOST_ERROR("accepted: " << text.substr(0, 200));
  return {};
}

std::string mutate(const std::string& json, const std::function<void(nlohmann::json&)>& f) {
  auto j = nlohmann::json::parse(json);
  f(j);
  return j.dump();
}

}  // namespace

BOOST_AUTO_TEST_SUITE(topology_json)

BOOST_AUTO_TEST_CASE(round_trip_every_fixture) {
  for (const char* name : kFixtures) {
    const NvlinkTopology t = KokkosMoETest::load(name);
    const std::string text = KokkosMoE::topology_to_json(t);
    const NvlinkTopology back = KokkosMoE::topology_from_json(text);
    BOOST_TEST((back == t), name);
    BOOST_TEST(KokkosMoE::topology_to_json(back) == text, name);
  }
}

BOOST_AUTO_TEST_CASE(round_trip_optional_fields) {
  NvlinkTopology t = KokkosMoETest::load("h200_2gpu_vm_hidden_switch");
  t.gpus[0].nvml_index = 3;
  t.gpus[0].compute_capability = 90;
  KokkosMoE::FabricIdentity f;
  for (int b = 0; b < 16; ++b) f.cluster_uuid[b] = static_cast<std::uint8_t>(0xf0 + b);
  f.clique_id = 4000000000u;
  t.gpus[1].fabric = f;
  t.driver_version = "580.159.04";
  t.source = NvlinkTopology::Source::Live;
  const NvlinkTopology back = KokkosMoE::topology_from_json(KokkosMoE::topology_to_json(t, -1));
  BOOST_TEST((back == t));
  BOOST_TEST(back.gpus[1].fabric->clique_id == 4000000000u);
  BOOST_TEST(!back.gpus[1].nvml_index.has_value());
}

BOOST_AUTO_TEST_CASE(invalid_utf8_is_replaced_not_thrown) {
  // Found by the fuzz target: an info value with bytes that are not UTF-8 made the JSON writer throw.
  std::string xml = KokkosMoETest::read_fixture("h200_2gpu_vm_hidden_switch");
  const std::string from = "value=\"NVIDIA H200\"";
  xml.replace(xml.find(from), from.size(), "value=\"NVIDIA \xcf\xff H200 \xc3\xa9\"");
  const NvlinkTopology t = KokkosMoE::load_topology_xml(xml);
  BOOST_TEST(t.gpus[0].model == "NVIDIA ?? H200 \xc3\xa9");  // valid UTF-8 (here: e-acute) is kept
  const NvlinkTopology back = KokkosMoE::topology_from_json(KokkosMoE::topology_to_json(t));
  BOOST_TEST((back == t));
}

BOOST_AUTO_TEST_CASE(json_content) {
  const auto j = nlohmann::json::parse(KokkosMoE::topology_to_json(KokkosMoETest::load("h200_2gpu_vm_hidden_switch")));
  BOOST_TEST(j["format"] == "kokkosmoe-topology");
  BOOST_TEST(j["version"] == 1);
  BOOST_TEST(j["source"] == "hwloc-xml");
  BOOST_TEST(j["gpus"].size() == 2u);
  BOOST_TEST(j["gpus"][0]["pci"] == "0000:00:06.0");
  BOOST_TEST(j["gpus"][1]["links_to_switch"] == 18);
  BOOST_TEST(j["pairs"].size() == 1u);
  BOOST_TEST(j["pairs"][0]["token"] == "NV18");
  BOOST_TEST(j["pairs"][0]["pcie"] == "PHB");
  BOOST_TEST(j["islands"] == nlohmann::json::parse("[[0,1]]"));
  BOOST_TEST(j["nvswitch_hidden"] == true);
}

BOOST_AUTO_TEST_CASE(derived_fields_are_recomputed) {
  const NvlinkTopology t = KokkosMoETest::load("pcie_pairs_4gpu");
  const std::string text = mutate(KokkosMoE::topology_to_json(t), [](nlohmann::json& j) {
    j["islands"] = nlohmann::json::parse("[[0,1,2,3]]");
    j["cliques"] = nlohmann::json::array();
  });
  const NvlinkTopology back = KokkosMoE::topology_from_json(text);
  BOOST_TEST(back.islands == t.islands);
  BOOST_TEST(back.cliques == t.cliques);
}

BOOST_AUTO_TEST_CASE(schema_violations) {
  const std::string good = KokkosMoE::topology_to_json(KokkosMoETest::load("pcie_pairs_4gpu"));
  auto has = [](const std::string& e, const char* s) { return e.find(s) != std::string::npos; };
  BOOST_TEST(has(json_error("{not json"), "not valid JSON"));
  BOOST_TEST(has(json_error("[]"), "expected an object"));
  BOOST_TEST(has(json_error(mutate(good, [](auto& j) { j["format"] = "other"; })), "$.format"));
  BOOST_TEST(has(json_error(mutate(good, [](auto& j) { j["version"] = 2; })), "unsupported version"));
  BOOST_TEST(has(json_error(mutate(good, [](auto& j) { j.erase("gpus"); })), "$.gpus: missing"));
  BOOST_TEST(has(json_error(mutate(good, [](auto& j) { j["gpus"][1]["pci"] = "0000:zz:00.0"; })), "$.gpus[1].pci"));
  BOOST_TEST(has(json_error(mutate(good, [](auto& j) { j["gpus"][1]["id"] = 5; })), "ids must be 0..n-1"));
  BOOST_TEST(has(json_error(mutate(good, [](auto& j) { j["gpus"][1]["pci"] = j["gpus"][0]["pci"]; })),
                 "duplicate PCI address"));
  BOOST_TEST(has(json_error(mutate(good, [](auto& j) { std::swap(j["gpus"][0]["pci"], j["gpus"][1]["pci"]); })),
                 "ordered by PCI address"));
  BOOST_TEST(has(json_error(mutate(good, [](auto& j) { j["gpus"][0]["active_links"] = -1; })), "out of range"));
  BOOST_TEST(has(json_error(mutate(good, [](auto& j) { j["gpus"][0]["active_links"] = 2.5; })), "expected an integer"));
  BOOST_TEST(has(json_error(mutate(good, [](auto& j) { j["pairs"][0]["j"] = 9; })), "i < j < number of GPUs"));
  BOOST_TEST(has(json_error(mutate(good, [](auto& j) { j["pairs"].push_back(j["pairs"][0]); })), "given twice"));
  BOOST_TEST(has(json_error(mutate(good, [](auto& j) { j["pairs"][0]["pcie"] = "PCI"; })), "unknown PCIe level"));
  BOOST_TEST(has(json_error(mutate(good, [](auto& j) { j["source"] = "magic"; })), "unknown source"));
  BOOST_TEST(has(json_error(mutate(good,
                                   [](auto& j) {
                                     j["gpus"][0]["fabric"] = {{"cluster_uuid", "xyz"}};
                                   })),
                 "32 hex digits"));
  BOOST_TEST(has(json_error(mutate(good, [](auto& j) { j["nvswitch_hidden"] = 1; })), "expected true or false"));
}

BOOST_AUTO_TEST_SUITE_END()
