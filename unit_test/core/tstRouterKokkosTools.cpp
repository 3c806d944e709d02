/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// Kokkos Tools see every router operation (docs/conventions.md §3), in the spirit of ArborX's Kokkos Tools tests:
//  * router_profiling_regions: each call runs inside one profiling region named
//    "KokkosMoE::<operation>[<implementation>]", "[cuda]" for the native launches of the Kokkos::Cuda specialization
//    and "[portable]" for the generic Kokkos kernels (Implementation::Portable, every other backend, and the forward
//    shapes the native kernels leave to the portable path), recorded through the push/pop region callbacks;
//  * router_tools_instances: on an instance of the caller's own, every Kokkos kernel of every operation (forward of
//    each output kind, backward, aux scores, aux loss) carries that instance's Tools device id, and no operation
//    fences except the one documented to (check_finite), recorded through the begin_parallel_* and begin_fence
//    callbacks (unit_test/KokkosToolsEvents.hpp). The native CUDA launches are not Kokkos kernels: the Tools do not
//    see them (router_cuda_streams checks their stream), but a fence inside them would still show.
// The callbacks of Kokkos::Tools::Experimental are the same in Kokkos 3.4 and 4.x; what 3.4 cannot tell (instances
// of one host backend, fences) is reported as skipped.

#include <KokkosMoE_AuxLoss.hpp>
#include <KokkosMoE_EnableDeviceTypes.hpp>
#include <KokkosMoE_Router.hpp>

#include <Kokkos_Core.hpp>

#include <boost/core/demangle.hpp>
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "KokkosToolsEvents.hpp"
#include "RouterTestUtils.hpp"

using namespace KokkosMoETest;

namespace {

// The callbacks are plain function pointers: they record into process-wide state, which the guard below resets.
std::vector<std::string> g_events;  // "push <name>" / "pop <name>", KokkosMoE regions only
std::vector<std::string> g_open;    // names of the open regions (all of them, to match the pops)

bool is_library_region(const std::string& name) { return name.rfind("KokkosMoE::", 0) == 0; }
void on_push(const char* name) {
  g_open.emplace_back(name);
  if (is_library_region(g_open.back())) g_events.push_back("push " + g_open.back());
}
void on_pop() {
  if (g_open.empty()) {
    g_events.emplace_back("pop without push");
    return;
  }
  if (is_library_region(g_open.back())) g_events.push_back("pop " + g_open.back());
  g_open.pop_back();
}

/// Installs the region callbacks for its lifetime (and removes them, so that other tests run without tools).
class RecordRegions {
 public:
  RecordRegions() {
    Kokkos::fence();
    Kokkos::Tools::Experimental::set_push_region_callback(on_push);
    Kokkos::Tools::Experimental::set_pop_region_callback(on_pop);
  }
  ~RecordRegions() {
    Kokkos::fence();
    Kokkos::Tools::Experimental::set_push_region_callback(nullptr);
    Kokkos::Tools::Experimental::set_pop_region_callback(nullptr);
    g_events.clear();
    g_open.clear();
  }
  RecordRegions(const RecordRegions&) = delete;
  RecordRegions& operator=(const RecordRegions&) = delete;

  /// Runs f and checks that it opened and closed exactly the region `name` at the outermost library level.
  template <class F>
  void expect(const std::string& name, F&& f) {
    g_events.clear();
    f();
    BOOST_TEST_CONTEXT("expected region " << name) {
      BOOST_TEST(g_open.empty(), "a region is still open after the call");
      BOOST_TEST_REQUIRE(g_events.size() >= 2u, "no KokkosMoE region was pushed");
      BOOST_TEST(g_events.front() == "push " + name);
      BOOST_TEST(g_events.back() == "pop " + name);
      int depth = 0, outermost = 0;
      for (const std::string& e : g_events) {
        depth += e.rfind("push ", 0) == 0 ? 1 : -1;
        BOOST_TEST(depth >= 0, "unbalanced pops");
        outermost += depth == 0 ? 1 : 0;
      }
      BOOST_TEST(outermost == 1, "the call pushed more than one outermost KokkosMoE region");
    }
  }
};

template <class Exec>
constexpr bool is_cuda() {
#if defined(KOKKOS_ENABLE_CUDA)
  return std::is_same<Exec, Kokkos::Cuda>::value;
#else
  return false;
#endif
}

}  // namespace

BOOST_AUTO_TEST_SUITE(router_profiling_regions)

// Every operation, both implementations: the region of the implementation that runs, pushed and popped once.
BOOST_AUTO_TEST_CASE_TEMPLATE(every_operation, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using D = DeviceType;
  using Exec = typename D::execution_space;
  const Exec exec;
  constexpr int T = 64, E = 32, K = 4;
  const auto logits = device_values<D, float>("logits", T, E, random_values<float>(T * E, 7, -4.0, 4.0));
  const auto grad = device_values<D, float>("grad", T, E, random_values<float>(T * E, 8, -1.0, 1.0));
  const auto grad_k = device_values<D, float>("grad_k", T, K, random_values<float>(T * K, 9, -1.0, 1.0));
  auto probs = make2<D, float>("probs", T, E, 0.f), inter = make2<D, float>("inter", T, E, 0.f);
  auto grad_logits = make2<D, float>("grad_logits", T, E, 0.f);
  auto map = make2<D, std::uint8_t>("map", T, E, 0);
  auto idx = make2<D, std::int32_t>("idx", T, K, 0), ids = make2<D, std::int32_t>("ids", T, K, 0);
  auto weights = make2<D, float>("weights", T, K, 0.f);
  auto tpe = make1<D, std::int32_t>("tpe", E, 16);
  auto const_buf = make1<D, float>("const_buf", 2, 0.f);
  auto workspace =
      make1<D, float>("workspace", static_cast<std::int64_t>(KokkosMoE::aux_loss_workspace_size(T, E)), 0.f);
  V0<D, float> loss("loss"), grad_loss("grad_loss");
  Kokkos::deep_copy(grad_loss, 1.0f);

  RecordRegions rec;
  for (const auto impl : {KokkosMoE::Implementation::Auto, KokkosMoE::Implementation::Portable}) {
    const std::string tag = (is_cuda<Exec>() && impl == KokkosMoE::Implementation::Auto) ? "[cuda]" : "[portable]";
    BOOST_TEST_CONTEXT(Exec::name() << (impl == KokkosMoE::Implementation::Auto ? " Auto" : " Portable")) {
      KokkosMoE::RouterConfig cfg;
      cfg.topk = K;
      cfg.score_function = KokkosMoE::ScoreFunction::Sigmoid;
      cfg.implementation = impl;
      rec.expect("KokkosMoE::topk_router" + tag, [&] { KokkosMoE::topk_router(exec, cfg, logits, probs, map, inter); });
      rec.expect("KokkosMoE::topk_router_backward" + tag,
                 [&] { KokkosMoE::topk_router_backward(exec, cfg, map, inter, grad, grad_logits); });
      rec.expect("KokkosMoE::topk_router" + tag,
                 [&] { KokkosMoE::topk_router_indices(exec, cfg, logits, probs, idx, inter); });
      rec.expect("KokkosMoE::topk_router_backward" + tag,
                 [&] { KokkosMoE::topk_router_indices_backward(exec, cfg, idx, inter, grad, grad_logits); });
      rec.expect("KokkosMoE::topk_router" + tag,
                 [&] { KokkosMoE::topk_router_compact(exec, cfg, logits, ids, weights); });
      rec.expect("KokkosMoE::topk_router_backward" + tag,
                 [&] { KokkosMoE::topk_router_compact_backward(exec, cfg, logits, ids, grad_k, grad_logits); });

      KokkosMoE::AuxScoresConfig acfg;
      acfg.topk = K;
      acfg.score_function = KokkosMoE::ScoreFunction::Sigmoid;
      acfg.implementation = impl;
      rec.expect("KokkosMoE::aux_scores" + tag, [&] { KokkosMoE::aux_scores(exec, acfg, logits, probs, map, inter); });
      rec.expect("KokkosMoE::aux_scores_backward" + tag,
                 [&] { KokkosMoE::aux_scores_backward(exec, acfg, inter, grad, grad_logits); });

      KokkosMoE::AuxLossConfig lcfg;
      lcfg.num_experts = E;
      lcfg.topk = K;
      lcfg.coeff = 0.01f;
      lcfg.implementation = impl;
      rec.expect("KokkosMoE::aux_loss" + tag,
                 [&] { KokkosMoE::aux_loss(exec, lcfg, probs, tpe, std::int64_t{T}, loss, const_buf, workspace); });
      rec.expect("KokkosMoE::aux_loss_backward" + tag,
                 [&] { KokkosMoE::aux_loss_backward(exec, lcfg, const_buf, tpe, grad_loss, grad); });
    }
  }
}

// Forward shapes without a native kernel (more than 1024 experts; a group size that no lane layout fits) run the
// portable path on every backend, Kokkos::Cuda included, and say so in their region.
BOOST_AUTO_TEST_CASE_TEMPLATE(fallback_shapes_are_portable, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using D = DeviceType;
  const typename D::execution_space exec;
  RecordRegions rec;
  struct Shape {
    int E, k, G, gk;
  };
  for (const Shape s : {Shape{2048, 8, 0, 0}, Shape{96, 4, 4, 2}}) {
    BOOST_TEST_CONTEXT("E = " << s.E << ", k = " << s.k << ", G = " << s.G << ", gk = " << s.gk) {
      constexpr int T = 8;
      const auto logits = device_values<D, float>("logits", T, s.E, random_values<float>(T * s.E, 3, -4.0, 4.0));
      auto probs = make2<D, float>("probs", T, s.E, 0.f), inter = make2<D, float>("inter", T, s.E, 0.f);
      auto map = make2<D, std::uint8_t>("map", T, s.E, 0);
      KokkosMoE::RouterConfig cfg;
      cfg.topk = s.k;
      cfg.score_function = KokkosMoE::ScoreFunction::Sigmoid;
      cfg.num_groups = s.G;
      cfg.group_topk = s.gk;
      rec.expect("KokkosMoE::topk_router[portable]",
                 [&] { KokkosMoE::topk_router(exec, cfg, logits, probs, map, inter); });
      if (s.G == 0) {
        KokkosMoE::AuxScoresConfig acfg;
        acfg.topk = s.k;
        acfg.score_function = KokkosMoE::ScoreFunction::Sigmoid;
        rec.expect("KokkosMoE::aux_scores[portable]",
                   [&] { KokkosMoE::aux_scores(exec, acfg, logits, probs, map, inter); });
      }
    }
  }
}

// The map and aux-score backward kernels of the Kokkos::Cuda specialization move rows in chunks of eight experts:
// other expert counts run the portable backward on every backend and say so; the dense-indices and compact backward
// take every shape natively.
BOOST_AUTO_TEST_CASE_TEMPLATE(backward_fallback_shapes_are_portable, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using D = DeviceType;
  using Exec = typename D::execution_space;
  const Exec exec;
  RecordRegions rec;
  const std::string native = is_cuda<Exec>() ? "[cuda]" : "[portable]";
  for (const int E : {130, 13}) {
    BOOST_TEST_CONTEXT("E = " << E) {
      constexpr int T = 40, K = 4;
      const auto logits = device_values<D, float>("logits", T, E, random_values<float>(T * E, 5, -4.0, 4.0));
      const auto grad = device_values<D, float>("grad", T, E, random_values<float>(T * E, 6, -1.0, 1.0));
      const auto gw = device_values<D, float>("gw", T, K, random_values<float>(T * K, 7, -1.0, 1.0));
      auto probs = make2<D, float>("probs", T, E, 0.f), inter = make2<D, float>("inter", T, E, 0.f);
      auto grad_logits = make2<D, float>("grad_logits", T, E, 0.f);
      auto map = make2<D, std::uint8_t>("map", T, E, 0);
      auto idx = make2<D, std::int32_t>("idx", T, K, 0);
      auto ids = make2<D, std::int32_t>("ids", T, K, 0);
      auto weights = make2<D, float>("weights", T, K, 0.f);
      KokkosMoE::RouterConfig cfg;
      cfg.topk = K;
      cfg.score_function = KokkosMoE::ScoreFunction::Sigmoid;
      KokkosMoE::topk_router(exec, cfg, logits, probs, map, inter);
      KokkosMoE::topk_router_indices(exec, cfg, logits, probs, idx, inter);
      KokkosMoE::topk_router_compact(exec, cfg, logits, ids, weights);
      rec.expect("KokkosMoE::topk_router_backward[portable]",
                 [&] { KokkosMoE::topk_router_backward(exec, cfg, map, inter, grad, grad_logits); });
      rec.expect("KokkosMoE::topk_router_backward" + native,
                 [&] { KokkosMoE::topk_router_indices_backward(exec, cfg, idx, inter, grad, grad_logits); });
      rec.expect("KokkosMoE::topk_router_backward" + native,
                 [&] { KokkosMoE::topk_router_compact_backward(exec, cfg, logits, ids, gw, grad_logits); });
      KokkosMoE::AuxScoresConfig acfg;
      acfg.topk = K;
      acfg.score_function = KokkosMoE::ScoreFunction::Sigmoid;
      rec.expect("KokkosMoE::aux_scores_backward[portable]",
                 [&] { KokkosMoE::aux_scores_backward(exec, acfg, inter, grad, grad_logits); });
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

namespace {

/// Every router and aux-loss operation, both implementations, on \p exec: check(operation, may_fence, events) gets
/// the Kokkos Tools events of each call. Only check_finite is documented to fence (docs/router.md §3); the other
/// operations enqueue and return (docs/conventions.md §3).
template <class D, class Check>
void each_router_operation(const typename D::execution_space& exec, Check&& check) {
  using Exec = typename D::execution_space;
  constexpr int T = 48, E = 32, K = 4;
  const auto logits = device_values<D, float>("logits", T, E, random_values<float>(T * E, 17, -4.0, 4.0));
  const auto bias = device_vector<D, float>("bias", random_values<float>(E, 18, -0.5, 0.5));
  const auto grad = device_values<D, float>("grad", T, E, random_values<float>(T * E, 19, -1.0, 1.0));
  const auto grad_k = device_values<D, float>("grad_k", T, K, random_values<float>(T * K, 20, -1.0, 1.0));
  auto probs = make2<D, float>("probs", T, E, 0.f), inter = make2<D, float>("inter", T, E, 0.f);
  auto grad_logits = make2<D, float>("grad_logits", T, E, 0.f);
  auto map = make2<D, std::uint8_t>("map", T, E, 0), bitmap = make2<D, std::uint8_t>("bitmap", T, (E + 7) / 8, 0);
  auto idx = make2<D, std::int32_t>("idx", T, K, 0), ids = make2<D, std::int32_t>("ids", T, K, 0);
  auto weights = make2<D, float>("weights", T, K, 0.f);
  auto tpe = make1<D, std::int32_t>("tpe", E, 12);
  auto const_buf = make1<D, float>("const_buf", 2, 0.f);
  auto workspace =
      make1<D, float>("workspace", static_cast<std::int64_t>(KokkosMoE::aux_loss_workspace_size(T, E)), 0.f);
  V0<D, float> loss("loss"), grad_loss("grad_loss");
  V0<D, std::int64_t> total("total");
  Kokkos::deep_copy(grad_loss, 1.0f);
  Kokkos::deep_copy(total, std::int64_t{T});
  Kokkos::fence();

  RecordToolsEvents rec;
  for (const auto impl : kImpls) {
    BOOST_TEST_CONTEXT(Exec::name() << " " << impl_name(impl)) {
      KokkosMoE::RouterConfig cfg;
      cfg.topk = K;
      cfg.score_function = KokkosMoE::ScoreFunction::Sigmoid;
      cfg.implementation = impl;
      KokkosMoE::RouterConfig bits = cfg;
      bits.map_format = KokkosMoE::RoutingMapFormat::BitmapU8;
      KokkosMoE::RouterConfig softmax = cfg;
      softmax.score_function = KokkosMoE::ScoreFunction::Softmax;
      KokkosMoE::RouterConfig checked = cfg;
      checked.check_finite = true;
      // The portable kernels are Kokkos kernels: a call of theirs that the Tools saw none of would make every
      // check vacuous. The native CUDA launches are not.
      const bool kokkos_kernels = !is_cuda<Exec>() || impl == KokkosMoE::Implementation::Portable;
      auto run = [&](const char* op, bool may_fence, const auto& call) {
        const std::vector<ToolsEvent> events = rec.during(call);
        BOOST_TEST((!kokkos_kernels || kernel_count(events) > 0), op << ": the Tools saw no kernel");
        check(op, may_fence, events);
      };
      run("topk_router (bytemap, bias)", false,
          [&] { KokkosMoE::topk_router(exec, cfg, logits, bias, probs, map, inter); });
      run("topk_router_backward (bytemap)", false,
          [&] { KokkosMoE::topk_router_backward(exec, cfg, map, inter, grad, grad_logits); });
      run("topk_router (bitmap)", false, [&] { KokkosMoE::topk_router(exec, bits, logits, probs, bitmap, inter); });
      run("topk_router_backward (bitmap)", false,
          [&] { KokkosMoE::topk_router_backward(exec, bits, bitmap, inter, grad, grad_logits); });
      run("topk_router_indices (softmax)", false,
          [&] { KokkosMoE::topk_router_indices(exec, softmax, logits, probs, idx, inter); });
      run("topk_router_indices_backward (softmax)", false,
          [&] { KokkosMoE::topk_router_indices_backward(exec, softmax, idx, inter, grad, grad_logits); });
      run("topk_router_compact (bias)", false,
          [&] { KokkosMoE::topk_router_compact(exec, cfg, logits, bias, ids, weights); });
      run("topk_router_compact_backward", false,
          [&] { KokkosMoE::topk_router_compact_backward(exec, cfg, logits, ids, grad_k, grad_logits); });
      run("topk_router (check_finite)", true,
          [&] { KokkosMoE::topk_router(exec, checked, logits, probs, map, inter); });

      KokkosMoE::AuxScoresConfig acfg;
      acfg.topk = K;
      acfg.score_function = KokkosMoE::ScoreFunction::Sigmoid;
      acfg.implementation = impl;
      run("aux_scores", false, [&] { KokkosMoE::aux_scores(exec, acfg, logits, probs, map, inter); });
      run("aux_scores_backward", false, [&] { KokkosMoE::aux_scores_backward(exec, acfg, inter, grad, grad_logits); });

      KokkosMoE::AuxLossConfig lcfg;
      lcfg.num_experts = E;
      lcfg.topk = K;
      lcfg.coeff = 0.01f;
      lcfg.implementation = impl;
      run("aux_loss (host total)", false,
          [&] { KokkosMoE::aux_loss(exec, lcfg, probs, tpe, std::int64_t{T}, loss, const_buf, workspace); });
      run("aux_loss (device total)", false,
          [&] { KokkosMoE::aux_loss(exec, lcfg, probs, tpe, total, loss, const_buf, workspace); });
      run("aux_loss_backward", false,
          [&] { KokkosMoE::aux_loss_backward(exec, lcfg, const_buf, tpe, grad_loss, grad); });
    }
    exec.fence();
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(router_tools_instances)

// Every Kokkos kernel of every operation runs on the backend of the caller's instance (not, say, on
// DefaultExecutionSpace when the caller passed Kokkos::Serial).
BOOST_AUTO_TEST_CASE_TEMPLATE(kernels_on_the_user_backend, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  const Exec exec = KokkosMoE::Impl::partitioned_instance(Exec());
  each_router_operation<DeviceType>(exec, [&](const std::string& op, bool, const std::vector<ToolsEvent>& events) {
    expect_on_instance(op, events, exec, /*whole_id=*/false, /*fences_allowed=*/true);
  });
}

// ... and on the caller's instance itself (its whole Tools device id), where the backend tells instances apart.
BOOST_TEST_DECORATOR(*boost::unit_test::precondition(OwnInstanceIds{}))
BOOST_AUTO_TEST_CASE_TEMPLATE(kernels_on_the_user_instance, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  const Exec exec = KokkosMoE::Impl::partitioned_instance(Exec());
  BOOST_TEST_REQUIRE(instance_has_own_tools_id(exec));
  each_router_operation<DeviceType>(exec, [&](const std::string& op, bool, const std::vector<ToolsEvent>& events) {
    expect_on_instance(op, events, exec, /*whole_id=*/true, /*fences_allowed=*/true);
  });
}

// No operation fences but check_finite, whose fence is its own instance's (never a global one).
BOOST_TEST_DECORATOR(*boost::unit_test::precondition(fences_are_reported))
BOOST_AUTO_TEST_CASE_TEMPLATE(no_fence_but_check_finite, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  const Exec exec = KokkosMoE::Impl::partitioned_instance(Exec());
  const std::uint32_t id = Kokkos::Tools::Experimental::device_id(exec);
  each_router_operation<DeviceType>(
      exec, [&](const std::string& op, bool may_fence, const std::vector<ToolsEvent>& events) {
        expect_on_instance(op, events, exec, /*whole_id=*/false, may_fence);
        if (!may_fence) return;
        int own = 0;
        for (const ToolsEvent& e : events) own += e.kind == ToolsEvent::Kind::Fence && e.device_id == id ? 1 : 0;
        BOOST_TEST(own > 0, op << ": the fence of the documented wait was not seen on the caller's instance");
      });
}

BOOST_AUTO_TEST_SUITE_END()
