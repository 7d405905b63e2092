// CUDA versions of the fused optimizer kernels and gradient checks of kernels/optimizer_kernels.hpp:
// the host kernels' arguments plus the cudaStream_t (`stream`) last; every pointer is device memory of
// the stream's device.
//
// Against the host kernels (kernels/host/optimizer_kernels.cpp):
//   - adam_step, sgd_step and cast_params_to_16bit do the host's IEEE operations in the host's order
//     without fused multiply-adds, with the host's per-step constants (adam_step_constants): the same
//     bits (NaN payloads of the 16-bit copy aside);
//   - grad_sum_squares reduces in fp64 in a different (fixed) order: deterministic run to run, within
//     a few fp64 ulps of the host's sum; found_inf is exact.
#pragma once

#include <cstddef>

#include "kernels/optimizer_kernels.hpp"

namespace zt::kernels::cuda {

void adam_step(const AdamStepArgs& args, void* stream);
void sgd_step(const SgdStepArgs& args, void* stream);
/// Synchronous, as the host's: the reduction runs on the device, one copy brings the result back.
GradCheck grad_sum_squares(const void* grads, DType grad_dtype, std::size_t count, double scale,
                           void* stream);
/// Asynchronous: adds this buffer's check into `accumulator` (device memory) in stream order.
void grad_sum_squares(const void* grads, DType grad_dtype, std::size_t count, double scale,
                      GradCheckScalars* accumulator, void* stream);
void cast_params_to_16bit(const float* params, void* params_16bit, DType dtype, std::size_t count,
                          void* stream);

}  // namespace zt::kernels::cuda
