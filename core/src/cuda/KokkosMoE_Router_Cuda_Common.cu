/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// Host helpers of the native CUDA router kernels: cached device properties and occupancy-based persistent grids,
// per device (the execution space instance's, passed down in a Queue). All of them are host-only queries (no stream
// work, no allocation), so they are legal during graph capture. Function attributes and occupancy queries apply to
// the current device, so the launchers hold a DeviceGuard of the queue's device while they run.

#include <algorithm>
#include <cuda/KokkosMoE_Router_Cuda_Common.cuh>
#include <mutex>
#include <utility>
#include <vector>

namespace KokkosMoE {
namespace Impl {
namespace CudaKernels {
namespace detail {

namespace {
struct DeviceInfo {
  int sms = 0;
};
std::mutex g_mutex;
std::vector<DeviceInfo> g_devices;

struct OccKey {
  int device;
  const void* kernel;
  int block;
  size_t smem;
  int blocks_per_sm;
};
std::vector<OccKey> g_occ;
std::vector<std::pair<int, const void*>> g_carveout;  // (device, kernel) with the carveout set

const DeviceInfo& device_info(int dev) {
  // caller holds g_mutex
  if (static_cast<int>(g_devices.size()) <= dev) g_devices.resize(dev + 1);
  DeviceInfo& d = g_devices[dev];
  if (d.sms == 0) {
    int v = 0;
    cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev);
    d.sms = v > 0 ? v : 1;
  }
  return d;
}
}  // namespace

DeviceGuard::DeviceGuard(const Queue& q) {
  // cudaGetDevice reads the calling thread's current device; the set (and the restore) only when another is current
  int current = -1;
  m_status = cudaGetDevice(&current);
  if (m_status != cudaSuccess || current == q.device) return;
  m_status = cudaSetDevice(q.device);
  if (m_status == cudaSuccess) m_restore = current;
}

DeviceGuard::~DeviceGuard() {
  if (m_restore >= 0) cudaSetDevice(m_restore);
}

int sm_count(int dev) {
  std::lock_guard<std::mutex> lock(g_mutex);
  return device_info(dev).sms;
}

cudaError_t prefer_max_shared(int dev, const void* kernel) {
  const std::pair<int, const void*> key(dev, kernel);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (std::find(g_carveout.begin(), g_carveout.end(), key) != g_carveout.end()) return cudaSuccess;
  const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                               static_cast<int>(cudaSharedmemCarveoutMaxShared));
  if (err == cudaSuccess) g_carveout.push_back(key);
  return err;
}

cudaError_t ensure_smem(const void* kernel, size_t smem) {
  if (smem <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
}

int persistent_grid(int dev, const void* kernel, int block, size_t smem, long long work_blocks) {
  if (work_blocks <= 0) return 1;
  int per_sm = 0, sms = 1;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    sms = device_info(dev).sms;
    for (const OccKey& o : g_occ)
      if (o.device == dev && o.kernel == kernel && o.block == block && o.smem == smem) per_sm = o.blocks_per_sm;
  }
  if (per_sm == 0) {
    int v = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, kernel, block, smem) != cudaSuccess || v <= 0) {
      cudaGetLastError();  // clear a failed query; the launch reports real errors
      v = 1;
    }
    per_sm = v;
    std::lock_guard<std::mutex> lock(g_mutex);
    g_occ.push_back(OccKey{dev, kernel, block, smem, per_sm});
  }
  const long long cap = static_cast<long long>(per_sm) * sms;
  return static_cast<int>(std::min<long long>(work_blocks, cap));
}

}  // namespace detail
}  // namespace CudaKernels
}  // namespace Impl
}  // namespace KokkosMoE
