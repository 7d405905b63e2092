// Fused optimizer kernels and optimizer classes against straightforward double-precision references.
//
// Tolerances. The kernels compute in fp32 (unit roundoff u = 2^-24 ~ 6e-8); the references in double
// from the same inputs. One step rounds p once (|p| u), and the update term lr * m_hat / denom goes
// through ~10 fp32 operations (~10 u relative, and |m_hat / denom| <= ~3 for Adam). The state m, v
// picks up a few u per step. Errors add over steps, so after S steps we allow
//   |p - p_ref| <= S * (4 u |p_ref| + 64 u * lr_max * 3)     and     |m - m_ref| <= S * 8 u * (|m_ref| + max
//   |g|)
// (a 4-8x margin over the estimate; a wrong formula misses these bounds by orders of magnitude).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/optimizer_kernels.hpp"
#include "zerotrain/device.hpp"
#include "zerotrain/dtype.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/optimizer.hpp"

namespace {

using zt::DType;

constexpr double kU = 0x1p-24;  // fp32 unit roundoff

// ---- gradients in any dtype ---------------------------------------------------------------------

/// A gradient buffer stored in `dtype`, plus its exact values as float (what the kernel reads).
struct Grad {
  DType dtype = DType::fp32;
  std::vector<float> values;        // exact values after rounding to dtype
  std::vector<std::uint16_t> bits;  // storage for bf16/fp16
  const void* data() const {
    return dtype == DType::fp32 ? static_cast<const void*>(values.data())
                                : static_cast<const void*>(bits.data());
  }
};

Grad make_grad(DType dtype, const std::vector<float>& source) {
  Grad grad;
  grad.dtype = dtype;
  grad.values.resize(source.size());
  if (dtype != DType::fp32) grad.bits.resize(source.size());
  for (std::size_t i = 0; i < source.size(); ++i) {
    if (dtype == DType::fp32) {
      grad.values[i] = source[i];
    } else if (dtype == DType::bf16) {
      grad.bits[i] = zt::bf16::from_float(source[i]);
      grad.values[i] = static_cast<float>(zt::bf16{source[i]});
    } else {
      grad.bits[i] = zt::fp16::from_float(source[i]);
      grad.values[i] = zt::fp16::to_float(grad.bits[i]);
    }
  }
  return grad;
}

std::vector<float> normal_values(std::size_t n, float stddev, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> out(n);
  for (float& x : out) x = dist(rng);
  return out;
}

// ---- references in double -----------------------------------------------------------------------

struct AdamRef {
  std::vector<double> p, m, v;
};

/// torch/DeepSpeed Adam(W), written out plainly in double.
void adam_reference(AdamRef& s, const std::vector<float>& g_in, double grad_scale, double lr,
                    const zt::OptimizerParams& hp, std::int64_t step) {
  const double b1 = hp.beta1, b2 = hp.beta2, eps = hp.eps, wd = hp.weight_decay;
  const double bc1 = hp.bias_correction ? 1.0 - std::pow(b1, static_cast<double>(step)) : 1.0;
  const double bc2 = hp.bias_correction ? 1.0 - std::pow(b2, static_cast<double>(step)) : 1.0;
  for (std::size_t i = 0; i < s.p.size(); ++i) {
    double g = g_in[i] * grad_scale;
    if (!hp.adam_w_mode) g += wd * s.p[i];
    s.m[i] = b1 * s.m[i] + (1.0 - b1) * g;
    s.v[i] = b2 * s.v[i] + (1.0 - b2) * g * g;
    const double m_hat = s.m[i] / bc1;
    const double denom = std::sqrt(s.v[i] / bc2) + eps;
    if (hp.adam_w_mode) s.p[i] -= lr * wd * s.p[i];
    s.p[i] -= lr * m_hat / denom;
  }
}

struct SgdRef {
  std::vector<double> p, buf;
};

/// torch SGD, written out plainly in double.
void sgd_reference(SgdRef& s, const std::vector<float>& g_in, double grad_scale, double lr,
                   const zt::OptimizerParams& hp, bool first) {
  for (std::size_t i = 0; i < s.p.size(); ++i) {
    double d = g_in[i] * grad_scale;
    if (hp.weight_decay != 0.0f) d += hp.weight_decay * s.p[i];
    if (hp.momentum != 0.0f) {
      s.buf[i] = first ? d : hp.momentum * s.buf[i] + (1.0 - hp.dampening) * d;
      d = hp.nesterov ? d + hp.momentum * s.buf[i] : s.buf[i];
    }
    s.p[i] -= lr * d;
  }
}

std::vector<double> to_double(const std::vector<float>& x) {
  return {x.begin(), x.end()};
}

// ---- Adam vs reference ---------------------------------------------------------------------------

struct AdamCase {
  std::string name;
  zt::OptimizerParams hp;
  DType grad_dtype;
  float grad_stddev = 4.0f;  // of the (loss-scaled) gradient
};

std::vector<AdamCase> adam_cases() {
  std::vector<AdamCase> cases;
  for (DType dtype : {DType::fp32, DType::bf16, DType::fp16}) {
    const std::string suffix = std::string(zt::dtype_name(dtype));
    zt::OptimizerParams adamw;
    adamw.weight_decay = 0.05f;
    cases.push_back({"adamw_" + suffix, adamw, dtype});
    zt::OptimizerParams l2 = adamw;
    l2.adam_w_mode = false;
    cases.push_back({"adam_l2_" + suffix, l2, dtype});
    zt::OptimizerParams no_bias = adamw;
    no_bias.bias_correction = false;
    no_bias.beta1 = 0.8f;
    no_bias.beta2 = 0.95f;
    no_bias.eps = 1e-6f;
    cases.push_back({"adamw_no_bias_correction_" + suffix, no_bias, dtype});
    cases.push_back({"adam_no_decay_" + suffix, zt::OptimizerParams{}, dtype});
    // Gradients ~1e-3 with eps 1e-3: eps outside the sqrt (denominator ~2e-3) versus inside
    // (~3e-2) changes every update by >10x, so this case pins eps's placement.
    zt::OptimizerParams eps_dominant = adamw;
    eps_dominant.eps = 1e-3f;
    cases.push_back({"adamw_eps_dominant_" + suffix, eps_dominant, dtype, 4e-3f});
  }
  return cases;
}

class AdamVsReference : public ::testing::TestWithParam<AdamCase> {};

TEST_P(AdamVsReference, SeveralSteps) {
  const AdamCase& c = GetParam();
  constexpr std::size_t n = 3 * 4096 + 1001;  // several kernel blocks and a ragged tail
  constexpr int steps = 5;
  const std::vector<float> lrs = {1e-2f, 2e-2f, 5e-3f, 1e-2f, 3e-2f};
  const float grad_scale = 0.25f;  // e.g. 1/loss_scale

  std::vector<float> params = normal_values(n, 1.0f, 1);
  AdamRef ref{to_double(params), std::vector<double>(n, 0.0), std::vector<double>(n, 0.0)};
  auto optimizer = zt::make_optimizer("adam", {{params.data(), n}}, c.hp);

  for (int s = 0; s < steps; ++s) {
    // Gradients of the loss scale: x4 so that grad_scale brings them back to O(1).
    const Grad grad = make_grad(c.grad_dtype, normal_values(n, c.grad_stddev, 100 + s));
    optimizer->step({grad.data(), c.grad_dtype}, grad_scale, lrs[s]);
    adam_reference(ref, grad.values, grad_scale, lrs[s], c.hp, s + 1);
  }
  EXPECT_EQ(optimizer->step_count(), steps);

  const auto m = optimizer->state("exp_avg", 0);
  const auto v = optimizer->state("exp_avg_sq", 0);
  const double lr_max = 3e-2;
  double worst = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    const double tol_p = steps * (4 * kU * std::abs(ref.p[i]) + 64 * kU * lr_max * 3);
    const double tol_m = steps * 8 * kU * (std::abs(ref.m[i]) + 4.0);
    const double tol_v = steps * 8 * kU * (std::abs(ref.v[i]) + 16.0 * 0.01);
    ASSERT_NEAR(params[i], ref.p[i], tol_p) << c.name << " p[" << i << "]";
    ASSERT_NEAR(m[i], ref.m[i], tol_m) << c.name << " m[" << i << "]";
    ASSERT_NEAR(v[i], ref.v[i], tol_v) << c.name << " v[" << i << "]";
    worst = std::max(worst, std::abs(params[i] - ref.p[i]) / tol_p);
  }
  RecordProperty("worst_p_error_over_tolerance", std::to_string(worst));
}

std::string adam_case_name(const ::testing::TestParamInfo<AdamCase>& param) {
  return param.param.name;
}
INSTANTIATE_TEST_SUITE_P(Kernels, AdamVsReference, ::testing::ValuesIn(adam_cases()), adam_case_name);

TEST(Adam, DecoupledAndL2DifferOnlyWithWeightDecay) {
  // Sanity that the two modes are really different formulas (and equal without decay).
  constexpr std::size_t n = 64;
  const std::vector<float> g = normal_values(n, 1.0f, 7);
  for (float wd : {0.0f, 0.1f}) {
    std::vector<float> a = normal_values(n, 1.0f, 8), b = a;
    zt::OptimizerParams hp;
    hp.weight_decay = wd;
    zt::make_optimizer("adamw", {{a.data(), n}}, hp)->step({g.data(), DType::fp32}, 1.0f, 0.1f);
    hp.adam_w_mode = false;
    zt::make_optimizer("adam", {{b.data(), n}}, hp)->step({g.data(), DType::fp32}, 1.0f, 0.1f);
    EXPECT_EQ(a == b, wd == 0.0f) << "weight_decay " << wd;
  }
}

// ---- SGD vs reference ----------------------------------------------------------------------------

struct SgdCase {
  std::string name;
  zt::OptimizerParams hp;
  DType grad_dtype;
};

std::vector<SgdCase> sgd_cases() {
  std::vector<SgdCase> cases;
  for (DType dtype : {DType::fp32, DType::bf16, DType::fp16}) {
    const std::string suffix = std::string(zt::dtype_name(dtype));
    zt::OptimizerParams plain;
    cases.push_back({"plain_" + suffix, plain, dtype});
    zt::OptimizerParams decay;
    decay.weight_decay = 0.01f;
    cases.push_back({"weight_decay_" + suffix, decay, dtype});
    zt::OptimizerParams momentum;
    momentum.momentum = 0.9f;
    momentum.dampening = 0.1f;
    momentum.weight_decay = 0.01f;
    cases.push_back({"momentum_dampening_" + suffix, momentum, dtype});
    zt::OptimizerParams nesterov;
    nesterov.momentum = 0.9f;
    nesterov.nesterov = true;
    cases.push_back({"nesterov_" + suffix, nesterov, dtype});
  }
  return cases;
}

class SgdVsReference : public ::testing::TestWithParam<SgdCase> {};

TEST_P(SgdVsReference, SeveralSteps) {
  const SgdCase& c = GetParam();
  constexpr std::size_t n = 2 * 4096 + 77;
  constexpr int steps = 5;
  const float lr = 0.05f;
  const float grad_scale = 0.5f;
  std::vector<float> params = normal_values(n, 1.0f, 2);
  SgdRef ref{to_double(params), std::vector<double>(n, 0.0)};
  auto optimizer = zt::make_optimizer("SGD", {{params.data(), n}}, c.hp);
  for (int s = 0; s < steps; ++s) {
    const Grad grad = make_grad(c.grad_dtype, normal_values(n, 2.0f, 200 + s));
    optimizer->step({grad.data(), c.grad_dtype}, grad_scale, lr);
    sgd_reference(ref, grad.values, grad_scale, lr, c.hp, s == 0);
  }
  // SGD: |d| <= ~|g| / (1 - momentum) = 10 with momentum 0.9; a few roundings per step.
  for (std::size_t i = 0; i < n; ++i) {
    const double tol = steps * (4 * kU * std::abs(ref.p[i]) + 16 * kU * lr * 10.0);
    ASSERT_NEAR(params[i], ref.p[i], tol) << c.name << " p[" << i << "]";
  }
  if (c.hp.momentum != 0.0f) {
    const auto buf = optimizer->state("momentum_buffer", 0);
    for (std::size_t i = 0; i < n; ++i) ASSERT_NEAR(buf[i], ref.buf[i], steps * 16 * kU * 10.0) << c.name;
  }
}

std::string sgd_case_name(const ::testing::TestParamInfo<SgdCase>& param) {
  return param.param.name;
}
INSTANTIATE_TEST_SUITE_P(Kernels, SgdVsReference, ::testing::ValuesIn(sgd_cases()), sgd_case_name);

// ---- 16-bit copies -------------------------------------------------------------------------------

/// Parameters across fp16's whole range and beyond: subnormals, normals, overflow to inf.
std::vector<float> wide_range_values(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> exponent(-30.0f, 20.0f);
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = ((i & 1) ? -1.0f : 1.0f) * std::exp2(exponent(rng));
  return out;
}

TEST(HalfCopy, EqualsRoundingOfTheMasterWeights) {
  constexpr std::size_t n = 3 * 4096 + 5;
  for (DType copy_dtype : {DType::bf16, DType::fp16}) {
    for (const char* type : {"adamw", "sgd"}) {
      std::vector<float> params = wide_range_values(n, 3);
      std::vector<std::uint16_t> copy(n, 0xdead);
      zt::OptimizerParams hp;
      hp.momentum = std::string(type) == "sgd" ? 0.9f : 0.0f;
      auto optimizer = zt::make_optimizer(type, {{params.data(), n}}, hp);
      const std::vector<float> g = normal_values(n, 1e-3f, 4);
      for (int s = 0; s < 2; ++s)
        optimizer->step({g.data(), DType::fp32}, 1.0f, 1e-4f, {copy.data(), copy_dtype});
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint16_t expected =
            copy_dtype == DType::bf16 ? zt::bf16::from_float(params[i]) : zt::fp16::from_float(params[i]);
        ASSERT_EQ(copy[i], expected) << type << " " << zt::dtype_name(copy_dtype) << " [" << i << "] "
                                     << params[i];
      }
    }
  }
}

/// Floats that hit every rounding case: all signs and exponents, leading mantissa patterns, and the
/// dropped bits below, at and above halfway for bf16 (16 dropped bits) and fp16 (13); the halfway
/// points of fp16 subnormals (k + 1/2) * 2^-24 and their neighbours; random mantissas.
std::vector<float> rounding_edge_values() {
  std::vector<float> out;
  const std::uint32_t fp16_tails[] = {0x0u, 0x1u, 0xfffu, 0x1000u, 0x1001u, 0x1fffu};
  const std::uint32_t bf16_tails[] = {0x0u, 0x1u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu};
  std::mt19937 rng(42);
  for (std::uint32_t sign : {0u, 0x80000000u}) {
    for (std::uint32_t exponent = 0; exponent < 256; ++exponent) {
      const std::uint32_t head = sign | (exponent << 23);
      for (std::uint32_t top = 0; top < 1024; ++top) {
        for (std::uint32_t tail : fp16_tails) out.push_back(std::bit_cast<float>(head | (top << 13) | tail));
      }
      for (std::uint32_t top = 0; top < 128; ++top) {
        for (std::uint32_t tail : bf16_tails) out.push_back(std::bit_cast<float>(head | (top << 16) | tail));
      }
      for (int r = 0; r < 64; ++r)
        out.push_back(std::bit_cast<float>(head | (static_cast<std::uint32_t>(rng()) & 0x7fffffu)));
    }
    for (std::uint32_t k = 0; k < 1025; ++k) {
      const float halfway = (static_cast<float>(k) + 0.5f) * 0x1p-24f;
      const std::uint32_t bits = sign | std::bit_cast<std::uint32_t>(halfway);
      for (std::uint32_t b : {bits - 1, bits, bits + 1}) out.push_back(std::bit_cast<float>(b));
    }
  }
  return out;
}

TEST(HalfCopy, CastMatchesDtypeConversionsOnEveryRoundingCase) {
  const std::vector<float> values = rounding_edge_values();
  std::vector<std::uint16_t> out(values.size());
  for (DType dtype : {DType::bf16, DType::fp16}) {
    zt::kernels::cast_params_to_16bit(zt::default_stream(zt::Device::host()), values.data(), out.data(),
                                      dtype, values.size());
    for (std::size_t i = 0; i < values.size(); ++i) {
      const std::uint16_t expected =
          dtype == DType::bf16 ? zt::bf16::from_float(values[i]) : zt::fp16::from_float(values[i]);
      ASSERT_EQ(out[i], expected) << zt::dtype_name(dtype) << " bits 0x" << std::hex
                                  << std::bit_cast<std::uint32_t>(values[i]);
    }
  }
}

TEST(HalfGradients, EveryBitPatternIsReadExactly) {
  // p = 0 - 1 * g with plain SGD: the kernel's value of every bf16 and fp16 gradient, exactly.
  constexpr std::size_t n = 65536;
  std::vector<std::uint16_t> bits(n);
  for (std::size_t i = 0; i < n; ++i) bits[i] = static_cast<std::uint16_t>(i);
  for (DType dtype : {DType::bf16, DType::fp16}) {
    std::vector<float> params(n, 0.0f);
    zt::kernels::SgdStepArgs args;
    args.params = params.data();
    args.grads = bits.data();
    args.grad_dtype = dtype;
    args.count = n;
    args.lr = 1.0f;
    zt::kernels::sgd_step(zt::default_stream(zt::Device::host()), args);
    for (std::size_t i = 0; i < n; ++i) {
      const float g = dtype == DType::bf16 ? std::bit_cast<float>(static_cast<std::uint32_t>(bits[i]) << 16)
                                           : zt::fp16::to_float(bits[i]);
      const float expected = 0.0f - 1.0f * g;
      if (std::isnan(expected)) {
        ASSERT_TRUE(std::isnan(params[i])) << zt::dtype_name(dtype) << " bits " << i;
      } else {
        ASSERT_EQ(std::bit_cast<std::uint32_t>(params[i]), std::bit_cast<std::uint32_t>(expected))
            << zt::dtype_name(dtype) << " bits " << i;
      }
    }
  }
}

// ---- determinism and grad_scale folding ----------------------------------------------------------

struct AdamRun {
  std::vector<float> p, m, v;
  std::vector<std::uint16_t> copy;
};

AdamRun run_adam(int threads, DType grad_dtype, std::size_t n) {
  zt::kernels::set_host_threads(threads);
  AdamRun run{normal_values(n, 1.0f, 5), {}, {}, std::vector<std::uint16_t>(n)};
  zt::OptimizerParams hp;
  hp.weight_decay = 0.01f;
  auto optimizer = zt::make_optimizer("adamw", {{run.p.data(), n}}, hp);
  for (int s = 0; s < 3; ++s) {
    const Grad grad = make_grad(grad_dtype, normal_values(n, 1.0f, 300 + s));
    optimizer->step({grad.data(), grad_dtype}, 0.5f, 1e-2f, {run.copy.data(), DType::bf16});
  }
  run.m.assign(optimizer->state("exp_avg", 0).begin(), optimizer->state("exp_avg", 0).end());
  run.v.assign(optimizer->state("exp_avg_sq", 0).begin(), optimizer->state("exp_avg_sq", 0).end());
  return run;
}

TEST(Determinism, OneAndTwoThreadsGiveTheSameBits) {
  const int saved = zt::kernels::host_threads();
  constexpr std::size_t n = 25 * 4096 + 333;
  for (DType dtype : {DType::fp32, DType::fp16}) {
    const AdamRun one = run_adam(1, dtype, n);
    const AdamRun two = run_adam(2, dtype, n);
    EXPECT_EQ(0, std::memcmp(one.p.data(), two.p.data(), n * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(one.m.data(), two.m.data(), n * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(one.v.data(), two.v.data(), n * sizeof(float)));
    EXPECT_EQ(one.copy, two.copy);

    const Grad grad = make_grad(dtype, normal_values(5'000'017, 1.0f, 9));
    zt::kernels::set_host_threads(1);
    const auto s1 = zt::kernels::grad_sum_squares(zt::default_stream(zt::Device::host()), grad.data(), dtype,
                                                  grad.values.size());
    zt::kernels::set_host_threads(2);
    const auto s2 = zt::kernels::grad_sum_squares(zt::default_stream(zt::Device::host()), grad.data(), dtype,
                                                  grad.values.size());
    zt::kernels::set_host_threads(3);
    const auto s3 = zt::kernels::grad_sum_squares(zt::default_stream(zt::Device::host()), grad.data(), dtype,
                                                  grad.values.size());
    EXPECT_EQ(std::bit_cast<std::uint64_t>(s1.sum_sq), std::bit_cast<std::uint64_t>(s2.sum_sq));
    EXPECT_EQ(std::bit_cast<std::uint64_t>(s1.sum_sq), std::bit_cast<std::uint64_t>(s3.sum_sq));
  }
  {  // SGD with momentum, too
    std::vector<float> a = normal_values(n, 1.0f, 6), b = a;
    const std::vector<float> g = normal_values(n, 1.0f, 7);
    zt::OptimizerParams hp;
    hp.momentum = 0.9f;
    hp.nesterov = true;
    auto opt_a = zt::make_optimizer("sgd", {{a.data(), n}}, hp);
    auto opt_b = zt::make_optimizer("sgd", {{b.data(), n}}, hp);
    for (int s = 0; s < 2; ++s) {
      zt::kernels::set_host_threads(1);
      opt_a->step({g.data(), DType::fp32}, 1.0f, 0.1f);
      zt::kernels::set_host_threads(2);
      opt_b->step({g.data(), DType::fp32}, 1.0f, 0.1f);
    }
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), n * sizeof(float)));
  }
  zt::kernels::set_host_threads(saved);
}

TEST(GradScale, FoldingEqualsPrescaledGradient) {
  constexpr std::size_t n = 4096 + 17;
  const float grad_scale = 0.37f;  // not a power of two: the product really rounds
  for (DType dtype : {DType::fp32, DType::bf16, DType::fp16}) {
    for (const char* type : {"adamw", "sgd"}) {
      const Grad grad = make_grad(dtype, normal_values(n, 3.0f, 11));
      std::vector<float> prescaled(n);
      for (std::size_t i = 0; i < n; ++i) prescaled[i] = grad.values[i] * grad_scale;  // fp32 product
      std::vector<float> a = normal_values(n, 1.0f, 12), b = a;
      zt::OptimizerParams hp;
      hp.weight_decay = 0.01f;
      hp.momentum = std::string(type) == "sgd" ? 0.9f : 0.0f;
      auto folded = zt::make_optimizer(type, {{a.data(), n}}, hp);
      auto plain = zt::make_optimizer(type, {{b.data(), n}}, hp);
      for (int s = 0; s < 2; ++s) {
        folded->step({grad.data(), dtype}, grad_scale, 1e-2f);
        plain->step({prescaled.data(), DType::fp32}, 1.0f, 1e-2f);
      }
      EXPECT_EQ(0, std::memcmp(a.data(), b.data(), n * sizeof(float)))
          << type << " " << zt::dtype_name(dtype);
    }
  }
}

// ---- sum of squares and clipping -----------------------------------------------------------------

TEST(GradSumSquares, MatchesReferenceAndAppliesScale) {
  constexpr std::size_t n = 1'000'003;
  for (DType dtype : {DType::fp32, DType::bf16, DType::fp16}) {
    const Grad grad = make_grad(dtype, normal_values(n, 2.0f, 13));
    long double expected = 0.0L;
    for (float x : grad.values) expected += static_cast<long double>(x) * x;
    const auto check =
        zt::kernels::grad_sum_squares(zt::default_stream(zt::Device::host()), grad.data(), dtype, n, 0.5);
    EXPECT_FALSE(check.found_inf);
    // fp64 accumulation of 1e6 positive terms: relative error <= ~1e6 * 2^-53 ~ 1e-10 (much less in
    // practice, with 8 lanes and 16K-element chunks).
    EXPECT_NEAR(check.sum_sq, static_cast<double>(expected) * 0.25, 1e-10 * static_cast<double>(expected))
        << zt::dtype_name(dtype);
  }
  const auto empty =
      zt::kernels::grad_sum_squares(zt::default_stream(zt::Device::host()), nullptr, DType::fp32, 0);
  EXPECT_EQ(empty.sum_sq, 0.0);
  EXPECT_FALSE(empty.found_inf);
  const zt::kernels::GradCheck combined =
      zt::kernels::GradCheck{1.0, false} + zt::kernels::GradCheck{2.0, true};
  EXPECT_EQ(combined.sum_sq, 3.0);
  EXPECT_TRUE(combined.found_inf);
}

TEST(GradSumSquares, DeviceScalarsAddUpToTheHostSequence) {
  // Three buffers (the partials of one rank), with and without an overflow in the middle one: the
  // device-resident accumulator holds the bits of check = check + partial, on the host and on the
  // emulated device.
  const std::size_t n = 40'000;
  for (bool overflow : {false, true}) {
    std::vector<Grad> grads;
    for (int b = 0; b < 3; ++b) grads.push_back(make_grad(DType::fp16, normal_values(n + b, 4.0f, 60 + b)));
    if (overflow) grads[1].bits[17] = 0x7c00;  // +inf in fp16
    const double scale = 1.0 / 1024;
    const zt::Stream& host = zt::default_stream(zt::Device::host());
    zt::kernels::GradCheck expected;
    for (const Grad& grad : grads)
      expected =
          expected + zt::kernels::grad_sum_squares(host, grad.data(), DType::fp16, grad.values.size(), scale);
    ASSERT_EQ(expected.found_inf, overflow);

    zt::kernels::GradCheckScalars on_host;
    for (const Grad& grad : grads)
      zt::kernels::grad_sum_squares(host, grad.data(), DType::fp16, grad.values.size(), scale, &on_host);
    EXPECT_EQ(std::bit_cast<std::uint64_t>(on_host.sum_sq), std::bit_cast<std::uint64_t>(expected.sum_sq));
    EXPECT_EQ(on_host.found_inf, overflow ? 1.0 : 0.0);

    const zt::Device emulated = zt::Device::emulated();
    const zt::Stream& stream = zt::default_stream(emulated);
    zt::Buffer accumulator(emulated, sizeof(zt::kernels::GradCheckScalars));
    zt::zero_bytes(accumulator.data(), emulated, accumulator.size(), &stream);
    for (const Grad& grad : grads) {
      zt::Buffer device_grad(emulated, grad.values.size() * sizeof(std::uint16_t));
      zt::copy_bytes(device_grad.data(), emulated, grad.data(), zt::Device::host(), device_grad.size(),
                     &stream);
      zt::kernels::grad_sum_squares(stream, device_grad.data(), DType::fp16, grad.values.size(), scale,
                                    accumulator.as<zt::kernels::GradCheckScalars>());
    }
    zt::kernels::GradCheckScalars on_device;
    zt::copy_bytes(&on_device, zt::Device::host(), accumulator.data(), emulated, sizeof(on_device), &stream);
    EXPECT_EQ(std::bit_cast<std::uint64_t>(on_device.sum_sq), std::bit_cast<std::uint64_t>(expected.sum_sq));
    EXPECT_EQ(on_device.found_inf, overflow ? 1.0 : 0.0);
  }
}

TEST(GradClip, DeepSpeedFormula) {
  // sum of squares 16 -> norm 4; max_norm 1 -> coefficient 1 / (4 + 1e-6).
  auto clip = zt::kernels::clip_from_sum_squares(16.0, 1.0);
  EXPECT_DOUBLE_EQ(clip.norm, 4.0);
  EXPECT_DOUBLE_EQ(clip.coefficient, 1.0 / (4.0 + 1e-6));
  // Norm below max_norm: no clipping.
  EXPECT_EQ(zt::kernels::clip_from_sum_squares(16.0, 10.0).coefficient, 1.0);
  // max_norm 0 disables clipping (gradient_clipping: 0).
  EXPECT_EQ(zt::kernels::clip_from_sum_squares(1e6, 0.0).coefficient, 1.0);
  // Overflowed gradients: the step is skipped; the coefficient stays 1 rather than 0 or nan.
  EXPECT_EQ(zt::kernels::clip_from_sum_squares(INFINITY, 1.0).coefficient, 1.0);
  // grad_scale for the kernels: clip / loss_scale.
  EXPECT_FLOAT_EQ(zt::kernels::combined_grad_scale(1024.0, 0.5), 0.5f / 1024.0f);
}

// ---- the Optimizer classes -----------------------------------------------------------------------

TEST(Optimizer, FactoryNamesAreCaseInsensitiveAndUnknownOnesListTheSupported) {
  std::vector<float> p(8, 1.0f);
  EXPECT_EQ(zt::make_optimizer("AdamW", {{p.data(), 8}}, {})->name(), "adamw");
  EXPECT_EQ(zt::make_optimizer("SGD", {{p.data(), 8}}, {})->name(), "sgd");
  zt::OptimizerParams l2;
  l2.adam_w_mode = false;
  EXPECT_EQ(zt::make_optimizer("ADAM", {{p.data(), 8}}, l2)->name(), "adam");
  EXPECT_EQ(zt::make_optimizer("adam", {{p.data(), 8}}, {})->name(),
            "adamw");  // DeepSpeed default adam_w_mode
  EXPECT_EQ(zt::make_optimizer("adamw", {{p.data(), 8}}, l2)->name(), "adamw");  // adamw forces it
  try {
    zt::make_optimizer("lamb", {{p.data(), 8}}, {});
    FAIL() << "lamb accepted";
  } catch (const zt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("'lamb' is not supported; expected one of: adam, adamw, sgd"),
              std::string::npos)
        << e.what();
  }
}

TEST(Optimizer, StateIsNamedAllocatedAsOptimizerStatesAndZeroed) {
  constexpr std::size_t n1 = 1000, n2 = 24;
  std::vector<float> a(n1, 1.0f), b(n2, 2.0f);
  const auto before = zt::memory_snapshot(zt::DeviceType::host)[zt::MemoryCategory::optimizer_states].current;
  {
    auto adam = zt::make_optimizer("adamw", {{a.data(), n1}, {b.data(), n2}}, {});
    const auto during =
        zt::memory_snapshot(zt::DeviceType::host)[zt::MemoryCategory::optimizer_states].current;
    EXPECT_EQ(during - before, 2 * (n1 + n2) * sizeof(float));  // exp_avg + exp_avg_sq, fp32
    EXPECT_EQ(adam->state_names(), (std::vector<std::string_view>{"exp_avg", "exp_avg_sq"}));
    EXPECT_EQ(adam->state("exp_avg_sq", 1).size(), n2);
    for (float x : adam->state("exp_avg", 0)) ASSERT_EQ(x, 0.0f);
    try {
      adam->state("momentum_buffer", 0);
      FAIL();
    } catch (const zt::Error& e) {
      EXPECT_NE(std::string(e.what()).find("has: exp_avg, exp_avg_sq"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(zt::memory_snapshot(zt::DeviceType::host)[zt::MemoryCategory::optimizer_states].current, before);

  zt::OptimizerParams momentum;
  momentum.momentum = 0.9f;
  EXPECT_EQ(zt::make_optimizer("sgd", {{a.data(), n1}}, momentum)->state_names(),
            (std::vector<std::string_view>{"momentum_buffer"}));
  EXPECT_TRUE(zt::make_optimizer("sgd", {{a.data(), n1}}, {})->state_names().empty());
}

TEST(Optimizer, MultiBufferStepMatchesOneBufferAtATime) {
  constexpr std::size_t n1 = 5000, n2 = 300;
  std::vector<float> a1 = normal_values(n1, 1.0f, 20), a2 = normal_values(n2, 1.0f, 21);
  std::vector<float> b1 = a1, b2 = a2;
  const std::vector<float> g1 = normal_values(n1, 1.0f, 22), g2 = normal_values(n2, 1.0f, 23);
  std::vector<std::uint16_t> h1(n1), h2(n2);
  auto multi = zt::make_optimizer("adamw", {{a1.data(), n1}, {a2.data(), n2}}, {});
  auto single1 = zt::make_optimizer("adamw", {{b1.data(), n1}}, {});
  auto single2 = zt::make_optimizer("adamw", {{b2.data(), n2}}, {});
  for (int s = 0; s < 3; ++s) {
    const zt::GradBuffer grads[] = {{g1.data(), DType::fp32}, {g2.data(), DType::fp32}};
    const zt::HalfParamBuffer copies[] = {{h1.data(), DType::fp16}, {nullptr, DType::bf16}};
    multi->step(grads, 1.0f, 1e-3f, copies);
    single1->step(grads[0], 1.0f, 1e-3f);
    single2->step(grads[1], 1.0f, 1e-3f);
  }
  EXPECT_EQ(multi->step_count(), 3);
  EXPECT_EQ(a1, b1);
  EXPECT_EQ(a2, b2);
  for (std::size_t i = 0; i < n1; ++i) ASSERT_EQ(h1[i], zt::fp16::from_float(a1[i]));
  EXPECT_EQ(h2, std::vector<std::uint16_t>(n2, 0));  // no copy requested for buffer 1
}

TEST(Optimizer, RestoringStateAndStepCountContinuesBitwise) {
  constexpr std::size_t n = 4096;
  for (const char* type : {"adamw", "sgd"}) {
    zt::OptimizerParams hp;
    hp.momentum = 0.9f;
    std::vector<float> a = normal_values(n, 1.0f, 30);
    auto original = zt::make_optimizer(type, {{a.data(), n}}, hp);
    std::vector<std::vector<float>> grads;
    for (int s = 0; s < 5; ++s) grads.push_back(normal_values(n, 1.0f, 31 + s));
    for (int s = 0; s < 3; ++s) original->step({grads[s].data(), DType::fp32}, 1.0f, 1e-2f);

    // "Checkpoint": master weights, every named state, the step count; restore into a fresh one.
    std::vector<float> b = a;
    auto restored = zt::make_optimizer(type, {{b.data(), n}}, hp);
    for (std::string_view name : original->state_names()) {
      const auto from = original->state(name, 0);
      std::copy(from.begin(), from.end(), restored->state(name, 0).begin());
    }
    restored->set_step_count(original->step_count());
    for (int s = 3; s < 5; ++s) {
      original->step({grads[s].data(), DType::fp32}, 1.0f, 1e-2f);
      restored->step({grads[s].data(), DType::fp32}, 1.0f, 1e-2f);
    }
    EXPECT_EQ(a, b) << type;
  }
}

TEST(Optimizer, RejectsBadArgumentsWithContext) {
  std::vector<float> p(16, 0.0f), g(16, 0.0f);
  zt::OptimizerParams bad_nesterov;
  bad_nesterov.nesterov = true;  // without momentum
  EXPECT_THROW(zt::make_optimizer("sgd", {{p.data(), 16}}, bad_nesterov), zt::ConfigError);
  zt::OptimizerParams bad_beta;
  bad_beta.beta2 = 1.0f;
  EXPECT_THROW(zt::make_optimizer("adam", {{p.data(), 16}}, bad_beta), zt::ConfigError);

  auto adam = zt::make_optimizer("adam", {{p.data(), 16}, {p.data(), 16}}, {});
  try {
    adam->step({g.data(), DType::fp32}, 1.0f, 1e-3f);  // single-buffer call on two buffers
    FAIL();
  } catch (const zt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected exactly one"), std::string::npos) << e.what();
  }
  auto one = zt::make_optimizer("adam", {{p.data(), 16}}, {});
  EXPECT_THROW(one->step({g.data(), DType::int32}, 1.0f, 1e-3f), zt::Error);
  EXPECT_THROW(one->step({g.data(), DType::fp32}, INFINITY, 1e-3f), zt::Error);
  EXPECT_EQ(one->step_count(), 0);  // failed calls do not count

  zt::OptimizerParams hp;
  hp.beta1 = 0.85f;  // e.g. OneCycle momentum
  one->set_hyperparameters(hp);
  EXPECT_EQ(one->hyperparameters().beta1, 0.85f);
  auto sgd = zt::make_optimizer("sgd", {{p.data(), 16}}, {});
  hp.momentum = 0.9f;
  EXPECT_THROW(sgd->set_hyperparameters(hp), zt::ConfigError);  // no momentum buffer was allocated
}

}  // namespace
