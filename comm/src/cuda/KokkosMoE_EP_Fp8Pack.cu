/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// The native CUDA pack of FP8 token rows (docs/ep.md §3.5, §3.6). One warp per token and no block barrier: the
// warp's lanes load the token's K slots, a ballot and a popcount compact its local rows and its remote ranks, and
// the lanes then quantize 16 channels each (an 8-lane group is one 128-channel scale block, whose amax is a
// shuffle maximum) from the 16-byte loads they keep in registers. The portable kernel (a team per token, the
// slots compacted by one thread between two team barriers, each unit loaded twice) is bound by that per-token
// prologue. The codes, scales and weights are those of the portable kernel bit for bit: the same amax (a maximum,
// the same in any order), the same block scale and the same E4M3 conversion of x / scale.

#include <kokkos_ext/KokkosMoE_Float8.hpp>

#include <cuda/KokkosMoE_EP_Fp8Pack.hpp>

#include <cuda/KokkosMoE_EP_Units.cuh>

namespace KokkosMoE {
namespace Impl {
namespace CudaEp {
namespace {

constexpr int kWarps = 8;          // tokens (warps) per thread block
constexpr int kUnitsPerScale = 8;  // 16-channel units per 128-channel scale block
constexpr int kLoadsInFlight = 8;  // 16-byte loads a lane issues before it converts them
constexpr int kBlocksPerSm = 2;    // 16 warps per SM: at most 128 registers a thread
constexpr unsigned kAllLanes = 0xffffffffu;

/// A token's targets, compacted in the warp's shared memory: local receive rows (with their weight or 1) and the
/// remote row addresses.
struct Targets {
  int* rows;
  float* coefs;
  std::uintptr_t* addrs;
  int nl = 0, nr = 0;
};

/// Unit u (codes val, its block's scale from the lanes with u % 8 == 0) to every target of the token.
__device__ __forceinline__ void put_unit(const Fp8PackArgs& a, const Targets& tg, int u, const uint4& val,
                                         float scale) {
  for (int i = 0; i < tg.nl; ++i) a.local_q[static_cast<std::size_t>(tg.rows[i]) * a.units + u] = val;
  for (int i = 0; i < tg.nr; ++i) reinterpret_cast<uint4*>(tg.addrs[i])[u] = val;
  if (u % kUnitsPerScale != 0) return;
  const int blocks = a.units / kUnitsPerScale, b = u / kUnitsPerScale;
  for (int i = 0; i < tg.nl; ++i) a.local_s[static_cast<std::size_t>(tg.rows[i]) * blocks + b] = scale;
  for (int i = 0; i < tg.nr; ++i) reinterpret_cast<float*>(tg.addrs[i] + a.scales_off)[b] = scale;
}

/// Row t quantized here: lane l takes units u0 + l + 32 j; an 8-lane group holds whole scale blocks, in or past the
/// row together (units is a multiple of 8), so every lane takes part in the shuffles.
template <class Scalar>
__device__ __forceinline__ void row_units(const Fp8PackArgs& a, const QuantizeSource<Scalar>& src, const Targets& tg,
                                          int t, int lane) {
  constexpr int kLoads = static_cast<int>(sizeof(Scalar));  // 16-byte loads per 16 channels
  constexpr int kBatch = kLoadsInFlight / kLoads;           // units per lane in flight
  const Scalar* x = src.x + static_cast<std::int64_t>(t) * src.ld;
  for (int u0 = 0; u0 < a.units; u0 += 32 * kBatch) {
    uint4 raw[kBatch][kLoads];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int u = u0 + lane + 32 * j;
      if (u >= a.units) continue;
      const uint4* p = reinterpret_cast<const uint4*>(x + 16 * u);
#pragma unroll
      for (int i = 0; i < kLoads; ++i) raw[j][i] = __ldg(p + i);
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int u = u0 + lane + 32 * j;
      float f[16];
      float amax = 0.0f;
      if (u < a.units) {
#pragma unroll
        for (int i = 0; i < kLoads; ++i) widen(raw[j][i], f + i * (16 / kLoads), x);
#pragma unroll
        for (int c = 0; c < 16; ++c) {
          const float av = fp8_finite(f[c]) ? (f[c] < 0.0f ? -f[c] : f[c]) : 0.0f;
          amax = av > amax ? av : amax;
        }
      }
#pragma unroll
      for (int off = 1; off < kUnitsPerScale; off <<= 1) {
        const float o = __shfl_xor_sync(kAllLanes, amax, off);
        amax = o > amax ? o : amax;
      }
      if (u >= a.units) continue;
      const float scale = fp8_block_scale(amax, src.min_amax, src.ue8m0);
      unsigned word[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        word[i] = 0;
        for (int k = 0; k < 4; ++k)
          word[i] |= static_cast<unsigned>(float_to_e4m3_bits(f[4 * i + k] / scale)) << (8 * k);
      }
      put_unit(a, tg, u, make_uint4(word[0], word[1], word[2], word[3]), scale);
    }
  }
}

/// Row t as the caller quantized it: its units and scales moved unchanged.
__device__ __forceinline__ void row_units(const Fp8PackArgs& a, const QuantizedSource& src, const Targets& tg, int t,
                                          int lane) {
  const int blocks = a.units / kUnitsPerScale;
  const uint4* q = src.q + static_cast<std::int64_t>(t) * a.units;
  for (int u0 = 0; u0 < a.units; u0 += 32 * kLoadsInFlight) {
    uint4 raw[kLoadsInFlight];
    float scale[kLoadsInFlight];
#pragma unroll
    for (int j = 0; j < kLoadsInFlight; ++j) {
      const int u = u0 + lane + 32 * j;
      if (u >= a.units) continue;
      raw[j] = __ldg(q + u);
      scale[j] = __ldg(src.scales + static_cast<std::int64_t>(t) * blocks + u / kUnitsPerScale);
    }
#pragma unroll
    for (int j = 0; j < kLoadsInFlight; ++j) {
      const int u = u0 + lane + 32 * j;
      if (u < a.units) put_unit(a, tg, u, raw[j], scale[j]);
    }
  }
}

template <class Src>
__global__ void __launch_bounds__(kWarps * 32, kBlocksPerSm) pack_fp8_warps(const Fp8PackArgs a, const Src src) {
  __shared__ int rows[kWarps][kFp8PackMaxTopk];
  __shared__ float coefs[kWarps][kFp8PackMaxTopk];
  __shared__ std::uintptr_t addrs[kWarps][kFp8PackMaxTopk];
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const unsigned below = (1u << lane) - 1u;
  for (int t = static_cast<int>(blockIdx.x) * kWarps + warp; t < a.T; t += static_cast<int>(gridDim.x) * kWarps) {
    // Lane k holds slot k: its receive row, its expert's rank and its weight (1 without weights).
    int row = -1, rank = -1;
    float coef = 1.0f, wk = 0.0f;
    if (lane < a.K) {
      const std::int64_t q = static_cast<std::int64_t>(t) * a.K + lane;
      row = a.slot_row[q];
      rank = a.slot_rank[q];
      if (a.w != nullptr) coef = wk = a.w[static_cast<std::int64_t>(t) * a.w_ld + lane];
    }
    const bool local = row >= 0 && rank == a.me;
    bool first = row >= 0 && rank != a.me;  // the rank's first kept slot adds it: the row goes once
    for (int k = 0; k < a.K; ++k) {
      const int rk = __shfl_sync(kAllLanes, rank, k), wr = __shfl_sync(kAllLanes, row, k);
      if (k < lane && rk == rank && wr >= 0) first = false;
    }
    const unsigned lmask = __ballot_sync(kAllLanes, local), rmask = __ballot_sync(kAllLanes, first);
    Targets tg{rows[warp], coefs[warp], addrs[warp], __popc(lmask), __popc(rmask)};
    __syncwarp();  // the previous token's tables have been read
    if (local) {
      const int i = __popc(lmask & below);
      tg.rows[i] = row;
      tg.coefs[i] = coef;
    }
    if (first) {
      const int p = a.tok_pos[static_cast<std::int64_t>(t) * a.R + rank];
      tg.addrs[__popc(rmask & below)] =
          p < 0 ? 0
                : a.peer[rank] + (static_cast<std::size_t>(a.peer_base[rank]) + static_cast<std::size_t>(p)) * a.pitch;
    }
    __syncwarp();
    row_units(a, src, tg, t, lane);
    if (a.trailer_off > 0 && lane < a.K)
      for (int i = 0; i < tg.nr; ++i) reinterpret_cast<float*>(tg.addrs[i] + a.trailer_off)[lane] = wk;
    if (a.local_f != nullptr && lane < tg.nl) a.local_f[tg.rows[lane]] = tg.coefs[lane];
  }
}

}  // namespace

template <class Src>
cudaError_t pack_fp8(const Fp8PackArgs& a, const Src& src, cudaStream_t stream) {
  if (a.T <= 0) return cudaSuccess;
  int blocks = (a.T + kWarps - 1) / kWarps;
  if (a.max_blocks > 0 && blocks > a.max_blocks) blocks = a.max_blocks;
  pack_fp8_warps<Src><<<blocks, kWarps * 32, 0, stream>>>(a, src);
  return cudaGetLastError();
}

template cudaError_t pack_fp8(const Fp8PackArgs&, const QuantizeSource<float>&, cudaStream_t);
template cudaError_t pack_fp8(const Fp8PackArgs&, const QuantizeSource<bf16_t>&, cudaStream_t);
template cudaError_t pack_fp8(const Fp8PackArgs&, const QuantizedSource&, cudaStream_t);

}  // namespace CudaEp
}  // namespace Impl
}  // namespace KokkosMoE
