// Shared by the optimizer-offload tests (test_offload.cpp, test_offload_errors.cpp): the test GPT
// with small sub-groups and small aio blocks, its offload_optimizer section, and the bitwise
// comparison of two runs.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <string>

#include "engine_runs.hpp"
#include "mpi_test_main.hpp"

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

/// The test GPT at `stage` over the world; `offload` is "" (in memory) or an offload_optimizer entry.
inline Config config_for(int stage, const std::string& offload, const char* optimizer = kAdamW,
                         const std::string& precision = "") {
  const int world = runtime().world_size();
  std::string zero = R"(, "zero_optimization": {"stage": )" + std::to_string(stage) +
                     R"(, "stage3_param_persistence_threshold": 0, "sub_group_size": )" +
                     std::to_string(kOffloadSubGroup);
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

}  // namespace zt::testing::engine_runs
