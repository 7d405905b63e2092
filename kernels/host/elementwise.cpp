// Element-wise host kernels: conversion, fills, sums, activations and dropout.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/host/host_common.hpp"
#include "kernels/host/nn_host.hpp"
#include "kernels/host/polynomial_cos.hpp"

namespace zt::kernels::host {
namespace {

template <typename T>
constexpr bool is_16bit = std::is_same_v<T, bf16> || std::is_same_v<T, fp16>;

/// Call body(T{}) with the storage type of any dtype, integers included.
template <typename Body>
void with_any_type(DType dtype, Body&& body) {
  switch (dtype) {
    case DType::int32:
      return body(std::int32_t{});
    case DType::int64:
      return body(std::int64_t{});
    default:
      return with_floating_type(dtype, "convert", body);
  }
}

/// A value as the widest type that holds it exactly: 16-bit floats widen to float.
template <typename T>
auto widen(T value) {
  if constexpr (is_16bit<T>) {
    return static_cast<float>(value);
  } else {
    return value;
  }
}

template <typename To, typename From>
To convert_value(From value) {
  if constexpr (is_16bit<To>) {
    return To(static_cast<float>(widen(value)));  // one rounding from fp32 (exact for fp32/16-bit sources)
  } else {
    return static_cast<To>(widen(value));
  }
}

constexpr double kSqrt2OverPi = 0.7978845608028654;

constexpr double kTwoPi = 6.283185307179586;

/// The two uniforms of element `index` of fill_normal's stream `seed`: u1 in (0, 1], u2 in [0, 1).
[[gnu::always_inline]] inline double normal_u1(std::uint64_t seed, std::uint64_t index) {
  return 1.0 - to_unit_double(counter_random(seed, 0, 2 * index));
}
[[gnu::always_inline]] inline double normal_u2(std::uint64_t seed, std::uint64_t index) {
  return to_unit_double(counter_random(seed, 0, 2 * index + 1));
}

/// fill_normal's value of element i, the definition: Box-Muller on two uniforms drawn for this element
/// alone, with libm's log and cos, converted once to T.
template <typename T>
T exact_normal(std::uint64_t seed, std::int64_t i, double mean, double stddev) {
  const auto index = static_cast<std::uint64_t>(i);
  const double normal =
      std::sqrt(-2.0 * std::log(normal_u1(seed, index))) * std::cos(kTwoPi * normal_u2(seed, index));
  return convert_value<T>(mean + stddev * normal);
}

/// fill_normal over elements [first, first + count), value-equal to exact_normal: log stays libm's;
/// cos is polynomial_cos, whose result is kept only where an interval around it that holds libm's
/// result too (|cos error| <= kFastCosError, plus the roundings of the double arithmetic) converts to
/// one T. Elsewhere (a result next to a rounding boundary of T: ~3 elements in 10^4 for fp32 at stddev
/// 0.02, measured) the element is computed again with libm's cos. Blocks of kBlock elements: the
/// uniforms, the polynomial and the bound vectorize, the log calls and the rare recomputations do not.
template <typename T>
struct NormalSpan {
  static constexpr std::int64_t kBlock = 256;
  // T's bits as an integer: compared and stored as such (memcmp, or a store of the bf16/fp16 struct,
  // keeps the loop from vectorizing).
  using StorageBits = std::conditional_t<sizeof(T) == 2, std::uint16_t, std::uint32_t>;
  static_assert(sizeof(StorageBits) == sizeof(T));

  ZT_HOST_ISA_BODY static void run(T* out, std::int64_t first, std::int64_t count, double mean, double stddev,
                                   std::uint64_t seed) {
    double u1[kBlock], log_u1[kBlock], u2[kBlock];
    StorageBits bits[kBlock];
    bool kept[kBlock];
    const double spread = std::fabs(stddev), offset = std::fabs(mean);
    for (std::int64_t begin = 0; begin < count; begin += kBlock) {
      const std::int64_t block = std::min(kBlock, count - begin);
      const auto base = static_cast<std::uint64_t>(first + begin);
#pragma omp simd
      for (std::int64_t j = 0; j < block; ++j) {
        u1[j] = normal_u1(seed, base + static_cast<std::uint64_t>(j));
        u2[j] = normal_u2(seed, base + static_cast<std::uint64_t>(j));
      }
      for (std::int64_t j = 0; j < block; ++j) log_u1[j] = std::log(u1[j]);
      T* block_out = out + first + begin;
#pragma omp simd
      for (std::int64_t j = 0; j < block; ++j) {
        const double radius = std::sqrt(-2.0 * log_u1[j]);
        const double value = mean + stddev * (radius * polynomial_cos(kTwoPi * u2[j]));
        // |libm's value - value| <= spread * radius * kFastCosError, plus a few double roundings of
        // terms no larger than offset + spread * radius (each at most 2^-53 of it).
        const double bound = 2.0 * spread * radius * kFastCosError + 0x1p-49 * (offset + spread * radius);
        const T low = convert_value<T>(value - bound), high = convert_value<T>(value + bound);
        bits[j] = std::bit_cast<StorageBits>(low);
        kept[j] = bits[j] == std::bit_cast<StorageBits>(high);
      }
      std::memcpy(block_out, bits, static_cast<std::size_t>(block) * sizeof(T));
      for (std::int64_t j = 0; j < block; ++j) {
        if (!kept[j]) block_out[j] = exact_normal<T>(seed, first + begin + j, mean, stddev);
      }
    }
  }
};

/// tanh through one exp: 1 - 2 / (exp(2u) + 1). glibc's tanhf (via expm1f) took a third of a GPT
/// step; this is ~3x cheaper, exact at +-inf, and its absolute error (what GELU sees) stays at the
/// rounding level of the type. vector_exp lets the GELU loops vectorize (libm's expf did not).
template <typename C>
[[gnu::always_inline]] inline C fast_tanh(C u) {
  return C(1) - C(2) / (vector_exp(C(2) * u) + C(1));
}
constexpr double kGeluCubic = 0.044715;

template <Activation activation, typename C>
[[gnu::always_inline]] inline C activation_value(C x) {
  switch (activation) {
    case Activation::gelu: {
      const C inner = C(kSqrt2OverPi) * (x + C(kGeluCubic) * x * x * x);
      return C(0.5) * x * (C(1) + fast_tanh(inner));
    }
    case Activation::relu:
      return x > C(0) ? x : C(0);
    case Activation::tanh:
      return std::tanh(x);
  }
  return x;
}

template <Activation activation, typename C>
[[gnu::always_inline]] inline C activation_derivative(C x) {
  switch (activation) {
    case Activation::gelu: {
      const C inner = C(kSqrt2OverPi) * (x + C(kGeluCubic) * x * x * x);
      const C tanh_inner = fast_tanh(inner);
      const C sech2 = C(1) - tanh_inner * tanh_inner;
      const C inner_derivative = C(kSqrt2OverPi) * (C(1) + C(3 * kGeluCubic) * x * x);
      return C(0.5) * (C(1) + tanh_inner) + C(0.5) * x * sech2 * inner_derivative;
    }
    case Activation::relu:
      return x > C(0) ? C(1) : C(0);
    case Activation::tanh: {
      const C t = std::tanh(x);
      return C(1) - t * t;
    }
  }
  return C(1);
}

/// Call body(std::integral_constant<Activation, kind>{}) so that loops are compiled per activation
/// (a switch per element cost a tenth of a GPT step).
template <typename Body>
void with_activation(Activation activation, Body&& body) {
  switch (activation) {
    case Activation::gelu:
      return body(std::integral_constant<Activation, Activation::gelu>{});
    case Activation::relu:
      return body(std::integral_constant<Activation, Activation::relu>{});
    case Activation::tanh:
      return body(std::integral_constant<Activation, Activation::tanh>{});
  }
  ZT_THROW("unknown activation ", static_cast<int>(activation));
}

struct GeluForwardSpan {
  ZT_HOST_ISA_BODY static void run(const float* input, float* output, std::int64_t count) {
#pragma omp simd
    for (std::int64_t i = 0; i < count; ++i) output[i] = activation_value<Activation::gelu, float>(input[i]);
  }
};

struct GeluBackwardSpan {
  ZT_HOST_ISA_BODY static void run(const float* input, const float* grad_output, float* grad_input,
                                   std::int64_t count) {
#pragma omp simd
    for (std::int64_t i = 0; i < count; ++i)
      grad_input[i] = activation_derivative<Activation::gelu, float>(input[i]) * grad_output[i];
  }
};

void check_dropout_probability(double p) {
  ZT_CHECK(p >= 0 && p < 1, "dropout probability must lie in [0, 1), got ", p);
}

}  // namespace

void convert(const void* source, DType source_dtype, void* destination, DType destination_dtype,
             std::int64_t count) {
  ZT_CHECK(dtype_is_floating(source_dtype) == dtype_is_floating(destination_dtype), "convert from ",
           dtype_name(source_dtype), " to ", dtype_name(destination_dtype),
           ": expected two floating dtypes or two integer dtypes");
  if (source_dtype == destination_dtype) {
    std::memcpy(destination, source, static_cast<std::size_t>(count) * dtype_size(source_dtype));
    return;
  }
  with_any_type(source_dtype, [&](auto source_tag) {
    using From = decltype(source_tag);
    with_any_type(destination_dtype, [&](auto destination_tag) {
      using To = decltype(destination_tag);
      const From* in = static_cast<const From*>(source);
      To* out = static_cast<To*>(destination);
#pragma omp parallel for simd schedule(static) if (count > 65536)
      for (std::int64_t i = 0; i < count; ++i) out[i] = convert_value<To>(in[i]);
    });
  });
}

void fill(DType dtype, void* data, std::int64_t count, double value) {
  with_any_type(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T filled = convert_value<T>(value);
    T* out = static_cast<T*>(data);
#pragma omp parallel for schedule(static) if (count > 65536)
    for (std::int64_t i = 0; i < count; ++i) out[i] = filled;
  });
}

void fill_normal(DType dtype, void* data, std::int64_t count, double mean, double stddev,
                 std::uint64_t seed) {
  with_floating_type(dtype, "fill_normal", [&](auto tag) {
    using T = decltype(tag);
    T* out = static_cast<T*>(data);
    // fp64 keeps every bit of the double result, so no bound can stand in for libm's cos there.
    if constexpr (std::is_same_v<T, double>) {
#pragma omp parallel for schedule(static)
      for (std::int64_t i = 0; i < count; ++i) out[i] = exact_normal<T>(seed, i, mean, stddev);
    } else {
      const bool finite = std::isfinite(mean) && std::isfinite(stddev);
      const auto span = host_isa_kernel<NormalSpan<T>>(host_isa());
      const std::int64_t spans = (count + kSimdSpan - 1) / kSimdSpan;
#pragma omp parallel for schedule(static)
      for (std::int64_t index = 0; index < spans; ++index) {
        const std::int64_t first = index * kSimdSpan, length = std::min(kSimdSpan, count - first);
        if (finite) {
          span(out, first, length, mean, stddev, seed);
        } else {  // NaN or inf parameters: the bound means nothing
          for (std::int64_t i = first; i < first + length; ++i)
            out[i] = exact_normal<T>(seed, i, mean, stddev);
        }
      }
    }
  });
}

void add(DType dtype, const void* a, const void* b, void* output, std::int64_t count) {
  with_floating_type(dtype, "add", [&](auto tag) {
    using T = decltype(tag);
    const T* x = static_cast<const T*>(a);
    const T* y = static_cast<const T*>(b);
    T* out = static_cast<T*>(output);
#pragma omp parallel for simd schedule(static) if (count > 32768)
    for (std::int64_t i = 0; i < count; ++i) out[i] = store<T>(load(x[i]) + load(y[i]));
  });
}

void accumulate(DType dtype, void* target, const void* source, std::int64_t count) {
  add(dtype, target, source, target, count);
}

void scale(DType dtype, void* data, std::int64_t count, double factor) {
  with_floating_type(dtype, "scale", [&](auto tag) {
    using T = decltype(tag);
    using C = acc_t<T>;
    T* values = static_cast<T*>(data);
    const C multiplier = static_cast<C>(factor);
#pragma omp parallel for simd schedule(static) if (count > 32768)
    for (std::int64_t i = 0; i < count; ++i) values[i] = store<T>(load(values[i]) * multiplier);
  });
}

void activation_forward(DType dtype, Activation activation, const void* input, void* output,
                        std::int64_t count) {
  with_floating_type(dtype, "activation_forward", [&](auto tag) {
    using T = decltype(tag);
    using C = acc_t<T>;
    const T* in = static_cast<const T*>(input);
    T* out = static_cast<T*>(output);
    with_activation(activation, [&](auto kind) {
      // Local copies: through the closure's references the loop did not vectorize.
      const T* source = in;
      T* destination = out;
      const std::int64_t n = count;
      if constexpr (std::is_same_v<T, float> && kind.value == Activation::gelu) {
        const auto gelu_forward_span = host_isa_kernel<GeluForwardSpan>(host_isa());
        const std::int64_t spans = (n + kSimdSpan - 1) / kSimdSpan;
#pragma omp parallel for schedule(static) if (n > 16384)
        for (std::int64_t span = 0; span < spans; ++span) {
          const std::int64_t first = span * kSimdSpan;
          gelu_forward_span(source + first, destination + first, std::min(kSimdSpan, n - first));
        }
        return;
      }
#pragma omp parallel for simd schedule(static) if (n > 16384)
      for (std::int64_t i = 0; i < n; ++i)
        destination[i] = store<T>(activation_value<kind.value, C>(load(source[i])));
    });
  });
}

void activation_backward(DType dtype, Activation activation, const void* input, const void* grad_output,
                         void* grad_input, std::int64_t count) {
  with_floating_type(dtype, "activation_backward", [&](auto tag) {
    using T = decltype(tag);
    using C = acc_t<T>;
    const T* in = static_cast<const T*>(input);
    const T* dout = static_cast<const T*>(grad_output);
    T* din = static_cast<T*>(grad_input);
    with_activation(activation, [&](auto kind) {
      const T* source = in;
      const T* gradient = dout;
      T* destination = din;
      const std::int64_t n = count;
      if constexpr (std::is_same_v<T, float> && kind.value == Activation::gelu) {
        const auto gelu_backward_span = host_isa_kernel<GeluBackwardSpan>(host_isa());
        const std::int64_t spans = (n + kSimdSpan - 1) / kSimdSpan;
#pragma omp parallel for schedule(static) if (n > 16384)
        for (std::int64_t span = 0; span < spans; ++span) {
          const std::int64_t first = span * kSimdSpan;
          gelu_backward_span(source + first, gradient + first, destination + first,
                             std::min(kSimdSpan, n - first));
        }
        return;
      }
#pragma omp parallel for simd schedule(static) if (n > 16384)
      for (std::int64_t i = 0; i < n; ++i) {
        destination[i] = store<T>(activation_derivative<kind.value, C>(load(source[i])) * load(gradient[i]));
      }
    });
  });
}

void dropout_forward(DType dtype, const void* input, void* output, std::int64_t count, double p,
                     std::uint64_t seed, std::uint64_t stream) {
  check_dropout_probability(p);
  with_floating_type(dtype, "dropout_forward", [&](auto tag) {
    using T = decltype(tag);
    using C = acc_t<T>;
    const T* in = static_cast<const T*>(input);
    T* out = static_cast<T*>(output);
    const C keep_scale = C(1.0 / (1.0 - p));
#pragma omp parallel for schedule(static) if (count > 16384)
    for (std::int64_t i = 0; i < count; ++i) {
      out[i] = dropout_keeps(seed, stream, i, p) ? store<T>(load(in[i]) * keep_scale) : store<T>(C(0));
    }
  });
}

void dropout_backward(DType dtype, const void* grad_output, void* grad_input, std::int64_t count, double p,
                      std::uint64_t seed, std::uint64_t stream) {
  // The same mask and scale as forward: dropout is linear in its input.
  dropout_forward(dtype, grad_output, grad_input, count, p, seed, stream);
}

}  // namespace zt::kernels::host

namespace zt::kernels {

bool dropout_keeps(std::uint64_t seed, std::uint64_t stream, std::int64_t index, double p) {
  return host::to_unit_double(host::counter_random(seed, stream, static_cast<std::uint64_t>(index))) >= p;
}

}  // namespace zt::kernels
