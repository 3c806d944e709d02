/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTER_CUDA_FORWARDLAUNCH_CUH
#define KOKKOSMOE_ROUTER_CUDA_FORWARDLAUNCH_CUH

// Launch geometry and kernel choice of the forward kernels; included by one .cu per logits dtype so that the
// instantiations compile in parallel. The choice is made once per call, on the host and without CUDA calls: it
// returns the kernel with its geometry (FwdKernel), or none when no native kernel applies. The forward plan
// (CudaKernels::plan_forward) holds that answer, so whether the native path runs and what it launches cannot
// disagree.

#include <impl/KokkosMoE_Router_KernelChoice.hpp>

#include <algorithm>
#include <cuda/KokkosMoE_Router_Cuda_Forward.cuh>
#include <cuda/KokkosMoE_Router_Cuda_ForwardLane.cuh>
#include <cuda/KokkosMoE_Router_Cuda_ForwardRounds.cuh>

namespace KokkosMoE {
namespace Impl {
namespace CudaKernels {
namespace detail {

inline int round16(int b) { return (b + 15) & ~15; }
inline bool is_pow2(int v) { return v > 0 && (v & (v - 1)) == 0; }

/// Grouping is supported by the register kernel when every chunk of W experts lies in one group and a group
/// spans a power-of-two number of lanes of one chunk row.
template <class L>
bool reg_group_ok(const FwdParams<L>& P, int W, int TPT) {
  if (P.gk <= 0) return true;
  if (P.kg > 8 || P.gs % W != 0) return false;
  const int sg = P.gs / W;
  return is_pow2(sg) && sg <= TPT;
}

/// A persistent token kernel: `warps` warps per block, `tpw` tokens per warp, `smem` dynamic bytes.
template <class L>
FwdKernel<L> persistent(void (*kernel)(FwdParams<L>), int warps, int tpw, size_t smem, bool max_shared = false) {
  return FwdKernel<L>{kernel, warps, tpw, smem, max_shared};
}

/// The dynamic shared memory of a forward block: its tokens' \p token_bytes, then the widened expert-bias row of the
/// kernel's \p row experts (stage_bias) when P has a bias.
template <class L>
size_t with_bias_row(const FwdParams<L>& P, size_t token_bytes, int row) {
  return P.bias.present() ? bias_row_offset(token_bytes) + static_cast<size_t>(row) * sizeof(float) : token_bytes;
}

template <class L, int TPT, int NC, int W>
FwdKernel<L> choose_reg(FwdParams<L>& P) {
  constexpr int ECAP = TPT * NC * W;
  constexpr int TPW = 32 / TPT;
  P.cap = std::max(P.k, std::min(kCandLimit, ECAP));
  P.off_slots = round16(P.cap * 8);
  P.off_ybuf = P.off_slots + round16(3 * P.k * 4);
  P.off_fbuf = P.off_ybuf + round16(ECAP * 4);
  P.fbuf_bytes = round16(ECAP);
  P.tok_smem = P.off_fbuf + P.fbuf_bytes;
  const size_t per_warp = static_cast<size_t>(TPW) * P.tok_smem;
  int warps = static_cast<int>(std::max<size_t>(1, std::min<size_t>(4, (48 * 1024) / per_warp)));
  const size_t smem = with_bias_row(P, per_warp * warps, ECAP);
  return persistent(topk_fwd_reg<L, TPT, NC, W>, warps, TPW, smem);
}

template <class L, int TPT, int NC, int W>
FwdKernel<L> choose_rounds(FwdParams<L>& P) {
  constexpr int ECAP = TPT * NC * W;
  constexpr int TPW = 32 / TPT;
  P.off_fbuf = round16(ECAP * 4);
  P.fbuf_bytes = round16(ECAP);
  P.tok_smem = P.off_fbuf + P.fbuf_bytes;
  const int warps = 4;
  const size_t smem = with_bias_row(P, static_cast<size_t>(TPW) * P.tok_smem * warps, ECAP);
  return persistent(topk_fwd_rounds<L, TPT, NC, W>, warps, TPW, smem);
}

/// Kernel choice between the two register kernels, which give bit-identical outputs: the rounds kernel needs
/// k <= TPT and pays off when a lane owns >= 16 experts (k rounds of one redux each are cheaper than the candidate
/// kernel's threshold search over that many keys per lane); with 8 experts per lane the candidate/threshold kernel
/// is at least as fast, so it runs there and whenever k > TPT (measured on the H200, single kernels timed; the results
/// are in commit a331d46). The small-E 4-wide path in choose_forward always uses the rounds
/// kernel. KernelChoice::forward_threshold_only asks for the candidate kernel instead.
template <class L, int TPT, int NC, int W>
FwdKernel<L> choose_best(FwdParams<L>& P, const KernelChoice& choice) {
  if (P.k <= TPT && NC * W >= 16 && !choice.forward_threshold_only) return choose_rounds<L, TPT, NC, W>(P);
  return choose_reg<L, TPT, NC, W>(P);
}

/// topk_fwd_lane; with several chunks per lane (16-32 KB per block, 4 KB more for the bias row) it asks for the
/// largest carveout. QB: the instantiation that also writes the QB cutoff (FwdParams::cutoff).
template <class L, int TPT, int NC, int W, int K = 0, bool QB = false>
FwdKernel<L> choose_lane(const FwdParams<L>& P) {
  constexpr int TPW = 32 / TPT;
  constexpr int ROW = TPT * NC * W;
  const int warps = 4;
  // per token: the activation row and the key row; with several chunks per lane, the block's widened bias row
  const size_t tokens = static_cast<size_t>(warps) * TPW * 2 * ROW * sizeof(float);
  const size_t smem = NC > 1 ? with_bias_row(P, tokens, ROW) : tokens;
  FwdKernel<L> kernel = persistent(topk_fwd_lane<L, TPT, NC, W, K, QB>, warps, TPW, smem, NC > 1);
  kernel.writes_cutoff = QB;
  return kernel;
}

/// topk_fwd_lane with one chunk of W experts per lane for a run-time lanes-per-token count (2..32); k == 8 gets the
/// compile-time-k variant when KEIGHT (16 and 32 lanes, the common MoE shapes). None for another count.
template <class L, int W, bool KEIGHT, bool QB = false>
FwdKernel<L> choose_lane_tpt(const FwdParams<L>& P, int tpt) {
  if constexpr (KEIGHT) {
    if (P.k == 8 && (tpt == 16 || tpt == 32))
      return tpt == 16 ? choose_lane<L, 16, 1, W, 8, QB>(P) : choose_lane<L, 32, 1, W, 8, QB>(P);
  }
  switch (tpt) {
    case 2:
      return choose_lane<L, 2, 1, W, 0, QB>(P);
    case 4:
      return choose_lane<L, 4, 1, W, 0, QB>(P);
    case 8:
      return choose_lane<L, 8, 1, W, 0, QB>(P);
    case 16:
      return choose_lane<L, 16, 1, W, 0, QB>(P);
    case 32:
      return choose_lane<L, 32, 1, W, 0, QB>(P);
    default:
      return FwdKernel<L>{};
  }
}

/// Lanes per token and chunks per lane of topk_fwd_lane for W experts per lane: the fewest lanes (a power of two,
/// at least k) covering E with one chunk, then up to 4 chunks at 32 lanes. False when W does not apply.
template <class L>
bool lane_shape(const FwdParams<L>& P, int W, int& tpt, int& nc) {
  if (P.E % W != 0) return false;
  tpt = 1;
  while (tpt < 32 && (tpt * W < P.E || tpt < P.k)) tpt <<= 1;
  if (tpt < P.k) return false;
  nc = 1;
  while (tpt * nc * W < P.E) nc <<= 1;
  if (nc * W > 32) return false;
  return P.gk <= 0 || (nc == 1 && P.kg <= 2 && P.gs % W == 0 && is_pow2(P.gs / W));
}

/// The lane kernel (KokkosMoE_Router_Cuda_ForwardLane.cuh) applies when a token fits TPT <= 32 lanes of NC chunks
/// of W contiguous experts (NC*W <= 32) with k <= TPT; with groups, NC == 1, a group spans a power-of-two number of
/// whole lanes and is scored by at most 2 experts. Chunk width: the wider W in {8, 4} that leaves fewer than half
/// of the token's lanes idle (k can force more lanes than E/W: Mixtral's E = 8, k = 2 takes 2 lanes of 4, not 2
/// lanes of 8 with one idle), else the wider that applies; several chunks only with 32 lanes of 8.
/// KernelChoice::forward_lane_width asks for a width. 16 experts per lane (2 or 4 tokens per warp sharing
/// every cross-lane step) is not instantiated: it needs about 117 registers, which halves the resident warps and
/// costs more than the shared steps save (docs/design.md).
template <class L, bool QB>
FwdKernel<L> choose_lane_kernel_for(const FwdParams<L>& P, const KernelChoice& choice) {
  for (int pass = 0; pass < 2; ++pass) {
    for (const int W : {8, 4}) {
      if (choice.forward_lane_width != 0 && W != choice.forward_lane_width) continue;
      int tpt = 0, nc = 0;
      if (!lane_shape(P, W, tpt, nc)) continue;
      if (pass == 0 && tpt * nc * W >= 2 * P.E) continue;
      if (nc == 1) {
        const FwdKernel<L> K =
            W == 8 ? choose_lane_tpt<L, 8, !QB, QB>(P, tpt) : choose_lane_tpt<L, 4, false, QB>(P, tpt);
        if (K.kernel != nullptr) return K;
      } else if (W == 8 && nc == 2) {
        return choose_lane<L, 32, 2, 8, 0, QB>(P);
      } else if (W == 8 && nc == 4) {  // (k = 32 at compile time for the E = 1024, k = 32 shape)
        return P.k == 32 && !QB ? choose_lane<L, 32, 4, 8, 32>(P) : choose_lane<L, 32, 4, 8, 0, QB>(P);
      }
    }
  }
  return FwdKernel<L>{};
}

/// The lane kernel for P; with P.cutoff (Quantile Balancing) the instantiations that also write it, whose k is
/// always a run-time value (the compile-time k = 8 and k = 32 variants are not instantiated twice).
template <class L>
FwdKernel<L> choose_lane_kernel(const FwdParams<L>& P, const KernelChoice& choice) {
  if (P.aux || choice.forward_threshold_only) return FwdKernel<L>{};
  return P.cutoff != nullptr ? choose_lane_kernel_for<L, true>(P, choice) : choose_lane_kernel_for<L, false>(P, choice);
}

/// The native forward kernel for P, with P's shared-memory layout filled in for it. None when no native kernel
/// handles the shape (E > 1024, or a grouping no register kernel's lane layout fits): the caller then runs the
/// portable path.
template <class L>
FwdKernel<L> choose_forward(FwdParams<L>& P, const KernelChoice& choice) {
  constexpr int VW = Elem<L>::VW;
  const int E = P.E;
  const bool vec = (E % VW == 0) && aligned16(P.logits) && aligned16(P.probs) && aligned16(P.inter) &&
                   aligned16(P.scores) && aligned16(P.map);
  if (E <= 1024) {
    if (vec) {
      const FwdKernel<L> K = choose_lane_kernel<L>(P, choice);
      if (K.kernel != nullptr) return K;
    }
    // small E with k above the default lanes per token: 4-wide chunks, more lanes, so the rounds kernel applies
    if (vec && E % 4 == 0 && E <= 32 && !choice.forward_threshold_only) {
      const int tpt_default = E <= 8 ? 1 : (E <= 16 ? 2 : 4);
      if (P.k > tpt_default) {
        if (E <= 8 && P.k <= 2 && reg_group_ok(P, 4, 2)) return choose_rounds<L, 2, 1, 4>(P);
        if (E <= 16 && P.k <= 4 && reg_group_ok(P, 4, 4)) return choose_rounds<L, 4, 1, 4>(P);
        if (P.k <= 8 && reg_group_ok(P, 4, 8)) return choose_rounds<L, 8, 1, 4>(P);
      }
    }
    if (vec) {
      if constexpr (VW == 8) {
        if (E <= 8 && reg_group_ok(P, 8, 1)) return choose_best<L, 1, 1, 8>(P, choice);
        if (E <= 16 && reg_group_ok(P, 8, 2)) return choose_best<L, 2, 1, 8>(P, choice);
        if (E <= 32 && reg_group_ok(P, 8, 4)) return choose_best<L, 4, 1, 8>(P, choice);
        if (E <= 64 && reg_group_ok(P, 8, 8)) return choose_best<L, 8, 1, 8>(P, choice);
        if (E <= 128 && reg_group_ok(P, 8, 16)) return choose_best<L, 16, 1, 8>(P, choice);
        if (E <= 256 && reg_group_ok(P, 8, 32)) return choose_best<L, 32, 1, 8>(P, choice);
        if (E <= 512 && E > 256 && reg_group_ok(P, 8, 32)) return choose_best<L, 32, 2, 8>(P, choice);
        if (E > 512 && reg_group_ok(P, 8, 32)) return choose_best<L, 32, 4, 8>(P, choice);
      } else {
        if (E <= 4 && reg_group_ok(P, 4, 1)) return choose_best<L, 1, 1, 4>(P, choice);
        if (E <= 8 && reg_group_ok(P, 4, 1)) return choose_best<L, 1, 2, 4>(P, choice);
        if (E <= 16 && reg_group_ok(P, 4, 2)) return choose_best<L, 2, 2, 4>(P, choice);
        if (E <= 32 && reg_group_ok(P, 4, 4)) return choose_best<L, 4, 2, 4>(P, choice);
        if (E <= 64 && reg_group_ok(P, 4, 8)) return choose_best<L, 8, 2, 4>(P, choice);
        if (E <= 128 && reg_group_ok(P, 4, 16)) return choose_best<L, 16, 2, 4>(P, choice);
        if (E <= 256 && reg_group_ok(P, 4, 32)) return choose_best<L, 32, 2, 4>(P, choice);
        if (E <= 512 && E > 256 && reg_group_ok(P, 4, 32)) return choose_best<L, 32, 4, 4>(P, choice);
        if (E > 512 && reg_group_ok(P, 4, 32)) return choose_best<L, 32, 8, 4>(P, choice);
      }
    }
    // scalar (coalesced 2/4-byte accesses): any E <= 1024, any alignment
    if (reg_group_ok(P, 1, 32)) {
      if (E <= 32) return choose_best<L, 32, 1, 1>(P, choice);
      if (E <= 128) return choose_best<L, 32, 4, 1>(P, choice);
      if (E <= 256) return choose_best<L, 32, 8, 1>(P, choice);
      if (E <= 512) return choose_best<L, 32, 16, 1>(P, choice);
      return choose_best<L, 32, 32, 1>(P, choice);
    }
  }
  return FwdKernel<L>{};
}

template <class L>
FwdParams<L> lower(const TopkForward<L>& a) {
  FwdParams<L> P;
  P.T = a.num_tokens;
  P.E = a.num_experts;
  P.k = a.config.topk;
  P.fn = static_cast<int>(a.config.score_function);
  P.pre = (a.config.score_function == ScoreFunction::Softmax && a.config.use_pre_softmax) ? 1 : 0;
  P.aux = 0;
  if (a.config.group_topk > 0) {
    P.G = a.config.num_groups;
    P.gk = a.config.group_topk;
    P.gs = P.E / P.G;
    P.kg = P.k / P.gk;
  }
  P.scale = a.config.scaling_factor;
  P.out = static_cast<int>(a.output);
  P.logits = a.logits;
  if (a.config.score_function != ScoreFunction::Softmax) P.bias = a.bias;
  if (a.output == RoutingOutput::Compact) {
    P.ids = a.ids;
    P.weights = a.weights;
  } else {
    P.probs = a.probs;
    P.inter = a.intermediate;
    P.cutoff = a.qb_cutoff;
    if (a.output == RoutingOutput::Indices)
      P.indices = a.indices;
    else
      P.map = a.routing_map;
  }
  return P;
}

template <class L>
FwdParams<L> lower(const AuxScoresForward<L>& a) {
  FwdParams<L> P;
  P.T = a.num_tokens;
  P.E = a.num_experts;
  P.k = a.topk;
  P.fn = static_cast<int>(a.score_function);
  P.pre = 0;
  P.aux = 1;
  P.out = static_cast<int>(a.output);
  P.logits = a.logits;
  P.scores = a.scores;
  P.map = a.routing_map;
  P.inter = a.intermediate;
  return P;
}

/// Launches a chosen kernel with P on q, whose device must be current.
template <class L>
cudaError_t launch_forward_kernel(const FwdKernel<L>& K, const FwdParams<L>& P, const Queue& q) {
  const void* kernel = reinterpret_cast<const void*>(K.kernel);
  cudaError_t err = cudaSuccess;
  if (K.max_shared) {
    err = prefer_max_shared(q.device, kernel);
    if (err != cudaSuccess) return err;
  }
  err = ensure_smem(kernel, K.smem);
  if (err != cudaSuccess) return err;
  const long long tok_per_block = static_cast<long long>(K.warps) * K.tpw;
  const long long work = (P.T + tok_per_block - 1) / tok_per_block;
  const int grid = persistent_grid(q.device, kernel, K.warps * 32, K.smem, work);
  K.kernel<<<grid, K.warps * 32, K.smem, q.stream>>>(P);
  return cudaGetLastError();
}

template <class L, class Args>
ForwardPlan<L> plan(const Args& a, const KernelChoice& choice) {
  ForwardPlan<L> plan;
  plan.params = lower(a);
  plan.kernel = choose_forward(plan.params, choice);
  return plan;
}

}  // namespace detail

template <class L>
ForwardPlan<L> plan_forward(const TopkForward<L>& a, const KernelChoice& choice) {
  return detail::plan<L>(a, choice);
}

template <class L>
ForwardPlan<L> plan_forward(const AuxScoresForward<L>& a, const KernelChoice& choice) {
  return detail::plan<L>(a, choice);
}

template <class L>
cudaError_t run_forward(const ForwardPlan<L>& plan, const Queue& q) {
  if (plan.params.T <= 0) return cudaSuccess;  // nothing per-token is launched (docs/router.md §4.3)
  if (!plan.native()) return cudaErrorInvalidValue;
  const detail::DeviceGuard device(q);
  if (device.status() != cudaSuccess) return device.status();
  return detail::launch_forward_kernel(plan.kernel, plan.params, q);
}

}  // namespace CudaKernels
}  // namespace Impl
}  // namespace KokkosMoE

/// The forward operations for logits of type L (at namespace KokkosMoE::Impl::CudaKernels).
#define KOKKOSMOE_ROUTER_INSTANTIATE_FORWARD(L)                                          \
  template ForwardPlan<L> plan_forward(const TopkForward<L>&, const KernelChoice&);      \
  template ForwardPlan<L> plan_forward(const AuxScoresForward<L>&, const KernelChoice&); \
  template cudaError_t run_forward(const ForwardPlan<L>&, const Queue&)

#endif
