/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// EpEvent (docs/ep.md §16): one instance's work waits for a point in another's without a host fence. On Kokkos::Cuda
// the recording instance is kept busy for 50 ms before it writes a value; the waiting instance, whose stream is
// otherwise free, must read that value, and the host must not have waited for the recording instance at the wait.
// Host spaces: the recording fences, so the value is there at once. An event never recorded is refused.
#include <KokkosMoE_EnableDeviceTypes.hpp>
#include <KokkosMoE_EpEvent.hpp>

#include <boost/test/unit_test.hpp>
#include <impl/KokkosMoE_EP_Signal.hpp>

#include <chrono>
#include <vector>

using namespace KokkosMoE;

namespace {

template <class Exec>
std::vector<Exec> two_instances() {
#if defined(KOKKOS_ENABLE_CUDA)
  if constexpr (std::is_same<Exec, Kokkos::Cuda>::value) {
    static cudaStream_t a = nullptr, b = nullptr;
    if (a == nullptr) {
      cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
      cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking);
    }
    return {Kokkos::Cuda(a), Kokkos::Cuda(b)};
  }
#endif
  return {Exec(), Exec()};
}

}  // namespace

BOOST_AUTO_TEST_SUITE(ep_event)

BOOST_AUTO_TEST_CASE_TEMPLATE(wait_orders_another_instance, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  using Mem = typename Exec::memory_space;
  const auto inst = two_instances<Exec>();
  const Exec& comm = inst[0];
  const Exec& compute = inst[1];
  Kokkos::View<int*, Mem> flag("flag", 1), seen("seen", 1);
  Kokkos::fence();
  constexpr std::uint64_t kBusyNs = 50'000'000;
  const auto t0 = std::chrono::steady_clock::now();
  Kokkos::parallel_for(
      "busy_then_write", Kokkos::RangePolicy<Exec>(comm, 0, 1), KOKKOS_LAMBDA(int) {
        const std::uint64_t s = Impl::ep_now_ns();
        while (Impl::ep_now_ns() - s < kBusyNs) {
        }
        flag(0) = 7;
      });
  const auto sent = ep_record_event(comm);
  BOOST_TEST(sent.valid());
  ep_wait_event(compute, sent);
  const double host_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  Kokkos::parallel_for(
      "read", Kokkos::RangePolicy<Exec>(compute, 0, 1), KOKKOS_LAMBDA(int) { seen(0) = flag(0); });
  compute.fence();
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), seen);
  BOOST_TEST(h(0) == 7, "the waiting instance read " << h(0) << " before the recorded point");
  constexpr bool device = !Kokkos::SpaceAccessibility<Kokkos::HostSpace, Mem>::accessible;
  // A device event costs the host nothing: the record and the wait returned long before the 50 ms of work ended.
  if (device) BOOST_TEST(host_s < 0.025, "record + wait took " << host_s << " s on the host");
  comm.fence();
}

BOOST_AUTO_TEST_CASE_TEMPLATE(unrecorded_event_is_refused, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  BOOST_CHECK_EXCEPTION(ep_wait_event(Exec(), EpEvent<Exec>()), InvalidArgument, [](const InvalidArgument& e) {
    return e.rule() == Rule::HandleState && e.parameter() == "event";
  });
}

BOOST_AUTO_TEST_SUITE_END()
