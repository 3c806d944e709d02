/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_TEST_EPSTEP_HPP
#define KOKKOSMOE_TEST_EPSTEP_HPP

// One MoE layer step through the library (layout, dispatch, test expert, combine, combine backward, expert
// backward, dispatch backward) and its expected values from the oracle of EpOracle.hpp.

#include <KokkosMoE_EP.hpp>

#include <Kokkos_Core.hpp>

#include <EpOracle.hpp>
#include <EpTestEnv.hpp>
#include <Fp8Oracle.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace KokkosMoE::Test {

/// What the step's outputs hold before the library writes them (exact in bf16).
constexpr float kSentinel = -512.0f;

/// Upstream gradient of combine's output on rank `rank`, token t, element h.
inline float upstream_grad(int rank, int t, int h, bool bf16) {
  const float g = 0.03125f * static_cast<float>((t * 7 + h * 3 + rank * 5) % 17) - 0.25f;
  return bf16 ? round_bf16(g) : g;
}
/// The slope of expert_fn (its derivative) for expert e.
inline float expert_slope(int e) { return 1.0f + static_cast<float>(e % 5) * 0.125f; }
/// The upstream gradient the test gives dispatch's recv_w.
inline float recv_w_grad(float w, int l) { return 0.5f * w + 0.125f * static_cast<float>(l); }

template <class Scalar>
inline float to_row(float v) {
  return std::is_same<Scalar, bf16_t>::value ? round_bf16(v) : v;
}

/// The FP8 dispatches of one handle: the rows quantized in the pack, the rows quantized first by quantize_fp8_rows
/// (`given`), and the rows quantized in the pack with power-of-two scales (Fp8ScaleFormat::Ue8m0).
struct Fp8Outputs {
  std::vector<std::uint8_t> q, q_given, q_ue8m0;
  std::vector<float> scales, scales_given, scales_ue8m0, w, w_given;
};

struct StepOutputs {
  int recv_rows = 0;
  std::vector<float> recv_x, recv_w, out, y, grad_out, grad_w_combine, grad_x, grad_w_dispatch;
  std::vector<int> recv_expert, tokens_per_expert, tokens_per_rank, counts, offsets;
  std::vector<std::uint8_t> token_in_rank, slot_kept;
  // Where the hidden size is a multiple of 128: the same layout's FP8 dispatches (docs/ep.md §3.5); on the decode
  // path also its FP8 forms (§15) on a second handle, each the layout fused in as ep_decode_dispatch.
  Fp8Outputs fp8, fp8_decode;
  EpStatus status;
};

/// The code sentinel of FP8 receive rows (a finite code no test row produces in the tail rows).
constexpr std::uint8_t kSentinelCode = 0x5a;

// Every copy goes through the step's execution space instance, never a global fence: several ranks of one process
// (loopback) each run their step from their own thread, and a global fence would wait for a peer's kernels that wait
// for this rank.
template <class Exec, class View>
auto mirror_of(const Exec& exec, const View& v) {
  Kokkos::View<typename View::non_const_data_type, typename View::array_layout, Kokkos::HostSpace> h(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "KokkosMoE::test::host_copy"), v.layout());
  Kokkos::deep_copy(exec, h, v);
  exec.fence();
  return h;
}

template <class Exec, class View>
std::vector<float> to_host_floats(const Exec& exec, const View& v) {
  auto h = mirror_of(exec, v);
  std::vector<float> out(h.size());
  const auto* p = h.data();
  for (std::size_t i = 0; i < h.size(); ++i) out[i] = static_cast<float>(p[i]);
  return out;
}
template <class T, class Exec, class View>
std::vector<T> to_host(const Exec& exec, const View& v) {
  auto h = mirror_of(exec, v);
  return std::vector<T>(h.data(), h.data() + h.size());
}

/// The same copies on the View's default execution space instance (single-rank-per-process tests).
template <class View>
std::vector<float> to_host_floats(const View& v) {
  return to_host_floats(typename View::execution_space(), v);
}
template <class T, class View>
std::vector<T> to_host(const View& v) {
  return to_host<T>(typename View::execution_space(), v);
}

template <class Exec, class Scalar>
struct StepViews {
  using Mem = typename Exec::memory_space;
  Kokkos::View<int**, Kokkos::LayoutRight, Mem> idx;
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> w;
  Kokkos::View<Scalar**, Kokkos::LayoutRight, Mem> x;
  template <class E>
  StepViews(const E& exec, const EpGroupConfig& c, const RankInputs& in)
      : idx("idx", in.T, c.topk), w("w", in.T, c.topk), x("x", in.T, c.hidden_size) {
    auto hi = Kokkos::create_mirror_view(idx);
    auto hw = Kokkos::create_mirror_view(w);
    auto hx = Kokkos::create_mirror_view(x);
    for (int t = 0; t < in.T; ++t) {
      for (int k = 0; k < c.topk; ++k) {
        hi(t, k) = in.idx[static_cast<std::size_t>(t) * c.topk + k];
        hw(t, k) = in.w[static_cast<std::size_t>(t) * c.topk + k];
      }
      for (int h = 0; h < c.hidden_size; ++h) hx(t, h) = Scalar(in.x[static_cast<std::size_t>(t) * c.hidden_size + h]);
    }
    Kokkos::deep_copy(exec, idx, hi);
    Kokkos::deep_copy(exec, w, hw);
    Kokkos::deep_copy(exec, x, hx);
    exec.fence();
  }
  explicit StepViews(const EpGroupConfig& c, const RankInputs& in) : StepViews(Exec(), c, in) {}
};

/// Work between a split send and its hook, on the same instance (docs/ep.md §14): it must not disturb the step. It
/// allocates nothing: freeing device memory synchronizes the whole device, and loopback peers on it may be waiting
/// for this rank's next signal.
template <class Exec, class View>
void other_work(const Exec& exec, const View& busy) {
  Kokkos::parallel_for(
      "test_other_work", Kokkos::RangePolicy<Exec>(exec, 0, busy.extent(0)),
      KOKKOS_LAMBDA(int i) { busy(i) = static_cast<float>(i) * 0.5f; });
}

/// The test's expert on the received rows (expert_fn of EpOracle.hpp): out = recv_x * slope(e) + (e % 3) / 16 for
/// every row of a local expert, 0 for padding and dropped rows. `me` and `L` locate the global expert ids.
template <class Exec, class ExpertView, class RowsIn, class RowsOut>
void test_expert(const Exec& exec, int me, int L, const ExpertView& recv_expert, const RowsIn& recv_x,
                 const RowsOut& out) {
  using Scalar = typename RowsOut::value_type;
  const int H = static_cast<int>(out.extent(1));
  Kokkos::parallel_for(
      "test_expert", Kokkos::RangePolicy<Exec>(exec, 0, static_cast<std::int64_t>(recv_expert.extent(0)) * H),
      KOKKOS_LAMBDA(std::int64_t i) {
        const int r = static_cast<int>(i / H), h = static_cast<int>(i % H);
        const int l = recv_expert(r);
        if (l < 0) {
          out(r, h) = Scalar(0.0f);
          return;
        }
        const int e = me * L + l;
        float v = static_cast<float>(recv_x(r, h)) * (1.0f + static_cast<float>(e % 5) * 0.125f) +
                  static_cast<float>(e % 3) * 0.0625f;
        out(r, h) = Scalar(v);
      });
}

/// The backward of test_expert: grad_recv_x = grad_out * slope(e), and recv_w's upstream gradient recv_w_grad.
template <class Exec, class ExpertView, class WIn, class RowsIn, class RowsOut, class WOut>
void test_expert_backward(const Exec& exec, int me, int L, const ExpertView& recv_expert, const WIn& recv_w,
                          const RowsIn& grad_out, const RowsOut& grad_recv_x, const WOut& grad_recv_w) {
  using Scalar = typename RowsOut::value_type;
  const int H = static_cast<int>(grad_recv_x.extent(1));
  Kokkos::parallel_for(
      "test_expert_backward", Kokkos::RangePolicy<Exec>(exec, 0, static_cast<std::int64_t>(recv_expert.extent(0)) * H),
      KOKKOS_LAMBDA(std::int64_t i) {
        const int r = static_cast<int>(i / H), h = static_cast<int>(i % H);
        const int l = recv_expert(r);
        const int e = me * L + (l < 0 ? 0 : l);
        grad_recv_x(r, h) = Scalar(l < 0 ? 0.0f : static_cast<float>(grad_out(r, h)) * (1.0f + (e % 5) * 0.125f));
        if (h == 0) grad_recv_w(r) = l < 0 ? 0.0f : 0.5f * recv_w(r) + 0.125f * static_cast<float>(l);
      });
}

/// The whole step on this rank; `me` and `L` locate the global expert ids of the received rows. \p rows >= 0
/// allocates the receive Views with that many rows before the layout (the oracle's count; loopback ranks allocate
/// nothing while their peers' kernels run), -1 after it. \p split: dispatch and combine in their two halves, other
/// work between a send and its hook. \p decode: the layout and the dispatch as one ep_decode_dispatch (a fixed-layout
/// group; its receive rows start zeroed, since the masked slabs' tails are not written).
template <class Exec, class Scalar>
StepOutputs run_step(const Exec& exec, EpGroup<Exec>& group, EpHandle<Exec>& handle, const RankInputs& in,
                     CombineMode mode, int rows = -1, bool split = false, bool decode = false) {
  using Mem = typename Exec::memory_space;
  const EpGroupConfig& c = group.config();
  const int H = c.hidden_size, K = c.topk, T = in.T, me = group.rank(), L = group.num_local_experts();
  constexpr bool is_bf16 = std::is_same<Scalar, bf16_t>::value;
  StepViews<Exec, Scalar> sv(exec, c, in);
  if (decode && rows < 0) rows = group.capacity_rows();
  const int N = rows >= 0 ? rows : (ep_layout(exec, handle, sv.idx), handle.num_recv_rows());
  Kokkos::View<Scalar**, Kokkos::LayoutRight, Mem> recv_x("recv_x", N, H), out("out", N, H), grad_out("grad_out", N, H),
      grad_recv_x("grad_recv_x", N, H);
  Kokkos::View<float*, Mem> recv_w("recv_w", N), grad_recv_w("grad_recv_w", N);
  Kokkos::View<Scalar**, Kokkos::LayoutRight, Mem> y("y", T, H), grad_y("grad_y", T, H), grad_x("grad_x", T, H);
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> grad_wc("grad_wc", T, K), grad_wd("grad_wd", T, K);
  Kokkos::View<float*, Mem> busy("busy", split ? 4096 : 0);
  auto hg = Kokkos::create_mirror_view(grad_y);
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) hg(t, h) = Scalar(upstream_grad(me, t, h, is_bf16));
  // Every output starts as a sentinel: a row or entry the library leaves unwritten shows up against the oracle.
  Kokkos::deep_copy(exec, recv_x, Scalar(kSentinel));
  Kokkos::deep_copy(exec, recv_w, kSentinel);
  Kokkos::deep_copy(exec, grad_out, Scalar(kSentinel));
  Kokkos::deep_copy(exec, y, Scalar(kSentinel));
  Kokkos::deep_copy(exec, grad_x, Scalar(kSentinel));
  Kokkos::deep_copy(exec, grad_wc, kSentinel);
  Kokkos::deep_copy(exec, grad_wd, kSentinel);
  if (decode) {
    Kokkos::deep_copy(exec, recv_x, Scalar(0.0f));
    Kokkos::deep_copy(exec, recv_w, 0.0f);
    ep_decode_dispatch(exec, handle, sv.idx, sv.x, sv.w, recv_x, recv_w);
  } else if (rows >= 0) {
    ep_layout(exec, handle, sv.idx);
    if (handle.num_recv_rows() > N)
      throw std::runtime_error("the layout needs " + std::to_string(handle.num_recv_rows()) + " receive rows, " +
                               std::to_string(N) + " were allocated");
  }
  if (split && !decode) {
    const auto hook = ep_dispatch_send(exec, handle, sv.x, sv.w, recv_x, recv_w);
    other_work(exec, busy);
    hook(exec);
  } else if (!decode) {
    ep_dispatch(exec, handle, sv.x, sv.w, recv_x, recv_w);
  }
  StepOutputs o;
  if (H % kFp8BlockChannels == 0) {
    const int nb = H / kFp8BlockChannels;
    Kokkos::View<fp8_e4m3_t**, Kokkos::LayoutRight, Mem> rq("recv_q", N, H), rq2("recv_q_given", N, H), xq("x_q", T, H);
    Kokkos::View<float**, Kokkos::LayoutRight, Mem> rs("recv_scales", N, nb), rs2("recv_scales_given", N, nb),
        xs("x_scales", T, nb);
    Kokkos::View<float*, Mem> rw8("recv_w_fp8", N), rw8b("recv_w_fp8_given", N), rw8c("recv_w_fp8_ue8m0", N);
    Kokkos::View<fp8_e4m3_t**, Kokkos::LayoutRight, Mem> rq3("recv_q_ue8m0", N, H);
    Kokkos::View<float**, Kokkos::LayoutRight, Mem> rs3("recv_scales_ue8m0", N, nb);
    Kokkos::deep_copy(exec, rq, fp8_e4m3_t::from_bits(kSentinelCode));
    Kokkos::deep_copy(exec, rq2, fp8_e4m3_t::from_bits(kSentinelCode));
    Kokkos::deep_copy(exec, rq3, fp8_e4m3_t::from_bits(kSentinelCode));
    Kokkos::deep_copy(exec, rs, kSentinel);
    Kokkos::deep_copy(exec, rs2, kSentinel);
    Kokkos::deep_copy(exec, rs3, kSentinel);
    Kokkos::deep_copy(exec, rw8, kSentinel);
    Kokkos::deep_copy(exec, rw8b, kSentinel);
    quantize_fp8_rows(exec, sv.x, xq, xs);
    if (split) {
      const auto h1 = ep_dispatch_send(exec, handle, sv.x, sv.w, fp8_rows(rq, rs), rw8);
      other_work(exec, busy);
      h1(exec);
      const auto h2 = ep_dispatch_send(exec, handle, fp8_rows(xq, xs), sv.w, fp8_rows(rq2, rs2), rw8b);
      other_work(exec, busy);
      h2(exec);
    } else {
      ep_dispatch(exec, handle, sv.x, sv.w, fp8_rows(rq, rs), rw8);
      ep_dispatch(exec, handle, fp8_rows(xq, xs), sv.w, fp8_rows(rq2, rs2), rw8b);
    }
    Fp8QuantizeConfig pow2;
    pow2.scale_format = Fp8ScaleFormat::Ue8m0;
    ep_dispatch(exec, handle, sv.x, sv.w, fp8_rows(rq3, rs3), rw8c, pow2);
    auto codes = [&](const auto& v) {
      auto h = mirror_of(exec, v);
      std::vector<std::uint8_t> out(h.size());
      for (std::size_t i = 0; i < h.size(); ++i) out[i] = h.data()[i].bits;
      return out;
    };
    auto read = [&](Fp8Outputs& f) {
      f.q = codes(rq);
      f.q_given = codes(rq2);
      f.q_ue8m0 = codes(rq3);
      f.scales = to_host_floats(exec, rs);
      f.scales_given = to_host_floats(exec, rs2);
      f.scales_ue8m0 = to_host_floats(exec, rs3);
      f.w = to_host_floats(exec, rw8);
      f.w_given = to_host_floats(exec, rw8b);
    };
    read(o.fp8);
    if (decode) {
      // The masked slabs' tails are not written: the receive rows start zeroed, as the oracle's unkept rows are.
      auto h8 = group.make_handle({false, "decode FP8"});
      for (const auto& v : {rq, rq2, rq3}) Kokkos::deep_copy(exec, v, fp8_e4m3_t::from_bits(0));
      for (const auto& v : {rs, rs2, rs3}) Kokkos::deep_copy(exec, v, 0.0f);
      Kokkos::deep_copy(exec, rw8, 0.0f);
      Kokkos::deep_copy(exec, rw8b, 0.0f);
      ep_decode_dispatch(exec, h8, sv.idx, sv.x, sv.w, fp8_rows(rq, rs), rw8);
      ep_decode_dispatch(exec, h8, sv.idx, fp8_rows(xq, xs), sv.w, fp8_rows(rq2, rs2), rw8b);
      ep_decode_dispatch(exec, h8, sv.idx, sv.x, Kokkos::View<float**, Kokkos::LayoutRight, Mem>(), fp8_rows(rq3, rs3),
                         Kokkos::View<float*, Mem>(), pow2);
      ep_synchronize(exec, h8);
      read(o.fp8_decode);
    }
  }
  auto recv_expert = handle.recv_expert();
  test_expert(exec, me, L, recv_expert, recv_x, out);
  if (split) {
    const auto hook = ep_combine_send(exec, handle, mode, out, sv.w, y);
    other_work(exec, busy);
    hook(exec);
  } else {
    ep_combine(exec, handle, mode, out, sv.w, y);
  }
  Kokkos::deep_copy(exec, grad_y, hg);
  if (split) {
    const auto hook = ep_combine_backward_send(exec, handle, mode, grad_y, sv.w, out, grad_out, grad_wc);
    other_work(exec, busy);
    hook(exec);
  } else {
    ep_combine_backward(exec, handle, mode, grad_y, sv.w, out, grad_out, grad_wc);
  }
  test_expert_backward(exec, me, L, recv_expert, recv_w, grad_out, grad_recv_x, grad_recv_w);
  if (split) {
    const auto hook = ep_dispatch_backward_send(exec, handle, grad_recv_x, grad_recv_w, grad_x, grad_wd);
    other_work(exec, busy);
    hook(exec);
  } else {
    ep_dispatch_backward(exec, handle, grad_recv_x, grad_recv_w, grad_x, grad_wd);
  }
  o.status = ep_synchronize(exec, handle);
  o.recv_rows = handle.num_recv_rows();
  o.recv_x = to_host_floats(exec, recv_x);
  o.recv_w = to_host_floats(exec, recv_w);
  o.out = to_host_floats(exec, out);
  o.y = to_host_floats(exec, y);
  o.grad_out = to_host_floats(exec, grad_out);
  o.grad_w_combine = to_host_floats(exec, grad_wc);
  o.grad_x = to_host_floats(exec, grad_x);
  o.grad_w_dispatch = to_host_floats(exec, grad_wd);
  o.recv_expert = to_host<int>(exec, recv_expert);
  o.tokens_per_expert = to_host<int>(exec, handle.tokens_per_expert());
  o.tokens_per_rank = to_host<int>(exec, handle.tokens_per_rank());
  o.counts = to_host<int>(exec, handle.count_matrix());
  o.offsets = to_host<int>(exec, handle.expert_offsets());
  o.token_in_rank = to_host<std::uint8_t>(exec, handle.token_in_rank());
  o.slot_kept = to_host<std::uint8_t>(exec, handle.slot_kept());
  return o;
}

/// The FP8 outputs of a step against the oracle's, bit for bit: "" when equal, else what differs first.
inline std::string fp8_differences(const StepOutputs& got, const StepOutputs& want) {
  std::string out;
  auto first = [](const auto& a, const auto& b) {
    if (a.size() != b.size())
      return std::string(" has ") + std::to_string(a.size()) + " values, expected " + std::to_string(b.size());
    for (std::size_t i = 0; i < a.size(); ++i)
      if (std::memcmp(&a[i], &b[i], sizeof(a[i])) != 0)
        return "[" + std::to_string(i) + "] = " + std::to_string(+a[i]) + ", expected " + std::to_string(+b[i]);
    return std::string();
  };
  auto add = [&](const char* kind, const Fp8Outputs& g, const Fp8Outputs& w) {
    const std::pair<const char*, std::string> checks[] = {
        {"recv_q", first(g.q, w.q)},
        {"recv_scales", first(g.scales, w.scales)},
        {"recv_w", first(g.w, w.w)},
        {"recv_q (given rows)", first(g.q_given, w.q_given)},
        {"recv_scales (given rows)", first(g.scales_given, w.scales_given)},
        {"recv_w (given rows)", first(g.w_given, w.w_given)},
        {"recv_q (UE8M0 scales)", first(g.q_ue8m0, w.q_ue8m0)},
        {"recv_scales (UE8M0 scales)", first(g.scales_ue8m0, w.scales_ue8m0)}};
    for (const auto& [what, d] : checks)
      if (!d.empty()) out += std::string(kind) + what + d + "; ";
  };
  add("FP8 dispatch: ", got.fp8, want.fp8);
  if (!got.fp8_decode.q.empty()) add("FP8 decode dispatch: ", got.fp8_decode, want.fp8);
  return out;
}

/// The oracle's values for rank `me` of the same step.
inline StepOutputs expected_step(const EpGroupConfig& c, const std::vector<RankInputs>& in, int me, CombineMode mode,
                                 bool bf16) {
  const OracleLayout o = oracle_layout(c, in);
  const int H = c.hidden_size, K = c.topk, L = o.L;
  auto row = [&](float v) { return bf16 ? round_bf16(v) : v; };
  StepOutputs e;
  e.recv_rows = o.recv_rows[me];
  const int N = e.recv_rows;
  e.recv_expert = o.recv_expert[me];
  e.recv_x.assign(static_cast<std::size_t>(N) * H, 0.0f);
  e.recv_w.assign(N, 0.0f);
  e.out.assign(static_cast<std::size_t>(N) * H, 0.0f);
  e.grad_out.assign(static_cast<std::size_t>(N) * H, 0.0f);
  for (int r = 0; r < N; ++r) {
    const int l = o.recv_expert[me][r];
    if (l < 0) continue;
    const int i = o.row_src_rank[me][r], t = o.row_src_token[me][r], k = o.row_src_k[me][r];
    const float wv = in[i].w[static_cast<std::size_t>(t) * K + k];
    const float cf = mode == CombineMode::Weighted ? wv : 1.0f;
    e.recv_w[r] = wv;
    for (int h = 0; h < H; ++h) {
      const float xv = in[i].x[static_cast<std::size_t>(t) * H + h];
      e.recv_x[static_cast<std::size_t>(r) * H + h] = xv;
      e.out[static_cast<std::size_t>(r) * H + h] = expert_fn(xv, me * L + l, bf16);
      e.grad_out[static_cast<std::size_t>(r) * H + h] = row(cf * upstream_grad(i, t, h, bf16));
    }
  }
  // Rows past off(L) (capacity mode's tail, owned by no expert) are never written: they keep the sentinel.
  for (int r = o.offsets[me][L]; r < N; ++r) {
    e.recv_w[r] = kSentinel;
    for (int h = 0; h < H; ++h) {
      e.recv_x[static_cast<std::size_t>(r) * H + h] = kSentinel;
      e.grad_out[static_cast<std::size_t>(r) * H + h] = kSentinel;
    }
  }
  if (H % 128 == 0) {
    // Each kept receive row's codes and scales from its (exact) row; zeros in the slabs' other rows, the sentinels
    // past off(L); recv_w as for the other dispatch.
    const int nb = H / 128;
    for (const bool ue8m0 : {false, true}) {
      std::vector<std::uint8_t>& codes = ue8m0 ? e.fp8.q_ue8m0 : e.fp8.q;
      std::vector<float>& scales = ue8m0 ? e.fp8.scales_ue8m0 : e.fp8.scales;
      codes.assign(static_cast<std::size_t>(N) * H, 0);
      scales.assign(static_cast<std::size_t>(N) * nb, 0.0f);
      for (int r = 0; r < N; ++r) {
        std::uint8_t* q = codes.data() + static_cast<std::size_t>(r) * H;
        float* sc = scales.data() + static_cast<std::size_t>(r) * nb;
        if (r >= o.offsets[me][L]) {
          std::fill(q, q + H, kSentinelCode);
          std::fill(sc, sc + nb, kSentinel);
        } else if (o.recv_expert[me][r] >= 0) {
          fp8_oracle_quantize_row(e.recv_x.data() + static_cast<std::size_t>(r) * H, H, ue8m0, 1e-4f, q, sc);
        }
      }
    }
    e.fp8.q_given = e.fp8.q;
    e.fp8.scales_given = e.fp8.scales;
    e.fp8.w = e.recv_w;
    e.fp8.w_given = e.recv_w;
  }
  const RankInputs& mine = in[me];
  const int T = mine.T, R = c.ep_size;
  e.y.assign(static_cast<std::size_t>(T) * H, 0.0f);
  e.grad_x.assign(static_cast<std::size_t>(T) * H, 0.0f);
  e.grad_w_combine.assign(static_cast<std::size_t>(T) * K, 0.0f);
  e.grad_w_dispatch.assign(static_cast<std::size_t>(T) * K, 0.0f);
  // y and grad_x (docs/ep.md §3.3, §3.4): each rank that holds kept slots of the token sums them in k order in FP32
  // and rounds to the row type; the token's rank adds these partials in ascending rank order from +0 and rounds.
  for (int t = 0; t < T; ++t) {
    for (int h = 0; h < H; ++h) {
      float acc = 0.0f, gacc = 0.0f;
      for (int r = 0; r < R; ++r) {
        float part = 0.0f, gpart = 0.0f;
        bool any = false;
        for (int k = 0; k < K; ++k) {
          const std::size_t q = static_cast<std::size_t>(t) * K + k;
          if (o.slot_row[me][q] < 0 || mine.idx[q] / L != r) continue;
          any = true;
          const int ex = mine.idx[q];
          const float cf = mode == CombineMode::Weighted ? mine.w[q] : 1.0f;
          const float ov = expert_fn(mine.x[static_cast<std::size_t>(t) * H + h], ex, bf16);
          part += cf * ov;
          const float go = row(cf * upstream_grad(me, t, h, bf16));
          gpart += row(go * expert_slope(ex));
        }
        if (!any) continue;
        acc += row(part);
        gacc += row(gpart);
      }
      e.y[static_cast<std::size_t>(t) * H + h] = row(acc);
      e.grad_x[static_cast<std::size_t>(t) * H + h] = row(gacc);
    }
    for (int k = 0; k < K; ++k) {
      const std::size_t q = static_cast<std::size_t>(t) * K + k;
      if (o.slot_row[me][q] < 0) continue;
      const int ex = mine.idx[q];
      if (mode == CombineMode::Weighted) {
        float d = 0.0f;
        for (int h = 0; h < H; ++h)
          d += upstream_grad(me, t, h, bf16) * expert_fn(mine.x[static_cast<std::size_t>(t) * H + h], ex, bf16);
        e.grad_w_combine[q] = d;
      }
      e.grad_w_dispatch[q] = recv_w_grad(mine.w[q], ex % L);
    }
  }
  // Layout outputs of this rank.
  const int E = c.num_experts;
  e.tokens_per_expert.assign(E, 0);
  e.tokens_per_rank.assign(R, 0);
  e.token_in_rank.assign(static_cast<std::size_t>(T) * R, 0);
  for (int t = 0; t < T; ++t)
    for (int k = 0; k < K; ++k) {
      const int ex = mine.idx[static_cast<std::size_t>(t) * K + k];
      if (ex < 0) continue;
      ++e.tokens_per_expert[ex];
      e.token_in_rank[static_cast<std::size_t>(t) * R + ex / L] = 1;
    }
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) e.tokens_per_rank[r] += e.token_in_rank[static_cast<std::size_t>(t) * R + r];
  e.counts.assign(static_cast<std::size_t>(R) * (E + 1), 0);
  for (int i = 0; i < R; ++i)
    for (int ex : in[i].idx)
      if (ex >= 0) ++e.counts[static_cast<std::size_t>(i) * (E + 1) + ex];
  e.status.recv_demand = o.demand[me];
  e.status.dropped_slots = o.dropped[me];
  e.status.dropped_recv_slots = o.dropped_recv[me];
  e.offsets = o.offsets[me];
  for (int v : o.slot_row[me]) e.slot_kept.push_back(v >= 0 ? 1 : 0);
  return e;
}

/// What the decode path's count matrix promises (docs/ep.md §15): rank \p me's own experts' columns and the invalid
/// column; the rest set to 0.
inline std::vector<int> decode_counts(const EpGroupConfig& c, std::vector<int> counts, int me) {
  const int E = c.num_experts, L = E / c.ep_size;
  for (std::size_t j = 0; j < counts.size(); ++j) {
    const int e = static_cast<int>(j % static_cast<std::size_t>(E + 1));
    if (e != E && e / L != me) counts[j] = 0;
  }
  return counts;
}

/// The Weighted combine of an identity expert (the received rows themselves) on rank \p me: y = sum of w * x over the
/// kept slots, FP32 rows.
inline std::vector<float> identity_combine(const EpGroupConfig& c, const std::vector<RankInputs>& in, int me) {
  const OracleLayout o = oracle_layout(c, in);
  const RankInputs& mine = in[me];
  std::vector<float> y(static_cast<std::size_t>(mine.T) * c.hidden_size, 0.0f);
  for (int t = 0; t < mine.T; ++t)
    for (int h = 0; h < c.hidden_size; ++h) {
      float acc = 0.0f;
      for (int k = 0; k < c.topk; ++k) {
        const std::size_t q = static_cast<std::size_t>(t) * c.topk + k;
        if (o.slot_row[me][q] >= 0) acc += mine.w[q] * mine.x[static_cast<std::size_t>(t) * c.hidden_size + h];
      }
      y[static_cast<std::size_t>(t) * c.hidden_size + h] = acc;
    }
  return y;
}

}  // namespace KokkosMoE::Test

#endif
