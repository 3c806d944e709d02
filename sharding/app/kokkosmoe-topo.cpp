/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// kokkosmoe-topo: prints the NVLink topology of this machine (or of a fixture) like `nvidia-smi topo -m`, as JSON,
// or captures the machine as an hwloc v2 XML fixture. A thin CLI over KokkosMoE_Topology.hpp.

#include <KokkosMoE_Topology.hpp>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "KokkosMoE_Cli.hpp"

namespace {

const char* kUsage =
    "usage: kokkosmoe-topo [--xml FILE] [--json] [--capture FILE] [options]\n"
    "\n"
    "  (no option)        detect this machine (hwloc + NVML via dlopen) and print the GPU matrix\n"
    "  --xml FILE         read an hwloc v2 XML fixture instead of the machine\n"
    "  --json             print the model as JSON instead of the matrix\n"
    "  --capture FILE     write this machine as a fixture (hwloc v2 XML + NVLink matrix) to FILE ('-' = stdout),\n"
    "                     reload it and check that it reproduces the live model\n"
    "  --no-nvml          do not load NVML (GPUs from hwloc's PCI devices, NVLinks unknown)\n"
    "  --nvml-library L   NVML library to dlopen (default libnvidia-ml.so.1)\n"
    "  --no-p2p           skip the NVML P2P-status queries\n"
    "  --fabric           query the multi-node NVLink identity (nvmlDeviceGetGpuFabricInfoV)\n"
    "  --no-env           ignore KOKKOSMOE_TOPO_XML and HWLOC_XMLFILE\n"
    "  -h, --help         this text\n"
    "\n"
    "exit status: 0 ok, 1 error, 2 usage error (one line naming the option), 3 the capture does not reproduce the\n"
    "live model\n";

// Everything that a capture must reproduce: the model without its source and warnings (live detection warns about
// per-link details that the fixture summarizes).
std::string compare_capture(const KokkosMoE::NvlinkTopology& live, const KokkosMoE::NvlinkTopology& loaded) {
  using KokkosMoE::NvlinkTopology;
  NvlinkTopology a = live, b = loaded;
  a.source = b.source = NvlinkTopology::Source::None;
  a.warnings.clear();
  b.warnings.clear();
  if (a == b) return {};
  std::string diff;
  if (a.gpus.size() != b.gpus.size())
    return "GPU count " + std::to_string(a.gpus.size()) + " vs " + std::to_string(b.gpus.size());
  for (std::size_t i = 0; i < a.gpus.size(); ++i)
    if (a.gpus[i] != b.gpus[i]) diff += " GPU" + std::to_string(i);
  for (int i = 0; i < a.num_gpus(); ++i)
    for (int j = i + 1; j < a.num_gpus(); ++j)
      if (a.pair(i, j) != b.pair(i, j)) diff += " pair(" + std::to_string(i) + "," + std::to_string(j) + ")";
  if (a.nvswitch_visible != b.nvswitch_visible || a.nvswitch_hidden != b.nvswitch_hidden) diff += " nvswitch";
  if (a.nvlink_known != b.nvlink_known) diff += " nvlink_known";
  if (a.islands != b.islands || a.cliques != b.cliques) diff += " islands/cliques";
  if (a.hwloc_version != b.hwloc_version || a.driver_version != b.driver_version || a.hostname != b.hostname)
    diff += " versions/hostname";
  return "differs in" + diff;
}

const std::vector<KokkosMoE::Impl::CliFlag> kFlags = {
    {"--xml", true, ""},      {"--json", false, ""},        {"--capture", true, ""},
    {"--no-nvml", false, ""}, {"--nvml-library", true, ""}, {"--no-p2p", false, ""},
    {"--fabric", false, ""},  {"--no-env", false, ""},      {"--help", false, "-h"},
};

int run(int argc, char** argv) {
  namespace Impl = KokkosMoE::Impl;
  const Impl::CliArgs cli = Impl::parse_command_line(argc, argv, kFlags);
  if (cli.has("--help")) {
    std::cout << kUsage;
    return 0;
  }
  KokkosMoE::DetectOptions options;
  options.xml_path = cli.input_file("--xml", Impl::kCliMaxInputBytes);
  const bool json = cli.has("--json");
  const std::string capture = cli.output_file("--capture").value_or("");
  options.allow_nvml = !cli.has("--no-nvml");
  options.nvml_library = cli.text("--nvml-library", options.nvml_library);
  options.query_p2p_status = !cli.has("--no-p2p");
  options.query_fabric = cli.has("--fabric");
  options.honor_env = !cli.has("--no-env");
  if (!capture.empty() && options.xml_path)
    throw Impl::CliUsageError("--capture records the live machine; it cannot be combined with --xml");
  if (!capture.empty() && json) throw Impl::CliUsageError("--capture writes XML; it cannot be combined with --json");
  if (!capture.empty()) {
    const std::string xml = KokkosMoE::capture_topology_xml(options);
    if (capture == "-") {
      std::cout << xml;
    } else {
      std::ofstream f(capture, std::ios::binary);
      if (!(f << xml) || !f.flush())
        throw std::runtime_error("cannot write " + Impl::cli_quote(capture) + ": " + std::strerror(errno));
    }
    // The capture and the detection see the same machine; the fixture must reproduce the live model.
    KokkosMoE::DetectOptions live_options = options;
    live_options.honor_env = false;
    const KokkosMoE::NvlinkTopology live = KokkosMoE::detect_topology(live_options);
    const KokkosMoE::NvlinkTopology loaded = KokkosMoE::load_topology_xml(xml);
    const std::string diff = compare_capture(live, loaded);
    std::ostream& os = capture == "-" ? std::cerr : std::cout;
    os << "kokkosmoe-topo: captured " << loaded.num_gpus() << " GPU(s)" << (capture == "-" ? "" : " to " + capture)
       << "; round-trip " << (diff.empty() ? "OK" : "MISMATCH: " + diff) << "\n";
    if (capture != "-") os << KokkosMoE::topology_report(loaded);
    return diff.empty() ? 0 : 3;
  }
  const KokkosMoE::NvlinkTopology topo = KokkosMoE::detect_topology(options);
  if (json)
    std::cout << KokkosMoE::topology_to_json(topo);
  else
    std::cout << KokkosMoE::topology_report(topo);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return KokkosMoE::Impl::cli_main("kokkosmoe-topo", [&] { return run(argc, argv); });
}
