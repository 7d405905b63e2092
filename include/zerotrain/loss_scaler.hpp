// Loss scaling for mixed precision: DeepSpeed's DynamicLossScaler (fp16), a static fp16 scale, and the
// overflow-skip rule of bf16 (no scaling; check_grad_overflow).
//
// Per training step the engine: scales the loss by loss_scale(); after backward, checks the
// gradients for inf/nan when checks_overflow() (kernels::grad_sum_squares gives found_inf with the
// norm; ZeRO all-reduces it); calls update(found_inf), which adjusts the scale and returns whether
// to skip the optimizer update; otherwise unscales with grad_scale = clip_coefficient / loss_scale
// (loss_scale() as it was BEFORE update(): an applied step never changes the scale it was made with,
// and a skipped step is not applied).
//
// Logging policy (DeepSpeed prints "OVERFLOW! Skipping step" for every overflow, which floods logs):
//   - the first overflow of a run of consecutive overflows is reported at once, with the attempted
//     scale and what happens to it (halved, or hysteresis decremented);
//   - further consecutive overflows are counted, not printed; every `report_interval` of them (100
//     by default) and when the run ends (the next clean step), one summary line reports how many
//     steps were skipped since the last report, the run length and the current scale;
//   - the consecutive_hysteresis "restoring hysteresis" note is printed only when it changes
//     something (after an overflow), not on every clean step.
// Messages go to a sink (stderr by default); the engine installs one that prints on rank 0 only.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>

#include "zerotrain/dtype.hpp"

namespace zt {

/// Which of DeepSpeed's two dynamic fp16 scalers to follow.
enum class LossScaleRule {
  /// DynamicLossScaler (fp16/loss_scaler.py), DeepSpeed's ZeRO stages 1-3: `hysteresis` overflows
  /// are tolerated before halving; an overflow at min_loss_scale is fatal.
  dynamic_loss_scaler,
  /// FP16_Optimizer._update_scale (fp16/fused_optimizer.py), DeepSpeed's stage 0: every overflow
  /// halves the scale (hysteresis is not used); at min_loss_scale the scale stays and the run goes on.
  fp16_optimizer,
};

/// The fp16 and bf16 ds_config keys that matter, with DeepSpeed's code defaults.
struct LossScalerParams {
  LossScaleRule rule = LossScaleRule::dynamic_loss_scaler;
  double loss_scale = 0.0;                // fp16.loss_scale: 0 = dynamic, > 0 = static scale
  int initial_scale_power = 16;           // dynamic: start at 2^power
  std::int64_t loss_scale_window = 1000;  // clean steps between doublings
  std::int64_t hysteresis = 2;            // overflows tolerated before halving (DeepSpeed's delayed_shift)
  bool consecutive_hysteresis = false;    // refill hysteresis on every clean step
  double min_loss_scale = 1.0;            // floor; an overflow at the floor is fatal
  bool check_grad_overflow = true;        // bf16: skip steps whose gradients hold inf/nan
};

/// Everything update() changes; saved with checkpoints (DeepSpeed pickles its scaler object).
struct LossScalerState {
  double cur_scale = 1.0;
  std::int64_t cur_iter = 0;
  std::int64_t last_overflow_iter = -1;
  std::int64_t cur_hysteresis = 1;
  std::int64_t skipped_steps = 0;
};

class LossScaler {
 public:
  using LogSink = std::function<void(std::string_view message)>;

  /// precision: the 16-bit (or fp32) training dtype. fp16 scales (dynamic unless loss_scale > 0);
  /// bf16 and fp32 use scale 1. Invalid values raise ConfigError naming the key.
  explicit LossScaler(DType precision, const LossScalerParams& params = {});

  DType precision() const { return precision_; }
  /// Multiply the loss by this before backward.
  double loss_scale() const { return state_.cur_scale; }
  bool dynamic() const { return dynamic_; }
  /// Whether the engine must look for inf/nan in the gradients (fp16 always; bf16 when
  /// check_grad_overflow; fp32 never). When false, update(false) is the only meaningful call.
  bool checks_overflow() const { return checks_overflow_; }

  /// Record one step's outcome; returns true when the optimizer update must be skipped.
  /// Dynamic fp16 follows DynamicLossScaler.update_scale exactly (rule dynamic_loss_scaler: at the
  /// minimum scale an overflow raises zt::Error ("Current loss scale already at minimum ...") and
  /// changes nothing), or FP16_Optimizer._update_scale (rule fp16_optimizer).
  bool update(bool overflow);

  std::int64_t skipped_steps() const { return state_.skipped_steps; }
  std::int64_t hysteresis() const { return state_.cur_hysteresis; }

  LossScalerState state() const { return state_; }
  void load_state(const LossScalerState& state);

  void set_log_sink(LogSink sink) { sink_ = std::move(sink); }
  /// Summarize a long run of consecutive overflows every `steps` suppressed reports (>= 1).
  void set_report_interval(std::int64_t steps);

 private:
  void emit(const std::string& message) const;
  void report_streak(std::string_view why);

  DType precision_;
  LossScalerParams params_;
  bool dynamic_ = false;
  bool checks_overflow_ = false;
  LossScalerState state_;
  LogSink sink_;
  std::int64_t report_interval_ = 100;
  std::int64_t streak_ = 0;      // consecutive overflows so far
  std::int64_t suppressed_ = 0;  // overflows in this run not yet reported
};

}  // namespace zt
