// Frozen parameters through the API (docs/adaptation-reference.md): EngineOptions::freeze (a
// predicate) trains bitwise as the config's "freeze" patterns, at ZeRO stages 0-3; frozen tensors
// keep their bits, get no gradient and no reduction traffic; bad patterns are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "engine_runs.hpp"
#include "test_helpers.hpp"

namespace {

using namespace zt;
using namespace zt::testing::engine_runs;

struct FrozenRun {
  std::vector<double> losses;
  std::vector<float> master;
  std::vector<std::uint64_t> comm_bytes;
  std::vector<std::string> frozen;
  bool frozen_unchanged = true;
  bool frozen_without_gradient = true;
  bool wte_changed = false;  // wte.weight's bits after the run differ from before
};

FrozenRun run_frozen(const Config& config, const std::function<bool(const std::string&)>& freeze, int steps) {
  Runtime& runtime = zt::testing::runtime();
  auto model = build_model(config);
  std::vector<std::vector<float>> before;
  for (const nn::Parameter* parameter : model->parameters()) {
    const float* values = parameter->value.data<float>();
    before.emplace_back(values, values + parameter->value.numel());
  }
  Engine engine(runtime, *model, config, EngineOptions{.freeze = freeze});
  auto data = make_training_data(engine.config(), engine, std::nullopt);
  FrozenRun result;
  train_steps(engine, *data, steps, [&] {
    result.losses.push_back(engine.last_step().loss);
    result.comm_bytes.push_back(engine.last_step().comm_bytes);
  });
  result.master = real_master_parameters(engine);
  result.frozen = engine.frozen_parameters();
  const std::vector<nn::Parameter*> parameters = model->parameters();
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    const nn::Parameter& parameter = *parameters[i];
    if (parameter.name == "wte.weight") {
      result.wte_changed =
          std::memcmp(parameter.value.data<float>(), before[i].data(), before[i].size() * sizeof(float)) != 0;
    }
    if (std::find(result.frozen.begin(), result.frozen.end(), parameter.name) == result.frozen.end())
      continue;
    result.frozen_unchanged &=
        std::memcmp(parameter.value.data<float>(), before[i].data(), before[i].size() * sizeof(float)) == 0;
    result.frozen_without_gradient &= !parameter.grad.defined();
  }
  return result;
}

TEST(Freeze, PredicateTrainsAsTheConfigPatternsAtEveryStage) {
  const int ranks = zt::testing::runtime().world_size();
  for (int stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const std::string zero = R"(, "zero_optimization": {"stage": )" + std::to_string(stage) + "}";
    const Config plain = parse(gpt_config(2, 2, zero));
    const Config patterns = parse(gpt_config(2, 2, zero + R"(, "freeze": ["wte.*", "h.0.*"])"));
    // 6 steps: past the config's 4 warmup steps, so that every step moves what trains.
    const FrozenRun by_config = run_frozen(patterns, {}, 6);
    const FrozenRun by_predicate = run_frozen(
        plain, [](const std::string& name) { return name.starts_with("wte.") || name.starts_with("h.0."); },
        6);
    const FrozenRun unfrozen = run_frozen(plain, {}, 6);
    EXPECT_EQ(by_config.frozen.size(), 13u);  // wte.weight and block 0's twelve tensors
    EXPECT_EQ(by_config.frozen, by_predicate.frozen);
    EXPECT_TRUE(unfrozen.frozen.empty());
    EXPECT_EQ(by_config.losses, by_predicate.losses);
    EXPECT_EQ(by_config.master, by_predicate.master);
    EXPECT_TRUE(by_config.frozen_unchanged);
    EXPECT_TRUE(by_predicate.frozen_unchanged);
    EXPECT_TRUE(by_config.frozen_without_gradient);
    EXPECT_LT(by_config.master.size(), unfrozen.master.size());  // no master for frozen tensors
    EXPECT_FALSE(by_config.wte_changed);
    EXPECT_TRUE(unfrozen.wte_changed);
    for (std::size_t step = 0; step < by_config.comm_bytes.size(); ++step) {
      if (ranks == 1) {
        EXPECT_EQ(by_config.comm_bytes[step], 0u);
      } else {
        EXPECT_LT(by_config.comm_bytes[step], unfrozen.comm_bytes[step]) << "step " << step;
      }
    }
  }
}

TEST(Freeze, BadPatternsAreRefused) {
  Runtime& runtime = zt::testing::runtime();
  const Config nothing = parse(gpt_config(2, 2, R"(, "freeze": ["h.9.*"])"));
  auto model = build_model(nothing);
  EXPECT_NE(zt::testing::error_of([&] {
              Engine engine(runtime, *model, nothing);
            }).find("freeze[0] \"h.9.*\" matches no parameter of the model"),
            std::string::npos);
  const Config everything = parse(gpt_config(2, 2, R"(, "freeze": ["*"])"));
  auto all = build_model(everything);
  EXPECT_NE(zt::testing::error_of([&] {
              Engine engine(runtime, *all, everything);
            }).find("parameters is frozen; nothing would train"),
            std::string::npos);
}

}  // namespace
