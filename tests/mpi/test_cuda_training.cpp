// The engine on a GPU (EngineOptions::device = cuda:<local rank>): the built-in GPT trained a few
// steps at ZeRO stages 0-3, in fp32 and bf16, equals the host run within tolerance; so does stage 2
// with offload_optimizer "cpu" (the host optimizer over pinned buffers, DeviceOffloadedUpdate), and
// stages 1-3 with offload_optimizer "nvme" (sub-groups from the swap file updated by the host
// optimizer, gradients and parameters through the same pinned pipeline), and stage 3 with the
// parameters on NVMe as well (offload_param "nvme"), pipeline stages on the GPUs, and activation
// checkpoints with their inputs on the device or the host. The
// device communicators are NCCL, ordered with the engine's compute stream (docs/gpu.md, "NCCL in
// the engine").
//
// The GPU's kernels sum in other orders than the host's, so the runs are not bitwise equal: the
// tolerance is on the distance between the two final masters relative to how far training moved
// the master (a run that did not train, or trained on wrong gradients, is far off), and on the
// losses. SGD (linear in the gradient) keeps small differences small; Adam's normalization would
// turn a sign difference of a tiny gradient into a full step.
//
// They run when every rank has a usable GPU of its own; otherwise every test skips with
// "no usable GPU: <reason>" (gpu_per_rank.hpp), which ctest shows as skipped.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "engine_runs.hpp"
#include "gpu_per_rank.hpp"
#include "job_directory.hpp"
#include "mpi_test_main.hpp"
#include "zerotrain/engine.hpp"
#include "zerotrain/process_grid.hpp"
#include "zerotrain/trainer.hpp"

namespace {

using namespace zt::testing::engine_runs;

constexpr int kSteps = 3;
constexpr int kGlobalBatch = 8;

/// Stage `stage` with small buckets (several per backward, reduced while backward runs) and
/// stage 3's prefetch on; `zero_extra` goes into the zero section, `precision` at the top level.
zt::Config config_of(int stage, const std::string& zero_extra, const std::string& precision,
                     const char* optimizer = kSgd, const char* model = kGptModel) {
  const int world = zt::testing::runtime().world_size();
  return parse(gpt_config(kGlobalBatch / world / 2, 2,
                          R"(, "zero_optimization": {"stage": )" + std::to_string(stage) +
                              R"(, "reduce_bucket_size": 3000, "allgather_bucket_size": 3000,)"
                              R"( "overlap_comm": true, "stage3_prefetch_bucket_size": 3000)" +
                              zero_extra + "}" + precision,
                          optimizer, model));
}

constexpr const char* kBf16 = R"(, "bf16": {"enabled": true})";

struct TrainingRun {
  std::vector<double> losses;
  std::vector<float> initial;             // the master before the first step
  std::vector<float> master;              // ... and after the last
  std::vector<std::uint64_t> comm_bytes;  // each step's model traffic (metrics' comm_bytes)
};

TrainingRun train_on(zt::Device device, const zt::Config& config) {
  auto model = zt::build_model(config);
  zt::Engine engine(zt::testing::runtime(), *model, config, {.device = device});
  auto data = zt::make_training_data(engine.config(), engine, std::nullopt);
  TrainingRun run;
  EXPECT_EQ(zt::engine_detail::inspect(engine).data_group_backend(),
            expected_data_group_backend(device, zt::testing::runtime().world_size()));
  run.initial = real_master_parameters(engine);
  for (int step = 0; step < kSteps; ++step) {
    engine.train_batch([&](std::int64_t micro) { return data->load(static_cast<std::uint64_t>(micro)); });
    data->advance();
    run.losses.push_back(engine.last_step().loss);
    run.comm_bytes.push_back(engine.last_step().comm_bytes);
  }
  run.master = real_master_parameters(engine);
  return run;
}

double distance(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double sum = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    sum += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  return std::sqrt(sum);
}

struct Tolerance {
  double loss;    // relative, per step
  double master;  // |gpu - host| / |host - initial|
};

void expect_close(const TrainingRun& gpu, const TrainingRun& host, Tolerance tolerance) {
  ASSERT_EQ(gpu.losses.size(), host.losses.size());
  for (std::size_t i = 0; i < host.losses.size(); ++i) {
    EXPECT_NEAR(gpu.losses[i], host.losses[i], tolerance.loss * std::abs(host.losses[i])) << "step " << i + 1;
  }
  EXPECT_EQ(gpu.initial, host.initial) << "the same seed initializes the same weights";
  const double moved = distance(host.master, host.initial);
  ASSERT_GT(moved, 0.0) << "the host run did not train";
  EXPECT_LT(distance(gpu.master, host.master), tolerance.master * moved)
      << "moved " << moved << " from the initial weights";
  EXPECT_LT(host.losses.back(), host.losses.front());
  // The same reductions and gathers, through NCCL on the GPU: the same bytes in the metrics.
  EXPECT_EQ(gpu.comm_bytes, host.comm_bytes);
}

TEST(CudaTraining, EqualsTheHostAtEveryStage) {
  ZT_SKIP_WITHOUT_GPU_PER_RANK();
  for (int stage : {0, 1, 2, 3}) {
    for (const char* precision : {"", kBf16}) {
      SCOPED_TRACE("stage " + std::to_string(stage) + precision);
      const zt::Config config = config_of(stage, "", precision);
      const TrainingRun host = train_on(zt::Device::host(), config);
      const TrainingRun gpu = train_on(zt::testing::gpu_of_this_rank(), config);
      const bool bf16 = *precision != '\0';
      expect_close(gpu, host, bf16 ? Tolerance{2e-2, 0.1} : Tolerance{1e-4, 1e-3});
    }
  }
}

TEST(CudaTraining, PipelineStagesEqualTheHost) {
  // Two (or, on four ranks, four) pipeline stages on the GPUs: activations and gradients between
  // the stages over NCCL (1F1B's steady state as grouped exchanges), ZeRO-1 within each stage's
  // data group, tied embeddings summed between the first and the last stage.
  ZT_SKIP_WITHOUT_GPU_PER_RANK();
  zt::Runtime& runtime = zt::testing::runtime();
  const int world = runtime.world_size();
  if (world == 1) GTEST_SKIP() << "pipeline stages need 2 or more ranks";
  for (int stages : {2, 4}) {
    if (world % stages != 0) continue;
    for (const char* precision : {"", kBf16}) {
      SCOPED_TRACE("pipeline " + std::to_string(stages) + precision);
      const int data = world / stages;
      const zt::Config config =
          parse(gpt_config(kGlobalBatch / data / 4, 4,
                           R"(, "zero_optimization": {"stage": 1}, "pipeline": {"stages": )" +
                               std::to_string(stages) + "}" + precision,
                           kSgd));
      zt::ProcessGrid grid(runtime, zt::GridShape{.data = data, .pipeline = stages, .tensor = 1});
      TrainingRun runs[2];
      for (int on_gpu = 0; on_gpu < 2; ++on_gpu) {
        auto stage = zt::build_model(config, grid.coordinates().pipeline);
        zt::Engine engine(
            runtime, *stage, config,
            {.grid = &grid, .device = on_gpu ? zt::testing::gpu_of_this_rank() : zt::Device::host()});
        auto data_source = zt::make_training_data(engine.config(), engine, std::nullopt);
        TrainingRun& run = runs[on_gpu];
        run.initial = real_master_parameters(engine);
        for (int step = 0; step < kSteps; ++step) {
          const auto started = std::chrono::steady_clock::now();
          engine.train_batch(
              [&](std::int64_t micro) { return data_source->load(static_cast<std::uint64_t>(micro)); });
          const std::chrono::duration<double> step_time = std::chrono::steady_clock::now() - started;
          data_source->advance();
          run.losses.push_back(engine.last_step().loss);
          // Launches bound a small model's step on a GPU, and its kernels on the CPU here: the
          // forwards and backwards are a good part of it either way.
          if (on_gpu)
            expect_device_stage_time(engine.last_step().pipeline, step_time.count(), 0.1 * step_time.count());
        }
        run.master = real_master_parameters(engine);
      }
      expect_close(runs[1], runs[0], *precision != '\0' ? Tolerance{2e-2, 0.1} : Tolerance{1e-4, 1e-3});
    }
  }
}

TEST(CudaTraining, OffloadsTheOptimizerToTheHostAtStage2) {
  ZT_SKIP_WITHOUT_GPU_PER_RANK();
  for (const char* optimizer : {kSgd, kAdamW}) {
    for (const char* precision : {"", kBf16}) {
      SCOPED_TRACE(std::string(optimizer == kSgd ? "SGD" : "AdamW") + precision);
      const zt::Config config = config_of(
          2, R"(, "offload_optimizer": {"device": "cpu", "pin_memory": true})", precision, optimizer);
      const TrainingRun host = train_on(zt::Device::host(), config);
      const TrainingRun gpu = train_on(zt::testing::gpu_of_this_rank(), config);
      const bool bf16 = *precision != '\0';
      // Adam turns tiny gradient differences into full steps: its weights are compared loosely.
      const double master = optimizer == kSgd ? (bf16 ? 0.1 : 1e-3) : 0.5;
      expect_close(gpu, host, {bf16 ? 2e-2 : 1e-3, master});
    }
  }
}

/// The states in the swap file (small sub-groups: the owned ranges split across them), the host
/// optimizer updating each sub-group with the gradients brought down from the GPU, against the host
/// engine with the same NVMe offload.
TEST(CudaTraining, OffloadsTheOptimizerToNvme) {
  ZT_SKIP_WITHOUT_GPU_PER_RANK();
  zt::testing::JobDirectory directory("zt-cuda-nvme", "ZT_TEST_SWAP_DIR");
  for (int stage : {1, 2, 3}) {
    for (const char* precision : {"", kBf16}) {
      SCOPED_TRACE("stage " + std::to_string(stage) + precision);
      const zt::Config config =
          config_of(stage,
                    R"(, "sub_group_size": 1500, "offload_optimizer": {"device": "nvme",)"
                    R"( "pin_memory": true, "buffer_count": 3, "nvme_path": ")" +
                        directory.path() + "\"}",
                    precision);
      const TrainingRun host = train_on(zt::Device::host(), config);
      const TrainingRun gpu = train_on(zt::testing::gpu_of_this_rank(), config);
      const bool bf16 = *precision != '\0';
      expect_close(gpu, host, bf16 ? Tolerance{2e-2, 0.1} : Tolerance{1e-3, 1e-3});
    }
  }
}

/// Stage 3 with the parameters on NVMe too (every piece, through 2 pinned buffers): each gather
/// copies its pieces from the parameter store's buffers to the device (on the transfer stream, which
/// the all-gather waits for), the host optimizer (states on NVMe or in host memory) writes the new
/// pieces into them.
TEST(CudaTraining, OffloadsTheParametersToNvme) {
  ZT_SKIP_WITHOUT_GPU_PER_RANK();
  zt::testing::JobDirectory directory("zt-cuda-param-nvme", "ZT_TEST_SWAP_DIR");
  for (const char* optimizer_device : {"nvme", "cpu"}) {
    for (const char* precision : {"", kBf16}) {
      SCOPED_TRACE(std::string("offload_optimizer ") + optimizer_device + precision);
      const std::string path = directory.path();
      const std::string optimizer_offload =
          std::string(R"("offload_optimizer": {"device": ")") + optimizer_device +
          R"(", "pin_memory": true)" +
          (std::string(optimizer_device) == "nvme" ? R"(, "buffer_count": 3, "nvme_path": ")" + path + "\""
                                                   : "") +
          "}";
      const zt::Config config = config_of(3,
                                          R"(, "sub_group_size": 1500, "offload_param": {"device": "nvme",)"
                                          R"( "pin_memory": true, "max_in_cpu": 0, "buffer_count": 2,)"
                                          R"( "nvme_path": ")" +
                                              path + "\"}, " + optimizer_offload,
                                          precision);
      const TrainingRun host = train_on(zt::Device::host(), config);
      const TrainingRun gpu = train_on(zt::testing::gpu_of_this_rank(), config);
      const bool bf16 = *precision != '\0';
      expect_close(gpu, host, bf16 ? Tolerance{2e-2, 0.1} : Tolerance{1e-3, 1e-3});
    }
  }
}

/// Stage 3 with offload_param "cpu": every piece in host memory, none on the GPU; each gather copies
/// its pieces to the device, the host optimizer (offload_optimizer "cpu") writes their new values.
TEST(CudaTraining, OffloadsTheParametersToHostMemory) {
  ZT_SKIP_WITHOUT_GPU_PER_RANK();
  for (const char* precision : {"", kBf16}) {
    SCOPED_TRACE(std::string("offload_param cpu") + precision);
    const zt::Config config = config_of(
        3,
        R"(, "offload_param": {"device": "cpu", "pin_memory": true}, "offload_optimizer": {"device": "cpu", "pin_memory": true})",
        precision);
    const TrainingRun host = train_on(zt::Device::host(), config);
    const TrainingRun gpu = train_on(zt::testing::gpu_of_this_rank(), config);
    const bool bf16 = *precision != '\0';
    expect_close(gpu, host, bf16 ? Tolerance{2e-2, 0.1} : Tolerance{1e-3, 1e-3});
  }
}

/// Activation checkpoints on the GPU: every block of a 4-block GPT with dropout in its own checkpoint
/// (the recompute must draw the forward's masks again), the inputs kept on the device or, with
/// cpu_checkpointing, in pinned host memory: copied down on the transfer stream during the
/// checkpoint's forward and uploaded again on it by the backward of the checkpoint after it, which
/// only the checkpoint's own recompute waits for (nn::ActivationCheckpoint). A copy ordered wrongly
/// on the device (a recompute reading an input not yet uploaded, a pinned copy reused too early)
/// shows here as a run far from the host's; the emulated device, whose streams run at once, cannot.
TEST(CudaTraining, CheckpointsActivationsOnTheDeviceOrTheHost) {
  ZT_SKIP_WITHOUT_GPU_PER_RANK();
  const char* model =
      R"({"type": "gpt", "n_layer": 4, "n_head": 2, "d_model": 32, "seq_len": 16, "vocab_size": 256, "dropout": 0.1})";
  for (int stage : {0, 3}) {
    for (const char* keep : {"", R"(, "activation_checkpointing": {"cpu_checkpointing": true})"}) {
      for (const char* precision : {"", kBf16}) {
        SCOPED_TRACE("stage " + std::to_string(stage) + keep + precision);
        const zt::Config config = config_of(
            stage, "",
            std::string(R"(, "pipeline": {"activation_checkpoint_interval": 1})") + keep + precision, kSgd,
            model);
        const TrainingRun host = train_on(zt::Device::host(), config);
        const TrainingRun gpu = train_on(zt::testing::gpu_of_this_rank(), config);
        const bool bf16 = *precision != '\0';
        expect_close(gpu, host, bf16 ? Tolerance{2e-2, 0.1} : Tolerance{1e-4, 1e-3});
      }
    }
  }
}

/// A model beyond the GPU's memory (about 12e9 parameters: 48 GB in fp32 as built on the host, 16 B
/// each as fp32 AdamW states on the device at stage 0, beyond an H200's 141 GB) is refused by
/// zt::train before the model is built, with the device's free memory as cudaMemGetInfo reports it,
/// not by an out-of-memory error partway through the allocations.
TEST(CudaTraining, AModelBeyondTheGpuIsRefusedBeforeItsAllocation) {
  ZT_SKIP_WITHOUT_GPU_PER_RANK();
  const zt::Config config = parse(gpt_config(
      2, 1, "", kAdamW,
      R"({"type": "gpt", "n_layer": 60, "n_head": 32, "d_model": 4096, "seq_len": 64, "vocab_size": 256})"));
  zt::TrainOptions options;
  options.steps = 1;
  options.device = zt::testing::gpu_of_this_rank();
  std::string message = "no ConfigError";
  try {
    (void)zt::train(zt::testing::runtime(), config, options);
  } catch (const zt::ConfigError& error) {
    message = error.what();
  }
  EXPECT_NE(message.find("the model cannot fit in the device's memory: each rank needs at least"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("(cudaMemGetInfo over the job's"), std::string::npos) << message;
}

}  // namespace
