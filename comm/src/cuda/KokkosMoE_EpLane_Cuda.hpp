/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_EPLANE_CUDA_HPP
#define KOKKOSMOE_EPLANE_CUDA_HPP

// EpLane on Kokkos::Cuda (docs/ep.md §13): under SmCap::Partition (or Auto where the driver makes partitions) the
// group's operations run on a Kokkos::Cuda instance over an SM partition's stream.

#include <Kokkos_Core.hpp>

#include <cuda/KokkosMoE_CudaDevice.hpp>
#include <cuda/KokkosMoE_SmPartition.hpp>
#include <cuda_runtime.h>
#include <impl/KokkosMoE_EP_Lane.hpp>

#include <memory>
#include <optional>
#include <string>

namespace KokkosMoE {
namespace Impl {

template <>
class EpLane<Kokkos::Cuda> {
 public:
  /// \throws InvalidArgument (Rule::ConfigValue, sm_cap) for SmCap::Partition where the device makes no partition of
  /// at most max_sms SMs; DeviceError when the driver fails to make one
  static EpLane make(const char* fn, const Kokkos::Cuda& caller, const EpGroupConfig& c) {
    EpLane l;
    if (c.max_sms <= 0 || c.sm_cap == SmCap::Teams) return l;
    l.m_part = acquire_sm_partition(caller.cuda_device(), c.max_sms);
    if (!l.m_part) {
      if (c.sm_cap == SmCap::Partition)
        throw InvalidArgument(fn, "sm_cap", Rule::ConfigValue,
                              "sm_cap = partition: device " + std::to_string(caller.cuda_device()) +
                                  " makes no SM partition of at most max_sms = " + std::to_string(c.max_sms) +
                                  " SMs (a driver without green contexts, or max_sms below their granularity)");
      return l;
    }
    l.m_exec.emplace(l.m_part->stream);
    CudaDeviceGuard guard(caller.cuda_device());  // the events live on the device of the streams they order
    l.m_fork = event();
    l.m_join = event();
    return l;
  }
  bool partitioned() const noexcept { return static_cast<bool>(m_part); }
  int partition_sms() const noexcept { return m_part ? m_part->sms : 0; }
  const Kokkos::Cuda& exec() const { return *m_exec; }
  cudaEvent_t fork() const noexcept { return m_fork.get(); }
  cudaEvent_t join() const noexcept { return m_join.get(); }

 private:
  static std::shared_ptr<CUevent_st> event() {
    cudaEvent_t e = nullptr;
    const cudaError_t r = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    if (r != cudaSuccess) throw DeviceError(std::string("KokkosMoE: EP lane event: ") + cudaGetErrorString(r));
    return std::shared_ptr<CUevent_st>(e, [](cudaEvent_t ev) { cudaEventDestroy(ev); });
  }
  std::shared_ptr<const SmPartition> m_part;
  std::optional<Kokkos::Cuda> m_exec;
  std::shared_ptr<CUevent_st> m_fork, m_join;
};

template <>
class EpLaneScope<Kokkos::Cuda> {
 public:
  EpLaneScope(const EpLane<Kokkos::Cuda>& lane, const Kokkos::Cuda& caller)
      : m_caller(caller), m_exec(lane.partitioned() ? lane.exec() : caller) {
    if (!lane.partitioned()) return;
    m_join = lane.join();
    cudaError_t r = cudaEventRecord(lane.fork(), caller.cuda_stream());
    if (r == cudaSuccess) r = cudaStreamWaitEvent(m_exec.cuda_stream(), lane.fork(), 0);
    if (r != cudaSuccess) throw DeviceError(std::string("KokkosMoE: EP lane fork: ") + cudaGetErrorString(r));
  }
  /// The caller's later work waits for everything the operation put on the partition's stream (also when it threw).
  ~EpLaneScope() {
    if (m_join == nullptr) return;
    if (cudaEventRecord(m_join, m_exec.cuda_stream()) == cudaSuccess)
      cudaStreamWaitEvent(m_caller.cuda_stream(), m_join, 0);
  }
  EpLaneScope(const EpLaneScope&) = delete;
  EpLaneScope& operator=(const EpLaneScope&) = delete;
  const Kokkos::Cuda& exec() const noexcept { return m_exec; }

 private:
  Kokkos::Cuda m_caller, m_exec;
  cudaEvent_t m_join = nullptr;
};

}  // namespace Impl
}  // namespace KokkosMoE

#endif
