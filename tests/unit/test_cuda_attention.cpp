// Our CUDA causal self-attention (kernels/cuda/attention.cu, called directly: through the dispatcher
// cuDNN's fused attention takes the 16-bit calls it supports) against the host kernel on the same inputs:
// the forward's output and saved row log-sum-exps (stat dtype), and the backward's overwritten grad_qkv
// with both sides fed the host's qkv, output, log-sum-exps and grad_output; every floating dtype, odd
// sequence lengths and head sizes (including one that needs more than 48 KiB of shared memory in fp64).
// Also: the masked future does not leak (new keys and values after row t leave row t's output and
// log-sum-exp bit for bit), and run-to-run determinism. Skips without a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda_kernel_checks.hpp"
#include "kernels/nn_kernels.hpp"
#include "zerotrain/build_info.hpp"
#include "zerotrain/device.hpp"
#include "zerotrain/dtype.hpp"
#if ZT_HAVE_CUDA
#include "kernels/cuda/attention.hpp"
#endif

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

// Our kernel on `stream` (a CUDA stream), whatever cuDNN would take. Reached only with a usable GPU,
// so only in a build with CUDA.
void cuda_forward([[maybe_unused]] const Stream& stream, [[maybe_unused]] DType dtype,
                  [[maybe_unused]] const void* qkv, [[maybe_unused]] void* output,
                  [[maybe_unused]] void* row_logsumexp, [[maybe_unused]] const zk::AttentionShape& shape) {
#if ZT_HAVE_CUDA
  zk::cuda::attention_forward(dtype, qkv, output, row_logsumexp, shape, stream.native());
#else
  ADD_FAILURE() << "attention_forward on CUDA in a build without CUDA";
#endif
}

void cuda_backward([[maybe_unused]] const Stream& stream, [[maybe_unused]] DType dtype,
                   [[maybe_unused]] const void* grad_output, [[maybe_unused]] const void* qkv,
                   [[maybe_unused]] const void* output, [[maybe_unused]] const void* row_logsumexp,
                   [[maybe_unused]] void* grad_qkv, [[maybe_unused]] const zk::AttentionShape& shape) {
#if ZT_HAVE_CUDA
  zk::cuda::attention_backward(dtype, grad_output, qkv, output, row_logsumexp, grad_qkv, shape,
                               stream.native());
#else
  ADD_FAILURE() << "attention_backward on CUDA in a build without CUDA";
#endif
}

/// A mirrored buffer holding `source`'s host values on the host and on the device: the host's results
/// fed to both sides.
MirroredBuffer host_values(const MirroredBuffer& source, const Stream& stream) {
  MirroredBuffer copy(source.host.size(), stream);
  std::memcpy(copy.host.data(), source.host.data(), source.host.size());
  copy.upload();
  return copy;
}

std::vector<unsigned char> downloaded_bytes(const MirroredBuffer& buffer) {
  const auto* bytes = buffer.downloaded_data<unsigned char>();
  return {bytes, bytes + buffer.downloaded.size()};
}

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
      const std::int64_t query_rows = shape.batch * shape.n_head * shape.seq_len;
      MirroredBuffer qkv = uniform_buffer(dtype, tokens * 3 * channels, -1, 1, 1, cuda_stream);
      MirroredBuffer output = uniform_buffer(dtype, tokens * channels, 0, 1, 2, cuda_stream);  // overwritten
      MirroredBuffer logsumexp = uniform_buffer(stat, query_rows, 0, 1, 3, cuda_stream);       // overwritten
      zk::attention_forward(host_stream, dtype, qkv.host.data(), output.host.data(), logsumexp.host.data(),
                            shape);
      cuda_forward(cuda_stream, dtype, qkv.device_data(), output.device_data(), logsumexp.device_data(),
                   shape);
      cuda_stream.synchronize();
      output.download();
      logsumexp.download();
      EXPECT_TRUE(all_close(output, dtype, default_tolerance(dtype), "attention output " + name));
      EXPECT_TRUE(all_close(logsumexp, stat, default_tolerance(stat), "attention row_logsumexp " + name));

      // Backward from the host's output and log-sum-exps on both sides.
      MirroredBuffer saved_output = host_values(output, cuda_stream);
      MirroredBuffer saved_logsumexp = host_values(logsumexp, cuda_stream);
      MirroredBuffer grad_output = uniform_buffer(dtype, tokens * channels, -1, 1, 4, cuda_stream);
      MirroredBuffer grad_qkv =
          uniform_buffer(dtype, tokens * 3 * channels, 0, 1, 5, cuda_stream);  // overwritten
      zk::attention_backward(host_stream, dtype, grad_output.host.data(), qkv.host.data(),
                             saved_output.host.data(), saved_logsumexp.host.data(), grad_qkv.host.data(),
                             shape);
      cuda_backward(cuda_stream, dtype, grad_output.device_data(), qkv.device_data(),
                    saved_output.device_data(), saved_logsumexp.device_data(), grad_qkv.device_data(), shape);
      cuda_stream.synchronize();
      grad_qkv.download();
      EXPECT_TRUE(all_close(grad_qkv, dtype, default_tolerance(dtype), "attention grad_qkv " + name));
    }
  }
}

TEST(CudaAttention, MaskedFutureDoesNotLeak) {
  ZT_REQUIRE_GPU();
  const Stream cuda_stream(zt::Device::cuda(0));
  // Row 37 sits inside a query tile and a key tile, so the mask inside a staged tile is exercised.
  const zk::AttentionShape shape{2, 67, 2, 33};
  const std::int64_t last_kept = 37;
  for (const DType dtype : kFloatingTypes) {
    const DType stat = zk::stat_dtype(dtype);
    SCOPED_TRACE(shape_name(dtype, shape));
    const std::int64_t tokens = shape.batch * shape.seq_len, channels = shape.n_head * shape.head_dim;
    const std::size_t element = zt::dtype_size(dtype), stat_element = zt::dtype_size(stat);
    MirroredBuffer qkv = uniform_buffer(dtype, tokens * 3 * channels, -1, 1, 20, cuda_stream);
    MirroredBuffer output = uniform_buffer(dtype, tokens * channels, 0, 1, 21, cuda_stream);
    MirroredBuffer logsumexp =
        uniform_buffer(stat, shape.batch * shape.n_head * shape.seq_len, 0, 1, 22, cuda_stream);
    std::vector<unsigned char> outputs[2], logsumexps[2];
    for (int run = 0; run < 2; ++run) {
      if (run == 1) {
        // New keys and values (not queries) for every position after last_kept, in every batch.
        std::mt19937_64 engine(23);
        std::uniform_real_distribution<double> pick(-3, 3);
        for (std::int64_t b = 0; b < shape.batch; ++b) {
          for (std::int64_t t = last_kept + 1; t < shape.seq_len; ++t) {
            for (std::int64_t c = channels; c < 3 * channels; ++c) {
              const std::size_t i = static_cast<std::size_t>((b * shape.seq_len + t) * 3 * channels + c);
              zt::testing::store_as(qkv.host.data(), dtype, i, pick(engine));
            }
          }
        }
        qkv.upload();
      }
      cuda_forward(cuda_stream, dtype, qkv.device_data(), output.device_data(), logsumexp.device_data(),
                   shape);
      output.download();
      logsumexp.download();
      outputs[run] = downloaded_bytes(output);
      logsumexps[run] = downloaded_bytes(logsumexp);
    }
    std::int64_t leaked_rows = 0;
    for (std::int64_t b = 0; b < shape.batch; ++b) {
      const std::size_t first = static_cast<std::size_t>(b * shape.seq_len * channels) * element;
      const std::size_t kept = static_cast<std::size_t>((last_kept + 1) * channels) * element;
      if (std::memcmp(&outputs[0][first], &outputs[1][first], kept) != 0) ++leaked_rows;
      for (std::int64_t h = 0; h < shape.n_head; ++h) {
        const std::size_t row =
            static_cast<std::size_t>((b * shape.n_head + h) * shape.seq_len) * stat_element;
        const std::size_t kept_rows = static_cast<std::size_t>(last_kept + 1) * stat_element;
        if (std::memcmp(&logsumexps[0][row], &logsumexps[1][row], kept_rows) != 0) ++leaked_rows;
      }
    }
    EXPECT_EQ(leaked_rows, 0) << "keys or values after position " << last_kept
                              << " changed the output or log-sum-exp of a row at or before it";
    // The new keys and values do reach the first row allowed to see them.
    const std::size_t next_row = static_cast<std::size_t>((last_kept + 1) * channels) * element;
    const std::size_t row_bytes = static_cast<std::size_t>(channels) * element;
    EXPECT_NE(std::memcmp(&outputs[0][next_row], &outputs[1][next_row], row_bytes), 0)
        << "output row " << last_kept + 1 << " did not change with its own key and value";
  }
}

TEST(CudaAttention, NoBatchDoesNothing) {
  ZT_REQUIRE_GPU();
  const Stream cuda_stream(zt::Device::cuda(0));
  const zk::AttentionShape shape{0, 1024, 12, 64};
  for (const DType dtype : kFloatingTypes) {
    SCOPED_TRACE(zt::dtype_name(dtype));
    EXPECT_NO_THROW(cuda_forward(cuda_stream, dtype, nullptr, nullptr, nullptr, shape));
    EXPECT_NO_THROW(cuda_backward(cuda_stream, dtype, nullptr, nullptr, nullptr, nullptr, nullptr, shape));
  }
  EXPECT_NO_THROW(cuda_stream.synchronize());
}

TEST(CudaAttention, ForwardAndBackwardAreDeterministic) {
  ZT_REQUIRE_GPU();
  const Stream cuda_stream(zt::Device::cuda(0));
  const DType dtype = DType::fp32;
  const zk::AttentionShape shape{2, 129, 3, 64};
  const std::int64_t tokens = shape.batch * shape.seq_len, channels = shape.n_head * shape.head_dim;
  const std::int64_t query_rows = shape.batch * shape.n_head * shape.seq_len;
  MirroredBuffer qkv = uniform_buffer(dtype, tokens * 3 * channels, -1, 1, 10, cuda_stream);
  MirroredBuffer grad_output = uniform_buffer(dtype, tokens * channels, -1, 1, 13, cuda_stream);
  std::vector<std::vector<unsigned char>> outputs, logsumexps, grads;
  for (int run = 0; run < 2; ++run) {
    MirroredBuffer output = uniform_buffer(dtype, tokens * channels, 0, 1, 11 + run, cuda_stream);
    MirroredBuffer logsumexp = uniform_buffer(dtype, query_rows, 0, 1, 16 + run, cuda_stream);
    MirroredBuffer grad_qkv = uniform_buffer(dtype, tokens * 3 * channels, 0, 1, 14 + run, cuda_stream);
    cuda_forward(cuda_stream, dtype, qkv.device_data(), output.device_data(), logsumexp.device_data(), shape);
    cuda_backward(cuda_stream, dtype, grad_output.device_data(), qkv.device_data(), output.device_data(),
                  logsumexp.device_data(), grad_qkv.device_data(), shape);
    output.download();
    logsumexp.download();
    grad_qkv.download();
    outputs.push_back(downloaded_bytes(output));
    logsumexps.push_back(downloaded_bytes(logsumexp));
    grads.push_back(downloaded_bytes(grad_qkv));
  }
  EXPECT_TRUE(outputs[0] == outputs[1]) << "attention output differs between two identical CUDA runs";
  EXPECT_TRUE(logsumexps[0] == logsumexps[1])
      << "attention row_logsumexp differs between two identical CUDA runs";
  EXPECT_TRUE(grads[0] == grads[1]) << "attention grad_qkv differs between two identical CUDA runs";
}

}  // namespace
