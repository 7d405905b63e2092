// Shared by the offload tests (test_offload.cpp, test_offload_errors.cpp, test_param_offload.cpp): the test
// GPT with small sub-groups and small aio blocks, its offload_optimizer section, and the bitwise comparison
// of two runs.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <string>
#include <vector>

#include "engine_runs.hpp"
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

/// The test GPT at `stage` over the world; `offload` is "" (in memory) or offload entries
/// (offload_optimizer, offload_param); `zero_keys` more zero_optimization keys (from a comma).
inline Config config_for(int stage, const std::string& offload, const char* optimizer = kAdamW,
                         const std::string& precision = "", const std::string& zero_keys = "") {
  const int world = runtime().world_size();
  std::string zero = R"(, "zero_optimization": {"stage": )" + std::to_string(stage) +
                     R"(, "stage3_param_persistence_threshold": 0, "sub_group_size": )" +
                     std::to_string(kOffloadSubGroup) + zero_keys;
  if (!offload.empty()) zero += ", " + offload;
  zero += "}";
  // Small aio blocks: many kernel requests per sub-group, as a large model's sub-groups would be.
  const std::string aio = R"(, "aio": {"block_size": 65536, "queue_depth": 4})";
  return parse(gpt_config(kOffloadGlobalBatch / world / 2, 2, zero + aio + precision, optimizer));
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

/// `save_at` steps with `saver`, a checkpoint (with the data position) under `directory`, then an
/// engine built with `loader` loads it and trains `after` more steps: the losses of all steps and
/// the final master weights, to compare with an uninterrupted run.
inline RunResult run_through_checkpoint(const Config& saver, const Config& loader, int save_at, int after,
                                        const std::string& directory) {
  RunResult resumed;
  {
    auto model = build_model(saver);
    Engine engine(runtime(), *model, saver);
    auto data = make_training_data(engine.config(), engine, std::nullopt);
    train_steps(engine, *data, save_at, [&] { resumed.losses.push_back(engine.last_step().loss); });
    SaveOptions options;
    options.data_position = data->position();
    engine.save_checkpoint(directory, options);
  }
  auto model = build_model(loader);
  Engine engine(runtime(), *model, loader);
  auto data = make_training_data(engine.config(), engine, std::nullopt);
  const LoadResult loaded = engine.load_checkpoint(directory);
  EXPECT_TRUE(loaded.data_position.has_value());
  if (loaded.data_position) data->restore(*loaded.data_position);
  train_steps(engine, *data, after, [&] { resumed.losses.push_back(engine.last_step().loss); });
  resumed.master = real_master_parameters(engine);
  return resumed;
}

}  // namespace zt::testing::engine_runs
