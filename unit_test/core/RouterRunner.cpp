/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// The explicit instantiations RouterRunner.hpp and RouterGrid.hpp declare: the runner and the grid for the three
// logits types on every enabled backend.

#include "RouterGrid.hpp"

namespace KokkosMoETest {

KOKKOSMOE_TEST_RUNNER_ETI(, float)
KOKKOSMOE_TEST_RUNNER_ETI(, fp16_t)
KOKKOSMOE_TEST_RUNNER_ETI(, bf16_t)
KOKKOSMOE_FOR_EACH_DEVICE_TYPE(KOKKOSMOE_TEST_GRID_ETI_DS, , float)
KOKKOSMOE_FOR_EACH_DEVICE_TYPE(KOKKOSMOE_TEST_GRID_ETI_DS, , fp16_t)
KOKKOSMOE_FOR_EACH_DEVICE_TYPE(KOKKOSMOE_TEST_GRID_ETI_DS, , bf16_t)

}  // namespace KokkosMoETest
