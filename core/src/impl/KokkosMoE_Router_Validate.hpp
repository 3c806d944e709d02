/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTER_VALIDATE_HPP
#define KOKKOSMOE_ROUTER_VALIDATE_HPP

// Validation at the public boundary (docs/router.md §4, docs/conventions.md §5): compile-time facts as static_asserts,
// run-time rules as KokkosMoE::InvalidArgument with a stable rule id. Kernels never re-check.

#include <KokkosMoE_Error.hpp>
#include <KokkosMoE_RouterConfig.hpp>

#include <Kokkos_Core.hpp>
#include <kokkos_ext/KokkosMoE_Float16.hpp>

#include <impl/KokkosMoE_Router_Args.hpp>

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <type_traits>

namespace KokkosMoE {
namespace Impl {

template <class T>
struct is_router_float
    : std::bool_constant<std::is_same_v<T, float> || std::is_same_v<T, fp16_t> || std::is_same_v<T, bf16_t>> {};
template <class T>
struct is_index_type : std::bool_constant<std::is_same_v<T, std::int16_t> || std::is_same_v<T, std::int32_t> ||
                                          std::is_same_v<T, std::int64_t>> {};

/// Compile-time checks common to every View operand.
template <class ExecSpace, class View, int Rank>
constexpr void static_check_view() {
  static_assert(Kokkos::is_view<View>::value, "KokkosMoE: operands must be Kokkos::View");
  static_assert(static_cast<int>(View::rank) == Rank, "KokkosMoE: operand has the wrong rank");
  static_assert(Kokkos::SpaceAccessibility<ExecSpace, typename View::memory_space>::accessible,
                "KokkosMoE: operand is not accessible from the execution space");
}

template <class V>
std::string shape_str(const V& v) {
  std::ostringstream os;
  os << "[";
  for (int r = 0; r < static_cast<int>(V::rank); ++r) os << (r ? ", " : "") << v.extent(r);
  os << "]";
  return os.str();
}

[[noreturn]] inline void fail(const char* fn, const char* param, Rule rule, const std::string& msg) {
  throw InvalidArgument(fn, param, rule, msg);
}

/// Row-major contiguity, whatever the layout type (LayoutStride views pass when their strides are row-major).
template <class V>
void check_contiguous(const char* fn, const char* param, const V& v) {
  if (v.size() == 0) return;
  bool ok = v.span_is_contiguous() && v.span() == v.size();
  if constexpr (V::rank == 2) ok = ok && (v.extent(1) <= 1 || v.stride(1) == 1) && v.stride(0) == v.extent(1);
  if constexpr (V::rank == 1) ok = ok && (v.extent(0) <= 1 || v.stride(0) == 1);
  if (!ok) fail(fn, param, Rule::NotContiguous, std::string(param) + " must be contiguous and row-major");
}

template <class V>
void check_shape2(const char* fn, const char* param, const V& v, std::int64_t rows, std::int64_t cols) {
  if (static_cast<std::int64_t>(v.extent(0)) != rows || static_cast<std::int64_t>(v.extent(1)) != cols) {
    fail(fn, param, Rule::ShapeMismatch,
         std::string(param) + " has shape " + shape_str(v) + ", expected [" + std::to_string(rows) + ", " +
             std::to_string(cols) + "]");
  }
  check_contiguous(fn, param, v);
}

template <class V>
void check_shape1(const char* fn, const char* param, const V& v, std::int64_t n) {
  if (static_cast<std::int64_t>(v.extent(0)) != n) {
    fail(fn, param, Rule::ShapeMismatch,
         std::string(param) + " has shape " + shape_str(v) + ", expected [" + std::to_string(n) + "]");
  }
  check_contiguous(fn, param, v);
}

/// T and E ranges (docs/router.md §4.2).
inline void check_counts(const char* fn, std::int64_t T, std::int64_t E) {
  if (E < 1) fail(fn, "logits", Rule::NumExpertsPositive, "num_experts (" + std::to_string(E) + ") must be >= 1");
  if (E >= (std::int64_t(1) << 31))
    fail(fn, "logits", Rule::ExpertCountRange, "num_experts (" + std::to_string(E) + ") must be < 2^31");
  if (T >= (std::int64_t(1) << 31))
    fail(fn, "logits", Rule::TokenCountRange, "num_tokens (" + std::to_string(T) + ") must be < 2^31");
}

inline void check_topk(const char* fn, int topk, std::int64_t E) {
  if (topk < 1 || topk > E)
    fail(fn, "topk", Rule::TopkRange,
         "topk (" + std::to_string(topk) + ") must be in [1, num_experts = " + std::to_string(E) + "]");
}

inline void check_score_function(const char* fn, ScoreFunction f) {
  const int v = static_cast<int>(f);
  if (v < 0 || v > 2)
    fail(fn, "score_function", Rule::ScoreFunctionValue,
         "score_function (" + std::to_string(v) + ") must be Sigmoid (0), Softmax (1) or SqrtSoftplus (2)");
}

/// Dense indices of type Index must hold every expert index: int16_t needs num_experts <= 32767.
template <class Index>
void check_index_range(const char* fn, std::int64_t num_experts) {
  if (std::is_same_v<Index, std::int16_t> && num_experts > 32767)
    fail(fn, "indices", Rule::IndexTypeRange,
         "int16_t indices require num_experts <= 32767 (num_experts = " + std::to_string(num_experts) + ")");
}

inline void check_map_format(const char* fn, RoutingMapFormat f) {
  const int v = static_cast<int>(f);
  if (v < 0 || v > 1)
    fail(fn, "map_format", Rule::MapFormatValue,
         "map_format (" + std::to_string(v) + ") must be Bytemap (0) or BitmapU8 (1)");
}

inline void check_implementation(const char* fn, Implementation impl) {
  const int v = static_cast<int>(impl);
  if (v < 0 || v > 1)
    fail(fn, "implementation", Rule::ConfigValue,
         "implementation (" + std::to_string(v) + ") must be Auto (0) or Portable (1)");
}

/// The attribute rules of docs/router.md §4 (4, 5, 6, 7) shared by forward and backward.
inline void check_router_config(const char* fn, const RouterConfig& c, std::int64_t E, bool has_bias) {
  check_score_function(fn, c.score_function);
  check_implementation(fn, c.implementation);
  check_topk(fn, c.topk, E);
  if (c.use_pre_softmax && c.score_function != ScoreFunction::Softmax)
    fail(fn, "use_pre_softmax", Rule::PreSoftmaxRequiresSoftmax,
         "use_pre_softmax = true requires score_function = Softmax");
  if (has_bias && c.score_function == ScoreFunction::Softmax)
    fail(fn, "expert_bias", Rule::BiasRequiresSigmoidOrSqrtSoftplus,
         "expert_bias is only allowed with Sigmoid or SqrtSoftplus, not with Softmax");
  if (!std::isfinite(c.scaling_factor)) {
    std::ostringstream os;
    os << "scaling_factor (" << c.scaling_factor << ") must be finite";
    fail(fn, "scaling_factor", Rule::ScalingFactorFinite, os.str());
  }
  if (c.group_topk > 0) {
    const std::string g = std::to_string(c.num_groups), gk = std::to_string(c.group_topk);
    if (c.num_groups <= 0)
      fail(fn, "num_groups", Rule::GroupCountPositive, "num_groups (" + g + ") must be > 0 when group_topk > 0");
    if (c.group_topk > c.num_groups)
      fail(fn, "group_topk", Rule::GroupTopkRange, "group_topk (" + gk + ") must be <= num_groups (" + g + ")");
    if (E % c.num_groups != 0)
      fail(fn, "num_groups", Rule::GroupDivisibility,
           "num_experts (" + std::to_string(E) + ") must be divisible by num_groups (" + g + ")");
    if (c.topk % c.group_topk != 0)
      fail(fn, "group_topk", Rule::TopkGroupDivisibility,
           "topk (" + std::to_string(c.topk) + ") must be divisible by group_topk (" + gk + ")");
    if (c.topk / c.group_topk > E / c.num_groups)
      fail(fn, "group_topk", Rule::TopkPerGroupRange,
           "topk / group_topk (" + std::to_string(c.topk / c.group_topk) + ") must be <= num_experts / num_groups (" +
               std::to_string(E / c.num_groups) + ")");
  }
}

/// Byte ranges of operands for the aliasing rule (docs/router.md §4.9).
struct Span {
  const char* name;
  const void* begin;
  std::size_t bytes;
};
template <class V>
Span span_of(const char* name, const V& v) {
  return Span{name, v.data(), v.span() * sizeof(typename V::value_type)};
}
inline bool overlaps(const Span& a, const Span& b) {
  if (a.bytes == 0 || b.bytes == 0 || a.begin == nullptr || b.begin == nullptr) return false;
  const auto* a0 = static_cast<const char*>(a.begin);
  const auto* b0 = static_cast<const char*>(b.begin);
  return a0 < b0 + b.bytes && b0 < a0 + a.bytes;
}
/// Every output against every input and every other output.
template <std::size_t NI, std::size_t NO>
void check_no_alias(const char* fn, const Span (&inputs)[NI], const Span (&outputs)[NO]) {
  for (std::size_t o = 0; o < NO; ++o) {
    for (std::size_t i = 0; i < NI; ++i)
      if (overlaps(outputs[o], inputs[i]))
        fail(fn, outputs[o].name, Rule::Aliasing,
             std::string(outputs[o].name) + " must not alias the input " + inputs[i].name);
    for (std::size_t p = o + 1; p < NO; ++p)
      if (overlaps(outputs[o], outputs[p]))
        fail(fn, outputs[p].name, Rule::Aliasing,
             std::string(outputs[p].name) + " must not alias the output " + outputs[o].name);
  }
}

}  // namespace Impl
}  // namespace KokkosMoE

#endif
