// zt::train's validation loss (docs/config.md, "eval"): a fixed set of eval samples, evaluated
// without gradients and reduced in sample order, so that the value is the same at any world size,
// ZeRO stage and pipeline split, and the training (optimizer state, loss scale, data order) never
// sees it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "zerotrain/config.hpp"
#include "zerotrain/engine.hpp"
#include "zerotrain/runtime.hpp"
#include "zerotrain/trainer.hpp"

namespace zt::engine_detail {

struct EvalResult {
  double loss = 0.0;        // the mean over the eval samples of each one's mean loss over its positions
  double perplexity = 0.0;  // exp(loss)
  std::int64_t batches = 0;
  std::int64_t samples = 0;
  std::int64_t tokens = 0;
  double seconds = 0.0;
};

/// The eval set is the first `batches` x train_batch_size windows of the eval data in file order:
/// eval batch k is stream positions [k B, (k+1) B), cut into micro-batches across the data-parallel
/// ranks as the training batches are (docs/data.md). Each rank evaluates its rows with
/// Engine::eval_rows; the per-sample losses are summed over all ranks into one vector (each entry
/// has exactly one non-zero contribution, so the sum is exact in any order) and every rank adds
/// them up in sample order.
class Evaluator {
 public:
  Evaluator(Runtime& runtime, const Config& config, const Engine& engine, const std::string& path);

  /// Whether to evaluate after optimizer step `step`: every interval-th step, and the run's last.
  [[nodiscard]] bool due(std::int64_t step, bool last_step) const;
  /// The validation loss of the engine's current parameters (collective over all ranks).
  EvalResult run(Engine& engine);

  [[nodiscard]] std::string description() const { return data_->description(); }
  [[nodiscard]] std::int64_t interval() const { return interval_; }
  [[nodiscard]] std::int64_t batches() const { return batches_; }
  [[nodiscard]] std::int64_t samples() const { return batches_ * global_batch_; }

 private:
  Communicator& world_;
  std::unique_ptr<TrainingData> data_;
  DataPosition start_;
  std::int64_t interval_ = 0;
  std::int64_t batches_ = 0;
  std::int64_t global_batch_ = 0;
  std::int64_t micro_batch_ = 0;
  std::int64_t grad_accum_ = 0;
  std::int64_t data_parallel_ = 0;
  std::int64_t rank_ = 0;
  bool contributes_ = true;  // pipeline stage 0 of its data-parallel group (every rank without stages)
};

}  // namespace zt::engine_detail
