/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// docs/topology.md §4.2's link classification as a pure function: hwloc scans and NVML snapshots built by hand.

#include <KokkosMoE_Topology.hpp>

#include <boost/test/unit_test.hpp>

#include "impl/KokkosMoE_Topology_Scan.hpp"
#include "tstTopologyHelpers.hpp"

using KokkosMoE::PciAddress;
using KokkosMoE::PcieLevel;
using KokkosMoE::Impl::HostScan;
using KokkosMoE::Impl::NvmlGpu;
using KokkosMoE::Impl::NvmlLink;
using KokkosMoE::Impl::NvmlSnapshot;
using KokkosMoETest::has_warning;

namespace {

PciAddress addr(const char* s) { return *PciAddress::parse(s); }

HostScan scan_of(const std::vector<const char*>& gpus, const std::vector<const char*>& switches = {}) {
  HostScan s;
  for (const char* g : gpus) {
    KokkosMoE::Impl::ScannedGpu sg;
    sg.pci = addr(g);
    sg.cpuset = "0-15";
    sg.numa_nodes = {0};
    s.gpus.push_back(sg);
  }
  for (const char* w : switches) s.nvswitches.push_back(addr(w));
  const std::size_t n = s.gpus.size();
  s.pcie.assign(n * n, PcieLevel::Phb);
  return s;
}

NvmlGpu nvml_gpu(int index, const char* bus) {
  NvmlGpu g;
  g.nvml_index = index;
  g.bus_id = bus;
  g.pci = PciAddress::parse(bus);
  g.name = "NVIDIA H200";
  g.uuid = std::string("GPU-") + std::to_string(index);
  return g;
}

NvmlLink link_to(const std::string& remote, int type, unsigned version = 6) {
  NvmlLink l;
  l.active = true;
  l.p2p_capable = true;
  l.version = version;
  l.remote_ok = true;
  l.remote_bus_id = remote;
  l.remote_type = type;
  return l;
}

NvmlSnapshot snapshot(std::vector<NvmlGpu> gpus) {
  NvmlSnapshot s;
  s.available = true;
  s.status = "ok";
  s.gpus = std::move(gpus);
  return s;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(topology_live_model)

BOOST_AUTO_TEST_CASE(hidden_switch_sentinels) {
  // Both spellings of the sentinel, an all-F domain and an empty bus id are switch links of a hidden fabric.
  auto a = nvml_gpu(0, "00000000:00:06.0");
  auto b = nvml_gpu(1, "00000000:00:07.0");
  for (int l = 0; l < 18; ++l) {
    a.links.push_back(link_to(l % 2 ? "FFFFFFFF:FF:FF.0" : "fffffff:ff:ff.0", 2));
    b.links.push_back(link_to(l % 3 ? "" : "FFFFFFFF:FF:FF.0", 255));
  }
  b.links[4].remote_domain = 0xffffffffu;
  const auto t =
      KokkosMoE::Impl::topology_from_live(scan_of({"0000:00:06.0", "0000:00:07.0"}), snapshot({a, b}), nullptr);
  BOOST_TEST(t.gpus[0].links_to_switch == 18);
  BOOST_TEST(t.gpus[1].links_to_switch == 18);
  BOOST_TEST(t.pair(0, 1).switch_links == 18);
  BOOST_TEST(t.pair(0, 1).nvlink_mbps == 18u * 25000u);
  BOOST_TEST(t.nvswitch_hidden);
  BOOST_TEST(has_warning(t, "NVSwitch hidden: fabric assumed"));
  BOOST_TEST(t.pair(0, 1).pcie == PcieLevel::Phb);
}

BOOST_AUTO_TEST_CASE(gpu_order_is_pci_order_not_nvml_order) {
  auto late = nvml_gpu(0, "00000000:9b:00.0");
  auto early = nvml_gpu(1, "00000000:1b:00.0");
  late.links = {link_to("00000000:1b:00.0", 0), link_to("00000000:1b:00.0", 0)};
  early.links = {link_to("00000000:9b:00.0", 0), link_to("00000000:9b:00.0", 0)};
  const auto t =
      KokkosMoE::Impl::topology_from_live(scan_of({"0000:1b:00.0", "0000:9b:00.0"}), snapshot({late, early}), nullptr);
  BOOST_TEST(t.gpus[0].pci.str() == "0000:1b:00.0");
  BOOST_TEST(t.gpus[0].nvml_index.value_or(-1) == 1);
  BOOST_TEST(t.gpus[1].nvml_index.value_or(-1) == 0);
  BOOST_TEST(t.pair(0, 1).direct_links == 2);  // counted once, not 4
  BOOST_TEST(t.gpus[0].active_links == 2);
}

BOOST_AUTO_TEST_CASE(visible_switch_cpu_link_and_invisible_gpu) {
  auto g = nvml_gpu(0, "00000000:1b:00.0");
  g.links = {link_to("00000000:e1:00.0", 255),  // a visible NVSwitch: classified by hwloc's object, not the type
             link_to("00000000:e1:00.0", 2), link_to("00000000:e2:00.0", 2),
             link_to("00000000:04:00.0", 1),   // IBMNPU: NVLink to the CPU
             link_to("00000000:77:00.0", 0)};  // a GPU this process cannot see (container)
  NvmlLink no_p2p = link_to("00000000:e1:00.0", 2);
  no_p2p.p2p_capable = false;
  g.links.push_back(no_p2p);
  NvmlLink inactive = link_to("00000000:e1:00.0", 2);
  inactive.active = false;
  g.links.push_back(inactive);
  KokkosMoE::Impl::SwitchLinkTable table;
  const auto t = KokkosMoE::Impl::topology_from_live(scan_of({"0000:1b:00.0"}, {"0000:e1:00.0", "0000:e2:00.0"}),
                                                     snapshot({g}), &table);
  BOOST_TEST(t.gpus[0].links_to_switch == 3);
  BOOST_TEST(t.gpus[0].links_to_cpu == 1);
  BOOST_TEST(t.gpus[0].active_links == 6);  // everything active, including the hidden GPU and the non-P2P link
  BOOST_TEST(!t.nvswitch_hidden);
  BOOST_TEST(t.nvswitch_visible == 2);
  BOOST_TEST(has_warning(t, "is not visible (container or cgroup)"));
  BOOST_TEST_REQUIRE(table.size() == 1u);
  BOOST_TEST(table[0].at(addr("0000:e1:00.0")) == 2);
  BOOST_TEST(table[0].at(addr("0000:e2:00.0")) == 1);
}

BOOST_AUTO_TEST_CASE(unknown_version_keeps_counts) {
  auto g = nvml_gpu(0, "00000000:00:06.0");
  for (int l = 0; l < 4; ++l) g.links.push_back(link_to("FFFFFFFF:FF:FF.0", 2, 42));
  const auto t = KokkosMoE::Impl::topology_from_live(scan_of({"0000:00:06.0"}), snapshot({g}), nullptr);
  BOOST_TEST(t.gpus[0].links_to_switch == 4);
  BOOST_TEST(t.gpus[0].nvlink_version == 42);
  BOOST_TEST(t.gpus[0].link_mbps == 0u);
  BOOST_TEST(has_warning(t, "NVLink version enum 42 unknown"));
}

BOOST_AUTO_TEST_CASE(p2p_status_overrides_derived_reachability) {
  std::vector<NvmlGpu> gpus;
  const char* buses[] = {"00000000:00:06.0", "00000000:00:07.0", "00000000:00:08.0"};
  for (int k = 0; k < 3; ++k) {
    gpus.push_back(nvml_gpu(k, buses[k]));
    for (int l = 0; l < 18; ++l) gpus.back().links.push_back(link_to("FFFFFFFF:FF:FF.0", 2));
  }
  auto snap = snapshot(gpus);
  snap.p2p.assign(9, true);
  snap.p2p[0 * 3 + 2] = snap.p2p[2 * 3 + 0] = false;  // a fabric-manager partition separates GPUs 0 and 2
  snap.p2p[1 * 3 + 2] = std::nullopt;                 // query failed for (1,2): derived
  snap.p2p[2 * 3 + 1] = std::nullopt;
  const auto t =
      KokkosMoE::Impl::topology_from_live(scan_of({"0000:00:06.0", "0000:00:07.0", "0000:00:08.0"}), snap, nullptr);
  BOOST_TEST(!t.pair(0, 2).nvlink_p2p);
  BOOST_TEST(t.pair(0, 2).switch_links == 18);  // the links exist; NVML says they do not connect the pair
  BOOST_TEST(t.pair(1, 2).nvlink_p2p);
  BOOST_TEST(t.pair(0, 1).nvlink_p2p);
  BOOST_TEST(has_warning(t, "fabric partition"));
  using V = std::vector<std::vector<int>>;
  BOOST_TEST(t.islands == (V{{0, 1, 2}}));
  BOOST_TEST(t.cliques == (V{{0, 1}, {1, 2}}));
}

BOOST_AUTO_TEST_CASE(locality_fallbacks) {
  // GPU 1 is not in the hwloc scan: locality from NVML, PCIe level from NVML's common ancestor.
  auto a = nvml_gpu(0, "00000000:00:06.0");
  auto b = nvml_gpu(1, "00000000:00:07.0");
  b.cpuset = "16-31";
  b.numa_nodes = {1};
  auto snap = snapshot({a, b});
  snap.common_ancestor.assign(4, 40);
  const auto scan = scan_of({"0000:00:06.0", "0000:00:09.0"});
  const auto t = KokkosMoE::Impl::topology_from_live(scan, snap, nullptr);
  BOOST_TEST(t.gpus[0].cpuset == "0-15");
  BOOST_TEST(t.gpus[1].cpuset == "16-31");
  BOOST_TEST(t.gpus[1].numa_nodes == std::vector<int>{1});
  BOOST_TEST(t.pair(0, 1).pcie == PcieLevel::Node);
  BOOST_TEST(has_warning(t, "0000:00:07.0 is not among hwloc's PCI devices"));
  BOOST_TEST(has_warning(t, "0000:00:09.0 is visible to hwloc but not to NVML"));
  BOOST_TEST(t.num_gpus() == 2);
}

BOOST_AUTO_TEST_CASE(hwloc_only_fallback) {
  const auto t = KokkosMoE::Impl::topology_from_hwloc_only(scan_of({"0000:00:06.0", "0000:00:07.0"}),
                                                           "cannot load libnvidia-ml.so.1");
  BOOST_TEST(t.num_gpus() == 2);
  BOOST_TEST(!t.nvlink_known);
  BOOST_TEST(has_warning(t, "NVML unavailable (cannot load libnvidia-ml.so.1): GPUs from hwloc's PCI devices"));
  BOOST_TEST(t.pair(0, 1).pcie == PcieLevel::Phb);
  BOOST_TEST(!t.pair(0, 1).nvlink_p2p);
}

BOOST_AUTO_TEST_SUITE_END()
