/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#include <KokkosMoE_Communicator.hpp>

#include <impl/KokkosMoE_Transport.hpp>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>

namespace KokkosMoE {
namespace Impl {

double resolve_timeout(const char* fn, double configured) {
  double value = configured;
  std::string source = "CommConfig::timeout_seconds";
  if (const char* env = std::getenv("KOKKOSMOE_COMM_TIMEOUT"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    errno = 0;
    value = std::strtod(env, &end);
    source = "KOKKOSMOE_COMM_TIMEOUT";
    if (end == env || *end != '\0' || errno == ERANGE)
      throw InvalidArgument(fn, "KOKKOSMOE_COMM_TIMEOUT", Rule::ConfigValue,
                            std::string("KOKKOSMOE_COMM_TIMEOUT='") + env + "' is not a number of seconds");
  }
  if (!std::isfinite(value) || value <= 0.0 || value > 1e6)
    throw InvalidArgument(fn, source, Rule::ConfigValue,
                          source + " (" + std::to_string(value) + ") must be a number of seconds in (0, 1e6]");
  return value;
}

PeerWindows resolve_peer_windows(const char* fn, const CommConfig& config, CommTransport kind) {
  const PeerWindows w = config.peer_windows;
  const int v = static_cast<int>(w);
  if (v < static_cast<int>(PeerWindows::Auto) || v > static_cast<int>(PeerWindows::CudaIpc))
    throw InvalidArgument(fn, "config.peer_windows", Rule::ConfigValue,
                          "CommConfig::peer_windows (" + std::to_string(v) + ") is not a PeerWindows enumerator");
  if (w == PeerWindows::NcclSymmetric && kind != CommTransport::Nccl)
    throw InvalidArgument(fn, "config.peer_windows", Rule::ConfigValue,
                          std::string("CommConfig::peer_windows = nccl is for NCCL communicators; a ") +
                              to_string(kind) + " communicator takes auto, off" +
                              (kind == CommTransport::CudaIpc ? " or ipc" : ""));
  if (w == PeerWindows::CudaIpc && kind != CommTransport::Nccl && kind != CommTransport::CudaIpc)
    throw InvalidArgument(fn, "config.peer_windows", Rule::ConfigValue,
                          std::string("CommConfig::peer_windows = ipc is for NCCL and CUDA-IPC communicators; a ") +
                              to_string(kind) + " communicator takes auto or off");
  return w;
}

CommStats stats_of(const Transport& t) {
  CommStats s;
  s.calls = t.calls;
  s.exchanges = t.exchanges;
  s.alltoalls = t.alltoalls;
  s.allgathers = t.allgathers;
  s.waits = t.waits;
  s.peer_mappings = t.peer_mappings;
  s.votes = t.votes;
  s.streams = t.streams_used;
  s.bytes = t.bytes;
  return s;
}

}  // namespace Impl

Impl::Transport& Communicator::checked(const char* fn) const {
  if (!m_transport)
    throw InvalidArgument(fn, "communicator", Rule::ConfigValue,
                          "the communicator is empty (default-constructed or moved from)");
  return *m_transport;
}

int Communicator::rank() const { return checked("Communicator::rank").rank(); }
int Communicator::size() const { return checked("Communicator::size").size(); }
int Communicator::device() const { return checked("Communicator::device").device(); }
CommTransport Communicator::transport() const { return checked("Communicator::transport").kind(); }
double Communicator::timeout_seconds() const { return checked("Communicator::timeout_seconds").timeout_seconds(); }
PeerWindows Communicator::peer_windows() const { return checked("Communicator::peer_windows").peer_windows(); }

Communicator Communicator::split(int color, int key) const {
  constexpr const char* fn = "Communicator::split";
  Impl::Transport& t = checked(fn);
  if (color < 0)
    throw InvalidArgument(fn, "color", Rule::ConfigValue, "color (" + std::to_string(color) + ") must be >= 0");
  std::shared_ptr<Impl::Transport> child = t.split(fn, color, key);
  child->set_peer_windows(t.peer_windows());
  return Communicator(std::move(child));
}

void Communicator::abort() noexcept {
  if (m_transport) m_transport->abort();
}
bool Communicator::aborted() const noexcept { return m_transport && m_transport->aborted(); }

CommStats Communicator::stats() const { return Impl::stats_of(checked("Communicator::stats")); }

}  // namespace KokkosMoE
