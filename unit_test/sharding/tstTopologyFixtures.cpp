/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// Every fixture of unit_test/fixtures against the model derived by hand from the machine it describes
// (docs/topology.md §6; the layouts are in unit_test/fixtures/gen_topology_fixtures.py).

#include <KokkosMoE_Topology.hpp>

#include <boost/test/unit_test.hpp>

#include <map>

#include "tstTopologyHelpers.hpp"

using KokkosMoE::NvlinkTopology;
using KokkosMoE::PcieLevel;
using KokkosMoETest::has_warning;
using KokkosMoETest::load;
using V = std::vector<std::vector<int>>;

namespace {

std::string pci(const NvlinkTopology& t, int i) { return t.gpus.at(static_cast<std::size_t>(i)).pci.str(); }
int level(const NvlinkTopology& t, int i, int j) { return static_cast<int>(t.pair(i, j).pcie); }
int lv(PcieLevel l) { return static_cast<int>(l); }

void check_symmetric(const NvlinkTopology& t) {
  for (int i = 0; i < t.num_gpus(); ++i) {
    BOOST_TEST(t.gpus[i].id == i);
    if (i > 0) BOOST_TEST((t.gpus[i - 1].pci < t.gpus[i].pci));
    for (int j = 0; j < t.num_gpus(); ++j) BOOST_TEST((t.pair(i, j) == t.pair(j, i)));
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(topology_fixtures)

BOOST_AUTO_TEST_CASE(hgx_h100_8gpu_4sw) {
  const auto t = load("hgx_h100_8gpu_4sw");
  BOOST_TEST_REQUIRE(t.num_gpus() == 8);
  check_symmetric(t);
  const char* buses[] = {"0000:1b:00.0", "0000:1f:00.0", "0000:5b:00.0", "0000:5f:00.0",
                         "0000:9b:00.0", "0000:9f:00.0", "0000:db:00.0", "0000:df:00.0"};
  for (int i = 0; i < 8; ++i) {
    const auto& g = t.gpus[i];
    BOOST_TEST(pci(t, i) == buses[i]);
    BOOST_TEST(g.model == "NVIDIA H100 80GB HBM3");
    BOOST_TEST(g.pci_device_id == 0x2330);
    BOOST_TEST(g.nvml_index.value_or(-1) == i);  // from the OS device name nvml<i>
    BOOST_TEST(g.nvlink_version == 6);           // by model: NVLink 4.0
    BOOST_TEST(g.link_mbps == 25000u);
    BOOST_TEST(g.links_to_switch == 18);  // 5 + 5 + 4 + 4 over four switches
    BOOST_TEST(g.active_links == 18);
    BOOST_TEST(g.links_to_cpu == 0);
    BOOST_TEST(g.numa_nodes == std::vector<int>{i < 4 ? 0 : 1});
    BOOST_TEST(g.cpuset == (i < 4 ? "0-7" : "8-15"));
    for (int j = 0; j < 8; ++j) {
      if (j == i) continue;
      BOOST_TEST(t.pair(i, j).switch_links == 18);
      BOOST_TEST(t.pair(i, j).direct_links == 0);
      BOOST_TEST(t.pair(i, j).nvlink_mbps == 450000u);
      BOOST_TEST(t.pair(i, j).nvlink_p2p);
      BOOST_TEST(KokkosMoE::pair_token(t, i, j) == "NV18");
    }
  }
  BOOST_TEST(t.gpus[0].uuid == "GPU-6b6d6f65-0100-4000-8000-000000001000");
  BOOST_TEST(t.gpus[7].uuid == "GPU-6b6d6f65-0100-4007-8007-000000001007");
  BOOST_TEST(t.nvswitch_visible == 4);
  BOOST_TEST(!t.nvswitch_hidden);
  BOOST_TEST(t.nvlink_known);
  BOOST_TEST(t.islands == (V{{0, 1, 2, 3, 4, 5, 6, 7}}));
  BOOST_TEST(t.cliques == (V{{0, 1, 2, 3, 4, 5, 6, 7}}));
  // Two GPUs per PCIe switch, two switches per package on separate host bridges.
  BOOST_TEST(level(t, 0, 1) == lv(PcieLevel::Pix));
  BOOST_TEST(level(t, 6, 7) == lv(PcieLevel::Pix));
  BOOST_TEST(level(t, 0, 2) == lv(PcieLevel::Node));
  BOOST_TEST(level(t, 1, 3) == lv(PcieLevel::Node));
  BOOST_TEST(level(t, 0, 4) == lv(PcieLevel::Sys));
  BOOST_TEST(level(t, 3, 7) == lv(PcieLevel::Sys));
  BOOST_TEST(t.warnings.empty());
  BOOST_TEST(t.hostname == "fixture");
  BOOST_TEST((t.source == NvlinkTopology::Source::HwlocXml));
}

// docs/topology.md §6 "default_filter_regression": the HGX fixture through the public API keeps its GPUs and matrix,
// which only happens when the loader sets hwloc's I/O filter.
BOOST_AUTO_TEST_CASE(default_filter_regression) {
  KokkosMoE::DetectOptions o;
  o.xml_buffer = KokkosMoETest::read_fixture("hgx_h100_8gpu_4sw");
  const auto t = KokkosMoE::detect_topology(o);
  BOOST_TEST(t.num_gpus() == 8);
  BOOST_TEST(t.nvswitch_visible == 4);
  BOOST_TEST(t.nvlink_known);
  BOOST_TEST(t.gpus[0].links_to_switch == 18);
}

BOOST_AUTO_TEST_CASE(h200_2gpu_vm_hidden_switch) {
  const auto t = load("h200_2gpu_vm_hidden_switch");
  BOOST_TEST_REQUIRE(t.num_gpus() == 2);
  check_symmetric(t);
  BOOST_TEST(pci(t, 0) == "0000:00:06.0");
  BOOST_TEST(pci(t, 1) == "0000:00:07.0");
  for (const auto& g : t.gpus) {
    BOOST_TEST(g.model == "NVIDIA H200");
    BOOST_TEST(g.pci_device_id == 0x2335);
    BOOST_TEST(g.links_to_switch == 18);
    BOOST_TEST(g.active_links == 18);
    BOOST_TEST(g.nvlink_version == 6);
    BOOST_TEST(g.link_mbps == 25000u);
    BOOST_TEST(g.cpuset == "0-31");
    BOOST_TEST(g.numa_nodes == std::vector<int>{0});
    BOOST_TEST(!g.nvml_index.has_value());
  }
  const auto& p = t.pair(0, 1);
  BOOST_TEST(p.switch_links == 18);
  BOOST_TEST(p.direct_links == 0);  // the GPU-GPU entry describes the hidden fabric, not direct links
  BOOST_TEST(p.nvlink_mbps == 450000u);
  BOOST_TEST(p.nvlink_p2p);
  BOOST_TEST(level(t, 0, 1) == lv(PcieLevel::Phb));  // GPUs straight under the machine (VM)
  BOOST_TEST(t.nvswitch_visible == 0);
  BOOST_TEST(t.nvswitch_hidden);
  BOOST_TEST(t.islands == (V{{0, 1}}));
  BOOST_TEST(t.cliques == (V{{0, 1}}));
  BOOST_TEST(t.warnings == std::vector<std::string>{"NVSwitch hidden: fabric assumed"});
  BOOST_TEST(t.hostname == "h200-vm");
  const std::string report = KokkosMoE::topology_report(t);
  BOOST_TEST(report.find("GPU0     X      NV18") != std::string::npos, report);
  BOOST_TEST(report.find("GPU1    NV18     X") != std::string::npos);
  BOOST_TEST(report.find("hidden fabric") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(dgx2_like_16gpu_12sw) {
  const auto t = load("dgx2_like_16gpu_12sw");
  BOOST_TEST_REQUIRE(t.num_gpus() == 16);
  check_symmetric(t);
  for (int i = 0; i < 16; ++i) {
    BOOST_TEST(t.gpus[i].links_to_switch == 6);
    BOOST_TEST(t.gpus[i].active_links == 6);
    BOOST_TEST(t.gpus[i].nvlink_version == 2);
    BOOST_TEST(t.gpus[i].numa_nodes == std::vector<int>{i < 8 ? 0 : 1});
    for (int j = i + 1; j < 16; ++j) {
      // Across baseboards too: all switches of a host form one fabric.
      BOOST_TEST(t.pair(i, j).switch_links == 6);
      BOOST_TEST(t.pair(i, j).nvlink_mbps == 150000u);
      BOOST_TEST(t.pair(i, j).nvlink_p2p);
    }
  }
  BOOST_TEST(t.nvswitch_visible == 12);  // including the one stored with class 0000 (found by subtype)
  BOOST_TEST(!t.nvswitch_hidden);
  BOOST_TEST(t.islands == (V{{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}}));
  BOOST_TEST(t.cliques.size() == 1u);
  BOOST_TEST(level(t, 0, 1) == lv(PcieLevel::Pix));
  BOOST_TEST(level(t, 0, 2) == lv(PcieLevel::Node));
  BOOST_TEST(level(t, 7, 8) == lv(PcieLevel::Sys));
  BOOST_TEST(t.warnings.empty());
}

BOOST_AUTO_TEST_CASE(pcie_pairs_4gpu) {
  const auto t = load("pcie_pairs_4gpu");
  BOOST_TEST_REQUIRE(t.num_gpus() == 4);
  check_symmetric(t);
  for (int i = 0; i < 4; ++i) {
    BOOST_TEST(t.gpus[i].active_links == 4);
    BOOST_TEST(t.gpus[i].links_to_switch == 0);
    BOOST_TEST(t.gpus[i].nvlink_version == 5);
    BOOST_TEST(t.gpus[i].nvml_index.value_or(-1) == i);  // OS devices with an unusual osdev_type still count
    BOOST_TEST(t.gpus[i].model == "NVIDIA A100 80GB PCIe");
  }
  BOOST_TEST(t.pair(0, 1).direct_links == 4);
  BOOST_TEST(t.pair(2, 3).direct_links == 4);
  BOOST_TEST(t.pair(0, 1).nvlink_mbps == 100000u);
  for (auto [i, j] : {std::pair{0, 2}, std::pair{0, 3}, std::pair{1, 2}, std::pair{1, 3}}) {
    BOOST_TEST(t.pair(i, j).direct_links == 0);
    BOOST_TEST(!t.pair(i, j).nvlink_p2p);
    BOOST_TEST(level(t, i, j) == lv(PcieLevel::Pxb));  // three PCIe switches between the pairs
    BOOST_TEST(KokkosMoE::pair_token(t, i, j) == "PXB");
  }
  BOOST_TEST(level(t, 0, 1) == lv(PcieLevel::Pix));
  BOOST_TEST(level(t, 2, 3) == lv(PcieLevel::Pix));
  BOOST_TEST(t.islands == (V{{0, 1}, {2, 3}}));
  BOOST_TEST(t.cliques == (V{{0, 1}, {2, 3}}));
  BOOST_TEST(t.nvswitch_visible == 0);
  BOOST_TEST(!t.nvswitch_hidden);
  BOOST_TEST(t.warnings.empty());
}

BOOST_AUTO_TEST_CASE(dgx1_like_mesh_8gpu) {
  const auto t = load("dgx1_like_mesh_8gpu");
  BOOST_TEST_REQUIRE(t.num_gpus() == 8);
  check_symmetric(t);
  const std::map<std::pair<int, int>, int> links = {
      {{0, 1}, 1}, {{0, 2}, 1}, {{0, 3}, 2}, {{0, 4}, 2}, {{1, 2}, 2}, {{1, 3}, 1}, {{1, 5}, 2}, {{2, 3}, 2},
      {{2, 6}, 1}, {{3, 7}, 1}, {{4, 5}, 1}, {{4, 6}, 1}, {{4, 7}, 2}, {{5, 6}, 2}, {{5, 7}, 1}, {{6, 7}, 2}};
  for (int i = 0; i < 8; ++i) {
    BOOST_TEST(t.gpus[i].active_links == 6);
    BOOST_TEST(t.gpus[i].links_to_switch == 0);
    BOOST_TEST(t.gpus[i].link_mbps == 25000u);  // root info NVLinkPerLinkMBps
    BOOST_TEST(t.gpus[i].numa_nodes == std::vector<int>{i < 4 ? 0 : 1});
    for (int j = i + 1; j < 8; ++j) {
      auto it = links.find({i, j});
      const int expect = it == links.end() ? 0 : it->second;
      BOOST_TEST(t.pair(i, j).direct_links == expect, i << "-" << j);
      BOOST_TEST(t.pair(i, j).nvlink_p2p == (expect > 0));
      BOOST_TEST(t.pair(i, j).nvlink_mbps == 25000u * static_cast<unsigned>(expect));
    }
  }
  BOOST_TEST(t.islands == (V{{0, 1, 2, 3, 4, 5, 6, 7}}));
  BOOST_TEST(t.cliques == (V{{0, 1, 2, 3}, {0, 4}, {1, 5}, {2, 6}, {3, 7}, {4, 5, 6, 7}}));
  BOOST_TEST(level(t, 0, 1) == lv(PcieLevel::Pix));
  BOOST_TEST(level(t, 0, 2) == lv(PcieLevel::Node));
  BOOST_TEST(level(t, 0, 5) == lv(PcieLevel::Sys));
  BOOST_TEST(KokkosMoE::pair_token(t, 0, 5) == "SYS");
  BOOST_TEST(KokkosMoE::pair_token(t, 0, 3) == "NV2");
  BOOST_TEST(KokkosMoE::pair_token(t, 0, 1) == "NV1");
  BOOST_TEST(t.warnings.empty());
}

BOOST_AUTO_TEST_CASE(power8_like_gpu_cpu) {
  const auto t = load("power8_like_gpu_cpu");
  BOOST_TEST_REQUIRE(t.num_gpus() == 4);
  check_symmetric(t);
  const char* addrs[] = {"0000:01:00.0", "0001:21:00.0", "0002:41:00.0", "0003:61:00.0"};
  for (int i = 0; i < 4; ++i) {
    BOOST_TEST(pci(t, i) == addrs[i]);
    BOOST_TEST(t.gpus[i].links_to_cpu == 2);  // 40000 MB/s to its package at 20000 per P100 link
    BOOST_TEST(t.gpus[i].active_links == 4);
    BOOST_TEST(t.gpus[i].link_mbps == 20000u);
    BOOST_TEST(t.gpus[i].nvlink_version == 1);
    BOOST_TEST(t.gpus[i].numa_nodes == std::vector<int>{i / 2});
  }
  BOOST_TEST(t.pair(0, 1).direct_links == 2);
  BOOST_TEST(t.pair(2, 3).direct_links == 2);
  BOOST_TEST(t.pair(0, 2).direct_links == 0);
  BOOST_TEST(level(t, 0, 1) == lv(PcieLevel::Node));  // two host bridges of one package
  BOOST_TEST(level(t, 1, 2) == lv(PcieLevel::Sys));
  BOOST_TEST(t.islands == (V{{0, 1}, {2, 3}}));
  BOOST_TEST(t.warnings.empty());
}

BOOST_AUTO_TEST_CASE(no_gpu) {
  const auto t = load("no_gpu");
  BOOST_TEST(t.num_gpus() == 0);
  BOOST_TEST(t.pairs.empty());
  BOOST_TEST(t.islands.empty());
  BOOST_TEST(t.cliques.empty());
  BOOST_TEST(t.nvswitch_visible == 0);
  BOOST_TEST(t.warnings.empty());
  BOOST_TEST(KokkosMoE::topology_report(t).find("No GPUs found.") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(gpu_without_matrix_warns) {
  const auto t = load("gpu_without_matrix");
  BOOST_TEST(t.num_gpus() == 2);
  BOOST_TEST(!t.nvlink_known);
  BOOST_TEST(has_warning(t, "no NVLinkBandwidth matrix"));
  BOOST_TEST(!t.pair(0, 1).nvlink_p2p);
  BOOST_TEST(t.islands == (V{{0}, {1}}));
  BOOST_TEST(level(t, 0, 1) == lv(PcieLevel::Phb));  // one host bridge
}

BOOST_AUTO_TEST_CASE(asymmetric_matrix_takes_minimum) {
  const auto t = load("asymmetric_matrix");
  BOOST_TEST(t.pair(0, 1).direct_links == 2);  // min(100000, 50000) / 25000
  BOOST_TEST(t.pair(0, 1).nvlink_mbps == 50000u);
  BOOST_TEST(has_warning(t, "asymmetric"));
}

BOOST_AUTO_TEST_CASE(report_has_legend_and_affinity) {
  const auto t = load("dgx1_like_mesh_8gpu");
  const std::string r = KokkosMoE::topology_report(t);
  for (const char* token : {"Legend:", "  X    = ", "  SYS  = ", "  NODE = ", "  PHB  = ", "  PXB  = ", "  PIX  = ",
                            "  NV#  = ", "CPU Affinity", "NUMA Affinity", "Islands (1): {0,1,2,3,4,5,6,7}",
                            "Cliques (6): {0,1,2,3} {0,4} {1,5} {2,6} {3,7} {4,5,6,7}", "8-15            1"})
    BOOST_TEST(r.find(token) != std::string::npos, token);
}

BOOST_AUTO_TEST_SUITE_END()
