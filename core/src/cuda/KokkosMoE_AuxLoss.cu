/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// aux_loss forward/backward (docs/router.md §11). Deterministic fixed-order two-stage reduction, no float atomics:
//   1. column partial sums over row chunks of kAuxLossRowChunk rows (sequential in row order) -> workspace
//   2. per column: sum of the chunk partials in chunk order, times tokens_per_expert[c] -> workspace
//   3. one block: fixed-order sum over the columns, Const computed on the device (device total read there on
//      every launch), loss = Const * sum; const_buf = {Const, FP32 loss}; loss cast once.
//   With C <= 256 columns (step 2 is one block then anyway) steps 2 and 3 are one launch, thread c owning column
//   c in both, with the same sums in the same order, so the bits do not change: two launches instead of three,
//   which is what a small T pays. Wider rows keep step 2 spread over several blocks.
// Workspace: ceil(R/256)*C + C floats (<= aux_loss_workspace_floats(R, C)).

#include <cuda/KokkosMoE_Router_Kernels.hpp>

#include <cuda/KokkosMoE_Router_Cuda_Common.cuh>
#include <type_traits>

namespace KokkosMoE {
namespace Impl {
namespace CudaKernels {
namespace detail {
namespace {

/// tokens_per_expert[c] as a float: the integer converted, a bf16_t widened.
template <class Tpe>
__device__ __forceinline__ float tpe_value(const Tpe* p, long long c) {
  if constexpr (std::is_integral_v<Tpe>)
    return static_cast<float>(p[c]);
  else
    return Elem<Tpe>::to_f(storage(p)[c]);
}

constexpr int kColBlock = 256;

template <class P>
__global__ void __launch_bounds__(kColBlock)
    aux_colsum_chunks(const typename Elem<P>::S* probs, long long R, long long C, float* ws) {
  using TT = Elem<P>;
  const long long chunk = blockIdx.y;
  const long long c = static_cast<long long>(blockIdx.x) * kColBlock + threadIdx.x;
  if (c >= C) return;
  const long long r0 = chunk * kAuxLossRowChunk;
  const long long r1 = min(R, r0 + kAuxLossRowChunk);
  float acc = 0.0f;
  for (long long r = r0; r < r1; ++r) acc += TT::to_f(__ldg(probs + r * C + c));
  ws[chunk * C + c] = acc;
}

/// Column c's sum of the chunk partials, in chunk order, times tokens_per_expert[c] (step 2; shared by both launch
/// shapes, so that they give the same bits).
template <class Tpe>
__device__ __forceinline__ float aux_column_product(const float* ws, long long nchunks, long long C, const Tpe* tpe,
                                                    long long c) {
  float s = 0.0f;
  for (long long j = 0; j < nchunks; ++j) s += ws[j * C + c];
  return s * tpe_value(tpe, c);
}

template <class Tpe>
__global__ void __launch_bounds__(kColBlock)
    aux_colsum_final(const float* ws, long long nchunks, long long C, const Tpe* tpe, float* prod) {
  const long long c = static_cast<long long>(blockIdx.x) * kColBlock + threadIdx.x;
  if (c >= C) return;
  prod[c] = aux_column_product(ws, nchunks, C, tpe, c);
}

/// The loss from each thread's share s of sum_c prod[c] (blockDim.x = 1024): warp sums, then thread 0 adds the
/// warp sums in warp order, computes Const (the device total read here, on every launch) and writes const_buf and
/// the loss.
template <class P>
__device__ __forceinline__ void aux_loss_finish(float s, long long R, int E, int topk, float coeff,
                                                std::int64_t host_total, const std::int64_t* dev_total,
                                                typename Elem<P>::S* loss, float* const_buf) {
  __shared__ float part[32];
  s = seg_add_f32<32>(s);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.0f;
    const int nw = blockDim.x >> 5;
    for (int i = 0; i < nw; ++i) total += part[i];
    const float tt = static_cast<float>(dev_total ? *dev_total : host_total);
    const float cst = ((static_cast<float>(E) * coeff) / static_cast<float>(topk)) / tt / tt;
    const float l = (R > 0) ? cst * total : 0.0f;
    const_buf[0] = cst;
    const_buf[1] = l;
    loss[0] = Elem<P>::from_f(l);
  }
}

template <class P>
__global__ void __launch_bounds__(1024)
    aux_loss_total(const float* prod, long long C, long long R, int E, int topk, float coeff, std::int64_t host_total,
                   const std::int64_t* dev_total, typename Elem<P>::S* loss, float* const_buf) {
  float s = 0.0f;
  if (R > 0)
    for (long long c = threadIdx.x; c < C; c += blockDim.x) s += prod[c];
  aux_loss_finish<P>(s, R, E, topk, coeff, host_total, dev_total, loss, const_buf);
}

/// Steps 2 and 3 for C <= kColBlock (R > 0): thread c forms column c's product and keeps it as its share.
template <class P, class Tpe>
__global__ void __launch_bounds__(1024)
    aux_final_total(const float* ws, long long nchunks, long long C, const Tpe* tpe, long long R, int E, int topk,
                    float coeff, std::int64_t host_total, const std::int64_t* dev_total, typename Elem<P>::S* loss,
                    float* const_buf) {
  const long long c = threadIdx.x;
  const float s = c < C ? aux_column_product(ws, nchunks, C, tpe, c) : 0.0f;
  aux_loss_finish<P>(s, R, E, topk, coeff, host_total, dev_total, loss, const_buf);
}

/// How aux_loss_grad forms the vectors it stores: kFixedColumn, the grid's stride is a whole number of rows, so that
/// every vector of a thread lies in one column (formed once, in registers); kStaged, each block forms the row once in
/// shared memory (rows up to kAuxGradStagedBytes); kFormed, each vector is formed where it is stored.
enum AuxGradMode { kFixedColumn, kStaged, kFormed };

/// Rows of at most this many bytes are formed once per block in shared memory (AuxGradMode::kStaged).
constexpr long long kAuxGradStagedBytes = 32 * 1024;

/// grad_probs [R, C] as one flat array of n = R * C / VW vectors of VW columns (C % VW == 0: no vector crosses a
/// row), written by a grid-stride loop, so that a warp stores 32 consecutive vectors at any row width. A value depends
/// on its column only (cst * tokens_per_expert[c] * grad_loss); MODE says where it is formed. A thread keeps its
/// vector's column cv by adding the stride's remainder (one division per thread, not per vector).
template <class G, class GL, class Tpe, int VW, AuxGradMode MODE>
__global__ void __launch_bounds__(256) aux_loss_grad(long long n, long long CV, const float* const_buf, const Tpe* tpe,
                                                     const typename Elem<GL>::S* grad_loss, typename Elem<G>::S* out) {
  using TT = Elem<G>;
  using S = typename TT::S;
  using VV = Vec<S, VW>;
  extern __shared__ __align__(16) unsigned char aux_row[];
  S* row = reinterpret_cast<S*>(aux_row);
  const float cst = const_buf[0];
  const float gl = Elem<GL>::to_f(__ldg(grad_loss));
  auto value = [&](long long c) { return TT::from_f(cst * tpe_value(tpe, c) * gl); };
  auto form = [&](long long cv) {
    S v[VW];
#pragma unroll
    for (int w = 0; w < VW; ++w) v[w] = value(cv * VW + w);
    return VV::from_array(v);
  };
  if constexpr (MODE == kStaged) {
    for (long long c = threadIdx.x; c < CV * VW; c += blockDim.x) row[c] = value(c);
    __syncthreads();
  }
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  long long j = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= n) return;
  if constexpr (MODE == kFixedColumn) {
    const typename VV::R vec = form(j % CV);
    for (; j < n; j += stride) VV::st(out + j * VW, vec);
  } else {
    const long long dc = stride % CV;
    for (long long cv = j % CV; j < n; j += stride) {
      if constexpr (MODE == kStaged)
        VV::st(out + j * VW, reinterpret_cast<const typename VV::R*>(row)[cv]);
      else
        VV::st(out + j * VW, form(cv));
      cv += dc;
      if (cv >= CV) cv -= CV;
    }
  }
}

/// aux_loss_grad<..., VW> over grad_probs [R, C] on q: at most 8 blocks of 256 threads per SM, each thread looping
/// over its vectors.
template <int VW, class G, class GL, class Tpe>
cudaError_t launch_aux_loss_grad(long long R, long long C, const float* const_buf, const Tpe* tpe,
                                 const typename Elem<GL>::S* grad_loss, typename Elem<G>::S* out, const Queue& q) {
  const long long CV = C / VW;
  const long long n = R * CV;
  const long long most = static_cast<long long>(sm_count(q.device)) * 8;
  const unsigned blocks = static_cast<unsigned>((n + 255) / 256 < most ? (n + 255) / 256 : most);
  const long long row_bytes = C * static_cast<long long>(sizeof(typename Elem<G>::S));
  if ((static_cast<long long>(blocks) * 256) % CV == 0) {
    aux_loss_grad<G, GL, Tpe, VW, kFixedColumn><<<blocks, 256, 0, q.stream>>>(n, CV, const_buf, tpe, grad_loss, out);
  } else if (row_bytes <= kAuxGradStagedBytes) {
    const std::size_t smem = static_cast<std::size_t>((row_bytes + 15) / 16 * 16);
    aux_loss_grad<G, GL, Tpe, VW, kStaged><<<blocks, 256, smem, q.stream>>>(n, CV, const_buf, tpe, grad_loss, out);
  } else {
    aux_loss_grad<G, GL, Tpe, VW, kFormed><<<blocks, 256, 0, q.stream>>>(n, CV, const_buf, tpe, grad_loss, out);
  }
  return cudaGetLastError();
}

}  // namespace
}  // namespace detail

template <class P, class Tpe>
cudaError_t aux_loss_forward(const AuxLossForward<P, Tpe>& a, const Queue& q) {
  using detail::kColBlock;
  const detail::DeviceGuard device(q);
  if (device.status() != cudaSuccess) return device.status();
  const long long R = a.rows, C = a.cols;
  const long long nchunks = (R + kAuxLossRowChunk - 1) / kAuxLossRowChunk;
  float* prod = a.workspace + nchunks * C;
  const auto* probs = detail::storage(a.probs);
  auto* loss = detail::storage(a.loss);
  if (R > 0 && C > 0) {
    const long long cblocks = (C + kColBlock - 1) / kColBlock;
    // grid.y is limited to 65535: chunk rows beyond it are covered by launching in slices
    for (long long y0 = 0; y0 < nchunks; y0 += 65535) {
      const long long ny = nchunks - y0 < 65535 ? nchunks - y0 : 65535;
      const long long rows_here = (y0 + ny) * kAuxLossRowChunk < R ? ny * kAuxLossRowChunk : R - y0 * kAuxLossRowChunk;
      dim3 grid(static_cast<unsigned>(cblocks), static_cast<unsigned>(ny));
      detail::aux_colsum_chunks<P>
          <<<grid, kColBlock, 0, q.stream>>>(probs + y0 * kAuxLossRowChunk * C, rows_here, C, a.workspace + y0 * C);
    }
    if (cblocks == 1) {
      detail::aux_final_total<P, Tpe><<<1, 1024, 0, q.stream>>>(a.workspace, nchunks, C, a.tokens_per_expert, R,
                                                                a.num_experts, a.topk, a.coeff, a.total_num_tokens,
                                                                a.total_num_tokens_device, loss, a.const_buf);
      return cudaGetLastError();
    }
    detail::aux_colsum_final<Tpe><<<static_cast<unsigned>(cblocks), kColBlock, 0, q.stream>>>(
        a.workspace, nchunks, C, a.tokens_per_expert, prod);
  }
  detail::aux_loss_total<P><<<1, 1024, 0, q.stream>>>(prod, C, R, a.num_experts, a.topk, a.coeff, a.total_num_tokens,
                                                      a.total_num_tokens_device, loss, a.const_buf);
  return cudaGetLastError();
}

template <class G, class GL, class Tpe>
cudaError_t aux_loss_backward(const AuxLossBackward<G, GL, Tpe>& a, const Queue& q) {
  const detail::DeviceGuard device(q);
  if (device.status() != cudaSuccess) return device.status();
  const long long R = a.rows, C = a.cols;
  if (R <= 0 || C <= 0) return cudaSuccess;
  // 16-byte vectors where every row starts on one (C % VW == 0, the output aligned); single elements otherwise
  constexpr int VW = 16 / static_cast<int>(sizeof(typename detail::Elem<G>::S));
  auto* out = detail::storage(a.grad_probs);
  if (C % VW == 0 && detail::aligned16(out))
    return detail::launch_aux_loss_grad<VW, G, GL>(R, C, a.const_buf, a.tokens_per_expert, detail::storage(a.grad_loss),
                                                   out, q);
  return detail::launch_aux_loss_grad<1, G, GL>(R, C, a.const_buf, a.tokens_per_expert, detail::storage(a.grad_loss),
                                                out, q);
}

// Every combination the public static_asserts allow (docs/router.md §11): grad_loss float or the probs' type.
#define KOKKOSMOE_AUX_LOSS(P, Tpe)                                                    \
  template cudaError_t aux_loss_forward(const AuxLossForward<P, Tpe>&, const Queue&); \
  template cudaError_t aux_loss_backward(const AuxLossBackward<P, float, Tpe>&, const Queue&)
#define KOKKOSMOE_AUX_LOSS_16(P, Tpe) \
  KOKKOSMOE_AUX_LOSS(P, Tpe);         \
  template cudaError_t aux_loss_backward(const AuxLossBackward<P, P, Tpe>&, const Queue&)
#define KOKKOSMOE_AUX_LOSS_ALL_TPE(M, P) \
  M(P, std::int16_t);                    \
  M(P, std::int32_t);                    \
  M(P, std::int64_t);                    \
  M(P, bf16_t);                          \
  M(P, float)
KOKKOSMOE_AUX_LOSS_ALL_TPE(KOKKOSMOE_AUX_LOSS, float);
KOKKOSMOE_AUX_LOSS_ALL_TPE(KOKKOSMOE_AUX_LOSS_16, fp16_t);
KOKKOSMOE_AUX_LOSS_ALL_TPE(KOKKOSMOE_AUX_LOSS_16, bf16_t);
#undef KOKKOSMOE_AUX_LOSS_ALL_TPE
#undef KOKKOSMOE_AUX_LOSS_16
#undef KOKKOSMOE_AUX_LOSS

}  // namespace CudaKernels
}  // namespace Impl
}  // namespace KokkosMoE
