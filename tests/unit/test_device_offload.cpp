// The CUDA side of optimizer offload (src/engine/device_offloaded_update.*): gradients copied from a
// device chunk by chunk through pinned buffers, the host optimizer's update, the new parameters
// copied back. On a GPU machine the result is bit for bit the host optimizer's on the same data, for
// every buffer count and with chunks that do not divide the range, and so are pieces queued one after
// the other (NVMe offload's pieces of sub-groups) with one wait, the fp32 parameters on the device
// serving as the master. Everywhere: the same pipeline with host buffers, and with the emulated
// device, in the device's place, and the error without a GPU.
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

/// The data of one comparison: random fp32 master (the host optimizer's and the offloaded copy), zero
/// Adam moments for each, the host's new parameters, and the gradients and parameters on `device`.
struct UpdateData {
  UpdateData(zt::Device device, std::size_t count, zt::DType dtype, std::uint32_t seed)
      : master(count),
        m(count, 0.0f),
        v(count, 0.0f),
        offloaded_m(count, 0.0f),
        offloaded_v(count, 0.0f),
        host_parameters(count * zt::dtype_size(dtype)),
        device_gradients(device, count * zt::dtype_size(dtype)),
        device_parameters(device, count * zt::dtype_size(dtype)) {
    const std::vector<std::byte> bytes = random_values(count, zt::DType::fp32, seed);
    std::memcpy(master.data(), bytes.data(), bytes.size());
    offloaded_master = master;
  }
  std::vector<float> master, offloaded_master, m, v, offloaded_m, offloaded_v;
  std::vector<std::byte> host_parameters;
  zt::Buffer device_gradients, device_parameters;
};

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
      UpdateData data(gpu, kCount, dtype, 1);
      auto& [master, offloaded_master, m, v, offloaded_m, offloaded_v, host_parameters, device_gradients,
             device_parameters] = data;
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

/// Pieces of uneven sizes queued one after the other (as NVMe offload queues a step's pieces of
/// sub-groups), the parameters on the device after one wait: bf16 with a host master, and fp32 with
/// the device's parameters as the master (staged down with the gradients, updated in the buffer).
/// `parameters_on_host` (offload_param nvme): the parameters in host memory, written in place
/// as each piece is queued, with a host master in fp32 too; no parameter staging.
void expect_queued_pieces_as_the_host_optimizer(zt::Device device, bool parameters_on_host = false) {
  constexpr std::size_t kCount = 100'003;
  const std::size_t cuts[] = {0, 1'500, 9'000, 9'001, 50'001, kCount};
  for (zt::DType dtype : {zt::DType::bf16, zt::DType::fp32}) {
    for (std::size_t buffers : {1u, 3u}) {
      const bool fp32 = dtype == zt::DType::fp32;
      const bool device_master = fp32 && !parameters_on_host;
      SCOPED_TRACE(std::string(zt::dtype_name(dtype)) + ", " + std::to_string(buffers) + " buffers");
      const std::size_t element = zt::dtype_size(dtype);
      auto host = zt::make_optimizer("adamw", {}, {});
      auto offloaded = zt::make_optimizer("adamw", {}, {});
      UpdateData data(device, kCount, dtype, 7);
      auto& [master, offloaded_master, m, v, offloaded_m, offloaded_v, host_parameters, device_gradients,
             device_parameters] = data;
      if (device_master) {
        zt::copy_bytes(device_parameters.data(), device, master.data(), zt::Device::host(), kCount * element);
      }
      DeviceOffloadedUpdateOptions options;
      options.device = device;
      options.gradient_dtype = dtype;
      options.parameter_dtype = dtype;
      options.chunk_elements = 4'096;
      options.buffer_count = buffers;
      options.parameters_on_host = parameters_on_host;
      DeviceOffloadedUpdate update(options);
      EXPECT_EQ(update.buffer_bytes(), buffers * 4'096 * (parameters_on_host ? 1 : 2) * element);
      std::vector<std::byte> host_target(kCount * element);  // the parameters with parameters_on_host
      const zt::Stream producer(device);
      for (int step = 0; step < 2; ++step) {
        const std::vector<std::byte> gradients = random_values(kCount, dtype, 200 + step);
        zt::copy_bytes(device_gradients.data(), device, gradients.data(), zt::Device::host(),
                       gradients.size(), &producer);
        host->begin_step(1.0f, 1e-3f);
        float* host_state[] = {m.data(), v.data()};
        host->update_range({master.data(), kCount}, host_state, {gradients.data(), dtype}, 1.0f, 1e-3f,
                           fp32 ? zt::HalfParamBuffer{} : zt::HalfParamBuffer{host_parameters.data(), dtype});
        if (fp32) std::memcpy(host_parameters.data(), master.data(), kCount * sizeof(float));

        offloaded->begin_step(1.0f, 1e-3f);
        for (std::size_t p = 0; p + 1 < std::size(cuts); ++p) {
          const std::size_t first = cuts[p];
          float* state[] = {offloaded_m.data() + first, offloaded_v.data() + first};
          std::byte* parameters = parameters_on_host ? host_target.data() : device_parameters.as<std::byte>();
          update.queue(*offloaded, device_gradients.as<std::byte>() + first * element,
                       parameters + first * element,
                       device_master ? nullptr : offloaded_master.data() + first, state, cuts[p + 1] - first,
                       1.0f, 1e-3f, &producer);
        }
        EXPECT_GE(update.wait_for_parameters(), 0.0);
        std::vector<std::byte> back(kCount * element);
        if (parameters_on_host) {
          back = host_target;
        } else {
          zt::copy_bytes(back.data(), zt::Device::host(), device_parameters.data(), device, back.size());
        }
        EXPECT_EQ(std::memcmp(back.data(), host_parameters.data(), back.size()), 0)
            << "parameters, step " << step;
        if (!device_master) {
          EXPECT_EQ(offloaded_master, master) << "step " << step;
        }
        EXPECT_EQ(offloaded_m, m) << "step " << step;
        EXPECT_EQ(offloaded_v, v) << "step " << step;
      }
    }
  }
  // A 16-bit parameter cannot be its own master.
  DeviceOffloadedUpdateOptions options;
  options.device = device;
  DeviceOffloadedUpdate update(options);
  auto optimizer = zt::make_optimizer("adamw", {}, {});
  optimizer->begin_step(1.0f, 1e-3f);
  zt::Buffer gradients(device, 16), parameters(device, 16);
  std::vector<float> m(8), v(8);
  float* state[] = {m.data(), v.data()};
  const std::string message = zt::testing::error_of(
      [&] { update.queue(*optimizer, gradients.data(), parameters.data(), nullptr, state, 8, 1.0f, 1e-3f); });
  EXPECT_NE(message.find("no host master with bf16 parameters"), std::string::npos) << message;
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

TEST(DeviceOffloadedUpdate, QueuedPiecesMatchTheHostOptimizerOnAGpu) {
  if (!zt::cuda_status().usable()) GTEST_SKIP() << "no usable GPU: " << zt::cuda_status().reason;
  expect_queued_pieces_as_the_host_optimizer(zt::Device::cuda(0));
}

TEST(DeviceOffloadedUpdate, QueuedPiecesMatchTheHostOptimizerWithHostBuffers) {
  expect_queued_pieces_as_the_host_optimizer(zt::Device::host());
}

/// The emulated device's memory faults on any host access: every byte the update reads or writes
/// there goes through the pipeline's copies.
TEST(DeviceOffloadedUpdate, QueuedPiecesMatchTheHostOptimizerOnTheEmulatedDevice) {
  expect_queued_pieces_as_the_host_optimizer(zt::Device::emulated());
}

/// offload_param nvme: the gradients on the emulated device, the parameters in host memory (the
/// parameter store's buffers), updated in place by the host optimizer.
TEST(DeviceOffloadedUpdate, ParametersInHostMemoryMatchTheHostOptimizerOnTheEmulatedDevice) {
  expect_queued_pieces_as_the_host_optimizer(zt::Device::emulated(), /*parameters_on_host=*/true);
}

}  // namespace
