// Row-major GEMM for every floating dtype on top of CBLAS; 16-bit inputs accumulate in fp32.
#include <omp.h>

#include <algorithm>

#include <cstdint>
#include <vector>

#include "kernels/host/host_common.hpp"

namespace zt::kernels::host {
namespace {

CBLAS_TRANSPOSE blas_transpose(bool transpose) {
  return transpose ? CblasTrans : CblasNoTrans;
}

/// One single-threaded BLAS call.
void blas_gemm(bool transpose_a, bool transpose_b, std::int64_t m, std::int64_t n, std::int64_t k,
               double alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb, double beta,
               float* c, std::int64_t ldc) {
  cblas_sgemm(CblasRowMajor, blas_transpose(transpose_a), blas_transpose(transpose_b), blas_int(m, "m"),
              blas_int(n, "n"), blas_int(k, "k"), static_cast<float>(alpha), a, blas_int(lda, "lda"), b,
              blas_int(ldb, "ldb"), static_cast<float>(beta), c, blas_int(ldc, "ldc"));
}

void blas_gemm(bool transpose_a, bool transpose_b, std::int64_t m, std::int64_t n, std::int64_t k,
               double alpha, const double* a, std::int64_t lda, const double* b, std::int64_t ldb,
               double beta, double* c, std::int64_t ldc) {
  cblas_dgemm(CblasRowMajor, blas_transpose(transpose_a), blas_transpose(transpose_b), blas_int(m, "m"),
              blas_int(n, "n"), blas_int(k, "k"), alpha, a, blas_int(lda, "lda"), b, blas_int(ldb, "ldb"),
              beta, c, blas_int(ldc, "ldc"));
}

/// C is split into at most this many blocks of rows or columns, one BLAS call each, run in parallel.
/// The split depends on the shape only (never on the thread count), so every element of C is
/// computed by the same BLAS call whatever the number of threads. Few, large blocks: each call packs
/// the operand it shares with the others again (B for a row split, A for a column split), which cost
/// a third of the GEMM time with 32-row blocks.
constexpr std::int64_t kGemmMaxBlocks = 8;
/// Smallest block (rows or columns) worth a call of its own; blocks are multiples of kGemmBlockQuantum.
constexpr std::int64_t kGemmMinBlock = 64;
constexpr std::int64_t kGemmBlockQuantum = 16;
/// Below this many multiply-adds a GEMM runs as one call (threading would cost more than it saves).
constexpr std::int64_t kParallelGemmWork = 1 << 18;

/// OpenBLAS's own threads (a pthread pool) and our OpenMP team would fight over the same cores
/// (measured: 7x slower on 2 cores). So OpenBLAS runs single-threaded and we split C into blocks
/// over OpenMP; calls from inside a parallel region (attention heads) run as they are. Other BLAS
/// libraries have no such call: an OpenMP-threaded one (MKL, BLIS) runs single-threaded inside our
/// parallel regions by itself, since OpenMP does not nest by default (docs/spack.md, "BLAS").
void use_single_threaded_blas() {
#ifdef ZT_BLAS_HAS_OPENBLAS_SET_NUM_THREADS
  static const bool done = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)done;
#endif
}

template <typename T>
void blocked_gemm(bool transpose_a, bool transpose_b, std::int64_t m, std::int64_t n, std::int64_t k,
                  double alpha, const T* a, std::int64_t lda, const T* b, std::int64_t ldb, double beta, T* c,
                  std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  use_single_threaded_blas();
  // Split the longer side of C: the operand every block packs again is then the smaller one.
  const bool split_rows = m >= n;
  const std::int64_t extent = split_rows ? m : n;
  // A power of two (1, 2, 4 or 8), so that blocks divide evenly among 2, 4 or 8 threads.
  std::int64_t wanted = 1;
  while (wanted * 2 <= std::min(kGemmMaxBlocks, extent / kGemmMinBlock)) wanted *= 2;
  if (omp_in_parallel() || m * n * k < kParallelGemmWork || wanted < 2) {
    blas_gemm(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  const std::int64_t per_block = (extent + wanted - 1) / wanted;
  const std::int64_t block_size = (per_block + kGemmBlockQuantum - 1) / kGemmBlockQuantum * kGemmBlockQuantum;
  const std::int64_t blocks = (extent + block_size - 1) / block_size;
#pragma omp parallel for schedule(static)
  for (std::int64_t block = 0; block < blocks; ++block) {
    const std::int64_t first = block * block_size;
    const std::int64_t count = std::min(block_size, extent - first);
    if (split_rows) {
      // Row r of op(A) starts at a + r * lda when A is not transposed, at column r when it is.
      const T* a_block = transpose_a ? a + first : a + first * lda;
      blas_gemm(transpose_a, transpose_b, count, n, k, alpha, a_block, lda, b, ldb, beta, c + first * ldc,
                ldc);
    } else {
      // Column j of op(B) starts at b + j when B is not transposed, at row j (b + j * ldb) when it is.
      const T* b_block = transpose_b ? b + first * ldb : b + first;
      blas_gemm(transpose_a, transpose_b, m, count, k, alpha, a, lda, b_block, ldb, beta, c + first, ldc);
    }
  }
}

/// Elements spanned by a row-major operand with `rows` rows of `columns` used entries and stride `ld`.
std::int64_t span(std::int64_t rows, std::int64_t columns, std::int64_t ld) {
  return rows == 0 ? 0 : (rows - 1) * ld + columns;
}

/// Widen a strided 16-bit operand to fp32 with the same leading dimension.
template <typename T>
void widen(const T* source, std::int64_t rows, std::int64_t columns, std::int64_t ld, float* destination) {
#pragma omp parallel for schedule(static) if (rows * columns > 65536)
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < columns; ++c)
      destination[r * ld + c] = static_cast<float>(source[r * ld + c]);
  }
}

/// The 16-bit GEMM: fp32 copies of A and B (and C when beta != 0), sgemm, then one rounding per element.
/// (Debian's OpenBLAS 0.3.21 is built without BUILD_BFLOAT16, so cblas_sbgemm is not available; on
/// AVX2 without AVX512-BF16 it would widen internally anyway.)
template <typename T>
void gemm_16bit(bool transpose_a, bool transpose_b, std::int64_t m, std::int64_t n, std::int64_t k,
                double alpha, const T* a, std::int64_t lda, const T* b, std::int64_t ldb, double beta, T* c,
                std::int64_t ldc) {
  thread_local std::vector<float> a_storage, b_storage, c_storage;
  float* c32 = scratch(c_storage, static_cast<std::size_t>(m * n));  // dense [m, n]
  if (beta != 0) {
    for (std::int64_t r = 0; r < m; ++r) {
      for (std::int64_t col = 0; col < n; ++col) c32[r * n + col] = static_cast<float>(c[r * ldc + col]);
    }
  }
  const std::int64_t a_rows = transpose_a ? k : m, a_columns = transpose_a ? m : k;
  const std::int64_t b_rows = transpose_b ? n : k, b_columns = transpose_b ? k : n;
  float* a32 = scratch(a_storage, static_cast<std::size_t>(span(a_rows, a_columns, lda)));
  float* b32 = scratch(b_storage, static_cast<std::size_t>(span(b_rows, b_columns, ldb)));
  widen(a, a_rows, a_columns, lda, a32);
  widen(b, b_rows, b_columns, ldb, b32);
  gemm(transpose_a, transpose_b, m, n, k, alpha, a32, lda, b32, ldb, beta, c32, n);
#pragma omp parallel for schedule(static) if (m * n > 65536)
  for (std::int64_t r = 0; r < m; ++r) {
    for (std::int64_t col = 0; col < n; ++col) c[r * ldc + col] = T(c32[r * n + col]);
  }
}

}  // namespace

void gemm(bool transpose_a, bool transpose_b, std::int64_t m, std::int64_t n, std::int64_t k, double alpha,
          const float* a, std::int64_t lda, const float* b, std::int64_t ldb, double beta, float* c,
          std::int64_t ldc) {
  blocked_gemm(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm(bool transpose_a, bool transpose_b, std::int64_t m, std::int64_t n, std::int64_t k, double alpha,
          const double* a, std::int64_t lda, const double* b, std::int64_t ldb, double beta, double* c,
          std::int64_t ldc) {
  blocked_gemm(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm(bool transpose_a, bool transpose_b, std::int64_t m, std::int64_t n, std::int64_t k, double alpha,
          const bf16* a, std::int64_t lda, const bf16* b, std::int64_t ldb, double beta, bf16* c,
          std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  gemm_16bit(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm(bool transpose_a, bool transpose_b, std::int64_t m, std::int64_t n, std::int64_t k, double alpha,
          const fp16* a, std::int64_t lda, const fp16* b, std::int64_t ldb, double beta, fp16* c,
          std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  gemm_16bit(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace zt::kernels::host
