/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_TEST_EPINTERLEAVE_HPP
#define KOKKOSMOE_TEST_EPINTERLEAVE_HPP

// Two layers in flight on one communicator (docs/ep.md §2, §14; §12 case 2): each layer's step in operations that
// scenarios string together in any order, the interleavings, and each layer's outputs against the oracle and, bit
// for bit, against the same step run alone. Used by tstEpInterleave.cpp (MPI ranks) and tstEpLoopback.cpp (threads).

#include <EpCases.hpp>
#include <EpStep.hpp>

#include <cstring>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace KokkosMoE::Test {

/// One step of one layer, in operations the scenarios call in any order. The receive Views are sized from the
/// oracle before the layout, so no operation allocates between two others (loopback peers may be waiting).
template <class Exec, class Scalar>
struct Layer {
  using Mem = typename Exec::memory_space;
  using Rows = Kokkos::View<Scalar**, Kokkos::LayoutRight, Mem>;
  using Floats = Kokkos::View<float*, Mem>;
  using Weights = Kokkos::View<float**, Kokkos::LayoutRight, Mem>;
  static constexpr bool bf16 = std::is_same<Scalar, bf16_t>::value;

  EpGroup<Exec>& group;
  EpHandle<Exec> handle;
  std::string name;
  CombineMode mode;
  std::vector<RankInputs> all;
  StepOutputs want;
  int me, L, N;
  StepViews<Exec, Scalar> sv;
  Rows recv_x, out, grad_out, grad_recv_x, y, grad_y, grad_x;
  Floats recv_w, grad_recv_w;
  Weights grad_wc, grad_wd;
  std::optional<EpReceiveHook<Exec>> pending;

  Layer(const Exec& exec, EpGroup<Exec>& g, const std::string& n, Routing routing, CombineMode m, std::uint64_t seed)
      : group(g),
        handle(g.make_handle({true, n})),
        name(n),
        mode(m),
        all(group_inputs(g.config(), routing, seed, bf16, true)),
        want(expected_step(g.config(), all, g.rank(), m, bf16)),
        me(g.rank()),
        L(g.num_local_experts()),
        N(want.recv_rows),
        sv(exec, g.config(), all[g.rank()]) {
    const int H = g.config().hidden_size, K = g.config().topk, T = all[me].T;
    recv_x = Rows("recv_x", N, H);
    out = Rows("out", N, H);
    grad_out = Rows("grad_out", N, H);
    grad_recv_x = Rows("grad_recv_x", N, H);
    recv_w = Floats("recv_w", N);
    grad_recv_w = Floats("grad_recv_w", N);
    y = Rows("y", T, H);
    grad_y = Rows("grad_y", T, H);
    grad_x = Rows("grad_x", T, H);
    grad_wc = Weights("grad_wc", T, K);
    grad_wd = Weights("grad_wd", T, K);
    auto hg = Kokkos::create_mirror_view(grad_y);
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h) hg(t, h) = Scalar(upstream_grad(me, t, h, bf16));
    Kokkos::deep_copy(exec, grad_y, hg);
    for (const Rows& v : {recv_x, grad_out, y, grad_x}) Kokkos::deep_copy(exec, v, Scalar(kSentinel));
    Kokkos::deep_copy(exec, recv_w, kSentinel);
    Kokkos::deep_copy(exec, grad_wc, kSentinel);
    Kokkos::deep_copy(exec, grad_wd, kSentinel);
    exec.fence();
  }

  void layout(const Exec& exec) {
    ep_layout(exec, handle, sv.idx);
    if (handle.num_recv_rows() != N)
      throw std::runtime_error(name + ": the layout has " + std::to_string(handle.num_recv_rows()) +
                               " receive rows, the oracle " + std::to_string(N));
  }
  void dispatch_send(const Exec& exec) { pending = ep_dispatch_send(exec, handle, sv.x, sv.w, recv_x, recv_w); }
  void dispatch(const Exec& exec) { ep_dispatch(exec, handle, sv.x, sv.w, recv_x, recv_w); }
  void expert(const Exec& exec) { test_expert(exec, me, L, handle.recv_expert(), recv_x, out); }
  void combine_send(const Exec& exec) { pending = ep_combine_send(exec, handle, mode, out, sv.w, y); }
  void combine(const Exec& exec) { ep_combine(exec, handle, mode, out, sv.w, y); }
  void hook(const Exec& exec) {
    if (!pending) throw std::runtime_error(name + ": no pending receive");
    (*pending)(exec);
    pending.reset();
  }
  void combine_backward(const Exec& exec) {
    ep_combine_backward(exec, handle, mode, grad_y, sv.w, out, grad_out, grad_wc);
  }
  void expert_backward(const Exec& exec) {
    test_expert_backward(exec, me, L, handle.recv_expert(), recv_w, grad_out, grad_recv_x, grad_recv_w);
  }
  void dispatch_backward(const Exec& exec) {
    ep_dispatch_backward(exec, handle, grad_recv_x, grad_recv_w, grad_x, grad_wd);
  }

  /// What differs between the step's outputs and the oracle's, or (bit for bit) \p alone's, the same step run by
  /// itself: "" when nothing does. Text, not assertions: loopback ranks check from their own threads.
  std::string check(const Exec& exec, const std::vector<std::vector<float>>* alone) {
    ep_synchronize(exec, handle);
    const auto got = outputs(exec);
    const char* names[] = {"recv_x", "recv_w", "y", "grad_out", "grad_w (combine)", "grad_x", "grad_w (dispatch)"};
    const std::vector<float>* oracle[] = {
        &want.recv_x, &want.recv_w, &want.y, &want.grad_out, &want.grad_w_combine, &want.grad_x, &want.grad_w_dispatch};
    std::ostringstream out;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const bool weights = i == 1 || i == 4 || i == 6;
      if (i != 4 || mode == CombineMode::Weighted) {
        int bad = 0;
        if (got[i].size() < oracle[i]->size()) out << names[i] << ": " << got[i].size() << " values; ";
        for (std::size_t j = 0; j < oracle[i]->size() && j < got[i].size() && bad < 3; ++j)
          if (!close(got[i][j], (*oracle[i])[j], bf16 && !weights) && ++bad)
            out << name << " " << names[i] << "[" << j << "] = " << got[i][j] << ", expected " << (*oracle[i])[j]
                << "; ";
      }
      if (alone) {
        const auto& a = (*alone)[i];
        if (a.size() != got[i].size()) {
          out << name << " " << names[i] << ": " << got[i].size() << " values, alone " << a.size() << "; ";
          continue;
        }
        for (std::size_t j = 0; j < a.size(); ++j)
          if (std::memcmp(&a[j], &got[i][j], sizeof(float)) != 0) {
            out << name << " " << names[i] << "[" << j << "] = " << got[i][j] << ", run alone " << a[j] << "; ";
            break;
          }
      }
    }
    if (to_host<int>(exec, handle.recv_expert()) != want.recv_expert) out << name << " recv_expert differs; ";
    return out.str();
  }

  std::vector<std::vector<float>> outputs(const Exec& exec) const {
    return {to_host_floats(exec, recv_x),   to_host_floats(exec, recv_w),  to_host_floats(exec, y),
            to_host_floats(exec, grad_out), to_host_floats(exec, grad_wc), to_host_floats(exec, grad_x),
            to_host_floats(exec, grad_wd)};
  }
};

/// The operations a scenario strings together: a letter for the layer (A or B) and the operation.
enum class Op {
  Layout,
  DispatchSend,
  Dispatch,
  Expert,
  CombineSend,
  Combine,
  Hook,
  CombineBwd,
  ExpertBwd,
  DispatchBwd
};
struct Step {
  char layer;
  Op op;
};

template <class Exec, class LA, class LB>
void run(const Exec& exec, LA& a, LB& b, const std::vector<Step>& steps) {
  for (const Step& s : steps) {
    auto act = [&](auto& l) {
      switch (s.op) {
        case Op::Layout:
          l.layout(exec);
          break;
        case Op::DispatchSend:
          l.dispatch_send(exec);
          break;
        case Op::Dispatch:
          l.dispatch(exec);
          break;
        case Op::Expert:
          l.expert(exec);
          break;
        case Op::CombineSend:
          l.combine_send(exec);
          break;
        case Op::Combine:
          l.combine(exec);
          break;
        case Op::Hook:
          l.hook(exec);
          break;
        case Op::CombineBwd:
          l.combine_backward(exec);
          break;
        case Op::ExpertBwd:
          l.expert_backward(exec);
          break;
        case Op::DispatchBwd:
          l.dispatch_backward(exec);
          break;
      }
    };
    if (s.layer == 'A') {
      act(a);
    } else {
      act(b);
    }
  }
}

/// The interleavings of overlapping micro-batches: both sends before both hooks (in either hook order), a plain
/// operation of one layer between the other's send and hook (for each operation of the step), and a dispatch pending
/// across the other layer's whole forward.
inline std::vector<std::pair<std::string, std::vector<Step>>> scenarios() {
  using O = Op;
  auto tail = [](char l) { return std::vector<Step>{{l, O::CombineBwd}, {l, O::ExpertBwd}, {l, O::DispatchBwd}}; };
  std::vector<std::pair<std::string, std::vector<Step>>> out;
  for (bool b_first : {false, true}) {
    const char x = 'A', z = 'B';
    std::vector<Step> s = {{x, O::Layout},
                           {z, O::Layout},
                           {x, O::DispatchSend},
                           {z, O::DispatchSend},
                           {b_first ? z : x, O::Hook},
                           {b_first ? x : z, O::Hook},
                           {x, O::Expert},
                           {z, O::Expert},
                           {x, O::CombineSend},
                           {z, O::CombineSend},
                           {b_first ? z : x, O::Hook},
                           {b_first ? x : z, O::Hook}};
    for (char l : {x, z})
      for (const Step& t : tail(l)) s.push_back(t);
    out.emplace_back(b_first ? "send A, send B, hook B, hook A" : "send A, send B, hook A, hook B", s);
  }
  for (const auto& [x, z] : {std::pair<char, char>{'A', 'B'}, std::pair<char, char>{'B', 'A'}}) {
    // z's whole step runs in plain operations while x's dispatch, then x's combine, waits for its hook.
    std::vector<Step> s = {{x, O::Layout},  {x, O::DispatchSend}, {z, O::Layout},    {z, O::Dispatch},
                           {x, O::Hook},    {x, O::Expert},       {z, O::Expert},    {x, O::CombineSend},
                           {z, O::Combine}, {z, O::CombineBwd},   {z, O::ExpertBwd}, {z, O::DispatchBwd},
                           {x, O::Hook}};
    for (const Step& t : tail(x)) s.push_back(t);
    out.emplace_back(std::string("send ") + x + ", plain " + z + ", hook " + x, s);
  }
  // A's dispatch stays pending while B lays out, dispatches and sends its combine; then A's combine is sent while
  // B's is still pending: two receives of different operations in flight.
  std::vector<Step> s = {{'A', O::Layout},      {'A', O::DispatchSend}, {'B', O::Layout}, {'B', O::Dispatch},
                         {'B', O::Expert},      {'B', O::CombineSend},  {'A', O::Hook},   {'A', O::Expert},
                         {'A', O::CombineSend}, {'B', O::Hook},         {'A', O::Hook}};
  for (char l : {'B', 'A'})
    for (const Step& t : tail(l)) s.push_back(t);
  out.emplace_back("dispatch A pending across B's forward, both combines pending", s);
  return out;
}

/// The step of \p config's layer run alone (plain operations), as every scenario's bitwise reference.
template <class Exec, class Scalar>
std::vector<std::vector<float>> alone(const Exec& exec, EpGroup<Exec>& group, const std::string& name, Routing r,
                                      CombineMode m, std::uint64_t seed) {
  Layer<Exec, Scalar> l(exec, group, name, r, m, seed);
  const std::vector<Step> plain = {{'A', Op::Layout},     {'A', Op::Dispatch},   {'A', Op::Expert},
                                   {'A', Op::Combine},    {'A', Op::CombineBwd}, {'A', Op::ExpertBwd},
                                   {'A', Op::DispatchBwd}};
  run(exec, l, l, plain);
  ep_synchronize(exec, l.handle);
  return l.outputs(exec);
}

/// Every scenario on two layers of the given groups (the same group twice for two handles of one group): "" when
/// each layer's outputs equal the oracle's and, bit for bit, its step run alone; else what differs, per scenario.
template <class Exec, class SA, class SB>
std::string interleavings_match(const Exec& exec, EpGroup<Exec>& ga, EpGroup<Exec>& gb, Routing ra, CombineMode ma,
                                Routing rb, CombineMode mb) {
  const auto ref_a = alone<Exec, SA>(exec, ga, "layer A", ra, ma, 601);
  const auto ref_b = alone<Exec, SB>(exec, gb, "layer B", rb, mb, 602);
  std::string found;
  for (const auto& [what, steps] : scenarios()) {
    Layer<Exec, SA> a(exec, ga, "layer A", ra, ma, 601);
    Layer<Exec, SB> b(exec, gb, "layer B", rb, mb, 602);
    run(exec, a, b, steps);
    const std::string f = a.check(exec, &ref_a) + b.check(exec, &ref_b);
    if (!f.empty()) found += "[" + what + "] " + f;
  }
  return found;
}

/// The two shapes of the two-groups case: A eager, FP32 rows of 32; B capacity mode with room for every slot, an odd
/// row size (37), E = 3R, K = 3, alignment 4.
inline std::pair<EpGroupConfig, EpGroupConfig> two_shapes(int R) {
  auto ca = default_config(R);
  auto cb = ca;
  cb.num_experts = 3 * R;
  cb.hidden_size = 37;
  cb.topk = 3;
  cb.max_tokens_per_rank = 6;
  cb.expert_alignment = 4;
  cb.max_recv_tokens_per_rank = cb.max_tokens_per_rank * cb.topk * R + 16;
  return {ca, cb};
}

}  // namespace KokkosMoE::Test

#endif
