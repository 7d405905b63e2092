// The engine's micro-batch API: several forwards in flight, each keeping its activations in its own
// slot, give the same training as forward/backward pairs; losses are helpers and a caller's own loss
// (a weighted mean squared error written here) trains through the public API, at every ZeRO stage
// and rank count; train_batch runs the step's loop; misuse is a clear error.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "engine_runs.hpp"
#include "mpi_test_main.hpp"
#include "test_helpers.hpp"
#include "zerotrain/engine.hpp"
#include "zerotrain/loss.hpp"
#include "zerotrain/trainer.hpp"

namespace {

using namespace zt::testing::engine_runs;

constexpr int kSteps = 4;
constexpr int kGlobalBatch = 8;
// Dropout on: every forward draws its own mask, which its backward must find again.
constexpr const char* kGptWithDropout =
    R"({"type": "gpt", "n_layer": 2, "n_head": 2, "d_model": 32, "seq_len": 16, "vocab_size": 256,
        "dropout": 0.1})";

std::string with_stage(int stage) {
  return R"(, "zero_optimization": {"stage": )" + std::to_string(stage) + "}";
}

struct SlotRun {
  std::vector<double> losses;
  std::vector<float> master;
};

/// `steps` optimizer steps of gas micro-batches; with `all_forwards_first`, every forward of a step
/// runs before the first backward (F F .. B B .., as a pipeline stage would order them).
SlotRun train(const zt::Config& config, bool all_forwards_first) {
  auto model = zt::build_model(config);
  zt::Engine engine(zt::testing::runtime(), *model, config);
  auto data = zt::make_training_data(engine.config(), engine, std::nullopt);
  const std::int64_t gas = engine.batch().gradient_accumulation_steps;
  SlotRun run;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<zt::Batch> batches;
    for (std::int64_t micro = 0; micro < gas; ++micro)
      batches.push_back(data->load(static_cast<std::uint64_t>(micro)));
    if (all_forwards_first) {
      std::vector<zt::Tensor> outputs;
      for (const zt::Batch& batch : batches) outputs.push_back(engine.forward(batch.inputs));
      for (std::int64_t micro = 0; micro < gas; ++micro) {
        engine.backward(zt::cross_entropy_loss(outputs[static_cast<std::size_t>(micro)],
                                               batches[static_cast<std::size_t>(micro)].targets,
                                               engine.execution()));
      }
      for (std::int64_t micro = 0; micro < gas; ++micro) engine.step();
    } else {
      for (const zt::Batch& batch : batches) {
        const zt::Tensor output = engine.forward(batch.inputs);
        engine.backward(zt::cross_entropy_loss(output, batch.targets, engine.execution()));
        engine.step();
      }
    }
    data->advance();
    run.losses.push_back(engine.last_step().loss);
  }
  run.master = real_master_parameters(engine);
  return run;
}

TEST(MicroBatches, ForwardsInFlightTrainAsForwardBackwardPairs) {
  const int world = zt::testing::runtime().world_size();
  for (int stage : {0, 1, 2}) {
    for (const char* precision : {"", R"(, "bf16": {"enabled": true})"}) {
      SCOPED_TRACE("stage " + std::to_string(stage) + precision);
      const zt::Config config = parse(gpt_config(2 * kGlobalBatch / world / 4, 4,
                                                 with_stage(stage) + precision, kAdamW, kGptWithDropout));
      const SlotRun pairs = train(config, false);
      const SlotRun in_flight = train(config, true);
      EXPECT_EQ(in_flight.losses, pairs.losses);
      EXPECT_EQ(in_flight.master, pairs.master);
      EXPECT_LT(pairs.losses.back(), pairs.losses.front());
    }
  }
}

/// The built-in loss helpers through forward(inputs)/backward(loss) are the same run as the
/// forward(batch)/backward() convenience and as train_batch.
TEST(MicroBatches, TheThreeWaysToRunAStepAgree) {
  const int world = zt::testing::runtime().world_size();
  for (int stage : {0, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const zt::Config config = parse(gpt_config(kGlobalBatch / world / 2, 2, with_stage(stage)));
    const SlotRun helpers = train(config, false);
    const RunResult convenience = run(config, kSteps, nullptr);
    auto model = zt::build_model(config);
    zt::Engine engine(zt::testing::runtime(), *model, config);
    auto data = zt::make_training_data(engine.config(), engine, std::nullopt);
    std::vector<double> losses;
    for (int step = 0; step < kSteps; ++step) {
      const zt::StepReport& report = engine.train_batch(
          [&](std::int64_t micro) { return data->load(static_cast<std::uint64_t>(micro)); });
      data->advance();
      losses.push_back(report.loss);
      EXPECT_EQ(report.step, step + 1);
    }
    EXPECT_EQ(helpers.losses, convenience.losses);
    EXPECT_EQ(helpers.master, convenience.master);
    EXPECT_EQ(losses, convenience.losses);
    EXPECT_EQ(real_master_parameters(engine), convenience.master);
  }
}

/// A loss the caller writes: mean over elements of w_j (prediction - target)^2 with a weight per
/// output column, on the host tensors of the engine's output (this build's engine is on the host).
struct WeightedMse {
  std::vector<double> weights;  // one per output column

  double value(const zt::Tensor& prediction, const zt::Tensor& target) const {
    const float* p = prediction.data<float>();
    const float* t = target.data<float>();
    const std::int64_t columns = prediction.size(-1);
    double sum = 0;
    for (std::int64_t i = 0; i < prediction.numel(); ++i) {
      const double d = double(p[i]) - double(t[i]);
      sum += weights[static_cast<std::size_t>(i % columns)] * d * d;
    }
    return sum / static_cast<double>(prediction.numel());
  }
  /// d(scale * loss)/d(prediction).
  zt::Tensor gradient(const zt::Tensor& prediction, const zt::Tensor& target, double scale) const {
    zt::Tensor grad = zt::Tensor::empty(prediction.shape(), zt::DType::fp32);
    const float* p = prediction.data<float>();
    const float* t = target.data<float>();
    float* g = grad.data<float>();
    const std::int64_t columns = prediction.size(-1);
    for (std::int64_t i = 0; i < prediction.numel(); ++i) {
      g[i] = static_cast<float>(scale * 2.0 * weights[static_cast<std::size_t>(i % columns)] *
                                (double(p[i]) - double(t[i])) / static_cast<double>(prediction.numel()));
    }
    return grad;
  }
};

zt::Config mlp_config(int stage) {
  const int world = zt::testing::runtime().world_size();
  return parse(R"({"train_micro_batch_size_per_gpu": )" + std::to_string(16 / world / 2) +
               R"(, "gradient_accumulation_steps": 2, "gradient_clipping": 0.0,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
    "zero_optimization": {"stage": )" +
               std::to_string(stage) + R"(, "stage3_param_persistence_threshold": 0},
    "model": {"type": "mlp", "sizes": [12, 24, 3], "activation": "gelu"},
    "data": {"format": "synthetic", "seed": 3}, "seed": 5})");
}

/// The caller's loss, both ways: as a zt::Loss (its value a device scalar, its gradient a function of
/// the scale) and as backward(grad_output, value). Returns the losses per step.
std::vector<double> train_with_weighted_mse(int stage, const WeightedMse& loss_function, bool as_loss) {
  const zt::Config config = mlp_config(stage);
  auto model = zt::build_model(config);
  zt::Engine engine(zt::testing::runtime(), *model, config);
  auto data = zt::make_training_data(engine.config(), engine, std::nullopt);
  std::vector<double> losses;
  for (int step = 0; step < 6; ++step) {
    for (std::int64_t micro = 0; micro < engine.batch().gradient_accumulation_steps; ++micro) {
      const zt::Batch batch = data->load(static_cast<std::uint64_t>(micro));
      const zt::Tensor prediction = engine.forward(batch.inputs);
      if (as_loss) {
        zt::Loss loss;
        loss.output = prediction;
        loss.value =
            zt::Tensor::from_vector(std::vector<double>{loss_function.value(prediction, batch.targets)}, {});
        loss.gradient = [&, prediction, targets = batch.targets](double scale) {
          return loss_function.gradient(prediction, targets, scale);
        };
        engine.backward(loss);
      } else {
        engine.backward(loss_function.gradient(prediction, batch.targets, 1.0),
                        loss_function.value(prediction, batch.targets));
      }
      engine.step();
    }
    data->advance();
    losses.push_back(engine.last_step().loss);
  }
  return losses;
}

TEST(MicroBatches, ACallersOwnLossTrainsAtStage3) {
  for (int stage : {3, 0}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    // Uniform weights: the built-in mean squared error, to float rounding of the gradient.
    const WeightedMse uniform{{1.0, 1.0, 1.0}};
    const std::vector<double> custom = train_with_weighted_mse(stage, uniform, true);
    const std::vector<double> custom_gradient = train_with_weighted_mse(stage, uniform, false);
    const zt::Config config = mlp_config(stage);
    const RunResult builtin = run(config, 6, nullptr);
    ASSERT_EQ(custom.size(), builtin.losses.size());
    for (std::size_t i = 0; i < custom.size(); ++i) {
      EXPECT_NEAR(custom[i], builtin.losses[i], 1e-5 * builtin.losses[i]) << "step " << i + 1;
      EXPECT_NEAR(custom_gradient[i], builtin.losses[i], 1e-5 * builtin.losses[i]) << "step " << i + 1;
    }
    // Uneven weights train another model: the weighted loss falls, and differs from the plain one.
    const WeightedMse uneven{{4.0, 0.25, 1.0}};
    const std::vector<double> weighted = train_with_weighted_mse(stage, uneven, true);
    EXPECT_LT(weighted.back(), 0.8 * weighted.front());
    EXPECT_GT(std::fabs(weighted.front() - custom.front()), 1e-3 * custom.front());
  }
}

TEST(MicroBatches, MisuseIsAClearError) {
  zt::Runtime& runtime = zt::testing::runtime();
  const int world = runtime.world_size();
  for (int stage : {1, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const zt::Config config = parse(gpt_config(kGlobalBatch / world / 2, 2, with_stage(stage)));
    auto model = zt::build_model(config);
    zt::Engine engine(runtime, *model, config);
    auto data = zt::make_training_data(engine.config(), engine, std::nullopt);
    const zt::Batch first = data->load(0);
    const zt::Batch second = data->load(1);
    const zt::Tensor out0 = engine.forward(first.inputs);
    if (stage == 3) {
      const std::string message = zt::testing::error_of([&] { engine.forward(second.inputs); });
      EXPECT_NE(message.find("ZeRO stage 3 takes 1 at a time"), std::string::npos) << message;
      engine.backward(zt::cross_entropy_loss(out0, first.targets, engine.execution()));
      engine.step();
      continue;
    }
    const zt::Tensor out1 = engine.forward(second.inputs);
    // The step has 2 micro-batches: a third forward is refused.
    std::string message = zt::testing::error_of([&] { engine.forward(second.inputs); });
    EXPECT_NE(message.find("gradient_accumulation_steps = 2 micro-batches and all of them are in flight"),
              std::string::npos)
        << message;
    // Backward takes the oldest forward: a loss of the second output is refused.
    message = zt::testing::error_of(
        [&] { engine.backward(zt::cross_entropy_loss(out1, second.targets, engine.execution())); });
    EXPECT_NE(message.find("not computed from the output of the oldest forward"), std::string::npos)
        << message;
    // A grad_output of the wrong shape.
    message = zt::testing::error_of([&] { engine.backward(zt::Tensor::zeros({3}, zt::DType::fp32)); });
    EXPECT_NE(message.find("must have the dtype and shape of the oldest forward's output"), std::string::npos)
        << message;
    engine.backward(zt::cross_entropy_loss(out0, first.targets, engine.execution()));
    EXPECT_FALSE(engine.step());
    // The boundary step needs every backward of the step.
    message = zt::testing::error_of([&] { engine.step(); });
    EXPECT_NE(message.find("at the accumulation boundary after 1 backward pass(es) of 2"), std::string::npos)
        << message;
    engine.backward(zt::cross_entropy_loss(out1, second.targets, engine.execution()));
    EXPECT_TRUE(engine.step());
    message = zt::testing::error_of([&] { engine.backward(zt::Tensor::zeros({3}, zt::DType::fp32)); });
    EXPECT_NE(message.find("called without a forward() before it"), std::string::npos) << message;
  }
}

}  // namespace
