// Data-parallel sharding under real MPI: every rank computes only its own sample ids; gathered,
// each global batch must be exactly the single-process global batch, in order, with no duplicates.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <vector>

#include "mpi_test_main.hpp"
#include "zerotrain/communicator.hpp"
#include "zerotrain/data.hpp"

namespace {

// Gathers each rank's ids for one (step, micro-step); returns them in rank order.
std::vector<std::int64_t> gather_ids(zt::Communicator& world, const std::vector<std::uint64_t>& mine) {
  const std::vector<std::int64_t> send(mine.begin(), mine.end());
  std::vector<std::size_t> counts(static_cast<std::size_t>(world.size()), send.size());
  std::vector<std::int64_t> all(send.size() * counts.size());
  world.all_gather_v(send.data(), send.size(), all.data(), counts, zt::DType::int64);
  return all;
}

void check_sharding(const zt::TokenView& tokens, std::uint64_t micro_batch, std::uint64_t grad_accum,
                    std::uint64_t seed, std::uint64_t steps) {
  zt::Communicator& world = zt::testing::runtime().world();
  const auto world_size = static_cast<std::uint64_t>(world.size());
  const auto rank = static_cast<std::uint64_t>(world.rank());
  const zt::SampleWindows windows{.seq_len = 64};
  const zt::BatchShape shape{
      .micro_batch = micro_batch, .grad_accum = grad_accum, .data_parallel = world_size};
  zt::BatchLoader loader(tokens, windows, shape, rank, seed);
  // The reference: one process, the whole global batch.
  const zt::DataSampler reference(windows.count(tokens.size()), seed);

  for (std::uint64_t step = 0; step < steps; ++step, loader.advance()) {
    std::vector<std::int64_t> gathered;
    for (std::uint64_t a = 0; a < grad_accum; ++a) {
      const auto batch = loader.load(a);  // reads the windows too: they must be valid on every rank
      ASSERT_EQ(batch.inputs.size(), micro_batch * windows.seq_len);
      const auto part = gather_ids(world, batch.sample_ids);
      gathered.insert(gathered.end(), part.begin(), part.end());
    }
    const auto expected = reference.global_batch(step, shape.global_batch());
    ASSERT_EQ(gathered.size(), expected.size());
    for (std::size_t i = 0; i < expected.size(); ++i)
      ASSERT_EQ(static_cast<std::uint64_t>(gathered[i]), expected[i]) << "step " << step << " position " << i;
    // No sample twice within a global batch, unless it straddles an epoch boundary (the end of one
    // permutation and the start of the next may share ids; docs/data.md).
    const std::uint64_t first = step * shape.global_batch();
    const bool straddles =
        first / reference.num_samples() != (first + shape.global_batch() - 1) / reference.num_samples();
    if (!straddles) {
      EXPECT_EQ(std::set<std::int64_t>(gathered.begin(), gathered.end()).size(), gathered.size())
          << "step " << step;
    }
  }
}

TEST(DataSharding, UnionOfRanksIsTheGlobalBatch) {
  check_sharding(zt::builtin_corpus_view(), /*micro_batch=*/4, /*grad_accum=*/1, /*seed=*/1, /*steps=*/10);
  check_sharding(zt::builtin_corpus_view(), /*micro_batch=*/2, /*grad_accum=*/3, /*seed=*/99, /*steps=*/10);
}

TEST(DataSharding, GlobalBatchDoesNotDependOnWorldSize) {
  // Fixed global batch 8: 8/world per rank per micro-step, one accumulation step.
  zt::Communicator& world = zt::testing::runtime().world();
  const auto world_size = static_cast<std::uint64_t>(world.size());
  ASSERT_EQ(8 % world_size, 0U);
  check_sharding(zt::builtin_corpus_view(), 8 / world_size, 1, 5, 8);
}

TEST(DataSharding, ShardsSpanningEpochsStayConsistent) {
  // A tiny dataset of 13 samples: global batches cross epoch boundaries on every rank count.
  std::vector<std::uint32_t> tokens(13 * 64 + 1);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::uint32_t>(i % 256);
  check_sharding(zt::TokenView(std::span<const std::uint32_t>(tokens), 256), 1, 2, 3, 20);
}

}  // namespace
