/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_EP_UNITS_CUH
#define KOKKOSMOE_EP_UNITS_CUH

// The 16-byte units the native EP kernels move rows in (cuda/*.cu), as FP32 lanes: 4 floats or 8 bf16 values, the
// decoding and rounding of the portable kernels' UnitOps (impl/KokkosMoE_EP_PackKernels.hpp). The last argument only
// selects the element type.

#include <kokkos_ext/KokkosMoE_Float16.hpp>

#include <cuda_runtime.h>

#include <cstdint>

namespace KokkosMoE {
namespace Impl {
namespace CudaEp {

__device__ __forceinline__ void widen(const uint4& r, float* f, const float*) {
  f[0] = __uint_as_float(r.x);
  f[1] = __uint_as_float(r.y);
  f[2] = __uint_as_float(r.z);
  f[3] = __uint_as_float(r.w);
}
__device__ __forceinline__ void widen(const uint4& r, float* f, const bf16_t*) {
  const unsigned w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = bf16_bits_to_float(static_cast<std::uint16_t>(w[i] & 0xffffu));
    f[2 * i + 1] = bf16_bits_to_float(static_cast<std::uint16_t>(w[i] >> 16));
  }
}
__device__ __forceinline__ uint4 narrow(const float* f, const float*) {
  return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), __float_as_uint(f[3]));
}
__device__ __forceinline__ uint4 narrow(const float* f, const bf16_t*) {
  unsigned w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    w[i] = static_cast<unsigned>(float_to_bf16_bits(f[2 * i])) |
           (static_cast<unsigned>(float_to_bf16_bits(f[2 * i + 1])) << 16);
  return make_uint4(w[0], w[1], w[2], w[3]);
}

}  // namespace CudaEp
}  // namespace Impl
}  // namespace KokkosMoE

#endif
