/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_COMMUNICATOR_CUDAIPC_HPP
#define KOKKOSMOE_COMMUNICATOR_CUDAIPC_HPP

/// \file KokkosMoE_Communicator_CudaIpc.hpp
/// \brief Communicators for Kokkos::Cuda without NCCL: CUDA IPC windows between the processes of one node,
/// bootstrapped and served over a host (MPI) communicator (docs/ep.md §7.5). Only in builds with KokkosMoE_ENABLE_CUDA
/// and KokkosMoE_ENABLE_MPI (KOKKOSMOE_HAVE_CUDA_IPC).

#include <KokkosMoE_Communicator.hpp>

namespace KokkosMoE {

/// \brief Rank \p host.rank() of \p host.size() on CUDA device \p device (collective over \p host).
///
/// Every EP group over it maps each peer's window part with cudaIpcOpenMemHandle (handles all-gathered over the host
/// communicator) and writes token rows and signals straight into it; count exchanges and configuration checks, and
/// every transfer where CommConfig::peer_windows = off or the ranks span several nodes, are the host
/// communicator's, staged through pinned host memory with bounded stream waits. One process per rank; ranks may
/// share a device (their contexts are time-sliced, so waits take longer) or use one each. The host communicator is
/// split once here (its own traffic never meets the caller's) and is no longer needed by the caller afterwards.
/// \throws InvalidArgument (Rule::TransportMismatch) when \p host is no MPI communicator, (Rule::ConfigValue) for a
/// device out of range, a bad timeout or peer_windows = nccl; CommError on a host communicator failure
Communicator make_cuda_ipc_communicator(const Communicator& host, int device, const CommConfig& config = {});

}  // namespace KokkosMoE

#endif
