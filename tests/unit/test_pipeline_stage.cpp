// Pipeline stages of the built-in models, chained by hand in one process: the stages' forwards and
// backwards compose to the unsplit model's (the same logits and gradients, bitwise but for a tied
// embedding's two contributions, summed in another order), with the same parameter names and
// values on whichever stage a layer lands, for 1 to 5 stages.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "test_helpers.hpp"
#include "zerotrain/nn.hpp"
#include "zerotrain/pipeline.hpp"

namespace {

namespace nn = zt::nn;
using zt::DType;
using zt::Tensor;
using zt::testing::random_tokens;

std::vector<float> values_of(const Tensor& tensor) {
  const float* data = tensor.data<float>();
  return std::vector<float>(data, data + tensor.numel());
}

struct Pass {
  std::vector<float> output;
  std::map<std::string, std::vector<float>> values;     // by parameter name
  std::map<std::string, std::vector<float>> gradients;  // summed over the stages that hold one
};

/// Forward and backward of `stages` (in order, all in this process) from `input` and `grad_output`.
Pass run_stages(std::vector<std::unique_ptr<nn::Module>>& stages, const Tensor& input,
                const Tensor& grad_output) {
  Pass pass;
  Tensor x = input;
  for (auto& stage : stages) x = stage->run_forward(x);
  pass.output = values_of(x);
  Tensor grad = grad_output;
  for (auto it = stages.rbegin(); it != stages.rend(); ++it) grad = (*it)->run_backward(grad);
  for (auto& stage : stages) {
    for (nn::Parameter* parameter : stage->parameters()) {
      const std::vector<float> gradient = values_of(parameter->grad);
      auto [entry, added] = pass.gradients.try_emplace(parameter->name, gradient);
      if (!added) {
        for (std::size_t i = 0; i < gradient.size(); ++i) entry->second[i] += gradient[i];
      }
      const auto [value, first] = pass.values.try_emplace(parameter->name, values_of(parameter->value));
      if (!first) {
        EXPECT_EQ(value->second, values_of(parameter->value)) << "copies of " << parameter->name;
      }
    }
  }
  return pass;
}

std::vector<std::unique_ptr<nn::Module>> build_stages(const std::vector<nn::LayerSpec>& layers, int stages,
                                                      const char* method) {
  const std::vector<std::int64_t> boundaries = nn::partition_layers(layers, stages, method);
  std::vector<std::unique_ptr<nn::Module>> built;
  for (int stage = 0; stage < stages; ++stage) {
    auto module = std::make_unique<nn::PipelineStage>(layers, boundaries, stage);
    EXPECT_EQ(module->stage(), stage);
    EXPECT_EQ(module->first_layer(), boundaries[static_cast<std::size_t>(stage)]);
    for (nn::Parameter* parameter : module->parameters()) EXPECT_EQ(parameter->pipeline_stage, stage);
    built.push_back(std::move(module));
  }
  return built;
}

void expect_same_pass(const Pass& staged, const Pass& whole, const std::string& tied_name) {
  EXPECT_EQ(staged.output, whole.output);
  ASSERT_EQ(staged.values.size(), whole.values.size());
  for (const auto& [name, values] : whole.values) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(staged.values.count(name));
    EXPECT_EQ(staged.values.at(name), values);
    const std::vector<float>& gradient = staged.gradients.at(name);
    if (name != tied_name) {
      EXPECT_EQ(gradient, whole.gradients.at(name));
      continue;
    }
    // The unsplit model accumulates the head's and the embedding's gradient in one buffer; split,
    // each stage's copy holds one and the sum is taken after: another rounding order.
    for (std::size_t i = 0; i < gradient.size(); ++i)
      EXPECT_NEAR(gradient[i], whole.gradients.at(name)[i], 1e-6f) << "element " << i;
  }
}

TEST(PipelineStage, GptStagesComposeToTheGpt) {
  for (bool tied : {false, true}) {
    const nn::GptConfig config{.n_layer = 3,
                               .n_head = 2,
                               .d_model = 16,
                               .seq_len = 8,
                               .vocab_size = 13,
                               .tie_embeddings = tied,
                               .dropout = 0.2};
    const Tensor tokens = random_tokens({2, 8}, 13, 7);
    const Tensor grad_logits =
        Tensor::from_vector(std::vector<float>(2 * 8 * 13, 0.01f), {2, 8, 13});  // any gradient will do
    std::vector<std::unique_ptr<nn::Module>> whole;
    whole.push_back(std::make_unique<nn::Gpt>(config, DType::fp32, 3));
    const Pass reference = run_stages(whole, tokens, grad_logits);
    const std::vector<nn::LayerSpec> layers = nn::gpt_layers(config, DType::fp32, 3);
    ASSERT_EQ(layers.size(), 5u);  // embeddings, h.0, h.1, h.2, head
    for (int stages = 1; stages <= 5; ++stages) {
      for (const char* method : {"uniform", "parameters", "type:TransformerBlock"}) {
        SCOPED_TRACE(std::string(tied ? "tied, " : "untied, ") + std::to_string(stages) + " stages, " +
                     method);
        if (stages > 3 && std::string(method).starts_with("type:"))
          continue;  // fewer matching layers than stages
        std::vector<std::unique_ptr<nn::Module>> split = build_stages(layers, stages, method);
        expect_same_pass(run_stages(split, tokens, grad_logits), reference, tied ? "wte.weight" : "");
      }
    }
  }
}

TEST(PipelineStage, MlpStagesComposeToTheMlp) {
  const nn::MlpConfig config{.sizes = {6, 10, 8, 3}, .activation = nn::ActivationKind::tanh};
  std::vector<float> input_values(4 * 6);
  for (std::size_t i = 0; i < input_values.size(); ++i)
    input_values[i] = 0.1f * static_cast<float>(i % 7) - 0.3f;
  const Tensor input = Tensor::from_vector(input_values, {4, 6});
  const Tensor grad = Tensor::from_vector(std::vector<float>(4 * 3, 0.5f), {4, 3});
  std::vector<std::unique_ptr<nn::Module>> whole;
  whole.push_back(std::make_unique<nn::Mlp>(config, DType::fp32, 9));
  const Pass reference = run_stages(whole, input, grad);
  const std::vector<nn::LayerSpec> layers = nn::mlp_layers(config, DType::fp32, 9);
  ASSERT_EQ(layers.size(), 5u);  // Linear, activation, Linear, activation, Linear
  for (int stages = 1; stages <= 5; ++stages) {
    SCOPED_TRACE(std::to_string(stages) + " stages");
    std::vector<std::unique_ptr<nn::Module>> split = build_stages(layers, stages, "uniform");
    expect_same_pass(run_stages(split, input, grad), reference, "");
  }
}

TEST(PipelineStage, TiedCopyOnlyWhereTheEmbeddingIsElsewhere) {
  const nn::GptConfig config{.n_layer = 2, .n_head = 2, .d_model = 16, .seq_len = 8, .vocab_size = 13};
  const std::vector<nn::LayerSpec> layers = nn::gpt_layers(config);
  nn::PipelineStage together(layers, {0, 4}, 0);
  EXPECT_EQ(together.parameter_count(), nn::gpt_parameter_count(config));
  nn::PipelineStage last(layers, {0, 2, 4}, 1);
  ASSERT_NE(last.find_parameter("wte.weight"), nullptr);  // the head's copy of the tied embedding
  EXPECT_EQ(last.find_parameter("wpe.weight"), nullptr);
  EXPECT_TRUE(last.is_last());
  EXPECT_EQ(last.layers().size(), 2u);
}

TEST(PipelineStage, BadBoundariesAreAClearError) {
  const std::vector<nn::LayerSpec> layers =
      nn::gpt_layers({.n_layer = 2, .n_head = 2, .d_model = 16, .seq_len = 8, .vocab_size = 13});
  EXPECT_NE(zt::testing::error_of([&] {
              nn::PipelineStage stage(layers, {0, 2, 2, 4}, 0);
            }).find("every stage needs at least one layer"),
            std::string::npos);
  EXPECT_NE(zt::testing::error_of([&] {
              nn::PipelineStage stage(layers, {0, 3}, 0);
            }).find("expected 0 to the number of layers, 4"),
            std::string::npos);
  EXPECT_NE(zt::testing::error_of([&] {
              nn::PipelineStage stage(layers, {0, 2, 4}, 2);
            }).find("stage 2 of 2"),
            std::string::npos);
}

}  // namespace
