// The MPI runtime and the process grid, at whatever world size the test runs with.
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>
#include <vector>

#include "mpi_test_main.hpp"
#include "runtime_checks.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/process_grid.hpp"
#include "zerotrain/runtime.hpp"

namespace {

std::vector<int> gather_world(zt::Communicator& communicator, int value) {
  std::vector<int> values(static_cast<std::size_t>(communicator.size()));
  communicator.all_gather(&value, values.data(), 1, zt::DType::int32);
  return values;
}

TEST(Runtime, RanksMatchMpi) {
  zt::Runtime& runtime = zt::testing::runtime();
  int rank = -1, size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_EQ(runtime.world_rank(), rank);
  EXPECT_EQ(runtime.world_size(), size);
  EXPECT_GE(runtime.thread_level(), MPI_THREAD_FUNNELED);
  EXPECT_EQ(runtime.world().rank(), rank);
  EXPECT_EQ(runtime.world().size(), size);
  EXPECT_EQ(runtime.world().name(), "world");
}

TEST(Runtime, NodeLocalRanksAreConsistent) {
  zt::Runtime& runtime = zt::testing::runtime();
  ASSERT_GE(runtime.node_count(), 1);
  ASSERT_LT(runtime.node_index(), runtime.node_count());
  EXPECT_FALSE(runtime.host_name().empty());
  zt::testing::expect_consistent_node_local_ranks(runtime);
  EXPECT_EQ(runtime.device().is_cuda(), zt::cuda_status().usable());
}

TEST(Runtime, ErrorsNameTheRank) {
  try {
    ZT_THROW("something broke");
  } catch (const zt::Error& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find("on rank " + std::to_string(zt::testing::runtime().world_rank())), std::string::npos)
        << text;
    EXPECT_NE(text.find("tests/mpi/test_runtime.cpp:"), std::string::npos) << text;
    EXPECT_NE(text.find("something broke"), std::string::npos) << text;
  }
}

class GridShapes : public ::testing::TestWithParam<zt::GridShape> {};

TEST_P(GridShapes, SubCommunicatorsFollowTheDocumentedRankOrder) {
  zt::Runtime& runtime = zt::testing::runtime();
  zt::GridShape shape = GetParam();
  if (shape.pipeline * shape.tensor > runtime.world_size() ||
      runtime.world_size() % (shape.pipeline * shape.tensor)) {
    GTEST_SKIP() << "shape needs a world size divisible by " << shape.pipeline * shape.tensor;
  }
  zt::ProcessGrid grid(runtime, shape);
  const zt::GridShape& s = grid.shape();
  ASSERT_EQ(s.product(), runtime.world_size());
  EXPECT_EQ(grid.data().size(), s.data);
  EXPECT_EQ(grid.pipeline().size(), s.pipeline);
  EXPECT_EQ(grid.tensor().size(), s.tensor);
  const zt::GridCoordinates c = grid.coordinates();
  EXPECT_EQ(grid.world_rank_of(c), runtime.world_rank());
  EXPECT_EQ(grid.data().rank(), c.data);
  EXPECT_EQ(grid.pipeline().rank(), c.pipeline);
  EXPECT_EQ(grid.tensor().rank(), c.tensor);
  // Members of my data group are the world ranks that share my pipeline and tensor coordinates.
  const auto data_members = gather_world(grid.data(), runtime.world_rank());
  for (int d = 0; d < s.data; ++d) {
    EXPECT_EQ(data_members[static_cast<std::size_t>(d)], grid.world_rank_of({d, c.pipeline, c.tensor}));
  }
  const auto pipeline_members = gather_world(grid.pipeline(), runtime.world_rank());
  for (int p = 0; p < s.pipeline; ++p) {
    EXPECT_EQ(pipeline_members[static_cast<std::size_t>(p)], grid.world_rank_of({c.data, p, c.tensor}));
  }
  const auto tensor_members = gather_world(grid.tensor(), runtime.world_rank());
  for (int t = 0; t < s.tensor; ++t) {
    EXPECT_EQ(tensor_members[static_cast<std::size_t>(t)], grid.world_rank_of({c.data, c.pipeline, t}));
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GridShapes,
                         ::testing::Values(zt::GridShape{0, 1, 1}, zt::GridShape{0, 2, 1},
                                           zt::GridShape{0, 1, 2}, zt::GridShape{0, 2, 2},
                                           zt::GridShape{0, 4, 1}),
                         [](const auto& param_info) {
                           return "pp" + std::to_string(param_info.param.pipeline) + "_tp" +
                                  std::to_string(param_info.param.tensor);
                         });

TEST(ProcessGrid, WrongProductIsAClearError) {
  zt::Runtime& runtime = zt::testing::runtime();
  try {
    zt::ProcessGrid grid(runtime, {runtime.world_size() + 1, 1, 1});
    FAIL() << "accepted a grid larger than the world";
  } catch (const zt::Error& e) {
    const std::string text = e.what();
    EXPECT_NE(
        text.find("data (" + std::to_string(runtime.world_size() + 1) + ") x pipeline (1) x tensor (1)"),
        std::string::npos)
        << text;
    EXPECT_NE(text.find("the job has " + std::to_string(runtime.world_size()) + " ranks"), std::string::npos)
        << text;
  }
  EXPECT_THROW(zt::ProcessGrid(runtime, {0, runtime.world_size() + 1, 1}), zt::Error);
  EXPECT_THROW(zt::ProcessGrid(runtime, {1, 0, 1}), zt::Error);
}

TEST(ProcessGrid, CoordinatesRoundTrip) {
  const zt::GridShape shape{3, 2, 4};
  for (int rank = 0; rank < shape.product(); ++rank) {
    const auto c = zt::ProcessGrid::coordinates_of(rank, shape);
    EXPECT_EQ(c.pipeline * 12 + c.data * 4 + c.tensor, rank);
  }
}

}  // namespace
