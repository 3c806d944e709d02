/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// Edges of docs/router.md §16.4: k = E, E = 1, E = 130 (partial last bitmap byte, zero padding), T = 0 for every entry
// point (and the aux loss's scalar outputs), token counts that are not multiples of anything, int16 indices at
// E = 32767, the SqrtSoftplus branch at x = 20, unusual scaling factors, strided-but-row-major and offset Views.

#include <KokkosMoE_EnableDeviceTypes.hpp>

#include <boost/test/unit_test.hpp>

#include "RouterGrid.hpp"

using namespace KokkosMoETest;
using Oracle::Score;

BOOST_AUTO_TEST_SUITE(router_edges)

BOOST_AUTO_TEST_CASE_TEMPLATE(k_equals_E, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  for (const Mode& m : kModes)
    for (int E : {1, 8, 130}) {
      run_router_case(make_random_case<DeviceType, float>(make_attr(m.f, m.pre, E, 0, 0, 1.2), 33, E, m.bias, E + 1),
                      RunFlags{true, true});
      if (E == 8)  // grouping with k = E: G = 2, gk = 2 (kg = 4 = E / G)
        run_router_case(make_random_case<DeviceType, bf16_t>(make_attr(m.f, m.pre, 8, 2, 2), 33, 8, m.bias, 5),
                        RunFlags{true, true});
    }
  // large k over a large row
  run_router_case(make_random_case<DeviceType, float>(make_attr(Score::Softmax, false, 1024), 3, 1024, false, 3),
                  RunFlags{true, true});
  run_router_case(make_random_case<DeviceType, float>(make_attr(Score::Sigmoid, false, 512, 8, 4), 3, 1024, true, 3),
                  RunFlags{true, true});
}

BOOST_AUTO_TEST_CASE_TEMPLATE(single_expert, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using D = DeviceType;
  const int T = 17;
  for (const Mode& m : kModes) {
    const Oracle::Attr a = make_attr(m.f, m.pre, 1, 0, 0, 1.2);
    const auto c = make_random_case<D, float>(a, T, 1, m.bias, 17);
    run_router_case(c, RunFlags{true, true});
    // by hand: the only expert is always routed; Softmax weights are exactly scale, the others scale * y
    for (const Out out : {Out::Bytemap, Out::Bitmap}) {
      const auto h = fetch(run_forward<D, float, float>(to_config(a), out, c.logits, c.bias));
      for (int t = 0; t < T; ++t) {
        BOOST_TEST(h.map[t] == 1);
        if (m.f == Score::Softmax) BOOST_TEST(h.probs[t] == 1.2f);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(bitmap_partial_last_byte, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using D = DeviceType;
  const int E = 130, T = 3;
  std::vector<double> x(static_cast<std::size_t>(T) * E);
  for (int t = 0; t < T; ++t)
    for (int e = 0; e < E; ++e) x[static_cast<std::size_t>(t) * E + e] = -e * 0.01;
  x[0 * E + 129] = 5;  // row 0: experts 129, 128, 0
  x[0 * E + 128] = 4;
  x[1 * E + 7] = 3;  // row 1: experts 7, 8, 0
  x[1 * E + 8] = 2;
  const auto logits = device_values<D, float>("logits", T, E, x);
  for (const auto impl : kImpls) {
    KokkosMoE::RouterConfig cfg = to_config(make_attr(Score::Softmax, false, 3));
    cfg.implementation = impl;
    const auto h = fetch(run_forward<D, float, float>(cfg, Out::Bitmap, logits, V1<D, const float>()));
    const int nb = 17;
    BOOST_TEST(static_cast<int>(h.map.size()) == T * nb);
    BOOST_TEST(h.map[0 * nb + 16] == 0x03);  // bits 0, 1 of the last byte; padding bits 2..7 zero
    BOOST_TEST(h.map[0 * nb + 0] == 0x01);
    BOOST_TEST(h.map[1 * nb + 0] == 0x81);  // experts 0 and 7
    BOOST_TEST(h.map[1 * nb + 1] == 0x01);  // expert 8
    BOOST_TEST(h.map[1 * nb + 16] == 0x00);
    BOOST_TEST(h.map[2 * nb + 0] == 0x07);  // experts 0, 1, 2
    // all selected: every byte 0xff except the last, 0x03 (padding over a 0xA5 sentinel cleared)
    cfg.topk = E;
    const auto all = fetch(run_forward<D, float, float>(cfg, Out::Bitmap, logits, V1<D, const float>()));
    for (int t = 0; t < T; ++t)
      for (int b = 0; b < nb; ++b) BOOST_TEST(all.map[t * nb + b] == (b == 16 ? 0x03 : 0xff));
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(zero_tokens, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using D = DeviceType;
  using Exec = typename D::execution_space;
  const Exec exec{};
  const int E = 8, k = 2;
  for (const Mode& m : kModes) {
    KokkosMoE::RouterConfig cfg = to_config(make_attr(m.f, m.pre, k));
    cfg.check_finite = true;
    const V2<D, const float> logits = make2<D, float>("logits", 0, E, 0.f);
    const V1<D, const float> bias = m.bias ? V1<D, const float>(make1<D, float>("bias", E, 0.f)) : V1<D, const float>();
    try {
      for (const Out out : kAllOuts) run_forward<D, float, float>(cfg, out, logits, bias);
      cfg.map_format = KokkosMoE::RoutingMapFormat::BitmapU8;
      KokkosMoE::topk_router_backward(exec, cfg, make2<D, std::uint8_t>("m", 0, 1, 0), make2<D, float>("i", 0, E, 0.f),
                                      make2<D, float>("g", 0, E, 0.f), make2<D, float>("gl", 0, E, 0.f));
      KokkosMoE::topk_router_indices_backward(exec, cfg, make2<D, std::int16_t>("x", 0, k, 0),
                                              make2<D, float>("i", 0, E, 0.f), make2<D, bf16_t>("g", 0, E, 0.f),
                                              make2<D, bf16_t>("gl", 0, E, 0.f));
      KokkosMoE::topk_router_compact_backward(exec, cfg, logits, make2<D, std::int32_t>("x", 0, k, 0),
                                              make2<D, float>("w", 0, k, 0.f), make2<D, float>("gl", 0, E, 0.f));
      KokkosMoE::AuxScoresConfig ac;
      ac.topk = k;
      ac.score_function = cfg.score_function;
      KokkosMoE::aux_scores(exec, ac, logits, make2<D, float>("s", 0, E, 0.f), make2<D, std::uint8_t>("m", 0, E, 0),
                            make2<D, float>("i", 0, E, 0.f));
      KokkosMoE::aux_scores_backward(exec, ac, make2<D, float>("i", 0, E, 0.f), make2<D, float>("g", 0, E, 0.f),
                                     make2<D, fp16_t>("gl", 0, E, fp16_t()));
      exec.fence();
    } catch (const std::exception& e) {
      BOOST_TEST(false, "T = 0 must be a valid no-op: " << e.what());
    }
  }
  // aux loss with R = 0: loss = 0 and Const are written (docs/router.md §4.3), for both overloads
  KokkosMoE::AuxLossConfig ac;
  ac.num_experts = 8;
  ac.topk = 2;
  ac.coeff = 0.01f;
  const float expect_const = ((8.0f * 0.01f) / 2.0f) / 4096.0f / 4096.0f;  // FP32, divisions in this order
  for (int device_total = 0; device_total < 2; ++device_total) {
    const auto probs = make2<D, bf16_t>("probs", 0, 16, bf16_t());
    const auto tpe = make1<D, std::int64_t>("tpe", 16, 5);
    V0<D, bf16_t> loss("loss");
    const auto cbuf = make1<D, float>("const_buf", 2, kSentinel);
    upload(loss, std::vector<bf16_t>{Num<bf16_t>::make(kSentinel)});
    const auto ws = make1<D, float>("ws", static_cast<std::int64_t>(KokkosMoE::aux_loss_workspace_size(0, 16)), 0.f);
    if (device_total) {
      V0<D, std::int64_t> total("total");
      upload(total, std::vector<std::int64_t>{4096});
      KokkosMoE::aux_loss(exec, ac, probs, tpe, total, loss, cbuf, ws);
    } else {
      KokkosMoE::aux_loss(exec, ac, probs, tpe, std::int64_t(4096), loss, cbuf, ws);
    }
    exec.fence();
    const auto cb = download(cbuf);
    BOOST_TEST(cb[0] == expect_const);
    BOOST_TEST(std::fabs(cb[0] - Oracle::aux_loss_const(8, 2, static_cast<double>(0.01f), 4096.0)) <= 1e-6 * cb[0]);
    BOOST_TEST(cb[1] == 0.0f);
    BOOST_TEST(Num<bf16_t>::raw(download(loss)[0]) == 0u);
    // backward with R = 0 is a no-op
    KokkosMoE::aux_loss_backward(exec, ac, cbuf, tpe, V0<D, float>("gl"), make2<D, float>("gp", 0, 16, 0.f));
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(odd_token_counts, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  std::uint64_t seed = 40;
  for (int T : {1, 2, 3, 33, 257, 1025})
    for (const Mode& m : {kModes[1], kModes[4]}) {
      run_router_case(make_random_case<DeviceType, float>(make_attr(m.f, m.pre, 2), T, 8, m.bias, ++seed),
                      RunFlags{true, true});
      run_router_case(
          make_random_case<DeviceType, bf16_t>(make_attr(m.f, m.pre, 4, 4, 2), T > 257 ? 31 : T, 64, m.bias, ++seed),
          RunFlags{true, true});
    }
}

// int16 dense indices at their limit E = 32767, the best expert at the last index (docs/router.md §16.4).
BOOST_AUTO_TEST_CASE_TEMPLATE(int16_indices_at_32767_experts, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  const int E = 32767, T = 3;
  for (const bool pre : {false, true}) {
    const Oracle::Attr a = make_attr(Score::Softmax, pre, 4, 0, 0, 1.2);
    RouterInputs in = generate_router_inputs<float>(a, T, E, false, 32767 + pre);
    in.x[E - 1] = 9.0;  // row 0: the last expert first, then the one before it
    in.x[E - 2] = 8.5;
    const auto c = make_case<DeviceType, float>(a, std::move(in));
    BOOST_TEST(c.ref[0].idx[0] == E - 1);
    BOOST_TEST(c.ref[0].idx[1] == E - 2);
    run_router_case(c, RunFlags{true, true});
  }
}

// SqrtSoftplus switches to the identity above x = 20 (docs/router.md §5.1).
BOOST_AUTO_TEST_CASE_TEMPLATE(sqrtsoftplus_branch_at_20, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  const std::vector<double> row = {19.5, 19.99, 20.0, 20.01, 20.5, 30.0, 80.0, -30.0, -80.0, 0.0, 1.0, 15.0};
  for (int k : {1, 3, 6}) {
    RouterInputs in;
    in.T = 1;
    in.E = static_cast<int>(row.size());
    for (double v : row) in.x.push_back(Num<float>::quantize(v));
    run_router_case(make_case<DeviceType, float>(make_attr(Score::SqrtSoftplus, false, k, 0, 0, 1.2), in),
                    RunFlags{true, true});
  }
}

// scaling_factor is applied in every mode; any finite value is allowed (docs/router.md §3, §4.7).
BOOST_AUTO_TEST_CASE_TEMPLATE(scaling_factors, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  std::uint64_t seed = 70;
  for (double scale : {0.0, -0.5, 2.5, 1e-3, 1e3})
    for (const Mode& m : kModes)
      run_router_case(
          make_random_case<DeviceType, float>(make_attr(m.f, m.pre, 4, 0, 0, scale), 19, 32, m.bias, ++seed),
          RunFlags{true, true});
}

// LayoutStride Views with row-major strides, and Views that start inside an allocation, are accepted and give the
// same bits as plain LayoutRight Views; the no-bias overload equals an empty bias View.
BOOST_AUTO_TEST_CASE_TEMPLATE(strided_offset_and_overloads, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using D = DeviceType;
  using Exec = typename D::execution_space;
  const Exec exec{};
  const int T = 9, E = 32, k = 4;
  const Oracle::Attr a = make_attr(Score::Sigmoid, false, k, 8, 4, 1.2);
  const auto c = make_random_case<D, float>(a, T, E, false, 12);
  const auto base = fetch(run_forward<D, float, float>(to_config(a), Out::Bytemap, c.logits, c.bias));
  // logits copied into rows 2..2+T of a larger View, probs/intermediate as LayoutStride Views with strides {E, 1}
  const auto big = make2<D, float>("big", T + 4, E, 0.f);
  Kokkos::deep_copy(Kokkos::subview(big, std::make_pair(2, 2 + T), Kokkos::ALL()), c.logits);
  const auto rows = Kokkos::subview(big, std::make_pair(2, 2 + T), Kokkos::ALL());
  const auto probs_mem = make2<D, float>("probs", T, E, kSentinel),
             inter_mem = make2<D, float>("inter", T, E, kSentinel);
  using Strided = Kokkos::View<float**, Kokkos::LayoutStride, D>;
  const Strided probs(probs_mem.data(), Kokkos::LayoutStride(T, E, E, 1));
  const Strided inter(inter_mem.data(), Kokkos::LayoutStride(T, E, E, 1));
  const auto map = make2<D, std::uint8_t>("map", T, E, kMapSentinel);
  try {
    KokkosMoE::topk_router(exec, to_config(a), rows, probs, map, inter);
  } catch (const std::exception& e) {
    BOOST_TEST(false, "row-major strided / offset Views rejected: " << e.what());
  }
  exec.fence();
  BOOST_TEST(bytes_equal(download(probs_mem), base.probs));
  BOOST_TEST(bytes_equal(download(inter_mem), base.inter));
  BOOST_TEST(bytes_equal(download(map), base.map));
}

// The bias type is independent of the logits type (docs/router.md §2: float, fp16 or bf16, widened to FP32).
template <class D, class S, class B>
void mixed_bias_case(Score f, std::uint64_t seed) {
  const Oracle::Attr a = make_attr(f, false, 8, 8, 4, 2.5);
  const RouterInputs in = generate_router_inputs<S, B>(a, 45, 256, true, seed);
  const auto ref = oracle_forward(a, in);
  const auto logits = device_values<D, S>("logits", in.T, in.E, in.x);
  const V1<D, const B> bias = device_vector<D, B>("bias", in.b);
  for (const auto impl : kImpls) {
    KokkosMoE::RouterConfig cfg = to_config(a);
    cfg.implementation = impl;
    for (const Out out : {Out::Bytemap, Out::I32, Out::Compact})
      check_forward_output(
          std::string(Num<S>::name) + " logits, " + Num<B>::name + " bias, " + impl_name(impl) + " " + out_name(out),
          out, fetch(run_forward<D, S, B>(cfg, out, logits, bias)), ref, in.T, in.E, a.topk);
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(bias_type_independent_of_logits_type, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  mixed_bias_case<DeviceType, fp16_t, float>(Score::Sigmoid, 1);
  mixed_bias_case<DeviceType, float, bf16_t>(Score::Sigmoid, 2);
  mixed_bias_case<DeviceType, bf16_t, fp16_t>(Score::SqrtSoftplus, 3);
}

BOOST_AUTO_TEST_SUITE_END()
