/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_COMMUNICATOR_HPP
#define KOKKOSMOE_COMMUNICATOR_HPP

/// \file KokkosMoE_Communicator.hpp
/// \brief The communicator of the expert-parallel layer (contract: docs/ep.md §2, §7).
///
/// A move-only owner (or borrower) of an NCCL communicator or an MPI communicator, in the spirit of kokkos-comm.
/// Vendor types never appear here: communicators are made by the factories of KokkosMoE_Communicator_MPI.hpp
/// (MPI_Comm), KokkosMoE_Communicator_NCCL.hpp (ncclUniqueId, ncclComm_t, several GPUs of one process),
/// KokkosMoE_Communicator_CudaIpc.hpp (CUDA IPC over MPI) and KokkosMoE_Communicator_Loopback.hpp (ranks as threads).
/// Every wait on a peer is bounded by the communicator's timeout; a timeout or an asynchronous error aborts the
/// communicator and throws KokkosMoE::CommError naming the operation, the rank and the cause.

#include <KokkosMoE_Error.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace KokkosMoE {

namespace Impl {
class Transport;
}

/// \brief The library under a communicator.
enum class CommTransport : int {
  Mpi = 1,       ///< host memory, host execution spaces (Serial, OpenMP, Threads), point-to-point messages
  Nccl = 2,      ///< device memory, Kokkos::Cuda, one GPU per rank
  MpiShm = 3,    ///< host memory in MPI shared windows: ranks of one node write into each other's rows directly
  Loopback = 4,  ///< several ranks of one process (one host thread each), windows in host or device memory
  CudaIpc = 5,   ///< device memory, Kokkos::Cuda, one process per rank: CUDA IPC windows, collectives over MPI
};

/// \brief "mpi", "nccl", "shm", "loopback", "ipc".
inline const char* to_string(CommTransport t) noexcept {
  switch (t) {
    case CommTransport::Mpi:
      return "mpi";
    case CommTransport::Nccl:
      return "nccl";
    case CommTransport::MpiShm:
      return "shm";
    case CommTransport::CudaIpc:
      return "ipc";
    default:
      return "loopback";
  }
}

/// \brief Bytes one kind of operation moved between ranks, summed over its calls (docs/ep.md §9).
struct ByteCount {
  std::int64_t logical = 0;  ///< payload: the token rows a peer needed (row bytes only), this rank's own excluded
  std::int64_t wire = 0;     ///< what left this rank: rows with their trailers and padding, whole blocks where the
                             ///< transport sends fixed blocks, and the signals of direct writes
};

/// \brief How the EP layer reaches the other ranks' memory (docs/ep.md §7.2).
enum class PeerWindows : int {
  Auto = 0,           ///< direct writes wherever the transport can map its peers' memory, messages elsewhere
  Off = 1,            ///< messages only (point-to-point sends and receives through staging rows): the portable path
  NcclSymmetric = 2,  ///< NCCL: symmetric windows (ncclMemAlloc + ncclCommWindowRegister), else CommError
  CudaIpc = 3,        ///< NCCL, CUDA IPC: cudaMalloc'd windows shared by CUDA IPC handles (ranks of one node), else
                      ///< CommError
};

/// \brief "auto", "off", "nccl", "ipc".
inline const char* to_string(PeerWindows w) noexcept {
  switch (w) {
    case PeerWindows::Auto:
      return "auto";
    case PeerWindows::Off:
      return "off";
    case PeerWindows::NcclSymmetric:
      return "nccl";
    default:
      return "ipc";
  }
}

/// \brief Settings of a new communicator.
struct CommConfig {
  /// Upper bound in seconds on every wait for a peer: initialization, each exchange, each host wait and the
  /// destruction. The environment variable KOKKOSMOE_COMM_TIMEOUT (seconds) overrides it when set.
  double timeout_seconds = 300.0;
  /// Direct writes into peers' windows or messages. NcclSymmetric is for NCCL communicators only, CudaIpc for NCCL
  /// and CUDA-IPC ones.
  PeerWindows peer_windows = PeerWindows::Auto;
};

/// \brief What a communicator has issued so far (docs/ep.md §12 cases 6 and 7: no stray communication, one stream).
struct CommStats {
  std::int64_t calls = 0;          ///< library calls that move data (exchange + alltoall + allgather)
  std::int64_t exchanges = 0;      ///< grouped send/recv
  std::int64_t alltoalls = 0;      ///< equal-block all-to-all
  std::int64_t allgathers = 0;     ///< all-gathers (count exchanges, configuration digests)
  std::int64_t waits = 0;          ///< host waits with a deadline
  std::int64_t peer_mappings = 0;  ///< peers' window parts this process has mapped now (CUDA IPC handles open)
  std::int64_t votes = 0;      ///< per-call validation votes (host memory, no stream; docs/ep.md §2), not in `calls`
  std::vector<void*> streams;  ///< distinct CUDA streams used (nullptr for host transports)
  /// Per operation name ("ep_layout", "ep_dispatch", ...): what it moved. The EP layer adds a handle's steps at
  /// ep_synchronize (capacity mode counts on the device and must not wait before that).
  std::map<std::string, ByteCount> bytes;
};

/// \brief A communicator: rank, size, device, split. Move-only; the transport it wraps lives as long as the
/// Communicator or any EpGroup made from it, whichever is last.
class Communicator {
 public:
  Communicator() = default;  ///< an empty communicator (valid() is false); every operation on it throws
  explicit Communicator(std::shared_ptr<Impl::Transport> transport) noexcept : m_transport(std::move(transport)) {}
  Communicator(Communicator&&) noexcept = default;
  Communicator& operator=(Communicator&&) noexcept = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  ~Communicator() = default;

  bool valid() const noexcept { return static_cast<bool>(m_transport); }
  int rank() const;
  int size() const;
  /// The CUDA device of this rank (NCCL), -1 for host transports.
  int device() const;
  CommTransport transport() const;
  double timeout_seconds() const;
  PeerWindows peer_windows() const;

  /// \brief The ranks with the same \p color, ordered by \p key then by rank: collective over this communicator.
  /// \throws InvalidArgument (Rule::ConfigValue) for a negative color; CommError on a transport failure
  Communicator split(int color, int key) const;

  /// \brief Stops all communication on this communicator now (ncclCommAbort on NCCL). Never blocks.
  void abort() noexcept;
  bool aborted() const noexcept;

  CommStats stats() const;

  /// Implementation access for the EP layer; not part of the API.
  const std::shared_ptr<Impl::Transport>& impl_transport() const noexcept { return m_transport; }

 private:
  Impl::Transport& checked(const char* fn) const;
  std::shared_ptr<Impl::Transport> m_transport;
};

}  // namespace KokkosMoE

#endif
