/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_COMMUNICATOR_LOOPBACK_HPP
#define KOKKOSMOE_COMMUNICATOR_LOOPBACK_HPP

/// \file KokkosMoE_Communicator_Loopback.hpp
/// \brief Several ranks in one process (docs/ep.md §7.3): the whole remote path of the EP layer (windows, direct
/// writes, signals, deadlines, graph capture) on one device, without MPI or several GPUs.

#include <KokkosMoE_Communicator.hpp>

#include <vector>

namespace KokkosMoE {

/// \brief \p ranks virtual ranks of one group in this process: element r of the result is rank r. Drive each from
/// its own host thread with its own execution space instance (a collective call blocks until every rank made it, or
/// fails with CommError(Timeout) at the deadline). Every EP group over them writes token rows straight into the
/// peers' windows. \p device >= 0: windows in that CUDA device's memory, for Kokkos::Cuda (CUDA builds only);
/// -1: host memory, for host execution spaces whose Kokkos runs concurrent instances (Kokkos >= 4: Serial).
/// \throws InvalidArgument (Rule::ConfigValue) for ranks < 1, a device without CUDA support in the build, a bad
/// timeout, and on a device when the process environment lacks what prepare_loopback_environment() sets
std::vector<Communicator> make_loopback_communicators(int ranks, int device = -1, const CommConfig& config = {});

/// \brief Call before CUDA starts (before Kokkos::initialize) in a process that runs loopback ranks on a device.
///
/// Loopback ranks wait for each other on the device, so every rank's stream must make progress while a peer's wait
/// kernel runs (docs/ep.md §7.3). Sets, unless already set: CUDA_MODULE_LOADING=EAGER (a module loaded lazily at a
/// kernel's first launch waits for the kernels already running) and CUDA_DEVICE_MAX_CONNECTIONS=32 (with fewer
/// hardware queues than streams, two ranks' streams share a queue and one's wait kernel blocks the other's work).
void prepare_loopback_environment();

/// \brief The most loopback ranks one device runs: hardware queues (32) less one for the default instance's stream.
constexpr int kMaxDeviceLoopbackRanks = 31;

}  // namespace KokkosMoE

#endif
