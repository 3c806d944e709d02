/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// Router benchmarks: presets deepseek-v3 (with a random FP32 bias), qwen3-moe,
// mixtral and large (E = 1024, k = 32); float and bf16_t; forward (dense TE-compatible, bitmap, compact), backward
// (dense Bytemap, compact), aux scores forward/backward, aux loss forward/backward; Implementation::Auto and, where
// the default execution space has a specialization (Kokkos::Cuda), Implementation::Portable (the generic Kokkos
// kernels) for comparison. On host spaces Auto *is* the portable code, so Portable is not registered there.
//
// On a GPU, device_us is the CUDA-event device time of one call (median of kDeviceTimeIters calls on the instance's
// stream behind a spin kernel, the references' protocol), besides the fenced wall time of Google Benchmark's
// columns; small-T targets are judged on it.
//
// Benchmark names: router/<op>/<preset>/<dtype>/<impl>/<warm|cold>/T:<T>[/min_time:...]/manual_time.
// "warm" reuses one set of buffers; "cold" (deepseek-v3 dense forward on a GPU) rotates over enough buffer sets to
// exceed 4x a 50 MB L2, so every call reads its inputs from HBM.

#include <KokkosMoE_AuxLoss.hpp>
#include <KokkosMoE_Router.hpp>
#include <KokkosMoE_RouterPresets.hpp>

#include <Kokkos_Core.hpp>

#include <benchmark/benchmark.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "KokkosMoE_PerfHelpers.hpp"

namespace KokkosMoE {
namespace Perf {
namespace {

// True when Implementation::Auto dispatches to a vendor specialization on the default space (Kokkos::Cuda).
constexpr bool kHasSpecialization = Impl::TopkSpec<ExecSpace>::is_specialized;

template <class T>
using View0 = Kokkos::View<T, MemSpace>;
template <class T>
using View1 = Kokkos::View<T*, MemSpace>;
template <class T>
using View2 = Kokkos::View<T**, Kokkos::LayoutRight, MemSpace>;

enum class Op {
  FwdDense,
  FwdBitmap,
  FwdCompact,
  BwdDense,
  BwdCompact,
  AuxScoresFwd,
  AuxScoresBwd,
  AuxLossFwd,
  AuxLossBwd
};
constexpr Op kOps[] = {Op::FwdDense,     Op::FwdBitmap,    Op::FwdCompact, Op::BwdDense,  Op::BwdCompact,
                       Op::AuxScoresFwd, Op::AuxScoresBwd, Op::AuxLossFwd, Op::AuxLossBwd};

const char* op_name(Op op) {
  switch (op) {
    case Op::FwdDense:
      return "fwd_dense";
    case Op::FwdBitmap:
      return "fwd_bitmap";
    case Op::FwdCompact:
      return "fwd_compact";
    case Op::BwdDense:
      return "bwd_dense";
    case Op::BwdCompact:
      return "bwd_compact";
    case Op::AuxScoresFwd:
      return "aux_scores_fwd";
    case Op::AuxScoresBwd:
      return "aux_scores_bwd";
    case Op::AuxLossFwd:
      return "aux_loss_fwd";
    case Op::AuxLossBwd:
      return "aux_loss_bwd";
  }
  return "?";
}

/// Bytes per token each operation must move at least (docs/router.md §5.5, §17; docs/conventions.md §7), with s the
/// logits' element size, E experts, k = topk, map = E (Bytemap) or ceil(E/8) (BitmapU8). Per-call constants (the [E]
/// bias, tokens_per_expert, const_buf) are left out; they do not scale with T.
///   fwd_dense      E*(2s + 4) + E          read logits (sE); write probs (sE), FP32 intermediate (4E), Bytemap (E)
///   fwd_bitmap     E*(2s + 4) + ceil(E/8)  the same with a BitmapU8 map
///   fwd_compact    sE + 8k                 read logits; write int32 ids (4k) and FP32 weights (4k)
///   bwd_dense      E*(2s + 4) + E          read intermediate (4E), grad_probs (sE), Bytemap (E); write grad_logits
///   bwd_compact    sk + 8k + sE            read logits at the k ids (sk; the whole row sE for Softmax pre), ids
///                                          (4k), FP32 grad_weights (4k); write grad_logits (sE). §5.5: 592 B for
///                                          bf16, E = 256, k = 8
///   aux_scores_fwd sE + 8E + E             read logits; write FP32 scores and intermediate, Bytemap
///   aux_scores_bwd 8E + sE                 read FP32 intermediate and grad_scores; write grad_logits
///   aux_loss_fwd   sE                      read probs (the per-chunk partial sums, E floats per 256 rows, ignored)
///   aux_loss_bwd   sE                      write grad_probs
double bytes_per_token(Op op, const RouterPreset& p, double s) {
  const double E = p.num_experts, k = p.config.topk, map = E, bitmap = std::ceil(E / 8.0);
  const bool pre = p.config.score_function == ScoreFunction::Softmax && p.config.use_pre_softmax;
  switch (op) {
    case Op::FwdDense:
      return E * (2 * s + 4) + map;
    case Op::FwdBitmap:
      return E * (2 * s + 4) + bitmap;
    case Op::FwdCompact:
      return s * E + 8 * k;
    case Op::BwdDense:
      return E * (2 * s + 4) + map;
    case Op::BwdCompact:
      return (pre ? s * E : s * k) + 8 * k + s * E;
    case Op::AuxScoresFwd:
      return s * E + 8 * E + map;
    case Op::AuxScoresBwd:
      return 8 * E + s * E;
    case Op::AuxLossFwd:
    case Op::AuxLossBwd:
      return s * E;
  }
  return 0;
}

/// The buffers one call touches. Only those the operation needs are allocated.
template <class Scalar>
struct BufferSet {
  View2<Scalar> logits;
  View1<float> bias;  // empty View: no bias
  View2<Scalar> probs;
  View2<std::uint8_t> map;
  View2<float> inter;
  View2<std::int32_t> ids;
  View2<float> weights;
  View2<Scalar> grad_in;  // grad_probs (dense backward, aux loss input probs)
  View2<float> grad_in_f32;
  View2<Scalar> grad_out;  // grad_logits / grad_probs
  View2<float> scores;
  View1<std::int32_t> tpe;
  View0<Scalar> loss;
  View1<float> const_buf;
  View1<float> workspace;
  View0<float> grad_loss;
};

class Fixture {
 public:
  virtual ~Fixture() = default;
  virtual void run(std::int64_t iteration) = 0;
  double bytes_per_token = 0;
  int num_sets = 1;
};

template <class Scalar>
class RouterFixture final : public Fixture {
 public:
  RouterFixture(Op op, const RouterPreset& preset, Implementation impl, std::int64_t T, bool cold)
      : m_op(op), m_preset(preset), m_T(T) {
    m_cfg = preset.config;
    m_cfg.implementation = impl;
    m_cfg.map_format = op == Op::FwdBitmap ? RoutingMapFormat::BitmapU8 : RoutingMapFormat::Bytemap;
    m_aux.topk = preset.config.topk;
    m_aux.score_function = preset.config.score_function;
    m_aux.implementation = impl;
    m_loss.num_experts = preset.num_experts;
    m_loss.topk = preset.config.topk;
    m_loss.coeff = 1e-2f;
    m_loss.implementation = impl;
    bytes_per_token = Perf::bytes_per_token(op, preset, sizeof(Scalar));
    if (cold) {
      const double set_bytes = bytes_per_token * static_cast<double>(T);
      num_sets = std::max(2, static_cast<int>(std::ceil(4.0 * kL2Bytes / set_bytes)));
    }
    for (int i = 0; i < num_sets; ++i) m_sets.push_back(make_set(1000u * static_cast<std::uint64_t>(i + 1)));
    call(m_sets[0]);  // warm-up: first-touch, lazy module loading, caches
    m_exec.fence();
  }

  void run(std::int64_t iteration) override { call(m_sets[static_cast<std::size_t>(iteration % num_sets)]); }

 private:
  BufferSet<Scalar> make_set(std::uint64_t seed) {
    const std::int64_t T = m_T, E = m_preset.num_experts, k = m_cfg.topk;
    BufferSet<Scalar> b;
    const bool router_fwd = m_op == Op::FwdDense || m_op == Op::FwdBitmap || m_op == Op::FwdCompact;
    const bool is_aux_scores = m_op == Op::AuxScoresFwd || m_op == Op::AuxScoresBwd;
    const bool is_aux_loss = m_op == Op::AuxLossFwd || m_op == Op::AuxLossBwd;
    if (router_fwd || is_aux_scores || m_op == Op::BwdDense || m_op == Op::BwdCompact) {
      // Seeded ~N(0, 1), independent per element: every row differs, so tokens pick different experts and groups.
      b.logits = alloc2<Scalar>("logits", T, E);
      fill_normal(b.logits, seed + 1, 0.0f, 1.0f);
      if (m_preset.has_bias && !is_aux_scores) {
        // Random FP32 score correction, comparable to the spread of the sigmoid scores near the top-k boundary
        // (docs/router.md §16.2): it steers the selection without dominating it.
        b.bias = View1<float>(Kokkos::view_alloc(std::string("KokkosMoE::perf::bias"), Kokkos::WithoutInitializing), E);
        fill_uniform(b.bias, seed + 2, -0.02f, 0.02f);
      }
    }
    if (m_op == Op::FwdDense || m_op == Op::FwdBitmap || m_op == Op::BwdDense) {
      const std::int64_t map_cols = m_op == Op::FwdBitmap ? (E + 7) / 8 : E;
      b.probs = alloc2<Scalar>("probs", T, E);
      b.map = alloc2<std::uint8_t>("routing_map", T, map_cols);
      b.inter = alloc2<float>("intermediate", T, E);
    }
    if (m_op == Op::FwdCompact || m_op == Op::BwdCompact) {
      b.ids = alloc2<std::int32_t>("ids", T, k);
      b.weights = alloc2<float>("weights", T, k);
    }
    if (m_op == Op::BwdDense) {
      topk_router(m_exec, m_cfg, b.logits, b.bias, b.probs, b.map, b.inter);  // the saved state
      b.grad_in = alloc2<Scalar>("grad_probs", T, E);
      fill_uniform(b.grad_in, seed + 3, -1.0f, 1.0f);
      b.grad_out = alloc2<Scalar>("grad_logits", T, E);
    }
    if (m_op == Op::BwdCompact) {
      topk_router_compact(m_exec, m_cfg, b.logits, b.bias, b.ids, b.weights);
      b.grad_in_f32 = alloc2<float>("grad_weights", T, k);
      fill_uniform(b.grad_in_f32, seed + 3, -1.0f, 1.0f);
      b.grad_out = alloc2<Scalar>("grad_logits", T, E);
    }
    if (is_aux_scores) {
      b.scores = alloc2<float>("scores", T, E);
      b.map = alloc2<std::uint8_t>("routing_map", T, E);
      b.inter = alloc2<float>("intermediate", T, E);
    }
    if (m_op == Op::AuxScoresBwd) {
      aux_scores(m_exec, m_aux, b.logits, b.scores, b.map, b.inter);
      b.grad_in_f32 = alloc2<float>("grad_scores", T, E);
      fill_uniform(b.grad_in_f32, seed + 3, -1.0f, 1.0f);
      b.grad_out = alloc2<Scalar>("grad_logits", T, E);
    }
    if (is_aux_loss) {
      b.grad_in = alloc2<Scalar>("probs", T, E);  // probabilities-like values in [0, 2/E)
      fill_uniform(b.grad_in, seed + 4, 0.0f, 2.0f / static_cast<float>(E));
      b.tpe = View1<std::int32_t>(
          Kokkos::view_alloc(std::string("KokkosMoE::perf::tokens_per_expert"), Kokkos::WithoutInitializing), E);
      fill_uniform(b.tpe, seed + 5, 1.0f, 1000.0f);
      b.loss = View0<Scalar>("KokkosMoE::perf::loss");
      b.const_buf = View1<float>("KokkosMoE::perf::const_buf", 2);
      b.workspace = View1<float>("KokkosMoE::perf::workspace", aux_loss_workspace_size(T, E));
    }
    if (m_op == Op::AuxLossBwd) {
      aux_loss(m_exec, m_loss, b.grad_in, b.tpe, m_T, b.loss, b.const_buf, b.workspace);
      b.grad_loss = View0<float>("KokkosMoE::perf::grad_loss");
      Kokkos::deep_copy(m_exec, b.grad_loss, 1.0f);
      b.grad_out = alloc2<Scalar>("grad_probs", T, E);
    }
    m_exec.fence();
    return b;
  }

  void call(const BufferSet<Scalar>& b) {
    switch (m_op) {
      case Op::FwdDense:
      case Op::FwdBitmap:
        topk_router(m_exec, m_cfg, b.logits, b.bias, b.probs, b.map, b.inter);
        break;
      case Op::FwdCompact:
        topk_router_compact(m_exec, m_cfg, b.logits, b.bias, b.ids, b.weights);
        break;
      case Op::BwdDense:
        topk_router_backward(m_exec, m_cfg, b.map, b.inter, b.grad_in, b.grad_out);
        break;
      case Op::BwdCompact:
        topk_router_compact_backward(m_exec, m_cfg, b.logits, b.ids, b.grad_in_f32, b.grad_out);
        break;
      case Op::AuxScoresFwd:
        aux_scores(m_exec, m_aux, b.logits, b.scores, b.map, b.inter);
        break;
      case Op::AuxScoresBwd:
        aux_scores_backward(m_exec, m_aux, b.inter, b.grad_in_f32, b.grad_out);
        break;
      case Op::AuxLossFwd:
        aux_loss(m_exec, m_loss, b.grad_in, b.tpe, m_T, b.loss, b.const_buf, b.workspace);
        break;
      case Op::AuxLossBwd:
        aux_loss_backward(m_exec, m_loss, b.const_buf, b.tpe, b.grad_loss, b.grad_out);
        break;
    }
  }

  ExecSpace m_exec;
  Op m_op;
  RouterPreset m_preset;
  std::int64_t m_T;
  RouterConfig m_cfg;
  AuxScoresConfig m_aux;
  AuxLossConfig m_loss;
  std::vector<BufferSet<Scalar>> m_sets;
};

using Cache = FixtureSlot<Fixture>;
const bool cleanup_registered = add_cleanup(&Cache::release);

const char* impl_name(Implementation impl) { return impl == Implementation::Portable ? "portable" : "auto"; }

template <class Scalar>
void bm_router(benchmark::State& state, Op op, const std::string& preset_name, Implementation impl, bool cold,
               const std::string& name) {
  const std::int64_t T = state.range(0);
  const std::string key = name + "/T:" + std::to_string(T);
  Fixture* f = nullptr;
  try {
    if (Cache::key() != key) {
      Cache::release();  // free the previous instance's buffers before allocating
      Cache::fixture() = std::make_unique<RouterFixture<Scalar>>(op, router_preset(preset_name), impl, T, cold);
      Cache::key() = key;
    }
    f = Cache::fixture().get();
  } catch (const std::exception& e) {
    Cache::release();
    state.SkipWithError(e.what());
    return;
  }
  ExecSpace exec;
  const double seconds = timed_loop(state, exec, [&](std::int64_t i) { f->run(i); });
  set_counters(state, T, f->bytes_per_token, seconds);
  if (has_device_timer())
    state.counters["device_us"] = device_time_us(exec, kDeviceTimeIters, [&](std::int64_t i) { f->run(i); });
  const RouterPreset p = router_preset(preset_name);
  std::string label =
      std::string(impl_name(impl)) +
      (kHasSpecialization || impl == Implementation::Portable ? "" : " (= portable: no specialization for this space)");
  label += ", E=" + std::to_string(p.num_experts) + " k=" + std::to_string(p.config.topk) + ", ";
  label += cold ? "cold: " + std::to_string(f->num_sets) + " buffer sets" : std::string("warm");
  state.SetLabel(label);
}

template <class Scalar>
void register_one(Op op, const std::string& preset, Implementation impl, bool cold) {
  const std::string name = std::string("router/") + op_name(op) + "/" + preset + "/" + dtype_name<Scalar>() + "/" +
                           impl_name(impl) + "/" + (cold ? "cold" : "warm");
  auto* b = benchmark::RegisterBenchmark(
      name.c_str(), [=](benchmark::State& state) { bm_router<Scalar>(state, op, preset, impl, cold, name); });
  b->ArgName("T")->UseManualTime()->Unit(benchmark::kMicrosecond);
  if (options().min_time > 0)
    b->MinTime(options().min_time);
  else
    b->Iterations(1);  // --kokkosmoe_min_time=0: one timed call (smoke runs)
  for (std::int64_t T : token_counts()) b->Arg(T);
}

void register_router_benchmarks() {
  benchmark::AddCustomContext("router_specialization",
                              kHasSpecialization ? std::string(ExecSpace::name()) + " native kernels (Auto)"
                                                 : "none: Implementation::Auto runs the portable Kokkos kernels");
  std::vector<Implementation> impls = {Implementation::Auto};
  if (kHasSpecialization) impls.push_back(Implementation::Portable);
  for (const char* preset : {"deepseek-v3", "qwen3-moe", "mixtral", "large"}) {
    for (Op op : kOps) {
      for (Implementation impl : impls) {
        register_one<float>(op, preset, impl, false);
        register_one<bf16_t>(op, preset, impl, false);
      }
    }
  }
  if (options().cold) {
    register_one<float>(Op::FwdDense, "deepseek-v3", Implementation::Auto, true);
    register_one<bf16_t>(Op::FwdDense, "deepseek-v3", Implementation::Auto, true);
  }
}
const bool registered = add_registrar(&register_router_benchmarks);

}  // namespace
}  // namespace Perf
}  // namespace KokkosMoE
