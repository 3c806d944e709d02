/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// The MPI host transport (docs/ep.md §7.1). Every exchange is a set of non-blocking requests polled with MPI_Testall
// until the deadline: a stalled or dead peer ends in CommError(Timeout) on the others, never in a hang. Collectives
// that MPI offers only as blocking calls (MPI_Comm_dup, MPI_Comm_split, MPI_Win_allocate_shared) are preceded by a
// polled all-gather, so a peer that is already gone is found with a deadline first. The shm flavour also makes
// windows: MPI_Win_allocate_shared over the ranks of one node (docs/ep.md §7.2).
#include <KokkosMoE_Communicator_MPI.hpp>

#include <impl/KokkosMoE_Transport.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace KokkosMoE {
namespace Impl {
namespace {

// MPI counts are int: messages are cut into pieces of at most 1 GiB.
constexpr std::size_t kMaxMessage = std::size_t(1) << 30;
constexpr int kTag = 7411;

std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, buf, &len);
  return std::string(buf, static_cast<std::size_t>(len));
}

/// A shared window of the ranks of one node; MPI_Win_free is collective and blocking, so a window of an aborted
/// transport (a peer may be gone) is left to MPI_Finalize instead.
class MpiShmWindow final : public PeerWindow {
 public:
  MpiShmWindow(MPI_Win win, const bool* aborted) : m_win(win), m_aborted(aborted) {}
  ~MpiShmWindow() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized || *m_aborted) return;
    MPI_Win_unlock_all(m_win);
    MPI_Win_free(&m_win);
  }

 private:
  MPI_Win m_win;
  const bool* m_aborted;  // the transport's flag: the transport outlives its windows (the EP group holds both)
};

class MpiTransport final : public Transport {
 public:
  MpiTransport(MPI_Comm comm, int rank, int size, double timeout, bool owned = true, bool shm = false)
      : Transport(rank, size, -1, timeout), m_comm(comm), m_owned(owned), m_shm(shm) {}
  ~MpiTransport() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (m_owned && !finalized && m_comm != MPI_COMM_NULL) MPI_Comm_free(&m_comm);
  }

  CommTransport kind() const noexcept override { return m_shm ? CommTransport::MpiShm : CommTransport::Mpi; }

  std::shared_ptr<PeerWindow> make_window(const char* op, std::size_t bytes) override {
    check_not_aborted(op);
    if (!m_shm) return nullptr;
    // Every rank learns whether all of them share one node (the same answer everywhere), alive peers first.
    MPI_Comm node = MPI_COMM_NULL;
    int rc = MPI_Comm_split_type(m_comm, MPI_COMM_TYPE_SHARED, m_rank, MPI_INFO_NULL, &node);
    if (rc != MPI_SUCCESS) fail(op, CommFailure::Library, "MPI_Comm_split_type: " + mpi_error_string(rc));
    int node_size = 0;
    MPI_Comm_size(node, &node_size);
    std::vector<int> sizes(static_cast<std::size_t>(m_size));
    allgather(op, &node_size, sizes.data(), sizeof(int), nullptr);
    const bool one_node = std::all_of(sizes.begin(), sizes.end(), [&](int n) { return n == m_size; });
    if (!one_node) {
      MPI_Comm_free(&node);
      return nullptr;
    }
    void* mine = nullptr;
    MPI_Win win = MPI_WIN_NULL;
    // Rows move as 16-byte vectors: each rank's part starts on a 64-byte boundary (the segment is mapped page-aligned
    // in every process, so the rounding is the same everywhere).
    constexpr std::size_t kAlign = 64;
    rc = MPI_Win_allocate_shared(static_cast<MPI_Aint>(bytes + kAlign), 1, MPI_INFO_NULL, m_comm, &mine, &win);
    MPI_Comm_free(&node);
    if (rc != MPI_SUCCESS)
      fail(op, CommFailure::Library, "MPI_Win_allocate_shared(" + std::to_string(bytes) + "): " + mpi_error_string(rc));
    MPI_Win_lock_all(MPI_MODE_NOCHECK, win);
    auto w = std::make_shared<MpiShmWindow>(win, &m_aborted);
    w->bytes = bytes;
    w->base.resize(static_cast<std::size_t>(m_size));
    for (int r = 0; r < m_size; ++r) {
      MPI_Aint size = 0;
      int disp = 0;
      void* p = nullptr;
      MPI_Win_shared_query(win, r, &size, &disp, &p);
      w->base[r] = (reinterpret_cast<std::uintptr_t>(p) + kAlign - 1) / kAlign * kAlign;
    }
    std::memset(mine, 0, bytes + kAlign);
    MPI_Win_sync(win);
    // Nobody writes into a peer before every peer zeroed its part.
    int one = 1;
    std::vector<int> all(static_cast<std::size_t>(m_size));
    allgather(op, &one, all.data(), sizeof(int), nullptr);
    return w;
  }

  void exchange(const char* op, const std::vector<PeerSegment>& segments, void* stream) override {
    check_not_aborted(op);
    record(stream, exchanges);
    post_and_complete(op, segments);
  }

  void alltoall(const char* op, const void* send, void* recv, std::size_t block_bytes, void* stream) override {
    check_not_aborted(op);
    record(stream, alltoalls);
    std::vector<PeerSegment> segs(static_cast<std::size_t>(m_size));
    for (int p = 0; p < m_size; ++p)
      segs[p] = {p, static_cast<const char*>(send) + block_bytes * p, block_bytes,
                 static_cast<char*>(recv) + block_bytes * p, block_bytes};
    post_and_complete(op, segs);
  }

  void allgather(const char* op, const void* send, void* recv, std::size_t bytes, void* stream) override {
    check_not_aborted(op);
    record(stream, allgathers);
    std::vector<PeerSegment> segs(static_cast<std::size_t>(m_size));
    for (int p = 0; p < m_size; ++p) segs[p] = {p, send, bytes, static_cast<char*>(recv) + bytes * p, bytes};
    post_and_complete(op, segs);
  }

  void vote(const char* op, const void* mine, void* all, std::size_t bytes) override {
    check_not_aborted(op);
    ++votes;
    std::vector<PeerSegment> segs(static_cast<std::size_t>(m_size));
    for (int p = 0; p < m_size; ++p) segs[p] = {p, mine, bytes, static_cast<char*>(all) + bytes * p, bytes};
    post_and_complete(op, segs, false);
  }

 private:
  /// Non-blocking receives (first, so that self-sends find their match) and sends for every segment, then the
  /// bounded wait.
  void post_and_complete(const char* op, const std::vector<PeerSegment>& segments, bool count_wait = true) {
    std::vector<MPI_Request> reqs;
    std::vector<int> req_peer;
    auto post = [&](bool is_send, int peer, void* ptr, std::size_t bytes) {
      auto* p = static_cast<char*>(ptr);
      for (std::size_t off = 0; off < bytes; off += kMaxMessage) {
        const int n = static_cast<int>(std::min(kMaxMessage, bytes - off));
        MPI_Request r;
        const int rc = is_send ? MPI_Isend(p + off, n, MPI_BYTE, peer, kTag, m_comm, &r)
                               : MPI_Irecv(p + off, n, MPI_BYTE, peer, kTag, m_comm, &r);
        if (rc != MPI_SUCCESS) {
          cancel(reqs);
          m_aborted = true;
          fail(op, CommFailure::Library,
               std::string(is_send ? "MPI_Isend" : "MPI_Irecv") + " to rank " + std::to_string(peer) + ": " +
                   mpi_error_string(rc));
        }
        reqs.push_back(r);
        req_peer.push_back(peer);
      }
    };
    for (const PeerSegment& s : segments)
      if (s.recv_bytes > 0) post(false, s.peer, s.recv, s.recv_bytes);
    for (const PeerSegment& s : segments)
      if (s.send_bytes > 0) post(true, s.peer, const_cast<void*>(s.send), s.send_bytes);
    complete(op, reqs, req_peer, count_wait);
  }

 public:
  void wait(const char* op, void*) override {
    check_not_aborted(op);
    ++waits;  // MPI exchanges are complete on return: nothing is in flight
  }

  std::shared_ptr<Transport> split(const char* op, int color, int key) override {
    // The polled all-gather proves every peer alive before the blocking MPI_Comm_split.
    std::vector<int> mine = {color, key};
    std::vector<int> all(2 * static_cast<std::size_t>(m_size));
    allgather(op, mine.data(), all.data(), sizeof(int) * 2, nullptr);
    MPI_Comm sub = MPI_COMM_NULL;
    const int rc = MPI_Comm_split(m_comm, color, key, &sub);
    if (rc != MPI_SUCCESS) fail(op, CommFailure::Library, "MPI_Comm_split: " + mpi_error_string(rc));
    MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN);
    int r = 0, n = 0;
    MPI_Comm_rank(sub, &r);
    MPI_Comm_size(sub, &n);
    return std::make_shared<MpiTransport>(sub, r, n, m_timeout, true, m_shm);
  }

  void abort() noexcept override { m_aborted = true; }

 private:
  static void cancel(std::vector<MPI_Request>& reqs) {
    for (MPI_Request& r : reqs) {
      if (r == MPI_REQUEST_NULL) continue;
      MPI_Cancel(&r);
      MPI_Request_free(&r);
    }
  }

  void complete(const char* op, std::vector<MPI_Request>& reqs, const std::vector<int>& req_peer, bool count_wait) {
    if (reqs.empty()) return;
    if (count_wait) ++waits;
    const auto until = deadline();
    int done = 0;
    for (int spin = 0;; ++spin) {
      const int rc = MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE);
      if (rc != MPI_SUCCESS) {
        cancel(reqs);
        m_aborted = true;
        fail(op, CommFailure::PeerFailure, "MPI_Testall: " + mpi_error_string(rc));
      }
      if (done) return;
      if (std::chrono::steady_clock::now() >= until) break;
      if (spin > 64) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    std::vector<int> pending;
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      if (reqs[i] == MPI_REQUEST_NULL) continue;
      int flag = 0;
      MPI_Test(&reqs[i], &flag, MPI_STATUS_IGNORE);
      if (!flag && std::find(pending.begin(), pending.end(), req_peer[i]) == pending.end())
        pending.push_back(req_peer[i]);
    }
    cancel(reqs);
    m_aborted = true;
    std::string who;
    for (int p : pending) who += (who.empty() ? "" : ", ") + std::to_string(p);
    fail(op, CommFailure::Timeout,
         "no answer within " + std::to_string(m_timeout) + " s from rank(s) " + (who.empty() ? "?" : who) +
             " (stalled or dead peer); the communicator is aborted");
  }

  MPI_Comm m_comm;
  bool m_owned;
  bool m_shm;
};

}  // namespace
}  // namespace Impl

namespace {
Communicator make_mpi(const char* fn, MPI_Comm comm, const CommConfig& config, bool shm);
}

Communicator make_mpi_communicator(MPI_Comm comm, const CommConfig& config) {
  return make_mpi("make_mpi_communicator", comm, config, false);
}
Communicator make_mpi_shm_communicator(MPI_Comm comm, const CommConfig& config) {
  return make_mpi("make_mpi_shm_communicator", comm, config, true);
}

namespace {
Communicator make_mpi(const char* fn, MPI_Comm comm, const CommConfig& config, bool shm) {
  const double timeout = Impl::resolve_timeout(fn, config.timeout_seconds);
  const PeerWindows windows = Impl::resolve_peer_windows(fn, config, shm ? CommTransport::MpiShm : CommTransport::Mpi);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized)
    throw InvalidArgument(fn, "comm", Rule::ConfigValue, "MPI is not initialized (or already finalized)");
  if (comm == MPI_COMM_NULL) throw InvalidArgument(fn, "comm", Rule::ConfigValue, "comm is MPI_COMM_NULL");
  int rank = 0, size = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  // A polled all-gather over a temporary transport on `comm` itself proves the peers alive before MPI_Comm_dup.
  MPI_Errhandler old;
  MPI_Comm_get_errhandler(comm, &old);
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  try {
    Impl::MpiTransport probe(comm, rank, size, timeout, /*owned=*/false);
    int one = 1;
    std::vector<int> all(static_cast<std::size_t>(size));
    probe.allgather(fn, &one, all.data(), sizeof(int), nullptr);
  } catch (...) {
    MPI_Comm_set_errhandler(comm, old);
    MPI_Errhandler_free(&old);
    throw;
  }
  MPI_Comm dup = MPI_COMM_NULL;
  const int rc = MPI_Comm_dup(comm, &dup);
  MPI_Comm_set_errhandler(comm, old);
  MPI_Errhandler_free(&old);
  if (rc != MPI_SUCCESS)
    throw CommError(fn, rank, size, CommFailure::Library, "MPI_Comm_dup: " + Impl::mpi_error_string(rc));
  MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
  auto t = std::make_shared<Impl::MpiTransport>(dup, rank, size, timeout, true, shm);
  t->set_peer_windows(windows);
  return Communicator(std::move(t));
}
}  // namespace

}  // namespace KokkosMoE
