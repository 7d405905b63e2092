// Pipeline parallelism end to end: every pipeline x data layout of the world trains the built-in GPT
// as one rank does (the same losses and weights, bitwise where the arithmetic is the same), with
// ZeRO 0-2 within each stage's data group, both schedules, tied embeddings, dropout, a model of the
// caller's own layers, and clear errors for what does not combine.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine_runs.hpp"
#include "job_directory.hpp"
#include "kernels/emulated_device.hpp"
#include "mpi_test_main.hpp"
#include "src/engine/pipeline_executor.hpp"
#include "test_helpers.hpp"
#include "zerotrain/device.hpp"
#include "zerotrain/engine.hpp"
#include "zerotrain/pipeline.hpp"
#include "zerotrain/process_grid.hpp"
#include "zerotrain/trainer.hpp"

namespace {

using namespace zt::testing::engine_runs;

#define EXPECT_CONTAINS(text, part) EXPECT_NE((text).find(part), std::string::npos) << "in: " << (text)

constexpr int kSteps = 20;
constexpr int kGlobalBatch = 16;
constexpr int kMicroBatches =
    4;  // per step and data rank: more than two stages, so 1F1B reaches its steady state

// Four layers (embeddings, h.0, h.1, head): up to four stages.
constexpr const char* kTiedGpt =
    R"({"type": "gpt", "n_layer": 2, "n_head": 2, "d_model": 32, "seq_len": 16, "vocab_size": 256})";
constexpr const char* kUntiedGpt =
    R"({"type": "gpt", "n_layer": 2, "n_head": 2, "d_model": 32, "seq_len": 16, "vocab_size": 256,
        "tie_embeddings": false})";
constexpr const char* kUntiedGptWithDropout =
    R"({"type": "gpt", "n_layer": 2, "n_head": 2, "d_model": 32, "seq_len": 16, "vocab_size": 256,
        "tie_embeddings": false, "dropout": 0.1})";

struct PipelineRun {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> masters;  // this rank's stage's parameters, by name
  std::vector<zt::PipelineTiming> timings;
  std::vector<double> step_seconds;    // train_batch's wall time
  std::uint64_t peak_activations = 0;  // this rank's, over the run
};

/// The fp32 masters of the engine's parameters by name (collective over its data group).
std::map<std::string, std::vector<float>> masters_by_name(zt::Engine& engine) {
  const std::vector<float> flat = zt::engine_detail::inspect(engine).gather_master_parameters();
  std::map<std::string, std::vector<float>> masters;
  for (const zt::FlatParameter& slot : zt::engine_detail::inspect(engine).flat_layout())
    masters[slot.name].assign(flat.begin() + slot.offset, flat.begin() + slot.offset + slot.numel);
  return masters;
}

/// A config for `data` data-parallel ranks and `stages` stages with the global batch fixed;
/// `pipeline_keys` go into the "pipeline" section (start them with a comma).
std::string config_text(int data, int stages, const std::string& extra, const char* model,
                        const char* optimizer = kAdamW, const std::string& pipeline_keys = "") {
  return gpt_config(kGlobalBatch / data / kMicroBatches, kMicroBatches,
                    R"(, "pipeline": {"stages": )" + std::to_string(stages) + pipeline_keys + "}" + extra,
                    optimizer, model);
}

/// kSteps steps of `engine` through train_batch: the losses, the timings, this rank's peak of
/// activation memory and the masters.
PipelineRun train_and_record(zt::Engine& engine) {
  zt::reset_memory_peaks();
  auto training = zt::make_training_data(engine.config(), engine, std::nullopt);
  PipelineRun result;
  for (int step = 0; step < kSteps; ++step) {
    const auto started = std::chrono::steady_clock::now();
    engine.train_batch([&](std::int64_t micro) { return training->load(static_cast<std::uint64_t>(micro)); });
    result.step_seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    training->advance();
    result.losses.push_back(engine.last_step().loss);
    result.timings.push_back(engine.last_step().pipeline);
  }
  result.peak_activations = zt::memory_snapshot(zt::DeviceType::host)[zt::MemoryCategory::activations].peak;
  result.masters = masters_by_name(engine);
  return result;
}

/// Train kSteps steps through train_batch on a grid of `stages` x (world / stages), the engine on
/// `device`.
PipelineRun run_on_grid(const std::string& extra, const char* model, int stages,
                        const char* optimizer = kAdamW, const std::string& pipeline_keys = "",
                        zt::Device device = zt::Device::host()) {
  zt::Runtime& runtime = zt::testing::runtime();
  const int data = runtime.world_size() / stages;
  const zt::Config config = parse(config_text(data, stages, extra, model, optimizer, pipeline_keys));
  zt::ProcessGrid grid(runtime, zt::GridShape{.data = data, .pipeline = stages, .tensor = 1});
  auto stage_model = zt::build_model(config, grid.coordinates().pipeline);
  zt::Engine engine(runtime, *stage_model, config, zt::EngineOptions{.grid = &grid, .device = device});
  return train_and_record(engine);
}

/// The same training unpipelined on `data_parallel` (the reference; nullptr: this process alone).
PipelineRun run_unpipelined(const std::string& extra, const char* model, const char* optimizer = kAdamW,
                            zt::Communicator* data_parallel = nullptr) {
  auto self = self_communicator();
  if (data_parallel == nullptr) data_parallel = self.get();
  const zt::Config config = parse(config_text(data_parallel->size(), 1, extra, model, optimizer));
  auto whole = zt::build_model(config);
  zt::Engine engine(zt::testing::runtime(), *whole, config,
                    zt::EngineOptions{.data_parallel = data_parallel});
  return train_and_record(engine);
}

/// Stage counts that divide the world and fit the four layers.
std::vector<int> pipeline_sizes() {
  std::vector<int> sizes;
  for (int stages : {2, 4}) {
    if (zt::testing::runtime().world_size() % stages == 0) sizes.push_back(stages);
  }
  return sizes;
}

double max_relative_difference(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    worst = std::max(worst, std::fabs(a[i] - b[i]) / std::fabs(b[i]));
  return worst;
}

/// Every parameter of `stage_run`'s stage against the reference's parameter of the same name.
void expect_masters_match(const PipelineRun& stage_run, const PipelineRun& reference, double tolerance) {
  ASSERT_FALSE(stage_run.masters.empty());
  for (const auto& [name, values] : stage_run.masters) {
    SCOPED_TRACE("parameter " + name);
    const auto found = reference.masters.find(name);
    ASSERT_NE(found, reference.masters.end());
    if (tolerance == 0) {
      EXPECT_EQ(values, found->second);
    } else {
      EXPECT_LT(max_abs_difference(values, found->second), tolerance);
    }
  }
}

std::string with_zero_stage(int stage) {
  return R"(, "zero_optimization": {"stage": )" + std::to_string(stage) + "}";
}

TEST(Pipeline, EveryLayoutTrainsAsOneRank) {
  const int world = zt::testing::runtime().world_size();
  for (int zero_stage : {0, 1, 2}) {
    const std::string extra = with_zero_stage(zero_stage);
    const PipelineRun reference = run_unpipelined(extra, kTiedGpt);
    for (int stages : pipeline_sizes()) {
      SCOPED_TRACE("ZeRO stage " + std::to_string(zero_stage) + ", pipeline " + std::to_string(stages) +
                   " x data " + std::to_string(world / stages));
      const PipelineRun pipelined = run_on_grid(extra, kTiedGpt, stages);
      // The same samples and arithmetic up to the order of gradient sums (data-parallel ranks, and the
      // tied embedding's two contributions, summed between the first and the last stage).
      const double worst = max_relative_difference(pipelined.losses, reference.losses);
      EXPECT_LT(worst, 1e-6);
      std::printf(
          "ZeRO %d, pp %d x dp %d: losses %.6f -> %.6f, largest relative difference to one rank %.2e\n",
          zero_stage, stages, world / stages, pipelined.losses.front(), pipelined.losses.back(), worst);
      expect_masters_match(pipelined, reference, 2e-5);
      EXPECT_LT(pipelined.losses.back(), pipelined.losses.front());
    }
  }
}

// AdamW without clipping: the gradient norm's fp64 partial sums are grouped by stage, so its last
// bits (and a clip coefficient computed from them) may differ from the unpipelined run's.
constexpr const char* kAdamWUnclipped = R"("gradient_clipping": 0.0,
    "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.01}},)";

TEST(Pipeline, UntiedStagesAreBitwiseTheUnpipelinedRun) {
  // Without tied layers a stage does exactly the unpipelined arithmetic on its layers; with at most
  // two data-parallel ranks the gradient sum is exact in any order, so the runs agree bit for bit.
  const int world = zt::testing::runtime().world_size();
  for (int stages : pipeline_sizes()) {
    const int data = world / stages;
    if (data > 2) continue;
    SCOPED_TRACE("pipeline " + std::to_string(stages) + " x data " + std::to_string(data));
    // fp32 with and without dropout; bf16 and fp16 (dynamic loss scale: every stage skips or updates
    // together, the overflow flag is summed over the pipeline) at ZeRO-2.
    const std::vector<std::pair<const char*, std::string>> cases = {
        {kUntiedGpt, with_zero_stage(1)},
        {kUntiedGptWithDropout, with_zero_stage(1)},
        {kUntiedGpt, with_zero_stage(2) + R"(, "bf16": {"enabled": true})"},
        {kUntiedGpt, with_zero_stage(2) + R"(, "fp16": {"enabled": true, "initial_scale_power": 24})"}};
    for (const auto& [model, extra] : cases) {
      SCOPED_TRACE(std::string(model) + extra);
      // The same data-parallel size without stages: the world in groups of `data` ranks, each rank
      // with the data-parallel index it has in the pipeline grid (world rank mod data).
      zt::Runtime& runtime = zt::testing::runtime();
      MPI_Comm group_comm = MPI_COMM_NULL;
      MPI_Comm_split(MPI_COMM_WORLD, runtime.world_rank() / data, runtime.world_rank(), &group_comm);
      auto group = zt::make_mpi_communicator(group_comm, "data");
      MPI_Comm_free(&group_comm);
      const PipelineRun unpipelined = run_unpipelined(extra, model, kAdamWUnclipped, group.get());
      const PipelineRun pipelined = run_on_grid(extra, model, stages, kAdamWUnclipped);
      EXPECT_EQ(pipelined.losses, unpipelined.losses);
      expect_masters_match(pipelined, unpipelined, 0);
    }
  }
}

TEST(Pipeline, GpipeAndOneFOneBTrainAlike) {
  // Both schedules run the forwards and the backwards of each stage in micro-batch order; only
  // when differs. The results are bitwise the same; 1F1B holds at most `stages` micro-batches.
  for (int stages : pipeline_sizes()) {
    SCOPED_TRACE("pipeline " + std::to_string(stages));
    const PipelineRun one_f_one_b = run_on_grid(R"(, "zero_optimization": {"stage": 2})", kTiedGpt, stages);
    const PipelineRun gpipe = run_on_grid(R"(, "zero_optimization": {"stage": 2})", kTiedGpt, stages, kAdamW,
                                          R"(, "schedule": "gpipe")");
    EXPECT_EQ(gpipe.losses, one_f_one_b.losses);
    expect_masters_match(gpipe, one_f_one_b, 0);
    EXPECT_EQ(one_f_one_b.timings.back().stages, stages);
    EXPECT_GT(one_f_one_b.timings.back().busy_seconds, 0);
  }
}

TEST(Pipeline, ActivationCheckpointsInStagesKeepTheRunBitwise) {
  // pipeline.activation_checkpoint_interval wraps each stage's layers in checkpoints that keep only
  // their input and recompute the forward (dropout masks replayed) in the backward: the same run,
  // less activation memory held between a micro-batch's forward and its backward.
  for (int stages : pipeline_sizes()) {
    SCOPED_TRACE("pipeline " + std::to_string(stages));
    const std::string extra = with_zero_stage(1);
    const PipelineRun plain = run_on_grid(extra, kUntiedGptWithDropout, stages, kAdamW);
    const PipelineRun checkpointed =
        run_on_grid(extra, kUntiedGptWithDropout, stages, kAdamW, R"(, "activation_checkpoint_interval": 1)");
    EXPECT_EQ(checkpointed.losses, plain.losses);
    expect_masters_match(checkpointed, plain, 0);
    // A stage saves where several micro-batches wait for their backward (1F1B: p - s on stage s);
    // the last stage holds one, and recomputes what it would have kept. Over the pipeline: less.
    std::uint64_t peaks[2] = {plain.peak_activations, checkpointed.peak_activations};
    MPI_Allreduce(MPI_IN_PLACE, peaks, 2, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    EXPECT_LT(peaks[1], peaks[0]);
    if (zt::testing::runtime().world_rank() == 0) {
      std::printf(
          "pipeline %d stages: peak activations summed over the ranks %llu bytes plain, %llu with "
          "checkpoints\n",
          stages, static_cast<unsigned long long>(peaks[0]), static_cast<unsigned long long>(peaks[1]));
    }
  }
}

/// A pipeline x data layout; 1 x 1 on a larger world: every rank alone (over a self communicator).
struct Layout {
  int stages = 1;
  int data = 1;
  std::string name() const { return std::to_string(stages) + "x" + std::to_string(data); }
};

/// Train `steps` steps from global step `first_step` in `layout` with the engine on `device`: loaded
/// from `load_from` (a checkpoint of step first_step) when given, saved to `save_to` after the steps
/// when given.
std::vector<double> train_in_layout(const Layout& layout, int first_step, int steps,
                                    const std::string& load_from, const std::string& save_to,
                                    zt::Device device = zt::Device::host()) {
  zt::Runtime& runtime = zt::testing::runtime();
  const zt::Config config = parse(config_text(layout.data, layout.stages, "", kTiedGpt));
  std::unique_ptr<zt::ProcessGrid> grid;
  std::unique_ptr<zt::Communicator> self;
  zt::EngineOptions options;
  options.device = device;
  if (layout.stages * layout.data == runtime.world_size()) {
    grid = std::make_unique<zt::ProcessGrid>(runtime,
                                             zt::GridShape{.data = layout.data, .pipeline = layout.stages});
    options.grid = grid.get();
  } else {
    self = self_communicator();
    options.data_parallel = self.get();
  }
  auto model =
      layout.stages > 1 ? zt::build_model(config, grid->coordinates().pipeline) : zt::build_model(config);
  zt::Engine engine(runtime, *model, config, options);
  auto training = zt::make_training_data(engine.config(), engine, std::nullopt);
  if (!load_from.empty()) {
    engine.load_checkpoint(load_from);
    EXPECT_EQ(engine.global_steps(), first_step);
  }
  for (int step = 0; step < first_step; ++step) training->advance();
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    engine.train_batch([&](std::int64_t micro) { return training->load(static_cast<std::uint64_t>(micro)); });
    training->advance();
    losses.push_back(engine.last_step().loss);
  }
  if (!save_to.empty()) engine.save_checkpoint(save_to);
  return losses;
}

TEST(Pipeline, CheckpointsLoadInEveryLayout) {
  // A checkpoint holds the model in its global layout (every stage's parameters by name, a tied
  // parameter once): saved at any pipeline x data layout, it resumes at any other, and the run
  // continues as the saving layout's own resumption does.
  const int world = zt::testing::runtime().world_size();
  std::vector<Layout> layouts;
  for (int stages : {1, 2, 4}) {
    if (world % stages == 0) layouts.push_back({stages, world / stages});
  }
  if (world > 1) layouts.push_back({1, 1});
  const zt::testing::JobDirectory directory("zt-pipeline-checkpoints");
  constexpr int kSaved = 3, kResumed = 2;
  for (const Layout& saving : layouts) {
    if (saving.stages * saving.data != world) continue;  // every rank alone would write one file at once
    const std::string dir = directory.path() + "/" + saving.name();
    train_in_layout(saving, 0, kSaved, "", dir);
    const std::vector<double> continued = train_in_layout(saving, kSaved, kResumed, dir, "");
    for (const Layout& loading : layouts) {
      if (saving.stages == 1 && loading.stages == 1) continue;  // the checkpoint tests cover these
      SCOPED_TRACE("saved at pp x dp " + saving.name() + ", loaded at " + loading.name());
      const std::vector<double> resumed = train_in_layout(loading, kSaved, kResumed, dir, "");
      if (loading.stages == saving.stages && loading.data == saving.data) {
        EXPECT_EQ(resumed, continued);
      } else {
        EXPECT_LT(max_relative_difference(resumed, continued), 1e-6);
      }
    }
  }
}

TEST(Pipeline, CheckpointsMoveBetweenTheEmulatedDeviceAndTheHost) {
  // Saved by stages on the emulated device, a checkpoint resumes on the host and the other way
  // round, bitwise as the host's own resumption; and resharded onto one rank on the device.
  const int world = zt::testing::runtime().world_size();
  const zt::Device emulated = zt::Device::emulated();
  const zt::testing::JobDirectory directory("zt-pipeline-device-checkpoints");
  constexpr int kSaved = 3, kResumed = 2;
  for (int stages : pipeline_sizes()) {
    const Layout layout{stages, world / stages};
    SCOPED_TRACE("pp x dp " + layout.name());
    const std::string on_host = directory.path() + "/host-" + layout.name();
    const std::string on_device = directory.path() + "/device-" + layout.name();
    const std::vector<double> host_saved = train_in_layout(layout, 0, kSaved, "", on_host);
    const std::vector<double> device_saved = train_in_layout(layout, 0, kSaved, "", on_device, emulated);
    EXPECT_EQ(device_saved, host_saved);
    const std::vector<double> continued = train_in_layout(layout, kSaved, kResumed, on_host, "");
    EXPECT_EQ(train_in_layout(layout, kSaved, kResumed, on_device, ""), continued);
    EXPECT_EQ(train_in_layout(layout, kSaved, kResumed, on_host, "", emulated), continued);
    EXPECT_EQ(train_in_layout(layout, kSaved, kResumed, on_device, "", emulated), continued);
    EXPECT_LT(max_relative_difference(train_in_layout({1, 1}, kSaved, kResumed, on_device, "", emulated),
                                      continued),
              1e-6);
  }
}

TEST(Pipeline, EvalRunsTheInferenceScheduleOnEveryStage) {
  // eval() runs the forwards through the stages and gives the last stage's loss on every rank: at
  // construction, the unsplit model's loss on the same batch (tied copies start equal).
  zt::Runtime& runtime = zt::testing::runtime();
  for (int stages : pipeline_sizes()) {
    SCOPED_TRACE("pipeline " + std::to_string(stages));
    const int data = runtime.world_size() / stages;
    const zt::Config config = parse(config_text(data, stages, "", kTiedGpt));
    zt::ProcessGrid grid(runtime, zt::GridShape{.data = data, .pipeline = stages});
    auto stage = zt::build_model(config, grid.coordinates().pipeline);
    zt::Engine engine(runtime, *stage, config, {.grid = &grid});
    const zt::Batch batch{zt::testing::random_tokens({2, 16}, 256, 5),
                          zt::testing::random_tokens({2, 16}, 256, 6)};
    const double loss = engine.eval(batch);
    const zt::Config whole_config = parse(config_text(1, 1, "", kTiedGpt));
    auto whole = zt::build_model(whole_config);
    auto self = self_communicator();
    zt::Engine alone(runtime, *whole, whole_config, {.data_parallel = self.get()});
    EXPECT_EQ(loss, alone.eval(batch));
    EXPECT_GT(loss, 0);
    // Training still works after an evaluation (the stages are back in training mode).
    auto training = zt::make_training_data(engine.config(), engine, std::nullopt);
    engine.train_batch([&](std::int64_t micro) { return training->load(static_cast<std::uint64_t>(micro)); });
    EXPECT_TRUE(std::isfinite(engine.last_step().loss));
  }
}

TEST(Pipeline, AStageOnADeviceIsTimedOnItsComputeStream) {
  // The executor alone, one stage of one on the emulated device, whose forwards and backwards only
  // queue work on the compute stream (20 ms each), as a GPU's launches do: the host spends next to
  // nothing in them, the stream 20 ms. Busy is the stream's time (the host's clock gave ~0).
  using namespace std::chrono_literals;
  const zt::ExecutionContext execution(zt::Device::emulated());
  auto self = self_communicator();
  zt::engine_detail::PipelineExecutor executor(*self, *self, execution, 0, 1);
  const std::uint64_t queue = zt::detail::emulated_queue_of(execution.compute());
  auto queue_work = [&] { zt::detail::emulated_enqueue(queue, [] { std::this_thread::sleep_for(20ms); }); };
  constexpr int kMicro = 3;
  const zt::Batch batch{zt::testing::random_tokens({1, 4}, 16, 1), zt::testing::random_tokens({1, 4}, 16, 2)};
  const zt::engine_detail::PipelineStageWork work{
      .load = [&](std::int64_t) { return batch; },
      .forward =
          [&](const zt::Tensor& input, std::int64_t, const zt::Batch&) {
            queue_work();
            return input;
          },
      .backward =
          [&](const zt::Tensor&, std::int64_t) {
            queue_work();
            return zt::Tensor();
          },
      .reduce_tied_gradients = [] {},
      .reduce_gradients = [] {},
      .optimizer_step = [] {}};
  for (auto kind :
       {zt::engine_detail::PipeScheduleKind::one_f_one_b, zt::engine_detail::PipeScheduleKind::gpipe}) {
    const zt::PipelineTiming timing =
        executor.run(zt::engine_detail::make_pipe_schedule(kind, 1, 0, kMicro), work);
    EXPECT_GE(timing.busy_seconds, 2 * kMicro * 0.02) << "6 items of 20 ms between the marks";
    EXPECT_LT(timing.idle_seconds, timing.busy_seconds) << "nothing to wait for";
  }
}

TEST(Pipeline, OnTheEmulatedDeviceTrainsBitwiseAsTheHost) {
  // The engine on the emulated device: activations and gradients travel between the stages over
  // its communicator, whose send completes only once its receive is posted (as NCCL's does), so
  // 1F1B's steady state runs as exchanges (a send and the next receive from the same neighbour
  // together); its memory faults on any host access, so no host-only path is left. The runs are
  // bitwise the host's: losses, masters, and evaluation.
  zt::Runtime& runtime = zt::testing::runtime();
  const zt::Device emulated = zt::Device::emulated();
  struct Case {
    const char* model;
    std::string extra;
    std::string pipeline_keys;
  };
  const std::vector<Case> cases = {
      {kTiedGpt, with_zero_stage(0), ""},
      {kTiedGpt, with_zero_stage(2), R"(, "schedule": "gpipe")"},
      {kUntiedGptWithDropout, with_zero_stage(1) + R"(, "bf16": {"enabled": true})",
       R"(, "activation_checkpoint_interval": 1)"},
      // Dynamic loss scaling: the overflow flag summed over the pipeline on the device.
      {kUntiedGpt, with_zero_stage(2) + R"(, "fp16": {"enabled": true, "initial_scale_power": 24})", ""},
  };
  for (int stages : pipeline_sizes()) {
    for (const Case& run : cases) {
      SCOPED_TRACE("pipeline " + std::to_string(stages) + ": " + run.model + run.extra + run.pipeline_keys);
      const PipelineRun host = run_on_grid(run.extra, run.model, stages, kAdamW, run.pipeline_keys);
      const PipelineRun device =
          run_on_grid(run.extra, run.model, stages, kAdamW, run.pipeline_keys, emulated);
      EXPECT_EQ(device.losses, host.losses);
      expect_masters_match(device, host, 0);
      EXPECT_LT(device.losses.back(), device.losses.front());
      EXPECT_EQ(device.timings.back().stages, stages);
      for (std::size_t step = 0; step < device.timings.size(); ++step)
        expect_device_stage_time(device.timings[step], device.step_seconds[step], 0.0);
    }
    // Evaluation (the inference schedule) on the device.
    const int data = runtime.world_size() / stages;
    const zt::Config config = parse(config_text(data, stages, "", kTiedGpt));
    zt::ProcessGrid grid(runtime, zt::GridShape{.data = data, .pipeline = stages});
    const zt::Batch batch{zt::testing::random_tokens({2, 16}, 256, 5),
                          zt::testing::random_tokens({2, 16}, 256, 6)};
    double losses[2] = {};
    for (int on_device = 0; on_device < 2; ++on_device) {
      auto stage = zt::build_model(config, grid.coordinates().pipeline);
      zt::Engine engine(runtime, *stage, config,
                        {.grid = &grid, .device = on_device ? emulated : zt::Device::host()});
      losses[on_device] = engine.eval(batch);
    }
    EXPECT_EQ(losses[1], losses[0]);
    if (runtime.world_rank() == 0) {
      std::printf("pipeline %d stages on the emulated device: bitwise the host in %zu runs and eval\n",
                  stages, cases.size());
    }
  }
}

/// One Linear(1, 1) without bias and with weight 1, as a layer of a caller's own pipelined model.
zt::nn::LayerSpec unit_linear(const std::string& name) {
  return {.key = name,
          .path = name,
          .type = "Linear",
          .parameter_count = 1,
          .build = [](zt::nn::PipelineStage&) -> std::unique_ptr<zt::nn::Module> {
            return std::make_unique<zt::nn::Linear>(1, 1, false);
          },
          .initialize =
              [](zt::nn::Module& layer) { static_cast<zt::nn::Linear&>(layer).weight().value.fill_(1.0); }};
}

TEST(Pipeline, GradientScaleOfTwoOneLayerStages) {
  // DeepSpeed's gradient-scaling scenario: y = w2 w1 x with x = 1, w = 1, loss mean((y - 0)^2): every
  // sample's gradient is 2 for both weights, so one SGD step leaves each weight at exactly 1 - 2 lr
  // whatever the micro-batches, accumulation steps and data-parallel ranks, if the gradients are
  // averaged, not summed (1 - 2 k lr), and the stages' scaling agrees.
  zt::Runtime& runtime = zt::testing::runtime();
  if (runtime.world_size() % 2 != 0) GTEST_SKIP() << "needs an even number of ranks for two stages";
  const int data = runtime.world_size() / 2;
  const std::vector<zt::nn::LayerSpec> layers = {unit_linear("first"), unit_linear("second")};
  zt::ProcessGrid grid(runtime, zt::GridShape{.data = data, .pipeline = 2, .tensor = 1});
  zt::nn::PipelineStage stage(layers, zt::nn::partition_layers(layers, 2, "uniform"),
                              grid.coordinates().pipeline);
  const zt::Config config = parse(R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
      "gradient_clipping": 0.0, "optimizer": {"type": "SGD", "params": {"lr": 0.125}},
      "pipeline": {"stages": 2}})");
  zt::Engine engine(runtime, stage, config, zt::EngineOptions{.grid = &grid});
  engine.train_batch([](std::int64_t) {
    zt::Batch batch{zt::Tensor::empty({2, 1}, zt::DType::fp32), zt::Tensor::zeros({2, 1}, zt::DType::fp32)};
    batch.inputs.fill_(1.0);
    return batch;
  });
  EXPECT_EQ(engine.last_step().loss, 1.0);
  const std::map<std::string, std::vector<float>> masters = masters_by_name(engine);
  ASSERT_EQ(masters.size(), 1u);
  EXPECT_EQ(masters.begin()->second, std::vector<float>{0.75f}) << masters.begin()->first;
  EXPECT_EQ(stage.layers().size(), 1u);
}

TEST(Pipeline, MisuseIsAClearError) {
  zt::Runtime& runtime = zt::testing::runtime();
  if (runtime.world_size() % 2 != 0) GTEST_SKIP() << "needs an even number of ranks for two stages";
  const int data = runtime.world_size() / 2;
  const zt::Config config = parse(config_text(data, 2, "", kTiedGpt));
  zt::ProcessGrid grid(runtime, zt::GridShape{.data = data, .pipeline = 2, .tensor = 1});
  // The whole model on a pipeline grid.
  auto whole = zt::build_model(parse(config_text(data, 1, "", kTiedGpt)));
  EXPECT_CONTAINS(zt::testing::error_of([&] { zt::Engine engine(runtime, *whole, config, {.grid = &grid}); }),
                  "not a zt::nn::PipelineStage");
  // Another rank's stage.
  auto wrong_stage = zt::build_model(config, 1 - grid.coordinates().pipeline);
  EXPECT_CONTAINS(
      zt::testing::error_of([&] { zt::Engine engine(runtime, *wrong_stage, config, {.grid = &grid}); }),
      "but this rank is stage");
  // build_model without a stage.
  EXPECT_CONTAINS(zt::testing::error_of([&] { (void)zt::build_model(config); }),
                  "build_model(config, stage)");
  // ZeRO-3 does not combine with stages.
  EXPECT_CONTAINS(zt::testing::error_of([&] {
                    zt::check_engine_supports(
                        parse(config_text(data, 2, R"(, "zero_optimization": {"stage": 3})", kTiedGpt)));
                  }),
                  "zero_optimization.stage 3 with pipeline.stages = 2");
  // The micro-batch API belongs to the schedule.
  auto stage_model = zt::build_model(config, grid.coordinates().pipeline);
  zt::Engine engine(runtime, *stage_model, config, {.grid = &grid});
  EXPECT_CONTAINS(zt::testing::error_of([&] {
                    (void)engine.forward(zt::Tensor::zeros({1, 4}, zt::DType::int32));
                  }),
                  "call train_batch()");
}

}  // namespace
