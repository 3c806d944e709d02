/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_TRANSPORT_HPP
#define KOKKOSMOE_TRANSPORT_HPP

// The transport seam of the comm layer (docs/ep.md §7): the few byte-moving primitives the EP layer needs, one
// implementation per library (mpi/, nccl/). Pointers here are byte buffers in the transport's memory (host memory for
// MPI, device memory for NCCL); `stream` is the CUDA stream of the execution space instance (nullptr on the host).
// A transport that can map its peers' memory also makes windows (make_window): the EP layer then writes token rows
// straight into the peers' windows and signals through counters in them (docs/ep.md §7.2).

#include <KokkosMoE_Communicator.hpp>
#include <KokkosMoE_Error.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace KokkosMoE {

namespace Impl {

/// One peer's part of a grouped exchange: send `send_bytes` from `send` to `peer` and receive `recv_bytes` from
/// `peer` into `recv`. Either size may be 0 (then that direction is skipped on both sides, since both sides derive
/// the sizes from the same count matrix).
struct PeerSegment {
  int peer = 0;
  const void* send = nullptr;
  std::size_t send_bytes = 0;
  void* recv = nullptr;
  std::size_t recv_bytes = 0;
};

/// Memory every rank of a transport addresses directly: base[r] is rank r's part as this process sees it (base[me]
/// is its own), zero-filled and visible to all ranks when make_window returns. Released with the object.
class PeerWindow {
 public:
  virtual ~PeerWindow() = default;
  std::vector<std::uintptr_t> base;
  std::size_t bytes = 0;
  /// Ranks whose kernels run on this rank's device, this rank included (loopback ranks, processes that share a GPU):
  /// a kernel that waits for its peers' kernels must leave them room on the device (docs/ep.md §15). 0: not known,
  /// taken as every rank.
  int device_sharers = 0;
};

class Transport {
 public:
  Transport(int rank, int size, int device, double timeout_seconds)
      : m_rank(rank), m_size(size), m_device(device), m_timeout(timeout_seconds) {}
  virtual ~Transport() = default;
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  virtual CommTransport kind() const noexcept = 0;
  /// Grouped point-to-point: every segment's send and receive, issued as one group (NCCL) or as non-blocking
  /// requests waited on with the deadline (MPI). Enqueued on `stream` (NCCL) or complete on return (MPI).
  virtual void exchange(const char* op, const std::vector<PeerSegment>& segments, void* stream) = 0;
  /// Equal blocks: block j of `send` to rank j, block i of `recv` from rank i (ncclAlltoAll on NCCL).
  virtual void alltoall(const char* op, const void* send, void* recv, std::size_t block_bytes, void* stream) = 0;
  /// Every rank's `bytes` from `send` into `recv` in rank order.
  virtual void allgather(const char* op, const void* send, void* recv, std::size_t bytes, void* stream) = 0;
  /// Every rank's \p bytes of host memory from \p mine into \p all in rank order, at once and bounded by the timeout,
  /// without touching any stream: the EP layer's per-call validation vote (docs/ep.md §2). Counted as a vote only.
  virtual void vote(const char* op, const void* mine, void* all, std::size_t bytes) = 0;
  /// Host wait for everything enqueued on `stream` (no-op work on MPI), bounded by the timeout.
  virtual void wait(const char* op, void* stream) = 0;
  /// A new transport over the ranks with the same color, ordered by key (collective over this transport).
  virtual std::shared_ptr<Transport> split(const char* op, int color, int key) = 0;
  /// Stops all communication; later operations throw CommError(Aborted). Never blocks.
  virtual void abort() noexcept = 0;
  /// Collective: \p bytes per rank of memory every rank can write, or nullptr (on every rank alike) when this
  /// transport has no windows for this group of ranks.
  virtual std::shared_ptr<PeerWindow> make_window(const char* /*op*/, std::size_t /*bytes*/) { return nullptr; }
  /// Ranks that share one device (loopback) meet on the host before an operation launches kernels that wait for
  /// peers: an implicitly synchronizing CUDA call of one rank's thread between operations (cudaMalloc, cudaFree, a
  /// copy on the legacy stream) would otherwise wait for a peer's wait kernel that waits for this very rank
  /// (docs/ep.md §7.3). Bounded by the timeout; a no-op where ranks have devices of their own.
  virtual void rendezvous(const char* /*op*/) {}
  /// Throws CommError(Aborted) after an abort or a failure.
  void require_open(const char* op) const { check_not_aborted(op); }
  /// A failure the EP layer found itself (a peer that never signalled in a window): aborts and throws.
  [[noreturn]] void fail_and_abort(const char* op, CommFailure cause, const std::string& detail) {
    abort();
    fail(op, cause, detail);
  }

  int rank() const noexcept { return m_rank; }
  int size() const noexcept { return m_size; }
  int device() const noexcept { return m_device; }
  double timeout_seconds() const noexcept { return m_timeout; }
  PeerWindows peer_windows() const noexcept { return m_windows; }
  void set_peer_windows(PeerWindows w) noexcept { m_windows = w; }
  void set_timeout_seconds(double seconds) noexcept { m_timeout = seconds; }
  bool aborted() const noexcept { return m_aborted; }

  /// Operation counters (docs/ep.md §12 cases 6 and 7): calls into the library and the streams they used.
  std::int64_t calls = 0;
  std::int64_t exchanges = 0, alltoalls = 0, allgathers = 0, waits = 0, votes = 0;
  /// Peer memory this process has mapped for the transport's windows (CUDA IPC handles opened), now.
  std::int64_t peer_mappings = 0;
  std::vector<void*> streams_used;
  std::map<std::string, ByteCount> bytes;  // added by the EP layer at ep_synchronize

 protected:
  [[noreturn]] void fail(const char* op, CommFailure cause, const std::string& detail) const {
    throw CommError(op, m_rank, m_size, cause, detail);
  }
  void check_not_aborted(const char* op) const {
    if (m_aborted) fail(op, CommFailure::Aborted, "the communicator was aborted by an earlier failure or abort()");
  }
  void record(void* stream, std::int64_t& counter) {
    ++calls;
    ++counter;
    bool seen = false;
    for (void* s : streams_used) seen = seen || s == stream;
    if (!seen) streams_used.push_back(stream);
  }
  std::chrono::steady_clock::time_point deadline() const {
    return std::chrono::steady_clock::now() +
           std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(m_timeout));
  }

  int m_rank, m_size, m_device;
  double m_timeout;
  bool m_aborted = false;
  PeerWindows m_windows = PeerWindows::Auto;
};

/// The counters of \p t as the public CommStats.
CommStats stats_of(const Transport& t);

/// The timeout of a new communicator: KOKKOSMOE_COMM_TIMEOUT (seconds) when set, else `configured`.
/// \throws InvalidArgument (Rule::ConfigValue) for a value that is not a finite number in (0, 1e6]
double resolve_timeout(const char* fn, double configured);

/// The window setting of a new communicator of kind \p kind.
/// \throws InvalidArgument (Rule::ConfigValue) for a value that is no enumerator, or an NCCL-only one elsewhere
PeerWindows resolve_peer_windows(const char* fn, const CommConfig& config, CommTransport kind);

}  // namespace Impl
}  // namespace KokkosMoE

#endif
