// The host bf16 GEMM paths (kernels/host_gemm.hpp): the choice and its override (ZT_BF16_GEMM), both
// paths against a double-precision product of the same bf16 operands at odd shapes, every transpose,
// strided operands, alpha and beta, within bf16 tolerances; the native path's determinism; and a short
// bf16 training run whose loss curve on the native path stays within bf16 tolerance of the fp32-widening
// path's. Tests of the native path skip, saying why, in a build without oneDNN.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/host/host_common.hpp"  // host::gemm
#include "kernels/host_gemm.hpp"
#include "kernels/optimizer_kernels.hpp"  // set_host_threads
#include "test_helpers.hpp"
#include "zerotrain/dtype.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/nn.hpp"
#include "zerotrain/tensor.hpp"

namespace {

using zt::bf16;
using zt::kernels::Bf16GemmPath;

/// Restores the bf16 GEMM path in use when the test ends.
class PathGuard {
 public:
  PathGuard() : saved_(zt::kernels::bf16_gemm_path()) {}
  ~PathGuard() { zt::kernels::set_bf16_gemm_path(saved_); }
  PathGuard(const PathGuard&) = delete;
  PathGuard& operator=(const PathGuard&) = delete;

 private:
  Bf16GemmPath saved_;
};

#define ZT_REQUIRE_NATIVE_BF16_GEMM()                                                                     \
  do {                                                                                                    \
    if (!zt::kernels::bf16_gemm_compiled())                                                               \
      GTEST_SKIP() << "built without oneDNN (ZT_WITH_ONEDNN): no native bf16 GEMM path to test";          \
    if (!zt::kernels::bf16_gemm_runnable())                                                               \
      GTEST_SKIP() << "oneDNN builds no bf16 matmul on this CPU (it needs AVX-512): no native bf16 GEMM " \
                      "path to test";                                                                     \
  } while (0)

/// ZT_BF16_GEMM=bf16 (ctest's unit.bf16_gemm_forced_bf16) on a CPU where the path cannot run: the
/// first bf16 GEMM must refuse with that reason, and every test of the forced path is skipped.
bool forced_native_path() {
  const char* forced = std::getenv("ZT_BF16_GEMM");
  return forced != nullptr && std::string(forced) == "bf16";
}
class ForcedPathThatCannotRun : public ::testing::Environment {
 public:
  void SetUp() override {
    if (!forced_native_path() || !zt::kernels::bf16_gemm_compiled() || zt::kernels::bf16_gemm_runnable())
      return;
    std::string message = "no error";
    try {
      (void)zt::kernels::bf16_gemm_path();
    } catch (const zt::Error& error) {
      message = error.what();
    }
    if (message.find("ZT_BF16_GEMM=bf16 asks for the native bf16 GEMM, but oneDNN builds no bf16 matmul on "
                     "this CPU") == std::string::npos) {
      ADD_FAILURE() << "ZT_BF16_GEMM=bf16 on a CPU without oneDNN bf16 matmuls: " << message;
      return;
    }
    std::printf("ZT_BF16_GEMM=bf16 cannot run on this CPU, as its error says: %s\n", message.c_str());
    GTEST_SKIP() << "ZT_BF16_GEMM=bf16 cannot run on this CPU (refused as expected)";
  }
};
const ::testing::Environment* const kForcedPathThatCannotRun =
    ::testing::AddGlobalTestEnvironment(new ForcedPathThatCannotRun);  // NOLINT: gtest takes ownership

/// Deterministic bf16 values in [-1, 1) with some exact zeros.
std::vector<bf16> bf16_values(std::size_t count, std::uint32_t seed) {
  std::vector<bf16> out(count);
  std::uint32_t state = seed * 2654435761u + 1u;
  for (std::size_t i = 0; i < count; ++i) {
    state = state * 1664525u + 1013904223u;
    out[i] = bf16(i % 89 == 0 ? 0.0f : static_cast<float>(state >> 8) / 8388608.0f - 1.0f);
  }
  return out;
}

struct GemmCase {
  bool transpose_a, transpose_b;
  std::int64_t m, n, k;
  double alpha, beta;
  std::int64_t padding;  // extra elements per row of every operand: strided views
};

std::string describe(const GemmCase& c) {
  return "C[" + std::to_string(c.m) + "," + std::to_string(c.n) + "] k " + std::to_string(c.k) +
         (c.transpose_a ? " A^T" : " A") + (c.transpose_b ? " B^T" : " B") + " alpha " +
         std::to_string(c.alpha) + " beta " + std::to_string(c.beta) + " padding " +
         std::to_string(c.padding);
}

/// Operands of one case, row-major with leading dimensions that include the padding.
struct GemmOperands {
  std::int64_t lda, ldb, ldc;
  std::vector<bf16> a, b, c;
};

GemmOperands operands(const GemmCase& c, std::uint32_t seed) {
  GemmOperands o;
  const std::int64_t a_rows = c.transpose_a ? c.k : c.m, a_columns = c.transpose_a ? c.m : c.k;
  const std::int64_t b_rows = c.transpose_b ? c.n : c.k, b_columns = c.transpose_b ? c.k : c.n;
  o.lda = a_columns + c.padding;
  o.ldb = b_columns + c.padding;
  o.ldc = c.n + c.padding;
  o.a = bf16_values(static_cast<std::size_t>(a_rows * o.lda), seed);
  o.b = bf16_values(static_cast<std::size_t>(b_rows * o.ldb), seed + 1);
  o.c = bf16_values(static_cast<std::size_t>(c.m * o.ldc), seed + 2);
  return o;
}

std::vector<bf16> run_gemm(const GemmCase& c, const GemmOperands& o) {
  std::vector<bf16> result = o.c;
  zt::kernels::host::gemm(c.transpose_a, c.transpose_b, c.m, c.n, c.k, c.alpha, o.a.data(), o.lda, o.b.data(),
                          o.ldb, c.beta, result.data(), o.ldc);
  return result;
}

/// Checks `result` against the product in double of the same bf16 operands. Both paths accumulate in fp32
/// and round to bf16 once: |error| <= 2^-8 |exact| (the rounding) + k 2^-23 sum |alpha a b| (fp32 sums),
/// with a factor 2 to spare. Padding columns of C must be untouched.
void expect_close_to_exact(const GemmCase& c, const GemmOperands& o, const std::vector<bf16>& result,
                           const char* path) {
  const auto a_at = [&](std::int64_t i, std::int64_t p) {
    return static_cast<double>(static_cast<float>(c.transpose_a ? o.a[p * o.lda + i] : o.a[i * o.lda + p]));
  };
  const auto b_at = [&](std::int64_t p, std::int64_t j) {
    return static_cast<double>(static_cast<float>(c.transpose_b ? o.b[j * o.ldb + p] : o.b[p * o.ldb + j]));
  };
  int failures = 0;
  for (std::int64_t i = 0; i < c.m; ++i) {
    for (std::int64_t j = 0; j < o.ldc; ++j) {
      const std::size_t at = static_cast<std::size_t>(i * o.ldc + j);
      if (j >= c.n) {
        ASSERT_EQ(result[at].bits, o.c[at].bits)
            << path << " " << describe(c) << ": padding of C at " << i << "," << j << " was written";
        continue;
      }
      double exact = 0, magnitude = 0;
      for (std::int64_t p = 0; p < c.k; ++p) {
        exact += a_at(i, p) * b_at(p, j);
        magnitude += std::abs(a_at(i, p) * b_at(p, j));
      }
      const double c_old = static_cast<float>(o.c[at]);
      exact = c.alpha * exact + c.beta * c_old;
      magnitude = std::abs(c.alpha) * magnitude + std::abs(c.beta * c_old);
      const double tolerance =
          2.0 * (0x1p-8 * std::abs(exact) + static_cast<double>(c.k + 2) * 0x1p-23 * magnitude);
      const double got = static_cast<float>(result[at]);
      if (!(std::abs(got - exact) <= tolerance) && ++failures <= 5) {
        ADD_FAILURE() << path << " " << describe(c) << ": C[" << i << "," << j << "] = " << got << ", exact "
                      << exact << ", tolerance " << tolerance;
      }
    }
  }
  EXPECT_EQ(failures, 0) << path << " " << describe(c);
}

std::vector<GemmCase> odd_cases() {
  std::vector<GemmCase> cases;
  // The last two cross the widening path's 1024-element tiles in every dimension (kernels/host/gemm.cpp).
  const std::int64_t shapes[][3] = {{1, 1, 1},     {3, 5, 7},      {17, 33, 65},    {129, 67, 255},
                                    {70, 513, 97}, {257, 31, 768}, {1030, 9, 2051}, {3, 2100, 1100}};
  for (const auto& shape : shapes) {
    for (int transposes = 0; transposes < 4; ++transposes) {
      const bool ta = (transposes & 1) != 0, tb = (transposes & 2) != 0;
      cases.push_back({ta, tb, shape[0], shape[1], shape[2], 1.0, 0.0, 0});
      cases.push_back({ta, tb, shape[0], shape[1], shape[2], 0.375, 1.0, 3});
      cases.push_back({ta, tb, shape[0], shape[1], shape[2], 1.0, -0.5, 5});
    }
  }
  return cases;
}

TEST(Bf16GemmPath, ChoiceFollowsTheCpuAndTheBuildOrZtBf16Gemm) {
  const char* forced = std::getenv("ZT_BF16_GEMM");
  const std::string description = zt::kernels::bf16_gemm_description();
  if (forced == nullptr || *forced == '\0' || std::string(forced) == "auto") {
    const bool native = zt::kernels::bf16_gemm_compiled() && zt::kernels::cpu_has_native_bf16_gemm();
    EXPECT_EQ(zt::kernels::bf16_gemm_path(), native ? Bf16GemmPath::bf16 : Bf16GemmPath::fp32) << description;
    EXPECT_NE(description.find("(auto: "), std::string::npos) << description;
  } else {
    EXPECT_EQ(zt::kernels::bf16_gemm_path_name(zt::kernels::bf16_gemm_path()), std::string(forced));
    EXPECT_NE(description.find("forced by ZT_BF16_GEMM="), std::string::npos) << description;
  }
  EXPECT_EQ(description.rfind(zt::kernels::bf16_gemm_path_name(zt::kernels::bf16_gemm_path()), 0), 0u)
      << description;
  if (!zt::kernels::bf16_gemm_compiled()) {
    PathGuard guard;
    try {
      zt::kernels::set_bf16_gemm_path(Bf16GemmPath::bf16);
      FAIL() << "set_bf16_gemm_path(bf16) succeeded in a build without oneDNN";
    } catch (const zt::Error& error) {
      EXPECT_NE(std::string(error.what()).find("without oneDNN"), std::string::npos) << error.what();
    }
  } else if (!zt::kernels::bf16_gemm_runnable()) {
    // A CPU without AVX-512 (oneDNN has no bf16 matmul there): the auto choice is fp32, forcing
    // bf16 is refused with the reason.
    EXPECT_FALSE(zt::kernels::cpu_has_native_bf16_gemm());
    PathGuard guard;
    try {
      zt::kernels::set_bf16_gemm_path(Bf16GemmPath::bf16);
      FAIL() << "set_bf16_gemm_path(bf16) succeeded where oneDNN has no bf16 matmul";
    } catch (const zt::Error& error) {
      EXPECT_NE(std::string(error.what()).find("oneDNN builds no bf16 matmul on this CPU"), std::string::npos)
          << error.what();
    }
    EXPECT_EQ(zt::kernels::bf16_gemm_path(), Bf16GemmPath::fp32) << "a refused switch changes nothing";
  }
}

TEST(Bf16Gemm, BothPathsMatchTheExactProductAtOddShapes) {
  PathGuard guard;
  std::vector<Bf16GemmPath> paths{Bf16GemmPath::fp32};
  if (zt::kernels::bf16_gemm_runnable()) paths.push_back(Bf16GemmPath::bf16);
  std::uint32_t seed = 1;
  for (const GemmCase& c : odd_cases()) {
    const GemmOperands o = operands(c, seed += 3);
    std::vector<std::vector<bf16>> results;
    for (Bf16GemmPath path : paths) {
      zt::kernels::set_bf16_gemm_path(path);
      results.push_back(run_gemm(c, o));
      expect_close_to_exact(c, o, results.back(), zt::kernels::bf16_gemm_path_name(path));
    }
  }
  if (!zt::kernels::bf16_gemm_compiled())
    GTEST_SKIP() << "built without oneDNN: only the fp32 path was checked";
  if (!zt::kernels::bf16_gemm_runnable())
    GTEST_SKIP() << "oneDNN builds no bf16 matmul on this CPU: only the fp32 path was checked";
}

TEST(Bf16Gemm, NativePathIsDeterministicAndIndependentOfTheThreadCount) {
  ZT_REQUIRE_NATIVE_BF16_GEMM();
  PathGuard guard;
  zt::kernels::set_bf16_gemm_path(Bf16GemmPath::bf16);
  const int saved_threads = zt::kernels::host_threads();
  // The step's shapes, smaller: a linear layer forward (B^T), its input gradient, its weight gradient (A^T).
  const GemmCase cases[] = {{false, true, 256, 384, 128, 1.0, 1.0, 0},
                            {false, false, 256, 128, 384, 1.0, 0.0, 0},
                            {true, false, 384, 128, 256, 1.0, 1.0, 0}};
  for (const GemmCase& c : cases) {
    const GemmOperands o = operands(c, 77);
    zt::kernels::set_host_threads(1);
    const std::vector<bf16> one = run_gemm(c, o);
    zt::kernels::set_host_threads(2);
    const std::vector<bf16> two = run_gemm(c, o), again = run_gemm(c, o);
    EXPECT_EQ(std::memcmp(two.data(), again.data(), two.size() * sizeof(bf16)), 0) << describe(c);
    EXPECT_EQ(std::memcmp(one.data(), two.data(), one.size() * sizeof(bf16)), 0) << describe(c);
  }
  zt::kernels::set_host_threads(saved_threads);
}

/// Loss per step of a bf16 GPT trained with SGD on fp32 master weights (as the engine's mixed precision
/// keeps them) on one fixed batch, on the bf16 GEMM path in use.
std::vector<double> bf16_loss_curve(int steps) {
  namespace nn = zt::nn;
  const nn::GptConfig config{.n_layer = 2, .n_head = 4, .d_model = 64, .seq_len = 32, .vocab_size = 97};
  nn::Gpt gpt(config, zt::DType::bf16, 21);
  const zt::Tensor tokens = zt::testing::random_tokens({4, 32}, 97, 22);
  const zt::Tensor targets = zt::testing::random_tokens({4, 32}, 97, 23);
  std::vector<std::vector<float>> master;
  for (nn::Parameter* parameter : gpt.parameters()) {
    const zt::Tensor widened = parameter->value.to(zt::DType::fp32);
    master.emplace_back(widened.data<float>(), widened.data<float>() + widened.numel());
  }
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    gpt.zero_grad();
    nn::SoftmaxCrossEntropy criterion;
    losses.push_back(criterion.forward(gpt.run_forward(tokens), targets));
    gpt.run_backward(criterion.backward());
    std::size_t index = 0;
    for (nn::Parameter* parameter : gpt.parameters()) {
      std::vector<float>& weights = master[index++];
      const bf16* grad = parameter->grad.data<bf16>();
      bf16* value = parameter->value.data<bf16>();
      for (std::size_t i = 0; i < weights.size(); ++i) {
        weights[i] -= 0.1f * static_cast<float>(grad[i]);
        value[i] = bf16(weights[i]);
      }
    }
  }
  return losses;
}

TEST(Bf16Gemm, ShortTrainingRunOnTheNativePathFollowsTheFp32WideningLossCurve) {
  ZT_REQUIRE_NATIVE_BF16_GEMM();
  PathGuard guard;
  constexpr int kSteps = 12;
  zt::kernels::set_bf16_gemm_path(Bf16GemmPath::fp32);
  const std::vector<double> widening = bf16_loss_curve(kSteps);
  zt::kernels::set_bf16_gemm_path(Bf16GemmPath::bf16);
  const std::vector<double> native = bf16_loss_curve(kSteps);
  std::string curves = "loss per step (fp32 widening / bf16 native):";
  for (int step = 0; step < kSteps; ++step) {
    // Appended piece by piece: GCC 12's -Wrestrict misfires on chained string concatenation.
    curves += ' ';
    curves += std::to_string(widening[step]);
    curves += '/';
    curves += std::to_string(native[step]);
  }
  SCOPED_TRACE(curves);
  std::printf("%s\n", curves.c_str());
  // The run learns (the fixed batch is memorized; plain SGD's curve is not monotone), on both paths.
  EXPECT_LT(*std::min_element(widening.begin() + kSteps / 2, widening.end()), 0.9 * widening.front());
  EXPECT_LT(*std::min_element(native.begin() + kSteps / 2, native.end()), 0.9 * native.front());
  for (int step = 0; step < kSteps; ++step) {
    // bf16 keeps 8 significant bits; the two paths differ in fp32 summation order only, and the
    // difference grows over the steps. 2 % of the loss: a few bf16 steps, far below what a wrong GEMM gives.
    EXPECT_NEAR(native[step], widening[step], 0.02 * widening[step]) << "step " << step;
  }
}

}  // namespace
