/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_EP_EXPANDDOTS_HPP
#define KOKKOSMOE_EP_EXPANDDOTS_HPP

// The native CUDA expert side of the Weighted combine backward (docs/ep.md §3.4, §3.6): the arguments of
// cuda/KokkosMoE_EP_ExpandDots.cu as typed pointers, and its launcher. No Kokkos header (see
// cuda/KokkosMoE_EP_Fp8Pack.hpp).

#include <kokkos_ext/KokkosMoE_Float16.hpp>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace KokkosMoE {
namespace Impl {
namespace CudaEp {

/// Slots of an arrival the kernel's warp holds in its lanes: one lane per slot.
constexpr int kExpandDotsMaxTopk = 32;

/// Arrival a (its token row g at in + a * in_pitch, the K weights at trailer_off of it) feeds the receive rows
/// fwd_rows[a * K + k] >= 0 of its kept slots: grad_out(row, :) = w_k * g and dot(g, out(row, :)) goes to the float
/// back[k] of the source's return row, back = dots_peer[i] + (dots_base[i] + a - arrive_base[i]) * dots_pitch for
/// i = arrive_rank[a] (arrivals with i < 0 are unused). Receive rows q < min(recv_rows, offsets[L]) with
/// recv_src[q] < 0 and recv_expert[q] < 0 (fed by no slot) are zeroed. Rows are `units` 16-byte units.
struct ExpandDotsArgs {
  int K = 0, R = 0, L = 0, B = 0;
  bool eager = true;          // arrival indices are the arrivals; else source i's are [i * B, i * B + arrive_count[i])
  std::int64_t arrivals = 0;  // eager: the arrivals; capacity: the bound R * B
  int recv_rows = 0;
  int units = 0;
  int max_blocks = 0;  // > 0: at most this many thread blocks (the SM cap by teams)
  const unsigned char* in = nullptr;
  std::size_t in_pitch = 0;
  std::size_t trailer_off = 0;
  const int* fwd_rows = nullptr;
  const int* arrive_rank = nullptr;
  const int* arrive_base = nullptr;
  const int* arrive_count = nullptr;
  const int* recv_src = nullptr;
  const int* recv_expert = nullptr;
  const int* offsets = nullptr;
  const uint4* out = nullptr;
  uint4* grad_out = nullptr;
  const std::uintptr_t* dots_peer = nullptr;
  const int* dots_base = nullptr;
  std::size_t dots_pitch = 0;
};

/// Launches the kernel on \p stream: one warp per arrival (then per 32 receive rows to zero), no fence.
/// Instantiated for float and bf16_t rows.
template <class Scalar>
cudaError_t expand_with_dots(const ExpandDotsArgs& a, cudaStream_t stream);

}  // namespace CudaEp
}  // namespace Impl
}  // namespace KokkosMoE

#endif
