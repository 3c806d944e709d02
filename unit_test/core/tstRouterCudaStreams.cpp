/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// The Kokkos::Cuda specialization enqueues on the execution space instance it is given (docs/conventions.md §3): two
// instances on two user-created streams, and the two instances of Kokkos::Experimental::partition_space, route
// different batches at the same time, and each gets the bits a run on the default instance alone gives.

#include <KokkosMoE_AuxLoss.hpp>
#include <KokkosMoE_Router.hpp>

#include <Kokkos_Core.hpp>

#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <vector>

#include "RouterTestUtils.hpp"

#if defined(KOKKOS_ENABLE_CUDA)

#include <cuda_runtime.h>

using namespace KokkosMoETest;

namespace {

using D = Kokkos::Cuda::device_type;

/// One routed batch: forward (map and compact), backward, aux scores and aux loss, on the instance it is given.
struct Batch {
  int T, E;
  KokkosMoE::RouterConfig cfg;
  V2<D, float> logits, grad, probs, inter, grad_logits, scores, aux_inter, weights;
  V2<D, std::uint8_t> map, aux_map;
  V2<D, std::int32_t> ids;
  V1<D, float> bias, const_buf, workspace;
  V1<D, std::int32_t> tpe;
  V0<D, float> loss;

  Batch(int T_, int E_, std::uint64_t seed) : T(T_), E(E_) {
    cfg.topk = 8;
    cfg.score_function = KokkosMoE::ScoreFunction::Sigmoid;
    cfg.num_groups = 8;
    cfg.group_topk = 4;
    cfg.scaling_factor = 2.5f;
    logits = device_values<D, float>("logits", T, E, random_values<float>(static_cast<std::size_t>(T) * E, seed));
    grad = device_values<D, float>("grad", T, E, random_values<float>(static_cast<std::size_t>(T) * E, seed + 1));
    bias = device_vector<D, float>("bias", random_values<float>(E, seed + 2, -0.1, 0.1));
    probs = make2<D, float>("probs", T, E, 0.f);
    inter = make2<D, float>("inter", T, E, 0.f);
    grad_logits = make2<D, float>("grad_logits", T, E, 0.f);
    scores = make2<D, float>("scores", T, E, 0.f);
    aux_inter = make2<D, float>("aux_inter", T, E, 0.f);
    weights = make2<D, float>("weights", T, cfg.topk, 0.f);
    map = make2<D, std::uint8_t>("map", T, E, 0);
    aux_map = make2<D, std::uint8_t>("aux_map", T, E, 0);
    ids = make2<D, std::int32_t>("ids", T, cfg.topk, 0);
    tpe = make1<D, std::int32_t>("tpe", E, 3);
    const_buf = make1<D, float>("const_buf", 2, 0.f);
    workspace = make1<D, float>("workspace", static_cast<std::int64_t>(KokkosMoE::aux_loss_workspace_size(T, E)), 0.f);
    loss = V0<D, float>("loss");
    Kokkos::fence();
  }

  void enqueue(const Kokkos::Cuda& exec) const {
    KokkosMoE::topk_router(exec, cfg, logits, bias, probs, map, inter);
    KokkosMoE::topk_router_backward(exec, cfg, map, inter, grad, grad_logits);
    KokkosMoE::topk_router_compact(exec, cfg, logits, bias, ids, weights);
    KokkosMoE::AuxScoresConfig acfg;
    acfg.topk = cfg.topk;
    acfg.score_function = cfg.score_function;
    KokkosMoE::aux_scores(exec, acfg, logits, scores, aux_map, aux_inter);
    KokkosMoE::AuxLossConfig lcfg;
    lcfg.num_experts = E;
    lcfg.topk = cfg.topk;
    lcfg.coeff = 0.01f;
    KokkosMoE::aux_loss(exec, lcfg, probs, tpe, std::int64_t{T}, loss, const_buf, workspace);
  }

  std::vector<std::vector<unsigned char>> outputs() const {
    Kokkos::fence();
    auto bytes = [](const auto& v) {
      const auto h = download(v);
      const auto* p = reinterpret_cast<const unsigned char*>(h.data());
      return std::vector<unsigned char>(p, p + h.size() * sizeof(h[0]));
    };
    return {bytes(probs),   bytes(map),    bytes(inter),   bytes(grad_logits), bytes(ids),
            bytes(weights), bytes(scores), bytes(aux_map), bytes(aux_inter),   bytes(const_buf)};
  }
};

/// Runs a and b concurrently on the two instances, then each alone on the default instance, and compares.
void concurrent_equals_alone(const Kokkos::Cuda& ea, const Kokkos::Cuda& eb) {
  Batch a(4096, 256, 11), b(3001, 256, 23);
  for (int rep = 0; rep < 3; ++rep) {  // interleaved enqueues, so both streams hold work at once
    a.enqueue(ea);
    b.enqueue(eb);
  }
  ea.fence();
  eb.fence();
  const auto got_a = a.outputs(), got_b = b.outputs();
  a.enqueue(Kokkos::Cuda{});
  b.enqueue(Kokkos::Cuda{});
  const auto ref_a = a.outputs(), ref_b = b.outputs();
  for (std::size_t i = 0; i < ref_a.size(); ++i) {
    BOOST_TEST((got_a[i] == ref_a[i]), "batch a, output " << i << ": the instance's run differs from the default's");
    BOOST_TEST((got_b[i] == ref_b[i]), "batch b, output " << i << ": the instance's run differs from the default's");
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(router_cuda_streams)

BOOST_AUTO_TEST_CASE(two_user_streams) {
  cudaStream_t s0, s1;
  BOOST_REQUIRE_EQUAL(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking), cudaSuccess);
  BOOST_REQUIRE_EQUAL(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), cudaSuccess);
  {
    const Kokkos::Cuda e0(s0), e1(s1);
    BOOST_TEST(e0.cuda_stream() == s0);
    BOOST_TEST(e1.cuda_stream() == s1);
    concurrent_equals_alone(e0, e1);
  }
  BOOST_REQUIRE_EQUAL(cudaStreamDestroy(s0), cudaSuccess);
  BOOST_REQUIRE_EQUAL(cudaStreamDestroy(s1), cudaSuccess);
}

BOOST_AUTO_TEST_CASE(partition_space_instances) {
  const auto parts = Kokkos::Experimental::partition_space(Kokkos::Cuda{}, 1, 1);
  BOOST_TEST(parts[0].cuda_stream() != parts[1].cuda_stream());
  concurrent_equals_alone(parts[0], parts[1]);
}

BOOST_AUTO_TEST_SUITE_END()

#endif
