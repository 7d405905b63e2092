// Pipeline parallelism: the measured bubble against the ideal (p - 1) / (m + p - 1), peak activation
// memory of 1F1B against GPipe, and the step time of a pipeline x data layout against pure ZeRO-2 on
// the same ranks and global batch.
//
//   mpirun -n W zt_bench_pipeline [--stages P] [--micro-batches LIST] [--steps N] [--layers L]
//                                 [--d-model C] [--compare-zero2 1]
//
// The model is a GPT of L transformer blocks (d_model C, seq_len 64, vocab 256, 4 heads) split with
// "type:TransformerBlock", so each stage holds L / P blocks and the small embeddings and head ride
// along; P stages x (W / P) data ranks, micro-batch 4 per data rank, m = gradient_accumulation_steps
// micro-batches per step. For each m and schedule it runs one untimed step and N timed ones and
// prints, over the stages, the mean and largest measured bubble (a stage's idle / (busy + idle),
// zt::StepReport::pipeline), the ideal, the median step time and the largest stage's peak of
// activation memory. With --compare-zero2 1 it then alternates pipeline x data 1F1B steps with
// ZeRO-2 steps on all W ranks (one stage) on the same global batch and prints the ratio of medians.
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_helpers.hpp"
#include "src/engine/pipeline_schedule.hpp"
#include "zerotrain/device.hpp"
#include "zerotrain/engine.hpp"
#include "zerotrain/process_grid.hpp"
#include "zerotrain/runtime.hpp"
#include "zerotrain/trainer.hpp"

namespace {

constexpr const char* kUsage =
    "usage: mpirun -n W zt_bench_pipeline [--stages P] [--micro-batches 1,2,4,8,16] [--steps N] [--layers L] "
    "[--d-model C] [--compare-zero2 0|1]";

struct Options {
  int stages = 2;
  std::vector<int> micro_batches = {1, 2, 4, 8, 16};
  int steps = 5;
  int layers = 8;
  int d_model = 128;
  bool compare_zero2 = false;
};

std::vector<int> parse_list(const std::string& text) {
  std::vector<int> values;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) values.push_back(std::stoi(item));
  return values;
}

std::string config_text(const Options& options, int stages, int micro_batches, const char* schedule,
                        int zero_stage) {
  return R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": )" +
         std::to_string(micro_batches) +
         R"(, "gradient_clipping": 1.0, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
    "zero_optimization": {"stage": )" +
         std::to_string(zero_stage) + R"(}, "pipeline": {"stages": )" + std::to_string(stages) +
         R"(, "partition": "type:TransformerBlock", "schedule": ")" + schedule + R"("},
    "model": {"type": "gpt", "n_layer": )" +
         std::to_string(options.layers) + R"(, "n_head": 4, "d_model": )" + std::to_string(options.d_model) +
         R"(, "seq_len": 64, "vocab_size": 256}, "data": {"format": "builtin", "seed": 1}, "seed": 3})";
}

/// An engine on a grid of `stages` x (world / stages), with its data.
struct Run {
  std::unique_ptr<zt::ProcessGrid> grid;
  std::unique_ptr<zt::nn::Module> model;
  std::unique_ptr<zt::Engine> engine;
  std::unique_ptr<zt::TrainingData> data;

  Run(zt::Runtime& runtime, const zt::Config& config, int stages) {
    grid = std::make_unique<zt::ProcessGrid>(
        runtime, zt::GridShape{.data = runtime.world_size() / stages, .pipeline = stages});
    model = stages > 1 ? zt::build_model(config, grid->coordinates().pipeline) : zt::build_model(config);
    engine = std::make_unique<zt::Engine>(runtime, *model, config, zt::EngineOptions{.grid = grid.get()});
    data = zt::make_training_data(engine->config(), *engine, std::nullopt);
  }
  /// One optimizer step; returns its wall time in seconds (the slowest rank's).
  double step() {
    MPI_Barrier(MPI_COMM_WORLD);
    const auto started = std::chrono::steady_clock::now();
    engine->train_batch([&](std::int64_t micro) { return data->load(static_cast<std::uint64_t>(micro)); });
    data->advance();
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return seconds;
  }
};

}  // namespace

int main(int argc, char** argv) {
  Options options;
  zt::bench::parse_flags(argc, argv, kUsage, [&](const std::string& flag, const std::string& value) {
    if (flag == "--stages")
      options.stages = std::stoi(value);
    else if (flag == "--micro-batches")
      options.micro_batches = parse_list(value);
    else if (flag == "--steps")
      options.steps = std::stoi(value);
    else if (flag == "--layers")
      options.layers = std::stoi(value);
    else if (flag == "--d-model")
      options.d_model = std::stoi(value);
    else if (flag == "--compare-zero2")
      options.compare_zero2 = value == "1";
    else
      return false;
    return true;
  });
  zt::Runtime runtime(&argc, &argv);
  const int world = runtime.world_size();
  const int data = world / options.stages;
  const bool printer = runtime.world_rank() == 0;
  if (printer) {
    std::printf("pipeline bench: %d ranks = %d stages x %d data, GPT %d blocks d_model %d, micro-batch 4\n",
                world, options.stages, data, options.layers, options.d_model);
    std::printf("%-6s %4s %8s %10s %10s %10s %12s %14s\n", "sched", "m", "ideal", "bubble", "max-bubble",
                "step-ms", "ms/micro", "peak-act-MiB");
  }
  for (int m : options.micro_batches) {
    for (const char* schedule : {"1f1b", "gpipe"}) {
      const zt::Config config = zt::Config::from_string(config_text(options, options.stages, m, schedule, 1),
                                                        zt::ConfigParseOptions{.warning_sink = {}});
      Run run(runtime, config, options.stages);
      run.step();  // untimed: first-touch of buffers
      zt::reset_memory_peaks();
      std::vector<double> seconds, bubbles;
      for (int step = 0; step < options.steps; ++step) {
        seconds.push_back(run.step());
        bubbles.push_back(run.engine->last_step().pipeline.bubble_fraction());
      }
      double bubble = zt::bench::median(bubbles);
      double stage_bubbles[2] = {bubble, bubble};  // sum (for the mean) and max over ranks
      MPI_Allreduce(MPI_IN_PLACE, &stage_bubbles[0], 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      MPI_Allreduce(MPI_IN_PLACE, &stage_bubbles[1], 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      double peak = static_cast<double>(
          zt::memory_snapshot(zt::DeviceType::host)[zt::MemoryCategory::activations].peak);
      MPI_Allreduce(MPI_IN_PLACE, &peak, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      const double step_ms = 1e3 * zt::bench::median(seconds);
      if (printer) {
        std::printf("%-6s %4d %8.3f %10.3f %10.3f %10.1f %12.2f %14.2f\n", schedule, m,
                    zt::engine_detail::ideal_bubble_fraction(options.stages, m), stage_bubbles[0] / world,
                    stage_bubbles[1], step_ms, step_ms / m, peak / (1 << 20));
      }
    }
  }
  if (options.compare_zero2) {
    const int m = options.micro_batches.back();
    // The same global batch: 4 x m x data samples in the pipeline, 4 x (m / stages) x world with ZeRO-2.
    const zt::Config pipelined = zt::Config::from_string(config_text(options, options.stages, m, "1f1b", 2),
                                                         zt::ConfigParseOptions{.warning_sink = {}});
    const zt::Config zero2 = zt::Config::from_string(config_text(options, 1, m / options.stages, "1f1b", 2),
                                                     zt::ConfigParseOptions{.warning_sink = {}});
    Run pipe(runtime, pipelined, options.stages);
    Run flat(runtime, zero2, 1);
    pipe.step();
    flat.step();
    std::vector<double> pipe_seconds, flat_seconds;
    for (int round = 0; round < options.steps; ++round) {  // interleaved against drift
      pipe_seconds.push_back(pipe.step());
      flat_seconds.push_back(flat.step());
    }
    if (printer) {
      std::printf(
          "global batch %lld: pipeline %d x data %d (ZeRO-2, 1F1B, m %d) %.1f ms/step; ZeRO-2 on %d ranks "
          "(m %d) %.1f ms/step; ratio pipeline / ZeRO-2 %.2f\n",
          static_cast<long long>(pipe.engine->batch().train_batch_size), options.stages, data, m,
          1e3 * zt::bench::median(pipe_seconds), world, m / options.stages,
          1e3 * zt::bench::median(flat_seconds),
          zt::bench::median(pipe_seconds) / zt::bench::median(flat_seconds));
    }
  }
  return 0;
}
