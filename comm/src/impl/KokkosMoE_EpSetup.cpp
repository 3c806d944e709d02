/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#include <KokkosMoE_EpSetup.hpp>

#include <limits>
#include <string>

namespace KokkosMoE {

EpCommunicators make_ep_communicators(const Communicator& world, const Plan& plan) {
  constexpr const char* fn = "make_ep_communicators";
  if (!world.valid()) throw InvalidArgument(fn, "world", Rule::ConfigValue, "the world communicator is empty");
  if (world.size() != plan.world_size() || static_cast<int>(plan.ranks.size()) != plan.world_size())
    throw InvalidArgument(fn, "world", Rule::CommSize,
                          "the world communicator has " + std::to_string(world.size()) + " ranks but the plan " +
                              std::to_string(plan.world_size()) + " (DP" + std::to_string(plan.dp_size()) + " x EP" +
                              std::to_string(plan.ep_size()) + ")");
  const RankPlacement& me = plan.ranks[static_cast<std::size_t>(world.rank())];
  EpCommunicators out;
  out.placement = me;
  out.ep = world.split(me.dp_index, me.ep_index);
  out.dp = world.split(me.ep_index, me.dp_index);
  return out;
}

EpGroupConfig ep_group_config(const Plan& plan, int max_recv_tokens_per_rank, int expert_alignment) {
  constexpr const char* fn = "ep_group_config";
  if (plan.layer.tokens_per_rank < 1 || plan.layer.tokens_per_rank > std::numeric_limits<int>::max())
    throw InvalidArgument(
        fn, "plan", Rule::ConfigValue,
        "the plan's tokens_per_rank (" + std::to_string(plan.layer.tokens_per_rank) + ") must be in [1, 2^31 - 1]");
  EpGroupConfig c;
  c.ep_size = plan.ep_size();
  c.num_experts = plan.layer.num_experts;
  c.hidden_size = plan.layer.hidden_size;
  c.topk = plan.layer.topk;
  c.max_tokens_per_rank = static_cast<int>(plan.layer.tokens_per_rank);
  c.max_recv_tokens_per_rank = max_recv_tokens_per_rank;
  c.expert_alignment = expert_alignment;
  return c;
}

}  // namespace KokkosMoE
