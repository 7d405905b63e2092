// Learning-rate schedules with DeepSpeed's formulas and code defaults (deepspeed/runtime/lr_schedules.py):
// LRRangeTest, OneCycle (lr and momentum), WarmupLR, WarmupDecayLR, WarmupCosineLR.
//
// Step convention (DeepSpeed's): a scheduler holds `last_batch_iteration`, -1 at the start. The
// engine uses lr() for an optimizer update, then calls step() (skipped updates do not step), so the
// n-th applied update (n = 0, 1, ...) runs with lr_at(n - 1). lr_at() is pure; the state is one
// integer, saved and restored as SchedulerState.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <variant>

namespace zt {

/// How the warmup ramps: gamma = ln(it + 1) / ln(N) ("log", the default) or it / N ("linear").
enum class WarmupType { log, linear };
/// "log" or "linear"; anything else raises ConfigError (DeepSpeed warns and falls back to log).
WarmupType warmup_type_from_name(std::string_view name);

/// lr = min_lr * (1 + step_rate * interval), interval = (it + 1) / step_size, floored with staircase.
struct LRRangeTestParams {
  double lr_range_test_min_lr = 1e-3;
  double lr_range_test_step_size = 2000;
  double lr_range_test_step_rate = 1.0;
  bool lr_range_test_staircase = false;
};

/// One triangular cycle from min to max lr (momentum from max to min) and back, then decay:
/// lr = min_lr / (1 + decay_lr_rate * k / decay_step_size), k = steps after the cycle.
struct OneCycleParams {
  std::optional<double> cycle_min_lr;  // required
  std::optional<double> cycle_max_lr;  // required
  double decay_lr_rate = 0.0;
  double cycle_first_step_size = 2000;
  std::optional<double> cycle_second_step_size;          // default: cycle_first_step_size
  std::int64_t cycle_first_stair_count = 0;              // 0: continuous
  std::optional<std::int64_t> cycle_second_stair_count;  // default: cycle_first_stair_count
  double decay_step_size = 0;                            // 0: no decay after the cycle
  bool cycle_momentum = true;
  double cycle_min_mom = 0.8;
  double cycle_max_mom = 0.9;
  double decay_mom_rate = 0.0;
};

/// After the cycle DeepSpeed grows momentum as cycle_max_mom * (1 + decay_mom_rate * k /
/// decay_step_size) without bound; once beta1 passes 1 Adam's first moment diverges (DeepSpeed keeps
/// running on it). zerotrain holds beta1 at this ceiling instead: max(0.999, cycle_max_mom).
double one_cycle_momentum_ceiling(const OneCycleParams& params);
/// The first optimizer step (1-based, counting from a fresh start) whose beta1 is held at the
/// ceiling; nullopt when momentum never grows (cycle_momentum off, decay_mom_rate or
/// decay_step_size 0).
std::optional<std::int64_t> one_cycle_first_clamped_step(const OneCycleParams& params);

/// lr = min + (max - min) * gamma during warmup, then max.
struct WarmupLRParams {
  double warmup_min_lr = 0.0;
  std::optional<double> warmup_max_lr;   // default: the optimizer's lr
  std::int64_t warmup_num_steps = 1000;  // must be > 0; at least 2 is used
  WarmupType warmup_type = WarmupType::log;
};

/// WarmupLR, then linear decay: gamma = max(0, (T - it) / max(1, T - N)).
struct WarmupDecayLRParams {
  std::optional<std::int64_t> total_num_steps;  // required
  double warmup_min_lr = 0.0;
  double warmup_max_lr = 0.001;  // DeepSpeed's default here is a number, not the optimizer's lr
  std::int64_t warmup_num_steps = 1000;
  WarmupType warmup_type = WarmupType::log;
};

/// A ratio of the optimizer's lr: warmup from warmup_min_ratio to 1, then cosine to cos_min_ratio
/// (progress clamped at 1, so the ratio stays at the floor after total_num_steps).
struct WarmupCosineLRParams {
  std::optional<std::int64_t> total_num_steps;  // required
  double warmup_min_ratio = 0.0;
  std::int64_t warmup_num_steps = 1000;
  double cos_min_ratio = 0.0001;
  WarmupType warmup_type = WarmupType::log;
};

using LRSchedulerParams = std::variant<LRRangeTestParams, OneCycleParams, WarmupLRParams, WarmupDecayLRParams,
                                       WarmupCosineLRParams>;

/// What a checkpoint keeps of a scheduler (DeepSpeed's state_dict).
struct LRSchedulerState {
  std::int64_t last_batch_iteration = -1;
};

/// Adam's (beta1, beta2) as OneCycle sets them. DeepSpeed writes beta2 = 0.99 alongside the cycled
/// beta1 (a quirk kept for parity); optimizers without betas (SGD) get no momentum cycling.
struct Betas {
  double beta1 = 0.9;
  double beta2 = 0.99;
};

class LRScheduler {
 public:
  virtual ~LRScheduler() = default;

  /// DeepSpeed's type name ("WarmupLR", "OneCycle", ...).
  virtual std::string_view name() const = 0;
  /// The lr once last_batch_iteration == it (pure; it = -1 is the value set at construction).
  virtual double lr_at(std::int64_t it) const = 0;
  /// The betas to set once last_batch_iteration == it; nullopt when the schedule has no momentum.
  virtual std::optional<Betas> betas_at(std::int64_t /*it*/) const { return std::nullopt; }

  double lr() const { return lr_at(last_batch_iteration_); }
  std::optional<Betas> betas() const { return betas_at(last_batch_iteration_); }
  /// Advance by one batch (after an applied optimizer update), or jump to `batch_iteration`.
  void step() { ++last_batch_iteration_; }
  void step(std::int64_t batch_iteration) { last_batch_iteration_ = batch_iteration; }
  std::int64_t last_batch_iteration() const { return last_batch_iteration_; }

  LRSchedulerState state() const { return {last_batch_iteration_}; }
  void load_state(const LRSchedulerState& state) { last_batch_iteration_ = state.last_batch_iteration; }

 protected:
  LRScheduler() = default;

 private:
  std::int64_t last_batch_iteration_ = -1;
};

class LRRangeTest final : public LRScheduler {
 public:
  explicit LRRangeTest(const LRRangeTestParams& params);
  std::string_view name() const override { return "LRRangeTest"; }
  double lr_at(std::int64_t it) const override;

 private:
  LRRangeTestParams params_;
};

class OneCycle final : public LRScheduler {
 public:
  explicit OneCycle(const OneCycleParams& params);
  std::string_view name() const override { return "OneCycle"; }
  double lr_at(std::int64_t it) const override;
  std::optional<Betas> betas_at(std::int64_t it) const override;

 private:
  double scale_factor(std::int64_t it) const;

  OneCycleParams params_;
  double min_lr_, max_lr_;
  double first_step_size_, second_step_size_, total_size_, step_ratio_;
  std::int64_t first_stair_count_, second_stair_count_;
  bool skip_lr_decay_, skip_mom_decay_;
};

class WarmupLR : public LRScheduler {
 public:
  /// optimizer_lr is the default warmup_max_lr.
  WarmupLR(const WarmupLRParams& params, double optimizer_lr);
  std::string_view name() const override { return "WarmupLR"; }
  double lr_at(std::int64_t it) const override;

 protected:
  WarmupLR(double min_lr, double max_lr, std::int64_t warmup_num_steps, WarmupType type);
  /// Warmup fraction for it < warmup_num_steps().
  double warmup_gamma(std::int64_t it) const;
  virtual double gamma(std::int64_t it) const;
  std::int64_t warmup_num_steps() const { return warmup_num_steps_; }

 private:
  double min_lr_, delta_lr_;
  std::int64_t warmup_num_steps_;  // max(2, given)
  WarmupType type_;
  double inverse_log_warmup_;
};

class WarmupDecayLR final : public WarmupLR {
 public:
  explicit WarmupDecayLR(const WarmupDecayLRParams& params);
  std::string_view name() const override { return "WarmupDecayLR"; }

 private:
  double gamma(std::int64_t it) const override;
  std::int64_t total_num_steps_;
};

class WarmupCosineLR final : public LRScheduler {
 public:
  /// The schedule is a ratio of optimizer_lr.
  WarmupCosineLR(const WarmupCosineLRParams& params, double optimizer_lr);
  std::string_view name() const override { return "WarmupCosineLR"; }
  double lr_at(std::int64_t it) const override;
  double ratio_at(std::int64_t it) const;

 private:
  WarmupCosineLRParams params_;
  double optimizer_lr_;
  std::int64_t total_num_steps_;
  std::int64_t warmup_num_steps_;
  double inverse_log_warmup_;
};

/// DeepSpeed's scheduler type names, as written in ds_config "scheduler.type" (exact case there).
inline constexpr std::string_view kLRSchedulerTypes[] = {"LRRangeTest", "OneCycle", "WarmupLR",
                                                         "WarmupDecayLR", "WarmupCosineLR"};

/// Build the scheduler that `params` describes; optimizer_lr feeds the defaults that use it.
std::unique_ptr<LRScheduler> make_lr_scheduler(const LRSchedulerParams& params, double optimizer_lr);

}  // namespace zt
