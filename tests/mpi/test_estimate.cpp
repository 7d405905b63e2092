// `zerotrain estimate` is the engine's allocation: the model-state bytes it predicts for a config
// equal, byte for byte, what an engine on that config holds in memory (parameters, gradients,
// optimizer states) after construction, after steps, and as the metrics report them, at ZeRO
// stages 0-3, in fp32 and bf16, with and without optimizer and parameter offload, at every rank
// count. Both come from one partition plan (src/engine/partition_plan.hpp); the plan of a config's
// model, computed without building it, matches the built model parameter by parameter.
#include <gtest/gtest.h>

#include <array>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine_runs.hpp"
#include "job_directory.hpp"
#include "mpi_test_main.hpp"
#include "offload_configs.hpp"
#include "src/engine/partition_plan.hpp"
#include "test_helpers.hpp"
#include "zerotrain/engine.hpp"
#include "zerotrain/estimate.hpp"
#include "zerotrain/trainer.hpp"

namespace {

using namespace zt::testing::engine_runs;

constexpr const char* kPrecisions[] = {"", R"(, "bf16": {"enabled": true})"};

struct Case {
  int stage;
  std::string offload;  // offload sections inside zero_optimization, or empty
  std::string label;
};

/// Every stage in memory; optimizer offload to the host and to NVMe at stages 1-3; parameters on
/// NVMe at stage 3, all of them or within max_in_cpu, with the optimizer in memory or on NVMe.
std::vector<Case> cases(const std::string& swap) {
  std::vector<Case> all;
  for (int stage : {0, 1, 2, 3}) all.push_back({stage, "", "in memory"});
  for (int stage : {1, 2, 3}) {
    all.push_back({stage, offload_section("cpu", ""), "offload_optimizer cpu"});
    all.push_back({stage, offload_section("nvme", swap, 2), "offload_optimizer nvme"});
  }
  const std::string nvme_param =
      R"("offload_param": {"device": "nvme", "nvme_path": ")" + swap + R"(", "buffer_count": 3)";
  all.push_back({3, nvme_param + R"(, "max_in_cpu": 0})", "offload_param nvme"});
  all.push_back({3, nvme_param + R"(, "max_in_cpu": 3000})", "offload_param nvme, max_in_cpu 3000"});
  all.push_back({3, nvme_param + R"(, "max_in_cpu": 0}, )" + offload_section("nvme", swap, 2),
                 "offload_param and offload_optimizer nvme"});
  return all;
}

/// A config with persistent stage-3 parameters (the default threshold keeps the small ones whole):
/// the plan counts them too.
zt::Config config_of(const Case& c, const char* precision) {
  std::string zero = R"(, "zero_optimization": {"stage": )" + std::to_string(c.stage) +
                     R"(, "stage3_param_persistence_threshold": 100, "sub_group_size": )" +
                     std::to_string(kOffloadSubGroup);
  if (!c.offload.empty()) zero += ", " + c.offload;
  zero += "}";
  const int world = zt::testing::runtime().world_size();
  return parse(gpt_config(kOffloadGlobalBatch / world / 2, 2, zero + precision));
}

TEST(Estimate, IsTheEnginesModelStateAllocation) {
  zt::testing::JobDirectory directory("zt-estimate-test", "ZT_TEST_SWAP_DIR");
  zt::Runtime& runtime = zt::testing::runtime();
  const int world = runtime.world_size();
  for (const Case& c : cases(directory.path())) {
    for (const char* precision : kPrecisions) {
      SCOPED_TRACE("stage " + std::to_string(c.stage) + ", " + c.label + (*precision ? ", bf16" : ", fp32"));
      const zt::Config config = config_of(c, precision);
      const zt::MemoryEstimate estimate = zt::estimate_model_state_memory(config, world);
      const zt::MemorySnapshot before = zt::memory_snapshot(zt::DeviceType::host);
      auto model = zt::build_model(config);
      zt::Engine engine(runtime, *model, config);
      auto held = [&](zt::MemoryCategory category) {
        return zt::memory_snapshot(zt::DeviceType::host)[category].current - before[category].current;
      };
      auto expect_the_estimate = [&](const char* when) {
        EXPECT_EQ(held(zt::MemoryCategory::parameters), estimate.parameters_host) << when;
        EXPECT_EQ(held(zt::MemoryCategory::gradients), estimate.gradients) << when;
        EXPECT_EQ(held(zt::MemoryCategory::optimizer_states), estimate.optimizer_states_host) << when;
        EXPECT_EQ(held(zt::MemoryCategory::parameters) + held(zt::MemoryCategory::gradients) +
                      held(zt::MemoryCategory::optimizer_states),
                  estimate.resident())
            << when;
      };
      expect_the_estimate("after construction");
      auto data = zt::make_training_data(engine.config(), engine, std::nullopt);
      train_steps(engine, *data, 2);
      expect_the_estimate("after 2 steps");
      // What lives in swap files: the placements the engine reports.
      if (estimate.param_offload_device == zt::OffloadDevice::nvme) {
        const zt::ParametersPlacement placement = engine.parameters_placement();
        EXPECT_EQ(placement.nvme_elements * zt::dtype_size(engine.compute_dtype()), estimate.parameters_nvme);
        EXPECT_GT(estimate.parameters_nvme, 0u);
      }
      if (estimate.offload_device == zt::OffloadDevice::nvme) {
        EXPECT_GE(engine.optimizer_states_placement().swap_bytes, estimate.nvme_bytes);
        EXPECT_GT(estimate.nvme_bytes, 0u);
      }
    }
  }
}

/// Train 3 steps through zt::train with metrics to `path`; on rank 0 every step's mem.resident must
/// be `expected` (parameters, gradients, optimizer states).
void train_and_expect_resident(const zt::Config& config, const std::filesystem::path& path,
                               const std::array<std::uint64_t, 3>& expected) {
  zt::TrainOptions options;
  options.steps = 3;
  options.metrics_path = path.string();
  options.print_every = 0;
  zt::train(zt::testing::runtime(), config, options);
  if (zt::testing::runtime().world_rank() != 0) return;
  std::ifstream in(path);
  std::string line;
  int steps = 0;
  while (std::getline(in, line)) {
    const nlohmann::json event = nlohmann::json::parse(line);
    if (event["event"] != "step") continue;
    ++steps;
    const nlohmann::json& resident = event["mem"]["resident"];
    EXPECT_EQ(resident["parameters"].get<std::uint64_t>(), expected[0]);
    EXPECT_EQ(resident["gradients"].get<std::uint64_t>(), expected[1]);
    EXPECT_EQ(resident["optimizer_states"].get<std::uint64_t>(), expected[2]);
  }
  EXPECT_EQ(steps, 3);
}

/// The metrics of `zerotrain train` report the same resident bytes at every step.
TEST(Estimate, IsWhatTheMetricsReport) {
  zt::Runtime& runtime = zt::testing::runtime();
  const int world = runtime.world_size();
  const auto path = std::filesystem::temp_directory_path() / "zt_estimate_test_metrics.jsonl";
  for (int stage : {0, 2, 3}) {
    for (const char* precision : kPrecisions) {
      SCOPED_TRACE("stage " + std::to_string(stage) + (*precision ? ", bf16" : ", fp32"));
      const zt::Config config = config_of({stage, "", ""}, precision);
      const zt::MemoryEstimate estimate = zt::estimate_model_state_memory(config, world);
      train_and_expect_resident(
          config, path, {estimate.parameters_host, estimate.gradients, estimate.optimizer_states_host});
    }
  }
  if (runtime.world_rank() == 0) std::filesystem::remove(path);
}

/// The plan of a config's model, made without building it, is the built model's: same names,
/// shapes and order (GPT tied and untied, MLP).
TEST(Estimate, PlansTheModelTheConfigBuilds) {
  const char* models[] = {
      kGptModel,
      R"({"type": "gpt", "n_layer": 3, "n_head": 2, "d_model": 16, "seq_len": 8, "vocab_size": 50,
          "tie_embeddings": false})",
      R"({"type": "mlp", "sizes": [7, 12, 5, 3], "activation": "gelu"})",
  };
  for (const char* model_section : models) {
    SCOPED_TRACE(model_section);
    const zt::Config config = parse(gpt_config(2, 1, "", kAdamW, model_section));
    const std::vector<zt::engine_detail::PlannedParameter> planned =
        zt::engine_detail::planned_parameters_of_config(config);
    auto model = zt::build_model(config);
    const std::vector<zt::nn::Parameter*> built = model->parameters();
    ASSERT_EQ(planned.size(), built.size());
    for (std::size_t i = 0; i < built.size(); ++i) {
      EXPECT_EQ(planned[i].name, built[i]->name) << i;
      EXPECT_EQ(planned[i].shape, built[i]->value.shape()) << built[i]->name;
    }
    EXPECT_EQ(zt::model_parameter_count(config), model->parameter_count());
    // The closed form the host-memory check uses, term by term, sums to the same count.
    double terms = 0.0;
    for (const auto& term : zt::engine_detail::parameter_count_terms_of_config(config)) terms += term.count;
    EXPECT_EQ(terms, static_cast<double>(model->parameter_count()));
  }
}

/// A model that cannot fit in the host's memory is refused before anything is allocated, naming
/// the keys that drive its size and the limit; one that fits passes.
TEST(Estimate, HostMemoryCheckNamesTheKeys) {
  const zt::HostMemory host{.node_bytes = 8ull << 30, .what = "8.0 GiB (a test's limit)"};
  const zt::Config tiny = parse(gpt_config(2, 1, "", kAdamW, kGptModel));
  EXPECT_NO_THROW(zt::check_fits_host_memory(tiny, 2, 2, host));
  const auto refusal = [&](const char* model_section, int ranks_on_node) {
    try {
      zt::check_fits_host_memory(parse(gpt_config(2, 1, "", kAdamW, model_section)), 2, ranks_on_node, host);
    } catch (const zt::ConfigError& error) {
      return std::string(error.what());
    }
    return std::string("no ConfigError");
  };
  const std::string layers = refusal(
      R"({"type": "gpt", "n_layer": 1000000, "n_head": 4, "d_model": 128, "seq_len": 64, "vocab_size": 256})",
      2);
  EXPECT_NE(layers.find("the model cannot fit in this host's memory: each of the 2 rank(s) on this node"),
            std::string::npos)
      << layers;
  EXPECT_NE(layers.find("most from model.n_layer x 12 model.d_model^2"), std::string::npos) << layers;
  EXPECT_NE(layers.find("but the node has 8.0 GiB (a test's limit)"), std::string::npos) << layers;
  const std::string attention = refusal(
      R"({"type": "gpt", "n_layer": 2, "n_head": 4, "d_model": 128, "seq_len": 3000000, "vocab_size": 256})",
      1);
  EXPECT_NE(attention.find("Reduce train_micro_batch_size_per_gpu x model.seq_len x 3 model.d_model"),
            std::string::npos)
      << attention;
  const std::string mlp = refusal(R"({"type": "mlp", "sizes": [100000, 100000, 10]})", 1);
  EXPECT_NE(mlp.find("most from model.sizes"), std::string::npos) << mlp;
  // This machine's limit is a real, positive number of bytes with its origin.
  const zt::HostMemory here = zt::host_memory(2);
  EXPECT_GT(here.node_bytes, 0u);
  EXPECT_NE(here.what.find("GiB"), std::string::npos) << here.what;
}

/// With the engine on a device the host holds the model as built before the engine moves it (or
/// what offload keeps there), not the model states and activations: a model refused on the host
/// passes, a far larger one is still refused, saying why.
TEST(Estimate, HostMemoryCheckWithTheEngineOnADevice) {
  const zt::HostMemory host{.node_bytes = 8ull << 30, .what = "8.0 GiB (a test's limit)"};
  // About 0.5e9 parameters in fp32 with AdamW at stage 0: 16 B each as model states per rank on the
  // host, 4 B each as the model built before it moves to the device; 2 ranks share the 8 GiB.
  const zt::Config mid = parse(gpt_config(
      2, 1, "", kAdamW,
      R"({"type": "gpt", "n_layer": 40, "n_head": 8, "d_model": 1024, "seq_len": 64, "vocab_size": 256})"));
  EXPECT_THROW(zt::check_fits_host_memory(mid, 2, 2, host), zt::ConfigError);
  EXPECT_NO_THROW(zt::check_fits_host_memory(mid, 2, 2, host, zt::DeviceType::cuda));
  const zt::Config huge = parse(gpt_config(
      2, 1, "", kAdamW,
      R"({"type": "gpt", "n_layer": 1000000, "n_head": 4, "d_model": 128, "seq_len": 64, "vocab_size": 256})"));
  std::string message;
  try {
    zt::check_fits_host_memory(huge, 2, 2, host, zt::DeviceType::cuda);
  } catch (const zt::ConfigError& error) {
    message = error.what();
  }
  EXPECT_NE(message.find("the model cannot fit in this host's memory"), std::string::npos) << message;
  EXPECT_NE(message.find("with the engine on a device: the model as built on the host before it moves"),
            std::string::npos)
      << message;
  EXPECT_EQ(message.find("activations"), std::string::npos)
      << "the activations are the device's: " << message;
}

/// On a GPU each rank needs the model states the estimate puts on the device, the buckets and the
/// step's activation peak there: a config beyond the device's memory is refused before anything is
/// allocated, naming the sizes and the keys of the larger part; offload makes it fit.
TEST(Estimate, DeviceMemoryCheckNamesTheSizesAndTheKeys) {
  const zt::DeviceMemory device{.bytes = 8ull << 30, .what = "8.0 GiB is free (a test's limit)"};
  const auto refusal = [&](const zt::Config& config) {
    try {
      zt::check_fits_device_memory(config, 2, device);
    } catch (const zt::ConfigError& error) {
      return std::string(error.what());
    }
    return std::string("no ConfigError");
  };
  EXPECT_NO_THROW(zt::check_fits_device_memory(parse(gpt_config(2, 1, "", kAdamW, kGptModel)), 2, device));
  // States: about 0.5e9 parameters, fp32 AdamW at stage 0 (16 B each on the device).
  const char* mid_model =
      R"({"type": "gpt", "n_layer": 40, "n_head": 8, "d_model": 1024, "seq_len": 64, "vocab_size": 256})";
  const std::string states = refusal(parse(gpt_config(2, 1, "", kAdamW, mid_model)));
  EXPECT_NE(states.find("the model cannot fit in the device's memory: each rank needs at least"),
            std::string::npos)
      << states;
  EXPECT_NE(states.find("but 8.0 GiB is free (a test's limit)"), std::string::npos) << states;
  EXPECT_NE(states.find("at ZeRO stage 0 over 2 data-parallel rank(s)"), std::string::npos) << states;
  EXPECT_NE(states.find("Reduce model.n_layer x 12 model.d_model^2"), std::string::npos) << states;
  EXPECT_NE(states.find("offload (zero_optimization.offload_optimizer"), std::string::npos) << states;
  // The same model with the optimizer states on the host (offload_optimizer cpu): 4 + 4 B on the device.
  EXPECT_NO_THROW(zt::check_fits_device_memory(
      parse(gpt_config(2, 1, R"(, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}})",
                       kAdamW, mid_model)),
      2, device));
  // Activations: a long sequence of a small model, without checkpoints.
  const std::string activations = refusal(parse(gpt_config(
      8, 1, "", kAdamW,
      R"({"type": "gpt", "n_layer": 4, "n_head": 4, "d_model": 256, "seq_len": 65536, "vocab_size": 256})")));
  EXPECT_NE(activations.find("activations "), std::string::npos) << activations;
  EXPECT_NE(activations.find("(the step's peak at train_micro_batch_size_per_gpu 8)"), std::string::npos)
      << activations;
  EXPECT_NE(
      activations.find("Reduce train_micro_batch_size_per_gpu (or model.seq_len), or checkpoint activations"),
      std::string::npos)
      << activations;
  // Pipelined: the largest stage decides, on every rank alike.
  const std::string pipelined = refusal(parse(gpt_config(
      2, 4, R"(, "pipeline": {"stages": 2})", kAdamW,
      R"({"type": "gpt", "n_layer": 120, "n_head": 8, "d_model": 1024, "seq_len": 64, "vocab_size": 256})")));
  EXPECT_NE(pipelined.find("each rank of pipeline stage "), std::string::npos) << pipelined;
  // Stages 2-3: the largest parameter whole during its backward comes on top (its full gradient; at
  // stage 3 its gathered value too, unless persistent). The exact sum fits; a byte less is refused
  // and names it.
  for (const int stage : {2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const zt::Config config =
        parse(gpt_config(2, 1,
                         R"(, "bf16": {"enabled": true}, "zero_optimization": {"stage": )" +
                             std::to_string(stage) + R"(, "stage3_param_persistence_threshold": 0})",
                         kAdamW, mid_model));
    const zt::MemoryEstimate estimate =
        zt::estimate_model_state_memory(config, 2, 0, 0, zt::DeviceType::cuda);
    ASSERT_TRUE(estimate.activations.has_value());
    ASSERT_GT(estimate.largest_parameter, 0);
    const std::uint64_t whole = static_cast<std::uint64_t>(estimate.largest_parameter) * 2;  // bf16
    const std::uint64_t need = estimate.device_bytes_with_cuda + estimate.bucket_buffers +
                               estimate.activations->peak + (stage == 3 ? 2 : 1) * whole;
    EXPECT_NO_THROW(zt::check_fits_device_memory(config, 2, {.bytes = need, .what = "exactly enough"}));
    const std::string transient = [&] {
      try {
        zt::check_fits_device_memory(config, 2, {.bytes = need - 1, .what = "a byte too little"});
      } catch (const zt::ConfigError& error) {
        return std::string(error.what());
      }
      return std::string("no ConfigError");
    }();
    EXPECT_NE(
        transient.find(stage == 3 ? "the largest parameter whole during its backward (its full gradient "
                                    "and its gathered value)"
                                  : "the largest parameter whole during its backward (its full gradient)"),
        std::string::npos)
        << transient;
  }
  // No size known (the host, the emulated device): nothing to check.
  EXPECT_NO_THROW(zt::check_fits_device_memory(parse(gpt_config(2, 1, "", kAdamW, mid_model)), 2, {}));
  EXPECT_EQ(zt::device_memory_info(zt::Device::host()).total, 0u);
  EXPECT_EQ(zt::device_memory_info(zt::Device::emulated()).free, 0u);
}

/// Each pipeline stage's plan, made without building it, is the built stage's: same names, shapes
/// and order, a tied copy of the embedding included (GPT tied and untied, MLP; every partition
/// method, one to four stages).
TEST(Estimate, PlansEachPipelineStageTheConfigBuilds) {
  struct Model {
    const char* section;
    const char* type_partition;  // a "type:" method that matches some of its layers
  };
  const Model models[] = {
      {kGptModel, "type:transformer"},
      {R"({"type": "gpt", "n_layer": 3, "n_head": 2, "d_model": 16, "seq_len": 8, "vocab_size": 50,
          "tie_embeddings": false})",
       "type:transformer"},
      {R"({"type": "mlp", "sizes": [7, 12, 5, 3], "activation": "gelu"})", "type:linear"},
  };
  for (const Model& model : models) {
    for (const std::string& partition :
         {std::string("parameters"), std::string("uniform"), std::string(model.type_partition)}) {
      for (int stages = 1; stages <= 4; ++stages) {
        SCOPED_TRACE(std::string(model.section) + ", partition " + partition + ", " + std::to_string(stages) +
                     " stage(s)");
        const zt::Config config = parse(gpt_config(2, 1,
                                                   R"(, "pipeline": {"stages": )" + std::to_string(stages) +
                                                       R"(, "partition": ")" + partition + "\"}",
                                                   kAdamW, model.section));
        std::int64_t stage_parameters = 0;
        for (int stage = 0; stage < stages; ++stage) {
          const std::vector<zt::engine_detail::PlannedParameter> planned =
              zt::engine_detail::planned_parameters_of_stage(config, stage);
          auto built_stage = zt::build_model(config, stage);
          const std::vector<zt::nn::Parameter*> built = built_stage->parameters();
          ASSERT_EQ(planned.size(), built.size()) << "stage " << stage;
          for (std::size_t i = 0; i < built.size(); ++i) {
            EXPECT_EQ(planned[i].name, built[i]->name) << "stage " << stage << ", " << i;
            EXPECT_EQ(planned[i].shape, built[i]->value.shape()) << built[i]->name;
            EXPECT_EQ(planned[i].pipeline_stage, stage) << built[i]->name;
          }
          stage_parameters += built_stage->parameter_count();
        }
        // The stages hold the model's parameters, and a tied GPT's last stage a copy of the embedding.
        const bool tied_copy = stages > 1 && std::string(model.section) == kGptModel;
        EXPECT_EQ(stage_parameters, zt::model_parameter_count(config) + (tied_copy ? 256 * 32 : 0));
      }
    }
  }
}

/// A pipelined config on this world: `stages` stages of world / stages data-parallel ranks.
zt::Config pipelined_config_of(const Case& c, const char* precision, int stages) {
  std::string zero = R"(, "zero_optimization": {"stage": )" + std::to_string(c.stage) +
                     R"(, "sub_group_size": )" + std::to_string(kOffloadSubGroup);
  if (!c.offload.empty()) zero += ", " + c.offload;
  zero += "}";
  const int data = std::max(1, zt::testing::runtime().world_size() / stages);  // 1: a config for other worlds
  return parse(gpt_config(kOffloadGlobalBatch / data / 4, 4,
                          zero + precision + R"(, "pipeline": {"stages": )" + std::to_string(stages) + "}"));
}

/// With pipeline stages, the estimate of each rank's stage is what its engine holds, after
/// construction and after steps (ZeRO stages 0-2, fp32 and bf16, optimizer offload to the host and
/// to NVMe; two stages, and four at four ranks).
TEST(Estimate, IsEachPipelineStagesModelStateAllocation) {
  zt::testing::JobDirectory directory("zt-estimate-pipeline-test", "ZT_TEST_SWAP_DIR");
  zt::Runtime& runtime = zt::testing::runtime();
  const int world = runtime.world_size();
  if (world == 1) GTEST_SKIP() << "a pipeline needs two ranks or more";
  std::vector<Case> all;
  for (int stage : {0, 1, 2}) all.push_back({stage, "", "in memory"});
  for (int stage : {1, 2}) {
    all.push_back({stage, offload_section("cpu", ""), "offload_optimizer cpu"});
    all.push_back({stage, offload_section("nvme", directory.path(), 2), "offload_optimizer nvme"});
  }
  for (int stages : {2, 4}) {
    if (world % stages != 0) continue;
    for (const Case& c : all) {
      for (const char* precision : kPrecisions) {
        SCOPED_TRACE(std::to_string(stages) + " pipeline stages, ZeRO stage " + std::to_string(c.stage) +
                     ", " + c.label + (*precision ? ", bf16" : ", fp32"));
        const zt::Config config = pipelined_config_of(c, precision, stages);
        const int stage = zt::pipeline_stage_of(runtime, config);
        const zt::MemoryEstimate estimate = zt::estimate_model_state_memory(config, world, 0, stage);
        EXPECT_EQ(estimate.pipeline_stage, stage);
        EXPECT_EQ(estimate.pipeline_stages, stages);
        EXPECT_EQ(estimate.world_size, world / stages);
        const zt::MemorySnapshot before = zt::memory_snapshot(zt::DeviceType::host);
        auto model = zt::build_model(config, stage);
        zt::Engine engine(runtime, *model, config);
        EXPECT_EQ(estimate.parameters_count, engine.parameter_count());
        auto held = [&](zt::MemoryCategory category) {
          return zt::memory_snapshot(zt::DeviceType::host)[category].current - before[category].current;
        };
        auto expect_the_estimate = [&](const char* when) {
          EXPECT_EQ(held(zt::MemoryCategory::parameters), estimate.parameters_host) << when;
          EXPECT_EQ(held(zt::MemoryCategory::gradients), estimate.gradients) << when;
          EXPECT_EQ(held(zt::MemoryCategory::optimizer_states), estimate.optimizer_states_host) << when;
        };
        expect_the_estimate("after construction");
        auto data = zt::make_training_data(engine.config(), engine, std::nullopt);
        for (int step = 0; step < 2; ++step) {
          engine.train_batch(
              [&](std::int64_t micro) { return data->load(static_cast<std::uint64_t>(micro)); });
          data->advance();
        }
        expect_the_estimate("after 2 steps");
        if (estimate.offload_device == zt::OffloadDevice::nvme) {
          EXPECT_GE(engine.optimizer_states_placement().swap_bytes, estimate.nvme_bytes);
          EXPECT_GT(estimate.nvme_bytes, 0u);
        }
      }
    }
  }
}

/// A pipelined `zerotrain train` reports in mem.resident the largest stage's model states (the
/// maximum over ranks) at every step.
TEST(Estimate, IsWhatThePipelinedMetricsReport) {
  zt::Runtime& runtime = zt::testing::runtime();
  const int world = runtime.world_size();
  if (world == 1) GTEST_SKIP() << "a pipeline needs two ranks or more";
  const auto path = std::filesystem::temp_directory_path() / "zt_estimate_test_pipeline_metrics.jsonl";
  const zt::Config config = pipelined_config_of({2, "", ""}, "", 2);
  std::uint64_t largest[3] = {0, 0, 0};
  for (int stage = 0; stage < 2; ++stage) {
    const zt::MemoryEstimate estimate = zt::estimate_model_state_memory(config, world, 0, stage);
    largest[0] = std::max(largest[0], estimate.parameters_host);
    largest[1] = std::max(largest[1], estimate.gradients);
    largest[2] = std::max(largest[2], estimate.optimizer_states_host);
  }
  train_and_expect_resident(config, path, {largest[0], largest[1], largest[2]});
  if (runtime.world_rank() == 0) std::filesystem::remove(path);
}

/// What the estimate cannot split is refused with the reason.
TEST(Estimate, PipelineMisuseIsAClearError) {
  const zt::Config config = pipelined_config_of({2, "", ""}, "", 2);
  auto expect_error = [](const std::string& message, const std::string& part) {
    EXPECT_NE(message.find(part), std::string::npos) << "in: " << message;
  };
  using zt::testing::error_of;
  expect_error(error_of([&] { (void)zt::estimate_model_state_memory(config, 3); }),
               "--world-size 3 with pipeline.stages = 2");
  expect_error(error_of([&] { (void)zt::estimate_model_state_memory(config, 4, 1000); }),
               "--params with pipeline.stages = 2");
  expect_error(error_of([&] { (void)zt::estimate_model_state_memory(config, 4, 0, 2); }),
               "pipeline stage 2 of a config with pipeline.stages = 2");
  expect_error(error_of([&] {
                 (void)zt::estimate_model_state_memory(pipelined_config_of({3, "", ""}, "", 2), 4);
               }),
               "zero_optimization.stage 3 with pipeline.stages = 2");
}

}  // namespace
