/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_EPCONFIG_HPP
#define KOKKOSMOE_EPCONFIG_HPP

/// \file KokkosMoE_EpConfig.hpp
/// \brief The value types of the expert-parallel layer: group configuration, layouts, modes, status
/// (contract: docs/ep.md §2, §4, §5). Plain C++, no Kokkos.

#include <cstdint>
#include <string>

namespace KokkosMoE {

/// \brief Receive layout of dispatch (docs/ep.md §4).
enum class RecvLayout : int {
  ExpertMajor = 0,       ///< one slab per local expert, pad(count, expert_alignment) rows each (grouped GEMM)
  ExpertMajorFixed = 1,  ///< expert l owns rows [l*R*B, (l+1)*R*B) (decode; never needs exact sizes)
};

/// \brief How combine weighs the expert outputs of a token's slots (docs/ep.md §3.3).
enum class CombineMode : int {
  Sum = 0,       ///< y[t] = sum over valid k of out[slot(t,k)] (the caller already applied the weights)
  Weighted = 1,  ///< y[t] = sum over valid k of topk_w[t,k] * out[slot(t,k)]
};

/// \brief How EpGroupConfig::max_sms bounds the EP kernels of a group (docs/ep.md §13).
enum class SmCap : int {
  Auto = 0,       ///< Partition where the device makes SM partitions, else Teams
  Partition = 1,  ///< Kokkos::Cuda: the group's kernels run on its own stream in an SM partition (a CUDA green
                  ///< context) of at most max_sms SMs, each with its uncapped grid, so every SM given runs full
  Teams = 2,      ///< every kernel launches at most max_sms teams, each taking several work items in turn
};

/// \brief A field's former name, kept for source compatibility (EpGroupConfig::hidden, ::top_k): assigning or
/// reading it warns (deprecated), copying the config does not. EpGroup takes its value where the field it names is 0.
struct DeprecatedFieldName {
  int value = 0;
  [[deprecated("EpGroupConfig: hidden is now hidden_size, top_k is now topk")]] DeprecatedFieldName& operator=(int v) {
    value = v;
    return *this;
  }
  [[deprecated("EpGroupConfig: hidden is now hidden_size, top_k is now topk")]] operator int() const { return value; }
};

/// \brief The shapes and mode of an EP group. Every rank of the group must pass the same values. The names are the
/// router's and the planner's (topk, hidden_size); the former hidden and top_k still compile, with a warning.
struct EpGroupConfig {
  int ep_size = 0;                   ///< R: ranks of the group (= the communicator's size)
  int num_experts = 0;               ///< E, a multiple of ep_size; expert e lives on rank e / (E / R)
  int hidden_size = 0;               ///< H, elements per token row
  int topk = 0;                      ///< K, slots per token, 1 <= K <= num_experts
  int max_tokens_per_rank = 0;       ///< B, the most tokens one rank routes per step
  int max_recv_tokens_per_rank = 0;  ///< receive capacity in rows (ExpertMajor); 0 selects eager mode
  int expert_alignment = 1;          ///< A, rows per expert slab are padded to a multiple of it (ExpertMajor)
  bool drop_on_overflow = false;     ///< capacity mode: drop slots past the capacity instead of failing
  RecvLayout layout = RecvLayout::ExpertMajor;
  /// The SM cap (docs/ep.md §13): every EP kernel of the group runs at most this many teams, so on Cuda it occupies
  /// at most this many streaming multiprocessors and leaves the others to concurrent compute; on a host space, at
  /// most this many threads. In [1, the execution space's count] (SMs of the device, or concurrency()); -1: no cap.
  /// A per-rank resource setting: the ranks may pass different caps.
  int max_sms = -1;
  /// How the cap is kept (per rank, as max_sms). Partition throws InvalidArgument (Rule::ConfigValue, naming sm_cap)
  /// where the execution space or the driver has no SM partitions or max_sms is below their granularity.
  SmCap sm_cap = SmCap::Auto;
  /// Sets of the group's buffers for remote rows (window regions or message stages; docs/ep.md §14), in [1, 8]. Every
  /// operation of the group's handles that moves rows takes a free set for its duration; a split send holds its set
  /// until its hook runs. So with n sets, at most n split operations of different handles are pending at once, and an
  /// operation of another handle that finds every set held throws InvalidArgument (Rule::HandleState) naming both
  /// handles. Two layers whose sends overlap take 2. Each set costs buffer_bytes() / wire_buffers.
  int wire_buffers = 1;
  /// Deprecated: hidden_size and topk under their former names. EpGroup reads one where its new field is 0 and
  /// throws InvalidArgument (Rule::ConfigValue) where both are set and differ; EpGroup::config() holds both.
  DeprecatedFieldName hidden;
  DeprecatedFieldName top_k;
};

/// \brief The groups ep_decode_dispatch serves (docs/ep.md §15), besides layout = ExpertMajorFixed.
struct EpDecodeLimits {
  static constexpr int max_tokens_per_rank = 256;  ///< small batches: a token row per (token, rank reached)
  static constexpr int max_ep_size = 64;           ///< a token's destination ranks are one 64-bit mask
  static constexpr int max_experts = 4096;         ///< the send kernel's histogram lives in team scratch
};

/// \brief Options of one layer's handle.
struct EpHandleOptions {
  /// Training: the step's backward must run (dispatch backward last) before the handle takes a new layout, so that
  /// one handle serving two layers is an error instead of a silently wrong gradient. Off for inference.
  bool training = true;
  std::string name;  ///< named in error messages (e.g. "layer 3")
};

/// \brief What the last layout found, read at a synchronization (docs/ep.md §5). Capacity mode only drops; eager
/// mode reports its demand and no drops.
struct EpStatus {
  int recv_demand = 0;         ///< receive rows this rank's layout needed before any drop (padded to the alignment;
                               ///< fixed layout: the most slots one of its local experts received)
  int dropped_slots = 0;       ///< sender side: this rank's own (token, k) slots that were dropped for capacity
  int dropped_recv_slots = 0;  ///< receiver side: slots addressed to this rank's experts that did not fit
};

/// \brief "expert-major", "expert-major-fixed".
inline const char* to_string(RecvLayout l) noexcept {
  return l == RecvLayout::ExpertMajor ? "expert-major" : "expert-major-fixed";
}
/// \brief "auto", "partition", "teams".
inline const char* to_string(SmCap c) noexcept {
  return c == SmCap::Auto ? "auto" : c == SmCap::Partition ? "partition" : "teams";
}
/// \brief "sum", "weighted".
inline const char* to_string(CombineMode m) noexcept { return m == CombineMode::Sum ? "sum" : "weighted"; }

}  // namespace KokkosMoE

#endif
