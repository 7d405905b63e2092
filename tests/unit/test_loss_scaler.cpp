// DynamicLossScaler semantics (DeepSpeed's half_precision/test_dynamic_loss_scale.py scenarios), static
// and bf16 modes, the logging policy, and the fused inf/nan check that feeds update().
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/optimizer_kernels.hpp"
#include "zerotrain/dtype.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/loss_scaler.hpp"

namespace {

using zt::DType;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

/// A gradient buffer of `dtype` with normal values and `injected` written at random positions.
struct GradBuffer {
  DType dtype;
  std::vector<float> f32;
  std::vector<std::uint16_t> u16;
  const void* data() const {
    return dtype == DType::fp32 ? static_cast<const void*>(f32.data()) : u16.data();
  }
  std::size_t size() const { return dtype == DType::fp32 ? f32.size() : u16.size(); }
};

GradBuffer make_buffer(DType dtype, std::size_t n, const std::vector<std::size_t>& positions, float injected,
                       unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> values(n);
  for (float& x : values) x = dist(rng);
  for (std::size_t pos : positions) values[pos] = injected;
  GradBuffer buffer{dtype, {}, {}};
  if (dtype == DType::fp32) {
    buffer.f32 = values;
  } else {
    for (float x : values)
      buffer.u16.push_back(dtype == DType::bf16 ? zt::bf16::from_float(x) : zt::fp16::from_float(x));
  }
  return buffer;
}

/// What the engine does: one fused pass over the gradients says whether they overflowed.
bool gradients_overflow(float injected, unsigned seed) {
  const std::size_t n = 4099;
  std::mt19937 rng(seed);
  const std::size_t position = std::uniform_int_distribution<std::size_t>(0, n - 1)(rng);
  const GradBuffer grads = make_buffer(DType::fp16, n, {position}, injected, seed);
  return zt::kernels::grad_sum_squares(zt::default_stream(zt::Device::host()), grads.data(), DType::fp16, n)
      .found_inf;
}

zt::LossScalerParams dynamic_params(int power, std::int64_t window, std::int64_t hysteresis) {
  zt::LossScalerParams p;
  p.initial_scale_power = power;
  p.loss_scale_window = window;
  p.hysteresis = hysteresis;
  return p;
}

zt::LossScaler quiet_scaler(DType dtype, const zt::LossScalerParams& params) {
  zt::LossScaler scaler(dtype, params);
  scaler.set_log_sink(nullptr);
  return scaler;
}

// ---- scenario 11: dynamic loss scale ------------------------------------------------------------

TEST(DynamicLossScale, NoOverflowDoublesEveryWindow) {
  // initial_scale_power 8, loss_scale_window 2: the scale doubles every 2 clean iterations.
  zt::LossScaler scaler = quiet_scaler(DType::fp16, dynamic_params(8, 2, 2));
  double expected = 256.0;
  for (int i = 0; i < 10; ++i) {
    EXPECT_FALSE(scaler.update(gradients_overflow(0.5f, i)));
    EXPECT_EQ(scaler.loss_scale(), expected) << "iteration " << i;
    EXPECT_EQ(scaler.state().cur_iter, i + 1);
    if (scaler.state().cur_iter % 2 == 0) expected *= 2;  // DeepSpeed's test: doubles at the next update
  }
  EXPECT_EQ(scaler.loss_scale(), 256.0 * 16);  // doubled at iterations 2, 4, 6, 8
  EXPECT_EQ(scaler.skipped_steps(), 0);
}

TEST(DynamicLossScale, InfMinusInfAndNanHalveEachStepDownToTheMinimum) {
  zt::LossScaler scaler = quiet_scaler(DType::fp16, dynamic_params(8, 2, 1));
  const float injected[] = {kInf, -kInf, kNan, kNan, kInf, -kInf, kNan, kInf};
  double expected = 256.0;
  for (int i = 0; i < 8; ++i) {
    EXPECT_TRUE(scaler.update(gradients_overflow(injected[i], 100 + i))) << "iteration " << i;
    expected = std::max(expected / 2, 1.0);
    EXPECT_EQ(scaler.loss_scale(), expected) << "iteration " << i;
    EXPECT_EQ(scaler.state().cur_iter, i + 1);
  }
  EXPECT_EQ(scaler.loss_scale(), 1.0);  // 2^8 / 2^8: at min_loss_scale
  EXPECT_EQ(scaler.skipped_steps(), 8);
  // One more overflow at the minimum is fatal, with DeepSpeed's words in a zt::Error, and changes nothing.
  try {
    scaler.update(gradients_overflow(kNan, 200));
    FAIL() << "no error at the minimum scale";
  } catch (const zt::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("Current loss scale already at minimum - cannot decrease scale anymore"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("min_loss_scale = 1"), std::string::npos) << what;
  }
  EXPECT_EQ(scaler.state().cur_iter, 8);
  EXPECT_EQ(scaler.skipped_steps(), 8);
}

TEST(DynamicLossScale, MixedSequence) {
  // DeepSpeed's test_some_overflow: hysteresis 1, window 2.
  zt::LossScaler scaler = quiet_scaler(DType::fp16, dynamic_params(8, 2, 1));
  std::int64_t iteration = 0;
  // Two overflows: 256 -> 64.
  for (float g : {kInf, kNan}) EXPECT_TRUE(scaler.update(gradients_overflow(g, 300 + iteration++)));
  EXPECT_EQ(scaler.loss_scale(), 64.0);
  // window + 1 = 3 clean steps: stable intervals 0, 1, 2 -> one doubling: 128.
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(scaler.update(gradients_overflow(0.1f, 300 + iteration++)));
  EXPECT_EQ(scaler.loss_scale(), 128.0);
  // One overflow: 64.
  EXPECT_TRUE(scaler.update(gradients_overflow(-kInf, 300 + iteration++)));
  EXPECT_EQ(scaler.loss_scale(), 64.0);
  EXPECT_EQ(scaler.state().cur_iter, iteration);
  EXPECT_EQ(scaler.state().last_overflow_iter, iteration - 1);
  EXPECT_EQ(scaler.skipped_steps(), 3);
}

TEST(DynamicLossScale, HysteresisTwo) {
  zt::LossScaler scaler = quiet_scaler(DType::fp16, dynamic_params(8, 2, 2));
  EXPECT_TRUE(scaler.update(true));  // first overflow: scale kept, hysteresis 2 -> 1, step skipped
  EXPECT_EQ(scaler.loss_scale(), 256.0);
  EXPECT_EQ(scaler.hysteresis(), 1);
  EXPECT_TRUE(scaler.update(true));  // hysteresis exhausted: halve
  EXPECT_EQ(scaler.loss_scale(), 128.0);
  EXPECT_TRUE(scaler.update(true));  // hysteresis is not refilled by halving: halve again
  EXPECT_EQ(scaler.loss_scale(), 64.0);
  EXPECT_EQ(scaler.hysteresis(), 1);
  // Clean steps at iterations 3, 4, 5 (last overflow 2): stable intervals 0, 1, 2; at 2 the scale
  // doubles and the hysteresis is refilled.
  EXPECT_FALSE(scaler.update(false));
  EXPECT_FALSE(scaler.update(false));
  EXPECT_EQ(scaler.hysteresis(), 1);  // no refill before the doubling without consecutive_hysteresis
  EXPECT_FALSE(scaler.update(false));
  EXPECT_EQ(scaler.loss_scale(), 128.0);
  EXPECT_EQ(scaler.hysteresis(), 2);
  EXPECT_TRUE(scaler.update(true));  // the refilled hysteresis absorbs one overflow again
  EXPECT_EQ(scaler.loss_scale(), 128.0);
  EXPECT_EQ(scaler.skipped_steps(), 4);
}

TEST(DynamicLossScale, StageZeroRuleHalvesOnEveryOverflowAndStaysAtTheMinimum) {
  // DeepSpeed's FP16_Optimizer (ZeRO stage 0): hysteresis 2 is given but not used.
  zt::LossScalerParams params = dynamic_params(3, 2, 2);
  params.rule = zt::LossScaleRule::fp16_optimizer;
  zt::LossScaler scaler = quiet_scaler(DType::fp16, params);
  EXPECT_TRUE(scaler.update(true));  // 8 -> 4 at once (DynamicLossScaler would keep 8)
  EXPECT_EQ(scaler.loss_scale(), 4.0);
  EXPECT_TRUE(scaler.update(true));
  EXPECT_TRUE(scaler.update(true));
  EXPECT_EQ(scaler.loss_scale(), 1.0);
  // At the minimum the scale stays and the run goes on (no "already at minimum" error).
  EXPECT_TRUE(scaler.update(true));
  EXPECT_EQ(scaler.loss_scale(), 1.0);
  EXPECT_EQ(scaler.skipped_steps(), 4);
  // Doubling after the window is the same rule as DynamicLossScaler's: stable intervals 0, 1, 2.
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(scaler.update(false));
  EXPECT_EQ(scaler.loss_scale(), 2.0);
  EXPECT_EQ(scaler.state().cur_iter, 7);
  EXPECT_EQ(scaler.state().last_overflow_iter, 3);
}

TEST(DynamicLossScale, ConsecutiveHysteresisRefillsOnEveryCleanStep) {
  for (bool consecutive : {false, true}) {
    zt::LossScalerParams p = dynamic_params(8, 1000, 2);
    p.consecutive_hysteresis = consecutive;
    zt::LossScaler scaler(DType::fp16, p);
    std::vector<std::string> log;
    scaler.set_log_sink([&](std::string_view m) { log.emplace_back(m); });
    scaler.update(true);   // hysteresis 2 -> 1
    scaler.update(false);  // consecutive: back to 2
    EXPECT_EQ(scaler.hysteresis(), consecutive ? 2 : 1);
    scaler.update(false);  // nothing to restore: no message
    scaler.update(true);   // consecutive: absorbed (2 -> 1); otherwise: halved
    EXPECT_EQ(scaler.loss_scale(), consecutive ? 256.0 : 128.0) << "consecutive " << consecutive;
    const std::size_t restore_notes =
        static_cast<std::size_t>(std::count_if(log.begin(), log.end(), [](const std::string& m) {
          return m.find("Restoring hysteresis to 2") != std::string::npos;
        }));
    EXPECT_EQ(restore_notes, consecutive ? 1u : 0u);
  }
}

// ---- static scale, bf16, fp32 --------------------------------------------------------------------

TEST(LossScaler, StaticScaleSkipsOverflowsButKeepsTheScale) {
  zt::LossScalerParams p;
  p.loss_scale = 128.0;
  zt::LossScaler scaler = quiet_scaler(DType::fp16, p);
  EXPECT_FALSE(scaler.dynamic());
  EXPECT_TRUE(scaler.checks_overflow());
  EXPECT_TRUE(scaler.update(true));
  EXPECT_FALSE(scaler.update(false));
  for (int i = 0; i < 5000; ++i) scaler.update(false);
  EXPECT_EQ(scaler.loss_scale(), 128.0);
  EXPECT_EQ(scaler.skipped_steps(), 1);
}

TEST(LossScaler, Bf16HasNoScaleAndFollowsCheckGradOverflow) {
  zt::LossScaler checked = quiet_scaler(DType::bf16, {});
  EXPECT_EQ(checked.loss_scale(), 1.0);
  EXPECT_TRUE(checked.checks_overflow());
  EXPECT_TRUE(checked.update(true));  // bf16.check_grad_overflow defaults to true: skip
  EXPECT_EQ(checked.loss_scale(), 1.0);
  EXPECT_EQ(checked.skipped_steps(), 1);

  zt::LossScalerParams ignore;
  ignore.check_grad_overflow = false;
  zt::LossScaler unchecked = quiet_scaler(DType::bf16, ignore);
  EXPECT_FALSE(unchecked.checks_overflow());
  EXPECT_FALSE(unchecked.update(true));  // ignored: the step is applied
  EXPECT_EQ(unchecked.skipped_steps(), 0);

  zt::LossScaler fp32 = quiet_scaler(DType::fp32, {});
  EXPECT_FALSE(fp32.checks_overflow());
  EXPECT_FALSE(fp32.update(true));
  EXPECT_EQ(fp32.loss_scale(), 1.0);
}

TEST(LossScaler, InvalidSettingsNameTheKey) {
  const auto expect_error = [](zt::LossScalerParams p, const std::string& key) {
    try {
      zt::LossScaler scaler(DType::fp16, p);
      FAIL() << key << " accepted";
    } catch (const zt::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  };
  zt::LossScalerParams p;
  p.loss_scale_window = 0;
  expect_error(p, "fp16.loss_scale_window = 0");
  p = {};
  p.min_loss_scale = 0.0;
  expect_error(p, "fp16.min_loss_scale = 0");
  p = {};
  p.hysteresis = 0;
  expect_error(p, "fp16.hysteresis = 0");
  p = {};
  p.loss_scale = -1.0;
  expect_error(p, "fp16.loss_scale = -1");
  p = {};
  p.initial_scale_power = 5000;
  expect_error(p, "fp16.initial_scale_power = 5000");
  EXPECT_THROW(zt::LossScaler(DType::int32, {}), zt::ConfigError);
}

TEST(LossScaler, StateRoundTrips) {
  zt::LossScaler a = quiet_scaler(DType::fp16, dynamic_params(10, 3, 2));
  for (bool overflow : {true, true, false, false, true, false, false, false, false}) a.update(overflow);
  zt::LossScaler b = quiet_scaler(DType::fp16, dynamic_params(10, 3, 2));
  b.load_state(a.state());
  for (bool overflow : {false, false, true, true, false, false, false, false}) {
    EXPECT_EQ(a.update(overflow), b.update(overflow));
    EXPECT_EQ(a.loss_scale(), b.loss_scale());
    EXPECT_EQ(a.hysteresis(), b.hysteresis());
  }
  EXPECT_EQ(a.skipped_steps(), b.skipped_steps());
}

// ---- logging policy ------------------------------------------------------------------------------

TEST(LossScaler, ReportsEachOverflowEventOnceAndSummarizesRepeats) {
  zt::LossScaler scaler(DType::fp16, dynamic_params(16, 1000, 1));
  std::vector<std::string> log;
  scaler.set_log_sink([&](std::string_view m) { log.emplace_back(m); });
  scaler.set_report_interval(3);

  for (int i = 0; i < 5; ++i) scaler.update(true);  // 65536 -> 2048
  // The first overflow in full; after 3 more, a summary; the 5th waits.
  ASSERT_EQ(log.size(), 2u);
  EXPECT_EQ(log[0], "[zerotrain] OVERFLOW! Skipping step. Attempted loss scale: 65536, reducing to 32768");
  EXPECT_EQ(log[1],
            "[zerotrain] OVERFLOW: skipped 3 more steps since last report (4 in a row, continuing); loss "
            "scale now 4096");
  scaler.update(false);  // the run ends: the rest is summarized
  ASSERT_EQ(log.size(), 3u);
  EXPECT_EQ(
      log[2],
      "[zerotrain] OVERFLOW: skipped 1 more step since last report (5 in a row, ended); loss scale now 2048");
  scaler.update(false);
  EXPECT_EQ(log.size(), 3u);  // clean steps are silent

  scaler.update(true);  // a new event: reported in full again
  ASSERT_EQ(log.size(), 4u);
  EXPECT_EQ(log[3], "[zerotrain] OVERFLOW! Skipping step. Attempted loss scale: 2048, reducing to 1024");
  scaler.update(false);
  EXPECT_EQ(log.size(), 4u);  // a single overflow needs no summary

  zt::LossScaler hysteresis(DType::fp16, dynamic_params(8, 1000, 2));
  std::string last;
  hysteresis.set_log_sink([&](std::string_view m) { last = m; });
  hysteresis.update(true);
  EXPECT_EQ(last,
            "[zerotrain] OVERFLOW! Skipping step. Attempted loss scale: 256, but hysteresis is 2. "
            "Reducing hysteresis to 1");
}

// ---- the fused unscale + overflow check ----------------------------------------------------------

TEST(OverflowCheck, FindsInfMinusInfAndNanAtRandomPositionsInEveryDtype) {
  constexpr std::size_t n = 3 * 16384 + 4097;  // several reduction chunks, a ragged tail
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::size_t> position(0, n - 1);
  for (DType dtype : {DType::fp32, DType::bf16, DType::fp16}) {
    const GradBuffer clean = make_buffer(dtype, n, {}, 0.0f, 1);
    const auto baseline =
        zt::kernels::grad_sum_squares(zt::default_stream(zt::Device::host()), clean.data(), dtype, n);
    EXPECT_FALSE(baseline.found_inf) << zt::dtype_name(dtype);
    EXPECT_TRUE(std::isfinite(baseline.sum_sq));
    // Unscaling with 1/loss_scale: the sum of squares of the unscaled gradient (scale^2 * sum).
    const auto unscaled = zt::kernels::grad_sum_squares(zt::default_stream(zt::Device::host()), clean.data(),
                                                        dtype, n, 1.0 / 1024);
    EXPECT_DOUBLE_EQ(unscaled.sum_sq, baseline.sum_sq / (1024.0 * 1024.0));

    for (float injected : {kInf, -kInf, kNan}) {
      for (int trial = 0; trial < 20; ++trial) {
        std::vector<std::size_t> positions = {position(rng)};
        if (trial % 4 == 1) positions.push_back(position(rng));  // several at once
        if (trial == 2) positions = {0};                         // the first element
        if (trial == 3) positions = {n - 1};                     // the last (in the tail)
        const GradBuffer bad = make_buffer(dtype, n, positions, injected, 1);
        const auto check = zt::kernels::grad_sum_squares(zt::default_stream(zt::Device::host()), bad.data(),
                                                         dtype, n, 1.0 / 1024);
        EXPECT_TRUE(check.found_inf) << zt::dtype_name(dtype) << " value " << injected << " at "
                                     << positions[0];
      }
    }
  }
  // The largest finite fp16 is not an overflow: 65504^2 is finite in the fp64 accumulator.
  const GradBuffer big = make_buffer(DType::fp16, 1000, {0, 1, 2, 999}, 65504.0f, 2);
  EXPECT_FALSE(
      zt::kernels::grad_sum_squares(zt::default_stream(zt::Device::host()), big.data(), DType::fp16, 1000)
          .found_inf);
  // An fp32 value that would overflow fp16 or an fp32 accumulator is not an inf either.
  const GradBuffer huge = make_buffer(DType::fp32, 1000, {5, 6}, 3e38f, 3);
  const auto huge_check =
      zt::kernels::grad_sum_squares(zt::default_stream(zt::Device::host()), huge.data(), DType::fp32, 1000);
  EXPECT_FALSE(huge_check.found_inf);
  EXPECT_GT(huge_check.sum_sq, 1.7e77);
}

}  // namespace
