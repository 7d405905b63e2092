// zt::Runtime over a sub-communicator: its ranks, node and hosts are those of the communicator, it
// shares the process's watchdog and device with the test main's runtime over the world, and two
// trainings on the two halves of a 4-rank job run side by side exactly like a 2-rank training,
// saving checkpoints and swap files that never collide.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "engine_runs.hpp"
#include "job_directory.hpp"
#include "mpi_layer/op_tracker.hpp"
#include "mpi_test_main.hpp"
#include "runtime_checks.hpp"
#include "test_helpers.hpp"
#include "zerotrain/checkpoint.hpp"
#include "zerotrain/engine.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/mpi_communicator.hpp"
#include "zerotrain/process_grid.hpp"
#include "zerotrain/runtime.hpp"
#include "zerotrain/swap.hpp"
#include "zerotrain/trainer.hpp"

namespace {

using namespace zt::testing::engine_runs;
namespace fs = std::filesystem;

/// MPI_Comm_split of the world, freed at the end of the scope (the runtime keeps a duplicate).
class Split {
 public:
  Split(int color, int key) { MPI_Comm_split(MPI_COMM_WORLD, color, key, &comm_); }
  ~Split() {
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }
  Split(const Split&) = delete;
  Split& operator=(const Split&) = delete;
  MPI_Comm get() const { return comm_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
};

int job_rank() {
  return zt::testing::runtime().world_rank();
}
int job_size() {
  return zt::testing::runtime().world_size();
}

template <typename T>
std::vector<T> gather(zt::Communicator& comm, T value) {
  std::vector<T> values(static_cast<std::size_t>(comm.size()));
  comm.all_gather(&value, values.data(), 1, zt::dtype_of_v<T>);
  return values;
}

/// The threads of this process now (Linux: one entry per thread in /proc/self/task).
std::size_t thread_count() {
  std::size_t count = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator("/proc/self/task")) ++count;
  return count;
}

std::size_t live_communicators_named(const std::string& name) {
  std::size_t count = 0;
  for (const auto& tracker : zt::detail::live_trackers()) count += tracker->name() == name;
  return count;
}

// Interleaved halves (even and odd world ranks), so that the runtime's ranks differ from the job's.
TEST(SubCommunicatorRuntime, RanksNodeAndHostsAreThoseOfTheCommunicator) {
  zt::Runtime& job = zt::testing::runtime();
  const Split half(job_rank() % 2, job_rank());
  int comm_rank = -1, comm_size = -1;
  MPI_Comm_rank(half.get(), &comm_rank);
  MPI_Comm_size(half.get(), &comm_size);

  zt::Runtime runtime(half.get());
  EXPECT_EQ(runtime.world_rank(), comm_rank);
  EXPECT_EQ(runtime.world_rank(), job_rank() / 2);
  EXPECT_EQ(runtime.world_size(), comm_size);
  EXPECT_EQ(runtime.world().rank(), comm_rank);
  EXPECT_EQ(runtime.world().size(), comm_size);
  EXPECT_EQ(runtime.world().name(), "world");
  EXPECT_FALSE(runtime.owns_mpi());
  EXPECT_EQ(runtime.covers_mpi_world(), comm_size == job_size());
  EXPECT_TRUE(job.covers_mpi_world());
  int relation = MPI_UNEQUAL;
  MPI_Comm_compare(runtime.world_comm(), half.get(), &relation);
  EXPECT_EQ(relation, MPI_CONGRUENT) << "world_comm() is the runtime's duplicate of the communicator";
  EXPECT_EQ(runtime.thread_level(), job.thread_level());
  EXPECT_EQ(runtime.device(), job.device()) << "a process computes on one device";

  // Node-local ranks count the communicator's ranks on each node.
  zt::testing::expect_consistent_node_local_ranks(runtime);
  EXPECT_EQ(runtime.host_name(), job.host_name());
  for (const std::string& host : runtime.hosts()) {
    EXPECT_NE(std::find(job.hosts().begin(), job.hosts().end(), host), job.hosts().end()) << host;
  }

  // A process grid over the runtime splits its world, not MPI_COMM_WORLD.
  zt::ProcessGrid grid(runtime, {0, 1, 1});
  EXPECT_EQ(grid.data().size(), comm_size);
  EXPECT_EQ(grid.data().rank(), comm_rank);
  const auto members = gather(grid.data(), job_rank());
  for (int r = 0; r < comm_size; ++r) EXPECT_EQ(members[static_cast<std::size_t>(r)], 2 * r + job_rank() % 2);

  // Errors keep naming the process's rank in the job, which is unique; the runtime's is not.
  const std::string message = zt::testing::error_of([] { ZT_THROW("something broke"); });
  EXPECT_NE(message.find("on rank " + std::to_string(job_rank()) + " "), std::string::npos) << message;
}

TEST(SubCommunicatorRuntime, IsWatchedByTheProcessWatchdogWithoutASecondOne) {
  zt::Runtime& job = zt::testing::runtime();
  const Split half(job_rank() % 2, job_rank());
  const bool watchdog_before = job.watchdog_running();
  const std::size_t threads_before = thread_count();
  const std::size_t worlds_before = live_communicators_named("world");
  {
    zt::Runtime runtime(half.get(), zt::RuntimeOptions{.collective_timeout = std::chrono::seconds(5)});
    EXPECT_EQ(runtime.watchdog_running(), job.watchdog_running());
    // The process's watchdog decides; the options of a runtime that does not start it do not apply.
    EXPECT_EQ(runtime.collective_timeout(), job.collective_timeout());
    EXPECT_EQ(thread_count(), threads_before) << "no second watchdog thread";
    // Its world communicator is registered once, where the process's watchdog looks.
    EXPECT_EQ(live_communicators_named("world"), worlds_before + 1);
    float value = 1.0f;
    runtime.world().all_reduce(&value, &value, 1, zt::DType::fp32, zt::ReduceOp::sum);
    EXPECT_EQ(value, static_cast<float>(runtime.world_size()));
  }
  EXPECT_EQ(live_communicators_named("world"), worlds_before);
  // The process's watchdog is the world runtime's: the other runtime's end does not stop it.
  EXPECT_EQ(job.watchdog_running(), watchdog_before);
  EXPECT_EQ(thread_count(), threads_before);
}

TEST(SubCommunicatorRuntime, SwapFilesOfTrainingsSideBySideNeverShareAName) {
  const Split half(job_rank() % 2, job_rank());
  zt::Runtime runtime(half.get());
  zt::testing::JobDirectory directory("zt-sub-runtime-swap");
  {
    // The same job id everywhere: only the rank tells the files apart, and it is the job's rank,
    // not the runtime's (rank 0 of each half would otherwise collide: O_EXCL refuses it).
    zt::SwapEngine swap({.nvme_path = directory.path(), .allow_buffered_io = true, .job_id = "side-by-side"});
    EXPECT_NE(swap.file_path().filename().string().find(".rank" + std::to_string(job_rank()) + "."),
              std::string::npos)
        << swap.file_path();
    MPI_Barrier(MPI_COMM_WORLD);
    std::set<int> ranks;
    for (const zt::SwapFileEntry& entry : zt::list_swap_files(directory.path())) ranks.insert(entry.rank);
    EXPECT_EQ(static_cast<int>(ranks.size()), job_size());
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

/// A training on `runtime`'s world (the engine's own process grid) or on `data_parallel`.
struct Training {
  Training(zt::Runtime& runtime, const zt::Config& config, zt::Communicator* data_parallel = nullptr)
      : model(zt::build_model(config)),
        engine(runtime, *model, config, zt::EngineOptions{.data_parallel = data_parallel}),
        data(zt::make_training_data(engine.config(), engine, std::nullopt)) {}

  void train(int steps, std::vector<double>& losses) {
    train_steps(engine, *data, steps, [&] { losses.push_back(engine.last_step().loss); });
  }
  std::vector<float> master() { return real_master_parameters(engine); }

  std::unique_ptr<zt::nn::Module> model;
  zt::Engine engine;
  std::unique_ptr<zt::TrainingData> data;
};

constexpr int kSaveAt = 3;  // steps before the checkpoint
constexpr int kAfter = 2;   // steps after it

zt::Config two_rank_config() {
  return parse(gpt_config(2, 2, R"(, "zero_optimization": {"stage": 2})"));
}

using Clock = std::chrono::steady_clock;

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

/// The halves {0, 1} and {2, 3} train at once, each on a runtime over its half, and save into
/// directories of their own at the same moment; a 2-rank training on {0, 2} and {1, 3} (made by a
/// different split, on the world runtime with EngineOptions::data_parallel) is the reference.
TEST(SubCommunicatorRuntime, TwoHalvesTrainAtOnceLikeATwoRankTraining) {
  if (job_size() != 4) {
    GTEST_SKIP() << "needs a 4-rank job (two 2-rank trainings side by side); this one has " << job_size()
                 << " rank(s)";
  }
  zt::Runtime& job = zt::testing::runtime();
  const zt::Config config = two_rank_config();
  zt::testing::JobDirectory directory("zt-sub-runtime-ckpt");
  const int half_index = job_rank() / 2;
  const std::string own_dir = directory / ("half" + std::to_string(half_index));

  std::vector<double> losses;
  std::vector<double> resumed;
  std::vector<float> master;
  std::vector<float> resumed_master;
  std::int64_t started = 0;
  std::int64_t finished = 0;
  {
    const Split half(half_index, job_rank());
    zt::Runtime runtime(half.get());
    ASSERT_EQ(runtime.world_size(), 2);
    started = now_ns();
    {
      Training training(runtime, config);
      EXPECT_EQ(training.engine.data_parallel().size(), 2);
      training.train(kSaveAt, losses);
      zt::SaveOptions options;
      options.data_position = training.data->position();
      EXPECT_EQ(training.engine.save_checkpoint(own_dir, options), "global_step3");
      training.train(kAfter, losses);
      master = training.master();
    }
    finished = now_ns();
    // Resumed from its own checkpoint, each half continues exactly as it went on uninterrupted.
    Training again(runtime, config);
    const zt::LoadResult loaded = again.engine.load_checkpoint(own_dir);
    EXPECT_EQ(loaded.saved_world_size, 2);
    ASSERT_TRUE(loaded.data_position.has_value());
    again.data->restore(*loaded.data_position);
    again.train(kAfter, resumed);
    resumed_master = again.master();
  }
  ASSERT_EQ(losses.size(), static_cast<std::size_t>(kSaveAt + kAfter));
  EXPECT_EQ(resumed, std::vector<double>(losses.begin() + kSaveAt, losses.end()));
  EXPECT_EQ(resumed_master, master);

  // Side by side: each half started before the other finished (one host: one steady clock).
  const auto starts = gather(job.world(), started);
  const auto ends = gather(job.world(), finished);
  if (job.node_count() == 1) {
    EXPECT_LT(std::max(starts[0], starts[2]), std::min(ends[0], ends[2])) << "the halves did not overlap";
  }

  // Both halves trained bitwise alike: the same losses on every rank of the job.
  for (int step = 0; step < kSaveAt + kAfter; ++step) {
    const auto everyone = gather(job.world(), losses[static_cast<std::size_t>(step)]);
    for (int r = 1; r < 4; ++r)
      EXPECT_EQ(everyone[static_cast<std::size_t>(r)], everyone[0]) << "step " << step;
  }

  // ... and like a 2-rank training on a communicator made another way, on the world runtime.
  {
    const Split pair(job_rank() % 2, job_rank());
    auto pair_comm = zt::make_mpi_communicator(pair.get(), "pair");
    Training reference(job, config, pair_comm.get());
    std::vector<double> reference_losses;
    reference.train(kSaveAt + kAfter, reference_losses);
    EXPECT_EQ(reference_losses, losses);
    EXPECT_EQ(reference.master(), master);
  }

  // Each directory holds its own half's checkpoint only, and it verifies.
  job.world().barrier();
  if (job_rank() % 2 == 0) {
    EXPECT_EQ(zt::checkpoint_tags_newest_first(own_dir), std::vector<std::string>{"global_step3"});
    EXPECT_NO_THROW(zt::verify_checkpoint(zt::checkpoint_file(own_dir, "global_step3")));
  }
}

}  // namespace
