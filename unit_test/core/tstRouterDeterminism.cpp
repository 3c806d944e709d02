/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// Determinism (docs/router.md §12): a battery of forward/backward/aux-score/aux-loss calls whose every output byte is
// collected. `two_runs_bitwise_equal` runs it twice in one process and compares every byte. `thread_dump` writes, per
// output, its size and two independent 64-bit digests of its bytes (FNV-1a, under which any single changed byte
// always changes the digest, and a multiply-rotate hash over 8-byte words) to $KOKKOSMOE_DETERMINISM_DUMP.<space>.txt;
// the ctest entries KokkosMoE_CoreTests.omp_threads_{1,2} run it under OMP_NUM_THREADS=1 and 2 (asserting the OpenMP
// concurrency through $KOKKOSMOE_EXPECT_OMP_THREADS) and KokkosMoE_CoreTests.omp_threads_compare compares the files.

#include <KokkosMoE_EnableDeviceTypes.hpp>

#include <boost/test/unit_test.hpp>

#include <cstdlib>
#include <fstream>
#include <utility>

#include "RouterRunner.hpp"

using namespace KokkosMoETest;
using Oracle::Score;

namespace {

using Blobs = std::vector<std::pair<std::string, std::vector<unsigned char>>>;

template <class T>
void add_blob(Blobs& blobs, const std::string& name, const std::vector<T>& v) {
  std::vector<unsigned char> bytes(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(bytes.data(), v.data(), bytes.size());
  blobs.emplace_back(name, std::move(bytes));
}

std::uint64_t fnv1a(const std::vector<unsigned char>& b) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : b) h = (h ^ c) * 0x100000001b3ull;
  return h;
}
std::uint64_t mix_words(const std::vector<unsigned char>& b) {
  std::uint64_t h = 0x9E3779B97F4A7C15ull ^ b.size();
  for (std::size_t i = 0; i < b.size(); i += 8) {
    std::uint64_t w = 0;
    std::memcpy(&w, b.data() + i, std::min<std::size_t>(8, b.size() - i));
    h = (h ^ (w * 0xC2B2AE3D27D4EB4Full)) * 0x9E3779B97F4A7C15ull;
    h = (h << 31) | (h >> 33);
  }
  return h;
}

template <class D, class S>
void router_battery(Blobs& blobs, const std::string& tag, const Oracle::Attr& a, int T, int E, bool with_bias,
                    std::uint64_t seed) {
  using Exec = typename D::execution_space;
  Exec exec{};
  // plain random inputs (no conditioning needed: ties are deterministic too)
  const auto logits =
      device_values<D, S>("logits", T, E, random_values<S>(static_cast<std::size_t>(T) * E, seed, -4, 4));
  V1<D, const S> bias;
  if (with_bias) bias = device_vector<D, S>("bias", random_values<S>(E, seed + 1, -0.5, 0.5));
  const auto gp = device_values<D, S>("grad_probs", T, E, random_values<S>(static_cast<std::size_t>(T) * E, seed + 2));
  const auto gw = device_values<D, float>("grad_weights", T, a.topk,
                                          random_values<float>(static_cast<std::size_t>(T) * a.topk, seed + 3));
  KokkosMoE::RouterConfig cfg = to_config(a);
  for (const Out out : kAllOuts) {
    const auto o = run_forward<D, S, S>(cfg, out, logits, bias);
    const auto h = fetch(o);
    const std::string n = tag + " " + out_name(out);
    add_blob(blobs, n + " probs", h.probs);
    add_blob(blobs, n + " intermediate", h.inter);
    add_blob(blobs, n + " map", h.map);
    add_blob(blobs, n + " indices", h.idx);
    add_blob(blobs, n + " weights", h.weights);
    auto gl = make2<D, S>("grad_logits", T, E, Num<S>::make(kSentinel));
    KokkosMoE::RouterConfig bc = cfg;
    if (out == Out::Bytemap || out == Out::Bitmap) {
      bc.map_format = out == Out::Bitmap ? KokkosMoE::RoutingMapFormat::BitmapU8 : KokkosMoE::RoutingMapFormat::Bytemap;
      KokkosMoE::topk_router_backward(exec, bc, o.map, o.inter, gp, gl);
    } else if (out == Out::I16) {
      KokkosMoE::topk_router_indices_backward(exec, bc, o.i16, o.inter, gp, gl);
    } else if (out == Out::I32) {
      KokkosMoE::topk_router_indices_backward(exec, bc, o.i32, o.inter, gp, gl);
    } else if (out == Out::I64) {
      KokkosMoE::topk_router_indices_backward(exec, bc, o.i64, o.inter, gp, gl);
    } else {
      KokkosMoE::topk_router_compact_backward(exec, bc, logits, o.ids, gw, gl);
    }
    exec.fence();
    add_blob(blobs, n + " grad_logits", download(gl));
  }
}

template <class D>
Blobs battery() {
  using Exec = typename D::execution_space;
  Blobs blobs;
  for (const auto impl : kImpls) {
    const std::string i = impl_name(impl);
    // DeepSeek-V3 (grouped, biased sigmoid, scale 2.5), Qwen3-style softmax, pre-softmax, large SqrtSoftplus
    router_battery<D, float>(blobs, i + " deepseek f32", make_attr(Score::Sigmoid, false, 8, 8, 4, 2.5), 1000, 256,
                             true, 1);
    router_battery<D, bf16_t>(blobs, i + " deepseek bf16", make_attr(Score::Sigmoid, false, 8, 8, 4, 2.5), 1000, 256,
                              true, 2);
    router_battery<D, float>(blobs, i + " softmax-post", make_attr(Score::Softmax, false, 8), 1000, 128, false, 3);
    router_battery<D, fp16_t>(blobs, i + " softmax-pre", make_attr(Score::Softmax, true, 4), 1000, 64, false, 4);
    router_battery<D, float>(blobs, i + " sqrtsoftplus", make_attr(Score::SqrtSoftplus, false, 32), 200, 1024, true, 5);
    // Mixtral (E = 8), the large preset (E = 1024, k = 32), Llama 4 (k = 1, no normalization), grouped softmax
    router_battery<D, bf16_t>(blobs, i + " mixtral", make_attr(Score::Softmax, false, 2), 1000, 8, false, 10);
    router_battery<D, bf16_t>(blobs, i + " large", make_attr(Score::Softmax, false, 32), 300, 1024, false, 11);
    router_battery<D, float>(blobs, i + " llama4", make_attr(Score::Sigmoid, false, 1), 1000, 16, false, 12);
    router_battery<D, fp16_t>(blobs, i + " grouped-pre", make_attr(Score::Softmax, true, 6, 4, 2, 1.5), 500, 96, false,
                              13);
  }
  Exec exec{};
  for (const auto impl : kImpls) {
    const std::string i = impl_name(impl);
    // aux scores
    const int T = 1000, E = 256;
    for (const Score f : {Score::Sigmoid, Score::SqrtSoftplus, Score::Softmax}) {
      KokkosMoE::AuxScoresConfig cfg;
      cfg.topk = 8;
      cfg.score_function = static_cast<KokkosMoE::ScoreFunction>(static_cast<int>(f));
      cfg.implementation = impl;
      const auto logits = device_values<D, bf16_t>("logits", T, E, random_values<bf16_t>(T * E, 6, -4, 4));
      auto s = make2<D, float>("s", T, E, 0.f), in = make2<D, float>("i", T, E, 0.f);
      auto m = make2<D, std::uint8_t>("m", T, E, 0);
      KokkosMoE::aux_scores(exec, cfg, logits, s, m, in);
      auto gl = make2<D, bf16_t>("gl", T, E, bf16_t());
      KokkosMoE::aux_scores_backward(exec, cfg, in, device_values<D, float>("gs", T, E, random_values<float>(T * E, 7)),
                                     gl);
      exec.fence();
      const std::string n = i + " aux_scores " + score_name(f, false);
      add_blob(blobs, n + " scores", download(s));
      add_blob(blobs, n + " map", download(m));
      add_blob(blobs, n + " intermediate", download(in));
      add_blob(blobs, n + " grad_logits", download(gl));
    }
    // aux loss: 5000 rows (20 row chunks), sequence aux loss m = 2, FP32 and bf16 probs
    const int R = 5000, C = 256;
    KokkosMoE::AuxLossConfig cfg;
    cfg.num_experts = 128;
    cfg.topk = 4;
    cfg.coeff = 0.01f;
    cfg.implementation = impl;
    std::vector<std::int32_t> tpe_h(C);
    for (int c = 0; c < C; ++c) tpe_h[c] = 1 + (c * 37) % 999;
    V1<D, std::int32_t> tpe("tpe", C);
    upload(tpe, tpe_h);
    const auto ws = make1<D, float>("ws", static_cast<std::int64_t>(KokkosMoE::aux_loss_workspace_size(R, C)), 0.f);
    const auto pf = device_values<D, float>("p", R, C, random_values<float>(R * C, 8, 0, 1));
    const auto pb = device_values<D, bf16_t>("p", R, C, random_values<bf16_t>(R * C, 9, 0, 1));
    V0<D, float> lf("lf");
    V0<D, bf16_t> lb("lb");
    const auto cf = make1<D, float>("cf", 2, 0.f), cb = make1<D, float>("cb", 2, 0.f);
    KokkosMoE::aux_loss(exec, cfg, pf, tpe, std::int64_t(2 * R), lf, cf, ws);
    KokkosMoE::aux_loss(exec, cfg, pb, tpe, std::int64_t(R), lb, cb, ws);
    V0<D, float> g("g");
    upload(g, std::vector<float>{0.5f});
    auto gpf = make2<D, float>("gp", R, C, 0.f);
    KokkosMoE::aux_loss_backward(exec, cfg, cf, tpe, g, gpf);
    exec.fence();
    add_blob(blobs, i + " aux_loss f32 loss", download(lf));
    add_blob(blobs, i + " aux_loss f32 const_buf", download(cf));
    add_blob(blobs, i + " aux_loss bf16 loss", download(lb));
    add_blob(blobs, i + " aux_loss bf16 const_buf", download(cb));
    add_blob(blobs, i + " aux_loss grad_probs", download(gpf));
  }
  return blobs;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(router_determinism)

BOOST_AUTO_TEST_CASE_TEMPLATE(two_runs_bitwise_equal, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  const Blobs a = battery<DeviceType>(), b = battery<DeviceType>();
  BOOST_TEST_REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    BOOST_TEST((a[i].first == b[i].first && bytes_equal(a[i].second, b[i].second)), a[i].first << ": two runs differ");
}

BOOST_AUTO_TEST_CASE_TEMPLATE(thread_dump, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
#if defined(KOKKOS_ENABLE_OPENMP)
  if (std::is_same_v<Exec, Kokkos::OpenMP>) {
    if (const char* expect = std::getenv("KOKKOSMOE_EXPECT_OMP_THREADS"))
      BOOST_TEST_REQUIRE(Kokkos::OpenMP().concurrency() == std::atoi(expect),
                         "OpenMP runs " << Kokkos::OpenMP().concurrency() << " threads, expected " << expect);
  }
#endif
  const Blobs blobs = battery<DeviceType>();
  BOOST_TEST(blobs.size() > 100u);
  const char* base = std::getenv("KOKKOSMOE_DETERMINISM_DUMP");
  if (!base) return;
  std::ofstream txt(std::string(base) + "." + Exec::name() + ".txt");
  BOOST_TEST_REQUIRE(txt.good());
  for (const auto& [name, bytes] : blobs)
    txt << std::hex << fnv1a(bytes) << ' ' << mix_words(bytes) << std::dec << ' ' << bytes.size() << ' ' << name
        << '\n';
  BOOST_TEST(txt.good());
}

BOOST_AUTO_TEST_SUITE_END()
