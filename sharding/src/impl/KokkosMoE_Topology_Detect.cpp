/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// Source selection (docs/topology.md §3): explicit fixture, fixture named by the environment, else the live machine.

#include "KokkosMoE_Topology_Detect.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "KokkosMoE_Topology_Hwloc.hpp"
#include "KokkosMoE_Topology_Nvml.hpp"
#include "KokkosMoE_Topology_Scan.hpp"

namespace KokkosMoE {

namespace Impl {

namespace {

HwlocTree machine_tree(const std::string* hwloc_xml, bool keep_all) {
  return hwloc_xml ? HwlocTree::from_xml(*hwloc_xml, "<hwloc XML standing in for the live machine>", true)
                   : HwlocTree::live(keep_all);
}

void warn_if_redirected(const HwlocTree& tree, const std::string* hwloc_xml, HostScan& scan) {
  if (!hwloc_xml && !tree.is_this_system())
    scan.warnings.push_back(
        "hwloc did not discover this machine (HWLOC_XMLFILE or HWLOC_FSROOT is set?): locality is not live");
}

}  // namespace

NvlinkTopology detect_live(const DetectOptions& options, const std::string* hwloc_xml) {
  HwlocTree tree = machine_tree(hwloc_xml, false);
  HostScan scan = tree.scan();
  warn_if_redirected(tree, hwloc_xml, scan);
  if (!options.allow_nvml) return topology_from_hwloc_only(scan, "disabled by DetectOptions::allow_nvml");
  const NvmlSnapshot snap = read_nvml(options.nvml_library, options.query_p2p_status, options.query_fabric);
  if (!snap.available) return topology_from_hwloc_only(scan, snap.status);
  return topology_from_live(scan, snap, nullptr);
}

std::string capture_xml(const DetectOptions& options, const std::string* hwloc_xml) {
  HwlocTree tree = machine_tree(hwloc_xml, true);
  HostScan scan = tree.scan();
  warn_if_redirected(tree, hwloc_xml, scan);
  NvlinkTopology topo;
  SwitchLinkTable switch_links;
  std::string status = "disabled by DetectOptions::allow_nvml";
  if (options.allow_nvml) {
    const NvmlSnapshot snap = read_nvml(options.nvml_library, options.query_p2p_status, options.query_fabric);
    status = snap.status;
    if (snap.available) {
      topo = topology_from_live(scan, snap, &switch_links);
      return tree.export_capture(topo, switch_links, status);
    }
  }
  topo = topology_from_hwloc_only(scan, status);
  return tree.export_capture(topo, switch_links, status);
}

}  // namespace Impl

namespace {

// The most bytes a fixture file may have: hwloc XML of the largest machines is a few MB.
constexpr std::uint64_t kMaxXmlFileBytes = 64ull << 20;

// Reads a regular file of at most kMaxXmlFileBytes. Devices (/dev/zero reads forever), FIFOs (block until a writer
// comes), directories and sockets are refused by type: the file is opened non-blocking (a FIFO without a writer
// opens at once) and checked with fstat before anything is read, and the read stops one byte past the cap.
std::string read_whole_file(const std::string& path) {
  const auto fail = [&](const std::string& why) {
    throw TopologyError("KokkosMoE topology: cannot read " + path + ": " + why);
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) fail(std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) fail(std::strerror(errno));
  if (S_ISDIR(st.st_mode)) fail("it is a directory, not an hwloc XML file");
  if (S_ISFIFO(st.st_mode)) fail("it is a FIFO (named pipe); give a regular file");
  if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) fail("it is a device; give a regular file");
  if (!S_ISREG(st.st_mode)) fail("it is not a regular file");
  if (static_cast<std::uint64_t>(st.st_size) > kMaxXmlFileBytes)
    fail("it has " + std::to_string(st.st_size) + " bytes; topology files are limited to " +
         std::to_string(kMaxXmlFileBytes >> 20) + " MiB");
  std::string text;
  text.reserve(static_cast<std::size_t>(st.st_size));
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(std::strerror(errno));
    if (n == 0) break;
    text.append(buf, static_cast<std::size_t>(n));
    if (text.size() > kMaxXmlFileBytes)  // the file grew while being read
      fail("it has more than " + std::to_string(kMaxXmlFileBytes >> 20) + " MiB; topology files are limited to that");
  }
  return text;
}

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

}  // namespace

NvlinkTopology load_topology_xml(std::string_view xml) {
  Impl::HwlocTree tree = Impl::HwlocTree::from_xml(xml, "<XML buffer>");
  return Impl::topology_from_scan(tree.scan());
}

NvlinkTopology load_topology_xml_file(const std::string& path) {
  const std::string text = read_whole_file(path);
  Impl::HwlocTree tree = Impl::HwlocTree::from_xml(text, path);
  try {
    return Impl::topology_from_scan(tree.scan());
  } catch (const TopologyError& e) {
    throw TopologyError(std::string(e.what()) + " [in " + path + "]");
  }
}

NvlinkTopology detect_topology(const DetectOptions& options) {
  if (options.xml_path && options.xml_buffer)
    throw InvalidArgument("detect_topology", "options", Rule::ConfigValue,
                          "xml_path and xml_buffer are both set; give at most one fixture");
  if (options.xml_buffer) return load_topology_xml(*options.xml_buffer);
  if (options.xml_path) return load_topology_xml_file(*options.xml_path);
  if (options.honor_env) {
    if (const char* p = env("KOKKOSMOE_TOPO_XML")) return load_topology_xml_file(p);
    if (const char* p = env("HWLOC_XMLFILE")) return load_topology_xml_file(p);
  }
  return Impl::detect_live(options, nullptr);
}

std::string capture_topology_xml(const DetectOptions& options) { return Impl::capture_xml(options, nullptr); }

}  // namespace KokkosMoE
