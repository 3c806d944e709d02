/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ERROR_HPP
#define KOKKOSMOE_ERROR_HPP

/// \file KokkosMoE_Error.hpp
/// \brief The exception types thrown at KokkosMoE's public boundary (docs/router.md §4, docs/conventions.md §5).

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

namespace KokkosMoE {

/// \brief Stable identifiers of the validation rules. Tests assert the rule, never the message text.
///
/// The numeric values are part of the API: new rules are appended, existing ones never renumbered.
enum class Rule : int {
  ShapeMismatch = 1,       ///< an extent does not match the contract (docs/router.md §4.1)
  NotContiguous = 2,       ///< a View is not contiguous row-major
  NumExpertsPositive = 3,  ///< E >= 1
  TopkRange = 4,           ///< 1 <= topk <= E
  TokenCountRange = 5,     ///< T < 2^31
  ExpertCountRange = 6,    ///< E < 2^31
  PreSoftmaxRequiresSoftmax = 7,
  BiasRequiresSigmoidOrSqrtSoftplus = 8,
  GroupCountPositive = 9,      ///< grouping on: num_groups > 0
  GroupTopkRange = 10,         ///< grouping on: group_topk <= num_groups
  GroupDivisibility = 11,      ///< grouping on: E % num_groups == 0
  TopkGroupDivisibility = 12,  ///< grouping on: topk % group_topk == 0
  TopkPerGroupRange = 13,      ///< grouping on: topk / group_topk <= E / num_groups
  ScalingFactorFinite = 14,
  IndexTypeRange = 15,         ///< int16 indices need E <= 32767
  Aliasing = 16,               ///< outputs must not alias inputs or each other
  ScoreFunctionValue = 17,     ///< not one of the ScoreFunction enumerators
  MapFormatValue = 18,         ///< not one of the RoutingMapFormat enumerators
  TotalTokensPositive = 19,    ///< aux loss: total_num_tokens >= 1 (host-side total)
  AuxColumnsMultiple = 20,     ///< aux loss: C is a positive multiple of num_experts
  WorkspaceTooSmall = 21,      ///< a caller-provided workspace is smaller than the size query returns
  CoeffFinite = 22,            ///< aux loss: coeff must be finite
  ConfigValue = 23,            ///< another configuration value out of its documented range
  Alignment = 24,              ///< a View's data is not aligned as the operation requires (FP8 rows: 16 bytes)
  QbRequiresSigmoid = 25,      ///< Quantile Balancing: score_function must be Sigmoid (docs/router.md §19.3)
  QbRequiresBias = 26,         ///< Quantile Balancing: an expert bias is required
  QbGroupingUnsupported = 27,  ///< Quantile Balancing: no group-limited routing (group_topk <= 0)
  QbTopkRange = 28,            ///< Quantile Balancing: 1 <= topk <= num_experts - 1
  QbBinCountPositive = 29,     ///< Quantile Balancing: the histogram has >= 1 bin per expert
  QbBinBounds = 30,            ///< Quantile Balancing: both bin bounds finite and lower < upper
  TopologyMalformed = 100,     ///< sharding: malformed topology input
  PlanInfeasible = 101,        ///< sharding: a planning request that cannot be satisfied
  ShardingRule = 102,          ///< sharding: an input sharding the partition rules reject
  GpuIndexRange = 103,         ///< sharding: a GPU index outside [0, number of GPUs)
  CommConfigMismatch = 200,    ///< comm: ranks of one group passed different configurations (digest differs)
  ExpertIdRange = 201,         ///< comm: an expert id >= num_experts or < -1 in topk_idx
  HandleState = 202,           ///< comm: an EP step called out of order (dispatch before layout, ...)
  HandleReuse = 203,           ///< comm: one EpHandle used for two layers (a new layout before the backward ran)
  TransportMismatch = 204,     ///< comm: the communicator's transport cannot serve this execution space
  CommSize = 205,              ///< comm: ep_size does not match the communicator, or a rank/size out of range
  PeerInvalidArgument = 206,   ///< comm: another rank's call of the same operation failed its own argument checks
};

/// \brief The stable, snake_case name of a rule (e.g. "topk_range").
inline const char* rule_name(Rule r) noexcept {
  switch (r) {
    case Rule::ShapeMismatch:
      return "shape_mismatch";
    case Rule::NotContiguous:
      return "not_contiguous";
    case Rule::NumExpertsPositive:
      return "num_experts_positive";
    case Rule::TopkRange:
      return "topk_range";
    case Rule::TokenCountRange:
      return "token_count_range";
    case Rule::ExpertCountRange:
      return "expert_count_range";
    case Rule::PreSoftmaxRequiresSoftmax:
      return "pre_softmax_requires_softmax";
    case Rule::BiasRequiresSigmoidOrSqrtSoftplus:
      return "bias_requires_sigmoid_or_sqrtsoftplus";
    case Rule::GroupCountPositive:
      return "group_count_positive";
    case Rule::GroupTopkRange:
      return "group_topk_range";
    case Rule::GroupDivisibility:
      return "group_divisibility";
    case Rule::TopkGroupDivisibility:
      return "topk_group_divisibility";
    case Rule::TopkPerGroupRange:
      return "topk_per_group_range";
    case Rule::ScalingFactorFinite:
      return "scaling_factor_finite";
    case Rule::IndexTypeRange:
      return "index_type_range";
    case Rule::Aliasing:
      return "aliasing";
    case Rule::ScoreFunctionValue:
      return "score_function_value";
    case Rule::MapFormatValue:
      return "map_format_value";
    case Rule::TotalTokensPositive:
      return "total_tokens_positive";
    case Rule::AuxColumnsMultiple:
      return "aux_columns_multiple";
    case Rule::WorkspaceTooSmall:
      return "workspace_too_small";
    case Rule::CoeffFinite:
      return "coeff_finite";
    case Rule::ConfigValue:
      return "config_value";
    case Rule::Alignment:
      return "alignment";
    case Rule::QbRequiresSigmoid:
      return "qb_requires_sigmoid";
    case Rule::QbRequiresBias:
      return "qb_requires_bias";
    case Rule::QbGroupingUnsupported:
      return "qb_grouping_unsupported";
    case Rule::QbTopkRange:
      return "qb_topk_range";
    case Rule::QbBinCountPositive:
      return "qb_bin_count_positive";
    case Rule::QbBinBounds:
      return "qb_bin_bounds";
    case Rule::TopologyMalformed:
      return "topology_malformed";
    case Rule::PlanInfeasible:
      return "plan_infeasible";
    case Rule::ShardingRule:
      return "sharding_rule";
    case Rule::GpuIndexRange:
      return "gpu_index_range";
    case Rule::CommConfigMismatch:
      return "comm_config_mismatch";
    case Rule::ExpertIdRange:
      return "expert_id_range";
    case Rule::HandleState:
      return "handle_state";
    case Rule::HandleReuse:
      return "handle_reuse";
    case Rule::TransportMismatch:
      return "transport_mismatch";
    case Rule::CommSize:
      return "comm_size";
    case Rule::PeerInvalidArgument:
      return "peer_invalid_argument";
  }
  return "unknown";
}

/// \brief A violated argument rule at a public entry point.
///
/// what() reads `KokkosMoE::<function>: <message> [rule <name>]`, e.g.
/// `KokkosMoE::topk_router: topk (9) must be in [1, num_experts = 8] [rule topk_range]`.
class InvalidArgument : public std::invalid_argument {
 public:
  InvalidArgument(std::string function, std::string parameter, Rule rule, const std::string& message)
      : std::invalid_argument("KokkosMoE::" + function + ": " + message + " [rule " + rule_name(rule) + "]"),
        m_function(std::move(function)),
        m_parameter(std::move(parameter)),
        m_rule(rule) {}
  const std::string& function() const noexcept { return m_function; }
  const std::string& parameter() const noexcept { return m_parameter; }
  Rule rule() const noexcept { return m_rule; }

 private:
  std::string m_function;
  std::string m_parameter;
  Rule m_rule;
};

/// \brief Thrown by the optional finite check (RouterConfig::check_finite / check_finite()): names the first
/// offending element in row-major order.
class NonFiniteInput : public std::domain_error {
 public:
  NonFiniteInput(std::string function, std::string parameter, std::int64_t row, std::int64_t col, float value)
      : std::domain_error("KokkosMoE::" + function + ": " + parameter + "(" + std::to_string(row) + ", " +
                          std::to_string(col) + ") = " + std::to_string(value) + " is not finite"),
        m_row(row),
        m_col(col) {}
  std::int64_t row() const noexcept { return m_row; }
  std::int64_t col() const noexcept { return m_col; }

 private:
  std::int64_t m_row;
  std::int64_t m_col;
};

/// \brief A malformed or unreadable topology description (hwloc XML, fixture, capture).
class TopologyError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// \brief A failure reported by a device runtime (a kernel launch the CUDA runtime rejected, ...).
class DeviceError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// \brief Why a communication step failed (CommError::cause()).
enum class CommFailure : int {
  Timeout = 1,      ///< a peer did not answer within the communicator's timeout (stalled or dead peer)
  PeerFailure = 2,  ///< the transport reported a failed peer or connection
  Library = 3,      ///< NCCL or MPI returned an error code
  Device = 4,       ///< the CUDA runtime reported an error on the communication stream
  Aborted = 5,      ///< the communicator was aborted earlier (by a failure or by abort())
};

/// \brief "timeout", "peer_failure", "library", "device", "aborted".
inline const char* to_string(CommFailure c) noexcept {
  switch (c) {
    case CommFailure::Timeout:
      return "timeout";
    case CommFailure::PeerFailure:
      return "peer_failure";
    case CommFailure::Library:
      return "library";
    case CommFailure::Device:
      return "device";
    case CommFailure::Aborted:
      return "aborted";
  }
  return "unknown";
}

/// \brief A failure reported by the communication layer (NCCL, MPI, the CUDA runtime on the communication stream).
///
/// what() reads `KokkosMoE::<operation>: rank <r> of <n>: <cause>: <detail>`. After a CommError the communicator is
/// aborted: every later operation on it throws CommError with cause Aborted.
class CommError : public std::runtime_error {
 public:
  CommError(std::string operation, int rank, int size, CommFailure cause, const std::string& detail)
      : std::runtime_error("KokkosMoE::" + operation + ": rank " + std::to_string(rank) + " of " +
                           std::to_string(size) + ": " + to_string(cause) + ": " + detail),
        m_operation(std::move(operation)),
        m_rank(rank),
        m_cause(cause) {}
  const std::string& operation() const noexcept { return m_operation; }
  int rank() const noexcept { return m_rank; }
  CommFailure cause() const noexcept { return m_cause; }

 private:
  std::string m_operation;
  int m_rank;
  CommFailure m_cause;
};

/// \brief Expert-parallel receive capacity exceeded without drop_on_overflow (docs/ep.md §5), reported on every rank
/// of the group at the next synchronization after the layout that overflowed.
class CapacityOverflow : public std::runtime_error {
 public:
  CapacityOverflow(std::string operation, std::int64_t demand, std::int64_t capacity)
      : CapacityOverflow(std::move(operation), demand, capacity, -1, std::string()) {}
  /// \p rank: the rank whose receive rows overflowed (-1: this process); \p detail: appended to the message.
  CapacityOverflow(std::string operation, std::int64_t demand, std::int64_t capacity, int rank,
                   const std::string& detail)
      : std::runtime_error("KokkosMoE::" + operation + ": " +
                           (rank < 0 ? std::string("the layout") : "rank " + std::to_string(rank) + "'s layout") +
                           " needs " + std::to_string(demand) + " receive rows but the group holds " +
                           std::to_string(capacity) + (detail.empty() ? std::string() : ": " + detail) +
                           "; grow the capacity or set drop_on_overflow"),
        m_demand(demand),
        m_capacity(capacity),
        m_rank(rank) {}
  /// Receive rows the overflowing rank's layout needed (padded; fixed layout: its largest expert's slots).
  std::int64_t demand() const noexcept { return m_demand; }
  /// Its capacity: max_recv_tokens_per_rank, or the fixed layout's slab of ep_size * max_tokens_per_rank rows.
  std::int64_t capacity() const noexcept { return m_capacity; }
  /// The rank whose receive rows overflowed: this rank when it overflowed itself, else the lowest one that did.
  int rank() const noexcept { return m_rank; }

 private:
  std::int64_t m_demand;
  std::int64_t m_capacity;
  int m_rank;
};

}  // namespace KokkosMoE

#endif
