// Element-wise host kernels: conversion, fills, sums, activations and dropout.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/host/host_common.hpp"
#include "kernels/host/nn_host.hpp"

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
    constexpr double kTwoPi = 6.283185307179586;
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < count; ++i) {
      // Box-Muller on two uniforms drawn for this element alone.
      const auto index = static_cast<std::uint64_t>(i);
      const double u1 = 1.0 - to_unit_double(counter_random(seed, 0, 2 * index));  // (0, 1]
      const double u2 = to_unit_double(counter_random(seed, 0, 2 * index + 1));
      const double normal = std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
      out[i] = convert_value<T>(mean + stddev * normal);
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
