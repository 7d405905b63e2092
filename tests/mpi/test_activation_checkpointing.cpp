// Activation checkpointing through zt::Engine: a GPT with dropout trained with its blocks in
// nn::ActivationCheckpoints (pipeline.activation_checkpoint_interval, or
// activation_checkpointing.number_checkpoints) gives bitwise the losses and weights of the same
// training without them at ZeRO stages 0-3 (stage 3 gathers the blocks' parameters again for the
// recompute; its first pass's trace holds the recomputes, and later passes prefetch by it), with
// forwards in flight at stages 0-2, and holds a
// lower peak of activation memory; with cpu_checkpointing on the emulated device the kept inputs
// move to the host and the run stays bitwise the host's.
#include <gtest/gtest.h>

#include <cstdio>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "engine_runs.hpp"
#include "mpi_test_main.hpp"
#include "zerotrain/device.hpp"
#include "zerotrain/engine.hpp"
#include "zerotrain/loss.hpp"
#include "zerotrain/nn.hpp"
#include "zerotrain/trainer.hpp"

namespace {

using namespace zt::testing::engine_runs;

constexpr int kSteps = 10;
constexpr int kGlobalBatch = 8;
constexpr const char* kGptWithDropout =
    R"({"type": "gpt", "n_layer": 4, "n_head": 2, "d_model": 32, "seq_len": 16, "vocab_size": 256,
        "dropout": 0.1})";

/// ZeRO `stage` with `gas` accumulation steps; stage 3 with small prefetch and live limits, so that
/// the gathering follows (and prefetches by) the trace of the first pass, recomputes included.
zt::Config config_of(int stage, const std::string& checkpointing, int gas = 2) {
  const int world = zt::testing::runtime().world_size();
  std::string zero = R"(, "zero_optimization": {"stage": )" + std::to_string(stage);
  if (stage == 3) {
    zero += R"(, "stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 20000,
               "stage3_max_live_parameters": 60000, "stage3_max_reuse_distance": 5000)";
  }
  zero += "}";
  return parse(gpt_config(kGlobalBatch / world / 2, gas, zero + checkpointing, kAdamW, kGptWithDropout));
}

std::size_t checkpoint_count(zt::nn::Module& model) {
  std::size_t count = 0;
  for (zt::nn::Module* module : model.modules())
    count += dynamic_cast<zt::nn::ActivationCheckpoint*>(module) != nullptr;
  return count;
}

struct TrainingRun {
  std::vector<double> losses;
  std::vector<float> master;
  std::size_t activation_peak = 0;  // bytes above the activations held before training
  std::size_t checkpoints = 0;
};

/// `steps` optimizer steps: forward/backward pairs (train_batch), or with `two_in_flight` a
/// second forward before each backward (F0 F1 B0 F2 B1 B2 for 3 micro-batches: a pipeline's 1F1B
/// order). The activation peak is measured on `device`.
TrainingRun train(const zt::Config& config, bool two_in_flight, zt::Device device = zt::Device::host(),
                  int steps = kSteps) {
  auto model = zt::build_model(config);
  zt::Engine engine(zt::testing::runtime(), *model, config, {.device = device});
  auto data = zt::make_training_data(engine.config(), engine, std::nullopt);
  TrainingRun run;
  run.checkpoints = checkpoint_count(*model);
  const zt::ExecutionContext& context = engine.execution();
  const std::size_t before = zt::memory_snapshot(device.type)[zt::MemoryCategory::activations].current;
  zt::reset_memory_peaks();
  for (int step = 0; step < steps; ++step) {
    if (two_in_flight) {
      std::deque<std::pair<zt::Tensor, zt::Tensor>> in_flight;  // outputs and targets, oldest first
      const auto backward_oldest = [&] {
        const auto [output, targets] = in_flight.front();
        in_flight.pop_front();
        engine.backward(zt::cross_entropy_loss(output, context.on_device(targets), context));
        engine.step();
      };
      for (std::int64_t micro = 0; micro < engine.batch().gradient_accumulation_steps; ++micro) {
        const zt::Batch batch = data->load(static_cast<std::uint64_t>(micro));
        in_flight.emplace_back(engine.forward(batch.inputs), batch.targets);
        if (in_flight.size() == 2) backward_oldest();
      }
      while (!in_flight.empty()) backward_oldest();
    } else {
      engine.train_batch([&](std::int64_t micro) { return data->load(static_cast<std::uint64_t>(micro)); });
    }
    data->advance();
    run.losses.push_back(engine.last_step().loss);
  }
  run.activation_peak = zt::memory_snapshot(device.type)[zt::MemoryCategory::activations].peak - before;
  run.master = real_master_parameters(engine);
  return run;
}

void print_peaks(const std::string& what, std::size_t plain, std::size_t checkpointed) {
  if (zt::testing::runtime().world_rank() != 0) return;
  std::printf("[rank 0 of %d] %s: activation peak %zu B without checkpointing, %zu B with (%.0f%%)\n",
              zt::testing::runtime().world_size(), what.c_str(), plain, checkpointed,
              100.0 * static_cast<double>(checkpointed) / static_cast<double>(plain));
}

TEST(ActivationCheckpointing, TrainsBitwiseAsWithoutItAtEveryStageWithALowerActivationPeak) {
  for (int stage : {0, 1, 2, 3}) {
    for (const char* checkpointing : {R"(, "pipeline": {"activation_checkpoint_interval": 2})",
                                      R"(, "activation_checkpointing": {"number_checkpoints": 4})"}) {
      SCOPED_TRACE("stage " + std::to_string(stage) + checkpointing);
      const TrainingRun plain = train(config_of(stage, ""), false);
      const TrainingRun checkpointed = train(config_of(stage, checkpointing), false);
      EXPECT_EQ(plain.checkpoints, 0u);
      EXPECT_EQ(checkpointed.checkpoints,
                std::string(checkpointing).find("interval") != std::string::npos ? 2u : 4u);
      EXPECT_EQ(checkpointed.losses, plain.losses);
      EXPECT_EQ(checkpointed.master, plain.master);
      EXPECT_LT(plain.losses.back(), plain.losses.front());
      EXPECT_LT(checkpointed.activation_peak, plain.activation_peak);
      print_peaks("stage " + std::to_string(stage) + checkpointing, plain.activation_peak,
                  checkpointed.activation_peak);
    }
  }
}

TEST(ActivationCheckpointing, ForwardsInFlightTrainBitwiseAsWithoutIt) {
  for (int stage : {0, 1, 2}) {
    for (int gas : {2, 3}) {  // F0 F1 B0 B1, and F0 F1 B0 F2 B1 B2
      SCOPED_TRACE("stage " + std::to_string(stage) + ", " + std::to_string(gas) + " micro-batches");
      const TrainingRun plain = train(config_of(stage, "", gas), true);
      const TrainingRun checkpointed =
          train(config_of(stage, R"(, "pipeline": {"activation_checkpoint_interval": 1})", gas), true);
      EXPECT_EQ(checkpointed.checkpoints, 4u);
      EXPECT_EQ(checkpointed.losses, plain.losses);
      EXPECT_EQ(checkpointed.master, plain.master);
      EXPECT_LT(checkpointed.activation_peak, plain.activation_peak);
      print_peaks("stage " + std::to_string(stage) + ", two forwards in flight, gas " + std::to_string(gas),
                  plain.activation_peak, checkpointed.activation_peak);
      // The schedule trains as the pairs do (so equal losses compare runs that really trained).
      EXPECT_EQ(plain.losses, train(config_of(stage, "", gas), false).losses);
    }
  }
}

TEST(ActivationCheckpointing, CpuCheckpointingKeepsTheInputsOnTheHostOffTheHost) {
  constexpr int kDeviceSteps = 2;  // the emulated device is slow (every kernel call changes page protections)
  for (int stage : {3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    // One block per checkpoint: while the last one's backward runs, the other three inputs are kept.
    const std::string interval = R"(, "pipeline": {"activation_checkpoint_interval": 1})";
    const TrainingRun host = train(config_of(stage, ""), false, zt::Device::host(), kDeviceSteps);
    const TrainingRun on_device =
        train(config_of(stage, interval), false, zt::Device::emulated(), kDeviceSteps);
    const zt::Config on_host_config =
        config_of(stage, interval + R"(, "activation_checkpointing": {"cpu_checkpointing": true})");
    const std::size_t host_before =
        zt::memory_snapshot(zt::DeviceType::host)[zt::MemoryCategory::activations].current;
    const TrainingRun on_host = train(on_host_config, false, zt::Device::emulated(), kDeviceSteps);
    const std::size_t host_peak =
        zt::memory_snapshot(zt::DeviceType::host)[zt::MemoryCategory::activations].peak - host_before;
    EXPECT_EQ(on_device.losses, host.losses);
    EXPECT_EQ(on_host.losses, host.losses);
    EXPECT_EQ(on_host.master, host.master);
    // The four checkpoints' inputs ([micro, 16, 32] fp32 each) are in host memory, not the device's.
    const std::size_t micro = kGlobalBatch / zt::testing::runtime().world_size() / 2;
    const std::size_t inputs = 4 * micro * 16 * 32 * sizeof(float);
    EXPECT_GE(host_peak, inputs);
    EXPECT_LT(on_host.activation_peak, on_device.activation_peak);
    if (zt::testing::runtime().world_rank() == 0) {
      std::printf(
          "[rank 0] stage %d on the emulated device: activation peak %zu B there with the inputs kept "
          "there, %zu B with cpu_checkpointing (host peak %zu B)\n",
          stage, on_device.activation_peak, on_host.activation_peak, host_peak);
    }
  }
}

}  // namespace
