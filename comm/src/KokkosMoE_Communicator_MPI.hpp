/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_COMMUNICATOR_MPI_HPP
#define KOKKOSMOE_COMMUNICATOR_MPI_HPP

/// \file KokkosMoE_Communicator_MPI.hpp
/// \brief Communicators over MPI: the host transport of the EP layer (docs/ep.md §7.1). Only in builds with
/// KokkosMoE_ENABLE_MPI.

#include <KokkosMoE_Communicator.hpp>

#include <mpi.h>

namespace KokkosMoE {

/// \brief A host communicator over a duplicate of \p comm (collective over \p comm).
///
/// The duplicate is owned and freed by the communicator; \p comm itself is never touched again. Exchanges are
/// non-blocking MPI point-to-point requests polled against the deadline, so a dead or stalled peer gives
/// CommError(Timeout) instead of a hang. MPI must be initialized, with MPI_THREAD_FUNNELED or more when OpenMP is
/// used.
/// \throws InvalidArgument (Rule::ConfigValue) for a bad timeout or an uninitialized MPI; CommError on MPI errors
Communicator make_mpi_communicator(MPI_Comm comm, const CommConfig& config = {});

/// \brief A host communicator like make_mpi_communicator whose EP groups write token rows straight into the peers'
/// memory (docs/ep.md §7.2): one MPI_Win_allocate_shared window per EP group on the node's ranks, per-peer sequence
/// counters in it, every wait bounded by the timeout. Where the ranks of an EP group span several nodes, that group
/// uses the point-to-point path of make_mpi_communicator instead. Counts and configuration digests stay MPI messages.
/// \throws as make_mpi_communicator
Communicator make_mpi_shm_communicator(MPI_Comm comm, const CommConfig& config = {});

}  // namespace KokkosMoE

#endif
