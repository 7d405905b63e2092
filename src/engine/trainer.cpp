// zt::train: the loop behind `zerotrain train`.
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <variant>

#include "zerotrain/error.hpp"
#include "zerotrain/runtime.hpp"
#include "zerotrain/trainer.hpp"

namespace zt {
namespace {

using Clock = std::chrono::steady_clock;

nlohmann::json model_description(const Config& config, std::int64_t parameters) {
  nlohmann::json model;
  if (const auto* gpt = std::get_if<GptModelConfig>(&*config.model)) {
    model = {{"type", "gpt"},
             {"n_layer", gpt->n_layer},
             {"n_head", gpt->n_head},
             {"d_model", gpt->d_model},
             {"seq_len", gpt->seq_len},
             {"vocab_size", gpt->vocab_size},
             {"tie_embeddings", gpt->tie_embeddings},
             {"dropout", gpt->dropout}};
  } else {
    const auto& mlp = std::get<MlpModelConfig>(*config.model);
    model = {{"type", "mlp"}, {"sizes", mlp.sizes}, {"activation", to_string(mlp.activation)}};
  }
  model["parameters"] = parameters;
  return model;
}

/// Memory by category as the maximum over ranks: per category the peak since the step began
/// (parameters, gradients and states are steady; activations peak inside the step), and the peak
/// of the total.
nlohmann::json memory_max_over_ranks(Communicator& world) {
  const MemorySnapshot host = memory_snapshot(DeviceType::host);
  const MemorySnapshot cuda = memory_snapshot(DeviceType::cuda);
  constexpr MemoryCategory kReported[] = {MemoryCategory::parameters, MemoryCategory::gradients,
                                          MemoryCategory::optimizer_states, MemoryCategory::activations,
                                          MemoryCategory::comm_buffers};
  std::int64_t values[std::size(kReported) + 1];
  for (std::size_t i = 0; i < std::size(kReported); ++i) {
    values[i] = static_cast<std::int64_t>(host[kReported[i]].peak + cuda[kReported[i]].peak);
  }
  values[std::size(kReported)] = static_cast<std::int64_t>(host.total.peak + cuda.total.peak);
  world.all_reduce(values, values, std::size(values), DType::int64, ReduceOp::max);
  nlohmann::json memory;
  for (std::size_t i = 0; i < std::size(kReported); ++i)
    memory[memory_category_name(kReported[i])] = values[i];
  memory["peak"] = values[std::size(kReported)];
  return memory;
}

class MetricsWriter {
 public:
  explicit MetricsWriter(const std::optional<std::string>& path) {
    if (!path) return;
    out_.open(*path, std::ios::out | std::ios::trunc);
    ZT_CHECK_AS(IoError, out_.good(), "cannot write metrics to '", *path, "'");
    path_ = *path;
  }
  void write(const nlohmann::json& line) {
    if (!out_.is_open()) return;
    out_ << line.dump() << '\n';
    out_.flush();  // a run killed midway still leaves every finished step on disk
    ZT_CHECK_AS(IoError, out_.good(), "writing metrics to '", path_, "' failed");
  }

 private:
  std::ofstream out_;
  std::string path_;
};

}  // namespace

TrainSummary train(Runtime& runtime, Config config, const TrainOptions& options) {
  ZT_CHECK_AS(ConfigError, options.steps >= 0, "--steps must be >= 0, got ", options.steps);
  const bool leader = runtime.world_rank() == 0;
  check_engine_supports(config);
  std::unique_ptr<nn::Module> model = build_model(config);
  Engine engine(runtime, *model, std::move(config));
  const Config& cfg = engine.config();
  std::unique_ptr<TrainingData> data = make_training_data(cfg, engine, options.data_path);
  const BatchSizes& batch = engine.batch();
  const std::int64_t print_every = options.print_every.value_or(cfg.steps_per_print.value_or(10));

  MetricsWriter metrics(leader ? options.metrics_path : std::nullopt);
  nlohmann::json start = {{"event", "start"},
                          {"world_size", runtime.world_size()},
                          {"data_parallel_size", batch.data_parallel_size},
                          {"zero_stage", cfg.zero_optimization.stage},
                          {"params_total", engine.parameter_count()},
                          {"dtype", dtype_name(engine.compute_dtype())},
                          {"model", model_description(cfg, engine.parameter_count())},
                          {"train_batch_size", batch.train_batch_size},
                          {"micro_batch_size", batch.train_micro_batch_size_per_gpu},
                          {"gradient_accumulation_steps", batch.gradient_accumulation_steps},
                          {"optimizer", to_string(cfg.optimizer->type)},
                          {"data", data->description()},
                          {"target_steps", options.steps}};
  metrics.write(start);
  if (leader) {
    std::printf("zerotrain train: %s model, %lld parameters, %s, ZeRO stage %d, %d rank(s) on %d node(s)\n",
                std::holds_alternative<GptModelConfig>(*cfg.model) ? "GPT" : "MLP",
                static_cast<long long>(engine.parameter_count()),
                std::string(dtype_name(engine.compute_dtype())).c_str(), engine.zero_stage(),
                runtime.world_size(), runtime.node_count());
    std::printf("  batch %lld = micro %lld x accumulation %lld x data-parallel %d; data: %s\n",
                static_cast<long long>(batch.train_batch_size),
                static_cast<long long>(batch.train_micro_batch_size_per_gpu),
                static_cast<long long>(batch.gradient_accumulation_steps), batch.data_parallel_size,
                data->description().c_str());
    std::fflush(stdout);
  }

  const double tokens_per_step = static_cast<double>(batch.train_batch_size * data->tokens_per_sample());
  TrainSummary summary;
  double total_seconds = 0;
  while (engine.global_steps() < options.steps) {
    reset_memory_peaks();
    const auto began = Clock::now();
    for (std::int64_t micro = 0; micro < batch.gradient_accumulation_steps; ++micro) {
      const Batch micro_batch = data->load(static_cast<std::uint64_t>(micro));
      engine.forward(micro_batch);
      engine.backward();
      engine.step();
    }
    data->advance();
    const double seconds = std::chrono::duration<double>(Clock::now() - began).count();
    total_seconds += seconds;
    const StepReport& report = engine.last_step();
    if (summary.steps == 0) summary.first_loss = report.loss;
    summary.last_loss = report.loss;
    ++summary.steps;

    const nlohmann::json memory = memory_max_over_ranks(runtime.world());
    const double tokens_per_second = tokens_per_step / seconds;
    metrics.write(
        {{"event", "step"},
         {"step", report.step},
         {"samples", engine.global_samples()},
         {"tokens", static_cast<std::int64_t>(engine.global_samples()) *
                        static_cast<std::int64_t>(data->tokens_per_sample())},
         {"loss", report.loss},
         {"lr", report.lr},
         {"loss_scale", report.loss_scale},
         {"grad_norm", std::isfinite(report.grad_norm) ? nlohmann::json(report.grad_norm) : nlohmann::json()},
         {"skipped", report.skipped},
         {"step_time_s", seconds},
         {"tokens_per_s", tokens_per_second},
         {"mem", memory},
         {"comm_bytes", report.comm_bytes},
         {"comm_wait_s", report.comm.wait_seconds},
         {"comm_busy_s", report.comm.busy_seconds}});
    if (leader && print_every > 0 &&
        (report.step % print_every == 0 || report.step == 1 || report.step == options.steps)) {
      std::printf(
          "step %6lld | loss %.4f | lr %.3e | scale %g | grad norm %.3f%s | %.0f tok/s | %.1f ms/step | "
          "peak %.1f MiB\n",
          static_cast<long long>(report.step), report.loss, report.lr, report.loss_scale, report.grad_norm,
          report.skipped ? " (skipped)" : "", tokens_per_second, seconds * 1e3,
          static_cast<double>(memory["peak"].get<std::int64_t>()) / (1 << 20));
      std::fflush(stdout);
    }
  }
  summary.mean_step_seconds = summary.steps > 0 ? total_seconds / static_cast<double>(summary.steps) : 0.0;
  if (leader && summary.steps > 0) {
    std::printf("zerotrain train: %lld steps, loss %.4f -> %.4f, %.1f ms/step, %lld skipped\n",
                static_cast<long long>(summary.steps), summary.first_loss, summary.last_loss,
                summary.mean_step_seconds * 1e3, static_cast<long long>(engine.skipped_steps()));
  }
  metrics.write({{"event", "end"},
                 {"steps", engine.global_steps()},
                 {"skipped_steps", engine.skipped_steps()},
                 {"first_loss", summary.first_loss},
                 {"last_loss", summary.last_loss},
                 {"mean_step_time_s", summary.mean_step_seconds}});
  return summary;
}

}  // namespace zt
