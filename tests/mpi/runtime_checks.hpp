// Shared by the runtime tests: what the ranks of any zt::Runtime satisfy, whatever its world.
#pragma once

#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "zerotrain/runtime.hpp"

namespace zt::testing {

/// Local ranks on each node are 0..local_size-1, each exactly once; node sizes add up to the
/// runtime's world. Collective over runtime.world().
inline void expect_consistent_node_local_ranks(Runtime& runtime) {
  const auto gather = [&](int value) {
    std::vector<int> values(static_cast<std::size_t>(runtime.world_size()));
    runtime.world().all_gather(&value, values.data(), 1, DType::int32);
    return values;
  };
  const auto local_ranks = gather(runtime.local_rank());
  const auto nodes = gather(runtime.node_index());
  const auto local_sizes = gather(runtime.local_size());
  int total = 0;
  for (int node = 0; node < runtime.node_count(); ++node) {
    std::set<int> seen;
    int node_size = -1;
    for (int r = 0; r < runtime.world_size(); ++r) {
      if (nodes[static_cast<std::size_t>(r)] != node) continue;
      seen.insert(local_ranks[static_cast<std::size_t>(r)]);
      node_size = local_sizes[static_cast<std::size_t>(r)];
    }
    ASSERT_EQ(static_cast<int>(seen.size()), node_size) << "node " << node;
    EXPECT_EQ(*seen.begin(), 0);
    EXPECT_EQ(*seen.rbegin(), node_size - 1);
    total += node_size;
  }
  EXPECT_EQ(total, runtime.world_size());
}

}  // namespace zt::testing
