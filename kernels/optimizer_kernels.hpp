// Fused optimizer kernels over flat buffers, and the gradient checks that precede them.
//
// Every kernel takes raw pointers and an element count, so ZeRO can run it on one rank's shard of a
// flat buffer. The update kernels make ONE pass over memory per element: read the fp32 master
// parameter, the gradient (fp32, bf16 or fp16) and the optimizer state; unscale (and clip) the
// gradient on the fly with `grad_scale`; write the parameter, the state and, optionally, a 16-bit
// copy of the parameter (bf16 or fp16, round to nearest even, bit-identical to zt::bf16/zt::fp16).
//
// Every kernel takes the stream it is ordered on first and runs on stream.device(); the pointers are
// memory of that device (kernels/nn_kernels.hpp states the conventions).
//
// Determinism: results do not depend on the number of OpenMP threads. Elementwise kernels split the
// range into fixed blocks (each element always takes the same code path); the sum of squares adds
// fixed chunks in index order.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zerotrain/device.hpp"
#include "zerotrain/dtype.hpp"

namespace zt::kernels {

/// One Adam/AdamW step (torch and DeepSpeed semantics), per element i:
///   g  = grads[i] * grad_scale                      (+ weight_decay * p when !adam_w_mode: L2)
///   m  = beta1 * m + (1 - beta1) * g
///   v  = beta2 * v + (1 - beta2) * g^2
///   p  = p * (1 - lr * weight_decay)                 (only when adam_w_mode: decoupled decay)
///   p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps)  (bc_k = 1 - beta_k^step, or 1 without
///                                                     bias_correction; eps outside the sqrt)
struct AdamStepArgs {
  float* params = nullptr;      // fp32 master weights, updated in place
  float* exp_avg = nullptr;     // m
  float* exp_avg_sq = nullptr;  // v
  const void* grads = nullptr;  // grad_dtype elements
  DType grad_dtype = DType::fp32;
  void* params_16bit = nullptr;  // optional copy of the updated params in params_16bit_dtype
  DType params_16bit_dtype = DType::bf16;
  std::size_t count = 0;
  float grad_scale = 1.0f;  // 1/loss_scale times the clip coefficient
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  bool adam_w_mode = true;
  bool bias_correction = true;
  std::int64_t step = 1;  // 1 for the first update (the count after incrementing)
};
void adam_step(const Stream& stream, const AdamStepArgs& args);
/// The per-step constants of adam_step: computed in double, rounded once to fp32 (as DeepSpeed's and
/// torch's kernels do). One function for the host and the CUDA kernel, so that both round alike.
struct AdamStepConstants {
  float step_size = 0;        // lr / bc1
  float inv_sqrt_bc2 = 0;     // 1 / sqrt(bc2)
  float one_minus_beta1 = 0;  // 1 - beta1
  float one_minus_beta2 = 0;  // 1 - beta2
  float decay = 1;            // 1 - lr * weight_decay: AdamW's factor on the weight
};
AdamStepConstants adam_step_constants(const AdamStepArgs& args);

/// One SGD step (torch semantics), per element i:
///   g = grads[i] * grad_scale + weight_decay * p
///   with momentum: buf = first_step ? g : momentum * buf + (1 - dampening) * g
///                  d   = nesterov ? g + momentum * buf : buf
///   p -= lr * d
struct SgdStepArgs {
  float* params = nullptr;
  float* momentum_buffer = nullptr;  // needed when momentum != 0; not read on the first step
  const void* grads = nullptr;
  DType grad_dtype = DType::fp32;
  void* params_16bit = nullptr;
  DType params_16bit_dtype = DType::bf16;
  std::size_t count = 0;
  float grad_scale = 1.0f;
  float lr = 1e-3f;
  float momentum = 0.0f;
  float dampening = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;
  bool first_step = true;  // the momentum buffer starts as a copy of the gradient
};
void sgd_step(const Stream& stream, const SgdStepArgs& args);

/// Sum of squares of a gradient buffer and whether it holds inf or nan, in one read.
/// Partial results (one rank's shard, one of several buffers) combine with `+`; ZeRO all-reduces
/// sum_sq (sum) and found_inf (max) across ranks.
struct GradCheck {
  double sum_sq = 0.0;     // sum of (scale * g)^2 in fp64; meaningless when found_inf
  bool found_inf = false;  // some element is +inf, -inf or nan
  friend GradCheck operator+(const GradCheck& a, const GradCheck& b) {
    return {a.sum_sq + b.sum_sq, a.found_inf || b.found_inf};
  }
};
/// fp64 accumulation in fixed chunks added in index order: the same bits for any thread count.
/// `scale` unscales (e.g. 1/loss_scale) so the result is the sum of squares of the true gradient.
/// Synchronous: the result comes back to the host (tests, host code).
GradCheck grad_sum_squares(const Stream& stream, const void* grads, DType grad_dtype, std::size_t count,
                           double scale = 1.0);

/// A GradCheck that stays on the device: two fp64 scalars, so that partials of several buffers and
/// ranks combine by one sum (an all_reduce of two doubles). found_inf counts the partials that held
/// inf or nan: > 0 means overflow.
struct GradCheckScalars {
  double sum_sq = 0.0;
  double found_inf = 0.0;
};
/// Adds this buffer's check into `accumulator` (device memory on stream.device()):
/// sum_sq += partial.sum_sq, found_inf += partial.found_inf ? 1 : 0. A sequence of these gives the
/// bits of `check = check + grad_sum_squares(...)` on the host.
void grad_sum_squares(const Stream& stream, const void* grads, DType grad_dtype, std::size_t count,
                      double scale, GradCheckScalars* accumulator);

/// Round fp32 master weights to a bf16 or fp16 copy (round to nearest even, as zt::bf16/zt::fp16).
void cast_params_to_16bit(const Stream& stream, const float* params, void* params_16bit, DType dtype,
                          std::size_t count);

/// OpenMP threads the host kernels use for calls from this thread on (omp_set_num_threads): for
/// tests, benchmarks and a CPU-optimizer core budget. host_threads() is omp_get_max_threads().
void set_host_threads(int threads);
int host_threads();

/// Global-norm clipping (DeepSpeed): norm = sqrt(global sum of squares of the unscaled gradients);
/// coefficient = max_norm / (norm + 1e-6) when that is < 1, else 1. max_norm <= 0 disables
/// clipping (coefficient 1). A non-finite norm gives coefficient 1: such a step is skipped anyway.
struct GradClip {
  double norm = 0.0;
  double coefficient = 1.0;
};
GradClip clip_from_sum_squares(double global_sum_sq, double max_norm);

/// The grad_scale the update kernels take: unscale by the loss scale and apply the clip coefficient.
inline float combined_grad_scale(double loss_scale, double clip_coefficient) {
  return static_cast<float>(clip_coefficient / loss_scale);
}

}  // namespace zt::kernels
