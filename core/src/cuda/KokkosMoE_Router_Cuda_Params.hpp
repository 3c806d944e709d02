/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTER_CUDA_PARAMS_HPP
#define KOKKOSMOE_ROUTER_CUDA_PARAMS_HPP

// The parameter block of the native forward kernels and the description of a chosen forward kernel: plain structs
// without device code, so that a forward plan (CudaKernels::ForwardPlan) can cross from the kernel-choice code of
// the .cu files to the Kokkos::Cuda specialization and back.

#include <cstddef>

namespace KokkosMoE {
namespace Impl {
namespace CudaKernels {
namespace detail {

struct FwdParams {
  long long T = 0;
  int E = 0, k = 1;
  int fn = 0;                         // ScoreFunction (kFn* of impl/KokkosMoE_RouterMath.hpp)
  int pre = 0;                        // Softmax pre
  int aux = 0;                        // aux_scores mode (scores out, map out; no probs)
  int G = 0, gk = 0, gs = 0, kg = 0;  // grouping (gk == 0: off)
  float scale = 1.0f;
  int out = 0;       // RoutingOutput
  int idx_type = 0;  // DType of dense indices
  int bias_type = 0;
  const void* logits = nullptr;
  const void* bias = nullptr;
  void* probs = nullptr;
  unsigned char* map = nullptr;
  void* indices = nullptr;
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

/// A forward kernel chosen for one FwdParams, with its launch geometry: blocks of `warps` warps, `tpw` tokens per
/// warp, `smem` bytes of dynamic shared memory; max_shared asks for the largest shared-memory carveout before the
/// launch. kernel == nullptr: no native kernel handles the parameters.
struct FwdKernel {
  void (*kernel)(FwdParams) = nullptr;
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
