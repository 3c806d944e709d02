/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// Two layers in flight on one communicator (docs/ep.md §2, §14; §12 case 2) over MPI ranks: their split and plain
// steps interleave in every order (EpInterleave.hpp), and each layer's outputs equal its own step run alone, bit for
// bit, and the oracle's. Two handles of one group share the group's wire buffers, so the group takes two
// (EpGroupConfig::wire_buffers); with one, an operation that needs the buffers a pending receive holds is a typed
// error on every rank naming both handles. Two groups of different shapes share nothing but the communicator.
#include <KokkosMoE_EnableDeviceTypes.hpp>

#include <EpInterleave.hpp>
#include <boost/test/unit_test.hpp>

#include <string>

using namespace KokkosMoE;
using namespace KokkosMoE::Test;

BOOST_AUTO_TEST_SUITE(ep_interleaved_layers)

BOOST_AUTO_TEST_CASE_TEMPLATE(two_groups_of_different_shapes, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  Exec exec;
  const Communicator& comm = ep_comm<Exec>();
  const int R = comm.size();
  // Layer A: eager, FP32, Weighted. Layer B: capacity mode with room for every slot, bf16, an odd row size, Sum.
  const auto [ca, cb] = two_shapes(R);
  EpGroup<Exec> ga(exec, comm, ca), gb(exec, comm, cb);
  const std::string found = interleavings_match<Exec, float, bf16_t>(
      exec, ga, gb, Routing::Skewed, CombineMode::Weighted, Routing::WithMinusOne, CombineMode::Sum);
  BOOST_TEST(found.empty(), found);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(two_handles_of_one_group, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  Exec exec;
  const Communicator& comm = ep_comm<Exec>();
  auto c = default_config(comm.size());
  c.hidden_size = 40;  // 160-byte rows
  c.max_tokens_per_rank = 5;
  c.wire_buffers = 2;  // a pending receive and another operation, or two pending receives
  for (const bool capacity : {false, true}) {
    auto cc = c;
    if (capacity) cc.max_recv_tokens_per_rank = cc.max_tokens_per_rank * cc.topk * comm.size() + 8;
    EpGroup<Exec> g(exec, comm, cc);
    const std::string found = interleavings_match<Exec, float, float>(
        exec, g, g, Routing::Uniform, CombineMode::Weighted, Routing::AllToOneExpert, CombineMode::Sum);
    BOOST_TEST(found.empty(), (capacity ? "capacity mode: " : "eager: ") << found);
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(busy_wire_buffers_are_a_typed_error, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  // One wire buffer (the default): while layer A's send waits for its hook, every operation of layer B that moves
  // rows is refused on every rank, naming both handles, before anything is communicated; after the hook both layers
  // complete and match the oracle.
  using Exec = typename DeviceType::execution_space;
  Exec exec;
  const Communicator& comm = ep_comm<Exec>();
  auto c = default_config(comm.size());
  BOOST_TEST(c.wire_buffers == 1);
  EpGroup<Exec> g(exec, comm, c);
  Layer<Exec, float> a(exec, g, "layer A", Routing::Skewed, CombineMode::Weighted, 521);
  Layer<Exec, float> b(exec, g, "layer B", Routing::Uniform, CombineMode::Weighted, 522);
  auto refused = [&](const char* what, auto&& f) {
    // The message names both handles and the setting that would serve.
    const std::string msg = refused_as_handle_state(what, f, "handle");
    for (const char* part : {"'layer A'", "'layer B'", "wire_buffers = 2"})
      BOOST_TEST(msg.find(part) != std::string::npos, what << " names no " << part << ": " << msg);
  };
  a.layout(exec);
  a.dispatch_send(exec);
  refused("B's layout while A's dispatch is pending", [&] { b.layout(exec); });
  a.hook(exec);
  b.layout(exec);
  b.dispatch_send(exec);
  refused("A's dispatch while B's is pending", [&] { a.dispatch(exec); });
  refused("A's split dispatch while B's is pending", [&] { a.dispatch_send(exec); });
  b.hook(exec);
  a.dispatch(exec);
  a.expert(exec);
  b.expert(exec);
  a.combine_send(exec);
  refused("B's combine while A's is pending", [&] { b.combine(exec); });
  refused("B's split combine while A's is pending", [&] { b.combine_send(exec); });
  a.hook(exec);
  b.combine(exec);
  a.combine_backward(exec);
  b.combine_backward(exec);
  a.expert_backward(exec);
  b.expert_backward(exec);
  b.combine_send(exec);  // B's second combine: the same y, the same bits
  refused("A's dispatch backward while B's combine is pending", [&] { a.dispatch_backward(exec); });
  b.hook(exec);
  a.dispatch_backward(exec);
  b.dispatch_backward(exec);
  const std::string found = a.check(exec, nullptr) + b.check(exec, nullptr);
  BOOST_TEST(found.empty(), found);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(wire_buffers_out_of_range, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  Exec exec;
  const Communicator& comm = ep_comm<Exec>();
  for (int bad : {0, -1, 9}) {
    auto c = default_config(comm.size());
    c.wire_buffers = bad;
    BOOST_CHECK_EXCEPTION(EpGroup<Exec>(exec, comm, c), InvalidArgument, [](const InvalidArgument& e) {
      return e.rule() == Rule::ConfigValue && e.parameter() == "wire_buffers";
    });
  }
}

BOOST_AUTO_TEST_SUITE_END()
