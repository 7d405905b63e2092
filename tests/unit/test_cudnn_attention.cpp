// cuDNN's fused attention (kernels/cuda/cudnn_attention.cpp) against the host kernel: the forward's
// output and row log-sum-exps, and the backward's grad_qkv from the host forward's saved tensors, in bf16
// and fp16, for GPT-2's head_dim 64, sequence lengths that are not multiples of 64, several batches and
// heads, and head_dim 128; a cuDNN forward continued by our own kernel's backward (the contracts are
// interchangeable); the backward bitwise equal over two runs; calls cuDNN does not take (fp32, head_dim
// 12) returning false with nothing written. Without a GPU: attention_status() names the cuDNN version or
// why it is not used, the same refusals return false, and ZT_CUDNN_ATTENTION=0 turns it off.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "cuda_kernel_checks.hpp"
#include "kernels/nn_kernels.hpp"
#include "zerotrain/build_info.hpp"
#include "zerotrain/device.hpp"
#include "zerotrain/dtype.hpp"
#include "zerotrain/error.hpp"
#if ZT_HAVE_CUDA
#include "kernels/cuda/attention.hpp"
#include "kernels/cuda/cudnn_attention.hpp"
#endif

namespace {

#if ZT_HAVE_CUDA

using zt::DType;
namespace zk = zt::kernels;
namespace zts = zt::testing;
namespace dnn = zt::kernels::cuda::cudnn;

/// Sets (or, with nullopt, unsets) an environment variable for the scope; restores it after.
class ScopedEnvironment {
 public:
  ScopedEnvironment(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      setenv(name, value->c_str(), 1);
    else
      unsetenv(name);
  }
  ~ScopedEnvironment() {
    if (old_)
      setenv(name_, old_->c_str(), 1);
    else
      unsetenv(name_);
  }
  ScopedEnvironment(const ScopedEnvironment&) = delete;
  ScopedEnvironment& operator=(const ScopedEnvironment&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

std::string shape_name(DType dtype, const zk::AttentionShape& shape) {
  return std::string(zt::dtype_name(dtype)) + " B" + std::to_string(shape.batch) + " T" +
         std::to_string(shape.seq_len) + " H" + std::to_string(shape.n_head) + " D" +
         std::to_string(shape.head_dim);
}

// ---- without a GPU --------------------------------------------------------------------------------

TEST(CudnnAttentionStatus, NamesTheVersionOrWhyNot) {
  const ScopedEnvironment enabled("ZT_CUDNN_ATTENTION", std::nullopt);
  const std::string status = dnn::attention_status();
  ASSERT_FALSE(status.empty());
  const bool names_version = status.rfind("cuDNN ", 0) == 0;
  const bool says_why_not =
      status.find("libcudnn") != std::string::npos || status.rfind("not compiled: no cuDNN headers", 0) == 0;
  EXPECT_TRUE(names_version || says_why_not) << status;
  std::cout << "cuDNN attention: " << status << "\n";
}

// These return before anything touches a GPU (no pointer is read, the stream is not asked).
TEST(CudnnAttentionStatus, UnsupportedCallsReturnFalse) {
  const ScopedEnvironment enabled("ZT_CUDNN_ATTENTION", std::nullopt);
  const zk::AttentionShape gpt2{2, 64, 12, 64};
  for (const DType dtype : {DType::fp32, DType::fp64}) {
    EXPECT_FALSE(dnn::attention_forward(dtype, nullptr, nullptr, nullptr, gpt2, nullptr))
        << zt::dtype_name(dtype);
    EXPECT_FALSE(dnn::attention_backward(dtype, nullptr, nullptr, nullptr, nullptr, nullptr, gpt2, nullptr))
        << zt::dtype_name(dtype);
  }
  for (const std::int64_t head_dim : {12, 33, 136}) {
    const zk::AttentionShape odd{2, 64, 2, head_dim};
    EXPECT_FALSE(dnn::attention_forward(DType::bf16, nullptr, nullptr, nullptr, odd, nullptr)) << head_dim;
    EXPECT_FALSE(
        dnn::attention_backward(DType::fp16, nullptr, nullptr, nullptr, nullptr, nullptr, odd, nullptr))
        << head_dim;
  }
  const zk::AttentionShape no_batch{0, 64, 2, 64};
  EXPECT_FALSE(dnn::attention_forward(DType::bf16, nullptr, nullptr, nullptr, no_batch, nullptr));
  const zk::AttentionShape one_position{2, 1, 2, 64};  // cuDNN has no backward for T = 1
  EXPECT_FALSE(dnn::attention_backward(DType::bf16, nullptr, nullptr, nullptr, nullptr, nullptr, one_position,
                                       nullptr));
}

TEST(CudnnAttentionStatus, ZeroInTheEnvironmentTurnsItOff) {
  const ScopedEnvironment off("ZT_CUDNN_ATTENTION", "0");
  const zk::AttentionShape gpt2{2, 64, 12, 64};
  EXPECT_FALSE(dnn::attention_forward(DType::bf16, nullptr, nullptr, nullptr, gpt2, nullptr));
  EXPECT_FALSE(
      dnn::attention_backward(DType::fp16, nullptr, nullptr, nullptr, nullptr, nullptr, gpt2, nullptr));
  const std::string status = dnn::attention_status();
  if (status.rfind("cuDNN ", 0) == 0) {
    EXPECT_NE(status.find("ZT_CUDNN_ATTENTION=0"), std::string::npos) << status;
  }
}

TEST(CudnnAttentionStatus, AnotherValueInTheEnvironmentIsAnError) {
  if (dnn::attention_status().rfind("not compiled", 0) == 0) GTEST_SKIP() << dnn::attention_status();
  const ScopedEnvironment wrong("ZT_CUDNN_ATTENTION", "yes");
  const zk::AttentionShape gpt2{2, 64, 12, 64};
  EXPECT_THROW(dnn::attention_forward(DType::bf16, nullptr, nullptr, nullptr, gpt2, nullptr),
               zt::ConfigError);
  EXPECT_NE(dnn::attention_status().find("ZT_CUDNN_ATTENTION"), std::string::npos);
}

// ---- on a GPU -------------------------------------------------------------------------------------

/// First statement of a test that needs cuDNN to take calls: a GPU, and libcudnn loading (else skip,
/// naming why). Once it loads, a call it refuses fails the test (attention_status() says why).
#define ZT_REQUIRE_CUDNN()                                                                      \
  ZT_REQUIRE_GPU();                                                                             \
  const ScopedEnvironment zt_cudnn_enabled_("ZT_CUDNN_ATTENTION", std::nullopt);                \
  do {                                                                                          \
    const std::string zt_status_ = dnn::attention_status();                                     \
    if (zt_status_.rfind("cuDNN ", 0) != 0) GTEST_SKIP() << "cuDNN not usable: " << zt_status_; \
    if (!dnn::taken_directions().forward) GTEST_SKIP() << "cuDNN is not taken: " << zt_status_; \
  } while (0)
/// ZT_REQUIRE_CUDNN, and the loaded cuDNN's version is taken for the backward (9.16 or later).
#define ZT_REQUIRE_CUDNN_BACKWARD()      \
  ZT_REQUIRE_CUDNN();                    \
  if (!dnn::taken_directions().backward) \
  GTEST_SKIP() << "cuDNN's version is not taken for the backward: " << dnn::attention_status()

constexpr DType kTypes[] = {DType::bf16, DType::fp16};

constexpr zk::AttentionShape kShapes[] = {
    {2, 67, 4, 64},    // T not a multiple of 64, B * H = 8, GPT-2's head_dim
    {4, 256, 12, 64},  // GPT-2 small's 12 heads
    {3, 129, 2, 32},   // one past a multiple of 64
    {1, 40, 1, 128},   // head_dim 128
};

/// cuDNN rounds the probabilities to the 16-bit type before P V (the host keeps them in fp32) and sums
/// in another order: twice the CUDA kernels' tolerance.
zts::Tolerance output_tolerance(DType dtype) {
  const zts::Tolerance base = zts::default_tolerance(dtype);
  return {2 * base.absolute, 2 * base.relative};
}
/// The log-sum-exps are fp32 from fp32 scores on both sides: only the order of the sums differs.
constexpr zts::Tolerance kLogSumExpTolerance{1e-3, 1e-4};
/// The gradients sum over up to T rows of 16-bit rounded P and dS: the absolute part grows with sqrt(T).
zts::Tolerance grad_tolerance(DType dtype, std::int64_t seq_len) {
  const zts::Tolerance base = output_tolerance(dtype);
  return {base.absolute * std::sqrt(static_cast<double>(seq_len) / 16), base.relative};
}

struct Tensors {
  zts::MirroredBuffer qkv, output, logsumexp, grad_output, grad_qkv;
};

Tensors make_tensors(DType dtype, const zk::AttentionShape& shape, std::uint64_t seed,
                     const zt::Stream& stream) {
  const std::int64_t tokens = shape.batch * shape.seq_len, channels = shape.n_head * shape.head_dim;
  const std::size_t size = zt::dtype_size(dtype);
  return Tensors{
      zts::uniform_buffer(dtype, tokens * 3 * channels, -1, 1, seed, stream),
      zts::garbage_buffer(static_cast<std::size_t>(tokens * channels) * size, stream),
      zts::garbage_buffer(static_cast<std::size_t>(shape.batch * shape.n_head * shape.seq_len) * 4, stream),
      zts::uniform_buffer(dtype, tokens * channels, -1, 1, seed + 1, stream),
      zts::garbage_buffer(static_cast<std::size_t>(tokens * 3 * channels) * size, stream),
  };
}

TEST(CudnnAttention, ForwardAndBackwardMatchTheHost) {
  ZT_REQUIRE_CUDNN();
  // An older cuDNN (before 9.16) takes the forward only: it is checked, the backward reported skipped.
  const bool backward_taken = dnn::taken_directions().backward;
  const zt::Stream host_stream;
  const zt::Stream cuda_stream(zt::Device::cuda(0));
  for (const DType dtype : kTypes) {
    for (const zk::AttentionShape& shape : kShapes) {
      const std::string name = shape_name(dtype, shape);
      SCOPED_TRACE(name);
      Tensors t = make_tensors(dtype, shape, 7, cuda_stream);
      zk::attention_forward(host_stream, dtype, t.qkv.host.data(), t.output.host.data(),
                            t.logsumexp.host.data(), shape);
      ASSERT_TRUE(dnn::attention_forward(dtype, t.qkv.device_data(), t.output.device_data(),
                                         t.logsumexp.device_data(), shape, cuda_stream.native()))
          << "cuDNN refused " << name << ": " << dnn::attention_status();
      cuda_stream.synchronize();
      t.output.download();
      t.logsumexp.download();
      EXPECT_TRUE(zts::all_close(t.output, dtype, output_tolerance(dtype), "cuDNN attention output " + name));
      EXPECT_TRUE(
          zts::all_close(t.logsumexp, DType::fp32, kLogSumExpTolerance, "cuDNN attention lse " + name));

      if (!backward_taken) continue;
      // The backward from the host forward's saved tensors on both sides.
      t.output.upload();
      t.logsumexp.upload();
      zk::attention_backward(host_stream, dtype, t.grad_output.host.data(), t.qkv.host.data(),
                             t.output.host.data(), t.logsumexp.host.data(), t.grad_qkv.host.data(), shape);
      ASSERT_TRUE(dnn::attention_backward(dtype, t.grad_output.device_data(), t.qkv.device_data(),
                                          t.output.device_data(), t.logsumexp.device_data(),
                                          t.grad_qkv.device_data(), shape, cuda_stream.native()))
          << "cuDNN refused the backward of " << name << ": " << dnn::attention_status();
      cuda_stream.synchronize();
      t.grad_qkv.download();
      EXPECT_TRUE(zts::all_close(t.grad_qkv, dtype, grad_tolerance(dtype, shape.seq_len),
                                 "cuDNN attention grad_qkv " + name));
    }
  }
  if (!backward_taken)
    GTEST_SKIP() << "the forward matched; cuDNN's version is not taken for the backward: "
                 << dnn::attention_status();
}

/// `bytes` bytes at `device_data` (on the stream's device), copied to the host.
std::vector<unsigned char> download(const void* device_data, std::size_t bytes, const zt::Stream& stream) {
  std::vector<unsigned char> host(bytes);
  zt::copy_bytes(host.data(), zt::Device::host(), device_data, stream.device(), bytes, &stream);
  stream.synchronize();
  return host;
}

TEST(CudnnAttention, OurBackwardContinuesItsForward) {
  ZT_REQUIRE_CUDNN_BACKWARD();
  const zt::Stream cuda_stream(zt::Device::cuda(0));
  for (const DType dtype : kTypes) {
    const zk::AttentionShape shape{2, 67, 4, 64};
    const std::string name = shape_name(dtype, shape);
    SCOPED_TRACE(name);
    Tensors t = make_tensors(dtype, shape, 21, cuda_stream);
    ASSERT_TRUE(dnn::attention_forward(dtype, t.qkv.device_data(), t.output.device_data(),
                                       t.logsumexp.device_data(), shape, cuda_stream.native()))
        << dnn::attention_status();
    ASSERT_TRUE(dnn::attention_backward(dtype, t.grad_output.device_data(), t.qkv.device_data(),
                                        t.output.device_data(), t.logsumexp.device_data(),
                                        t.grad_qkv.device_data(), shape, cuda_stream.native()))
        << dnn::attention_status();
    const std::size_t bytes = t.grad_qkv.device.size();
    const std::vector<unsigned char> from_cudnn = download(t.grad_qkv.device_data(), bytes, cuda_stream);
    zt::kernels::cuda::attention_backward(dtype, t.grad_output.device_data(), t.qkv.device_data(),
                                          t.output.device_data(), t.logsumexp.device_data(),
                                          t.grad_qkv.device_data(), shape, cuda_stream.native());
    const std::vector<unsigned char> from_ours = download(t.grad_qkv.device_data(), bytes, cuda_stream);
    EXPECT_TRUE(zts::all_close(from_cudnn.data(), from_ours.data(), dtype, bytes / zt::dtype_size(dtype),
                               grad_tolerance(dtype, shape.seq_len),
                               "our backward after cuDNN's forward " + name));
  }
}

TEST(CudnnAttention, BackwardIsDeterministic) {
  ZT_REQUIRE_CUDNN_BACKWARD();
  const zt::Stream cuda_stream(zt::Device::cuda(0));
  const DType dtype = DType::bf16;
  const zk::AttentionShape shape{2, 129, 12, 64};
  Tensors t = make_tensors(dtype, shape, 33, cuda_stream);
  ASSERT_TRUE(dnn::attention_forward(dtype, t.qkv.device_data(), t.output.device_data(),
                                     t.logsumexp.device_data(), shape, cuda_stream.native()))
      << dnn::attention_status();
  std::vector<std::vector<unsigned char>> runs;
  for (int run = 0; run < 2; ++run) {
    zts::MirroredBuffer grad_qkv = zts::garbage_buffer(t.grad_qkv.device.size(), cuda_stream);
    ASSERT_TRUE(dnn::attention_backward(dtype, t.grad_output.device_data(), t.qkv.device_data(),
                                        t.output.device_data(), t.logsumexp.device_data(),
                                        grad_qkv.device_data(), shape, cuda_stream.native()))
        << dnn::attention_status();
    grad_qkv.download();
    const auto* bytes = grad_qkv.downloaded_data<unsigned char>();
    runs.emplace_back(bytes, bytes + grad_qkv.downloaded.size());
  }
  EXPECT_TRUE(runs[0] == runs[1]) << "cuDNN's attention grad_qkv differs between two identical runs";
}

TEST(CudnnAttention, RefusedCallsWriteNothing) {
  ZT_REQUIRE_GPU();
  const zt::Stream cuda_stream(zt::Device::cuda(0));
  for (const auto& [dtype, shape] : {std::pair{DType::fp32, zk::AttentionShape{2, 67, 4, 64}},
                                     std::pair{DType::bf16, zk::AttentionShape{2, 67, 4, 12}}}) {
    const std::string name = shape_name(dtype, shape);
    SCOPED_TRACE(name);
    Tensors t = make_tensors(dtype, shape, 45, cuda_stream);
    EXPECT_FALSE(dnn::attention_forward(dtype, t.qkv.device_data(), t.output.device_data(),
                                        t.logsumexp.device_data(), shape, cuda_stream.native()));
    EXPECT_FALSE(dnn::attention_backward(dtype, t.grad_output.device_data(), t.qkv.device_data(),
                                         t.output.device_data(), t.logsumexp.device_data(),
                                         t.grad_qkv.device_data(), shape, cuda_stream.native()));
    cuda_stream.synchronize();
    for (zts::MirroredBuffer* written : {&t.output, &t.logsumexp, &t.grad_qkv}) {
      written->download();
      EXPECT_EQ(std::memcmp(written->host.data(), written->downloaded.data(), written->host.size()), 0)
          << "a refused call wrote into a tensor";
    }
  }
}

#else

TEST(CudnnAttention, NeedsCuda) {
  GTEST_SKIP() << "built without CUDA";
}

#endif

}  // namespace
