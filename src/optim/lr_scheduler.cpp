// DeepSpeed's learning-rate schedules. Arithmetic is in double, in the order DeepSpeed's Python
// evaluates it, so values match to the last bit where the operations are the same.
#include "zerotrain/lr_scheduler.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <type_traits>

#include "zerotrain/error.hpp"

namespace zt {
namespace {

std::int64_t check_warmup_steps(std::int64_t steps, std::string_view scheduler) {
  ZT_CHECK_AS(ConfigError, steps > 0, scheduler, ": warmup_num_steps = ", steps,
              "; expected a positive integer");
  return std::max<std::int64_t>(2, steps);  // DeepSpeed: ln(N) must not be 0
}

double warmup_fraction(std::int64_t it, std::int64_t warmup_num_steps, WarmupType type,
                       double inverse_log_warmup) {
  if (type == WarmupType::log) return inverse_log_warmup * std::log(static_cast<double>(it + 1));
  return static_cast<double>(it) / static_cast<double>(warmup_num_steps);
}

}  // namespace

WarmupType warmup_type_from_name(std::string_view name) {
  if (name == "log") return WarmupType::log;
  if (name == "linear") return WarmupType::linear;
  ZT_THROW_AS(ConfigError, "warmup_type '", name, "' is not supported; expected 'log' or 'linear'");
}

// ---- LRRangeTest ---------------------------------------------------------------------------------

LRRangeTest::LRRangeTest(const LRRangeTestParams& params) : params_(params) {
  ZT_CHECK_AS(ConfigError, params.lr_range_test_step_size > 0,
              "LRRangeTest: lr_range_test_step_size = ", params.lr_range_test_step_size, "; expected > 0");
}

double LRRangeTest::lr_at(std::int64_t it) const {
  double interval = static_cast<double>(it + 1) / params_.lr_range_test_step_size;
  if (params_.lr_range_test_staircase) interval = std::floor(interval);
  return params_.lr_range_test_min_lr * (1.0 + params_.lr_range_test_step_rate * interval);
}

// ---- OneCycle ------------------------------------------------------------------------------------

OneCycle::OneCycle(const OneCycleParams& params) : params_(params) {
  ZT_CHECK_AS(ConfigError, params.cycle_min_lr.has_value() && params.cycle_max_lr.has_value(),
              "OneCycle: cycle_min_lr and cycle_max_lr are required; got ",
              params.cycle_min_lr ? "cycle_min_lr" : "no cycle_min_lr", " and ",
              params.cycle_max_lr ? "cycle_max_lr" : "no cycle_max_lr");
  min_lr_ = *params.cycle_min_lr;
  max_lr_ = *params.cycle_max_lr;
  first_step_size_ = params.cycle_first_step_size;
  second_step_size_ = params.cycle_second_step_size.value_or(first_step_size_);
  ZT_CHECK_AS(ConfigError, first_step_size_ > 0 && second_step_size_ > 0,
              "OneCycle: cycle_first_step_size = ", first_step_size_,
              ", cycle_second_step_size = ", second_step_size_, "; expected both > 0");
  total_size_ = first_step_size_ + second_step_size_;
  step_ratio_ = first_step_size_ / total_size_;
  first_stair_count_ = params.cycle_first_stair_count;
  second_stair_count_ = params.cycle_second_stair_count.value_or(first_stair_count_);
  ZT_CHECK_AS(ConfigError, first_stair_count_ >= 0 && second_stair_count_ >= 0, "OneCycle: stair counts are ",
              first_stair_count_, " and ", second_stair_count_, "; expected >= 0");
  ZT_CHECK_AS(ConfigError, params.decay_step_size >= 0,
              "OneCycle: decay_step_size = ", params.decay_step_size, "; expected >= 0 (0 disables decay)");
  // DeepSpeed tests these with math.isclose(x, 0), which is x == 0.
  skip_lr_decay_ = params.decay_step_size == 0 || params.decay_lr_rate == 0;
  skip_mom_decay_ = params.decay_step_size == 0 || params.decay_mom_rate == 0;
}

double OneCycle::scale_factor(std::int64_t it) const {
  const auto batch_iteration = static_cast<double>(it + 1);
  const double cycle = std::floor(1.0 + batch_iteration / total_size_);
  const double x = 1.0 + batch_iteration / total_size_ - cycle;
  double scale;
  std::int64_t stair_count;
  if (x <= step_ratio_) {
    scale = x / step_ratio_;
    stair_count = first_stair_count_;
  } else {
    scale = (x - 1.0) / (step_ratio_ - 1.0);
    stair_count = second_stair_count_;
  }
  if (stair_count > 0) {
    // Staircase: hold the value flat over steps of the half cycle, quantised from the integer
    // position in the cycle (not from `scale`, which can land just below an exact stair).
    const double cycle_iteration = std::fmod(batch_iteration, total_size_);
    const auto stairs = static_cast<double>(stair_count);
    const double position = cycle_iteration <= first_step_size_
                                ? cycle_iteration * stairs / first_step_size_
                                : (total_size_ - cycle_iteration) * stairs / second_step_size_;
    scale = std::floor(position) / stairs;
  }
  return scale;
}

double OneCycle::lr_at(std::int64_t it) const {
  if (static_cast<double>(it) < total_size_) return min_lr_ + (max_lr_ - min_lr_) * scale_factor(it);
  if (skip_lr_decay_) return min_lr_;
  const double decay_interval = (static_cast<double>(it) - total_size_ + 1.0) / params_.decay_step_size;
  return min_lr_ / (1.0 + params_.decay_lr_rate * decay_interval);
}

std::optional<Betas> OneCycle::betas_at(std::int64_t it) const {
  if (!params_.cycle_momentum) return std::nullopt;
  constexpr double kBeta2 = 0.99;                           // DeepSpeed sets (momentum, 0.99)
  if (it < 0) return Betas{params_.cycle_min_mom, kBeta2};  // the value set at construction
  const double min_mom = params_.cycle_min_mom;
  const double max_mom = params_.cycle_max_mom;
  if (static_cast<double>(it) < total_size_)
    return Betas{max_mom - (max_mom - min_mom) * scale_factor(it), kBeta2};
  if (skip_mom_decay_) return Betas{max_mom, kBeta2};
  const double decay_interval = (static_cast<double>(it) - total_size_ + 1.0) / params_.decay_step_size;
  const double grown = max_mom * (1.0 + params_.decay_mom_rate * decay_interval);
  return Betas{std::min(grown, one_cycle_momentum_ceiling(params_)), kBeta2};
}

double one_cycle_momentum_ceiling(const OneCycleParams& params) {
  return std::max(0.999, params.cycle_max_mom);
}

std::optional<std::int64_t> one_cycle_first_clamped_step(const OneCycleParams& params) {
  if (!params.cycle_momentum || params.decay_mom_rate == 0 || params.decay_step_size == 0 ||
      params.cycle_max_mom <= 0)
    return std::nullopt;
  const double total_size =
      params.cycle_first_step_size + params.cycle_second_step_size.value_or(params.cycle_first_step_size);
  // betas_at(it) reaches the ceiling at it >= total - 1 + decay_step_size * (ceiling / max - 1) /
  // rate; optimizer step s (1-based) uses it = s - 2 (the first update runs on the value set at
  // construction, it = -1).
  const double growth = one_cycle_momentum_ceiling(params) / params.cycle_max_mom - 1.0;
  const double first_iteration = std::max(
      total_size, std::ceil(total_size - 1.0 + params.decay_step_size * growth / params.decay_mom_rate));
  return static_cast<std::int64_t>(first_iteration) + 2;
}

// ---- WarmupLR / WarmupDecayLR --------------------------------------------------------------------

WarmupLR::WarmupLR(double min_lr, double max_lr, std::int64_t warmup_num_steps, WarmupType type)
    : min_lr_(min_lr),
      delta_lr_(max_lr - min_lr),
      warmup_num_steps_(warmup_num_steps),
      type_(type),
      inverse_log_warmup_(1.0 / std::log(static_cast<double>(warmup_num_steps))) {}

WarmupLR::WarmupLR(const WarmupLRParams& params, double optimizer_lr)
    : WarmupLR(params.warmup_min_lr, params.warmup_max_lr.value_or(optimizer_lr),
               check_warmup_steps(params.warmup_num_steps, "WarmupLR"), params.warmup_type) {}

double WarmupLR::warmup_gamma(std::int64_t it) const {
  return warmup_fraction(it, warmup_num_steps_, type_, inverse_log_warmup_);
}

double WarmupLR::gamma(std::int64_t it) const {
  return it < warmup_num_steps_ ? warmup_gamma(it) : 1.0;
}

double WarmupLR::lr_at(std::int64_t it) const {
  if (it < 0) return min_lr_;  // before the first step(): DeepSpeed returns the min lr
  return min_lr_ + delta_lr_ * gamma(it);
}

WarmupDecayLR::WarmupDecayLR(const WarmupDecayLRParams& params)
    : WarmupLR(params.warmup_min_lr, params.warmup_max_lr,
               check_warmup_steps(params.warmup_num_steps, "WarmupDecayLR"), params.warmup_type),
      total_num_steps_(params.total_num_steps.value_or(0)) {
  ZT_CHECK_AS(ConfigError, params.total_num_steps.has_value(), "WarmupDecayLR: total_num_steps is required");
}

double WarmupDecayLR::gamma(std::int64_t it) const {
  if (it < warmup_num_steps()) return warmup_gamma(it);
  return std::max(0.0, static_cast<double>(total_num_steps_ - it) /
                           std::max(1.0, static_cast<double>(total_num_steps_ - warmup_num_steps())));
}

// ---- WarmupCosineLR ------------------------------------------------------------------------------

WarmupCosineLR::WarmupCosineLR(const WarmupCosineLRParams& params, double optimizer_lr)
    : params_(params),
      optimizer_lr_(optimizer_lr),
      total_num_steps_(params.total_num_steps.value_or(0)),
      warmup_num_steps_(check_warmup_steps(params.warmup_num_steps, "WarmupCosineLR")),
      inverse_log_warmup_(1.0 / std::log(static_cast<double>(warmup_num_steps_))) {
  ZT_CHECK_AS(ConfigError, params.total_num_steps.has_value(), "WarmupCosineLR: total_num_steps is required");
}

double WarmupCosineLR::ratio_at(std::int64_t it) const {
  if (it < 0) return 0.0;  // DeepSpeed: lr 0 before the first step()
  if (it < warmup_num_steps_) {
    const double ratio = warmup_fraction(it, warmup_num_steps_, params_.warmup_type, inverse_log_warmup_);
    return params_.warmup_min_ratio + ratio * (1.0 - params_.warmup_min_ratio);
  }
  const auto real_last_step = static_cast<double>(it - warmup_num_steps_ + 1);
  const auto real_total_steps =
      static_cast<double>(std::max<std::int64_t>(1, total_num_steps_ - warmup_num_steps_));
  const double progress = std::min(1.0, real_last_step / real_total_steps);  // stay at the floor past the end
  const double ratio = (1.0 + std::cos(std::numbers::pi * progress)) / 2.0;
  return std::max(0.0, params_.cos_min_ratio + (1.0 - params_.cos_min_ratio) * ratio);
}

double WarmupCosineLR::lr_at(std::int64_t it) const {
  return optimizer_lr_ * ratio_at(it);
}

// ---- factory -------------------------------------------------------------------------------------

std::unique_ptr<LRScheduler> make_lr_scheduler(const LRSchedulerParams& params, double optimizer_lr) {
  return std::visit(
      [&](const auto& p) -> std::unique_ptr<LRScheduler> {
        using P = std::decay_t<decltype(p)>;
        if constexpr (std::is_same_v<P, LRRangeTestParams>) return std::make_unique<LRRangeTest>(p);
        if constexpr (std::is_same_v<P, OneCycleParams>) return std::make_unique<OneCycle>(p);
        if constexpr (std::is_same_v<P, WarmupLRParams>) return std::make_unique<WarmupLR>(p, optimizer_lr);
        if constexpr (std::is_same_v<P, WarmupDecayLRParams>) return std::make_unique<WarmupDecayLR>(p);
        if constexpr (std::is_same_v<P, WarmupCosineLRParams>)
          return std::make_unique<WarmupCosineLR>(p, optimizer_lr);
      },
      params);
}

}  // namespace zt
