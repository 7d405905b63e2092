// Parameter offload (zero_optimization.offload_param, ZeRO stage 3): device "cpu" and "nvme" train
// exactly as the in-memory stage 3, with the optimizer in memory, offloaded to the host or on NVMe
// too; host memory holds the kept pieces and the read buffers only; checkpoints move between
// offloaded and in-memory runs; a swap file damaged mid-run stops the forward with the file and
// offset. Swap files go to a directory under the temporary directory (ZT_TEST_SWAP_DIR chooses
// another; it must support O_DIRECT), removed afterwards.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

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
namespace fs = std::filesystem;

constexpr int kSteps = 4;
constexpr const char* kBf16 = R"(, "bf16": {"enabled": true})";

/// Stage 3 on the test GPT; `offload` holds offload sections (or is empty), `zero` more
/// zero_optimization keys (each from a comma).
zt::Config stage3_config(const std::string& offload, const char* optimizer = kAdamW,
                         const std::string& precision = "", const std::string& zero = "") {
  return config_for(3, offload, optimizer, precision, zero);
}

TEST(ParamOffload, CpuReproducesTheInMemoryRunBitwise) {
  for (const char* precision : {"", kBf16}) {
    SCOPED_TRACE(*precision ? "bf16" : "fp32");
    const RunResult in_memory = run(stage3_config("", kAdamW, precision), kSteps, nullptr);
    const zt::Config config = stage3_config(param_section("cpu"), kAdamW, precision);
    {
      auto model = zt::build_model(config);
      zt::Engine engine(zt::testing::runtime(), *model, config);
      const zt::ParametersPlacement placement = engine.parameters_placement();
      EXPECT_EQ(placement.device, zt::OffloadDevice::cpu);
      EXPECT_EQ(placement.describe(), "host memory (offload_param: cpu)");
      EXPECT_EQ(placement.host_elements, zt::engine_detail::inspect(engine).shard_size());
      EXPECT_EQ(placement.nvme_elements, 0);
    }
    expect_same_run(in_memory, run(config, kSteps, nullptr), "offload_param cpu");
  }
}

/// Parameters on NVMe against the in-memory stage 3: fp32 (the engine then keeps a separate fp32
/// master) and bf16; the optimizer in memory, on the host ("cpu") or on NVMe too; every piece on NVMe
/// or some kept in host memory (max_in_cpu); one buffer or several; a prefetch window smaller than
/// the model, so that reads run ahead of the gathers.
TEST(ParamOffload, NvmeReproducesTheInMemoryRunBitwise) {
  zt::testing::JobDirectory directory("zt-param-offload-test", "ZT_TEST_SWAP_DIR");
  const std::string path = directory.path();
  const ParamOffloadCase cases[] = {
      {"fp32 adamw, all on nvme", kAdamW, "", "", R"(, "max_in_cpu": 0)", ""},
      {"bf16 adamw, optimizer on nvme too, one buffer", kAdamW, kBf16, offload_section("nvme", path),
       R"(, "max_in_cpu": 0, "buffer_count": 1)", ""},
      {"fp32 sgd, optimizer cpu, part kept in host memory", kSgd, "", offload_section("cpu", ""),
       R"(, "max_in_cpu": 6000, "buffer_count": 2)", ""},
      {"bf16 adamw, small prefetch window, reads ahead", kAdamW, kBf16, "",
       R"(, "max_in_cpu": 0, "buffer_count": 3)",
       R"(, "stage3_prefetch_bucket_size": 3000, "stage3_max_live_parameters": 20000)"},
      {"fp32 adamw, small prefetch window, 2 buffers", kAdamW, "", "",
       R"(, "max_in_cpu": 0, "buffer_count": 2)", R"(, "stage3_prefetch_bucket_size": 3000)"},
      {"fp32 adamw, optimizer on nvme, everything fits in max_in_cpu", kAdamW, "",
       offload_section("nvme", path), "", ""},
  };
  for (const ParamOffloadCase& c : cases) {
    SCOPED_TRACE(c.name);
    const RunResult in_memory = run(stage3_config("", c.optimizer, c.precision, c.zero), kSteps, nullptr);
    const zt::Config config = param_offload_config(c, path);
    {
      auto model = zt::build_model(config);
      zt::Engine engine(zt::testing::runtime(), *model, config);
      const zt::ParametersPlacement placement = engine.parameters_placement();
      EXPECT_EQ(placement.device, zt::OffloadDevice::nvme);
      EXPECT_EQ(placement.host_elements + placement.nvme_elements,
                zt::engine_detail::inspect(engine).shard_size());
      EXPECT_FALSE(placement.swap_file.empty());
      EXPECT_TRUE(fs::exists(placement.swap_file)) << placement.swap_file;
      if (c.param_keys.find("\"max_in_cpu\": 0") != std::string::npos) {
        EXPECT_EQ(placement.host_elements, 0);
        auto data = zt::make_training_data(engine.config(), engine, std::nullopt);
        train_steps(engine, *data, 2);
        // Every piece is read for the forward and again for the backward, and written by the update.
        const zt::OffloadTiming& offload_timing = engine.last_step().offload;
        const std::uint64_t shard_bytes =
            static_cast<std::uint64_t>(zt::engine_detail::inspect(engine).shard_size()) *
            zt::dtype_size(engine.compute_dtype());
        EXPECT_EQ(offload_timing.parameter_bytes_written, shard_bytes);
        EXPECT_GT(offload_timing.parameter_bytes_read, 0u);
        // With the default reuse distance and live bound nothing is released within a forward and
        // backward, so no piece is read twice per micro-batch: reads run ahead in queue order and
        // are never dropped before use.
        const auto micro_batches = static_cast<std::uint64_t>(engine.batch().gradient_accumulation_steps);
        if (c.zero.find("max_live") == std::string::npos) {
          EXPECT_LE(offload_timing.parameter_bytes_read, micro_batches * shard_bytes);
        }
      } else if (c.param_keys.find("max_in_cpu") == std::string::npos) {
        EXPECT_EQ(placement.nvme_elements, 0) << "the default max_in_cpu (1e9) keeps a small model in memory";
      } else {
        EXPECT_GT(placement.host_elements, 0);
        EXPECT_GT(placement.nvme_elements, 0);
      }
    }
    expect_same_run(in_memory, run(config, kSteps, nullptr), c.name);
    expect_no_files_left(directory);
  }
}

/// With every piece on NVMe the host keeps the read buffers only: buffer_count buffers of the
/// largest piece, as the estimate says; with max_in_cpu above the shard, the whole shard.
TEST(ParamOffload, HostMemoryIsTheKeptPiecesAndTheBuffers) {
  zt::testing::JobDirectory directory("zt-param-offload-test", "ZT_TEST_SWAP_DIR");
  zt::Runtime& runtime = zt::testing::runtime();
  const int world = runtime.world_size();
  for (const char* precision : {"", kBf16}) {
    for (const char* keys : {R"(, "max_in_cpu": 0, "buffer_count": 3)", R"(, "buffer_count": 3)"}) {
      SCOPED_TRACE(std::string(*precision ? "bf16" : "fp32") + keys);
      const zt::Config config =
          stage3_config(param_section("nvme", directory.path(), keys), kAdamW, precision);
      const zt::MemoryEstimate predicted = zt::estimate_model_state_memory(config, world);
      const auto before = zt::memory_snapshot(zt::DeviceType::host);
      auto model = zt::build_model(config);
      zt::Engine engine(runtime, *model, config);
      auto measured = [&] {
        return zt::memory_snapshot(zt::DeviceType::host)[zt::MemoryCategory::parameters].current -
               before[zt::MemoryCategory::parameters].current;
      };
      const zt::ParametersPlacement placement = engine.parameters_placement();
      const std::size_t element = zt::dtype_size(engine.compute_dtype());
      EXPECT_EQ(measured(), placement.host_elements * element + placement.buffer_bytes);
      EXPECT_EQ(measured(), predicted.parameters_host) << "the estimate";
      if (placement.nvme_elements > 0) {
        // The largest piece is the token embedding's: vocab 256 x d_model 32, split over the ranks.
        const std::uint64_t piece = (256 * 32 + world - 1) / world * element;
        EXPECT_EQ(placement.buffer_count, 3);
        EXPECT_GE(placement.buffer_bytes, 3 * piece);
        EXPECT_LT(placement.buffer_bytes, 3 * (piece + 4096));
        EXPECT_EQ(placement.host_elements, 0);
        EXPECT_LT(measured(), predicted.parameters) << "less than the shard in memory";
        EXPECT_EQ(predicted.parameters_nvme, predicted.parameters);
      } else {
        EXPECT_EQ(measured(), predicted.parameters);
        EXPECT_EQ(predicted.parameters_nvme, 0u);
      }
      auto data = zt::make_training_data(engine.config(), engine, std::nullopt);
      train_steps(engine, *data, 1);
      EXPECT_EQ(measured(), placement.host_elements * element + placement.buffer_bytes) << "after a step";
    }
  }
}

TEST(ParamOffload, SettingsThatCannotWorkAreClearErrors) {
  zt::testing::JobDirectory directory("zt-param-offload-test", "ZT_TEST_SWAP_DIR");
  zt::Runtime& runtime = zt::testing::runtime();
  const int world = runtime.world_size();
  // A buffer smaller than a piece to swap: the message names the parameter and the size needed.
  const zt::Config small =
      stage3_config(param_section("nvme", directory.path(), R"(, "max_in_cpu": 0, "buffer_size": 1000)"));
  auto model = zt::build_model(small);
  const std::string message = zt::testing::error_of([&] { zt::Engine engine(runtime, *model, small); });
  const std::string piece = std::to_string((256 * 32 + world - 1) / world);
  EXPECT_NE(message.find("zero_optimization.offload_param.buffer_size is 1000 elements, but this rank's "
                         "piece of parameter 'wte.weight'"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("raise buffer_size to at least " + piece), std::string::npos) << message;
  expect_no_files_left(directory);

  const std::string count = zt::testing::error_of([&] {
    zt::check_engine_supports(
        stage3_config(param_section("nvme", directory.path(), R"(, "buffer_count": 0)")));
  });
  EXPECT_NE(count.find("zero_optimization.offload_param.buffer_count is 0; expected >= 1"), std::string::npos)
      << count;
  // A missing nvme_path fails in check_engine_supports, before the trainer builds the model.
  const std::string missing = (fs::path(directory.path()) / "missing").string();
  const std::string path_message = zt::testing::error_of(
      [&] { zt::check_engine_supports(stage3_config(param_section("nvme", missing))); });
  EXPECT_NE(path_message.find("zero_optimization.offload_param.nvme_path '" + missing +
                              "' is not usable: No such file or directory (create the directory first)"),
            std::string::npos)
      << path_message;
}

/// Checkpoints carry the parameters across offload settings: saved with the parameters (and the
/// optimizer) on NVMe and loaded in memory, and the reverse, the run goes on bit for bit.
TEST(ParamOffload, CheckpointsMoveBetweenNvmeAndMemory) {
  zt::testing::JobDirectory directory("zt-param-offload-test", "ZT_TEST_SWAP_DIR");
  constexpr int kSaveAt = 2;
  constexpr int kAfter = 2;
  const std::string path = directory.path();
  for (const char* precision : {"", kBf16}) {
    SCOPED_TRACE(*precision ? "bf16" : "fp32");
    const zt::Config in_memory = stage3_config("", kAdamW, precision);
    const zt::Config nvme = stage3_config(
        param_section("nvme", path, R"(, "max_in_cpu": 0)") + ", " + offload_section("nvme", path), kAdamW,
        precision);
    const RunResult uninterrupted = run(in_memory, kSaveAt + kAfter, nullptr);
    const zt::Config* directions[][2] = {{&nvme, &in_memory}, {&in_memory, &nvme}};
    for (std::size_t d = 0; d < std::size(directions); ++d) {
      const std::string name = d == 0 ? "nvme -> memory" : "memory -> nvme";
      SCOPED_TRACE(name);
      const std::string checkpoints =
          directory / ("ckpt-" + std::string(*precision ? "bf16-" : "fp32-") + std::to_string(d));
      const RunResult resumed =
          run_through_checkpoint(*directions[d][0], *directions[d][1], kSaveAt, kAfter, checkpoints);
      expect_same_run(uninterrupted, resumed, name);
    }
  }
}

/// A parameter swap file cut short behind the engine's back: the next forward stops with an
/// IoError that names the file and the offset, on every rank (each damaged its own), and the
/// engine is destroyed cleanly afterwards.
TEST(ParamOffload, TruncatedSwapFileStopsTheForwardNamingFileAndOffset) {
  zt::testing::JobDirectory directory("zt-param-offload-test", "ZT_TEST_SWAP_DIR");
  const zt::Config config = stage3_config(param_section("nvme", directory.path(), R"(, "max_in_cpu": 0)"));
  std::string message;
  std::string swap_file;
  {
    auto model = zt::build_model(config);
    zt::Engine engine(zt::testing::runtime(), *model, config);
    auto data = zt::make_training_data(engine.config(), engine, std::nullopt);
    train_steps(engine, *data, 1);
    swap_file = engine.parameters_placement().swap_file;
    ASSERT_EQ(::truncate(swap_file.c_str(), 0), 0) << swap_file;
    message = zt::testing::error_of([&] { train_steps(engine, *data, 1); });
  }
  EXPECT_NE(message.find("short read at offset"), std::string::npos) << message;
  EXPECT_NE(message.find(swap_file), std::string::npos) << message;
  expect_no_files_left(directory);
}

}  // namespace
