/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_SM_PARTITION_HPP
#define KOKKOSMOE_SM_PARTITION_HPP

// SM partitions (docs/ep.md §13): a share of a device's streaming multiprocessors as a CUDA green context and a
// stream in it. Every block of a kernel launched on that stream runs on the partition's SMs, so a kernel may launch
// as many blocks as it likes (full SMs, the grid it has without a cap) and still occupy no other SM. The driver's
// green-context entry points are taken through cudaGetDriverEntryPointByVersion: the library does not link libcuda.
// Every driver call of the library is in KokkosMoE_SmPartition.cpp.

#include <cuda_runtime.h>

#include <memory>

namespace KokkosMoE {
namespace Impl {

/// A partition of a device's SMs held by one owner (an EP group); released when the last copy of its pointer goes.
struct SmPartition {
  int device = -1;
  int sms = 0;  ///< SMs of the partition: the largest count the driver partitions that is at most the cap asked for
  /// Every partition of this size the device holds had an owner: this one is another owner's too (the partitions of
  /// one size held at once in a process are disjoint while the device holds enough of them).
  bool shared = false;
  /// Non-blocking, of the device's highest priority, in the partition's green context; lives as long as the process.
  cudaStream_t stream = nullptr;
};

/// The SMs a partition under a cap of \p max_sms SMs on \p device would have: the largest count at most max_sms that
/// the driver splits off the device (on Hopper, a multiple of 2); 0 where the driver has no green contexts or max_sms
/// is below its granularity.
int sm_partition_size(int device, int max_sms);

/// A partition of sm_partition_size(device, max_sms) SMs, or nullptr where that is 0: of the disjoint groups of that
/// size the device splits into, the one fewest owners hold (the lowest such), so the partitions of one size held at
/// once are disjoint while there are enough (partitions of different sizes may overlap). The process makes a
/// group's green context when first asked for and keeps it.
/// \throws DeviceError when the driver fails to make the green context or its stream
std::shared_ptr<const SmPartition> acquire_sm_partition(int device, int max_sms);

}  // namespace Impl
}  // namespace KokkosMoE

#endif
