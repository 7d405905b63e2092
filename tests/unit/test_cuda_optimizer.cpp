// The CUDA optimizer kernels and gradient checks (kernels/cuda/optimizer.cu) against the host kernels
// on the same inputs: each test runs zt::kernels::foo on a host Stream and on a cuda:0 Stream and
// compares. adam_step, sgd_step and cast_params_to_16bit do the host's IEEE operations in the host's
// order without fused multiply-adds, so they are checked for the host's values exactly (and, first,
// within a tolerance, so that a failure says how far off it is); grad_sum_squares sums in another
// fixed order, within a few fp64 ulps, with found_inf exact. Every gradient dtype, with and without
// the 16-bit parameter copy, sizes 0 and 1 and odd sizes. Without a usable GPU every test skips
// (ctest: unit.cuda_optimizer skipped).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "cuda_kernel_checks.hpp"
#include "kernels/optimizer_kernels.hpp"
#include "test_helpers.hpp"
#include "zerotrain/device.hpp"
#include "zerotrain/dtype.hpp"

namespace {

using zt::DType;
using zt::testing::all_close;
using zt::testing::fill_uniform;
using zt::testing::garbage_buffer;
using zt::testing::MirroredBuffer;
using zt::testing::Tolerance;
using zt::testing::uniform_buffer;
namespace kernels = zt::kernels;

constexpr DType kGradDtypes[] = {DType::fp32, DType::bf16, DType::fp16};
// Empty, one element, less than a warp, odd counts over many blocks.
constexpr std::size_t kSizes[] = {0, 1, 31, 4099, 100'003};

/// The 16-bit parameter copy an update writes: none, bf16 or fp16.
struct CopyChoice {
  bool enabled = false;
  DType dtype = DType::bf16;
  std::string name() const { return enabled ? std::string(zt::dtype_name(dtype)) : std::string("no"); }
};
constexpr CopyChoice kCopies[] = {{false, DType::bf16}, {true, DType::bf16}, {true, DType::fp16}};

// The exact comparison of the update kernels, and a tolerance (a few fp32 ulps per step) that says how
// far off a result is when the exact one fails.
constexpr Tolerance kExact{};
constexpr Tolerance kFewUlps{1e-7, 1e-6};

std::string describe(DType dtype, std::size_t count) {
  return std::string(zt::dtype_name(dtype)) + " x " + std::to_string(count);
}

MirroredBuffer zero_buffer(std::size_t bytes, const zt::Stream& stream) {
  MirroredBuffer buffer(bytes, stream);
  std::memset(buffer.host.data(), 0, buffer.host.size());
  buffer.upload();
  return buffer;
}

/// The CUDA result equals the host's exactly, and (reported separately) within a few ulps.
void expect_equal_results(MirroredBuffer& buffer, DType dtype, const std::string& what) {
  buffer.download();
  EXPECT_TRUE(all_close(buffer, dtype, kFewUlps, what + " (within a few ulps)"));
  EXPECT_TRUE(all_close(buffer, dtype, kExact, what + " (the host's value exactly)"));
}

class CudaOptimizer : public zt::testing::CudaKernelTest {};

// ---- Adam / AdamW -------------------------------------------------------------------------------

TEST_F(CudaOptimizer, AdamOverSeveralStepsGivesTheHostResults) {
  struct Variant {
    bool adam_w_mode, bias_correction;
    float weight_decay;
  };
  const Variant variants[] = {{true, true, 0.01f},   {true, false, 0.01f}, {false, true, 0.01f},
                              {false, false, 0.01f}, {false, true, 0.0f},  {true, true, 0.0f}};
  constexpr int kSteps = 5;
  for (DType grad_dtype : kGradDtypes) {
    for (const CopyChoice& copy : kCopies) {
      for (const Variant& variant : variants) {
        for (std::size_t count : kSizes) {
          const std::string what = std::string(variant.adam_w_mode ? "adamw" : "adam (L2)") + " decay " +
                                   std::to_string(variant.weight_decay) + " bias correction " +
                                   (variant.bias_correction ? "on" : "off") + ", grads " +
                                   describe(grad_dtype, count) + ", " + copy.name() + " copy";
          SCOPED_TRACE(what);
          MirroredBuffer params =
              uniform_buffer(DType::fp32, static_cast<std::int64_t>(count), -1.0, 1.0, 1, *cuda);
          MirroredBuffer exp_avg = zero_buffer(count * sizeof(float), *cuda);
          MirroredBuffer exp_avg_sq = zero_buffer(count * sizeof(float), *cuda);
          MirroredBuffer params_16bit = garbage_buffer(count * 2, *cuda);
          for (int step = 1; step <= kSteps; ++step) {
            // Loss-scaled gradients, unscaled by grad_scale inside the kernel.
            MirroredBuffer grads = uniform_buffer(grad_dtype, static_cast<std::int64_t>(count), -1024.0,
                                                  1024.0, 100 + step, *cuda);
            kernels::AdamStepArgs args;
            args.grad_dtype = grad_dtype;
            args.params_16bit_dtype = copy.dtype;
            args.count = count;
            args.grad_scale = 1.0f / 1024.0f;
            args.lr = 1e-2f;
            args.weight_decay = variant.weight_decay;
            args.adam_w_mode = variant.adam_w_mode;
            args.bias_correction = variant.bias_correction;
            args.step = step;
            kernels::AdamStepArgs on_host = args;
            on_host.params = params.host_data<float>();
            on_host.exp_avg = exp_avg.host_data<float>();
            on_host.exp_avg_sq = exp_avg_sq.host_data<float>();
            on_host.grads = grads.host.data();
            on_host.params_16bit = copy.enabled ? params_16bit.host.data() : nullptr;
            kernels::AdamStepArgs on_device = args;
            on_device.params = static_cast<float*>(params.device_data());
            on_device.exp_avg = static_cast<float*>(exp_avg.device_data());
            on_device.exp_avg_sq = static_cast<float*>(exp_avg_sq.device_data());
            on_device.grads = grads.device_data();
            on_device.params_16bit = copy.enabled ? params_16bit.device_data() : nullptr;
            kernels::adam_step(host, on_host);
            kernels::adam_step(*cuda, on_device);
          }
          expect_equal_results(params, DType::fp32, what + ": params");
          expect_equal_results(exp_avg, DType::fp32, what + ": exp_avg");
          expect_equal_results(exp_avg_sq, DType::fp32, what + ": exp_avg_sq");
          // Without a copy both sides keep the garbage; with one, it is the 16-bit params.
          expect_equal_results(params_16bit, copy.dtype, what + ": 16-bit params");
        }
      }
    }
  }
}

// ---- SGD ----------------------------------------------------------------------------------------

TEST_F(CudaOptimizer, SgdOverSeveralStepsGivesTheHostResults) {
  struct Variant {
    float momentum, dampening;
    bool nesterov;
  };
  const Variant variants[] = {
      {0.0f, 0.0f, false}, {0.9f, 0.0f, false}, {0.9f, 0.1f, false}, {0.9f, 0.0f, true}};
  constexpr int kSteps = 4;
  for (DType grad_dtype : kGradDtypes) {
    for (const CopyChoice& copy : kCopies) {
      for (const Variant& variant : variants) {
        for (float weight_decay : {0.0f, 1e-2f}) {
          for (std::size_t count : kSizes) {
            const std::string what = "sgd momentum " + std::to_string(variant.momentum) + " dampening " +
                                     std::to_string(variant.dampening) +
                                     (variant.nesterov ? " nesterov" : "") + " decay " +
                                     std::to_string(weight_decay) + ", grads " + describe(grad_dtype, count) +
                                     ", " + copy.name() + " copy";
            SCOPED_TRACE(what);
            MirroredBuffer params =
                uniform_buffer(DType::fp32, static_cast<std::int64_t>(count), -1.0, 1.0, 2, *cuda);
            // Not read on the first step: garbage until then.
            MirroredBuffer momentum_buffer = garbage_buffer(count * sizeof(float), *cuda);
            MirroredBuffer params_16bit = garbage_buffer(count * 2, *cuda);
            const bool with_buffer = variant.momentum != 0.0f;
            for (int step = 1; step <= kSteps; ++step) {
              MirroredBuffer grads = uniform_buffer(grad_dtype, static_cast<std::int64_t>(count), -64.0, 64.0,
                                                    200 + step, *cuda);
              kernels::SgdStepArgs args;
              args.grad_dtype = grad_dtype;
              args.params_16bit_dtype = copy.dtype;
              args.count = count;
              args.grad_scale = 1.0f / 64.0f;
              args.lr = 5e-2f;
              args.momentum = variant.momentum;
              args.dampening = variant.dampening;
              args.nesterov = variant.nesterov;
              args.weight_decay = weight_decay;
              args.first_step = step == 1;
              kernels::SgdStepArgs on_host = args;
              on_host.params = params.host_data<float>();
              on_host.momentum_buffer = with_buffer ? momentum_buffer.host_data<float>() : nullptr;
              on_host.grads = grads.host.data();
              on_host.params_16bit = copy.enabled ? params_16bit.host.data() : nullptr;
              kernels::SgdStepArgs on_device = args;
              on_device.params = static_cast<float*>(params.device_data());
              on_device.momentum_buffer =
                  with_buffer ? static_cast<float*>(momentum_buffer.device_data()) : nullptr;
              on_device.grads = grads.device_data();
              on_device.params_16bit = copy.enabled ? params_16bit.device_data() : nullptr;
              kernels::sgd_step(host, on_host);
              kernels::sgd_step(*cuda, on_device);
            }
            expect_equal_results(params, DType::fp32, what + ": params");
            expect_equal_results(momentum_buffer, DType::fp32, what + ": momentum buffer");
            expect_equal_results(params_16bit, copy.dtype, what + ": 16-bit params");
          }
        }
      }
    }
  }
}

TEST_F(CudaOptimizer, UpdatesRejectWhatTheHostRejects) {
  MirroredBuffer params = zero_buffer(16 * sizeof(float), *cuda);
  MirroredBuffer state = zero_buffer(16 * sizeof(float), *cuda);
  MirroredBuffer state_sq = zero_buffer(16 * sizeof(float), *cuda);
  MirroredBuffer grads = zero_buffer(16 * sizeof(double), *cuda);
  kernels::AdamStepArgs adam;
  adam.params = static_cast<float*>(params.device_data());
  adam.exp_avg = static_cast<float*>(state.device_data());
  adam.exp_avg_sq = static_cast<float*>(state_sq.device_data());
  adam.grads = grads.device_data();
  adam.count = 16;
  adam.grad_dtype = DType::fp64;
  std::string message = zt::testing::error_of([&] { kernels::adam_step(*cuda, adam); });
  EXPECT_NE(message.find("gradient dtype fp64 is not supported"), std::string::npos) << message;
  adam.grad_dtype = DType::fp32;
  adam.params_16bit = grads.device_data();
  adam.params_16bit_dtype = DType::fp32;
  message = zt::testing::error_of([&] { kernels::adam_step(*cuda, adam); });
  EXPECT_NE(message.find("expected bf16 or fp16"), std::string::npos) << message;
  message =
      zt::testing::error_of([&] { kernels::grad_sum_squares(*cuda, grads.device_data(), DType::fp64, 16); });
  EXPECT_NE(message.find("gradient dtype fp64 is not supported"), std::string::npos) << message;
}

// ---- sum of squares + inf/nan -------------------------------------------------------------------

// The host adds 16384-element chunks of 8 fp64 lanes, the GPU per-thread strides, warps and blocks:
// both error bounds are far below this for sums of non-negative terms.
constexpr double kSumRelativeTolerance = 1e-12;

TEST_F(CudaOptimizer, GradSumSquaresMatchesTheHost) {
  for (DType grad_dtype : kGradDtypes) {
    for (std::size_t count :
         {std::size_t{0}, std::size_t{1}, std::size_t{31}, std::size_t{16'385}, std::size_t{1'000'003}}) {
      for (double scale : {1.0, 1.0 / 1024.0}) {
        const std::string what =
            "grad_sum_squares " + describe(grad_dtype, count) + " scale " + std::to_string(scale);
        SCOPED_TRACE(what);
        MirroredBuffer grads =
            uniform_buffer(grad_dtype, static_cast<std::int64_t>(count), -3.0, 3.0, 3, *cuda);
        const kernels::GradCheck on_host =
            kernels::grad_sum_squares(host, grads.host.data(), grad_dtype, count, scale);
        const kernels::GradCheck on_device =
            kernels::grad_sum_squares(*cuda, grads.device_data(), grad_dtype, count, scale);
        EXPECT_FALSE(on_device.found_inf);
        EXPECT_FALSE(on_host.found_inf);
        EXPECT_NEAR(on_device.sum_sq, on_host.sum_sq, kSumRelativeTolerance * on_host.sum_sq);
        if (count > 0) {
          EXPECT_GT(on_device.sum_sq, 0.0);
        }
        // Deterministic: the same bits again.
        const kernels::GradCheck again =
            kernels::grad_sum_squares(*cuda, grads.device_data(), grad_dtype, count, scale);
        EXPECT_EQ(std::memcmp(&again.sum_sq, &on_device.sum_sq, sizeof(double)), 0)
            << "a second run gave " << again.sum_sq << " after " << on_device.sum_sq;
      }
    }
  }
}

/// Puts `value` (inf or nan) at `index` of a gradient buffer of `dtype`, on the host and the device.
void poison(MirroredBuffer& grads, DType dtype, std::size_t index, float value) {
  switch (dtype) {
    case DType::fp32:
      grads.host_data<float>()[index] = value;
      break;
    case DType::bf16:
      grads.host_data<zt::bf16>()[index] = zt::bf16(value);
      break;
    default:
      grads.host_data<zt::fp16>()[index] = zt::fp16(value);
  }
  grads.upload();
}

TEST_F(CudaOptimizer, GradSumSquaresFindsInfAndNanWhereverTheyAre) {
  constexpr std::size_t kCount = 100'003;
  const float specials[] = {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN()};
  for (DType grad_dtype : kGradDtypes) {
    for (float special : specials) {
      for (std::size_t index : {std::size_t{0}, kCount / 2 + 1, kCount - 1}) {
        const std::string what = "grad_sum_squares " + describe(grad_dtype, kCount) + " with " +
                                 std::to_string(special) + " at " + std::to_string(index);
        SCOPED_TRACE(what);
        MirroredBuffer grads =
            uniform_buffer(grad_dtype, static_cast<std::int64_t>(kCount), -1.0, 1.0, 4, *cuda);
        poison(grads, grad_dtype, index, special);
        const kernels::GradCheck on_host =
            kernels::grad_sum_squares(host, grads.host.data(), grad_dtype, kCount, 0.5);
        const kernels::GradCheck on_device =
            kernels::grad_sum_squares(*cuda, grads.device_data(), grad_dtype, kCount, 0.5);
        EXPECT_TRUE(on_host.found_inf);
        EXPECT_TRUE(on_device.found_inf);
      }
    }
    // The largest finite values are no overflow: fp16's 65504, fp32's max squared fits fp64. bf16 takes
    // its own largest finite value, 0x1.fep127: fp32's max rounds (to nearest even) to bf16 inf, which
    // would make this a test of an inf.
    MirroredBuffer grads = uniform_buffer(grad_dtype, static_cast<std::int64_t>(kCount), -1.0, 1.0, 5, *cuda);
    const float largest_finite = grad_dtype == DType::fp16   ? 65504.0f
                                 : grad_dtype == DType::bf16 ? 0x1.fep127f
                                                             : std::numeric_limits<float>::max();
    poison(grads, grad_dtype, 7, largest_finite);
    ASSERT_TRUE(std::isfinite(zt::testing::element_as_double(grads.host.data(), grad_dtype, 7)))
        << zt::dtype_name(grad_dtype) << ": the largest finite value is not finite in the dtype";
    const kernels::GradCheck on_device =
        kernels::grad_sum_squares(*cuda, grads.device_data(), grad_dtype, kCount);
    EXPECT_FALSE(on_device.found_inf) << zt::dtype_name(grad_dtype) << " with its largest finite value";
  }
}

TEST_F(CudaOptimizer, GradSumSquaresAccumulatesDeviceScalarsAsTheHost) {
  // The engine's pattern: the partials of several buffers added into two device scalars in stream
  // order, read once. One buffer holds an inf: found_inf counts it.
  struct Part {
    DType dtype;
    std::size_t count;
    bool with_inf;
  };
  const Part parts[] = {{DType::fp32, 4099, false},
                        {DType::bf16, 100'003, false},
                        {DType::fp16, 0, false},
                        {DType::fp16, 31, true},
                        {DType::fp32, 1, false}};
  for (bool include_inf : {false, true}) {
    SCOPED_TRACE(include_inf ? "with an inf" : "all finite");
    kernels::GradCheckScalars on_host;
    MirroredBuffer on_device = zero_buffer(sizeof(kernels::GradCheckScalars), *cuda);
    std::uint64_t seed = 6;
    for (const Part& part : parts) {
      if (part.with_inf && !include_inf) continue;
      MirroredBuffer grads =
          uniform_buffer(part.dtype, static_cast<std::int64_t>(part.count), -2.0, 2.0, seed++, *cuda);
      if (part.with_inf) poison(grads, part.dtype, part.count / 2, std::numeric_limits<float>::infinity());
      kernels::grad_sum_squares(host, grads.host.data(), part.dtype, part.count, 0.25, &on_host);
      kernels::grad_sum_squares(*cuda, grads.device_data(), part.dtype, part.count, 0.25,
                                static_cast<kernels::GradCheckScalars*>(on_device.device_data()));
    }
    on_device.download();
    const auto* result = on_device.downloaded_data<kernels::GradCheckScalars>();
    EXPECT_EQ(result->found_inf, on_host.found_inf);
    EXPECT_EQ(result->found_inf, include_inf ? 1.0 : 0.0);
    if (!include_inf) {
      EXPECT_GT(result->sum_sq, 0.0);
      EXPECT_NEAR(result->sum_sq, on_host.sum_sq, kSumRelativeTolerance * on_host.sum_sq);
    } else {
      EXPECT_FALSE(std::isfinite(result->sum_sq));
    }
  }
}

// ---- 16-bit parameter copies --------------------------------------------------------------------

TEST_F(CudaOptimizer, CastParamsTo16BitGivesTheHostValues) {
  for (DType dtype : {DType::bf16, DType::fp16}) {
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{31}, std::size_t{100'003}}) {
      const std::string what = "cast_params_to_16bit " + describe(dtype, count);
      SCOPED_TRACE(what);
      MirroredBuffer params(count * sizeof(float), *cuda);
      fill_uniform(params.host.data(), DType::fp32, count, -70000.0, 70000.0, 7);
      // Every rounding path: inf, -0, fp16 overflow, fp16 subnormals, a bf16 tie, tiny values.
      const float specials[] = {std::numeric_limits<float>::infinity(),
                                -0.0f,
                                65520.0f,
                                1e-7f,
                                1.0f + 0x1p-8f,
                                3e-8f,
                                -65504.0f,
                                1e-30f};
      for (std::size_t i = 0; i < count && i < std::size(specials); ++i)
        params.host_data<float>()[i] = specials[i];
      params.upload();
      MirroredBuffer copy = garbage_buffer(count * 2, *cuda);
      kernels::cast_params_to_16bit(host, params.host_data<float>(), copy.host.data(), dtype, count);
      kernels::cast_params_to_16bit(*cuda, static_cast<const float*>(params.device_data()),
                                    copy.device_data(), dtype, count);
      copy.download();
      EXPECT_TRUE(all_close(copy, dtype, kExact, what));
      EXPECT_EQ(std::memcmp(copy.host.data(), copy.downloaded.data(), copy.host.size()), 0)
          << what << ": bits";
    }
  }
}

}  // namespace
