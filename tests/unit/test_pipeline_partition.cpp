// zt::nn::partition_layers: uniform, balanced by parameters or by matching layer types, against
// hand-computed splits and a brute force over every partition.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "zerotrain/error.hpp"
#include "zerotrain/pipeline.hpp"

namespace {

using Boundaries = std::vector<std::int64_t>;
using zt::nn::LayerSpec;
using zt::nn::partition_layers;

LayerSpec layer(std::string key, std::string type, std::int64_t parameter_count) {
  LayerSpec spec;
  spec.key = std::move(key);
  spec.type = std::move(type);
  spec.parameter_count = parameter_count;
  return spec;
}

std::vector<LayerSpec> layers_weighing(const std::vector<std::int64_t>& weights) {
  std::vector<LayerSpec> layers;
  for (std::size_t i = 0; i < weights.size(); ++i)
    layers.push_back(layer(std::to_string(i), "Linear", weights[i]));
  return layers;
}

std::int64_t largest_stage(const std::vector<std::int64_t>& weights, const Boundaries& boundaries) {
  std::int64_t largest = 0;
  for (std::size_t s = 0; s + 1 < boundaries.size(); ++s) {
    std::int64_t stage = 0;
    for (std::int64_t i = boundaries[s]; i < boundaries[s + 1]; ++i) stage += weights[i];
    largest = std::max(largest, stage);
  }
  return largest;
}

// Every partition of the weights into `stages` non-empty consecutive parts: the smallest largest
// stage and, among the partitions reaching it, the lexicographically largest boundaries.
struct BruteForce {
  std::int64_t best = -1;
  Boundaries chosen;
};

BruteForce brute_force(const std::vector<std::int64_t>& weights, int stages) {
  BruteForce result;
  const std::int64_t n = static_cast<std::int64_t>(weights.size());
  Boundaries boundaries{0};
  std::function<void()> extend = [&] {
    const int placed = static_cast<int>(boundaries.size()) - 1;
    if (placed + 1 == stages) {
      boundaries.push_back(n);
      const std::int64_t largest = largest_stage(weights, boundaries);
      if (result.best < 0 || largest < result.best ||
          (largest == result.best && boundaries > result.chosen)) {
        result.best = largest;
        result.chosen = boundaries;
      }
      boundaries.pop_back();
      return;
    }
    // Leave at least one layer for each stage after this one.
    for (std::int64_t end = boundaries.back() + 1; end <= n - (stages - placed - 1); ++end) {
      boundaries.push_back(end);
      extend();
      boundaries.pop_back();
    }
  };
  extend();
  return result;
}

void expect_config_error(const std::function<void()>& action, std::initializer_list<std::string> parts) {
  try {
    action();
  } catch (const zt::ConfigError& error) {
    const std::string message = error.what();
    for (const std::string& part : parts) EXPECT_NE(message.find(part), std::string::npos) << message;
    return;
  }
  ADD_FAILURE() << "no zt::ConfigError thrown";
}

// GPT-2 small's layer sizes: wte 50257 x 768 + wpe 1024 x 768; a block; ln_f + the tied lm_head copy.
constexpr std::int64_t gpt_embeddings = 50257 * 768 + 1024 * 768;  // 39,383,808
constexpr std::int64_t gpt_block = 2 * 768 + (768 * 2304 + 2304) + (768 * 768 + 768) + 2 * 768 +
                                   (768 * 3072 + 3072) + (3072 * 768 + 768);  // 7,087,872
constexpr std::int64_t gpt_head = 2 * 768 + 50257 * 768;                      // 38,598,912

std::vector<LayerSpec> gpt_like_layers() {
  std::vector<LayerSpec> layers{layer("embeddings", "GptEmbeddings", gpt_embeddings)};
  for (int i = 0; i < 12; ++i)
    layers.push_back(layer("h." + std::to_string(i), "TransformerBlock", gpt_block));
  layers.push_back(layer("head", "GptHead", gpt_head));
  return layers;
}

TEST(PartitionLayers, UniformGivesTheFirstStagesTheExtraLayers) {
  const auto layers = layers_weighing(std::vector<std::int64_t>(10, 5));
  EXPECT_EQ(partition_layers(layers, 4, "uniform"), (Boundaries{0, 3, 6, 8, 10}));
  EXPECT_EQ(partition_layers(layers, 1, "uniform"), (Boundaries{0, 10}));
  EXPECT_EQ(partition_layers(layers, 10, "uniform"), (Boundaries{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}));
  EXPECT_EQ(partition_layers(layers, 5, "uniform"), (Boundaries{0, 2, 4, 6, 8, 10}));
  // Uniform ignores the weights.
  EXPECT_EQ(partition_layers(layers_weighing({100, 1, 1, 1}), 2, "uniform"), (Boundaries{0, 2, 4}));
}

TEST(PartitionLayers, GptLikeModelBalancedByParameters) {
  const auto layers = gpt_like_layers();
  // Four stages: the embeddings and the head (about 39M each) stay alone, since either with one
  // block (46.5M, 45.7M) weighs more than six blocks (42.5M), and the blocks split 6 + 6.
  const Boundaries four = partition_layers(layers, 4, "parameters");
  EXPECT_EQ(four, (Boundaries{0, 1, 7, 13, 14}));
  std::vector<std::int64_t> weights;
  for (const LayerSpec& spec : layers) weights.push_back(spec.parameter_count);
  EXPECT_EQ(largest_stage(weights, four), 6 * gpt_block);
  // Two stages: embeddings + 6 blocks (81.9M) against 6 blocks + head (81.1M); 5 / 7 would put
  // 88.2M on the second.
  EXPECT_EQ(partition_layers(layers, 2, "parameters"), (Boundaries{0, 7, 14}));
  // "best" is "parameters" (DeepSpeed's default method).
  EXPECT_EQ(partition_layers(layers, 4, "best"), four);
  EXPECT_EQ(partition_layers(layers, 3, "best"), partition_layers(layers, 3, "parameters"));
  for (int stages = 1; stages <= 6; ++stages) {
    const BruteForce expected = brute_force(weights, stages);
    EXPECT_EQ(partition_layers(layers, stages, "parameters"), expected.chosen) << stages << " stages";
  }
}

TEST(PartitionLayers, TypeRegexBalancesTheMatchingLayers) {
  const auto layers = gpt_like_layers();
  // 3 blocks a stage; the embeddings go with the first blocks and the head with the last.
  EXPECT_EQ(partition_layers(layers, 4, "type:TransformerBlock"), (Boundaries{0, 4, 7, 10, 14}));
  // Case-insensitive, anywhere in the type.
  EXPECT_EQ(partition_layers(layers, 4, "type:transformer"), (Boundaries{0, 4, 7, 10, 14}));
  EXPECT_EQ(partition_layers(layers, 3, "type:block$"), (Boundaries{0, 5, 9, 14}));
  // Only the embeddings and the head match: the head alone, the blocks join the first stage.
  EXPECT_EQ(partition_layers(layers, 2, "type:^gpt"), (Boundaries{0, 13, 14}));
  // Twelve stages: one block each, the embeddings before the first and the head after the last.
  Boundaries twelve{0};
  for (int s = 1; s < 12; ++s) twelve.push_back(s + 1);
  twelve.push_back(14);
  EXPECT_EQ(partition_layers(layers, 12, "type:TransformerBlock"), twelve);
}

TEST(PartitionLayers, BalancedMatchesBruteForceOnRandomCases) {
  std::mt19937 random(12);
  std::uniform_int_distribution<int> layer_count(1, 9);
  std::uniform_int_distribution<std::int64_t> weight(0, 20);
  std::bernoulli_distribution weightless(0.25);
  std::bernoulli_distribution matching(0.5);
  for (int trial = 0; trial < 400; ++trial) {
    const int n = layer_count(random);
    std::vector<std::int64_t> weights(n);
    std::vector<LayerSpec> typed;
    std::vector<std::int64_t> matches(n);
    for (int i = 0; i < n; ++i) {
      weights[i] = weightless(random) ? 0 : weight(random);
      matches[i] = matching(random) ? 1 : 0;
      typed.push_back(layer(std::to_string(i), matches[i] ? "Attention" : "Norm", 1));
    }
    if (std::count(matches.begin(), matches.end(), 1) == 0) {
      matches[0] = 1;
      typed[0].type = "Attention";
    }
    const auto layers = layers_weighing(weights);
    for (int stages = 1; stages <= std::min(n, 5); ++stages) {
      SCOPED_TRACE("trial " + std::to_string(trial) + ", " + std::to_string(n) + " layers, " +
                   std::to_string(stages) + " stages");
      const BruteForce expected = brute_force(weights, stages);
      const Boundaries got = partition_layers(layers, stages, "parameters");
      ASSERT_EQ(got.size(), static_cast<std::size_t>(stages + 1));
      EXPECT_EQ(got.front(), 0);
      EXPECT_EQ(got.back(), n);
      for (int s = 0; s < stages; ++s) EXPECT_LT(got[s], got[s + 1]);
      EXPECT_EQ(largest_stage(weights, got), expected.best);
      EXPECT_EQ(got, expected.chosen);  // the tie rule: earlier stages as full as allowed
      EXPECT_EQ(partition_layers(typed, stages, "type:attention"), brute_force(matches, stages).chosen);
    }
  }
}

TEST(PartitionLayers, Errors) {
  const auto layers = gpt_like_layers();  // 14 layers
  expect_config_error([&] { partition_layers(layers, 15, "parameters"); },
                      {"\"parameters\"", "14 layers", "15 stages"});
  expect_config_error([&] { partition_layers(layers, 15, "uniform"); },
                      {"\"uniform\"", "14 layers", "15 stages"});
  expect_config_error([&] { partition_layers(layers, 0, "uniform"); }, {"0 stages", "at least 1"});
  expect_config_error([&] { partition_layers(layers, 2, "balanced"); },
                      {"unknown method \"balanced\"", "uniform", "parameters", "type:<regex>"});
  expect_config_error([&] { partition_layers(layers, 2, "type:Conv2d"); },
                      {"\"type:Conv2d\"", "\"Conv2d\"", "none of the 14 layers"});
  expect_config_error([&] { partition_layers(layers, 2, "type:(block"); },
                      {"\"type:(block\"", "\"(block\" is not a valid regular expression"});
  expect_config_error([&] { partition_layers({}, 1, "uniform"); }, {"0 layers", "1 stages"});
  auto negative = layers_weighing({3, -1, 2});
  expect_config_error([&] { partition_layers(negative, 2, "parameters"); }, {"layer \"1\"", "-1 parameters"});
}

}  // namespace
