/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// The native CUDA expert side of the Weighted combine backward (docs/ep.md §3.4, §3.6). One warp per arrival and no
// block barrier past the kernel's start: lane k loads slot k's receive row and weight, a ballot and a popcount
// compact the kept slots, and the lanes then read the arrived row once per kDots slots, kBatch units at a time with
// the slots' expert outputs in the same round of loads, write each slot's w * g and sum its dot in FP32; a warp
// butterfly (the same bits in every lane) ends each dot. The portable kernel (a team per arrival, its slots compacted
// by one thread between barriers, the dots one team reduction of a 4-float struct) held 96 registers a thread and
// a third of the warps an SM holds, bound by load latency. grad_out is the portable kernel's bit for bit (one FP32
// product, one rounding); a dot is an FP32 sum in this kernel's fixed order, the same in every run.

#include <cuda/KokkosMoE_EP_ExpandDots.hpp>

#include <cuda/KokkosMoE_EP_Units.cuh>

namespace KokkosMoE {
namespace Impl {
namespace CudaEp {
namespace {

constexpr int kWarps = 8;  // arrivals (warps) per thread block
constexpr int kBatch = 2;  // units per lane in flight
constexpr int kDots = 4;   // slots per pass over the arrived row
constexpr unsigned kAllLanes = 0xffffffffu;

/// The arrival index of the c-th real arrival: source i's arrivals are [i * B, i * B + count(i)), pre the prefix sums
/// of the counts (pre[0] = 0).
__device__ __forceinline__ std::int64_t arrival_at(const ExpandDotsArgs& a, const std::int64_t* pre, std::int64_t c) {
  int lo = 0, hi = a.R;  // pre[lo] <= c < pre[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (pre[mid] <= c) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return static_cast<std::int64_t>(lo) * a.B + (c - pre[lo]);
}

/// Arrival idx: its kept slots' grad_out rows and dots. rows, cs, ks: the warp's tables of kExpandDotsMaxTopk entries
/// in shared memory.
template <class Scalar>
__device__ __forceinline__ void arrival(const ExpandDotsArgs& a, std::int64_t idx, int lane, int* rows, float* cs,
                                        int* ks) {
  constexpr int kN = 16 / static_cast<int>(sizeof(Scalar));  // values per 16-byte unit
  const Scalar* tag = nullptr;
  const int src = __shfl_sync(kAllLanes, lane == 0 ? a.arrive_rank[idx] : 0, 0);
  if (src < 0) return;  // the same in every lane
  const unsigned char* row = a.in + static_cast<std::size_t>(idx) * a.in_pitch;
  int fwd = -1;
  float c = 0.0f;
  if (lane < a.K) {
    fwd = a.fwd_rows[idx * a.K + lane];
    c = reinterpret_cast<const float*>(row + a.trailer_off)[lane];
  }
  const unsigned kept = __ballot_sync(kAllLanes, fwd >= 0);
  __syncwarp();  // the previous arrival's tables have been read
  if (fwd >= 0) {
    const int j = __popc(kept & ((1u << lane) - 1u));
    rows[j] = fwd;
    cs[j] = c;
    ks[j] = lane;
  }
  __syncwarp();
  const int n = __popc(kept);
  float* back = reinterpret_cast<float*>(
      a.dots_peer[src] +
      (static_cast<std::size_t>(a.dots_base[src]) + static_cast<std::size_t>(idx - a.arrive_base[src])) * a.dots_pitch);
  const uint4* g = reinterpret_cast<const uint4*>(row);
  for (int d0 = 0; d0 < n; d0 += kDots) {
    const int nd = n - d0 < kDots ? n - d0 : kDots;
    std::size_t at[kDots];
    float coef[kDots], part[kDots];
#pragma unroll
    for (int d = 0; d < kDots; ++d) {
      at[d] = d < nd ? static_cast<std::size_t>(rows[d0 + d]) * a.units : 0;
      coef[d] = d < nd ? cs[d0 + d] : 0.0f;
      part[d] = 0.0f;
    }
    for (int u0 = lane; u0 < a.units; u0 += 32 * kBatch) {
      uint4 graw[kBatch], oraw[kBatch][kDots];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int u = u0 + 32 * b;
        if (u >= a.units) continue;
        graw[b] = g[u];
#pragma unroll
        for (int d = 0; d < kDots; ++d)
          if (d < nd) oraw[b][d] = a.out[at[d] + u];
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int u = u0 + 32 * b;
        if (u >= a.units) continue;
        float x[kN];
        widen(graw[b], x, tag);
#pragma unroll
        for (int d = 0; d < kDots; ++d) {
          if (d >= nd) continue;
          float z[kN], y[kN];
          widen(oraw[b][d], z, tag);
#pragma unroll
          for (int e = 0; e < kN; ++e) {
            part[d] += x[e] * z[e];
            y[e] = coef[d] * x[e];
          }
          a.grad_out[at[d] + u] = narrow(y, tag);
        }
      }
    }
#pragma unroll
    for (int d = 0; d < kDots; ++d) {
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) part[d] += __shfl_xor_sync(kAllLanes, part[d], off);
      if (lane == 0 && d < nd) back[ks[d0 + d]] = part[d];
    }
  }
}

/// Receive rows [32 z, 32 z + 32) that no slot feeds inside the experts' slabs: zeroed.
__device__ __forceinline__ void zero_unfed(const ExpandDotsArgs& a, std::int64_t z, int lane) {
  const std::int64_t q = z * 32 + lane;
  const bool unfed =
      q < a.recv_rows && a.recv_src[q] < 0 && a.recv_expert[q] < 0 && q < static_cast<std::int64_t>(a.offsets[a.L]);
  for (unsigned m = __ballot_sync(kAllLanes, unfed); m != 0u; m &= m - 1u) {
    const std::size_t at = static_cast<std::size_t>(z * 32 + __ffs(m) - 1) * a.units;
    for (int u = lane; u < a.units; u += 32) a.grad_out[at + u] = make_uint4(0u, 0u, 0u, 0u);
  }
}

/// Items [0, walk) are arrivals (eager) or arrival ranks c (capacity: the c-th real arrival), [walk, items) the
/// 32-row groups to zero; a warp takes items warp, + all warps, ...
template <class Scalar>
__global__ void __launch_bounds__(kWarps * 32)
    expand_dots_warps(const ExpandDotsArgs a, std::int64_t walk, std::int64_t items) {
  extern __shared__ std::int64_t pre[];  // capacity: R + 1 prefix sums of arrive_count
  __shared__ int rows[kWarps][kExpandDotsMaxTopk];
  __shared__ float cs[kWarps][kExpandDotsMaxTopk];
  __shared__ int ks[kWarps][kExpandDotsMaxTopk];
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  std::int64_t walked = walk;
  if (!a.eager) {
    if (threadIdx.x == 0) {
      pre[0] = 0;
      for (int i = 0; i < a.R; ++i) pre[i + 1] = pre[i] + a.arrive_count[i];
    }
    __syncthreads();
    walked = pre[a.R];
  }
  const std::int64_t all = static_cast<std::int64_t>(gridDim.x) * kWarps;
  for (std::int64_t it = static_cast<std::int64_t>(blockIdx.x) * kWarps + warp; it < items; it += all) {
    if (it >= walk) {
      zero_unfed(a, it - walk, lane);
    } else if (it < walked) {
      arrival<Scalar>(a, a.eager ? it : arrival_at(a, pre, it), lane, rows[warp], cs[warp], ks[warp]);
    }
  }
}

}  // namespace

template <class Scalar>
cudaError_t expand_with_dots(const ExpandDotsArgs& a, cudaStream_t stream) {
  if (a.recv_rows <= 0) return cudaSuccess;
  const std::int64_t walk = a.arrivals, items = walk + (a.recv_rows + 31) / 32;
  std::int64_t blocks = (items + kWarps - 1) / kWarps;
  if (a.max_blocks > 0 && blocks > a.max_blocks) blocks = a.max_blocks;
  const std::size_t shmem = a.eager ? 0 : static_cast<std::size_t>(a.R + 1) * sizeof(std::int64_t);
  expand_dots_warps<Scalar><<<static_cast<unsigned>(blocks), kWarps * 32, shmem, stream>>>(a, walk, items);
  return cudaGetLastError();
}

template cudaError_t expand_with_dots<float>(const ExpandDotsArgs&, cudaStream_t);
template cudaError_t expand_with_dots<bf16_t>(const ExpandDotsArgs&, cudaStream_t);

}  // namespace CudaEp
}  // namespace Impl
}  // namespace KokkosMoE
