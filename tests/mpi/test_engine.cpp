// The engine across data-parallel ranks (stage 0) against a single-process baseline run in the same
// job, plus accumulation invariance, mixed precision, the training driver's metrics and errors.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "mpi_test_main.hpp"
#include "zerotrain/engine.hpp"
#include "zerotrain/estimate.hpp"
#include "zerotrain/mpi_communicator.hpp"
#include "zerotrain/trainer.hpp"

namespace {

constexpr const char* kAdamW = R"("gradient_clipping": 1.0,
    "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.01}},)";
// SGD without clipping is linear in the gradient: a wrong gradient scale (sum instead of mean
// across ranks, a missing 1/accumulation) changes the run, where Adam's normalization would hide it.
constexpr const char* kSgd = R"("gradient_clipping": 0.0,
    "optimizer": {"type": "SGD", "params": {"lr": 0.5, "momentum": 0.9}},)";

std::string gpt_config(int micro, int gas, const std::string& extra = "", const char* optimizer = kAdamW) {
  return R"({
    "train_batch_size": )" +
         std::to_string(0) + R"(,
    "train_micro_batch_size_per_gpu": )" +
         std::to_string(micro) + R"(,
    "gradient_accumulation_steps": )" +
         std::to_string(gas) + R"(,
    )" + std::string(optimizer) +
         R"(
    "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 4, "warmup_type": "linear"}},
    "model": {"type": "gpt", "n_layer": 2, "n_head": 2, "d_model": 32, "seq_len": 16, "vocab_size": 256},
    "data": {"format": "builtin", "seed": 5},
    "seed": 11)" +
         extra + "}";
}

zt::Config parse(std::string text) {
  // train_batch_size 0 above is a placeholder: drop it so micro x gas x dp defines the batch.
  const std::string placeholder = "\"train_batch_size\": 0,";
  if (auto at = text.find(placeholder); at != std::string::npos) text.erase(at, placeholder.size());
  return zt::Config::from_string(text, zt::ConfigParseOptions{.warning_sink = {}});
}

struct RunResult {
  std::vector<double> losses;
  std::vector<float> master;
  std::int64_t skipped = 0;
};

/// Train `steps` optimizer steps with the engine on `data_parallel` (nullptr: the world).
RunResult run(const zt::Config& config, int steps, zt::Communicator* data_parallel) {
  zt::Runtime& runtime = zt::testing::runtime();
  auto model = zt::build_model(config);
  zt::Engine engine(runtime, *model, config, zt::EngineOptions{.data_parallel = data_parallel});
  auto data = zt::make_training_data(engine.config(), engine, std::nullopt);
  RunResult result;
  for (int step = 0; step < steps; ++step) {
    for (std::int64_t micro = 0; micro < engine.batch().gradient_accumulation_steps; ++micro) {
      engine.forward(data->load(static_cast<std::uint64_t>(micro)));
      engine.backward();
      EXPECT_EQ(engine.step(), micro + 1 == engine.batch().gradient_accumulation_steps);
    }
    data->advance();
    result.losses.push_back(engine.last_step().loss);
  }
  // Real parameters only: the flat buffer's tail padding depends on the rank count.
  result.master = engine.gather_master_parameters();
  result.master.resize(
      static_cast<std::size_t>(engine.flat_layout().back().offset + engine.flat_layout().back().numel));
  result.skipped = engine.skipped_steps();
  return result;
}

double max_abs_difference(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    worst = std::max(worst, double(std::fabs(a[i] - b[i])));
  return worst;
}

std::unique_ptr<zt::Communicator> self_communicator() {
  return zt::make_mpi_communicator(MPI_COMM_SELF, "self");
}

constexpr int kSteps = 10;
constexpr int kGlobalBatch = 8;

/// (optimizer, ZeRO stage): stage 1 partitions the optimizer states, so the same run must come out.
class EngineOptimizers : public ::testing::TestWithParam<std::tuple<const char*, int>> {
 protected:
  static std::string config(int micro, int gas, const std::string& extra = "") {
    const auto [optimizer, stage] = GetParam();
    return gpt_config(
        micro, gas, R"(, "zero_optimization": {"stage": )" + std::to_string(stage) + "}" + extra, optimizer);
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
  if (world == 1) {
    // One rank does exactly the baseline's arithmetic.
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
                         ::testing::Combine(::testing::Values(kAdamW, kSgd), ::testing::Values(0, 1)),
                         [](const auto& param_info) {
                           return std::string(std::get<0>(param_info.param) == kAdamW ? "AdamW" : "Sgd") +
                                  "_stage" + std::to_string(std::get<1>(param_info.param));
                         });

/// ZeRO-1 memory and traffic per rank: parameters and gradients whole, optimizer states (fp32
/// master + Adam moments) for 1/N of the flat buffer; reduce-scatter + all-gather = 2 (N-1)/N.
TEST(Engine, Zero1PartitionsOptimizerStates) {
  zt::Runtime& runtime = zt::testing::runtime();
  const int world = runtime.world_size();
  for (const char* precision : {"", R"(, "bf16": {"enabled": true})"}) {
    const zt::Config config = parse(gpt_config(
        kGlobalBatch / world / 2, 2, R"(, "zero_optimization": {"stage": 1})" + std::string(precision)));
    const bool bf16 = config.bf16.enabled;
    const std::size_t element = bf16 ? 2 : 4;
    const auto before = zt::memory_snapshot(zt::DeviceType::host);
    auto model = zt::build_model(config);
    zt::Engine engine(runtime, *model, config);
    const auto after = zt::memory_snapshot(zt::DeviceType::host);
    auto grown = [&](zt::MemoryCategory category) {
      return after[category].current - before[category].current;
    };
    const auto flat = static_cast<std::size_t>(engine.flat_size());
    const auto shard = static_cast<std::size_t>(engine.shard_size());
    EXPECT_EQ(flat % static_cast<std::size_t>(world * 16), 0u);
    EXPECT_EQ(shard * static_cast<std::size_t>(world), flat);
    EXPECT_EQ(engine.shard_offset(), static_cast<std::int64_t>(shard) * runtime.world_rank());
    EXPECT_EQ(grown(zt::MemoryCategory::parameters), flat * element);
    EXPECT_EQ(grown(zt::MemoryCategory::gradients), flat * element);
    // Adam moments (8 bytes) plus, in bf16, the fp32 master (4 bytes) -- for the shard only.
    EXPECT_EQ(grown(zt::MemoryCategory::optimizer_states), shard * (bf16 ? 12 : 8));
    auto data = zt::make_training_data(engine.config(), engine, std::nullopt);
    for (std::int64_t micro = 0; micro < engine.batch().gradient_accumulation_steps; ++micro) {
      engine.forward(data->load(static_cast<std::uint64_t>(micro)));
      engine.backward();
      engine.step();
    }
    const std::uint64_t n = static_cast<std::uint64_t>(world);
    // reduce_scatter + all_gather, each (N-1)/N of the flat buffer, plus the 2-element fp64 all-reduce of
    // the partial norm and overflow flag (2 (N-1)/N of 16 bytes).
    const std::uint64_t expected = world == 1 ? 0 : 2 * (flat * element) * (n - 1) / n + 2 * 16 * (n - 1) / n;
    EXPECT_EQ(engine.last_step().comm_bytes, expected);
    // After the all-gather every rank holds the same parameters, bit for bit.
    std::uint64_t hash = 1469598103934665603ULL;  // FNV-1a over every parameter's bytes
    for (const zt::nn::Parameter* parameter : model->parameters()) {
      const auto* bytes = static_cast<const unsigned char*>(parameter->value.raw_data());
      for (std::size_t i = 0; i < parameter->value.nbytes(); ++i) hash = (hash ^ bytes[i]) * 1099511628211ULL;
    }
    std::vector<std::int64_t> hashes(static_cast<std::size_t>(world));
    const auto mine = static_cast<std::int64_t>(hash);
    runtime.world().all_gather(&mine, hashes.data(), 1, zt::DType::int64);
    for (std::int64_t other : hashes) EXPECT_EQ(other, mine);
  }
}

/// Measured model-state bytes per rank against `zerotrain estimate` (the ZeRO formulas): equal up
/// to the engine's padding (each parameter to 16 elements, the flat buffer to 16 N).
TEST(Engine, MemoryMatchesTheZeroFormulas) {
  zt::Runtime& runtime = zt::testing::runtime();
  const int world = runtime.world_size();
  for (int stage : {0, 1}) {
    for (const char* precision : {"", R"(, "bf16": {"enabled": true})", R"(, "fp16": {"enabled": true})"}) {
      const zt::Config config =
          parse(gpt_config(kGlobalBatch / world / 2, 2,
                           R"(, "zero_optimization": {"stage": )" + std::to_string(stage) + "}" + precision));
      const zt::MemoryEstimate predicted = zt::estimate_model_state_memory(config, world);
      const auto before = zt::memory_snapshot(zt::DeviceType::host);
      auto model = zt::build_model(config);
      zt::Engine engine(runtime, *model, config);
      const auto after = zt::memory_snapshot(zt::DeviceType::host);
      auto measured = [&](zt::MemoryCategory c) { return after[c].current - before[c].current; };
      ASSERT_EQ(predicted.parameters_count, engine.parameter_count());
      const std::size_t tensors = engine.flat_layout().size();
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

TEST(Engine, OverflowOnOneRankSkipsTheStepEverywhere) {
  zt::Runtime& runtime = zt::testing::runtime();
  const int world = runtime.world_size();
  const zt::Config config = parse(gpt_config(
      kGlobalBatch / world / 2, 2,
      R"(, "fp16": {"enabled": true, "initial_scale_power": 10, "loss_scale_window": 1000, "hysteresis": 1})"));
  auto model = zt::build_model(config);
  zt::Engine engine(runtime, *model, config);
  auto data = zt::make_training_data(engine.config(), engine, std::nullopt);
  // Rank 0 writes +inf, -inf or nan into one gradient element after the backward of step 2, 3, 4.
  int injections_left = 0;
  float injected = 0;
  model->add_backward_post_hook([&](zt::nn::Module& module, const zt::Tensor&) {
    if (injections_left == 0 || runtime.world_rank() != 0) return;
    zt::nn::Parameter* parameter = module.find_parameter("h.0.mlp.fc.weight");
    ASSERT_NE(parameter, nullptr);
    static_cast<zt::fp16*>(parameter->grad.raw_data())[7] = zt::fp16(injected);
    --injections_left;
  });
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
    const std::vector<float> before(engine.master_parameters().begin(), engine.master_parameters().end());
    const double scale_before = engine.loss_scale();
    injected = value;
    injections_left = 1;
    train_step();
    EXPECT_TRUE(engine.last_step().skipped) << value;
    EXPECT_EQ(engine.loss_scale(), scale_before / 2) << value;  // hysteresis 1: halve at once
    const std::vector<float> after(engine.master_parameters().begin(), engine.master_parameters().end());
    EXPECT_EQ(after, before) << "a skipped step must not move the parameters";
  }
  EXPECT_EQ(engine.skipped_steps(), 3);
  EXPECT_EQ(engine.global_steps(), 4);
  train_step();
  EXPECT_FALSE(engine.last_step().skipped);
  EXPECT_EQ(engine.loss_scale(), 128.0);
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

  auto staged = parse(gpt_config(2, 1, R"(, "zero_optimization": {"stage": 2})"));
  auto model2 = zt::build_model(staged);
  try {
    zt::Engine rejected(runtime, *model2, staged);
    FAIL() << "stage 2 accepted";
  } catch (const zt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("zero_optimization.stage is 2"), std::string::npos) << e.what();
  }
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
  for (int i = 1; i <= 30; ++i) {
    const auto& step = events[static_cast<std::size_t>(i)];
    EXPECT_EQ(step["event"], "step");
    EXPECT_EQ(step["step"], i);
    EXPECT_EQ(step["samples"], i * kGlobalBatch);
    EXPECT_EQ(step["tokens"], i * kGlobalBatch * 16);
    for (const char* key : {"loss", "lr", "loss_scale", "grad_norm", "step_time_s", "tokens_per_s"}) {
      EXPECT_TRUE(step[key].is_number()) << key;
    }
    EXPECT_EQ(step["skipped"], false);
    const auto& mem = step["mem"];
    // fp32 AdamW: parameters 4 bytes, gradients 4 bytes, moments 8 bytes per (padded) element.
    EXPECT_GT(mem["parameters"].get<std::int64_t>(), 4 * start["params_total"].get<std::int64_t>() - 1);
    EXPECT_EQ(mem["gradients"], mem["parameters"]);
    EXPECT_EQ(mem["optimizer_states"].get<std::int64_t>(), 2 * mem["parameters"].get<std::int64_t>());
    EXPECT_GT(mem["activations"].get<std::int64_t>(), 0);
    EXPECT_GE(mem["peak"].get<std::int64_t>(), mem["parameters"].get<std::int64_t>() * 4);
    // Stage 0 all-reduces the gradients once per step: 2 (N-1)/N of their bytes on the wire.
    const auto grad_bytes = mem["gradients"].get<std::uint64_t>();
    EXPECT_EQ(step["comm_bytes"].get<std::uint64_t>(),
              world == 1 ? 0u : 2 * (grad_bytes / 4) * 4 * static_cast<std::uint64_t>(world - 1) / world);
  }
  EXPECT_EQ(events.back()["event"], "end");
  std::filesystem::remove(path);
}

}  // namespace
