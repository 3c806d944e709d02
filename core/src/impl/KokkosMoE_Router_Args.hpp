/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTER_ARGS_HPP
#define KOKKOSMOE_ROUTER_ARGS_HPP

// The raw-pointer argument structs of the native CUDA kernels (cuda/*.cu), and the enums and constants that every
// implementation shares. cuda/KokkosMoE_Router_CudaSpec.hpp lowers the typed canonical operands
// (impl/KokkosMoE_Router_Operands.hpp) to these structs, so that the .cu kernels need neither Kokkos nor the View
// types and compile with nvcc alone. The portable kernels never see the structs; they take from this file only
// RoutingOutput, bitmap_row_bytes and the aux-loss row chunking (and the workspace size it implies), which fix the
// output layout and the summation order on every backend. DType tags the element type behind a void pointer here,
// and names types in the validation messages.
//
// Everything here is validated already: implementations never re-check (docs/router.md §4). All tensors are
// row-major and contiguous; row offsets are 64-bit.

#include <KokkosMoE_RouterConfig.hpp>

#include <kokkos_ext/KokkosMoE_Float16.hpp>  // KOKKOSMOE_HOST_DEVICE

#include <impl/KokkosMoE_RouterMath.hpp>

#include <cstddef>
#include <cstdint>

namespace KokkosMoE {
namespace Impl {

/// Element type of a type-erased operand.
enum class DType : std::uint8_t { F32 = 0, F16 = 1, BF16 = 2, I16 = 3, I32 = 4, I64 = 5, U8 = 6 };

/// The routing output of a forward call (docs/router.md §5.4, §5.5).
enum class RoutingOutput : std::uint8_t { Bytemap = 0, BitmapU8 = 1, Indices = 2, Compact = 3 };

/// Bytes of one BitmapU8 row.
KOKKOSMOE_HOST_DEVICE constexpr std::int64_t bitmap_row_bytes(std::int64_t num_experts) {
  return (num_experts + 7) / 8;
}

/// topk_router forward (all output kinds). Pointers not used by `output` are null.
struct TopkForwardArgs {
  std::int64_t num_tokens = 0;  ///< T (may be 0)
  int num_experts = 0;          ///< E >= 1
  RouterConfig config;          ///< validated; grouping is on iff config.group_topk > 0
  RoutingOutput output = RoutingOutput::Bytemap;

  DType logits_type = DType::F32;
  const void* logits = nullptr;  ///< [T, E] logits_type
  DType bias_type = DType::F32;
  const void* bias = nullptr;  ///< [E] F32/F16/BF16, or null

  void* probs = nullptr;                ///< [T, E] logits_type (Bytemap, BitmapU8, Indices)
  std::uint8_t* routing_map = nullptr;  ///< [T, E] (Bytemap) or [T, ceil(E/8)] (BitmapU8)
  DType indices_type = DType::I32;      ///< I16/I32/I64 (Indices)
  void* indices = nullptr;              ///< [T, k] (Indices)
  float* intermediate = nullptr;        ///< [T, E] (Bytemap, BitmapU8, Indices)
  std::int32_t* ids = nullptr;          ///< [T, k] (Compact)
  float* weights = nullptr;             ///< [T, k] (Compact)
  /// Quantile Balancing (docs/router.md §19.4): [T] the score of order[k] per token, written by the forward kernels
  /// that can (CudaKernels::ForwardPlan::writes_cutoff); null otherwise.
  float* qb_cutoff = nullptr;
};

/// aux_scores forward (docs/router.md §10): scores [T, E] F32, routing map, intermediate [T, E] F32.
struct AuxScoresArgs {
  std::int64_t num_tokens = 0;
  int num_experts = 0;
  int topk = 1;
  ScoreFunction score_function = ScoreFunction::Softmax;
  RoutingOutput output = RoutingOutput::Bytemap;  ///< Bytemap or BitmapU8
  DType logits_type = DType::F32;
  const void* logits = nullptr;
  float* scores = nullptr;
  std::uint8_t* routing_map = nullptr;
  float* intermediate = nullptr;
};

/// Rows per chunk of the deterministic two-stage column reduction of aux_loss. Fixed (never derived from the
/// thread count or the device), so the summation order, and therefore the result bits, are fixed per backend.
constexpr std::int64_t kAuxLossRowChunk = 256;

/// Floats of workspace aux_loss needs for probs [rows, cols], on every backend.
constexpr std::size_t aux_loss_workspace_floats(std::int64_t rows, std::int64_t cols) {
  return static_cast<std::size_t>(((rows + kAuxLossRowChunk - 1) / kAuxLossRowChunk) * cols + 2 * cols + 64);
}

}  // namespace Impl
}  // namespace KokkosMoE

#endif
