/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_COMMUNICATOR_LOOPBACK_HPP
#define KOKKOSMOE_COMMUNICATOR_LOOPBACK_HPP

/// \file KokkosMoE_Communicator_Loopback.hpp
/// \brief Several ranks in one process (docs/ep.md §7.3): the whole remote path of the EP layer (windows, direct
/// writes, signals, deadlines, graph capture) on one device, without MPI or several GPUs.

#include <KokkosMoE_Communicator.hpp>

#include <vector>

namespace KokkosMoE {

/// \brief \p ranks virtual ranks of one group in this process: element r of the result is rank r. Drive each from
/// its own host thread with its own execution space instance (a collective call blocks until every rank made it, or
/// fails with CommError(Timeout) at the deadline). Every EP group over them writes token rows straight into the
/// peers' windows. \p device >= 0: windows in that CUDA device's memory, for Kokkos::Cuda (CUDA builds only);
/// -1: host memory, for host execution spaces whose Kokkos runs concurrent instances (Kokkos >= 4: Serial).
/// \throws InvalidArgument (Rule::ConfigValue) for ranks < 1, a device without CUDA support in the build, a bad
/// timeout
std::vector<Communicator> make_loopback_communicators(int ranks, int device = -1, const CommConfig& config = {});

}  // namespace KokkosMoE

#endif
