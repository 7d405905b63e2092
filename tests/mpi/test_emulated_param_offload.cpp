// Parameters on NVMe (zero_optimization.offload_param "nvme", ZeRO stage 3) with the engine on the
// emulated device, whose memory only the device API may touch. The rank's pieces live in the
// parameter store's swap file and host buffers; every gather copies them from there into its
// staging on the device (ParameterStore::copy_to_device, the execution context's from_host), and the
// host optimizer (offload_optimizer "cpu" or "nvme", which the engine on a device requires) writes
// the new pieces into the store's buffers with the gradients brought down from the device
// (DeviceOffloadedUpdate). It trains bitwise as the host engine with the same config, the device
// keeps no parameter shard, and checkpoints move between it, the host (in memory or with the same
// offload) and another world size, resuming bitwise. The refusal without offload_optimizer is in
// test_emulated_engine.cpp.
#include <gtest/gtest.h>
#include <mpi.h>

#include <filesystem>
#include <memory>
#include <span>
#include <string>

#include "engine_runs.hpp"
#include "job_directory.hpp"
#include "mpi_test_main.hpp"
#include "offload_configs.hpp"
#include "test_helpers.hpp"
#include "zerotrain/checkpoint.hpp"
#include "zerotrain/engine.hpp"
#include "zerotrain/trainer.hpp"

namespace {

using namespace zt::testing::engine_runs;

// The config's WarmupLR gives the first two updates a learning rate of 0: from step 4 on the
// forwards read pieces the update wrote (a wrong copy of a zero-initialized bias shows only there).
constexpr int kSteps = 5;
constexpr const char* kBf16 = R"(, "bf16": {"enabled": true})";

/// A run on `device`: losses and master, the parameters' placement and swap traffic of the last
/// step, and the parameter bytes the device holds after training (gathered or persistent ones).
struct ParamOffloadRun {
  RunResult result;
  zt::ParametersPlacement placement;
  zt::OffloadTiming last_offload;
  std::uint64_t device_parameters = 0;
};

ParamOffloadRun param_offload_run_on(zt::Device device, const zt::Config& config) {
  const zt::MemorySnapshot before = zt::memory_snapshot(device.type);
  auto model = zt::build_model(config);
  zt::Engine engine(zt::testing::runtime(), *model, config, {.device = device});
  auto data = zt::make_training_data(engine.config(), engine, std::nullopt);
  ParamOffloadRun run;
  EXPECT_EQ(zt::engine_detail::inspect(engine).data_group_backend(),
            expected_data_group_backend(device, zt::testing::runtime().world_size()));
  train_steps(engine, *data, kSteps, [&] { run.result.losses.push_back(engine.last_step().loss); });
  run.placement = engine.parameters_placement();
  run.last_offload = engine.last_step().offload;
  run.device_parameters = zt::memory_snapshot(device.type)[zt::MemoryCategory::parameters].current -
                          before[zt::MemoryCategory::parameters].current;
  run.result.master = real_master_parameters(engine);
  return run;
}

/// One way a checkpoint travels: saved by `saver` on its device, loaded by `loader` on its.
struct CheckpointDirection {
  const char* name;
  const zt::Config& saver;
  zt::Device saver_device;
  const zt::Config& loader;
  zt::Device loader_device;
};

/// Each direction's checkpoint, saved after `save_at` steps under `base`-<its index> and resumed to
/// kSteps, gives the uninterrupted run bit for bit.
void expect_every_direction_resumes(const RunResult& uninterrupted,
                                    std::span<const CheckpointDirection> directions, int save_at,
                                    const std::string& base) {
  for (std::size_t d = 0; d < directions.size(); ++d) {
    const CheckpointDirection& direction = directions[d];
    expect_same_run(uninterrupted,
                    run_through_checkpoint(direction.saver, direction.loader, save_at, kSteps - save_at,
                                           base + "-" + std::to_string(d), direction.saver_device,
                                           direction.loader_device),
                    direction.name);
  }
}

/// The same config on the host and on the emulated device: fp32 (the engine keeps a separate fp32
/// master) and bf16; the optimizer on NVMe (the sub-group pipeline) or on the host ("cpu"); every
/// piece on NVMe or part of the shard kept in host memory; 1 to 3 buffers (one: every piece waits
/// for the previous one's write); a prefetch window smaller than the model, so reads run ahead of
/// the gathers; persistent parameters, gathered again after each update.
TEST(EmulatedParamOffload, TrainsBitwiseAsTheHost) {
  zt::testing::JobDirectory directory("zt-emulated-param-offload", "ZT_TEST_SWAP_DIR");
  const std::string path = directory.path();
  const ParamOffloadCase cases[] = {
      {"fp32 adamw, optimizer on nvme, 3 buffers", kAdamW, "", offload_section("nvme", path),
       R"(, "max_in_cpu": 0, "buffer_count": 3)", ""},
      {"bf16 adamw, optimizer on nvme, one buffer each", kAdamW, kBf16, offload_section("nvme", path, 1),
       R"(, "max_in_cpu": 0, "buffer_count": 1)", ""},
      {"fp32 sgd, optimizer cpu, part kept in host memory, 2 buffers", kSgd, "", offload_section("cpu", ""),
       R"(, "max_in_cpu": 6000, "buffer_count": 2)", ""},
      {"bf16 adamw, optimizer cpu, small prefetch window, persistent parameters", kAdamW, kBf16,
       offload_section("cpu", ""), R"(, "max_in_cpu": 0, "buffer_count": 3)",
       R"(, "stage3_prefetch_bucket_size": 3000, "stage3_max_live_parameters": 20000, )"
       R"("stage3_param_persistence_threshold": 100)"},
  };
  for (const ParamOffloadCase& c : cases) {
    SCOPED_TRACE(c.name);
    const zt::Config config = param_offload_config(c, path);
    const ParamOffloadRun host = param_offload_run_on(zt::Device::host(), config);
    const ParamOffloadRun emulated = param_offload_run_on(zt::Device::emulated(), config);
    expect_same_run(host.result, emulated.result, std::string(c.name) + ": host vs emulated");
    EXPECT_LT(host.result.losses.back(), host.result.losses.front());

    // The pieces really went through NVMe and the store's buffers on the device run.
    EXPECT_EQ(emulated.placement.device, zt::OffloadDevice::nvme);
    EXPECT_EQ(emulated.placement.nvme_elements, host.placement.nvme_elements);
    EXPECT_GT(emulated.placement.nvme_elements, 0);
    EXPECT_GT(emulated.last_offload.parameter_bytes_read, 0u);
    EXPECT_EQ(emulated.last_offload.parameter_bytes_written, host.last_offload.parameter_bytes_written);
    EXPECT_GT(emulated.last_offload.parameter_bytes_written, 0u);
    // Between steps the device holds no piece of the shard: only persistent parameters stay there.
    if (c.zero.find("persistence") == std::string::npos) {
      EXPECT_EQ(emulated.device_parameters, 0u) << "parameter bytes left on the device";
    } else {
      EXPECT_GT(emulated.device_parameters, 0u) << "persistent parameters on the device";
    }
  }
  expect_no_files_left(directory);
}

/// offload_param "cpu" with the engine on a device moves the pieces off it, into host memory (on the
/// host engine it changes nothing): every gather copies them to the device, the host optimizer
/// writes their new values there, no swap file is made, and the run is bitwise the host's with the
/// same config, with the optimizer in host memory or on NVMe; between steps the device holds no
/// piece of the shard; checkpoints move between it and the host. Without offload_optimizer the
/// engine says which keys to set.
TEST(EmulatedParamOffload, CpuKeepsThePiecesInHostMemoryOffTheDevice) {
  zt::testing::JobDirectory directory("zt-emulated-param-cpu", "ZT_TEST_SWAP_DIR");
  const std::string path = directory.path();
  struct CpuCase {
    const char* name;
    const char* optimizer;
    const char* precision;
    std::string optimizer_offload;
    std::string zero;
    bool pin_memory = true;  // offload_param.pin_memory (the default)
  };
  const CpuCase cases[] = {
      {"fp32 sgd, optimizer cpu", kSgd, "", offload_section("cpu", ""), ""},
      {"bf16 adamw, optimizer on nvme", kAdamW, kBf16, offload_section("nvme", path), ""},
      {"bf16 adamw, optimizer cpu, small prefetch window, persistent parameters", kAdamW, kBf16,
       offload_section("cpu", ""),
       R"(, "stage3_prefetch_bucket_size": 3000, "stage3_max_live_parameters": 20000, )"
       R"("stage3_param_persistence_threshold": 100)"},
      {"bf16 adamw, optimizer cpu, pageable parameters", kAdamW, kBf16, offload_section("cpu", ""), "",
       false},
  };
  for (const CpuCase& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string pin = c.pin_memory ? "" : R"(, "pin_memory": false)";
    const zt::Config config = config_for(3, param_section("cpu", "", pin) + ", " + c.optimizer_offload,
                                         c.optimizer, c.precision, c.zero);
    const ParamOffloadRun host = param_offload_run_on(zt::Device::host(), config);
    const ParamOffloadRun emulated = param_offload_run_on(zt::Device::emulated(), config);
    expect_same_run(host.result, emulated.result, std::string(c.name) + ": host vs emulated");
    EXPECT_LT(host.result.losses.back(), host.result.losses.front());
    EXPECT_EQ(emulated.placement.device, zt::OffloadDevice::cpu);
    EXPECT_EQ(emulated.placement.nvme_elements, 0);
    EXPECT_GT(emulated.placement.host_elements, 0);
    EXPECT_TRUE(emulated.placement.swap_file.empty()) << emulated.placement.swap_file;
    // With pin_memory the pieces are page-locked host memory, copied to the device on its transfer
    // stream (on the host engine nothing is copied, nothing pinned).
    EXPECT_EQ(emulated.placement.host_pinned, c.pin_memory);
    EXPECT_FALSE(host.placement.host_pinned);
    EXPECT_EQ(emulated.placement.describe(), c.pin_memory ? "host memory (offload_param: cpu, page-locked)"
                                                          : "host memory (offload_param: cpu)");
    EXPECT_EQ(emulated.last_offload.parameter_bytes_read, 0u) << "nothing read from NVMe";
    if (c.zero.find("persistence") == std::string::npos) {
      EXPECT_EQ(emulated.device_parameters, 0u) << "parameter bytes left on the device";
    } else {
      EXPECT_GT(emulated.device_parameters, 0u) << "persistent parameters on the device";
    }
  }
  // Without the host optimizer: a clear error, as with "nvme".
  const zt::Config alone = config_for(3, param_section("cpu"));
  auto model = zt::build_model(alone);
  const std::string message = zt::testing::error_of(
      [&] { zt::Engine engine(zt::testing::runtime(), *model, alone, {.device = zt::Device::emulated()}); });
  EXPECT_NE(message.find("zero_optimization.offload_param.device \"cpu\" with the engine on emulated:0 "
                         "needs zero_optimization.offload_optimizer.device \"cpu\" or \"nvme\""),
            std::string::npos)
      << message;
  expect_no_files_left(directory);

  // Checkpoints move between it and the host in memory, resuming bitwise (the pieces are written
  // through the store on the load, read from it for the gathers after it).
  zt::testing::JobDirectory checkpoints("zt-emulated-param-cpu-checkpoint");
  constexpr int kSaveAt = 3;  // after the first update that moves the parameters
  const zt::Config cpu = config_for(3, param_section("cpu") + ", " + offload_section("cpu", ""), kSgd);
  const zt::Config in_memory = config_for(3, "", kSgd);
  const RunResult uninterrupted = param_offload_run_on(zt::Device::emulated(), cpu).result;
  const CheckpointDirection directions[] = {
      {"emulated cpu -> emulated cpu", cpu, zt::Device::emulated(), cpu, zt::Device::emulated()},
      {"emulated cpu -> host in memory", cpu, zt::Device::emulated(), in_memory, zt::Device::host()},
      {"host in memory -> emulated cpu", in_memory, zt::Device::host(), cpu, zt::Device::emulated()},
  };
  expect_every_direction_resumes(uninterrupted, directions, kSaveAt, checkpoints.path() + "/cpu");
}

/// A checkpoint of the emulated engine with its parameters (and optimizer) on NVMe: resumed on the
/// emulated device and on the host with the same config, it trains on as the uninterrupted run; the
/// host engine in memory resumes it too, and an emulated NVMe engine resumes the host's in-memory
/// checkpoint, bitwise (the in-memory stage 3 trains as NVMe offload does). Loaded by one rank (another
/// world size, when the job has several), the master is the saved one exactly.
TEST(EmulatedParamOffload, CheckpointsMoveBetweenTheDeviceTheHostAndWorldSizes) {
  zt::testing::JobDirectory directory("zt-emulated-param-checkpoint", "ZT_TEST_SWAP_DIR");
  constexpr int kSaveAt = 3;  // after the first update that moves the parameters
  const zt::Device emulated = zt::Device::emulated();
  const zt::Device host = zt::Device::host();
  for (const char* precision : {"", kBf16}) {
    SCOPED_TRACE(*precision ? "bf16" : "fp32");
    const std::string swap = directory.path() + "/swap";
    if (zt::testing::runtime().world_rank() == 0) std::filesystem::create_directories(swap);
    MPI_Barrier(MPI_COMM_WORLD);
    const zt::Config nvme =
        config_for(3,
                   param_section("nvme", swap, R"(, "max_in_cpu": 0, "buffer_count": 2)") + ", " +
                       offload_section("nvme", swap),
                   kAdamW, precision);
    const zt::Config in_memory = config_for(3, "", kAdamW, precision);
    const std::string base = directory.path() + (*precision ? "/bf16" : "/fp32");

    const RunResult uninterrupted = param_offload_run_on(emulated, nvme).result;
    const CheckpointDirection directions[] = {
        {"emulated nvme -> emulated nvme", nvme, emulated, nvme, emulated},
        {"emulated nvme -> host nvme", nvme, emulated, nvme, host},
        {"emulated nvme -> host in memory", nvme, emulated, in_memory, host},
        {"host in memory -> emulated nvme", in_memory, host, nvme, emulated},
    };
    expect_every_direction_resumes(uninterrupted, directions, kSaveAt, base);

    // The emulated NVMe checkpoint of step kSaveAt (saved by run_through_checkpoint above) loaded by
    // one rank on the emulated device with its parameters on NVMe, and by the host in memory.
    const std::string saved = base + "-0";
    std::vector<float> saved_master;
    {
      auto model = zt::build_model(nvme);
      zt::Engine engine(zt::testing::runtime(), *model, nvme, {.device = emulated});
      engine.load_checkpoint(saved);
      saved_master = real_master_parameters(engine);
    }
    if (auto one = first_ranks(1)) {
      RunResult continued[2];  // on the emulated device, on the host
      const zt::Device devices[2] = {emulated, host};
      for (int d = 0; d < 2; ++d) {
        SCOPED_TRACE("one rank on " + devices[d].str());
        auto model = zt::build_model(nvme);
        zt::Engine engine(zt::testing::runtime(), *model, nvme,
                          {.data_parallel = one.get(), .device = devices[d]});
        const zt::LoadResult loaded = engine.load_checkpoint(saved);
        EXPECT_EQ(loaded.saved_world_size, zt::testing::runtime().world_size());
        EXPECT_EQ(engine.global_steps(), kSaveAt);
        EXPECT_EQ(real_master_parameters(engine), saved_master);
        // The pieces on NVMe hold the loaded values: a step from there is the same on both devices.
        auto data = zt::make_training_data(engine.config(), engine, std::nullopt);
        train_steps(engine, *data, 1, [&] { continued[d].losses.push_back(engine.last_step().loss); });
        continued[d].master = real_master_parameters(engine);
      }
      expect_same_run(continued[1], continued[0], "one rank: host nvme vs emulated nvme after the load");
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

}  // namespace
