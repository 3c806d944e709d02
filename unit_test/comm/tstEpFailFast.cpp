/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// One rank's bad call fails every rank at once (docs/ep.md §2): every operation's per-call checks join one vote
// before it communicates. For each mistake, made by one rank only (a different rank per case), the offending rank
// throws its own InvalidArgument naming the argument and every other rank InvalidArgument (peer_invalid_argument)
// naming that rank and argument, all within 2 s (the communicator's timeout is far longer), and the same group and
// handle then serve a good step that equals the oracle. Rank 0 prints what every rank threw (a table).
#include <KokkosMoE_EnableDeviceTypes.hpp>

#include <EpCases.hpp>
#include <EpStep.hpp>
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

using namespace KokkosMoE;
using namespace KokkosMoE::Test;

namespace {

struct Outcome {
  bool threw = false;
  Rule rule = Rule::ShapeMismatch;
  std::string parameter, message;
  double seconds = 0.0;
};

template <class F>
Outcome attempt(F&& f) {
  Outcome o;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    f();
  } catch (const InvalidArgument& e) {
    o.threw = true;
    o.rule = e.rule();
    o.parameter = e.parameter();
    o.message = e.what();
  }
  o.seconds = seconds_since(t0);
  return o;
}

/// What every world rank threw in one case, printed by world rank 0.
void print_row(const std::string& what, int R, const Outcome& o) {
  struct Row {
    int threw, rule;
    double seconds;
    char parameter[24];
  } mine{o.threw ? 1 : 0, static_cast<int>(o.rule), o.seconds, {}};
  std::strncpy(mine.parameter, o.parameter.c_str(), sizeof(mine.parameter) - 1);
  std::vector<Row> all(static_cast<std::size_t>(world_size()));
  MPI_Allgather(&mine, sizeof(Row), MPI_BYTE, all.data(), sizeof(Row), MPI_BYTE, MPI_COMM_WORLD);
  if (world_rank() != 0) return;
  std::string line = "fail-fast | R = " + std::to_string(R) + " | " + what + " |";
  for (std::size_t r = 0; r < all.size(); ++r) {
    char cell[96];
    std::snprintf(cell, sizeof(cell), " rank %zu: %s(%s) %.3f s;", r,
                  all[r].threw ? rule_name(static_cast<Rule>(all[r].rule)) : "no error", all[r].parameter,
                  all[r].seconds);
    line += cell;
  }
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

/// One case: rank \p bad's call is invalid (own \p rule on \p parameter), every rank's call runs at once.
void expect_fail_fast(const std::string& what, int R, int me, int bad, const Outcome& o, Rule rule,
                      const std::string& parameter) {
  print_row(what, R, o);
  BOOST_TEST_CONTEXT(what << ", rank " << bad << " of " << R << " wrong; this is rank " << me) {
    BOOST_TEST(o.threw, "no error");
    BOOST_TEST(o.seconds < 2.0, "the typed error took " << o.seconds << " s");
    BOOST_TEST(o.parameter == parameter, o.message);
    if (me == bad || rule == Rule::ExpertIdRange) {
      BOOST_TEST(static_cast<int>(o.rule) == static_cast<int>(rule), o.message);
      if (me != bad) BOOST_TEST(o.message.find("rank " + std::to_string(bad)) != std::string::npos, o.message);
    } else {
      BOOST_TEST(static_cast<int>(o.rule) == static_cast<int>(Rule::PeerInvalidArgument), o.message);
      BOOST_TEST(o.message.find("rank " + std::to_string(bad)) != std::string::npos, o.message);
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(ep_fail_fast)

BOOST_AUTO_TEST_CASE_TEMPLATE(one_rank_bad_call_fails_every_rank_fast, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  using Mem = typename Exec::memory_space;
  using Rows = Kokkos::View<float**, Kokkos::LayoutRight, Mem>;
  using Flt = Kokkos::View<float*, Mem>;
  Exec exec;
  const Communicator& comm = ep_comm<Exec>();
  const int R = comm.size(), me = comm.rank();
  const auto c = default_config(R);
  const int H = c.hidden_size, K = c.topk;
  const auto in = group_inputs(c, Routing::Uniform, 23, false, false);
  const int T = in[me].T;
  EpGroup<Exec> group(exec, comm, c);
  auto handle = group.make_handle({false, "fail-fast"});
  StepViews<Exec, float> sv(exec, c, in[me]);
  int bad = 0;
  auto next_bad = [&] { return bad++ % R; };
  auto check = [&](const std::string& what, Rule rule, const std::string& parameter, int b, auto&& call) {
    expect_fail_fast(what, R, me, b, attempt(call), rule, parameter);
  };

  // ep_layout: topk_idx with K + 1 columns, then more tokens than max_tokens_per_rank.
  {
    const int b = next_bad();
    Kokkos::View<int**, Kokkos::LayoutRight, Mem> wide("wide", T, K + 1);
    check("ep_layout: topk_idx [T, K + 1]", Rule::ShapeMismatch, "topk_idx", b, [&] {
      if (me == b) {
        ep_layout(exec, handle, wide);
      } else {
        ep_layout(exec, handle, sv.idx);
      }
    });
  }
  {
    const int b = next_bad();
    Kokkos::View<int**, Kokkos::LayoutRight, Mem> many("many", c.max_tokens_per_rank + 1, K);
    check("ep_layout: T > max_tokens_per_rank", Rule::ShapeMismatch, "topk_idx", b,
          [&] { ep_layout(exec, handle, me == b ? many : sv.idx); });
  }
  // Eager mode's expert ids out of range: already found on every rank from the all-gathered counts.
  {
    const int b = next_bad();
    auto ids = Kokkos::create_mirror(sv.idx);  // a copy on host spaces too: sv.idx stays good
    Kokkos::deep_copy(ids, sv.idx);
    Kokkos::View<int**, Kokkos::LayoutRight, Mem> wrong("wrong", T, K);
    if (me == b && T > 0) ids(0, 0) = c.num_experts;
    Kokkos::deep_copy(wrong, ids);
    check("ep_layout: an expert id >= num_experts", Rule::ExpertIdRange, "topk_idx", b,
          [&] { ep_layout(exec, handle, wrong); });
  }
  ep_layout(exec, handle, sv.idx);
  const int N = handle.num_recv_rows();
  Rows recv_x("recv_x", N, H), out("out", N, H), y("y", T, H), grad_y("grad_y", T, H), grad_out("grad_out", N, H),
      grad_recv_x("grad_recv_x", N, H), grad_x("grad_x", T, H), grad_w("grad_w", T, K);
  Flt recv_w("recv_w", N), grad_recv_w("grad_recv_w", N);

  // ep_dispatch: rows of the wrong width, column-major rows, a receive View of the wrong width.
  {
    const int b = next_bad();
    Rows x_wide("x_wide", T, H + 1);
    check("ep_dispatch: x [T, H + 1]", Rule::ShapeMismatch, "x", b,
          [&] { ep_dispatch(exec, handle, me == b ? x_wide : sv.x, sv.w, recv_x, recv_w); });
  }
  {
    const int b = next_bad();
    Kokkos::View<float**, Kokkos::LayoutLeft, Mem> x_left("x_left", T, H);
    check("ep_dispatch: x column-major", Rule::NotContiguous, "x", b, [&] {
      if (me == b) {
        ep_dispatch(exec, handle, x_left, sv.w, recv_x, recv_w);
      } else {
        ep_dispatch(exec, handle, sv.x, sv.w, recv_x, recv_w);
      }
    });
  }
  {
    const int b = next_bad();
    Rows recv_wide("recv_wide", N, H + 1);
    check("ep_dispatch: recv_x [N, H + 1]", Rule::ShapeMismatch, "recv_x", b,
          [&] { ep_dispatch(exec, handle, sv.x, sv.w, me == b ? recv_wide : recv_x, recv_w); });
  }
  ep_dispatch(exec, handle, sv.x, sv.w, recv_x, recv_w);
  Kokkos::deep_copy(exec, out, recv_x);

  // ep_combine: a mode outside the enum, an output of the wrong width.
  {
    const int b = next_bad();
    check("ep_combine: mode 7", Rule::ConfigValue, "mode", b,
          [&] { ep_combine(exec, handle, me == b ? static_cast<CombineMode>(7) : CombineMode::Sum, out, sv.w, y); });
  }
  {
    const int b = next_bad();
    Rows y_wide("y_wide", T, H + 1);
    check("ep_combine: y [T, H + 1]", Rule::ShapeMismatch, "y", b,
          [&] { ep_combine(exec, handle, CombineMode::Weighted, out, sv.w, me == b ? y_wide : y); });
  }
  ep_combine(exec, handle, CombineMode::Weighted, out, sv.w, y);

  // The backwards: a gradient of the wrong token count, one of the wrong width.
  {
    const int b = next_bad();
    Rows gy_long("gy_long", T + 1, H);
    check("ep_combine_backward: grad_y [T + 1, H]", Rule::ShapeMismatch, "grad_y", b, [&] {
      ep_combine_backward(exec, handle, CombineMode::Weighted, me == b ? gy_long : grad_y, sv.w, out, grad_out, grad_w);
    });
  }
  ep_combine_backward(exec, handle, CombineMode::Weighted, grad_y, sv.w, out, grad_out, grad_w);
  {
    const int b = next_bad();
    Rows gx_wide("gx_wide", T, H + 2);
    check("ep_dispatch_backward: grad_x [T, H + 2]", Rule::ShapeMismatch, "grad_x", b,
          [&] { ep_dispatch_backward(exec, handle, grad_recv_x, grad_recv_w, me == b ? gx_wide : grad_x, grad_w); });
  }
  ep_dispatch_backward(exec, handle, grad_recv_x, grad_recv_w, grad_x, grad_w);

  // The receive hook's misuse: one rank skips its hook and goes on to the next operation (its own handle_state,
  // everyone else peer_invalid_argument), runs the hook late, then calls it twice (a local error: nobody waits).
  {
    const int b = next_bad();
    auto hook = ep_dispatch_send(exec, handle, sv.x, sv.w, recv_x, recv_w);
    if (me != b) hook(exec);
    check("ep_combine after a skipped receive hook", Rule::HandleState, "handle", b,
          [&] { ep_combine(exec, handle, CombineMode::Sum, out, sv.w, y); });
    if (me == b) {
      hook(exec);
      const Outcome twice = attempt([&] { hook(exec); });
      BOOST_TEST(twice.threw);
      BOOST_TEST(static_cast<int>(twice.rule) == static_cast<int>(Rule::HandleState), twice.message);
      BOOST_TEST(twice.seconds < 2.0);
    }
  }
  ep_synchronize(exec, handle);

  // A training handle reused before its backward ran, on one rank (the others' handles are for inference).
  {
    const int b = next_bad();
    auto layer = group.make_handle({me == b, "layer"});
    ep_layout(exec, layer, sv.idx);
    check("ep_layout: a training handle reused before its backward", Rule::HandleReuse, "handle", b,
          [&] { ep_layout(exec, layer, sv.idx); });
  }

  // The same group and handle serve a good step on every rank.
  const StepOutputs got = run_step<Exec, float>(exec, group, handle, in[me], CombineMode::Weighted);
  const StepOutputs want = expected_step(c, in, me, CombineMode::Weighted, false);
  compare("y after the failed calls", got.y, want.y, false, want.y.size());
  compare("grad_x after the failed calls", got.grad_x, want.grad_x, false, want.grad_x.size());
}

// FP8 rows: scales of the wrong shape at the receiver or in an FP8 source, on one rank.
BOOST_AUTO_TEST_CASE_TEMPLATE(one_rank_bad_fp8_call_fails_every_rank_fast, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  using Mem = typename Exec::memory_space;
  Exec exec;
  const Communicator& comm = ep_comm<Exec>();
  const int R = comm.size(), me = comm.rank();
  auto c = default_config(R);
  c.hidden_size = 128;
  const int H = c.hidden_size;
  const auto in = group_inputs(c, Routing::Uniform, 29, false, false);
  const int T = in[me].T;
  EpGroup<Exec> group(exec, comm, c);
  auto handle = group.make_handle({false, "fp8"});
  StepViews<Exec, float> sv(exec, c, in[me]);
  ep_layout(exec, handle, sv.idx);
  const int N = handle.num_recv_rows();
  Kokkos::View<fp8_e4m3_t**, Kokkos::LayoutRight, Mem> q("q", N, H), xq("xq", T, H);
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> scales("scales", N, H / 128), bad_scales("bad_scales", N, 2),
      xs("xs", T, H / 128), bad_xs("bad_xs", T + 1, H / 128);
  Kokkos::View<float*, Mem> recv_w("recv_w", N);
  {
    const int b = 0;
    const Outcome o =
        attempt([&] { ep_dispatch(exec, handle, sv.x, sv.w, fp8_rows(q, me == b ? bad_scales : scales), recv_w); });
    expect_fail_fast("ep_dispatch (FP8): recv scales [N, 2]", R, me, b, o, Rule::ShapeMismatch, "recv_scales");
  }
  {
    const int b = R - 1;
    const Outcome o = attempt(
        [&] { ep_dispatch(exec, handle, fp8_rows(xq, me == b ? bad_xs : xs), sv.w, fp8_rows(q, scales), recv_w); });
    expect_fail_fast("ep_dispatch (FP8 rows): x.scales [T + 1, H / 128]", R, me, b, o, Rule::ShapeMismatch, "x.scales");
  }
  // The handle goes on: a good FP8 dispatch on every rank.
  ep_dispatch(exec, handle, sv.x, sv.w, fp8_rows(q, scales), recv_w);
  ep_synchronize(exec, handle);
}

BOOST_AUTO_TEST_SUITE_END()
