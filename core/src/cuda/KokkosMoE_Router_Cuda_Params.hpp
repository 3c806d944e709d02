/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTER_CUDA_PARAMS_HPP
#define KOKKOSMOE_ROUTER_CUDA_PARAMS_HPP

// The parameter block of the native forward kernels, typed by the logits' element type L (float, fp16_t, bf16_t),
// the description of a chosen forward kernel and the alignment test of every kernel choice: plain host code, so that
// a forward plan (CudaKernels::ForwardPlan<L>) can cross from the kernel-choice code of the .cu files to the
// Kokkos::Cuda specialization and back.

#include <kokkos_ext/KokkosMoE_Float16.hpp>

#include <cstddef>
#include <cstdint>

namespace KokkosMoE {
namespace Impl {
namespace CudaKernels {

/// The expert bias [E] of a forward call in its own element type, which need not be the logits': at most one member
/// is set, none without a bias. Each block widens it once into a float row in shared memory (the lane kernel with one
/// chunk per lane: once per lane into registers), so the kernels take every bias type without an instantiation per
/// combination and their token loops never branch on it.
struct ExpertBias {
  const float* f32 = nullptr;
  const fp16_t* f16 = nullptr;
  const bf16_t* bf16 = nullptr;
  ExpertBias() = default;
  explicit ExpertBias(const float* p) : f32(p) {}
  explicit ExpertBias(const fp16_t* p) : f16(p) {}
  explicit ExpertBias(const bf16_t* p) : bf16(p) {}
  KOKKOSMOE_HD_INLINE bool present() const { return f32 != nullptr || f16 != nullptr || bf16 != nullptr; }
};

/// Dense top-k indices [T, k] in the caller's index type: at most one member is set (none unless the output kind is
/// RoutingOutput::Indices). Written once per selected slot.
struct IndexOutput {
  std::int16_t* i16 = nullptr;
  std::int32_t* i32 = nullptr;
  std::int64_t* i64 = nullptr;
  IndexOutput() = default;
  explicit IndexOutput(std::int16_t* p) : i16(p) {}
  explicit IndexOutput(std::int32_t* p) : i32(p) {}
  explicit IndexOutput(std::int64_t* p) : i64(p) {}
};

namespace detail {

/// The byte offset of a forward block's widened expert-bias row (E floats) in its dynamic shared memory, after the
/// \p token_bytes of its tokens' rows: the next 16-byte boundary. The planner adds E * 4 bytes there when a bias is
/// present; the kernels fill it once per block (stage_bias) and read it per token.
KOKKOSMOE_HD_INLINE std::size_t bias_row_offset(std::size_t token_bytes) { return (token_bytes + 15) / 16 * 16; }

/// Whether p is 16-byte aligned: the vector kernels' condition, checked on the host when a kernel is chosen.
inline bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

/// The kernel parameters of a forward call (topk_router or aux_scores) with logits of type L.
template <class L>
struct FwdParams {
  long long T = 0;
  int E = 0, k = 1;
  int fn = 0;                         // ScoreFunction (kFn* of impl/KokkosMoE_RouterMath.hpp)
  int pre = 0;                        // Softmax pre
  int aux = 0;                        // aux_scores mode (scores out, map out; no probs)
  int G = 0, gk = 0, gs = 0, kg = 0;  // grouping (gk == 0: off)
  float scale = 1.0f;
  int out = 0;  // RoutingOutput
  const L* logits = nullptr;
  ExpertBias bias;
  L* probs = nullptr;
  unsigned char* map = nullptr;
  IndexOutput indices;
  float* inter = nullptr;
  int* ids = nullptr;
  float* weights = nullptr;
  float* scores = nullptr;
  float* cutoff = nullptr;  // QB: order[k]'s score per token (kernels with FwdKernel::writes_cutoff)
  // fast path: per-token shared-memory region
  int cap = 0;        // candidate entries
  int tok_smem = 0;   // bytes per token
  int off_slots = 0;  // byte offsets inside the token region
  int off_ybuf = 0;
  int off_fbuf = 0;
  int fbuf_bytes = 0;
};

/// A forward kernel chosen for one FwdParams<L>, with its launch geometry: blocks of `warps` warps, `tpw` tokens per
/// warp, `smem` bytes of dynamic shared memory; max_shared asks for the largest shared-memory carveout before the
/// launch. kernel == nullptr: no native kernel handles the parameters.
template <class L>
struct FwdKernel {
  void (*kernel)(FwdParams<L>) = nullptr;
  int warps = 0;
  int tpw = 0;
  std::size_t smem = 0;
  bool max_shared = false;
  bool writes_cutoff = false;  // the kernel writes FwdParams::cutoff when it is not null
};

}  // namespace detail
}  // namespace CudaKernels
}  // namespace Impl
}  // namespace KokkosMoE

#endif
