/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_TST_TOPOLOGY_HELPERS_HPP
#define KOKKOSMOE_TST_TOPOLOGY_HELPERS_HPP

#include <KokkosMoE_Topology.hpp>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

// Boost.Test prints values of failed checks; PcieLevel prints as its `nvidia-smi topo -m` token.
namespace KokkosMoE {
inline std::ostream& operator<<(std::ostream& os, PcieLevel l) { return os << to_string(l); }
}  // namespace KokkosMoE

namespace KokkosMoETest {

inline std::string fixture_path(const std::string& name) {
  return std::string(KOKKOSMOE_TEST_FIXTURES) + "/" + name + ".xml";
}

inline std::string read_fixture(const std::string& name) {
  std::ifstream f(fixture_path(name), std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline KokkosMoE::NvlinkTopology load(const std::string& name) {
  return KokkosMoE::load_topology_xml_file(fixture_path(name));
}

/// Sets an environment variable for the lifetime of the guard, restoring the old value afterwards.
class EnvGuard {
 public:
  EnvGuard(const char* name, const char* value) : m_name(name) {
    if (const char* old = std::getenv(name)) m_old = old;
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~EnvGuard() {
    if (m_old)
      setenv(m_name.c_str(), m_old->c_str(), 1);
    else
      unsetenv(m_name.c_str());
  }
  EnvGuard(const EnvGuard&) = delete;
  EnvGuard& operator=(const EnvGuard&) = delete;

 private:
  std::string m_name;
  std::optional<std::string> m_old;
};

inline bool has_warning(const KokkosMoE::NvlinkTopology& t, const std::string& needle) {
  for (const auto& w : t.warnings)
    if (w.find(needle) != std::string::npos) return true;
  return false;
}

/// A topology with n GPUs and NVLink p2p exactly on the given edges (for graph tests).
inline KokkosMoE::NvlinkTopology graph(int n, const std::vector<std::pair<int, int>>& edges) {
  KokkosMoE::NvlinkTopology t;
  for (int i = 0; i < n; ++i) {
    KokkosMoE::GpuInfo g;
    g.id = i;
    g.pci.bus = static_cast<std::uint8_t>(i + 1);
    t.gpus.push_back(g);
  }
  t.pairs.assign(static_cast<std::size_t>(n) * n, KokkosMoE::GpuPair{});
  for (auto [a, b] : edges) {
    t.pairs[a * n + b].nvlink_p2p = true;
    t.pairs[b * n + a].nvlink_p2p = true;
  }
  return t;
}

}  // namespace KokkosMoETest

#endif
