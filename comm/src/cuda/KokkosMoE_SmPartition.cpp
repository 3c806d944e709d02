/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// SM partitions over CUDA green contexts (docs/ep.md §13). Every driver call of the library is in this file.
#include <KokkosMoE_Error.hpp>

#include <cuda.h>
#include <cuda/KokkosMoE_CudaDevice.hpp>
#include <cuda/KokkosMoE_SmPartition.hpp>

#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace KokkosMoE {
namespace Impl {
namespace {

/// The driver's green-context entry points (CUDA 12.5 and later drivers); all null where the driver lacks one.
struct GreenApi {
  decltype(&cuDeviceGetDevResource) get_resource = nullptr;
  decltype(&cuDevSmResourceSplitByCount) split = nullptr;
  decltype(&cuDevResourceGenerateDesc) describe = nullptr;
  decltype(&cuGreenCtxCreate) create = nullptr;
  decltype(&cuGreenCtxStreamCreate) stream_create = nullptr;
  bool complete() const { return get_resource && split && describe && create && stream_create; }
};

template <class F>
void entry(const char* name, F& f) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(name, &p, CUDA_VERSION, cudaEnableDefault, &found) == cudaSuccess &&
      found == cudaDriverEntryPointSuccess)
    f = reinterpret_cast<F>(p);
  else
    cudaGetLastError();  // a missing entry point is an answer, not a sticky error
}

GreenApi load_api() {
  GreenApi a;
  entry("cuDeviceGetDevResource", a.get_resource);
  entry("cuDevSmResourceSplitByCount", a.split);
  entry("cuDevResourceGenerateDesc", a.describe);
  entry("cuGreenCtxCreate", a.create);
  entry("cuGreenCtxStreamCreate", a.stream_create);
  return a;
}

/// Partitions split one SM at a time (per SM, not per cluster of co-scheduled SMs: the EP kernels launch no
/// clusters), which gives the finest granularity the device has.
constexpr unsigned kSplitFlags = CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING;

struct Entry {
  SmPartition part;
  CUgreenCtx ctx = nullptr;
  int users = 0;
};

/// The partitions of one size: the device split once into as many disjoint groups of that size as it holds, each
/// group's green context made when first asked for and kept (never freed: it lives as long as the process).
struct SizeSlots {
  std::vector<CUdevResource> groups;
  std::vector<Entry*> entries;  // per group; nullptr until made
};

struct DevicePool {
  bool ready = false;  // the device's SM resource was read
  CUdevResource all{};
  std::map<int, SizeSlots> sizes;
};

struct Pools {
  std::mutex mutex;
  GreenApi api = load_api();
  std::map<int, DevicePool> devices;
};

Pools& pools() {
  static Pools* p = new Pools();  // never destroyed: partitions may be released after static destruction began
  return *p;
}

/// One group of \p min_count SMs or more off \p from; its count, 0 when the driver cannot split one.
unsigned split_one(const GreenApi& api, CUdevResource* from, unsigned min_count, CUdevResource* group,
                   CUdevResource* remaining) {
  unsigned groups = 1;
  if (api.split(group, &groups, from, remaining, kSplitFlags, min_count) != CUDA_SUCCESS || groups != 1) return 0;
  return group->sm.smCount;
}

/// The pool of \p device with its SM resource read; nullptr where the driver has no green contexts.
DevicePool* device_pool(Pools& p, int device) {
  if (!p.api.complete()) return nullptr;
  DevicePool& d = p.devices[device];
  if (!d.ready) {
    CudaDeviceGuard guard(device);
    cudaFree(nullptr);  // the primary context exists before a green context retains it
    if (p.api.get_resource(static_cast<CUdevice>(device), &d.all, CU_DEV_RESOURCE_TYPE_SM) != CUDA_SUCCESS)
      return nullptr;
    d.ready = true;
  }
  return &d;
}

int size_for(const GreenApi& api, DevicePool& d, int max_sms) {
  for (int n = max_sms; n >= 1; --n) {
    CUdevResource g{};
    const unsigned got = split_one(api, &d.all, static_cast<unsigned>(n), &g, nullptr);
    if (got >= 1 && got <= static_cast<unsigned>(max_sms)) return static_cast<int>(got);
  }
  return 0;
}

[[noreturn]] void fail(int device, int sms, const char* what, CUresult r) {
  throw DeviceError("KokkosMoE: making an SM partition of " + std::to_string(sms) + " SMs on device " +
                    std::to_string(device) + ": " + what + " failed (CUresult " + std::to_string(static_cast<int>(r)) +
                    ")");
}

}  // namespace

int sm_partition_size(int device, int max_sms) {
  Pools& p = pools();
  std::lock_guard<std::mutex> lock(p.mutex);
  DevicePool* d = device_pool(p, device);
  return d != nullptr && max_sms >= 1 ? size_for(p.api, *d, max_sms) : 0;
}

std::shared_ptr<const SmPartition> acquire_sm_partition(int device, int max_sms) {
  Pools& p = pools();
  std::lock_guard<std::mutex> lock(p.mutex);
  DevicePool* d = device_pool(p, device);
  const int size = d != nullptr && max_sms >= 1 ? size_for(p.api, *d, max_sms) : 0;
  if (size == 0) return nullptr;
  SizeSlots& slots = d->sizes[size];
  if (slots.groups.empty()) {
    unsigned n = 0;
    if (p.api.split(nullptr, &n, &d->all, nullptr, kSplitFlags, static_cast<unsigned>(size)) != CUDA_SUCCESS || n == 0)
      return nullptr;
    std::vector<CUdevResource> groups(n);
    if (p.api.split(groups.data(), &n, &d->all, nullptr, kSplitFlags, static_cast<unsigned>(size)) != CUDA_SUCCESS)
      return nullptr;
    groups.resize(n);
    for (const CUdevResource& g : groups)
      if (static_cast<int>(g.sm.smCount) == size) slots.groups.push_back(g);
    if (slots.groups.empty()) return nullptr;
    slots.entries.assign(slots.groups.size(), nullptr);
  }
  // The group fewest owners hold (the lowest such): disjoint from every partition of this size held, while any is
  // free.
  std::size_t k = 0;
  for (std::size_t i = 1; i < slots.groups.size(); ++i) {
    const int ui = slots.entries[i] != nullptr ? slots.entries[i]->users : 0;
    const int uk = slots.entries[k] != nullptr ? slots.entries[k]->users : 0;
    if (ui < uk) k = i;
  }
  Entry*& e = slots.entries[k];
  if (e == nullptr) {
    CudaDeviceGuard guard(device);
    CUdevResourceDesc desc = nullptr;
    CUresult r = p.api.describe(&desc, &slots.groups[k], 1);
    if (r != CUDA_SUCCESS) fail(device, size, "cuDevResourceGenerateDesc", r);
    CUgreenCtx ctx = nullptr;
    r = p.api.create(&ctx, desc, static_cast<CUdevice>(device), CU_GREEN_CTX_DEFAULT_STREAM);
    if (r != CUDA_SUCCESS) fail(device, size, "cuGreenCtxCreate", r);
    // The highest priority: where compute kernels of other streams fill the partition's SMs too, a block of the
    // group's takes the first free slot there.
    int least = 0, greatest = 0;
    if (cudaDeviceGetStreamPriorityRange(&least, &greatest) != cudaSuccess) greatest = 0;
    CUstream stream = nullptr;
    r = p.api.stream_create(&stream, ctx, CU_STREAM_NON_BLOCKING, greatest);
    if (r != CUDA_SUCCESS) fail(device, size, "cuGreenCtxStreamCreate", r);
    e = new Entry{SmPartition{device, size, false, static_cast<cudaStream_t>(stream)}, ctx, 0};
  }
  Entry* held = e;
  ++held->users;
  held->part.shared = held->users > 1;
  // A copy: SmPartition::shared as it was when this owner took it.
  return std::shared_ptr<const SmPartition>(new SmPartition(held->part), [held](const SmPartition* q) {
    {
      std::lock_guard<std::mutex> guard(pools().mutex);
      --held->users;
    }
    delete q;
  });
}

}  // namespace Impl
}  // namespace KokkosMoE
