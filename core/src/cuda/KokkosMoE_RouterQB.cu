/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */

// The Quantile Balancing histogram pass (docs/router.md §19.5) as a native kernel: one count per (token, expert)
// pair in bin qb_bin(cutoff[t] - intermediate[t, e]) of histogram [E, num_bins].
//
// A block owns a slice of S experts and a chunk of tokens: it counts the chunk's pairs of its slice in shared
// memory, then adds each non-zero count to the histogram with one global atomic. The sums of integer atomics do
// not depend on their order, so the result is exact and deterministic. Per-pair global atomics (TransformerEngine's
// fused mode) are bound by the L2 atomic rate: a kernel of one atomic per pair took 365 µs where this pass takes 48
// (H100, E = 384, T = 65536, 1000 bins). The pass is memory bound: 16 experts per block make each token's row segment
// 64 contiguous bytes, read as float4 by 4 threads, each with 4 tokens' loads in flight; blocks of one chunk are
// adjacent in the launch order, so they read neighbouring segments of the same rows together; chunks are visited
// last token first, so the first ones read what the forward wrote last and may still be in L2.

#include <cuda/KokkosMoE_Router_Kernels.hpp>
#include <cuda_runtime.h>
#include <impl/KokkosMoE_RouterMath.hpp>

#include <algorithm>
#include <cstdint>
#include <cuda/KokkosMoE_Router_Cuda_Common.cuh>

namespace KokkosMoE {
namespace Impl {
namespace CudaKernels {
namespace detail {
namespace {

constexpr int kQbThreads = 256;
constexpr int kQbUnroll = 4;
/// Shared memory per block for the counts: 16 experts of 1000 bins use 64 KB, three blocks per SM.
constexpr std::size_t kQbSmemCap = 64 * 1024;
/// Tokens per block: at least kQbMinChunk (the flush reads S * num_bins counters, so a chunk should hold more
/// pairs than that), at most kQbMaxChunk.
constexpr long long kQbMinChunk = 1024;
constexpr long long kQbMaxChunk = 4096;

/// The geometry of the sliced kernel: `experts` per block (a multiple of 4 when `vec`: float4 loads), `chunk` tokens
/// per block.
struct QbHistogramShape {
  bool vec = false;
  int experts = 0;
  long long chunk = 0;
};

/// VEC experts per thread (4: float4 loads; 1: scalar), S experts per block (a multiple of VEC), run-time width w
/// <= S of the last slice.
template <int VEC>
__global__ void __launch_bounds__(kQbThreads)
    qb_histogram_kernel(QbHistogramArgs a, int S, int slices, long long chunk, int chunks) {
  extern __shared__ int counts[];  // [S][num_bins]
  const int nb = a.num_bins;
  const int slice = static_cast<int>(blockIdx.x % static_cast<unsigned>(slices));
  const int c = chunks - 1 - static_cast<int>(blockIdx.x / static_cast<unsigned>(slices));
  const int E = a.num_experts;
  const int e0 = slice * S;
  const int w = min(S, E - e0);
  const long long t0 = static_cast<long long>(c) * chunk;
  const long long t1 = min(t0 + chunk, a.num_tokens);
  for (int i = threadIdx.x; i < w * nb; i += kQbThreads) counts[i] = 0;
  __syncthreads();

  const float lower = a.bin_bounds[0];
  const float scale = qb_bin_scale(lower, a.bin_bounds[1], nb);
  const int lanes = S / VEC;  // threads per token
  const int lane = threadIdx.x % lanes;
  const int j0 = lane * VEC;              // first expert of this thread in the slice
  const int stride = kQbThreads / lanes;  // tokens per pass; threads past stride * lanes stay idle
  const bool active = j0 < w && static_cast<int>(threadIdx.x) < stride * lanes;
  if (active) {
    long long t = t0 + threadIdx.x / lanes;
    const float* base = a.intermediate + e0 + j0;
    for (; t + (kQbUnroll - 1) * stride < t1; t += kQbUnroll * stride) {
      float y[kQbUnroll][VEC];
      float cut[kQbUnroll];
#pragma unroll
      for (int u = 0; u < kQbUnroll; ++u) {
        const long long tu = t + u * stride;
        if constexpr (VEC == 4) {
          const float4 v = __ldg(reinterpret_cast<const float4*>(base + tu * E));
          y[u][0] = v.x;
          y[u][1] = v.y;
          y[u][2] = v.z;
          y[u][3] = v.w;
        } else {
          y[u][0] = __ldg(base + tu * E);
        }
        cut[u] = __ldg(a.cutoff + tu);
      }
#pragma unroll
      for (int u = 0; u < kQbUnroll; ++u)
#pragma unroll
        for (int v = 0; v < VEC; ++v) atomicAdd(&counts[(j0 + v) * nb + qb_bin(cut[u] - y[u][v], lower, scale, nb)], 1);
    }
    for (; t < t1; t += stride) {
      const float cu = __ldg(a.cutoff + t);
#pragma unroll
      for (int v = 0; v < VEC; ++v)
        atomicAdd(&counts[(j0 + v) * nb + qb_bin(cu - __ldg(base + t * E + v), lower, scale, nb)], 1);
    }
  }
  __syncthreads();
  for (int j = 0; j < w; ++j) {
    int* row = a.histogram + static_cast<long long>(e0 + j) * nb;
    for (int b = threadIdx.x; b < nb; b += kQbThreads) {
      const int n = counts[j * nb + b];
      if (n != 0) atomicAdd(row + b, n);
    }
  }
}

/// Histograms whose one expert's counts exceed kQbSmemCap: one global atomic per pair.
__global__ void __launch_bounds__(kQbThreads) qb_histogram_global_kernel(QbHistogramArgs a) {
  const float lower = a.bin_bounds[0];
  const float scale = qb_bin_scale(lower, a.bin_bounds[1], a.num_bins);
  const long long n = a.num_tokens * a.num_experts;
  for (long long i = blockIdx.x * static_cast<long long>(kQbThreads) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * kQbThreads) {
    const long long t = i / a.num_experts;
    const int e = static_cast<int>(i - t * a.num_experts);
    atomicAdd(a.histogram + static_cast<long long>(e) * a.num_bins +
                  qb_bin(__ldg(a.cutoff + t) - __ldg(a.intermediate + i), lower, scale, a.num_bins),
              1);
  }
}

cudaError_t qb_histogram_global(const QbHistogramArgs& a, const Queue& q) {
  DeviceGuard guard(q);
  if (guard.status() != cudaSuccess) return guard.status();
  const long long n = a.num_tokens * a.num_experts;
  const int grid = persistent_grid(q.device, reinterpret_cast<const void*>(qb_histogram_global_kernel), kQbThreads, 0,
                                   (n + kQbThreads - 1) / kQbThreads);
  qb_histogram_global_kernel<<<grid, kQbThreads, 0, q.stream>>>(a);
  return cudaGetLastError();
}

QbHistogramShape choose_qb_histogram(const QbHistogramArgs& a, int device) {
  QbHistogramShape h;
  const int per_expert = a.num_bins * static_cast<int>(sizeof(int));
  const int fit = static_cast<int>(kQbSmemCap / static_cast<std::size_t>(per_expert));
  h.vec = a.num_experts % 4 == 0 && reinterpret_cast<std::uintptr_t>(a.intermediate) % 16 == 0 && fit >= 4;
  // 16 experts per block, fewer when their counts do not fit (a multiple of 4 on the float4 path)
  h.experts = h.vec ? std::min({16, fit / 4 * 4, (a.num_experts + 3) / 4 * 4})
                    : std::max(1, std::min({16, fit, a.num_experts}));
  // Chunks of 1024-4096 tokens, as many as give about two blocks per SM (an H100 sweep over 4-48 experts and
  // 1024-16384 tokens per block at E = 384 and 896, T = 16384 and 65536: 16 experts with 2-4 K tokens were within
  // 15% of the best at every shape; wider slices and longer chunks leave SMs idle, shorter chunks add flushes).
  const int slices = (a.num_experts + h.experts - 1) / h.experts;
  const long long want_blocks = 2LL * sm_count(device);
  h.chunk = (a.num_tokens * slices + want_blocks - 1) / want_blocks;
  h.chunk = std::min(kQbMaxChunk, std::max(kQbMinChunk, (h.chunk + 63) / 64 * 64));
  return h;
}

cudaError_t launch_qb_histogram(const QbHistogramArgs& a, const QbHistogramShape& h, const Queue& q) {
  const int S = h.experts;
  const std::size_t smem = static_cast<std::size_t>(S) * a.num_bins * sizeof(int);
  const void* kernel = h.vec ? reinterpret_cast<const void*>(qb_histogram_kernel<4>)
                             : reinterpret_cast<const void*>(qb_histogram_kernel<1>);
  DeviceGuard guard(q);
  if (guard.status() != cudaSuccess) return guard.status();
  const cudaError_t err = ensure_smem(kernel, smem);
  if (err != cudaSuccess) return err;
  const int slices = (a.num_experts + S - 1) / S;
  const long long chunks = (a.num_tokens + h.chunk - 1) / h.chunk;
  const long long blocks = chunks * slices;
  if (blocks > 0x7fffffffLL) return cudaErrorInvalidValue;
  if (h.vec)
    qb_histogram_kernel<4><<<static_cast<unsigned>(blocks), kQbThreads, smem, q.stream>>>(a, S, slices, h.chunk,
                                                                                          static_cast<int>(chunks));
  else
    qb_histogram_kernel<1><<<static_cast<unsigned>(blocks), kQbThreads, smem, q.stream>>>(a, S, slices, h.chunk,
                                                                                          static_cast<int>(chunks));
  return cudaGetLastError();
}

}  // namespace
}  // namespace detail

cudaError_t qb_histogram(const QbHistogramArgs& a, const Queue& q) {
  if (a.num_tokens <= 0 || a.num_experts <= 0) return cudaSuccess;
  if (a.num_bins <= 0) return cudaErrorInvalidValue;
  if (static_cast<std::size_t>(a.num_bins) * sizeof(int) > detail::kQbSmemCap) return detail::qb_histogram_global(a, q);
  return detail::launch_qb_histogram(a, detail::choose_qb_histogram(a, q.device), q);
}

}  // namespace CudaKernels
}  // namespace Impl
}  // namespace KokkosMoE
