/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_CUDA_IPC_HPP
#define KOKKOSMOE_CUDA_IPC_HPP

// CUDA IPC windows (docs/ep.md §7.2): every rank cudaMallocs its part, exports a cudaIpcMemHandle_t, the handles
// travel in one host all-gather, and each rank opens the parts of the ranks in other processes (a part made in this
// process is addressed as is, with peer access where it lives on another device). Used by the NCCL transport (its
// fallback where NCCL has no symmetric windows) and by the CUDA-IPC transport over MPI. Every CUDA IPC call of the
// library is in KokkosMoE_CudaIpc.cpp; a HIP port replaces that file (hipIpc*).

#include <cuda/KokkosMoE_CudaDevice.hpp>
#include <cuda_runtime.h>
#include <impl/KokkosMoE_Transport.hpp>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

namespace KokkosMoE {
namespace Impl {

/// CommError (Device) naming \p what unless \p e is cudaSuccess.
inline void check_cuda(const char* op, int rank, int size, cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw CommError(op, rank, size, CommFailure::Device, std::string(what) + ": " + cudaGetErrorString(e));
}

/// Every rank's \p bytes from \p mine into \p all in rank order, over the ranks of a transport, bounded by its
/// deadline (host memory on both sides; throws CommError).
using HostAllgather = std::function<void(const char* op, const void* mine, void* all, std::size_t bytes)>;

/// Collective over \p t's ranks: a window of \p bytes per rank in device \p t.device()'s memory, zero-filled and
/// visible to every rank on return. \p allgather must stay usable as long as the window lives (its release meets
/// every rank first, so that no peer still writes into a part being freed). Returns nullptr on every rank alike when
/// the ranks span several nodes and \p required is false.
/// \throws CommError (Library) when \p required and the ranks span several nodes; CommError (Device) on CUDA errors
std::shared_ptr<PeerWindow> make_cuda_ipc_window(const char* op, Transport& t, std::size_t bytes, bool required,
                                                 HostAllgather allgather);

}  // namespace Impl
}  // namespace KokkosMoE

#endif
