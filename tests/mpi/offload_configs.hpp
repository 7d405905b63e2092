// Shared by the offload tests (test_offload.cpp, test_offload_errors.cpp, test_param_offload.cpp,
// test_emulated_*offload.cpp): the test GPT with small sub-groups and small aio blocks, its
// offload_optimizer and offload_param sections, and the bitwise comparison of two runs.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <string>
#include <vector>

#include "engine_runs.hpp"
#include "job_directory.hpp"
#include "mpi_test_main.hpp"
#include "zerotrain/checkpoint.hpp"

namespace zt::testing::engine_runs {

inline constexpr int kOffloadGlobalBatch = 8;
// Small sub-groups: the shard (about 35k elements at one rank, 9k at four) spans many of them, and
// they split parameter pieces in the middle.
inline constexpr int kOffloadSubGroup = 1500;

/// An offload_optimizer entry: device "none", "cpu" or "nvme" (then with nvme_path and buffer_count).
inline std::string offload_section(const std::string& device, const std::string& nvme_path,
                                   int buffer_count = 3) {
  std::string section = R"("offload_optimizer": {"device": ")" + device + "\"";
  if (device == "nvme") {
    section += R"(, "nvme_path": ")" + nvme_path + R"(", "buffer_count": )" + std::to_string(buffer_count);
  }
  return section + "}";
}

/// An offload_param entry on `device`; for nvme under `path`, with the given keys appended.
inline std::string param_section(const std::string& device, const std::string& path = "",
                                 const std::string& keys = "") {
  std::string section = R"("offload_param": {"device": ")" + device + "\"";
  if (device == "nvme") section += R"(, "nvme_path": ")" + path + "\"";
  return section + keys + "}";
}

/// The test GPT at `stage` over the world; `offload` is "" (in memory) or offload entries
/// (offload_optimizer, offload_param); `zero_keys` more zero_optimization keys (from a comma).
/// No parameter is persistent unless `zero_keys` sets stage3_param_persistence_threshold.
inline Config config_for(int stage, const std::string& offload, const char* optimizer = kAdamW,
                         const std::string& precision = "", const std::string& zero_keys = "") {
  const int world = runtime().world_size();
  const bool persistence_given = zero_keys.find("stage3_param_persistence_threshold") != std::string::npos;
  std::string zero = R"(, "zero_optimization": {"stage": )" + std::to_string(stage) +
                     (persistence_given ? "" : R"(, "stage3_param_persistence_threshold": 0)") +
                     R"(, "sub_group_size": )" + std::to_string(kOffloadSubGroup) + zero_keys;
  if (!offload.empty()) zero += ", " + offload;
  zero += "}";
  // Small aio blocks: many kernel requests per sub-group, as a large model's sub-groups would be.
  const std::string aio = R"(, "aio": {"block_size": 65536, "queue_depth": 4})";
  return parse(gpt_config(kOffloadGlobalBatch / world / 2, 2, zero + aio + precision, optimizer));
}

/// A stage-3 run with the parameters on NVMe: its optimizer and precision, its offload_optimizer
/// entry ("": in memory), the offload_param keys after nvme_path, and more zero_optimization keys.
struct ParamOffloadCase {
  const char* name;
  const char* optimizer;
  const char* precision;
  std::string optimizer_offload;
  std::string param_keys;
  std::string zero;
};

/// The config of `c` with its swap files under `path`.
inline Config param_offload_config(const ParamOffloadCase& c, const std::string& path) {
  std::string offload = param_section("nvme", path, c.param_keys);
  if (!c.optimizer_offload.empty()) offload += ", " + c.optimizer_offload;
  return config_for(3, offload, c.optimizer, c.precision, c.zero);
}

/// Rank 0 finds `directory` empty (no swap file left), after every rank is done with it.
inline void expect_no_files_left(const JobDirectory& directory) {
  MPI_Barrier(MPI_COMM_WORLD);
  if (runtime().world_rank() == 0) {
    EXPECT_EQ(directory.entries(), 0u) << "swap files left in " << directory.path();
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

/// Losses and master weights bit for bit equal.
inline void expect_same_run(const RunResult& expected, const RunResult& actual, const std::string& what) {
  ASSERT_EQ(expected.losses.size(), actual.losses.size()) << what;
  for (std::size_t i = 0; i < expected.losses.size(); ++i)
    EXPECT_EQ(expected.losses[i], actual.losses[i]) << what << ", step " << i + 1;
  ASSERT_EQ(expected.master.size(), actual.master.size()) << what;
  std::size_t differing = 0;
  for (std::size_t i = 0; i < expected.master.size(); ++i)
    differing += expected.master[i] != actual.master[i];
  EXPECT_EQ(differing, 0u) << what << ": master weights differ (max "
                           << max_abs_difference(expected.master, actual.master) << ")";
}

/// `save_at` steps with `saver` (its engine on `saver_device`), a checkpoint (with the data position)
/// under `directory`, then an engine built with `loader` (on `loader_device`) loads it and trains
/// `after` more steps: the losses of all steps and the final master weights, to compare with an
/// uninterrupted run.
inline RunResult run_through_checkpoint(const Config& saver, const Config& loader, int save_at, int after,
                                        const std::string& directory, Device saver_device = Device::host(),
                                        Device loader_device = Device::host()) {
  RunResult resumed;
  {
    auto model = build_model(saver);
    Engine engine(runtime(), *model, saver, {.device = saver_device});
    auto data = make_training_data(engine.config(), engine, std::nullopt);
    train_steps(engine, *data, save_at, [&] { resumed.losses.push_back(engine.last_step().loss); });
    SaveOptions options;
    options.data_position = data->position();
    engine.save_checkpoint(directory, options);
  }
  auto model = build_model(loader);
  Engine engine(runtime(), *model, loader, {.device = loader_device});
  auto data = make_training_data(engine.config(), engine, std::nullopt);
  const LoadResult loaded = engine.load_checkpoint(directory);
  EXPECT_TRUE(loaded.data_position.has_value());
  if (loaded.data_position) data->restore(*loaded.data_position);
  train_steps(engine, *data, after, [&] { resumed.losses.push_back(engine.last_step().loss); });
  resumed.master = real_master_parameters(engine);
  return resumed;
}

}  // namespace zt::testing::engine_runs
