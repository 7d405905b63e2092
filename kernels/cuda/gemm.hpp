// CUDA versions of the matmul kernels (kernels/nn_kernels.hpp) through cuBLASLt: the same arguments as
// the host kernels (kernels/host/nn_host.hpp) plus the cudaStream_t, asynchronous on that stream.
// fp32 computes in fp32 (or TF32 when selected, tf32_enabled()), bf16 and fp16 on tensor cores with fp32
// accumulation, fp64 in fp64. Built only with ZT_HAVE_CUDA.
#pragma once

#include <cstdint>

#include "kernels/nn_kernels.hpp"
#include "zerotrain/dtype.hpp"

namespace zt::kernels::cuda {

void matmul_forward(DType dtype, const void* input, const void* weight, const void* bias, void* output,
                    const MatmulShape& shape, void* stream);
void matmul_backward(DType dtype, const void* grad_output, const void* input, const void* weight,
                     void* grad_input, void* grad_weight, void* grad_bias, const MatmulShape& shape,
                     void* stream);
void matmul_weight_grad_rows(DType dtype, const void* grad_output, const void* input, void* grad_weight_rows,
                             const MatmulShape& shape, std::int64_t first_out, std::int64_t count,
                             void* stream);

/// Whether fp32 GEMMs run on tensor cores in TF32 (CUBLAS_COMPUTE_32F_FAST_TF32: 10-bit mantissa
/// products, fp32 accumulation). Off unless the environment variable ZT_CUDA_TF32 is 1 when the first
/// GEMM asks (read once; 0 or unset: off, anything else: an error naming the variable).
bool tf32_enabled();
/// Overrides ZT_CUDA_TF32 for the GEMMs queued from now on (tests compare both modes in one process).
void set_tf32_enabled(bool enabled);

}  // namespace zt::kernels::cuda
