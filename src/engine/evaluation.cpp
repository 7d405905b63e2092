// zt::train's validation loss: the fixed eval set, its rows and their reduction in sample order.
#include "src/engine/evaluation.hpp"

#include <chrono>
#include <cmath>
#include <vector>

#include "zerotrain/error.hpp"

namespace zt::engine_detail {

Evaluator::Evaluator(Runtime& runtime, const Config& config, const Engine& engine, const std::string& path)
    : world_(runtime.world()), data_(make_eval_data(config, engine, path)), start_(data_->position()) {
  const EvalConfig eval = config.eval.value_or(EvalConfig{});
  interval_ = eval.interval;
  batches_ = eval.batches;
  const BatchSizes& batch = engine.batch();
  global_batch_ = batch.train_batch_size;
  micro_batch_ = batch.train_micro_batch_size_per_gpu;
  grad_accum_ = batch.gradient_accumulation_steps;
  data_parallel_ = batch.data_parallel_size;
  rank_ = engine.data_parallel_rank();
  contributes_ = config.pipeline.stage_count() <= 1 || pipeline_stage_of(runtime, config) == 0;
  const auto available = static_cast<std::int64_t>(start_.num_samples);
  ZT_CHECK_AS(ConfigError, batches_ <= available / global_batch_, "eval.batches ", batches_,
              " x train_batch_size ", global_batch_, " = ", batches_ * global_batch_,
              " eval samples, but the eval data (", data_->description(), ") holds ", available,
              "; lower eval.batches to at most ", available / global_batch_, " or give more eval data");
}

bool Evaluator::due(std::int64_t step, bool last_step) const {
  return last_step || (interval_ > 0 && step % interval_ == 0);
}

EvalResult Evaluator::run(Engine& engine) {
  const auto began = std::chrono::steady_clock::now();
  data_->restore(start_);  // the same samples every time
  const auto count = static_cast<std::size_t>(samples());
  std::vector<double> losses(count, 0.0);
  for (std::int64_t k = 0; k < batches_; ++k) {
    for (std::int64_t a = 0; a < grad_accum_; ++a) {
      const std::vector<double> rows = engine.eval_rows(data_->load(static_cast<std::uint64_t>(a)));
      ZT_CHECK(static_cast<std::int64_t>(rows.size()) == micro_batch_, "eval: ", rows.size(),
               " row losses from a micro-batch of ", micro_batch_);
      if (!contributes_) continue;
      // The positions of these rows in the eval stream (docs/data.md, the split across ranks).
      const std::int64_t first = k * global_batch_ + a * micro_batch_ * data_parallel_ + rank_ * micro_batch_;
      for (std::int64_t i = 0; i < micro_batch_; ++i) losses[static_cast<std::size_t>(first + i)] = rows[i];
    }
    data_->advance();
  }
  world_.all_reduce(losses.data(), losses.data(), losses.size(), DType::fp64, ReduceOp::sum);
  double sum = 0.0;
  for (const double loss : losses) sum += loss;  // in sample order, on every rank alike
  EvalResult result;
  result.loss = sum / static_cast<double>(count);
  result.perplexity = std::exp(result.loss);
  result.batches = batches_;
  result.samples = samples();
  result.tokens = samples() * static_cast<std::int64_t>(data_->tokens_per_sample());
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  return result;
}

}  // namespace zt::engine_detail
