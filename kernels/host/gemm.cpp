// Row-major GEMM for every floating dtype on top of CBLAS; 16-bit inputs accumulate in fp32. bf16
// GEMMs run as oneDNN matmul primitives where the CPU has native bf16 dot products (kernels/host_gemm.hpp).
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

// Defined (to 1) by kernels/CMakeLists.txt when the build links oneDNN (cmake/ZerotrainOneDnn.cmake).
#ifndef ZT_HAVE_ONEDNN
#define ZT_HAVE_ONEDNN 0
#endif
#if ZT_HAVE_ONEDNN
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#endif

#include "kernels/host/host_common.hpp"
#include "kernels/host_gemm.hpp"
#include "zerotrain/device.hpp"
#include "zerotrain/error.hpp"

namespace zt::kernels {
namespace {

constexpr const char* kBf16GemmVariable = "ZT_BF16_GEMM";

/// The CPU's bf16 dot-product instructions, as libgcc sees them (CPUID and the OS's vector state).
bool cpu_has_bf16_dot_products() {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16") || __builtin_cpu_supports("amx-bf16");
#else
  return false;
#endif
}

/// ZT_BF16_GEMM when set to a path (not empty, not "auto").
const char* forced_bf16_gemm_name() {
  const char* text = std::getenv(kBf16GemmVariable);
  if (text == nullptr || *text == '\0' || std::string_view(text) == "auto") return nullptr;
  return text;
}

void require_bf16_gemm_runnable(Bf16GemmPath path, std::string_view what) {
  if (path != Bf16GemmPath::bf16) return;
  ZT_CHECK(bf16_gemm_compiled(), what,
           " asks for the native bf16 GEMM, which this build does not have: it was built without oneDNN "
           "(configure with ZT_WITH_ONEDNN=ON; Debian: libdnnl-dev); use fp32 or auto");
  ZT_CHECK(bf16_gemm_runnable(), what,
           " asks for the native bf16 GEMM, but oneDNN builds no bf16 matmul on this CPU (its bf16 matmuls "
           "need AVX-512 at least: native on AVX512-BF16 or AMX-BF16, emulated on plain AVX-512); use fp32 "
           "or auto");
}

Bf16GemmPath initial_bf16_gemm_path() {
  const char* forced = forced_bf16_gemm_name();
  if (forced == nullptr) {
    return bf16_gemm_compiled() && cpu_has_native_bf16_gemm() ? Bf16GemmPath::bf16 : Bf16GemmPath::fp32;
  }
  const std::string what = std::string(kBf16GemmVariable) + "=" + forced;
  const std::string_view name(forced);
  ZT_CHECK(name == "bf16" || name == "fp32", what, ": unknown bf16 GEMM path '", name,
           "'; expected bf16, fp32 or auto");
  const Bf16GemmPath path = name == "bf16" ? Bf16GemmPath::bf16 : Bf16GemmPath::fp32;
  require_bf16_gemm_runnable(path, what);
  return path;
}

/// The path in use, initialized on the first call (an invalid ZT_BF16_GEMM throws there and on every
/// later call: a static whose initializer throws is initialized again next time).
std::atomic<int>& current_bf16_gemm_path() {
  static std::atomic<int> path{static_cast<int>(initial_bf16_gemm_path())};
  return path;
}

}  // namespace

const char* bf16_gemm_path_name(Bf16GemmPath path) {
  return path == Bf16GemmPath::bf16 ? "bf16" : "fp32";
}

bool bf16_gemm_compiled() {
  return ZT_HAVE_ONEDNN != 0;
}

bool cpu_has_native_bf16_gemm() {
#if ZT_HAVE_ONEDNN
  // oneDNN's ISA bits are cumulative: avx512_core_bf16 (0xe7) is set in every ISA above it (AMX).
  static const bool native =
      cpu_has_bf16_dot_products() && (static_cast<unsigned>(dnnl::get_effective_cpu_isa()) &
                                      static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16)) ==
                                         static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
  return native;
#else
  return false;
#endif
}

bool bf16_gemm_runnable() {
#if ZT_HAVE_ONEDNN
  // Probed once on a 1 x 1 x 1 matmul: oneDNN says at primitive creation whether it has a kernel.
  static const bool runs = [] {
    try {
      const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
      const dnnl::memory::desc one({1, 1}, dnnl::memory::data_type::bf16, dnnl::memory::dims{1, 1});
      const dnnl::matmul::primitive_desc description(dnnl::matmul::desc(one, one, one), engine);
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return runs;
#else
  return false;
#endif
}

Bf16GemmPath bf16_gemm_path() {
  return static_cast<Bf16GemmPath>(current_bf16_gemm_path().load(std::memory_order_relaxed));
}

void set_bf16_gemm_path(Bf16GemmPath path) {
  require_bf16_gemm_runnable(path, std::string("set_bf16_gemm_path(") + bf16_gemm_path_name(path) + ")");
  current_bf16_gemm_path().store(static_cast<int>(path), std::memory_order_relaxed);
}

std::string bf16_gemm_description() {
  try {
    const Bf16GemmPath path = bf16_gemm_path();
    std::string text = path == Bf16GemmPath::bf16 ? "bf16 (oneDNN matmul, fp32 accumulation)"
                                                  : "fp32 (bf16 operands widened to fp32, sgemm)";
    if (const char* forced = forced_bf16_gemm_name(); forced != nullptr) {
      text += std::string(" (forced by ") + kBf16GemmVariable + "=" + forced + ")";
      if (path == Bf16GemmPath::bf16 && !cpu_has_native_bf16_gemm())
        text += "; this CPU has no native bf16 dot products, oneDNN emulates them";
    } else if (path == Bf16GemmPath::bf16) {
      text +=
          std::string(" (auto: this CPU has AVX512-BF16 or AMX-BF16; ") + kBf16GemmVariable + "=fp32 widens)";
    } else if (!bf16_gemm_compiled()) {
      text += " (auto: built without oneDNN, ZT_WITH_ONEDNN)";
    } else {
      text += std::string(" (auto: this CPU has no AVX512-BF16 or AMX-BF16; ") + kBf16GemmVariable +
              "=bf16 forces oneDNN)";
    }
    return text;
  } catch (const Error& error) {
    return std::string("invalid: ") + error.what();
  }
}

namespace host {
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

/// A GEMM's temporary for one call, counted under MemoryCategory::workspace so that the accounted peak
/// includes it (the LM head's are tens of MiB at vocabulary 50257).
Buffer workspace_floats(std::size_t count) {
  return Buffer(Device::host(), count * sizeof(float), MemoryCategory::workspace);
}

/// Widen the [rows, columns] block at `source` (row stride ld) into a dense fp32 [rows, columns].
template <typename T>
void widen_block(const T* source, std::int64_t rows, std::int64_t columns, std::int64_t ld,
                 float* destination) {
#pragma omp parallel for schedule(static) if (rows * columns > 65536)
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < columns; ++c)
      destination[r * columns + c] = static_cast<float>(source[r * ld + c]);
  }
}

/// The widening GEMM's tile edge: each of its three fp32 tiles is at most 1024 x 1024 (4 MiB).
inline constexpr std::int64_t kWideningTile = 1024;

/// The 16-bit GEMM: sgemm on fp32 copies of tiles of A and B (and of C when beta != 0), accumulated in
/// an fp32 tile of C over the reduction, then one rounding per element of C. (Debian's OpenBLAS 0.3.21
/// is built without BUILD_BFLOAT16, so cblas_sbgemm is not available; on AVX2 without AVX512-BF16 it
/// would widen internally anyway.)
/// Tiled, the copies are at most 12 MiB per call (MemoryCategory::workspace) at any shape: whole, the
/// LM head's at vocabulary 50257 were ~77 MiB per call, counted or not, and their varying sizes left
/// holes in the heap that it kept (docs/benchmarks.md, "Resident memory: huge pages and workspace").
/// A tile of A is widened once per column tile of C, a tile of B once per row tile: at GPT-2 124M's
/// LM head (m 1024, n 50257, k 768) that is 50 x 0.8 M extra conversions against 79 GFLOP of GEMM.
template <typename T>
void gemm_16bit(bool transpose_a, bool transpose_b, std::int64_t m, std::int64_t n, std::int64_t k,
                double alpha, const T* a, std::int64_t lda, const T* b, std::int64_t ldb, double beta, T* c,
                std::int64_t ldc) {
  const std::int64_t tile_m = std::min(m, kWideningTile), tile_n = std::min(n, kWideningTile);
  const std::int64_t tile_k = std::min(k, kWideningTile);
  Buffer storage =
      workspace_floats(static_cast<std::size_t>(tile_m * tile_n + tile_m * tile_k + tile_k * tile_n));
  float* c32 = storage.as<float>();  // dense [rows, columns] of the current tile of C
  float* a32 = c32 + tile_m * tile_n;
  float* b32 = a32 + tile_m * tile_k;
  for (std::int64_t row = 0; row < m; row += kWideningTile) {
    const std::int64_t rows = std::min(kWideningTile, m - row);
    for (std::int64_t column = 0; column < n; column += kWideningTile) {
      const std::int64_t columns = std::min(kWideningTile, n - column);
      T* c_tile = c + row * ldc + column;
      if (beta != 0) {
        for (std::int64_t r = 0; r < rows; ++r) {
          for (std::int64_t col = 0; col < columns; ++col)
            c32[r * columns + col] = static_cast<float>(c_tile[r * ldc + col]);
        }
      }
      // k == 0 runs once with an empty reduction: C = beta C.
      for (std::int64_t inner = 0; inner == 0 || inner < k; inner += kWideningTile) {
        const std::int64_t depth = std::min(kWideningTile, k - inner);
        if (transpose_a) {  // A is [k, m]: op(A)'s tile is A's [depth, rows] block
          widen_block(a + inner * lda + row, depth, rows, lda, a32);
        } else {
          widen_block(a + row * lda + inner, rows, depth, lda, a32);
        }
        if (transpose_b) {  // B is [n, k]
          widen_block(b + column * ldb + inner, columns, depth, ldb, b32);
        } else {
          widen_block(b + inner * ldb + column, depth, columns, ldb, b32);
        }
        const std::int64_t a_ld = std::max<std::int64_t>(transpose_a ? rows : depth, 1);
        const std::int64_t b_ld = std::max<std::int64_t>(transpose_b ? depth : columns, 1);
        gemm(transpose_a, transpose_b, rows, columns, depth, alpha, a32, a_ld, b32, b_ld,
             inner == 0 ? beta : 1.0, c32, columns);
      }
#pragma omp parallel for schedule(static) if (rows * columns > 65536)
      for (std::int64_t r = 0; r < rows; ++r) {
        for (std::int64_t col = 0; col < columns; ++col) c_tile[r * ldc + col] = T(c32[r * columns + col]);
      }
    }
  }
}

#if ZT_HAVE_ONEDNN
/// A bf16 GEMM's shape, strides and scalars: what a oneDNN matmul primitive is built for.
struct Bf16GemmShape {
  bool transpose_a, transpose_b;
  std::int64_t m, n, k, lda, ldb, ldc;
  float alpha, beta;
  auto operator<=>(const Bf16GemmShape&) const = default;
};

/// oneDNN matmul primitives, one per shape, built on first use. Building one takes milliseconds (it
/// picks and JIT-compiles a kernel), running it a GEMM's time; a training step repeats a few dozen
/// shapes, so they are kept (up to kMaxPrimitives, then the cache starts over).
/// Their scratchpads (fp32 accumulators: m x n x 4 bytes for the LM head's [B*T, vocab]) are ours
/// (scratchpad_mode::user), counted as workspace, and live for one call: in oneDNN's library mode, built with
/// DNNL_ENABLE_CONCURRENT_EXEC as Debian's is, every cached primitive owned its own for the process's
/// life (~29 MB per rank at vocabulary 50257 that nothing accounted, docs/benchmarks.md).
class OneDnnBf16Gemms {
 public:
  static OneDnnBf16Gemms& instance() {
    static OneDnnBf16Gemms gemms;
    return gemms;
  }

  /// C = alpha op(A) op(B) + beta C: bf16 operands, fp32 accumulation, one rounding to bf16.
  void run(const Bf16GemmShape& shape, const bf16* a, const bf16* b, bf16* c) {
    const CachedMatmul cached = primitive_for(shape);
    // A stream per thread: a stream is not meant to be shared by threads that execute at once.
    thread_local dnnl::stream stream(engine_);
    using dnnl::memory;
    // const_cast: oneDNN's memory objects take a void*; the primitive only reads SRC and WEIGHTS.
    memory a_memory(a_descriptor(shape), engine_, const_cast<bf16*>(a));
    memory b_memory(b_descriptor(shape), engine_, const_cast<bf16*>(b));
    memory c_memory(c_descriptor(shape), engine_, c);
    Buffer scratchpad_storage(Device::host(), cached.scratchpad.get_size(), MemoryCategory::workspace);
    memory scratchpad_memory(cached.scratchpad, engine_, scratchpad_storage.data());
    try {
      cached.primitive.execute(stream, {{DNNL_ARG_SRC, a_memory},
                                        {DNNL_ARG_WEIGHTS, b_memory},
                                        {DNNL_ARG_DST, c_memory},
                                        {DNNL_ARG_SCRATCHPAD, scratchpad_memory}});
      stream.wait();
    } catch (const dnnl::error& error) {
      ZT_THROW("oneDNN bf16 matmul C[", shape.m, ", ", shape.n, "] (k ", shape.k, ") failed: ", error.what());
    }
  }

 private:
  static constexpr std::size_t kMaxPrimitives = 1024;

  /// A primitive (a handle: copies share it, so clearing the cache never pulls one away from a thread
  /// that runs it) and the scratchpad each of its executions needs.
  struct CachedMatmul {
    dnnl::matmul primitive;
    dnnl::memory::desc scratchpad;
  };

  /// A row-major [rows, columns] view with leading dimension ld, or its transpose.
  static dnnl::memory::desc strided(std::int64_t rows, std::int64_t columns, std::int64_t ld,
                                    bool transposed) {
    return {{rows, columns},
            dnnl::memory::data_type::bf16,
            transposed ? dnnl::memory::dims{1, ld} : dnnl::memory::dims{ld, 1}};
  }
  static dnnl::memory::desc a_descriptor(const Bf16GemmShape& s) {
    return strided(s.m, s.k, s.lda, s.transpose_a);
  }
  static dnnl::memory::desc b_descriptor(const Bf16GemmShape& s) {
    return strided(s.k, s.n, s.ldb, s.transpose_b);
  }
  static dnnl::memory::desc c_descriptor(const Bf16GemmShape& s) { return strided(s.m, s.n, s.ldc, false); }

  /// The primitive for `shape`, built on first use.
  CachedMatmul primitive_for(const Bf16GemmShape& shape) {
    const std::lock_guard lock(mutex_);
    if (auto found = primitives_.find(shape); found != primitives_.end()) return found->second;
    if (primitives_.size() >= kMaxPrimitives) primitives_.clear();
    dnnl::primitive_attr attributes;
    attributes.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    // oneDNN's order is dst = output_scale * (A B) + sum_scale * dst, in fp32, then one rounding.
    if (shape.alpha != 1.0f) attributes.set_output_scales(0, {shape.alpha});
    if (shape.beta != 0.0f) {
      dnnl::post_ops post_ops;
      post_ops.append_sum(shape.beta);
      attributes.set_post_ops(post_ops);
    }
    try {
      const dnnl::matmul::primitive_desc description(
          dnnl::matmul::desc(a_descriptor(shape), b_descriptor(shape), c_descriptor(shape)), attributes,
          engine_);
      return primitives_
          .emplace(shape, CachedMatmul{dnnl::matmul(description), description.scratchpad_desc()})
          .first->second;
    } catch (const dnnl::error& error) {
      ZT_THROW("oneDNN has no bf16 matmul for C[", shape.m, ", ", shape.n, "] = ", shape.alpha, " op(A)[",
               shape.m, ", ", shape.k, "] op(B)[", shape.k, ", ", shape.n, "] + ", shape.beta,
               " C (transpose A ", shape.transpose_a, ", B ", shape.transpose_b, "; lda ", shape.lda,
               ", ldb ", shape.ldb, ", ldc ", shape.ldc, "): ", error.what(),
               "; ZT_BF16_GEMM=fp32 widens to fp32 instead");
    }
  }

  dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
  std::mutex mutex_;
  std::map<Bf16GemmShape, CachedMatmul> primitives_;
};

void onednn_bf16_gemm(const Bf16GemmShape& shape, const bf16* a, const bf16* b, bf16* c) {
  OneDnnBf16Gemms::instance().run(shape, a, b, c);
}
#endif

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
#if ZT_HAVE_ONEDNN
  // k == 0 (C = beta C) stays on the widening path: oneDNN has no matmul over an empty reduction.
  if (k > 0 && bf16_gemm_path() == Bf16GemmPath::bf16) {
    onednn_bf16_gemm({transpose_a, transpose_b, m, n, k, lda, ldb, ldc, static_cast<float>(alpha),
                      static_cast<float>(beta)},
                     a, b, c);
    return;
  }
#endif
  gemm_16bit(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm(bool transpose_a, bool transpose_b, std::int64_t m, std::int64_t n, std::int64_t k, double alpha,
          const fp16* a, std::int64_t lda, const fp16* b, std::int64_t ldb, double beta, fp16* c,
          std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  gemm_16bit(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace host
}  // namespace zt::kernels
