/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_TEST_EPORACLE_HPP
#define KOKKOSMOE_TEST_EPORACLE_HPP

// The independent oracle of the EP tests: a single-process simulation of dispatch and combine over every rank of one
// EP group, written as plain loops over (destination rank, local expert, source rank, token, k). It never calls the
// library. Inputs of every rank are generated from (seed, rank), so each process can compute the whole group's
// expected results without communication.

#include <KokkosMoE_EpConfig.hpp>

#include <kokkos_ext/KokkosMoE_Float16.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace KokkosMoE::Test {

/// Routing patterns of the adversarial matrix.
enum class Routing { Uniform, Skewed, AllToOneExpert, SomeExpertsEmpty, WithMinusOne, Duplicates };

struct RankInputs {
  int T = 0;
  std::vector<int> idx;  // [T*K]
  std::vector<float> w;  // [T*K]
  std::vector<float> x;  // [T*H], values exactly representable in bf16 when requested
};

inline float round_bf16(float f) { return static_cast<float>(bf16_t(f)); }

/// Deterministic per-rank inputs. T varies per rank when `vary_tokens` (rank 1 of every group has T = 0).
inline RankInputs make_inputs(const EpGroupConfig& c, Routing routing, int rank, int T, std::uint64_t seed,
                              bool bf16_values) {
  RankInputs in;
  in.T = T;
  const int K = c.topk, E = c.num_experts, H = c.hidden_size;
  std::mt19937_64 gen(seed * 1000003ull + static_cast<std::uint64_t>(rank) * 7919ull + static_cast<int>(routing));
  std::uniform_int_distribution<int> expert(0, E - 1);
  std::uniform_real_distribution<float> val(-1.0f, 1.0f);
  in.idx.assign(static_cast<std::size_t>(T) * K, -1);
  in.w.assign(static_cast<std::size_t>(T) * K, 0.0f);
  in.x.resize(static_cast<std::size_t>(T) * H);
  for (auto& v : in.x) v = bf16_values ? round_bf16(val(gen)) : val(gen);
  for (int t = 0; t < T; ++t) {
    std::vector<int> chosen;
    for (int k = 0; k < K; ++k) {
      int e = -1;
      switch (routing) {
        case Routing::Uniform:
        case Routing::WithMinusOne:
        case Routing::Duplicates:
          do {
            e = expert(gen);
          } while (routing != Routing::Duplicates && std::find(chosen.begin(), chosen.end(), e) != chosen.end());
          if (routing == Routing::WithMinusOne && (gen() % 3) == 0) e = -1;
          break;
        case Routing::Skewed:
          // Most slots go to the first rank's experts.
          do {
            e = (gen() % 4 != 0) ? static_cast<int>(gen() % static_cast<std::uint64_t>(c.num_experts / c.ep_size))
                                 : expert(gen);
          } while (std::find(chosen.begin(), chosen.end(), e) != chosen.end());
          break;
        case Routing::AllToOneExpert:
          e = k == 0 ? E - 1 : -1;
          break;
        case Routing::SomeExpertsEmpty:
          // Only even experts receive anything.
          do {
            e = (expert(gen) / 2) * 2;
          } while (std::find(chosen.begin(), chosen.end(), e) != chosen.end() &&
                   static_cast<int>(chosen.size()) < E / 2);
          if (std::find(chosen.begin(), chosen.end(), e) != chosen.end()) e = -1;
          break;
      }
      if (e >= 0) chosen.push_back(e);
      in.idx[static_cast<std::size_t>(t) * K + k] = e;
      in.w[static_cast<std::size_t>(t) * K + k] =
          routing == Routing::Skewed ? (k == 0 ? 0.9f : 0.1f / K) : 0.25f + 0.5f * (gen() % 7) / 7.0f;
    }
  }
  return in;
}

/// The deterministic test expert: out = x * (1 + (e % 5) / 8) + (e % 3) / 16, rounded to the row type.
inline float expert_fn(float v, int e, bool bf16) {
  const float r = v * (1.0f + static_cast<float>(e % 5) * 0.125f) + static_cast<float>(e % 3) * 0.0625f;
  return bf16 ? round_bf16(r) : r;
}

/// Where every (source rank, token, k) slot lands on its destination rank, by plain loops in the fixed order.
struct OracleLayout {
  int R = 0, L = 0, K = 0, E = 0;
  std::vector<std::vector<int>> slot_row;     // [src][t*K+k]: row on the destination rank, -1 none/dropped
  std::vector<int> recv_rows;                 // per rank: rows of the receive Views
  std::vector<std::vector<int>> recv_expert;  // per rank: local expert per row, -1 padding/dropped
  std::vector<std::vector<int>> row_src_rank, row_src_token, row_src_k;  // per rank per row
  std::vector<int> demand;                // per rank (padded rows; fixed: largest expert)
  std::vector<int> dropped;               // per source rank: its own slots dropped (sender side)
  std::vector<int> dropped_recv;          // per destination rank: slots for its experts dropped (receiver side)
  std::vector<std::vector<int>> offsets;  // per rank: [L + 1] expert offsets, never past its receive rows
};

inline OracleLayout oracle_layout(const EpGroupConfig& c, const std::vector<RankInputs>& in) {
  OracleLayout o;
  o.R = c.ep_size;
  o.L = c.num_experts / c.ep_size;
  o.K = c.topk;
  o.E = c.num_experts;
  const bool fixed = c.layout == RecvLayout::ExpertMajorFixed;
  const int A = fixed ? 1 : c.expert_alignment;
  const int slab = fixed ? c.ep_size * c.max_tokens_per_rank : 0;
  const bool capacity = c.max_recv_tokens_per_rank > 0 || fixed;
  const long long cap_rows = fixed ? static_cast<long long>(o.L) * slab : c.max_recv_tokens_per_rank;
  o.slot_row.resize(o.R);
  o.dropped.assign(o.R, 0);
  o.dropped_recv.assign(o.R, 0);
  o.offsets.resize(o.R);
  for (int i = 0; i < o.R; ++i) o.slot_row[i].assign(in[i].idx.size(), -1);
  o.recv_rows.assign(o.R, 0);
  o.recv_expert.resize(o.R);
  o.row_src_rank.resize(o.R);
  o.row_src_token.resize(o.R);
  o.row_src_k.resize(o.R);
  o.demand.assign(o.R, 0);
  for (int j = 0; j < o.R; ++j) {
    // Expert slabs first.
    std::vector<long long> count(o.L, 0);
    for (int l = 0; l < o.L; ++l)
      for (int i = 0; i < o.R; ++i)
        for (std::size_t q = 0; q < in[i].idx.size(); ++q) count[l] += in[i].idx[q] == j * o.L + l;
    std::vector<long long> off(o.L + 1, 0);
    for (int l = 0; l < o.L; ++l)
      off[l + 1] = fixed ? (l + 1) * static_cast<long long>(slab) : off[l] + (count[l] + A - 1) / A * A;
    long long demand = off[o.L];
    if (fixed) {
      demand = 0;
      for (long long n : count) demand = std::max(demand, n);
    }
    o.demand[j] = static_cast<int>(demand);
    const long long rows = capacity ? cap_rows : off[o.L];
    for (long long v : off) o.offsets[j].push_back(static_cast<int>(std::min(v, rows)));
    o.recv_rows[j] = static_cast<int>(rows);
    o.recv_expert[j].assign(rows, -1);
    o.row_src_rank[j].assign(rows, -1);
    o.row_src_token[j].assign(rows, -1);
    o.row_src_k[j].assign(rows, -1);
    // Within each local expert, slots in (source rank, token, k) order; the ones past the capacity are dropped.
    for (int l = 0; l < o.L; ++l) {
      long long pos = 0;
      for (int i = 0; i < o.R; ++i) {
        for (int t = 0; t < in[i].T; ++t)
          for (int k = 0; k < o.K; ++k) {
            const std::size_t q = static_cast<std::size_t>(t) * o.K + k;
            if (in[i].idx[q] != j * o.L + l) continue;
            const long long row = off[l] + pos;
            bool keep = true;
            if (fixed)
              keep = pos < slab;
            else if (capacity)
              keep = row < cap_rows;
            ++pos;
            if (!keep) {
              ++o.dropped[i];
              ++o.dropped_recv[j];
              continue;
            }
            o.slot_row[i][q] = static_cast<int>(row);
            o.recv_expert[j][row] = l;
            o.row_src_rank[j][row] = i;
            o.row_src_token[j][row] = t;
            o.row_src_k[j][row] = k;
          }
      }
    }
  }
  return o;
}

}  // namespace KokkosMoE::Test

#endif
