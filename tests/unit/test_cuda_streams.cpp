// Stream ordering on a GPU (ctest unit.cuda_streams, label gpu): what docs/gpu.md says does not
// synchronize the host is ordered on the execution context's streams, and what reads for the host
// waits for the stream that wrote. Without a usable GPU every test skips saying so; the same calls
// run on the host and the emulated device in unit.execution, unit.nn and unit.activation_checkpoint.
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "cuda_kernel_checks.hpp"
#include "tensor_checks.hpp"
#include "test_helpers.hpp"
#include "zerotrain/execution.hpp"
#include "zerotrain/loss.hpp"
#include "zerotrain/nn.hpp"
#include "zerotrain/tensor.hpp"

namespace {

using zt::testing::error_of;
using zt::testing::random_tokens;
using zt::testing::same_bits;

using zt::DType;
using zt::ExecutionContext;
using zt::MemoryCategory;
using zt::Tensor;
namespace nn = zt::nn;

TEST(CudaStreams, TransferStreamCopyFollowsTheKernelsThatWroteItsSource) {
  ZT_REQUIRE_GPU();
  const ExecutionContext context(zt::Device::cuda(0));
  const std::int64_t count = std::int64_t{1} << 24;  // 64 MiB: the fill is still running at the copy
  for (int round = 0; round < 3; ++round) {
    Tensor source = context.empty({count}, DType::fp32);
    source.fill_(1.5 + round, &context.compute());
    zt::Buffer pinned = context.allocate_pinned_host(source.nbytes(), MemoryCategory::activations);
    context.to_host_async(pinned.data(), source.raw_data(), source.nbytes());
    context.compute_waits_for_transfers();
    source.fill_(-1.0, &context.compute());  // after the copy: it must not show in the host copy
    context.compute().synchronize();
    const auto* values = pinned.as<float>();
    for (std::int64_t i : {std::int64_t{0}, count / 2, count - 1}) {
      ASSERT_EQ(values[i], static_cast<float>(1.5 + round)) << "round " << round << " element " << i;
    }
  }
}

TEST(CudaStreams, CheckpointInputsKeptOnTheHostGiveTheSameBits) {
  ZT_REQUIRE_GPU();
  const zt::Device gpu = zt::Device::cuda(0);
  const ExecutionContext context(gpu);
  nn::GptConfig config{
      .n_layer = 4, .n_head = 2, .d_model = 64, .seq_len = 32, .vocab_size = 50, .dropout = 0.1};
  config.activation_checkpoint_interval = 1;
  const Tensor tokens = context.on_device(random_tokens({4, 32}, 50, 3));
  std::vector<Tensor> logits, losses;
  std::vector<std::vector<Tensor>> gradients;
  for (bool on_host : {false, true}) {
    SCOPED_TRACE(on_host ? "keep_input_on_host" : "on the device");
    config.cpu_checkpointing = on_host;
    nn::Gpt gpt(config, DType::fp32, 7, gpu);
    const std::size_t host_before =
        zt::memory_snapshot(zt::DeviceType::host)[MemoryCategory::activations].current;
    // Two micro-batches in flight, backwards in reverse order: each slot's pinned copy stays its own.
    const Tensor first = gpt.run_forward(tokens, {.execution = &context, .micro_batch = 0});
    const Tensor second = gpt.run_forward(tokens, {.execution = &context, .micro_batch = 1});
    const std::size_t host_held =
        zt::memory_snapshot(zt::DeviceType::host)[MemoryCategory::activations].current - host_before;
    EXPECT_EQ(host_held, on_host ? 2u * 4u * 4u * 32u * 64u * sizeof(float) : 0u);
    const zt::Loss second_loss = zt::cross_entropy_loss(second, tokens, context);
    gpt.run_backward(second_loss.gradient(0.5), {.execution = &context, .micro_batch = 1});
    const zt::Loss first_loss = zt::cross_entropy_loss(first, tokens, context);
    gpt.run_backward(first_loss.gradient(0.5), {.execution = &context, .micro_batch = 0});
    // The clones below copy on the legacy default stream, which does not wait for the compute stream
    // (non-blocking): the backward's last gradients must be written first.
    context.synchronize();
    EXPECT_EQ(zt::memory_snapshot(zt::DeviceType::host)[MemoryCategory::activations].current, host_before);
    logits.push_back(first.clone());
    losses.push_back(second_loss.value.clone());
    std::vector<Tensor> grads;
    for (nn::Parameter* parameter : gpt.parameters()) grads.push_back(parameter->grad.clone());
    gradients.push_back(std::move(grads));
  }
  EXPECT_TRUE(same_bits(logits[0], logits[1]));
  EXPECT_TRUE(same_bits(losses[0], losses[1]));
  ASSERT_EQ(gradients[0].size(), gradients[1].size());
  for (std::size_t i = 0; i < gradients[0].size(); ++i) {
    EXPECT_TRUE(same_bits(gradients[0][i], gradients[1][i])) << "gradient " << i;
  }
}

TEST(CudaStreams, ZeroGradIsOrderedOnTheComputeStream) {
  ZT_REQUIRE_GPU();
  const zt::Device gpu = zt::Device::cuda(0);
  const ExecutionContext context(gpu);
  nn::Linear linear(512, 4096, true, DType::fp32, gpu);
  for (nn::Parameter* parameter : linear.parameters()) {
    parameter->grad = context.empty(parameter->value.shape(), DType::fp32, MemoryCategory::gradients);
  }
  for (int round = 0; round < 3; ++round) {
    for (nn::Parameter* parameter : linear.parameters()) parameter->grad.fill_(3.0, &context.compute());
    linear.zero_grad(context);  // after the fills on the same stream: no legacy-stream race
    for (nn::Parameter* parameter : linear.parameters()) {
      EXPECT_EQ(parameter->grad.item_as_double(parameter->grad.numel() - 1, &context.compute()), 0.0)
          << parameter->name;
    }
  }
  const std::string message = error_of([&] { linear.zero_grad(); });
  EXPECT_NE(message.find("pass the ExecutionContext whose compute stream uses it"), std::string::npos)
      << message;
}

TEST(CudaStreams, ItemAsDoubleWaitsForTheStreamThatWroteTheElement) {
  ZT_REQUIRE_GPU();
  const ExecutionContext context(zt::Device::cuda(0));
  const std::int64_t count = std::int64_t{1} << 24;
  for (int round = 0; round < 3; ++round) {
    Tensor tensor = context.empty({count}, DType::fp32);
    tensor.fill_(round + 0.25, &context.compute());
    EXPECT_EQ(tensor.item_as_double(count - 1, &context.compute()), round + 0.25);
    tensor.fill_(round + 0.75, &context.compute());
    EXPECT_EQ(tensor.item_as_double(count - 1), round + 0.75) << "without a stream: the whole device";
  }
}

// A kernel on the default stream (the legacy one, which does not wait for the non-blocking streams)
// runs after every stream's work and is done on return (kernels/dispatch.hpp): a stream-less
// conversion reads the compute stream's last fill, and a stream-less fill lands before the compute
// stream's next kernel. 64 MiB, so that the fill before is still running at the call.
TEST(CudaStreams, DefaultStreamKernelsFollowEveryStream) {
  ZT_REQUIRE_GPU();
  const ExecutionContext context(zt::Device::cuda(0));
  const std::int64_t count = std::int64_t{1} << 24;
  for (int round = 0; round < 3; ++round) {
    Tensor tensor = context.empty({count}, DType::fp32);
    tensor.fill_(round + 0.5, &context.compute());
    const Tensor converted = tensor.to(DType::fp64);  // without a stream: a conversion kernel
    EXPECT_EQ(converted.item_as_double(0), round + 0.5) << "round " << round;
    EXPECT_EQ(converted.item_as_double(count - 1), round + 0.5) << "round " << round;
    tensor.fill_(-1.0);  // without a stream
    Tensor doubled = context.empty({count}, DType::fp64);
    doubled.copy_from(tensor, &context.compute());  // a conversion on the compute stream, after it
    EXPECT_EQ(doubled.item_as_double(count - 1, &context.compute()), -1.0) << "round " << round;
  }
}

// A copy or a zero without a stream (copy_bytes, zero_bytes, Tensor::clone) runs on the legacy
// default stream after every stream's work and is done on return: the legacy stream alone does not
// wait for the compute stream (non-blocking), so without the device's synchronize first the copy
// would read the fill half done and the zero could land before it. 64 MiB, as above.
TEST(CudaStreams, CopiesAndZerosWithoutAStreamFollowEveryStream) {
  ZT_REQUIRE_GPU();
  const ExecutionContext context(zt::Device::cuda(0));
  const std::int64_t count = std::int64_t{1} << 24;
  std::vector<float> host(static_cast<std::size_t>(count));  // pageable
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    Tensor tensor = context.empty({count}, DType::fp32);
    tensor.fill_(round + 0.5, &context.compute());
    zt::copy_bytes(host.data(), zt::Device::host(), tensor.raw_data(), tensor.device(), tensor.nbytes());
    EXPECT_EQ(host.front(), round + 0.5f);
    EXPECT_EQ(host.back(), round + 0.5f);
    tensor.fill_(round + 0.25, &context.compute());
    const Tensor cloned = tensor.clone();
    EXPECT_EQ(cloned.item_as_double(count - 1), round + 0.25);
    tensor.fill_(7.0, &context.compute());
    zt::zero_bytes(tensor.raw_data(), tensor.device(), tensor.nbytes());
    EXPECT_EQ(tensor.item_as_double(count - 1, &context.compute()), 0.0);
  }
}

}  // namespace
