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

namespace KokkosMoE {
namespace Impl {
namespace CudaKernels {
namespace detail {
namespace {

__device__ __forceinline__ float load_tpe(const void* p, int dt, long long c) {
  switch (dt) {
    case static_cast<int>(DType::I16):
      return static_cast<float>(static_cast<const short*>(p)[c]);
    case static_cast<int>(DType::I32):
      return static_cast<float>(static_cast<const int*>(p)[c]);
    case static_cast<int>(DType::I64):
      return static_cast<float>(static_cast<const long long*>(p)[c]);
    case static_cast<int>(DType::BF16):
      return Ty<kDtBF16>::to_f(static_cast<const unsigned short*>(p)[c]);
    default:
      return static_cast<const float*>(p)[c];
  }
}

constexpr int kColBlock = 256;

template <int DT>
__global__ void __launch_bounds__(kColBlock) aux_colsum_chunks(const void* probs, long long R, long long C, float* ws) {
  using TT = Ty<DT>;
  const long long chunk = blockIdx.y;
  const long long c = static_cast<long long>(blockIdx.x) * kColBlock + threadIdx.x;
  if (c >= C) return;
  const long long r0 = chunk * kAuxLossRowChunk;
  const long long r1 = min(R, r0 + kAuxLossRowChunk);
  const typename TT::S* p = static_cast<const typename TT::S*>(probs);
  float acc = 0.0f;
  for (long long r = r0; r < r1; ++r) acc += TT::to_f(__ldg(p + r * C + c));
  ws[chunk * C + c] = acc;
}

/// Column c's sum of the chunk partials, in chunk order, times tokens_per_expert[c] (step 2; shared by both launch
/// shapes, so that they give the same bits).
__device__ __forceinline__ float aux_column_product(const float* ws, long long nchunks, long long C, const void* tpe,
                                                    int tpe_type, long long c) {
  float s = 0.0f;
  for (long long j = 0; j < nchunks; ++j) s += ws[j * C + c];
  return s * load_tpe(tpe, tpe_type, c);
}

__global__ void __launch_bounds__(kColBlock)
    aux_colsum_final(const float* ws, long long nchunks, long long C, const void* tpe, int tpe_type, float* prod) {
  const long long c = static_cast<long long>(blockIdx.x) * kColBlock + threadIdx.x;
  if (c >= C) return;
  prod[c] = aux_column_product(ws, nchunks, C, tpe, tpe_type, c);
}

/// The loss from each thread's share s of sum_c prod[c] (blockDim.x = 1024): warp sums, then thread 0 adds the
/// warp sums in warp order, computes Const (the device total read here, on every launch) and writes const_buf and
/// the loss.
template <int DT>
__device__ __forceinline__ void aux_loss_finish(float s, long long R, int E, int topk, float coeff,
                                                std::int64_t host_total, const std::int64_t* dev_total, void* loss,
                                                float* const_buf) {
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
    static_cast<typename Ty<DT>::S*>(loss)[0] = Ty<DT>::from_f(l);
  }
}

template <int DT>
__global__ void __launch_bounds__(1024)
    aux_loss_total(const float* prod, long long C, long long R, int E, int topk, float coeff, std::int64_t host_total,
                   const std::int64_t* dev_total, void* loss, float* const_buf) {
  float s = 0.0f;
  if (R > 0)
    for (long long c = threadIdx.x; c < C; c += blockDim.x) s += prod[c];
  aux_loss_finish<DT>(s, R, E, topk, coeff, host_total, dev_total, loss, const_buf);
}

/// Steps 2 and 3 for C <= kColBlock (R > 0): thread c forms column c's product and keeps it as its share.
template <int DT>
__global__ void __launch_bounds__(1024)
    aux_final_total(const float* ws, long long nchunks, long long C, const void* tpe, int tpe_type, long long R, int E,
                    int topk, float coeff, std::int64_t host_total, const std::int64_t* dev_total, void* loss,
                    float* const_buf) {
  const long long c = threadIdx.x;
  const float s = c < C ? aux_column_product(ws, nchunks, C, tpe, tpe_type, c) : 0.0f;
  aux_loss_finish<DT>(s, R, E, topk, coeff, host_total, dev_total, loss, const_buf);
}

template <int DT>
__global__ void __launch_bounds__(256)
    aux_loss_grad(long long R, long long C, const float* const_buf, const void* tpe, int tpe_type,
                  const void* grad_loss, int gl_type, void* grad_probs) {
  using TT = Ty<DT>;
  const float cst = const_buf[0];
  const float gl = load_any(grad_loss, gl_type, 0);
  typename TT::S* out = static_cast<typename TT::S*>(grad_probs);
  for (long long c = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; c < C;
       c += static_cast<long long>(gridDim.x) * blockDim.x) {
    const typename TT::S v = TT::from_f(cst * load_tpe(tpe, tpe_type, c) * gl);
    for (long long r = blockIdx.y; r < R; r += gridDim.y) out[r * C + c] = v;
  }
}

template <int DT>
cudaError_t aux_fwd(const AuxLossArgs& a, const Queue& q) {
  const long long R = a.rows, C = a.cols;
  const long long nchunks = (R + kAuxLossRowChunk - 1) / kAuxLossRowChunk;
  float* prod = a.workspace + nchunks * C;
  if (R > 0 && C > 0) {
    const long long cblocks = (C + kColBlock - 1) / kColBlock;
    // grid.y is limited to 65535: chunk rows beyond it are covered by launching in slices
    for (long long y0 = 0; y0 < nchunks; y0 += 65535) {
      const long long ny = nchunks - y0 < 65535 ? nchunks - y0 : 65535;
      const long long rows_here = (y0 + ny) * kAuxLossRowChunk < R ? ny * kAuxLossRowChunk : R - y0 * kAuxLossRowChunk;
      dim3 grid(static_cast<unsigned>(cblocks), static_cast<unsigned>(ny));
      aux_colsum_chunks<DT><<<grid, kColBlock, 0, q.stream>>>(
          static_cast<const typename Ty<DT>::S*>(a.probs) + y0 * kAuxLossRowChunk * C, rows_here, C,
          a.workspace + y0 * C);
    }
    if (cblocks == 1) {
      aux_final_total<DT><<<1, 1024, 0, q.stream>>>(a.workspace, nchunks, C, a.tokens_per_expert,
                                                    static_cast<int>(a.tpe_type), R, a.num_experts, a.topk, a.coeff,
                                                    a.total_num_tokens, a.total_num_tokens_device, a.loss, a.const_buf);
      return cudaGetLastError();
    }
    aux_colsum_final<<<static_cast<unsigned>(cblocks), kColBlock, 0, q.stream>>>(
        a.workspace, nchunks, C, a.tokens_per_expert, static_cast<int>(a.tpe_type), prod);
  }
  aux_loss_total<DT><<<1, 1024, 0, q.stream>>>(prod, C, R, a.num_experts, a.topk, a.coeff, a.total_num_tokens,
                                               a.total_num_tokens_device, a.loss, a.const_buf);
  return cudaGetLastError();
}

template <int DT>
cudaError_t aux_bwd(const AuxLossBackwardArgs& a, const Queue& q) {
  const long long R = a.rows, C = a.cols;
  if (R <= 0 || C <= 0) return cudaSuccess;
  const long long cblocks = (C + 255) / 256;
  const int sms = sm_count(q.device);
  long long gy = (static_cast<long long>(sms) * 16 + cblocks - 1) / cblocks;
  if (gy > R) gy = R;
  if (gy > 65535) gy = 65535;
  if (gy < 1) gy = 1;
  dim3 grid(static_cast<unsigned>(cblocks < 2147483647LL ? cblocks : 2147483647LL), static_cast<unsigned>(gy));
  aux_loss_grad<DT><<<grid, 256, 0, q.stream>>>(R, C, a.const_buf, a.tokens_per_expert, static_cast<int>(a.tpe_type),
                                                a.grad_loss, static_cast<int>(a.grad_loss_type), a.grad_probs);
  return cudaGetLastError();
}

}  // namespace
}  // namespace detail

cudaError_t aux_loss_forward(const AuxLossArgs& a, const Queue& q) {
  const detail::DeviceGuard device(q);
  if (device.status() != cudaSuccess) return device.status();
  switch (a.probs_type) {
    case DType::F32:
      return detail::aux_fwd<detail::kDtF32>(a, q);
    case DType::F16:
      return detail::aux_fwd<detail::kDtF16>(a, q);
    case DType::BF16:
      return detail::aux_fwd<detail::kDtBF16>(a, q);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t aux_loss_backward(const AuxLossBackwardArgs& a, const Queue& q) {
  const detail::DeviceGuard device(q);
  if (device.status() != cudaSuccess) return device.status();
  switch (a.grad_probs_type) {
    case DType::F32:
      return detail::aux_bwd<detail::kDtF32>(a, q);
    case DType::F16:
      return detail::aux_bwd<detail::kDtF16>(a, q);
    case DType::BF16:
      return detail::aux_bwd<detail::kDtBF16>(a, q);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace CudaKernels
}  // namespace Impl
}  // namespace KokkosMoE
