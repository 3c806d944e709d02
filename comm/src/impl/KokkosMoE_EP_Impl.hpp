/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_EP_IMPL_HPP
#define KOKKOSMOE_EP_IMPL_HPP

// Group and handle state, boundary validation and the step drivers of the EP layer (docs/ep.md §3-§6). Each public
// function validates on the host, then enqueues kernels and transfers on the execution space instance; the stream
// handed to the transport is the instance's stream, so every EP kernel and library call runs on it. One header per
// concern: state and checks, transfers and the vote, the layout step, the forward steps, the return steps.

#include <impl/KokkosMoE_EP_CombineSteps.hpp>
#include <impl/KokkosMoE_EP_DispatchSteps.hpp>
#include <impl/KokkosMoE_EP_LayoutStep.hpp>
#include <impl/KokkosMoE_EP_State.hpp>
#include <impl/KokkosMoE_EP_Transfer.hpp>

#endif
