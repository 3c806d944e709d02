/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// Live detection and capture end to end through dlopen, with a mock NVML library (mock_nvml.cpp) standing in for
// libnvidia-ml.so.1 and a fixture standing in for the live hwloc tree.

#include <KokkosMoE_Topology.hpp>

#include <boost/test/unit_test.hpp>
#include <dlfcn.h>

#include "impl/KokkosMoE_Topology_Detect.hpp"
#include "tstTopologyHelpers.hpp"

using KokkosMoE::NvlinkTopology;
using KokkosMoE::PcieLevel;
using KokkosMoETest::EnvGuard;
using KokkosMoETest::has_warning;
using V = std::vector<std::vector<int>>;

namespace {

KokkosMoE::DetectOptions mock(bool minimal = false) {
  KokkosMoE::DetectOptions o;
  o.honor_env = false;
  o.nvml_library = minimal ? KOKKOSMOE_MOCK_NVML_MINIMAL : KOKKOSMOE_MOCK_NVML;
  o.query_fabric = true;
  return o;
}

NvlinkTopology live(const char* scenario, const char* machine, bool minimal = false) {
  EnvGuard g("KOKKOSMOE_MOCK_NVML_SCENARIO", scenario);
  const std::string xml = KokkosMoETest::read_fixture(machine);
  return KokkosMoE::Impl::detect_live(mock(minimal), &xml);
}

// The model a capture reproduces: everything but the source and the warnings.
NvlinkTopology comparable(NvlinkTopology t) {
  t.source = NvlinkTopology::Source::None;
  t.warnings.clear();
  return t;
}

void check_capture_round_trip(const char* scenario, const char* machine, bool minimal = false) {
  BOOST_TEST_CONTEXT(scenario << " on " << machine) {
    EnvGuard g("KOKKOSMOE_MOCK_NVML_SCENARIO", scenario);
    const std::string base = KokkosMoETest::read_fixture(machine);
    const NvlinkTopology detected = KokkosMoE::Impl::detect_live(mock(minimal), &base);
    const std::string captured = KokkosMoE::Impl::capture_xml(mock(minimal), &base);
    BOOST_TEST(captured.find("<topology version=\"2.0\">") != std::string::npos);
    const NvlinkTopology loaded = KokkosMoE::load_topology_xml(captured);
    BOOST_TEST((loaded.source == NvlinkTopology::Source::HwlocXml));
    BOOST_TEST((comparable(loaded) == comparable(detected)), KokkosMoE::topology_to_json(detected)
                                                                 << "\nvs\n"
                                                                 << KokkosMoE::topology_to_json(loaded));
    // A capture of a capture is the same fixture model again.
    BOOST_TEST((comparable(KokkosMoE::load_topology_xml(captured)) == comparable(loaded)));
  }
}

int mock_refs() {
  void* h = dlopen(KOKKOSMOE_MOCK_NVML, RTLD_NOW | RTLD_LOCAL);
  BOOST_TEST_REQUIRE(h != nullptr);
  auto fn = reinterpret_cast<int (*)()>(dlsym(h, "kokkosmoe_mock_nvml_refs"));
  const int r = fn ? fn() : -1;
  dlclose(h);
  return r;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(topology_nvml_mock)

BOOST_AUTO_TEST_CASE(h200_vm_two_gpus) {
  const auto t = live("h200_vm", "h200_2gpu_vm_machine_only");
  BOOST_TEST_REQUIRE(t.num_gpus() == 2);
  BOOST_TEST((t.source == NvlinkTopology::Source::Live));
  BOOST_TEST(t.driver_version == "580.159.04");
  for (int i = 0; i < 2; ++i) {
    const auto& g = t.gpus[i];
    BOOST_TEST(g.active_links == 18);  // links 0-17; link 18 answers INVALID_ARGUMENT, which ends the loop
    BOOST_TEST(g.links_to_switch == 18);
    BOOST_TEST(g.nvlink_version == 6);
    BOOST_TEST(g.link_mbps == 25000u);
    BOOST_TEST(g.model == "NVIDIA H200");
    BOOST_TEST(g.compute_capability.value_or(0) == 90);
    BOOST_TEST(g.nvml_index.value_or(-1) == i);
    BOOST_TEST(g.pci_device_id == 0x2335);
    BOOST_TEST(g.cpuset == "0-31");                   // from the (fixture) hwloc tree
    BOOST_TEST(g.numa_nodes == std::vector<int>{0});  // idem; NVML's memory affinity is NOT_SUPPORTED here
    BOOST_TEST(!g.fabric.has_value());                // state COMPLETED but a zero cluster UUID
  }
  BOOST_TEST(t.gpus[0].uuid == "GPU-6d6f636b-0000-4000-8000-000000000a00");
  BOOST_TEST(t.pair(0, 1).switch_links == 18);
  BOOST_TEST(t.pair(0, 1).direct_links == 0);
  BOOST_TEST(t.pair(0, 1).nvlink_p2p);
  BOOST_TEST(t.pair(0, 1).pcie == PcieLevel::Phb);
  BOOST_TEST(KokkosMoE::pair_token(t, 0, 1) == "NV18");
  BOOST_TEST(t.nvswitch_visible == 0);
  BOOST_TEST(t.nvswitch_hidden);
  BOOST_TEST(t.islands == (V{{0, 1}}));
  BOOST_TEST(t.cliques == (V{{0, 1}}));
  BOOST_TEST(t.warnings == std::vector<std::string>{"NVSwitch hidden: fabric assumed"});
  BOOST_TEST(mock_refs() == 0);  // every nvmlInit_v2 was paired with nvmlShutdown
}

BOOST_AUTO_TEST_CASE(hgx_visible_switches) {
  const auto t = live("hgx", "hgx_h100_8gpu_4sw");
  BOOST_TEST_REQUIRE(t.num_gpus() == 8);
  for (const auto& g : t.gpus) BOOST_TEST(g.links_to_switch == 18);
  BOOST_TEST(t.pair(2, 6).switch_links == 18);
  BOOST_TEST(!t.nvswitch_hidden);
  BOOST_TEST(t.nvswitch_visible == 4);
  BOOST_TEST(t.pair(0, 1).pcie == PcieLevel::Pix);  // from the hwloc tree, not NVML's (mock) answer of 50
  BOOST_TEST(t.pair(0, 4).pcie == PcieLevel::Sys);
  BOOST_TEST(t.cliques == (V{{0, 1, 2, 3, 4, 5, 6, 7}}));
  BOOST_TEST(t.warnings.empty());
}

BOOST_AUTO_TEST_CASE(dgx1_mesh_direct_links) {
  const auto t = live("mesh", "dgx1_like_mesh_8gpu");
  BOOST_TEST_REQUIRE(t.num_gpus() == 8);
  const auto fixture = KokkosMoETest::load("dgx1_like_mesh_8gpu");
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 8; ++j)
      if (i != j) BOOST_TEST(t.pair(i, j).direct_links == fixture.pair(i, j).direct_links, i << "-" << j);
  for (const auto& g : t.gpus) {
    BOOST_TEST(g.active_links == 6);  // GPU0's extra inactive link is not counted
    BOOST_TEST(g.nvlink_version == 2);
  }
  BOOST_TEST(t.cliques == fixture.cliques);
  BOOST_TEST(!t.nvswitch_hidden);
}

BOOST_AUTO_TEST_CASE(container_hides_a_peer_gpu) {
  const auto t = live("container", "h200_2gpu_vm_machine_only");
  BOOST_TEST(t.pair(0, 1).direct_links == 2);
  BOOST_TEST(t.gpus[0].active_links == 6);
  BOOST_TEST(t.gpus[0].links_to_switch == 0);
  BOOST_TEST(has_warning(t, "peer GPU 00000000:99:00.0 is not visible"));
}

BOOST_AUTO_TEST_CASE(fabric_partition_from_p2p_status) {
  // hwloc sees two GPUs, NVML four: the two unknown to hwloc get NVML locality and NVML PCIe levels.
  const auto t = live("partition", "h200_2gpu_vm_machine_only");
  BOOST_TEST_REQUIRE(t.num_gpus() == 4);
  BOOST_TEST(t.islands == (V{{0, 1}, {2, 3}}));
  BOOST_TEST(t.cliques == (V{{0, 1}, {2, 3}}));
  BOOST_TEST(t.pair(0, 2).switch_links == 18);
  BOOST_TEST(!t.pair(0, 2).nvlink_p2p);
  BOOST_TEST(t.pair(2, 3).pcie == PcieLevel::Phb);  // NVML common ancestor 30
  BOOST_TEST(t.gpus[3].cpuset == "0-31");           // NVML CPU affinity
  BOOST_TEST(has_warning(t, "0000:00:08.0 is not among hwloc's PCI devices"));
}

BOOST_AUTO_TEST_CASE(unknown_version_and_odd_peers) {
  const auto u = live("unknown_version", "h200_2gpu_vm_machine_only");
  BOOST_TEST(u.gpus[0].links_to_switch == 18);
  BOOST_TEST(u.gpus[0].link_mbps == 0u);
  BOOST_TEST(u.pair(0, 1).nvlink_mbps == 0u);
  BOOST_TEST(has_warning(u, "NVLink version enum 42 unknown"));
  const auto w = live("weird_peer", "h200_2gpu_vm_machine_only");
  BOOST_TEST(w.gpus[0].links_to_switch == 2);
  BOOST_TEST(has_warning(w, "unrecognized peer \"garbage\""));
  BOOST_TEST(has_warning(w, "remote PCI info unavailable"));
  BOOST_TEST(has_warning(w, "0000:00:07.0 is visible to hwloc but not to NVML"));
  const auto a = live("asym_direct", "h200_2gpu_vm_machine_only");
  BOOST_TEST(a.pair(0, 1).direct_links == 2);
  BOOST_TEST(has_warning(a, "the GPUs report 2 and 1"));
}

BOOST_AUTO_TEST_CASE(multi_node_fabric_identity) {
  const auto t = live("fabric", "h200_2gpu_vm_machine_only");
  BOOST_TEST_REQUIRE(t.gpus.at(0).fabric.has_value());
  BOOST_TEST(t.gpus[0].fabric->clique_id == 7u);
  BOOST_TEST(t.gpus[0].fabric->cluster_uuid[15] == 0x1f);
  KokkosMoE::DetectOptions o = mock();
  o.query_fabric = false;
  EnvGuard g("KOKKOSMOE_MOCK_NVML_SCENARIO", "fabric");
  const std::string xml = KokkosMoETest::read_fixture("h200_2gpu_vm_machine_only");
  BOOST_TEST(!KokkosMoE::Impl::detect_live(o, &xml).gpus.at(0).fabric.has_value());
}

BOOST_AUTO_TEST_CASE(minimal_nvml_symbols) {
  // Only the required symbols: no remote PCI info, so every active link is a fabric link (with a warning).
  const auto t = live("h200_vm", "h200_2gpu_vm_machine_only", true);
  BOOST_TEST_REQUIRE(t.num_gpus() == 2);
  BOOST_TEST(t.gpus[0].links_to_switch == 18);
  BOOST_TEST(t.gpus[0].uuid.empty());
  BOOST_TEST(t.gpus[0].nvlink_version == 0);
  BOOST_TEST(t.pair(0, 1).nvlink_p2p);  // derived: no P2P-status symbol
  BOOST_TEST(has_warning(t, "NVLink version query failed"));
  BOOST_TEST(t.driver_version.empty());
}

BOOST_AUTO_TEST_CASE(nvml_missing_or_failing_is_not_an_error) {
  const std::string xml = KokkosMoETest::read_fixture("h200_2gpu_vm_machine_only");
  KokkosMoE::DetectOptions o = mock();
  o.nvml_library = "/nonexistent/libnvidia-ml.so.1";
  const auto missing = KokkosMoE::Impl::detect_live(o, &xml);
  BOOST_TEST(missing.num_gpus() == 2);  // never zero GPUs when hwloc sees NVIDIA GPUs
  BOOST_TEST(!missing.nvlink_known);
  BOOST_TEST(has_warning(missing, "NVML unavailable (cannot load /nonexistent/libnvidia-ml.so.1"));
  BOOST_TEST(missing.gpus[0].model == "");  // a bare PCI device: no name without NVML
  {
    EnvGuard g("KOKKOSMOE_MOCK_NVML_SCENARIO", "init_fails");
    const auto failed = KokkosMoE::Impl::detect_live(mock(), &xml);
    BOOST_TEST(failed.num_gpus() == 2);
    BOOST_TEST(has_warning(failed, "nvmlInit_v2 failed: NVML error 9 (Driver Not Loaded)"));
  }
  {
    EnvGuard g("KOKKOSMOE_MOCK_NVML_SCENARIO", "no_devices");
    const auto none = KokkosMoE::Impl::detect_live(mock(), &xml);
    BOOST_TEST(none.num_gpus() == 0);
    BOOST_TEST(has_warning(none, "visible to hwloc but not to NVML"));
  }
  o.nvml_library = KOKKOSMOE_TEST_NOT_NVML;  // a real library without NVML's symbols
  const auto wrong = KokkosMoE::Impl::detect_live(o, &xml);
  BOOST_TEST(has_warning(wrong, "lacks the symbol nvmlInit_v2"));
  BOOST_TEST(mock_refs() == 0);
}

BOOST_AUTO_TEST_CASE(capture_round_trips) {
  check_capture_round_trip("h200_vm", "h200_2gpu_vm_machine_only");
  check_capture_round_trip("h200_1gpu", "h200_2gpu_vm_machine_only");  // 1 GPU: no matrix, infos carry the links
  check_capture_round_trip("hgx", "hgx_h100_8gpu_4sw");                // visible switches: heterogeneous matrix
  check_capture_round_trip("mesh", "dgx1_like_mesh_8gpu");
  check_capture_round_trip("container", "h200_2gpu_vm_machine_only");
  check_capture_round_trip("fabric", "h200_2gpu_vm_machine_only");
  check_capture_round_trip("unknown_version", "h200_2gpu_vm_machine_only");  // link counts without a rate
  check_capture_round_trip("h200_vm", "h200_2gpu_vm_machine_only", true);
}

BOOST_AUTO_TEST_CASE(capture_of_one_h200_shows_18_links_to_a_hidden_switch) {
  EnvGuard g("KOKKOSMOE_MOCK_NVML_SCENARIO", "h200_1gpu");
  const std::string base = KokkosMoETest::read_fixture("h200_2gpu_vm_machine_only");
  const std::string xml = KokkosMoE::Impl::capture_xml(mock(), &base);
  for (const char* info :
       {"<info name=\"NVSwitchHidden\" value=\"1\"/>", "<info name=\"NVLinkVersion\" value=\"6\"/>",
        "<info name=\"NVLinkPerLinkMBps\" value=\"25000\"/>", "<info name=\"NVLinkToSwitch\" value=\"18\"/>",
        "<info name=\"GPUModel\" value=\"NVIDIA H200\"/>", "<info name=\"NVIDIADriverVersion\" value=\"580.159.04\"/>"})
    BOOST_TEST(xml.find(info) != std::string::npos, info);
  const auto t = KokkosMoE::load_topology_xml(xml);
  BOOST_TEST(t.num_gpus() == 1);
  BOOST_TEST(t.gpus[0].links_to_switch == 18);
  BOOST_TEST(t.gpus[0].nvlink_version == 6);
  BOOST_TEST(t.nvswitch_hidden);
}

BOOST_AUTO_TEST_CASE(capture_two_h200_writes_the_fabric_matrix) {
  EnvGuard g("KOKKOSMOE_MOCK_NVML_SCENARIO", "h200_vm");
  const std::string base = KokkosMoETest::read_fixture("h200_2gpu_vm_machine_only");
  const std::string xml = KokkosMoE::Impl::capture_xml(mock(), &base);
  BOOST_TEST(xml.find("name=\"NVLinkBandwidth\"") != std::string::npos);
  BOOST_TEST(xml.find("0 450000 450000 0 ") != std::string::npos);  // FROM_USER matrix of docs/topology.md §6
  BOOST_TEST(xml.find("KokkosMoENVLinkP2P") == std::string::npos);  // P2P agrees with the links: not written
  // Capturing over a base that already has a matrix replaces it rather than adding a second one.
  const std::string again = KokkosMoE::Impl::capture_xml(mock(), &xml);
  BOOST_TEST(again.find("NVLinkBandwidth") == again.rfind("NVLinkBandwidth"));
}

BOOST_AUTO_TEST_CASE(capture_keeps_p2p_partitions) {
  EnvGuard g("KOKKOSMOE_MOCK_NVML_SCENARIO", "partition");
  const std::string base = KokkosMoETest::read_fixture("h200_2gpu_vm_machine_only");
  // Only the two GPUs hwloc knows are captured; the partition needs four, so build a four-GPU base from the fixture.
  std::string four = base;
  const std::string gpu7 = "pci_busid=\"0000:00:07.0\"";
  const auto at = four.find(gpu7);
  BOOST_TEST_REQUIRE(at != std::string::npos);
  const auto line_begin = four.rfind('\n', at) + 1;
  const auto line_end = four.find('\n', at) + 1;
  std::string line = four.substr(line_begin, line_end - line_begin);
  std::string extra;
  for (const char* dev : {"08", "09"}) {
    std::string l = line;
    l.replace(l.find("00:07.0"), 7, std::string("00:") + dev + ".0");
    l.replace(l.find("gp_index=\"") + 10, 2, std::string("9") + dev[1]);
    extra += l;
  }
  four.insert(line_end, extra);
  const NvlinkTopology detected = KokkosMoE::Impl::detect_live(mock(), &four);
  BOOST_TEST_REQUIRE(detected.num_gpus() == 4);
  const std::string xml = KokkosMoE::Impl::capture_xml(mock(), &four);
  BOOST_TEST(xml.find("KokkosMoENVLinkP2P") != std::string::npos);
  const auto loaded = KokkosMoE::load_topology_xml(xml);
  BOOST_TEST((comparable(loaded) == comparable(detected)));
  BOOST_TEST(loaded.islands == (V{{0, 1}, {2, 3}}));
}

BOOST_AUTO_TEST_SUITE_END()
