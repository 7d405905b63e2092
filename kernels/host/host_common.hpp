// Shared pieces of the host kernels: dtype dispatch to templates, widening loads and rounding
// stores for 16-bit types, a row-major GEMM over every floating dtype, deterministic sums and the
// counter-based random numbers.
#pragma once

// The CBLAS interface of whichever BLAS the build found (cmake/ZerotrainBlas.cmake): cblas.h from
// OpenBLAS, BLIS, FlexiBLAS or netlib; oneMKL names it mkl_cblas.h.
#if __has_include(<cblas.h>)
#include <cblas.h>
#elif __has_include(<mkl_cblas.h>)
#include <mkl_cblas.h>
#else
#error "no CBLAS header (cblas.h or mkl_cblas.h) on the include path: install the BLAS's development files"
#endif

#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/counter_random.hpp"
#include "kernels/host/host_isa_kernels.hpp"
#include "zerotrain/dtype.hpp"
#include "zerotrain/error.hpp"

namespace zt::kernels::host {

/// Compute (accumulation) type for a storage type: double for double, float for everything else.
template <typename T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <typename T>
inline acc_t<T> load(T value) {
  return static_cast<acc_t<T>>(value);
}
template <typename T>
inline T store(acc_t<T> value) {
  return T(value);
}

/// exp for loops that should vectorize (softmax, cross-entropy, GELU). float: a Cephes-style
/// polynomial (max relative error ~2 ulp on [-87, 88]) in plain arithmetic, so that `omp simd` loops
/// compile to SIMD code instead of one libm call per element; NaN stays NaN, x > 88.37 gives +inf and
/// x < -87 gives 0 (libm: finite up to 88.72, subnormal down to -103). double: std::exp.
template <typename C>
[[gnu::always_inline]] inline C vector_exp(C x) {
  if constexpr (std::is_same_v<C, float>) {
    float clamped = x < -87.0f ? -87.0f : x;
    clamped = clamped > 88.37f ? 88.37f : clamped;
    // Round to nearest through the 1.5 * 2^23 shifter: plain float adds, no call, no rounding mode.
    const float n = (clamped * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    const float r = (clamped - n * 0.693359375f) - n * -2.12194440e-4f;  // ln 2 in two parts
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;  // e^r, r in [-ln2/2, ln2/2]: p in [0.70, 1.42]
    // Times 2^n: add n to the exponent field (n in [-126, 127], so the result stays normal).
    const float result =
        std::bit_cast<float>(std::bit_cast<std::int32_t>(p) + (static_cast<std::int32_t>(n) << 23));
    float ranged = x < -87.0f ? 0.0f : result;
    ranged = x > 88.37f ? HUGE_VALF : ranged;
    return x == x ? ranged : x;
  } else {
    return std::exp(x);
  }
}

/// The hot fp32 loops built on vector_exp (GELU, the softmax and cross-entropy exps) are span kernels
/// with ISA paths: kernels/host/host_isa_kernels.hpp.

/// Call `body(T{})` with T the storage type of a floating dtype; throws for integer dtypes.
template <typename Body>
decltype(auto) with_floating_type(DType dtype, const char* kernel_name, Body&& body) {
  switch (dtype) {
    case DType::fp32:
      return body(float{});
    case DType::fp64:
      return body(double{});
    case DType::bf16:
      return body(bf16{});
    case DType::fp16:
      return body(fp16{});
    default:
      break;
  }
  ZT_THROW("kernel '", kernel_name, "' got dtype ", dtype_name(dtype), ": expected fp32, fp64, bf16 or fp16");
}

inline int blas_int(std::int64_t value, const char* what) {
  ZT_CHECK(value >= 0 && value <= INT_MAX, "BLAS dimension ", what, " = ", value,
           " does not fit a 32-bit int");
  return static_cast<int>(value);
}

/// Per-thread scratch that grows and is reused, so hot loops do not allocate each call.
template <typename T>
T* scratch(std::vector<T>& storage, std::size_t count) {
  if (storage.size() < count) storage.resize(count);
  return storage.data();
}

/// Row-major C[m, n] = alpha * op(A)[m, k] . op(B)[k, n] + beta * C, any floating T.
/// 16-bit inputs go through widened fp32 copies and sgemm, or for bf16 through oneDNN's bf16 matmul
/// (kernels/host_gemm.hpp, ZT_BF16_GEMM), so products always accumulate in fp32; the result is
/// rounded once when stored.
/// OpenBLAS splits GEMMs over rows and columns, never over k, so results do not depend on its
/// thread count.
void gemm(bool transpose_a, bool transpose_b, std::int64_t m, std::int64_t n, std::int64_t k, double alpha,
          const float* a, std::int64_t lda, const float* b, std::int64_t ldb, double beta, float* c,
          std::int64_t ldc);
void gemm(bool transpose_a, bool transpose_b, std::int64_t m, std::int64_t n, std::int64_t k, double alpha,
          const double* a, std::int64_t lda, const double* b, std::int64_t ldb, double beta, double* c,
          std::int64_t ldc);
void gemm(bool transpose_a, bool transpose_b, std::int64_t m, std::int64_t n, std::int64_t k, double alpha,
          const bf16* a, std::int64_t lda, const bf16* b, std::int64_t ldb, double beta, bf16* c,
          std::int64_t ldc);
void gemm(bool transpose_a, bool transpose_b, std::int64_t m, std::int64_t n, std::int64_t k, double alpha,
          const fp16* a, std::int64_t lda, const fp16* b, std::int64_t ldb, double beta, fp16* c,
          std::int64_t ldc);

/// Elements per chunk of a deterministic sum: chunks are summed in parallel, then in order.
inline constexpr std::int64_t kSumChunk = 4096;

/// sum over i in [0, count) of term(i), in double, independent of the thread count.
template <typename Term>
double deterministic_sum(std::int64_t count, Term&& term) {
  const std::int64_t chunks = (count + kSumChunk - 1) / kSumChunk;
  std::vector<double> partial(static_cast<std::size_t>(chunks), 0.0);
#pragma omp parallel for schedule(static)
  for (std::int64_t chunk = 0; chunk < chunks; ++chunk) {
    const std::int64_t end = std::min(count, (chunk + 1) * kSumChunk);
    double sum = 0;
    for (std::int64_t i = chunk * kSumChunk; i < end; ++i) sum += term(i);
    partial[static_cast<std::size_t>(chunk)] = sum;
  }
  double total = 0;
  for (double value : partial) total += value;
  return total;
}

// The counter-based random numbers are shared with the CUDA kernels: kernels/counter_random.hpp.
using kernels::counter_random;
using kernels::mix64;
using kernels::to_unit_double;

}  // namespace zt::kernels::host
