/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// Quantile Balancing benchmarks (docs/router.md §19), the shapes of TransformerEngine's QB comparison: E = 384
// (Kimi K2) and 896, k = 8 and 16, 1000 bins, bias linspace(-0.2, 0.2, E), bounds [-1.2, 1.2] (every required bias
// inside), logits ~N(0, 1), float and bf16_t; each call timed whole (router and histogram), the histogram
// accumulating over the calls. Beside them, the plain Sigmoid forward of the same shape with the same bias
// (`plain`), the reference point of QB's overhead, and the histogram pass alone (`histogram`: qb_histogram_accumulate
// on a saved intermediate and cutoff, named with float/bytemap and k = 8, on which it does not depend).
//
// Names: router_qb/<fused|two_pass|plain|histogram>/E:<E>/k:<k>/<dtype>/<bytemap|idx32>/T:<T>[...]/manual_time;
// device_us as in the other router benchmarks (CUDA events on the instance's stream behind a spin kernel, median).

#include <KokkosMoE_Router.hpp>
#include <KokkosMoE_RouterQB.hpp>

#include <Kokkos_Core.hpp>

#include <benchmark/benchmark.h>

#include <memory>
#include <string>
#include <vector>

#include "KokkosMoE_PerfHelpers.hpp"

namespace KokkosMoE {
namespace Perf {
namespace {

template <class T>
using View1 = Kokkos::View<T*, MemSpace>;
template <class T>
using View2 = Kokkos::View<T**, Kokkos::LayoutRight, MemSpace>;

/// Fused / TwoPass: topk_router_qb(_indices) in that mode; Plain: topk_router(_indices) of the same shape; Histogram:
/// qb_histogram_accumulate alone on the intermediate and cutoff of one QB forward (the second pass of both modes).
enum class QbOp { Fused, TwoPass, Plain, Histogram };
const char* qb_op_name(QbOp op) {
  switch (op) {
    case QbOp::Fused:
      return "fused";
    case QbOp::TwoPass:
      return "two_pass";
    case QbOp::Plain:
      return "plain";
    default:
      return "histogram";
  }
}

constexpr int kQbBins = 1000;

/// The buffers of one QB shape and the call being timed.
class QbFixture {
 public:
  virtual ~QbFixture() = default;
  virtual void run() = 0;
  double bytes_per_token = 0;
};

template <class Scalar>
class QbFixtureT final : public QbFixture {
 public:
  QbFixtureT(QbOp op, int E, int k, bool indices, std::int64_t T) : m_op(op), m_indices(indices) {
    m_cfg.topk = k;
    m_cfg.score_function = ScoreFunction::Sigmoid;
    m_qb.histogram_mode = op == QbOp::TwoPass ? QbHistogramMode::TwoPass : QbHistogramMode::FusedAtomic;
    m_qb.validate_bin_bounds = false;  // validated once below, as a graph-captured trainer would
    m_logits = alloc2<Scalar>("logits", T, E);
    fill_normal(m_logits, 11, 0.0f, 1.0f);
    m_bias = View1<float>("KokkosMoE::perf::bias", E);
    auto hb = Kokkos::create_mirror_view(m_bias);
    for (int e = 0; e < E; ++e) hb(e) = E > 1 ? -0.2f + 0.4f * static_cast<float>(e) / static_cast<float>(E - 1) : 0.0f;
    Kokkos::deep_copy(m_bias, hb);
    m_bounds = View1<float>("KokkosMoE::perf::bin_bounds", 2);
    auto hbounds = Kokkos::create_mirror_view(m_bounds);
    hbounds(0) = -1.2f;
    hbounds(1) = 1.2f;
    Kokkos::deep_copy(m_bounds, hbounds);
    validate_qb_bin_bounds(m_exec, m_bounds);
    m_probs = alloc2<Scalar>("probs", T, E);
    if (indices)
      m_idx = alloc2<std::int32_t>("indices", T, k);
    else
      m_map = alloc2<std::uint8_t>("routing_map", T, E);
    m_inter = alloc2<float>("intermediate", T, E);
    m_cutoff = View1<float>("KokkosMoE::perf::cutoff", T);
    m_hist = View2<std::int32_t>("KokkosMoE::perf::histogram", E, kQbBins);
    const double s = sizeof(Scalar), e = E;
    // Read logits; write probs, the FP32 intermediate and the routing output (Bytemap E, int32 indices 4k); QB adds
    // the cutoff (4) and, two-pass, a re-read of the intermediate (4E). The [E, bins] histogram is per call.
    bytes_per_token = e * (2 * s + 4) + (indices ? 4.0 * k : e) + (op == QbOp::Plain ? 0.0 : 4.0) +
                      (op == QbOp::TwoPass ? 4.0 * e : 0.0);
    if (op == QbOp::Histogram) {  // read the intermediate and the cutoff
      bytes_per_token = 4.0 * e + 4.0;
      topk_router_qb(m_exec, m_cfg, m_qb, m_logits, m_bias, m_bounds, m_probs, m_map, m_inter, m_cutoff, m_hist);
    }
    run();  // warm-up
    m_exec.fence();
  }
  void run() override {
    if (m_op == QbOp::Histogram) {
      qb_histogram_accumulate(m_exec, m_qb, m_inter, m_cutoff, m_bounds, m_hist);
    } else if (m_op == QbOp::Plain) {
      if (m_indices)
        topk_router_indices(m_exec, m_cfg, m_logits, m_bias, m_probs, m_idx, m_inter);
      else
        topk_router(m_exec, m_cfg, m_logits, m_bias, m_probs, m_map, m_inter);
    } else if (m_indices) {
      topk_router_qb_indices(m_exec, m_cfg, m_qb, m_logits, m_bias, m_bounds, m_probs, m_idx, m_inter, m_cutoff,
                             m_hist);
    } else {
      topk_router_qb(m_exec, m_cfg, m_qb, m_logits, m_bias, m_bounds, m_probs, m_map, m_inter, m_cutoff, m_hist);
    }
  }

 private:
  ExecSpace m_exec;
  QbOp m_op;
  bool m_indices;
  RouterConfig m_cfg;
  QbConfig m_qb;
  View2<Scalar> m_logits, m_probs;
  View1<float> m_bias, m_bounds, m_cutoff;
  View2<std::uint8_t> m_map;
  View2<std::int32_t> m_idx, m_hist;
  View2<float> m_inter;
};

using QbCache = FixtureSlot<QbFixture>;
const bool qb_cleanup_registered = add_cleanup(&QbCache::release);

template <class Scalar>
void bm_qb(benchmark::State& state, QbOp op, int E, int k, bool indices, const std::string& name) {
  const std::int64_t T = state.range(0);
  const std::string key = name + "/T:" + std::to_string(T);
  try {
    if (QbCache::key() != key) {
      QbCache::release();
      QbCache::fixture() = std::make_unique<QbFixtureT<Scalar>>(op, E, k, indices, T);
      QbCache::key() = key;
    }
  } catch (const std::exception& e) {
    QbCache::release();
    state.SkipWithError(e.what());
    return;
  }
  QbFixture* f = QbCache::fixture().get();
  ExecSpace exec;
  const double seconds = timed_loop(state, exec, [&](std::int64_t) { f->run(); });
  set_counters(state, T, f->bytes_per_token, seconds);
  if (has_device_timer())
    state.counters["device_us"] = device_time_us(exec, kDeviceTimeIters, [&](std::int64_t) { f->run(); });
  state.SetLabel("E=" + std::to_string(E) + " k=" + std::to_string(k) + ", " + std::to_string(kQbBins) + " bins");
}

template <class Scalar>
void register_qb(QbOp op, int E, int k, bool indices) {
  const std::string name = std::string("router_qb/") + qb_op_name(op) + "/E:" + std::to_string(E) +
                           "/k:" + std::to_string(k) + "/" + dtype_name<Scalar>() + "/" +
                           (indices ? "idx32" : "bytemap");
  auto* b = benchmark::RegisterBenchmark(
      name.c_str(), [=](benchmark::State& state) { bm_qb<Scalar>(state, op, E, k, indices, name); });
  b->ArgName("T")->UseManualTime()->Unit(benchmark::kMicrosecond);
  if (options().min_time > 0)
    b->MinTime(options().min_time);
  else
    b->Iterations(1);
  for (std::int64_t T : options().tokens.empty() ? std::vector<std::int64_t>{4096, 16384, 65536} : options().tokens)
    b->Arg(T);
}

void register_qb_benchmarks() {
  for (int E : {384, 896})
    for (int k : {8, 16})
      for (QbOp op : {QbOp::Fused, QbOp::TwoPass, QbOp::Plain})
        for (bool indices : {false, true}) {
          register_qb<float>(op, E, k, indices);
          register_qb<bf16_t>(op, E, k, indices);
        }
  // The histogram pass depends on neither the logits' type nor the routing output.
  for (int E : {384, 896}) register_qb<float>(QbOp::Histogram, E, 8, false);
}
const bool qb_registered = add_registrar(&register_qb_benchmarks);

}  // namespace
}  // namespace Perf
}  // namespace KokkosMoE
