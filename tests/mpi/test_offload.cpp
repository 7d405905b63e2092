// Optimizer offload (zero_optimization.offload_optimizer): device "cpu" and "nvme" train exactly as
// the in-memory optimizer at ZeRO stages 1-3, the NVMe swap keeps host memory to the sub-group
// buffers, checkpoints move between offloaded and in-memory runs, and a bad nvme_path fails at
// construction. Swap files go to a directory under the temporary directory (ZT_TEST_SWAP_DIR
// chooses another; it must support O_DIRECT), removed afterwards.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "engine_runs.hpp"
#include "job_directory.hpp"
#include "mpi_test_main.hpp"
#include "offload_configs.hpp"
#include "test_helpers.hpp"
#include "zerotrain/checkpoint.hpp"
#include "zerotrain/engine.hpp"
#include "zerotrain/estimate.hpp"
#include "zerotrain/trainer.hpp"

namespace {

using namespace zt::testing::engine_runs;
namespace fs = std::filesystem;

constexpr int kSteps = 5;
constexpr int kSubGroup = kOffloadSubGroup;

TEST(Offload, CpuReproducesTheInMemoryRunBitwise) {
  for (int stage : {1, 2, 3}) {
    const RunResult in_memory = run(config_for(stage, ""), kSteps, nullptr);
    const zt::Config config = config_for(stage, offload_section("cpu", ""));
    {
      auto model = zt::build_model(config);
      zt::Engine engine(zt::testing::runtime(), *model, config);
      EXPECT_EQ(engine.optimizer_states_placement().device, zt::OffloadDevice::cpu);
      EXPECT_EQ(engine.optimizer_states_placement().describe(), "host memory (offload_optimizer: cpu)");
    }
    expect_same_run(in_memory, run(config, kSteps, nullptr), "cpu offload, stage " + std::to_string(stage));
  }
}

/// NVMe offload against the in-memory optimizer: AdamW and SGD with momentum, stages 1-3, fp32 (only
/// the moments swap) and bf16 (the fp32 master swaps too), 1 to 4 pipeline buffers.
TEST(Offload, NvmeReproducesTheInMemoryRunBitwise) {
  zt::testing::JobDirectory directory("zt-offload-test", "ZT_TEST_SWAP_DIR");
  struct Case {
    int stage;
    const char* optimizer;
    const char* precision;
    int buffers;
  };
  const Case cases[] = {
      {1, kAdamW, "", 3},
      {2, kAdamW, "", 4},
      {3, kAdamW, "", 3},
      {2, kSgd, "", 2},
      {3, kSgd, "", 1},
      {1, kAdamW, R"(, "bf16": {"enabled": true})", 3},
      {3, kAdamW, R"(, "bf16": {"enabled": true})", 4},
  };
  for (const Case& c : cases) {
    const std::string what = std::string("stage ") + std::to_string(c.stage) +
                             (c.optimizer == kSgd ? " sgd" : " adamw") + (*c.precision ? " bf16" : " fp32") +
                             ", " + std::to_string(c.buffers) + " buffers";
    SCOPED_TRACE(what);
    const RunResult in_memory = run(config_for(c.stage, "", c.optimizer, c.precision), kSteps, nullptr);
    const RunResult offloaded = run(
        config_for(c.stage, offload_section("nvme", directory.path(), c.buffers), c.optimizer, c.precision),
        kSteps, nullptr);
    expect_same_run(in_memory, offloaded, what);
    expect_no_files_left(directory);
  }
}

/// With NVMe offload the host holds the sub-group buffers only: buffer_count x sub-group x arrays.
/// Measured against the estimate's host bytes, with the in-memory states for contrast.
TEST(Offload, NvmeHostMemoryIsTheSubGroupBuffers) {
  zt::testing::JobDirectory directory("zt-offload-test", "ZT_TEST_SWAP_DIR");
  zt::Runtime& runtime = zt::testing::runtime();
  const int world = runtime.world_size();
  for (const char* precision : {"", R"(, "bf16": {"enabled": true})"}) {
    for (int stage : {1, 3}) {
      SCOPED_TRACE(std::string("stage ") + std::to_string(stage) + precision);
      const int buffers = 2;
      const zt::Config config =
          config_for(stage, offload_section("nvme", directory.path(), buffers), kAdamW, precision);
      const zt::MemoryEstimate predicted = zt::estimate_model_state_memory(config, world);
      const auto before = zt::memory_snapshot(zt::DeviceType::host);
      auto model = zt::build_model(config);
      zt::Engine engine(runtime, *model, config);
      const auto after = zt::memory_snapshot(zt::DeviceType::host);
      auto measured = [&](const zt::MemorySnapshot& snapshot) {
        return snapshot[zt::MemoryCategory::optimizer_states].current -
               before[zt::MemoryCategory::optimizer_states].current;
      };
      const zt::OptimizerStatesPlacement placement = engine.optimizer_states_placement();
      EXPECT_EQ(placement.device, zt::OffloadDevice::nvme);
      EXPECT_EQ(placement.master_in_swap, *precision != '\0');
      EXPECT_EQ(measured(after), placement.buffer_bytes);
      const std::size_t arrays = *precision ? 3 : 2;  // (master,) exp_avg, exp_avg_sq
      const std::uint64_t formula = buffers * static_cast<std::uint64_t>(kSubGroup) * arrays * sizeof(float);
      // Each array of a sub-group starts at the direct-I/O alignment (4096 bytes here, at most 64 KiB).
      EXPECT_GE(measured(after), formula);
      EXPECT_LE(measured(after), formula + buffers * arrays * 65536);
      // The estimate: host bytes of the states are the buffers, the swap file holds K x shard.
      EXPECT_GE(predicted.optimizer_states_host, formula);
      EXPECT_LE(predicted.optimizer_states_host, formula + buffers * arrays * 65536);
      EXPECT_EQ(measured(after) >= predicted.optimizer_states_host
                    ? measured(after) - predicted.optimizer_states_host
                    : predicted.optimizer_states_host - measured(after),
                0u)
          << "measured " << measured(after) << ", predicted " << predicted.optimizer_states_host;
      EXPECT_GE(placement.swap_bytes, predicted.optimizer_states);  // the whole states, on disk
      EXPECT_EQ(predicted.nvme_bytes, predicted.optimizer_states);
      EXPECT_LT(measured(after), predicted.optimizer_states);  // and less than in memory

      auto data = zt::make_training_data(engine.config(), engine, std::nullopt);
      for (std::int64_t micro = 0; micro < engine.batch().gradient_accumulation_steps; ++micro) {
        engine.forward(data->load(static_cast<std::uint64_t>(micro)));
        engine.backward();
        engine.step();
      }
      EXPECT_EQ(measured(zt::memory_snapshot(zt::DeviceType::host)), measured(after)) << "after a step";
      EXPECT_GT(engine.last_step().offload.wall_seconds, 0.0);
      EXPECT_GT(engine.last_step().offload.update_seconds, 0.0);
    }
  }
}

TEST(Offload, BadNvmePathFailsAtConstruction) {
  zt::testing::JobDirectory directory("zt-offload-test", "ZT_TEST_SWAP_DIR");
  zt::Runtime& runtime = zt::testing::runtime();
  const std::string missing = directory / "missing";
  const zt::Config config = config_for(2, offload_section("nvme", missing));
  auto model = zt::build_model(config);
  const std::string message = zt::testing::error_of([&] { zt::Engine engine(runtime, *model, config); });
  EXPECT_NE(message.find("nvme_path '" + missing + "' is not usable: No such file or directory"),
            std::string::npos)
      << message;

  // A file where the directory should be.
  if (runtime.world_rank() == 0) std::ofstream(directory / "file") << "x";
  MPI_Barrier(MPI_COMM_WORLD);
  const zt::Config under_file = config_for(2, offload_section("nvme", directory / "file"));
  auto model2 = zt::build_model(under_file);
  const std::string message2 =
      zt::testing::error_of([&] { zt::Engine engine(runtime, *model2, under_file); });
  EXPECT_NE(message2.find("is not a directory"), std::string::npos) << message2;

  // Settings this engine does not honour are refused with what to change.
  const std::string partial = zt::testing::error_of([&] {
    zt::check_engine_supports(parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
        "offload_optimizer": {"device": "cpu", "ratio": 0.5}}})"));
  });
  EXPECT_NE(partial.find("partial optimizer offload is not supported"), std::string::npos) << partial;
  // A config built in code skips the parser's checks; the engine's own say the same.
  const std::string parameters = zt::testing::error_of([&] {
    zt::Config refused = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
        "offload_param": {"device": "cpu"}}})");
    refused.zero_optimization.offload_param.max_in_cpu = -1;
    zt::check_engine_supports(refused);
  });
  EXPECT_NE(parameters.find("zero_optimization.offload_param.max_in_cpu is -1; expected >= 0"),
            std::string::npos)
      << parameters;
}

/// Checkpoints carry the real state values across offload settings: saved with NVMe offload and
/// loaded in memory, and the reverse, the run continues bit for bit as the uninterrupted one.
TEST(Offload, CheckpointsMoveBetweenNvmeAndMemory) {
  zt::testing::JobDirectory directory("zt-offload-test", "ZT_TEST_SWAP_DIR");
  constexpr int kSaveAt = 3;
  constexpr int kAfter = 2;
  const std::string swap = directory.path();
  for (const char* precision : {"", R"(, "bf16": {"enabled": true})"}) {
    for (int stage : {1, 3}) {
      const std::string trace = "stage " + std::to_string(stage) + precision;
      SCOPED_TRACE(trace);
      const zt::Config in_memory = config_for(stage, "", kAdamW, precision);
      const zt::Config nvme = config_for(stage, offload_section("nvme", swap), kAdamW, precision);
      const RunResult uninterrupted = run(in_memory, kSaveAt + kAfter, nullptr);

      struct Direction {
        const zt::Config* saver;
        const zt::Config* loader;
        const char* name;
      };
      const Direction directions[] = {{&nvme, &in_memory, "nvme -> memory"},
                                      {&in_memory, &nvme, "memory -> nvme"},
                                      {&nvme, &nvme, "nvme -> nvme"}};
      for (std::size_t d = 0; d < std::size(directions); ++d) {
        const Direction& direction = directions[d];
        SCOPED_TRACE(direction.name);
        const std::string checkpoints = directory / ("ckpt-" + std::to_string(stage) +
                                                     (*precision ? "-bf16-" : "-fp32-") + std::to_string(d));
        const RunResult resumed =
            run_through_checkpoint(*direction.saver, *direction.loader, kSaveAt, kAfter, checkpoints);
        expect_same_run(uninterrupted, resumed, trace + ", " + direction.name);
      }
    }
  }
}

}  // namespace
