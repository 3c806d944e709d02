/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// Nothing vanishes silently from a topology: every GPU of the input is in the model or named in an error
// or a warning; NVSwitches are recognized by subtype in fixtures (docs/topology.md §5.2).

#include <KokkosMoE_Topology.hpp>

#include <boost/test/unit_test.hpp>

#include <string>

#include "tstTopologyHelpers.hpp"

namespace {

using KokkosMoE::NvlinkTopology;

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

const std::string kGpu1 =
    "<object type=\"PCIDev\" gp_index=\"69\" pci_busid=\"0000:00:07.0\" pci_type=\"0302 [10de:2335] [10de:2435] a1\"";

// A third H200 that the NVLinkBandwidth matrix does not list.
std::string with_third_gpu(const std::string& base) {
  return replace_first(base, kGpu1,
                       "<object type=\"PCIDev\" gp_index=\"70\" pci_busid=\"0000:00:08.0\" pci_type=\"0302 "
                       "[10de:2335] [10de:2435] a1\" pci_link_speed=\"0.000000\"/>\n    " +
                           kGpu1);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(topology_nothing_vanishes)

BOOST_AUTO_TEST_CASE(unreadable_pci_addresses_are_errors) {
  // hwloc drops a PCI object whose pci_busid its sscanf cannot read -- the GPU vanished with its links, silently.
  const std::string base = KokkosMoETest::read_fixture("h200_2gpu_vm_hidden_switch");
  for (const char* bad : {"0000:00:07", "zz:00:07.0", "0000:00:07.0 ", "10000:00:07.0", "0000:000:07.0", "", "GPU1"}) {
    const std::string xml = replace_first(base, "pci_busid=\"0000:00:07.0\"", std::string("pci_busid=\"") + bad + "\"");
    const std::string e = error_of(xml);
    BOOST_TEST(e.find("line 114: <object>: pci_busid=\"" + std::string(bad) + "\" is not a PCI address hwloc reads") !=
                   std::string::npos,
               bad << ": " << e);
  }
  // hwloc reads a 1- to 4-digit domain and upper-case hex alike
  const NvlinkTopology t =
      KokkosMoE::load_topology_xml(replace_first(base, "pci_busid=\"0000:00:07.0\"", "pci_busid=\"0:00:0A.0\""));
  BOOST_TEST(t.num_gpus() == 2);
  BOOST_TEST(t.gpus[1].pci.str() == "0000:00:0a.0");
  std::string e = error_of(replace_first(base, " pci_busid=\"0000:00:07.0\"", ""));
  BOOST_TEST(e.find("a PCIDev without pci_busid") != std::string::npos, e);
  // an unreadable pci_type left class and vendor 0: the GPU was no longer a GPU
  e = error_of(replace_first(base,
                             "pci_type=\"0302 [10de:2335] [10de:2435] a1\" pci_link_speed=\"0.000000\">\n      "
                             "<info name=\"GPUModel\" value=\"NVIDIA H200\"/>\n      <info name=\"NVIDIAUUID\" "
                             "value=\"GPU-6b6d6f65-0200-4001",
                             "pci_type=\"display [10de:2335]\" pci_link_speed=\"0.000000\">\n      "
                             "<info name=\"GPUModel\" value=\"NVIDIA H200\"/>\n      <info name=\"NVIDIAUUID\" "
                             "value=\"GPU-6b6d6f65-0200-4001"));
  BOOST_TEST(e.find("pci_type=\"display [10de:2335]\" is not \"cccc [vvvv:dddd] [vvvv:dddd] rr\"") != std::string::npos,
             e);
}

BOOST_AUTO_TEST_CASE(gpus_the_matrix_omits_are_named) {
  const NvlinkTopology t =
      KokkosMoE::load_topology_xml(with_third_gpu(KokkosMoETest::read_fixture("h200_2gpu_vm_hidden_switch")));
  BOOST_TEST(t.num_gpus() == 3);
  BOOST_TEST(KokkosMoETest::has_warning(
      t, "GPU2 (0000:00:08.0) is not in the NVLinkBandwidth matrix and has no NVLink infos: its NVLinks are unknown"));
  BOOST_TEST(t.pair(0, 1).nvlink_p2p);
  BOOST_TEST(!t.pair(0, 2).nvlink_p2p);
  // the fixtures themselves list every GPU: no such warning there
  for (const char* f : {"hgx_h100_8gpu_4sw", "dgx2_like_16gpu_12sw", "pcie_pairs_4gpu", "dgx1_like_mesh_8gpu",
                        "power8_like_gpu_cpu", "h200_2gpu_vm_hidden_switch"})
    BOOST_TEST(!KokkosMoETest::has_warning(KokkosMoETest::load(f), "is not in the NVLinkBandwidth matrix"), f);
}

BOOST_AUTO_TEST_CASE(conflicting_infos_are_errors_or_warnings) {
  const std::string base = KokkosMoETest::read_fixture("h200_2gpu_vm_hidden_switch");
  // NVSwitchHidden twice, different values: hwloc answered the first; which one is meant cannot be known.
  std::string e = error_of(replace_first(base, "<info name=\"NVSwitchHidden\" value=\"1\"/>",
                                         "<info name=\"NVSwitchHidden\" value=\"1\"/><info name=\"NVSwitchHidden\" "
                                         "value=\"0\"/>"));
  BOOST_TEST(e.find("root: info NVSwitchHidden is given 2 times with different values (\"1\", \"0\"); keep one") !=
                 std::string::npos,
             e);
  e = error_of(replace_first(base, "<info name=\"NVLinkPerLinkMBps\" value=\"25000\"/>",
                             "<info name=\"NVLinkPerLinkMBps\" value=\"25000\"/><info name=\"NVLinkPerLinkMBps\" "
                             "value=\"50000\"/>"));
  BOOST_TEST(e.find("info NVLinkPerLinkMBps is given 2 times") != std::string::npos, e);
  // the same value twice is no conflict
  const NvlinkTopology same = KokkosMoE::load_topology_xml(
      replace_first(base, "<info name=\"NVSwitchHidden\" value=\"1\"/>",
                    "<info name=\"NVSwitchHidden\" value=\"1\"/><info name=\"NVSwitchHidden\" value=\"1\"/>"));
  BOOST_TEST(same.nvswitch_hidden);
  // a per-GPU identity given twice: an error for the UUID (it keys GPUs), a warning for a descriptive info
  e = error_of(replace_first(base, "<info name=\"NVIDIAUUID\" value=\"GPU-6b6d6f65-0200-4000-8000-000000001000\"/>",
                             "<info name=\"NVIDIAUUID\" value=\"GPU-6b6d6f65-0200-4000-8000-000000001000\"/><info "
                             "name=\"NVIDIAUUID\" value=\"GPU-other\"/>"));
  BOOST_TEST(e.find("GPU 0000:00:06.0: info NVIDIAUUID is given 2 times") != std::string::npos, e);
  const NvlinkTopology t = KokkosMoE::load_topology_xml(
      replace_first(base, "<info name=\"GPUModel\" value=\"NVIDIA H200\"/>",
                    "<info name=\"GPUModel\" value=\"NVIDIA H200\"/><info name=\"GPUModel\" value=\"NVIDIA H100\"/>"));
  BOOST_TEST(t.gpus[0].model == "NVIDIA H200");
  BOOST_TEST(KokkosMoETest::has_warning(
      t, "GPU 0000:00:06.0: info GPUModel has different values (\"NVIDIA H200\", \"NVIDIA H100\"); the first is used"));
}

BOOST_AUTO_TEST_CASE(nvswitches_are_recognized_by_subtype_never_by_class_alone) {
  const std::string base = KokkosMoETest::read_fixture("hgx_h100_8gpu_4sw");
  const NvlinkTopology full = KokkosMoE::load_topology_xml(base);
  BOOST_TEST(full.nvswitch_visible == 4);
  // The same class-0680 NVIDIA function without the subtype is not counted; its matrix entries are named.
  const NvlinkTopology t = KokkosMoE::load_topology_xml(replace_first(
      base, "<object type=\"PCIDev\" subtype=\"NVSwitch\" gp_index=\"76\"", "<object type=\"PCIDev\" gp_index=\"76\""));
  BOOST_TEST(t.nvswitch_visible == 3);
  BOOST_TEST(KokkosMoETest::has_warning(t,
                                        "PCI device 0000:e1:00.0 is an NVIDIA bridge-class (0680) function without "
                                        "subtype=\"NVSwitch\": not counted as an NVSwitch"));
  BOOST_TEST(KokkosMoETest::has_warning(t, "ignored (neither GPU, NVSwitch nor CPU package)"));
  BOOST_TEST(t.gpus[0].links_to_switch < full.gpus[0].links_to_switch);
  // The DGX-2-like fixture's switch with class 0000 but the subtype is a switch.
  BOOST_TEST(KokkosMoETest::load("dgx2_like_16gpu_12sw").nvswitch_visible == 12);
}

BOOST_AUTO_TEST_CASE(every_gpu_of_every_fixture_is_in_the_model_or_named) {
  // Counts the NVIDIA display/3D PCI functions in the text, independently of hwloc, and compares.
  for (const char* f : {"hgx_h100_8gpu_4sw", "h200_2gpu_vm_hidden_switch", "dgx2_like_16gpu_12sw", "pcie_pairs_4gpu",
                        "dgx1_like_mesh_8gpu", "power8_like_gpu_cpu", "no_gpu", "h200_2gpu_live_capture",
                        "h200_2gpu_vm_machine_only", "asymmetric_matrix", "gpu_without_matrix"}) {
    const std::string xml = KokkosMoETest::read_fixture(f);
    int in_text = 0, excluded = 0;
    for (std::size_t p = xml.find("pci_type=\"03"); p != std::string::npos; p = xml.find("pci_type=\"03", p + 1))
      if (xml.compare(p + 14, 6, " [10de") == 0) ++in_text;
    for (std::size_t p = xml.find("KokkosMoEGpuExcluded"); p != std::string::npos;
         p = xml.find("KokkosMoEGpuExcluded", p + 1))
      ++excluded;
    const NvlinkTopology t = KokkosMoETest::load(f);
    int named = 0;
    for (const auto& w : t.warnings) named += w.find("excluded by the capture") != std::string::npos ? 1 : 0;
    BOOST_TEST(in_text == t.num_gpus() + named, f << ": " << in_text << " GPUs in the text, " << t.num_gpus()
                                                  << " in the model, " << named << " named in warnings");
    BOOST_TEST(named == excluded, f);
  }
}

BOOST_AUTO_TEST_SUITE_END()
