/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// The out-of-line parts of RouterTestUtils.hpp.

#include "RouterTestUtils.hpp"

namespace KokkosMoETest {

KOKKOSMOE_TEST_UTILS_ETI()

void expect_rule(KokkosMoE::Rule rule, const std::string& what, const std::function<void()>& f, const char* fn,
                 const char* param) {
  try {
    f();
    BOOST_TEST(false, what << ": no exception, expected rule " << KokkosMoE::rule_name(rule));
  } catch (const KokkosMoE::InvalidArgument& e) {
    BOOST_TEST(static_cast<int>(e.rule()) == static_cast<int>(rule), what << ": rule " << KokkosMoE::rule_name(e.rule())
                                                                          << ", expected " << KokkosMoE::rule_name(rule)
                                                                          << " (" << e.what() << ")");
    BOOST_TEST(std::string(e.what()).find(KokkosMoE::rule_name(rule)) != std::string::npos,
               what << ": message does not name the rule: " << e.what());
    if (fn) BOOST_TEST(e.function() == fn, what << ": function " << e.function() << ", expected " << fn);
    if (param) BOOST_TEST(e.parameter() == param, what << ": parameter " << e.parameter() << ", expected " << param);
  } catch (const std::exception& e) {
    BOOST_TEST(false, what << ": unexpected exception type: " << e.what());
  }
}

}  // namespace KokkosMoETest
