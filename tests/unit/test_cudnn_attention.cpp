// cuDNN's fused attention (kernels/cuda/cudnn_attention.cpp) against the host kernel: the forward's
// output and row log-sum-exps, and the backward's grad_qkv from the host forward's saved tensors, in bf16
// and fp16, for GPT-2's head_dim 64, sequence lengths that are not multiples of 64, several batches and
// heads, and head_dim 128; a cuDNN forward continued by our own kernel's backward (the contracts are
// interchangeable); the backward bitwise equal over two runs; calls cuDNN does not take (fp32, head_dim
// 12) returning false with nothing written. Without a GPU: attention_status() names the cuDNN version or
// why it is not used, the same refusals return false, and ZT_CUDNN_ATTENTION=0 turns it off; and
// (CudnnGraphs, libcudnn only) cuDNN itself finalizes both graphs, and its engines take them on a
// described Hopper GPU and not on a described Volta.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
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

// cuDNN's device-properties JSON for a GPU of compute capability `major`.`minor` with the limits of an
// H100/H200 SXM (132 SMs; the per-SM and per-block limits of CUDA's compute capability 9.0 table; 50 MB
// of L2; 141 GB). Written from those published figures, not read from a device: cuDNN wants every key.
std::string hopper_like_device_json(int major, int minor) {
  nlohmann::json device = {
      {"deviceName", "zerotrain test: H200-like"},
      {"deviceVer", major * 100 + minor * 10},
      {"driverVer", 13000},
      {"cudaDeviceId", 0},
      {"pciDeviceId", 0},
      {"multiProcessorCount", 132},
      {"maxGridSize", {2147483647, 65535, 65535}},
      {"maxBlockSize", {1024, 1024, 64}},
      {"maxThreadsPerBlock", 1024},
      {"maxThreadsPerSM", 2048},
      {"maxCtasPerSM", 32},
      {"warpSize", 32},
      {"regsPerBlock", 65536},
      {"maxRegistersPerSM", 65536},
      {"maxSharedMemoryPerBlock", 49152},
      {"maxSharedMemoryPerBlockOptin", 232448},
      {"reservedSharedMemoryPerBlock", 1024},
      {"l2CacheSize", 52428800},
      {"totalGlobalMem", 150754820096},
      {"smClockRateKHz", 1980000},
      {"memClockRateKHz", 3201000},
      {"isTccDriver", 0},
      {"supportCoopLaunch", 1},
  };
  return device.dump();
}

/// The GPT-2 124M shape, the widest and the smallest head cuDNN takes, and odd extents.
const zk::AttentionShape kGraphShapes[] = {{4, 1024, 12, 64}, {2, 64, 2, 128}, {1, 2, 1, 8}, {3, 17, 5, 24}};

/// Whether the loaded cuDNN has device properties (9.8 and later), read from attention_status().
bool has_device_properties() {
  int major = 0, minor = 0;
  std::sscanf(dnn::attention_status().c_str(), "cuDNN %d.%d", &major, &minor);
  return major * 100 + minor >= 908;
}

#define ZT_REQUIRE_LIBCUDNN()                                                                      \
  do {                                                                                             \
    const std::string zt_status_ = dnn::attention_status();                                        \
    if (zt_status_.rfind("cuDNN ", 0) != 0) GTEST_SKIP() << "libcudnn not usable: " << zt_status_; \
  } while (0)

// cuDNN itself finalizes every tensor and operation descriptor of both graphs, and the operation
// graphs: the attribute types and counts, the matmuls' dimensions, the broadcasts and reductions are
// cuDNN's to accept. The counts pin the graphs: the forward's 14 operations, the backward's 21 (the top
// of kernels/cuda/cudnn_attention.cpp lists them).
TEST(CudnnGraphs, CudnnFinalizesBothGraphsWithoutAGpu) {
  ZT_REQUIRE_LIBCUDNN();
  for (const DType dtype : {DType::bf16, DType::fp16}) {
    for (const zk::AttentionShape& shape : kGraphShapes) {
      const dnn::GraphCheck check = dnn::check_graphs_without_device(dtype, shape);
      EXPECT_EQ(check.forward.operations, 14u) << shape_name(dtype, shape);
      EXPECT_EQ(check.backward.operations, 21u) << shape_name(dtype, shape);
    }
  }
  EXPECT_THROW(dnn::check_graphs_without_device(DType::fp32, kGraphShapes[0]), zt::Error);
}

// cuDNN's engines, asked about a described Hopper GPU, take both graphs: some engine passes its
// graph-pattern and shape checks for every shape and dtype and stops only at compiling its kernel,
// which needs the driver. Without this the GPU run would find our kernel running instead of cuDNN's.
// The same graphs on a described Volta (7.0), which cuDNN's fused attention does not support, find no
// engine: the check can fail.
TEST(CudnnGraphs, CudnnEnginesTakeBothGraphsOnADescribedHopperGpu) {
  ZT_REQUIRE_LIBCUDNN();
  if (!has_device_properties())
    GTEST_SKIP() << "device properties need cuDNN 9.8: " << dnn::attention_status();
  const std::string hopper = hopper_like_device_json(9, 0);
  for (const DType dtype : {DType::bf16, DType::fp16}) {
    for (const zk::AttentionShape& shape : kGraphShapes) {
      const dnn::GraphCheck check = dnn::check_graphs_without_device(dtype, shape, hopper);
      EXPECT_FALSE(check.forward.engines_taking.empty()) << "forward " << shape_name(dtype, shape);
      EXPECT_FALSE(check.backward.engines_taking.empty()) << "backward " << shape_name(dtype, shape);
      std::cout << shape_name(dtype, shape) << ": engines taking the forward:";
      for (const std::int64_t engine : check.forward.engines_taking) std::cout << " " << engine;
      std::cout << "; the backward:";
      for (const std::int64_t engine : check.backward.engines_taking) std::cout << " " << engine;
      std::cout << "\n";
    }
  }
  const dnn::GraphCheck volta =
      dnn::check_graphs_without_device(DType::bf16, kGraphShapes[0], hopper_like_device_json(7, 0));
  EXPECT_TRUE(volta.forward.engines_taking.empty());
  EXPECT_TRUE(volta.backward.engines_taking.empty());
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

// On the GPU: cuDNN's description of it, printed (so that the described Hopper of CudnnGraphs can be
// compared with a real one), takes our graphs with the same engines as the described Hopper when it is
// one (compute capability 9.0), and with some engine otherwise.
TEST(CudnnDeviceProperties, TheGpuAsCudnnDescribesItTakesTheGraphs) {
  ZT_REQUIRE_CUDNN();
  if (!has_device_properties())
    GTEST_SKIP() << "device properties need cuDNN 9.8: " << dnn::attention_status();
  const std::string json = dnn::device_properties_json(0);
  std::cout << "cuDNN's device properties of cuda:0: " << json << "\n";
  const nlohmann::json device = nlohmann::json::parse(json);
  const zk::AttentionShape gpt2 = kGraphShapes[0];
  const dnn::GraphCheck real = dnn::check_graphs_without_device(DType::bf16, gpt2, json);
  EXPECT_FALSE(real.forward.engines_taking.empty());
  EXPECT_FALSE(real.backward.engines_taking.empty());
  if (device.value("deviceVer", 0) == 900) {
    const dnn::GraphCheck described =
        dnn::check_graphs_without_device(DType::bf16, gpt2, hopper_like_device_json(9, 0));
    EXPECT_EQ(real.forward.engines_taking, described.forward.engines_taking);
    EXPECT_EQ(real.backward.engines_taking, described.backward.engines_taking);
  }
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
TEST(CudnnGraphs, NeedsCuda) {
  GTEST_SKIP() << "libcudnn not usable: built without CUDA";
}

#endif

}  // namespace
