// The host kernels' run-time ISA paths (kernels/host_isa.hpp): the choice and its override, and that
// every path this CPU runs gives the baseline path's bits (all element-wise kernels and the in-order
// sums), cross-entropy's SIMD row sum within fp32 roundoff. ctest runs this file, and the kernel,
// gradient-check and optimizer tests, once per path with ZT_HOST_ISA forced (unit.isa_<path>.*).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "kernels/host_isa.hpp"
#include "kernels/nn_kernels.hpp"
#include "kernels/optimizer_kernels.hpp"
#include "zerotrain/device.hpp"
#include "zerotrain/dtype.hpp"
#include "zerotrain/error.hpp"

namespace {

using zt::kernels::HostIsa;

const zt::Stream& host_stream() {
  return zt::default_stream(zt::Device::host());
}

/// The supported paths, best first.
std::vector<HostIsa> supported_paths() {
  std::vector<HostIsa> paths;
  for (int i = zt::kernels::kHostIsaCount - 1; i >= 0; --i) {
    if (zt::kernels::host_isa_supported(static_cast<HostIsa>(i))) paths.push_back(static_cast<HostIsa>(i));
  }
  return paths;
}

/// Restores the path in use when the test ends.
class PathGuard {
 public:
  PathGuard() : saved_(zt::kernels::host_isa()) {}
  ~PathGuard() { zt::kernels::set_host_isa(saved_); }
  PathGuard(const PathGuard&) = delete;
  PathGuard& operator=(const PathGuard&) = delete;

 private:
  HostIsa saved_;
};

/// Deterministic values in [-scale, scale) with some exact zeros.
std::vector<float> values(std::size_t count, std::uint32_t seed, float scale = 1.0f) {
  std::vector<float> out(count);
  std::uint32_t state = seed * 2654435761u + 1u;
  for (std::size_t i = 0; i < count; ++i) {
    state = state * 1664525u + 1013904223u;
    out[i] = i % 97 == 0 ? 0.0f : scale * (static_cast<float>(state >> 8) / 8388608.0f - 1.0f);
  }
  return out;
}

template <typename T>
std::vector<std::uint8_t> bytes_of(const std::vector<T>& data) {
  std::vector<std::uint8_t> out(data.size() * sizeof(T));
  std::memcpy(out.data(), data.data(), out.size());
  return out;
}

/// Runs `produce` (which returns the bytes of its outputs) on every supported path and expects the
/// baseline path's bytes from each.
void expect_same_bits_on_every_path(const std::string& what,
                                    const std::function<std::vector<std::uint8_t>()>& produce) {
  const PathGuard guard;
  zt::kernels::set_host_isa(HostIsa::baseline);
  const std::vector<std::uint8_t> reference = produce();
  ASSERT_FALSE(reference.empty()) << what;
  for (HostIsa path : supported_paths()) {
    zt::kernels::set_host_isa(path);
    const std::vector<std::uint8_t> result = produce();
    ASSERT_EQ(result.size(), reference.size()) << what << " on " << zt::kernels::host_isa_name(path);
    std::size_t first = result.size();
    for (std::size_t i = 0; i < result.size() && first == result.size(); ++i) {
      if (result[i] != reference[i]) first = i;
    }
    EXPECT_EQ(first, result.size()) << what << " on " << zt::kernels::host_isa_name(path)
                                    << " differs from the baseline path first at byte " << first;
  }
}

// 3 blocks of 4096 and a remainder: every path runs its vector body and its scalar tail.
constexpr std::size_t kCount = 3 * 4096 + 37;

TEST(HostIsa, NamesRoundTripAndUnknownNamesAreRejected) {
  for (int i = 0; i < zt::kernels::kHostIsaCount; ++i) {
    const auto isa = static_cast<HostIsa>(i);
    EXPECT_EQ(zt::kernels::parse_host_isa(zt::kernels::host_isa_name(isa), "test"), isa);
  }
  try {
    (void)zt::kernels::parse_host_isa("sse9", "ZT_HOST_ISA=sse9");
    FAIL() << "parse_host_isa accepted 'sse9'";
  } catch (const zt::Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("ZT_HOST_ISA=sse9: unknown host ISA path 'sse9'"), std::string::npos) << message;
    EXPECT_NE(message.find("expected avx512, avx2, baseline or auto"), std::string::npos) << message;
  }
}

TEST(HostIsa, ActivePathIsTheOverrideOrTheBestSupported) {
  EXPECT_TRUE(zt::kernels::host_isa_supported(HostIsa::baseline));
  EXPECT_NE(zt::kernels::supported_host_isas().find("baseline"), std::string::npos);
  const char* forced = std::getenv("ZT_HOST_ISA");
  const std::string description = zt::kernels::host_isa_description();
  if (forced != nullptr && *forced != '\0' && std::string(forced) != "auto") {
    EXPECT_EQ(zt::kernels::host_isa(), zt::kernels::parse_host_isa(forced, "ZT_HOST_ISA"));
    EXPECT_NE(description.find(std::string("forced by ZT_HOST_ISA=") + forced), std::string::npos)
        << description;
  } else {
    EXPECT_EQ(zt::kernels::host_isa(), zt::kernels::best_host_isa());
    EXPECT_NE(description.find("auto"), std::string::npos) << description;
  }
  EXPECT_EQ(description.rfind(zt::kernels::host_isa_name(zt::kernels::host_isa()), 0), 0u) << description;
}

TEST(HostIsa, SwitchingPathsAcceptsSupportedAndRejectsUnsupported) {
  const PathGuard guard;
  for (int i = 0; i < zt::kernels::kHostIsaCount; ++i) {
    const auto isa = static_cast<HostIsa>(i);
    if (zt::kernels::host_isa_supported(isa)) {
      zt::kernels::set_host_isa(isa);
      EXPECT_EQ(zt::kernels::host_isa(), isa);
    } else {
      EXPECT_THROW(zt::kernels::set_host_isa(isa), zt::Error) << zt::kernels::host_isa_name(isa);
    }
  }
}

TEST(HostIsa, AdamGivesTheSameBitsOnEveryPath) {
  for (zt::DType grad_dtype : {zt::DType::fp32, zt::DType::bf16, zt::DType::fp16}) {
    for (int copy = 0; copy < 3; ++copy) {
      for (bool decoupled : {true, false}) {
        const std::string what = std::string("adam_step grads ") + std::string(zt::dtype_name(grad_dtype)) +
                                 " copy " + std::to_string(copy) + (decoupled ? " adamw" : " l2");
        expect_same_bits_on_every_path(what, [&] {
          std::vector<float> p = values(kCount, 1), m = values(kCount, 2, 0.1f), v = values(kCount, 3, 0.01f);
          for (float& x : v) x = x * x;
          const std::vector<float> g32 = values(kCount, 4, 3.0f);
          std::vector<std::uint16_t> g16(kCount), p16(kCount, 0);
          if (grad_dtype != zt::DType::fp32) {
            zt::kernels::convert(host_stream(), g32.data(), zt::DType::fp32, g16.data(), grad_dtype,
                                 static_cast<std::int64_t>(kCount));
          }
          zt::kernels::AdamStepArgs args;
          args.params = p.data();
          args.exp_avg = m.data();
          args.exp_avg_sq = v.data();
          args.grads = grad_dtype == zt::DType::fp32 ? static_cast<const void*>(g32.data()) : g16.data();
          args.grad_dtype = grad_dtype;
          args.params_16bit = copy == 0 ? nullptr : p16.data();
          args.params_16bit_dtype = copy == 1 ? zt::DType::bf16 : zt::DType::fp16;
          args.count = kCount;
          args.grad_scale = 0.5f;
          args.lr = 1e-2f;
          args.weight_decay = 0.1f;
          args.adam_w_mode = decoupled;
          for (std::int64_t step = 1; step <= 3; ++step) {
            args.step = step;
            zt::kernels::adam_step(host_stream(), args);
          }
          std::vector<std::uint8_t> out = bytes_of(p);
          for (const auto& part : {bytes_of(m), bytes_of(v), bytes_of(p16)})
            out.insert(out.end(), part.begin(), part.end());
          return out;
        });
      }
    }
  }
}

TEST(HostIsa, SgdGivesTheSameBitsOnEveryPath) {
  for (zt::DType grad_dtype : {zt::DType::fp32, zt::DType::bf16}) {
    for (int mode = 0; mode < 3; ++mode) {
      const std::string what = std::string("sgd_step grads ") + std::string(zt::dtype_name(grad_dtype)) +
                               " mode " + std::to_string(mode);
      expect_same_bits_on_every_path(what, [&] {
        std::vector<float> p = values(kCount, 5), buffer(kCount, 0.0f);
        const std::vector<float> g32 = values(kCount, 6);
        std::vector<std::uint16_t> g16(kCount), p16(kCount, 0);
        if (grad_dtype != zt::DType::fp32) {
          zt::kernels::convert(host_stream(), g32.data(), zt::DType::fp32, g16.data(), grad_dtype,
                               static_cast<std::int64_t>(kCount));
        }
        zt::kernels::SgdStepArgs args;
        args.params = p.data();
        args.momentum_buffer = buffer.data();
        args.grads = grad_dtype == zt::DType::fp32 ? static_cast<const void*>(g32.data()) : g16.data();
        args.grad_dtype = grad_dtype;
        args.params_16bit = p16.data();
        args.params_16bit_dtype = zt::DType::fp16;
        args.count = kCount;
        args.lr = 0.1f;
        args.momentum = mode == 0 ? 0.0f : 0.9f;
        args.dampening = 0.1f;
        args.weight_decay = 0.01f;
        args.nesterov = mode == 2;
        for (bool first : {true, false}) {
          args.first_step = first;
          zt::kernels::sgd_step(host_stream(), args);
        }
        std::vector<std::uint8_t> out = bytes_of(p);
        for (const auto& part : {bytes_of(buffer), bytes_of(p16)})
          out.insert(out.end(), part.begin(), part.end());
        return out;
      });
    }
  }
}

TEST(HostIsa, CastAndSumOfSquaresGiveTheSameBitsOnEveryPath) {
  std::vector<float> params = values(kCount, 7, 70000.0f);
  // The conversions' special cases: inf, nan, the fp16 overflow edge, fp16 subnormals, fp32 denormals.
  const float specials[] = {std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            65504.0f,
                            65519.0f,
                            65520.0f,
                            6e-8f,
                            3e-8f,
                            1e-40f,
                            -0.0f};
  for (std::size_t i = 0; i < std::size(specials); ++i) params[100 + 13 * i] = specials[i];
  for (zt::DType dtype : {zt::DType::bf16, zt::DType::fp16}) {
    expect_same_bits_on_every_path(
        std::string("cast_params_to_16bit ") + std::string(zt::dtype_name(dtype)), [&] {
          std::vector<std::uint16_t> out(kCount, 0);
          zt::kernels::cast_params_to_16bit(host_stream(), params.data(), out.data(), dtype, kCount);
          return bytes_of(out);
        });
  }
  const std::vector<float> grads = values(kCount, 8, 10.0f);
  std::vector<std::uint16_t> grads16(kCount);
  zt::kernels::convert(host_stream(), grads.data(), zt::DType::fp32, grads16.data(), zt::DType::bf16,
                       static_cast<std::int64_t>(kCount));
  expect_same_bits_on_every_path("grad_sum_squares", [&] {
    const std::vector<double> sums = {
        zt::kernels::grad_sum_squares(host_stream(), grads.data(), zt::DType::fp32, kCount, 0.5).sum_sq,
        zt::kernels::grad_sum_squares(host_stream(), grads16.data(), zt::DType::bf16, kCount, 0.5).sum_sq};
    return bytes_of(sums);
  });
}

TEST(HostIsa, GeluAndLayerNormGiveTheSameBitsOnEveryPath) {
  const std::vector<float> input = values(kCount, 9, 6.0f), grad = values(kCount, 10);
  expect_same_bits_on_every_path("gelu forward and backward", [&] {
    std::vector<float> out(kCount), din(kCount);
    const auto n = static_cast<std::int64_t>(kCount);
    zt::kernels::activation_forward(host_stream(), zt::DType::fp32, zt::kernels::Activation::gelu,
                                    input.data(), out.data(), n);
    zt::kernels::activation_backward(host_stream(), zt::DType::fp32, zt::kernels::Activation::gelu,
                                     input.data(), grad.data(), din.data(), n);
    std::vector<std::uint8_t> bytes = bytes_of(out), more = bytes_of(din);
    bytes.insert(bytes.end(), more.begin(), more.end());
    return bytes;
  });
  constexpr std::int64_t rows = 37, channels = 200;  // 3 column blocks of 64 and a remainder
  const std::vector<float> x = values(rows * channels, 11, 3.0f), dy = values(rows * channels, 12);
  const std::vector<float> w = values(channels, 13), b = values(channels, 14);
  expect_same_bits_on_every_path("layernorm forward and backward", [&] {
    std::vector<float> y(rows * channels), mean(rows), rstd(rows), dx(rows * channels);
    std::vector<float> dw = values(channels, 15), db = values(channels, 16);
    zt::kernels::layernorm_forward(host_stream(), zt::DType::fp32, x.data(), w.data(), b.data(), y.data(),
                                   mean.data(), rstd.data(), rows, channels, 1e-5);
    zt::kernels::layernorm_backward(host_stream(), zt::DType::fp32, dy.data(), x.data(), w.data(),
                                    mean.data(), rstd.data(), dx.data(), dw.data(), db.data(), rows,
                                    channels);
    std::vector<std::uint8_t> out;
    for (const auto* part : {&y, &mean, &rstd, &dx, &dw, &db}) {
      const auto part_bytes = bytes_of(*part);
      out.insert(out.end(), part_bytes.begin(), part_bytes.end());
    }
    return out;
  });
}

TEST(HostIsa, AttentionSoftmaxGivesTheSameBitsOnEveryPath) {
  const zt::kernels::AttentionShape shape{2, 75, 3, 16};  // two query blocks of the host kernel
  const std::int64_t channels = shape.n_head * shape.head_dim;
  const std::vector<float> qkv = values(shape.batch * shape.seq_len * 3 * channels, 17, 2.0f);
  const std::vector<float> dout = values(shape.batch * shape.seq_len * channels, 18);
  expect_same_bits_on_every_path("attention forward and backward", [&] {
    std::vector<float> out(dout.size()), row_logsumexp(shape.batch * shape.n_head * shape.seq_len);
    std::vector<float> dqkv(qkv.size());
    zt::kernels::attention_forward(host_stream(), zt::DType::fp32, qkv.data(), out.data(),
                                   row_logsumexp.data(), shape);
    zt::kernels::attention_backward(host_stream(), zt::DType::fp32, dout.data(), qkv.data(), out.data(),
                                    row_logsumexp.data(), dqkv.data(), shape);
    std::vector<std::uint8_t> bytes = bytes_of(out);
    for (const auto* part : {&row_logsumexp, &dqkv}) {
      const auto part_bytes = bytes_of(*part);
      bytes.insert(bytes.end(), part_bytes.begin(), part_bytes.end());
    }
    return bytes;
  });
}

TEST(HostIsa, CrossEntropyAgreesToRoundoffOnEveryPath) {
  constexpr std::int64_t rows = 9, vocab = 5003;
  const std::vector<float> logits = values(rows * vocab, 19, 8.0f);
  std::vector<std::int32_t> targets(rows);
  for (std::int64_t r = 0; r < rows; ++r) targets[r] = static_cast<std::int32_t>((r * 977) % vocab);
  targets[4] = -100;  // ignored
  const PathGuard guard;
  const auto run = [&](HostIsa path, std::vector<float>& lse, std::vector<float>& grad) {
    zt::kernels::set_host_isa(path);
    zt::kernels::CrossEntropyScalars result;
    zt::kernels::cross_entropy_forward(host_stream(), zt::DType::fp32, logits.data(), targets.data(),
                                       lse.data(), rows, vocab, -100, &result);
    zt::kernels::cross_entropy_backward(host_stream(), zt::DType::fp32, logits.data(), targets.data(),
                                        lse.data(), &result, grad.data(), rows, vocab, -100, 1.0);
    return result.mean_loss;
  };
  std::vector<float> lse_reference(rows), grad_reference(rows * vocab);
  const double loss_reference = run(HostIsa::baseline, lse_reference, grad_reference);
  for (HostIsa path : supported_paths()) {
    std::vector<float> lse(rows), grad(rows * vocab);
    const double loss = run(path, lse, grad);
    // The row sum of exps is a SIMD sum whose order follows the vector width: fp32 roundoff apart.
    EXPECT_NEAR(loss, loss_reference, 1e-6 * std::abs(loss_reference)) << zt::kernels::host_isa_name(path);
    for (std::int64_t r = 0; r < rows; ++r) {
      EXPECT_NEAR(lse[r], lse_reference[r], 1e-6f * std::abs(lse_reference[r])) << "row " << r;
    }
    for (std::size_t i = 0; i < grad.size(); ++i) {
      ASSERT_NEAR(grad[i], grad_reference[i], 1e-5f * std::abs(grad_reference[i]) + 1e-12f)
          << "element " << i;
    }
  }
}

}  // namespace
