/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// A run in which every test case skipped is reported as skipped, not passed: the Boost.Test mains
// (utf_main.cpp, comm/utf_main_mpi.cpp) each define one SkipReport, an observer that Boost.Test registers before the
// run (a global configuration), which counts the test cases that ran and keeps the reasons of those that skipped. When
// the run ends with none run and at least one skipped, it prints
//   SKIPPED: <n> test unit(s), none run: <test unit>: <reason>; ...
// and the process exits with 77, ctest's SKIP_RETURN_CODE for every KokkosMoE test (cmake/KokkosMoE_Targets.cmake,
// unit_test/comm/mpi_launch.sh), so ctest lists the suite among the tests that did not run and the log says why.
#ifndef KOKKOSMOE_UNIT_TEST_SKIP_REPORT_HPP
#define KOKKOSMOE_UNIT_TEST_SKIP_REPORT_HPP

#include <boost/test/framework.hpp>
#include <boost/test/tree/global_fixture.hpp>
#include <boost/test/tree/test_unit.hpp>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

namespace KokkosMoETest {

/// The exit status of a run whose every test case skipped (ctest's SKIP_RETURN_CODE).
inline constexpr int kSkipReturnCode = 77;

class SkipReport final : public boost::unit_test::global_configuration {
 public:
  using boost::unit_test::test_observer::test_unit_skipped;  // the deprecated one-argument form stays as it is
  void test_unit_start(const boost::unit_test::test_unit& tu) override {
    if (tu.p_type == boost::unit_test::TUT_CASE) ++run_;
  }
  // Units left out by --run_test (and disabled ones) come as "disabled": not a skip of this run.
  void test_unit_skipped(const boost::unit_test::test_unit& tu, boost::unit_test::const_string reason) override {
    const std::string why(reason.begin(), reason.end());
    if (why != "disabled") skipped_.emplace(tu.full_name(), why);
  }
  /// After the report and the global fixtures' teardown (Kokkos, MPI finalized): the process reports skipped when
  /// nothing ran.
  void test_finish() override {
    if (run_ > 0 || skipped_.empty()) return;
    std::string why;
    for (const auto& [name, reason] : skipped_) why += (why.empty() ? "" : "; ") + name + ": " + reason;
    std::printf("SKIPPED: %zu test unit(s), none run: %s\n", skipped_.size(), why.c_str());
    std::fflush(stdout);
    std::exit(kSkipReturnCode);
  }
  // test_finish goes to the observers from the highest priority down: this one is last (the log's is 2).
  int priority() override { return -1; }

 private:
  long run_ = 0;
  std::map<std::string, std::string> skipped_;
};

}  // namespace KokkosMoETest

#endif
