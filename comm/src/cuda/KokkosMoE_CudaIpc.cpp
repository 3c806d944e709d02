/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// CUDA IPC (docs/ep.md §7.2, §7.5): the IPC windows both device transports share, and the CUDA-IPC transport: a
// communicator for Kokkos::Cuda bootstrapped over a host (MPI) communicator, whose windows are CUDA IPC mappings and
// whose collectives are the host communicator's, staged through pinned host memory with bounded stream waits. Every
// CUDA IPC call of the library is in this file.
#include <KokkosMoE_Communicator_CudaIpc.hpp>

#include <cuda/KokkosMoE_CudaIpc.hpp>
#include <cuda/KokkosMoE_CudaStreamWait.hpp>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace KokkosMoE {
namespace Impl {
namespace {

/// What each rank tells the others before a window is made (one all-gather).
struct IpcProbe {
  std::uint64_t node = 0;  // hash of the host name and boot id
  std::int64_t pid = 0;
  int device = -1;
  cudaUUID_t uuid{};  // the GPU itself: processes that see it under different ordinals share it all the same
  cudaIpcMemHandle_t handle{};
  std::uintptr_t raw = 0;  // the allocation as this process sees it (peers in the same process use it as is)
};

std::uint64_t node_id() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::string id = host;
  if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
    char boot[64] = {};
    if (std::fgets(boot, sizeof(boot), f) != nullptr) id += boot;
    std::fclose(f);
  }
  return std::hash<std::string>{}(id);
}

/// A window of cudaMalloc'd parts. A complete window (handed to the caller) is released collectively: every rank meets
/// first, so no peer still writes into a part being freed. After an abort (a peer may be gone or stalled, and a
/// stalled peer may still write into this rank's part) the mappings of the peers' parts are closed and this rank's
/// part stays allocated until the process ends. A window abandoned while it is made (an error, ranks on several
/// nodes) was never written by anyone: it is freed at once, without a meeting its peers might not come to.
class CudaIpcWindow final : public PeerWindow {
 public:
  CudaIpcWindow(Transport& t, HostAllgather meet) : m_t(t), m_meet(std::move(meet)) {}
  ~CudaIpcWindow() override {
    CudaDeviceGuard guard(m_t.device());
    bool free_mine = !m_complete;  // abandoned while made: nobody wrote into it
    if (m_complete && !m_t.aborted()) {
      try {
        const int one = 1;
        std::vector<int> all(static_cast<std::size_t>(m_t.size()));
        m_meet("~EpGroup", &one, all.data(), sizeof(int));
        free_mine = true;
      } catch (...) {
      }
    }
    for (void* q : m_opened) {
      cudaIpcCloseMemHandle(q);
      --m_t.peer_mappings;
    }
    if (free_mine && m_mine != nullptr) cudaFree(m_mine);
  }
  CudaIpcWindow(const CudaIpcWindow&) = delete;
  CudaIpcWindow& operator=(const CudaIpcWindow&) = delete;

  Transport& m_t;  // outlives its windows (the EP group holds both)
  HostAllgather m_meet;
  void* m_mine = nullptr;
  std::vector<void*> m_opened;  // parts of ranks in other processes
  bool m_complete = false;      // handed to the caller
};

}  // namespace

std::shared_ptr<PeerWindow> make_cuda_ipc_window(const char* op, Transport& t, std::size_t bytes, bool required,
                                                 HostAllgather allgather) {
  const int R = t.size(), me = t.rank();
  auto cuda = [&](cudaError_t e, const std::string& what) { check_cuda(op, me, R, e, what.c_str()); };
  CudaDeviceGuard guard(t.device());
  auto w = std::make_shared<CudaIpcWindow>(t, allgather);
  w->bytes = bytes;
  // Every part starts on a 16-byte row boundary at least: cudaMalloc aligns to 256 bytes.
  cuda(cudaMalloc(&w->m_mine, std::max<std::size_t>(bytes, 1)), "cudaMalloc (window)");
  IpcProbe mine;
  mine.node = node_id();
  mine.pid = static_cast<std::int64_t>(getpid());
  mine.device = t.device();
  cudaDeviceProp prop{};
  cuda(cudaGetDeviceProperties(&prop, t.device()), "cudaGetDeviceProperties");
  mine.uuid = prop.uuid;
  mine.raw = reinterpret_cast<std::uintptr_t>(w->m_mine);
  cuda(cudaIpcGetMemHandle(&mine.handle, w->m_mine), "cudaIpcGetMemHandle");
  std::vector<IpcProbe> all(static_cast<std::size_t>(R));
  allgather(op, &mine, all.data(), sizeof(IpcProbe));
  const bool one_node = std::all_of(all.begin(), all.end(), [&](const IpcProbe& p) { return p.node == all[0].node; });
  if (!one_node) {
    if (required)
      throw CommError(op, me, R, CommFailure::Library,
                      "CommConfig::peer_windows = ipc, but the ranks are on more than one node");
    return nullptr;  // ranks on several nodes: messages
  }
  w->base.resize(static_cast<std::size_t>(R));
  w->device_sharers = static_cast<int>(std::count_if(all.begin(), all.end(), [&](const IpcProbe& p) {
    return std::memcmp(&p.uuid, &mine.uuid, sizeof(cudaUUID_t)) == 0;
  }));
  std::string failed;
  for (int r = 0; r < R; ++r) {
    const IpcProbe& p = all[r];
    if (r == me) {
      w->base[r] = mine.raw;
    } else if (p.pid == mine.pid) {
      // Another GPU of this process: its allocation is addressable as is once peer access is on.
      if (p.device != mine.device) {
        const cudaError_t e = cudaDeviceEnablePeerAccess(p.device, 0);
        if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) cuda(e, "cudaDeviceEnablePeerAccess");
        cudaGetLastError();  // clear the sticky "already enabled"
      }
      w->base[r] = p.raw;
    } else {
      void* q = nullptr;
      const cudaError_t e = cudaIpcOpenMemHandle(&q, p.handle, cudaIpcMemLazyEnablePeerAccess);
      if (e != cudaSuccess) {
        failed +=
            (failed.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + ": " + cudaGetErrorString(e);
        cudaGetLastError();
        continue;
      }
      w->m_opened.push_back(q);
      ++t.peer_mappings;
      w->base[r] = reinterpret_cast<std::uintptr_t>(q);
    }
  }
  cudaError_t e = cudaMemset(w->m_mine, 0, bytes);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  // Every rank learns whether every rank mapped every part (the same answer everywhere, so all throw or none).
  const int ok = failed.empty() && e == cudaSuccess ? 1 : 0;
  std::vector<int> oks(static_cast<std::size_t>(R));
  allgather(op, &ok, oks.data(), sizeof(int));
  if (e != cudaSuccess) cuda(e, "zeroing the window");
  if (!failed.empty()) throw CommError(op, me, R, CommFailure::Device, "cudaIpcOpenMemHandle: " + failed);
  std::string bad;
  for (int r = 0; r < R; ++r)
    if (oks[r] == 0) bad += (bad.empty() ? "" : ", ") + std::to_string(r);
  if (!bad.empty())
    throw CommError(op, me, R, CommFailure::PeerFailure,
                    "rank(s) " + bad +
                        " could not map every part of the window (their CommError names the CUDA "
                        "error)");
  w->m_complete = true;
  return w;
}

namespace {

/// The CUDA-IPC transport: collectives over the host communicator, staged through pinned host memory on the
/// caller's stream; windows of CUDA IPC mappings.
class CudaIpcTransport final : public Transport {
 public:
  CudaIpcTransport(std::shared_ptr<Transport> host, int device, double timeout)
      : Transport(host->rank(), host->size(), device, timeout), m_host(std::move(host)) {}
  ~CudaIpcTransport() override {
    if (m_stage != nullptr) cudaFreeHost(m_stage);
  }

  CommTransport kind() const noexcept override { return CommTransport::CudaIpc; }

  void exchange(const char* op, const std::vector<PeerSegment>& segments, void* stream) override {
    check_not_aborted(op);
    record(stream, exchanges);
    std::size_t out = 0, in = 0;
    for (const PeerSegment& s : segments) {
      out += s.send_bytes;
      in += s.recv_bytes;
    }
    char* h = stage(op, out + in);
    std::vector<PeerSegment> host(segments.size());
    std::size_t so = 0, ro = out;
    for (std::size_t i = 0; i < segments.size(); ++i) {
      const PeerSegment& s = segments[i];
      host[i] = {s.peer, h + so, s.send_bytes, h + ro, s.recv_bytes};
      so += s.send_bytes;
      ro += s.recv_bytes;
    }
    for (std::size_t i = 0; i < segments.size(); ++i)
      if (segments[i].send_bytes > 0)
        copy(op, const_cast<void*>(host[i].send), segments[i].send, host[i].send_bytes, stream);
    drain(op, stream);
    on_host([&] { m_host->exchange(op, host, nullptr); });
    for (std::size_t i = 0; i < segments.size(); ++i)
      if (segments[i].recv_bytes > 0) copy(op, segments[i].recv, host[i].recv, host[i].recv_bytes, stream);
    drain(op, stream);
  }

  void alltoall(const char* op, const void* send, void* recv, std::size_t block_bytes, void* stream) override {
    check_not_aborted(op);
    record(stream, alltoalls);
    const std::size_t n = block_bytes * static_cast<std::size_t>(m_size);
    char* h = stage(op, 2 * n);
    copy(op, h, send, n, stream);
    drain(op, stream);
    on_host([&] { m_host->alltoall(op, h, h + n, block_bytes, nullptr); });
    copy(op, recv, h + n, n, stream);
    drain(op, stream);
  }

  void allgather(const char* op, const void* send, void* recv, std::size_t bytes, void* stream) override {
    check_not_aborted(op);
    record(stream, allgathers);
    const std::size_t n = bytes * static_cast<std::size_t>(m_size);
    char* h = stage(op, bytes + n);
    copy(op, h, send, bytes, stream);
    drain(op, stream);
    on_host([&] { m_host->allgather(op, h, h + bytes, bytes, nullptr); });
    copy(op, recv, h + bytes, n, stream);
    drain(op, stream);
  }

  void vote(const char* op, const void* mine, void* all, std::size_t bytes) override {
    check_not_aborted(op);
    ++votes;
    on_host([&] { m_host->vote(op, mine, all, bytes); });
  }

  void wait(const char* op, void* stream) override {
    check_not_aborted(op);
    ++waits;
    drain(op, stream);
  }

  std::shared_ptr<Transport> split(const char* op, int color, int key) override {
    check_not_aborted(op);
    std::shared_ptr<Transport> child;
    on_host([&] { child = m_host->split(op, color, key); });
    return std::make_shared<CudaIpcTransport>(std::move(child), m_device, m_timeout);
  }

  void abort() noexcept override {
    m_aborted = true;
    m_host->abort();
  }

  std::shared_ptr<PeerWindow> make_window(const char* op, std::size_t bytes) override {
    check_not_aborted(op);
    if (m_windows == PeerWindows::Off) return nullptr;
    std::shared_ptr<PeerWindow> w;
    on_host([&] {
      w = make_cuda_ipc_window(op, *this, bytes, m_windows == PeerWindows::CudaIpc,
                               [this](const char* o, const void* mine, void* all, std::size_t b) {
                                 m_host->allgather(o, mine, all, b, nullptr);  // setup: not counted as EP traffic
                               });
    });
    return w;
  }

 private:
  /// A host communicator failure aborts this transport too.
  template <class F>
  void on_host(F&& f) {
    try {
      f();
    } catch (const CommError&) {
      m_aborted = true;
      throw;
    }
  }

  /// Pinned host memory of at least \p bytes, reused by the next call (each call drains its copies first).
  char* stage(const char* op, std::size_t bytes) {
    if (bytes > m_stage_bytes) {
      CudaDeviceGuard guard(m_device);
      if (m_stage != nullptr) cudaFreeHost(m_stage);
      m_stage = nullptr;
      m_stage_bytes = 0;
      check_cuda(op, m_rank, m_size, cudaMallocHost(reinterpret_cast<void**>(&m_stage), bytes),
                 "cudaMallocHost (staging)");
      m_stage_bytes = bytes;
    }
    return m_stage;
  }

  void copy(const char* op, void* dst, const void* src, std::size_t bytes, void* stream) {
    if (bytes == 0) return;
    CudaDeviceGuard guard(m_device);
    const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream));
    if (e != cudaSuccess) {
      abort();
      fail(op, CommFailure::Device, std::string("cudaMemcpyAsync (staging): ") + cudaGetErrorString(e));
    }
  }

  /// Host wait for \p stream, bounded by the timeout.
  void drain(const char* op, void* stream) {
    CudaDeviceGuard guard(m_device);
    cudaError_t q = cudaSuccess;
    switch (wait_stream(static_cast<cudaStream_t>(stream), deadline(), q, [] {})) {
      case StreamWait::Done:
        return;
      case StreamWait::Failed:
        abort();
        fail(op, CommFailure::Device, std::string("cudaStreamQuery: ") + cudaGetErrorString(q));
      case StreamWait::Expired:
        abort();
        fail(op, CommFailure::Timeout,
             "the stream did not finish within " + std::to_string(m_timeout) +
                 " s (a kernel waiting for a stalled or dead peer); the communicator was aborted");
    }
  }

  std::shared_ptr<Transport> m_host;
  char* m_stage = nullptr;
  std::size_t m_stage_bytes = 0;
};

}  // namespace
}  // namespace Impl

Communicator make_cuda_ipc_communicator(const Communicator& host, int device, const CommConfig& config) {
  constexpr const char* fn = "make_cuda_ipc_communicator";
  const double timeout = Impl::resolve_timeout(fn, config.timeout_seconds);
  const PeerWindows windows = Impl::resolve_peer_windows(fn, config, CommTransport::CudaIpc);
  if (!host.valid() || (host.transport() != CommTransport::Mpi && host.transport() != CommTransport::MpiShm))
    throw InvalidArgument(fn, "host", Rule::TransportMismatch,
                          "the bootstrap communicator must be a host (MPI) one, made by make_mpi_communicator or "
                          "make_mpi_shm_communicator");
  const int rank = host.rank(), size = host.size();
  int ndev = 0;
  Impl::check_cuda(fn, rank, size, cudaGetDeviceCount(&ndev), "cudaGetDeviceCount");
  if (device < 0 || device >= ndev)
    throw InvalidArgument(fn, "device", Rule::ConfigValue,
                          "device (" + std::to_string(device) + ") must be in [0, " + std::to_string(ndev) + ")");
  // A private host communicator (a split that keeps every rank in order): this communicator's traffic never meets
  // the caller's, and its deadline is this one's.
  std::shared_ptr<Impl::Transport> sub = host.impl_transport()->split(fn, 0, rank);
  sub->set_timeout_seconds(timeout);
  auto t = std::make_shared<Impl::CudaIpcTransport>(std::move(sub), device, timeout);
  t->set_peer_windows(windows);
  return Communicator(std::move(t));
}

}  // namespace KokkosMoE
