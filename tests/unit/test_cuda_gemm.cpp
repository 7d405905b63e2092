// The CUDA GEMMs (kernels/cuda/gemm.cu, cuBLASLt) against the host kernels: matmul_forward,
// matmul_backward and matmul_weight_grad_rows on the same inputs, every floating dtype, shapes from
// 1x1x1 to GPT-2's MLP (1024 x 768 x 2304) and odd ones whose leading dimensions break 16-byte
// alignment, null bias and null gradients, accumulation over calls, streamed weight rows against the
// full weight gradient, and TF32. Without a usable GPU every test skips saying why.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cuda_kernel_checks.hpp"
#include "kernels/nn_kernels.hpp"
#include "zerotrain/build_info.hpp"
#include "zerotrain/device.hpp"
#include "zerotrain/dtype.hpp"
#if ZT_HAVE_CUDA
#include "kernels/cuda/gemm.hpp"
#endif

namespace {

using zt::DType;
using zt::kernels::MatmulShape;
using zt::testing::all_close;
using zt::testing::MirroredBuffer;
using zt::testing::Tolerance;

constexpr DType kDtypes[] = {DType::fp32, DType::fp64, DType::bf16, DType::fp16};

/// 1x1x1; odd sizes (no multiple of a warp or a tile; 16-bit rows of 33 or 65 elements are not 16-byte
/// aligned); rows not a multiple of 8 with aligned features; GPT-2 small's MLP up-projection.
const std::vector<MatmulShape> kShapes = {
    {1, 1, 1}, {7, 33, 65}, {37, 64, 96}, {13, 24, 40}, {1024, 768, 2304},
};

std::string describe(const MatmulShape& shape, DType dtype) {
  return std::to_string(shape.rows) + "x" + std::to_string(shape.in_features) + "x" +
         std::to_string(shape.out_features) + " " + std::string(zt::dtype_name(dtype));
}

/// The per-dtype tolerance, its absolute part grown with the square root of the reduction length (the
/// two sides sum `reduction` products in different orders; rounding errors grow as a random walk).
Tolerance gemm_tolerance(DType dtype, std::int64_t reduction) {
  Tolerance tolerance = zt::testing::default_tolerance(dtype);
  tolerance.absolute *= std::sqrt(static_cast<double>(std::max<std::int64_t>(reduction, 1)));
  return tolerance;
}

/// TF32 keeps 10 mantissa bits of each fp32 input (relative 2^-11 rounded, 2^-10 truncated) before the
/// fp32 accumulation: each product is off by up to about 2e-3 relative, a random walk over the reduction.
Tolerance tf32_tolerance(std::int64_t reduction) {
  return {5e-3 * std::sqrt(static_cast<double>(std::max<std::int64_t>(reduction, 1))), 5e-3};
}

/// A buffer of `count` elements of `dtype` with uniform values in [-1, 1), on the host and the device.
MirroredBuffer make_operand(std::int64_t count, DType dtype, std::uint64_t seed, const zt::Stream& stream) {
  MirroredBuffer buffer(static_cast<std::size_t>(count) * zt::dtype_size(dtype), stream);
  zt::testing::fill_uniform(buffer.host.data(), dtype, static_cast<std::size_t>(count), -1.0, 1.0, seed);
  buffer.upload();
  return buffer;
}

/// The operands of one Linear layer: inputs and gradients (both with nonzero starting values, so that
/// overwrite and accumulate semantics show).
struct LinearOperands {
  LinearOperands(const MatmulShape& shape, DType dtype, const zt::Stream& stream)
      : input(make_operand(shape.rows * shape.in_features, dtype, 1, stream)),
        weight(make_operand(shape.out_features * shape.in_features, dtype, 2, stream)),
        bias(make_operand(shape.out_features, dtype, 3, stream)),
        output(make_operand(shape.rows * shape.out_features, dtype, 4, stream)),
        grad_output(make_operand(shape.rows * shape.out_features, dtype, 5, stream)),
        grad_input(make_operand(shape.rows * shape.in_features, dtype, 6, stream)),
        grad_weight(make_operand(shape.out_features * shape.in_features, dtype, 7, stream)),
        grad_bias(make_operand(shape.out_features, dtype, 8, stream)) {}
  MirroredBuffer input, weight, bias, output, grad_output, grad_input, grad_weight, grad_bias;
};

class CudaGemm : public ::testing::Test {
 protected:
  zt::Stream host_stream;
  std::unique_ptr<zt::Stream> cuda_stream;
  void SetUp() override {
    if (zt::cuda_status().usable()) cuda_stream = std::make_unique<zt::Stream>(zt::Device::cuda(0));
  }
  void TearDown() override {
#if ZT_HAVE_CUDA
    if (zt::cuda_status().usable()) zt::kernels::cuda::set_tf32_enabled(false);
#endif
  }

  /// Forward on both sides (bias or not); compares the output.
  void check_forward(const MatmulShape& shape, DType dtype, bool with_bias, Tolerance tolerance) {
    LinearOperands x(shape, dtype, *cuda_stream);
    zt::kernels::matmul_forward(host_stream, dtype, x.input.host.data(), x.weight.host.data(),
                                with_bias ? x.bias.host.data() : nullptr, x.output.host.data(), shape);
    zt::kernels::matmul_forward(*cuda_stream, dtype, x.input.device_data(), x.weight.device_data(),
                                with_bias ? x.bias.device_data() : nullptr, x.output.device_data(), shape);
    x.output.download();
    EXPECT_TRUE(
        all_close(x.output, dtype, tolerance,
                  "matmul_forward " + describe(shape, dtype) + (with_bias ? " with bias" : " no bias")));
  }

  /// Backward on both sides with the gradients chosen by the flags (others null), `calls` times in a
  /// row (the weight and bias gradients accumulate); compares every gradient, the unchosen ones
  /// unchanged.
  void check_backward(const MatmulShape& shape, DType dtype, bool want_input, bool want_weight,
                      bool want_bias, int calls) {
    LinearOperands x(shape, dtype, *cuda_stream);
    for (int call = 0; call < calls; ++call) {
      zt::kernels::matmul_backward(host_stream, dtype, x.grad_output.host.data(), x.input.host.data(),
                                   x.weight.host.data(), want_input ? x.grad_input.host.data() : nullptr,
                                   want_weight ? x.grad_weight.host.data() : nullptr,
                                   want_bias ? x.grad_bias.host.data() : nullptr, shape);
      zt::kernels::matmul_backward(*cuda_stream, dtype, x.grad_output.device_data(), x.input.device_data(),
                                   x.weight.device_data(), want_input ? x.grad_input.device_data() : nullptr,
                                   want_weight ? x.grad_weight.device_data() : nullptr,
                                   want_bias ? x.grad_bias.device_data() : nullptr, shape);
    }
    const std::string what = "matmul_backward " + describe(shape, dtype) + " x" + std::to_string(calls);
    x.grad_input.download();
    x.grad_weight.download();
    x.grad_bias.download();
    // Untouched buffers stay bitwise as uploaded (the host side is untouched too: tolerance 0).
    EXPECT_TRUE(all_close(x.grad_input, dtype,
                          want_input ? gemm_tolerance(dtype, shape.out_features) : Tolerance{},
                          what + " grad_input"));
    EXPECT_TRUE(all_close(x.grad_weight, dtype,
                          want_weight ? gemm_tolerance(dtype, shape.rows * calls) : Tolerance{},
                          what + " grad_weight"));
    EXPECT_TRUE(all_close(x.grad_bias, dtype,
                          want_bias ? gemm_tolerance(dtype, shape.rows * calls) : Tolerance{},
                          what + " grad_bias"));
  }
};

TEST_F(CudaGemm, ForwardMatchesHost) {
  ZT_REQUIRE_GPU();
  for (DType dtype : kDtypes) {
    for (const MatmulShape& shape : kShapes) {
      for (bool with_bias : {true, false}) {
        check_forward(shape, dtype, with_bias, gemm_tolerance(dtype, shape.in_features));
      }
    }
  }
}

TEST_F(CudaGemm, BackwardMatchesHost) {
  ZT_REQUIRE_GPU();
  for (DType dtype : kDtypes) {
    for (const MatmulShape& shape : kShapes) check_backward(shape, dtype, true, true, true, 1);
  }
}

TEST_F(CudaGemm, NullGradientsAreSkipped) {
  ZT_REQUIRE_GPU();
  for (DType dtype : kDtypes) {
    for (const MatmulShape& shape : {MatmulShape{7, 33, 65}, MatmulShape{37, 64, 96}}) {
      check_backward(shape, dtype, true, false, false, 1);
      check_backward(shape, dtype, false, true, false, 1);
      check_backward(shape, dtype, false, false, true, 1);
      check_backward(shape, dtype, false, true, true, 1);
      check_backward(shape, dtype, false, false, false, 1);
    }
  }
}

TEST_F(CudaGemm, GradientsAccumulateOverCalls) {
  ZT_REQUIRE_GPU();
  for (DType dtype : kDtypes) {
    for (const MatmulShape& shape : {MatmulShape{7, 33, 65}, MatmulShape{37, 64, 96}}) {
      check_backward(shape, dtype, true, true, true, 3);
    }
  }
}

TEST_F(CudaGemm, EmptyBatchChangesNothing) {
  ZT_REQUIRE_GPU();
  for (DType dtype : kDtypes) check_backward(MatmulShape{0, 33, 65}, dtype, true, true, true, 1);
}

/// Weight rows [first_out, first_out + count): against the host's rows and against the same rows of the
/// CUDA matmul_backward's full grad_weight, from the same starting values.
TEST_F(CudaGemm, WeightGradRowsAreTheFullGradientsRows) {
  ZT_REQUIRE_GPU();
  struct RowsCase {
    MatmulShape shape;
    std::int64_t first_out, count;
  };
  // Odd starts put grad_output's column offset off 16-byte alignment; empty and whole ranges too.
  const RowsCase cases[] = {{{7, 33, 65}, 3, 5},           {{7, 33, 65}, 0, 65},  {{37, 64, 96}, 1, 3},
                            {{37, 64, 96}, 93, 3},         {{37, 64, 96}, 10, 0}, {{1, 1, 1}, 0, 1},
                            {{1024, 768, 2304}, 1031, 257}};
  for (DType dtype : kDtypes) {
    for (const RowsCase& rows_case : cases) {
      const MatmulShape& shape = rows_case.shape;
      const std::int64_t in = shape.in_features;
      const std::string what = "matmul_weight_grad_rows " + describe(shape, dtype) + " rows [" +
                               std::to_string(rows_case.first_out) + ", " +
                               std::to_string(rows_case.first_out + rows_case.count) + ")";
      LinearOperands x(shape, dtype, *cuda_stream);
      // The rows start as the full gradient's rows do.
      const std::size_t row_bytes = static_cast<std::size_t>(in) * zt::dtype_size(dtype);
      MirroredBuffer rows(static_cast<std::size_t>(rows_case.count) * row_bytes, *cuda_stream);
      if (rows.host.size() > 0) {
        std::memcpy(rows.host.data(), x.grad_weight.host.as<std::byte>() + rows_case.first_out * row_bytes,
                    rows.host.size());
      }
      rows.upload();
      zt::kernels::matmul_weight_grad_rows(host_stream, dtype, x.grad_output.host.data(), x.input.host.data(),
                                           rows.host.data(), shape, rows_case.first_out, rows_case.count);
      zt::kernels::matmul_weight_grad_rows(*cuda_stream, dtype, x.grad_output.device_data(),
                                           x.input.device_data(), rows.device_data(), shape,
                                           rows_case.first_out, rows_case.count);
      rows.download();
      EXPECT_TRUE(all_close(rows, dtype, gemm_tolerance(dtype, shape.rows), what + " vs host"));

      zt::kernels::matmul_backward(*cuda_stream, dtype, x.grad_output.device_data(), x.input.device_data(),
                                   x.weight.device_data(), nullptr, x.grad_weight.device_data(), nullptr,
                                   shape);
      x.grad_weight.download();
      const std::size_t count = static_cast<std::size_t>(rows_case.count * in);
      EXPECT_TRUE(all_close(x.grad_weight.downloaded_data<std::byte>() + rows_case.first_out * row_bytes,
                            rows.downloaded_data<std::byte>(), dtype, count,
                            gemm_tolerance(dtype, shape.rows),
                            what + " vs matmul_backward's grad_weight rows (host: full, cuda: rows)"));
    }
  }
}

TEST_F(CudaGemm, WeightGradRowsRejectsRowsOutsideTheWeight) {
  ZT_REQUIRE_GPU();
  const MatmulShape shape{7, 33, 65};
  LinearOperands x(shape, DType::fp32, *cuda_stream);
  try {
    zt::kernels::matmul_weight_grad_rows(*cuda_stream, DType::fp32, x.grad_output.device_data(),
                                         x.input.device_data(), x.grad_weight.device_data(), shape, 60, 6);
    FAIL() << "rows [60, 66) of a weight with 65 output features were accepted";
  } catch (const zt::Error& error) {
    EXPECT_NE(std::string(error.what()).find("rows [60, 66) of a weight with 65 output features"),
              std::string::npos)
        << error.what();
  }
}

/// The same GEMMs (shape, dtype, bias or not) with every operand at an aligned address, then one element
/// off it, then aligned again: each distinct alignment must get its own cached cuBLASLt plan (an
/// algorithm chosen for 256-byte operands faults or misreads on 2-byte ones), and the fused bias too.
TEST_F(CudaGemm, CachedPlansFollowTheOperandsAlignment) {
  ZT_REQUIRE_GPU();
  const MatmulShape shape{37, 64, 96};
  const auto [rows, in, out] = shape;
  for (DType dtype : kDtypes) {
    for (std::int64_t offset : {std::int64_t{0}, std::int64_t{1}, std::int64_t{0}}) {
      const std::string what = describe(shape, dtype) + " operands " + std::to_string(offset) +
                               " element(s) past an aligned address";
      // One element more than needed, so that the operands can start one element in.
      MirroredBuffer input = make_operand(rows * in + 1, dtype, 11, *cuda_stream);
      MirroredBuffer weight = make_operand(out * in + 1, dtype, 12, *cuda_stream);
      MirroredBuffer bias = make_operand(out + 1, dtype, 13, *cuda_stream);
      MirroredBuffer output = make_operand(rows * out + 1, dtype, 14, *cuda_stream);
      MirroredBuffer grad_output = make_operand(rows * out + 1, dtype, 15, *cuda_stream);
      MirroredBuffer grad_weight = make_operand(out * in + 1, dtype, 16, *cuda_stream);
      const std::size_t shift = static_cast<std::size_t>(offset) * zt::dtype_size(dtype);
      const auto host_at = [&](MirroredBuffer& buffer) { return buffer.host.as<std::byte>() + shift; };
      const auto device_at = [&](MirroredBuffer& buffer) {
        return static_cast<std::byte*>(buffer.device_data()) + shift;
      };
      zt::kernels::matmul_forward(host_stream, dtype, host_at(input), host_at(weight), host_at(bias),
                                  host_at(output), shape);
      zt::kernels::matmul_forward(*cuda_stream, dtype, device_at(input), device_at(weight), device_at(bias),
                                  device_at(output), shape);
      zt::kernels::matmul_backward(host_stream, dtype, host_at(grad_output), host_at(input), host_at(weight),
                                   nullptr, host_at(grad_weight), nullptr, shape);
      zt::kernels::matmul_backward(*cuda_stream, dtype, device_at(grad_output), device_at(input),
                                   device_at(weight), nullptr, device_at(grad_weight), nullptr, shape);
      output.download();
      grad_weight.download();
      // The element before the operands (offset 1) is untouched on both sides: compared too.
      EXPECT_TRUE(all_close(output, dtype, gemm_tolerance(dtype, in), "matmul_forward " + what));
      EXPECT_TRUE(all_close(grad_weight, dtype, gemm_tolerance(dtype, rows), "matmul_backward " + what));
    }
  }
}

#if ZT_HAVE_CUDA
TEST_F(CudaGemm, Tf32MatchesHostWithinTf32Rounding) {
  ZT_REQUIRE_GPU();
  zt::kernels::cuda::set_tf32_enabled(true);
  ASSERT_TRUE(zt::kernels::cuda::tf32_enabled());
  for (const MatmulShape& shape : kShapes) {
    check_forward(shape, DType::fp32, true, tf32_tolerance(shape.in_features));
  }
  // Backward in TF32 too, with its tolerance: one large shape through the same comparison.
  const MatmulShape shape{1024, 768, 2304};
  LinearOperands x(shape, DType::fp32, *cuda_stream);
  zt::kernels::matmul_backward(host_stream, DType::fp32, x.grad_output.host.data(), x.input.host.data(),
                               x.weight.host.data(), x.grad_input.host.data(), x.grad_weight.host.data(),
                               nullptr, shape);
  zt::kernels::matmul_backward(*cuda_stream, DType::fp32, x.grad_output.device_data(), x.input.device_data(),
                               x.weight.device_data(), x.grad_input.device_data(),
                               x.grad_weight.device_data(), nullptr, shape);
  x.grad_input.download();
  x.grad_weight.download();
  EXPECT_TRUE(all_close(x.grad_input, DType::fp32, tf32_tolerance(shape.out_features), "TF32 grad_input"));
  EXPECT_TRUE(all_close(x.grad_weight, DType::fp32, tf32_tolerance(shape.rows), "TF32 grad_weight"));
  zt::kernels::cuda::set_tf32_enabled(false);
  EXPECT_FALSE(zt::kernels::cuda::tf32_enabled());
}
#endif

TEST_F(CudaGemm, AStreamsWorkspaceIsCountedAndGoesWithTheStream) {
  // cuBLASLt's 32 MiB per stream: device workspace memory while the stream lives, freed with it.
  ZT_REQUIRE_GPU();
  const auto workspace_bytes = [] {
    return zt::memory_snapshot(zt::DeviceType::cuda)[zt::MemoryCategory::workspace].current;
  };
  const std::size_t before = workspace_bytes();
  {
    const zt::Stream stream(zt::Device::cuda(0));
    const MatmulShape shape{8, 16, 24};
    LinearOperands x(shape, DType::fp32, stream);
    zt::kernels::matmul_forward(stream, DType::fp32, x.input.device_data(), x.weight.device_data(), nullptr,
                                x.output.device_data(), shape);
    stream.synchronize();
    EXPECT_EQ(workspace_bytes(), before + (std::size_t{32} << 20)) << "the stream's workspace";
    zt::kernels::matmul_forward(stream, DType::fp32, x.input.device_data(), x.weight.device_data(), nullptr,
                                x.output.device_data(), shape);
    EXPECT_EQ(workspace_bytes(), before + (std::size_t{32} << 20)) << "one per stream, kept while it lives";
  }
  EXPECT_EQ(workspace_bytes(), before) << "the destroyed stream's workspace was kept";
}

TEST_F(CudaGemm, RepeatsItsBits) {
  ZT_REQUIRE_GPU();
  // The same GEMM twice (the second from the cached plan) gives the same bits: deterministic.
  for (DType dtype : kDtypes) {
    const MatmulShape shape{1024, 768, 2304};
    LinearOperands x(shape, dtype, *cuda_stream);
    MirroredBuffer first(x.grad_weight.device.size(), *cuda_stream);
    for (MirroredBuffer* target : {&x.grad_weight, &first}) {
      zt::zero_bytes(target->device_data(), target->device.device(), target->device.size(),
                     cuda_stream.get());
    }
    zt::kernels::matmul_backward(*cuda_stream, dtype, x.grad_output.device_data(), x.input.device_data(),
                                 x.weight.device_data(), nullptr, first.device_data(), nullptr, shape);
    zt::kernels::matmul_backward(*cuda_stream, dtype, x.grad_output.device_data(), x.input.device_data(),
                                 x.weight.device_data(), nullptr, x.grad_weight.device_data(), nullptr,
                                 shape);
    first.download();
    x.grad_weight.download();
    EXPECT_TRUE(all_close(first.downloaded.data(), x.grad_weight.downloaded.data(), dtype,
                          first.downloaded.size() / zt::dtype_size(dtype), Tolerance{},
                          "matmul_backward grad_weight twice " + describe(shape, dtype)));
  }
}

}  // namespace
