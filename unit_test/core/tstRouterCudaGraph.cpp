/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// CUDA-graph capture of the Kokkos::Cuda specialization (docs/router.md §11, §16.3 "aux loss graph capture",
// §16.4 "CUDA-graph replay with changed inputs gives the eager results"): forward, backward and the aux loss with
// a device-side token total are captured once on a stream and replayed with new inputs and totals.
#include <KokkosMoE_AuxLoss.hpp>
#include <KokkosMoE_Router.hpp>

#include <Kokkos_Core.hpp>

#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#if defined(KOKKOS_ENABLE_CUDA)

#include <cuda_runtime.h>

namespace {

using Space = Kokkos::Cuda;
using Mem = Space::memory_space;
template <class T>
using M2 = Kokkos::View<T**, Kokkos::LayoutRight, Mem>;

#define KMOE_CUDA_CHECK(x) BOOST_REQUIRE_EQUAL((x), cudaSuccess)

template <class V>
std::vector<unsigned char> bytes_of(const V& v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, v);
  std::vector<unsigned char> out(h.span() * sizeof(typename V::value_type));
  std::memcpy(out.data(), h.data(), out.size());
  return out;
}

struct Problem {
  int T, E;
  KokkosMoE::RouterConfig cfg;
  M2<float> logits, probs, inter, grad_probs, grad_logits;
  M2<std::uint8_t> map;
  Kokkos::View<float*, Mem> bias, tpe, const_buf, workspace;
  Kokkos::View<float, Mem> loss;
  Kokkos::View<std::int64_t, Mem> total;

  Problem(int T_, int E_, int topk, bool grouped) : T(T_), E(E_) {
    cfg.topk = topk;
    cfg.score_function = KokkosMoE::ScoreFunction::Sigmoid;
    cfg.num_groups = grouped ? 8 : 0;
    cfg.group_topk = grouped ? 4 : 0;
    cfg.scaling_factor = 2.5f;
    logits = M2<float>("logits", T, E);
    probs = M2<float>("probs", T, E);
    inter = M2<float>("inter", T, E);
    grad_probs = M2<float>("grad_probs", T, E);
    grad_logits = M2<float>("grad_logits", T, E);
    map = M2<std::uint8_t>("map", T, E);
    bias = Kokkos::View<float*, Mem>("bias", E);
    tpe = Kokkos::View<float*, Mem>("tpe", E);
    const_buf = Kokkos::View<float*, Mem>("const_buf", 2);
    workspace = Kokkos::View<float*, Mem>("ws", KokkosMoE::aux_loss_workspace_size(T, E));
    loss = Kokkos::View<float, Mem>("loss");
    total = Kokkos::View<std::int64_t, Mem>("total");
  }

  void fill(unsigned seed, std::int64_t total_tokens) {
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> u(-4.0f, 4.0f);
    auto hl = Kokkos::create_mirror_view(logits);
    auto hg = Kokkos::create_mirror_view(grad_probs);
    for (int t = 0; t < T; ++t)
      for (int e = 0; e < E; ++e) {
        hl(t, e) = u(gen);
        hg(t, e) = u(gen);
      }
    auto hb = Kokkos::create_mirror_view(bias);
    auto ht = Kokkos::create_mirror_view(tpe);
    for (int e = 0; e < E; ++e) {
      hb(e) = 0.1f * u(gen);
      ht(e) = static_cast<float>(1 + gen() % 999);
    }
    Kokkos::deep_copy(logits, hl);
    Kokkos::deep_copy(grad_probs, hg);
    Kokkos::deep_copy(bias, hb);
    Kokkos::deep_copy(tpe, ht);
    Kokkos::deep_copy(total, total_tokens);
  }

  void enqueue(const Space& exec) const {
    KokkosMoE::topk_router(exec, cfg, logits, bias, probs, map, inter);
    KokkosMoE::topk_router_backward(exec, cfg, map, inter, grad_probs, grad_logits);
    KokkosMoE::AuxLossConfig aux;
    aux.num_experts = E;
    aux.topk = cfg.topk;
    aux.coeff = 0.01f;
    KokkosMoE::aux_loss(exec, aux, probs, tpe, total, loss, const_buf, workspace);
  }

  std::vector<std::vector<unsigned char>> outputs() const {
    return {bytes_of(probs),       bytes_of(map),       bytes_of(inter),
            bytes_of(grad_logits), bytes_of(const_buf), bytes_of(Kokkos::View<float*, Mem>(loss.data(), 1))};
  }
};

/// Captures forward, backward and aux loss once on a non-blocking stream, then replays the graph with new inputs
/// and a new device total and compares every output with eager calls on the same inputs.
void capture_once_replay(Problem& p) {
  cudaStream_t stream;
  KMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    Space exec(stream);
    p.fill(1, 4096);
    Kokkos::fence();
    p.enqueue(exec);  // warm-up: first calls do one-time, host-side kernel attribute setup
    exec.fence();

    cudaGraph_t graph;
    KMOE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    p.enqueue(exec);
    KMOE_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t instance;
    KMOE_CUDA_CHECK(cudaGraphInstantiate(&instance, graph, 0));

    const std::int64_t totals[] = {4096, 2048, 8175};
    for (int replay = 0; replay < 3; ++replay) {
      p.fill(100 + replay, totals[replay]);  // new inputs and a new device total between replays
      Kokkos::fence();
      KMOE_CUDA_CHECK(cudaGraphLaunch(instance, stream));
      KMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
      const auto replayed = p.outputs();
      p.enqueue(exec);  // eager, same inputs
      exec.fence();
      const auto eager = p.outputs();
      for (std::size_t i = 0; i < eager.size(); ++i) BOOST_TEST((replayed[i] == eager[i]), "output " << i);
      // Const follows the device total of this replay
      auto hc = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, p.const_buf);
      const float total = static_cast<float>(totals[replay]);
      const float expect = ((static_cast<float>(p.E) * 0.01f) / static_cast<float>(p.cfg.topk)) / total / total;
      BOOST_TEST(hc(0) == expect);
    }
    KMOE_CUDA_CHECK(cudaGraphExecDestroy(instance));
    KMOE_CUDA_CHECK(cudaGraphDestroy(graph));
  }
  KMOE_CUDA_CHECK(cudaStreamDestroy(stream));
}

}  // namespace

BOOST_AUTO_TEST_SUITE(router_cuda_graph)

// E = 128 with groups: the one-chunk lane forward, the dense backward, the aux loss in two launches
BOOST_AUTO_TEST_CASE(capture_once_replay_with_changed_inputs) {
  Problem p(4096, 128, 4, true);
  capture_once_replay(p);
}

// E = 1024, k = 32: the lane forward with four chunks per lane (its shared-memory carveout set by the warm-up),
// the several-chunk backward, the aux loss in three launches
BOOST_AUTO_TEST_CASE(capture_once_replay_large) {
  Problem p(2048, 1024, 32, false);
  capture_once_replay(p);
}

BOOST_AUTO_TEST_SUITE_END()

#endif
