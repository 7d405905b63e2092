// The engine on the emulated device (EngineOptions::device = Device::emulated()): memory that only
// the device API may touch (any other access faults; include/zerotrain/device.hpp), with the host's
// kernels and an emulated-device communicator per group. A training run there at ZeRO stages 0-3 is
// bitwise the host run, so no host-only path is left in the engine: a raw memcpy, a host pointer
// dereference or a host-side kernel on the model's state would crash the run. Its model states
// live on the device (the host holds none of them), exactly as the estimate says; checkpoints move
// between the two. NVMe optimizer offload on this device: test_emulated_offload.cpp; parameters on
// NVMe: test_emulated_param_offload.cpp.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <string>
#include <vector>

#include "engine_runs.hpp"
#include "job_directory.hpp"
#include "mpi_test_main.hpp"
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
  std::vector<std::uint64_t> comm_bytes;  // each step's model traffic (metrics' comm_bytes)
  std::vector<float> master;
  std::uint64_t held[3] = {};                  // model-state bytes on the engine's device after training
  std::uint64_t host_grown[3] = {};            // ... and what the host gained meanwhile
  std::string parameters_where, states_where;  // the placements' describe()
};

DeviceRun train_on(zt::Device device, const zt::Config& config) {
  const zt::MemorySnapshot host_before = zt::memory_snapshot(zt::DeviceType::host);
  const zt::MemorySnapshot device_before = zt::memory_snapshot(device.type);
  auto model = zt::build_model(config);
  zt::Engine engine(zt::testing::runtime(), *model, config, {.device = device});
  auto data = zt::make_training_data(engine.config(), engine, std::nullopt);
  DeviceRun run;
  EXPECT_EQ(zt::engine_detail::inspect(engine).data_group_backend(),
            expected_data_group_backend(device, zt::testing::runtime().world_size()));
  for (int step = 0; step < kSteps; ++step) {
    engine.train_batch([&](std::int64_t micro) { return data->load(static_cast<std::uint64_t>(micro)); });
    data->advance();
    run.losses.push_back(engine.last_step().loss);
    run.norms.push_back(engine.last_step().grad_norm);
    run.comm_bytes.push_back(engine.last_step().comm_bytes);
  }
  run.master = real_master_parameters(engine);
  run.parameters_where = engine.parameters_placement().describe();
  run.states_where = engine.optimizer_states_placement().describe();
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
      // The same reductions and gathers, through the device's data-group communicator.
      EXPECT_EQ(emulated.comm_bytes, host.comm_bytes);
      EXPECT_EQ(host.comm_bytes.back() > 0, world > 1);
      EXPECT_LT(host.losses.back(), host.losses.front());
      EXPECT_EQ(host.parameters_where, "host memory");
      EXPECT_EQ(host.states_where, "host memory");
      EXPECT_EQ(emulated.parameters_where, "emulated:0 memory");
      EXPECT_EQ(emulated.states_where, "emulated:0 memory");
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

/// Parameters on NVMe need the host optimizer on a device (it writes the new pieces into the
/// parameter store's host buffers): without offload_optimizer the engine says which keys to set,
/// before any swap file exists. (With it: test_emulated_param_offload.cpp.)
TEST(EmulatedEngine, ParametersOnNvmeWithoutOptimizerOffloadIsAClearError) {
  zt::testing::JobDirectory directory("zt-emulated-offload");
  const int world = zt::testing::runtime().world_size();
  const zt::Config nvme = parse(
      gpt_config(kGlobalBatch / world / 2, 2,
                 R"(, "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": ")" +
                     directory.path() + R"(", "max_in_cpu": 0}})"));
  auto model = zt::build_model(nvme);
  const std::string message = zt::testing::error_of(
      [&] { zt::Engine engine(zt::testing::runtime(), *model, nvme, {.device = zt::Device::emulated()}); });
  EXPECT_NE(message.find("zero_optimization.offload_param.device \"nvme\" with the engine on emulated:0 "
                         "needs zero_optimization.offload_optimizer.device \"cpu\" or \"nvme\""),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("or train on the host"), std::string::npos) << message;
  MPI_Barrier(MPI_COMM_WORLD);
  if (zt::testing::runtime().world_rank() == 0) {
    EXPECT_EQ(directory.entries(), 0u) << "a swap file was made";
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
