// Synthetic regression samples for MLP runs: a pure function of (seed, sample id).
#include <cmath>

#include "io/splitmix64.hpp"
#include "zerotrain/data.hpp"
#include "zerotrain/error.hpp"

namespace zt {
namespace {

/// Uniform in [-1, 1) from the top 24 bits (exact in fp32).
float uniform_symmetric(detail::SplitMix64& generator) {
  return static_cast<float>(generator.next() >> 40) * 0x1p-23f - 1.0f;
}

}  // namespace

SyntheticRegression::SyntheticRegression(std::uint64_t input_dim, std::uint64_t output_dim,
                                         std::uint64_t seed, std::uint64_t num_samples)
    : input_dim_(input_dim), output_dim_(output_dim), seed_(seed), num_samples_(num_samples) {
  ZT_CHECK(input_dim > 0 && output_dim > 0 && num_samples > 0,
           "synthetic regression data needs positive sizes, got ", input_dim, " inputs, ", output_dim,
           " outputs, ", num_samples, " samples");
  // Teacher weights: sums of 4 uniforms (an Irwin-Hall approximation of a normal, variance 4/3),
  // scaled to variance 1/input_dim so tanh(Wx) stays in its sensitive range.
  detail::SplitMix64 generator(detail::mix64(seed ^ 0x7eac4e5ULL));
  const float scale = std::sqrt(0.75f / static_cast<float>(input_dim));
  teacher_.resize(input_dim * output_dim);
  for (float& weight : teacher_) {
    float sum = 0;
    for (int k = 0; k < 4; ++k) sum += uniform_symmetric(generator);
    weight = sum * scale;
  }
}

void SyntheticRegression::fill(std::span<const std::uint64_t> sample_ids, std::span<float> inputs,
                               std::span<float> targets) const {
  ZT_CHECK(
      inputs.size() == sample_ids.size() * input_dim_ && targets.size() == sample_ids.size() * output_dim_,
      "synthetic regression: buffers of ", inputs.size(), " and ", targets.size(), " floats for ",
      sample_ids.size(), " samples; expected ", sample_ids.size() * input_dim_, " and ",
      sample_ids.size() * output_dim_);
  for (std::size_t row = 0; row < sample_ids.size(); ++row) {
    ZT_CHECK(sample_ids[row] < num_samples_, "synthetic regression: sample id ", sample_ids[row],
             " >= ", num_samples_, " samples");
    detail::SplitMix64 generator(detail::mix64(seed_ * 0x9E3779B97F4A7C15ULL + sample_ids[row]));
    float* x = inputs.data() + row * input_dim_;
    for (std::uint64_t j = 0; j < input_dim_; ++j) x[j] = uniform_symmetric(generator);
    float* y = targets.data() + row * output_dim_;
    for (std::uint64_t k = 0; k < output_dim_; ++k) {
      double sum = 0;
      for (std::uint64_t j = 0; j < input_dim_; ++j) sum += double(teacher_[k * input_dim_ + j]) * x[j];
      y[k] = static_cast<float>(std::tanh(sum));
    }
  }
}

}  // namespace zt
