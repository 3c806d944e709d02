/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTER_CUDA_FORWARD_CUH
#define KOKKOSMOE_ROUTER_CUDA_FORWARD_CUH

// Forward kernels of topk_router (all output kinds) and aux_scores (docs/router.md §5, §10).
//
// topk_fwd_reg<L, TPT, NC, W>: the fast path for E <= 1024. TPT lanes (1..32) own one token; lane `ls` owns NC
//   chunks of W contiguous experts, chunk c covering experts (c*TPT + ls)*W .. +W-1 (16-byte loads when W is the
//   vector width). Scores and keys live in registers. Selection (exact, deterministic):
//     1. tau = the k-th largest per-lane maximum (k <= TPT): a lower bound of the k-th largest key, found with
//        k rounds of one redux.sync; candidates = keys >= tau (typically k + 1 or 2 of them);
//     2. if there are too many candidates (ties, k > TPT, few eligible lanes) the exact k-th key is found by a
//        32-step bitwise search with redux.sync counts, and ties at it are cut by index order (segment scan);
//     3. candidates are compacted into shared memory and each is ranked by counting the candidates that beat it
//        under (key desc, index asc): rank = slot. No float atomics, no data-dependent order.
//   Weights are computed per slot (one division per slot, sums in slot order), then scattered through a
//   per-token shared row so that every output row is written once with coalesced vector stores.
// topk_fwd_rounds<L, TPT, NC, W> (KokkosMoE_Router_Cuda_ForwardRounds.cuh): the same mapping for k <= TPT,
//   selecting by k rounds of a segment arg-max.
// topk_fwd_lane (KokkosMoE_Router_Cuda_ForwardLane.cuh) is preferred where it applies. Shapes none of them handles
// (E > 1024, groupings no lane layout fits) run the portable path (CudaKernels::plan_forward).

#include <cuda/KokkosMoE_Router_Cuda_Params.hpp>

#include <cuda/KokkosMoE_Router_Cuda_Common.cuh>

namespace KokkosMoE {
namespace Impl {
namespace CudaKernels {
namespace detail {

constexpr int kOutBytemap = static_cast<int>(RoutingOutput::Bytemap);
constexpr int kOutBitmap = static_cast<int>(RoutingOutput::BitmapU8);
constexpr int kOutIndices = static_cast<int>(RoutingOutput::Indices);
constexpr int kOutCompact = static_cast<int>(RoutingOutput::Compact);

/// Candidate-list limit of the fast selection (above it, or with ties piling up, the exact search runs).
constexpr int kCandLimit = 64;

/// Element e of the expert bias as float (ExpertBias: at most one typed pointer is set; the caller checks present()).
__device__ __forceinline__ float bias_value(const ExpertBias& b, int e) {
  if (b.f32 != nullptr) return __ldg(b.f32 + e);
  if (b.f16 != nullptr) return Elem<fp16_t>::to_f(__ldg(storage(b.f16) + e));
  return Elem<bf16_t>::to_f(__ldg(storage(b.bf16) + e));
}

/// Writes slot o of the dense indices in the caller's index type.
__device__ __forceinline__ void store_index(const IndexOutput& out, long long o, int v) {
  if (out.i32 != nullptr)
    out.i32[o] = v;
  else if (out.i64 != nullptr)
    out.i64[o] = v;
  else
    out.i16[o] = static_cast<std::int16_t>(v);
}

/// Inserts v into the descending list L[0..N) (values only; multiset semantics).
template <int N>
__device__ __forceinline__ void list_insert(unsigned (&L)[N], unsigned v) {
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const unsigned hi = max(L[j], v);
    v = min(L[j], v);
    L[j] = hi;
  }
}

/// W floats of shared memory at p (16-byte aligned, W % 4 == 0) in float4 loads.
template <int W>
__device__ __forceinline__ void load_shared4(const float* p, float (&out)[W]) {
  static_assert(W % 4 == 0, "whole float4 vectors");
#pragma unroll
  for (int w = 0; w < W; w += 4) {
    const float4 q = *reinterpret_cast<const float4*>(p + w);
    out[w] = q.x;
    out[w + 1] = q.y;
    out[w + 2] = q.z;
    out[w + 3] = q.w;
  }
}

/// The block's expert bias widened into the float row at \p sbias (bias_row_offset), zeros from E up to the kernel's
/// \p row experts (a lane's chunk past E may read them), when there is one: every thread of the block calls it before
/// its token loop. The token loops read it without a branch on the bias type (per element with three typed pointers,
/// or per lane in registers, the register layouts of 16-bit logits spilled or lost speed).
template <class L>
__device__ __forceinline__ void stage_bias(const FwdParams<L>& P, float* sbias, int row) {
  if (!P.bias.present()) return;
  for (int e = threadIdx.x; e < row; e += blockDim.x) sbias[e] = e < P.E ? bias_value(P.bias, e) : 0.0f;
  __syncthreads();
}

/// The lane's chunks of the logits row of token t as raw vectors (zeros past the row or for t >= T): loaded one
/// token ahead by the register kernels, then widened.
template <class L, int TPT, int NC, int W>
struct LaneRow {
  using S = typename Elem<L>::S;
  using VV = Vec<S, W>;
  using Raw = typename VV::R;
  __device__ __forceinline__ static void load(const FwdParams<L>& P, long long t, int ls, const bool (&cvalid)[NC],
                                              Raw (&r)[NC]) {
    const S* row = storage(P.logits) + t * static_cast<long long>(P.E);
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      if (t < P.T && cvalid[c])
        r[c] = VV::ldg(row + (c * TPT + ls) * W);
      else
        memset(&r[c], 0, sizeof(Raw));
    }
  }
  __device__ __forceinline__ static void widen(const Raw (&r)[NC], float (&x)[NC * W]) {
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      S s[W];
      VV::to_array(r[c], s);
#pragma unroll
      for (int w = 0; w < W; ++w) x[c * W + w] = Elem<L>::to_f(s[w]);
    }
  }
};

/// The score of a group with kg <= 2 (§5.3): each lane's two best keys (a1 >= a2) merged over the group's sg lanes
/// (a power of two, aligned) by a butterfly, so that every lane of the group gets the group's two best, then summed
/// as the reference sums them.
__device__ __forceinline__ float group_top2_score(unsigned a1, unsigned a2, int sg, int kg) {
  for (int o = 1; o < sg; o <<= 1) {
    const unsigned b1 = __shfl_xor_sync(kFull, a1, o);
    const unsigned b2 = __shfl_xor_sync(kFull, a2, o);
    const unsigned n2 = max(min(a1, b1), max(a2, b2));
    a1 = max(a1, b1);
    a2 = n2;
  }
  float gsum = group_score_add(0.0f, 0, order_key_decode(a1));
  if (kg == 2) gsum = group_score_add(gsum, 1, order_key_decode(a2));
  return gsum;
}

/// Front part of the per-token work shared by both register kernels: activations (§5.1), selection keys (§7),
/// early outputs (intermediate, aux scores), the activation row in shared memory, group-limited eligibility (§5.3).
template <class L, int TPT, int NC, int W>
__device__ __forceinline__ void token_front(const FwdParams<L>& P, const float (&x)[NC * W], float (&y)[NC * W],
                                            unsigned (&key)[NC * W], const bool (&cvalid)[NC], const float* sbias,
                                            bool valid, long long rowE, int ls, int seg, float* ybuf) {
  constexpr int V = NC * W;
  const int fn = P.fn;
  const bool aux = P.aux != 0;
  const bool compact = P.out == kOutCompact;
  const bool softmax_rowstats = fn == kFnSoftmax && (P.pre || aux);
  const bool softmax_post = fn == kFnSoftmax && !P.pre && !aux;
  const bool has_bias = P.bias.present();
  // ---- activations, selection scores, early outputs --------------------------------------------------
  if (fn == kFnSoftmax) {
    if (softmax_rowstats) {
      float m = -INFINITY;
#pragma unroll
      for (int c = 0; c < NC; ++c)
#pragma unroll
        for (int w = 0; w < W; ++w)
          if (cvalid[c]) m = math_fmax(m, x[c * W + w]);
      float s = 0.0f;
#pragma unroll
      for (int c = 0; c < NC; ++c)
#pragma unroll
        for (int w = 0; w < W; ++w)
          if (cvalid[c] && x[c * W + w] != -INFINITY) s += softmax_exp(x[c * W + w], m);
#pragma unroll
      for (int o = TPT / 2; o > 0; o >>= 1) {
        const float mo = __shfl_xor_sync(kFull, m, o);
        const float so = __shfl_xor_sync(kFull, s, o);
        softmax_merge(m, s, mo, so);
      }
      const float inv = 1.0f / s;
#pragma unroll
      for (int p = 0; p < V; ++p) y[p] = softmax_exp(x[p], m) * inv;
    } else {
#pragma unroll
      for (int p = 0; p < V; ++p) y[p] = x[p];
    }
  } else if (fn == kFnSigmoid) {
#pragma unroll
    for (int p = 0; p < V; ++p) y[p] = sigmoid(x[p]);
  } else {
#pragma unroll
    for (int p = 0; p < V; ++p) y[p] = sqrt_softplus(x[p]);
  }

  if (aux && fn != kFnSoftmax) {
    float rs = 0.0f;
#pragma unroll
    for (int c = 0; c < NC; ++c)
#pragma unroll
      for (int w = 0; w < W; ++w)
        if (cvalid[c]) rs += y[c * W + w];
    rs = normalization_denominator(seg_add_f32<TPT>(rs));
    float sc[V];
#pragma unroll
    for (int p = 0; p < V; ++p) sc[p] = y[p] / rs;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      if (valid && cvalid[c]) store_elems<float, W>(P.scores + rowE + (c * TPT + ls) * W, sc + c * W);
#pragma unroll
      for (int w = 0; w < W; ++w) key[c * W + w] = cvalid[c] ? order_key(sc[c * W + w]) : 0u;
    }
  } else {
    if (aux) {  // softmax aux: scores = probabilities
#pragma unroll
      for (int c = 0; c < NC; ++c)
        if (valid && cvalid[c]) store_elems<float, W>(P.scores + rowE + (c * TPT + ls) * W, y + c * W);
    }
#pragma unroll
    for (int c = 0; c < NC; ++c)
#pragma unroll
      for (int w = 0; w < W; ++w) {
        const int p = c * W + w;
        const float sc = has_bias ? y[p] + sbias[(c * TPT + ls) * W + w] : y[p];
        key[p] = cvalid[c] ? order_key(sc) : 0u;
      }
  }
  // intermediate (all modes but compact; Softmax post is written after selection)
  if (!compact && valid && !softmax_post) {
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      float iv[W];
#pragma unroll
      for (int w = 0; w < W; ++w) iv[w] = (fn == kFnSqrtSoftplus) ? x[c * W + w] : y[c * W + w];
      if (cvalid[c]) store_elems<float, W>(P.inter + rowE + (c * TPT + ls) * W, iv);
    }
  }
  // per-token shared row: activations for the slot weights, cleared flags
  if (!aux) {
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      float* d = ybuf + (c * TPT + ls) * W;
      if constexpr (W % 4 == 0) {
#pragma unroll
        for (int w = 0; w < W; w += 4)
          *reinterpret_cast<float4*>(d + w) =
              make_float4(y[c * W + w], y[c * W + w + 1], y[c * W + w + 2], y[c * W + w + 3]);
      } else {
#pragma unroll
        for (int w = 0; w < W; ++w) d[w] = y[c * W + w];
      }
    }
  }

  // ---- group-limited routing (§5.3) -------------------------------------------------------------------
  if (P.gk > 0) {
    const int sg = P.gs / W;  // lanes per group (a power of two <= TPT, checked by the launcher)
    const int kg = P.kg;
    unsigned gkey[NC];
    int gid[NC];
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      gid[c] = ((c * TPT + ls) * W) / P.gs;
      float gsum = 0.0f;
      if (kg <= 2) {
        unsigned a1 = 0, a2 = 0;
#pragma unroll
        for (int w = 0; w < W; ++w) {
          const unsigned v = key[c * W + w];
          a2 = max(a2, min(a1, v));
          a1 = max(a1, v);
        }
        gsum = group_top2_score(a1, a2, sg, kg);
      } else {
        unsigned lst[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) lst[j] = 0;
#pragma unroll
        for (int w = 0; w < W; ++w) list_insert<8>(lst, key[c * W + w]);
        for (int o = 1; o < sg; o <<= 1) {
          unsigned B[8];
#pragma unroll
          for (int j = 0; j < 8; ++j) B[j] = __shfl_xor_sync(kFull, lst[j], o);
#pragma unroll
          for (int j = 0; j < 8; ++j) list_insert<8>(lst, B[j]);
        }
#pragma unroll
        for (int j = 0; j < 8; ++j)
          if (j < kg) gsum = group_score_add(gsum, j, order_key_decode(lst[j]));
      }
      gkey[c] = order_key(gsum);
    }
    int rank[NC];
#pragma unroll
    for (int c = 0; c < NC; ++c) rank[c] = 0;
    const int gpc = TPT / sg;  // groups per chunk row
#pragma unroll
    for (int c2 = 0; c2 < NC; ++c2) {
      for (int j = 0; j < gpc; ++j) {
        const int g2 = c2 * gpc + j;
        if (g2 >= P.G) break;  // uniform
        const unsigned v = __shfl_sync(kFull, gkey[c2], seg * TPT + j * sg);
#pragma unroll
        for (int c = 0; c < NC; ++c) rank[c] += (v > gkey[c] || (v == gkey[c] && g2 < gid[c])) ? 1 : 0;
      }
    }
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const bool elig = gid[c] < P.G && rank[c] < P.gk;
#pragma unroll
      for (int w = 0; w < W; ++w) key[c * W + w] = elig ? key[c * W + w] : 0u;
    }
  }
}

/// The token loop of the register kernels (topk_fwd_reg, topk_fwd_rounds): segment seg of a warp (TPT lanes) takes
/// token tb + seg, tb striding over the grid's tokens; lane ls owns the NC chunks of W experts (c * TPT + ls) * W
/// that lie inside the row (cvalid). The lane's chunks of the next token are loaded while this one is processed.
template <class L, int TPT, int NC, int W>
struct LaneTokens {
  static constexpr int TPW = 32 / TPT;  // tokens per warp
  using Row = LaneRow<L, TPT, NC, W>;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int seg = lane / TPT;
  const int ls = lane % TPT;
  long long stride = 0;
  long long tb = 0;
  bool cvalid[NC];
  typename Row::Raw raw[NC];

  /// Stages the bias (every thread of the block) into the row behind the block's P.tok_smem token rows and returns
  /// it, then starts the first token's load.
  __device__ __forceinline__ const float* start(const FwdParams<L>& P, unsigned char* smem, int bias_row) {
#pragma unroll
    for (int c = 0; c < NC; ++c) cvalid[c] = (c * TPT + ls) * W < P.E;
    float* sbias =
        reinterpret_cast<float*>(smem + bias_row_offset(static_cast<size_t>(blockDim.x >> 5) * TPW * P.tok_smem));
    stage_bias(P, sbias, bias_row);
    stride = static_cast<long long>(gridDim.x) * (blockDim.x >> 5) * TPW;
    tb = (static_cast<long long>(blockIdx.x) * (blockDim.x >> 5) + warp) * TPW;
    if (tb < P.T) Row::load(P, tb + seg, ls, cvalid, raw);
    return sbias;
  }
  __device__ __forceinline__ bool more(const FwdParams<L>& P) const { return tb < P.T; }
  __device__ __forceinline__ long long token() const { return tb + seg; }
  /// The current token's activations and keys (token_front) from its loaded row; the next token's load started.
  /// Returns whether the token is inside the batch.
  __device__ __forceinline__ bool front(const FwdParams<L>& P, const float* sbias, float* ybuf, float (&y)[NC * W],
                                        unsigned (&key)[NC * W]) {
    float x[NC * W];
    Row::widen(raw, x);
    if (tb + stride < P.T) Row::load(P, tb + stride + seg, ls, cvalid, raw);
    const long long t = tb + seg;
    const bool valid = t < P.T;
    token_front<L, TPT, NC, W>(P, x, y, key, cvalid, sbias, valid, t * static_cast<long long>(P.E), ls, seg, ybuf);
    return valid;
  }
  __device__ __forceinline__ void next() { tb += stride; }
};

// =============================================================================================================
// Fast path: TPT lanes per token, NC chunks of W experts per lane
// =============================================================================================================
template <class L, int TPT, int NC, int W>
__global__ void __launch_bounds__(128) topk_fwd_reg(const FwdParams<L> P) {
  using TT = Elem<L>;
  using S = typename TT::S;
  constexpr int V = NC * W;
  constexpr int TPW = 32 / TPT;  // tokens per warp
  constexpr int ECAP = TPT * V;
  static_assert(V <= 32, "selection masks are 32-bit");
  extern __shared__ __align__(16) unsigned char smem[];

  LaneTokens<L, TPT, NC, W> it;
  const int lane = it.lane;
  const int seg = it.seg;
  const int ls = it.ls;
  const bool(&cvalid)[NC] = it.cvalid;
  const int E = P.E;
  const int k = P.k;
  const int fn = P.fn;
  const bool aux = P.aux != 0;
  const bool compact = P.out == kOutCompact;
  const bool softmax_post = fn == kFnSoftmax && !P.pre && !aux;

  unsigned char* tok = smem + static_cast<size_t>(it.warp * TPW + seg) * P.tok_smem;
  unsigned long long* cand = reinterpret_cast<unsigned long long*>(tok);
  int* slot_idx = reinterpret_cast<int*>(tok + P.off_slots);
  float* slot_y = reinterpret_cast<float*>(slot_idx + k);
  float* slot_e = slot_y + k;
  float* ybuf = reinterpret_cast<float*>(tok + P.off_ybuf);  // activations, then weights (same region)
  unsigned char* fbuf = tok + P.off_fbuf;                    // selected flags
  const float* sbias = it.start(P, smem, ECAP);

  for (; it.more(P); it.next()) {
    float y[V];
    unsigned key[V];
    const bool valid = it.front(P, sbias, ybuf, y, key);
    for (int i = ls * 16; i < P.fbuf_bytes; i += TPT * 16) *reinterpret_cast<uint4*>(fbuf + i) = make_uint4(0, 0, 0, 0);
    const long long t = it.token();
    const long long rowE = t * static_cast<long long>(E);

    // ---- top-k selection -------------------------------------------------------------------------------
    unsigned cmask = 0;
    int C = 0;
    bool need_exact = false;
    {
      unsigned tau = 0;
      if constexpr (ECAP <= kCandLimit) {
        tau = 1;  // every real key (>= kNaNKey) is a candidate
      } else {
        if (k <= TPT) {
          unsigned lm = 0;
#pragma unroll
          for (int p = 0; p < V; ++p) lm = max(lm, key[p]);
          int cnt = 0;
          bool done = false;
          for (int r = 0; r < k; ++r) {
            const unsigned M = seg_max_u32<TPT>(lm);
            const int c = seg_add_i32<TPT>(lm == M ? 1 : 0);
            if (!done) {
              tau = M;
              cnt += c;
              done = cnt >= k || M == 0;
            }
            lm = (lm == M) ? 0u : lm;
            if (__all_sync(kFull, done)) break;
          }
        }
      }
      if (tau != 0) {
#pragma unroll
        for (int p = 0; p < V; ++p) cmask |= (key[p] >= tau) ? (1u << p) : 0u;
      }
      C = seg_add_i32<TPT>(__popc(cmask));
      need_exact = valid && (tau == 0 || C > kCandLimit);
    }
    if (__any_sync(kFull, need_exact)) {
      unsigned T = 0;
      for (int b = 31; b >= 0; --b) {
        const unsigned cd = T | (1u << b);
        int c = 0;
#pragma unroll
        for (int p = 0; p < V; ++p) c += (key[p] >= cd) ? 1 : 0;
        c = seg_add_i32<TPT>(c);
        if (c >= k) T = cd;
      }
      int gt = 0;
      cmask = 0;
#pragma unroll
      for (int p = 0; p < V; ++p) {
        const bool g = key[p] > T;
        gt += g ? 1 : 0;
        cmask |= g ? (1u << p) : 0u;
      }
      const int need = k - seg_add_i32<TPT>(gt);
      int base = 0;
#pragma unroll
      for (int c = 0; c < NC; ++c) {
        int tc = 0;
#pragma unroll
        for (int w = 0; w < W; ++w) tc += (key[c * W + w] == T) ? 1 : 0;
        int r = base + seg_excl_scan<TPT>(tc, ls);
#pragma unroll
        for (int w = 0; w < W; ++w) {
          if (key[c * W + w] == T) {
            if (r < need) cmask |= 1u << (c * W + w);
            ++r;
          }
        }
        base += seg_add_i32<TPT>(tc);
      }
      C = k;
    }
    {  // compaction of the candidates
      int off = seg_excl_scan<TPT>(__popc(cmask), ls);
#pragma unroll
      for (int c = 0; c < NC; ++c)
#pragma unroll
        for (int w = 0; w < W; ++w) {
          const int p = c * W + w;
          if (cmask & (1u << p)) cand[off++] = pack_key(key[p], (c * TPT + ls) * W + w);
        }
    }
    __syncwarp();
    // rank = slot: candidates beating this one under (key desc, index asc)
    for (int j = ls; j < C; j += TPT) {
      const unsigned long long me = cand[j];
      int rank = 0;
      int i = 0;
      for (; i + 4 <= C; i += 4) {
        rank += (cand[i] > me) ? 1 : 0;
        rank += (cand[i + 1] > me) ? 1 : 0;
        rank += (cand[i + 2] > me) ? 1 : 0;
        rank += (cand[i + 3] > me) ? 1 : 0;
      }
      for (; i < C; ++i) rank += (cand[i] > me) ? 1 : 0;
      if (rank < k) {
        const int idx = key_index(me);
        if (aux) {
          fbuf[idx] = 1;
        } else {
          slot_idx[rank] = idx;
          slot_y[rank] = ybuf[idx];
        }
      }
    }
    __syncwarp();

    // ---- weights per slot (§5.2): sums in slot order ----------------------------------------------------
    if (!aux) {
      float x0 = 0.0f, inv = 0.0f, D = 0.0f;
      if (softmax_post) {
        x0 = slot_y[0];
        for (int r = ls; r < k; r += TPT) slot_e[r] = softmax_exp(slot_y[r], x0);
        __syncwarp();
        float sum = 0.0f;
        for (int r = 0; r < k; ++r) {
          const float xr = slot_y[r];
          sum += (xr == -INFINITY) ? 0.0f : slot_e[r];
        }
        inv = 1.0f / sum;
      } else if (fn != kFnSoftmax && k > 1) {
        float sum = 0.0f;
        for (int r = 0; r < k; ++r) sum += slot_y[r];
        D = normalization_denominator(sum);
      }
      for (int r = ls; r < k; r += TPT) {
        const int idx = slot_idx[r];
        const float yr = slot_y[r];
        float v;
        if (fn == kFnSoftmax)
          v = P.pre ? yr : slot_e[r] * inv;
        else
          v = (k > 1) ? yr / D : yr;
        if (valid) {
          const long long o = t * static_cast<long long>(k) + r;
          if (compact) {
            P.ids[o] = idx;
            P.weights[o] = P.scale * v;
          } else if (P.out == kOutIndices) {
            store_index(P.indices, o, idx);
          }
        }
        if (valid) {      // (slots of a token beyond T were never written)
          ybuf[idx] = v;  // weights row (activations are no longer read)
          fbuf[idx] = 1;
        }
      }
    }
    __syncwarp();

    // ---- dense outputs: one coalesced pass over the row ---------------------------------------------------
    if (valid && !compact) {
#pragma unroll
      for (int c = 0; c < NC; ++c) {
        if (!cvalid[c]) continue;
        const int e0 = (c * TPT + ls) * W;
        unsigned char f[W];
        {
          using VB = Vec<unsigned char, W>;
          const typename VB::R rb = *reinterpret_cast<const typename VB::R*>(fbuf + e0);
          VB::to_array(rb, f);
        }
        if (!aux) {
          float wv[W], pv[W];
#pragma unroll
          for (int w = 0; w < W; ++w) {
            wv[w] = ybuf[e0 + w];
            pv[w] = f[w] ? P.scale * wv[w] : 0.0f;
          }
          store_elems<L, W>(storage(P.probs) + rowE + e0, pv);
          if (softmax_post) {
#pragma unroll
            for (int w = 0; w < W; ++w) wv[w] = f[w] ? wv[w] : -INFINITY;
            store_elems<float, W>(P.inter + rowE + e0, wv);
          }
        }
        if (P.out == kOutBytemap) store_bytes<W>(P.map + rowE + e0, f);
      }
      if (P.out == kOutBitmap) {
        const int nb = (E + 7) >> 3;
        for (int b = ls; b < nb; b += TPT) {
          const uint2 q = *reinterpret_cast<const uint2*>(fbuf + 8 * b);
          unsigned bits = 0;
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            bits |= ((q.x >> (8 * j)) & 1u) << j;
            bits |= ((q.y >> (8 * j)) & 1u) << (j + 4);
          }
          P.map[t * static_cast<long long>(nb) + b] = static_cast<unsigned char>(bits);
        }
      }
    }
    __syncwarp();
  }
}

/// Inserts (key, pos) into the descending top-Q list (Lk, Lp). Elements arrive in ascending pos, and a tie never
/// displaces an earlier entry, so equal keys stay in index order. Key 0 ("no candidate") never enters.
template <int Q>
__device__ __forceinline__ void topq_insert(unsigned (&Lk)[Q], int (&Lp)[Q], unsigned key, int pos) {
  bool g[Q];
#pragma unroll
  for (int j = 0; j < Q; ++j) g[j] = key > Lk[j];
#pragma unroll
  for (int j = Q - 1; j > 0; --j) {
    Lk[j] = g[j - 1] ? Lk[j - 1] : (g[j] ? key : Lk[j]);
    Lp[j] = g[j - 1] ? Lp[j - 1] : (g[j] ? pos : Lp[j]);
  }
  Lk[0] = g[0] ? key : Lk[0];
  Lp[0] = g[0] ? pos : Lp[0];
}

/// Weight of the slot held by a slot lane (docs/router.md §5.2): yr is the slot's activation (Softmax post: its logit;
/// idle lanes pass 1, a value that keeps the division on its fast path). Sums run over the k slot lanes of the
/// segment starting at lane sbase, in slot order, through shuffles; one division per lane. All lanes must call it.
template <class L>
__device__ __forceinline__ float slot_weight(const FwdParams<L>& P, int k, bool softmax_post, float yr, int sbase) {
  if (softmax_post) {
    const float x0 = __shfl_sync(kFull, yr, sbase);
    const float er = softmax_exp(yr, x0);
    const float ez = softmax_term(yr, x0);
    float sum = 0.0f;
#pragma unroll
    for (int r = 0; r < k; ++r) sum += __shfl_sync(kFull, ez, sbase + r);
    return er * (1.0f / sum);
  }
  if (P.fn == kFnSoftmax || k == 1) return yr;
  float sum = 0.0f;
#pragma unroll
  for (int r = 0; r < k; ++r) sum += __shfl_sync(kFull, yr, sbase + r);
  return normalize(yr, sum);
}

/// Writes slot `slot` of token t (expert idx, weight v before scaling) to the compact ids/weights or dense indices.
template <class L>
__device__ __forceinline__ void store_slot(const FwdParams<L>& P, int k, long long t, int slot, int idx, float v) {
  const long long o = t * static_cast<long long>(k) + slot;
  if (P.out == kOutCompact) {
    P.ids[o] = idx;
    P.weights[o] = P.scale * v;
  } else if (P.out == kOutIndices) {
    store_index(P.indices, o, idx);
  }
}

template <int TPT>
__device__ __forceinline__ unsigned seg_min_u32(unsigned v) {
  if constexpr (TPT == 32) {
    return __reduce_min_sync(kFull, v);
  } else {
#pragma unroll
    for (int o = TPT / 2; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(kFull, v, o));
    return v;
  }
}

/// Kernel choice for the logits type L (KokkosMoE_Router_Cuda_ForwardLaunch.cuh, instantiated per type).
template <class L>
FwdKernel<L> choose_forward(FwdParams<L>& P, const KernelChoice& choice);

}  // namespace detail
}  // namespace CudaKernels
}  // namespace Impl
}  // namespace KokkosMoE

#endif
