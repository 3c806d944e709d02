/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// The EP test matrix of docs/ep.md §12, its steps (cases 4-8 and 10: dispatch, combine, the backwards, capacity,
// streams, graphs); tstEp.cpp holds setup and layout. One source for every transport, as there.
#include <KokkosMoE_EnableDeviceTypes.hpp>

#include <EpCases.hpp>
#include <EpStep.hpp>
#include <boost/test/unit_test.hpp>
#include <impl/KokkosMoE_EP_Decode.hpp>         // kDecodeStageIds: a decode case of several staged tiles
#include <impl/KokkosMoE_EP_LayoutKernels.hpp>  // the layout chunk and kLayoutScanChunks: a case past the fused scan

#include <algorithm>
#include <random>
#include <set>

using namespace KokkosMoE;
using namespace KokkosMoE::Test;

// ----- cases 4 and 5: round trips, gradients, the oracle over the adversarial matrix ---------------------------------
BOOST_AUTO_TEST_SUITE(ep_dispatch_combine)

BOOST_AUTO_TEST_CASE_TEMPLATE(step_matches_oracle, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  const int R = ep_comm<Exec>().size();
  auto c = default_config(R);
  auto c2 = c;
  c2.num_experts = 3 * R;
  c2.hidden_size = 37;  // not a multiple of 16 bytes: the element-wise path
  c2.topk = 3;
  c2.max_tokens_per_rank = 50;
  c2.expert_alignment = 4;
  for (Routing r : {Routing::Uniform, Routing::Skewed, Routing::AllToOneExpert, Routing::SomeExpertsEmpty,
                    Routing::WithMinusOne, Routing::Duplicates}) {
    for (CombineMode m : {CombineMode::Sum, CombineMode::Weighted}) {
      check_step<Exec, float>(c, r, m, 100 + static_cast<int>(r), false, "default shape");
      check_step<Exec, bf16_t>(c2, r, m, 200 + static_cast<int>(r), true, "odd shape, T varies (T = 0 on rank 1)");
    }
  }
  // Many tokens: the layout's many chunks and the prefix over them (docs/ep.md §3.1), the last chunk
  // partial; repeated ids within a token, and drops in capacity mode, across the chunks. Then more chunks than the
  // count kernel's last team scans: the prefix kernel.
  auto many = c2;
  many.hidden_size = 16;
  many.max_tokens_per_rank = 1500;
  for (Routing r : {Routing::Skewed, Routing::Duplicates})
    check_step<Exec, float>(many, r, CombineMode::Weighted, 370 + static_cast<int>(r), true, "many tokens");
  auto more = many;
  more.max_tokens_per_rank = (Impl::kLayoutScanChunks + 1) * Impl::layout_chunk(more.topk) + 5;
  check_step<Exec, float>(more, Routing::Duplicates, CombineMode::Sum, 375, true, "more chunks than one team scans");
  auto many_cap = many;
  many_cap.max_recv_tokens_per_rank = many.max_tokens_per_rank * many.topk * R / 2 + 1;
  many_cap.drop_on_overflow = true;
  check_step<Exec, bf16_t>(many_cap, Routing::Skewed, CombineMode::Sum, 380, false, "many tokens, capacity with drops");
  // Capacity mode with room for everything, and the fixed expert-major layout.
  auto cap = c2;
  cap.max_recv_tokens_per_rank = cap.max_tokens_per_rank * cap.topk * R + 64;
  check_step<Exec, float>(cap, Routing::Skewed, CombineMode::Weighted, 300, true, "capacity mode");
  check_step<Exec, bf16_t>(cap, Routing::Uniform, CombineMode::Sum, 301, false, "capacity mode");
  // FP8 rows (H a multiple of 128): every step also dispatches them, quantized in the pack and given quantized.
  auto f8 = c;
  f8.hidden_size = 256;
  f8.max_tokens_per_rank = 9;
  f8.expert_alignment = 4;  // padding rows: zero codes and zero scales
  check_step<Exec, bf16_t>(f8, Routing::Uniform, CombineMode::Weighted, 310, true, "FP8 rows");
  check_step<Exec, float>(f8, Routing::WithMinusOne, CombineMode::Sum, 311, false, "FP8 rows");
  auto f8cap = f8;
  f8cap.max_recv_tokens_per_rank = f8cap.max_tokens_per_rank * f8cap.topk * R / 2 + 1;
  f8cap.drop_on_overflow = true;
  check_step<Exec, float>(f8cap, Routing::Skewed, CombineMode::Weighted, 312, true, "FP8 rows, capacity with drops");
  auto fixed = c;
  fixed.layout = RecvLayout::ExpertMajorFixed;
  check_step<Exec, bf16_t>(fixed, Routing::Uniform, CombineMode::Weighted, 302, false, "fixed layout");
  check_step<Exec, float>(fixed, Routing::AllToOneExpert, CombineMode::Sum, 303, true, "fixed layout");
  // The SM cap at its tightest (docs/ep.md §13): every kernel runs one team that takes all its work items in turn.
  // The ranks may pass different caps: rank 0 caps, the others do not.
  const int me = ep_comm<Exec>().rank();
  for (auto capped : {c2, cap, f8cap, fixed}) {
    capped.max_sms = me == 0 || R == 1 ? 1 : -1;
    check_step<Exec, bf16_t>(capped, Routing::Skewed, CombineMode::Weighted, 320, true, "SM cap 1 on rank 0");
    capped.max_sms = 1;
    check_step<Exec, float>(capped, Routing::Uniform, CombineMode::Sum, 321, false, "SM cap 1 on every rank");
    // On Cuda a cap of 16 is an SM partition (SmCap::Auto) whose stream carries the transport's calls too.
    if (!is_cuda<Exec>()) continue;
    capped.max_sms = 16;
    check_step<Exec, bf16_t>(capped, Routing::Skewed, CombineMode::Weighted, 322, true, "SM cap 16 on every rank");
  }
  // Every operation in its two halves (docs/ep.md §14; FP8 dispatch where H allows), other work between each send
  // and its hook.
  for (auto split : {c2, cap, fixed, f8}) {
    check_step<Exec, bf16_t>(split, Routing::Skewed, CombineMode::Weighted, 330, true, "split send/receive", true);
    check_step<Exec, float>(split, Routing::WithMinusOne, CombineMode::Sum, 331, false, "split send/receive", true);
  }
  // The decode path (docs/ep.md §15): the layout fused into the dispatch on fixed-layout groups (ids distinct per
  // token), then combine and the backwards on its handle; FP8 dispatches on the same handle where H allows.
  auto odd_fixed = c2;
  odd_fixed.layout = RecvLayout::ExpertMajorFixed;
  odd_fixed.expert_alignment = 1;
  auto f8_fixed = f8;
  f8_fixed.layout = RecvLayout::ExpertMajorFixed;
  f8_fixed.expert_alignment = 1;
  for (Routing r :
       {Routing::Uniform, Routing::Skewed, Routing::AllToOneExpert, Routing::SomeExpertsEmpty, Routing::WithMinusOne}) {
    const int seed = static_cast<int>(r);
    check_step<Exec, bf16_t>(fixed, r, CombineMode::Weighted, 340 + seed, false, "decode", false, true);
    check_step<Exec, float>(odd_fixed, r, CombineMode::Sum, 350 + seed, true, "decode, odd shape", false, true);
  }
  check_step<Exec, bf16_t>(f8_fixed, Routing::Uniform, CombineMode::Weighted, 360, true, "decode, FP8 rows", false,
                           true);
  auto decode_capped = odd_fixed;
  decode_capped.max_sms = 1;
  check_step<Exec, float>(decode_capped, Routing::Skewed, CombineMode::Weighted, 361, true, "decode, SM cap 1", false,
                          true);
  check_step<Exec, bf16_t>(fixed, Routing::WithMinusOne, CombineMode::Weighted, 362, true, "decode, split combine",
                           true, true);
  // Rows the per-token kernels split into column blocks at decode sizes (RowSplit): two blocks of bf16 Chunk16 units;
  // float units (an unaligned row) in blocks whose last is short. The combine of both splits too (T < 1024).
  auto wide = fixed;
  wide.hidden_size = 2048;
  check_step<Exec, bf16_t>(wide, Routing::Skewed, CombineMode::Weighted, 363, true, "decode, wide rows", false, true);
  auto wide_odd = odd_fixed;
  wide_odd.hidden_size = 1030;
  check_step<Exec, float>(wide_odd, Routing::WithMinusOne, CombineMode::Sum, 364, false, "decode, wide unaligned rows",
                          false, true);
  // The decode kernels stage a step's ids in tiles of whole tokens: the most tokens the path takes, with more ids
  // than one tile holds.
  auto tiles = odd_fixed;
  tiles.max_tokens_per_rank = EpDecodeLimits::max_tokens_per_rank;
  tiles.topk = Impl::kDecodeStageIds / tiles.max_tokens_per_rank + 1;
  tiles.num_experts = 2 * tiles.topk * R;
  tiles.hidden_size = 16;
  check_step<Exec, float>(tiles, Routing::Skewed, CombineMode::Weighted, 365, true, "decode, ids in several tiles",
                          false, true);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(decode_rules_are_typed, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  using Mem = typename Exec::memory_space;
  Exec exec;
  const Communicator& comm = ep_comm<Exec>();
  const int R = comm.size(), me = comm.rank();
  {
    // A group the decode path does not serve (the ExpertMajor layout): every rank refuses before communicating.
    const auto c = default_config(R);
    EpGroup<Exec> group(exec, comm, c);
    auto handle = group.make_handle({false, "decode"});
    const auto in = group_inputs(c, Routing::Uniform, 93, false, false);
    StepViews<Exec, float> sv(exec, c, in[me]);
    Kokkos::View<float**, Kokkos::LayoutRight, Mem> rx("rx", c.max_tokens_per_rank * c.topk * R, c.hidden_size);
    Kokkos::View<float*, Mem> rw("rw", rx.extent(0));
    int rule = -1;
    std::string param, msg;
    try {
      ep_decode_dispatch(exec, handle, sv.idx, sv.x, sv.w, rx, rw);
    } catch (const InvalidArgument& e) {
      rule = static_cast<int>(e.rule());
      param = e.parameter();
      msg = e.what();
    }
    BOOST_TEST(rule == static_cast<int>(Rule::ConfigValue), msg);
    BOOST_TEST(param == "handle", msg);
    BOOST_TEST(msg.find("ExpertMajorFixed") != std::string::npos, msg);
  }
  {
    // Rank 0's first token names one expert twice: every rank throws ExpertIdRange at ep_synchronize, naming the
    // repeat and rank 0, and the handle serves the next step.
    auto c = default_config(R);
    c.layout = RecvLayout::ExpertMajorFixed;
    EpGroup<Exec> group(exec, comm, c);
    auto handle = group.make_handle({false, "decode"});
    auto in = group_inputs(c, Routing::Uniform, 94, false, false);
    in[0].idx[1] = in[0].idx[0];
    StepViews<Exec, float> sv(exec, c, in[me]);
    const int N = group.capacity_rows();
    Kokkos::View<float**, Kokkos::LayoutRight, Mem> rx("rx", N, c.hidden_size);
    Kokkos::View<float*, Mem> rw("rw", N);
    ep_decode_dispatch(exec, handle, sv.idx, sv.x, sv.w, rx, rw);
    int rule = -1;
    std::string msg;
    try {
      ep_synchronize(exec, handle);
    } catch (const InvalidArgument& e) {
      rule = static_cast<int>(e.rule());
      msg = e.what();
    }
    BOOST_TEST(rule == static_cast<int>(Rule::ExpertIdRange), msg);
    BOOST_TEST(msg.find("repeated") != std::string::npos, msg);
    BOOST_TEST(msg.find("rank 0 (1)") != std::string::npos, msg);
    const auto clean = group_inputs(c, Routing::Uniform, 95, false, false);
    const StepOutputs got =
        run_step<Exec, float>(exec, group, handle, clean[me], CombineMode::Weighted, -1, false, true);
    const StepOutputs want = expected_step(c, clean, me, CombineMode::Weighted, false);
    compare("y after the refused step", got.y, want.y, false, want.y.size());
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(receive_hook_misuse_is_typed, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  // Every rank makes the same mistake: each throws InvalidArgument (Rule::HandleState) before communicating, the
  // pending receive survives the refused calls, and the step completes afterwards (no rank was left waiting).
  using Exec = typename DeviceType::execution_space;
  using Mem = typename Exec::memory_space;
  Exec exec;
  const Communicator& comm = ep_comm<Exec>();
  const auto c = default_config(comm.size());
  const auto in = group_inputs(c, Routing::Uniform, 91, false, false);
  EpGroup<Exec> group(exec, comm, c);
  auto handle = group.make_handle({false, "layer 7"});
  StepViews<Exec, float> sv(exec, c, in[comm.rank()]);
  ep_layout(exec, handle, sv.idx);
  const int N = handle.num_recv_rows(), T = in[comm.rank()].T;
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> rx("rx", N, c.hidden_size), y("y", T, c.hidden_size);
  Kokkos::View<float*, Mem> rw("rw", N);
  auto refused = [&](const char* what, auto&& f, const char* arg) { refused_as_handle_state(what, f, arg); };
  auto hook = ep_dispatch_send(exec, handle, sv.x, sv.w, rx, rw);
  refused(
      "a second send before the hook", [&] { (void)ep_dispatch_send(exec, handle, sv.x, sv.w, rx, rw); }, "handle");
  refused(
      "ep_dispatch before the hook", [&] { ep_dispatch(exec, handle, sv.x, sv.w, rx, rw); }, "handle");
  refused(
      "ep_combine before the hook", [&] { ep_combine(exec, handle, CombineMode::Sum, rx, sv.w, y); }, "handle");
  refused(
      "ep_layout before the hook", [&] { ep_layout(exec, handle, sv.idx); }, "handle");
  refused(
      "ep_synchronize before the hook", [&] { ep_synchronize(exec, handle); }, "handle");
  hook(exec);
  refused(
      "the hook called twice", [&] { hook(exec); }, "hook");
  auto back = ep_combine_send(exec, handle, CombineMode::Weighted, rx, sv.w, y);
  refused(
      "the dispatch's hook after a later send", [&] { hook(exec); }, "hook");
  back(exec);
  ep_synchronize(exec, handle);
  // The identity expert's y (sum over k of w * x) in plain loops: the refused calls changed nothing.
  auto hy = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y);
  int bad = 0;
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < c.hidden_size; ++h) {
      float want_y = 0.0f;
      for (int k = 0; k < c.topk; ++k) {
        const int e = in[comm.rank()].idx[static_cast<std::size_t>(t) * c.topk + k];
        if (e >= 0)
          want_y += in[comm.rank()].w[static_cast<std::size_t>(t) * c.topk + k] *
                    in[comm.rank()].x[static_cast<std::size_t>(t) * c.hidden_size + h];
      }
      if (!close(hy(t, h), want_y, false) && bad++ < 3)
        BOOST_TEST(false, "y(" << t << ", " << h << ") = " << hy(t, h) << ", expected " << want_y);
    }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(fp8_bad_input_is_typed, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  // Every rank passes the same bad FP8 argument: each throws InvalidArgument naming it before communicating, and the
  // handle still serves a good dispatch afterwards (no rank was left waiting).
  using Exec = typename DeviceType::execution_space;
  using Mem = typename Exec::memory_space;
  Exec exec;
  const Communicator& comm = ep_comm<Exec>();
  auto c = default_config(comm.size());
  c.hidden_size = 128;
  const auto in = group_inputs(c, Routing::Uniform, 77, false, false);
  EpGroup<Exec> group(exec, comm, c);
  auto handle = group.make_handle();
  StepViews<Exec, float> sv(exec, c, in[comm.rank()]);
  ep_layout(exec, handle, sv.idx);
  const int N = handle.num_recv_rows(), T = in[comm.rank()].T;
  Kokkos::View<fp8_e4m3_t**, Kokkos::LayoutRight, Mem> q("q", N, 128), xq("xq", T, 128);
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> sc("sc", N, 1), bad_sc("bad_sc", N, 2), xs("xs", T, 1);
  Kokkos::View<float*, Mem> rw("rw", N);
  auto thrown = [&](auto&& f) -> std::string {
    try {
      f();
    } catch (const InvalidArgument& e) {
      return e.parameter() + " " + rule_name(e.rule());
    }
    return "nothing";
  };
  BOOST_TEST(thrown([&] { ep_dispatch(exec, handle, sv.x, sv.w, fp8_rows(q, bad_sc), rw); }) ==
             "recv_scales shape_mismatch");
  BOOST_TEST(thrown([&] { ep_dispatch(exec, handle, fp8_rows(xq, bad_sc), sv.w, fp8_rows(q, sc), rw); }) ==
             "x.scales shape_mismatch");
  Fp8QuantizeConfig bad;
  bad.min_amax = 0.0f;
  BOOST_TEST(thrown([&] { ep_dispatch(exec, handle, sv.x, sv.w, fp8_rows(q, sc), rw, bad); }) ==
             "config.min_amax config_value");
  Kokkos::View<fp8_e4m3_t*, Mem> flat("flat", static_cast<std::size_t>(N + 1) * 128);
  Kokkos::View<fp8_e4m3_t**, Kokkos::LayoutRight, Mem, Kokkos::MemoryTraits<Kokkos::Unmanaged>> odd(flat.data() + 1, N,
                                                                                                    128);
  BOOST_TEST(thrown([&] { ep_dispatch(exec, handle, sv.x, sv.w, fp8_rows(odd, sc), rw); }) == "recv_q alignment");
  ep_dispatch(exec, handle, sv.x, sv.w, fp8_rows(q, sc), rw);
  BOOST_TEST(ep_synchronize(exec, handle).dropped_slots == 0);
  // A hidden size that is not a multiple of 128: the group's, so on every rank.
  auto c32 = default_config(comm.size());
  EpGroup<Exec> group32(exec, comm, c32);
  auto h32 = group32.make_handle();
  StepViews<Exec, float> sv32(exec, c32, group_inputs(c32, Routing::Uniform, 78, false, false)[comm.rank()]);
  ep_layout(exec, h32, sv32.idx);
  Kokkos::View<fp8_e4m3_t**, Kokkos::LayoutRight, Mem> q32("q32", h32.num_recv_rows(), 32);
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> s32("s32", h32.num_recv_rows(), 0);
  Kokkos::View<float*, Mem> rw32("rw32", h32.num_recv_rows());
  BOOST_TEST(thrown([&] { ep_dispatch(exec, h32, sv32.x, sv32.w, fp8_rows(q32, s32), rw32); }) == "x shape_mismatch");
  ep_synchronize(exec, h32);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(identity_expert_round_trip, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  using Mem = typename Exec::memory_space;
  Exec exec;
  const Communicator& comm = ep_comm<Exec>();
  auto c = default_config(comm.size());
  c.max_tokens_per_rank = 12;
  for (Routing r : {Routing::Uniform, Routing::Skewed}) {
    const auto in = group_inputs(c, r, 51, false, false);
    const RankInputs& mine = in[comm.rank()];
    EpGroup<Exec> group(exec, comm, c);
    auto handle = group.make_handle({false, "identity"});
    // 3-D input [batch = 3, sequence = 4, hidden] flattened to [12, hidden] without a copy.
    Kokkos::View<float***, Kokkos::LayoutRight, Mem> x3("x3", 3, 4, c.hidden_size);
    StepViews<Exec, float> s(c, mine);
    Kokkos::deep_copy(
        x3, Kokkos::View<float***, Kokkos::LayoutRight, Mem, Kokkos::MemoryUnmanaged>(s.x.data(), 3, 4, c.hidden_size));
    Kokkos::View<float**, Kokkos::LayoutRight, Mem, Kokkos::MemoryUnmanaged> x2(x3.data(), 12, c.hidden_size);
    // Normalized weights: the Weighted combine of the identity expert gives the input back.
    auto hw = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), s.w);
    for (int t = 0; t < mine.T; ++t) {
      float sum = 0;
      for (int k = 0; k < c.topk; ++k) sum += hw(t, k);
      for (int k = 0; k < c.topk; ++k) hw(t, k) /= sum;
    }
    Kokkos::deep_copy(s.w, hw);
    ep_layout(exec, handle, s.idx);
    const int N = handle.num_recv_rows();
    Kokkos::View<float**, Kokkos::LayoutRight, Mem> rx("rx", N, c.hidden_size);
    Kokkos::View<float*, Mem> rw("rw", N);
    Kokkos::View<float**, Kokkos::LayoutRight, Mem> y("y", mine.T, c.hidden_size), ysum("ysum", mine.T, c.hidden_size);
    ep_dispatch(exec, handle, x2, s.w, rx, rw);
    ep_combine(exec, handle, CombineMode::Weighted, rx, s.w, y);
    ep_combine(exec, handle, CombineMode::Sum, rx, Kokkos::View<float**, Kokkos::LayoutRight, Mem>(), ysum);
    ep_synchronize(exec, handle);
    auto hy = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y);
    auto hs = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), ysum);
    for (int t = 0; t < mine.T; ++t)
      for (int h = 0; h < c.hidden_size; ++h) {
        const float xv = mine.x[static_cast<std::size_t>(t) * c.hidden_size + h];
        BOOST_TEST(close(hy(t, h), xv, false), "y(" << t << ", " << h << ") = " << hy(t, h) << ", x = " << xv);
        BOOST_TEST(close(hs(t, h), c.topk * xv, false));
      }
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(closed_form_gradients, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  using Mem = typename Exec::memory_space;
  Exec exec;
  const Communicator& comm = ep_comm<Exec>();
  auto c = default_config(comm.size());
  c.max_tokens_per_rank = 9;
  const auto in = group_inputs(c, Routing::Uniform, 61, false, false);
  const RankInputs& mine = in[comm.rank()];
  EpGroup<Exec> group(exec, comm, c);
  auto handle = group.make_handle();
  StepViews<Exec, float> s(c, mine);
  ep_layout(exec, handle, s.idx);
  const int N = handle.num_recv_rows(), T = mine.T, K = c.topk, H = c.hidden_size;
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> rx("rx", N, H), gout("gout", N, H), gx("gx", T, H);
  Kokkos::View<float*, Mem> rw("rw", N);
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> gw("gw", T, K), gwc("gwc", T, K), uni("uni", T, K);
  ep_dispatch(exec, handle, s.x, s.w, rx, rw);
  // Dispatch backward with every slot's upstream gradient its own token: grad_x = K * x; grad_w = recv_w.
  ep_dispatch_backward(exec, handle, rx, rw, gx, gw);
  // Combine backward with uniform weights 1/K: grad_out = grad_y / K; grad_w = dot(grad_y, out).
  Kokkos::deep_copy(uni, 1.0f / K);
  ep_combine_backward(exec, handle, CombineMode::Weighted, s.x, uni, rx, gout, gwc);
  ep_synchronize(exec, handle);
  auto hgx = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), gx);
  auto hgw = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), gw);
  auto hgwc = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), gwc);
  auto hgo = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), gout);
  auto hrx = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), rx);
  for (int t = 0; t < T; ++t) {
    float xx = 0;
    for (int h = 0; h < H; ++h) {
      const float xv = mine.x[static_cast<std::size_t>(t) * H + h];
      xx += xv * xv;
      BOOST_TEST(close(hgx(t, h), K * xv, false));
    }
    for (int k = 0; k < K; ++k) {
      BOOST_TEST(close(hgw(t, k), mine.w[static_cast<std::size_t>(t) * K + k], false));
      BOOST_TEST(std::fabs(hgwc(t, k) - xx) <= 1e-4f * (1 + xx));  // out = x (identity) so dot = |x|^2
    }
  }
  for (int r = 0; r < N; ++r)
    for (int h = 0; h < H; ++h) BOOST_TEST(close(hgo(r, h), hrx(r, h) / K, false));
}

BOOST_AUTO_TEST_CASE_TEMPLATE(same_bits_every_run, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  Exec exec;
  const Communicator& comm = ep_comm<Exec>();
  auto c = default_config(comm.size());
  c.max_tokens_per_rank = 40;
  c.topk = 2;
  const auto in = group_inputs(c, Routing::Skewed, 71, true, true);
  EpGroup<Exec> group(exec, comm, c);
  auto h1 = group.make_handle();
  auto h2 = group.make_handle();
  const auto a = run_step<Exec, bf16_t>(exec, group, h1, in[comm.rank()], CombineMode::Weighted);
  const auto b = run_step<Exec, bf16_t>(exec, group, h2, in[comm.rank()], CombineMode::Weighted);
  BOOST_TEST(a.recv_x == b.recv_x);
  BOOST_TEST(a.y == b.y);
  BOOST_TEST(a.grad_x == b.grad_x);
  BOOST_TEST(a.grad_w_combine == b.grad_w_combine);
  BOOST_TEST(a.grad_out == b.grad_out);
}

// Load statistics (docs/ep.md §5): the handle's expert load is the sum of every layout's demand per local expert,
// from the oracle's count matrix; the peers' wait times are non-negative, 0 for this rank itself and over messages;
// both reset to 0 and count again.
BOOST_AUTO_TEST_CASE_TEMPLATE(load_statistics_accumulate_and_reset, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  Exec exec;
  const Communicator& comm = ep_comm<Exec>();
  const int R = comm.size(), me = comm.rank();
  const EpGroupConfig c = default_config(R);
  const int L = c.num_experts / R, E = c.num_experts;
  EpGroup<Exec> group(exec, comm, c);
  auto handle = group.make_handle();
  auto demand = [&](const std::vector<RankInputs>& in) {
    const StepOutputs want = expected_step(c, in, me, CombineMode::Weighted, false);
    std::vector<std::int64_t> d(static_cast<std::size_t>(L), 0);
    for (int i = 0; i < R; ++i)
      for (int l = 0; l < L; ++l) d[l] += want.counts[static_cast<std::size_t>(i) * (E + 1) + me * L + l];
    return d;
  };
  std::vector<std::int64_t> want(static_cast<std::size_t>(L), 0);
  for (std::uint64_t seed : {31u, 32u, 33u}) {
    const auto in = group_inputs(c, seed == 32u ? Routing::Skewed : Routing::Uniform, seed, false, true);
    run_step<Exec, float>(exec, group, handle, in[me], CombineMode::Weighted);
    const auto d = demand(in);
    for (int l = 0; l < L; ++l) want[l] += d[l];
  }
  auto load = to_host<std::int64_t>(exec, handle.expert_load());
  BOOST_TEST(load == want, "expert load after three steps");
  auto waits = to_host<std::int64_t>(exec, group.peer_wait_ns());
  BOOST_REQUIRE(waits.size() == static_cast<std::size_t>(R));
  for (int p = 0; p < R; ++p) {
    BOOST_TEST(waits[p] >= 0);
    if (p == me || !group.direct_writes()) BOOST_TEST(waits[p] == 0, "wait for rank " << p);
  }
  ep_reset_statistics(exec, handle);
  ep_reset_statistics(exec, group);
  load = to_host<std::int64_t>(exec, handle.expert_load());
  waits = to_host<std::int64_t>(exec, group.peer_wait_ns());
  BOOST_TEST(load == std::vector<std::int64_t>(static_cast<std::size_t>(L), 0));
  BOOST_TEST(waits == std::vector<std::int64_t>(static_cast<std::size_t>(R), 0));
  const auto in = group_inputs(c, Routing::Skewed, 34u, false, false);
  run_step<Exec, float>(exec, group, handle, in[me], CombineMode::Sum);
  BOOST_TEST(to_host<std::int64_t>(exec, handle.expert_load()) == demand(in), "after the reset: one step's demand");
}

// A handle whose only forward was an FP8 dispatch (no row dispatch at all) takes both backwards, in eager and
// capacity mode: the codes, scales and weights equal the oracle's, the gradients too, and the training handle takes
// its next layout (its backward ran).
BOOST_AUTO_TEST_CASE_TEMPLATE(fp8_only_forward_then_backwards, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  using Mem = typename Exec::memory_space;
  using Rows = Kokkos::View<float**, Kokkos::LayoutRight, Mem>;
  Exec exec;
  const Communicator& comm = ep_comm<Exec>();
  const int R = comm.size(), me = comm.rank();
  for (const bool capacity : {false, true}) {
    BOOST_TEST_CONTEXT((capacity ? "capacity" : "eager") << " mode, " << R << " ranks") {
      auto c = default_config(R);
      c.hidden_size = 256;
      if (capacity) c.max_recv_tokens_per_rank = c.max_tokens_per_rank * c.topk * R;
      const int H = c.hidden_size, K = c.topk, nb = H / kFp8BlockChannels;
      const auto in = group_inputs(c, Routing::Skewed, 515, false, false);
      const StepOutputs want = expected_step(c, in, me, CombineMode::Sum, false);
      const int T = in[me].T;
      EpGroup<Exec> group(exec, comm, c);
      auto handle = group.make_handle({true, "fp8 only"});
      StepViews<Exec, float> sv(exec, c, in[me]);
      ep_layout(exec, handle, sv.idx);
      const int N = handle.num_recv_rows(), L = group.num_local_experts();
      Kokkos::View<fp8_e4m3_t**, Kokkos::LayoutRight, Mem> rq("rq", N, H);
      Rows rs("rs", N, nb), out("out", N, H), grad_out("grad_out", N, H), grad_recv_x("grad_recv_x", N, H),
          y("y", T, H), grad_y("grad_y", T, H), grad_x("grad_x", T, H), grad_wc("grad_wc", T, K),
          grad_wd("grad_wd", T, K);
      Kokkos::View<float*, Mem> rw("rw", N), grad_recv_w("grad_recv_w", N);
      Kokkos::deep_copy(exec, rq, fp8_e4m3_t::from_bits(kSentinelCode));
      Kokkos::deep_copy(exec, rs, kSentinel);
      Kokkos::deep_copy(exec, rw, kSentinel);
      Kokkos::deep_copy(exec, grad_out, kSentinel);
      Kokkos::deep_copy(exec, grad_x, kSentinel);
      Kokkos::deep_copy(exec, grad_wd, kSentinel);
      ep_dispatch(exec, handle, sv.x, sv.w, fp8_rows(rq, rs), rw);
      ep_combine(exec, handle, CombineMode::Sum, out, sv.w, y);  // the experts' rows: zeros here
      auto hg = Kokkos::create_mirror_view(grad_y);
      for (int t = 0; t < T; ++t)
        for (int h = 0; h < H; ++h) hg(t, h) = upstream_grad(me, t, h, false);
      Kokkos::deep_copy(exec, grad_y, hg);
      ep_combine_backward(exec, handle, CombineMode::Sum, grad_y, sv.w, out, grad_out, grad_wc);
      test_expert_backward(exec, me, L, handle.recv_expert(), rw, grad_out, grad_recv_x, grad_recv_w);
      ep_dispatch_backward(exec, handle, grad_recv_x, grad_recv_w, grad_x, grad_wd);
      ep_synchronize(exec, handle);
      std::vector<std::uint8_t> codes(static_cast<std::size_t>(N) * H);
      {
        auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), rq);
        for (std::size_t i = 0; i < codes.size(); ++i) codes[i] = h.data()[i].bits;
      }
      BOOST_TEST(codes == want.fp8.q, boost::test_tools::per_element());
      compare("recv_scales", to_host_floats(exec, rs), want.fp8.scales, false, want.fp8.scales.size());
      compare("recv_w", to_host_floats(exec, rw), want.fp8.w, false, want.fp8.w.size());
      compare("grad_out", to_host_floats(exec, grad_out), want.grad_out, false,
              static_cast<std::size_t>(want.recv_rows) * H);
      compare("grad_x", to_host_floats(exec, grad_x), want.grad_x, false, want.grad_x.size());
      compare("grad_w (dispatch)", to_host_floats(exec, grad_wd), want.grad_w_dispatch, false,
              want.grad_w_dispatch.size());
      BOOST_CHECK_NO_THROW(ep_layout(exec, handle, sv.idx));  // the training step is complete
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

// ----- cases 6, 7, 8 and 10 ----------------------------------------------------------------------------------------
BOOST_AUTO_TEST_SUITE(ep_capacity_and_streams)

BOOST_AUTO_TEST_CASE_TEMPLATE(no_stray_communication, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  Exec exec;
  const Communicator& comm = ep_comm<Exec>();
  for (bool capacity : {false, true}) {
    auto c = default_config(comm.size());
    if (capacity) c.max_recv_tokens_per_rank = c.max_tokens_per_rank * c.topk * c.ep_size;
    const auto in = group_inputs(c, Routing::Uniform, 81, false, false);
    EpGroup<Exec> group(exec, comm, c);
    auto handle = group.make_handle();
    const int R = comm.size();
    const CommStats before = group.stats();
    run_step<Exec, float>(exec, group, handle, in[comm.rank()], CombineMode::Weighted);
    const CommStats after = group.stats();
    // One count exchange and the layout's meta; dispatch and dispatch backward: one transfer each; the Weighted
    // combine and combine backward: two each (the weights to the experts' ranks, then the rows back; the rows with
    // their weights, then the dots back). Weights and weight gradients ride in their rows' trailers (docs/ep.md §3).
    // Direct writes into shared windows need no library call at all: the counts travel through the window too.
    // One rank exchanges nothing.
    const bool windows = group.direct_writes();
    BOOST_TEST(after.allgathers - before.allgathers == (windows || R == 1 ? 0 : 1));
    const std::int64_t transfers = R == 1 || windows ? 0 : 7;
    BOOST_TEST(after.alltoalls - before.alltoalls == (capacity ? transfers : 0));
    BOOST_TEST(after.exchanges - before.exchanges == (capacity ? 0 : transfers));
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(wire_bytes_are_exact, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  Exec exec;
  const Communicator& comm = ep_comm<Exec>();
  const int R = comm.size(), me = comm.rank();
  const bool windows = writes_directly(comm);
  auto c = default_config(R);
  c.topk = 3;
  c.num_experts = 3 * R;
  c.max_tokens_per_rank = 10;
  const auto in = group_inputs(c, Routing::Uniform, 97, false, false);
  // The oracle of docs/ep.md §9: one FP32 row per (token, remote rank it reaches), trailer of K floats.
  const int L = c.num_experts / R, H = c.hidden_size;
  std::int64_t rows = 0, slots = 0;
  for (int t = 0; t < in[me].T; ++t) {
    std::set<int> ranks;
    for (int k = 0; k < c.topk; ++k) {
      const int e = in[me].idx[static_cast<std::size_t>(t) * c.topk + k];
      if (e >= 0 && e / L != me) {
        ranks.insert(e / L);
        ++slots;
      }
    }
    rows += static_cast<std::int64_t>(ranks.size());
  }
  const std::int64_t pitch = (4 * H + 15) / 16 * 16 + (4 * c.topk + 15) / 16 * 16;
  const std::int64_t signals = windows ? 16 * (R - 1) : 0;
  std::int64_t eager_wire = 0;
  // Eager, capacity, and the decode path on the fixed layout (docs/ep.md §15).
  for (const int mode : {0, 1, 2}) {
    const bool capacity = mode > 0, decode = mode == 2;
    BOOST_TEST_CONTEXT((decode ? "decode" : (capacity ? "capacity" : "eager")) << " mode") {
      auto cc = c;
      if (mode == 1) cc.max_recv_tokens_per_rank = c.max_tokens_per_rank * c.topk * R;
      if (decode) cc.layout = RecvLayout::ExpertMajorFixed;
      EpGroup<Exec> group(exec, comm, cc);
      auto handle = group.make_handle();
      const ByteCount before = group.stats().bytes["ep_dispatch"];
      const ByteCount layout_before = group.stats().bytes["ep_layout"];
      run_step<Exec, float>(exec, group, handle, in[me], CombineMode::Sum, -1, false, decode);
      const ByteCount after = group.stats().bytes["ep_dispatch"];
      const std::int64_t logical = after.logical - before.logical, wire = after.wire - before.wire;
      BOOST_TEST(logical == rows * 4 * H);
      BOOST_TEST(logical <= slots * 4 * H);  // deduplicated: never more than one row per remote slot
      if (decode && windows && R > 1) {
        // The layout's share of the decode path: every token's K codes and the L + 2 counts to each peer, with
        // their two signals.
        const std::int64_t layout_wire = group.stats().bytes["ep_layout"].wire - layout_before.wire;
        BOOST_TEST(layout_wire == static_cast<std::int64_t>(R - 1) * ((L + 2 + in[me].T * c.topk) * 4 + 32));
      }
      if (!capacity) {
        BOOST_TEST(wire == (R == 1 ? 0 : rows * pitch + signals));
        eager_wire = wire;
      } else if (windows || R == 1) {
        BOOST_TEST(wire == eager_wire);  // direct writes send only real rows in capacity mode too
      } else {
        BOOST_TEST(wire == static_cast<std::int64_t>(R - 1) * c.max_tokens_per_rank * pitch);  // whole blocks
      }
    }
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(one_stream, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  const Communicator& comm = ep_comm<Exec>();
  auto c = default_config(comm.size());
  const auto in = group_inputs(c, Routing::Uniform, 91, false, false);
#if defined(KOKKOS_ENABLE_CUDA)
  if constexpr (std::is_same<Exec, Kokkos::Cuda>::value) {
    cudaStream_t stream = nullptr;
    cudaStreamCreate(&stream);
    {
      Kokkos::Cuda exec(stream);
      EpGroup<Exec> group(exec, comm, c);
      auto handle = group.make_handle();
      const CommStats before = group.stats();
      run_step<Exec, float>(exec, group, handle, in[comm.rank()], CombineMode::Sum);
      const CommStats after = group.stats();
      // Every library call of the step went to the instance's stream; over windows the step makes none (the
      // counts travel through the window too), nor does one rank (nothing to exchange), and the eager layout's host
      // wait is the only one.
      BOOST_TEST(std::count(after.streams.begin(), after.streams.end(), static_cast<void*>(stream)) == 1);
      BOOST_TEST((after.calls > before.calls) == (!group.direct_writes() && comm.size() > 1));
      BOOST_TEST(after.waits > before.waits);
    }
    cudaStreamDestroy(stream);
    return;
  }
#endif
  Exec exec;
  EpGroup<Exec> group(exec, comm, c);
  auto handle = group.make_handle();
  run_step<Exec, float>(exec, group, handle, in[comm.rank()], CombineMode::Sum);
  const CommStats s = group.stats();
  BOOST_TEST(s.streams.size() == 1u);
  BOOST_TEST(s.streams[0] == nullptr);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(drop_on_overflow, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  Exec exec;
  const Communicator& comm = ep_comm<Exec>();
  auto c = default_config(comm.size());
  c.max_tokens_per_rank = 16;
  c.max_recv_tokens_per_rank = 6;  // smaller than the skewed demand on rank 0
  c.drop_on_overflow = true;
  for (CombineMode m : {CombineMode::Sum, CombineMode::Weighted}) {
    check_step<Exec, float>(c, Routing::Skewed, m, 401, false, "drop");
    check_step<Exec, bf16_t>(c, Routing::AllToOneExpert, m, 402, false, "drop");
  }
  // The reported demand exceeds the capacity where slots were dropped.
  const auto in = group_inputs(c, Routing::AllToOneExpert, 403, false, false);
  EpGroup<Exec> group(exec, comm, c);
  auto handle = group.make_handle();
  const auto got = run_step<Exec, float>(exec, group, handle, in[comm.rank()], CombineMode::Sum);
  const auto want = expected_step(c, in, comm.rank(), CombineMode::Sum, false);
  BOOST_TEST(got.status.recv_demand == want.status.recv_demand);
  if (comm.rank() == comm.size() - 1) BOOST_TEST(got.status.recv_demand > c.max_recv_tokens_per_rank);
  // Without drop_on_overflow the same step fails at the synchronization on every rank when any rank overflowed;
  // each reports its own overflow, or the lowest rank that overflowed.
  c.drop_on_overflow = false;
  EpGroup<Exec> strict(exec, comm, c);
  auto sh = strict.make_handle({false, "strict"});
  StepViews<Exec, float> s(c, in[comm.rank()]);
  ep_layout(exec, sh, s.idx);
  const OracleLayout o = oracle_layout(c, in);
  int culprit = -1;
  for (int j = comm.size() - 1; j >= 0; --j)
    if (o.dropped_recv[j] > 0) culprit = j;
  if (o.dropped_recv[comm.rank()] > 0) culprit = comm.rank();
  if (culprit >= 0) {
    BOOST_CHECK_EXCEPTION(ep_synchronize(exec, sh), CapacityOverflow, [&](const CapacityOverflow& e) {
      return e.capacity() == c.max_recv_tokens_per_rank && e.rank() == culprit && e.demand() == o.demand[culprit];
    });
  } else {
    BOOST_CHECK_NO_THROW(ep_synchronize(exec, sh));
  }
}

// The minimal case of a kept row that was never written (3 ranks; any R >= 2 runs it): E = 4R, K = 1, B = 2,
// capacity 1, drop on overflow. Rank 0 routes nothing, rank 1 sends its 2 tokens to expert 1, rank 2 one token to
// expert 0 (experts 0 and 1 live on rank 0). Rank 0 keeps rank 2's row in row 0; rank 2's combine returns the
// expert's output for it. The segments of rank 1's overflowing slots must not hide rank 2's segment from the
// receive side's search (3, 5 and 6 ranks are where they did).
BOOST_AUTO_TEST_CASE_TEMPLATE(kept_rows_arrive_at_every_world_size, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  Exec exec;
  const Communicator& comm = ep_comm<Exec>();
  const int R = comm.size(), me = comm.rank();
  EpGroupConfig c = tiny_capacity_config(R, 4);
  c.drop_on_overflow = true;
  std::vector<RankInputs> in;
  for (int r = 0; r < R; ++r) {
    std::vector<int> idx = {-1, -1};
    if (r == 1) idx = {1, 1};
    if (r == 2) idx = {0, -1};
    in.push_back(explicit_inputs(c, r, idx, 601));
  }
  for (CombineMode m : {CombineMode::Sum, CombineMode::Weighted}) {
    EpGroup<Exec> group(exec, comm, c);
    auto handle = group.make_handle();
    const StepOutputs got = run_step<Exec, float>(exec, group, handle, in[me], m);
    const StepOutputs want = expected_step(c, in, me, m, false);
    compare("recv_x", got.recv_x, want.recv_x, false, want.recv_x.size());
    compare("y", got.y, want.y, false, want.y.size());
    BOOST_TEST(got.recv_expert == want.recv_expert, boost::test_tools::per_element());
    BOOST_TEST(got.status.dropped_slots == want.status.dropped_slots);
    BOOST_TEST(got.status.dropped_recv_slots == want.status.dropped_recv_slots);
    if (R >= 3 && me == 0) {
      // Row 0 is rank 2's token 0 (expert 0 comes first); rank 1's two rows for expert 1 are past the capacity.
      BOOST_TEST(got.recv_expert[0] == 0);
      for (int h = 0; h < c.hidden_size; ++h) BOOST_TEST(got.recv_x[h] == in[2].x[h]);
      BOOST_TEST(got.status.dropped_recv_slots == 2);
      BOOST_TEST(got.status.recv_demand == 3);
    }
    if (R >= 3 && me == 2) {
      const float cf = m == CombineMode::Weighted ? in[2].w[0] : 1.0f;
      for (int h = 0; h < c.hidden_size; ++h) BOOST_TEST(close(got.y[h], cf * expert_fn(in[2].x[h], 0, false), false));
    }
    if (R >= 2 && me == 1) BOOST_TEST(got.status.dropped_slots == (R >= 3 ? 2 : 1));
  }
}

// Overflow without drop: the receiver whose demand exceeds its capacity throws CapacityOverflow with its own
// demand, and so does every other rank (naming that rank), so no rank goes on alone into the next collective.
BOOST_AUTO_TEST_CASE_TEMPLATE(overflow_raises_on_every_rank, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  Exec exec;
  const Communicator& comm = ep_comm<Exec>();
  const int R = comm.size(), me = comm.rank();
  EpGroupConfig c = tiny_capacity_config(R, 2);
  const int victim = 1 % R;       // rank 1, or rank 0 itself at one rank
  const int expert = victim * 2;  // its first local expert
  std::vector<RankInputs> in;
  for (int r = 0; r < R; ++r)
    in.push_back(explicit_inputs(c, r, r == 0 ? std::vector<int>{expert, expert} : std::vector<int>{-1, -1}, 602));
  for (bool drop : {false, true}) {
    c.drop_on_overflow = drop;
    EpGroup<Exec> group(exec, comm, c);
    auto handle = group.make_handle({false, "overflow"});
    StepViews<Exec, float> sv(c, in[me]);
    const auto t0 = std::chrono::steady_clock::now();
    ep_layout(exec, handle, sv.idx);
    if (!drop) {
      BOOST_CHECK_EXCEPTION(ep_synchronize(exec, handle), CapacityOverflow, [&](const CapacityOverflow& e) {
        BOOST_TEST_MESSAGE("rank " << me << ": " << e.what());
        return e.rank() == victim && e.demand() == 2 && e.capacity() == 1;
      });
      BOOST_TEST(seconds_since(t0) < 2.0);
    } else {
      const EpStatus st = ep_synchronize(exec, handle);
      BOOST_TEST(st.recv_demand == (me == victim ? 2 : 0));
      BOOST_TEST(st.dropped_recv_slots == (me == victim ? 1 : 0));
      BOOST_TEST(st.dropped_slots == (me == 0 ? 1 : 0));
    }
  }
  // Every rank is still in step: a full step against the oracle.
  c.drop_on_overflow = true;
  step_still_matches_oracle(exec, comm, c, in, "y after the overflow");
}

// Randomized capacity-mode steps with drops against the oracle: shapes, alignment, capacity, layout, routing, mode
// and row type drawn from one seed (the same on every rank), at every world size the suites run at.
BOOST_AUTO_TEST_CASE_TEMPLATE(randomized_capacity_steps_match_oracle, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  const Communicator& comm = ep_comm<Exec>();
  const int R = comm.size();
  std::mt19937 gen(7001u + static_cast<unsigned>(R));
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(gen); };
  const Routing routings[] = {Routing::Uniform,          Routing::Skewed,       Routing::AllToOneExpert,
                              Routing::SomeExpertsEmpty, Routing::WithMinusOne, Routing::Duplicates};
  const int cases = 24;
  int dropped_somewhere = 0;
  for (int i = 0; i < cases; ++i) {
    EpGroupConfig c;
    c.ep_size = R;
    c.num_experts = R * pick(1, 6);
    c.topk = pick(1, std::min(4, c.num_experts));
    c.hidden_size = i % 3 == 0 ? 13 : 16;  // 13: the element-wise path
    c.max_tokens_per_rank = pick(1, 10);
    const bool fixed = i % 5 == 4;
    c.layout = fixed ? RecvLayout::ExpertMajorFixed : RecvLayout::ExpertMajor;
    c.expert_alignment = fixed ? 1 : std::vector<int>{1, 2, 3, 4}[pick(0, 3)];
    // Mostly below the demand, so that slots drop: the room left after the first experts' rows is what the
    // receiver keeps.
    c.max_recv_tokens_per_rank = fixed ? 0 : pick(1, c.max_tokens_per_rank * c.topk * R / (i % 2 == 0 ? 4 : 1) + 1);
    c.drop_on_overflow = true;
    const Routing routing = fixed ? Routing::Duplicates : routings[pick(0, 5)];
    const CombineMode mode = i % 2 == 0 ? CombineMode::Weighted : CombineMode::Sum;
    const std::string label = "random case " + std::to_string(i) + " (E " + std::to_string(c.num_experts) + ", K " +
                              std::to_string(c.topk) + ", B " + std::to_string(c.max_tokens_per_rank) + ", C " +
                              std::to_string(c.max_recv_tokens_per_rank) + ", A " + std::to_string(c.expert_alignment) +
                              (fixed ? ", fixed" : "") + ")";
    const bool vary = i % 3 == 2 && c.max_tokens_per_rank >= 3;  // T = B - (rank % 3), T = 0 on rank 1
    const auto in = group_inputs(c, routing, 7100 + i, i % 4 == 1, vary);
    const OracleLayout o = oracle_layout(c, in);
    for (int d : o.dropped_recv) dropped_somewhere += d > 0;
    if (i % 4 == 1) {
      check_step<Exec, bf16_t>(c, routing, mode, 7100 + i, vary, label);
    } else {
      check_step<Exec, float>(c, routing, mode, 7100 + i, vary, label);
    }
  }
  BOOST_TEST(dropped_somewhere > 0, "no random case dropped a slot: the drop paths went untested");
}

BOOST_AUTO_TEST_CASE_TEMPLATE(graph_capture_replays_new_routing, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  if (!is_cuda<Exec>()) {
    BOOST_TEST_MESSAGE(
        "graph capture needs Kokkos::Cuda; capacity mode's no-sync property is covered by "
        "no_stray_communication on host spaces");
    return;
  }
#if defined(KOKKOS_ENABLE_CUDA)
  if constexpr (std::is_same<Exec, Kokkos::Cuda>::value) {
    using Mem = typename Exec::memory_space;
    const Communicator& comm = ep_comm<Exec>();
    auto c = default_config(comm.size());
    c.max_tokens_per_rank = 24;
    c.max_recv_tokens_per_rank = c.max_tokens_per_rank * c.topk * c.ep_size;
    cudaStream_t stream = nullptr;
    cudaStreamCreate(&stream);
    {
      Kokkos::Cuda exec(stream);
      EpGroup<Exec> group(exec, comm, c);
      auto handle = group.make_handle({false, "graph"});
      const auto in1 = group_inputs(c, Routing::Uniform, 501, false, false);
      const auto in2 = group_inputs(c, Routing::Skewed, 502, false, false);
      StepViews<Exec, float> s(c, in1[comm.rank()]);
      const int N = group.capacity_rows();
      Kokkos::View<float**, Kokkos::LayoutRight, Mem> rx("rx", N, c.hidden_size), y("y", s.x.extent(0), c.hidden_size);
      Kokkos::View<float*, Mem> rw("rw", N);
      // Warm up once eagerly (Kokkos' lazy first-launch setup), then capture layout, dispatch and combine.
      ep_layout(exec, handle, s.idx);
      ep_dispatch(exec, handle, s.x, s.w, rx, rw);
      ep_combine(exec, handle, CombineMode::Weighted, rx, s.w, y);
      ep_synchronize(exec, handle);
      cudaGraph_t graph = nullptr;
      BOOST_TEST_REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
      ep_layout(exec, handle, s.idx);
      ep_dispatch(exec, handle, s.x, s.w, rx, rw);
      ep_combine(exec, handle, CombineMode::Weighted, rx, s.w, y);
      BOOST_TEST_REQUIRE(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
      cudaGraphExec_t inst = nullptr;
      BOOST_TEST_REQUIRE(cudaGraphInstantiate(&inst, graph, 0) == cudaSuccess);
      // New routing and tokens in the same buffers, then replay.
      StepViews<Exec, float> s2(c, in2[comm.rank()]);
      Kokkos::deep_copy(s.idx, s2.idx);
      Kokkos::deep_copy(s.w, s2.w);
      Kokkos::deep_copy(s.x, s2.x);
      Kokkos::fence();
      BOOST_TEST_REQUIRE(cudaGraphLaunch(inst, stream) == cudaSuccess);
      ep_synchronize(exec, handle);
      const auto want = expected_step(c, in2, comm.rank(), CombineMode::Weighted, false);
      // Rows past off(L) are never written: they hold whatever the first routing left there.
      compare("recv_x (replayed)", to_host_floats(rx), want.recv_x, false,
              static_cast<std::size_t>(want.offsets.back()) * c.hidden_size);
      // The captured combine ran on the received rows themselves (an identity expert): y = sum of w * x.
      const std::vector<float> y_identity = identity_combine(c, in2, comm.rank());
      compare("y (replayed)", to_host_floats(y), y_identity, false, y_identity.size());
      cudaGraphExecDestroy(inst);
      cudaGraphDestroy(graph);
    }
    cudaStreamDestroy(stream);
  }
#endif
}

BOOST_AUTO_TEST_CASE(dp_and_ep_groups_follow_the_mesh) {
  const Communicator& world = host_world();
  const Test::Mesh mesh = host_mesh();
  const Communicator& ep = ep_comm<Kokkos::DefaultHostExecutionSpace>();
  const Communicator& dp = host_dp();
  BOOST_TEST(ep.size() == mesh.ep);
  BOOST_TEST(dp.size() == mesh.dp);
  BOOST_TEST(ep.rank() == world.rank() % mesh.ep);
  BOOST_TEST(dp.rank() == world.rank() / mesh.ep);
}

BOOST_AUTO_TEST_SUITE_END()
