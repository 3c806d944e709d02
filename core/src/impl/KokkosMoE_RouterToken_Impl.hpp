/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTERTOKEN_IMPL_HPP
#define KOKKOSMOE_ROUTERTOKEN_IMPL_HPP

// The per-token routing algorithm (docs/router.md §5.2) behind the public per-token functions and the portable
// kernels: one implementation, parameterized by a "loops" object that says who works on the row (one thread, a
// team's threads, a team's threads and lanes, or one thread's lanes). Each loops object maps the same four
// primitives (for_each, max and sum reductions, single, barrier) onto Kokkos' nested policies; the host variants
// reduce sequentially in expert order, which is what makes host results independent of the thread count.

#include <KokkosMoE_RouterConfig.hpp>

#include <Kokkos_Core.hpp>
#include <kokkos_ext/KokkosMoE_Float16.hpp>

#include <impl/KokkosMoE_RouterMath.hpp>

#include <cstddef>
#include <cstdint>

namespace KokkosMoE {
namespace Impl {

/// Validated per-token routing parameters (the device-side part of RouterConfig, with E).
struct TokenParams {
  int num_experts = 1;
  int topk = 1;
  ScoreFunction score_function = ScoreFunction::Softmax;
  bool use_pre_softmax = false;
  int num_groups = 1;  ///< 1 when ungrouped
  int group_topk = 0;  ///< 0: ungrouped
  float scaling_factor = 1.0f;
  bool has_bias = false;

  KOKKOS_INLINE_FUNCTION bool grouped() const { return group_topk > 0; }
  KOKKOS_INLINE_FUNCTION int group_size() const { return num_experts / num_groups; }
  KOKKOS_INLINE_FUNCTION bool softmax_pre() const {
    return score_function == ScoreFunction::Softmax && use_pre_softmax;
  }
  KOKKOS_INLINE_FUNCTION bool softmax_post() const {
    return score_function == ScoreFunction::Softmax && !use_pre_softmax;
  }
};

/// Lowers an already validated config (no checks here: the caller validated at the boundary).
inline TokenParams token_params(const RouterConfig& c, int num_experts, bool has_bias) {
  TokenParams p;
  p.num_experts = num_experts;
  p.topk = c.topk;
  p.score_function = c.score_function;
  p.use_pre_softmax = c.score_function == ScoreFunction::Softmax && c.use_pre_softmax;
  p.group_topk = c.group_topk > 0 ? c.group_topk : 0;
  p.num_groups = p.group_topk > 0 ? c.num_groups : 1;
  p.scaling_factor = c.scaling_factor;
  p.has_bias = has_bias;
  return p;
}

/// Selection slots of the parallel top-k: expert e belongs to slot e % kTopkSlots, and each slot keeps its
/// kSlotKeys best remaining keys, sorted, in the workspace (after the k selected keys).
constexpr int kTopkSlots = 32;
constexpr int kSlotKeys = 4;

/// Keys a top-k selection of k needs: the k selected ones, then the slot lists of the parallel selection.
KOKKOS_INLINE_FUNCTION constexpr int topk_key_count(int k) { return k + kTopkSlots * kSlotKeys; }

/// Per-token workspace: act [E] (the activation; the raw logit for Softmax post), score [E] (selection score, only
/// with a bias), group [G] and gsel [G] (grouped only), keys [k] (the selected packed keys in slot order).
template <class MemorySpace>
struct TokenWork {
  template <class T>
  using Row = Kokkos::View<T*, MemorySpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  Row<float> act;
  Row<float> score;
  Row<float> group;
  Row<int> gsel;
  Row<std::uint64_t> keys;

  KOKKOS_DEFAULTED_FUNCTION TokenWork() = default;
  KOKKOS_INLINE_FUNCTION TokenWork(const Row<float>& act_, const Row<float>& score_, const Row<float>& group_,
                                   const Row<int>& gsel_, const Row<std::uint64_t>& keys_)
      : act(act_), score(score_), group(group_), gsel(gsel_), keys(keys_) {}

  /// Carves the rows out of a scratch handle (member.team_scratch(l) or member.thread_scratch(l)).
  template <class ScratchHandle>
  KOKKOS_INLINE_FUNCTION TokenWork(const ScratchHandle& h, const TokenParams& p) : TokenWork(h, p, key_count(p)) {}
  /// The same with num_keys keys (serial_key_count(p) where only the Serial variant runs on it).
  template <class ScratchHandle>
  KOKKOS_INLINE_FUNCTION TokenWork(const ScratchHandle& h, const TokenParams& p, int num_keys)
      : act(h, p.num_experts),
        score(h, p.has_bias ? p.num_experts : 0),
        group(h, p.grouped() ? p.num_groups : 0),
        gsel(h, p.grouped() ? p.num_groups : 0),
        keys(h, num_keys) {}

  /// Scratch bytes the scratch-handle constructor takes.
  static std::size_t shmem_size(const TokenParams& p) { return shmem_size(p, key_count(p)); }
  static std::size_t shmem_size(const TokenParams& p, int num_keys) {
    const int G = p.grouped() ? p.num_groups : 0;
    return Row<float>::shmem_size(p.num_experts) + Row<float>::shmem_size(p.has_bias ? p.num_experts : 0) +
           Row<float>::shmem_size(G) + Row<int>::shmem_size(G) + Row<std::uint64_t>::shmem_size(num_keys);
  }
  KOKKOS_INLINE_FUNCTION static int key_count(const TokenParams& p) { return topk_key_count(p.topk); }
  /// Keys the Serial variant uses: the k selected ones (its selection is one pass with an insertion buffer).
  KOKKOS_INLINE_FUNCTION static int serial_key_count(const TokenParams& p) { return p.topk; }

  /// Selection score of expert e (docs/router.md §5.1: the activation plus the bias, if any).
  KOKKOS_INLINE_FUNCTION float s(const TokenParams& p, int e) const { return p.has_bias ? score(e) : act(e); }
  /// Packed key of expert e if it is eligible (its group is selected), else 0.
  KOKKOS_INLINE_FUNCTION std::uint64_t eligible_key(const TokenParams& p, int e) const {
    return (!p.grouped() || gsel(e / p.group_size())) ? pack_key(s(p, e), e) : std::uint64_t(0);
  }
};

// ---------------------------------------------------------------------------------------------------------------
// Loops: who works on the row
// ---------------------------------------------------------------------------------------------------------------
struct SerialLoops {
  static constexpr bool private_lanes = false;
  KOKKOS_INLINE_FUNCTION bool sequential() const { return true; }
  template <class F>
  KOKKOS_INLINE_FUNCTION void for_each(int n, const F& f) const {
    for (int i = 0; i < n; ++i) f(i);
  }
  /// Max of f(i) from Kokkos' Max identity (the lowest finite float), NaN never replacing the running value.
  template <class F>
  KOKKOS_INLINE_FUNCTION float max_float(int n, const F& f) const {
    float acc = Kokkos::reduction_identity<float>::max();
    for (int i = 0; i < n; ++i) {
      const float x = f(i);
      if (x > acc) acc = x;
    }
    return acc;
  }
  template <class F>
  KOKKOS_INLINE_FUNCTION float sum_float(int n, const F& f) const {
    float acc = 0.0f;
    for (int i = 0; i < n; ++i) acc += f(i);
    return acc;
  }
  template <class F>
  KOKKOS_INLINE_FUNCTION std::uint64_t max_key(int n, const F& f) const {
    std::uint64_t acc = 0;
    for (int i = 0; i < n; ++i) {
      const std::uint64_t k = f(i);
      if (k > acc) acc = k;
    }
    return acc;
  }
  template <class F>
  KOKKOS_INLINE_FUNCTION void single(const F& f) const {
    f();
  }
  KOKKOS_INLINE_FUNCTION void barrier() const {}
};

/// Shared by the team-level loops: Range is TeamThreadRange or TeamVectorRange.
template <class Member, class Derived>
struct TeamLoopsBase {
  static constexpr bool private_lanes = false;
  const Member& m;
  template <class F>
  KOKKOS_INLINE_FUNCTION void for_each(int n, const F& f) const {
    Kokkos::parallel_for(Derived::range(m, n), f);
  }
  template <class F>
  KOKKOS_INLINE_FUNCTION float max_float(int n, const F& f) const {
    float r = 0.0f;
    Kokkos::parallel_reduce(
        Derived::range(m, n),
        [&](const int i, float& acc) {
          const float x = f(i);
          if (x > acc) acc = x;
        },
        Kokkos::Max<float>(r));
    return r;
  }
  template <class F>
  KOKKOS_INLINE_FUNCTION float sum_float(int n, const F& f) const {
    float r = 0.0f;
    Kokkos::parallel_reduce(
        Derived::range(m, n), [&](const int i, float& acc) { acc += f(i); }, r);
    return r;
  }
  template <class F>
  KOKKOS_INLINE_FUNCTION std::uint64_t max_key(int n, const F& f) const {
    std::uint64_t r = 0;
    Kokkos::parallel_reduce(
        Derived::range(m, n),
        [&](const int i, std::uint64_t& acc) {
          const std::uint64_t k = f(i);
          if (k > acc) acc = k;
        },
        Kokkos::Max<std::uint64_t>(r));
    return r;
  }
  template <class F>
  KOKKOS_INLINE_FUNCTION void single(const F& f) const {
    Kokkos::single(Kokkos::PerTeam(m), f);
  }
  KOKKOS_INLINE_FUNCTION void barrier() const { m.team_barrier(); }
};

template <class Member>
struct TeamLoops : TeamLoopsBase<Member, TeamLoops<Member>> {
  KOKKOS_INLINE_FUNCTION bool sequential() const { return this->m.team_size() == 1; }
  KOKKOS_INLINE_FUNCTION static auto range(const Member& m, int n) { return Kokkos::TeamThreadRange(m, n); }
};

template <class Member>
struct TeamVectorLoops : TeamLoopsBase<Member, TeamVectorLoops<Member>> {
  KOKKOS_INLINE_FUNCTION bool sequential() const { return false; }
  KOKKOS_INLINE_FUNCTION static auto range(const Member& m, int n) { return Kokkos::TeamVectorRange(m, n); }
};

/// One team thread's vector lanes: the team-level reductions over ThreadVectorRange, with single(PerThread). Kokkos
/// ends single(PerThread) with a lane synchronization, so a value written in single() is visible to the lanes
/// afterwards; a ThreadVectorRange reduction ends with shuffles only, so barrier() synchronizes the lanes.
///
/// private_lanes: code at the thread level runs on every vector lane with the lane's own copy of its locals (on a
/// device, where lanes are hardware threads) or once (on the host, where one thread runs every lane's iterations),
/// and a lane runs the same iterations of two ThreadVectorRanges of the same length. The parallel top-k keeps per
/// lane state in locals on that basis (select_topk_lanes).
template <class Member>
struct ThreadVectorLoops : TeamLoopsBase<Member, ThreadVectorLoops<Member>> {
  static constexpr bool private_lanes = true;
  KOKKOS_INLINE_FUNCTION bool sequential() const { return false; }
  KOKKOS_INLINE_FUNCTION static auto range(const Member& m, int n) { return Kokkos::ThreadVectorRange(m, n); }
  template <class F>
  KOKKOS_INLINE_FUNCTION void single(const F& f) const {
    Kokkos::single(Kokkos::PerThread(this->m), f);
  }
  /// An empty single(PerThread): on a device it synchronizes the thread's vector lanes (__syncwarp over them on
  /// Cuda), so a lane's read of scratch before the barrier is ordered before another lane's write after it (without
  /// it only the reduction's shuffles ordered them, which compute-sanitizer's racecheck reports as warp-synchronous
  /// hazards).
  KOKKOS_INLINE_FUNCTION void barrier() const {
    Kokkos::single(Kokkos::PerThread(this->m), []() {});
  }
  /// The number of lanes that run iterations of a range of n: min(n, vector length) on a device, 1 on the host.
  KOKKOS_INLINE_FUNCTION int lanes(int n) const {
    int count = 0;
    Kokkos::parallel_reduce(
        range(this->m, n), [&](const int, int& c) { c = 1; }, count);
    return count;
  }
};

// ---------------------------------------------------------------------------------------------------------------
// The algorithm
// ---------------------------------------------------------------------------------------------------------------

/// The per-token scalars of the weights (docs/router.md §5.2 step 4) and the smallest selected key.
struct TokenChoice {
  enum Mode : int { Plain = 0, Normalize = 1, Post = 2 };
  std::uint64_t kth = 0;
  float norm = 1.0f;      ///< Normalize: the denominator; Post: 1 / sum
  float post_max = 0.0f;  ///< Post: max of the selected logits
  int mode = Plain;
  /// Unscaled weight of a selected expert with activation y.
  KOKKOS_INLINE_FUNCTION float weight(float y) const {
    if (mode == Post) return softmax_term(y, post_max) * norm;
    return mode == Normalize ? y / norm : y;
  }
};

/// Keeps list[0..kSlotKeys) the largest keys offered, descending (0 = empty entry).
template <class Keys>
KOKKOS_INLINE_FUNCTION void slot_insert(const Keys& keys, int base, std::uint64_t key) {
  if (key <= keys(base + kSlotKeys - 1)) return;
  int pos = kSlotKeys - 1;
  for (; pos > 0 && keys(base + pos - 1) < key; --pos) keys(base + pos) = keys(base + pos - 1);
  keys(base + pos) = key;
}

/// A short sorted list of the largest keys offered (0 = empty entry), kept in registers: constant indices only.
struct KeyList {
  std::uint64_t key[kSlotKeys] = {};
  /// Inserts k if it is among the kSlotKeys largest; returns whether a non-zero key dropped out (k or the last).
  KOKKOS_INLINE_FUNCTION bool offer(std::uint64_t k) {
    std::uint64_t out = k;
    if (k > key[kSlotKeys - 1]) {
      out = key[kSlotKeys - 1];
      key[kSlotKeys - 1] = k;
      for (int q = kSlotKeys - 1; q > 0; --q) {
        if (key[q] > key[q - 1]) {
          const std::uint64_t t = key[q - 1];
          key[q - 1] = key[q];
          key[q] = t;
        }
      }
    }
    return out != 0;
  }
  KOKKOS_INLINE_FUNCTION void pop() {
    for (int q = 0; q + 1 < kSlotKeys; ++q) key[q] = key[q + 1];
    key[kSlotKeys - 1] = 0;
  }
};

/// select_topk for loops with private lanes: each lane keeps the kSlotKeys largest untaken keys of its own experts
/// in registers (KeyList), and each of the k rounds is one max reduction over the lanes' list heads, after which
/// the lane that holds the maximum takes it. A lane whose list ran empty while keys below it remain flags the round
/// (kRefill, above every key) and rescans its experts for the keys below the last one it gave up. Same keys, same
/// slot order as the other methods.
template <class Loops, class KeyOf, class Keys>
KOKKOS_INLINE_FUNCTION std::uint64_t select_topk_lanes(const Loops& L, int n, int k, const KeyOf& key_of,
                                                       const Keys& keys) {
  constexpr std::uint64_t kRefill = ~std::uint64_t(0);  // above every key (+inf's order key is 0xff800000)
  KeyList list;
  std::uint64_t floor = kRefill;  // the last key this lane gave up; the list holds its largest keys below
  bool more = false;              // keys below the list remain among this lane's experts
  L.for_each(n, [&](const int e) { more = list.offer(key_of(e)) || more; });
  const int lanes = L.lanes(n);
  std::uint64_t best = 0;
  for (int i = 0; i < k; ++i) {
    best = L.max_key(lanes, [&](const int) { return list.key[0] == 0 && more ? kRefill : list.key[0]; });
    if (best == kRefill) {
      const bool refill = list.key[0] == 0 && more;
      if (refill) more = false;
      L.for_each(n, [&](const int e) {
        if (!refill) return;
        const std::uint64_t key = key_of(e);
        if (key < floor) more = list.offer(key) || more;
      });
      best = L.max_key(lanes, [&](const int) { return list.key[0]; });
    }
    if (list.key[0] == best) {  // the one lane that holds it
      keys(i) = best;
      floor = best;
      list.pop();
    }
  }
  L.barrier();
  return best;
}

/// select_topk for the other loops: sequential loops make one pass with an insertion buffer; parallel ones split the
/// experts into kTopkSlots slots, each with a short sorted list of its best keys in the workspace, and take k times
/// the best list head (one small reduction per round), refilling a list from its slot only when it runs empty.
template <class Loops, class KeyOf, class Keys>
KOKKOS_INLINE_FUNCTION std::uint64_t select_topk_slots(const Loops& L, int n, int k, const KeyOf& key_of,
                                                       const Keys& keys) {
  if (L.sequential()) {
    L.single([&]() {
      int filled = 0;
      for (int e = 0; e < n; ++e) {
        const std::uint64_t key = key_of(e);
        if (key == 0 || (filled == k && key <= keys(k - 1))) continue;
        int pos = filled < k ? filled++ : k - 1;
        for (; pos > 0 && keys(pos - 1) < key; --pos) keys(pos) = keys(pos - 1);
        keys(pos) = key;
      }
    });
    L.barrier();
    return keys(k - 1);
  }
  const int slots = n < kTopkSlots ? n : kTopkSlots;
  // each slot's best kSlotKeys keys below `below`, into its list
  auto fill_slot = [&](const int j, const std::uint64_t below) {
    const int base = k + j * kSlotKeys;
    for (int q = 0; q < kSlotKeys; ++q) keys(base + q) = 0;
    for (int e = j; e < n; e += slots) {
      const std::uint64_t key = key_of(e);
      if (key < below) slot_insert(keys, base, key);
    }
  };
  L.for_each(slots, [&](const int j) { fill_slot(j, ~std::uint64_t(0)); });
  L.barrier();
  std::uint64_t best = 0;
  for (int i = 0; i < k; ++i) {
    best = L.max_key(slots, [&](const int j) { return keys(k + j * kSlotKeys); });
    L.barrier();  // every thread has read the list heads before one of them changes
    L.single([&]() {
      keys(i) = best;
      const int j = key_index(best) % slots, base = k + j * kSlotKeys;
      for (int q = 0; q + 1 < kSlotKeys; ++q) keys(base + q) = keys(base + q + 1);
      keys(base + kSlotKeys - 1) = 0;
      if (keys(base) == 0) fill_slot(j, best);
    });
    L.barrier();
  }
  return best;
}

/// Fills keys(0..k) with the k largest non-zero keys among key_of(0..n), descending, and returns the k-th. Keys are
/// unique (they embed the index), so every method gives the same slots.
template <class Loops, class KeyOf, class Keys>
KOKKOS_INLINE_FUNCTION std::uint64_t select_topk(const Loops& L, int n, int k, const KeyOf& key_of, const Keys& keys) {
  if constexpr (Loops::private_lanes)
    return select_topk_lanes(L, n, k, key_of, keys);
  else
    return select_topk_slots(L, n, k, key_of, keys);
}

/// Row softmax of load(e) into row (max, then the sum of exp(x - M), then a multiply by 1 / sum).
template <class Loops, class Load, class Row>
KOKKOS_INLINE_FUNCTION void row_softmax(const Loops& L, int n, const Load& load, const Row& row) {
  const float M = L.max_float(n, [&](const int e) {
    const float x = load(e);
    row(e) = x;
    return x;
  });
  const float sum = L.sum_float(n, [&](const int e) { return softmax_term(row(e), M); });
  const float inv = 1.0f / sum;
  L.for_each(n, [&](const int e) { row(e) = softmax_term(row(e), M) * inv; });
}

/// Sub-scans per group in group_scores: with parallel loops and kg <= kSlotKeys, a group's experts are split over up
/// to kTopkSlots / G scans (their lists fill w.keys, which the selection only uses later).
template <class Loops>
KOKKOS_INLINE_FUNCTION int group_sub_scans(const Loops& L, const TokenParams& p) {
  const int G = p.num_groups, kg = p.topk / p.group_topk;
  if (L.sequential() || kg > kSlotKeys || G * 2 > kTopkSlots) return 1;
  const int S = kTopkSlots / G;
  return S < p.group_size() ? S : p.group_size();
}

/// work.group(g) = the sum of group g's kg = topk / group_topk best selection scores, added best first (§5.3).
template <class Loops, class Work>
KOKKOS_INLINE_FUNCTION void group_scores(const Loops& L, const TokenParams& p, const Work& w) {
  const int G = p.num_groups, gs = p.group_size(), kg = p.topk / p.group_topk;
  auto key_of = [&](const int e) { return pack_key(w.s(p, e), e); };
  if (kg > kSlotKeys) {  // kg passes over the group, each for the best key below the previous one
    L.for_each(G, [&](const int g) {
      float sum = 0.0f;
      std::uint64_t prev = ~std::uint64_t(0);
      for (int j = 0; j < kg; ++j) {
        std::uint64_t best = 0;
        for (int e = g * gs; e < g * gs + gs; ++e) {
          const std::uint64_t key = key_of(e);
          if (key < prev && key > best) best = key;
        }
        sum = group_score_add(sum, j, w.s(p, key_index(best)));
        prev = best;
      }
      w.group(g) = sum;
    });
    return;
  }
  const int S = group_sub_scans(L, p);
  // scan s of group g keeps the best keys of experts g * gs + s, + S, ... in registers
  auto scan = [&](const int g, const int s) {
    KeyList list;
    for (int e = g * gs + s; e < g * gs + gs; e += S) list.offer(key_of(e));
    return list;
  };
  if (S == 1) {
    L.for_each(G, [&](const int g) {
      const KeyList list = scan(g, 0);
      float sum = 0.0f;
      for (int j = 0; j < kSlotKeys; ++j)  // constant indices: the list stays in registers
        if (j < kg) sum = group_score_add(sum, j, w.s(p, key_index(list.key[j])));
      w.group(g) = sum;
    });
    return;
  }
  L.for_each(G * S, [&](const int i) {
    const KeyList list = scan(i / S, i % S);
    for (int j = 0; j < kSlotKeys; ++j)
      if (j < kg) w.keys(i * kg + j) = list.key[j];
  });
  L.barrier();
  // merge the S lists of a group, best first
  L.for_each(G, [&](const int g) {
    float sum = 0.0f;
    std::uint64_t prev = ~std::uint64_t(0);
    for (int j = 0; j < kg; ++j) {
      std::uint64_t best = 0;
      for (int c = g * S * kg; c < (g + 1) * S * kg; ++c) {
        const std::uint64_t key = w.keys(c);
        if (key < prev && key > best) best = key;
      }
      sum = group_score_add(sum, j, w.s(p, key_index(best)));
      prev = best;
    }
    w.group(g) = sum;
  });
}

/// Steps 1-4 of docs/router.md §5.2 for one token: activations into work.act (and selection scores into
/// work.score), group-limited eligibility, the top-k keys into work.keys (slot order) and the weight scalars.
template <class Loops, class LogitsRow, class BiasRow, class Work>
KOKKOS_INLINE_FUNCTION TokenChoice route_token(const Loops& L, const TokenParams& p, const LogitsRow& x,
                                               const BiasRow& b, const Work& w) {
  const int E = p.num_experts;
  const int k = p.topk;
  const ScoreFunction f = p.score_function;

  // 1. activations and selection scores (§5.1)
  if (p.softmax_pre()) {
    row_softmax(
        L, E, [&](const int e) { return to_float(x(e)); }, w.act);
  } else if (f == ScoreFunction::Softmax) {
    L.for_each(E, [&](const int e) { w.act(e) = to_float(x(e)); });
  } else {
    const bool sig = f == ScoreFunction::Sigmoid;
    L.for_each(E, [&](const int e) {
      const float xe = to_float(x(e));
      const float y = sig ? sigmoid(xe) : sqrt_softplus(xe);
      w.act(e) = y;
      if (p.has_bias) w.score(e) = y + to_float(b(e));
    });
  }
  L.barrier();

  // 2. group-limited eligibility (§5.3)
  if (p.grouped()) {
    const int G = p.num_groups;
    group_scores(L, p, w);
    L.barrier();
    // a group is selected when fewer than group_topk groups outrank it (group keys are unique)
    L.for_each(G, [&](const int g) {
      const std::uint64_t mine = pack_key(w.group(g), g);
      int above = 0;
      for (int h = 0; h < G; ++h) above += pack_key(w.group(h), h) > mine ? 1 : 0;
      w.gsel(g) = above < p.group_topk ? 1 : 0;
    });
    L.barrier();
  }

  // 3. top-k over the eligible experts (§6: value descending, then the lower index)
  TokenChoice c;
  c.kth = select_topk(
      L, E, k, [&](const int e) { return w.eligible_key(p, e); }, w.keys);

  // 4. weight scalars, computed by every thread in slot order
  auto y_of = [&](const int i) { return w.act(key_index(w.keys(i))); };
  if (p.softmax_post()) {
    c.mode = TokenChoice::Post;
    float M = y_of(0);
    for (int i = 1; i < k; ++i) M = y_of(i) > M ? y_of(i) : M;
    float sum = 0.0f;
    for (int i = 0; i < k; ++i) sum += softmax_term(y_of(i), M);
    c.post_max = M;
    c.norm = 1.0f / sum;
  } else if (f != ScoreFunction::Softmax && k > 1) {
    c.mode = TokenChoice::Normalize;
    float sum = 0.0f;
    for (int i = 0; i < k; ++i) sum += y_of(i);
    c.norm = normalization_denominator(sum);
  }
  return c;
}

}  // namespace Impl
}  // namespace KokkosMoE

#endif
