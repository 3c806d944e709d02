/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTER_CUDA_COMMON_CUH
#define KOKKOSMOE_ROUTER_CUDA_COMMON_CUH

// Private helpers of the native CUDA router kernels (docs/router.md §5-§12): dtype traits and 16-byte chunk
// loads/stores, segmented warp reductions, launch-geometry caches. The math (score functions and derivatives,
// selection keys, constants, group-score rule) is impl/KokkosMoE_RouterMath.hpp's, shared with the portable path.
// Nothing here needs Kokkos. Compiled without fast-math: expf/log1pf/sqrtf are the accurate versions and every
// '/' is an IEEE division.

#include <cuda/KokkosMoE_Router_Kernels.hpp>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <impl/KokkosMoE_RouterMath.hpp>
#include <impl/KokkosMoE_Router_Args.hpp>

#include <cstdint>

#if defined(__CUDACC__) && defined(__FAST_MATH__)
#error "KokkosMoE router kernels must be compiled without fast-math (docs/router.md §1)"
#endif

namespace KokkosMoE {
namespace Impl {
namespace CudaKernels {
namespace detail {

constexpr unsigned kFull = 0xffffffffu;

// ------------------------------------------------------------------------------------------------------------
// Element traits: storage type, 16-byte vector width, widening/narrowing (round to nearest even, once, on store; the
// conversions are kokkos_ext/KokkosMoE_Float16.hpp's). Elem<T> takes the router's element type (float, fp16_t,
// bf16_t, layout-compatible with its storage type).
// ------------------------------------------------------------------------------------------------------------
template <class T>
struct Elem;
template <>
struct Elem<float> {
  using S = float;
  static constexpr int VW = 4;  // elements per 16 bytes
  __device__ __forceinline__ static float to_f(S v) { return v; }
  __device__ __forceinline__ static S from_f(float f) { return f; }
};
template <>
struct Elem<fp16_t> {
  using S = unsigned short;
  static constexpr int VW = 8;
  __device__ __forceinline__ static float to_f(S v) { return half_bits_to_float_hw(v); }
  __device__ __forceinline__ static S from_f(float f) { return float_to_half_bits_hw(f); }
};
template <>
struct Elem<bf16_t> {
  using S = unsigned short;
  static constexpr int VW = 8;
  __device__ __forceinline__ static float to_f(S v) { return bf16_bits_to_float(v); }
  __device__ __forceinline__ static S from_f(float f) { return float_to_bf16_bits_hw(f); }
};

/// The storage view of a typed array (the same bytes).
template <class T>
__host__ __device__ __forceinline__ const typename Elem<T>::S* storage(const T* p) {
  return reinterpret_cast<const typename Elem<T>::S*>(p);
}
template <class T>
__host__ __device__ __forceinline__ typename Elem<T>::S* storage(T* p) {
  return reinterpret_cast<typename Elem<T>::S*>(p);
}

template <int BYTES>
struct RawT;
template <>
struct RawT<32> {
  struct type {
    uint4 a, b;
  };
};
template <>
struct RawT<16> {
  using type = uint4;
};
template <>
struct RawT<8> {
  using type = uint2;
};
template <>
struct RawT<4> {
  using type = unsigned;
};
template <>
struct RawT<2> {
  using type = unsigned short;
};
template <>
struct RawT<1> {
  using type = unsigned char;
};

/// W contiguous elements of storage type S moved with one (or two) vector accesses. The address must be aligned
/// to min(16, W*sizeof(S)) bytes (the launchers check this before picking a vector kernel).
template <class S, int W>
struct Vec {
  static constexpr int BYTES = W * static_cast<int>(sizeof(S));
  using R = typename RawT<BYTES>::type;
  __device__ __forceinline__ static R ldg(const S* p) {
    if constexpr (BYTES == 32) {
      R r;
      r.a = __ldg(reinterpret_cast<const uint4*>(p));
      r.b = __ldg(reinterpret_cast<const uint4*>(p) + 1);
      return r;
    } else {
      return __ldg(reinterpret_cast<const R*>(p));
    }
  }
  __device__ __forceinline__ static void stcs(S* p, const R& r) {
    if constexpr (BYTES == 32) {
      __stcs(reinterpret_cast<uint4*>(p), r.a);
      __stcs(reinterpret_cast<uint4*>(p) + 1, r.b);
    } else {
      __stcs(reinterpret_cast<R*>(p), r);
    }
  }
  /// A write-back store: for lines that are written again soon.
  __device__ __forceinline__ static void st(S* p, const R& r) {
    if constexpr (BYTES == 32) {
      reinterpret_cast<uint4*>(p)[0] = r.a;
      reinterpret_cast<uint4*>(p)[1] = r.b;
    } else {
      *reinterpret_cast<R*>(p) = r;
    }
  }
  __device__ __forceinline__ static void to_array(const R& r, S (&s)[W]) { memcpy(s, &r, BYTES); }
  __device__ __forceinline__ static R from_array(const S (&s)[W]) {
    R r;
    memcpy(&r, s, BYTES);
    return r;
  }
};

/// Loads W elements of type T at p and widens them.
template <class T, int W>
__device__ __forceinline__ void load_elems(const typename Elem<T>::S* p, float* out) {
  using S = typename Elem<T>::S;
  using VV = Vec<S, W>;
  S s[W];
  VV::to_array(VV::ldg(p), s);
#pragma unroll
  for (int w = 0; w < W; ++w) out[w] = Elem<T>::to_f(s[w]);
}
/// Narrows W floats to type T and stores them at p: a streaming store, or with Streaming = false a write-back one.
template <class T, int W, bool Streaming = true>
__device__ __forceinline__ void store_elems(typename Elem<T>::S* p, const float* in) {
  using S = typename Elem<T>::S;
  using VV = Vec<S, W>;
  S s[W];
#pragma unroll
  for (int w = 0; w < W; ++w) s[w] = Elem<T>::from_f(in[w]);
  if constexpr (Streaming)
    VV::stcs(p, VV::from_array(s));
  else
    VV::st(p, VV::from_array(s));
}
template <int W>
__device__ __forceinline__ void store_bytes(unsigned char* p, const unsigned char* in) {
  using VV = Vec<unsigned char, W>;
  unsigned char s[W];
#pragma unroll
  for (int w = 0; w < W; ++w) s[w] = in[w];
  VV::stcs(p, VV::from_array(s));
}

// ------------------------------------------------------------------------------------------------------------
// Segmented (TPT lanes per token) warp primitives. All 32 lanes must call them (full mask); a segment is the
// aligned group of TPT lanes of one token. TPT == 32 uses the single-instruction redux.sync of sm_80+.
// ------------------------------------------------------------------------------------------------------------
template <int TPT>
__device__ __forceinline__ unsigned seg_max_u32(unsigned v) {
  if constexpr (TPT == 32) {
    return __reduce_max_sync(kFull, v);
  } else {
#pragma unroll
    for (int o = TPT / 2; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(kFull, v, o));
    return v;
  }
}
template <int TPT>
__device__ __forceinline__ int seg_add_i32(int v) {
  if constexpr (TPT == 32) {
    return __reduce_add_sync(kFull, v);
  } else {
#pragma unroll
    for (int o = TPT / 2; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
    return v;
  }
}
/// Butterfly float sum: fixed order, every lane of the segment gets identical bits.
template <int TPT>
__device__ __forceinline__ float seg_add_f32(float v) {
#pragma unroll
  for (int o = TPT / 2; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}
/// Exclusive prefix sum over the lanes of the segment (lane order).
template <int TPT>
__device__ __forceinline__ int seg_excl_scan(int v, int ls) {
  int incl = v;
#pragma unroll
  for (int o = 1; o < TPT; o <<= 1) {
    const int n = __shfl_up_sync(kFull, incl, o, TPT);
    if (ls >= o) incl += n;
  }
  return incl - v;
}

// ------------------------------------------------------------------------------------------------------------
// Host helpers
// ------------------------------------------------------------------------------------------------------------
/// Makes the queue's device current for the guard's lifetime and gives the caller's current device back when it
/// ends: the attribute calls, occupancy queries and launches below act on the current device, and a library call
/// that left another device current would move the caller's own later CUDA calls (allocations, launches) there.
/// status() is the error of reading or setting the device; the launch must not proceed unless it is cudaSuccess.
class DeviceGuard {
 public:
  explicit DeviceGuard(const Queue& q);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  cudaError_t status() const { return m_status; }

 private:
  int m_restore = -1;  ///< the caller's device, or -1 when the guard changed nothing
  cudaError_t m_status = cudaSuccess;
};

/// Multiprocessor count of device `dev` (cached per device; host-only query, capture-safe).
int sm_count(int dev);

/// Grid for a persistent (grid-stride) kernel on device `dev`: enough blocks to cover `work_blocks` but no more
/// than fit on the device at once. Occupancy is computed once per (device, kernel, block, smem) and cached.
int persistent_grid(int dev, const void* kernel, int block, size_t smem, long long work_blocks);

/// Opts a kernel into more than 48 KB of dynamic shared memory when needed (current device).
cudaError_t ensure_smem(const void* kernel, size_t smem);

/// Asks for the largest shared-memory carveout for a kernel (a hint that lets registers, not shared memory, bound
/// its resident blocks), once per device and kernel: after a first eager call a captured launch makes no
/// attribute call. `dev` must be the current device.
cudaError_t prefer_max_shared(int dev, const void* kernel);

}  // namespace detail
}  // namespace CudaKernels
}  // namespace Impl
}  // namespace KokkosMoE

#endif
