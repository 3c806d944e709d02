/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_EP_FP8PACK_HPP
#define KOKKOSMOE_EP_FP8PACK_HPP

// The native CUDA pack of FP8 token rows (docs/ep.md §3.5, §3.6): the arguments of cuda/KokkosMoE_EP_Fp8Pack.cu as
// typed pointers, and its launcher. No Kokkos header: the kernel is compiled by nvcc into kokkosmoe_comm, and
// cuda/KokkosMoE_EP_Native_Cuda.hpp lowers the Views of impl/KokkosMoE_EP_Fp8Kernels.hpp's pack to these.

#include <kokkos_ext/KokkosMoE_Float16.hpp>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace KokkosMoE {
namespace Impl {
namespace CudaEp {

/// Rows quantized in the pack: x(t, c) = x[t * ld + c], float or bf16_t, every row 16-byte aligned.
template <class Scalar>
struct QuantizeSource {
  const Scalar* x = nullptr;
  std::int64_t ld = 0;
  float min_amax = 0.0f;
  bool ue8m0 = false;
};

/// Rows the caller quantized: the codes of row t in units of 16 (q[t * units + u]), its scales at scales[t * blocks].
struct QuantizedSource {
  const uint4* q = nullptr;
  const float* scales = nullptr;
};

/// Slots of a token the kernel's warp holds in its lanes: one lane per slot.
constexpr int kFp8PackMaxTopk = 32;

/// Where token t's row goes: the receive rows of its kept local slots (codes local_q[row * units], scales
/// local_s[row * blocks], the slot's weight or 1 at local_f[row] when local_f is given) and once to every remote rank
/// r its kept slots reach, at peer[r] + (peer_base[r] + tok_pos[t * R + r]) * pitch bytes: codes, scales at
/// scales_off, the K weights (0 without weights) at trailer_off.
struct Fp8PackArgs {
  int T = 0, K = 0, R = 0, me = 0;
  int units = 0;       // H / 16
  int max_blocks = 0;  // > 0: at most this many thread blocks (the SM cap by teams); else one warp per token
  const int* slot_row = nullptr;
  const int* slot_rank = nullptr;
  const int* tok_pos = nullptr;
  const float* w = nullptr;  // [T, K] with row stride w_ld, or nullptr
  std::int64_t w_ld = 0;
  uint4* local_q = nullptr;
  float* local_s = nullptr;
  float* local_f = nullptr;  // or nullptr
  const std::uintptr_t* peer = nullptr;
  const int* peer_base = nullptr;
  std::size_t pitch = 0;
  std::size_t scales_off = 0;
  std::size_t trailer_off = 0;
};

/// Launches the pack on \p stream: one warp per token, no block barrier, no fence. Instantiated for
/// QuantizeSource<float>, QuantizeSource<bf16_t> and QuantizedSource.
template <class Src>
cudaError_t pack_fp8(const Fp8PackArgs& a, const Src& src, cudaStream_t stream);

}  // namespace CudaEp
}  // namespace Impl
}  // namespace KokkosMoE

#endif
