// The CUDA element-wise kernels (kernels/cuda/elementwise.cu) against the host kernels on the same
// inputs: each test runs zt::kernels::foo on a host Stream and on a cuda:0 Stream and compares.
// Conversions, fills, sums, scaling, ReLU and dropout must give the host's bits (one IEEE operation
// per element); fill_normal, GELU and tanh differ by the ulps of CUDA's log/cos/tanh, compared with
// a tolerance. Every floating dtype, sizes 0 and 1 and odd sizes that are no multiple of a warp or a
// block. Without a usable GPU every test skips (ctest: unit.cuda_elementwise skipped).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_kernel_checks.hpp"
#include "kernels/nn_kernels.hpp"
#include "test_helpers.hpp"
#include "zerotrain/device.hpp"
#include "zerotrain/dtype.hpp"

namespace {

using zt::DType;
using zt::testing::all_close;
using zt::testing::default_tolerance;
using zt::testing::element_as_double;
using zt::testing::garbage_buffer;
using zt::testing::MirroredBuffer;
using zt::testing::same_bits;
using zt::testing::Tolerance;
using zt::testing::uniform_buffer;
namespace kernels = zt::kernels;

constexpr DType kFloatingDtypes[] = {DType::fp32, DType::fp64, DType::bf16, DType::fp16};
constexpr DType kAllDtypes[] = {DType::fp32, DType::fp64,  DType::bf16,
                                DType::fp16, DType::int32, DType::int64};
// Empty, one element, less than a warp, just over a block, and odd counts over many blocks.
constexpr std::int64_t kSizes[] = {0, 1, 31, 257, 4099, 100'003};

std::size_t bytes_of(DType dtype, std::int64_t count) {
  return zt::dtype_size(dtype) * static_cast<std::size_t>(count);
}

std::string describe(DType dtype, std::int64_t count) {
  std::ostringstream text;
  text << zt::dtype_name(dtype) << " x " << count;
  return text.str();
}

/// Values that probe every rounding path of a conversion: zeros, infinities, NaN, the fp16 overflow
/// threshold, fp16 subnormals, bf16 ties, fp32 extremes and doubles beyond fp32's range, then values
/// with random signs and exponents from 2^-30 to 2^20. Stored in `dtype` with the host's rounding.
void fill_conversion_probes(void* data, DType dtype, std::size_t count, std::uint64_t seed) {
  std::vector<double> values = {0.0,
                                -0.0,
                                std::numeric_limits<double>::infinity(),
                                -std::numeric_limits<double>::infinity(),
                                std::numeric_limits<double>::quiet_NaN(),
                                65504.0,
                                65519.99,
                                65520.0,
                                -1e-6,
                                6e-8,
                                2.98e-8,
                                1.0 + 0x1p-8,
                                1.0 + 3 * 0x1p-8,
                                -(1.0 + 0x1p-8 + 0x1p-24),
                                static_cast<double>(std::numeric_limits<float>::max()),
                                static_cast<double>(std::numeric_limits<float>::denorm_min()),
                                1e300,
                                -1e-300,
                                1.0 / 3.0};
  std::mt19937_64 engine(seed);
  std::uniform_real_distribution<double> mantissa(1.0, 2.0), exponent(-30.0, 20.0);
  while (values.size() < count) {
    const double sign = (engine() & 1) ? -1.0 : 1.0;
    values.push_back(sign * mantissa(engine) * std::exp2(std::floor(exponent(engine))));
  }
  for (std::size_t i = 0; i < count; ++i) zt::testing::store_as(data, dtype, i, values[i]);
}

class CudaElementwise : public zt::testing::CudaKernelTest {};

// ---- conversion -------------------------------------------------------------------------------

TEST_F(CudaElementwise, ConvertBetweenFloatingDtypesGivesTheHostBits) {
  for (DType from : kFloatingDtypes) {
    for (DType to : kFloatingDtypes) {
      for (std::int64_t count : {std::int64_t{0}, std::int64_t{1}, std::int64_t{19}, std::int64_t{100'003}}) {
        const std::string what =
            "convert " + describe(from, count) + " to " + std::string(zt::dtype_name(to));
        SCOPED_TRACE(what);
        MirroredBuffer source(bytes_of(from, count), *cuda);
        fill_conversion_probes(source.host.data(), from, static_cast<std::size_t>(count), 11);
        source.upload();
        MirroredBuffer destination = garbage_buffer(bytes_of(to, count), *cuda);
        kernels::convert(host, source.host.data(), from, destination.host.data(), to, count);
        kernels::convert(*cuda, source.device_data(), from, destination.device_data(), to, count);
        destination.download();
        EXPECT_TRUE(same_bits(destination, to, what));
      }
    }
  }
}

TEST_F(CudaElementwise, ConvertBetweenIntegerDtypesGivesTheHostValues) {
  constexpr std::int64_t kCount = 1001;
  for (DType from : {DType::int32, DType::int64}) {
    for (DType to : {DType::int32, DType::int64}) {
      const std::string what = "convert " + describe(from, kCount) + " to " + std::string(zt::dtype_name(to));
      SCOPED_TRACE(what);
      MirroredBuffer source(bytes_of(from, kCount), *cuda);
      for (std::int64_t i = 0; i < kCount; ++i) {
        const std::int64_t value = (i % 2 ? -1 : 1) * (i * 2'147'483 % 2'147'483'647);  // int32 range
        if (from == DType::int32) {
          source.host_data<std::int32_t>()[i] = static_cast<std::int32_t>(value);
        } else {
          source.host_data<std::int64_t>()[i] = value;
        }
      }
      source.upload();
      MirroredBuffer destination = garbage_buffer(bytes_of(to, kCount), *cuda);
      kernels::convert(host, source.host.data(), from, destination.host.data(), to, kCount);
      kernels::convert(*cuda, source.device_data(), from, destination.device_data(), to, kCount);
      destination.download();
      EXPECT_TRUE(same_bits(destination, to, what));
    }
  }
}

TEST_F(CudaElementwise, ConvertRejectsAFloatingAndAnIntegerDtypeAsTheHostDoes) {
  MirroredBuffer source(bytes_of(DType::fp32, 4), *cuda), destination(bytes_of(DType::int32, 4), *cuda);
  const std::string message = zt::testing::error_of([&] {
    kernels::convert(*cuda, source.device_data(), DType::fp32, destination.device_data(), DType::int32, 4);
  });
  EXPECT_NE(message.find("expected two floating dtypes or two integer dtypes"), std::string::npos) << message;
}

// ---- fills ------------------------------------------------------------------------------------

TEST_F(CudaElementwise, FillGivesTheHostBitsForEveryDtype) {
  // 0 takes the memset path; -0.0 must not; 1e6 overflows fp16; 1/3 rounds in every floating dtype.
  for (DType dtype : kAllDtypes) {
    for (double value : {0.0, -0.0, 1.5, -3.3, 1e6, 1.0 / 3.0}) {
      for (std::int64_t count : kSizes) {
        const std::string what = "fill " + describe(dtype, count) + " with " + std::to_string(value);
        SCOPED_TRACE(what);
        MirroredBuffer data = garbage_buffer(bytes_of(dtype, count), *cuda);
        kernels::fill(host, dtype, data.host.data(), count, value);
        kernels::fill(*cuda, dtype, data.device_data(), count, value);
        data.download();
        EXPECT_TRUE(same_bits(data, dtype, what));
      }
    }
  }
}

TEST_F(CudaElementwise, FillNormalDrawsTheHostUniformsAndMatchesWithinAnUlp) {
  // The uniforms are the host's bits (kernels/counter_random.hpp); only CUDA's log and cos differ, by
  // a few fp64 ulps. So fp64 agrees to ~1e-15 relative, and a stored fp32/bf16/fp16 value is the
  // host's except where the fp64 value lies within those ulps of a rounding boundary: at most one ulp
  // of the dtype, and rarely (a wrong uniform would be off by O(stddev) almost everywhere).
  struct Case {
    double mean, stddev;
    std::uint64_t seed;
  };
  for (const Case& c : {Case{0.0, 1.0, 42}, Case{0.5, 0.02, 0xdeadbeefcafef00dull}}) {
    for (DType dtype : kFloatingDtypes) {
      for (std::int64_t count : kSizes) {
        const std::string what = "fill_normal " + describe(dtype, count) + " seed " + std::to_string(c.seed);
        SCOPED_TRACE(what);
        MirroredBuffer data = garbage_buffer(bytes_of(dtype, count), *cuda);
        kernels::fill_normal(host, dtype, data.host.data(), count, c.mean, c.stddev, c.seed);
        kernels::fill_normal(*cuda, dtype, data.device_data(), count, c.mean, c.stddev, c.seed);
        data.download();
        Tolerance one_ulp;
        switch (dtype) {
          case DType::fp64:
            one_ulp = {1e-14, 1e-13};
            break;
          case DType::fp32:
            one_ulp = {1e-30, 1.2e-7};  // 2^-23
            break;
          case DType::bf16:
            one_ulp = {1e-30, 7.9e-3};  // 2^-7
            break;
          default:
            one_ulp = {6e-8, 9.8e-4};  // 2^-10, and the fp16 subnormal step 2^-24
        }
        EXPECT_TRUE(all_close(data, dtype, one_ulp, what));
        if (dtype != DType::fp64) {
          std::size_t differing = 0;
          for (std::int64_t i = 0; i < count; ++i) {
            const auto index = static_cast<std::size_t>(i);
            if (element_as_double(data.host.data(), dtype, index) !=
                element_as_double(data.downloaded.data(), dtype, index)) {
              ++differing;
            }
          }
          EXPECT_LE(differing, static_cast<std::size_t>(count) / 1000) << what << ": elements not bit-equal";
        }
      }
    }
  }
}

// ---- sums and scaling -------------------------------------------------------------------------

TEST_F(CudaElementwise, AddGivesTheHostBitsAlsoInPlace) {
  for (DType dtype : kFloatingDtypes) {
    for (std::int64_t count : kSizes) {
      const std::string what = "add " + describe(dtype, count);
      SCOPED_TRACE(what);
      MirroredBuffer a = uniform_buffer(dtype, count, -2.0, 2.0, 1, *cuda);
      MirroredBuffer b = uniform_buffer(dtype, count, -2.0, 2.0, 2, *cuda);
      MirroredBuffer sum = garbage_buffer(bytes_of(dtype, count), *cuda);
      kernels::add(host, dtype, a.host.data(), b.host.data(), sum.host.data(), count);
      kernels::add(*cuda, dtype, a.device_data(), b.device_data(), sum.device_data(), count);
      sum.download();
      EXPECT_TRUE(same_bits(sum, dtype, what));
      // output aliasing b: b = a + b
      kernels::add(host, dtype, a.host.data(), b.host.data(), b.host.data(), count);
      kernels::add(*cuda, dtype, a.device_data(), b.device_data(), b.device_data(), count);
      b.download();
      EXPECT_TRUE(same_bits(b, dtype, what + " in place"));
    }
  }
}

TEST_F(CudaElementwise, AccumulateGivesTheHostBits) {
  for (DType dtype : kFloatingDtypes) {
    for (std::int64_t count : kSizes) {
      const std::string what = "accumulate " + describe(dtype, count);
      SCOPED_TRACE(what);
      MirroredBuffer target = uniform_buffer(dtype, count, -1.0, 1.0, 3, *cuda);
      MirroredBuffer source = uniform_buffer(dtype, count, -1.0, 1.0, 4, *cuda);
      for (int round = 0; round < 3; ++round) {
        kernels::accumulate(host, dtype, target.host.data(), source.host.data(), count);
        kernels::accumulate(*cuda, dtype, target.device_data(), source.device_data(), count);
      }
      target.download();
      EXPECT_TRUE(same_bits(target, dtype, what));
    }
  }
}

TEST_F(CudaElementwise, AccumulateAddsAnFp64DeviceScalarInStreamOrder) {
  // The loss-sum pattern: one fp64 scalar on the device, a per-micro-batch loss added to it each time,
  // with no host read in between.
  MirroredBuffer total(sizeof(double), *cuda);
  *total.host_data<double>() = 0.0;
  total.upload();
  std::vector<MirroredBuffer> losses;
  for (int micro_batch = 0; micro_batch < 16; ++micro_batch) {
    losses.emplace_back(sizeof(double), *cuda);
    *losses.back().host_data<double>() = 2.0 + std::sin(micro_batch) / 3.0;
    losses.back().upload();
  }
  for (MirroredBuffer& loss : losses) {
    kernels::accumulate(host, DType::fp64, total.host.data(), loss.host.data(), 1);
    kernels::accumulate(*cuda, DType::fp64, total.device_data(), loss.device_data(), 1);
  }
  total.download();
  EXPECT_TRUE(same_bits(total, DType::fp64, "accumulated fp64 scalar"));
  EXPECT_NEAR(*total.downloaded_data<double>(), 32.0, 1.0);  // the sum is there at all
}

TEST_F(CudaElementwise, ScaleGivesTheHostBits) {
  for (DType dtype : kFloatingDtypes) {
    for (double factor : {0.5, 1.0 / 3.0, -2.5, 0.0}) {
      for (std::int64_t count : kSizes) {
        const std::string what = "scale " + describe(dtype, count) + " by " + std::to_string(factor);
        SCOPED_TRACE(what);
        MirroredBuffer data = uniform_buffer(dtype, count, -3.0, 3.0, 5, *cuda);
        kernels::scale(host, dtype, data.host.data(), count, factor);
        kernels::scale(*cuda, dtype, data.device_data(), count, factor);
        data.download();
        EXPECT_TRUE(same_bits(data, dtype, what));
      }
    }
  }
}

TEST_F(CudaElementwise, ScaleCoversMoreElementsThanOneGrid) {
  // More elements than the largest grid has threads (grid_blocks caps it at 65535 * 4 blocks of 256):
  // the grid-stride loop must come round again.
  constexpr std::int64_t kCount = std::int64_t{65535} * 4 * 256 + 1001;
  MirroredBuffer data = uniform_buffer(DType::fp16, kCount, -3.0, 3.0, 6, *cuda);
  kernels::scale(host, DType::fp16, data.host.data(), kCount, 1.0 / 3.0);
  kernels::scale(*cuda, DType::fp16, data.device_data(), kCount, 1.0 / 3.0);
  data.download();
  EXPECT_TRUE(same_bits(data, DType::fp16, "scale of " + std::to_string(kCount) + " fp16 elements"));
}

// ---- activations ------------------------------------------------------------------------------

constexpr kernels::Activation kActivations[] = {kernels::Activation::gelu, kernels::Activation::relu,
                                                kernels::Activation::tanh};

const char* activation_name(kernels::Activation activation) {
  switch (activation) {
    case kernels::Activation::gelu:
      return "gelu";
    case kernels::Activation::relu:
      return "relu";
    case kernels::Activation::tanh:
      return "tanh";
  }
  return "?";
}

/// ReLU is exact; GELU and tanh use CUDA's tanh (a few ulps of the compute type from the host's),
/// which the defaults cover with a wide margin; a 16-bit result may round the other way (one ulp).
Tolerance activation_tolerance(kernels::Activation activation, DType dtype) {
  if (activation == kernels::Activation::relu) return {};
  return default_tolerance(dtype);
}

TEST_F(CudaElementwise, ActivationForwardMatchesTheHost) {
  for (kernels::Activation activation : kActivations) {
    for (DType dtype : kFloatingDtypes) {
      for (std::int64_t count : kSizes) {
        const std::string what =
            std::string(activation_name(activation)) + " forward " + describe(dtype, count);
        SCOPED_TRACE(what);
        // [-12, 12]: both saturated tails and the curved middle.
        MirroredBuffer input = uniform_buffer(dtype, count, -12.0, 12.0, 7, *cuda);
        MirroredBuffer output = garbage_buffer(bytes_of(dtype, count), *cuda);
        kernels::activation_forward(host, dtype, activation, input.host.data(), output.host.data(), count);
        kernels::activation_forward(*cuda, dtype, activation, input.device_data(), output.device_data(),
                                    count);
        output.download();
        EXPECT_TRUE(all_close(output, dtype, activation_tolerance(activation, dtype), what));
        if (activation == kernels::Activation::relu) {
          EXPECT_TRUE(same_bits(output, dtype, what));
        }
      }
    }
  }
}

TEST_F(CudaElementwise, ActivationBackwardMatchesTheHost) {
  for (kernels::Activation activation : kActivations) {
    for (DType dtype : kFloatingDtypes) {
      for (std::int64_t count : kSizes) {
        const std::string what =
            std::string(activation_name(activation)) + " backward " + describe(dtype, count);
        SCOPED_TRACE(what);
        MirroredBuffer input = uniform_buffer(dtype, count, -12.0, 12.0, 8, *cuda);
        MirroredBuffer grad_output = uniform_buffer(dtype, count, -1.0, 1.0, 9, *cuda);
        MirroredBuffer grad_input = garbage_buffer(bytes_of(dtype, count), *cuda);
        kernels::activation_backward(host, dtype, activation, input.host.data(), grad_output.host.data(),
                                     grad_input.host.data(), count);
        kernels::activation_backward(*cuda, dtype, activation, input.device_data(), grad_output.device_data(),
                                     grad_input.device_data(), count);
        grad_input.download();
        EXPECT_TRUE(all_close(grad_input, dtype, activation_tolerance(activation, dtype), what));
        if (activation == kernels::Activation::relu) {
          EXPECT_TRUE(same_bits(grad_input, dtype, what));
        }
      }
    }
  }
}

// ---- dropout ----------------------------------------------------------------------------------

TEST_F(CudaElementwise, DropoutMasksAreDropoutKeepsAndValuesAreTheHostBits) {
  struct Key {
    std::uint64_t seed, mask_stream;
  };
  for (double p : {0.0, 0.1, 0.5, 0.9}) {
    for (const Key& key : {Key{1234, 0}, Key{0xfedcba9876543210ull, 7}}) {
      for (DType dtype : kFloatingDtypes) {
        for (std::int64_t count : kSizes) {
          const std::string what = "dropout p " + std::to_string(p) + " " + describe(dtype, count) +
                                   " seed " + std::to_string(key.seed) + " stream " +
                                   std::to_string(key.mask_stream);
          SCOPED_TRACE(what);
          // Inputs in [0.5, 1.5): never zero, so a zero output means exactly "dropped".
          MirroredBuffer input = uniform_buffer(dtype, count, 0.5, 1.5, 10, *cuda);
          MirroredBuffer output = garbage_buffer(bytes_of(dtype, count), *cuda);
          kernels::dropout_forward(host, dtype, input.host.data(), output.host.data(), count, p, key.seed,
                                   key.mask_stream);
          kernels::dropout_forward(*cuda, dtype, input.device_data(), output.device_data(), count, p,
                                   key.seed, key.mask_stream);
          output.download();
          EXPECT_TRUE(same_bits(output, dtype, what + " forward"));
          std::int64_t mask_mismatches = 0, kept = 0;
          for (std::int64_t i = 0; i < count; ++i) {
            const bool cuda_kept =
                element_as_double(output.downloaded.data(), dtype, static_cast<std::size_t>(i)) != 0;
            kept += cuda_kept;
            mask_mismatches += cuda_kept != kernels::dropout_keeps(key.seed, key.mask_stream, i, p);
          }
          EXPECT_EQ(mask_mismatches, 0) << what << ": CUDA mask differs from dropout_keeps";
          if (count >= 4099) {  // the mask is random at all: the kept fraction is near 1 - p
            EXPECT_NEAR(static_cast<double>(kept) / static_cast<double>(count), 1.0 - p, 0.05) << what;
          }

          // Backward: the same mask and scale on the gradient.
          MirroredBuffer grad_output = uniform_buffer(dtype, count, -1.0, 1.0, 12, *cuda);
          MirroredBuffer grad_input = garbage_buffer(bytes_of(dtype, count), *cuda);
          kernels::dropout_backward(host, dtype, grad_output.host.data(), grad_input.host.data(), count, p,
                                    key.seed, key.mask_stream);
          kernels::dropout_backward(*cuda, dtype, grad_output.device_data(), grad_input.device_data(), count,
                                    p, key.seed, key.mask_stream);
          grad_input.download();
          EXPECT_TRUE(same_bits(grad_input, dtype, what + " backward"));
        }
      }
    }
  }
}

TEST_F(CudaElementwise, DropoutRejectsAProbabilityOfOneAsTheHostDoes) {
  MirroredBuffer data(bytes_of(DType::fp32, 8), *cuda);
  const std::string message = zt::testing::error_of([&] {
    kernels::dropout_forward(*cuda, DType::fp32, data.device_data(), data.device_data(), 8, 1.0, 1, 0);
  });
  EXPECT_NE(message.find("dropout probability must lie in [0, 1)"), std::string::npos) << message;
}

}  // namespace
