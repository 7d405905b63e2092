// The engine on the emulated device (EngineOptions::device = Device::emulated()): memory that only
// the device API may touch (any other access faults; include/zerotrain/device.hpp), with the host's
// kernels and an emulated-device communicator per group. A training run there at ZeRO stages 0-3 is
// bitwise the host run, so no host-only path is left in the engine: a raw memcpy, a host pointer
// dereference or a host-side kernel on the model's state would crash the run. Its model states
// live on the device (the host holds none of them), exactly as the estimate says; checkpoints move
// between the two. With offload_optimizer "nvme" the host optimizer updates the sub-groups from the
// swap file with gradients brought down from the device through the staging pipeline, bitwise as
// the host engine with NVMe offload and the device engine with offload_optimizer "cpu".
#include <gtest/gtest.h>

#include <mpi.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "engine_runs.hpp"
#include "job_directory.hpp"
#include "mpi_test_main.hpp"
#include "offload_configs.hpp"
#include "src/engine/engine_access.hpp"
#include "test_helpers.hpp"
#include "zerotrain/engine.hpp"
#include "zerotrain/estimate.hpp"
#include "zerotrain/trainer.hpp"

namespace {

using namespace zt::testing::engine_runs;

constexpr int kSteps = 3;
constexpr int kGlobalBatch = 8;
constexpr zt::MemoryCategory kModelStates[] = {zt::MemoryCategory::parameters, zt::MemoryCategory::gradients,
                                               zt::MemoryCategory::optimizer_states};

zt::Config config_of(int stage, const std::string& extra = "") {
  const int world = zt::testing::runtime().world_size();
  return parse(gpt_config(kGlobalBatch / world / 2, 2,
                          R"(, "zero_optimization": {"stage": )" + std::to_string(stage) +
                              R"(, "reduce_bucket_size": 3000, "allgather_bucket_size": 3000})" + extra));
}

struct DeviceRun {
  std::vector<double> losses;
  std::vector<double> norms;
  std::vector<float> master;
  std::uint64_t held[3] = {};        // model-state bytes on the engine's device after training
  std::uint64_t host_grown[3] = {};  // ... and what the host gained meanwhile
};

DeviceRun train_on(zt::Device device, const zt::Config& config) {
  const zt::MemorySnapshot host_before = zt::memory_snapshot(zt::DeviceType::host);
  const zt::MemorySnapshot device_before = zt::memory_snapshot(device.type);
  auto model = zt::build_model(config);
  zt::Engine engine(zt::testing::runtime(), *model, config, {.device = device});
  auto data = zt::make_training_data(engine.config(), engine, std::nullopt);
  DeviceRun run;
  for (int step = 0; step < kSteps; ++step) {
    engine.train_batch([&](std::int64_t micro) { return data->load(static_cast<std::uint64_t>(micro)); });
    data->advance();
    run.losses.push_back(engine.last_step().loss);
    run.norms.push_back(engine.last_step().grad_norm);
  }
  run.master = real_master_parameters(engine);
  const zt::MemorySnapshot host_after = zt::memory_snapshot(zt::DeviceType::host);
  const zt::MemorySnapshot device_after = zt::memory_snapshot(device.type);
  for (std::size_t k = 0; k < 3; ++k) {
    run.held[k] = device_after[kModelStates[k]].current - device_before[kModelStates[k]].current;
    run.host_grown[k] = host_after[kModelStates[k]].current - host_before[kModelStates[k]].current;
  }
  return run;
}

TEST(EmulatedEngine, TrainsBitwiseAsTheHost) {
  const int world = zt::testing::runtime().world_size();
  for (int stage : {0, 1, 2, 3}) {
    for (const char* extra : {"", R"(, "bf16": {"enabled": true})", R"(, "fp16": {"enabled": true})"}) {
      SCOPED_TRACE("stage " + std::to_string(stage) + extra);
      const zt::Config config = config_of(stage, extra);
      const DeviceRun host = train_on(zt::Device::host(), config);
      const DeviceRun emulated = train_on(zt::Device::emulated(), config);
      EXPECT_EQ(emulated.losses, host.losses);
      // fp16's first steps overflow (dynamic loss scale): their norm is nan on both.
      ASSERT_EQ(emulated.norms.size(), host.norms.size());
      for (std::size_t i = 0; i < host.norms.size(); ++i) {
        if (std::isnan(host.norms[i])) {
          EXPECT_TRUE(std::isnan(emulated.norms[i])) << "step " << i + 1;
        } else {
          EXPECT_EQ(emulated.norms[i], host.norms[i]) << "step " << i + 1;
        }
      }
      EXPECT_EQ(emulated.master, host.master);
      EXPECT_LT(host.losses.back(), host.losses.front());
      // The model states are on the device, exactly the estimate's; the host keeps none of them.
      const zt::MemoryEstimate estimate = zt::estimate_model_state_memory(config, world);
      EXPECT_EQ(emulated.held[0], estimate.parameters_host);
      EXPECT_EQ(emulated.held[1], estimate.gradients);
      EXPECT_EQ(emulated.held[2], estimate.optimizer_states_host);
      for (std::size_t k = 0; k < 3; ++k) {
        EXPECT_EQ(emulated.host_grown[k], 0u) << zt::memory_category_name(kModelStates[k]);
        EXPECT_EQ(host.held[k], emulated.held[k]) << zt::memory_category_name(kModelStates[k]);
      }
    }
  }
}

/// Several forwards in flight and a caller's loss on the device too.
TEST(EmulatedEngine, ForwardsInFlightAndLossHelpers) {
  for (int stage : {0, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const zt::Config config = config_of(stage);
    std::vector<std::vector<double>> losses;
    for (zt::Device device : {zt::Device::host(), zt::Device::emulated()}) {
      auto model = zt::build_model(config);
      zt::Engine engine(zt::testing::runtime(), *model, config, {.device = device});
      auto data = zt::make_training_data(engine.config(), engine, std::nullopt);
      std::vector<double> run;
      for (int step = 0; step < kSteps; ++step) {
        const zt::Batch first = data->load(0), second = data->load(1);
        const zt::Tensor out0 = engine.forward(first.inputs);
        const zt::Tensor out1 = engine.forward(second.inputs);
        EXPECT_EQ(out0.device(), device);
        const zt::ExecutionContext& context = engine.execution();
        engine.backward(zt::cross_entropy_loss(out0, context.on_device(first.targets), context));
        engine.backward(zt::cross_entropy_loss(out1, context.on_device(second.targets), context));
        engine.step();
        engine.step();
        data->advance();
        run.push_back(engine.last_step().loss);
      }
      losses.push_back(run);
    }
    EXPECT_EQ(losses[1], losses[0]);
  }
}

TEST(EmulatedEngine, CheckpointsMoveBetweenTheDeviceAndTheHost) {
  zt::testing::JobDirectory directory("zt-emulated-checkpoint");
  for (int stage : {1, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const zt::Config config = config_of(stage);
    auto device_model = zt::build_model(config);
    zt::Engine on_device(zt::testing::runtime(), *device_model, config, {.device = zt::Device::emulated()});
    auto data = zt::make_training_data(on_device.config(), on_device, std::nullopt);
    for (int step = 0; step < 2; ++step) {
      on_device.train_batch(
          [&](std::int64_t micro) { return data->load(static_cast<std::uint64_t>(micro)); });
      data->advance();
    }
    const std::string tag = on_device.save_checkpoint(directory.path());
    auto host_model = zt::build_model(config);
    zt::Engine on_host(zt::testing::runtime(), *host_model, config);
    on_host.load_checkpoint(directory.path(), {.tag = tag});
    EXPECT_EQ(real_master_parameters(on_host), real_master_parameters(on_device));
    // And back: a host checkpoint into a fresh device engine.
    zt::SaveOptions save;
    save.tag = "from_host" + tag;
    const std::string host_tag = on_host.save_checkpoint(directory.path(), save);
    auto again_model = zt::build_model(config);
    zt::Engine again(zt::testing::runtime(), *again_model, config, {.device = zt::Device::emulated()});
    again.load_checkpoint(directory.path(), {.tag = host_tag});
    EXPECT_EQ(real_master_parameters(again), real_master_parameters(on_host));
    EXPECT_EQ(again.global_steps(), 2);
  }
}

/// A run of config_for's offload test GPT (small sub-groups that split the owned ranges) on `device`:
/// its losses and master, with its placement and what the host gained in memory while training.
struct OffloadRun {
  RunResult result;
  zt::OptimizerStatesPlacement placement;
  std::uint64_t host_grown[3] = {};
  std::uint64_t device_held[3] = {};
};

OffloadRun offload_run_on(zt::Device device, const zt::Config& config) {
  const zt::MemorySnapshot host_before = zt::memory_snapshot(zt::DeviceType::host);
  const zt::MemorySnapshot device_before = zt::memory_snapshot(device.type);
  auto model = zt::build_model(config);
  zt::Engine engine(zt::testing::runtime(), *model, config, {.device = device});
  auto data = zt::make_training_data(engine.config(), engine, std::nullopt);
  OffloadRun run;
  train_steps(engine, *data, kSteps, [&] { run.result.losses.push_back(engine.last_step().loss); });
  run.placement = engine.optimizer_states_placement();
  const zt::MemorySnapshot host_after = zt::memory_snapshot(zt::DeviceType::host);
  const zt::MemorySnapshot device_after = zt::memory_snapshot(device.type);
  for (std::size_t k = 0; k < 3; ++k) {
    run.host_grown[k] = host_after[kModelStates[k]].current - host_before[kModelStates[k]].current;
    run.device_held[k] = device_after[kModelStates[k]].current - device_before[kModelStates[k]].current;
  }
  run.result.master = real_master_parameters(engine);
  return run;
}

TEST(EmulatedEngine, NvmeOffloadTrainsBitwiseAsTheHostAndAsCpuOffload) {
  zt::testing::JobDirectory directory("zt-emulated-nvme", "ZT_TEST_SWAP_DIR");
  for (int stage : {1, 2, 3}) {
    for (const char* precision : {"", R"(, "bf16": {"enabled": true})"}) {
      for (int buffers : {1, 3}) {
        const bool bf16 = *precision != '\0';
        const std::string what = "stage " + std::to_string(stage) + (bf16 ? " bf16" : " fp32") + ", " +
                                 std::to_string(buffers) + " buffer(s)";
        SCOPED_TRACE(what);
        const zt::Config nvme =
            config_for(stage, offload_section("nvme", directory.path(), buffers), kAdamW, precision);
        const OffloadRun host = offload_run_on(zt::Device::host(), nvme);
        const OffloadRun emulated = offload_run_on(zt::Device::emulated(), nvme);
        expect_same_run(host.result, emulated.result, what + ": host nvme vs emulated nvme");
        EXPECT_LT(host.result.losses.back(), host.result.losses.front());
        const OffloadRun cpu = offload_run_on(
            zt::Device::emulated(), config_for(stage, offload_section("cpu", ""), kAdamW, precision));
        expect_same_run(cpu.result, emulated.result, what + ": emulated cpu vs emulated nvme");

        // Where the memory is: the states (and the bf16 master) in the swap file and its sub-group
        // buffers on the host, the staging buffers beside them (pinned with pin_memory, gradients and
        // parameters), accounted in the placement; nothing of the optimizer on the device.
        const zt::OptimizerStatesPlacement& placement = emulated.placement;
        EXPECT_EQ(placement.device, zt::OffloadDevice::nvme);
        EXPECT_EQ(placement.master_in_swap, bf16);
        EXPECT_EQ(placement.buffer_bytes, host.placement.buffer_bytes);
        EXPECT_EQ(host.placement.staging_bytes, 0u);
        const std::size_t element = bf16 ? 2 : 4;
        // Each buffer holds a chunk of gradients and one of parameters; a chunk is at most a sub-group.
        EXPECT_GT(placement.staging_bytes, 0u);
        EXPECT_LE(placement.staging_bytes,
                  static_cast<std::uint64_t>(buffers) * kOffloadSubGroup * 2 * element);
        EXPECT_NE(
            placement.describe().find(std::to_string(placement.staging_bytes) + " bytes of device staging"),
            std::string::npos)
            << placement.describe();
        EXPECT_EQ(emulated.host_grown[2], placement.buffer_bytes);  // optimizer_states
        EXPECT_EQ(emulated.host_grown[0] + emulated.host_grown[1], placement.staging_bytes);
        EXPECT_EQ(emulated.device_held[2], 0u) << "optimizer states on the device";
        EXPECT_EQ(emulated.device_held[0], host.host_grown[0]) << "parameters";
        EXPECT_EQ(emulated.device_held[1], host.host_grown[1]) << "gradients";
      }
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (zt::testing::runtime().world_rank() == 0) {
    EXPECT_EQ(directory.entries(), 0u) << "swap files left in " << directory.path();
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

/// A checkpoint of the emulated engine with NVMe offload: a fresh one loads it and trains on as the
/// uninterrupted run, and the host engine (in memory) reads the same master from it.
TEST(EmulatedEngine, NvmeOffloadCheckpointRoundTrip) {
  zt::testing::JobDirectory directory("zt-emulated-nvme-checkpoint", "ZT_TEST_SWAP_DIR");
  constexpr int kSaveAt = 2;
  for (int stage : {1, 3}) {
    for (const char* precision : {"", R"(, "bf16": {"enabled": true})"}) {
      SCOPED_TRACE("stage " + std::to_string(stage) + precision);
      const zt::Config config =
          config_for(stage, offload_section("nvme", directory.path() + "/swap"), kAdamW, precision);
      if (zt::testing::runtime().world_rank() == 0)
        std::filesystem::create_directories(directory.path() + "/swap");
      MPI_Barrier(MPI_COMM_WORLD);
      const std::string checkpoints =
          directory.path() + "/ckpt-" + std::to_string(stage) + (*precision ? "-bf16" : "-fp32");
      RunResult uninterrupted;
      {
        auto model = zt::build_model(config);
        zt::Engine engine(zt::testing::runtime(), *model, config, {.device = zt::Device::emulated()});
        auto data = zt::make_training_data(engine.config(), engine, std::nullopt);
        train_steps(engine, *data, kSteps, [&] { uninterrupted.losses.push_back(engine.last_step().loss); });
        uninterrupted.master = real_master_parameters(engine);
      }
      RunResult resumed;
      {
        auto model = zt::build_model(config);
        zt::Engine engine(zt::testing::runtime(), *model, config, {.device = zt::Device::emulated()});
        auto data = zt::make_training_data(engine.config(), engine, std::nullopt);
        train_steps(engine, *data, kSaveAt, [&] { resumed.losses.push_back(engine.last_step().loss); });
        zt::SaveOptions save;
        save.data_position = data->position();
        engine.save_checkpoint(checkpoints, save);
      }
      {
        auto model = zt::build_model(config);
        zt::Engine engine(zt::testing::runtime(), *model, config, {.device = zt::Device::emulated()});
        auto data = zt::make_training_data(engine.config(), engine, std::nullopt);
        const zt::LoadResult loaded = engine.load_checkpoint(checkpoints);
        ASSERT_TRUE(loaded.data_position.has_value());
        data->restore(*loaded.data_position);
        train_steps(engine, *data, kSteps - kSaveAt,
                    [&] { resumed.losses.push_back(engine.last_step().loss); });
        resumed.master = real_master_parameters(engine);
      }
      expect_same_run(uninterrupted, resumed, "through a checkpoint at step " + std::to_string(kSaveAt));
      // The host engine with the states in memory reads the emulated NVMe run's checkpoint.
      const zt::Config in_memory = config_for(stage, "", kAdamW, precision);
      auto model = zt::build_model(in_memory);
      zt::Engine on_host(zt::testing::runtime(), *model, in_memory);
      on_host.load_checkpoint(checkpoints);
      EXPECT_EQ(on_host.global_steps(), kSaveAt);
      auto saver_model = zt::build_model(config);
      zt::Engine saver(zt::testing::runtime(), *saver_model, config, {.device = zt::Device::emulated()});
      saver.load_checkpoint(checkpoints);
      EXPECT_EQ(real_master_parameters(on_host), real_master_parameters(saver));
    }
  }
}

TEST(EmulatedEngine, WhatNeedsTheHostIsAClearError) {
  zt::testing::JobDirectory directory("zt-emulated-offload");
  const int world = zt::testing::runtime().world_size();
  const zt::Config nvme = parse(
      gpt_config(kGlobalBatch / world / 2, 2,
                 R"(, "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": ")" +
                     directory.path() + R"("}})"));
  auto model = zt::build_model(nvme);
  const std::string message = zt::testing::error_of(
      [&] { zt::Engine engine(zt::testing::runtime(), *model, nvme, {.device = zt::Device::emulated()}); });
  EXPECT_NE(message.find("offload_param nvme with the engine on emulated:0"), std::string::npos) << message;
  EXPECT_NE(message.find("offload_optimizer cpu or nvme"), std::string::npos) << message;
}

}  // namespace
