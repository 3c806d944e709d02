/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_PERF_BENCHEPLOOPBACK_HPP
#define KOKKOSMOE_PERF_BENCHEPLOOPBACK_HPP

#include <vector>

namespace KokkosMoE {
namespace Perf {

/// The loopback benchmarks (ep_loopback/OP/MODE/R<n>/SHAPE) at R = 2, 4, 8 for each token count; nothing where the
/// default execution space is not Kokkos::Cuda (host loopback needs Kokkos >= 4 Serial instances).
void register_loopback_benchmarks(const std::vector<int>& tokens);

}  // namespace Perf
}  // namespace KokkosMoE

#endif
