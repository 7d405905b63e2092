// Checks the MPI test main itself: a test that fails on the last rank only must fail on every rank,
// and rank 0's report must name the failing rank. Run by ctest through expect_failure.cmake, which
// requires a non-zero exit and that message.
#include <gtest/gtest.h>

#include "mpi_test_main.hpp"

TEST(HarnessSelfCheck, FailsOnLastRankOnly) {
  const zt::Runtime& runtime = zt::testing::runtime();
  EXPECT_NE(runtime.world_rank(), runtime.world_size() - 1) << "deliberate failure on the last rank";
}

TEST(HarnessSelfCheck, PassesEverywhere) {
  SUCCEED();
}
