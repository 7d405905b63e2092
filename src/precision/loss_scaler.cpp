// DeepSpeed's DynamicLossScaler (fp16/loss_scaler.py), static fp16 scaling and the bf16 skip rule.
#include "zerotrain/loss_scaler.hpp"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <sstream>

#include "zerotrain/error.hpp"

namespace zt {
namespace {

constexpr double kScaleFactor = 2.0;  // DeepSpeed's scale_factor: halve on overflow, double after a window

std::string format_scale(double scale) {
  std::ostringstream out;
  out << scale;
  return out.str();
}

}  // namespace

LossScaler::LossScaler(DType precision, const LossScalerParams& params)
    : precision_(precision),
      params_(params),
      sink_([](std::string_view message) { std::cerr << message << '\n'; }) {
  ZT_CHECK_AS(ConfigError, precision == DType::fp16 || precision == DType::bf16 || precision == DType::fp32,
              "loss scaler for ", dtype_name(precision), " training; expected fp16, bf16 or fp32");
  if (precision != DType::fp16) {
    // bf16 and fp32 have no loss scale; bf16 may still skip steps with inf/nan gradients.
    checks_overflow_ = precision == DType::bf16 && params.check_grad_overflow;
    return;
  }
  checks_overflow_ = true;
  ZT_CHECK_AS(ConfigError, std::isfinite(params.loss_scale) && params.loss_scale >= 0.0,
              "fp16.loss_scale = ", params.loss_scale, "; expected a finite value >= 0 (0 = dynamic)");
  if (params.loss_scale > 0.0) {
    state_.cur_scale = params.loss_scale;
    return;
  }
  dynamic_ = true;
  const double initial = std::ldexp(1.0, params.initial_scale_power);
  ZT_CHECK_AS(ConfigError, std::isfinite(initial) && initial > 0.0,
              "fp16.initial_scale_power = ", params.initial_scale_power,
              "; expected 2^power to be a finite positive scale");
  ZT_CHECK_AS(ConfigError, params.loss_scale_window > 0,
              "fp16.loss_scale_window = ", params.loss_scale_window, "; expected a positive integer");
  ZT_CHECK_AS(ConfigError, params.hysteresis > 0, "fp16.hysteresis = ", params.hysteresis,
              "; expected a positive integer");
  ZT_CHECK_AS(ConfigError, std::isfinite(params.min_loss_scale) && params.min_loss_scale > 0.0,
              "fp16.min_loss_scale = ", params.min_loss_scale, "; expected a finite value > 0");
  state_.cur_scale = initial;
  state_.cur_hysteresis = params.hysteresis;
}

void LossScaler::set_report_interval(std::int64_t steps) {
  ZT_CHECK(steps >= 1, "overflow report interval ", steps, "; expected >= 1 step");
  report_interval_ = steps;
}

void LossScaler::load_state(const LossScalerState& state) {
  ZT_CHECK(std::isfinite(state.cur_scale) && state.cur_scale > 0.0, "loss scaler state has scale ",
           state.cur_scale, "; expected a finite positive value");
  ZT_CHECK(state.cur_hysteresis >= 1 && state.skipped_steps >= 0 && state.cur_iter >= 0,
           "loss scaler state is inconsistent (hysteresis ", state.cur_hysteresis, ", skipped steps ",
           state.skipped_steps, ", iteration ", state.cur_iter,
           "); expected hysteresis >= 1 and counts >= 0");
  state_ = state;
  streak_ = 0;
  suppressed_ = 0;
}

void LossScaler::emit(const std::string& message) const {
  if (sink_) sink_(message);
}

void LossScaler::report_streak(std::string_view why) {
  std::ostringstream out;
  out << "[zerotrain] OVERFLOW: skipped " << suppressed_ << " more step" << (suppressed_ == 1 ? "" : "s")
      << " since last report (" << streak_ << " in a row" << why << ")";
  if (precision_ == DType::fp16) out << "; loss scale now " << format_scale(state_.cur_scale);
  emit(out.str());
  suppressed_ = 0;
}

bool LossScaler::update(bool overflow) {
  if (!checks_overflow_) overflow = false;  // fp32, or bf16 with check_grad_overflow off

  if (!overflow) {
    if (streak_ > 0 && suppressed_ > 0) report_streak(", ended");
    streak_ = 0;
    if (dynamic_) {
      if (params_.consecutive_hysteresis) {
        if (state_.cur_hysteresis != params_.hysteresis) {
          emit("[zerotrain] Consecutive hysteresis is enabled. Restoring hysteresis to " +
               std::to_string(params_.hysteresis));
        }
        state_.cur_hysteresis = params_.hysteresis;
      }
      const std::int64_t stable_interval = state_.cur_iter - state_.last_overflow_iter - 1;
      if (stable_interval > 0 && stable_interval % params_.loss_scale_window == 0) {
        if (!params_.consecutive_hysteresis) state_.cur_hysteresis = params_.hysteresis;
        state_.cur_scale *= kScaleFactor;
      }
      ++state_.cur_iter;
    }
    return false;
  }

  // Overflow: the step is skipped. Work out the message first, then change the state.
  std::string message = "[zerotrain] OVERFLOW! Skipping step.";
  if (dynamic_) {
    const double attempted = state_.cur_scale;
    const bool halves = params_.rule == LossScaleRule::fp16_optimizer || params_.hysteresis == 1 ||
                        state_.cur_hysteresis == 1;
    if (halves) {
      if (state_.cur_scale == params_.min_loss_scale && params_.rule == LossScaleRule::dynamic_loss_scaler) {
        ZT_THROW(
            "fp16 dynamic loss scaling: gradients overflowed (inf/nan) with the loss scale already at ",
            "min_loss_scale = ", format_scale(params_.min_loss_scale),
            ". Current loss scale already at minimum - cannot decrease scale anymore. Exiting run. ",
            "This was overflow ", streak_ + 1, " in a row (", state_.skipped_steps,
            " steps skipped in total); expected finite gradients at this scale: check the learning rate ",
            "and the data for the source of inf/nan, or lower fp16.min_loss_scale");
      }
      const double next = std::max(state_.cur_scale / kScaleFactor, params_.min_loss_scale);
      message += " Attempted loss scale: " + format_scale(attempted) + ", reducing to " + format_scale(next);
      state_.cur_scale = next;
    } else {
      message += " Attempted loss scale: " + format_scale(attempted) + ", but hysteresis is " +
                 std::to_string(state_.cur_hysteresis) + ". Reducing hysteresis to " +
                 std::to_string(state_.cur_hysteresis - 1);
      --state_.cur_hysteresis;
    }
    state_.last_overflow_iter = state_.cur_iter;
    ++state_.cur_iter;
  } else if (precision_ == DType::bf16) {
    message += " (bf16 gradients hold inf/nan; bf16.check_grad_overflow is on)";
  } else {
    message += " Static loss scale " + format_scale(state_.cur_scale) + " is kept.";
  }
  ++state_.skipped_steps;

  ++streak_;
  if (streak_ == 1) {
    emit(message);  // a new overflow event: report it in full
  } else if (++suppressed_ >= report_interval_) {
    report_streak(", continuing");
  }
  return true;
}

}  // namespace zt
