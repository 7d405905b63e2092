// The engine across data-parallel ranks (ZeRO stages 0-3) against a single-process baseline run in
// the same job, plus accumulation invariance, mixed precision, the training driver's metrics and
// errors. ZeRO's partitioning details (buckets, traffic, stage-3 gathering) are in test_zero.cpp.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine_runs.hpp"
#include "mpi_test_main.hpp"
#include "src/engine/engine_access.hpp"
#include "zerotrain/engine.hpp"
#include "zerotrain/estimate.hpp"
#include "zerotrain/mpi_communicator.hpp"
#include "zerotrain/trainer.hpp"

namespace {

using namespace zt::testing::engine_runs;

constexpr int kSteps = 10;
constexpr int kGlobalBatch = 8;

/// (optimizer, ZeRO stage): partitioning must not change the run.
class EngineOptimizers : public ::testing::TestWithParam<std::tuple<const char*, int>> {
 protected:
  static std::string config(int micro, int gas, const std::string& extra = "") {
    const auto [optimizer, stage] = GetParam();
    // Stage 3 with no resident parameters, so that every module gathers (the tiny model's tensors
    // are all below the default persistence threshold).
    return gpt_config(micro, gas,
                      R"(, "zero_optimization": {"stage": )" + std::to_string(stage) +
                          R"(, "stage3_param_persistence_threshold": 0})" + extra,
                      optimizer);
  }
};

TEST_P(EngineOptimizers, DataParallelMatchesSingleProcess) {
  const int world = zt::testing::runtime().world_size();
  // Global batch 8 everywhere: baseline 4 x 2 on one process; distributed (8 / world / 2) x 2.
  auto self = self_communicator();
  const RunResult baseline = run(parse(gpt_config(4, 2, "", std::get<0>(GetParam()))), kSteps, self.get());
  const RunResult distributed = run(parse(config(kGlobalBatch / world / 2, 2)), kSteps, nullptr);
  ASSERT_EQ(baseline.losses.size(), distributed.losses.size());
  // Same samples, same arithmetic up to the order of the gradient sum (micro-batches in one
  // process vs an all-reduce across ranks): fp32 rounding differences of ~1e-7 relative per step,
  // which Adam's normalized update turns into parameter differences far below lr = 2e-3.
  for (std::size_t i = 0; i < baseline.losses.size(); ++i) {
    EXPECT_NEAR(distributed.losses[i], baseline.losses[i], 1e-5 * std::fabs(baseline.losses[i]))
        << "step " << i + 1;
  }
  EXPECT_LT(max_abs_difference(distributed.master, baseline.master), 2e-5);
  if (world == 1 && std::get<1>(GetParam()) <= 1) {
    // One rank does exactly the baseline's arithmetic. (Stages 2-3 add each micro-batch's gradient
    // into the shard after its backward instead of accumulating in place: other rounding.)
    EXPECT_EQ(distributed.losses, baseline.losses);
    EXPECT_EQ(distributed.master, baseline.master);
  }
  EXPECT_LT(distributed.losses.back(), distributed.losses.front());
}

TEST_P(EngineOptimizers, AccumulationSplitDoesNotChangeTheRun) {
  const int world = zt::testing::runtime().world_size();
  const RunResult one_micro = run(parse(config(kGlobalBatch / world, 1)), 5, nullptr);
  const RunResult two_micro = run(parse(config(kGlobalBatch / world / 2, 2)), 5, nullptr);
  for (std::size_t i = 0; i < one_micro.losses.size(); ++i) {
    EXPECT_NEAR(two_micro.losses[i], one_micro.losses[i], 1e-5 * std::fabs(one_micro.losses[i]));
  }
  EXPECT_LT(max_abs_difference(two_micro.master, one_micro.master), 2e-5);
}

INSTANTIATE_TEST_SUITE_P(OptimizersAndStages, EngineOptimizers,
                         ::testing::Combine(::testing::Values(kAdamW, kSgd), ::testing::Values(0, 1, 2, 3)),
                         [](const auto& param_info) {
                           return std::string(std::get<0>(param_info.param) == kAdamW ? "AdamW" : "Sgd") +
                                  "_stage" + std::to_string(std::get<1>(param_info.param));
                         });

/// Measured model-state bytes per rank against `zerotrain estimate` (the ZeRO formulas): equal up
/// to the engine's padding (each parameter to a multiple of N, and to 16 elements in the flat layout).
/// Stage 3 keeps no parameter resident (persistence threshold 0), as the formula assumes.
TEST(Engine, MemoryMatchesTheZeroFormulas) {
  zt::Runtime& runtime = zt::testing::runtime();
  const int world = runtime.world_size();
  for (int stage : {0, 1, 2, 3}) {
    for (const char* precision : {"", R"(, "bf16": {"enabled": true})", R"(, "fp16": {"enabled": true})"}) {
      const zt::Config config =
          parse(gpt_config(kGlobalBatch / world / 2, 2,
                           R"(, "zero_optimization": {"stage": )" + std::to_string(stage) +
                               R"(, "stage3_param_persistence_threshold": 0})" + precision));
      const zt::MemoryEstimate predicted = zt::estimate_model_state_memory(config, world);
      const auto before = zt::memory_snapshot(zt::DeviceType::host);
      auto model = zt::build_model(config);
      zt::Engine engine(runtime, *model, config);
      const auto after = zt::memory_snapshot(zt::DeviceType::host);
      auto measured = [&](zt::MemoryCategory c) { return after[c].current - before[c].current; };
      ASSERT_EQ(predicted.parameters_count, engine.parameter_count());
      const std::size_t tensors = zt::engine_detail::inspect(engine).flat_layout().size();
      const std::size_t element = zt::dtype_size(engine.compute_dtype());
      const std::size_t padding = 16 * tensors + 16 * static_cast<std::size_t>(world);  // elements, at most
      auto expect_close = [&](const char* what, std::uint64_t bytes, std::uint64_t formula,
                              std::size_t per_element) {
        EXPECT_GE(bytes, formula) << what << " stage " << stage << precision;
        EXPECT_LE(bytes, formula + padding * per_element) << what << " stage " << stage << precision;
        EXPECT_LE(static_cast<double>(bytes), 1.05 * static_cast<double>(formula))
            << what;  // the issue's 5 %
      };
      expect_close("parameters", measured(zt::MemoryCategory::parameters), predicted.parameters, element);
      expect_close("gradients", measured(zt::MemoryCategory::gradients), predicted.gradients, element);
      expect_close("optimizer_states", measured(zt::MemoryCategory::optimizer_states),
                   predicted.optimizer_states,
                   static_cast<std::size_t>(predicted.optimizer_bytes_per_parameter));

      // After a step: the same model states (nothing gathered or unreduced is left behind) and
      // communication staging within the estimate's bucket buffers.
      auto data = zt::make_training_data(engine.config(), engine, std::nullopt);
      for (std::int64_t micro = 0; micro < engine.batch().gradient_accumulation_steps; ++micro) {
        engine.forward(data->load(static_cast<std::uint64_t>(micro)));
        engine.backward();
        engine.step();
      }
      const auto trained = zt::memory_snapshot(zt::DeviceType::host);
      for (zt::MemoryCategory category : {zt::MemoryCategory::parameters, zt::MemoryCategory::gradients,
                                          zt::MemoryCategory::optimizer_states}) {
        EXPECT_EQ(trained[category].current - before[category].current, measured(category))
            << zt::memory_category_name(category) << " stage " << stage << precision;
      }
      EXPECT_LE(trained[zt::MemoryCategory::comm_buffers].current -
                    before[zt::MemoryCategory::comm_buffers].current,
                predicted.bucket_buffers + 3 * padding * element)
          << "stage " << stage << precision;
    }
  }
}

TEST(Engine, Bf16TracksFp32) {
  const int world = zt::testing::runtime().world_size();
  const RunResult fp32 = run(parse(gpt_config(kGlobalBatch / world / 2, 2)), 6, nullptr);
  const RunResult bf16 =
      run(parse(gpt_config(kGlobalBatch / world / 2, 2, R"(, "bf16": {"enabled": true})")), 6, nullptr);
  // bf16 keeps 8 mantissa bits (relative rounding 2^-9 ~ 2e-3 per operation); over a 2-layer model
  // the loss moves by a few times that. 3 % is loose enough for accumulation, tight enough to catch a
  // wrong scale or a missing master copy (which would diverge by far more).
  for (std::size_t i = 0; i < fp32.losses.size(); ++i) {
    EXPECT_NEAR(bf16.losses[i], fp32.losses[i], 0.03 * fp32.losses[i]) << "step " << i + 1;
  }
  EXPECT_EQ(bf16.skipped, 0);
}

TEST(Engine, Fp16WithDynamicLossScaleTrains) {
  const int world = zt::testing::runtime().world_size();
  const RunResult fp16 = run(
      parse(gpt_config(kGlobalBatch / world / 2, 2,
                       R"(, "fp16": {"enabled": true, "initial_scale_power": 12, "loss_scale_window": 4})")),
      8, nullptr);
  for (double loss : fp16.losses) EXPECT_TRUE(std::isfinite(loss));
  EXPECT_LT(fp16.losses.back(), fp16.losses.front());
}

/// An inf or nan in one rank's gradient skips the step on every rank, at every stage (the overflow
/// flag travels with the reduced gradient at stage 0 and is summed over shards at stages 1-3).
TEST(Engine, OverflowOnOneRankSkipsTheStepEverywhere) {
  zt::Runtime& runtime = zt::testing::runtime();
  const int world = runtime.world_size();
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const zt::Config config = parse(gpt_config(
        kGlobalBatch / world / 2, 2,
        R"(, "fp16": {"enabled": true, "initial_scale_power": 10, "loss_scale_window": 1000, "hysteresis": 1},
            "zero_optimization": {"stage": )" +
            std::to_string(stage) + "}"));
    auto model = zt::build_model(config);
    // Rank 0 writes +inf, -inf or nan into one gradient element right after that module's backward;
    // the hook goes in before the engine's own, so the engine sees the bad value. The bias: at
    // stages 2-3 the Linear's weight gradient is streamed into the reduce buckets (no full `grad`),
    // its bias gradient is a full-shape tensor there too.
    int injections_left = 0;
    float injected = 0;
    zt::nn::Module* fc = model->find_module("h.0.mlp.fc");
    ASSERT_NE(fc, nullptr);
    fc->add_backward_post_hook([&](zt::nn::Module& module, const zt::Tensor&) {
      if (injections_left == 0 || runtime.world_rank() != 0) return;
      zt::nn::Parameter* parameter = module.find_parameter("h.0.mlp.fc.bias");
      ASSERT_NE(parameter, nullptr);
      static_cast<zt::fp16*>(parameter->grad.raw_data())[7] = zt::fp16(injected);
      --injections_left;
    });
    zt::Engine engine(runtime, *model, config);
    auto data = zt::make_training_data(engine.config(), engine, std::nullopt);
    auto train_step = [&] {
      for (std::int64_t micro = 0; micro < engine.batch().gradient_accumulation_steps; ++micro) {
        engine.forward(data->load(static_cast<std::uint64_t>(micro)));
        engine.backward();
        engine.step();
      }
      data->advance();
    };
    train_step();
    EXPECT_FALSE(engine.last_step().skipped);
    EXPECT_EQ(engine.loss_scale(), 1024.0);
    for (float value : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                        std::numeric_limits<float>::quiet_NaN()}) {
      const std::vector<float> before = zt::engine_detail::inspect(engine).master_parameters();
      const double scale_before = engine.loss_scale();
      injected = value;
      injections_left = 1;
      train_step();
      EXPECT_TRUE(engine.last_step().skipped) << value;
      EXPECT_EQ(engine.loss_scale(), scale_before / 2) << value;  // hysteresis 1: halve at once
      EXPECT_EQ(zt::engine_detail::inspect(engine).master_parameters(), before)
          << "a skipped step must not move the parameters";
    }
    EXPECT_EQ(engine.skipped_steps(), 3);
    EXPECT_EQ(engine.global_steps(), 4);
    train_step();
    EXPECT_FALSE(engine.last_step().skipped);
    EXPECT_EQ(engine.loss_scale(), 128.0);
  }
}

TEST(Engine, CommunicationDataTypeBf16StaysClose) {
  const int world = zt::testing::runtime().world_size();
  const RunResult fp32 = run(parse(gpt_config(kGlobalBatch / world / 2, 2)), 4, nullptr);
  const RunResult bf16_wire = run(
      parse(gpt_config(kGlobalBatch / world / 2, 2, R"(, "communication_data_type": "bf16")")), 4, nullptr);
  for (std::size_t i = 0; i < fp32.losses.size(); ++i) {
    EXPECT_NEAR(bf16_wire.losses[i], fp32.losses[i], 0.02 * fp32.losses[i]);
  }
}

TEST(Engine, MisuseIsAClearError) {
  zt::Runtime& runtime = zt::testing::runtime();
  const zt::Config config = parse(gpt_config(2, 1));
  auto model = zt::build_model(config);
  zt::Engine engine(runtime, *model, config);
  auto data = zt::make_training_data(engine.config(), engine, std::nullopt);
  const zt::Batch batch = data->load(0);
  EXPECT_THROW(engine.backward(), zt::Error);
  engine.forward(batch);
  try {
    engine.forward(batch);
    FAIL() << "second forward without backward accepted";
  } catch (const zt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("without backward()"), std::string::npos) << e.what();
  }
  engine.backward();
  engine.step();

  // A model built in fp32 handed to a bf16 config names the parameter.
  auto bf16 = parse(gpt_config(2, 1, R"(, "bf16": {"enabled": true})"));
  auto fp32_model = zt::build_model(config);
  try {
    zt::Engine mismatched(runtime, *fp32_model, bf16);
    FAIL() << "dtype mismatch accepted";
  } catch (const zt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("parameter 'wte.weight' is fp32"), std::string::npos) << e.what();
  }
}

TEST(Trainer, WritesMetricsAndLearns) {
  zt::Runtime& runtime = zt::testing::runtime();
  const int world = runtime.world_size();
  const auto path = std::filesystem::temp_directory_path() / "zt_engine_test_metrics.jsonl";
  zt::TrainOptions options;
  options.steps = 30;
  options.metrics_path = path.string();
  options.print_every = 0;
  const zt::TrainSummary summary =
      zt::train(runtime, parse(gpt_config(kGlobalBatch / world / 2, 2)), options);
  EXPECT_EQ(summary.steps, 30);
  EXPECT_LT(summary.last_loss, summary.first_loss - 0.5);
  if (runtime.world_rank() != 0) return;
  std::ifstream in(path);
  std::string line;
  std::vector<nlohmann::json> events;
  while (std::getline(in, line)) events.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(events.size(), 32u);  // start, 30 steps, end
  const auto& start = events.front();
  EXPECT_EQ(start["event"], "start");
  EXPECT_EQ(start["world_size"], world);
  EXPECT_EQ(start["zero_stage"], 0);
  EXPECT_EQ(start["dtype"], "fp32");
  EXPECT_EQ(start["model"]["type"], "gpt");
  EXPECT_EQ(start["params_total"], zt::nn::gpt_parameter_count({2, 2, 32, 16, 256, true, 0.0}));
  // 6 per parameter, 12 x n_layer x seq_len x d_model for the attention; the peak from the probe.
  EXPECT_EQ(start["flops_per_token"].get<double>(),
            6.0 * start["params_total"].get<double>() + 12.0 * 2 * 16 * 32);
  EXPECT_EQ(start["peak_flops_source"], "matmul probe");
  EXPECT_GT(start["peak_flops"].get<double>(), 0.0);
  for (int i = 1; i <= 30; ++i) {
    const auto& step = events[static_cast<std::size_t>(i)];
    EXPECT_EQ(step["event"], "step");
    EXPECT_EQ(step["step"], i);
    EXPECT_EQ(step["samples"], i * kGlobalBatch);
    EXPECT_EQ(step["tokens"], i * kGlobalBatch * 16);
    for (const char* key : {"loss", "lr", "loss_scale", "grad_norm", "step_time_s", "tokens_per_s", "mfu"}) {
      EXPECT_TRUE(step[key].is_number()) << key;
    }
    // MFU: the step's model FLOPs per second over the job's peak (docs/metrics.md, "MFU").
    EXPECT_DOUBLE_EQ(step["mfu"].get<double>(), step["tokens_per_s"].get<double>() *
                                                    start["flops_per_token"].get<double>() /
                                                    start["peak_flops"].get<double>());
    EXPECT_EQ(step["skipped"], false);
    const auto& mem = step["mem"];
    // fp32 AdamW: parameters 4 bytes, gradients 4 bytes, moments 8 bytes per (padded) element.
    EXPECT_GT(mem["parameters"].get<std::int64_t>(), 4 * start["params_total"].get<std::int64_t>() - 1);
    EXPECT_EQ(mem["gradients"], mem["parameters"]);
    EXPECT_EQ(mem["optimizer_states"].get<std::int64_t>(), 2 * mem["parameters"].get<std::int64_t>());
    EXPECT_GT(mem["activations"].get<std::int64_t>(), 0);
    EXPECT_GE(mem["peak"].get<std::int64_t>(), mem["parameters"].get<std::int64_t>() * 4);
    // Stage 0 all-reduces the gradients (Ψ fp32 values) once per step: 2 (N-1)/N of them on the wire.
    const auto psi = start["params_total"].get<std::uint64_t>();
    EXPECT_EQ(step["comm_bytes"].get<std::uint64_t>(),
              world == 1 ? 0u : 2 * psi * 4 * static_cast<std::uint64_t>(world - 1) / world);
  }
  EXPECT_EQ(events.back()["event"], "end");
  std::filesystem::remove(path);
}

}  // namespace
