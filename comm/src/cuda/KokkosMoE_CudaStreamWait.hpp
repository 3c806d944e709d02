/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_CUDA_STREAMWAIT_HPP
#define KOKKOSMOE_CUDA_STREAMWAIT_HPP

// The bounded host wait for a CUDA stream that every CUDA transport's Transport::wait runs (docs/ep.md §2): nothing
// the library waits for on the host waits without a deadline.

#include <cuda_runtime.h>

#include <chrono>
#include <thread>

namespace KokkosMoE {
namespace Impl {

/// How a bounded stream wait ended.
enum class StreamWait { Done, Failed, Expired };

/// Spin time of a stream wait before it sleeps between queries: the EP layer's host waits are mostly a few kernels
/// long, and a sleep of the thread costs tens of microseconds.
constexpr std::chrono::microseconds kStreamWaitSpin{200};

/// Polls \p stream with cudaStreamQuery until its work is done (Done), a query fails (Failed; \p error says why) or
/// \p until passes (Expired). \p poll runs after every unfinished query (a transport's own asynchronous error check;
/// it may throw). The first kStreamWaitSpin of polls spin; later ones sleep 20 us between queries.
template <class Poll>
StreamWait wait_stream(cudaStream_t stream, std::chrono::steady_clock::time_point until, cudaError_t& error,
                       Poll&& poll) {
  const auto spin_until = std::chrono::steady_clock::now() + kStreamWaitSpin;
  for (;;) {
    error = cudaStreamQuery(stream);
    if (error == cudaSuccess) return StreamWait::Done;
    if (error != cudaErrorNotReady) return StreamWait::Failed;
    poll();
    const auto now = std::chrono::steady_clock::now();
    if (now >= until) return StreamWait::Expired;
    if (now >= spin_until) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

}  // namespace Impl
}  // namespace KokkosMoE

#endif
