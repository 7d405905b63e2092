// Parsing and validation of the configuration. Defaults and rules follow DeepSpeed's code (see
// /work/shared/reference/deepspeed-semantics.md §1 and docs/config.md); messages name JSON paths.
#include "zerotrain/config.hpp"

#include <fnmatch.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <fstream>
#include <iostream>
#include <regex>
#include <sstream>

#include "base/permission_bits.hpp"
#include "base/text.hpp"
#include "src/config/json_reader.hpp"
#include "src/config/zero_partitioning.hpp"
#include "zerotrain/watchdog.hpp"

namespace zt {

using config_detail::IntRange;
using config_detail::json;
using config_detail::kNonNegative;
using config_detail::kNonNegativeNumber;
using config_detail::kPositive;
using config_detail::kPositiveNumber;
using config_detail::kUnitInterval;
using config_detail::NumberRange;
using config_detail::ParseContext;
using config_detail::render;
using config_detail::Section;

namespace {

std::string lowercase(std::string_view text) {
  std::string result(text);
  std::transform(result.begin(), result.end(), result.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return result;
}

std::string source_label(const std::string& source) {
  return source == "<string>" ? std::string("config string") : "config file '" + source + "'";
}

/// fp32 | fp16 | bf16 (and the long spellings DeepSpeed also accepts), or absent.
std::optional<DType> read_float_dtype(Section& section, std::string_view key) {
  if (!section.has(key)) return std::nullopt;
  return section.choice<DType>(key, DType::fp32,
                               {{"fp32", DType::fp32},
                                {"float32", DType::fp32},
                                {"float", DType::fp32},
                                {"fp16", DType::fp16},
                                {"float16", DType::fp16},
                                {"half", DType::fp16},
                                {"bf16", DType::bf16},
                                {"bfloat16", DType::bf16}},
                               /*case_insensitive=*/true);
}

/// Whether a DeepSpeed feature section/flag turns the feature on: true, a non-zero number, or an
/// object without "enabled": false. Absent, null, false, {} and {"enabled": false} are off.
bool feature_enabled(const json* value) {
  if (value == nullptr || value->is_null()) return false;
  if (value->is_boolean()) return value->get<bool>();
  if (value->is_number()) return value->get<double>() != 0.0;
  if (value->is_object()) {
    if (value->empty()) return false;
    auto enabled = value->find("enabled");
    if (enabled != value->end()) return !(enabled->is_boolean() && !enabled->get<bool>());
    return true;
  }
  return true;
}

enum class Policy { reject, ignore_with_warning };

struct UnsupportedFeature {
  std::string_view key;
  Policy policy;
  std::string_view reason;
  /// Decides whether the value turns the feature on; defaults to feature_enabled().
  bool (*enabled)(const json*) = feature_enabled;
};

void check_unsupported(Section& section, std::initializer_list<UnsupportedFeature> features) {
  for (const UnsupportedFeature& feature : features) {
    const json* value = section.find(feature.key);
    if (!feature.enabled(value)) continue;
    if (feature.policy == Policy::reject) {
      section.fail(feature.key,
                   "DeepSpeed feature not supported by zerotrain: " + std::string(feature.reason) +
                       ". Remove it (or disable it) to run with zerotrain.");
    }
    section.context().warn(section.path_of(feature.key) +
                           ": DeepSpeed feature not supported by zerotrain; ignored (" +
                           std::string(feature.reason) + ")");
  }
}

/// Reads a key that DeepSpeed also accepts under a second name (pydantic alias or rename).
template <typename Read>
auto read_aliased(Section& section, std::string_view name, std::string_view alias, Read read) {
  const bool has_name = section.has(name);
  const bool has_alias = section.has(alias);
  if (has_name && has_alias) {
    section.fail(alias, "'" + std::string(alias) + "' and '" + std::string(name) +
                            "' name the same setting; give only '" + std::string(name) + "'");
  }
  return read(has_alias ? alias : name);
}

std::uint32_t read_permission_bits(Section& section, std::string_view key, std::uint32_t fallback) {
  const json* value = section.find(key);
  if (value == nullptr) return fallback;
  const std::string_view expected = "an octal permission string such as \"0640\"";
  if (!value->is_string()) section.type_error(key, *value, expected);
  const std::string& text = value->get_ref<const std::string&>();
  if (text.size() < 3 || text.size() > 4 ||
      !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '7'; })) {
    section.type_error(key, *value, expected);
  }
  const auto mode = static_cast<std::uint32_t>(std::stoul(text, nullptr, 8));
  const std::string problem = base::permission_bits_problem(mode, key == "dir_mode");
  if (!problem.empty())
    section.fail(key, render(*value) + " " + problem +
                          "; expected permission bits such as \"0640\" (files) or \"0750\" (directories)");
  return mode;
}

// ---- keys without a Config member ----------------------------------------------------------------
// DeepSpeed keys that zerotrain accepts so that DeepSpeed configs (and the configs stored in older
// checkpoints) parse, but that no code reads. Each is validated like any other key; then either it
// is ignored, where honouring it could not change the training (how DeepSpeed stores or
// communicates, its logging), or its default is accepted and any other value refused, where
// ignoring that value would change the training or break the user's expectation silently.
// docs/config.md, "Accepted and ignored", lists them with the reasons.

/// Accepts `fallback`; any other value is an error saying why zerotrain does not honour it.
void refuse_unless_default(Section& section, std::string_view key, bool fallback, std::string_view why) {
  if (section.boolean(key, fallback) == fallback) return;
  section.fail(key, std::string(fallback ? "false" : "true") + " is not supported by zerotrain: " +
                        std::string(why) + "; remove the key or set it to " + (fallback ? "true" : "false"));
}

constexpr std::string_view kSupportedOptimizers = "Adam, AdamW, SGD";
constexpr std::string_view kSupportedSchedulers =
    "WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest";

}  // namespace

/// Fills a Config from a parsed document. A friend of Config, so it can set the private members.
class ConfigParser {
 public:
  /// Parse `text` (from `source`: a file path or "<string>") and report warnings to the sink.
  static Config parse_text(std::string_view text, std::string source, const ConfigParseOptions& options);

  static void parse(Config& config, const json& document, ParseContext& context) {
    Section top(&document, "", context);
    parse_top_level(config, top);
    parse_optimizer(config, top.child("optimizer"));
    parse_scheduler(config, top.child("scheduler"));
    parse_zero(config, top);
    parse_fp16(config, top.child("fp16"));
    parse_bf16(config, top);
    parse_aio(config, top.child("aio"));
    parse_activation_checkpointing(config, top.child("activation_checkpointing"));
    parse_checkpoint(config, top.child("checkpoint"));
    parse_pipeline(config, top.child("pipeline"));
    parse_model(config, top.child("model"));
    parse_data(config, top.child("data"));
    parse_eval(config, top.child("eval"));
    parse_monitor(config.tensorboard, top.child("tensorboard"));
    parse_monitor(config.csv_monitor, top.child("csv_monitor"));
    parse_alerts(config, top.child("alerts"));
    parse_comm(config, top.child("comm"));
    parse_init(config, top.child("init"));
    parse_freeze(config, top);
    check_across_sections(config, top);
    parse_data_types(config, top.child("data_types"));  // after fp16/bf16 are known to agree
    top.finish();
  }

 private:
  static void parse_top_level(Config& c, Section& top) {
    c.train_batch_size = top.optional_integer("train_batch_size", kPositive);
    c.train_micro_batch_size_per_gpu = top.optional_integer("train_micro_batch_size_per_gpu", kPositive);
    c.gradient_accumulation_steps = top.optional_integer("gradient_accumulation_steps", kPositive);
    c.gradient_clipping = top.number("gradient_clipping", 1.0, kNonNegativeNumber);
    c.steps_per_print = top.optional_integer("steps_per_print", kPositive);
    c.device = top.choice<DeviceChoice>(
        "device", DeviceChoice::automatic,
        {{"auto", DeviceChoice::automatic}, {"cuda", DeviceChoice::cuda}, {"host", DeviceChoice::host}});
    // DeepSpeed's diagnostics: validated here, warned about below when switched on.
    for (std::string_view key : {"wall_clock_breakdown", "memory_breakdown", "dump_state"}) {
      (void)top.boolean(key, false);
    }
    // The reduction divides the summed gradients by the data-parallel size once (gradient_allreduce_op
    // "mean"); DeepSpeed's scaling before the sum gives other roundings and 16-bit overflows.
    refuse_unless_default(top, "prescale_gradients", false,
                          "gradients are averaged after the sum, not scaled before it");
    if (const double factor = top.number("gradient_predivide_factor", 1.0, kPositiveNumber); factor != 1.0) {
      top.fail("gradient_predivide_factor",
               render(*top.find("gradient_predivide_factor")) +
                   " is not supported by zerotrain: gradients are averaged after the sum, not divided "
                   "before it; remove the key or set it to 1.0");
    }
    c.gradient_allreduce_op =
        top.choice<GradientReduceOp>("gradient_allreduce_op", GradientReduceOp::mean,
                                     {{"mean", GradientReduceOp::mean}, {"sum", GradientReduceOp::sum}},
                                     /*case_insensitive=*/true);
    c.communication_data_type = read_float_dtype(top, "communication_data_type");
    c.managed_gradient_accumulation = top.boolean("managed_gradient_accumulation", true);
    refuse_unless_default(top, "dataloader_drop_last", false,
                          "the training data is one endless stream of epochs (docs/data.md): no batch is "
                          "incomplete and none is dropped");
    c.seed = static_cast<std::uint64_t>(top.integer("seed", 1234, kNonNegative));

    // DeepSpeed switches about its own optimizer choice; zerotrain's optimizers are all its own.
    top.boolean("zero_allow_untested_optimizer", false);
    top.boolean("zero_force_ds_cpu_optimizer", true);

    check_unsupported(
        top,
        {
            {"elasticity", Policy::reject, "elastic training overrides the batch sizes"},
            {"amp", Policy::reject, "NVIDIA Apex AMP; use \"fp16\" or \"bf16\""},
            {"torch_autocast", Policy::reject, "torch.autocast mixed precision; use \"fp16\" or \"bf16\""},
            {"zenflow", Policy::reject, "ZenFlow changes when optimizer updates are applied"},
            {"compression_training", Policy::reject, "compression changes the model"},
            {"quantize_training", Policy::reject, "quantization changes the model"},
            {"weight_quantization", Policy::reject, "quantization changes the model"},
            {"progressive_layer_drop", Policy::reject, "layer dropping changes the training"},
            {"curriculum_learning", Policy::reject, "curriculum learning changes the data order and lengths"},
            {"data_efficiency", Policy::reject, "data sampling/routing changes the training"},
            {"sparse_attention", Policy::reject, "sparse attention changes the model"},
            {"hybrid_engine", Policy::reject, "the RLHF hybrid engine"},
            {"sequence_parallel_size", Policy::reject,
             "sequence parallelism (it would change the data-parallel size)",
             [](const json* v) { return v != nullptr && !(v->is_number() && v->get<double>() == 1.0); }},
            {"tensor_parallel", Policy::reject, "tensor parallelism (AutoTP)",
             [](const json* v) {
               if (v == nullptr || !v->is_object()) return feature_enabled(v);
               auto size = v->find("autotp_size");
               return size != v->end() && size->is_number() && size->get<double>() > 1.0;
             }},
            {"sparse_gradients", Policy::ignore_with_warning,
             "gradients are reduced densely, with the same result"},
            {"wall_clock_breakdown", Policy::ignore_with_warning, "DeepSpeed's forward/backward/step timers"},
            {"memory_breakdown", Policy::ignore_with_warning, "DeepSpeed's memory prints"},
            {"dump_state", Policy::ignore_with_warning, "DeepSpeed's print of its engine state"},
            {"disable_allgather", Policy::ignore_with_warning, "parameters are always allgathered"},
            {"wandb", Policy::ignore_with_warning, "monitoring backend"},
            {"comet", Policy::ignore_with_warning, "monitoring backend"},
            {"flops_profiler", Policy::ignore_with_warning, "profiler"},
            {"comms_logger", Policy::ignore_with_warning, "communication logger"},
            {"autotuning", Policy::ignore_with_warning, "autotuner"},
            {"eigenvalue", Policy::ignore_with_warning, "eigenvalue computation"},
            {"compile", Policy::ignore_with_warning, "torch.compile"},
            {"nebula", Policy::ignore_with_warning, "Nebula checkpoint service"},
            {"timers", Policy::ignore_with_warning, "DeepSpeed's throughput timers"},
            {"seq_parallel_communication_data_type", Policy::ignore_with_warning, "sequence parallelism"},
            {"graph_harvesting", Policy::ignore_with_warning, "CUDA graph harvesting"},
            {"use_data_before_expert_parallelism", Policy::ignore_with_warning, "mixture of experts"},
        });
  }

  static void parse_optimizer(Config& c, Section s) {
    if (!s.present()) return;
    OptimizerConfig o;
    const json* type_value = s.find("type");
    if (type_value == nullptr) s.missing("type", "(one of " + std::string(kSupportedOptimizers) + ")");
    if (!type_value->is_string()) s.type_error("type", *type_value, "a string");
    const std::string type_name = type_value->get<std::string>();
    const std::string type = lowercase(type_name);
    if (type == "adam") {
      o.type = OptimizerType::adam;
    } else if (type == "adamw") {
      o.type = OptimizerType::adamw;
    } else if (type == "sgd") {
      o.type = OptimizerType::sgd;
    } else {
      static const std::set<std::string, std::less<>> deepspeed_optimizers = {
          "lamb",       "lion",   "adagrad", "onebitadam", "zerooneadam",
          "onebitlamb", "muadam", "muadamw", "musgd",      "muon"};
      const bool known_to_deepspeed = deepspeed_optimizers.contains(type);
      s.fail("type",
             (known_to_deepspeed ? "DeepSpeed optimizer '" + type_name + "' is not implemented by zerotrain"
                                 : "unknown optimizer type '" + type_name + "'") +
                 "; supported (case-insensitive): " + std::string(kSupportedOptimizers));
    }
    s.accept("legacy_fusion");  // a DeepSpeed FusedAdam implementation switch

    Section p = s.child("params");
    o.lr = p.number("lr", 1e-3, kNonNegativeNumber);
    o.weight_decay = p.number("weight_decay", 0.0, kNonNegativeNumber);
    // torch.optim switches that select an implementation, not the mathematics.
    for (std::string_view key : {"foreach", "fused", "capturable", "differentiable"}) p.accept(key);
    for (std::string_view key : {"maximize", "amsgrad"}) {
      if (p.boolean(key, false)) p.fail(key, "true is not supported by zerotrain");
    }
    if (o.type == OptimizerType::sgd) {
      o.momentum = p.number("momentum", 0.0, kNonNegativeNumber);
      o.dampening = p.number("dampening", 0.0, kNonNegativeNumber);
      o.nesterov = p.boolean("nesterov", false);
      if (o.nesterov && (o.momentum <= 0.0 || o.dampening != 0.0)) {
        p.fail("nesterov", "Nesterov momentum needs momentum > 0 and dampening 0");
      }
    } else {
      if (const json* betas = p.find("betas")) {
        const std::string expected = "an array of two numbers in [0, 1)";
        if (!betas->is_array() || betas->size() != 2) p.type_error("betas", *betas, expected);
        for (std::size_t i = 0; i < 2; ++i) {
          const json& beta = (*betas)[i];
          if (!beta.is_number() || beta.get<double>() < 0.0 || beta.get<double>() >= 1.0) {
            p.type_error("betas", *betas, expected);
          }
          o.betas[i] = beta.get<double>();
        }
      }
      o.eps = p.number("eps", 1e-8, kNonNegativeNumber);
      o.bias_correction = p.boolean("bias_correction", true);
      o.adam_w_mode = p.boolean("adam_w_mode", true);
      if (o.type == OptimizerType::adamw && !o.adam_w_mode) {
        s.context().warn(
            p.path_of("adam_w_mode") +
            ": false is ignored for type AdamW, which always decouples weight decay (as in DeepSpeed)");
        o.adam_w_mode = true;
      }
      if (p.boolean("torch_adam", false)) {
        s.context().warn(
            p.path_of("torch_adam") +
            ": ignored; zerotrain has one Adam implementation (same mathematics as torch.optim.Adam)");
      }
      if (p.has("max_grad_norm")) {
        s.context().warn(p.path_of("max_grad_norm") + ": ignored; use the top-level \"gradient_clipping\"");
      }
    }
    p.finish();
    s.finish();
    c.optimizer = o;
  }

  static WarmupType read_warmup_type(Section& p) {
    return p.choice<WarmupType>("warmup_type", WarmupType::log,
                                {{"log", WarmupType::log}, {"linear", WarmupType::linear}});
  }

  static void warn_if_total_below_warmup(Section& p, std::int64_t total, std::int64_t warmup) {
    // DeepSpeed warns the same way; the schedule then never reaches its decay phase.
    if (total < std::max<std::int64_t>(2, warmup)) {
      p.context().warn(p.path_of("total_num_steps") + ": " + std::to_string(total) +
                       " is less than warmup_num_steps (" + std::to_string(warmup) + ")");
    }
  }

  static void parse_scheduler(Config& c, Section s) {
    if (!s.present()) return;
    SchedulerConfig result;
    const json* type_value = s.find("type");
    if (type_value == nullptr) s.missing("type", "(one of " + std::string(kSupportedSchedulers) + ")");
    if (!type_value->is_string()) s.type_error("type", *type_value, "a string");
    const std::string type_name = type_value->get<std::string>();
    const std::string type = lowercase(type_name);
    Section p = s.child("params");
    const std::string why = "for scheduler " + type_name;
    if (type == "warmuplr") {
      result.type = SchedulerType::warmup_lr;
      WarmupLRParams w;
      w.warmup_min_lr = p.number("warmup_min_lr", 0.0, kNonNegativeNumber);
      w.warmup_max_lr = p.optional_number("warmup_max_lr", kNonNegativeNumber);
      w.warmup_num_steps = p.integer("warmup_num_steps", 1000, kPositive);
      w.warmup_type = read_warmup_type(p);
      result.params = w;
    } else if (type == "warmupdecaylr") {
      result.type = SchedulerType::warmup_decay_lr;
      WarmupDecayLRParams w;
      w.total_num_steps = p.required_integer("total_num_steps", kPositive, why);
      w.warmup_min_lr = p.number("warmup_min_lr", 0.0, kNonNegativeNumber);
      w.warmup_max_lr = p.number("warmup_max_lr", 0.001, kNonNegativeNumber);
      w.warmup_num_steps = p.integer("warmup_num_steps", 1000, kPositive);
      w.warmup_type = read_warmup_type(p);
      warn_if_total_below_warmup(p, *w.total_num_steps, w.warmup_num_steps);
      result.params = w;
    } else if (type == "warmupcosinelr") {
      result.type = SchedulerType::warmup_cosine_lr;
      WarmupCosineLRParams w;
      w.total_num_steps = p.required_integer("total_num_steps", kPositive, why);
      w.warmup_min_ratio = p.number("warmup_min_ratio", 0.0, kUnitInterval);
      w.warmup_num_steps = p.integer("warmup_num_steps", 1000, kPositive);
      w.cos_min_ratio = p.number("cos_min_ratio", 1e-4, kUnitInterval);
      w.warmup_type = read_warmup_type(p);
      warn_if_total_below_warmup(p, *w.total_num_steps, w.warmup_num_steps);
      result.params = w;
    } else if (type == "onecycle") {
      result.type = SchedulerType::one_cycle;
      OneCycleParams o;
      o.cycle_min_lr = p.required_number("cycle_min_lr", kNonNegativeNumber, why);
      o.cycle_max_lr = p.required_number("cycle_max_lr", kNonNegativeNumber, why);
      o.decay_lr_rate = p.number("decay_lr_rate", 0.0, kNonNegativeNumber);
      o.cycle_first_step_size = p.number("cycle_first_step_size", 2000, kPositiveNumber);
      o.cycle_second_step_size = p.optional_number("cycle_second_step_size", kPositiveNumber);
      o.cycle_first_stair_count = p.integer("cycle_first_stair_count", 0, kNonNegative);
      o.cycle_second_stair_count = p.optional_integer("cycle_second_stair_count", kNonNegative);
      o.decay_step_size = p.number("decay_step_size", 0, kNonNegativeNumber);
      o.cycle_momentum = p.boolean("cycle_momentum", true);
      o.cycle_min_mom = p.number("cycle_min_mom", 0.8, kUnitInterval);
      o.cycle_max_mom = p.number("cycle_max_mom", 0.9, kUnitInterval);
      o.decay_mom_rate = p.number("decay_mom_rate", 0.0, kNonNegativeNumber);
      if (const auto clamped = one_cycle_first_clamped_step(o)) {
        std::ostringstream text;
        text << p.path_of("decay_mom_rate") << ": momentum grows after the cycle and would pass 1 "
             << "(DeepSpeed keeps running with beta1 > 1, where Adam diverges); zerotrain holds beta1 at "
             << one_cycle_momentum_ceiling(o) << " from step " << *clamped << " on";
        p.context().warn(text.str());
      }
      result.params = o;

    } else if (type == "lrrangetest") {
      result.type = SchedulerType::lr_range_test;
      LRRangeTestParams l;
      l.lr_range_test_min_lr = p.number("lr_range_test_min_lr", 1e-3, kNonNegativeNumber);
      l.lr_range_test_step_size = p.number("lr_range_test_step_size", 2000, kPositiveNumber);
      l.lr_range_test_step_rate = p.number("lr_range_test_step_rate", 1.0, kNonNegativeNumber);
      l.lr_range_test_staircase = p.boolean("lr_range_test_staircase", false);
      result.params = l;
    } else {
      s.fail("type", "unknown scheduler type '" + type_name +
                         "'; supported (case-insensitive): " + std::string(kSupportedSchedulers));
    }
    result.last_batch_iteration = p.integer("last_batch_iteration", -1, IntRange{-1});
    p.finish();
    s.finish();
    c.scheduler = result;
  }

  static OffloadDevice read_offload_device(Section& s) {
    return s.choice<OffloadDevice>(
        "device", OffloadDevice::none,
        {{"none", OffloadDevice::none}, {"cpu", OffloadDevice::cpu}, {"nvme", OffloadDevice::nvme}},
        /*case_insensitive=*/true);
  }

  static void require_nvme_path(Section& s, OffloadDevice device, const std::optional<std::string>& path) {
    if (device == OffloadDevice::nvme && (!path || path->empty()))
      s.missing("nvme_path", "when device is \"nvme\"");
  }

  static void parse_zero(Config& c, Section& top) {
    ZeroConfig& z = c.zero_optimization;
    const json* value = top.find("zero_optimization");
    if (value != nullptr && value->is_boolean()) {
      // DeepSpeed's oldest format: "zero_optimization": true meant stage 1.
      z.stage = value->get<bool>() ? 1 : 0;
      z.overlap_comm = false;
      top.context().warn("zero_optimization: the boolean form is deprecated; write {\"stage\": " +
                         std::to_string(z.stage) + "}");
      return;
    }
    Section s = top.child("zero_optimization");
    z.stage = static_cast<int>(s.integer("stage", 0, IntRange{0, 3}));
    // DeepSpeed overlaps by default where the parameters are partitioned (stage 3).
    z.overlap_comm = s.boolean("overlap_comm", engine_detail::ZeroPartitioning::of_stage(z.stage).parameters);
    z.reduce_bucket_size = s.integer("reduce_bucket_size", 500'000'000, kPositive);
    z.allgather_bucket_size = s.integer("allgather_bucket_size", 500'000'000, kPositive);
    if (z.allgather_bucket_size % 2 != 0) {
      s.fail("allgather_bucket_size", "expected a multiple of 2 (the NCCL alignment factor), got " +
                                          std::to_string(z.allgather_bucket_size));
    }
    // How DeepSpeed lays out and communicates gradients and parameters: zerotrain's engine has one
    // way of its own (docs/zero.md), with the same results.
    for (const auto& [key, fallback] : {std::pair<std::string_view, bool>{"contiguous_gradients", true},
                                        {"reduce_scatter", true},
                                        {"allgather_partitions", true},
                                        {"use_multi_rank_bucket_allreduce", true},
                                        {"round_robin_gradients", false},
                                        {"memory_efficient_linear", true},
                                        {"override_module_apply", true}}) {
      (void)s.boolean(key, fallback);
    }
    // DeepSpeed raises an error for parameters without a gradient when this is false; zerotrain
    // treats their gradient as zero either way, which changes nothing for the others.
    (void)s.boolean("ignore_unused_parameters", true);
    refuse_unless_default(s, "load_from_fp32_weights", true,
                          "a checkpoint's fp32 master weights are always loaded (docs/checkpoint-format.md); "
                          "rebuilding them from the 16-bit weights would change the training after a resume");
    if (s.boolean("elastic_checkpoint", false)) {
      s.context().warn(s.path_of("elastic_checkpoint") +
                       ": deprecated in DeepSpeed; use universal checkpoints (\"checkpoint\": "
                       "{\"load_universal\": true})");
    }
    z.sub_group_size = s.integer("sub_group_size", 1'000'000'000, kPositive);

    // DeepSpeed accepts the stage-3 keys with and without their "stage3_" prefix.
    auto integer = [&s](std::int64_t fallback, IntRange range) {
      return [&s, fallback, range](std::string_view key) { return s.integer(key, fallback, range); };
    };
    auto boolean = [&s](bool fallback) {
      return [&s, fallback](std::string_view key) { return s.boolean(key, fallback); };
    };
    z.stage3_prefetch_bucket_size = read_aliased(s, "stage3_prefetch_bucket_size", "prefetch_bucket_size",
                                                 integer(50'000'000, kNonNegative));
    z.stage3_param_persistence_threshold =
        read_aliased(s, "stage3_param_persistence_threshold", "param_persistence_threshold",
                     integer(100'000, kNonNegative));
    (void)read_aliased(s, "stage3_model_persistence_threshold", "model_persistence_threshold",
                       integer(std::numeric_limits<std::int64_t>::max(), kNonNegative));
    z.stage3_max_live_parameters = read_aliased(s, "stage3_max_live_parameters", "max_live_parameters",
                                                integer(1'000'000'000, kNonNegative));
    z.stage3_max_reuse_distance = read_aliased(s, "stage3_max_reuse_distance", "max_reuse_distance",
                                               integer(1'000'000'000, kNonNegative));
    // DeepSpeed's save_16bit_model; every zerotrain checkpoint holds the whole model, which
    // `zerotrain checkpoint export` writes out in fp32 or bf16.
    (void)read_aliased(s, "stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save",
                       boolean(false));
    if (s.boolean("stage3_gather_fp16_weights_on_model_save", false)) {
      s.context().warn(s.path_of("stage3_gather_fp16_weights_on_model_save") +
                       ": deprecated; use stage3_gather_16bit_weights_on_model_save");
    }
    (void)read_aliased(s, "stage3_module_granularity_threshold", "module_granularity_threshold",
                       integer(0, kNonNegative));
    (void)read_aliased(s, "stage3_use_all_reduce_for_fetch_params", "use_all_reduce_for_fetch_params",
                       boolean(false));
    (void)read_aliased(s, "stage3_allgather_sequential", "allgather_sequential", boolean(false));

    if (s.integer("zero_hpz_partition_size", 1, kNonNegative) > 1) {
      s.context().warn(
          s.path_of("zero_hpz_partition_size") +
          ": ZeRO++ hierarchical partitioning is not supported by zerotrain; ignored (parameters are "
          "partitioned over the whole data-parallel group, with the same results)");
    }
    for (std::string_view key :
         {"zero_quantized_weights", "zero_quantized_nontrainable_weights", "zero_quantized_gradients"}) {
      if (s.boolean(key, false)) {
        s.fail(key,
               "ZeRO++ quantized communication is not supported by zerotrain (it would change the results); "
               "set it to false");
      }
    }
    if (s.integer("mics_shard_size", -1, IntRange{-1}) > 0) {
      s.context().warn(s.path_of("mics_shard_size") +
                       ": MiCS is not supported by zerotrain; ignored (states are partitioned over the whole "
                       "data-parallel group, with the same results)");
    }
    check_unsupported(
        s, {
               {"zenflow", Policy::reject, "ZenFlow changes when optimizer updates are applied"},
               {"mics_hierarchical_params_gather", Policy::ignore_with_warning, "MiCS"},
               {"zeropp_loco_param", Policy::ignore_with_warning, "ZeRO++ LoCo (quantized gradients)"},
               {"legacy_stage1", Policy::ignore_with_warning, "DeepSpeed's old stage-1 implementation"},
           });
    // PyTorch-implementation knobs of DeepSpeed that have no counterpart here.
    for (std::string_view key :
         {"log_trace_cache_warnings", "enable_sanity_checks", "pipeline_loading_checkpoint",
          "save_muon_momentum_buffer_in_memory", "leaf_module", "stage3_partition_stream_chunk_size",
          "partition_stream_chunk_size"}) {
      s.accept(key);
    }

    parse_offload_optimizer(z, s.child("offload_optimizer"));
    parse_offload_param(z, s.child("offload_param"));
    apply_deprecated_offload_flags(z, s);
    check_zero(z, s);
    s.finish();
  }

  static void parse_offload_optimizer(ZeroConfig& z, Section s) {
    OffloadOptimizerConfig& o = z.offload_optimizer;
    o.device = read_offload_device(s);
    o.nvme_path = s.optional_string("nvme_path");
    o.pin_memory = s.boolean("pin_memory", true);
    o.buffer_count = s.integer("buffer_count", 4, kNonNegative);
    o.ratio = s.number("ratio", 1.0, kUnitInterval);
    o.super_offload = s.boolean("super_offload", false);
    // How DeepSpeed schedules its swaps and its CPU Adam: zerotrain always pipelines the swaps
    // (buffer_count 1 is the synchronous order) and updates on its own threads, with the same results.
    for (std::string_view key : {"pipeline_read", "pipeline_write", "fast_init"}) (void)s.boolean(key, false);
    (void)s.number("cpuadam_cores_perc", 0.8, kUnitInterval);
    s.accept("convert_grad_on_cpu");  // where DeepSpeed converts gradients; no effect on results
    require_nvme_path(s, o.device, o.nvme_path);
    s.finish();
  }

  static void parse_offload_param(ZeroConfig& z, Section s) {
    OffloadParamConfig& o = z.offload_param;
    o.device = read_offload_device(s);
    o.nvme_path = s.optional_string("nvme_path");
    o.pin_memory = s.boolean("pin_memory", true);
    o.buffer_count = s.integer("buffer_count", 5, kNonNegative);
    o.buffer_size = s.integer("buffer_size", 100'000'000, kPositive);
    o.max_in_cpu = s.integer("max_in_cpu", 1'000'000'000, kNonNegative);
    require_nvme_path(s, o.device, o.nvme_path);
    s.finish();
  }

  /// DeepSpeed still maps cpu_offload / cpu_offload_param / cpu_offload_use_pin_memory.
  static void apply_deprecated_offload_flags(ZeroConfig& z, Section& s) {
    struct Flag {
      std::string_view key;
      std::string_view replacement;
      OffloadDevice* device;
    };
    for (const Flag& flag : {Flag{"cpu_offload", "offload_optimizer", &z.offload_optimizer.device},
                             Flag{"cpu_offload_param", "offload_param", &z.offload_param.device}}) {
      if (!s.has(flag.key)) continue;
      const bool enabled = s.boolean(flag.key, false);
      std::string message = s.path_of(flag.key) + ": deprecated; write \"" + std::string(flag.replacement) +
                            "\": {\"device\": \"cpu\"}";
      if (enabled && *flag.device != OffloadDevice::none) {
        message += " (ignored: " + std::string(flag.replacement) + " is given)";
      } else if (enabled) {
        *flag.device = OffloadDevice::cpu;
        message += " (applied)";
      }
      s.context().warn(message);
    }
    if (s.has("cpu_offload_use_pin_memory")) {
      const bool pin = s.boolean("cpu_offload_use_pin_memory", true);
      z.offload_optimizer.pin_memory = z.offload_param.pin_memory = pin;
      s.context().warn(
          s.path_of("cpu_offload_use_pin_memory") +
          ": deprecated; write pin_memory in offload_optimizer / offload_param (applied to both)");
    }
  }

  static void check_zero(const ZeroConfig& z, Section& s) {
    const std::string stage_text = "zero_optimization.stage is " + std::to_string(z.stage);
    const engine_detail::ZeroPartitioning partitioned = engine_detail::ZeroPartitioning::of_stage(z.stage);
    if (z.offload_param.device != OffloadDevice::none && !partitioned.parameters) {
      s.fail("offload_param", "parameter offload needs ZeRO stage 3, but " + stage_text);
    }
    const OffloadOptimizerConfig& o = z.offload_optimizer;
    if (o.device != OffloadDevice::none && !partitioned.optimizer_states) {
      s.fail("offload_optimizer", "optimizer offload needs ZeRO stage 1, 2 or 3, but " + stage_text);
    }
    // DeepSpeed documents NVMe optimizer offload for stage 3 only (stages 1-2 silently run without
    // it); zerotrain's engine swaps the optimizer states at stages 1-3 alike (docs/offload.md).
    if (o.ratio < 1.0 && !partitioned.parameters) {
      s.fail("offload_optimizer.ratio", "partial offload (ratio < 1) needs ZeRO stage 3, but " + stage_text);
    }
    if (o.super_offload && !partitioned.parameters) {
      s.fail("offload_optimizer.super_offload", "needs ZeRO stage 3, but " + stage_text);
    }
  }

  static void parse_fp16(Config& c, Section s) {
    Fp16Config& f = c.fp16;
    f.enabled = s.boolean("enabled", false);
    refuse_unless_default(s, "auto_cast", false,
                          "the engine does not cast the model's inputs; pass them in fp16 (the data of "
                          "`zerotrain train` already is)");
    f.loss_scale = s.number("loss_scale", 0.0, kNonNegativeNumber);
    f.initial_scale_power = static_cast<int>(s.integer("initial_scale_power", 16, IntRange{0, 127}));
    f.loss_scale_window = s.integer("loss_scale_window", 1000);
    f.hysteresis = static_cast<int>(s.integer("hysteresis", 2, IntRange{1, 1'000'000}));
    f.consecutive_hysteresis = s.boolean("consecutive_hysteresis", false);
    f.min_loss_scale = s.number("min_loss_scale", 1.0);
    f.fp16_master_weights_and_grads = s.boolean("fp16_master_weights_and_grads", false);
    if (f.dynamic_loss_scale()) {
      if (f.loss_scale_window <= 0) {
        s.fail("loss_scale_window",
               "expected a positive integer with a dynamic loss scale (loss_scale 0), got " +
                   std::to_string(f.loss_scale_window));
      }
      if (f.min_loss_scale <= 0.0) {
        s.fail("min_loss_scale", "expected a number > 0 with a dynamic loss scale (loss_scale 0), got " +
                                     render(json(f.min_loss_scale)));
      }
      if (f.enabled && c.zero_optimization.stage == 0) {
        for (const std::string_view key : {"hysteresis", "consecutive_hysteresis"}) {
          if (s.has(key)) {
            s.context().warn(s.path_of(key) +
                             ": not used at ZeRO stage 0, where (as in DeepSpeed's FP16_Optimizer) every "
                             "overflow halves the loss scale; stages 1-3 apply it");
          }
        }
      }
    }
    s.finish();
  }

  static void parse_bf16(Config& c, Section& top) {
    if (top.has("bf16") && top.has("bfloat16")) {
      top.fail("bfloat16", "\"bf16\" and its alias \"bfloat16\" are both given; keep only \"bf16\"");
    }
    Section s = top.child(top.has("bfloat16") ? "bfloat16" : "bf16");
    Bf16Config& b = c.bf16;
    b.enabled = s.boolean("enabled", false);
    refuse_unless_default(s, "immediate_grad_update", false,
                          "gradients accumulate in the compute dtype (bf16) across micro-batches, not in "
                          "fp32 after each one");
    b.check_grad_overflow = s.boolean("check_grad_overflow", true);
    b.bf16_master_weights_and_grads = s.boolean("bf16_master_weights_and_grads", false);
    b.bf16_optimizer_states = s.boolean("bf16_optimizer_states", false);
    if (b.bf16_optimizer_states && !b.bf16_master_weights_and_grads) {
      s.fail("bf16_optimizer_states", "needs bf16_master_weights_and_grads true");
    }
    if (b.bf16_optimizer_states &&
        !engine_detail::ZeroPartitioning::of_stage(c.zero_optimization.stage).optimizer_states) {
      s.fail("bf16_optimizer_states", "needs ZeRO stage 1, 2 or 3, but zero_optimization.stage is 0");
    }
    s.finish();
  }

  static void parse_aio(Config& c, Section s) {
    AioConfig& a = c.aio;
    a.block_size = s.integer("block_size", 1'048'576, kPositive);
    a.queue_depth = s.integer("queue_depth", 8, kPositive);
    if (s.has("thread_count")) {
      if (s.has("intra_op_parallelism")) {
        s.fail("thread_count", "the old name of intra_op_parallelism; give only intra_op_parallelism");
      }
      a.intra_op_parallelism = s.integer("thread_count", 1, kPositive);
      s.context().warn(s.path_of("thread_count") +
                       ": renamed to intra_op_parallelism (DeepSpeed PR #7056, whose runtime no longer reads "
                       "thread_count); the value is used as intra_op_parallelism");
    } else {
      a.intra_op_parallelism = s.integer("intra_op_parallelism", 1, kPositive);
    }
    a.single_submit = s.boolean("single_submit", false);
    a.overlap_events = s.boolean("overlap_events", true);
    a.use_gds = s.boolean("use_gds", false);
    s.finish();
  }

  /// Whether there are checkpoints says pipeline.activation_checkpoint_interval (or, without it,
  /// number_checkpoints); this section says how they keep their inputs. The keys without an effect
  /// in this build are accepted (docs/config.md, "activation_checkpointing").
  static void parse_activation_checkpointing(Config& c, Section s) {
    ActivationCheckpointingConfig& a = c.activation_checkpointing;
    a.partition_activations = s.boolean("partition_activations", false);
    a.cpu_checkpointing = s.boolean("cpu_checkpointing", false);
    a.number_checkpoints = s.optional_integer("number_checkpoints", kPositive);
    a.contiguous_memory_optimization = s.boolean("contiguous_memory_optimization", false);
    a.synchronize_checkpoint_boundary = s.boolean("synchronize_checkpoint_boundary", false);
    a.profile = s.boolean("profile", false);
    s.finish();
  }

  static void parse_checkpoint(Config& c, Section s) {
    CheckpointConfig& k = c.checkpoint;
    // Ranks that pass different tags to save_checkpoint are always an error (as "Fail"), whatever
    // DeepSpeed's setting says.
    (void)s.choice<std::string_view>("tag_validation", "Warn",
                                     {{"Ignore", "Ignore"}, {"Warn", "Warn"}, {"Fail", "Fail"}},
                                     /*case_insensitive=*/true);
    // zerotrain's checkpoints load at any data-parallel size: every load is "universal".
    (void)s.boolean("load_universal", false);
    refuse_unless_default(s, "use_node_local_storage", false,
                          "all ranks write one checkpoint file with MPI-IO, so save_dir must be on a file "
                          "system that every node shares");
    Section parallel_write = s.child("parallel_write");
    (void)parallel_write.boolean("pipeline_stage", false);  // no pipeline stages (see "pipeline")
    parallel_write.finish();
    k.save_dir = s.optional_string("save_dir");
    if (k.save_dir && k.save_dir->empty()) s.fail("save_dir", "expected a directory path, got \"\"");
    k.save_interval = s.integer("save_interval", 0, kNonNegative);
    k.keep_last = s.integer("keep_last", 0, kNonNegative);
    k.file_mode = read_permission_bits(s, "file_mode", 0640);
    k.dir_mode = read_permission_bits(s, "dir_mode", 0750);
    if (k.save_interval > 0 && !k.save_dir) s.missing("save_dir", "when save_interval > 0");
    s.finish();
  }

  /// zerotrain keeps parameters, gradients (accumulated ones too) and activations in one dtype; a
  /// DeepSpeed data type is accepted when it names that dtype.
  static void parse_data_types(const Config& c, Section s) {
    const DType compute = c.compute_dtype();
    for (std::string_view key : {"grad_accum_dtype", "param_dtype", "buffer_dtype"}) {
      const std::optional<DType> dtype = read_float_dtype(s, key);
      if (!dtype || *dtype == compute) continue;
      const std::string compute_name(dtype_name(compute));
      s.fail(key, render(*s.find(key)) +
                      " is not supported by zerotrain: parameters, gradients and their accumulation are "
                      "all in the compute dtype, " +
                      compute_name + " here (fp16.enabled / bf16.enabled); remove the key or set it to \"" +
                      compute_name + "\"");
    }
    s.finish();
  }

  static void parse_pipeline(Config& c, Section s) {
    PipelineConfig& p = c.pipeline;
    if (const json* stages = s.find("stages")) {
      if (!(stages->is_string() && stages->get<std::string>() == "auto")) {
        p.stages = s.integer("stages", 1, kPositive);
      }
    }
    const std::string partition = s.string("partition", "best");
    if (partition != "best" && partition != "parameters" && partition != "uniform" &&
        !partition.starts_with("type:")) {
      s.type_error("partition", json(partition),
                   "one of \"best\", \"parameters\", \"uniform\", \"type:<regex>\"");
    }
    p.partition = partition == "best" ? "parameters" : partition;
    p.schedule = s.choice<PipelineSchedule>(
        "schedule", PipelineSchedule::one_f_one_b,
        {{"1f1b", PipelineSchedule::one_f_one_b}, {"gpipe", PipelineSchedule::gpipe}});
    // How DeepSpeed seeds and runs a PipelineModule's layers: zerotrain initializes every layer from
    // the config's seed and the parameter's name, and moves whole activations between stages.
    (void)s.boolean("seed_layers", false);
    for (std::string_view key : {"pipe_partitioned", "grad_partitioned", "use_reentrant"})
      (void)s.boolean(key, true);
    // Honoured without pipelining too: the built-in models' blocks per activation checkpoint.
    p.activation_checkpoint_interval = s.integer("activation_checkpoint_interval", 0, kNonNegative);
    s.finish();
  }

  static void parse_model(Config& c, Section s) {
    if (!s.present()) return;
    const ModelType type = [&] {
      if (!s.has("type")) s.missing("type", "(\"gpt\" or \"mlp\")");
      return s.choice<ModelType>("type", ModelType::gpt, {{"gpt", ModelType::gpt}, {"mlp", ModelType::mlp}});
    }();
    if (type == ModelType::gpt) {
      GptModelConfig g;
      const std::string why = "for a gpt model";
      g.n_layer = s.required_integer("n_layer", kPositive, why);
      g.n_head = s.required_integer("n_head", kPositive, why);
      g.d_model = s.required_integer("d_model", kPositive, why);
      g.seq_len = s.required_integer("seq_len", kPositive, why);
      g.vocab_size = s.required_integer("vocab_size", kPositive, why);
      g.tie_embeddings = s.boolean("tie_embeddings", true);
      g.dropout = s.number("dropout", 0.0, NumberRange{0.0, 1.0, false, true});
      if (g.d_model % g.n_head != 0) {
        s.fail("d_model", "expected a multiple of n_head (" + std::to_string(g.n_head) + "), got " +
                              std::to_string(g.d_model));
      }
      c.model = g;
    } else {
      MlpModelConfig m;
      const json* sizes = s.find("sizes");
      if (sizes == nullptr) s.missing("sizes", "for an mlp model ([inputs, hidden..., outputs])");
      const std::string expected = "an array of at least two positive integers (layer widths)";
      if (!sizes->is_array() || sizes->size() < 2) s.type_error("sizes", *sizes, expected);
      for (const json& size : *sizes) {
        const bool positive_integer =
            (size.is_number_integer() || size.is_number_unsigned()) && size.get<double>() >= 1;
        const bool integral_float =
            size.is_number_float() && size.get<double>() >= 1 &&
            size.get<double>() == static_cast<double>(static_cast<std::int64_t>(size.get<double>()));
        if (!positive_integer && !integral_float) s.type_error("sizes", *sizes, expected);
        m.sizes.push_back(static_cast<std::int64_t>(size.get<double>()));
      }
      m.activation = s.choice<MlpActivation>(
          "activation", MlpActivation::relu,
          {{"relu", MlpActivation::relu}, {"gelu", MlpActivation::gelu}, {"tanh", MlpActivation::tanh}});
      c.model = m;
    }
    s.finish();
  }

  static void parse_data(Config& c, Section s) {
    if (!s.present()) return;
    DataConfig d;
    d.format = s.choice<DataFormat>("format", DataFormat::automatic,
                                    {{"auto", DataFormat::automatic},
                                     {"tokens", DataFormat::tokens},
                                     {"text", DataFormat::text},
                                     {"builtin", DataFormat::builtin},
                                     {"synthetic", DataFormat::synthetic}});
    d.path = s.optional_string("path");
    if (const auto seed = s.optional_integer("seed", kNonNegative))
      d.seed = static_cast<std::uint64_t>(*seed);
    const bool needs_path = d.format != DataFormat::builtin && d.format != DataFormat::synthetic;
    if (needs_path && (!d.path || d.path->empty()))
      s.missing("path", "unless data.format is \"builtin\" or \"synthetic\"");
    s.finish();
    c.data = d;
  }

  /// zerotrain's "eval" section: the validation loss (EvalConfig).
  static void parse_eval(Config& c, Section s) {
    if (!s.present()) return;
    EvalConfig e;
    e.data = s.optional_string("data");
    if (e.data && e.data->empty())
      s.fail("data",
             "expected a data path (a token file, a directory or glob of shards, a text file), got \"\"");
    e.interval = s.integer("interval", 0, kNonNegative);
    e.batches = s.integer("batches", 10, kPositive);
    s.finish();
    c.eval = e;
  }

  /// DeepSpeed's monitor sections (TensorBoardConfig, CSVConfig): enabled, output_path, job_name.
  static void parse_monitor(MonitorConfig& m, Section s) {
    m.enabled = s.boolean("enabled", false);
    m.output_path = s.string("output_path", "");
    m.job_name = s.string("job_name", "DeepSpeedJobName");
    if (m.job_name.empty()) s.fail("job_name", "expected a directory name, got \"\"");
    s.finish();
  }

  static void parse_alerts(Config& c, Section s) {
    c.alerts.memory_limit = s.optional_integer("memory_limit", kPositive);
    c.alerts.memory_fraction = s.number("memory_fraction", 0.95, {0.0, 1.0, true, false});
    s.finish();
  }

  /// zerotrain's "comm" section: the watchdog's collective timeout (the runtime applies it, see
  /// CommConfig); "backend" is accepted at its default only (older configs have it).
  static void parse_comm(Config& c, Section s) {
    if (const json* value = s.find("timeout_s"); value != nullptr && value->is_string()) {
      if (value->get_ref<const std::string&>() != "off")
        s.type_error("timeout_s", *value, "a number of seconds, or \"off\"");
      c.comm.timeout_s = 0.0;
    } else if (const std::optional<double> seconds = s.optional_number("timeout_s", kNonNegativeNumber)) {
      if (const std::string problem = collective_timeout_problem(*seconds); !problem.empty())
        s.fail("timeout_s", problem);
      c.comm.timeout_s = *seconds;
    }
    const std::string_view backend =
        s.choice<std::string_view>("backend", "auto", {{"auto", "auto"}, {"mpi", "mpi"}, {"nccl", "nccl"}});
    if (backend != "auto") {
      s.fail("backend", render(*s.find("backend")) +
                            " is not supported: the config does not choose the communication backend; the "
                            "engine reduces over the communicator it is given (EngineOptions::data_parallel; "
                            "by default MPI over all ranks); remove the key or set it to \"auto\"");
    }
    s.finish();
  }

  /// zerotrain's "init": {"from": PATH}, the weights training starts from. Unknown keys are errors:
  /// a misspelt "from" would otherwise start from random weights without a word.
  static void parse_init(Config& c, Section s) {
    if (!s.present()) return;
    c.init.from = s.optional_string("from");
    if (c.init.from && c.init.from->empty()) s.fail("from", "expected the path of a weights file, got \"\"");
    s.finish_strict("\"from\" (the weights file, docs/config.md \"init\")");
  }

  /// zerotrain's "freeze": a list of parameter-name patterns (globs, or "re:" regular expressions).
  static void parse_freeze(Config& c, Section& top) {
    const json* value = top.find("freeze");
    if (value == nullptr) return;
    const char* expected =
        "a list of parameter-name patterns, e.g. [\"wte.*\", \"h.0.*\"] (globs, or \"re:\" "
        "followed by a regular expression)";
    if (!value->is_array()) top.type_error("freeze", *value, expected);
    for (std::size_t i = 0; i < value->size(); ++i) {
      const json& item = (*value)[i];
      const std::string key = "freeze[" + std::to_string(i) + "]";
      if (!item.is_string() || item.get_ref<const std::string&>().empty())
        top.type_error(key, item, "a non-empty pattern string");
      const std::string& pattern = item.get_ref<const std::string&>();
      if (const std::string problem = freeze_pattern_problem(pattern); !problem.empty())
        top.fail(key, problem);
      c.freeze.push_back(pattern);
    }
  }

  static void check_across_sections(const Config& c, Section& top) {
    if (c.fp16.enabled && c.bf16.enabled) {
      top.fail("fp16", "fp16.enabled and bf16.enabled are both true; enable at most one");
    }
    const engine_detail::ZeroPartitioning partitioned =
        engine_detail::ZeroPartitioning::of_stage(c.zero_optimization.stage);
    if (c.fp16.fp16_master_weights_and_grads && !partitioned.optimizer_states) {
      top.fail("fp16.fp16_master_weights_and_grads",
               "needs ZeRO stage 1, 2 or 3, but zero_optimization.stage is 0");
    }
    if (c.gradient_allreduce_op == GradientReduceOp::sum && partitioned.parameters) {
      top.fail("gradient_allreduce_op",
               "\"sum\" is not supported with ZeRO stage 3 (as in DeepSpeed); use \"mean\"");
    }
  }
};

// ---- Config ------------------------------------------------------------------------------------

void print_config_warning_to_stderr(std::string_view line) {
  std::cerr << line << '\n' << std::flush;
}

Config ConfigParser::parse_text(std::string_view text, std::string source,
                                const ConfigParseOptions& options) {
  ParseContext context{source_label(source), {}};
  auto flush_warnings = [&] {
    if (!options.warning_sink) return;
    for (const std::string& warning : context.warnings) {
      options.warning_sink("zerotrain: warning: " + context.source + ": " + warning);
    }
  };
  json document;
  try {
    config_detail::check_document_shape(text, context);
    document = json::parse(text.begin(), text.end(), /*callback=*/nullptr, /*allow_exceptions=*/true,
                           /*ignore_comments=*/true);
  } catch (const json::parse_error& error) {
    // nlohmann's message reads "[json.exception.parse_error.101] parse error at line L, column C: ...".
    std::string message = error.what();
    if (auto end = message.find("] "); message.starts_with("[json.exception") && end != std::string::npos) {
      message.erase(0, end + 2);
    }
    ZT_THROW_AS(ConfigError, context.source, ": invalid JSON: ", message);
  } catch (const json::exception& error) {
    // Anything else the JSON library refuses (check_document_shape reports what it knows first).
    ZT_THROW_AS(ConfigError, context.source, ": invalid JSON: ", error.what());
  }
  Config config;
  try {
    ConfigParser::parse(config, document, context);
  } catch (const ConfigError&) {
    flush_warnings();  // an unknown-key warning often explains the error
    throw;
  }
  flush_warnings();
  config.warnings_ = std::move(context.warnings);
  config.raw_json_ = document.dump();
  config.source_ = std::move(source);
  return config;
}

Config Config::from_string(std::string_view json_text, const ConfigParseOptions& options) {
  return ConfigParser::parse_text(json_text, "<string>", options);
}

Config Config::from_string(std::string_view json_text, int data_parallel_size,
                           const ConfigParseOptions& options) {
  Config config = from_string(json_text, options);
  config.resolve_batch(data_parallel_size);
  return config;
}

Config Config::from_file(const std::filesystem::path& path, const ConfigParseOptions& options) {
  const std::string label = "config file '" + path.string() + "'";
  std::error_code error;
  if (!std::filesystem::exists(path, error)) {
    ZT_THROW_AS(ConfigError, label, ": cannot open: ", error ? error.message() : "no such file");
  }
  if (std::filesystem::is_directory(path, error))
    ZT_THROW_AS(ConfigError, label, ": is a directory, not a file");
  std::ifstream in(path, std::ios::binary);
  if (!in) ZT_THROW_AS(ConfigError, label, ": cannot open: ", base::errno_text(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) ZT_THROW_AS(ConfigError, label, ": read failed: ", base::errno_text(errno));
  return ConfigParser::parse_text(text.str(), path.string(), options);
}

Config Config::from_file(const std::filesystem::path& path, int data_parallel_size,
                         const ConfigParseOptions& options) {
  Config config = from_file(path, options);
  config.resolve_batch(data_parallel_size);
  return config;
}

std::string MonitorConfig::directory() const {
  // As DeepSpeed's os.path.join(output_path, job_name): "" is the working directory.
  return (std::filesystem::path(output_path) / job_name).string();
}

std::int64_t Config::activation_checkpoint_interval_for(std::int64_t layers) const {
  if (pipeline.activation_checkpoint_interval > 0) return pipeline.activation_checkpoint_interval;
  if (const auto& count = activation_checkpointing.number_checkpoints; count && layers > 0)
    return (layers + *count - 1) / *count;
  return 0;
}

DType Config::compute_dtype() const {
  if (bf16.enabled) return DType::bf16;
  if (fp16.enabled) return DType::fp16;
  return DType::fp32;
}

const BatchSizes& Config::batch() const {
  if (!resolved_batch_) {
    ZT_THROW_AS(ConfigError, source_label(source_),
                ": batch sizes are not resolved yet; call Config::resolve_batch(data_parallel_size)");
  }
  return *resolved_batch_;
}

const BatchSizes& Config::resolve_batch(int data_parallel_size) {
  const std::string label = source_label(source_);
  if (data_parallel_size <= 0) {
    ZT_THROW_AS(ConfigError, label, ": the data-parallel size must be positive, got ", data_parallel_size);
  }
  const std::int64_t ws = data_parallel_size;
  const std::string ws_text = "data-parallel size (" + std::to_string(ws) + ")";
  auto named = [](std::string_view key, std::int64_t value) {
    return std::string(key) + " (" + std::to_string(value) + ")";
  };
  std::optional<std::int64_t> tb = train_batch_size;
  std::optional<std::int64_t> mb = train_micro_batch_size_per_gpu;
  std::optional<std::int64_t> gas = gradient_accumulation_steps;
  // How each missing value was derived, for the messages below.
  std::string tb_how, mb_how, gas_how;

  // DeepSpeed's derivation (runtime/config.py, _set_batch_related_parameters), integer division included.
  if (tb && mb && gas) {
    // all given: only the check below
  } else if (tb && gas) {
    mb = *tb / ws / *gas;
    mb_how =
        named("train_batch_size", *tb) + " / " + ws_text + " / " + named("gradient_accumulation_steps", *gas);
  } else if (tb && mb) {
    gas = *tb / ws / *mb;
    gas_how = named("train_batch_size", *tb) + " / " + ws_text + " / " +
              named("train_micro_batch_size_per_gpu", *mb);
  } else if (mb && gas) {
    tb = *mb * *gas * ws;
  } else if (tb) {
    gas = 1;
    mb = *tb / ws;
    mb_how = named("train_batch_size", *tb) + " / " + ws_text;
  } else if (mb) {
    tb = *mb * ws;
    gas = 1;
  } else {
    ZT_THROW_AS(ConfigError, label,
                ": either train_batch_size or train_micro_batch_size_per_gpu must be given",
                gas ? " (only gradient_accumulation_steps is)" : "");
  }

  auto require_positive = [&](std::string_view key, std::int64_t value, const std::string& how) {
    if (value > 0) return;
    ZT_THROW_AS(
        ConfigError, label, ": ", key, " must be > 0, got ", value,
        how.empty() ? std::string() : " (derived as " + how + " with integer division, as DeepSpeed does)");
  };
  require_positive("train_batch_size", *tb, tb_how);
  require_positive("train_micro_batch_size_per_gpu", *mb, mb_how);
  require_positive("gradient_accumulation_steps", *gas, gas_how);

  std::int64_t product = 0;
  const bool overflow =
      __builtin_mul_overflow(*mb, *gas, &product) || __builtin_mul_overflow(product, ws, &product);
  if (overflow || product != *tb) {
    ZT_THROW_AS(ConfigError, label, ": batch sizes do not match: ", named("train_batch_size", *tb),
                " != ", named("train_micro_batch_size_per_gpu", *mb), " * ",
                named("gradient_accumulation_steps", *gas), " * ", ws_text, " = ",
                overflow ? std::string("(overflow)") : std::to_string(product),
                ". Correct one of the three values, or leave one out to have it derived.");
  }
  resolved_batch_ = BatchSizes{*tb, *mb, *gas, data_parallel_size};
  return *resolved_batch_;
}

bool freeze_pattern_matches(const std::string& pattern, const std::string& name) {
  if (pattern.starts_with("re:"))
    return std::regex_match(name, std::regex(pattern.substr(3), std::regex::ECMAScript));
  return ::fnmatch(pattern.c_str(), name.c_str(), 0) == 0;
}

std::string freeze_pattern_problem(const std::string& pattern) {
  if (pattern.empty()) return "an empty pattern matches no parameter";
  if (!pattern.starts_with("re:")) return "";
  if (pattern.size() == 3) return "\"re:\" needs a regular expression after it";
  try {
    (void)std::regex(pattern.substr(3), std::regex::ECMAScript);
  } catch (const std::regex_error& error) {
    return "\"" + pattern + "\" is not a valid regular expression (" + error.what() + ")";
  }
  return "";
}

}  // namespace zt
