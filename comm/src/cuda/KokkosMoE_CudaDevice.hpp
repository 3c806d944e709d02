/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_CUDA_DEVICE_HPP
#define KOKKOSMOE_CUDA_DEVICE_HPP

// The current CUDA device for a scope: the vendor code that makes device objects (IPC windows, SM partitions, events)
// makes them on the device of the rank or instance they serve, not on whichever device the thread had current.

#include <cuda_runtime.h>

namespace KokkosMoE {
namespace Impl {

/// Makes \p device current for the scope (a negative device leaves the current one).
class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(int device) {
    cudaGetDevice(&m_old);
    m_switched = device >= 0 && device != m_old;
    if (m_switched) cudaSetDevice(device);
  }
  ~CudaDeviceGuard() {
    if (m_switched) cudaSetDevice(m_old);
  }
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;

 private:
  int m_old = 0;
  bool m_switched = false;
};

}  // namespace Impl
}  // namespace KokkosMoE

#endif
