/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_EPEVENT_CUDA_HPP
#define KOKKOSMOE_EPEVENT_CUDA_HPP

// EpEvent on Kokkos::Cuda (docs/ep.md §16): a CUDA event without timing, recorded on the instance's stream and waited
// for on another instance's stream, with no host wait on either.

#include <KokkosMoE_EpEvent.hpp>

#include <cuda/KokkosMoE_CudaDevice.hpp>
#include <cuda_runtime.h>

#include <memory>
#include <string>

namespace KokkosMoE {

template <>
class EpEvent<Kokkos::Cuda> {
 public:
  EpEvent() = default;
  bool valid() const noexcept { return static_cast<bool>(m_event); }
  /// Implementation access; not part of the API.
  cudaEvent_t native() const noexcept { return m_event ? m_event.get() : nullptr; }
  /// Implementation access; not part of the API.
  static EpEvent record(const Kokkos::Cuda& exec) {
    cudaEvent_t e = nullptr;
    cudaError_t r = cudaSuccess;
    {
      Impl::CudaDeviceGuard guard(exec.cuda_device());
      r = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
      if (r == cudaSuccess) r = cudaEventRecord(e, exec.cuda_stream());
    }
    if (r != cudaSuccess) {
      if (e != nullptr) cudaEventDestroy(e);
      throw DeviceError(std::string("KokkosMoE::ep_record_event: ") + cudaGetErrorString(r));
    }
    EpEvent out;
    out.m_event = std::shared_ptr<CUevent_st>(e, [](cudaEvent_t ev) { cudaEventDestroy(ev); });
    return out;
  }

 private:
  std::shared_ptr<CUevent_st> m_event;
};

template <>
inline EpEvent<Kokkos::Cuda> ep_record_event<Kokkos::Cuda>(const Kokkos::Cuda& exec) {
  return EpEvent<Kokkos::Cuda>::record(exec);
}

template <>
inline void ep_wait_event<Kokkos::Cuda>(const Kokkos::Cuda& exec, const EpEvent<Kokkos::Cuda>& event) {
  if (!event.valid())
    throw InvalidArgument("ep_wait_event", "event", Rule::HandleState,
                          "the event was never recorded (ep_record_event)");
  const cudaError_t r = cudaStreamWaitEvent(exec.cuda_stream(), event.native(), 0);
  if (r != cudaSuccess) throw DeviceError(std::string("KokkosMoE::ep_wait_event: ") + cudaGetErrorString(r));
}

}  // namespace KokkosMoE

#endif
