/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_COMMUNICATOR_NCCL_HPP
#define KOKKOSMOE_COMMUNICATOR_NCCL_HPP

/// \file KokkosMoE_Communicator_NCCL.hpp
/// \brief Communicators over NCCL, one GPU per rank (docs/ep.md §7). Only in builds with KokkosMoE_ENABLE_NCCL.
///
/// Every NCCL communicator made here is non-blocking (ncclConfig_t::blocking = 0): initialization and every
/// communication step are polled against the deadline, and a timeout or an asynchronous error aborts the
/// communicator (ncclCommAbort) and throws CommError. Destruction finalizes with the same deadline, then aborts.
/// NCCL_NVLS_ENABLE should be 0 on machines without NVLink SHARP support in the fabric manager.

#include <KokkosMoE_Communicator.hpp>

#include <nccl.h>

#include <vector>

namespace KokkosMoE {

/// \brief Rank \p rank of \p size over the id the caller exchanged (rank 0's ncclGetUniqueId, sent by any launcher:
/// MPI, Slurm, torch, a file). Collective over the \p size ranks; binds CUDA device \p device.
/// \throws InvalidArgument (Rule::CommSize) for rank/size out of range; CommError on NCCL errors or a timeout
Communicator make_nccl_communicator(const ncclUniqueId& id, int rank, int size, int device,
                                    const CommConfig& config = {});

/// \brief One process driving several GPUs (ncclCommInitAll-style): rank i uses devices[i].
std::vector<Communicator> make_nccl_communicators(const std::vector<int>& devices, const CommConfig& config = {});

/// \brief Borrows \p comm (not destroyed by the Communicator; the caller keeps ownership and must keep it alive).
/// Waits on it use the deadline, but an existing blocking communicator cannot be interrupted inside NCCL calls.
Communicator borrow_nccl_communicator(ncclComm_t comm, int device, const CommConfig& config = {});

/// \brief A new ncclUniqueId (rank 0 calls this and sends it to the others).
ncclUniqueId make_nccl_unique_id();

/// \brief Rank \p host.rank() of \p host.size() over NCCL: rank 0's unique id reaches the others through the host
/// communicator \p host (an MPI communicator, say), with its deadline. Collective over \p host.
Communicator make_nccl_communicator(const Communicator& host, int device, const CommConfig& config = {});

}  // namespace KokkosMoE

#endif
