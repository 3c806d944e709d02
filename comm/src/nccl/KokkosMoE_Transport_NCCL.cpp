/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// The NCCL device transport (docs/ep.md §7): grouped ncclSend/ncclRecv with exact splits, ncclAlltoAll for equal
// blocks, ncclAllGather for the count exchange, all on the caller's stream. The communicator is non-blocking, so
// every call may return ncclInProgress; poll() waits for ncclCommGetAsyncError to leave ncclInProgress with a
// deadline. Host waits poll cudaStreamQuery and the async error together; on a timeout the communicator is aborted,
// which also releases kernels stuck waiting for a dead peer.
#include <KokkosMoE_Communicator_NCCL.hpp>

#include <cuda_runtime.h>
#include <impl/KokkosMoE_Transport.hpp>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace KokkosMoE {
namespace Impl {
namespace {

std::string nccl_text(ncclResult_t r) { return std::string(ncclGetErrorString(r)) + " (" + std::to_string(r) + ")"; }

class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    cudaGetDevice(&m_old);
    if (device >= 0 && device != m_old) cudaSetDevice(device);
  }
  ~DeviceGuard() { cudaSetDevice(m_old); }

 private:
  int m_old = 0;
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
    auto s = static_cast<cudaStream_t>(stream);
    const auto until = deadline();
    for (int spin = 0;; ++spin) {
      const cudaError_t q = cudaStreamQuery(s);
      if (q == cudaSuccess) break;
      if (q != cudaErrorNotReady) {
        abort();
        fail(op, CommFailure::Device, std::string("cudaStreamQuery: ") + cudaGetErrorString(q));
      }
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(m_comm, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        abort();
        fail(op, CommFailure::PeerFailure, "NCCL reported an asynchronous error: " + nccl_text(async));
      }
      if (std::chrono::steady_clock::now() >= until) {
        abort();
        fail(op, CommFailure::Timeout,
             "the communication stream did not finish within " + std::to_string(m_timeout) +
                 " s (stalled or dead peer); the communicator was aborted (ncclCommAbort)");
      }
      if (spin > 64) std::this_thread::sleep_for(std::chrono::microseconds(20));
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
    return std::make_shared<NcclTransport>(sub, r, n, m_device, m_timeout, true);
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

  ncclComm_t comm() const noexcept { return m_comm; }

 private:
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

  ncclComm_t m_comm;
  bool m_owned;
};

void check_cuda(const char* fn, int rank, int size, cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw CommError(fn, rank, size, CommFailure::Device, std::string(what) + ": " + cudaGetErrorString(e));
}

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
  t->poll_comm(fn, comm, "ncclCommInitRankConfig");
  return Communicator(std::move(t));
}

std::vector<Communicator> make_nccl_communicators(const std::vector<int>& devices, const CommConfig& config) {
  constexpr const char* fn = "make_nccl_communicators";
  const double timeout = Impl::resolve_timeout(fn, config.timeout_seconds);
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
  for (int i = 0; i < n; ++i)
    ts.push_back(std::make_shared<Impl::NcclTransport>(comms[i], i, n, devices[i], timeout, true));
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
  return make_nccl_communicator(all[0], host.rank(), host.size(), device, config);
}

Communicator borrow_nccl_communicator(ncclComm_t comm, int device, const CommConfig& config) {
  constexpr const char* fn = "borrow_nccl_communicator";
  const double timeout = Impl::resolve_timeout(fn, config.timeout_seconds);
  if (comm == nullptr) throw InvalidArgument(fn, "comm", Rule::ConfigValue, "comm is null");
  int rank = 0, size = 0;
  ncclCommUserRank(comm, &rank);
  ncclCommCount(comm, &size);
  return Communicator(std::make_shared<Impl::NcclTransport>(comm, rank, size, device, timeout, false));
}

}  // namespace KokkosMoE
