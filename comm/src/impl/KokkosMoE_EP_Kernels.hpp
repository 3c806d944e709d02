/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_EP_KERNELS_HPP
#define KOKKOSMOE_EP_KERNELS_HPP

// The portable kernels of the EP layer (docs/ep.md §3): layout, pack, expand, reduce, as Kokkos parallel patterns
// that run on every backend. Slots are the (token, k) pairs with a valid expert id. A slot whose expert is on this
// rank is written by the pack kernel straight into the receive rows. Every other token travels once per destination
// rank ("token rows": the row with a trailer of its K slot floats) to its position in the peer's arrival space, from
// where the peer expands it into the expert-major receive rows; the way back reduces a token's slots on the expert's
// rank first and returns one row per (token, rank). Where a token row goes is a peer address table plus an index
// base per peer: the sender's own source stage for the message transports, the peer's window for direct writes. No
// atomics decide a position, so the layout is deterministic.

#include <impl/KokkosMoE_EP_ArrivalKernels.hpp>
#include <impl/KokkosMoE_EP_Fp8Kernels.hpp>
#include <impl/KokkosMoE_EP_KernelBase.hpp>
#include <impl/KokkosMoE_EP_LayoutKernels.hpp>
#include <impl/KokkosMoE_EP_PackKernels.hpp>

#endif
