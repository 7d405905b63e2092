// `zerotrain estimate`'s activations against measured runs: the peak of
// MemoryCategory::activations that a rank reaches in training steps through zt::Engine (above
// what it held before them) equals the estimate exactly for unpipelined GPT and MLP runs (micro-
// batch 1 and 4, dropout on and off, activation checkpoints of 1 and 2 layers, fp32 and bf16),
// and lies between the estimate's two send models for 2- and 4-stage pipelines (1F1B and GPipe,
// with and without checkpointing). With the engine on the emulated device (a device's allocations,
// as on a GPU) the estimate for a device is the device's measured peak exactly, with and without
// cpu_checkpointing, and bounds 2-stage pipelines likewise. Each run prints predicted against
// measured.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "engine_runs.hpp"
#include "mpi_test_main.hpp"
#include "zerotrain/device.hpp"
#include "zerotrain/engine.hpp"
#include "zerotrain/estimate.hpp"
#include "zerotrain/process_grid.hpp"
#include "zerotrain/trainer.hpp"

namespace {

using namespace zt::testing::engine_runs;

constexpr int kSteps = 2;

std::string gpt_model(double dropout, int n_layer = 4) {
  return R"({"type": "gpt", "n_layer": )" + std::to_string(n_layer) +
         R"(, "n_head": 2, "d_model": 32, "seq_len": 16, "vocab_size": 256, "dropout": )" +
         std::to_string(dropout) + "}";
}

/// The peak of activation memory on `device` above what this rank held there before `kSteps`
/// training steps of the engine on that device.
std::uint64_t measured_peak(const zt::Config& config, zt::Device device = zt::Device::host()) {
  zt::Runtime& runtime = zt::testing::runtime();
  const int stages = static_cast<int>(config.pipeline.stage_count());
  zt::ProcessGrid grid(runtime,
                       zt::GridShape{.data = runtime.world_size() / stages, .pipeline = stages, .tensor = 1});
  auto model = stages > 1 ? zt::build_model(config, grid.coordinates().pipeline) : zt::build_model(config);
  zt::Engine engine(runtime, *model, config, zt::EngineOptions{.grid = &grid, .device = device});
  auto data = zt::make_training_data(engine.config(), engine, std::nullopt);
  const std::size_t before = zt::memory_snapshot(device.type)[zt::MemoryCategory::activations].current;
  zt::reset_memory_peaks();
  for (int step = 0; step < kSteps; ++step) {
    engine.train_batch([&](std::int64_t micro) { return data->load(static_cast<std::uint64_t>(micro)); });
    data->advance();
  }
  return zt::memory_snapshot(device.type)[zt::MemoryCategory::activations].peak - before;
}

void print(const std::string& what, const zt::ActivationEstimate& estimate, std::uint64_t measured) {
  std::printf(
      "[rank %d of %d] %s: stage %d/%d, kept %llu B x %lld in flight + transient %llu B = "
      "predicted %llu B (sends wait: %llu B), measured %llu B\n",
      zt::testing::runtime().world_rank(), zt::testing::runtime().world_size(), what.c_str(),
      estimate.pipeline_stage, estimate.pipeline_stages,
      static_cast<unsigned long long>(estimate.kept_per_micro_batch),
      static_cast<long long>(estimate.in_flight), static_cast<unsigned long long>(estimate.transient),
      static_cast<unsigned long long>(estimate.peak),
      static_cast<unsigned long long>(estimate.peak_if_sends_wait),
      static_cast<unsigned long long>(measured));
}

zt::ActivationEstimate estimate_of(const zt::Config& config, zt::DeviceType device = zt::DeviceType::host) {
  zt::Runtime& runtime = zt::testing::runtime();
  const int stage = zt::pipeline_stage_of(runtime, config);
  return zt::estimate_activation_memory(config, runtime.world_size(), stage, device);
}

TEST(ActivationEstimate, IsTheMeasuredPeakOfUnpipelinedGptRuns) {
  for (int micro : {1, 4}) {
    for (double dropout : {0.0, 0.1}) {
      for (const char* precision : {"", R"(, "bf16": {"enabled": true})"}) {
        if (micro == 1 && *precision != '\0') continue;  // bf16 once per shape is enough
        std::uint64_t measured_without_checkpointing = 0;
        for (int interval : {0, 1, 2}) {  // 0 first: the others compare their estimate without with it
          const std::string checkpointing =
              interval == 0
                  ? ""
                  : R"(, "pipeline": {"activation_checkpoint_interval": )" + std::to_string(interval) + "}";
          const std::string label = "GPT micro " + std::to_string(micro) + ", dropout " +
                                    std::to_string(dropout) + ", checkpoint interval " +
                                    std::to_string(interval) + (*precision != '\0' ? ", bf16" : "");
          SCOPED_TRACE(label);
          const zt::Config config =
              parse(gpt_config(micro, 2, checkpointing + precision, kAdamW, gpt_model(dropout).c_str()));
          const zt::ActivationEstimate estimate = estimate_of(config);
          const std::uint64_t measured = measured_peak(config);
          print(label, estimate, measured);
          EXPECT_EQ(estimate.in_flight, 1);
          EXPECT_EQ(estimate.checkpoint_interval, interval);
          EXPECT_EQ(estimate.peak, measured);
          EXPECT_EQ(estimate.peak, estimate.kept_per_micro_batch + estimate.transient);
          if (interval == 0) {
            measured_without_checkpointing = measured;
            EXPECT_EQ(estimate.kept_per_micro_batch, estimate.kept_without_checkpointing);
          } else {
            EXPECT_LT(estimate.kept_per_micro_batch, estimate.kept_without_checkpointing);
            EXPECT_LT(estimate.peak, estimate.peak_without_checkpointing);
          }
          EXPECT_EQ(estimate.peak_without_checkpointing, measured_without_checkpointing);
        }
      }
    }
  }
}

TEST(ActivationEstimate, IsTheMeasuredPeakOfUnpipelinedMlpRuns) {
  for (int micro : {1, 4}) {
    for (int interval : {0, 1, 2}) {
      const std::string checkpointing =
          interval == 0
              ? ""
              : R"(, "pipeline": {"activation_checkpoint_interval": )" + std::to_string(interval) + "}";
      const std::string label =
          "MLP micro " + std::to_string(micro) + ", checkpoint interval " + std::to_string(interval);
      SCOPED_TRACE(label);
      const zt::Config config =
          parse(R"({"train_micro_batch_size_per_gpu": )" + std::to_string(micro) +
                R"(, "gradient_accumulation_steps": 2, )" + kAdamW +
                R"( "model": {"type": "mlp", "sizes": [16, 64, 64, 8], "activation": "gelu"},
          "data": {"format": "synthetic", "seed": 3}, "seed": 5)" +
                checkpointing + "}");
      const zt::ActivationEstimate estimate = estimate_of(config);
      const std::uint64_t measured = measured_peak(config);
      print(label, estimate, measured);
      EXPECT_EQ(estimate.peak, measured);
    }
  }
}

TEST(ActivationEstimate, BoundsTheMeasuredPeakOfPipelinedGptRuns) {
  const int world = zt::testing::runtime().world_size();
  if (world == 1) GTEST_SKIP() << "pipelines need 2 or 4 ranks";
  for (int stages : {2, 4}) {
    if (world % stages != 0) continue;
    for (const char* schedule : {"1f1b", "gpipe"}) {
      for (int interval : {0, 1}) {
        for (double dropout : {0.0, 0.1}) {
          const std::string label = std::to_string(stages) + " stages, " + schedule +
                                    ", checkpoint interval " + std::to_string(interval) + ", dropout " +
                                    std::to_string(dropout);
          SCOPED_TRACE(label);
          const std::string pipeline =
              R"(, "pipeline": {"stages": )" + std::to_string(stages) + R"(, "schedule": ")" + schedule +
              R"(", "activation_checkpoint_interval": )" + std::to_string(interval) + "}";
          const int micro_batches = 4;
          const zt::Config config =
              parse(gpt_config(2, micro_batches, pipeline, kAdamW, gpt_model(dropout, 6).c_str()));
          const zt::ActivationEstimate estimate = estimate_of(config);
          const std::uint64_t measured = measured_peak(config);
          print(label, estimate, measured);
          const int stage = estimate.pipeline_stage;
          EXPECT_EQ(estimate.in_flight, std::string(schedule) == "gpipe"
                                            ? micro_batches
                                            : std::min(stages - stage, micro_batches));
          EXPECT_LE(estimate.peak, measured);
          EXPECT_LE(measured, estimate.peak_if_sends_wait);
          EXPECT_EQ(estimate.peak, estimate.kept_per_micro_batch * estimate.in_flight + estimate.transient);
        }
      }
    }
  }
}

/// The engine on the emulated device (a device's memory, allocated as on a GPU): the micro-batches
/// stay on the host and the device holds the engine's copies of them; with cpu_checkpointing the
/// checkpoints' inputs are on the host, each uploaded again from the backward of the checkpoint
/// after it to its own. The estimate for a device is the device's measured peak exactly (GPT and
/// MLP, unpipelined), and the host's pinned bytes are the checkpoints' inputs.
TEST(ActivationEstimate, IsTheMeasuredPeakOnADevice) {
  const zt::Device device = zt::Device::emulated();
  for (bool gpt : {true, false}) {
    for (int interval : {0, 1, 2}) {
      for (bool cpu_checkpointing : {false, true}) {
        if (interval == 0 && cpu_checkpointing) continue;  // no checkpoints, nothing to keep
        const std::string label = std::string(gpt ? "GPT" : "MLP") +
                                  " on the emulated device, checkpoint interval " + std::to_string(interval) +
                                  (cpu_checkpointing ? ", cpu_checkpointing" : "");
        SCOPED_TRACE(label);
        std::string extra = interval == 0 ? ""
                                          : R"(, "pipeline": {"activation_checkpoint_interval": )" +
                                                std::to_string(interval) + "}";
        if (cpu_checkpointing) extra += R"(, "activation_checkpointing": {"cpu_checkpointing": true})";
        const zt::Config config =
            gpt ? parse(gpt_config(2, 2, extra + R"(, "bf16": {"enabled": true})", kAdamW,
                                   gpt_model(0.1).c_str()))
                : parse(R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, )" +
                        std::string(kAdamW) +
                        R"( "model": {"type": "mlp", "sizes": [16, 64, 64, 8], "activation": "gelu"},
          "data": {"format": "synthetic", "seed": 3}, "seed": 5)" +
                        extra + "}");
        const zt::ActivationEstimate estimate = estimate_of(config, device.type);
        const zt::ActivationEstimate on_host = estimate_of(config);
        const std::uint64_t measured = measured_peak(config, device);
        print(label, estimate, measured);
        EXPECT_EQ(estimate.device, device.type);
        EXPECT_EQ(estimate.peak, measured);
        // The host keeps the checkpoints' inputs: one [micro, T, d_model] (GPT) or [micro, width]
        // (MLP) per checkpoint.
        if (cpu_checkpointing) {
          // GPT: 4 blocks, [2, 16, 32] bf16 inputs; MLP: 3 linear layers of 16, 64, 64 inputs, [4, width]
          // fp32.
          const std::uint64_t inputs =
              gpt ? (4 / interval) * 2 * 16 * 32 * 2 : (interval == 1 ? 16 + 64 + 64 : 16 + 64) * 4 * 4;
          EXPECT_EQ(estimate.kept_on_host_per_micro_batch, inputs);
          EXPECT_LT(estimate.kept_per_micro_batch, on_host.kept_per_micro_batch);
          EXPECT_EQ(estimate.kept_per_micro_batch + estimate.kept_on_host_per_micro_batch,
                    on_host.kept_per_micro_batch)
              << "kept: the same bytes, the inputs on the host";
        } else {
          EXPECT_EQ(estimate.kept_on_host_per_micro_batch, 0u);
          EXPECT_EQ(estimate.kept_per_micro_batch, on_host.kept_per_micro_batch);
        }
      }
    }
  }
}

/// Pipelined on the emulated device: 2 stages, each checkpointing its layers, with the inputs kept on
/// the device or (cpu_checkpointing) on the host: the device's measured peak lies between the
/// estimate's two send models.
TEST(ActivationEstimate, BoundsTheMeasuredPeakOfPipelinedRunsOnADevice) {
  const int world = zt::testing::runtime().world_size();
  if (world % 2 != 0) GTEST_SKIP() << "2 pipeline stages need an even number of ranks";
  const zt::Device device = zt::Device::emulated();
  for (const char* schedule : {"1f1b", "gpipe"}) {
    for (bool cpu_checkpointing : {false, true}) {
      const std::string label = std::string("2 stages on the emulated device, ") + schedule +
                                (cpu_checkpointing ? ", cpu_checkpointing" : "");
      SCOPED_TRACE(label);
      const std::string extra =
          std::string(R"(, "pipeline": {"stages": 2, "schedule": ")") + schedule +
          R"(", "activation_checkpoint_interval": 1})" +
          (cpu_checkpointing ? R"(, "activation_checkpointing": {"cpu_checkpointing": true})" : "");
      const zt::Config config = parse(gpt_config(2, 4, extra, kAdamW, gpt_model(0.0, 6).c_str()));
      const zt::ActivationEstimate estimate = estimate_of(config, device.type);
      const std::uint64_t measured = measured_peak(config, device);
      print(label, estimate, measured);
      EXPECT_LE(estimate.peak, measured);
      EXPECT_LE(measured, estimate.peak_if_sends_wait);
      EXPECT_EQ(estimate.kept_on_host_per_micro_batch > 0, cpu_checkpointing);
    }
  }
}

}  // namespace
