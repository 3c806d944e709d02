/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// SM partitions (docs/ep.md §13): a kernel of many more teams than the partition has SMs, launched on its stream,
// runs on at most that many distinct SMs (read from %smid); two partitions held at once share no SM; a released
// partition serves the next owner; an EP group under a cap takes one (SmCap::Auto, Partition) or none (Teams).
#include <KokkosMoE_Communicator_Loopback.hpp>
#include <KokkosMoE_EP.hpp>

#include <boost/test/unit_test.hpp>

#include <set>
#include <string>
#include <thread>
#include <vector>

using namespace KokkosMoE;

namespace {

using Exec = Kokkos::Cuda;
using Team = Kokkos::TeamPolicy<Exec>::member_type;

// The EP group case runs loopback ranks on the device: set before the test main initializes Kokkos (and CUDA).
const bool g_loopback_environment = [] {
  prepare_loopback_environment();
  return true;
}();

/// The SMs that ran the 8 * 132 teams of a kernel on \p exec.
std::set<unsigned> sms_used(const Exec& exec) {
  const int teams = 8 * 132;
  Kokkos::View<unsigned*, Exec::memory_space> sm("sm", teams);
  Kokkos::parallel_for(
      Kokkos::TeamPolicy<Exec>(exec, teams, Kokkos::AUTO), KOKKOS_LAMBDA(const Team& m) {
        unsigned id = 0;
#if defined(__CUDA_ARCH__)
        asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
#endif
        Kokkos::single(Kokkos::PerTeam(m), [&]() { sm(m.league_rank()) = id; });
      });
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), sm);
  return std::set<unsigned>(h.data(), h.data() + teams);
}

bool partitions_available() { return Impl::sm_partition_size(Exec().cuda_device(), 16) > 0; }

}  // namespace

BOOST_AUTO_TEST_SUITE(ep_sm_partition)

BOOST_AUTO_TEST_CASE(kernels_stay_on_the_partition) {
  if (!partitions_available()) {
    BOOST_TEST_MESSAGE("skipped: the driver makes no SM partition (green context) on this device");
    return;
  }
  const int device = Exec().cuda_device();
  int device_sms = 0;
  cudaDeviceGetAttribute(&device_sms, cudaDevAttrMultiProcessorCount, device);
  BOOST_TEST(static_cast<int>(sms_used(Exec()).size()) == device_sms);
  for (int cap : {2, 8, 16, 24, 32}) {
    const auto p = Impl::acquire_sm_partition(device, cap);
    BOOST_REQUIRE(p);
    BOOST_TEST(p->sms >= 1);
    BOOST_TEST(p->sms <= cap);
    BOOST_TEST(p->sms == Impl::sm_partition_size(device, cap));
    const auto used = sms_used(Exec(p->stream));
    BOOST_TEST(static_cast<int>(used.size()) <= p->sms, "cap " << cap << ": " << used.size() << " SMs ran teams");
    BOOST_TEST(static_cast<int>(used.size()) >= 1);
  }
}

BOOST_AUTO_TEST_CASE(partitions_held_at_once_are_disjoint) {
  if (!partitions_available()) {
    BOOST_TEST_MESSAGE("skipped: the driver makes no SM partition (green context) on this device");
    return;
  }
  const int device = Exec().cuda_device();
  auto a = Impl::acquire_sm_partition(device, 16), b = Impl::acquire_sm_partition(device, 16);
  BOOST_REQUIRE(a);
  BOOST_REQUIRE(b);
  BOOST_TEST(a->stream != b->stream);
  BOOST_TEST(!a->shared);
  BOOST_TEST(!b->shared);
  const auto ua = sms_used(Exec(a->stream)), ub = sms_used(Exec(b->stream));
  for (unsigned id : ua) BOOST_TEST(ub.count(id) == 0u, "SM " << id << " ran teams of both partitions");
  // Released and asked for again: the same partition serves (the process keeps its green contexts).
  const cudaStream_t sa = a->stream;
  a.reset();
  auto c = Impl::acquire_sm_partition(device, 16);
  BOOST_REQUIRE(c);
  BOOST_TEST(c->stream == sa);
}

BOOST_AUTO_TEST_CASE(ep_groups_take_a_partition_under_a_cap) {
  if (!partitions_available()) {
    BOOST_TEST_MESSAGE("skipped: the driver makes no SM partition (green context) on this device");
    return;
  }
  const int R = 2;
  auto comms = make_loopback_communicators(R, Exec().cuda_device());
  std::vector<std::string> found(R);
  std::vector<std::thread> ranks;
  std::vector<cudaStream_t> streams(R);
  for (auto& st : streams) cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
  for (int r = 0; r < R; ++r)
    ranks.emplace_back([&, r] {
      const Exec exec(streams[r]);
      try {
        EpGroupConfig c;
        c.ep_size = R;
        c.num_experts = 4;
        c.hidden_size = 64;
        c.topk = 2;
        c.max_tokens_per_rank = 8;
        std::string& f = found[r];
        c.max_sms = 16;
        const int size = Impl::sm_partition_size(Exec().cuda_device(), 16);
        if (EpGroup<Exec>(exec, comms[r], c).partition_sms() != size) f += "Auto took no partition; ";
        c.sm_cap = SmCap::Partition;
        if (EpGroup<Exec>(exec, comms[r], c).partition_sms() != size) f += "Partition took none; ";
        c.sm_cap = SmCap::Teams;
        if (EpGroup<Exec>(exec, comms[r], c).partition_sms() != 0) f += "Teams took a partition; ";
        c.max_sms = -1;
        c.sm_cap = SmCap::Partition;
        if (EpGroup<Exec>(exec, comms[r], c).partition_sms() != 0) f += "no cap took a partition; ";
        if (Impl::sm_partition_size(Exec().cuda_device(), 1) == 0) {
          c.max_sms = 1;
          try {
            EpGroup<Exec>(exec, comms[r], c);
            f += "a partition of 1 SM was not refused; ";
          } catch (const InvalidArgument& e) {
            if (e.rule() != Rule::ConfigValue || std::string(e.what()).find("sm_cap") == std::string::npos)
              f += std::string("a partition of 1 SM: ") + e.what() + "; ";
          }
        }
      } catch (const std::exception& e) {
        found[r] += e.what();
      }
    });
  for (auto& t : ranks) t.join();
  for (auto& st : streams) cudaStreamDestroy(st);
  for (int r = 0; r < R; ++r) BOOST_TEST(found[r].empty(), "rank " << r << ": " << found[r]);
}

BOOST_AUTO_TEST_SUITE_END()
