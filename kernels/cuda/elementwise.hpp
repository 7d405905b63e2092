// CUDA versions of the element-wise kernels of kernels/nn_kernels.hpp (conversion, fills, sums,
// activations, dropout): the host kernels' arguments plus the cudaStream_t (`stream`) last. They
// launch asynchronously on that stream; every pointer is device memory of the stream's device.
//
// Against the host kernels (kernels/host/elementwise.cpp):
//   - convert, fill, add, accumulate, scale, relu and dropout give the host's bits (one IEEE
//     operation per element, bf16/fp16 rounded to nearest even as zt::bf16 / zt::fp16; NaN stays
//     NaN, its payload may differ);
//   - fill_normal draws the host's uniforms bit for bit (kernels/counter_random.hpp); the Box-Muller
//     step uses CUDA's log and cos, a few fp64 ulps from the host's;
//   - GELU and tanh use CUDA's tanh, a few ulps of the compute type from the host's.
#pragma once

#include <cstdint>

#include "kernels/nn_kernels.hpp"

namespace zt::kernels::cuda {

void convert(const void* source, DType source_dtype, void* destination, DType destination_dtype,
             std::int64_t count, void* stream);
void fill(DType dtype, void* data, std::int64_t count, double value, void* stream);
void fill_normal(DType dtype, void* data, std::int64_t count, double mean, double stddev, std::uint64_t seed,
                 void* stream);
void add(DType dtype, const void* a, const void* b, void* output, std::int64_t count, void* stream);
void accumulate(DType dtype, void* target, const void* source, std::int64_t count, void* stream);
void scale(DType dtype, void* data, std::int64_t count, double factor, void* stream);
void activation_forward(DType dtype, Activation activation, const void* input, void* output,
                        std::int64_t count, void* stream);
void activation_backward(DType dtype, Activation activation, const void* input, const void* grad_output,
                         void* grad_input, std::int64_t count, void* stream);
void dropout_forward(DType dtype, const void* input, void* output, std::int64_t count, double p,
                     std::uint64_t seed, std::uint64_t mask_stream, void* stream);
void dropout_backward(DType dtype, const void* grad_output, void* grad_input, std::int64_t count, double p,
                      std::uint64_t seed, std::uint64_t mask_stream, void* stream);

}  // namespace zt::kernels::cuda
