// Every layer's backward against central finite differences in fp64.
//
// For a module f and a fixed random projection R, the scalar L(x, params) = sum(f(x) * R) has
// dL/dx = backward(R) and dL/dparam = the accumulated parameter gradients. Each analytic gradient
// is compared with (L(v + h) - L(v - h)) / 2h, h = 1e-5, on every element (or a fixed sample of 48
// elements for larger tensors). Criterion: max |analytic - numeric| / max |numeric| <= 1e-8 per
// tensor (the largest error seen over all checks is ~1e-9: the finite-difference error).
#include <gtest/gtest.h>

#include "test_helpers.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "zerotrain/nn.hpp"
#include "zerotrain/tensor.hpp"

namespace {

using zt::testing::random_tokens;

using zt::DType;
using zt::Tensor;
namespace nn = zt::nn;

/// The finite-difference forwards: no backward follows them, so they save nothing.
const nn::RunContext kNoBackward{.save_for_backward = false};

constexpr double kStep = 1e-5;
constexpr double kTolerance = 1e-8;
constexpr std::int64_t kMaxCheckedElements = 48;

Tensor random_tensor(const zt::Shape& shape, std::uint64_t seed, double stddev = 1.0, double mean = 0.0) {
  Tensor tensor = Tensor::empty(shape, DType::fp64);
  std::mt19937_64 engine(seed);
  std::normal_distribution<double> normal(mean, stddev);
  double* data = tensor.data<double>();
  for (std::int64_t i = 0; i < tensor.numel(); ++i) data[i] = normal(engine);
  return tensor;
}

double dot(const Tensor& a, const Tensor& b) {
  double sum = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) sum += a.data<double>()[i] * b.data<double>()[i];
  return sum;
}

/// Indices to check: all of them for small tensors, else a fixed sample.
std::vector<std::int64_t> checked_indices(std::int64_t numel, std::uint64_t seed) {
  std::vector<std::int64_t> indices;
  if (numel <= kMaxCheckedElements) {
    for (std::int64_t i = 0; i < numel; ++i) indices.push_back(i);
    return indices;
  }
  std::mt19937_64 engine(seed);
  std::uniform_int_distribution<std::int64_t> pick(0, numel - 1);
  for (std::int64_t i = 0; i < kMaxCheckedElements; ++i) indices.push_back(pick(engine));
  return indices;
}

/// Compare `analytic` with central differences of `loss` in the elements of `variable` (perturbed in place).
void expect_gradient_matches(const std::string& what, Tensor variable, const Tensor& analytic,
                             const std::function<double()>& loss) {
  ASSERT_TRUE(analytic.defined()) << what << ": no analytic gradient";
  ASSERT_EQ(analytic.numel(), variable.numel()) << what;
  double* values = variable.data<double>();
  double max_error = 0, max_numeric = 0;
  std::int64_t worst = -1;
  for (std::int64_t i : checked_indices(variable.numel(), 1234)) {
    const double saved = values[i];
    values[i] = saved + kStep;
    const double plus = loss();
    values[i] = saved - kStep;
    const double minus = loss();
    values[i] = saved;
    const double numeric = (plus - minus) / (2 * kStep);
    const double error = std::abs(numeric - analytic.data<double>()[i]);
    max_numeric = std::max(max_numeric, std::abs(numeric));
    if (error > max_error) {
      max_error = error;
      worst = i;
    }
  }
  ASSERT_GT(max_numeric, 1e-8) << what << ": gradient is zero everywhere checked; the check would be vacuous";
  const double relative = max_error / max_numeric;
  EXPECT_LE(relative, kTolerance) << what << ": relative error " << relative << " at element " << worst
                                  << " (analytic " << analytic.data<double>()[worst] << ")";
}

/// Give every parameter random values (LayerNorm weights around 1) so no gradient is trivially zero.
void randomize_parameters(nn::Module& module, std::uint64_t seed, double stddev = 0.5) {
  for (nn::Parameter* parameter : module.parameters()) {
    const bool norm_weight = parameter->name.find("ln") != std::string::npos && parameter->name.size() > 7 &&
                             parameter->name.compare(parameter->name.size() - 7, 7, ".weight") == 0;
    const Tensor values = random_tensor(parameter->value.shape(), seed++, stddev, norm_weight ? 1.0 : 0.0);
    parameter->value.copy_from(values);
  }
}

/// Check the input gradient (when the input is floating) and every parameter gradient of `module`.
/// `before_forward` runs before each forward (to pin a dropout mask).
void gradcheck_module(
    nn::Module& module, Tensor input, std::uint64_t seed,
    const std::function<void()>& before_forward = [] {}) {
  before_forward();
  const Tensor first_output = module.run_forward(input, kNoBackward);
  const Tensor projection = random_tensor(first_output.shape(), seed + 99);
  const auto loss = [&] {
    before_forward();
    return dot(module.run_forward(input, kNoBackward), projection);
  };
  module.zero_grad();
  before_forward();
  module.run_forward(input);  // the forward whose activations the backward takes
  const Tensor grad_input = module.run_backward(projection);
  std::vector<Tensor> parameter_grads;
  for (nn::Parameter* parameter : module.parameters()) parameter_grads.push_back(parameter->grad.clone());

  if (input.dtype() == DType::fp64) {
    expect_gradient_matches(module.type_name() + " input", input, grad_input, loss);
  }
  std::size_t index = 0;
  for (nn::Parameter* parameter : module.parameters()) {
    expect_gradient_matches(module.type_name() + " parameter " + parameter->name, parameter->value,
                            parameter_grads[index++], loss);
  }
}

TEST(GradCheck, Linear) {
  for (bool bias : {true, false}) {
    nn::Linear linear(5, 3, bias, DType::fp64);
    randomize_parameters(linear, 1);
    gradcheck_module(linear, random_tensor({2, 4, 5}, 2), 3);
  }
}

TEST(GradCheck, Embedding) {
  nn::Embedding embedding(7, 4, DType::fp64);
  randomize_parameters(embedding, 4);
  // Repeated tokens: their gradient rows must accumulate.
  Tensor tokens = Tensor::from_vector<std::int32_t>({1, 3, 3, 0, 6, 1}, {2, 3});
  gradcheck_module(embedding, tokens, 5);
}

TEST(GradCheck, PositionalEmbedding) {
  nn::PositionalEmbedding positions(6, 4, DType::fp64);
  randomize_parameters(positions, 6);
  gradcheck_module(positions, random_tensor({3, 5, 4}, 7), 8);
}

TEST(GradCheck, LayerNorm) {
  nn::LayerNorm norm(6, DType::fp64);
  randomize_parameters(norm, 9);
  gradcheck_module(norm, random_tensor({2, 3, 6}, 10, 2.0, 0.5), 11);
}

TEST(GradCheck, Activations) {
  for (auto kind : {nn::ActivationKind::gelu, nn::ActivationKind::tanh, nn::ActivationKind::relu}) {
    nn::Activation activation(kind);
    // relu's kink at 0 is never hit by random normals (within h).
    gradcheck_module(activation, random_tensor({3, 7}, 12, 2.0), 13);
  }
}

TEST(GradCheck, DropoutWithFixedMask) {
  nn::Dropout dropout(0.4, 77);
  Tensor input = random_tensor({4, 16}, 14);
  gradcheck_module(dropout, input, 15, [&] { dropout.set_next_stream(3); });
  // The mask really drops something, and eval mode is the identity.
  dropout.set_next_stream(3);
  const Tensor output = dropout.run_forward(input);
  int dropped = 0;
  for (std::int64_t i = 0; i < output.numel(); ++i) dropped += output.data<double>()[i] == 0.0;
  EXPECT_GT(dropped, 10);
  EXPECT_LT(dropped, 45);
  dropout.eval();
  EXPECT_EQ(dropout.run_forward(input).raw_data(), input.raw_data());
}

TEST(GradCheck, CausalSelfAttention) {
  nn::CausalSelfAttention attention(8, 2, DType::fp64);
  randomize_parameters(attention, 16);
  gradcheck_module(attention, random_tensor({2, 5, 8}, 17), 18);
}

// Longer than the host kernel's 64-row query blocks: the recomputed probabilities of every block, and
// dK/dV accumulated across blocks.
TEST(GradCheck, CausalSelfAttentionAcrossQueryBlocks) {
  nn::CausalSelfAttention attention(4, 2, DType::fp64);
  randomize_parameters(attention, 23);
  gradcheck_module(attention, random_tensor({1, 70, 4}, 24), 25);
}

TEST(GradCheck, MLPBlock) {
  nn::MLPBlock mlp(4, DType::fp64);
  randomize_parameters(mlp, 19);
  gradcheck_module(mlp, random_tensor({2, 3, 4}, 20), 21);
}

TEST(GradCheck, TransformerBlock) {
  nn::TransformerBlock block(8, 2, DType::fp64);
  randomize_parameters(block, 22, 0.4);
  gradcheck_module(block, random_tensor({2, 4, 8}, 23), 24);
}

TEST(GradCheck, TransformerBlockWithDropout) {
  nn::TransformerBlock block(8, 2, DType::fp64, 0.3, 5);
  randomize_parameters(block, 25, 0.4);
  const auto pin_masks = [&] {
    for (nn::Module* module : block.modules()) {
      if (auto* dropout = dynamic_cast<nn::Dropout*>(module)) dropout->set_next_stream(1);
    }
  };
  gradcheck_module(block, random_tensor({2, 4, 8}, 26), 27, pin_masks);
}

TEST(GradCheck, ActivationCheckpointWithDropout) {
  // Its backward recomputes the layers' forward (same masks) before their backward.
  nn::ActivationCheckpoint checkpoint;
  checkpoint.append(std::make_unique<nn::TransformerBlock>(8, 2, DType::fp64, 0.3, 5), "0");
  checkpoint.append(std::make_unique<nn::LayerNorm>(8, DType::fp64), "norm");
  randomize_parameters(checkpoint, 38, 0.4);
  const auto pin_masks = [&] {
    for (nn::Module* module : checkpoint.modules()) {
      if (auto* dropout = dynamic_cast<nn::Dropout*>(module)) dropout->set_next_stream(2);
    }
  };
  gradcheck_module(checkpoint, random_tensor({2, 4, 8}, 39), 40, pin_masks);
}

TEST(GradCheck, MlpModel) {
  nn::Mlp mlp({.sizes = {5, 7, 6, 3}, .activation = nn::ActivationKind::tanh}, DType::fp64, 28);
  gradcheck_module(mlp, random_tensor({4, 5}, 29), 30);
}

/// GPT end to end: L = cross-entropy(gpt(tokens), targets), gradients of every parameter.
void gradcheck_gpt(bool tie_embeddings, double dropout) {
  const nn::GptConfig config{.n_layer = 2,
                             .n_head = 2,
                             .d_model = 8,
                             .seq_len = 6,
                             .vocab_size = 11,
                             .tie_embeddings = tie_embeddings,
                             .dropout = dropout};
  nn::Gpt gpt(config, DType::fp64, 31);
  randomize_parameters(gpt, 32, 0.3);
  const Tensor tokens = random_tokens({2, 5}, 11, 33);  // T = 5 < seq_len: positions beyond T get no gradient
  Tensor targets = random_tokens({2, 5}, 11, 34);
  targets.data<std::int32_t>()[3] = -100;  // one ignored position
  nn::SoftmaxCrossEntropy criterion;
  const auto pin_masks = [&] {
    for (nn::Module* module : gpt.modules()) {
      if (auto* layer = dynamic_cast<nn::Dropout*>(module)) layer->set_next_stream(0);
    }
  };
  const auto forward = [&](const nn::RunContext& context) {
    pin_masks();
    return criterion.forward(gpt.run_forward(tokens, context), targets);
  };
  const auto loss = [&] { return forward(kNoBackward); };
  gpt.zero_grad();
  forward({});
  EXPECT_EQ(criterion.counted_rows(), 9);
  const Tensor grad_tokens = gpt.run_backward(criterion.backward());
  EXPECT_FALSE(grad_tokens.defined());  // integer input: no gradient
  for (nn::Parameter* parameter : gpt.parameters()) {
    const Tensor analytic = parameter->grad.clone();
    if (parameter->name == "wpe.weight") {
      // Only the first T = 5 positions are used; row 5 must have stayed exactly zero.
      for (std::int64_t i = 5 * config.d_model; i < 6 * config.d_model; ++i) {
        ASSERT_EQ(analytic.data<double>()[i], 0.0);
      }
      expect_gradient_matches("GPT wpe.weight (used rows)",
                              parameter->value.flat_slice(0, 5 * config.d_model),
                              analytic.flat_slice(0, 5 * config.d_model), loss);
      continue;
    }
    expect_gradient_matches(std::string("GPT ") + (tie_embeddings ? "tied " : "untied ") + parameter->name,
                            parameter->value, analytic, loss);
  }
}

TEST(GradCheck, GptTiedEmbeddings) {
  gradcheck_gpt(true, 0.0);
}
TEST(GradCheck, GptUntiedEmbeddings) {
  gradcheck_gpt(false, 0.0);
}
TEST(GradCheck, GptWithDropout) {
  gradcheck_gpt(true, 0.2);
}

TEST(GradCheck, SoftmaxCrossEntropy) {
  Tensor logits = random_tensor({2, 3, 5}, 35, 2.0);
  Tensor targets = Tensor::from_vector<std::int32_t>({0, 4, -1, 2, 2, 1}, {2, 3});
  nn::SoftmaxCrossEntropy criterion(-1);
  const double scale = 2.5;
  const auto loss = [&] { return scale * criterion.forward(logits, targets); };
  loss();
  EXPECT_EQ(criterion.counted_rows(), 5);
  const Tensor grad = criterion.backward(scale);
  for (std::int64_t v = 0; v < 5; ++v) EXPECT_EQ(grad.data<double>()[2 * 5 + v], 0.0);  // ignored row
  expect_gradient_matches("SoftmaxCrossEntropy logits", logits, grad, loss);
  // Stable for large logits: no overflow, and the loss of a confident right answer is ~0.
  Tensor large = Tensor::from_vector<double>({1000.0, 0.0, -1000.0}, {1, 3});
  Tensor right = Tensor::from_vector<std::int32_t>({0}, {1});
  EXPECT_NEAR(nn::SoftmaxCrossEntropy().forward(large, right), 0.0, 1e-12);
}

TEST(GradCheck, MseLoss) {
  Tensor prediction = random_tensor({3, 4}, 36);
  const Tensor target = random_tensor({3, 4}, 37);
  nn::MseLoss criterion;
  const double scale = 0.75;
  const auto loss = [&] { return scale * criterion.forward(prediction, target); };
  loss();
  const Tensor grad = criterion.backward(scale);
  expect_gradient_matches("MseLoss prediction", prediction, grad, loss);
}

}  // namespace
