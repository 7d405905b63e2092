// CUDA fused optimizer kernels and gradient checks (kernels/cuda/optimizer.hpp says how each compares
// with the host's). The updates are one grid-stride pass over memory (kernels/cuda/grid_stride.cuh):
// each element reads its parameter, gradient and state once and writes them once. Their arithmetic
// is spelled with the __f*_rn intrinsics, which nvcc never fuses into multiply-adds, in the order of
// kernels/host/optimizer_kernels.cpp (built with -ffp-contract=off): the host's bits.
//
// The sum of squares is a two-pass reduction in fp64: a first kernel of a fixed number of blocks
// (it depends on the element count only) leaves one partial per block, reduced in registers, warp
// shuffles and shared memory in a fixed order; a one-block second kernel adds the partials in a fixed
// order and finishes (scale, inf/nan, accumulate). No atomics: the same bits on every run.
#include "kernels/cuda/optimizer.hpp"

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/cuda_common.hpp"
#include "kernels/cuda/grid_stride.cuh"
#include "kernels/cuda/stream_scratch.hpp"
#include "zerotrain/dtype.hpp"
#include "zerotrain/error.hpp"

namespace zt::kernels::cuda {
namespace {

// ---- dtypes -------------------------------------------------------------------------------------

/// The gradient dtypes the host kernels take too.
constexpr DTypeSet<DType::fp32, DType::bf16, DType::fp16> kGradientDTypes{"gradient"};
/// The dtypes of the 16-bit parameter copy.
constexpr DTypeSet<DType::bf16, DType::fp16> kParameterCopyDTypes{"parameter copy"};

/// The type of "no 16-bit parameter copy".
struct NoCopy {};

/// Calls body(C{}) with the storage type of the 16-bit parameter copy, or NoCopy without one.
template <typename Body>
void with_copy_type(const void* params_16bit, DType dtype, const char* kernel_name, Body&& body) {
  if (params_16bit == nullptr) {
    body(NoCopy{});
    return;
  }
  with_dtype(kParameterCopyDTypes, dtype, kernel_name, body);
}

template <typename Copy>
__device__ __forceinline__ void store_copy(void* copy, std::int64_t i, float value) {
  if constexpr (!std::is_same_v<Copy, NoCopy>) store_float(static_cast<Copy*>(copy) + i, value);
}

// ---- Adam / AdamW -------------------------------------------------------------------------------

/// What the update reads besides the arrays: the host's per-step constants (adam_step_constants,
/// kernels/host/optimizer_kernels.cpp) and the hyperparameters.
struct AdamConstants {
  AdamStepConstants step;
  float beta1, beta2, eps, grad_scale, weight_decay;
};

template <typename Grad, typename Copy, bool kDecoupled>
struct AdamOp {
  float* params;
  float* exp_avg;
  float* exp_avg_sq;
  const Grad* grads;
  void* copy;
  AdamConstants k;
  __device__ void operator()(std::int64_t i) const {
    float p = params[i];
    float g = __fmul_rn(load_float(grads + i), k.grad_scale);
    if constexpr (!kDecoupled)
      g = __fadd_rn(g, __fmul_rn(k.weight_decay, p));  // L2: decay joins the gradient
    const float m = __fadd_rn(__fmul_rn(k.beta1, exp_avg[i]), __fmul_rn(k.step.one_minus_beta1, g));
    const float v =
        __fadd_rn(__fmul_rn(k.beta2, exp_avg_sq[i]), __fmul_rn(k.step.one_minus_beta2, __fmul_rn(g, g)));
    const float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(v), k.step.inv_sqrt_bc2), k.eps);
    if constexpr (kDecoupled) p = __fmul_rn(p, k.step.decay);  // AdamW: decay the weight, not the gradient
    p = __fsub_rn(p, __fmul_rn(k.step.step_size, __fdiv_rn(m, denom)));
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    params[i] = p;
    store_copy<Copy>(copy, i, p);
  }
};

// ---- SGD ----------------------------------------------------------------------------------------

enum class SgdMode { plain, momentum, nesterov };

template <typename Grad, typename Copy, SgdMode kMode, bool kFirst>
struct SgdOp {
  float* params;
  float* buffer;
  const Grad* grads;
  void* copy;
  float lr, momentum, one_minus_dampening, grad_scale, weight_decay;
  __device__ void operator()(std::int64_t i) const {
    float p = params[i];
    const float g = __fadd_rn(__fmul_rn(load_float(grads + i), grad_scale), __fmul_rn(weight_decay, p));
    float d = g;
    if constexpr (kMode != SgdMode::plain) {
      float b;
      if constexpr (kFirst) {
        b = g;  // torch: the buffer starts as a copy of the first gradient (no dampening)
      } else {
        b = __fadd_rn(__fmul_rn(momentum, buffer[i]), __fmul_rn(one_minus_dampening, g));
      }
      buffer[i] = b;
      if constexpr (kMode == SgdMode::nesterov) {
        d = __fadd_rn(g, __fmul_rn(momentum, b));
      } else {
        d = b;
      }
    }
    p = __fsub_rn(p, __fmul_rn(lr, d));
    params[i] = p;
    store_copy<Copy>(copy, i, p);
  }
};

template <typename Grad, typename Copy, SgdMode kMode, bool kFirst>
void launch_sgd(const SgdStepArgs& a, cudaStream_t stream) {
  const SgdOp<Grad, Copy, kMode, kFirst> op{
      a.params,      a.momentum_buffer, static_cast<const Grad*>(a.grads),     a.params_16bit,
      a.lr,          a.momentum,        static_cast<float>(1.0 - a.dampening), a.grad_scale,
      a.weight_decay};
  for_each_index(static_cast<std::int64_t>(a.count), op, stream, "sgd_step");
}

// ---- sum of squares + inf/nan -------------------------------------------------------------------

constexpr unsigned int kReduceThreads = 256;
constexpr unsigned int kWarpSize = 32;
// Blocks of the first pass at most: enough to fill a GPU, few enough for one block to add up.
constexpr unsigned int kMaxPartials = 1024;

/// The sum of `value` over the block (blockDim.x == kReduceThreads, every thread calling), valid in
/// thread 0: warp shuffles, then the warps' sums in warp order. Once per kernel (shared memory).
__device__ double block_sum(double value) {
  __shared__ double warp_sums[kReduceThreads / kWarpSize];
  for (unsigned int offset = kWarpSize / 2; offset > 0; offset /= 2)
    value += __shfl_down_sync(0xffffffffu, value, offset);
  if (threadIdx.x % kWarpSize == 0) warp_sums[threadIdx.x / kWarpSize] = value;
  __syncthreads();
  double total = 0.0;
  if (threadIdx.x == 0) {
    for (unsigned int w = 0; w < kReduceThreads / kWarpSize; ++w) total += warp_sums[w];
  }
  return total;
}

/// partials[block] = the sum of squares of the elements this block's threads stride over.
template <typename Grad>
__global__ void __launch_bounds__(kReduceThreads)
    sum_squares_partials_kernel(const Grad* grads, std::int64_t count, double* partials) {
  double sum = 0.0;
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    const double x = load_float(grads + i);
    sum += x * x;  // exact square (a 24-bit significand squared fits in 53 bits): fused or not, the same
  }
  sum = block_sum(sum);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

/// Adds the partials and finishes as the host does (kernels/host/optimizer_kernels.cpp,
/// grad_sum_squares): squares of finite values cannot overflow fp64, so a non-finite sum means an inf
/// or nan element. Writes the check into *result, or adds it there when `accumulate`.
__global__ void __launch_bounds__(kReduceThreads)
    sum_squares_finish_kernel(const double* partials, unsigned int partial_count, double scale,
                              GradCheckScalars* result, bool accumulate) {
  double sum = 0.0;
  for (unsigned int j = threadIdx.x; j < partial_count; j += blockDim.x) sum += partials[j];
  sum = block_sum(sum);
  if (threadIdx.x == 0) {
    const bool found_inf = !isfinite(sum);
    const double sum_sq = found_inf ? sum : __dmul_rn(sum, __dmul_rn(scale, scale));
    const double inf_count = found_inf ? 1.0 : 0.0;
    if (accumulate) {
      result->sum_sq = __dadd_rn(result->sum_sq, sum_sq);
      result->found_inf = __dadd_rn(result->found_inf, inf_count);
    } else {
      result->sum_sq = sum_sq;
      result->found_inf = inf_count;
    }
  }
}

/// Both passes over grads[0, count) (count > 0) into *result (device memory), with scratch for the
/// partials allocated on the stream.
void launch_sum_squares(const void* grads, DType grad_dtype, std::size_t count, double scale,
                        GradCheckScalars* result, bool accumulate, cudaStream_t stream) {
  const auto elements = static_cast<std::int64_t>(count);
  const unsigned int blocks = grid_blocks(elements, kReduceThreads, kMaxPartials);
  const StreamScratch partials(blocks * sizeof(double), stream, "grad_sum_squares (partial sums)");
  with_dtype(kGradientDTypes, grad_dtype, "grad_sum_squares", [&](auto tag) {
    using Grad = decltype(tag);
    sum_squares_partials_kernel<Grad><<<blocks, kReduceThreads, 0, stream>>>(static_cast<const Grad*>(grads),
                                                                             elements, partials.as<double>());
    ZT_CHECK_LAUNCH("grad_sum_squares (partial sums)");
  });
  sum_squares_finish_kernel<<<1, kReduceThreads, 0, stream>>>(partials.as<double>(), blocks, scale, result,
                                                              accumulate);
  ZT_CHECK_LAUNCH("grad_sum_squares (finish)");
}

template <typename Copy>
struct CastOp {
  const float* params;
  void* copy;
  __device__ void operator()(std::int64_t i) const { store_copy<Copy>(copy, i, params[i]); }
};

}  // namespace

void adam_step(const AdamStepArgs& args, void* stream) {
  const AdamConstants constants{adam_step_constants(args), args.beta1,       args.beta2, args.eps,
                                args.grad_scale,           args.weight_decay};
  with_dtype(kGradientDTypes, args.grad_dtype, "adam_step", [&](auto grad_tag) {
    using Grad = decltype(grad_tag);
    with_copy_type(args.params_16bit, args.params_16bit_dtype, "adam_step", [&](auto copy_tag) {
      using Copy = decltype(copy_tag);
      const auto launch = [&](auto decoupled) {
        const AdamOp<Grad, Copy, decltype(decoupled)::value> op{
            args.params,       args.exp_avg, args.exp_avg_sq, static_cast<const Grad*>(args.grads),
            args.params_16bit, constants};
        for_each_index(static_cast<std::int64_t>(args.count), op, as_cuda_stream(stream), "adam_step");
      };
      // As on the host: L2 mode without weight decay is the decoupled update with decay factor 1.
      if (args.adam_w_mode || args.weight_decay == 0.0f) {
        launch(std::true_type{});
      } else {
        launch(std::false_type{});
      }
    });
  });
}

void sgd_step(const SgdStepArgs& args, void* stream) {
  const cudaStream_t cuda_stream = as_cuda_stream(stream);
  with_dtype(kGradientDTypes, args.grad_dtype, "sgd_step", [&](auto grad_tag) {
    using Grad = decltype(grad_tag);
    with_copy_type(args.params_16bit, args.params_16bit_dtype, "sgd_step", [&](auto copy_tag) {
      using Copy = decltype(copy_tag);
      if (args.momentum == 0.0f) {
        launch_sgd<Grad, Copy, SgdMode::plain, false>(args, cuda_stream);
      } else if (args.nesterov) {
        args.first_step ? launch_sgd<Grad, Copy, SgdMode::nesterov, true>(args, cuda_stream)
                        : launch_sgd<Grad, Copy, SgdMode::nesterov, false>(args, cuda_stream);
      } else {
        args.first_step ? launch_sgd<Grad, Copy, SgdMode::momentum, true>(args, cuda_stream)
                        : launch_sgd<Grad, Copy, SgdMode::momentum, false>(args, cuda_stream);
      }
    });
  });
}

GradCheck grad_sum_squares(const void* grads, DType grad_dtype, std::size_t count, double scale,
                           void* stream) {
  with_dtype(kGradientDTypes, grad_dtype, "grad_sum_squares",
             [](auto) {});             // a bad dtype throws before any work
  if (count == 0) return GradCheck{};  // the host's result for no elements, without a device round trip
  const cudaStream_t cuda_stream = as_cuda_stream(stream);
  GradCheckScalars check;
  {
    const StreamScratch result(sizeof(GradCheckScalars), cuda_stream, "grad_sum_squares (result)");
    launch_sum_squares(grads, grad_dtype, count, scale, result.as<GradCheckScalars>(), false, cuda_stream);
    ZT_CHECK_CUDA(cudaMemcpyAsync(&check, result.as<GradCheckScalars>(), sizeof(check),
                                  cudaMemcpyDeviceToHost, cuda_stream));
  }                                                   // the scratch is freed in stream order, after the copy
  ZT_CHECK_CUDA(cudaStreamSynchronize(cuda_stream));  // synchronous by contract: the host reads the result
  return GradCheck{check.sum_sq, check.found_inf > 0.0};
}

void grad_sum_squares(const void* grads, DType grad_dtype, std::size_t count, double scale,
                      GradCheckScalars* accumulator, void* stream) {
  with_dtype(kGradientDTypes, grad_dtype, "grad_sum_squares", [](auto) {});
  // No elements add a zero sum and no inf: nothing to do.
  if (count == 0) return;
  launch_sum_squares(grads, grad_dtype, count, scale, accumulator, true, as_cuda_stream(stream));
}

void cast_params_to_16bit(const float* params, void* params_16bit, DType dtype, std::size_t count,
                          void* stream) {
  with_copy_type(params_16bit, dtype, "cast_params_to_16bit", [&](auto copy_tag) {
    using Copy = decltype(copy_tag);
    if constexpr (!std::is_same_v<Copy, NoCopy>) {
      for_each_index(static_cast<std::int64_t>(count), CastOp<Copy>{params, params_16bit},
                     as_cuda_stream(stream), "cast_params_to_16bit");
    }
  });
}

}  // namespace zt::kernels::cuda
