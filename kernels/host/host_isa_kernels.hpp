// One source, one compiled copy per ISA path (kernels/host_isa.hpp), picked through a table.
//
// A kernel with ISA paths is a type with one static member function `run`, marked ZT_HOST_ISA_BODY
// (always_inline), that holds the arithmetic: typically the vectorizable inner loop over one span of
// elements, with the OpenMP parallel loop outside in the caller. host_isa_kernel<Kernel>(isa) returns a
// pointer to `run` compiled for that path: the wrappers below carry the target attribute and `flatten`,
// so `run` and everything it calls is inlined and vectorized for the path's vector width. The wrappers
// are plain functions (no ifunc, no target_clones), so a test or the benchmark can call any path.
//
//   struct ScaleSpan {
//     ZT_HOST_ISA_BODY static void run(float* x, std::int64_t n, float s) {
//   #pragma omp simd
//       for (std::int64_t i = 0; i < n; ++i) x[i] *= s;
//     }
//   };
//   const auto span = host_isa_kernel<ScaleSpan>(host_isa());   // once per kernel call
//   #pragma omp parallel for ...   span(x + first, count, s);    // per span of kSimdSpan elements
//
// A kernel that runs faster with 256-bit vectors even where AVX-512 is there declares
// `static constexpr HostIsa kWidestIsa = HostIsa::avx2;`: its avx512 path is then its avx2 build.
// Layer norm does (its in-order sums bound it; its 512-bit build took 1.3x the time of the avx2 one on
// an AVX-512 Intel VM, docs/benchmarks.md).
#pragma once

#include <cstdint>

#include "kernels/host_isa.hpp"

// The ISA paths exist for GCC on x86-64 (the target attribute with `flatten` and
// prefer-vector-width); other builds compile the baseline path alone.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ZT_HOST_ISA_PATHS 1
#else
#define ZT_HOST_ISA_PATHS 0
#endif

/// The body of a kernel with ISA paths: inlined into each path's wrapper.
#define ZT_HOST_ISA_BODY [[gnu::always_inline]] inline

namespace zt::kernels::host {

/// Elements per call of a span kernel inside a parallel loop: the call through the table costs
/// nothing next to 4096 elements.
inline constexpr std::int64_t kSimdSpan = 4096;

template <typename Kernel, typename Signature = decltype(&Kernel::run)>
struct HostIsaTable;

template <typename Kernel, typename Result, typename... Args>
struct HostIsaTable<Kernel, Result (*)(Args...)> {
  using Function = Result (*)(Args...);
  __attribute__((flatten)) static Result baseline(Args... args) { return Kernel::run(args...); }
#if ZT_HOST_ISA_PATHS
  // The feature sets host_isa.cpp checks (x86-64-v3 and v4 without the arch= switch, which would stop
  // the inlining of the default-target helpers).
  __attribute__((target("avx2,fma,f16c,bmi,bmi2"), flatten)) static Result avx2(Args... args) {
    return Kernel::run(args...);
  }
  __attribute__((target("avx2,fma,f16c,bmi,bmi2,avx512f,avx512bw,avx512vl,avx512dq,prefer-vector-width=512"),
                 flatten)) static Result
  avx512(Args... args) {
    return Kernel::run(args...);
  }
#endif
  static Function get(HostIsa isa) {
#if ZT_HOST_ISA_PATHS
    if constexpr (requires { Kernel::kWidestIsa; }) {
      if (static_cast<int>(isa) > static_cast<int>(Kernel::kWidestIsa)) isa = Kernel::kWidestIsa;
    }
    switch (isa) {
      case HostIsa::avx512:
        return &avx512;
      case HostIsa::avx2:
        return &avx2;
      case HostIsa::baseline:
        break;
    }
#endif
    (void)isa;
    return &baseline;
  }
};

/// `Kernel::run` compiled for `isa`.
template <typename Kernel>
auto host_isa_kernel(HostIsa isa) {
  return HostIsaTable<Kernel>::get(isa);
}

}  // namespace zt::kernels::host
