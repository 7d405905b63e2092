// zt::Config: DeepSpeed defaults, validation errors, unknown-key warnings, the batch rule,
// round trips through to_json_string, and file errors.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "zerotrain/config.hpp"
#include "zerotrain/watchdog.hpp"

namespace {

using zt::Config;
using zt::ConfigError;

/// Parse without printing warnings (they are checked through warnings()).
Config parse(const std::string& text) {
  return Config::from_string(text, zt::ConfigParseOptions{.warning_sink = {}});
}

/// The message of the ConfigError that parsing `text` throws; fails the test if none is thrown.
std::string parse_error(const std::string& text) {
  try {
    parse(text);
  } catch (const ConfigError& error) {
    return error.what();
  }
  ADD_FAILURE() << "no ConfigError for: " << text;
  return {};
}

std::string batch_error(const std::string& text, int data_parallel_size) {
  try {
    Config config = parse(text);
    config.resolve_batch(data_parallel_size);
  } catch (const ConfigError& error) {
    return error.what();
  }
  ADD_FAILURE() << "no ConfigError for: " << text << " at data-parallel size " << data_parallel_size;
  return {};
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

#define EXPECT_CONTAINS(haystack, needle) EXPECT_TRUE(contains(haystack, needle)) << "in: " << (haystack)

/// A temporary directory removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "zt_config_test_XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  std::filesystem::path write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name) << text;
    return path_ / name;
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// ---- defaults ------------------------------------------------------------------------------------

TEST(ConfigDefaults, TopLevelMatchDeepSpeedCode) {
  const Config c = parse("{}");
  EXPECT_FALSE(c.train_batch_size);
  EXPECT_FALSE(c.train_micro_batch_size_per_gpu);
  EXPECT_FALSE(c.gradient_accumulation_steps);
  EXPECT_EQ(c.gradient_clipping, 1.0);  // PR #8068; the docs still say 0
  EXPECT_FALSE(c.steps_per_print);      // the docs say 10
  EXPECT_EQ(c.gradient_allreduce_op, zt::GradientReduceOp::mean);
  EXPECT_FALSE(c.communication_data_type);
  EXPECT_TRUE(c.managed_gradient_accumulation);
  EXPECT_EQ(c.seed, 1234u);
  EXPECT_FALSE(c.optimizer);
  EXPECT_FALSE(c.scheduler);
  EXPECT_FALSE(c.model);
  EXPECT_FALSE(c.data);
  EXPECT_EQ(c.compute_dtype(), zt::DType::fp32);
  EXPECT_TRUE(c.warnings().empty());
  EXPECT_FALSE(c.batch_resolved());
}

TEST(ConfigDefaults, PrecisionSections) {
  const Config c = parse("{}");
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_EQ(c.fp16.loss_scale, 0.0);
  EXPECT_TRUE(c.fp16.dynamic_loss_scale());
  EXPECT_EQ(c.fp16.initial_scale_power, 16);
  EXPECT_EQ(c.fp16.loss_scale_window, 1000);
  EXPECT_EQ(c.fp16.hysteresis, 2);
  EXPECT_FALSE(c.fp16.consecutive_hysteresis);
  EXPECT_EQ(c.fp16.min_loss_scale, 1.0);
  EXPECT_FALSE(c.fp16.fp16_master_weights_and_grads);
  EXPECT_FALSE(c.bf16.enabled);
  EXPECT_TRUE(c.bf16.check_grad_overflow);
  EXPECT_FALSE(c.bf16.bf16_master_weights_and_grads);
  EXPECT_FALSE(c.bf16.bf16_optimizer_states);
}

TEST(ConfigDefaults, ZeroOptimization) {
  const zt::ZeroConfig z = parse("{}").zero_optimization;
  EXPECT_EQ(z.stage, 0);
  EXPECT_FALSE(z.overlap_comm);
  EXPECT_EQ(z.reduce_bucket_size, 500'000'000);
  EXPECT_EQ(z.allgather_bucket_size, 500'000'000);
  EXPECT_EQ(z.sub_group_size, 1'000'000'000);
  EXPECT_EQ(z.stage3_prefetch_bucket_size, 50'000'000);  // code 5e7; the docs say 5e8
  EXPECT_EQ(z.stage3_param_persistence_threshold, 100'000);
  EXPECT_EQ(z.stage3_max_live_parameters, 1'000'000'000);
  EXPECT_EQ(z.stage3_max_reuse_distance, 1'000'000'000);

  EXPECT_EQ(z.offload_optimizer.device, zt::OffloadDevice::none);
  EXPECT_FALSE(z.offload_optimizer.nvme_path);
  EXPECT_TRUE(z.offload_optimizer.pin_memory);  // true since PR #8207
  EXPECT_EQ(z.offload_optimizer.buffer_count, 4);
  EXPECT_EQ(z.offload_optimizer.ratio, 1.0);
  EXPECT_FALSE(z.offload_optimizer.super_offload);

  EXPECT_EQ(z.offload_param.device, zt::OffloadDevice::none);
  EXPECT_FALSE(z.offload_param.nvme_path);
  EXPECT_TRUE(z.offload_param.pin_memory);
  EXPECT_EQ(z.offload_param.buffer_count, 5);
  EXPECT_EQ(z.offload_param.buffer_size, 100'000'000);
  EXPECT_EQ(z.offload_param.max_in_cpu, 1'000'000'000);
}

TEST(ConfigDefaults, OverlapCommIsDerivedFromTheStage) {
  for (int stage = 0; stage <= 3; ++stage) {
    const Config c = parse(R"({"zero_optimization": {"stage": )" + std::to_string(stage) + "}}");
    EXPECT_EQ(c.zero_optimization.overlap_comm, stage == 3) << "stage " << stage;
  }
  EXPECT_FALSE(
      parse(R"({"zero_optimization": {"stage": 3, "overlap_comm": false}})").zero_optimization.overlap_comm);
  EXPECT_TRUE(
      parse(R"({"zero_optimization": {"stage": 1, "overlap_comm": true}})").zero_optimization.overlap_comm);
}

TEST(ConfigDefaults, OtherDeepSpeedSections) {
  const Config c = parse("{}");
  EXPECT_EQ(c.aio.block_size, 1'048'576);
  EXPECT_EQ(c.aio.queue_depth, 8);
  EXPECT_EQ(c.aio.intra_op_parallelism, 1);
  EXPECT_FALSE(c.aio.single_submit);
  EXPECT_TRUE(c.aio.overlap_events);
  EXPECT_FALSE(c.aio.use_gds);

  EXPECT_FALSE(c.checkpoint.save_dir);
  EXPECT_EQ(c.checkpoint.save_interval, 0);
  EXPECT_EQ(c.checkpoint.keep_last, 0);
  EXPECT_EQ(c.checkpoint.file_mode, 0640u);
  EXPECT_EQ(c.checkpoint.dir_mode, 0750u);

  EXPECT_FALSE(c.pipeline.stages);
}

TEST(ConfigDefaults, OptimizerParams) {
  const Config adam = parse(R"({"optimizer": {"type": "Adam"}})");
  ASSERT_TRUE(adam.optimizer);
  EXPECT_EQ(adam.optimizer->type, zt::OptimizerType::adam);
  EXPECT_EQ(adam.optimizer->lr, 1e-3);
  EXPECT_EQ(adam.optimizer->betas[0], 0.9);
  EXPECT_EQ(adam.optimizer->betas[1], 0.999);
  EXPECT_EQ(adam.optimizer->eps, 1e-8);
  EXPECT_EQ(adam.optimizer->weight_decay, 0.0);
  EXPECT_TRUE(adam.optimizer->adam_w_mode);
  EXPECT_TRUE(adam.optimizer->bias_correction);
  EXPECT_TRUE(adam.optimizer->decoupled_weight_decay());  // DeepSpeed's Adam defaults to AdamW mode

  const Config plain_adam = parse(R"({"optimizer": {"type": "adam", "params": {"adam_w_mode": false}}})");
  EXPECT_FALSE(plain_adam.optimizer->decoupled_weight_decay());

  const Config sgd =
      parse(R"({"optimizer": {"type": "sgd", "params": {"lr": 0.1, "momentum": 0.9, "nesterov": true}}})");
  EXPECT_EQ(sgd.optimizer->type, zt::OptimizerType::sgd);
  EXPECT_EQ(sgd.optimizer->lr, 0.1);
  EXPECT_EQ(sgd.optimizer->momentum, 0.9);
  EXPECT_EQ(sgd.optimizer->dampening, 0.0);
  EXPECT_TRUE(sgd.optimizer->nesterov);
  EXPECT_FALSE(sgd.optimizer->decoupled_weight_decay());
}

TEST(ConfigDefaults, OptimizerTypeIsCaseInsensitive) {
  EXPECT_EQ(parse(R"({"optimizer": {"type": "ADAMW"}})").optimizer->type, zt::OptimizerType::adamw);
  EXPECT_EQ(parse(R"({"optimizer": {"type": "AdamW"}})").optimizer->type, zt::OptimizerType::adamw);
  EXPECT_EQ(parse(R"({"optimizer": {"type": "Sgd"}})").optimizer->type, zt::OptimizerType::sgd);
}

TEST(ConfigDefaults, SchedulerParams) {
  const Config warmup = parse(R"({"scheduler": {"type": "WarmupLR"}})");
  ASSERT_TRUE(warmup.scheduler);
  EXPECT_EQ(warmup.scheduler->type, zt::SchedulerType::warmup_lr);
  const auto& w = std::get<zt::WarmupLRParams>(warmup.scheduler->params);
  EXPECT_EQ(w.warmup_min_lr, 0.0);
  EXPECT_FALSE(w.warmup_max_lr);  // None: the optimizer's lr
  EXPECT_EQ(w.warmup_num_steps, 1000);
  EXPECT_EQ(w.warmup_type, zt::WarmupType::log);
  EXPECT_EQ(warmup.scheduler->last_batch_iteration, -1);

  const Config decay =
      parse(R"({"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 5000}}})");
  const auto& d = std::get<zt::WarmupDecayLRParams>(decay.scheduler->params);
  EXPECT_EQ(d.total_num_steps, 5000);
  EXPECT_EQ(d.warmup_min_lr, 0.0);
  EXPECT_EQ(d.warmup_max_lr, 0.001);
  EXPECT_EQ(d.warmup_num_steps, 1000);
  EXPECT_EQ(d.warmup_type, zt::WarmupType::log);

  const Config cosine = parse(
      R"({"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 5000, "warmup_type": "linear"}}})");
  const auto& k = std::get<zt::WarmupCosineLRParams>(cosine.scheduler->params);
  EXPECT_EQ(k.total_num_steps, 5000);
  EXPECT_EQ(k.warmup_min_ratio, 0.0);
  EXPECT_EQ(k.warmup_num_steps, 1000);
  EXPECT_EQ(k.cos_min_ratio, 1e-4);
  EXPECT_EQ(k.warmup_type, zt::WarmupType::linear);

  const Config cycle =
      parse(R"({"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3}}})");
  const auto& o = std::get<zt::OneCycleParams>(cycle.scheduler->params);
  EXPECT_EQ(o.cycle_min_lr, 1e-4);
  EXPECT_EQ(o.cycle_max_lr, 1e-3);
  EXPECT_EQ(o.decay_lr_rate, 0.0);
  EXPECT_EQ(o.cycle_first_step_size, 2000);
  EXPECT_FALSE(o.cycle_second_step_size);
  EXPECT_EQ(o.cycle_first_stair_count, 0);
  EXPECT_FALSE(o.cycle_second_stair_count);
  EXPECT_EQ(o.decay_step_size, 0);
  EXPECT_TRUE(o.cycle_momentum);
  EXPECT_EQ(o.cycle_min_mom, 0.8);
  EXPECT_EQ(o.cycle_max_mom, 0.9);
  EXPECT_EQ(o.decay_mom_rate, 0.0);
  EXPECT_TRUE(cycle.warnings().empty());
  // Growing momentum is held below 1 from a step the warning names (first_clamped_step: unit test).
  const Config growing = parse(
      R"({"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3,
          "cycle_first_step_size": 4, "decay_step_size": 2, "decay_mom_rate": 0.1}}})");
  ASSERT_EQ(growing.warnings().size(), 1u);
  EXPECT_CONTAINS(growing.warnings()[0],
                  "scheduler.params.decay_mom_rate: momentum grows after the cycle and would pass 1");
  EXPECT_CONTAINS(growing.warnings()[0], "holds beta1 at 0.999 from step 12 on");

  const Config range = parse(R"({"scheduler": {"type": "LRRangeTest"}})");
  const auto& r = std::get<zt::LRRangeTestParams>(range.scheduler->params);
  EXPECT_EQ(r.lr_range_test_min_lr, 1e-3);
  EXPECT_EQ(r.lr_range_test_step_size, 2000);
  EXPECT_EQ(r.lr_range_test_step_rate, 1.0);
  EXPECT_FALSE(r.lr_range_test_staircase);
}

// ---- values that are accepted ----------------------------------------------------------------------

TEST(ConfigValues, IntegralFloatsAreAcceptedForIntegers) {
  const Config c = parse(R"({"zero_optimization": {"stage": 2, "reduce_bucket_size": 5e8,
                               "allgather_bucket_size": 2e8, "stage3_max_live_parameters": 1e9}})");
  EXPECT_EQ(c.zero_optimization.stage, 2);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 500'000'000);
  EXPECT_EQ(c.zero_optimization.allgather_bucket_size, 200'000'000);
  EXPECT_EQ(c.zero_optimization.stage3_max_live_parameters, 1'000'000'000);
  EXPECT_EQ(parse(R"({"train_batch_size": 32.0})").train_batch_size, 32);
}

TEST(ConfigValues, AllgatherBucketMultipleOfTwo) {
  EXPECT_EQ(parse(R"({"zero_optimization": {"allgather_bucket_size": 1000}})")
                .zero_optimization.allgather_bucket_size,
            1000);
  const std::string message = parse_error(R"({"zero_optimization": {"allgather_bucket_size": 1001}})");
  EXPECT_CONTAINS(message, "zero_optimization.allgather_bucket_size: expected a multiple of 2");
  EXPECT_CONTAINS(message, "got 1001");
}

TEST(ConfigValues, Stage3KeysAcceptTheirShortAliases) {
  const Config c = parse(R"({"zero_optimization": {"stage": 3, "prefetch_bucket_size": 1000,
                               "max_live_parameters": 77}})");
  EXPECT_EQ(c.zero_optimization.stage3_prefetch_bucket_size, 1000);
  EXPECT_EQ(c.zero_optimization.stage3_max_live_parameters, 77);
  EXPECT_TRUE(c.warnings().empty());
  EXPECT_CONTAINS(
      parse_error(R"({"zero_optimization": {"prefetch_bucket_size": 1, "stage3_prefetch_bucket_size": 2}})"),
      "give only 'stage3_prefetch_bucket_size'");
}

TEST(ConfigValues, Bfloat16AliasAndDtypes) {
  // data_types naming the compute dtype (bf16) are accepted; others are refused (ConfigIgnoredKeys).
  const Config c = parse(R"({"bfloat16": {"enabled": true, "check_grad_overflow": false},
                               "communication_data_type": "bf16",
                               "data_types": {"grad_accum_dtype": "bf16", "param_dtype": "bfloat16"}})");
  EXPECT_TRUE(c.bf16.enabled);
  EXPECT_FALSE(c.bf16.check_grad_overflow);
  EXPECT_EQ(c.communication_data_type, zt::DType::bf16);
  EXPECT_EQ(c.compute_dtype(), zt::DType::bf16);
  EXPECT_TRUE(c.warnings().empty());
}

TEST(ConfigValues, OffloadAndCheckpointSections) {
  const Config c = parse(R"({
    "zero_optimization": {"stage": 3,
      "offload_optimizer": {"device": "nvme", "nvme_path": "/local/nvme", "pin_memory": false, "ratio": 0.5},
      "offload_param": {"device": "cpu", "buffer_count": 7}},
    "checkpoint": {"tag_validation": "fail", "save_dir": "/scratch/ckpt", "save_interval": 100, "keep_last": 3,
                   "file_mode": "0600", "dir_mode": "0700", "parallel_write": {"pipeline_stage": true}},
    "pipeline": {"stages": 2, "partition": "type:Block"}})");
  const zt::ZeroConfig& z = c.zero_optimization;
  EXPECT_EQ(z.offload_optimizer.device, zt::OffloadDevice::nvme);
  EXPECT_EQ(z.offload_optimizer.nvme_path, "/local/nvme");
  EXPECT_FALSE(z.offload_optimizer.pin_memory);
  EXPECT_EQ(z.offload_optimizer.ratio, 0.5);
  EXPECT_EQ(z.offload_param.device, zt::OffloadDevice::cpu);
  EXPECT_EQ(z.offload_param.buffer_count, 7);
  EXPECT_EQ(c.checkpoint.save_dir, "/scratch/ckpt");
  EXPECT_EQ(c.checkpoint.save_interval, 100);
  EXPECT_EQ(c.checkpoint.keep_last, 3);
  EXPECT_EQ(c.checkpoint.file_mode, 0600u);
  EXPECT_EQ(c.checkpoint.dir_mode, 0700u);
  EXPECT_EQ(c.pipeline.stages, 2);
  EXPECT_TRUE(c.warnings().empty());
}

TEST(ConfigValues, ZerotrainSections) {
  const Config gpt = parse(R"({"model": {"type": "gpt", "n_layer": 12, "n_head": 12, "d_model": 768,
                                 "seq_len": 1024, "vocab_size": 50257, "dropout": 0.1},
                               "data": {"path": "/data/train.tokens", "format": "tokens", "seed": 7},
                               "seed": 99})");
  const auto& g = std::get<zt::GptModelConfig>(*gpt.model);
  EXPECT_EQ(g.n_layer, 12);
  EXPECT_EQ(g.n_head, 12);
  EXPECT_EQ(g.d_model, 768);
  EXPECT_EQ(g.seq_len, 1024);
  EXPECT_EQ(g.vocab_size, 50257);
  EXPECT_TRUE(g.tie_embeddings);
  EXPECT_EQ(g.dropout, 0.1);
  EXPECT_EQ(gpt.data->path, "/data/train.tokens");
  EXPECT_EQ(gpt.data->format, zt::DataFormat::tokens);
  EXPECT_EQ(gpt.data->seed, 7u);
  EXPECT_EQ(gpt.seed, 99u);

  const Config mlp = parse(R"({"model": {"type": "mlp", "sizes": [784, 256, 10], "activation": "gelu"},
                               "data": {"format": "synthetic"}})");
  const auto& m = std::get<zt::MlpModelConfig>(*mlp.model);
  EXPECT_EQ(m.sizes, (std::vector<std::int64_t>{784, 256, 10}));
  EXPECT_EQ(m.activation, zt::MlpActivation::gelu);
  EXPECT_FALSE(mlp.data->path);
  EXPECT_FALSE(mlp.data->seed);
}

// ---- validation errors ---------------------------------------------------------------------------

TEST(ConfigValues, DeviceChoice) {
  EXPECT_EQ(parse("{}").device, zt::DeviceChoice::automatic);
  EXPECT_EQ(parse(R"({"device": "auto"})").device, zt::DeviceChoice::automatic);
  EXPECT_EQ(parse(R"({"device": "cuda"})").device, zt::DeviceChoice::cuda);
  EXPECT_EQ(parse(R"({"device": "host"})").device, zt::DeviceChoice::host);
  EXPECT_EQ(zt::to_string(zt::DeviceChoice::automatic), "auto");
  // It survives the round trip through to_json_string, as every other key.
  EXPECT_EQ(parse(parse(R"({"device": "cuda"})").to_json_string()).device, zt::DeviceChoice::cuda);
  EXPECT_CONTAINS(parse_error(R"({"device": "gpu"})"),
                  "device: expected one of \"auto\", \"cuda\", \"host\", got \"gpu\"");
  EXPECT_CONTAINS(parse_error(R"({"device": 0})"), "device: expected one of \"auto\"");
}

TEST(ConfigErrors, WrongTypeNamesPathAndExpectation) {
  const std::string message = parse_error(R"({"zero_optimization": {"stage": "two"}})");
  EXPECT_CONTAINS(message, "zero_optimization.stage: expected an integer in 0..3, got \"two\"");
  EXPECT_CONTAINS(message, "config string");
  EXPECT_CONTAINS(parse_error(R"({"fp16": {"enabled": "yes"}})"),
                  "fp16.enabled: expected a boolean (true or false), got \"yes\"");
  EXPECT_CONTAINS(parse_error(R"({"gradient_clipping": "1.0"})"),
                  "gradient_clipping: expected a number >= 0");
  EXPECT_CONTAINS(parse_error(R"({"zero_optimization": 2})"),
                  "zero_optimization: expected a JSON object, got 2");
  EXPECT_CONTAINS(parse_error(R"([1, 2])"), "expected a JSON object");
  EXPECT_CONTAINS(parse_error(R"({"train_batch_size": 1.5})"),
                  "train_batch_size: expected a positive integer, got 1.5");
}

TEST(ConfigErrors, OutOfRange) {
  EXPECT_CONTAINS(parse_error(R"({"zero_optimization": {"stage": 4}})"),
                  "zero_optimization.stage: expected an integer in 0..3, got 4");
  EXPECT_CONTAINS(parse_error(R"({"train_micro_batch_size_per_gpu": 0})"),
                  "train_micro_batch_size_per_gpu: expected a positive integer, got 0");
  EXPECT_CONTAINS(parse_error(R"({"gradient_clipping": -1})"),
                  "gradient_clipping: expected a number >= 0, got -1");
  EXPECT_CONTAINS(parse_error(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"ratio": 1.5}}})"),
                  "zero_optimization.offload_optimizer.ratio: expected a number in [0, 1], got 1.5");
  EXPECT_CONTAINS(parse_error(R"({"aio": {"queue_depth": 0}})"),
                  "aio.queue_depth: expected a positive integer");
  EXPECT_CONTAINS(
      parse_error(R"({"zero_optimization": {"offload_optimizer": {"device": "gpu"}}})"),
      "zero_optimization.offload_optimizer.device: expected one of \"none\", \"cpu\", \"nvme\", got \"gpu\"");
  EXPECT_CONTAINS(parse_error(R"({"gradient_allreduce_op": "max"})"),
                  "gradient_allreduce_op: expected one of \"mean\", \"sum\", got \"max\"");
  EXPECT_CONTAINS(parse_error(R"({"checkpoint": {"file_mode": 640}})"),
                  "checkpoint.file_mode: expected an octal permission string such as \"0640\", got 640");
  // Permission bits that would let others replace a checkpoint, or run one as its owner (issue 16).
  EXPECT_CONTAINS(parse_error(R"({"checkpoint": {"file_mode": "4777"}})"),
                  "checkpoint.file_mode: \"4777\" sets the setuid bit (04000)");
  EXPECT_CONTAINS(parse_error(R"({"checkpoint": {"file_mode": "2640"}})"),
                  "checkpoint.file_mode: \"2640\" sets the setgid bit (02000)");
  EXPECT_CONTAINS(parse_error(R"({"checkpoint": {"file_mode": "1640"}})"), "sets the sticky bit (01000)");
  EXPECT_CONTAINS(parse_error(R"({"checkpoint": {"file_mode": "0666"}})"),
                  "checkpoint.file_mode: \"0666\" is writable by others (0002)");
  EXPECT_CONTAINS(parse_error(R"({"checkpoint": {"dir_mode": "0777"}})"),
                  "checkpoint.dir_mode: \"0777\" is writable by others (0002)");
  EXPECT_EQ(parse(R"({"checkpoint": {"dir_mode": "2750"}})").checkpoint.dir_mode, 02750u);
  EXPECT_CONTAINS(parse_error(R"({"checkpoint": {"tag_validation": "Sometimes"}})"),
                  "checkpoint.tag_validation");
}

TEST(ConfigErrors, AutoPlaceholderIsExplained) {
  EXPECT_CONTAINS(parse_error(R"({"train_micro_batch_size_per_gpu": "auto"})"), "Hugging Face");
}

TEST(ConfigErrors, Fp16Rules) {
  EXPECT_CONTAINS(parse_error(R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})"),
                  "fp16.enabled and bf16.enabled are both true");
  EXPECT_CONTAINS(parse_error(R"({"fp16": {"enabled": true}, "bfloat16": {"enabled": true}})"),
                  "fp16.enabled and bf16.enabled are both true");
  EXPECT_CONTAINS(parse_error(R"({"fp16": {"loss_scale": -1}})"),
                  "fp16.loss_scale: expected a number >= 0, got -1");
  EXPECT_CONTAINS(parse_error(R"({"fp16": {"loss_scale_window": 0}})"),
                  "fp16.loss_scale_window: expected a positive integer with a dynamic loss scale");
  EXPECT_CONTAINS(parse_error(R"({"fp16": {"min_loss_scale": 0}})"),
                  "fp16.min_loss_scale: expected a number > 0 with a dynamic loss scale");
  // With a static scale the dynamic-only rules do not apply (as in DeepSpeed).
  EXPECT_EQ(parse(R"({"fp16": {"loss_scale": 128, "loss_scale_window": 0}})").fp16.loss_scale, 128.0);
  EXPECT_CONTAINS(parse_error(R"({"bf16": {}, "bfloat16": {}})"), "are both given");
  EXPECT_CONTAINS(parse_error(R"({"bf16": {"bf16_optimizer_states": true}})"),
                  "bf16.bf16_optimizer_states: needs bf16_master_weights_and_grads");
}

TEST(ConfigErrors, OffloadRules) {
  EXPECT_CONTAINS(parse_error(R"({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})"),
                  "zero_optimization.offload_param: parameter offload needs ZeRO stage 3, but "
                  "zero_optimization.stage is 2");
  EXPECT_CONTAINS(
      parse_error(R"({"zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}}})"),
      "optimizer offload needs ZeRO stage 1, 2 or 3");
  EXPECT_CONTAINS(parse_error(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}})"),
                  "zero_optimization.offload_param.nvme_path: required when device is \"nvme\"");
  // NVMe optimizer offload: stages 1-3 (DeepSpeed documents stage 3 only; zerotrain's engine swaps at 1-3).
  EXPECT_EQ(
      parse(
          R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": "/x"}}})")
          .zero_optimization.offload_optimizer.device,
      zt::OffloadDevice::nvme);
  EXPECT_CONTAINS(
      parse_error(
          R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}})"),
      "partial offload (ratio < 1) needs ZeRO stage 3");
  // A "none" device is harmless on any stage.
  EXPECT_EQ(parse(R"({"zero_optimization": {"stage": 1, "offload_param": {"device": "none"}}})")
                .zero_optimization.stage,
            1);
}

TEST(ConfigErrors, OptimizerTypes) {
  const std::string lamb = parse_error(R"({"optimizer": {"type": "Lamb"}})");
  EXPECT_CONTAINS(lamb, "optimizer.type: DeepSpeed optimizer 'Lamb' is not implemented by zerotrain");
  EXPECT_CONTAINS(lamb, "Adam, AdamW, SGD");
  EXPECT_CONTAINS(parse_error(R"({"optimizer": {"type": "OneBitAdam"}})"), "not implemented by zerotrain");
  EXPECT_CONTAINS(parse_error(R"({"optimizer": {"type": "RMSprop"}})"), "unknown optimizer type 'RMSprop'");
  EXPECT_CONTAINS(parse_error(R"({"optimizer": {"params": {"lr": 1}}})"), "optimizer.type: required");
  EXPECT_CONTAINS(parse_error(R"({"optimizer": {"type": "Adam", "params": {"betas": [0.9]}}})"),
                  "optimizer.params.betas: expected an array of two numbers in [0, 1), got [0.9]");
  EXPECT_CONTAINS(parse_error(R"({"optimizer": {"type": "SGD", "params": {"nesterov": true}}})"),
                  "optimizer.params.nesterov: Nesterov momentum needs momentum > 0");
  EXPECT_CONTAINS(parse_error(R"({"optimizer": {"type": "Adam", "params": {"amsgrad": true}}})"),
                  "optimizer.params.amsgrad: true is not supported");
}

TEST(ConfigErrors, SchedulerTypesAndRequiredParams) {
  const std::string bad = parse_error(R"({"scheduler": {"type": "CosineAnnealingLR"}})");
  EXPECT_CONTAINS(bad, "scheduler.type: unknown scheduler type 'CosineAnnealingLR'");
  EXPECT_CONTAINS(bad, "WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest");
  EXPECT_CONTAINS(parse_error(R"({"scheduler": {"type": "WarmupDecayLR", "params": {}}})"),
                  "scheduler.params.total_num_steps: required for scheduler WarmupDecayLR");
  EXPECT_CONTAINS(parse_error(R"({"scheduler": {"type": "WarmupCosineLR"}})"),
                  "scheduler.params.total_num_steps: required for scheduler WarmupCosineLR");
  EXPECT_CONTAINS(parse_error(R"({"scheduler": {"type": "OneCycle", "params": {"cycle_max_lr": 0.1}}})"),
                  "scheduler.params.cycle_min_lr: required for scheduler OneCycle");
  EXPECT_CONTAINS(parse_error(R"({"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.1}}})"),
                  "scheduler.params.cycle_max_lr: required for scheduler OneCycle");
  EXPECT_CONTAINS(parse_error(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "cubic"}}})"),
                  "scheduler.params.warmup_type: expected one of \"log\", \"linear\", got \"cubic\"");
  EXPECT_CONTAINS(parse_error(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 0}}})"),
                  "scheduler.params.warmup_num_steps: expected a positive integer, got 0");
  // A typo of the required key is pointed out.
  EXPECT_CONTAINS(
      parse_error(R"({"scheduler": {"type": "WarmupDecayLR", "params": {"totl_num_steps": 10}}})"),
      "found 'totl_num_steps': a typo?");
}

TEST(ConfigErrors, ZerotrainSections) {
  EXPECT_CONTAINS(parse_error(R"({"model": {"type": "gpt", "n_layer": 2, "n_head": 3, "d_model": 8,
                                            "seq_len": 4, "vocab_size": 10}})"),
                  "model.d_model: expected a multiple of n_head (3), got 8");
  EXPECT_CONTAINS(parse_error(R"({"model": {"type": "gpt", "n_layer": 2}})"),
                  "model.n_head: required for a gpt model");
  EXPECT_CONTAINS(parse_error(R"({"model": {"type": "mlp", "sizes": [4]}})"),
                  "model.sizes: expected an array of at least two positive integers");
  EXPECT_CONTAINS(parse_error(R"({"model": {"type": "cnn"}})"),
                  "model.type: expected one of \"gpt\", \"mlp\"");
  EXPECT_CONTAINS(parse_error(R"({"data": {"format": "tokens"}})"),
                  "data.path: required unless data.format is");
  EXPECT_CONTAINS(parse_error(R"({"data": {}})"), "data.path: required unless data.format is");
  EXPECT_FALSE(parse(R"({"data": {"format": "builtin"}})").data->path);
  EXPECT_CONTAINS(parse_error(R"({"comm": {"backend": "gloo"}})"),
                  "comm.backend: expected one of \"auto\", \"mpi\"");
  EXPECT_CONTAINS(parse_error(R"({"comm": {"timeout_s": -5}})"), "comm.timeout_s: expected a number >= 0");
  EXPECT_CONTAINS(parse_error(R"({"checkpoint": {"save_interval": 10}})"),
                  "checkpoint.save_dir: required when save_interval > 0");
}

TEST(ConfigErrors, UnsupportedDeepSpeedFeaturesThatChangeResults) {
  EXPECT_CONTAINS(parse_error(R"({"elasticity": {"enabled": true, "max_train_batch_size": 64}})"),
                  "elasticity: DeepSpeed feature not supported by zerotrain");
  EXPECT_CONTAINS(
      parse_error(R"({"zero_optimization": {"stage": 3, "zero_quantized_gradients": true}})"),
      "zero_optimization.zero_quantized_gradients: ZeRO++ quantized communication is not supported");
  EXPECT_CONTAINS(parse_error(R"({"zero_optimization": {"stage": 2, "zenflow": {"topk_ratio": 0.1}}})"),
                  "zero_optimization.zenflow: DeepSpeed feature not supported");
  EXPECT_CONTAINS(parse_error(R"({"gradient_allreduce_op": "sum", "zero_optimization": {"stage": 3}})"),
                  "\"sum\" is not supported with ZeRO stage 3");
  EXPECT_CONTAINS(parse_error(R"({"sequence_parallel_size": 2})"), "sequence_parallel_size");
  // Disabled forms are accepted silently.
  const Config off = parse(R"({"elasticity": {"enabled": false}, "sequence_parallel_size": 1,
                               "zero_optimization": {"zero_quantized_weights": false},
                               "tensorboard": {"enabled": false}, "sparse_gradients": false})");
  EXPECT_TRUE(off.warnings().empty());
}

// ---- DeepSpeed keys without a Config member (docs/config.md, "Accepted and ignored") ---------------

/// Every key that has no member, at DeepSpeed's default: what a DeepSpeed config, an older example
/// config or the effective config stored in an older checkpoint may hold.
constexpr const char* kIgnoredKeysAtTheirDefaults = R"({
  "wall_clock_breakdown": false, "memory_breakdown": false, "dump_state": false,
  "prescale_gradients": false, "gradient_predivide_factor": 1.0, "dataloader_drop_last": false,
  "fp16": {"auto_cast": false}, "bf16": {"immediate_grad_update": false},
  "zero_optimization": {"contiguous_gradients": true, "reduce_scatter": true, "allgather_partitions": true,
    "use_multi_rank_bucket_allreduce": true, "round_robin_gradients": false, "load_from_fp32_weights": true,
    "ignore_unused_parameters": true, "elastic_checkpoint": false,
    "stage3_model_persistence_threshold": 9223372036854775807, "stage3_gather_16bit_weights_on_model_save": false,
    "stage3_module_granularity_threshold": 0, "stage3_use_all_reduce_for_fetch_params": false,
    "stage3_allgather_sequential": false, "zero_hpz_partition_size": 1, "zero_quantized_weights": false,
    "zero_quantized_nontrainable_weights": false, "zero_quantized_gradients": false, "mics_shard_size": -1,
    "memory_efficient_linear": true, "override_module_apply": true,
    "offload_optimizer": {"pipeline_read": false, "pipeline_write": false, "fast_init": false,
                          "cpuadam_cores_perc": 0.8}},
  "activation_checkpointing": {"partition_activations": false, "contiguous_memory_optimization": false,
    "cpu_checkpointing": false, "number_checkpoints": null, "synchronize_checkpoint_boundary": false,
    "profile": false},
  "checkpoint": {"tag_validation": "Warn", "load_universal": false, "use_node_local_storage": false,
                 "parallel_write": {"pipeline_stage": false}},
  "data_types": {"grad_accum_dtype": null, "param_dtype": null, "buffer_dtype": null},
  "pipeline": {"stages": "auto", "partition": "best", "seed_layers": false, "activation_checkpoint_interval": 0,
               "pipe_partitioned": true, "grad_partitioned": true, "use_reentrant": true},
  "comm": {"timeout_s": 600, "backend": "auto"}
})";

TEST(ConfigIgnoredKeys, DefaultsAreAcceptedSilently) {
  const Config c = parse(kIgnoredKeysAtTheirDefaults);
  EXPECT_TRUE(c.warnings().empty()) << c.warnings().at(0);
  EXPECT_EQ(c.to_json_string(), parse("{}").to_json_string());
  // activation_checkpointing absent (above: "{}"), empty or with its defaults (above) is accepted.
  EXPECT_TRUE(parse(R"({"activation_checkpointing": {}})").warnings().empty());
}

TEST(ConfigPipeline, StagesPartitionAndSchedule) {
  const Config defaults = parse("{}");
  EXPECT_EQ(defaults.pipeline.stage_count(), 1);
  EXPECT_EQ(defaults.pipeline.partition, "parameters");
  EXPECT_EQ(defaults.pipeline.schedule, zt::PipelineSchedule::one_f_one_b);
  // DeepSpeed's "best" balances parameters, as "parameters" does.
  const Config best = parse(R"({"pipeline": {"stages": 2, "partition": "best", "schedule": "gpipe"}})");
  EXPECT_EQ(best.pipeline.stage_count(), 2);
  EXPECT_EQ(best.pipeline.partition, "parameters");
  EXPECT_EQ(best.pipeline.schedule, zt::PipelineSchedule::gpipe);
  const Config typed = parse(R"({"pipeline": {"partition": "type:Block", "schedule": "1f1b"}})");
  EXPECT_EQ(typed.pipeline.partition, "type:Block");
  const Config round_trip = parse(best.to_json_string());
  EXPECT_EQ(round_trip.pipeline.stage_count(), 2);
  EXPECT_EQ(round_trip.pipeline.schedule, zt::PipelineSchedule::gpipe);
  EXPECT_CONTAINS(parse_error(R"({"pipeline": {"schedule": "interleaved"}})"), "pipeline.schedule");
}

TEST(ConfigIgnoredKeys, ValuesThatCannotChangeTheTrainingAreIgnored) {
  const std::string base = R"("zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu")";
  const Config c = parse("{" + base + R"(, "pipeline_read": true, "pipeline_write": true, "fast_init": true,
                                   "cpuadam_cores_perc": 0.5},
      "contiguous_gradients": false, "reduce_scatter": false, "allgather_partitions": false,
      "use_multi_rank_bucket_allreduce": false, "round_robin_gradients": true, "ignore_unused_parameters": false,
      "stage3_model_persistence_threshold": 10, "stage3_gather_16bit_weights_on_model_save": true,
      "stage3_module_granularity_threshold": 5, "stage3_use_all_reduce_for_fetch_params": true,
      "allgather_sequential": true, "memory_efficient_linear": false, "override_module_apply": false},
    "checkpoint": {"tag_validation": "fail", "load_universal": true, "parallel_write": {"pipeline_stage": true}},
    "pipeline": {"seed_layers": true, "pipe_partitioned": false, "grad_partitioned": false,
                 "use_reentrant": false}})");
  EXPECT_TRUE(c.warnings().empty()) << c.warnings().at(0);
  EXPECT_EQ(c.to_json_string(), parse("{" + base + "}}}").to_json_string());

  // DeepSpeed's diagnostics print nothing here: a warning says so.
  const Config diagnostics =
      parse(R"({"wall_clock_breakdown": true, "memory_breakdown": true, "dump_state": true})");
  ASSERT_EQ(diagnostics.warnings().size(), 3u);
  EXPECT_CONTAINS(diagnostics.warnings()[0],
                  "wall_clock_breakdown: DeepSpeed feature not supported by zerotrain; ignored");
  EXPECT_CONTAINS(diagnostics.warnings()[1],
                  "memory_breakdown: DeepSpeed feature not supported by zerotrain; ignored");
  EXPECT_CONTAINS(diagnostics.warnings()[2],
                  "dump_state: DeepSpeed feature not supported by zerotrain; ignored");

  // Ignored keys are still validated.
  EXPECT_CONTAINS(parse_error(R"({"zero_optimization": {"contiguous_gradients": "yes"}})"),
                  "zero_optimization.contiguous_gradients: expected a boolean (true or false), got \"yes\"");
  EXPECT_CONTAINS(parse_error(R"({"pipeline": {"partition": "random"}})"),
                  "pipeline.partition: expected one of \"best\", \"parameters\"");
  EXPECT_CONTAINS(
      parse_error(R"({"zero_optimization": {"offload_optimizer": {"cpuadam_cores_perc": 2}}})"),
      "zero_optimization.offload_optimizer.cpuadam_cores_perc: expected a number in [0, 1], got 2");
}

TEST(ConfigIgnoredKeys, ValuesThatWouldChangeTheTrainingAreRefused) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"prescale_gradients": true})",
       "prescale_gradients: true is not supported by zerotrain: gradients are averaged after the sum"},
      {R"({"gradient_predivide_factor": 2})", "gradient_predivide_factor: 2 is not supported by zerotrain"},
      {R"({"dataloader_drop_last": true})",
       "dataloader_drop_last: true is not supported by zerotrain: the training data is one endless stream of "
       "epochs"},
      {R"({"fp16": {"enabled": true, "auto_cast": true}})",
       "fp16.auto_cast: true is not supported by zerotrain: the engine does not cast"},
      {R"({"bf16": {"enabled": true, "immediate_grad_update": true}})",
       "bf16.immediate_grad_update: true is not supported by zerotrain: gradients accumulate in the compute "
       "dtype"},
      {R"({"zero_optimization": {"stage": 2, "load_from_fp32_weights": false}})",
       "zero_optimization.load_from_fp32_weights: false is not supported by zerotrain: a checkpoint's fp32 "
       "master "
       "weights are always loaded"},
      {R"({"checkpoint": {"use_node_local_storage": true}})",
       "checkpoint.use_node_local_storage: true is not supported by zerotrain: all ranks write one "
       "checkpoint file"},
      {R"({"bf16": {"enabled": true}, "data_types": {"grad_accum_dtype": "fp32"}})",
       "data_types.grad_accum_dtype: \"fp32\" is not supported by zerotrain: parameters, gradients and their "
       "accumulation are all in the compute dtype, bf16 here"},
      {R"({"data_types": {"param_dtype": "fp16"}})",
       "data_types.param_dtype: \"fp16\" is not supported by zerotrain"},
      {R"({"fp16": {"enabled": true}, "data_types": {"buffer_dtype": "bf16"}})",
       "data_types.buffer_dtype: \"bf16\" is not supported by zerotrain: parameters, gradients and their "
       "accumulation are all in the compute dtype, fp16 here"},
      {R"({"comm": {"backend": "nccl"}})",
       "comm.backend: \"nccl\" is not supported: the config does not choose the communication backend"},
  };
  for (const auto& [text, message] : cases) EXPECT_CONTAINS(parse_error(text), message);
}

// ---- activation checkpointing ------------------------------------------------------------------

TEST(ConfigActivationCheckpointing, KeysAreReadAndRoundTrip) {
  const Config c =
      parse(R"({"activation_checkpointing": {"partition_activations": true, "cpu_checkpointing": true,
      "number_checkpoints": 3, "contiguous_memory_optimization": true, "synchronize_checkpoint_boundary": true,
      "profile": true}, "pipeline": {"activation_checkpoint_interval": 2}})");
  EXPECT_TRUE(c.warnings().empty()) << c.warnings().at(0);
  const zt::ActivationCheckpointingConfig& a = c.activation_checkpointing;
  EXPECT_TRUE(a.partition_activations);
  EXPECT_TRUE(a.cpu_checkpointing);
  EXPECT_EQ(a.number_checkpoints, 3);
  EXPECT_TRUE(a.contiguous_memory_optimization);
  EXPECT_TRUE(a.synchronize_checkpoint_boundary);
  EXPECT_TRUE(a.profile);
  EXPECT_EQ(c.pipeline.activation_checkpoint_interval, 2);
  const Config again = parse(c.to_json_string());
  EXPECT_TRUE(again.warnings().empty()) << again.warnings().at(0);
  EXPECT_EQ(again.to_json_string(), c.to_json_string());
  EXPECT_EQ(again.activation_checkpointing.number_checkpoints, 3);
  EXPECT_EQ(again.pipeline.activation_checkpoint_interval, 2);
  EXPECT_TRUE(again.activation_checkpointing.cpu_checkpointing);
  EXPECT_NE(c.to_json_string(), parse("{}").to_json_string());

  const Config defaults = parse("{}");
  EXPECT_FALSE(defaults.activation_checkpointing.number_checkpoints.has_value());
  EXPECT_EQ(defaults.pipeline.activation_checkpoint_interval, 0);
  EXPECT_FALSE(defaults.activation_checkpointing.cpu_checkpointing);
}

TEST(ConfigActivationCheckpointing, TheIntervalComesFromThePipelineOrTheNumberOfCheckpoints) {
  EXPECT_EQ(parse("{}").activation_checkpoint_interval_for(10), 0);
  EXPECT_EQ(parse(R"({"activation_checkpointing": {"cpu_checkpointing": true}})")
                .activation_checkpoint_interval_for(10),
            0);
  const Config by_count = parse(R"({"activation_checkpointing": {"number_checkpoints": 3}})");
  EXPECT_EQ(by_count.activation_checkpoint_interval_for(10), 4);  // ceil(10 / 3): groups of 4, 4, 2
  EXPECT_EQ(by_count.activation_checkpoint_interval_for(9), 3);
  EXPECT_EQ(by_count.activation_checkpoint_interval_for(2), 1);  // more checkpoints than layers
  const Config both = parse(
      R"({"activation_checkpointing": {"number_checkpoints": 3}, "pipeline": {"activation_checkpoint_interval": 5}})");
  EXPECT_EQ(both.activation_checkpoint_interval_for(10), 5);  // the interval wins
  EXPECT_EQ(
      parse(R"({"pipeline": {"activation_checkpoint_interval": 1}})").activation_checkpoint_interval_for(10),
      1);
}

TEST(ConfigActivationCheckpointing, InvalidValuesAreRefused) {
  EXPECT_CONTAINS(parse_error(R"({"activation_checkpointing": {"number_checkpoints": 0}})"),
                  "activation_checkpointing.number_checkpoints: expected a positive integer, got 0");
  EXPECT_CONTAINS(parse_error(R"({"pipeline": {"activation_checkpoint_interval": -1}})"),
                  "pipeline.activation_checkpoint_interval: expected a non-negative integer, got -1");
  EXPECT_CONTAINS(
      parse_error(R"({"activation_checkpointing": {"cpu_checkpointing": "yes"}})"),
      "activation_checkpointing.cpu_checkpointing: expected a boolean (true or false), got \"yes\"");
  const Config typo = parse(R"({"activation_checkpointing": {"cpu_checkpoint": true}})");
  ASSERT_EQ(typo.warnings().size(), 1u);
  EXPECT_CONTAINS(typo.warnings()[0],
                  "activation_checkpointing.cpu_checkpoint: unknown key; did you mean "
                  "'cpu_checkpointing'?");
}

// ---- warnings --------------------------------------------------------------------------------------

TEST(ConfigWarnings, UnknownKeyWithSuggestion) {
  const Config c = parse(R"({"zero_optimization": {"stgae": 2}, "train_batch_sise": 8})");
  ASSERT_EQ(c.warnings().size(), 2u);
  EXPECT_EQ(c.warnings()[0], "zero_optimization.stgae: unknown key; did you mean 'stage'? (ignored)");
  EXPECT_EQ(c.warnings()[1], "train_batch_sise: unknown key; did you mean 'train_batch_size'? (ignored)");
  EXPECT_EQ(c.zero_optimization.stage, 0);
}

TEST(ConfigWarnings, UnknownKeysInNestedSections) {
  const Config c =
      parse(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "pin_memry": true}},
                             "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decai": 0.1}},
                             "scheduler": {"type": "WarmupLR", "params": {"warmup_num_step": 10}},
                             "completely_unrelated": 1})");
  ASSERT_EQ(c.warnings().size(), 4u);
  EXPECT_EQ(c.warnings()[0],
            "optimizer.params.weight_decai: unknown key; did you mean 'weight_decay'? (ignored)");
  EXPECT_EQ(c.warnings()[1],
            "scheduler.params.warmup_num_step: unknown key; did you mean 'warmup_num_steps'? (ignored)");
  EXPECT_EQ(c.warnings()[2],
            "zero_optimization.offload_param.pin_memry: unknown key; did you mean 'pin_memory'? (ignored)");
  EXPECT_EQ(c.warnings()[3], "completely_unrelated: unknown key (ignored)");
}

TEST(ConfigWarnings, ThreadCountIsTheOldNameOfIntraOpParallelism) {
  const Config c = parse(R"({"aio": {"thread_count": 4}})");
  EXPECT_EQ(c.aio.intra_op_parallelism, 4);
  ASSERT_EQ(c.warnings().size(), 1u);
  EXPECT_CONTAINS(c.warnings()[0], "aio.thread_count: renamed to intra_op_parallelism");
  EXPECT_CONTAINS(parse_error(R"({"aio": {"thread_count": 4, "intra_op_parallelism": 2}})"),
                  "give only intra_op_parallelism");
}

TEST(ConfigWarnings, UnsupportedFeaturesThatDoNotChangeResults) {
  const Config c = parse(R"({"wandb": {"enabled": true, "project": "p"}, "sparse_gradients": true,
                             "zero_optimization": {"stage": 2, "zero_hpz_partition_size": 8},
                             "optimizer": {"type": "Adam", "params": {"torch_adam": true}}})");
  ASSERT_EQ(c.warnings().size(), 4u);
  EXPECT_CONTAINS(c.warnings()[0], "sparse_gradients: DeepSpeed feature not supported by zerotrain; ignored");
  EXPECT_CONTAINS(c.warnings()[1], "wandb: DeepSpeed feature not supported by zerotrain; ignored");
  EXPECT_CONTAINS(c.warnings()[2], "optimizer.params.torch_adam: ignored");
  EXPECT_CONTAINS(c.warnings()[3], "zero_optimization.zero_hpz_partition_size");
}

// ---- monitors and alerts (docs/metrics.md) --------------------------------------------------------

TEST(ConfigMonitors, DeepSpeedSectionsAndDefaults) {
  const Config defaults = parse("{}");
  EXPECT_FALSE(defaults.tensorboard.enabled);
  EXPECT_FALSE(defaults.csv_monitor.enabled);
  EXPECT_EQ(defaults.csv_monitor.job_name, "DeepSpeedJobName");  // DeepSpeed's default
  EXPECT_EQ(defaults.csv_monitor.directory(), "DeepSpeedJobName");
  EXPECT_FALSE(defaults.alerts.memory_limit.has_value());
  EXPECT_DOUBLE_EQ(defaults.alerts.memory_fraction, 0.95);

  const Config c = parse(R"({"tensorboard": {"enabled": true, "output_path": "out/tb", "job_name": "run1"},
                             "csv_monitor": {"enabled": true, "output_path": "/tmp/csv"},
                             "alerts": {"memory_limit": 1048576, "memory_fraction": 0.5}})");
  EXPECT_TRUE(c.warnings().empty());
  EXPECT_TRUE(c.tensorboard.enabled);
  EXPECT_EQ(c.tensorboard.directory(), "out/tb/run1");
  EXPECT_EQ(c.csv_monitor.directory(), "/tmp/csv/DeepSpeedJobName");
  EXPECT_EQ(c.alerts.memory_limit, 1048576);
  EXPECT_DOUBLE_EQ(c.alerts.memory_fraction, 0.5);
  const Config again = parse(c.to_json_string());
  EXPECT_EQ(again.to_json_string(), c.to_json_string());
  EXPECT_EQ(again.tensorboard.directory(), "out/tb/run1");
}

TEST(ConfigMonitors, Errors) {
  EXPECT_CONTAINS(parse_error(R"({"tensorboard": {"enabled": "yes"}})"), "tensorboard.enabled");
  EXPECT_CONTAINS(parse_error(R"({"csv_monitor": {"job_name": ""}})"), "csv_monitor.job_name");
  EXPECT_CONTAINS(parse_error(R"({"alerts": {"memory_limit": 0}})"), "alerts.memory_limit");
  EXPECT_CONTAINS(parse_error(R"({"alerts": {"memory_fraction": 0}})"), "alerts.memory_fraction");
  EXPECT_CONTAINS(parse_error(R"({"alerts": {"memory_fraction": 1.5}})"), "alerts.memory_fraction");
  const Config typo = parse(R"({"csv_monitor": {"enabled": true, "outputpath": "x"}})");
  ASSERT_EQ(typo.warnings().size(), 1u);
  EXPECT_CONTAINS(typo.warnings()[0], "csv_monitor.outputpath: unknown key; did you mean 'output_path'?");
}

// ---- "init" and "freeze" (docs/config.md; docs/adaptation-reference.md) ------------------------

TEST(ConfigInitFreeze, ParsedAndInTheEffectiveConfig) {
  const Config defaults = parse("{}");
  EXPECT_FALSE(defaults.init.from.has_value());
  EXPECT_TRUE(defaults.freeze.empty());
  const Config c = parse(R"({"init": {"from": "gpt2.h5"}, "freeze": ["wte.*", "re:h\\.[01]\\..*"]})");
  EXPECT_TRUE(c.warnings().empty());
  EXPECT_EQ(c.init.from.value_or(""), "gpt2.h5");
  ASSERT_EQ(c.freeze.size(), 2u);
  const Config again = parse(c.to_json_string(0));
  EXPECT_EQ(again.init.from.value_or(""), "gpt2.h5");
  EXPECT_EQ(again.freeze, c.freeze);
}

TEST(ConfigInitFreeze, PatternsMatchWholeNames) {
  EXPECT_TRUE(zt::freeze_pattern_matches("wte.*", "wte.weight"));
  EXPECT_TRUE(zt::freeze_pattern_matches("h.0.*", "h.0.attn.qkv.weight"));  // '*' crosses dots
  EXPECT_FALSE(zt::freeze_pattern_matches("h.0.*", "h.10.attn.qkv.weight"));
  EXPECT_TRUE(zt::freeze_pattern_matches("*.bias", "h.3.mlp.fc.bias"));
  EXPECT_FALSE(zt::freeze_pattern_matches("wte", "wte.weight"));  // the whole name
  EXPECT_TRUE(zt::freeze_pattern_matches("re:h\\.[0-2]\\..*", "h.2.ln1.weight"));
  EXPECT_FALSE(zt::freeze_pattern_matches("re:h\\.[0-2]", "h.2.ln1.weight"));  // regex_match: the whole name
  EXPECT_EQ(zt::freeze_pattern_problem("re:("),
            "\"re:(\" is not a valid regular expression (" +
                std::string(std::regex_error(std::regex_constants::error_paren).what()) + ")");
}

TEST(ConfigInitFreeze, Errors) {
  EXPECT_CONTAINS(parse_error(R"({"init": {"form": "x.h5"}})"),
                  "init.form: unknown key; did you mean 'from'?");
  EXPECT_CONTAINS(parse_error(R"({"init": {"from": ""}})"), "init.from: expected the path of a weights file");
  EXPECT_CONTAINS(parse_error(R"({"init": {"from": 3}})"), "init.from: expected a string");
  EXPECT_CONTAINS(parse_error(R"({"init": "x.h5"})"), "init: expected a JSON object");
  EXPECT_CONTAINS(parse_error(R"({"freeze": "wte.*"})"),
                  "freeze: expected a list of parameter-name patterns");
  EXPECT_CONTAINS(parse_error(R"({"freeze": ["wte.*", 3]})"),
                  "freeze[1]: expected a non-empty pattern string");
  EXPECT_CONTAINS(parse_error(R"({"freeze": [""]})"), "freeze[0]: expected a non-empty pattern string");
  EXPECT_CONTAINS(parse_error(R"({"freeze": ["re:"]})"), "freeze[0]: \"re:\" needs a regular expression");
  EXPECT_CONTAINS(parse_error(R"({"freeze": ["re:h.(0"]})"), "is not a valid regular expression");
}

TEST(ConfigWarnings, DeprecatedForms) {
  const Config legacy = parse(R"({"zero_optimization": true})");
  EXPECT_EQ(legacy.zero_optimization.stage, 1);
  ASSERT_EQ(legacy.warnings().size(), 1u);
  EXPECT_CONTAINS(legacy.warnings()[0], "the boolean form is deprecated");

  const Config cpu_offload = parse(R"({"zero_optimization": {"stage": 2, "cpu_offload": true}})");
  EXPECT_EQ(cpu_offload.zero_optimization.offload_optimizer.device, zt::OffloadDevice::cpu);
  ASSERT_EQ(cpu_offload.warnings().size(), 1u);
  EXPECT_CONTAINS(cpu_offload.warnings()[0], "zero_optimization.cpu_offload: deprecated");
}

TEST(ConfigWarnings, HysteresisIsNotUsedAtStageZero) {
  // DeepSpeed's stage-0 FP16_Optimizer halves on every overflow: a given hysteresis is said to be unused.
  const Config stage0 =
      parse(R"({"fp16": {"enabled": true, "hysteresis": 4, "consecutive_hysteresis": true}})");
  ASSERT_EQ(stage0.warnings().size(), 2u);
  EXPECT_CONTAINS(stage0.warnings()[0], "fp16.hysteresis: not used at ZeRO stage 0");
  EXPECT_CONTAINS(stage0.warnings()[1], "fp16.consecutive_hysteresis: not used at ZeRO stage 0");
  EXPECT_TRUE(parse(R"({"fp16": {"enabled": true}})").warnings().empty());  // the default says nothing
  EXPECT_TRUE(parse(R"({"fp16": {"enabled": true, "hysteresis": 4}, "zero_optimization": {"stage": 1}})")
                  .warnings()
                  .empty());
}

TEST(ConfigWarnings, SinkReceivesEachWarningOnce) {
  std::vector<std::string> lines;
  zt::ConfigParseOptions options;
  options.warning_sink = [&lines](std::string_view line) { lines.emplace_back(line); };
  const Config c = Config::from_string(R"({"zero_optimization": {"stgae": 2}})", options);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0],
            "zerotrain: warning: config string: zero_optimization.stgae: unknown key; did you mean 'stage'? "
            "(ignored)");
  EXPECT_EQ(c.warnings().size(), 1u);

  // Warnings found before an error still reach the sink: they often explain it.
  lines.clear();
  EXPECT_THROW(
      Config::from_string(R"({"optimizer": {"type": "Adam", "params": {"lrr": 1}}, "fp16": {"enabled": 1}})",
                          options),
      ConfigError);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_CONTAINS(lines[0], "optimizer.params.lrr: unknown key; did you mean 'lr'?");
}

TEST(ConfigWarnings, EditDistanceSuggestsOnlyNearKeys) {
  // One transposition or one missing letter is a typo; an unrelated word is not.
  EXPECT_CONTAINS(parse(R"({"zero_optimization": {"overlapcomm": true}})").warnings().at(0),
                  "did you mean 'overlap_comm'?");
  EXPECT_CONTAINS(parse(R"({"fp16": {"Enabled": true}})").warnings().at(0), "did you mean 'enabled'?");
  EXPECT_EQ(parse(R"({"fp16": {"xyz": true}})").warnings().at(0), "fp16.xyz: unknown key (ignored)");
}

// ---- the batch rule (DeepSpeed's runtime/test_ds_config_dict.py, world size 2) ---------------------

std::string batch_json(std::optional<int> tb, std::optional<int> mb, std::optional<int> gas) {
  std::string text = "{";
  auto add = [&text](const char* key, std::optional<int> value) {
    if (!value) return;
    if (text.size() > 1) text += ", ";
    // Appended piece by piece: GCC 12's -Wrestrict misfires on "literal" + std::string&& (GCC bug 105329).
    text.append("\"").append(key).append("\": ").append(std::to_string(*value));
  };
  add("train_batch_size", tb);
  add("train_micro_batch_size_per_gpu", mb);
  add("gradient_accumulation_steps", gas);
  return text + "}";
}

struct BatchCase {
  std::optional<int> tb, mb, gas;
  std::int64_t expected_tb, expected_mb, expected_gas;
};

TEST(ConfigBatch, ValidCombinationsAtWorldSizeTwo) {
  const std::vector<BatchCase> cases = {
      {32, 16, 1, 32, 16, 1},                       // all three, consistent
      {32, 8, 2, 32, 8, 2},                         // all three, consistent
      {32, 16, std::nullopt, 32, 16, 1},            // tb, mb -> gas = 32 / 2 / 16
      {32, 8, std::nullopt, 32, 8, 2},              // tb, mb -> gas = 32 / 2 / 8
      {32, std::nullopt, 2, 32, 8, 2},              // tb, gas -> mb = 32 / 2 / 2
      {std::nullopt, 8, 2, 32, 8, 2},               // mb, gas -> tb = 8 * 2 * 2
      {32, std::nullopt, std::nullopt, 32, 16, 1},  // tb only -> gas 1, mb = 32 / 2
      {std::nullopt, 16, std::nullopt, 32, 16, 1},  // mb only -> gas 1, tb = 16 * 2
  };
  for (const BatchCase& c : cases) {
    const std::string text = batch_json(c.tb, c.mb, c.gas);
    Config config = parse(text);
    const zt::BatchSizes& b = config.resolve_batch(2);
    EXPECT_EQ(b.train_batch_size, c.expected_tb) << text;
    EXPECT_EQ(b.train_micro_batch_size_per_gpu, c.expected_mb) << text;
    EXPECT_EQ(b.gradient_accumulation_steps, c.expected_gas) << text;
    EXPECT_EQ(b.data_parallel_size, 2) << text;
    EXPECT_EQ(&config.batch(), &b);
  }
}

TEST(ConfigBatch, MismatchNamesTheThreeKeysAndTheSize) {
  EXPECT_CONTAINS(
      batch_error(batch_json(33, 17, 2), 2),
      "train_batch_size (33) != train_micro_batch_size_per_gpu (17) * gradient_accumulation_steps (2) "
      "* data-parallel size (2) = 68");
  EXPECT_CONTAINS(
      batch_error(batch_json(32, 18, 1), 2),
      "train_batch_size (32) != train_micro_batch_size_per_gpu (18) * gradient_accumulation_steps (1) "
      "* data-parallel size (2) = 36");
  // Derived values that do not multiply back fail the same check (DeepSpeed's integer division).
  EXPECT_CONTAINS(
      batch_error(batch_json(33, std::nullopt, std::nullopt), 2),
      "train_batch_size (33) != train_micro_batch_size_per_gpu (16) * gradient_accumulation_steps (1) "
      "* data-parallel size (2) = 32");
  EXPECT_CONTAINS(
      batch_error(batch_json(32, 6, std::nullopt), 2),
      "train_batch_size (32) != train_micro_batch_size_per_gpu (6) * gradient_accumulation_steps (2) "
      "* data-parallel size (2) = 24");
}

TEST(ConfigBatch, IntegerDivisionToZeroIsReported) {
  EXPECT_CONTAINS(batch_error(batch_json(1, std::nullopt, std::nullopt), 2),
                  "train_micro_batch_size_per_gpu must be > 0, got 0 (derived as train_batch_size (1) / "
                  "data-parallel size (2)");
  EXPECT_CONTAINS(batch_error(batch_json(4, 8, std::nullopt), 2),
                  "gradient_accumulation_steps must be > 0, got 0 (derived as train_batch_size (4) / "
                  "data-parallel size (2) / train_micro_batch_size_per_gpu (8)");
  EXPECT_CONTAINS(batch_error(batch_json(8, std::nullopt, 8), 2),
                  "train_micro_batch_size_per_gpu must be > 0, got 0");
}

TEST(ConfigBatch, OnlyGradientAccumulationOrNothing) {
  EXPECT_CONTAINS(batch_error(batch_json(std::nullopt, std::nullopt, 4), 2),
                  "either train_batch_size or train_micro_batch_size_per_gpu must be given (only "
                  "gradient_accumulation_steps is)");
  EXPECT_CONTAINS(batch_error("{}", 2),
                  "either train_batch_size or train_micro_batch_size_per_gpu must be given");
}

TEST(ConfigBatch, ResolveAgainUsesTheGivenValues) {
  Config config = parse(batch_json(32, std::nullopt, std::nullopt));
  EXPECT_EQ(config.resolve_batch(2).train_micro_batch_size_per_gpu, 16);
  EXPECT_EQ(config.resolve_batch(4).train_micro_batch_size_per_gpu, 8);
  EXPECT_EQ(config.batch().data_parallel_size, 4);
  EXPECT_FALSE(config.train_micro_batch_size_per_gpu);  // still as given
}

TEST(ConfigBatch, ErrorsWithoutResolutionAndForBadSizes) {
  const Config config = parse(batch_json(32, std::nullopt, std::nullopt));
  EXPECT_THROW(config.batch(), ConfigError);
  EXPECT_CONTAINS(batch_error(batch_json(32, std::nullopt, std::nullopt), 0),
                  "data-parallel size must be positive");
  const Config resolved = Config::from_string(batch_json(32, 8, std::nullopt), 4, {.warning_sink = {}});
  EXPECT_EQ(resolved.batch().gradient_accumulation_steps, 1);
}

// ---- round trip ------------------------------------------------------------------------------------

constexpr const char* kFullConfig = R"({
  "train_batch_size": 64, "gradient_accumulation_steps": 4, "gradient_clipping": 0.5, "steps_per_print": 10,
  "communication_data_type": "fp16", "managed_gradient_accumulation": false, "seed": 42,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-6, "weight_decay": 0.1}},
  "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-5, "cycle_max_lr": 3e-4,
                "cycle_second_step_size": 500, "decay_step_size": 100, "decay_lr_rate": 0.01}},
  "fp16": {"enabled": true, "initial_scale_power": 12, "loss_scale_window": 500, "hysteresis": 1,
           "consecutive_hysteresis": true, "min_loss_scale": 0.5},
  "zero_optimization": {"stage": 3, "overlap_comm": false, "reduce_bucket_size": 2e8, "allgather_bucket_size": 1000,
                        "stage3_param_persistence_threshold": 10, "sub_group_size": 100,
                        "offload_optimizer": {"device": "cpu", "ratio": 0.25},
                        "offload_param": {"device": "nvme", "nvme_path": "/nvme", "max_in_cpu": 1000}},
  "aio": {"block_size": 262144, "queue_depth": 16, "intra_op_parallelism": 2, "use_gds": true},
  "checkpoint": {"tag_validation": "Ignore", "load_universal": true, "save_dir": "/ckpt", "save_interval": 50,
                 "keep_last": 2, "file_mode": "0600"},
  "data_types": {"grad_accum_dtype": "fp16"},
  "pipeline": {"stages": 2, "partition": "uniform"},
  "model": {"type": "gpt", "n_layer": 2, "n_head": 4, "d_model": 64, "seq_len": 32, "vocab_size": 100,
            "tie_embeddings": false, "dropout": 0.1},
  "data": {"path": "/data/x.txt", "format": "text", "seed": 3}
})";

void expect_same_values(const Config& a, const Config& b) {
  EXPECT_EQ(a.to_json_string(), b.to_json_string());
  EXPECT_EQ(a.train_batch_size, b.train_batch_size);
  EXPECT_EQ(a.gradient_clipping, b.gradient_clipping);
  EXPECT_EQ(a.steps_per_print, b.steps_per_print);
  EXPECT_EQ(a.communication_data_type, b.communication_data_type);
  EXPECT_EQ(a.seed, b.seed);
  EXPECT_EQ(a.optimizer->lr, b.optimizer->lr);
  EXPECT_EQ(a.optimizer->betas, b.optimizer->betas);
  EXPECT_EQ(a.fp16.min_loss_scale, b.fp16.min_loss_scale);
  EXPECT_EQ(a.zero_optimization.stage3_max_live_parameters, b.zero_optimization.stage3_max_live_parameters);
  EXPECT_EQ(a.zero_optimization.offload_param.nvme_path, b.zero_optimization.offload_param.nvme_path);
  EXPECT_EQ(a.zero_optimization.offload_optimizer.ratio, b.zero_optimization.offload_optimizer.ratio);
  EXPECT_EQ(a.checkpoint.file_mode, b.checkpoint.file_mode);
  EXPECT_EQ(a.pipeline.stages, b.pipeline.stages);
}

TEST(ConfigRoundTrip, EffectiveConfigParsesToTheSameValues) {
  const Config original = parse(kFullConfig);
  EXPECT_TRUE(original.warnings().empty()) << original.warnings().at(0);
  const Config again = parse(original.to_json_string());
  EXPECT_TRUE(again.warnings().empty()) << again.warnings().at(0);
  expect_same_values(original, again);
  EXPECT_EQ(again.zero_optimization.offload_param.max_in_cpu, 1000);
  EXPECT_EQ(std::get<zt::OneCycleParams>(again.scheduler->params).cycle_second_step_size, 500);
  EXPECT_EQ(std::get<zt::GptModelConfig>(*again.model).tie_embeddings, false);
  EXPECT_EQ(again.data->format, zt::DataFormat::text);
}

TEST(ConfigRoundTrip, DefaultsAndEachSchedulerAndModel) {
  for (
      const char* text : {
          "{}",
          R"({"optimizer": {"type": "SGD", "params": {"momentum": 0.9}}, "bf16": {"enabled": true}})",
          R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 0.01, "warmup_type": "linear"}}})",
          R"({"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 2000}}})",
          R"({"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 2000}}})",
          R"({"scheduler": {"type": "LRRangeTest", "params": {"lr_range_test_staircase": true}}})",
          R"({"model": {"type": "mlp", "sizes": [3, 5, 2]}, "data": {"format": "synthetic"}})",
      }) {
    const Config original = parse(text);
    const Config again = parse(original.to_json_string());
    EXPECT_TRUE(again.warnings().empty()) << text << ": " << again.warnings().at(0);
    EXPECT_EQ(original.to_json_string(), again.to_json_string()) << text;
  }
}

TEST(ConfigRoundTrip, ResolvedBatchIsWrittenOut) {
  Config config = parse(batch_json(32, std::nullopt, std::nullopt));
  config.resolve_batch(2);
  Config again = parse(config.to_json_string());
  EXPECT_EQ(again.train_batch_size, 32);
  EXPECT_EQ(again.train_micro_batch_size_per_gpu, 16);
  EXPECT_EQ(again.gradient_accumulation_steps, 1);
  EXPECT_EQ(again.resolve_batch(2).train_batch_size, 32);
}

TEST(ConfigSummary, MentionsTheEssentials) {
  Config config = parse(kFullConfig);
  config.resolve_batch(4);
  const std::string summary = config.summary();
  EXPECT_CONTAINS(summary, "batch: 64 = micro 4 x accumulation 4 x data-parallel 4");
  EXPECT_CONTAINS(summary, "fp16, dynamic loss scale 2^12");
  EXPECT_CONTAINS(summary, "zero: stage 3");
  EXPECT_CONTAINS(summary, "optimizer offload cpu");
  EXPECT_CONTAINS(summary, "AdamW lr 0.0003");
  EXPECT_CONTAINS(summary, "scheduler: OneCycle");
}

TEST(ConfigRaw, KeepsTheDocumentAsGiven) {
  const Config config = parse(R"({"zero_optimization": {"stage": 2, "custom": [1, 2]}})");
  EXPECT_EQ(config.raw_json(), R"({"zero_optimization":{"custom":[1,2],"stage":2}})");
  EXPECT_EQ(config.source(), "<string>");
}

// ---- files -----------------------------------------------------------------------------------------

TEST(ConfigFile, ReadsAFileAndResolves) {
  TempDir dir;
  const auto path = dir.write("ds.json", batch_json(32, 8, std::nullopt));
  const Config config = Config::from_file(path, 2, {.warning_sink = {}});
  EXPECT_EQ(config.batch().gradient_accumulation_steps, 2);
  EXPECT_EQ(config.source(), path.string());
}

TEST(ConfigFile, MissingFileIsNamed) {
  TempDir dir;
  const auto path = dir.path() / "nope.json";
  try {
    Config::from_file(path);
    FAIL() << "no error for a missing file";
  } catch (const ConfigError& error) {
    EXPECT_CONTAINS(std::string(error.what()), "config file '" + path.string() + "': cannot open");
  }
  try {
    Config::from_file(dir.path());
    FAIL() << "no error for a directory";
  } catch (const ConfigError& error) {
    EXPECT_CONTAINS(std::string(error.what()), "is a directory");
  }
}

TEST(ConfigFile, InvalidJsonNamesFileAndLine) {
  TempDir dir;
  const auto path = dir.write("bad.json", "{\n  \"train_batch_size\": 8,\n  \"fp16\": {enabled: true}\n}\n");
  try {
    Config::from_file(path);
    FAIL() << "no error for invalid JSON";
  } catch (const ConfigError& error) {
    const std::string message = error.what();
    EXPECT_CONTAINS(message, "config file '" + path.string() + "': invalid JSON");
    EXPECT_CONTAINS(message, "line 3");
    EXPECT_CONTAINS(message, "column");
  }
}

TEST(ConfigFile, ValidationErrorsNameTheFile) {
  TempDir dir;
  const auto path = dir.write("stage.json", R"({"zero_optimization": {"stage": 5}})");
  try {
    Config::from_file(path);
    FAIL() << "no error for stage 5";
  } catch (const ConfigError& error) {
    EXPECT_CONTAINS(
        std::string(error.what()),
        "config file '" + path.string() + "': zero_optimization.stage: expected an integer in 0..3, got 5");
  }
}

TEST(ConfigFile, ExampleConfigsParseWithoutWarnings) {
  const std::filesystem::path examples = std::filesystem::path(ZT_SOURCE_ROOT) / "examples" / "configs";
  ASSERT_TRUE(std::filesystem::is_directory(examples)) << examples;
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(examples)) {
    if (entry.path().extension() != ".json") continue;
    SCOPED_TRACE(entry.path().string());
    Config config = Config::from_file(entry.path(), {.warning_sink = {}});
    EXPECT_TRUE(config.warnings().empty()) << config.warnings().at(0);
    EXPECT_NO_THROW(config.resolve_batch(2));
    ++count;
  }
  EXPECT_GE(count, 2);
}

}  // namespace

// ---- the document's shape: depth and repeated keys ---------------------------------------------

TEST(ConfigDocumentShape, DeepNestingIsAnErrorNotACrash) {
  // 200000 nested arrays overflowed the stack in the JSON library's recursive serializer.
  const std::string arrays = std::string(200000, '[') + std::string(200000, ']');
  EXPECT_CONTAINS(parse_error(arrays), "nesting deeper than 64 levels at line 1, column 65");
  std::string objects;
  for (int i = 0; i < 100000; ++i) objects += R"({"a": )";
  objects += "1" + std::string(100000, '}');
  EXPECT_CONTAINS(parse_error(objects), "config string: a.a.a.a.a.a.a.a");
  EXPECT_CONTAINS(parse_error(objects), "...: nesting deeper than 64 levels");
  // 64 levels are accepted (the top-level object and 63 arrays; an unknown key, a warning).
  const Config deepest = parse(R"({"x": )" + std::string(63, '[') + std::string(63, ']') + "}");
  EXPECT_EQ(deepest.warnings().size(), 1u);
  EXPECT_CONTAINS(parse_error(R"({"x": )" + std::string(64, '[') + std::string(64, ']') + "}"),
                  "config string: x[0][0]");
}

TEST(ConfigDocumentShape, NumbersBeyondDoubleAreConfigErrors) {
  // The JSON library throws out_of_range for them, which escaped as a fatal non-config error.
  EXPECT_CONTAINS(parse_error("{\n  \"train_batch_size\": 1e400}"),
                  "config string: invalid JSON: number overflow parsing '1e400' at line 2, column");
}

TEST(ConfigDocumentShape, RepeatedKeysAreErrorsNamingBothPositions) {
  EXPECT_CONTAINS(parse_error("{\n  \"zero_optimization\": {\"stage\": 2},\n  \"train_batch_size\": 4,\n"
                              "  \"zero_optimization\": {\"stage\": 0}\n}\n"),
                  "config string: zero_optimization: duplicate key 'zero_optimization' at line 4, column 3 "
                  "(first at line 2, column 3)");
  EXPECT_CONTAINS(
      parse_error(R"({"optimizer": {"type": "Adam", "params": {"lr": 1, "l\"r": 2, "lr": 3}}})"),
      "optimizer.params.lr: duplicate key 'lr' at line 1, column 63 (first at line 1, column 43)");
  EXPECT_CONTAINS(parse_error(R"({"pipeline": {"stages": 1}, "x": [{"k": 1}, {"k": 2, "k": 3}]})"),
                  "x[1].k: duplicate key 'k'");
  // The same key in different objects, or in the elements of an array, is no repetition.
  EXPECT_NO_THROW(
      parse(R"({"fp16": {"enabled": false}, "bf16": {"enabled": false}, "x": [{"k": 1}, {"k": 2}]})"));
}

// ---- eval: the validation loss (docs/config.md, "eval") ------------------------------------------

TEST(ConfigEval, KeysDefaultsAndRoundTrip) {
  EXPECT_FALSE(parse("{}").eval.has_value());
  const Config defaults = parse(R"({"eval": {}})");
  ASSERT_TRUE(defaults.eval.has_value());
  EXPECT_FALSE(defaults.eval->data.has_value());
  EXPECT_EQ(defaults.eval->interval, 0);
  EXPECT_EQ(defaults.eval->batches, 10);
  const Config c = parse(R"({"eval": {"data": "val.bin", "interval": 50, "batches": 4}})");
  EXPECT_EQ(c.eval->data, "val.bin");
  EXPECT_EQ(c.eval->interval, 50);
  EXPECT_EQ(c.eval->batches, 4);
  const Config again = parse(c.to_json_string());
  EXPECT_TRUE(again.warnings().empty());
  EXPECT_EQ(again.eval->data, "val.bin");
  EXPECT_EQ(again.eval->interval, 50);
  EXPECT_EQ(again.eval->batches, 4);
  EXPECT_FALSE(parse(parse("{}").to_json_string()).eval.has_value());
}

TEST(ConfigEval, BadValuesAreRefusedNamingTheKey) {
  EXPECT_CONTAINS(parse_error(R"({"eval": {"batches": 0}})"), "eval.batches");
  EXPECT_CONTAINS(parse_error(R"({"eval": {"interval": -1}})"), "eval.interval");
  EXPECT_CONTAINS(parse_error(R"({"eval": {"interval": 2.5}})"), "eval.interval");
  EXPECT_CONTAINS(parse_error(R"({"eval": {"data": ""}})"), "eval.data: expected a data path");
  EXPECT_CONTAINS(parse_error(R"({"eval": {"data": 3}})"), "eval.data");
  EXPECT_CONTAINS(parse_error(R"({"eval": 5})"), "eval");
  const Config typo = parse(R"({"eval": {"intervall": 5}})");
  ASSERT_EQ(typo.warnings().size(), 1U);
  EXPECT_EQ(typo.warnings()[0], "eval.intervall: unknown key; did you mean 'interval'? (ignored)");
}

// ---- comm.timeout_s: the watchdog's collective timeout -----------------------------------------

TEST(ConfigComm, TimeoutIsReadAndRoundTrips) {
  EXPECT_FALSE(parse("{}").comm.timeout_s.has_value());
  EXPECT_EQ(parse(R"({"comm": {"timeout_s": 4}})").comm.timeout_s, 4.0);
  EXPECT_EQ(parse(R"({"comm": {"timeout_s": 2.5}})").comm.timeout_s, 2.5);
  EXPECT_EQ(parse(R"({"comm": {"timeout_s": 0}})").comm.timeout_s, 0.0);
  EXPECT_EQ(parse(R"({"comm": {"timeout_s": "off"}})").comm.timeout_s, 0.0);
  const Config four = parse(R"({"comm": {"timeout_s": 4}})");
  EXPECT_EQ(parse(four.to_json_string()).comm.timeout_s, 4.0);
  EXPECT_TRUE(parse(four.to_json_string()).warnings().empty());
}

TEST(ConfigComm, TimeoutOutOfRangeIsRefusedNamingTheBound) {
  EXPECT_CONTAINS(
      parse_error(R"({"comm": {"timeout_s": 0.001}})"),
      "comm.timeout_s: 0.001 s is below the minimum of 1 s (a healthy job would be reported as hung); "
      "expected 0 or \"off\" (no watchdog) or 1 to 1e+09 seconds");
  EXPECT_CONTAINS(parse_error(R"({"comm": {"timeout_s": 1e-300}})"),
                  "comm.timeout_s: 1e-300 s is below the minimum of 1 s");
  EXPECT_CONTAINS(parse_error(R"({"comm": {"timeout_s": 1e300}})"),
                  "comm.timeout_s: 1e+300 s is above the maximum of 1e+09 s");
  EXPECT_CONTAINS(parse_error(R"({"comm": {"timeout_s": "never"}})"),
                  "comm.timeout_s: expected a number of seconds, or \"off\", got \"never\"");
  EXPECT_CONTAINS(parse_error(R"({"comm": {"timeout_s": true}})"), "comm.timeout_s: expected a number >= 0");
}

TEST(ConfigComm, TimeoutBoundIsTheWatchdogs) {
  EXPECT_EQ(zt::collective_timeout_problem(0.0), "");
  EXPECT_EQ(zt::collective_timeout_problem(zt::kMinimumCollectiveTimeoutSeconds), "");
  EXPECT_EQ(zt::collective_timeout_problem(zt::kMaximumCollectiveTimeoutSeconds), "");
  for (double bad :
       {0.5, -1.0, 1e-300, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
        -std::numeric_limits<double>::infinity(), 2e9}) {
    EXPECT_NE(zt::collective_timeout_problem(bad), "") << bad;
  }
}
