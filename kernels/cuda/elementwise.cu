// CUDA element-wise kernels: conversion, fills, sums, activations and dropout (kernels/cuda/elementwise.hpp
// says how each compares with the host kernels of kernels/host/elementwise.cpp). Each is one grid-stride
// loop over the elements (kernels/cuda/grid_stride.cuh): one thread writes each element, so results do
// not depend on the grid. Arithmetic goes through the __*_rn intrinsics where the host does more than
// one operation per element, so that nvcc's fused multiply-adds do not move the result off the host's.
#include "kernels/cuda/elementwise.hpp"

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/counter_random.hpp"
#include "kernels/cuda/cuda_common.hpp"
#include "kernels/cuda/grid_stride.cuh"
#include "zerotrain/dtype.hpp"
#include "zerotrain/error.hpp"

namespace zt::kernels::cuda {
namespace {

template <typename T>
inline constexpr bool is_16bit = std::is_same_v<T, bf16_storage> || std::is_same_v<T, fp16_storage>;

/// A stored value as the widest type that holds it exactly: 16-bit floats widen to float, the others
/// (float, double, integers) stay as they are.
template <typename T>
__device__ __forceinline__ auto widen(const T* p) {
  if constexpr (is_16bit<T>) {
    return load_float(p);
  } else {
    return *p;
  }
}

/// *p = value in T: 16-bit types round once from fp32 (a double goes to fp32 first, as the host's
/// zt::bf16(static_cast<float>(value))), the others convert with one rounding to nearest.
template <typename T, typename V>
__device__ __forceinline__ void store_as(T* p, V value) {
  if constexpr (is_16bit<T>) {
    store_float(p, static_cast<float>(value));
  } else {
    *p = static_cast<T>(value);
  }
}

// ---- conversion and fills ---------------------------------------------------------------------

template <typename To, typename From>
struct ConvertOp {
  const From* source;
  To* destination;
  __device__ void operator()(std::int64_t i) const { store_as(destination + i, widen(source + i)); }
};

template <typename Word>
struct FillOp {
  Word* data;
  Word value;
  __device__ void operator()(std::int64_t i) const { data[i] = value; }
};

/// Every element of `data` set to the bits of `value`, which the host rounded to the dtype already.
template <typename Word>
void fill_words(void* data, std::int64_t count, Word value, cudaStream_t stream) {
  const Word zero{};
  if (std::memcmp(&value, &zero, sizeof(Word)) == 0) {  // all bits zero (+0.0, 0): a memset
    ZT_CHECK_CUDA(cudaMemsetAsync(data, 0, static_cast<std::size_t>(count) * sizeof(Word), stream));
    return;
  }
  for_each_index(count, FillOp<Word>{static_cast<Word*>(data), value}, stream, "fill");
}

template <typename T>
struct FillNormalOp {
  T* data;
  double mean;
  double stddev;
  std::uint64_t seed;
  __device__ void operator()(std::int64_t i) const {
    // The host's Box-Muller (kernels/host/elementwise.cpp, fill_normal) on the same two uniforms.
    constexpr double kTwoPi = 6.283185307179586;
    const auto index = static_cast<std::uint64_t>(i);
    const double u1 = 1.0 - to_unit_double(counter_random(seed, 0, 2 * index));  // (0, 1]
    const double u2 = to_unit_double(counter_random(seed, 0, 2 * index + 1));
    const double normal = __dmul_rn(sqrt(__dmul_rn(-2.0, log(u1))), cos(__dmul_rn(kTwoPi, u2)));
    store_as(data + i, __dadd_rn(mean, __dmul_rn(stddev, normal)));
  }
};

// ---- sums -------------------------------------------------------------------------------------

template <typename T>
struct AddOp {
  const T* a;
  const T* b;
  T* output;  // may alias a or b: each element is read before it is written, by the same thread
  __device__ void operator()(std::int64_t i) const {
    store_float(output + i, load_float(a + i) + load_float(b + i));
  }
};

template <typename T>
struct ScaleOp {
  T* data;
  compute_t<T> factor;
  __device__ void operator()(std::int64_t i) const { store_float(data + i, load_float(data + i) * factor); }
};

// ---- activations ------------------------------------------------------------------------------

template <typename C>
__device__ __forceinline__ C device_tanh(C x) {
  if constexpr (std::is_same_v<C, float>) {
    return tanhf(x);
  } else {
    return tanh(x);
  }
}

// The host's formulas (kernels/host/elementwise.cpp), with CUDA's tanh in place of the host's.
template <Activation kind, typename C>
__device__ __forceinline__ C activation_value(C x) {
  constexpr double kSqrt2OverPi = 0.7978845608028654;
  constexpr double kGeluCubic = 0.044715;
  if constexpr (kind == Activation::gelu) {
    const C inner = C(kSqrt2OverPi) * (x + C(kGeluCubic) * x * x * x);
    return C(0.5) * x * (C(1) + device_tanh(inner));
  } else if constexpr (kind == Activation::relu) {
    return x > C(0) ? x : C(0);
  } else {
    return device_tanh(x);
  }
}

template <Activation kind, typename C>
__device__ __forceinline__ C activation_derivative(C x) {
  constexpr double kSqrt2OverPi = 0.7978845608028654;
  constexpr double kGeluCubic = 0.044715;
  if constexpr (kind == Activation::gelu) {
    const C inner = C(kSqrt2OverPi) * (x + C(kGeluCubic) * x * x * x);
    const C tanh_inner = device_tanh(inner);
    const C sech2 = C(1) - tanh_inner * tanh_inner;
    const C inner_derivative = C(kSqrt2OverPi) * (C(1) + C(3 * kGeluCubic) * x * x);
    return C(0.5) * (C(1) + tanh_inner) + C(0.5) * x * sech2 * inner_derivative;
  } else if constexpr (kind == Activation::relu) {
    return x > C(0) ? C(1) : C(0);
  } else {
    const C t = device_tanh(x);
    return C(1) - t * t;
  }
}

template <Activation kind, typename T>
struct ActivationForwardOp {
  const T* input;
  T* output;
  __device__ void operator()(std::int64_t i) const {
    store_float(output + i, activation_value<kind>(load_float(input + i)));
  }
};

template <Activation kind, typename T>
struct ActivationBackwardOp {
  const T* input;
  const T* grad_output;
  T* grad_input;
  __device__ void operator()(std::int64_t i) const {
    store_float(grad_input + i,
                activation_derivative<kind>(load_float(input + i)) * load_float(grad_output + i));
  }
};

/// Calls body(std::integral_constant<Activation, kind>{}): one compiled loop per activation.
template <typename Body>
void with_activation(Activation activation, const char* kernel_name, Body&& body) {
  switch (activation) {
    case Activation::gelu:
      body(std::integral_constant<Activation, Activation::gelu>{});
      return;
    case Activation::relu:
      body(std::integral_constant<Activation, Activation::relu>{});
      return;
    case Activation::tanh:
      body(std::integral_constant<Activation, Activation::tanh>{});
      return;
  }
  ZT_THROW("CUDA kernel ", kernel_name, ": unknown activation ", static_cast<int>(activation));
}

// ---- dropout ----------------------------------------------------------------------------------

template <typename T>
struct DropoutOp {
  const T* input;
  T* output;
  double p;
  std::uint64_t seed;
  std::uint64_t mask_stream;
  compute_t<T> keep_scale;
  __device__ void operator()(std::int64_t i) const {
    // zt::kernels::dropout_keeps, on the device: the same hash, the same comparison.
    const bool keeps = to_unit_double(counter_random(seed, mask_stream, static_cast<std::uint64_t>(i))) >= p;
    store_float(output + i, keeps ? load_float(input + i) * keep_scale : compute_t<T>(0));
  }
};

}  // namespace

void convert(const void* source, DType source_dtype, void* destination, DType destination_dtype,
             std::int64_t count, void* stream) {
  ZT_CHECK(dtype_is_floating(source_dtype) == dtype_is_floating(destination_dtype), "CUDA convert from ",
           dtype_name(source_dtype), " to ", dtype_name(destination_dtype),
           ": expected two floating dtypes or two integer dtypes");
  if (count <= 0) return;
  const cudaStream_t cuda_stream = as_cuda_stream(stream);
  if (source_dtype == destination_dtype) {
    ZT_CHECK_CUDA(cudaMemcpyAsync(destination, source,
                                  static_cast<std::size_t>(count) * dtype_size(source_dtype),
                                  cudaMemcpyDefault, cuda_stream));
    return;
  }
  with_dtype(kAnyDTypes, source_dtype, "convert", [&](auto source_tag) {
    using From = decltype(source_tag);
    with_dtype(kAnyDTypes, destination_dtype, "convert", [&](auto destination_tag) {
      using To = decltype(destination_tag);
      for_each_index(count,
                     ConvertOp<To, From>{static_cast<const From*>(source), static_cast<To*>(destination)},
                     cuda_stream, "convert");
    });
  });
}

void fill(DType dtype, void* data, std::int64_t count, double value, void* stream) {
  if (count <= 0) return;
  const cudaStream_t cuda_stream = as_cuda_stream(stream);
  // The value is rounded here, on the host, exactly as the host kernel rounds it.
  switch (dtype) {
    case DType::fp32:
      return fill_words(data, count, static_cast<float>(value), cuda_stream);
    case DType::fp64:
      return fill_words(data, count, value, cuda_stream);
    case DType::bf16:
      return fill_words(data, count, bf16(static_cast<float>(value)).bits, cuda_stream);
    case DType::fp16:
      return fill_words(data, count, fp16(static_cast<float>(value)).bits, cuda_stream);
    case DType::int32:
      return fill_words(data, count, static_cast<std::int32_t>(value), cuda_stream);
    case DType::int64:
      return fill_words(data, count, static_cast<std::int64_t>(value), cuda_stream);
  }
  ZT_THROW("CUDA kernel fill: unknown dtype ", static_cast<int>(dtype));
}

void fill_normal(DType dtype, void* data, std::int64_t count, double mean, double stddev, std::uint64_t seed,
                 void* stream) {
  with_dtype(kFloatingDTypes, dtype, "fill_normal", [&](auto tag) {
    using T = decltype(tag);
    for_each_index(count, FillNormalOp<T>{static_cast<T*>(data), mean, stddev, seed}, as_cuda_stream(stream),
                   "fill_normal");
  });
}

void add(DType dtype, const void* a, const void* b, void* output, std::int64_t count, void* stream) {
  with_dtype(kFloatingDTypes, dtype, "add", [&](auto tag) {
    using T = decltype(tag);
    for_each_index(count,
                   AddOp<T>{static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(output)},
                   as_cuda_stream(stream), "add");
  });
}

void accumulate(DType dtype, void* target, const void* source, std::int64_t count, void* stream) {
  // As on the host: target = target + source. With fp64 and count 1 this adds a device scalar (a loss
  // sum) in stream order, without a host round trip.
  add(dtype, target, source, target, count, stream);
}

void scale(DType dtype, void* data, std::int64_t count, double factor, void* stream) {
  with_dtype(kFloatingDTypes, dtype, "scale", [&](auto tag) {
    using T = decltype(tag);
    const auto multiplier = static_cast<compute_t<T>>(factor);  // rounded first, as on the host
    for_each_index(count, ScaleOp<T>{static_cast<T*>(data), multiplier}, as_cuda_stream(stream), "scale");
  });
}

void activation_forward(DType dtype, Activation activation, const void* input, void* output,
                        std::int64_t count, void* stream) {
  with_dtype(kFloatingDTypes, dtype, "activation_forward", [&](auto tag) {
    using T = decltype(tag);
    with_activation(activation, "activation_forward", [&](auto kind) {
      for_each_index(count,
                     ActivationForwardOp<decltype(kind)::value, T>{static_cast<const T*>(input),
                                                                   static_cast<T*>(output)},
                     as_cuda_stream(stream), "activation_forward");
    });
  });
}

void activation_backward(DType dtype, Activation activation, const void* input, const void* grad_output,
                         void* grad_input, std::int64_t count, void* stream) {
  with_dtype(kFloatingDTypes, dtype, "activation_backward", [&](auto tag) {
    using T = decltype(tag);
    with_activation(activation, "activation_backward", [&](auto kind) {
      for_each_index(
          count,
          ActivationBackwardOp<decltype(kind)::value, T>{
              static_cast<const T*>(input), static_cast<const T*>(grad_output), static_cast<T*>(grad_input)},
          as_cuda_stream(stream), "activation_backward");
    });
  });
}

void dropout_forward(DType dtype, const void* input, void* output, std::int64_t count, double p,
                     std::uint64_t seed, std::uint64_t mask_stream, void* stream) {
  ZT_CHECK(p >= 0 && p < 1, "dropout probability must lie in [0, 1), got ", p);
  with_dtype(kFloatingDTypes, dtype, "dropout_forward", [&](auto tag) {
    using T = decltype(tag);
    const auto keep_scale = static_cast<compute_t<T>>(1.0 / (1.0 - p));  // as the host computes it
    for_each_index(
        count,
        DropoutOp<T>{static_cast<const T*>(input), static_cast<T*>(output), p, seed, mask_stream, keep_scale},
        as_cuda_stream(stream), "dropout_forward");
  });
}

void dropout_backward(DType dtype, const void* grad_output, void* grad_input, std::int64_t count, double p,
                      std::uint64_t seed, std::uint64_t mask_stream, void* stream) {
  // The same mask and scale as forward: dropout is linear in its input.
  dropout_forward(dtype, grad_output, grad_input, count, p, seed, mask_stream, stream);
}

}  // namespace zt::kernels::cuda
