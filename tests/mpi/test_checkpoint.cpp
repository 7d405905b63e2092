// Checkpoints across ranks: exact resume, the resharding matrix (saved at world size N and ZeRO
// stage s, loaded at M and s'), the sample stream across a resume, corrupted and truncated files.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "engine_runs.hpp"
#include "job_directory.hpp"
#include "mpi_test_main.hpp"
#include "src/engine/engine_access.hpp"
#include "test_helpers.hpp"
#include "zerotrain/checkpoint.hpp"
#include "zerotrain/engine.hpp"
#include "zerotrain/mpi_communicator.hpp"
#include "zerotrain/trainer.hpp"

namespace {

using namespace zt::testing::engine_runs;
namespace fs = std::filesystem;

constexpr int kGlobalBatch = 8;
constexpr int kSaveAt = 3;  // steps before the save
constexpr int kAfter = 3;   // steps after it
constexpr const char* kOddModel =
    R"({"type": "gpt", "n_layer": 2, "n_head": 1, "d_model": 31, "seq_len": 15, "vocab_size": 257})";

zt::Config config_for(int stage, int ranks, const std::string& extra = "") {
  return parse(gpt_config(kGlobalBatch / ranks / 2, 2,
                          R"(, "zero_optimization": {"stage": )" + std::to_string(stage) +
                              R"(, "stage3_param_persistence_threshold": 0})" + extra,
                          kAdamW, kOddModel));
}

/// A model, an engine on `group` and its data, trained step by step.
struct Trainee {
  Trainee(const zt::Config& config, zt::Communicator* group)
      : model(zt::build_model(config)),
        engine(zt::testing::runtime(), *model, config, zt::EngineOptions{.data_parallel = group}),
        data(zt::make_training_data(engine.config(), engine, std::nullopt)) {}

  void train(int steps, RunResult& into, std::vector<std::vector<std::uint64_t>>* ids = nullptr) {
    for (int step = 0; step < steps; ++step) {
      std::vector<std::uint64_t> consumed;
      for (std::int64_t micro = 0; micro < engine.batch().gradient_accumulation_steps; ++micro) {
        const auto micro_ids = data->sample_ids(static_cast<std::uint64_t>(micro));
        consumed.insert(consumed.end(), micro_ids.begin(), micro_ids.end());
        engine.forward(data->load(static_cast<std::uint64_t>(micro)));
        engine.backward();
        engine.step();
      }
      data->advance();
      into.losses.push_back(engine.last_step().loss);
      if (ids != nullptr) ids->push_back(std::move(consumed));
    }
  }
  std::vector<float> master() { return real_master_parameters(engine); }
  void save(const std::string& dir, const std::string& client = "{}") {
    zt::SaveOptions options;
    options.client_state = client;
    options.data_position = data->position();
    engine.save_checkpoint(dir, options);
  }
  zt::LoadResult load(const std::string& dir, zt::LoadOptions options = {}) {
    zt::LoadResult loaded = engine.load_checkpoint(dir, options);
    if (loaded.data_position) data->restore(*loaded.data_position);
    return loaded;
  }

  std::unique_ptr<zt::nn::Module> model;
  zt::Engine engine;
  std::unique_ptr<zt::TrainingData> data;
};

/// At the same world size and stage, save / load / continue is the uninterrupted run, bit for bit
/// in fp32: losses, parameters and the samples each rank consumed.
TEST(Checkpoint, ResumeIsExactAtTheSameWorldSizeAndStage) {
  const int world = zt::testing::runtime().world_size();
  zt::testing::JobDirectory directory("zt-checkpoint-test");
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const zt::Config config = config_for(stage, world);
    RunResult uninterrupted;
    std::vector<std::vector<std::uint64_t>> uninterrupted_ids;
    std::vector<float> uninterrupted_master;
    {
      Trainee run(config, nullptr);
      run.train(kSaveAt + kAfter, uninterrupted, &uninterrupted_ids);
      uninterrupted_master = run.master();
    }
    const std::string dir = directory / ("exact" + std::to_string(stage));
    RunResult resumed;
    std::vector<std::vector<std::uint64_t>> resumed_ids;
    {
      Trainee first(config, nullptr);
      first.train(kSaveAt, resumed, &resumed_ids);
      first.save(dir, R"({"note": "mid-run"})");
    }
    Trainee second(config, nullptr);
    const zt::LoadResult loaded = second.load(dir);
    EXPECT_EQ(loaded.tag, "global_step" + std::to_string(kSaveAt));
    EXPECT_EQ(loaded.client_state, R"({"note": "mid-run"})");
    EXPECT_EQ(loaded.saved_world_size, world);
    EXPECT_EQ(second.engine.global_steps(), kSaveAt);
    EXPECT_EQ(second.engine.global_samples(), kSaveAt * kGlobalBatch);
    second.train(kAfter, resumed, &resumed_ids);
    EXPECT_EQ(resumed.losses, uninterrupted.losses);
    EXPECT_EQ(second.master(), uninterrupted_master);
    // No sample skipped or repeated: every rank consumed the same ids in the same steps.
    EXPECT_EQ(resumed_ids, uninterrupted_ids);
  }
}

/// Saved at world size N (the first N ranks) and stage s, loaded at M and s', optimizer states
/// included: the continuation follows the uninterrupted run at (M, s'). Bitwise when (N, s) =
/// (M, s'); otherwise the first kSaveAt steps differ in the order of float sums (~1e-7 relative),
/// which the tolerances of test_zero.cpp cover.
TEST(Checkpoint, LoadsAtAnyWorldSizeAndStage) {
  zt::Runtime& runtime = zt::testing::runtime();
  const int world = runtime.world_size();
  zt::testing::JobDirectory directory("zt-checkpoint-test");
  std::vector<int> sizes;
  for (int size : {1, 2, 4})
    if (size <= world) sizes.push_back(size);
  const auto name = [](int size, int stage) {
    return "n" + std::to_string(size) + "_s" + std::to_string(stage);
  };

  // The uninterrupted runs, and a checkpoint after kSaveAt steps, for every (size, stage).
  std::map<std::string, RunResult> reference;
  std::map<std::string, std::vector<float>> reference_master;
  for (int size : sizes) {
    auto group = first_ranks(size);
    for (int stage : {0, 1, 2, 3}) {
      if (!group) continue;
      const zt::Config config = config_for(stage, size);
      Trainee run(config, group.get());
      RunResult result;
      run.train(kSaveAt, result);
      run.save(directory / name(size, stage));
      run.train(kAfter, result);
      reference_master[name(size, stage)] = run.master();
      reference[name(size, stage)] = result;
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);

  for (int saved_size : sizes) {
    for (int saved_stage : {0, 1, 2, 3}) {
      for (int size : sizes) {
        auto group = first_ranks(size);
        for (int stage : {0, 1, 2, 3}) {
          if (!group) continue;
          SCOPED_TRACE("saved " + name(saved_size, saved_stage) + ", loaded " + name(size, stage));
          Trainee run(zt::Config(config_for(stage, size)), group.get());
          const zt::LoadResult loaded = run.load(directory / name(saved_size, saved_stage));
          EXPECT_EQ(loaded.saved_world_size, saved_size);
          EXPECT_EQ(loaded.saved_zero_stage, saved_stage);
          RunResult continued;
          run.train(kAfter, continued);
          const RunResult& expected = reference[name(size, stage)];
          const std::vector<float> master = run.master();
          if (saved_size == size && saved_stage == stage) {
            for (int i = 0; i < kAfter; ++i) EXPECT_EQ(continued.losses[i], expected.losses[kSaveAt + i]);
            EXPECT_EQ(master, reference_master[name(size, stage)]);
          } else {
            for (int i = 0; i < kAfter; ++i) {
              EXPECT_NEAR(continued.losses[i], expected.losses[kSaveAt + i],
                          1e-5 * expected.losses[kSaveAt + i]);
            }
            EXPECT_LT(max_abs_difference(master, reference_master[name(size, stage)]), 5e-5);
          }
        }
      }
    }
  }
}

/// Loading without the optimizer states or with the module only leaves those parts fresh.
TEST(Checkpoint, LoadOptionsLeaveTheRestAlone) {
  const int world = zt::testing::runtime().world_size();
  zt::testing::JobDirectory directory("zt-checkpoint-test");
  const zt::Config config = config_for(1, world);
  std::vector<float> saved_master;
  {
    Trainee run(config, nullptr);
    RunResult ignored;
    run.train(kSaveAt, ignored);
    run.save(directory / "options");
    saved_master = run.master();
  }
  Trainee module_only(config, nullptr);
  zt::LoadOptions module_options;
  module_options.load_module_only = true;
  const zt::LoadResult loaded = module_only.engine.load_checkpoint(directory / "options", module_options);
  EXPECT_EQ(module_only.master(), saved_master);
  EXPECT_EQ(module_only.engine.global_steps(), 0);
  EXPECT_FALSE(loaded.data_position.has_value());
  EXPECT_EQ(module_only.engine.optimizer().step_count(), 0);

  Trainee no_optimizer(config, nullptr);
  zt::LoadOptions without_optimizer;
  without_optimizer.load_optimizer_states = false;
  no_optimizer.engine.load_checkpoint(directory / "options", without_optimizer);
  EXPECT_EQ(no_optimizer.engine.global_steps(), kSaveAt);
  EXPECT_EQ(no_optimizer.engine.optimizer().step_count(), 0);
  for (float value : no_optimizer.engine.optimizer().state("exp_avg", 0)) EXPECT_EQ(value, 0.0f);
}

/// Flip one byte inside a dataset's stored data (the test opens the file with HDF5 to find it).
void corrupt_dataset(const std::string& path, const std::string& dataset) {
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  const hid_t handle = H5Dopen2(file, dataset.c_str(), H5P_DEFAULT);
  ASSERT_GE(handle, 0);
  const haddr_t offset = H5Dget_offset(handle);
  H5Dclose(handle);
  H5Fclose(file);
  ASSERT_NE(offset, HADDR_UNDEF);
  std::fstream bytes(path, std::ios::in | std::ios::out | std::ios::binary);
  bytes.seekg(static_cast<std::streamoff>(offset + 40));
  char byte = 0;
  bytes.read(&byte, 1);
  byte = static_cast<char>(byte ^ 0x5a);
  bytes.seekp(static_cast<std::streamoff>(offset + 40));
  bytes.write(&byte, 1);
}

TEST(Checkpoint, CorruptedOrTruncatedFilesAreClearErrors) {
  zt::Runtime& runtime = zt::testing::runtime();
  const int world = runtime.world_size();
  zt::testing::JobDirectory directory("zt-checkpoint-test");
  const zt::Config config = config_for(2, world);
  const std::string dir = directory / "damaged";
  {
    Trainee run(config, nullptr);
    RunResult ignored;
    run.train(1, ignored);
    run.save(dir);
    run.train(1, ignored);
    run.save(dir);
  }
  const std::string newest = zt::checkpoint_file(dir, "global_step2");
  EXPECT_EQ(zt::checkpoint_tags_newest_first(dir),
            (std::vector<std::string>{"global_step2", "global_step1"}));
  if (runtime.world_rank() == 0) {
    zt::verify_checkpoint(newest);
    corrupt_dataset(newest, "model/h.1.mlp.fc.weight");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  {
    Trainee run(config, nullptr);
    const std::string error = zt::testing::error_of([&] { run.load(dir); });
    EXPECT_NE(error.find(newest), std::string::npos) << error;
    EXPECT_NE(error.find("model/h.1.mlp.fc.weight"), std::string::npos) << error;
    EXPECT_NE(error.find("checksum"), std::string::npos) << error;
    if (runtime.world_rank() == 0) {
      const std::string verified = zt::testing::error_of([&] { zt::verify_checkpoint(newest); });
      EXPECT_NE(verified.find("model/h.1.mlp.fc.weight"), std::string::npos) << verified;
      EXPECT_EQ(zt::newest_valid_checkpoint(dir), std::optional<std::string>("global_step1"));
    }
    // The older one still loads.
    zt::LoadOptions older;
    older.tag = "global_step1";
    EXPECT_EQ(run.load(dir, older).tag, "global_step1");
  }
  if (runtime.world_rank() == 0) fs::resize_file(newest, fs::file_size(newest) / 2);
  MPI_Barrier(MPI_COMM_WORLD);
  {
    Trainee run(config, nullptr);
    const std::string error = zt::testing::error_of([&] { run.load(dir); });
    EXPECT_NE(error.find(newest), std::string::npos) << error;
  }
  // A model that does not match names the dataset and both shapes.
  {
    Trainee other(parse(gpt_config(kGlobalBatch / world / 2, 2, "", kAdamW)), nullptr);
    zt::LoadOptions older;
    older.tag = "global_step1";
    const std::string error = zt::testing::error_of([&] { other.load(dir, older); });
    EXPECT_NE(error.find("model/"), std::string::npos) << error;
  }
}

/// Files 0640, the directory the save created 0750, latest written last; keep_last prunes.
TEST(Checkpoint, PermissionsLatestAndPruning) {
  zt::Runtime& runtime = zt::testing::runtime();
  const int world = runtime.world_size();
  zt::testing::JobDirectory directory("zt-checkpoint-test");
  const std::string dir = directory / "nested/run";
  Trainee run(config_for(0, world), nullptr);
  RunResult ignored;
  for (int step = 1; step <= 4; ++step) {
    run.train(1, ignored);
    zt::SaveOptions options;
    options.data_position = run.data->position();
    options.keep_last = 2;
    run.engine.save_checkpoint(dir, options);
  }
  EXPECT_EQ(zt::latest_checkpoint_tag(dir), std::optional<std::string>("global_step4"));
  EXPECT_EQ(zt::checkpoint_tags_newest_first(dir),
            (std::vector<std::string>{"global_step4", "global_step3"}));
  const auto permissions = [](const std::string& path) {
    return static_cast<unsigned>(fs::status(path).permissions() & fs::perms::mask);
  };
  EXPECT_EQ(permissions(zt::checkpoint_file(dir, "global_step4")), 0640u);
  EXPECT_EQ(permissions(dir), 0750u);
  const zt::CheckpointSummary summary = zt::inspect_checkpoint(zt::checkpoint_file(dir, "global_step4"));
  EXPECT_EQ(summary.global_steps, 4);
  EXPECT_EQ(summary.world_size, world);
  EXPECT_EQ(summary.optimizer, "adamw");
  // Parameters, two Adam moments per parameter, and the RNG table.
  EXPECT_EQ(summary.datasets.size(), 3 * zt::engine_detail::inspect(run.engine).flat_layout().size() + 1);
  zt::SaveOptions escaping;
  escaping.tag = "../escape";
  const std::string error = zt::testing::error_of([&] { run.engine.save_checkpoint(dir, escaping); });
  EXPECT_NE(error.find("checkpoint tag '../escape'"), std::string::npos) << error;
}

}  // namespace
