// Host (OpenMP + SIMD) versions of the fused optimizer kernels and the gradient checks.
//
// The loops are written for the vectorizer: the dtype of the gradient, of the 16-bit copy and the
// update variant are template parameters (chosen once per call, never per element), and the 16-bit
// conversions are branch-free bit manipulation that produces exactly the bits of zt::bf16 and
// zt::fp16. With -fno-math-errno (kernels/CMakeLists.txt) sqrt vectorizes too. Each inner loop is a
// span kernel with ISA paths (kernels/host/host_isa_kernels.hpp): the parallel loop over blocks stays
// here, the block itself runs the path host_isa() names. No FMA contraction on any path: the same bits.
#include "kernels/optimizer_kernels.hpp"

#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/dispatch.hpp"
#include "kernels/host/host_isa_kernels.hpp"
#include "kernels/host_isa.hpp"
#include "zerotrain/error.hpp"
#if ZT_HAVE_CUDA
#include "kernels/cuda/optimizer.hpp"
#endif

namespace zt::kernels::host {
namespace {

// Elementwise kernels run in blocks of this many elements, statically spread over the threads.
// The block grid does not depend on the thread count, so every element takes the same code path
// (vector body or remainder) whatever the number of threads: results are bitwise reproducible.
constexpr std::size_t kBlock = 4096;
// The sum of squares adds one fp64 partial per chunk, then the partials in index order.
constexpr std::size_t kReductionChunk = 16384;
constexpr std::size_t kReductionLanes = 8;

// ---- 16-bit conversions, branch-free (selects vectorize, branches do not) ----------------------

// condition ? a : b with a mask, which GCC vectorizes where it would keep a ternary as a branch.
inline std::uint32_t select(bool condition, std::uint32_t a, std::uint32_t b) {
  const std::uint32_t mask = 0u - static_cast<std::uint32_t>(condition);
  return (a & mask) | (b & ~mask);
}

// Magnitudes (sign bit cleared) compared as int32: SSE2/AVX2 have signed compares only, and an
// unsigned one costs two extra instructions per vector.
inline std::int32_t as_int(std::uint32_t magnitude) {
  return static_cast<std::int32_t>(magnitude);
}

inline float bf16_bits_to_float(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

// Exactly zt::fp16::to_float: the exponent is rebased by a multiplication with 2^112, which also
// turns fp16 subnormals (fp32 denormals after the shift) into the right normal fp32 value. For inf
// and nan the product has exponent 143 with the payload kept; OR-ing in all exponent bits makes it
// 255. (The product is used on every path: GCC would sink a product used by one arm of a select
// into a branch, since a float multiply may trap, and then refuse to vectorize.)
inline float fp16_bits_to_float(std::uint16_t bits) {
  const std::uint32_t h = bits;
  const std::uint32_t sign = (h & 0x8000u) << 16;
  const std::uint32_t shifted = (h & 0x7fffu) << 13;
  const std::uint32_t magnitude = std::bit_cast<std::uint32_t>(std::bit_cast<float>(shifted) * 0x1p112f);
  const std::uint32_t special_exponent = select(as_int(shifted) >= as_int(0x7c00u << 13), 0x7f800000u, 0u);
  return std::bit_cast<float>(sign | magnitude | special_exponent);
}

// Exactly zt::bf16::from_float: round to nearest even, NaN stays a quiet NaN with its sign. All in
// 32-bit lanes with one narrowing at the end (an arithmetic shift keeps the value in int16 range):
// narrowing each operand of a select separately, as GCC otherwise does, doubles the cost.
inline std::uint16_t float_to_bf16_bits(float value) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t nan_mask =
      0u - static_cast<std::uint32_t>(as_int(u & 0x7fffffffu) > as_int(0x7f800000u));
  const std::uint32_t quieted = u | (nan_mask & 0x00400000u);                 // NaN: set the quiet bit
  const std::uint32_t bias = (0x7fffu + ((quieted >> 16) & 1u)) & ~nan_mask;  // NaN: no rounding
  return static_cast<std::uint16_t>(static_cast<std::int32_t>(quieted + bias) >> 16);
}

// Exactly zt::fp16::from_float, without branches: compute every case, select one.
inline std::uint16_t float_to_fp16_bits(float value) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t abs = u & 0x7fffffffu;
  // Normal fp16: rebase the exponent (127 -> 15), round the 13 dropped bits to nearest even.
  const std::uint32_t rebased = abs - 0x38000000u;
  const std::uint32_t normal = (rebased + 0xfffu + ((rebased >> 13) & 1u)) >> 13;
  // Subnormal fp16 (|x| < 2^-14): adding 0.5 (ulp 2^-24, the fp16 subnormal step) makes the fp32
  // adder round |x| to a multiple of 2^-24, nearest even; the low mantissa bits are the result.
  const std::uint32_t subnormal =
      std::bit_cast<std::uint32_t>(std::bit_cast<float>(abs) + 0.5f) - 0x3f000000u;
  // From 65520 (rounds past 65504) up: inf, or a quiet NaN for NaN inputs.
  const std::uint32_t special = 0x7c00u | select(as_int(abs) > as_int(0x7f800000u), 0x200u, 0u);
  std::uint32_t out = select(as_int(abs) < as_int(0x38800000u), subnormal, normal);
  out = select(as_int(abs) >= as_int(0x477ff000u), special, out);
  // Narrow once, from an int16-range value (see float_to_bf16_bits).
  return static_cast<std::uint16_t>(static_cast<std::int32_t>((sign | out) << 16) >> 16);
}

// ---- typed access ------------------------------------------------------------------------------

template <DType kType>
using Storage = std::conditional_t<kType == DType::fp32, float, std::uint16_t>;

template <DType kType>
inline float load(const Storage<kType>* data, std::size_t i) {
  if constexpr (kType == DType::fp32) {
    return data[i];
  } else if constexpr (kType == DType::bf16) {
    return bf16_bits_to_float(data[i]);
  } else {
    static_assert(kType == DType::fp16);
    return fp16_bits_to_float(data[i]);
  }
}

/// The 16-bit copy of the updated parameters: none, bf16 or fp16.
enum class Copy { none, bf16, fp16 };

template <Copy kCopy>
inline void store_copy(std::uint16_t* out, std::size_t i, float value) {
  if constexpr (kCopy == Copy::bf16) {
    out[i] = float_to_bf16_bits(value);
  } else if constexpr (kCopy == Copy::fp16) {
    out[i] = float_to_fp16_bits(value);
  } else {
    (void)out, (void)i, (void)value;
  }
}

template <DType kType>
using DTypeTag = std::integral_constant<DType, kType>;
template <Copy kCopy>
using CopyTag = std::integral_constant<Copy, kCopy>;

template <typename Body>
void with_grad_dtype(DType dtype, const char* kernel, Body&& body) {
  switch (dtype) {
    case DType::fp32:
      return body(DTypeTag<DType::fp32>{});
    case DType::bf16:
      return body(DTypeTag<DType::bf16>{});
    case DType::fp16:
      return body(DTypeTag<DType::fp16>{});
    default:
      ZT_THROW(kernel, ": gradient dtype ", dtype_name(dtype),
               " is not supported; expected fp32, bf16 or fp16");
  }
}

template <typename Body>
void with_copy(const void* params_16bit, DType dtype, const char* kernel, Body&& body) {
  if (params_16bit == nullptr) return body(CopyTag<Copy::none>{});
  switch (dtype) {
    case DType::bf16:
      return body(CopyTag<Copy::bf16>{});
    case DType::fp16:
      return body(CopyTag<Copy::fp16>{});
    default:
      ZT_THROW(kernel, ": the parameter copy dtype is ", dtype_name(dtype), "; expected bf16 or fp16");
  }
}

/// Run fn(begin, end) over fixed blocks of [0, count), statically spread over the OpenMP threads.
template <typename BlockFn>
void for_each_block(std::size_t count, BlockFn&& fn) {
  const auto blocks = static_cast<std::ptrdiff_t>((count + kBlock - 1) / kBlock);
#pragma omp parallel for schedule(static) if (blocks > 1)
  for (std::ptrdiff_t b = 0; b < blocks; ++b) {
    const std::size_t begin = static_cast<std::size_t>(b) * kBlock;
    fn(begin, std::min(count, begin + kBlock));
  }
}

// ---- Adam / AdamW -------------------------------------------------------------------------------

// Everything a kernel's inner loop reads besides the arrays. Each block copies it into locals first:
// read through the lambda's captures, the compiler must assume the float stores to the arrays may
// change them and reloads every constant in every iteration (it did: ~2x slower with a 16-bit copy).
struct AdamConstants {
  float* params;
  float* exp_avg;
  float* exp_avg_sq;
  const void* grads;
  std::uint16_t* copy;
  float step_size, inv_sqrt_bc2, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, grad_scale,
      weight_decay, decay;
};

/// One block of the update: the arithmetic of every ISA path.
template <DType kGrad, Copy kCopy, bool kDecoupled>
struct AdamSpan {
  ZT_HOST_ISA_BODY static void run(const AdamConstants* constants, std::size_t begin, std::size_t end) {
    const AdamConstants k = *constants;  // locals: provably untouched by the stores below
    float* const params = k.params;
    float* const exp_avg = k.exp_avg;
    float* const exp_avg_sq = k.exp_avg_sq;
    const auto* const grads = static_cast<const Storage<kGrad>*>(k.grads);
    std::uint16_t* const copy = k.copy;
    // No software prefetch: on huge pages (kernels/host_memory.hpp) the hardware prefetchers keep
    // up alone, and prefetching 2 KiB ahead made the update 1.15-1.7x slower there (on 4 KiB pages
    // within a few per cent either way; docs/benchmarks.md, "Host AdamW", evening).
#pragma omp simd
    for (std::size_t i = begin; i < end; ++i) {
      float p = params[i];
      float g = load<kGrad>(grads, i) * k.grad_scale;
      if constexpr (!kDecoupled) g = g + k.weight_decay * p;  // L2: decay joins the gradient
      const float m = k.beta1 * exp_avg[i] + k.one_minus_beta1 * g;
      const float v = k.beta2 * exp_avg_sq[i] + k.one_minus_beta2 * (g * g);
      const float denom = std::sqrt(v) * k.inv_sqrt_bc2 + k.eps;
      if constexpr (kDecoupled) p = p * k.decay;  // AdamW: decay the weight, not the gradient
      p = p - k.step_size * (m / denom);
      exp_avg[i] = m;
      exp_avg_sq[i] = v;
      params[i] = p;
      store_copy<kCopy>(copy, i, p);
    }
  }
};

template <DType kGrad, Copy kCopy, bool kDecoupled>
void adam_kernel(const AdamStepArgs& a) {
  const AdamStepConstants step = adam_step_constants(a);
  const AdamConstants constants{
      a.params,
      a.exp_avg,
      a.exp_avg_sq,
      a.grads,
      static_cast<std::uint16_t*>(a.params_16bit),
      step.step_size,
      step.inv_sqrt_bc2,
      a.beta1,
      a.beta2,
      step.one_minus_beta1,
      step.one_minus_beta2,
      a.eps,
      a.grad_scale,
      a.weight_decay,
      step.decay,
  };
  const auto span = host_isa_kernel<AdamSpan<kGrad, kCopy, kDecoupled>>(host_isa());
  for_each_block(a.count,
                 [&constants, span](std::size_t begin, std::size_t end) { span(&constants, begin, end); });
}

// ---- SGD ----------------------------------------------------------------------------------------

enum class SgdMode { plain, momentum, nesterov };

struct SgdConstants {
  float* params;
  float* buffer;
  const void* grads;
  std::uint16_t* copy;
  float lr, momentum, one_minus_dampening, grad_scale, weight_decay;
};

template <DType kGrad, Copy kCopy, SgdMode kMode, bool kFirst>
struct SgdSpan {
  ZT_HOST_ISA_BODY static void run(const SgdConstants* constants, std::size_t begin, std::size_t end) {
    const SgdConstants k = *constants;  // locals, as in AdamSpan
    float* const params = k.params;
    float* const buffer = k.buffer;
    const auto* const grads = static_cast<const Storage<kGrad>*>(k.grads);
    std::uint16_t* const copy = k.copy;
#pragma omp simd
    for (std::size_t i = begin; i < end; ++i) {
      float p = params[i];
      const float g = load<kGrad>(grads, i) * k.grad_scale + k.weight_decay * p;
      float d = g;
      if constexpr (kMode != SgdMode::plain) {
        float b;
        if constexpr (kFirst) {
          b = g;  // torch: the buffer starts as a copy of the first gradient (no dampening)
        } else {
          b = k.momentum * buffer[i] + k.one_minus_dampening * g;
        }
        buffer[i] = b;
        if constexpr (kMode == SgdMode::nesterov) {
          d = g + k.momentum * b;
        } else {
          d = b;
        }
      }
      p = p - k.lr * d;
      params[i] = p;
      store_copy<kCopy>(copy, i, p);
    }
  }
};

template <DType kGrad, Copy kCopy, SgdMode kMode, bool kFirst>
void sgd_kernel(const SgdStepArgs& a) {
  const SgdConstants constants{a.params,
                               a.momentum_buffer,
                               a.grads,
                               static_cast<std::uint16_t*>(a.params_16bit),
                               a.lr,
                               a.momentum,
                               static_cast<float>(1.0 - a.dampening),
                               a.grad_scale,
                               a.weight_decay};
  const auto span = host_isa_kernel<SgdSpan<kGrad, kCopy, kMode, kFirst>>(host_isa());
  for_each_block(a.count,
                 [&constants, span](std::size_t begin, std::size_t end) { span(&constants, begin, end); });
}

// ---- sum of squares + inf/nan -------------------------------------------------------------------

/// The fp64 sum of squares of grads[begin, end): a fixed number of independent accumulators, so it
/// vectorizes and the order of additions is fixed by this code, not by the compiler, the ISA path or
/// the thread count.
template <DType kGrad>
struct SumSquaresChunk {
  ZT_HOST_ISA_BODY static double run(const Storage<kGrad>* grads, std::size_t begin, std::size_t end) {
    double lanes[kReductionLanes] = {};
    std::size_t i = begin;
    for (; i + kReductionLanes <= end; i += kReductionLanes) {
#pragma omp simd
      for (std::size_t j = 0; j < kReductionLanes; ++j) {
        const double x = load<kGrad>(grads, i + j);
        lanes[j] += x * x;  // exact square: 24-bit significand squared fits in 53 bits
      }
    }
    for (std::size_t j = 0; i < end; ++i, ++j) {
      const double x = load<kGrad>(grads, i);
      lanes[j] += x * x;
    }
    return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  }
};

template <DType kGrad>
double sum_squares_kernel(const void* data, std::size_t count) {
  const auto* grads = static_cast<const Storage<kGrad>*>(data);
  const std::size_t chunks = (count + kReductionChunk - 1) / kReductionChunk;
  std::vector<double> partial(chunks, 0.0);
  const auto chunk_sum = host_isa_kernel<SumSquaresChunk<kGrad>>(host_isa());
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (std::ptrdiff_t c = 0; c < static_cast<std::ptrdiff_t>(chunks); ++c) {
    const std::size_t begin = static_cast<std::size_t>(c) * kReductionChunk;
    partial[static_cast<std::size_t>(c)] = chunk_sum(grads, begin, std::min(count, begin + kReductionChunk));
  }
  double sum = 0.0;
  for (double value : partial) sum += value;
  return sum;
}

/// out[i] = the 16-bit copy of params[i] for i in [begin, end).
template <Copy kCopy>
struct CastSpan {
  ZT_HOST_ISA_BODY static void run(const float* params, std::uint16_t* out, std::size_t begin,
                                   std::size_t end) {
#pragma omp simd
    for (std::size_t i = begin; i < end; ++i) store_copy<kCopy>(out, i, params[i]);
  }
};

}  // namespace

void adam_step(const AdamStepArgs& args) {
  with_grad_dtype(args.grad_dtype, "adam_step", [&](auto grad) {
    with_copy(args.params_16bit, args.params_16bit_dtype, "adam_step", [&](auto copy) {
      // L2 mode without weight decay is the decoupled kernel with decay factor 1: skip the add.
      if (args.adam_w_mode || args.weight_decay == 0.0f) {
        adam_kernel<decltype(grad)::value, decltype(copy)::value, true>(args);
      } else {
        adam_kernel<decltype(grad)::value, decltype(copy)::value, false>(args);
      }
    });
  });
}

void sgd_step(const SgdStepArgs& args) {
  with_grad_dtype(args.grad_dtype, "sgd_step", [&](auto grad) {
    with_copy(args.params_16bit, args.params_16bit_dtype, "sgd_step", [&](auto copy) {
      constexpr DType kGrad = decltype(grad)::value;
      constexpr Copy kCopy = decltype(copy)::value;
      if (args.momentum == 0.0f) {
        sgd_kernel<kGrad, kCopy, SgdMode::plain, false>(args);
      } else if (args.nesterov) {
        args.first_step ? sgd_kernel<kGrad, kCopy, SgdMode::nesterov, true>(args)
                        : sgd_kernel<kGrad, kCopy, SgdMode::nesterov, false>(args);
      } else {
        args.first_step ? sgd_kernel<kGrad, kCopy, SgdMode::momentum, true>(args)
                        : sgd_kernel<kGrad, kCopy, SgdMode::momentum, false>(args);
      }
    });
  });
}

GradCheck grad_sum_squares(const void* grads, DType grad_dtype, std::size_t count, double scale) {
  double sum = 0.0;
  with_grad_dtype(grad_dtype, "grad_sum_squares",
                  [&](auto grad) { sum = sum_squares_kernel<decltype(grad)::value>(grads, count); });
  // Squares of finite fp32 values summed in fp64 cannot overflow (at most 2^64 terms of < 2^256),
  // so the sum is non-finite exactly when some element is inf or nan: the check is free.
  GradCheck result;
  result.found_inf = !std::isfinite(sum);
  result.sum_sq = result.found_inf ? sum : sum * (scale * scale);
  return result;
}

void cast_params_to_16bit(const float* params, void* params_16bit, DType dtype, std::size_t count) {
  auto* out = static_cast<std::uint16_t*>(params_16bit);
  with_copy(params_16bit, dtype, "cast_params_to_16bit", [&](auto copy) {
    const auto span = host_isa_kernel<CastSpan<decltype(copy)::value>>(host_isa());
    for_each_block(count, [&](std::size_t begin, std::size_t end) { span(params, out, begin, end); });
  });
}

}  // namespace zt::kernels::host

namespace zt::kernels {
namespace {

void check_buffer(const void* pointer, std::size_t count, const char* kernel, const char* what) {
  ZT_CHECK(pointer != nullptr || count == 0, kernel, ": ", what, " is null for ", count,
           " elements; expected a buffer of that many elements");
}

}  // namespace

AdamStepConstants adam_step_constants(const AdamStepArgs& args) {
  const double bc1 = args.bias_correction ? 1.0 - std::pow(static_cast<double>(args.beta1), args.step) : 1.0;
  const double bc2 = args.bias_correction ? 1.0 - std::pow(static_cast<double>(args.beta2), args.step) : 1.0;
  AdamStepConstants constants;
  constants.step_size = static_cast<float>(args.lr / bc1);
  constants.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  constants.one_minus_beta1 = static_cast<float>(1.0 - args.beta1);
  constants.one_minus_beta2 = static_cast<float>(1.0 - args.beta2);
  constants.decay = static_cast<float>(1.0 - static_cast<double>(args.lr) * args.weight_decay);
  return constants;
}

void adam_step(const Stream& stream, const AdamStepArgs& args) {
  check_buffer(args.params, args.count, "adam_step", "params");
  check_buffer(args.exp_avg, args.count, "adam_step", "exp_avg");
  check_buffer(args.exp_avg_sq, args.count, "adam_step", "exp_avg_sq");
  check_buffer(args.grads, args.count, "adam_step", "grads");
  ZT_CHECK(args.step >= 1, "adam_step: step is ", args.step,
           "; expected the 1-based count of updates (>= 1)");
  dispatch(
      stream, "adam_step", [=] { host::adam_step(args); },
#if ZT_HAVE_CUDA
      [&](void* native) { cuda::adam_step(args, native); }
#else
      no_cuda_kernel
#endif
  );
}

void sgd_step(const Stream& stream, const SgdStepArgs& args) {
  check_buffer(args.params, args.count, "sgd_step", "params");
  check_buffer(args.grads, args.count, "sgd_step", "grads");
  if (args.momentum != 0.0f) check_buffer(args.momentum_buffer, args.count, "sgd_step", "momentum_buffer");
  dispatch(
      stream, "sgd_step", [=] { host::sgd_step(args); },
#if ZT_HAVE_CUDA
      [&](void* native) { cuda::sgd_step(args, native); }
#else
      no_cuda_kernel
#endif
  );
}

GradCheck grad_sum_squares(const Stream& stream, const void* grads, DType grad_dtype, std::size_t count,
                           double scale) {
  check_buffer(grads, count, "grad_sum_squares", "grads");
  return dispatch(
      stream, "grad_sum_squares", [=] { return host::grad_sum_squares(grads, grad_dtype, count, scale); },
#if ZT_HAVE_CUDA
      [&](void* native) { return cuda::grad_sum_squares(grads, grad_dtype, count, scale, native); }
#else
      no_cuda_kernel
#endif
  );
}

void grad_sum_squares(const Stream& stream, const void* grads, DType grad_dtype, std::size_t count,
                      double scale, GradCheckScalars* accumulator) {
  check_buffer(grads, count, "grad_sum_squares", "grads");
  ZT_CHECK(accumulator != nullptr, "grad_sum_squares: the accumulator is null");
  dispatch(
      stream, "grad_sum_squares",
      [=] {
        const GradCheck partial = host::grad_sum_squares(grads, grad_dtype, count, scale);
        accumulator->sum_sq = accumulator->sum_sq + partial.sum_sq;
        accumulator->found_inf = accumulator->found_inf + (partial.found_inf ? 1.0 : 0.0);
      },
#if ZT_HAVE_CUDA
      [&](void* native) { cuda::grad_sum_squares(grads, grad_dtype, count, scale, accumulator, native); }
#else
      no_cuda_kernel
#endif
  );
}

void cast_params_to_16bit(const Stream& stream, const float* params, void* params_16bit, DType dtype,
                          std::size_t count) {
  check_buffer(params, count, "cast_params_to_16bit", "params");
  check_buffer(params_16bit, count, "cast_params_to_16bit", "params_16bit");
  dispatch(
      stream, "cast_params_to_16bit", [=] { host::cast_params_to_16bit(params, params_16bit, dtype, count); },
#if ZT_HAVE_CUDA
      [&](void* native) { cuda::cast_params_to_16bit(params, params_16bit, dtype, count, native); }
#else
      no_cuda_kernel
#endif
  );
}

void set_host_threads(int threads) {
  ZT_CHECK(threads >= 1, "set_host_threads(", threads, "): expected at least 1 thread");
  omp_set_num_threads(threads);
}

int host_threads() {
  return omp_get_max_threads();
}

GradClip clip_from_sum_squares(double global_sum_sq, double max_norm) {
  GradClip clip;
  clip.norm = std::sqrt(global_sum_sq);
  if (max_norm > 0.0 && std::isfinite(clip.norm)) {
    // DeepSpeed: clip = (norm + 1e-6) / max_norm, applied when > 1, i.e. scale by its inverse.
    clip.coefficient = std::min(1.0, max_norm / (clip.norm + 1e-6));
  }
  return clip;
}

}  // namespace zt::kernels
