/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTER_ARGS_HPP
#define KOKKOSMOE_ROUTER_ARGS_HPP

// The enums and constants that every implementation of the router shares: the routing output kinds, the BitmapU8 row
// size and the aux-loss row chunking (and the workspace size it implies), which fix the output layout and the
// summation order on every backend. The operands themselves are typed: impl/KokkosMoE_Router_Operands.hpp (the
// canonical Views) and, below the Kokkos::Cuda spec, the argument structs of cuda/KokkosMoE_Router_Cuda_Forward.hpp,
// cuda/KokkosMoE_Router_Cuda_Backward.hpp and cuda/KokkosMoE_AuxLoss_Cuda.hpp.

#include <KokkosMoE_RouterConfig.hpp>

#include <kokkos_ext/KokkosMoE_Float16.hpp>  // KOKKOSMOE_HOST_DEVICE

#include <impl/KokkosMoE_RouterMath.hpp>

#include <cstddef>
#include <cstdint>

namespace KokkosMoE {
namespace Impl {

/// The routing output of a forward call (docs/router.md §5.4, §5.5).
enum class RoutingOutput : std::uint8_t { Bytemap = 0, BitmapU8 = 1, Indices = 2, Compact = 3 };

/// Bytes of one BitmapU8 row.
KOKKOSMOE_HOST_DEVICE constexpr std::int64_t bitmap_row_bytes(std::int64_t num_experts) {
  return (num_experts + 7) / 8;
}

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
