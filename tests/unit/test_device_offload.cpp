// The CUDA side of optimizer offload (src/engine/device_offloaded_update.*): gradients copied from a
// device chunk by chunk through pinned buffers, the host optimizer's update, the new parameters
// copied back. On a GPU machine the result is bit for bit the host optimizer's on the same data, for
// every buffer count and with chunks that do not divide the range. Everywhere: the same pipeline with
// host buffers in the device's place, and the error without a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "src/engine/device_offloaded_update.hpp"
#include "test_helpers.hpp"
#include "zerotrain/device.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/optimizer.hpp"
#include "zerotrain/tensor.hpp"

namespace {

using zt::engine_detail::DeviceOffloadedUpdate;
using zt::engine_detail::DeviceOffloadedUpdateOptions;

TEST(DeviceOffloadedUpdate, RefusesWithTheReasonWithoutAUsableGpu) {
  if (zt::cuda_status().usable()) GTEST_SKIP() << "a GPU is usable here; this checks the error without one";
  const std::string message = zt::testing::error_of([] { DeviceOffloadedUpdate update({}); });
  EXPECT_NE(message.find("offload_optimizer with the model on cuda:0: no usable CUDA device ("),
            std::string::npos)
      << message;
  EXPECT_NE(message.find(zt::cuda_status().reason), std::string::npos) << message;
}

/// Random bytes of `count` values of `dtype` (finite: bf16/fp16 from floats in [-1, 1]).
std::vector<std::byte> random_values(std::size_t count, zt::DType dtype, std::uint32_t seed) {
  std::mt19937 generator(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> values(count);
  for (float& value : values) value = uniform(generator);
  std::vector<std::byte> bytes(count * zt::dtype_size(dtype));
  zt::Tensor::view_of(bytes.data(), {static_cast<std::int64_t>(count)}, dtype)
      .copy_from(zt::Tensor::from_vector(values, {static_cast<std::int64_t>(count)}));
  return bytes;
}

/// The offloaded update with gradients and parameters on `gpu` against the host optimizer on the
/// same data: bf16 and fp32, 1 to 5 buffers, 3 steps, chunks that do not divide the range.
void expect_same_as_the_host_optimizer(zt::Device gpu) {
  constexpr std::size_t kCount = 300'007;  // not a multiple of the chunk
  constexpr std::size_t kChunk = 65'536;
  for (zt::DType dtype : {zt::DType::bf16, zt::DType::fp32}) {
    for (std::size_t buffers : {1u, 2u, 3u, 5u}) {
      SCOPED_TRACE(std::string(zt::dtype_name(dtype)) + ", " + std::to_string(buffers) + " buffers");
      const std::size_t element = zt::dtype_size(dtype);
      zt::OptimizerParams hyperparameters;
      hyperparameters.weight_decay = 0.01f;
      auto host = zt::make_optimizer("adamw", {}, hyperparameters);
      auto offloaded = zt::make_optimizer("adamw", {}, hyperparameters);
      std::vector<float> master = [&] {
        std::vector<std::byte> bytes = random_values(kCount, zt::DType::fp32, 1);
        std::vector<float> values(kCount);
        std::memcpy(values.data(), bytes.data(), bytes.size());
        return values;
      }();
      std::vector<float> offloaded_master = master;
      std::vector<float> m(kCount, 0.0f), v(kCount, 0.0f), offloaded_m(kCount, 0.0f),
          offloaded_v(kCount, 0.0f);
      std::vector<std::byte> host_parameters(kCount * element);
      zt::Buffer device_gradients(gpu, kCount * element);
      zt::Buffer device_parameters(gpu, kCount * element);
      DeviceOffloadedUpdateOptions options;
      options.device = gpu;
      options.gradient_dtype = dtype;
      options.parameter_dtype = dtype;
      options.chunk_elements = kChunk;
      options.buffer_count = buffers;
      DeviceOffloadedUpdate update(options);
      // The gradients arrive on a stream of their own, as the engine's come from its compute stream:
      // the update's copies must wait for it (run's ordered_after).
      const zt::Stream producer(gpu);
      for (int step = 0; step < 3; ++step) {
        const std::vector<std::byte> gradients = random_values(kCount, dtype, 100 + step);
        zt::copy_bytes(device_gradients.data(), gpu, gradients.data(), zt::Device::host(), gradients.size(),
                       &producer);
        const float grad_scale = 0.5f;
        const float lr = 1e-3f;
        host->begin_step(grad_scale, lr);
        float* host_state[] = {m.data(), v.data()};
        host->update_range({master.data(), kCount}, host_state, {gradients.data(), dtype}, grad_scale, lr,
                           dtype == zt::DType::fp32 ? zt::HalfParamBuffer{}
                                                    : zt::HalfParamBuffer{host_parameters.data(), dtype});
        if (dtype == zt::DType::fp32)
          std::memcpy(host_parameters.data(), master.data(), kCount * sizeof(float));

        offloaded->begin_step(grad_scale, lr);
        float* offloaded_state[] = {offloaded_m.data(), offloaded_v.data()};
        const auto stats =
            update.run(*offloaded, device_gradients.data(), device_parameters.data(), offloaded_master.data(),
                       offloaded_state, kCount, grad_scale, lr, &producer);
        EXPECT_GT(stats.update_seconds, 0.0);
        std::vector<std::byte> back(kCount * element);
        zt::copy_bytes(back.data(), zt::Device::host(), device_parameters.data(), gpu, back.size());
        EXPECT_EQ(std::memcmp(back.data(), host_parameters.data(), back.size()), 0)
            << "parameters, step " << step;
        EXPECT_EQ(offloaded_master, master) << "step " << step;
        EXPECT_EQ(offloaded_m, m) << "step " << step;
        EXPECT_EQ(offloaded_v, v) << "step " << step;
      }
    }
  }
}

TEST(DeviceOffloadedUpdate, MatchesTheHostOptimizerBitwiseOnAGpu) {
  if (!zt::cuda_status().usable()) GTEST_SKIP() << "no usable GPU: " << zt::cuda_status().reason;
  expect_same_as_the_host_optimizer(zt::Device::cuda(0));
}

/// The same chunks, slots and copies with host buffers in the device's place (copies are memcpy):
/// the pipeline's bookkeeping, checked on every machine.
TEST(DeviceOffloadedUpdate, MatchesTheHostOptimizerBitwiseWithHostBuffers) {
  expect_same_as_the_host_optimizer(zt::Device::host());
}

}  // namespace
