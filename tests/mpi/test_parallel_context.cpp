// The engine on a process grid (EngineOptions::grid): data x tensor groups, reductions spanning
// the groups they name. A tensor group of 2 over a model whose parameters are all replicated holds
// two identical copies of each data-parallel rank's work: the run must be bitwise the data-parallel
// run on the grid's data group, which holds only when the gradient norm counts a replicated
// parameter once (counted on both tensor ranks, the norm grows by sqrt(2) and the clipping differs)
// and the loss is averaged over the data group only. Checkpoints of such a grid write each
// replicated parameter once and load on a plain data-parallel job. A pipeline grid given the whole
// model instead of this rank's stage is a clear error (pipelines: tests/mpi/test_pipeline.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "engine_runs.hpp"
#include "job_directory.hpp"
#include "mpi_test_main.hpp"
#include "src/engine/engine_access.hpp"
#include "swap_test_fixtures.hpp"  // ScopedEnvironment
#include "test_helpers.hpp"
#include "zerotrain/engine.hpp"
#include "zerotrain/process_grid.hpp"
#include "zerotrain/trainer.hpp"

namespace {

using namespace zt::testing::engine_runs;

constexpr int kSteps = 4;

/// Clipping at 0.05 is active every step (the norms are ~1), so a wrong norm changes the weights.
std::string clipped(int stage, int micro) {
  std::string config =
      gpt_config(micro, 2, R"(, "zero_optimization": {"stage": )" + std::to_string(stage) + "}");
  const std::string from = R"("gradient_clipping": 1.0)";
  config.replace(config.find(from), from.size(), R"("gradient_clipping": 0.05)");
  return config;
}

struct GridRun {
  std::vector<double> losses;
  std::vector<double> norms;
  std::vector<float> master;
};

GridRun train(const zt::Config& config, const zt::EngineOptions& options) {
  auto model = zt::build_model(config);
  zt::Engine engine(zt::testing::runtime(), *model, config, options);
  auto data = zt::make_training_data(engine.config(), engine, std::nullopt);
  GridRun run;
  train_steps(engine, *data, kSteps, [&] {
    run.losses.push_back(engine.last_step().loss);
    run.norms.push_back(engine.last_step().grad_norm);
  });
  run.master = real_master_parameters(engine);
  return run;
}

TEST(ParallelContext, ReplicatedParametersCountOnceAcrossTheTensorGroup) {
  zt::Runtime& runtime = zt::testing::runtime();
  const int world = runtime.world_size();
  if (world % 2 != 0)
    GTEST_SKIP() << "a tensor group of 2 needs an even number of ranks, the job has " << world;
  zt::ProcessGrid grid(runtime, {.data = 0, .pipeline = 1, .tensor = 2});
  const int data = grid.shape().data;
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const zt::Config config = parse(clipped(stage, 8 / data / 2));
    const GridRun on_grid = train(config, {.grid = &grid});
    const GridRun data_parallel = train(config, {.data_parallel = &grid.data()});
    EXPECT_EQ(on_grid.norms, data_parallel.norms);
    EXPECT_EQ(on_grid.losses, data_parallel.losses);
    EXPECT_EQ(on_grid.master, data_parallel.master);
    EXPECT_LT(on_grid.losses.back(), on_grid.losses.front());
    for (double norm : on_grid.norms) EXPECT_GT(norm, 0.05) << "the clipping must be active";
  }
}

TEST(ParallelContext, GridCheckpointLoadsOnADataParallelJob) {
  zt::Runtime& runtime = zt::testing::runtime();
  const int world = runtime.world_size();
  if (world % 2 != 0)
    GTEST_SKIP() << "a tensor group of 2 needs an even number of ranks, the job has " << world;
  zt::testing::JobDirectory directory("zt-grid-checkpoint");
  zt::ProcessGrid grid(runtime, {.data = 0, .pipeline = 1, .tensor = 2});
  for (int stage : {1, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const zt::Config config = parse(clipped(stage, 8 / grid.shape().data / 2));
    auto model = zt::build_model(config);
    zt::Engine on_grid(runtime, *model, config, {.grid = &grid});
    auto data = zt::make_training_data(on_grid.config(), on_grid, std::nullopt);
    train_steps(on_grid, *data, 2);
    zt::SaveOptions save;
    save.tag = "stage" + std::to_string(stage);
    const std::string tag = on_grid.save_checkpoint(directory.path(), save);

    // The whole world as one data-parallel group (another world size and partition).
    const zt::Config flat = parse(gpt_config(8 / world / 2, 2, R"(, "zero_optimization": {"stage": 2})"));
    auto other_model = zt::build_model(flat);
    zt::Engine loaded(runtime, *other_model, flat);
    const zt::LoadResult result = loaded.load_checkpoint(directory.path(), {.tag = tag});
    EXPECT_EQ(result.saved_world_size, grid.shape().data);
    EXPECT_EQ(real_master_parameters(loaded), real_master_parameters(on_grid));
    EXPECT_EQ(loaded.global_steps(), 2);
  }
}

TEST(ParallelContext, APipelineGridNeedsTheRanksStage) {
  zt::Runtime& runtime = zt::testing::runtime();
  const int world = runtime.world_size();
  if (world % 2 != 0) GTEST_SKIP() << "a pipeline of 2 needs an even number of ranks, the job has " << world;
  zt::ProcessGrid grid(runtime, {.data = 0, .pipeline = 2, .tensor = 1});
  const zt::Config config = parse(gpt_config(2, 1));
  auto model = zt::build_model(config);
  const std::string message =
      zt::testing::error_of([&] { zt::Engine engine(runtime, *model, config, {.grid = &grid}); });
  EXPECT_NE(message.find(
                "the process grid has 2 pipeline stages but the model is a GPT, not a zt::nn::PipelineStage"),
            std::string::npos)
      << message;
}

TEST(ParallelContext, AGridAndADataParallelGroupTogetherAreRefused) {
  zt::Runtime& runtime = zt::testing::runtime();
  zt::ProcessGrid grid(runtime, {.data = 0, .pipeline = 1, .tensor = 1});
  const zt::Config config = parse(gpt_config(2, 1));
  auto model = zt::build_model(config);
  const std::string message = zt::testing::error_of(
      [&] { zt::Engine engine(runtime, *model, config, {.grid = &grid, .data_parallel = &grid.data()}); });
  EXPECT_NE(message.find("pass a process grid or a data-parallel communicator, not both"), std::string::npos)
      << message;
}

/// ZT_ONE_RANK_GROUPS takes "copy" or "device"; anything else is refused, naming the variable and both
/// values, on every rank alike (each reads its own environment, so the job agrees).
TEST(ParallelContext, AnUnknownOneRankGroupsSettingIsRefused) {
  const zt::testing::ScopedEnvironment setting("ZT_ONE_RANK_GROUPS", "nccl");
  const zt::Config config = parse(gpt_config(2, 1));
  auto model = zt::build_model(config);
  const std::string message = zt::testing::error_of(
      [&] { zt::Engine engine(zt::testing::runtime(), *model, config, {.device = zt::Device::emulated()}); });
  EXPECT_NE(message.find("ZT_ONE_RANK_GROUPS='nccl': expected 'copy'"), std::string::npos) << message;
  EXPECT_NE(message.find("'device'"), std::string::npos) << message;
}

/// On a GPU the groups get NCCL communicators (mpi.cuda_training); without a usable one the engine
/// says why, on every rank alike, before any communication.
TEST(ParallelContext, AGpuEngineWithoutAUsableGpuSaysWhy) {
  if (zt::cuda_status().usable()) GTEST_SKIP() << "a GPU is usable here: mpi.cuda_training trains on it";
  const zt::Config config = parse(gpt_config(2, 1));
  auto model = zt::build_model(config);
  const std::string message = zt::testing::error_of(
      [&] { zt::Engine engine(zt::testing::runtime(), *model, config, {.device = zt::Device::cuda(0)}); });
  EXPECT_TRUE(message.find("no usable CUDA device") != std::string::npos ||
              message.find("without CUDA") != std::string::npos)
      << message;
}

}  // namespace
