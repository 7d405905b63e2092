// Shared by the engine's MPI tests: a small GPT config, and a training run that returns what the
// equivalence tests compare (losses per step and the final master weights in the flat layout).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "mpi_test_main.hpp"
#include "src/engine/engine_access.hpp"
#include "zerotrain/engine.hpp"
#include "zerotrain/mpi_communicator.hpp"
#include "zerotrain/trainer.hpp"

namespace zt::testing::engine_runs {

inline constexpr const char* kAdamW = R"("gradient_clipping": 1.0,
    "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.01}},)";
// SGD without clipping is linear in the gradient: a wrong gradient scale (sum instead of mean
// across ranks, a missing 1/accumulation) changes the run, where Adam's normalization would hide it.
inline constexpr const char* kSgd = R"("gradient_clipping": 0.0,
    "optimizer": {"type": "SGD", "params": {"lr": 0.5, "momentum": 0.9}},)";

inline constexpr const char* kGptModel =
    R"({"type": "gpt", "n_layer": 2, "n_head": 2, "d_model": 32, "seq_len": 16, "vocab_size": 256})";

/// A config with micro-batch `micro`, `gas` accumulation steps, the given optimizer and model, and
/// `extra` appended inside the top-level object (start it with a comma).
inline std::string gpt_config(int micro, int gas, const std::string& extra = "",
                              const char* optimizer = kAdamW, const char* model = kGptModel) {
  return R"({
    "train_micro_batch_size_per_gpu": )" +
         std::to_string(micro) + R"(,
    "gradient_accumulation_steps": )" +
         std::to_string(gas) + R"(,
    )" + std::string(optimizer) +
         R"(
    "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 4, "warmup_type": "linear"}},
    "model": )" +
         std::string(model) +
         R"(,
    "data": {"format": "builtin", "seed": 5},
    "seed": 11)" +
         extra + "}";
}

inline Config parse(const std::string& text) {
  return Config::from_string(text, ConfigParseOptions{.warning_sink = {}});
}

struct RunResult {
  std::vector<double> losses;
  std::vector<float> master;  // real parameters only, in the flat layout's order (padding dropped)
  std::vector<std::uint64_t> comm_bytes;
  std::int64_t skipped = 0;
  std::int64_t peak_gathered = 0;
};

/// `steps` optimizer steps (every micro-batch of each), calling `after_step()` after each one.
template <typename AfterStep>
void train_steps(Engine& engine, TrainingData& data, int steps, AfterStep&& after_step) {
  for (int step = 0; step < steps; ++step) {
    for (std::int64_t micro = 0; micro < engine.batch().gradient_accumulation_steps; ++micro) {
      engine.forward(data.load(static_cast<std::uint64_t>(micro)));
      engine.backward();
      EXPECT_EQ(engine.step(), micro + 1 == engine.batch().gradient_accumulation_steps);
    }
    data.advance();
    after_step();
  }
}

inline void train_steps(Engine& engine, TrainingData& data, int steps) {
  train_steps(engine, data, steps, [] {});
}

/// The engine's master weights, real parameters only, in the flat layout's order: the layout's
/// padding depends on the rank count and the stage. Collective over the data-parallel group.
inline std::vector<float> real_master_parameters(Engine& engine) {
  const std::vector<float> flat = zt::engine_detail::inspect(engine).gather_master_parameters();
  std::vector<float> real;
  for (const FlatParameter& slot : zt::engine_detail::inspect(engine).flat_layout())
    real.insert(real.end(), flat.begin() + slot.offset, flat.begin() + slot.offset + slot.numel);
  return real;
}

/// Train `steps` optimizer steps with the engine on `data_parallel` (nullptr: the world).
inline RunResult run(const Config& config, int steps, Communicator* data_parallel) {
  Runtime& runtime = zt::testing::runtime();
  auto model = build_model(config);
  Engine engine(runtime, *model, config, EngineOptions{.data_parallel = data_parallel});
  auto data = make_training_data(engine.config(), engine, std::nullopt);
  RunResult result;
  train_steps(engine, *data, steps, [&] {
    result.losses.push_back(engine.last_step().loss);
    result.comm_bytes.push_back(engine.last_step().comm_bytes);
  });
  result.master = real_master_parameters(engine);
  result.skipped = engine.skipped_steps();
  result.peak_gathered = zt::engine_detail::inspect(engine).peak_gathered_parameters();
  return result;
}

inline double max_abs_difference(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    worst = std::max(worst, double(std::fabs(a[i] - b[i])));
  return worst;
}

/// The first `size` ranks of the world as a data-parallel group (null on the others).
inline std::unique_ptr<Communicator> first_ranks(int size) {
  MPI_Comm comm = MPI_COMM_NULL;
  const int rank = runtime().world_rank();
  MPI_Comm_split(MPI_COMM_WORLD, rank < size ? 0 : MPI_UNDEFINED, rank, &comm);
  if (comm == MPI_COMM_NULL) return nullptr;
  auto communicator = make_mpi_communicator(comm, "group");
  MPI_Comm_free(&comm);
  return communicator;
}

/// The backend of the data group's communicator that the engine makes on `device` (EngineInspection::
/// data_group_backend): MPI on the host; on a device, copies for a group of one rank unless
/// ZT_ONE_RANK_GROUPS=device, then NCCL on a GPU and the emulated device's (MPI moving the data).
/// Checked by the runs that claim to go through a device communicator.
inline CommBackend expected_data_group_backend(Device device, int data_ranks) {
  if (device.is_host()) return CommBackend::mpi;
  const char* one_rank_groups = std::getenv("ZT_ONE_RANK_GROUPS");
  if (data_ranks == 1 && (one_rank_groups == nullptr || std::string(one_rank_groups) != "device"))
    return CommBackend::local;
  return device.is_cuda() ? CommBackend::nccl : CommBackend::mpi;
}

inline std::unique_ptr<Communicator> self_communicator() {
  return make_mpi_communicator(MPI_COMM_SELF, "self");
}

/// A pipeline stage's time on a device is its compute stream's (pipeline_executor.hpp), not the
/// host's clock around the calls that only queue the work (which gave a few milliseconds of a step
/// of seconds): busy more than `least_busy_seconds`, busy and idle together within the step.
inline void expect_device_stage_time(const PipelineTiming& timing, double step_seconds,
                                     double least_busy_seconds) {
  EXPECT_GT(timing.busy_seconds, least_busy_seconds)
      << "stage " << timing.stage << ": busy " << timing.busy_seconds << " s, idle " << timing.idle_seconds
      << " s in a step of " << step_seconds << " s";
  EXPECT_LE(timing.busy_seconds + timing.idle_seconds, 1.01 * step_seconds + 1e-3)
      << "stage " << timing.stage << ": busy " << timing.busy_seconds << " s, idle " << timing.idle_seconds
      << " s in a step of " << step_seconds << " s";
}

}  // namespace zt::testing::engine_runs
