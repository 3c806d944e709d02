/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_EPSETUP_HPP
#define KOKKOSMOE_EPSETUP_HPP

/// \file KokkosMoE_EpSetup.hpp
/// \brief From a planner Plan (sharding/) to this rank's EP and DP communicators and EpGroupConfig
/// (docs/ep.md §2; docs/planner.md for the plan). Available when the sharding component is built.
///
///     auto plan = KokkosMoE::make_plan(request);                    // detect_topology() -> PlanRequest
///     auto comms = KokkosMoE::make_ep_communicators(world, plan);   // world: MPI or NCCL, plan.world_size() ranks
///     KokkosMoE::EpGroup<Exec> group(exec, comms.ep, KokkosMoE::ep_group_config(plan, comms));

#include <KokkosMoE_Communicator.hpp>
#include <KokkosMoE_EpConfig.hpp>
#include <KokkosMoE_Planner.hpp>

#include <string>

namespace KokkosMoE {

/// \brief This rank's share of a plan.
struct EpCommunicators {
  Communicator ep;          ///< the ranks of this rank's EP group, in ep_index order
  Communicator dp;          ///< the ranks with this rank's ep_index, in dp_index order (gradient all-reduce)
  RankPlacement placement;  ///< the plan's entry for this rank (node, GPU, PCI address, experts)
};

/// \brief Splits \p world (rank r plays plan.ranks[r]) into the plan's EP and DP groups. Collective over \p world.
/// \throws InvalidArgument (Rule::CommSize) when world.size() != plan.world_size(); CommError on a failure
EpCommunicators make_ep_communicators(const Communicator& world, const Plan& plan);

/// \brief The EpGroupConfig of the plan's layer on this rank's EP group: E, k, hidden, ep_size, and
/// max_tokens_per_rank = the layer's tokens_per_rank; eager mode unless \p max_recv_tokens_per_rank > 0.
EpGroupConfig ep_group_config(const Plan& plan, int max_recv_tokens_per_rank = 0, int expert_alignment = 1);

}  // namespace KokkosMoE

#endif
