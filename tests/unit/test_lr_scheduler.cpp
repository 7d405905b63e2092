// LR schedules against values computed by hand from DeepSpeed's formulas (arithmetic in comments).
// `it` is last_batch_iteration: -1 at construction, +1 per scheduler step().
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <string>

#include "zerotrain/error.hpp"
#include "zerotrain/lr_scheduler.hpp"

namespace {

// ---- WarmupLR ------------------------------------------------------------------------------------

TEST(WarmupLR, LogWarmup) {
  zt::WarmupLRParams p;
  p.warmup_min_lr = 0.0;
  p.warmup_max_lr = 0.01;
  p.warmup_num_steps = 10;  // log warmup is the default
  zt::WarmupLR s(p, 0.5);
  EXPECT_EQ(s.lr(), 0.0);      // it = -1: min_lr
  EXPECT_EQ(s.lr_at(0), 0.0);  // ln(1) / ln(10) = 0
  // it = 1: ln(2) / ln(10) = 0.30102999566 -> 0.01 * 0.30103 = 0.0030103
  EXPECT_NEAR(s.lr_at(1), 0.0030102999566398, 1e-16);
  // it = 4: ln(5) / ln(10) = 0.69897000434 -> 0.0069897
  EXPECT_NEAR(s.lr_at(4), 0.0069897000433602, 1e-16);
  EXPECT_NEAR(s.lr_at(9), 0.01, 1e-17);  // ln(10) / ln(10) = 1
  EXPECT_EQ(s.lr_at(10), 0.01);          // after warmup: gamma = 1
  EXPECT_EQ(s.lr_at(100000), 0.01);
}

TEST(WarmupLR, LinearWarmupAndDefaults) {
  zt::WarmupLRParams p;
  p.warmup_min_lr = 0.001;
  p.warmup_max_lr = 0.011;
  p.warmup_num_steps = 10;
  p.warmup_type = zt::WarmupType::linear;
  zt::WarmupLR s(p, 0.5);
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.001);   // 0.001 + 0.01 * 0/10
  EXPECT_DOUBLE_EQ(s.lr_at(1), 0.002);   // 0.001 + 0.01 * 1/10
  EXPECT_DOUBLE_EQ(s.lr_at(5), 0.006);   // 0.001 + 0.01 * 5/10
  EXPECT_DOUBLE_EQ(s.lr_at(9), 0.010);   // 0.001 + 0.01 * 9/10 (linear never reaches max in warmup)
  EXPECT_DOUBLE_EQ(s.lr_at(10), 0.011);  // then max

  // warmup_max_lr defaults to the optimizer's lr; warmup_num_steps 1 is raised to 2.
  zt::WarmupLRParams d;
  d.warmup_num_steps = 1;
  zt::WarmupLR defaults(d, 0.5);
  EXPECT_EQ(defaults.lr_at(0), 0.0);  // ln(1) / ln(2)
  EXPECT_EQ(defaults.lr_at(1), 0.5);  // ln(2) / ln(2) = 1
  zt::WarmupLRParams bad;
  bad.warmup_num_steps = 0;
  EXPECT_THROW(zt::WarmupLR(bad, 0.5), zt::ConfigError);
  EXPECT_EQ(zt::warmup_type_from_name("linear"), zt::WarmupType::linear);
  EXPECT_THROW(zt::warmup_type_from_name("cosine"), zt::ConfigError);
}

// ---- WarmupDecayLR -------------------------------------------------------------------------------

TEST(WarmupDecayLR, WarmupThenLinearDecayToZero) {
  zt::WarmupDecayLRParams p;
  p.total_num_steps = 20;
  p.warmup_max_lr = 0.01;
  p.warmup_num_steps = 10;
  p.warmup_type = zt::WarmupType::linear;
  zt::WarmupDecayLR s(p);
  EXPECT_DOUBLE_EQ(s.lr_at(5), 0.005);   // warmup: 0.01 * 5/10
  EXPECT_DOUBLE_EQ(s.lr_at(10), 0.01);   // (20 - 10) / max(1, 20 - 10) = 1
  EXPECT_DOUBLE_EQ(s.lr_at(15), 0.005);  // (20 - 15) / 10 = 0.5
  EXPECT_DOUBLE_EQ(s.lr_at(19), 0.001);  // 1/10
  EXPECT_EQ(s.lr_at(20), 0.0);           // 0/10
  EXPECT_EQ(s.lr_at(25), 0.0);           // max(0, -5/10)

  // The default warmup_max_lr is 0.001 (not the optimizer's lr), log warmup.
  zt::WarmupDecayLRParams d;
  d.total_num_steps = 5;  // shorter than the warmup: max(1, 5 - 1000) = 1 and (5 - it) < 0 after it
  zt::WarmupDecayLR defaults(d);
  EXPECT_NEAR(defaults.lr_at(999), 0.001 * std::log(1000.0) / std::log(1000.0), 1e-18);
  EXPECT_EQ(defaults.lr_at(1000), 0.0);
  EXPECT_THROW(zt::WarmupDecayLR(zt::WarmupDecayLRParams{}), zt::ConfigError);  // total_num_steps missing
}

// ---- WarmupCosineLR ------------------------------------------------------------------------------

TEST(WarmupCosineLR, WarmupThenCosineClampedAtTheFloor) {
  zt::WarmupCosineLRParams p;
  p.total_num_steps = 30;
  p.warmup_num_steps = 10;
  p.warmup_min_ratio = 0.1;
  p.cos_min_ratio = 0.01;
  p.warmup_type = zt::WarmupType::linear;
  zt::WarmupCosineLR s(p, 0.1);         // ratios multiply the optimizer lr 0.1
  EXPECT_EQ(s.lr(), 0.0);               // it = -1: DeepSpeed returns 0
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.01);   // ratio 0.1 + 0/10 * 0.9 = 0.1
  EXPECT_DOUBLE_EQ(s.lr_at(5), 0.055);  // 0.1 + 0.5 * 0.9 = 0.55
  EXPECT_DOUBLE_EQ(s.lr_at(9), 0.091);  // 0.1 + 0.9 * 0.9 = 0.91
  // it = 10: progress (10 - 10 + 1) / (30 - 10) = 0.05; (1 + cos(0.05 pi)) / 2 = 0.99384417;
  // ratio 0.01 + 0.99 * 0.99384417 = 0.99390573
  EXPECT_NEAR(s.lr_at(10), 0.1 * (0.01 + 0.99 * (1 + std::cos(0.05 * std::numbers::pi)) / 2), 1e-17);
  EXPECT_NEAR(s.lr_at(10), 0.099390573, 1e-9);
  EXPECT_NEAR(s.lr_at(19), 0.0505, 1e-17);  // progress 10/20: (1 + 0)/2 = 0.5 -> 0.01 + 0.495 = 0.505
  EXPECT_NEAR(s.lr_at(29), 0.001, 1e-18);   // progress 1: ratio = cos_min_ratio
  // Past the end the progress is clamped at 1. Unclamped, it = 40 would give progress 31/20 and
  // (1 + cos(1.55 pi)) / 2 = 0.578, climbing back up.
  EXPECT_NEAR(s.lr_at(40), 0.001, 1e-18);
  EXPECT_NEAR(s.lr_at(1000), 0.001, 1e-18);

  zt::WarmupCosineLRParams log_params = p;
  log_params.warmup_type = zt::WarmupType::log;
  zt::WarmupCosineLR log_warmup(log_params, 0.1);
  // it = 4: ln(5)/ln(10) = 0.69897 -> 0.1 + 0.69897 * 0.9 = 0.729073 -> lr 0.0729073
  EXPECT_NEAR(log_warmup.lr_at(4), 0.1 * (0.1 + 0.9 * std::log(5.0) / std::log(10.0)), 1e-17);
  EXPECT_NEAR(log_warmup.lr_at(4), 0.0729073, 1e-7);

  // Defaults: warmup 1000 steps, cos_min_ratio 1e-4.
  zt::WarmupCosineLRParams d;
  d.total_num_steps = 2000;
  zt::WarmupCosineLR defaults(d, 1.0);
  EXPECT_NEAR(defaults.lr_at(1999), 1e-4, 1e-18);
}

// ---- LRRangeTest ---------------------------------------------------------------------------------

TEST(LRRangeTest, ContinuousAndStaircase) {
  zt::LRRangeTestParams p;
  p.lr_range_test_min_lr = 1e-3;
  p.lr_range_test_step_size = 10;
  p.lr_range_test_step_rate = 2.0;
  zt::LRRangeTest continuous(p);
  EXPECT_DOUBLE_EQ(continuous.lr(), 1e-3);        // it = -1: interval 0
  EXPECT_DOUBLE_EQ(continuous.lr_at(0), 1.2e-3);  // interval 1/10: 1e-3 * (1 + 2 * 0.1)
  EXPECT_DOUBLE_EQ(continuous.lr_at(4), 2e-3);    // interval 5/10: 1e-3 * (1 + 2 * 0.5)
  EXPECT_DOUBLE_EQ(continuous.lr_at(14), 4e-3);   // interval 15/10: 1e-3 * (1 + 2 * 1.5)

  p.lr_range_test_staircase = true;
  zt::LRRangeTest stairs(p);
  EXPECT_DOUBLE_EQ(stairs.lr_at(0), 1e-3);   // floor(1/10) = 0
  EXPECT_DOUBLE_EQ(stairs.lr_at(8), 1e-3);   // floor(9/10) = 0
  EXPECT_DOUBLE_EQ(stairs.lr_at(9), 3e-3);   // floor(10/10) = 1: 1e-3 * (1 + 2)
  EXPECT_DOUBLE_EQ(stairs.lr_at(18), 3e-3);  // floor(19/10) = 1
  EXPECT_DOUBLE_EQ(stairs.lr_at(19), 5e-3);  // floor(20/10) = 2: 1e-3 * (1 + 4)

  zt::LRRangeTest defaults(zt::LRRangeTestParams{});  // 1e-3, step 2000, rate 1, continuous
  EXPECT_DOUBLE_EQ(defaults.lr_at(1999), 2e-3);       // interval 2000/2000 = 1
}

// ---- OneCycle ------------------------------------------------------------------------------------

zt::OneCycleParams one_cycle_params() {
  zt::OneCycleParams p;
  p.cycle_min_lr = 0.001;
  p.cycle_max_lr = 0.01;
  p.cycle_first_step_size = 4;  // second defaults to 4: total 8, step_ratio 0.5
  p.decay_lr_rate = 0.5;
  p.decay_step_size = 2;
  p.cycle_min_mom = 0.8;
  p.cycle_max_mom = 0.9;
  p.decay_mom_rate = 0.1;
  return p;
}

TEST(OneCycle, CycleThenDecayOfLrAndMomentum) {
  zt::OneCycle s(one_cycle_params());
  // it = -1 (construction): lr = cycle_min_lr, betas = (cycle_min_mom, 0.99).
  EXPECT_DOUBLE_EQ(s.lr(), 0.001);
  EXPECT_DOUBLE_EQ(s.betas()->beta1, 0.8);
  EXPECT_DOUBLE_EQ(s.betas()->beta2, 0.99);
  // scale(it): b = it + 1, x = 1 + b/8 - floor(1 + b/8); x <= 0.5: x/0.5, else (x - 1)/(0.5 - 1).
  // it = 0: x = 0.125 -> 0.25: lr = 0.001 + 0.009 * 0.25 = 0.00325; mom = 0.9 - 0.1 * 0.25 = 0.875
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.00325);
  EXPECT_DOUBLE_EQ(s.betas_at(0)->beta1, 0.875);
  // it = 3: x = 0.5 -> 1: the peak lr, the lowest momentum
  EXPECT_DOUBLE_EQ(s.lr_at(3), 0.01);
  EXPECT_DOUBLE_EQ(s.betas_at(3)->beta1, 0.8);
  // it = 4: x = 0.625 -> (0.625 - 1)/(-0.5) = 0.75: lr = 0.001 + 0.00675; mom = 0.9 - 0.075
  EXPECT_DOUBLE_EQ(s.lr_at(4), 0.00775);
  EXPECT_DOUBLE_EQ(s.betas_at(4)->beta1, 0.825);
  EXPECT_DOUBLE_EQ(s.lr_at(6), 0.00325);  // x = 0.875 -> 0.25
  // it = 7 (< total 8, still the cycle): b = 8, x = 1 + 1 - 2 = 0 -> lr = min, mom = max
  EXPECT_DOUBLE_EQ(s.lr_at(7), 0.001);
  EXPECT_DOUBLE_EQ(s.betas_at(7)->beta1, 0.9);
  // Decay: k = it - 8 + 1, interval = k / decay_step_size (continuous):
  // it = 8: k = 1, interval 0.5: lr = 0.001 / (1 + 0.5 * 0.5) = 0.0008; mom = 0.9 * (1 + 0.1 * 0.5)
  EXPECT_DOUBLE_EQ(s.lr_at(8), 0.0008);
  EXPECT_DOUBLE_EQ(s.betas_at(8)->beta1, 0.945);
  // it = 9: k = 2, interval 1: lr = 0.001 / 1.5
  EXPECT_DOUBLE_EQ(s.lr_at(9), 0.001 / 1.5);
  // it = 9: k = 2, interval 1: mom = 0.9 * 1.1 = 0.99, still below the ceiling 0.999
  EXPECT_DOUBLE_EQ(s.betas_at(9)->beta1, 0.9 * 1.1);
  // it = 10: k = 3: 0.9 * 1.15 = 1.035 would pass 1 (DeepSpeed does not cap it): held at 0.999.
  EXPECT_DOUBLE_EQ(s.betas_at(10)->beta1, 0.999);
  // it = 11: k = 4, interval 2: lr = 0.001 / 2 = 0.0005; mom 0.9 * 1.2 = 1.08 -> 0.999
  EXPECT_DOUBLE_EQ(s.lr_at(11), 0.0005);
  EXPECT_DOUBLE_EQ(s.betas_at(11)->beta1, 0.999);
  EXPECT_DOUBLE_EQ(s.betas_at(1'000'000)->beta1, 0.999);
  // The first clamped iteration is 10, which optimizer step 12 uses (step s runs on it = s - 2).
  EXPECT_DOUBLE_EQ(zt::one_cycle_momentum_ceiling(one_cycle_params()), 0.999);
  EXPECT_EQ(zt::one_cycle_first_clamped_step(one_cycle_params()), 12);
  zt::OneCycleParams high = one_cycle_params();
  high.cycle_max_mom = 0.9995;  // a maximum above 0.999 is its own ceiling
  EXPECT_DOUBLE_EQ(zt::one_cycle_momentum_ceiling(high), 0.9995);
  EXPECT_DOUBLE_EQ(zt::OneCycle(high).betas_at(100)->beta1, 0.9995);

  // No decay (decay_step_size 0, the default): min lr and max momentum after the cycle.
  zt::OneCycleParams no_decay = one_cycle_params();
  no_decay.decay_step_size = 0;
  zt::OneCycle flat(no_decay);
  EXPECT_DOUBLE_EQ(flat.lr_at(100), 0.001);
  EXPECT_DOUBLE_EQ(flat.betas_at(100)->beta1, 0.9);

  zt::OneCycleParams no_momentum = one_cycle_params();
  no_momentum.cycle_momentum = false;
  EXPECT_FALSE(zt::OneCycle(no_momentum).betas_at(3).has_value());
  EXPECT_FALSE(zt::one_cycle_first_clamped_step(no_momentum).has_value());
  EXPECT_FALSE(zt::one_cycle_first_clamped_step(no_decay).has_value());

  EXPECT_THROW(zt::OneCycle(zt::OneCycleParams{}), zt::ConfigError);  // min and max lr are required
}

TEST(OneCycle, Staircase) {
  zt::OneCycleParams p = one_cycle_params();
  p.cycle_first_stair_count = 2;  // second defaults to the first's
  zt::OneCycle s(p);
  // Stair position: ci = b mod 8; first half ci * 2 / 4, second half (8 - ci) * 2 / 4; scale = floor(pos)/2.
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.001);           // b = 1: pos 0.5 -> 0
  EXPECT_DOUBLE_EQ(s.lr_at(1), 0.0055);          // b = 2: pos 1 -> 0.5: 0.001 + 0.009 * 0.5
  EXPECT_DOUBLE_EQ(s.lr_at(2), 0.0055);          // b = 3: pos 1.5 -> 0.5 (flat)
  EXPECT_DOUBLE_EQ(s.lr_at(3), 0.01);            // b = 4: pos 2 -> 1
  EXPECT_DOUBLE_EQ(s.lr_at(4), 0.0055);          // b = 5: (8 - 5) * 2/4 = 1.5 -> 0.5
  EXPECT_DOUBLE_EQ(s.lr_at(5), 0.0055);          // b = 6: 1 -> 0.5
  EXPECT_DOUBLE_EQ(s.lr_at(6), 0.001);           // b = 7: 0.5 -> 0
  EXPECT_DOUBLE_EQ(s.betas_at(1)->beta1, 0.85);  // momentum follows the same stairs: 0.9 - 0.1 * 0.5

  // Asymmetric: first 3 steps with 3 stairs, second 6 steps with 2 stairs; total 9, ratio 1/3.
  zt::OneCycleParams a = one_cycle_params();
  a.cycle_first_step_size = 3;
  a.cycle_second_step_size = 6;
  a.cycle_first_stair_count = 3;
  a.cycle_second_stair_count = 2;
  zt::OneCycle asym(a);
  EXPECT_DOUBLE_EQ(asym.lr_at(0), 0.004);  // b = 1: 1 * 3/3 = 1 -> 1/3: 0.001 + 0.009/3
  // b = 3: x = (1 + 3/9) - 1 = 0.33333333333333326 in floating point, just under 1/3; the stair
  // comes from the integer position 3 * 3/3 = 3 -> scale 1, so the peak is reached exactly.
  EXPECT_DOUBLE_EQ(asym.lr_at(2), 0.01);
  EXPECT_DOUBLE_EQ(asym.lr_at(3), 0.0055);  // b = 4: (9 - 4) * 2/6 = 1.67 -> 1/2
  EXPECT_DOUBLE_EQ(asym.lr_at(5), 0.0055);  // b = 6: (9 - 6) * 2/6 = 1 -> 1/2
  EXPECT_DOUBLE_EQ(asym.lr_at(6), 0.001);   // b = 7: (9 - 7) * 2/6 = 0.67 -> 0
}

// ---- state, stepping, factory --------------------------------------------------------------------

TEST(LRScheduler, StepStateAndTheEngineConvention) {
  zt::WarmupLRParams p;
  p.warmup_max_lr = 0.01;
  p.warmup_num_steps = 10;
  p.warmup_type = zt::WarmupType::linear;
  auto s = zt::make_lr_scheduler(p, 0.5);
  EXPECT_EQ(s->name(), "WarmupLR");
  // The engine applies lr() to an update, then steps: update n runs with lr_at(n - 1).
  for (int n = 0; n < 5; ++n) {
    EXPECT_EQ(s->lr(), s->lr_at(n - 1));
    s->step();
  }
  EXPECT_EQ(s->last_batch_iteration(), 4);
  const zt::LRSchedulerState saved = s->state();

  auto restored = zt::make_lr_scheduler(p, 0.5);
  restored->load_state(saved);
  EXPECT_EQ(restored->lr(), s->lr());
  restored->step();
  s->step();
  EXPECT_DOUBLE_EQ(restored->lr(), 0.005);  // it = 5: 0.01 * 5/10
  EXPECT_EQ(restored->lr(), s->lr());
  s->step(9);  // DeepSpeed's step(batch_iteration)
  EXPECT_DOUBLE_EQ(s->lr(), 0.009);

  EXPECT_EQ(zt::make_lr_scheduler(zt::LRRangeTestParams{}, 1.0)->name(), "LRRangeTest");
  EXPECT_EQ(zt::make_lr_scheduler(one_cycle_params(), 1.0)->name(), "OneCycle");
  zt::WarmupCosineLRParams cosine;
  cosine.total_num_steps = 100;
  EXPECT_EQ(zt::make_lr_scheduler(cosine, 1.0)->name(), "WarmupCosineLR");
}

}  // namespace
