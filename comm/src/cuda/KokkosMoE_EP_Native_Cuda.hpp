/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_EP_NATIVE_CUDA_HPP
#define KOKKOSMOE_EP_NATIVE_CUDA_HPP

// EpNative on Kokkos::Cuda (docs/ep.md §3.6): the operations with a native kernel lower their Views to the typed
// pointers of that kernel's arguments and launch it on the instance's stream; the Kokkos Tools see it as a kernel
// "<label>[cuda]" on the instance. No fence, no allocation, CUDA-graph capturable. A shape the kernel does not take
// returns false and the portable kernel runs.

#include <KokkosMoE_Error.hpp>

#include <Kokkos_Core.hpp>
#include <kokkos_ext/KokkosMoE_Float16.hpp>

#include <cuda/KokkosMoE_CudaDevice.hpp>
#include <cuda/KokkosMoE_EP_ExpandDots.hpp>
#include <cuda/KokkosMoE_EP_Fp8Pack.hpp>
#include <impl/KokkosMoE_EP_KernelBase.hpp>
#include <impl/KokkosMoE_EP_Native.hpp>

#include <cstdint>
#include <string>
#include <type_traits>

namespace KokkosMoE {
namespace Impl {

/// A kernel that Kokkos does not launch, reported to the Kokkos Tools as a parallel_for "<label>[cuda]" on \p exec's
/// instance for as long as this lives: begin_parallel_for with the instance's device id, then end_parallel_for, as
/// Kokkos reports its own kernels. Without a tool loaded it costs one flag test (no name is built).
class ToolsKernel {
 public:
  ToolsKernel(const char* label, const Kokkos::Cuda& exec) : m_on(Kokkos::Tools::profileLibraryLoaded()) {
    if (m_on)
      Kokkos::Tools::beginParallelFor(std::string(label) + "[cuda]", Kokkos::Tools::Experimental::device_id(exec),
                                      &m_id);
  }
  ~ToolsKernel() {
    if (m_on) Kokkos::Tools::endParallelFor(m_id);
  }
  ToolsKernel(const ToolsKernel&) = delete;
  ToolsKernel& operator=(const ToolsKernel&) = delete;

 private:
  bool m_on = false;
  std::uint64_t m_id = 0;
};

template <>
struct EpNative<Kokkos::Cuda> {
  using Mem = Kokkos::Cuda::memory_space;

  /// pack_fp8_tokens (impl/KokkosMoE_EP_Fp8Kernels.hpp) by CudaEp::pack_fp8: float or bf16 rows quantized in the pack
  /// (16-byte aligned, QuantizingRows::vec), or rows the caller quantized; at most kFp8PackMaxTopk slots a token.
  template <class Src>
  static bool pack_fp8(const Kokkos::Cuda& exec, const EpShape& s, const Src& src, int units,
                       const Unmanaged2<const float, Mem>& w, const EpLayoutViews<Mem>& v,
                       const Unmanaged2<Chunk16, Mem>& local_q, const Unmanaged2<float, Mem>& local_s,
                       const Unmanaged1<float, Mem>& local_f, const PeerRows<Mem>& dst, std::size_t scales_off,
                       std::size_t trailer_off, const char* label) {
    if (s.K > CudaEp::kFp8PackMaxTopk) return false;
    CudaEp::Fp8PackArgs a;
    a.T = s.T;
    a.K = s.K;
    a.R = s.R;
    a.me = s.me;
    a.units = units;
    a.max_blocks = s.max_teams;
    a.slot_row = v.slot_row.data();
    a.slot_rank = v.slot_rank.data();
    a.tok_pos = v.tok_pos.data();
    if (w.extent(0) > 0) {
      a.w = w.data();
      a.w_ld = static_cast<std::int64_t>(w.stride(0));
    }
    a.local_q = reinterpret_cast<uint4*>(local_q.data());
    a.local_s = local_s.data();
    a.local_f = local_f.extent(0) > 0 ? local_f.data() : nullptr;
    a.peer = dst.peer.data();
    a.peer_base = dst.base.data();
    a.pitch = dst.pitch;
    a.scales_off = scales_off;
    a.trailer_off = trailer_off;
    if constexpr (Src::quantizes) {
      using Scalar = typename std::decay_t<decltype(src.x)>::non_const_value_type;
      if constexpr (std::is_same<Scalar, float>::value || std::is_same<Scalar, bf16_t>::value) {
        if (!src.vec) return false;
        CudaEp::QuantizeSource<Scalar> q;
        q.x = src.x.data();
        q.ld = static_cast<std::int64_t>(src.x.stride(0));
        q.min_amax = src.min_amax;
        q.ue8m0 = src.ue8m0;
        launch(exec, label, a, q);
        return true;
      } else {
        return false;
      }
    } else {
      CudaEp::QuantizedSource q;
      q.q = reinterpret_cast<const uint4*>(src.q.data());
      q.scales = src.scales.data();
      launch(exec, label, a, q);
      return true;
    }
  }

  /// expand_with_dots (impl/KokkosMoE_EP_ArrivalKernels.hpp) by CudaEp::expand_with_dots: float or bf16 rows in
  /// 16-byte units, at most kExpandDotsMaxTopk slots a token.
  template <class Scalar, class Unit>
  static bool expand_with_dots(const Kokkos::Cuda& exec, const EpShape& s, std::int64_t arrivals, int recv_rows,
                               const LocalRows& in, std::size_t trailer_off, const Unmanaged2<const Unit, Mem>& out,
                               const EpLayoutViews<Mem>& v, const PeerRows<Mem>& dots,
                               const Unmanaged2<Unit, Mem>& grad_out) {
    constexpr bool typed = std::is_same<Unit, Chunk16>::value &&
                           (std::is_same<Scalar, float>::value || std::is_same<Scalar, bf16_t>::value);
    if constexpr (!typed) {
      return false;
    } else {
      if (s.K > CudaEp::kExpandDotsMaxTopk) return false;
      CudaEp::ExpandDotsArgs a;
      a.K = s.K;
      a.R = s.R;
      a.L = s.L;
      a.B = s.B;
      a.eager = s.eager();
      a.arrivals = arrivals;
      a.recv_rows = recv_rows;
      a.units = static_cast<int>(grad_out.extent(1));
      a.max_blocks = s.max_teams;
      a.in = reinterpret_cast<const unsigned char*>(in.base);
      a.in_pitch = in.pitch;
      a.trailer_off = trailer_off;
      a.fwd_rows = v.fwd_rows.data();
      a.arrive_rank = v.arrive_rank.data();
      a.arrive_base = v.arrive_base.data();
      a.arrive_count = v.arrive_count.data();
      a.recv_src = v.recv_src.data();
      a.recv_expert = v.recv_expert.data();
      a.offsets = v.expert_offsets.data();
      a.out = reinterpret_cast<const uint4*>(out.data());
      a.grad_out = reinterpret_cast<uint4*>(grad_out.data());
      a.dots_peer = dots.peer.data();
      a.dots_base = dots.base.data();
      a.dots_pitch = dots.pitch;
      const Guard g(exec, "KokkosMoE::ep_combine_backward::expert");
      g.check(CudaEp::expand_with_dots<Scalar>(a, exec.cuda_stream()));
      return true;
    }
  }

 private:
  /// A native launch: the kernel as the Kokkos Tools see it (on the instance), the instance's device, and the
  /// launch's error.
  class Guard {
   public:
    Guard(const Kokkos::Cuda& exec, const char* label)
        : m_label(label), m_tools(label, exec), m_device(exec.cuda_device()) {}
    void check(cudaError_t r) const {
      if (r != cudaSuccess) throw DeviceError(std::string(m_label) + ": CUDA launch failed: " + cudaGetErrorString(r));
    }

   private:
    const char* m_label;
    ToolsKernel m_tools;
    CudaDeviceGuard m_device;
  };

  template <class Src>
  static void launch(const Kokkos::Cuda& exec, const char* label, const CudaEp::Fp8PackArgs& a, const Src& src) {
    const Guard g(exec, label);
    g.check(CudaEp::pack_fp8(a, src, exec.cuda_stream()));
  }
};

}  // namespace Impl
}  // namespace KokkosMoE

#endif
