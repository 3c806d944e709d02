/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_TEST_EPCASES_HPP
#define KOKKOSMOE_TEST_EPCASES_HPP

// Shapes, inputs and comparisons shared by the EP test matrix's translation units (tstEp.cpp, tstEpSteps.cpp).
#include <EpStep.hpp>
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace KokkosMoE::Test {

inline EpGroupConfig default_config(int ep_size) {
  // docs/ep.md §12: 2 local experts, hidden 32, top-k 2, 4 tokens per shard.
  EpGroupConfig c;
  c.ep_size = ep_size;
  c.num_experts = 2 * ep_size;
  c.hidden_size = 32;
  c.topk = 2;
  c.max_tokens_per_rank = 4;
  return c;
}

inline std::vector<RankInputs> group_inputs(const EpGroupConfig& c, Routing routing, std::uint64_t seed, bool bf16,
                                            bool vary_tokens) {
  std::vector<RankInputs> in;
  for (int r = 0; r < c.ep_size; ++r) {
    int T = c.max_tokens_per_rank;
    if (vary_tokens) T = (r == 1 % c.ep_size && c.ep_size > 1) ? 0 : c.max_tokens_per_rank - (r % 3);
    in.push_back(make_inputs(c, routing, r, T, seed, bf16));
  }
  return in;
}

inline bool close(float got, float want, bool bf16) {
  const float tol = bf16 ? 5e-2f : 1e-5f;
  return std::fabs(got - want) <= tol + tol * std::fabs(want);
}

inline std::string where(const char* what, std::size_t i) { return std::string(what) + "[" + std::to_string(i) + "]"; }

inline void compare(const char* what, const std::vector<float>& got, const std::vector<float>& want, bool bf16,
                    std::size_t n) {
  BOOST_TEST_REQUIRE(got.size() >= n, what << ": " << got.size() << " values, expected >= " << n);
  int bad = 0;
  for (std::size_t i = 0; i < n && bad < 5; ++i)
    if (!close(got[i], want[i], bf16)) {
      ++bad;
      BOOST_TEST(false, where(what, i) << " = " << got[i] << ", expected " << want[i]);
    }
}

template <class Exec, class Scalar>
void check_step(const EpGroupConfig& c, Routing routing, CombineMode mode, std::uint64_t seed, bool vary_tokens,
                const std::string& label, bool split = false, bool decode = false) {
  BOOST_TEST_CONTEXT(label << " mode " << to_string(mode) << " dtype "
                           << (std::is_same<Scalar, bf16_t>::value ? "bf16" : "fp32") << " routing "
                           << static_cast<int>(routing) << (decode ? " decode" : "")) {
    Exec exec;
    const Communicator& comm = ep_comm<Exec>();
    constexpr bool bf16 = std::is_same<Scalar, bf16_t>::value;
    const auto in = group_inputs(c, routing, seed, bf16, vary_tokens);
    EpGroup<Exec> group(exec, comm, c);
    auto handle = group.make_handle();
    const StepOutputs got = run_step<Exec, Scalar>(exec, group, handle, in[comm.rank()], mode, -1, split, decode);
    const StepOutputs want = expected_step(c, in, comm.rank(), mode, bf16);
    BOOST_TEST(got.recv_rows == want.recv_rows);
    BOOST_TEST(got.recv_expert == want.recv_expert, boost::test_tools::per_element());
    const std::size_t NH = static_cast<std::size_t>(want.recv_rows) * c.hidden_size;
    compare("recv_x", got.recv_x, want.recv_x, bf16, NH);
    compare("recv_w", got.recv_w, want.recv_w, false, want.recv_rows);
    compare("y", got.y, want.y, bf16, want.y.size());
    compare("grad_out", got.grad_out, want.grad_out, bf16, NH);
    if (mode == CombineMode::Weighted)
      compare("grad_w (combine)", got.grad_w_combine, want.grad_w_combine, bf16, want.grad_w_combine.size());
    compare("grad_x", got.grad_x, want.grad_x, bf16, want.grad_x.size());
    compare("grad_w (dispatch)", got.grad_w_dispatch, want.grad_w_dispatch, false, want.grad_w_dispatch.size());
    BOOST_TEST(got.tokens_per_expert == want.tokens_per_expert, boost::test_tools::per_element());
    BOOST_TEST(got.tokens_per_rank == want.tokens_per_rank, boost::test_tools::per_element());
    BOOST_TEST(got.token_in_rank == want.token_in_rank, boost::test_tools::per_element());
    BOOST_TEST((decode ? decode_counts(c, got.counts, comm.rank()) : got.counts) ==
                   (decode ? decode_counts(c, want.counts, comm.rank()) : want.counts),
               boost::test_tools::per_element());
    BOOST_TEST(got.offsets == want.offsets, boost::test_tools::per_element());
    BOOST_TEST(got.slot_kept == want.slot_kept, boost::test_tools::per_element());
    BOOST_TEST(got.offsets.back() <= got.recv_rows);
    BOOST_TEST(got.status.recv_demand == want.status.recv_demand);
    BOOST_TEST(got.status.dropped_slots == want.status.dropped_slots);
    BOOST_TEST(got.status.dropped_recv_slots == want.status.dropped_recv_slots);
    const std::string fp8 = fp8_differences(got, want);
    BOOST_TEST(fp8.empty(), "FP8 rows: " << fp8);
  }
}

/// Calls \p f, which must throw InvalidArgument with Rule::HandleState naming \p parameter; returns its message ("" and
/// a failed assertion when \p f returned).
template <class F>
std::string refused_as_handle_state(const char* what, F&& f, const char* parameter) {
  std::string msg;
  try {
    f();
  } catch (const InvalidArgument& e) {
    msg = e.what();
    BOOST_TEST(static_cast<int>(e.rule()) == static_cast<int>(Rule::HandleState), what << ": " << msg);
    BOOST_TEST(e.parameter() == parameter, what << ": " << msg);
  }
  BOOST_TEST(!msg.empty(), what << " was not refused");
  return msg;
}

/// After a failure every rank survived: a new group and a Weighted step on \p in match the oracle's y.
template <class Exec>
void step_still_matches_oracle(const Exec& exec, const Communicator& comm, const EpGroupConfig& c,
                               const std::vector<RankInputs>& in, const char* what) {
  EpGroup<Exec> group(exec, comm, c);
  auto handle = group.make_handle();
  const StepOutputs got = run_step<Exec, float>(exec, group, handle, in[comm.rank()], CombineMode::Weighted);
  const StepOutputs want = expected_step(c, in, comm.rank(), CombineMode::Weighted, false);
  compare(what, got.y, want.y, false, want.y.size());
}

/// Inputs with the given expert ids (-1 = empty slot) and seeded rows and weights.
inline RankInputs explicit_inputs(const EpGroupConfig& c, int rank, const std::vector<int>& idx, std::uint64_t seed) {
  const int T = static_cast<int>(idx.size()) / c.topk;
  RankInputs in = make_inputs(c, Routing::Uniform, rank, T, seed, false);
  in.idx = idx;
  return in;
}

/// Capacity mode at its smallest: L local experts per rank, hidden 8, top-1, 2 tokens per rank, one receive row.
inline EpGroupConfig tiny_capacity_config(int R, int L) {
  EpGroupConfig c;
  c.ep_size = R;
  c.num_experts = L * R;
  c.hidden_size = 8;
  c.topk = 1;
  c.max_tokens_per_rank = 2;
  c.max_recv_tokens_per_rank = 1;
  return c;
}

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

template <class Exec>
bool is_cuda() {
#if defined(KOKKOS_ENABLE_CUDA)
  return std::is_same<Exec, Kokkos::Cuda>::value;
#else
  return false;
#endif
}

}  // namespace KokkosMoE::Test

#endif
