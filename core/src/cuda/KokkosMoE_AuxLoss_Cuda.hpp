/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_AUXLOSS_CUDA_HPP
#define KOKKOSMOE_AUXLOSS_CUDA_HPP

// The native aux_loss operations (docs/router.md §11), one argument struct each, typed by the element types of their
// operands: probs P and grad_probs G in {float, fp16_t, bf16_t}, tokens_per_expert Tpe in {int16_t, int32_t,
// int64_t, bf16_t, float}, grad_loss GL in {float, G}. The native kernels take every shape; the launchers are
// explicitly instantiated for every combination in KokkosMoE_AuxLoss.cu and only enqueue on the queue's stream (the
// workspace is the caller's).

#include <cuda_runtime_api.h>

#include <cstdint>

namespace KokkosMoE {
namespace Impl {
namespace CudaKernels {

struct Queue;

/// aux_loss forward: loss = Const * sum_c (sum_r probs[r, c]) * tokens_per_expert[c], in a fixed order.
template <class P, class Tpe>
struct AuxLossForward {
  std::int64_t rows = 0;  ///< R (may be 0)
  std::int64_t cols = 0;  ///< C = m * E
  int num_experts = 1;
  int topk = 1;
  float coeff = 0.0f;
  const P* probs = nullptr;                               ///< [R, C]
  const Tpe* tokens_per_expert = nullptr;                 ///< [C]
  std::int64_t total_num_tokens = 0;                      ///< host-side total (used when the device pointer is null)
  const std::int64_t* total_num_tokens_device = nullptr;  ///< rank-0 device scalar, read on the device
  P* loss = nullptr;                                      ///< rank-0
  float* const_buf = nullptr;                             ///< [2]: {Const, FP32 loss value before the cast}
  float* workspace = nullptr;                             ///< aux_loss_workspace_floats(R, C) floats
};

/// aux_loss backward: grad_probs[r, c] = const_buf[0] * tokens_per_expert[c] * grad_loss.
template <class G, class GL, class Tpe>
struct AuxLossBackward {
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  const float* const_buf = nullptr;
  const Tpe* tokens_per_expert = nullptr;
  const GL* grad_loss = nullptr;  ///< rank-0
  G* grad_probs = nullptr;        ///< [R, C]
};

template <class P, class Tpe>
cudaError_t aux_loss_forward(const AuxLossForward<P, Tpe>& args, const Queue& queue);
template <class G, class GL, class Tpe>
cudaError_t aux_loss_backward(const AuxLossBackward<G, GL, Tpe>& args, const Queue& queue);

}  // namespace CudaKernels
}  // namespace Impl
}  // namespace KokkosMoE

#endif
