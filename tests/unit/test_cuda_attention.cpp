// The CUDA causal self-attention (kernels/cuda/attention.cu) against the host kernel on the same
// inputs: the output, the saved probabilities (stat dtype, exactly zero above the diagonal) and the
// overwritten grad_qkv, every floating dtype, odd sequence lengths and head sizes (including one that
// needs more than 48 KiB of shared memory in fp64), and run-to-run determinism. Skips without a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_kernel_checks.hpp"
#include "kernels/nn_kernels.hpp"
#include "zerotrain/device.hpp"
#include "zerotrain/dtype.hpp"

namespace {

using zt::DType;
using zt::Stream;
using zt::testing::all_close;
using zt::testing::default_tolerance;
using zt::testing::MirroredBuffer;
using zt::testing::uniform_buffer;
namespace zk = zt::kernels;

constexpr DType kFloatingTypes[] = {DType::fp32, DType::fp64, DType::bf16, DType::fp16};

std::string shape_name(DType dtype, const zk::AttentionShape& shape) {
  return std::string(zt::dtype_name(dtype)) + " B" + std::to_string(shape.batch) + " T" +
         std::to_string(shape.seq_len) + " H" + std::to_string(shape.n_head) + " D" +
         std::to_string(shape.head_dim);
}

constexpr zk::AttentionShape kShapes[] = {
    {2, 1, 3, 8},     // one position: the softmax of a single score
    {1, 5, 1, 1},     // head_dim 1
    {1, 67, 2, 33},   // seq_len and head_dim not multiples of the tiles
    {2, 67, 4, 64},   // GPT-2's head size
    {1, 40, 1, 128},  // fp64: more than 48 KiB of shared memory per block
};

TEST(CudaAttention, ForwardAndBackwardMatchTheHost) {
  ZT_REQUIRE_GPU();
  const Stream host_stream;
  const Stream cuda_stream(zt::Device::cuda(0));
  for (const DType dtype : kFloatingTypes) {
    const DType stat = zk::stat_dtype(dtype);
    for (const zk::AttentionShape& shape : kShapes) {
      const std::string name = shape_name(dtype, shape);
      SCOPED_TRACE(name);
      const std::int64_t tokens = shape.batch * shape.seq_len, channels = shape.n_head * shape.head_dim;
      const std::int64_t probability_count = shape.batch * shape.n_head * shape.seq_len * shape.seq_len;
      MirroredBuffer qkv = uniform_buffer(dtype, tokens * 3 * channels, -1, 1, 1, cuda_stream);
      MirroredBuffer output = uniform_buffer(dtype, tokens * channels, 0, 1, 2, cuda_stream);  // overwritten
      MirroredBuffer probabilities = uniform_buffer(stat, probability_count, 0, 1, 3, cuda_stream);
      zk::attention_forward(host_stream, dtype, qkv.host.data(), output.host.data(),
                            probabilities.host.data(), shape);
      zk::attention_forward(cuda_stream, dtype, qkv.device_data(), output.device_data(),
                            probabilities.device_data(), shape);
      cuda_stream.synchronize();
      output.download();
      probabilities.download();
      EXPECT_TRUE(all_close(output, dtype, default_tolerance(dtype), "attention output " + name));
      EXPECT_TRUE(all_close(probabilities, stat, default_tolerance(stat), "attention probabilities " + name));
      std::int64_t nonzero_above_diagonal = 0;
      for (std::int64_t head = 0; head < shape.batch * shape.n_head; ++head) {
        for (std::int64_t t = 0; t < shape.seq_len; ++t) {
          for (std::int64_t s = t + 1; s < shape.seq_len; ++s) {
            const std::size_t i = static_cast<std::size_t>((head * shape.seq_len + t) * shape.seq_len + s);
            if (zt::testing::element_as_double(probabilities.downloaded.data(), stat, i) != 0.0)
              ++nonzero_above_diagonal;
          }
        }
      }
      EXPECT_EQ(nonzero_above_diagonal, 0) << "probabilities above the diagonal must be exactly 0";

      // Backward from the host's probabilities on both sides.
      MirroredBuffer saved = uniform_buffer(stat, probability_count, 0, 1, 0, cuda_stream);
      std::memcpy(saved.host.data(), probabilities.host.data(), probabilities.host.size());
      saved.upload();
      MirroredBuffer grad_output = uniform_buffer(dtype, tokens * channels, -1, 1, 4, cuda_stream);
      MirroredBuffer grad_qkv =
          uniform_buffer(dtype, tokens * 3 * channels, 0, 1, 5, cuda_stream);  // overwritten
      zk::attention_backward(host_stream, dtype, grad_output.host.data(), qkv.host.data(), saved.host.data(),
                             grad_qkv.host.data(), shape);
      zk::attention_backward(cuda_stream, dtype, grad_output.device_data(), qkv.device_data(),
                             saved.device_data(), grad_qkv.device_data(), shape);
      cuda_stream.synchronize();
      grad_qkv.download();
      EXPECT_TRUE(all_close(grad_qkv, dtype, default_tolerance(dtype), "attention grad_qkv " + name));
    }
  }
}

TEST(CudaAttention, NoBatchDoesNothing) {
  ZT_REQUIRE_GPU();
  const Stream cuda_stream(zt::Device::cuda(0));
  const zk::AttentionShape shape{0, 1024, 12, 64};
  EXPECT_NO_THROW(zk::attention_forward(cuda_stream, DType::fp32, nullptr, nullptr, nullptr, shape));
  EXPECT_NO_THROW(
      zk::attention_backward(cuda_stream, DType::fp32, nullptr, nullptr, nullptr, nullptr, shape));
  EXPECT_NO_THROW(cuda_stream.synchronize());
}

TEST(CudaAttention, BackwardIsDeterministic) {
  ZT_REQUIRE_GPU();
  const Stream cuda_stream(zt::Device::cuda(0));
  const DType dtype = DType::fp32;
  const zk::AttentionShape shape{2, 129, 3, 64};
  const std::int64_t tokens = shape.batch * shape.seq_len, channels = shape.n_head * shape.head_dim;
  const std::int64_t probability_count = shape.batch * shape.n_head * shape.seq_len * shape.seq_len;
  MirroredBuffer qkv = uniform_buffer(dtype, tokens * 3 * channels, -1, 1, 10, cuda_stream);
  MirroredBuffer output = uniform_buffer(dtype, tokens * channels, 0, 1, 11, cuda_stream);
  MirroredBuffer probabilities = uniform_buffer(dtype, probability_count, 0, 1, 12, cuda_stream);
  MirroredBuffer grad_output = uniform_buffer(dtype, tokens * channels, -1, 1, 13, cuda_stream);
  zk::attention_forward(cuda_stream, dtype, qkv.device_data(), output.device_data(),
                        probabilities.device_data(), shape);
  std::vector<std::vector<unsigned char>> runs;
  for (int run = 0; run < 2; ++run) {
    MirroredBuffer grad_qkv = uniform_buffer(dtype, tokens * 3 * channels, 0, 1, 14 + run, cuda_stream);
    zk::attention_backward(cuda_stream, dtype, grad_output.device_data(), qkv.device_data(),
                           probabilities.device_data(), grad_qkv.device_data(), shape);
    grad_qkv.download();
    const auto* bytes = grad_qkv.downloaded_data<unsigned char>();
    runs.emplace_back(bytes, bytes + grad_qkv.downloaded.size());
  }
  EXPECT_TRUE(runs[0] == runs[1]) << "attention grad_qkv differs between two identical CUDA runs";
}

}  // namespace
