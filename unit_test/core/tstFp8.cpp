/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// FP8 E4M3 rows (docs/ep.md §3.5) on every enabled backend, against an oracle of plain loops that shares no code with
// the library: E4M3 values from the format's definition (powers of two), float -> E4M3 as a search for the nearest of
// the 254 finite values with ties to the even code, the block scales from their formula.
#include <KokkosMoE_EnableDeviceTypes.hpp>
#include <KokkosMoE_Fp8Quantize.hpp>

#include <Fp8Oracle.hpp>
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

using namespace KokkosMoE;
using namespace KokkosMoE::Test;

namespace {

/// Inputs that exercise every branch: the codes' values and the midpoints between neighbours (ties), their float
/// neighbours, the saturation edge, subnormals, zeros, infinities, NaN, random magnitudes.
std::vector<float> probe_values() {
  std::vector<float> v;
  std::vector<double> vals;
  for (int c = 0; c <= 0x7e; ++c) vals.push_back(fp8_oracle_value(c));
  for (std::size_t i = 0; i < vals.size(); ++i) {
    const float f = static_cast<float>(vals[i]);
    v.push_back(f);
    v.push_back(std::nextafter(f, 1e9f));
    v.push_back(std::nextafter(f, -1e9f));
    if (i + 1 < vals.size()) {
      const float mid = static_cast<float>((vals[i] + vals[i + 1]) / 2);  // exact in float
      v.push_back(mid);
      v.push_back(std::nextafter(mid, 1e9f));
      v.push_back(std::nextafter(mid, -1e9f));
    }
  }
  for (float f : {448.0f, 455.99f, 464.0f, 464.01f, 480.0f, 1e6f, 3.0e38f, std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN(), std::ldexp(1.0f, -10), std::ldexp(1.0f, -11),
                  std::ldexp(1.0f, -12), std::ldexp(3.0f, -11), 1e-30f, std::numeric_limits<float>::denorm_min(), 0.0f})
    v.push_back(f);
  std::mt19937 gen(2026);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> ex(-14, 10);
  for (int i = 0; i < 4000; ++i) v.push_back(std::ldexp(mant(gen), ex(gen)));
  const std::size_t n = v.size();
  for (std::size_t i = 0; i < n; ++i) v.push_back(-v[i]);
  return v;
}

template <class Exec>
std::vector<std::uint8_t> convert_on(const std::vector<float>& in) {
  using Mem = typename Exec::memory_space;
  Kokkos::View<float*, Mem> x("x", in.size());
  Kokkos::View<std::uint8_t*, Mem> q("q", in.size());
  auto hx = Kokkos::create_mirror_view(x);
  for (std::size_t i = 0; i < in.size(); ++i) hx(i) = in[i];
  Kokkos::deep_copy(x, hx);
  Kokkos::parallel_for(
      "convert", Kokkos::RangePolicy<Exec>(0, in.size()),
      KOKKOS_LAMBDA(std::size_t i) { q(i) = fp8_e4m3_t(x(i)).bits; });
  auto hq = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), q);
  return std::vector<std::uint8_t>(hq.data(), hq.data() + hq.size());
}

struct Rows {
  int N = 0, H = 0;
  std::vector<float> x;
};

/// Rows with an all-zero block, a block holding NaN and infinities, a block of huge values, a block of tiny ones.
Rows test_rows(int N, int H, std::uint64_t seed) {
  Rows r;
  r.N = N;
  r.H = H;
  r.x.resize(static_cast<std::size_t>(N) * H);
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (float& v : r.x) v = d(gen);
  auto at = [&](int row, int c) -> float& { return r.x[static_cast<std::size_t>(row) * H + c]; };
  if (N > 0)
    for (int c = 0; c < 128; ++c) at(0, c) = 0.0f;
  if (N > 1) {
    at(1, 3) = std::numeric_limits<float>::quiet_NaN();
    at(1, 7) = std::numeric_limits<float>::infinity();
    at(1, 9) = -std::numeric_limits<float>::infinity();
  }
  if (N > 2 && H >= 256)
    for (int c = 128; c < 256; ++c) at(2, c) *= 1e30f;
  if (N > 3)
    for (int c = 0; c < 128; ++c) at(3, c) *= 1e-7f;
  return r;
}

/// The oracle's quantization of rows stored as T (float or bf16_t: the rows are rounded to T first).
template <class T>
void oracle_quantize(const Rows& r, bool ue8m0, float min_amax, std::vector<std::uint8_t>& q, std::vector<float>& s) {
  const int nb = r.H / 128;
  q.assign(r.x.size(), 0);
  s.assign(static_cast<std::size_t>(r.N) * nb, 0.0f);
  std::vector<float> row(static_cast<std::size_t>(r.H));
  for (int i = 0; i < r.N; ++i) {
    for (int c = 0; c < r.H; ++c) row[c] = static_cast<float>(T(r.x[static_cast<std::size_t>(i) * r.H + c]));
    fp8_oracle_quantize_row(row.data(), r.H, ue8m0, min_amax, q.data() + static_cast<std::size_t>(i) * r.H,
                            s.data() + static_cast<std::size_t>(i) * nb);
  }
}

template <class Exec, class T>
void check_quantize(int N, int H, bool ue8m0, std::uint64_t seed) {
  using Mem = typename Exec::memory_space;
  const Rows r = test_rows(N, H, seed);
  Kokkos::View<T**, Kokkos::LayoutRight, Mem> x("x", N, H);
  Kokkos::View<fp8_e4m3_t**, Kokkos::LayoutRight, Mem> q("q", N, H);
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> s("s", N, H / 128);
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> y("y", N, H);
  auto hx = Kokkos::create_mirror_view(x);
  for (int i = 0; i < N; ++i)
    for (int c = 0; c < H; ++c) hx(i, c) = T(r.x[static_cast<std::size_t>(i) * H + c]);
  Kokkos::deep_copy(x, hx);
  Exec exec;
  Fp8QuantizeConfig cfg;
  cfg.scale_format = ue8m0 ? Fp8ScaleFormat::Ue8m0 : Fp8ScaleFormat::Fp32;
  quantize_fp8_rows(exec, x, q, s, cfg);
  dequantize_fp8_rows(exec, q, s, y);
  exec.fence();
  std::vector<std::uint8_t> wq;
  std::vector<float> ws;
  oracle_quantize<T>(r, ue8m0, cfg.min_amax, wq, ws);
  auto hq = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), q);
  auto hs = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), s);
  auto hy = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y);
  int bad_q = 0, bad_s = 0, bad_y = 0;
  for (int i = 0; i < N; ++i) {
    for (int b = 0; b < H / 128; ++b) {
      const float want = ws[static_cast<std::size_t>(i) * (H / 128) + b];
      if (std::memcmp(&hs(i, b), &want, 4) != 0 && bad_s++ < 3)
        BOOST_TEST_MESSAGE("scale(" << i << ", " << b << ") = " << hs(i, b) << ", expected " << want);
    }
    for (int c = 0; c < H; ++c) {
      const std::size_t k = static_cast<std::size_t>(i) * H + c;
      if (hq(i, c).bits != wq[k] && bad_q++ < 3)
        BOOST_TEST_MESSAGE("q(" << i << ", " << c << ") = " << int(hq(i, c).bits) << ", expected " << int(wq[k]));
      const double v = fp8_oracle_value(wq[k]) * ws[static_cast<std::size_t>(i) * (H / 128) + c / 128];
      const float want_y = static_cast<float>(v);  // exact: a 4-bit significand times a float scale
      if (!(hy(i, c) == want_y || (std::isnan(hy(i, c)) && std::isnan(want_y))) && bad_y++ < 3)
        BOOST_TEST_MESSAGE("y(" << i << ", " << c << ") = " << hy(i, c) << ", expected " << want_y);
    }
  }
  BOOST_TEST(bad_q == 0, bad_q << " quantized values differ from the oracle");
  BOOST_TEST(bad_s == 0, bad_s << " scales differ from the oracle");
  BOOST_TEST(bad_y == 0, bad_y << " dequantized values differ from the oracle");
}

template <class F>
int rule_of(F&& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return static_cast<int>(e.rule());
  }
  return -1;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(fp8_rows)

BOOST_AUTO_TEST_CASE(decoding_matches_the_definition) {
  for (int b = 0; b < 256; ++b) {
    const float got = Impl::e4m3_bits_to_float(static_cast<std::uint8_t>(b));
    const double want = fp8_oracle_value(b);
    if (std::isnan(want)) {
      BOOST_TEST(std::isnan(got), "code " << b);
    } else {
      BOOST_TEST(static_cast<double>(got) == want, "code " << b);
      if (b != 0x80) BOOST_TEST(int(Impl::float_to_e4m3_bits(got)) == b, "code " << b << " round trip");
    }
  }
  BOOST_TEST(int(Impl::float_to_e4m3_bits(-0.0f)) == 0x80);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(conversion_is_bit_exact, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  const std::vector<float> in = probe_values();
  const std::vector<std::uint8_t> got = convert_on<typename DeviceType::execution_space>(in);
  int bad = 0;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const std::uint8_t want = fp8_oracle_code(in[i]);
    if (got[i] != want && bad++ < 5)
      BOOST_TEST_MESSAGE(std::hexfloat << in[i] << " -> " << int(got[i]) << ", expected " << int(want));
  }
  BOOST_TEST(bad == 0, bad << " of " << in.size() << " conversions differ from the oracle");
}

BOOST_AUTO_TEST_CASE_TEMPLATE(rows_match_the_oracle, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  for (bool ue8m0 : {false, true}) {
    check_quantize<Exec, float>(5, 384, ue8m0, 11);
    check_quantize<Exec, bf16_t>(5, 384, ue8m0, 12);
    check_quantize<Exec, bf16_t>(37, 7168, ue8m0, 13);  // DeepSeek-V3's hidden size: 56 blocks per row
  }
  check_quantize<Exec, float>(0, 128, false, 14);  // no rows: nothing to do
}

BOOST_AUTO_TEST_CASE_TEMPLATE(bad_input_is_a_typed_error, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  using Mem = typename Exec::memory_space;
  Exec exec;
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> x("x", 2, 256), x_bad("x_bad", 2, 200), y("y", 2, 256);
  Kokkos::View<fp8_e4m3_t**, Kokkos::LayoutRight, Mem> q("q", 2, 256), q_bad("q_bad", 2, 128);
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> s("s", 2, 2), s_bad("s_bad", 2, 3);
  const int shape = static_cast<int>(Rule::ShapeMismatch), config = static_cast<int>(Rule::ConfigValue);
  BOOST_TEST(rule_of([&] { quantize_fp8_rows(exec, x_bad, q, s); }) == shape);
  BOOST_TEST(rule_of([&] { quantize_fp8_rows(exec, x, q_bad, s); }) == shape);
  BOOST_TEST(rule_of([&] { quantize_fp8_rows(exec, x, q, s_bad); }) == shape);
  Fp8QuantizeConfig cfg;
  cfg.scale_format = static_cast<Fp8ScaleFormat>(5);
  BOOST_TEST(rule_of([&] { quantize_fp8_rows(exec, x, q, s, cfg); }) == config);
  cfg = {};
  cfg.min_amax = 0.0f;
  BOOST_TEST(rule_of([&] { quantize_fp8_rows(exec, x, q, s, cfg); }) == config);
  cfg.min_amax = std::numeric_limits<float>::infinity();
  BOOST_TEST(rule_of([&] { quantize_fp8_rows(exec, x, q, s, cfg); }) == config);
  BOOST_TEST(rule_of([&] { dequantize_fp8_rows(exec, q, s_bad, y); }) == shape);
  BOOST_TEST(rule_of([&] { dequantize_fp8_rows(exec, q_bad, s, y); }) == shape);
  try {
    quantize_fp8_rows(exec, x_bad, q, s);
  } catch (const InvalidArgument& e) {
    BOOST_TEST(e.parameter() == "x");
  }
}

BOOST_AUTO_TEST_SUITE_END()
