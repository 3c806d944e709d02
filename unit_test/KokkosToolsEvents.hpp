/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_TEST_KOKKOSTOOLSEVENTS_HPP
#define KOKKOSMOE_TEST_KOKKOSTOOLSEVENTS_HPP

// Kokkos Tools callbacks that record every kernel launch (begin_parallel_for / _reduce / _scan) and every fence
// (begin_fence) with the Tools device id Kokkos passes: the id names the execution space instance the work went to
// (Kokkos::Tools::Experimental::device_id), so a test can tell whether a library call kept to the caller's instance
// and whether it fenced. Shared by the router's and the EP layer's instance tests.

#include <KokkosMoE_EnableDeviceTypes.hpp>

#include <Kokkos_Core.hpp>
#include <kokkos_ext/KokkosMoE_KokkosCompat.hpp>

#include <boost/core/demangle.hpp>
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <sstream>
#include <string>
#include <tuple>
#include <typeinfo>
#include <utility>
#include <vector>

namespace KokkosMoETest {

struct ToolsEvent {
  enum class Kind { For, Reduce, Scan, Fence };
  Kind kind;
  std::string name;
  std::uint32_t device_id;
};

/// Kokkos 4 fences every instance before it calls a kernel callback unless a tool declined that fence at
/// initialization (request_tool_settings): such a fence is the tools' own, not the library's.
inline bool is_tools_own_fence(const ToolsEvent& e) {
  return e.kind == ToolsEvent::Kind::Fence && e.name.find("Kokkos Profile Tool Fence") != std::string::npos;
}

inline const char* to_string(ToolsEvent::Kind k) {
  switch (k) {
    case ToolsEvent::Kind::For:
      return "parallel_for";
    case ToolsEvent::Kind::Reduce:
      return "parallel_reduce";
    case ToolsEvent::Kind::Scan:
      return "parallel_scan";
    default:
      return "fence";
  }
}

/// The device id as its parts: the backend, the device and the instance (docs of Kokkos::Tools::Experimental).
inline std::string describe_device_id(std::uint32_t id) {
  const KokkosMoE::Impl::ToolsDeviceId d = KokkosMoE::Impl::decode_tools_device_id(id);
  std::ostringstream os;
  os << id << " (backend " << d.type << ", device " << d.device << ", instance " << d.instance << ")";
  return os.str();
}

namespace ToolsRecording {
// The callbacks are plain function pointers, so they record into process-wide state.
inline std::vector<ToolsEvent>& events() {
  static std::vector<ToolsEvent> e;
  return e;
}
template <ToolsEvent::Kind K>
void on_begin(const char* name, const std::uint32_t device_id, std::uint64_t* id) {
  events().push_back(ToolsEvent{K, name != nullptr ? name : "", device_id});
  *id = events().size();
}
inline void on_end(std::uint64_t) {}
}  // namespace ToolsRecording

/// Installs the kernel and fence callbacks for its lifetime and removes them at the end, so that the other tests
/// run without tools. Not thread-safe: the calls it records run on the thread that made it.
class RecordToolsEvents {
 public:
  RecordToolsEvents() {
    Kokkos::fence();
    namespace KTE = Kokkos::Tools::Experimental;
    using K = ToolsEvent::Kind;
    KTE::set_begin_parallel_for_callback(ToolsRecording::on_begin<K::For>);
    KTE::set_begin_parallel_reduce_callback(ToolsRecording::on_begin<K::Reduce>);
    KTE::set_begin_parallel_scan_callback(ToolsRecording::on_begin<K::Scan>);
    KTE::set_begin_fence_callback(ToolsRecording::on_begin<K::Fence>);
    KTE::set_end_parallel_for_callback(ToolsRecording::on_end);
    KTE::set_end_parallel_reduce_callback(ToolsRecording::on_end);
    KTE::set_end_parallel_scan_callback(ToolsRecording::on_end);
    KTE::set_end_fence_callback(ToolsRecording::on_end);
    ToolsRecording::events().clear();
  }
  ~RecordToolsEvents() {
    namespace KTE = Kokkos::Tools::Experimental;
    KTE::set_begin_parallel_for_callback(nullptr);
    KTE::set_begin_parallel_reduce_callback(nullptr);
    KTE::set_begin_parallel_scan_callback(nullptr);
    KTE::set_begin_fence_callback(nullptr);
    KTE::set_end_parallel_for_callback(nullptr);
    KTE::set_end_parallel_reduce_callback(nullptr);
    KTE::set_end_parallel_scan_callback(nullptr);
    KTE::set_end_fence_callback(nullptr);
    ToolsRecording::events().clear();
    Kokkos::fence();
  }
  RecordToolsEvents(const RecordToolsEvents&) = delete;
  RecordToolsEvents& operator=(const RecordToolsEvents&) = delete;

  /// The events f() caused, in order.
  template <class F>
  std::vector<ToolsEvent> during(F&& f) {
    ToolsRecording::events().clear();
    f();
    std::vector<ToolsEvent> out;
    out.swap(ToolsRecording::events());
    return out;
  }
};

/// Whether this Kokkos reports fences to the tools: Kokkos 3.4 declares begin_fence but never calls it, so a test
/// that no fence happened would pass whatever the library did. Probed once with a fence of the default instance.
inline bool tools_report_fences() {
  static const bool reported = [] {
    RecordToolsEvents rec;
    const auto events = rec.during([] { Kokkos::DefaultExecutionSpace().fence(); });
    for (const ToolsEvent& e : events)
      if (e.kind == ToolsEvent::Kind::Fence && !is_tools_own_fence(e)) return true;
    return false;
  }();
  return reported;
}

/// A Boost.Test precondition over tools_report_fences() (the test reports skipped, with the reason, otherwise).
inline boost::test_tools::assertion_result fences_are_reported(boost::unit_test::test_unit_id) {
  boost::test_tools::assertion_result r(tools_report_fences());
  if (!r) {
    r.message() << "this Kokkos (" << KOKKOS_VERSION
                << ") does not report fences to Kokkos Tools: a check that a call issued no fence would pass vacuously";
    std::cout << "skipped: " << r.message().str() << std::endl;
  }
  return r;
}

/// An execution space instance of the caller's own (KokkosMoE::Impl::partitioned_instance), and whether the Tools
/// tell it from the default instance: Kokkos 3.4 gives every Serial and OpenMP instance one id, Kokkos 4 every
/// Serial one. Where they cannot be told apart, a kernel launched on the default instance instead would carry the
/// same id, and only the backend can be checked.
template <class ExecSpace>
bool instance_has_own_tools_id(const ExecSpace& exec) {
  return Kokkos::Tools::Experimental::device_id(exec) != Kokkos::Tools::Experimental::device_id(ExecSpace());
}

/// A Boost.Test precondition for the cases of BOOST_AUTO_TEST_CASE_TEMPLATE over KOKKOSMOE_DEVICE_TYPES: the
/// backend of the case (found by its name, which Boost makes from the demangled device type with ':' and ','
/// replaced by '_') gives its partitioned instance a Tools id of its own. Otherwise the case reports skipped with the
/// reason: a kernel on another instance of that backend would carry the same id.
struct OwnInstanceIds {
  boost::test_tools::assertion_result operator()(boost::unit_test::test_unit_id id) const {
    const std::string name = boost::unit_test::framework::get(id, boost::unit_test::TUT_CASE).p_name;
    boost::test_tools::assertion_result r(false);
    r.message() << "no enabled backend matches the test case " << name;
    find(name, r, std::make_index_sequence<std::tuple_size<KOKKOSMOE_DEVICE_TYPES>::value>{});
    return r;
  }

 private:
  static std::string sanitized(std::string s) {
    std::replace(s.begin(), s.end(), ':', '_');
    std::replace(s.begin(), s.end(), ',', '_');
    return s;
  }
  template <class D>
  static void match(const std::string& name, boost::test_tools::assertion_result& r) {
    using Exec = typename D::execution_space;
    const std::string key = sanitized("Device<" + boost::core::demangle(typeid(Exec).name()) + ",");
    if (name.find(key) == std::string::npos) return;
    const Exec exec = KokkosMoE::Impl::partitioned_instance(Exec());
    r = boost::test_tools::assertion_result(instance_has_own_tools_id(exec));
    if (!r) {
      r.message() << "this Kokkos (" << KOKKOS_VERSION << ") gives every " << Exec::name()
                  << " instance the Tools device id "
                  << describe_device_id(Kokkos::Tools::Experimental::device_id(exec))
                  << ": only the backend of each kernel can be checked";
      std::cout << "skipped: " << name << ": " << r.message().str() << std::endl;
    }
  }
  template <std::size_t... I>
  static void find(const std::string& name, boost::test_tools::assertion_result& r, std::index_sequence<I...>) {
    (match<std::tuple_element_t<I, KOKKOSMOE_DEVICE_TYPES>>(name, r), ...);
  }
};

/// Checks every event of \p events: each kernel ran on \p exec's backend (and, with \p whole_id, carries exec's
/// whole device id: its instance), and no fence happened when \p fences_allowed is false.
template <class ExecSpace>
void expect_on_instance(const std::string& what, const std::vector<ToolsEvent>& events, const ExecSpace& exec,
                        bool whole_id, bool fences_allowed) {
  const std::uint32_t want = Kokkos::Tools::Experimental::device_id(exec);
  const std::uint32_t want_type = KokkosMoE::Impl::decode_tools_device_id(want).type;
  BOOST_TEST_CONTEXT(what) {
    for (const ToolsEvent& e : events) {
      if (is_tools_own_fence(e)) continue;
      if (e.kind == ToolsEvent::Kind::Fence) {
        BOOST_TEST(fences_allowed, "fence \"" << e.name << "\" on " << describe_device_id(e.device_id)
                                              << " inside an operation that must not fence");
        continue;
      }
      if (whole_id)
        BOOST_TEST(e.device_id == want, to_string(e.kind)
                                            << " \"" << e.name << "\" on " << describe_device_id(e.device_id)
                                            << ", not on the user's " << describe_device_id(want));
      else
        BOOST_TEST(KokkosMoE::Impl::decode_tools_device_id(e.device_id).type == want_type,
                   to_string(e.kind) << " \"" << e.name << "\" on " << describe_device_id(e.device_id)
                                     << ", not on the user's backend " << describe_device_id(want));
    }
  }
}

/// The number of kernels among \p events.
inline int kernel_count(const std::vector<ToolsEvent>& events) {
  int n = 0;
  for (const ToolsEvent& e : events) n += e.kind != ToolsEvent::Kind::Fence ? 1 : 0;
  return n;
}

}  // namespace KokkosMoETest

#endif
