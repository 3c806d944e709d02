/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// The NCCL device transport (docs/ep.md §7): grouped ncclSend/ncclRecv with exact splits, ncclAlltoAll for equal
// blocks, ncclAllGather for the count exchange, all on the caller's stream. The communicator is non-blocking, so
// every call may return ncclInProgress; poll() waits for ncclCommGetAsyncError to leave ncclInProgress with a
// deadline. Host waits poll cudaStreamQuery and the async error together; on a timeout the communicator is aborted,
// which also releases kernels stuck waiting for a dead peer.
//
// Windows (docs/ep.md §7.2): NCCL symmetric windows where the library has them and every rank is in the
// communicator's load/store team (ncclMemAlloc + ncclCommWindowRegister; peer pointers from the device API's
// ncclGetLsaPointer), else cudaMalloc'd memory shared by CUDA IPC handles among the ranks of one node (the IPC
// windows of cuda/KokkosMoE_CudaIpc.hpp, which the CUDA-IPC transport uses too), else none (messages). The window entry
// points are looked up at run time, so a binary built against NCCL 2.28's headers still runs, without symmetric
// windows, on an older libnccl.
#include <KokkosMoE_Communicator_NCCL.hpp>

#include <cuda/KokkosMoE_CudaIpc.hpp>
#include <cuda/KokkosMoE_CudaStreamWait.hpp>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <impl/KokkosMoE_Transport.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#if defined(__CUDACC__)
#include <nccl_device.h>
#endif

namespace KokkosMoE {
namespace Impl {
namespace {

std::string nccl_text(ncclResult_t r) { return std::string(ncclGetErrorString(r)) + " (" + std::to_string(r) + ")"; }

using DeviceGuard = CudaDeviceGuard;

/// NCCL's window entry points, where the loaded library has them (2.28 and later).
struct WindowApi {
  using Register = ncclResult_t (*)(ncclComm_t, void*, size_t, ncclWindow_t*, int);
  using Deregister = ncclResult_t (*)(ncclComm_t, ncclWindow_t);
  Register reg = nullptr;
  Deregister dereg = nullptr;
  void* team_lsa = nullptr;  // ncclTeam_t (*)(ncclComm_t), from the device API's host part
  std::string why;           // empty when usable
};

const WindowApi& window_api() {
  static const WindowApi api = [] {
    WindowApi a;
#if !defined(__CUDACC__)
    a.why = "this build compiled the NCCL transport without a CUDA compiler (no device API)";
#else
    int version = 0;
    ncclGetVersion(&version);
    if (version < 22800) {
      a.why = "the loaded NCCL is " + std::to_string(version) + "; symmetric windows need 2.28 or later";
      return a;
    }
    a.reg = reinterpret_cast<WindowApi::Register>(dlsym(RTLD_DEFAULT, "ncclCommWindowRegister"));
    a.dereg = reinterpret_cast<WindowApi::Deregister>(dlsym(RTLD_DEFAULT, "ncclCommWindowDeregister"));
    a.team_lsa = dlsym(RTLD_DEFAULT, "ncclTeamLsa");
    if (a.reg == nullptr || a.dereg == nullptr || a.team_lsa == nullptr)
      a.why = "the loaded NCCL has no ncclCommWindowRegister/ncclTeamLsa";
#endif
    return a;
  }();
  return api;
}

/// Whether every rank of \p comm is in this rank's load/store team (symmetric windows reach all peers).
bool lsa_is_world(const WindowApi& api, ncclComm_t comm, int size) {
  if (!api.why.empty()) return false;
#if defined(__CUDACC__)
  using TeamLsa = ncclTeam_t (*)(ncclComm_t);
  return reinterpret_cast<TeamLsa>(api.team_lsa)(comm).nRanks == size;
#else
  (void)comm;
  (void)size;
  return false;
#endif
}

#if defined(__CUDACC__)
/// Every rank's part of a symmetric window as this rank addresses it (the device API computes it on the device).
__global__ void lsa_bases(ncclWindow_t w, int n, std::uintptr_t* out) {
  const int p = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (p < n) out[p] = reinterpret_cast<std::uintptr_t>(ncclGetLsaPointer(w, 0, p));
}
#endif

class NcclTransport;

/// A symmetric window of the ranks of one NCCL communicator. Released collectively (every rank meets first, so no
/// peer still writes into memory being freed); a window of an aborted communicator is left allocated (a peer may be
/// gone).
class NcclWindow final : public PeerWindow {
 public:
  explicit NcclWindow(NcclTransport* t) : m_t(t) {}
  ~NcclWindow() override;

  NcclTransport* m_t;
  void* m_mine = nullptr;
  ncclWindow_t m_win = nullptr;
};

class NcclTransport final : public Transport {
 public:
  NcclTransport(ncclComm_t comm, int rank, int size, int device, double timeout, bool owned)
      : Transport(rank, size, device, timeout), m_comm(comm), m_owned(owned) {}

  ~NcclTransport() override {
    if (!m_owned || m_comm == nullptr) return;
    DeviceGuard guard(m_device);
    if (m_aborted) return;  // abort() already released the communicator
    // Finalize flushes outstanding work, bounded by the timeout; a peer that never answers ends in an abort.
    ncclResult_t state = ncclCommFinalize(m_comm);
    const auto until = deadline();
    while (state == ncclInProgress && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      if (ncclCommGetAsyncError(m_comm, &state) != ncclSuccess) break;
    }
    if (state != ncclSuccess) {
      ncclCommAbort(m_comm);
      return;
    }
    ncclCommDestroy(m_comm);
  }

  CommTransport kind() const noexcept override { return CommTransport::Nccl; }

  void exchange(const char* op, const std::vector<PeerSegment>& segments, void* stream) override {
    check_not_aborted(op);
    record(stream, exchanges);
    DeviceGuard guard(m_device);
    auto s = static_cast<cudaStream_t>(stream);
    check(op, "ncclGroupStart", ncclGroupStart());
    ncclResult_t r = ncclSuccess;
    for (const PeerSegment& seg : segments) {
      if (r == ncclSuccess && seg.send_bytes > 0)
        r = ncclSend(seg.send, seg.send_bytes, ncclUint8, seg.peer, m_comm, s);
      if (r == ncclSuccess && seg.recv_bytes > 0)
        r = ncclRecv(seg.recv, seg.recv_bytes, ncclUint8, seg.peer, m_comm, s);
    }
    const ncclResult_t end = ncclGroupEnd();
    check(op, "ncclSend/ncclRecv", r);
    check(op, "ncclGroupEnd", end);
  }

  void alltoall(const char* op, const void* send, void* recv, std::size_t block_bytes, void* stream) override {
    check_not_aborted(op);
    record(stream, alltoalls);
    DeviceGuard guard(m_device);
    check(op, "ncclAlltoAll",
          ncclAlltoAll(send, recv, block_bytes, ncclUint8, m_comm, static_cast<cudaStream_t>(stream)));
  }

  void allgather(const char* op, const void* send, void* recv, std::size_t bytes, void* stream) override {
    check_not_aborted(op);
    record(stream, allgathers);
    DeviceGuard guard(m_device);
    check(op, "ncclAllGather", ncclAllGather(send, recv, bytes, ncclUint8, m_comm, static_cast<cudaStream_t>(stream)));
  }

  void wait(const char* op, void* stream) override {
    check_not_aborted(op);
    ++waits;
    DeviceGuard guard(m_device);
    drain(op, static_cast<cudaStream_t>(stream));
  }

  /// Over the host communicator the communicator was bootstrapped with, where it was (no stream, no NCCL call); else
  /// an NCCL all-gather on a stream of its own, waited for on the host.
  void vote(const char* op, const void* mine, void* all, std::size_t bytes) override {
    check_not_aborted(op);
    ++votes;
    if (m_votes) {
      try {
        m_votes->vote(op, mine, all, bytes);
      } catch (const CommError&) {
        abort();
        throw;
      }
      return;
    }
    host_allgather_bytes(op, mine, all, bytes);
  }

  /// The host communicator of the votes (a private split of the bootstrap communicator).
  void set_vote_transport(std::shared_ptr<Transport> host) { m_votes = std::move(host); }

  /// Host wait for \p s and the communicator's asynchronous errors, bounded by the timeout.
  void drain(const char* op, cudaStream_t s) {
    cudaError_t q = cudaSuccess;
    const auto poll = [&] {
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(m_comm, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        abort();
        fail(op, CommFailure::PeerFailure, "NCCL reported an asynchronous error: " + nccl_text(async));
      }
    };
    switch (wait_stream(s, deadline(), q, poll)) {
      case StreamWait::Done:
        return;
      case StreamWait::Failed:
        abort();
        fail(op, CommFailure::Device, std::string("cudaStreamQuery: ") + cudaGetErrorString(q));
      case StreamWait::Expired:
        abort();
        fail(op, CommFailure::Timeout,
             "the communication stream did not finish within " + std::to_string(m_timeout) +
                 " s (stalled or dead peer); the communicator was aborted (ncclCommAbort)");
    }
  }

  std::shared_ptr<Transport> split(const char* op, int color, int key) override {
    check_not_aborted(op);
    DeviceGuard guard(m_device);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    // With a non-blocking communicator NCCL writes *newcomm only when the split has completed, from its own init
    // thread: the slot lives on the heap so that a split abandoned at the deadline never writes into a dead frame.
    auto* slot = new ncclComm_t(nullptr);
    const ncclResult_t r0 = ncclCommSplit(m_comm, color, key, slot, &cfg);
    if (r0 != ncclSuccess && r0 != ncclInProgress) {
      delete slot;
      abort();
      fail(op, CommFailure::Library, "ncclCommSplit: " + nccl_text(r0));
    }
    const auto until = deadline();
    for (int spin = 0; __atomic_load_n(slot, __ATOMIC_ACQUIRE) == nullptr; ++spin) {
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(m_comm, &state);
      if (state != ncclSuccess && state != ncclInProgress) {
        abort();  // the slot is left to NCCL
        fail(op, CommFailure::Library, "ncclCommSplit: " + nccl_text(state));
      }
      if (std::chrono::steady_clock::now() >= until) {
        abort();
        fail(op, CommFailure::Timeout,
             "ncclCommSplit did not complete within " + std::to_string(m_timeout) +
                 " s (a peer did not join); the communicator was aborted");
      }
      if (spin > 64) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    ncclComm_t sub = *slot;
    delete slot;
    poll_comm(op, sub, "ncclCommSplit");
    int r = 0, n = 0;
    ncclCommUserRank(sub, &r);
    ncclCommCount(sub, &n);
    auto child = std::make_shared<NcclTransport>(sub, r, n, m_device, m_timeout, true);
    if (m_votes) child->set_vote_transport(m_votes->split(op, color, key));
    return child;
  }

  std::shared_ptr<PeerWindow> make_window(const char* op, std::size_t bytes) override {
    check_not_aborted(op);
    DeviceGuard guard(m_device);
    const WindowApi& api = window_api();
    const std::size_t n =
        (bytes + NCCL_WIN_REQUIRED_ALIGNMENT - 1) / NCCL_WIN_REQUIRED_ALIGNMENT * NCCL_WIN_REQUIRED_ALIGNMENT;
    if (m_windows == PeerWindows::NcclSymmetric || m_windows == PeerWindows::Auto) {
      // Every rank learns whether every rank can try (the same answer everywhere).
      const std::vector<int> can = host_allgather(op, lsa_is_world(api, m_comm, m_size) ? 1 : 0);
      const bool all_can = std::all_of(can.begin(), can.end(), [](int c) { return c != 0; });
      if (all_can) {
        if (auto w = symmetric_window(op, n, bytes, api)) return w;
      }
      if (m_windows == PeerWindows::NcclSymmetric)
        fail(op, CommFailure::Library,
             std::string("CommConfig::peer_windows = nccl, but NCCL gives no symmetric window here (") +
                 (!all_can
                      ? (api.why.empty() ? std::string("not every rank is in this rank's load/store team") : api.why)
                      : std::string("the communicator has no symmetric memory support")) +
                 ")");
    }
    if (m_windows != PeerWindows::CudaIpc && m_windows != PeerWindows::Auto) return nullptr;
    return make_cuda_ipc_window(
        op, *this, bytes, m_windows == PeerWindows::CudaIpc,
        [this](const char* o, const void* mine, void* all, std::size_t b) { host_allgather_bytes(o, mine, all, b); });
  }

  /// Every rank's \p mine, over the communicator itself (device memory, a stream of its own, bounded), not counted in
  /// the EP statistics.
  template <class T>
  std::vector<T> host_allgather(const char* op, const T& mine) {
    std::vector<T> all(static_cast<std::size_t>(m_size));
    host_allgather_bytes(op, &mine, all.data(), sizeof(T));
    return all;
  }

  /// Every rank's \p bytes from \p mine (host memory) into \p all in rank order, as host_allgather.
  void host_allgather_bytes(const char* op, const void* mine, void* all, std::size_t bytes) {
    DeviceGuard guard(m_device);
    cudaStream_t s = nullptr;
    cuda(op, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    void* d = nullptr;
    const cudaError_t e = cudaMalloc(&d, bytes * (m_size + 1));
    if (e != cudaSuccess) {
      cudaStreamDestroy(s);
      cuda(op, e, "cudaMalloc (window setup)");
    }
    auto* send = static_cast<char*>(d) + bytes * m_size;
    try {
      cuda(op, cudaMemcpyAsync(send, mine, bytes, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync");
      check(op, "ncclAllGather", ncclAllGather(send, d, bytes, ncclUint8, m_comm, s));
      cuda(op, cudaMemcpyAsync(all, d, bytes * m_size, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync");
      drain(op, s);
    } catch (...) {
      cudaFree(d);
      cudaStreamDestroy(s);
      throw;
    }
    cudaFree(d);
    cudaStreamDestroy(s);
  }

  void abort() noexcept override {
    if (m_aborted) return;
    m_aborted = true;
    if (m_owned && m_comm != nullptr) {
      DeviceGuard guard(m_device);
      ncclCommAbort(m_comm);
      m_comm = nullptr;
    }
  }

  /// Waits until \p comm leaves ncclInProgress (non-blocking init, split, group end), bounded by the deadline.
  void poll_comm(const char* op, ncclComm_t comm, const char* what) {
    const auto until = deadline();
    for (int spin = 0;; ++spin) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
      if (r != ncclSuccess) state = r;
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) {
        ncclCommAbort(comm);
        if (comm == m_comm) {
          m_comm = nullptr;
          m_aborted = true;
        }
        fail(op, CommFailure::Library, std::string(what) + ": " + nccl_text(state));
      }
      if (std::chrono::steady_clock::now() >= until) {
        ncclCommAbort(comm);
        if (comm == m_comm) {
          m_comm = nullptr;
          m_aborted = true;
        }
        fail(op, CommFailure::Timeout,
             std::string(what) + " did not complete within " + std::to_string(m_timeout) +
                 " s (a peer did not join or stalled); the communicator was aborted");
      }
      if (spin > 64) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

 private:
  std::shared_ptr<PeerWindow> symmetric_window(const char* op, std::size_t n, std::size_t bytes, const WindowApi& api) {
#if defined(__CUDACC__)
    void* mem = nullptr;
    check(op, "ncclMemAlloc", ncclMemAlloc(&mem, n));
    ncclWindow_t win = nullptr;
    const ncclResult_t r = api.reg(m_comm, mem, n, &win, NCCL_WIN_COLL_SYMMETRIC);
    if (r != ncclSuccess && r != ncclInProgress) ncclMemFree(mem);
    check_settled(op, "ncclCommWindowRegister", r);
    // A communicator without symmetric memory support registers nothing and still succeeds (the window stays null):
    // every rank must have a window, or none keeps one.
    const std::vector<int> got = host_allgather(op, win != nullptr ? 1 : 0);
    if (!std::all_of(got.begin(), got.end(), [](int g) { return g != 0; })) {
      if (win != nullptr) check_settled(op, "ncclCommWindowDeregister", api.dereg(m_comm, win));
      ncclMemFree(mem);
      return nullptr;
    }
    auto w = std::make_shared<NcclWindow>(this);
    w->bytes = bytes;
    w->m_mine = mem;
    w->m_win = win;
    std::uintptr_t* d = nullptr;
    cuda(op, cudaMalloc(&d, sizeof(std::uintptr_t) * m_size), "cudaMalloc");
    cudaStream_t s = nullptr;
    cuda(op, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    w->base.resize(static_cast<std::size_t>(m_size));
    lsa_bases<<<(m_size + 127) / 128, 128, 0, s>>>(w->m_win, m_size, d);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess)
      e = cudaMemcpyAsync(w->base.data(), d, sizeof(std::uintptr_t) * m_size, cudaMemcpyDeviceToHost, s);
    if (e == cudaSuccess) e = cudaMemsetAsync(w->m_mine, 0, n, s);
    if (e == cudaSuccess) drain(op, s);
    cudaFree(d);
    cudaStreamDestroy(s);
    cuda(op, e, "the window's peer pointers (ncclGetLsaPointer)");
    meet(op);  // nobody writes into a peer before every peer zeroed its part
    return w;
#else
    (void)n;
    (void)bytes;
    fail(op, CommFailure::Library, "NCCL symmetric windows are unavailable: " + api.why);
#endif
  }

 public:
  /// Every rank gets here (a one-int all-gather), bounded by the timeout.
  void meet(const char* op) {
    const int one = 1;
    (void)host_allgather(op, one);
  }

  /// Releases \p w (see NcclWindow); never throws.
  void release(NcclWindow& w) noexcept {
    if (m_aborted || m_comm == nullptr) return;
    DeviceGuard guard(m_device);
    try {
      meet("~EpGroup");
      check_settled("~EpGroup", "ncclCommWindowDeregister", window_api().dereg(m_comm, w.m_win));
      ncclMemFree(w.m_mine);
    } catch (...) {
    }
  }

 private:
  void cuda(const char* op, cudaError_t e, const char* what) const { check_cuda(op, m_rank, m_size, e, what); }

  void check(const char* op, const char* what, ncclResult_t r) {
    if (r == ncclInProgress) {
      poll_comm(op, m_comm, what);
      return;
    }
    if (r != ncclSuccess) {
      abort();
      fail(op, CommFailure::Library, std::string(what) + ": " + nccl_text(r));
    }
  }

  /// check(), then wait until the non-blocking communicator has settled: window (de)registration may keep it busy
  /// after returning success, and the next call on it would fail as "used before the previous operation returned
  /// ncclSuccess" (NCCL 2.28.9).
  void check_settled(const char* op, const char* what, ncclResult_t r) {
    check(op, what, r);
    poll_comm(op, m_comm, what);
  }

  ncclComm_t m_comm;
  bool m_owned;
  std::shared_ptr<Transport> m_votes;
};

NcclWindow::~NcclWindow() { m_t->release(*this); }

}  // namespace
}  // namespace Impl

ncclUniqueId make_nccl_unique_id() {
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess)
    throw CommError("make_nccl_unique_id", 0, 1, CommFailure::Library, "ncclGetUniqueId: " + Impl::nccl_text(r));
  return id;
}

Communicator make_nccl_communicator(const ncclUniqueId& id, int rank, int size, int device, const CommConfig& config) {
  constexpr const char* fn = "make_nccl_communicator";
  const double timeout = Impl::resolve_timeout(fn, config.timeout_seconds);
  const PeerWindows windows = Impl::resolve_peer_windows(fn, config, CommTransport::Nccl);
  if (size < 1 || rank < 0 || rank >= size)
    throw InvalidArgument(fn, "rank", Rule::CommSize,
                          "rank (" + std::to_string(rank) + ") must be in [0, size = " + std::to_string(size) + ")");
  int ndev = 0;
  Impl::check_cuda(fn, rank, size, cudaGetDeviceCount(&ndev), "cudaGetDeviceCount");
  if (device < 0 || device >= ndev)
    throw InvalidArgument(fn, "device", Rule::ConfigValue,
                          "device (" + std::to_string(device) + ") must be in [0, " + std::to_string(ndev) + ")");
  Impl::DeviceGuard guard(device);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &cfg);
  if (r != ncclSuccess && r != ncclInProgress) {
    if (comm != nullptr) ncclCommAbort(comm);
    throw CommError(fn, rank, size, CommFailure::Library, "ncclCommInitRankConfig: " + Impl::nccl_text(r));
  }
  auto t = std::make_shared<Impl::NcclTransport>(comm, rank, size, device, timeout, true);
  t->set_peer_windows(windows);
  t->poll_comm(fn, comm, "ncclCommInitRankConfig");
  return Communicator(std::move(t));
}

std::vector<Communicator> make_nccl_communicators(const std::vector<int>& devices, const CommConfig& config) {
  constexpr const char* fn = "make_nccl_communicators";
  const double timeout = Impl::resolve_timeout(fn, config.timeout_seconds);
  const PeerWindows windows = Impl::resolve_peer_windows(fn, config, CommTransport::Nccl);
  const int n = static_cast<int>(devices.size());
  if (n < 1) throw InvalidArgument(fn, "devices", Rule::CommSize, "devices must name at least one GPU");
  const ncclUniqueId id = make_nccl_unique_id();
  std::vector<ncclComm_t> comms(devices.size(), nullptr);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclResult_t r = ncclGroupStart();
  for (int i = 0; i < n && r == ncclSuccess; ++i) {
    cudaSetDevice(devices[i]);
    r = ncclCommInitRankConfig(&comms[i], n, id, i, &cfg);
    if (r == ncclInProgress) r = ncclSuccess;
  }
  const ncclResult_t end = ncclGroupEnd();
  if (r != ncclSuccess || (end != ncclSuccess && end != ncclInProgress)) {
    for (ncclComm_t c : comms)
      if (c != nullptr) ncclCommAbort(c);
    throw CommError(fn, 0, n, CommFailure::Library,
                    "ncclCommInitRankConfig (grouped): " + Impl::nccl_text(r != ncclSuccess ? r : end));
  }
  std::vector<Communicator> out;
  std::vector<std::shared_ptr<Impl::NcclTransport>> ts;
  for (int i = 0; i < n; ++i) {
    ts.push_back(std::make_shared<Impl::NcclTransport>(comms[i], i, n, devices[i], timeout, true));
    ts.back()->set_peer_windows(windows);
  }
  for (int i = 0; i < n; ++i) ts[i]->poll_comm(fn, comms[i], "ncclCommInitRankConfig");
  for (auto& t : ts) out.emplace_back(std::move(t));
  return out;
}

Communicator make_nccl_communicator(const Communicator& host, int device, const CommConfig& config) {
  constexpr const char* fn = "make_nccl_communicator";
  if (!host.valid() || (host.transport() != CommTransport::Mpi && host.transport() != CommTransport::MpiShm))
    throw InvalidArgument(fn, "host", Rule::TransportMismatch, "the bootstrap communicator must be a host (MPI) one");
  ncclUniqueId id{};
  if (host.rank() == 0) id = make_nccl_unique_id();
  std::vector<ncclUniqueId> all(static_cast<std::size_t>(host.size()));
  host.impl_transport()->allgather(fn, &id, all.data(), sizeof(ncclUniqueId), nullptr);
  Communicator c = make_nccl_communicator(all[0], host.rank(), host.size(), device, config);
  // The per-call validation votes go over a private split of the host communicator: no stream, no NCCL call.
  std::shared_ptr<Impl::Transport> votes = host.impl_transport()->split(fn, 0, host.rank());
  votes->set_timeout_seconds(c.timeout_seconds());
  static_cast<Impl::NcclTransport&>(*c.impl_transport()).set_vote_transport(std::move(votes));
  return c;
}

Communicator borrow_nccl_communicator(ncclComm_t comm, int device, const CommConfig& config) {
  constexpr const char* fn = "borrow_nccl_communicator";
  const double timeout = Impl::resolve_timeout(fn, config.timeout_seconds);
  const PeerWindows windows = Impl::resolve_peer_windows(fn, config, CommTransport::Nccl);
  if (comm == nullptr) throw InvalidArgument(fn, "comm", Rule::ConfigValue, "comm is null");
  int rank = 0, size = 0;
  ncclCommUserRank(comm, &rank);
  ncclCommCount(comm, &size);
  auto t = std::make_shared<Impl::NcclTransport>(comm, rank, size, device, timeout, false);
  t->set_peer_windows(windows);
  return Communicator(std::move(t));
}

}  // namespace KokkosMoE
