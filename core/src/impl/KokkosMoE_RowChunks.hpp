/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_IMPL_ROWCHUNKS_HPP
#define KOKKOSMOE_IMPL_ROWCHUNKS_HPP

// Short rows moved in vector-sized chunks: the 16-byte unit of the EP layer's row copies (comm/) and the whole-row
// loads and stores of the router's one-thread tokens (impl/KokkosMoE_Router_PortableTopk.hpp). On a device a warp's
// threads then each move one chunk of consecutive rows, so their accesses cover contiguous memory.

#include <Kokkos_Macros.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace KokkosMoE {
namespace Impl {

/// 16 bytes: moved as one vector load or store on devices where both ends are 16-byte aligned.
struct alignas(16) Chunk16 {
  std::uint32_t v[4];
};

/// The chunk in which row_copy moves a row of `Bytes` (8, or a multiple of 16) bytes.
template <std::size_t Bytes>
using RowChunk = std::conditional_t<(Bytes >= 16), Chunk16, std::uint64_t>;

/// Copies the first n of N elements from src to dst, in chunks of RowChunk where n == N and both ends are so
/// aligned (one vector access per chunk on devices), else element by element. Used for one thread's rows of small E.
template <int N, class T>
KOKKOS_INLINE_FUNCTION void row_copy(T* dst, const T* src, int n) {
  using Chunk = RowChunk<N * sizeof(T)>;
  static_assert(N * sizeof(T) % sizeof(Chunk) == 0, "rows of whole chunks");
  constexpr int per = static_cast<int>(sizeof(Chunk) / sizeof(T));
  constexpr std::uintptr_t align = alignof(Chunk);
  if (n == N && (reinterpret_cast<std::uintptr_t>(dst) % align) == 0 &&
      (reinterpret_cast<std::uintptr_t>(src) % align) == 0) {
    for (int i = 0; i < N; i += per) *reinterpret_cast<Chunk*>(dst + i) = *reinterpret_cast<const Chunk*>(src + i);
  } else {
    for (int i = 0; i < N; ++i)
      if (i < n) dst[i] = src[i];
  }
}
/// Loads a row of n <= N elements into row[0..n), the rest of row zero-filled.
template <int N, class T>
KOKKOS_INLINE_FUNCTION void load_row(const T* src, int n, T (&row)[N]) {
  alignas(RowChunk<N * sizeof(T)>) T tmp[N];
  for (int i = 0; i < N; ++i) tmp[i] = T{};
  row_copy<N>(tmp, src, n);
  for (int i = 0; i < N; ++i) row[i] = tmp[i];
}
/// Stores row[0..n) at dst.
template <int N, class T>
KOKKOS_INLINE_FUNCTION void store_row(T* dst, int n, const T (&row)[N]) {
  alignas(RowChunk<N * sizeof(T)>) T tmp[N];
  for (int i = 0; i < N; ++i) tmp[i] = row[i];
  row_copy<N>(dst, tmp, n);
}

}  // namespace Impl
}  // namespace KokkosMoE

#endif
