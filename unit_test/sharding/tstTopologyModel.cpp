/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// The value-type layer: PCI addresses, PCIe tokens, pair access, islands and cliques (checked against brute force).

#include <KokkosMoE_Topology.hpp>

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <random>

#include "impl/KokkosMoE_Topology_Scan.hpp"
#include "tstTopologyHelpers.hpp"

using KokkosMoE::GpuPair;
using KokkosMoE::NvlinkTopology;
using KokkosMoE::PciAddress;
using KokkosMoE::PcieLevel;
using KokkosMoETest::graph;

namespace KokkosMoE::Impl {
std::vector<std::vector<int>> nvlink_cliques_capped(const NvlinkTopology& topo, std::size_t limit, bool* truncated);
}

namespace {

// All maximal cliques by enumerating every subset (n <= 12).
std::vector<std::vector<int>> brute_force_cliques(const NvlinkTopology& t) {
  const int n = t.num_gpus();
  auto edge = [&](int a, int b) { return t.pair(a, b).nvlink_p2p; };
  std::vector<unsigned> cliques;
  for (unsigned s = 1; s < (1u << n); ++s) {
    bool ok = true;
    for (int a = 0; a < n && ok; ++a)
      for (int b = a + 1; b < n && ok; ++b)
        if ((s >> a & 1) && (s >> b & 1)) ok = edge(a, b);
    if (ok) cliques.push_back(s);
  }
  std::vector<std::vector<int>> out;
  for (unsigned s : cliques) {
    bool maximal = true;
    for (unsigned u : cliques)
      if (u != s && (u & s) == s) maximal = false;
    if (!maximal) continue;
    std::vector<int> c;
    for (int a = 0; a < n; ++a)
      if (s >> a & 1) c.push_back(a);
    out.push_back(c);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(topology_model)

BOOST_AUTO_TEST_CASE(pci_address_parse_and_print) {
  auto a = PciAddress::parse("0000:18:00.0");
  BOOST_TEST_REQUIRE(a.has_value());
  BOOST_TEST(a->domain == 0u);
  BOOST_TEST(a->bus == 0x18);
  BOOST_TEST(a->str() == "0000:18:00.0");
  auto nvml = PciAddress::parse("00000000:1B:00.0");  // NVML's 8-digit, upper-case form
  BOOST_TEST_REQUIRE(nvml.has_value());
  BOOST_TEST(nvml->str() == "0000:1b:00.0");
  BOOST_TEST(PciAddress::parse("1b:1f.7")->str() == "0000:1b:1f.7");
  BOOST_TEST(PciAddress::parse("  0001:02:03.4\n")->str() == "0001:02:03.4");
  auto big = PciAddress::parse("00010000:e0:00.0");
  BOOST_TEST_REQUIRE(big.has_value());
  BOOST_TEST(big->str() == "00010000:e0:00.0");
  BOOST_TEST(PciAddress::parse("FFFFFFFF:FF:FF.0")->domain == 0xffffffffu);
  BOOST_TEST(PciAddress::parse("fffffff:ff:ff.0")->domain == 0x0fffffffu);  // NCCL's spelling parses too
  for (const char* bad : {"", "0000:18:00", "0000:18:00.8", "zz:00.0", "0000:1:00.0", "00:18:00.0", "0000:18:00.0.1",
                          "000000000:18:00.0", "0000:18:00.x", "garbage"})
    BOOST_TEST(!PciAddress::parse(bad).has_value(), bad);
}

BOOST_AUTO_TEST_CASE(pci_address_order) {
  const auto a = *PciAddress::parse("0000:07:00.0");
  const auto b = *PciAddress::parse("0000:18:00.0");
  const auto c = *PciAddress::parse("0001:00:00.0");
  const auto d = *PciAddress::parse("0000:18:00.1");
  BOOST_TEST((a < b && b < d && d < c));
  BOOST_TEST(!(b < a));
  BOOST_TEST((a == *PciAddress::parse("00000000:07:00.0")));
  BOOST_TEST((a != b));
}

BOOST_AUTO_TEST_CASE(nvml_sentinel_spellings) {
  using KokkosMoE::Impl::is_nvml_sentinel;
  BOOST_TEST(is_nvml_sentinel(0xffffffffu, "whatever"));
  BOOST_TEST(is_nvml_sentinel(0, "FFFFFFFF:FF:FF.0"));
  BOOST_TEST(is_nvml_sentinel(0, "fffffff:ff:ff.0"));
  BOOST_TEST(is_nvml_sentinel(0, ""));
  BOOST_TEST(is_nvml_sentinel(0, std::string("00\x01:00.0")));
  BOOST_TEST(!is_nvml_sentinel(0, "00000000:00:06.0"));
  BOOST_TEST(!is_nvml_sentinel(0, "0000:ff:00.0"));
}

BOOST_AUTO_TEST_CASE(pcie_tokens_round_trip) {
  for (PcieLevel l : {PcieLevel::Internal, PcieLevel::Pix, PcieLevel::Pxb, PcieLevel::Phb, PcieLevel::Node,
                      PcieLevel::Sys, PcieLevel::Unknown}) {
    const auto back = KokkosMoE::pcie_level_from_string(KokkosMoE::to_string(l));
    BOOST_TEST_REQUIRE(back.has_value());
    BOOST_TEST(static_cast<int>(*back) == static_cast<int>(l));
  }
  BOOST_TEST(std::string(KokkosMoE::to_string(PcieLevel::Node)) == "NODE");
  BOOST_TEST(static_cast<int>(PcieLevel::Sys) == 50);  // NVML's common-ancestor values
  BOOST_TEST(!KokkosMoE::pcie_level_from_string("NV4").has_value());
}

BOOST_AUTO_TEST_CASE(link_rates_by_version_and_model) {
  using namespace KokkosMoE::Impl;
  BOOST_TEST(nvlink_rate_mbps(1) == 20000u);
  for (int v = 2; v <= 6; ++v) BOOST_TEST(nvlink_rate_mbps(v) == 25000u);
  BOOST_TEST(nvlink_rate_mbps(7) == 50000u);
  BOOST_TEST(nvlink_rate_mbps(0) == 0u);
  BOOST_TEST(nvlink_rate_mbps(8) == 0u);  // NVLink 6.0: not claimed here, counts only
  BOOST_TEST(nvlink_rate_mbps(42) == 0u);
  BOOST_TEST(nvlink_rate_for_model("NVIDIA H200") == 25000u);
  BOOST_TEST(nvlink_rate_for_model("Tesla P100-SXM2-16GB") == 20000u);
  BOOST_TEST(nvlink_rate_for_model("NVIDIA B200") == 50000u);
  BOOST_TEST(nvlink_rate_for_model("NVIDIA GeForce RTX 4090") == 0u);
  BOOST_TEST(nvlink_version_for_model("NVIDIA A100-SXM4-80GB") == 5);
}

BOOST_AUTO_TEST_CASE(pair_access_checks_indices) {
  NvlinkTopology t = graph(3, {{0, 2}});
  BOOST_TEST(t.pair(0, 2).nvlink_p2p);
  BOOST_TEST(t.pair(2, 0).nvlink_p2p);
  BOOST_TEST(!t.pair(0, 1).nvlink_p2p);
  for (auto [i, j] : {std::pair{-1, 0}, std::pair{0, 3}, std::pair{3, 3}}) {
    try {
      (void)t.pair(i, j);
      BOOST_FAIL("pair(" << i << ", " << j << ") did not throw");
    } catch (const KokkosMoE::InvalidArgument& e) {
      BOOST_TEST(static_cast<int>(e.rule()) == static_cast<int>(KokkosMoE::Rule::GpuIndexRange));
      BOOST_TEST(e.function() == "NvlinkTopology::pair");
    }
  }
  BOOST_CHECK_THROW(KokkosMoE::pair_token(t, 0, 5), KokkosMoE::InvalidArgument);
}

BOOST_AUTO_TEST_CASE(find_gpu_by_pci_and_uuid) {
  NvlinkTopology t = graph(2, {});
  t.gpus[1].uuid = "GPU-abc";
  BOOST_TEST(t.find_gpu(t.gpus[1].pci).value_or(-1) == 1);
  BOOST_TEST(!t.find_gpu(*PciAddress::parse("0000:55:00.0")).has_value());
  BOOST_TEST(t.find_gpu_by_uuid("GPU-abc").value_or(-1) == 1);
  BOOST_TEST(!t.find_gpu_by_uuid("").has_value());
}

BOOST_AUTO_TEST_CASE(pair_tokens) {
  NvlinkTopology t = graph(3, {});
  t.pair(0, 1).direct_links = 4;
  t.pair(1, 0).direct_links = 4;
  t.pair(0, 2).switch_links = 18;
  t.pair(0, 2).direct_links = 2;
  t.pair(1, 2).pcie = PcieLevel::Pxb;
  BOOST_TEST(KokkosMoE::pair_token(t, 1, 1) == "X");
  BOOST_TEST(KokkosMoE::pair_token(t, 0, 1) == "NV4");
  BOOST_TEST(KokkosMoE::pair_token(t, 0, 2) == "NV20");
  BOOST_TEST(KokkosMoE::pair_token(t, 1, 2) == "PXB");
  BOOST_TEST(KokkosMoE::pair_token(t, 2, 1) == "N/A");  // only (1,2) was set: the token reads the pair asked for
}

BOOST_AUTO_TEST_CASE(islands_and_cliques_small_graphs) {
  BOOST_TEST(KokkosMoE::nvlink_islands(graph(0, {})).empty());
  BOOST_TEST(KokkosMoE::nvlink_cliques(graph(0, {})).empty());
  using V = std::vector<std::vector<int>>;
  BOOST_TEST(KokkosMoE::nvlink_islands(graph(3, {})) == (V{{0}, {1}, {2}}));
  BOOST_TEST(KokkosMoE::nvlink_cliques(graph(3, {})) == (V{{0}, {1}, {2}}));
  const auto path = graph(4, {{0, 1}, {1, 2}});
  BOOST_TEST(KokkosMoE::nvlink_islands(path) == (V{{0, 1, 2}, {3}}));
  BOOST_TEST(KokkosMoE::nvlink_cliques(path) == (V{{0, 1}, {1, 2}, {3}}));
  const auto k4 = graph(4, {{0, 1}, {0, 2}, {0, 3}, {1, 2}, {1, 3}, {2, 3}});
  BOOST_TEST(KokkosMoE::nvlink_cliques(k4) == (V{{0, 1, 2, 3}}));
  const auto two = graph(5, {{3, 4}, {0, 2}});
  BOOST_TEST(KokkosMoE::nvlink_islands(two) == (V{{0, 2}, {1}, {3, 4}}));
}

BOOST_AUTO_TEST_CASE(cliques_match_brute_force_on_random_graphs) {
  std::mt19937 rng(20240604u);
  for (int trial = 0; trial < 300; ++trial) {
    const int n = 1 + trial % 11;
    std::bernoulli_distribution coin(0.2 + 0.6 * ((trial / 11) % 5) / 4.0);
    std::vector<std::pair<int, int>> edges;
    for (int a = 0; a < n; ++a)
      for (int b = a + 1; b < n; ++b)
        if (coin(rng)) edges.emplace_back(a, b);
    const auto t = graph(n, edges);
    const auto expected = brute_force_cliques(t);
    BOOST_TEST_REQUIRE((KokkosMoE::nvlink_cliques(t) == expected), "trial " << trial << " n " << n);
    // Islands: every clique lies inside one island, and islands partition the GPUs.
    const auto islands = KokkosMoE::nvlink_islands(t);
    std::vector<int> seen(static_cast<std::size_t>(n), 0);
    for (const auto& isl : islands)
      for (int g : isl) ++seen[g];
    BOOST_TEST(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
    for (const auto& c : expected) {
      const auto& isl = *std::find_if(islands.begin(), islands.end(),
                                      [&](const auto& i) { return std::find(i.begin(), i.end(), c[0]) != i.end(); });
      for (int g : c) BOOST_TEST((std::find(isl.begin(), isl.end(), g) != isl.end()));
    }
  }
}

BOOST_AUTO_TEST_CASE(clique_enumeration_is_capped) {
  // Moon-Moser graph: complement of 8 disjoint triangles has 3^8 = 6561 maximal cliques.
  const int n = 24;
  std::vector<std::pair<int, int>> edges;
  for (int a = 0; a < n; ++a)
    for (int b = a + 1; b < n; ++b)
      if (a / 3 != b / 3) edges.emplace_back(a, b);
  const auto t = graph(n, edges);
  BOOST_TEST(KokkosMoE::nvlink_cliques(t).size() == 6561u);
  bool truncated = false;
  const auto capped = KokkosMoE::Impl::nvlink_cliques_capped(t, 100, &truncated);
  BOOST_TEST(truncated);
  BOOST_TEST(capped.size() == 100u);
}

BOOST_AUTO_TEST_CASE(detect_rejects_two_fixtures) {
  KokkosMoE::DetectOptions o;
  o.xml_path = KokkosMoETest::fixture_path("no_gpu");
  o.xml_buffer = KokkosMoETest::read_fixture("no_gpu");
  try {
    (void)KokkosMoE::detect_topology(o);
    BOOST_FAIL("no exception");
  } catch (const KokkosMoE::InvalidArgument& e) {
    BOOST_TEST(static_cast<int>(e.rule()) == static_cast<int>(KokkosMoE::Rule::ConfigValue));
  }
}

BOOST_AUTO_TEST_CASE(detect_honors_environment) {
  {
    KokkosMoETest::EnvGuard g("KOKKOSMOE_TOPO_XML", KokkosMoETest::fixture_path("pcie_pairs_4gpu").c_str());
    const auto t = KokkosMoE::detect_topology();
    BOOST_TEST(t.num_gpus() == 4);
    BOOST_TEST((t.source == NvlinkTopology::Source::HwlocXml));
  }
  {
    KokkosMoETest::EnvGuard a("KOKKOSMOE_TOPO_XML", nullptr);
    KokkosMoETest::EnvGuard b("HWLOC_XMLFILE", KokkosMoETest::fixture_path("dgx1_like_mesh_8gpu").c_str());
    const auto t = KokkosMoE::detect_topology();
    BOOST_TEST(t.num_gpus() == 8);
  }
  {
    // honor_env = false: the environment's fixture is not used; the explicit buffer wins regardless.
    KokkosMoETest::EnvGuard g("KOKKOSMOE_TOPO_XML", KokkosMoETest::fixture_path("pcie_pairs_4gpu").c_str());
    KokkosMoE::DetectOptions o;
    o.honor_env = false;
    o.xml_buffer = KokkosMoETest::read_fixture("h200_2gpu_vm_hidden_switch");
    BOOST_TEST(KokkosMoE::detect_topology(o).num_gpus() == 2);
    o.xml_buffer.reset();
    o.allow_nvml = false;
    const auto live = KokkosMoE::detect_topology(o);
    BOOST_TEST((live.source == NvlinkTopology::Source::Live));
  }
}

BOOST_AUTO_TEST_SUITE_END()
