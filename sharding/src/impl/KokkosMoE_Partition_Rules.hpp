/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_PARTITION_RULES_HPP
#define KOKKOSMOE_PARTITION_RULES_HPP

// The sharding rules of the router operations (docs/router.md §13), without Kokkos: which input shardings are legal,
// which argument shardings an operation requires and which output shardings it produces. KokkosMoE_Partition.hpp
// documents this as public API and adds the shard callables; the planner uses the rules for its router specs.
//
// Why each rule:
//  * token axis: tokens are independent, so any split over data-like axes is exact. Tensor-parallel ranks hold the
//    same tokens (they split the hidden dimension of other layers), so a token split over a tensor axis contradicts
//    the mesh and is rejected rather than silently treated as replicated.
//  * expert axis: top-k, softmax and the normalization need the whole row; a per-shard top-k over a slice of the
//    experts is a different (wrong) function. The reference computed exactly that silently; here it is an error.
//  * BitmapU8: the packed byte axis holds 8 experts per byte; splitting it splits experts (and bytes).
//  * aux loss: a global reduction. Either the inputs are global, or every shard computes a partial with the *global*
//    token count and the caller sums the partials (psum). Using a local row count as T_total is wrong by a factor
//    of the shard count squared.

#include <KokkosMoE_Error.hpp>
#include <KokkosMoE_Mesh.hpp>
#include <KokkosMoE_RouterConfig.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace KokkosMoE {

/// \brief The router operations that have partition rules (KokkosMoE_Router.hpp, KokkosMoE_AuxLoss.hpp).
enum class RouterOp : int {
  Forward = 0,            ///< topk_router: logits, expert_bias -> probs, routing_map, intermediate
  ForwardIndices = 1,     ///< topk_router_indices: logits, expert_bias -> probs, indices, intermediate
  ForwardCompact = 2,     ///< topk_router_compact: logits, expert_bias -> ids, weights
  Backward = 3,           ///< topk_router_backward: routing_map, intermediate, grad_probs -> grad_logits
  BackwardIndices = 4,    ///< topk_router_indices_backward: indices, intermediate, grad_probs -> grad_logits
  BackwardCompact = 5,    ///< topk_router_compact_backward: logits, ids, grad_weights -> grad_logits
  AuxScores = 6,          ///< aux_scores: logits -> scores, routing_map, intermediate
  AuxScoresBackward = 7,  ///< aux_scores_backward: intermediate, grad_scores -> grad_logits
  AuxLoss = 8,            ///< aux_loss: probs, tokens_per_expert -> loss, const_buf
  AuxLossBackward = 9,    ///< aux_loss_backward: const_buf, tokens_per_expert, grad_loss -> grad_probs
};

inline const char* to_string(RouterOp op) noexcept {
  switch (op) {
    case RouterOp::Forward:
      return "topk_router";
    case RouterOp::ForwardIndices:
      return "topk_router_indices";
    case RouterOp::ForwardCompact:
      return "topk_router_compact";
    case RouterOp::Backward:
      return "topk_router_backward";
    case RouterOp::BackwardIndices:
      return "topk_router_indices_backward";
    case RouterOp::BackwardCompact:
      return "topk_router_compact_backward";
    case RouterOp::AuxScores:
      return "aux_scores";
    case RouterOp::AuxScoresBackward:
      return "aux_scores_backward";
    case RouterOp::AuxLoss:
      return "aux_loss";
    case RouterOp::AuxLossBackward:
      return "aux_loss_backward";
  }
  return "unknown";
}

/// \brief How aux_loss handles token-sharded probs (docs/router.md §13).
enum class AuxLossMode : int {
  Auto = 0,          ///< PartialSum when probs' rows are split, global otherwise
  GatherInputs = 1,  ///< require global (replicated) probs: the caller all-gathers the rows first
  PartialSum = 2,    ///< each shard computes Const * sum_c colsum_local[c] * tpe[c] with the global T_total; psum
};

/// \brief The operation and every configuration value its shard callable uses. Copied into the callable.
struct RouterOpSpec {
  RouterOp op = RouterOp::Forward;
  int num_experts = 0;         ///< E of the layer: every shard checks that its expert axis is whole (not aux_loss)
  RouterConfig router;         ///< Forward*, Backward* (router.map_format selects the routing-map form)
  AuxScoresConfig aux_scores;  ///< AuxScores, AuxScoresBackward
  AuxLossConfig aux_loss;      ///< AuxLoss, AuxLossBackward
  AuxLossMode aux_loss_mode = AuxLossMode::Auto;
  std::int64_t global_num_tokens = 0;          ///< AuxLoss: T_total over the whole batch (>= 1), never a local count
  std::vector<std::string> output_token_axes;  ///< AuxLossBackward: the row split of grad_probs (no token input)
};

/// \brief The outcome of a partition rule.
struct ShardingDecision {
  std::vector<std::string> argument_names;  ///< in the operation's argument order
  std::vector<ShardingSpec> arguments;      ///< the argument shardings the operation requires
  std::vector<std::string> output_names;
  std::vector<ShardingSpec> outputs;    ///< the shardings of the outputs
  std::vector<std::string> token_axes;  ///< the mesh axes the token (row) dimension is split over
  std::vector<std::string> psum_axes;   ///< outputs marked partial must be summed over these axes
  std::vector<std::string> resharded;   ///< arguments whose required sharding differs from the given one
  std::string explanation;              ///< one paragraph: what is split, what is replicated, what is reduced
};

namespace Impl {

/// What a tensor dimension means to the rules.
enum class DimKind : std::uint8_t { Token, Expert, Packed, Slot, Column, Pair };

struct OperandDesc {
  std::string name;
  std::vector<DimKind> dims;
};
struct OpDesc {
  std::vector<OperandDesc> args, outs;
};

inline bool map_is_bitmap(const RouterOpSpec& s) {
  return (s.op == RouterOp::AuxScores ? s.aux_scores.map_format : s.router.map_format) == RoutingMapFormat::BitmapU8;
}

inline OpDesc describe(const RouterOpSpec& s) {
  using D = DimKind;
  const OperandDesc logits{"logits", {D::Token, D::Expert}}, bias{"expert_bias", {D::Expert}},
      probs{"probs", {D::Token, D::Expert}}, inter{"intermediate", {D::Token, D::Expert}},
      map{"routing_map", {D::Token, map_is_bitmap(s) ? D::Packed : D::Expert}}, indices{"indices", {D::Token, D::Slot}},
      ids{"ids", {D::Token, D::Slot}}, weights{"weights", {D::Token, D::Slot}},
      grad_probs{"grad_probs", {D::Token, D::Expert}}, grad_logits{"grad_logits", {D::Token, D::Expert}},
      grad_weights{"grad_weights", {D::Token, D::Slot}}, scores{"scores", {D::Token, D::Expert}},
      grad_scores{"grad_scores", {D::Token, D::Expert}}, aux_probs{"probs", {D::Token, D::Column}},
      tpe{"tokens_per_expert", {D::Column}}, loss{"loss", {}}, cbuf{"const_buf", {D::Pair}}, grad_loss{"grad_loss", {}},
      aux_grad{"grad_probs", {D::Token, D::Column}};
  switch (s.op) {
    case RouterOp::Forward:
      return {{logits, bias}, {probs, map, inter}};
    case RouterOp::ForwardIndices:
      return {{logits, bias}, {probs, indices, inter}};
    case RouterOp::ForwardCompact:
      return {{logits, bias}, {ids, weights}};
    case RouterOp::Backward:
      return {{map, inter, grad_probs}, {grad_logits}};
    case RouterOp::BackwardIndices:
      return {{indices, inter, grad_probs}, {grad_logits}};
    case RouterOp::BackwardCompact:
      return {{logits, ids, grad_weights}, {grad_logits}};
    case RouterOp::AuxScores:
      return {{logits}, {scores, map, inter}};
    case RouterOp::AuxScoresBackward:
      return {{inter, grad_scores}, {grad_logits}};
    case RouterOp::AuxLoss:
      return {{aux_probs, tpe}, {loss, cbuf}};
    case RouterOp::AuxLossBackward:
      return {{cbuf, tpe, grad_loss}, {aux_grad}};
  }
  throw InvalidArgument("router_sharding_rule", "op", Rule::ConfigValue,
                        "unknown RouterOp value " + std::to_string(static_cast<int>(s.op)));
}

inline std::string axes_text(const std::vector<std::string>& axes) {
  std::string s;
  for (std::size_t i = 0; i < axes.size(); ++i) s += (i ? ", '" : "'") + axes[i] + "'";
  return s.empty() ? "none" : s;
}

[[noreturn]] inline void sharding_fail(const RouterOpSpec& s, const std::string& param, const std::string& msg) {
  throw InvalidArgument(std::string("router_sharding_rule(") + to_string(s.op) + ")", param, Rule::ShardingRule, msg);
}

/// Axes named by a spec exist and are used once.
inline void check_axes(const RouterOpSpec& s, const Mesh& mesh, const std::string& name, const ShardingSpec& spec) {
  std::vector<std::string> seen;
  auto use = [&](const std::string& a) {
    if (mesh.axis_index(a) < 0)
      sharding_fail(s, name,
                    name + " is sharded over '" + a + "', which is not an axis of the mesh (" + mesh.str() + ")");
    for (const auto& b : seen)
      if (a == b) sharding_fail(s, name, name + " uses mesh axis '" + a + "' twice in " + spec.str());
    seen.push_back(a);
  };
  for (const auto& d : spec.dims)
    for (const auto& a : d) use(a);
  for (const auto& a : spec.partial) use(a);
}

inline void check_token_axes(const RouterOpSpec& s, const Mesh& mesh, const std::string& name,
                             const std::vector<std::string>& axes) {
  for (const auto& a : axes) {
    const int i = mesh.axis_index(a);
    if (i >= 0 && mesh.axes()[i].kind == AxisKind::Tensor)
      sharding_fail(s, name,
                    "the token axis of " + name + " is split over '" + a +
                        "', a tensor-parallel axis; tensor-parallel ranks hold the same tokens, so tokens are "
                        "replicated along '" +
                        a + "': remove it from the token split (any data, fsdp, expert or sequence axis may split it)");
  }
}

inline std::string dim_rule(DimKind k, const std::string& name, const std::string& axes) {
  switch (k) {
    case DimKind::Expert:
      return "the expert axis of " + name + " is split over " + axes +
             "; top-k, softmax and the normalization need all E experts of a row, so a per-shard result would be a "
             "different function. Keep the expert axis whole (all-gather it over " +
             axes + ") and split tokens instead (docs/router.md §13)";
    case DimKind::Packed:
      return "the packed byte axis of the BitmapU8 " + name + " is split over " + axes +
             "; each byte packs 8 experts and a row needs all of them, so it is always replicated: split tokens only";
    case DimKind::Slot:
      return "the top-k slot axis of " + name + " is split over " + axes +
             "; the k selections of a token are normalized together, so keep it whole";
    case DimKind::Column:
      return "the expert-column axis of " + name + " is split over " + axes +
             "; the aux loss pairs every column with its global tokens_per_expert count, so keep it whole "
             "(replicated tokens_per_expert, rows split at most)";
    case DimKind::Pair:
      return name + " is the [2] pair {Const, loss accumulator}; it cannot be split";
    case DimKind::Token:
      break;
  }
  return {};
}

}  // namespace Impl

/// \brief The partition rule of a router operation (docs/router.md §13).
///
/// \param mesh       the device mesh
/// \param spec       the operation and its configuration
/// \param inputs     one ShardingSpec per argument, in the operation's argument order (RouterOp documents it); an
///                   argument's token dimension is dimension 0
/// \returns the required argument shardings (the token split of the first token-bearing argument wins; others are
///          listed in `resharded` when they differ), the output shardings and, for a token-sharded aux loss, the
///          psum axes
/// \throws KokkosMoE::InvalidArgument with Rule::ShardingRule naming the argument and the fix when an expert,
///         packed-bitmap, top-k slot or aux-loss column axis is split, a token axis is split over a tensor-parallel
///         axis, an axis is unknown or repeated, an input holds partial sums, or the argument count or a rank is
///         wrong; Rule::TotalTokensPositive when aux_loss lacks the global token count
inline ShardingDecision router_sharding_rule(const Mesh& mesh, const RouterOpSpec& spec,
                                             const std::vector<ShardingSpec>& inputs) {
  using Impl::DimKind;
  const Impl::OpDesc d = Impl::describe(spec);
  if (inputs.size() != d.args.size()) {
    std::string names;
    for (const auto& a : d.args) names += (names.empty() ? "" : ", ") + a.name;
    Impl::sharding_fail(spec, "inputs",
                        std::string(to_string(spec.op)) + " takes " + std::to_string(d.args.size()) + " arguments (" +
                            names + "); got " + std::to_string(inputs.size()) + " shardings");
  }
  ShardingDecision out;
  bool have_tokens = false;
  for (std::size_t i = 0; i < d.args.size(); ++i) {
    const auto& a = d.args[i];
    const ShardingSpec& in = inputs[i];
    out.argument_names.push_back(a.name);
    if (in.rank() != static_cast<int>(a.dims.size()))
      Impl::sharding_fail(spec, a.name,
                          a.name + " has rank " + std::to_string(a.dims.size()) + "; its sharding " + in.str() +
                              " has rank " + std::to_string(in.rank()));
    Impl::check_axes(spec, mesh, a.name, in);
    const bool partial_ok = spec.op == RouterOp::AuxLossBackward && a.name == "const_buf";
    if (!in.partial.empty() && !partial_ok)
      Impl::sharding_fail(spec, a.name,
                          a.name + " holds partial sums over " + Impl::axes_text(in.partial) +
                              "; reduce (psum) it before " + to_string(spec.op));
    for (std::size_t k = 0; k < a.dims.size(); ++k) {
      if (a.dims[k] == DimKind::Token || in.dims[k].empty()) continue;
      Impl::sharding_fail(spec, a.name, Impl::dim_rule(a.dims[k], a.name, Impl::axes_text(in.dims[k])));
    }
    if (!a.dims.empty() && a.dims[0] == DimKind::Token) {
      Impl::check_token_axes(spec, mesh, a.name, in.dims[0]);
      if (!have_tokens) {
        out.token_axes = in.dims[0];
        have_tokens = true;
      }
    }
  }
  if (spec.op == RouterOp::AuxLossBackward) {
    for (const auto& a : spec.output_token_axes)
      if (mesh.axis_index(a) < 0)
        Impl::sharding_fail(spec, "output_token_axes",
                            "output_token_axes names '" + a + "', not an axis of " + mesh.str());
    Impl::check_token_axes(spec, mesh, "grad_probs", spec.output_token_axes);
    out.token_axes = spec.output_token_axes;
  }
  const bool aux_loss = spec.op == RouterOp::AuxLoss;
  if (aux_loss && spec.global_num_tokens < 1)
    throw InvalidArgument("router_sharding_rule(aux_loss)", "global_num_tokens", Rule::TotalTokensPositive,
                          "aux_loss needs the global token count T_total (>= 1) of the whole batch; got " +
                              std::to_string(spec.global_num_tokens) +
                              ". The local row count of a token shard is wrong (docs/router.md §13)");
  if (aux_loss && spec.aux_loss_mode == AuxLossMode::GatherInputs && !out.token_axes.empty()) {
    out.token_axes.clear();  // the caller all-gathers the rows; every device computes the global loss
  }
  // Required argument shardings: token dimension split like the first token-bearing argument, everything else
  // whole; the AuxLossBackward const_buf is accepted as given (only const_buf[0] = Const is read, equal everywhere).
  for (std::size_t i = 0; i < d.args.size(); ++i) {
    const auto& a = d.args[i];
    ShardingSpec req = ShardingSpec::replicated(static_cast<int>(a.dims.size()));
    if (!a.dims.empty() && a.dims[0] == DimKind::Token) req.dims[0] = out.token_axes;
    if (spec.op == RouterOp::AuxLossBackward && a.name == "const_buf") req = inputs[i];
    if (req != inputs[i]) out.resharded.push_back(a.name);
    out.arguments.push_back(req);
  }
  const bool psum = aux_loss && !out.token_axes.empty();
  if (psum) out.psum_axes = out.token_axes;
  for (const auto& o : d.outs) {
    out.output_names.push_back(o.name);
    ShardingSpec s = ShardingSpec::replicated(static_cast<int>(o.dims.size()));
    if (!o.dims.empty() && o.dims[0] == DimKind::Token) s.dims[0] = out.token_axes;
    if (psum) s.partial = out.psum_axes;
    out.outputs.push_back(s);
  }
  // Explanation.
  std::string e = std::string(to_string(spec.op)) + " on " + mesh.str() + ": ";
  if (out.token_axes.empty())
    e += "tokens are whole on every device (computed redundantly)";
  else
    e += "tokens split over " + Impl::axes_text(out.token_axes) + " (" +
         std::to_string(num_shards(mesh, out.token_axes)) + " shards, independent rows, no collective)";
  std::vector<std::string> repl;
  for (const auto& a : mesh.axes()) {
    bool used = false;
    for (const auto& t : out.token_axes) used = used || t == a.name;
    if (!used) repl.push_back(a.name);
  }
  if (!repl.empty()) e += "; replicated along " + Impl::axes_text(repl);
  if (spec.op != RouterOp::AuxLoss && spec.op != RouterOp::AuxLossBackward)
    e += "; the expert axis is whole" +
         std::string(Impl::map_is_bitmap(spec) ? " and the BitmapU8 bytes replicated" : "");
  if (psum)
    e += "; each shard computes Const * sum_c colsum_local[c] * tpe[c] with the global T_total = " +
         std::to_string(spec.global_num_tokens) + ", then loss and const_buf[1] are summed (psum) over " +
         Impl::axes_text(out.psum_axes) + "; const_buf[0] (Const) is identical on every shard";
  else if (aux_loss)
    e += "; global inputs, T_total = " + std::to_string(spec.global_num_tokens) +
         (spec.aux_loss_mode == AuxLossMode::GatherInputs ? " (rows all-gathered first)" : "");
  if (spec.op == RouterOp::AuxLossBackward)
    e += "; shard-local: every shard fills its rows with the global Const and tokens_per_expert";
  if (!out.resharded.empty()) e += "; resharded to the required layout: " + Impl::axes_text(out.resharded);
  out.explanation = e;
  return out;
}

}  // namespace KokkosMoE

#endif
