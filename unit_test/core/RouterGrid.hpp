/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_TEST_ROUTERGRID_HPP
#define KOKKOSMOE_TEST_ROUTERGRID_HPP

// The router parameter grid of docs/router.md §16.3, scaled for the CPU suite: the full cross product of score
// function (with bias on/off for Sigmoid/SqrtSoftplus, pre/post for Softmax), grouping {off, G=8/gk=4},
// scale {1.0, 1.2} and (E, k) pairs covering E in {8, 32, 128, 130, 256, 1024} and k in {1, 2, 4, 8, 32}, with small,
// odd token counts. Every case runs every output kind and both implementations (RouterRunner.hpp).

#include "RouterRunner.hpp"

namespace KokkosMoETest {

struct GridPoint {
  Oracle::Attr attr;
  int T = 0, E = 0;
  bool bias = false;
  std::uint64_t seed = 0;
};

struct Mode {
  Oracle::Score f;
  bool pre;
  bool bias;
};
constexpr Mode kModes[] = {{Oracle::Score::Sigmoid, false, false},      {Oracle::Score::Sigmoid, false, true},
                           {Oracle::Score::SqrtSoftplus, false, false}, {Oracle::Score::SqrtSoftplus, false, true},
                           {Oracle::Score::Softmax, false, false},      {Oracle::Score::Softmax, true, false}};

inline std::vector<GridPoint> router_grid(std::uint64_t salt) {
  static const int kEk[][2] = {{8, 1}, {8, 2}, {32, 4}, {32, 8}, {128, 1}, {128, 8}, {130, 4}, {256, 8}, {1024, 32}};
  static const int kT[] = {64, 97, 131, 200};  // E <= 32: all four; E <= 256: 64, 97; E = 1024: 37, 64
  std::vector<GridPoint> grid;
  std::uint64_t n = 0;
  for (const Mode& m : kModes)
    for (int grouped = 0; grouped < 2; ++grouped)
      for (double scale : {1.0, 1.2})
        for (const auto& ek : kEk) {
          const int E = ek[0], k = ek[1];
          const int G = grouped ? 8 : 0, gk = grouped ? 4 : 0;
          if (!grouping_valid(E, k, G, gk)) continue;
          ++n;
          GridPoint p;
          p.attr = make_attr(m.f, m.pre, k, G, gk, scale);
          p.E = E;
          p.T = E >= 1024 ? (n % 2 ? 37 : 64) : E > 32 ? kT[n % 2] : kT[n % 4];
          p.bias = m.bias;
          p.seed = mix_seed(salt, n);
          grid.push_back(p);
        }
  return grid;
}

template <class D, class S>
void run_router_grid(RunFlags flags, std::uint64_t salt) {
  int cases = 0, redrawn = 0;
  for (const GridPoint& p : router_grid(salt)) {
    const auto c = make_random_case<D, S>(p.attr, p.T, p.E, p.bias, p.seed);
    redrawn += c.in.redrawn_rows;
    run_router_case(c, flags);
    ++cases;
  }
  BOOST_TEST_MESSAGE(D::execution_space::name() << " " << Num<S>::name << ": " << cases << " cases, " << redrawn
                                                << " rows redrawn for conditioning");
  BOOST_TEST(cases > 100);
}

// Compiled once in RouterRunner.cpp, as the runner itself (RouterRunner.hpp).
#define KOKKOSMOE_TEST_GRID_ETI_DS(PREFIX, S, D) PREFIX template void run_router_grid<D, S>(RunFlags, std::uint64_t);
KOKKOSMOE_FOR_EACH_DEVICE_TYPE(KOKKOSMOE_TEST_GRID_ETI_DS, extern, float)
KOKKOSMOE_FOR_EACH_DEVICE_TYPE(KOKKOSMOE_TEST_GRID_ETI_DS, extern, fp16_t)
KOKKOSMOE_FOR_EACH_DEVICE_TYPE(KOKKOSMOE_TEST_GRID_ETI_DS, extern, bf16_t)

}  // namespace KokkosMoETest

#endif
