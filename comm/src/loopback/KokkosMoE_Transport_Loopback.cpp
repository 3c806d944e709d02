/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// The loopback transport (docs/ep.md §7.3): R ranks of one process, each driven by its own host thread. Collectives
// meet in a shared world: every rank posts its buffers, a barrier with a deadline, every rank copies what it needs
// from its peers' posts, a second barrier (so no buffer is reused early). Device buffers are copied with the CUDA
// runtime after the rank's stream has drained (a polled wait with the same deadline). Windows are one allocation
// per rank, freed collectively.
#include <KokkosMoE_Communicator_Loopback.hpp>

#include <impl/KokkosMoE_Transport.hpp>

#if defined(KOKKOSMOE_LOOPBACK_CUDA)
#include <cuda/KokkosMoE_CudaStreamWait.hpp>
#include <cuda_runtime.h>
#endif

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace KokkosMoE {
namespace Impl {
namespace {

/// What one rank offers in a collective.
struct Post {
  const void* send = nullptr;
  std::vector<PeerSegment> segments;
  int color = 0, key = 0;
  std::uintptr_t window = 0;
  std::shared_ptr<struct World> child;
};

struct World {
  explicit World(int n) : size(n), posts(static_cast<std::size_t>(n)), waiting_in(static_cast<std::size_t>(n)) {}
  const int size;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Post> posts;
  std::vector<std::string> waiting_in;  // per rank: the meeting it waits at, "" when none

  /// Every rank of the world reaches the same meeting (named by its operation), or CommError(Timeout) at the deadline
  /// naming the ranks that did not come and where they wait instead. Meetings of different names never block each
  /// other: a rank at another meeting (e.g. its ~EpGroup) neither completes this one nor keeps it from starting, and
  /// a rank that gives up withdraws, so the world stays consistent after a failure.
  void barrier(const char* op, int rank, std::chrono::steady_clock::time_point until, double timeout) {
    std::unique_lock<std::mutex> lock(mu);
    Gathering& m = meetings[op];  // std::map: the reference stays valid while other meetings come and go
    if (m.here.empty()) {
      m.here.assign(static_cast<std::size_t>(size), false);
      m.gave_up.assign(static_cast<std::size_t>(size), false);
    }
    const std::uint64_t gen = m.generation;
    waiting_in[rank] = op;
    m.here[rank] = true;
    m.gave_up[rank] = false;
    if (++m.arrived == size) {
      m.arrived = 0;
      std::fill(m.here.begin(), m.here.end(), false);
      for (std::string& w : waiting_in)
        if (w == op) w.clear();
      ++m.generation;
      cv.notify_all();
      return;
    }
    if (cv.wait_until(lock, until, [&] { return m.generation != gen; })) return;
    m.here[rank] = false;
    m.gave_up[rank] = true;
    --m.arrived;
    waiting_in[rank].clear();
    std::string missing;
    for (int r = 0; r < size; ++r) {
      if (r == rank || m.here[r]) continue;
      missing += (missing.empty() ? "rank " : ", rank ") + std::to_string(r);
      if (!waiting_in[r].empty()) {
        missing += " (waiting at " + waiting_in[r] + ")";
      } else if (m.gave_up[r]) {
        missing += " (came, gave up at its deadline)";
      }
    }
    throw CommError(op, rank, size, CommFailure::Timeout,
                    missing + " of the loopback group did not reach " + op + " (waited " + std::to_string(timeout) +
                        " s: stalled or gone thread); the communicator is aborted");
  }

 private:
  struct Gathering {
    int arrived = 0;
    std::uint64_t generation = 0;
    std::vector<bool> here, gave_up;
  };
  std::map<std::string, Gathering> meetings;
};

class LoopbackWindow final : public PeerWindow {
 public:
  LoopbackWindow(std::shared_ptr<World> world, int rank, int device, void* mine, double timeout, const bool* aborted)
      : m_world(std::move(world)),
        m_rank(rank),
        m_device(device),
        m_mine(mine),
        m_timeout(timeout),
        m_aborted(aborted) {}
  ~LoopbackWindow() override {
    // Peers may still write here until they are done with the group: free only after all arrived; a rank that never
    // comes (aborted group) leaves the memory allocated rather than freed under a peer's writes.
    if (*m_aborted) return;
    try {
      const auto until =
          std::chrono::steady_clock::now() +
          std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(m_timeout));
      m_world->barrier("~EpGroup", m_rank, until, m_timeout);
    } catch (...) {
      return;
    }
#if defined(KOKKOSMOE_LOOPBACK_CUDA)
    if (m_device >= 0) {
      cudaFree(m_mine);
      return;
    }
#endif
    std::free(m_mine);
  }

 private:
  std::shared_ptr<World> m_world;
  int m_rank, m_device;
  void* m_mine;
  double m_timeout;
  const bool* m_aborted;
};

class LoopbackTransport final : public Transport {
 public:
  LoopbackTransport(std::shared_ptr<World> world, int rank, int device, double timeout)
      : Transport(rank, world->size, device, timeout), m_world(std::move(world)) {}

  CommTransport kind() const noexcept override { return CommTransport::Loopback; }

  void exchange(const char* op, const std::vector<PeerSegment>& segments, void* stream) override {
    begin(op, stream, exchanges);
    m_world->posts[m_rank].segments = segments;
    meet(op);
    for (const PeerSegment& s : segments) {
      if (s.recv_bytes == 0) continue;
      for (const PeerSegment& p : m_world->posts[s.peer].segments)
        if (p.peer == m_rank) copy(op, s.recv, p.send, std::min(s.recv_bytes, p.send_bytes));
    }
    meet(op);
  }

  void alltoall(const char* op, const void* send, void* recv, std::size_t block, void* stream) override {
    begin(op, stream, alltoalls);
    m_world->posts[m_rank].send = send;
    meet(op);
    for (int p = 0; p < m_size; ++p)
      copy(op, static_cast<char*>(recv) + block * p, static_cast<const char*>(m_world->posts[p].send) + block * m_rank,
           block);
    meet(op);
  }

  void allgather(const char* op, const void* send, void* recv, std::size_t bytes, void* stream) override {
    begin(op, stream, allgathers);
    m_world->posts[m_rank].send = send;
    meet(op);
    for (int p = 0; p < m_size; ++p) copy(op, static_cast<char*>(recv) + bytes * p, m_world->posts[p].send, bytes);
    meet(op);
  }

  void vote(const char* op, const void* mine, void* all, std::size_t bytes) override {
    check_not_aborted(op);
    ++votes;
    m_world->posts[m_rank].send = mine;
    meet(op);
    for (int p = 0; p < m_size; ++p) std::memcpy(static_cast<char*>(all) + bytes * p, m_world->posts[p].send, bytes);
    meet(op);
  }

  void wait(const char* op, void* stream) override {
    check_not_aborted(op);
    ++waits;
    drain(op, stream);
  }

  std::shared_ptr<Transport> split(const char* op, int color, int key) override {
    check_not_aborted(op);
    Post& mine = m_world->posts[m_rank];
    mine.color = color;
    mine.key = key;
    mine.child.reset();
    meet(op);
    // The lowest rank of each color makes the new world; the others take it after the second meeting.
    std::vector<int> members;
    for (int r = 0; r < m_size; ++r)
      if (m_world->posts[r].color == color) members.push_back(r);
    std::stable_sort(members.begin(), members.end(),
                     [&](int a, int b) { return m_world->posts[a].key < m_world->posts[b].key; });
    const int leader = *std::min_element(members.begin(), members.end());
    if (leader == m_rank) mine.child = std::make_shared<World>(static_cast<int>(members.size()));
    meet(op);
    std::shared_ptr<World> child = m_world->posts[leader].child;
    meet(op);
    const int new_rank = static_cast<int>(std::find(members.begin(), members.end(), m_rank) - members.begin());
    return std::make_shared<LoopbackTransport>(child, new_rank, m_device, m_timeout);
  }

  void abort() noexcept override { m_aborted = true; }

  void rendezvous(const char* op) override {
    check_not_aborted(op);
    meet(op);
  }

  std::shared_ptr<PeerWindow> make_window(const char* op, std::size_t bytes) override {
    check_not_aborted(op);
    constexpr std::size_t kAlign = 64;
    const std::size_t n = (bytes + kAlign - 1) / kAlign * kAlign + kAlign;
    void* p = nullptr;
#if defined(KOKKOSMOE_LOOPBACK_CUDA)
    if (m_device >= 0) {
      if (cudaMalloc(&p, n) != cudaSuccess || cudaMemset(p, 0, n) != cudaSuccess ||
          cudaDeviceSynchronize() != cudaSuccess)
        fail(op, CommFailure::Library, "cudaMalloc/cudaMemset of a " + std::to_string(n) + "-byte window failed");
    }
#endif
    if (m_device < 0) {
      p = std::aligned_alloc(kAlign, n);
      if (p == nullptr) fail(op, CommFailure::Library, "no memory for a " + std::to_string(n) + "-byte window");
      std::memset(p, 0, n);
    }
    auto w = std::make_shared<LoopbackWindow>(m_world, m_rank, m_device, p, m_timeout, &m_aborted);
    m_world->posts[m_rank].window = reinterpret_cast<std::uintptr_t>(p);
    meet(op);
    w->bytes = bytes;
    w->device_sharers = m_size;  // every rank runs on this process's one device (or its host threads)
    for (int r = 0; r < m_size; ++r) w->base.push_back(m_world->posts[r].window);
    meet(op);
    return w;
  }

 private:
  void begin(const char* op, void* stream, std::int64_t& counter) {
    check_not_aborted(op);
    record(stream, counter);
    drain(op, stream);
  }
  void meet(const char* op) {
    try {
      m_world->barrier(op, m_rank, deadline(), m_timeout);
    } catch (...) {
      m_aborted = true;
      throw;
    }
  }
  /// The rank's stream has finished the kernels that wrote its buffers (device ranks), bounded by the timeout and a
  /// grace second: a wait kernel on the stream gives up at the same timeout, and when it ends first its error word
  /// names the silent peer, which a host deadline that fires first could not.
  void drain(const char* op, void* stream) {
#if defined(KOKKOSMOE_LOOPBACK_CUDA)
    if (m_device < 0) return;
    cudaError_t e = cudaSuccess;
    switch (wait_stream(static_cast<cudaStream_t>(stream), deadline() + std::chrono::seconds(1), e, []{})) {
      case StreamWait::Done:
        return;
      case StreamWait::Failed:
        m_aborted = true;
        fail(op, CommFailure::Library, std::string("cudaStreamQuery: ") + cudaGetErrorString(e));
      case StreamWait::Expired:
        m_aborted = true;
        fail(op, CommFailure::Timeout,
             "the rank's stream did not finish within " + std::to_string(m_timeout) +
                 " s (+ 1 s of grace); the communicator is aborted");
    }
#else
    (void)op;
    (void)stream;
#endif
  }
  void copy(const char* op, void* dst, const void* src, std::size_t n) {
    if (n == 0) return;
#if defined(KOKKOSMOE_LOOPBACK_CUDA)
    if (m_device >= 0) {
      const cudaError_t e = cudaMemcpy(dst, src, n, cudaMemcpyDefault);
      if (e != cudaSuccess) fail(op, CommFailure::Library, std::string("cudaMemcpy: ") + cudaGetErrorString(e));
      return;
    }
#endif
    (void)op;
    std::memcpy(dst, src, n);
  }

  std::shared_ptr<World> m_world;
};

}  // namespace
}  // namespace Impl

std::vector<Communicator> make_loopback_communicators(int ranks, int device, const CommConfig& config) {
  constexpr const char* fn = "make_loopback_communicators";
  const double timeout = Impl::resolve_timeout(fn, config.timeout_seconds);
  const PeerWindows windows = Impl::resolve_peer_windows(fn, config, CommTransport::Loopback);
  if (ranks < 1 || ranks > 4096)
    throw InvalidArgument(fn, "ranks", Rule::ConfigValue, "ranks (" + std::to_string(ranks) + ") must be in [1, 4096]");
#if !defined(KOKKOSMOE_LOOPBACK_CUDA)
  if (device >= 0)
    throw InvalidArgument(
        fn, "device", Rule::ConfigValue,
        "device " + std::to_string(device) + ": this build has no CUDA loopback (use -1, host memory)");
#endif
  if (device < -1) throw InvalidArgument(fn, "device", Rule::ConfigValue, "device must be -1 (host) or a CUDA device");
  if (device >= 0) {
    if (ranks > kMaxDeviceLoopbackRanks)
      throw InvalidArgument(fn, "ranks", Rule::ConfigValue,
                            "ranks (" + std::to_string(ranks) + ") on one device must be at most " +
                                std::to_string(kMaxDeviceLoopbackRanks) + " (one hardware queue per rank's stream)");
    const char* loading = std::getenv("CUDA_MODULE_LOADING");
    const char* queues = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    const int nq = queues != nullptr ? std::atoi(queues) : 8;
    if (loading == nullptr || std::string(loading) != "EAGER" || nq < ranks + 1)
      throw InvalidArgument(
          fn, "environment", Rule::ConfigValue,
          "loopback ranks on a device need CUDA_MODULE_LOADING=EAGER and CUDA_DEVICE_MAX_CONNECTIONS >= ranks + 1 (" +
              std::to_string(ranks + 1) + ") before CUDA starts (found " + (loading ? loading : "unset") + " and " +
              (queues ? queues : "unset") + "): call prepare_loopback_environment() before Kokkos::initialize");
  }
  auto world = std::make_shared<Impl::World>(ranks);
  std::vector<Communicator> out;
  for (int r = 0; r < ranks; ++r) {
    auto t = std::make_shared<Impl::LoopbackTransport>(world, r, device, timeout);
    t->set_peer_windows(windows);
    out.emplace_back(std::move(t));
  }
  return out;
}

void prepare_loopback_environment() {
  setenv("CUDA_MODULE_LOADING", "EAGER", 0);
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
}

}  // namespace KokkosMoE
