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
  IndexTypeRange = 15,       ///< int16 indices need E <= 32767
  Aliasing = 16,             ///< outputs must not alias inputs or each other
  ScoreFunctionValue = 17,   ///< not one of the ScoreFunction enumerators
  MapFormatValue = 18,       ///< not one of the RoutingMapFormat enumerators
  TotalTokensPositive = 19,  ///< aux loss: total_num_tokens >= 1 (host-side total)
  AuxColumnsMultiple = 20,   ///< aux loss: C is a positive multiple of num_experts
  WorkspaceTooSmall = 21,    ///< a caller-provided workspace is smaller than the size query returns
  CoeffFinite = 22,          ///< aux loss: coeff must be finite
  ConfigValue = 23,          ///< another configuration value out of its documented range
  TopologyMalformed = 100,   ///< sharding: malformed topology input
  PlanInfeasible = 101,      ///< sharding: a planning request that cannot be satisfied
  ShardingRule = 102,        ///< sharding: an input sharding the partition rules reject
  GpuIndexRange = 103,       ///< sharding: a GPU index outside [0, number of GPUs)
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
    case Rule::TopologyMalformed:
      return "topology_malformed";
    case Rule::PlanInfeasible:
      return "plan_infeasible";
    case Rule::ShardingRule:
      return "sharding_rule";
    case Rule::GpuIndexRange:
      return "gpu_index_range";
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

/// \brief A failure reported by the communication layer (NCCL, CUDA runtime).
class CommError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace KokkosMoE

#endif
