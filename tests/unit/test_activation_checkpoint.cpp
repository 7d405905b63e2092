// nn::ActivationCheckpoint: layers run through it give bitwise the outputs, gradients and dropout
// masks of the same layers without it (several micro-batches in flight too), keep their names, hold
// less activation memory between forward and backward, keep their input on the host with
// keep_input_on_host off the host, and misuse is a clear error. Its backward against finite
// differences is in test_nn_gradcheck.cpp.
#include <gtest/gtest.h>

#include "tensor_checks.hpp"
#include "test_helpers.hpp"

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

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
using zt::Tensor;
namespace nn = zt::nn;

const nn::GptConfig kGpt{
    .n_layer = 5, .n_head = 2, .d_model = 16, .seq_len = 8, .vocab_size = 13, .dropout = 0.2};

nn::GptConfig checkpointed(nn::GptConfig config, std::int64_t interval, bool on_host = false) {
  config.activation_checkpoint_interval = interval;
  config.cpu_checkpointing = on_host;
  return config;
}

/// Every parameter gradient of `actual` bitwise that of `expected` (same names in the same order).
void expect_same_gradients(nn::Module& expected, nn::Module& actual, const std::string& when) {
  const auto expected_parameters = expected.parameters(), actual_parameters = actual.parameters();
  ASSERT_EQ(expected_parameters.size(), actual_parameters.size());
  for (std::size_t i = 0; i < expected_parameters.size(); ++i) {
    EXPECT_EQ(actual_parameters[i]->name, expected_parameters[i]->name);
    EXPECT_TRUE(same_bits(actual_parameters[i]->grad, expected_parameters[i]->grad))
        << when << ": " << expected_parameters[i]->name;
  }
}

std::vector<std::uint64_t> dropout_streams(nn::Module& module) {
  std::vector<std::uint64_t> streams;
  for (nn::Module* descendant : module.modules()) {
    if (auto* dropout = dynamic_cast<nn::Dropout*>(descendant)) streams.push_back(dropout->next_stream());
  }
  return streams;
}

std::size_t activation_bytes(zt::DeviceType device = zt::DeviceType::host) {
  return zt::memory_snapshot(device)[zt::MemoryCategory::activations].current;
}

TEST(ActivationCheckpoint, GptKeepsItsParameterNamesValuesAndOrder) {
  nn::Gpt plain(kGpt, DType::fp32, 7);
  for (std::int64_t interval : {1, 2, 3, 5, 8}) {
    SCOPED_TRACE("interval " + std::to_string(interval));
    nn::Gpt gpt(checkpointed(kGpt, interval), DType::fp32, 7);
    const auto expected = plain.parameters(), actual = gpt.parameters();
    ASSERT_EQ(actual.size(), expected.size());
    for (std::size_t i = 0; i < expected.size(); ++i) {
      EXPECT_EQ(actual[i]->name, expected[i]->name);
      EXPECT_TRUE(same_bits(actual[i]->value, expected[i]->value)) << expected[i]->name;
    }
    // ceil(5 / interval) checkpoints, the last one shorter; the blocks are still "h.<layer>".
    std::vector<std::size_t> sizes;
    for (nn::Module* module : gpt.modules()) {
      if (auto* checkpoint = dynamic_cast<nn::ActivationCheckpoint*>(module)) {
        EXPECT_EQ(checkpoint->name(), "h");
        EXPECT_EQ(checkpoint->type_name(), "ActivationCheckpoint");
        sizes.push_back(checkpoint->size());
      }
    }
    ASSERT_EQ(sizes.size(), static_cast<std::size_t>((5 + interval - 1) / interval));
    EXPECT_EQ(sizes.front(), static_cast<std::size_t>(std::min<std::int64_t>(interval, 5)));
    EXPECT_EQ(sizes.back(), static_cast<std::size_t>(5 - (sizes.size() - 1) * interval));
    ASSERT_NE(gpt.find_module("h.4.attn.dropout"), nullptr);
    EXPECT_EQ(gpt.find_module("h.3")->type_name(), "TransformerBlock");
  }
  EXPECT_NE(error_of([&] { nn::Gpt bad(checkpointed(kGpt, -1)); }).find("activation_checkpoint_interval -1"),
            std::string::npos);
}

TEST(ActivationCheckpoint, MlpKeepsItsNamesAndValues) {
  const nn::MlpConfig config{.sizes = {5, 9, 7, 6, 4}, .activation = nn::ActivationKind::tanh};
  nn::MlpConfig grouped = config;
  grouped.activation_checkpoint_interval = 2;
  nn::Mlp plain(config, DType::fp32, 3), mlp(grouped, DType::fp32, 3);
  const auto expected = plain.parameters(), actual = mlp.parameters();
  ASSERT_EQ(actual.size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(actual[i]->name, expected[i]->name);
    EXPECT_TRUE(same_bits(actual[i]->value, expected[i]->value)) << expected[i]->name;
  }
  // Linear+activation pairs two by two: "0".."3" and "4".."6".
  ASSERT_EQ(mlp.size(), 2u);
  EXPECT_EQ(mlp.find_module("6")->type_name(), "Linear");
  EXPECT_EQ(mlp.find_module("5")->type_name(), "Activation");
  const std::vector<nn::Module*> groups = mlp.children();
  EXPECT_EQ(dynamic_cast<nn::ActivationCheckpoint&>(*groups[0]).size(), 4u);
  EXPECT_EQ(dynamic_cast<nn::ActivationCheckpoint&>(*groups[1]).size(), 3u);

  std::mt19937_64 engine(8);
  std::normal_distribution<float> normal;
  std::vector<float> x(3 * 5), y(3 * 4);
  for (float& v : x) v = normal(engine);
  for (float& v : y) v = normal(engine);
  const Tensor input = Tensor::from_vector(x, {3, 5}), target = Tensor::from_vector(y, {3, 4});
  const Tensor plain_output = plain.run_forward(input), output = mlp.run_forward(input);
  EXPECT_TRUE(same_bits(output, plain_output));
  EXPECT_TRUE(same_bits(mlp.run_backward(zt::mse_loss(output, target).gradient(1.0)),
                        plain.run_backward(zt::mse_loss(plain_output, target).gradient(1.0))));
  expect_same_gradients(plain, mlp, "mlp");
}

/// Runs `schedule` ("F0 F1 B0 B1": forward of micro-batch 0, ...) on the model with checkpoints of
/// `interval` blocks and on the model without: every output, gradient and dropout stream is
/// bitwise the same after every pass.
void expect_schedule_matches(std::int64_t interval, const std::string& schedule, std::uint64_t seed) {
  nn::Gpt plain(kGpt, DType::fp32, 9), gpt(checkpointed(kGpt, interval), DType::fp32, 9);
  std::vector<Tensor> tokens, expected, actual;
  for (std::size_t at = 0; at + 1 < schedule.size(); at += 3) {
    const std::uint32_t m = static_cast<std::uint32_t>(schedule[at + 1] - '0');
    const std::string pass = schedule.substr(at, 2);
    if (schedule[at] == 'F') {
      ASSERT_EQ(m, tokens.size()) << "forwards in micro-batch order";
      tokens.push_back(random_tokens({2, 8}, 13, seed + m));
      expected.push_back(plain.run_forward(tokens[m], {.micro_batch = m}));
      actual.push_back(gpt.run_forward(tokens[m], {.micro_batch = m}));
      EXPECT_TRUE(same_bits(actual[m], expected[m])) << "output of " << pass;
      EXPECT_LT(gpt.saved_activation_count(), plain.saved_activation_count()) << pass;
    } else {
      plain.run_backward(zt::cross_entropy_loss(expected[m], tokens[m]).gradient(1.0), {.micro_batch = m});
      gpt.run_backward(zt::cross_entropy_loss(actual[m], tokens[m]).gradient(1.0), {.micro_batch = m});
      expect_same_gradients(plain, gpt, "after " + pass);
    }
    EXPECT_EQ(dropout_streams(gpt), dropout_streams(plain)) << "after " << pass;
  }
  EXPECT_FALSE(same_bits(expected[0], expected[1])) << "the micro-batches differ (not vacuous)";
  EXPECT_EQ(gpt.saved_activation_count(), 0u);
}

TEST(ActivationCheckpoint, GptWithDropoutAndMicroBatchesInFlightIsBitwiseTheUncheckpointedGpt) {
  for (std::int64_t interval : {1, 2, 5}) {
    for (const char* schedule : {"F0 F1 B0 B1", "F0 F1 B0 F2 B1 B2"}) {  // the second as 1F1B runs
      SCOPED_TRACE("interval " + std::to_string(interval) + ", " + schedule);
      expect_schedule_matches(interval, schedule, 100);
    }
  }
}

TEST(ActivationCheckpoint, BlocksInACheckpointMatchTheBlocksAloneWithTheirInputGradient) {
  // Two blocks in a Sequential against the same two blocks (same seeds) in one checkpoint; the
  // backwards in the opposite order of the forwards, as a pipeline may run them.
  nn::Sequential plain;
  nn::ActivationCheckpoint checkpoint;
  for (std::uint64_t layer = 0; layer < 2; ++layer) {
    plain.append(std::make_unique<nn::TransformerBlock>(8, 2, DType::fp32, 0.3, 20 + 2 * layer));
    checkpoint.append(std::make_unique<nn::TransformerBlock>(8, 2, DType::fp32, 0.3, 20 + 2 * layer),
                      std::to_string(layer));
  }
  for (std::size_t i = 0; i < plain.parameters().size(); ++i) {
    nn::init_normal(*plain.parameters()[i], 0.3, 4);
    nn::init_normal(*checkpoint.parameters()[i], 0.3, 4);
  }
  std::mt19937_64 engine(5);
  std::normal_distribution<float> normal;
  Tensor inputs[3], grads[3];
  for (int m = 0; m < 3; ++m) {
    std::vector<float> x(2 * 4 * 8), g(2 * 4 * 8);
    for (float& v : x) v = normal(engine);
    for (float& v : g) v = normal(engine);
    inputs[m] = Tensor::from_vector(x, {2, 4, 8});
    grads[m] = Tensor::from_vector(g, {2, 4, 8});
  }
  for (std::uint32_t m = 0; m < 3; ++m) {
    EXPECT_TRUE(same_bits(checkpoint.run_forward(inputs[m], {.micro_batch = m}),
                          plain.run_forward(inputs[m], {.micro_batch = m})));
  }
  EXPECT_EQ(checkpoint.saved_activation_count(), 3u) << "one slot per micro-batch: the checkpoint's own";
  for (std::uint32_t m : {2u, 0u, 1u}) {
    EXPECT_TRUE(same_bits(checkpoint.run_backward(grads[m], {.micro_batch = m}),
                          plain.run_backward(grads[m], {.micro_batch = m})))
        << "input gradient of micro-batch " << m;
    expect_same_gradients(plain, checkpoint, "micro-batch " + std::to_string(m));
  }
  EXPECT_EQ(dropout_streams(checkpoint), dropout_streams(plain));
  // Evaluation forwards just run the layers and save nothing.
  plain.eval();
  checkpoint.eval();
  EXPECT_TRUE(same_bits(checkpoint.run_forward(inputs[0]), plain.run_forward(inputs[0])));
  EXPECT_EQ(checkpoint.saved_activation_count(), 0u);
}

TEST(ActivationCheckpoint, HoldsLessActivationMemoryBetweenForwardAndBackward) {
  const nn::GptConfig config{.n_layer = 4, .n_head = 4, .d_model = 64, .seq_len = 32, .vocab_size = 64};
  const Tensor tokens = random_tokens({4, 32}, 64, 11);
  std::size_t held[2] = {};
  std::size_t peak[2] = {};
  for (std::int64_t interval : {0, 2}) {
    nn::Gpt gpt(checkpointed(config, interval), DType::fp32, 12);
    const std::size_t before = activation_bytes();
    zt::reset_memory_peaks();
    const Tensor logits = gpt.run_forward(tokens);
    held[interval / 2] = activation_bytes() - before;
    gpt.run_backward(zt::cross_entropy_loss(logits, tokens).gradient(1.0));
    peak[interval / 2] =
        zt::memory_snapshot(zt::DeviceType::host)[zt::MemoryCategory::activations].peak - before;
    EXPECT_EQ(activation_bytes(), before + logits.nbytes()) << "only the logits are left";
  }
  std::printf("activations held after the forward: %zu B plain, %zu B with checkpoints of 2 blocks\n",
              held[0], held[1]);
  std::printf("activation peak over forward and backward: %zu B plain, %zu B checkpointed\n", peak[0],
              peak[1]);
  // Two checkpoints keep two [4, 32, 64] inputs instead of every block's activations.
  EXPECT_LT(held[1] * 2, held[0]);
  EXPECT_LT(peak[1], peak[0]);
}

TEST(ActivationCheckpoint, KeepsItsInputOnTheHostOffTheHostWithTheSameBits) {
  const zt::Device emulated = zt::Device::emulated();
  const ExecutionContext context(emulated);
  const nn::RunContext on_device{.execution = &context};
  nn::GptConfig config = kGpt;
  config.n_layer = 4;
  const Tensor tokens = random_tokens({2, 8}, 13, 13);
  nn::Gpt host(config, DType::fp32, 14);
  const Tensor host_logits = host.run_forward(tokens);
  host.run_backward(zt::cross_entropy_loss(host_logits, tokens).gradient(1.0));

  std::size_t device_held[2] = {}, host_held[2] = {};
  for (bool on_host : {false, true}) {
    SCOPED_TRACE(on_host ? "cpu_checkpointing" : "on the device");
    nn::Gpt gpt(checkpointed(config, 2, on_host), DType::fp32, 14, emulated);
    const Tensor device_tokens = context.on_device(tokens);
    const std::size_t device_before = activation_bytes(zt::DeviceType::emulated);
    const std::size_t host_before = activation_bytes();
    const Tensor logits = gpt.run_forward(device_tokens, on_device);
    device_held[on_host] = activation_bytes(zt::DeviceType::emulated) - device_before;
    host_held[on_host] = activation_bytes() - host_before;
    EXPECT_TRUE(same_bits(logits, host_logits));
    gpt.run_backward(zt::cross_entropy_loss(logits, device_tokens, context).gradient(1.0), on_device);
    expect_same_gradients(host, gpt, "backward");
    EXPECT_EQ(activation_bytes(), host_before) << "the host copies are freed by the backward";
  }
  // The two checkpoints' inputs ([2, 8, 16] fp32 each) moved from the device to the host.
  const std::size_t inputs = 2 * 2 * 8 * 16 * sizeof(float);
  EXPECT_EQ(host_held[0], 0u);
  EXPECT_EQ(host_held[1], inputs);
  EXPECT_EQ(device_held[0] - device_held[1], inputs);

  // On the host the option changes nothing: the input is kept as it is.
  nn::Gpt on_host(checkpointed(config, 2, true), DType::fp32, 14);
  const std::size_t before = activation_bytes();
  const Tensor logits = on_host.run_forward(tokens);
  nn::Gpt on_device_kept(checkpointed(config, 2, false), DType::fp32, 14);
  const std::size_t middle = activation_bytes();
  const Tensor other = on_device_kept.run_forward(tokens);
  EXPECT_EQ(middle - before, activation_bytes() - middle);
  EXPECT_TRUE(same_bits(logits, other));
}

TEST(ActivationCheckpoint, QueuesThePreviousCheckpointsUploadInItsBackward) {
  // Two checkpoints in a row, inputs kept on the host, on the emulated device: linked, the second's
  // backward queues the upload of the first's input (the transfer stream, overlapping the second's
  // recompute and backward on a GPU), which the first's backward then uses; the gradients are the
  // same bits as without the link, and everything is freed afterwards, also when the slots are
  // dropped between the two backwards.
  const zt::Device emulated = zt::Device::emulated();
  const ExecutionContext context(emulated);
  const nn::RunContext on_device{.execution = &context};
  auto normal = [&](std::uint64_t seed) {
    std::mt19937_64 generator(seed);
    std::normal_distribution<float> distribution;
    std::vector<float> values(4 * 8);
    for (float& value : values) value = distribution(generator);
    return context.on_device(Tensor::from_vector(values, {4, 8}));
  };
  const Tensor x = normal(21), grad_y = normal(22);
  const std::size_t input_bytes = 4 * 8 * sizeof(float);
  struct Chain {
    nn::Sequential model;
    nn::ActivationCheckpoint* first = nullptr;
    nn::ActivationCheckpoint* second = nullptr;
  };
  auto make_chain = [&](bool linked) {
    auto chain = std::make_unique<Chain>();
    chain->first = &chain->model.append(std::make_unique<nn::ActivationCheckpoint>(true));
    chain->second = &chain->model.append(std::make_unique<nn::ActivationCheckpoint>(true));
    for (nn::ActivationCheckpoint* checkpoint : {chain->first, chain->second}) {
      auto& linear = checkpoint->append(std::make_unique<nn::Linear>(8, 8, true, DType::fp32, emulated), "0");
      nn::init_normal(linear.weight(), 0.3, 5);
    }
    if (linked) chain->second->set_previous_checkpoint(chain->first);
    return chain;
  };
  std::unique_ptr<Chain> chains[2];
  std::size_t held_between[2] = {};
  for (bool linked : {false, true}) {
    SCOPED_TRACE(linked ? "linked" : "not linked");
    chains[linked] = make_chain(linked);
    Chain& chain = *chains[linked];
    const std::size_t device_before = activation_bytes(zt::DeviceType::emulated);
    const std::size_t host_before = activation_bytes();
    (void)chain.model.run_forward(x, on_device);
    const Tensor grad_middle = chain.second->run_backward(grad_y, on_device);
    held_between[linked] = activation_bytes(zt::DeviceType::emulated) - device_before;
    (void)chain.first->run_backward(grad_middle, on_device);
    EXPECT_EQ(activation_bytes(), host_before) << "the pinned copies are freed";
  }
  expect_same_gradients(chains[0]->model, chains[1]->model, "linked against not linked");
  // Between the two backwards the linked chain holds the first checkpoint's input on the device.
  EXPECT_EQ(held_between[1] - held_between[0], input_bytes);

  // Dropped between the two backwards: the queued upload is freed with its slot.
  auto chain = make_chain(true);
  const std::size_t device_before = activation_bytes(zt::DeviceType::emulated);
  const std::size_t host_before = activation_bytes();
  (void)chain->model.run_forward(x, on_device);
  (void)chain->second->run_backward(grad_y, on_device);
  EXPECT_GE(activation_bytes(zt::DeviceType::emulated), device_before + input_bytes);
  chain->model.release_activations();
  EXPECT_EQ(activation_bytes(zt::DeviceType::emulated), device_before);
  EXPECT_EQ(activation_bytes(), host_before);
}

TEST(ActivationCheckpoint, MisuseIsAClearError) {
  nn::Gpt gpt(checkpointed(kGpt, 2));
  const Tensor tokens = random_tokens({1, 4}, 13, 15);
  const Tensor logits = gpt.run_forward(tokens, {.micro_batch = 1});
  std::string message = error_of([&] { gpt.run_forward(tokens, {.micro_batch = 1}); });
  EXPECT_NE(message.find("a second forward into micro-batch slot 1 before its backward"), std::string::npos)
      << message;
  message = error_of(
      [&] { gpt.run_backward(zt::cross_entropy_loss(logits, tokens).gradient(1.0), {.micro_batch = 2}); });
  EXPECT_NE(message.find("for micro-batch 2 without its forward"), std::string::npos) << message;

  gpt.eval();
  message = error_of(
      [&] { gpt.run_backward(zt::cross_entropy_loss(logits, tokens).gradient(1.0), {.micro_batch = 1}); });
  EXPECT_NE(message.find("ActivationCheckpoint 'h': backward of micro-batch 1 in evaluation mode"),
            std::string::npos)
      << message;
  EXPECT_EQ(gpt.saved_activation_count(), 0u) << "the failed backward released its micro-batch";
  message = error_of([&] { gpt.run_backward(Tensor::zeros({1, 4, 13}, DType::fp32), {.micro_batch = 1}); });
  EXPECT_NE(message.find("without its forward"), std::string::npos) << message;
}

}  // namespace
