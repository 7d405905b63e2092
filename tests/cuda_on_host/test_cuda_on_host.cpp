// The CUDA kernel sources (kernels/cuda/{elementwise,optimizer,layers,attention}.cu, translated by
// translate.py) run on the CPU by cuda_fibers, against the host kernels on the same inputs: a check
// of their indexing, tiling, reductions, barriers and launch configurations that needs no GPU. It
// does not replace the GPU tests (tests/unit/test_cuda_*.cpp), which run the same kernels compiled by
// nvcc on a GPU; cuda_fibers.hpp says what this cannot see. The fault tests at the end show that the
// runtime catches what it claims to.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cuda_kernel_checks.hpp"
#include "cuda_on_host/kernels/cuda/attention.hpp"
#include "cuda_on_host/kernels/cuda/elementwise.hpp"
#include "cuda_on_host/kernels/cuda/layers.hpp"
#include "cuda_on_host/kernels/cuda/optimizer.hpp"
#include "fault_kernels.hpp"
#include "kernels/nn_kernels.hpp"
#include "kernels/optimizer_kernels.hpp"
#include "zerotrain/device.hpp"
#include "zerotrain/dtype.hpp"
#include "zerotrain/error.hpp"

namespace {

using zt::DType;
using zt::testing::all_close;
using zt::testing::case_name;
using zt::testing::default_tolerance;
using zt::testing::element_as_double;
using zt::testing::fill_uniform;
using zt::testing::random_indices;
using zt::testing::summed_over_rows_tolerance;
using zt::testing::Tolerance;
namespace zk = zt::kernels;
namespace translated = zt::kernels::cuda_on_host;

constexpr DType kFloatingTypes[] = {DType::fp32, DType::fp64, DType::bf16, DType::fp16};

/// Host memory standing for device memory: the translated kernels read and write it directly.
class Values {
 public:
  Values(DType dtype, std::int64_t count) : dtype_(dtype), count_(count), bytes_(bytes_of(dtype, count)) {}
  static Values uniform(DType dtype, std::int64_t count, double low, double high, std::uint64_t seed) {
    Values values(dtype, count);
    fill_uniform(values.data(), dtype, static_cast<std::size_t>(count), low, high, seed);
    return values;
  }
  static Values garbage(DType dtype, std::int64_t count) {
    Values values(dtype, count);
    std::memset(values.data(), 0x5a, values.bytes_.size());
    return values;
  }
  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }
  template <typename T>
  T* as() {
    return reinterpret_cast<T*>(bytes_.data());
  }
  template <typename T>
  const T* as() const {
    return reinterpret_cast<const T*>(bytes_.data());
  }
  std::size_t count() const { return static_cast<std::size_t>(count_); }
  DType dtype() const { return dtype_; }

 private:
  static std::size_t bytes_of(DType dtype, std::int64_t count) {
    return static_cast<std::size_t>(count) * zt::dtype_size(dtype);
  }
  DType dtype_;
  std::int64_t count_;
  std::vector<unsigned char> bytes_;
};

/// Host result `host`, translated CUDA result `cuda`: equal within `tolerance`.
::testing::AssertionResult close(const Values& host, const Values& cuda, Tolerance tolerance,
                                 const std::string& what) {
  return all_close(host.data(), cuda.data(), host.dtype(), host.count(), tolerance, what);
}
::testing::AssertionResult close(const Values& host, const Values& cuda, const std::string& what) {
  return close(host, cuda, default_tolerance(host.dtype()), what);
}

class CudaOnHost : public ::testing::Test {
 protected:
  zt::Stream host;  // the reference kernels
};

// ---- element-wise ------------------------------------------------------------------------------

// Sizes: one partial block, several blocks, and more than the grid-stride loop's grid cap (65535 * 4
// blocks of 256 is 67 M; 300001 still has a partial last block).
constexpr std::int64_t kElementwiseCounts[] = {1, 1000, 300001};

TEST_F(CudaOnHost, ConvertFillAddAccumulateAndScaleMatchTheHost) {
  for (const DType from : kFloatingTypes) {
    for (const std::int64_t count : kElementwiseCounts) {
      const Values source = Values::uniform(from, count, -70000, 70000, 1);
      for (const DType to : kFloatingTypes) {
        Values expected = Values::garbage(to, count), actual = Values::garbage(to, count);
        zk::convert(host, source.data(), from, expected.data(), to, count);
        translated::convert(source.data(), from, actual.data(), to, count, nullptr);
        EXPECT_TRUE(close(expected, actual, Tolerance{},
                          "convert " + case_name(from, count, 1) + " to " + std::string(zt::dtype_name(to))));
      }
    }
  }
  for (const DType dtype : kFloatingTypes) {
    for (const std::int64_t count : kElementwiseCounts) {
      const std::string name = case_name(dtype, count, 1);
      Values expected = Values::garbage(dtype, count), actual = Values::garbage(dtype, count);
      zk::fill(host, dtype, expected.data(), count, 0.1);
      translated::fill(dtype, actual.data(), count, 0.1, nullptr);
      EXPECT_TRUE(close(expected, actual, Tolerance{}, "fill " + name));

      zk::fill_normal(host, dtype, expected.data(), count, 0.5, 0.02, 7);
      translated::fill_normal(dtype, actual.data(), count, 0.5, 0.02, 7, nullptr);
      EXPECT_TRUE(close(expected, actual, "fill_normal " + name));

      const Values a = Values::uniform(dtype, count, -3, 3, 2), b = Values::uniform(dtype, count, -3, 3, 3);
      zk::add(host, dtype, a.data(), b.data(), expected.data(), count);
      translated::add(dtype, a.data(), b.data(), actual.data(), count, nullptr);
      EXPECT_TRUE(close(expected, actual, Tolerance{}, "add " + name));

      zk::accumulate(host, dtype, expected.data(), a.data(), count);
      translated::accumulate(dtype, actual.data(), a.data(), count, nullptr);
      EXPECT_TRUE(close(expected, actual, Tolerance{}, "accumulate " + name));

      zk::scale(host, dtype, expected.data(), count, -0.37);
      translated::scale(dtype, actual.data(), count, -0.37, nullptr);
      EXPECT_TRUE(close(expected, actual, Tolerance{}, "scale " + name));
    }
  }
}

TEST_F(CudaOnHost, ActivationsAndDropoutMatchTheHost) {
  for (const DType dtype : kFloatingTypes) {
    for (const std::int64_t count : {std::int64_t{1000}, std::int64_t{70001}}) {
      const std::string name = case_name(dtype, count, 1);
      const Values input = Values::uniform(dtype, count, -5, 5, 11);
      const Values grad_output = Values::uniform(dtype, count, -1, 1, 12);
      for (const zk::Activation activation :
           {zk::Activation::gelu, zk::Activation::relu, zk::Activation::tanh}) {
        const std::string which = name + " activation " + std::to_string(static_cast<int>(activation));
        Values expected = Values::garbage(dtype, count), actual = Values::garbage(dtype, count);
        zk::activation_forward(host, dtype, activation, input.data(), expected.data(), count);
        translated::activation_forward(dtype, activation, input.data(), actual.data(), count, nullptr);
        EXPECT_TRUE(close(expected, actual, "forward " + which));
        zk::activation_backward(host, dtype, activation, input.data(), grad_output.data(), expected.data(),
                                count);
        translated::activation_backward(dtype, activation, input.data(), grad_output.data(), actual.data(),
                                        count, nullptr);
        EXPECT_TRUE(close(expected, actual, "backward " + which));
      }
      Values expected = Values::garbage(dtype, count), actual = Values::garbage(dtype, count);
      zk::dropout_forward(host, dtype, input.data(), expected.data(), count, 0.3, 99, 5);
      translated::dropout_forward(dtype, input.data(), actual.data(), count, 0.3, 99, 5, nullptr);
      EXPECT_TRUE(close(expected, actual, Tolerance{}, "dropout forward " + name));
      zk::dropout_backward(host, dtype, grad_output.data(), expected.data(), count, 0.3, 99, 5);
      translated::dropout_backward(dtype, grad_output.data(), actual.data(), count, 0.3, 99, 5, nullptr);
      EXPECT_TRUE(close(expected, actual, Tolerance{}, "dropout backward " + name));
    }
  }
}

// ---- optimizers --------------------------------------------------------------------------------

TEST_F(CudaOnHost, AdamSgdGradNormAndCastMatchTheHost) {
  constexpr std::int64_t kCount = 100003;
  for (const DType grad_dtype : {DType::fp32, DType::bf16, DType::fp16}) {
    for (const DType copy_dtype : {DType::bf16, DType::fp16}) {
      const std::string name = std::string(zt::dtype_name(grad_dtype)) + " grads, " +
                               std::string(zt::dtype_name(copy_dtype)) + " copy";
      const Values grads = Values::uniform(grad_dtype, kCount, -2, 2, 21);
      Values params[2] = {Values::uniform(DType::fp32, kCount, -1, 1, 22), Values(DType::fp32, kCount)};
      Values m[2] = {Values::uniform(DType::fp32, kCount, -0.1, 0.1, 23), Values(DType::fp32, kCount)};
      Values v[2] = {Values::uniform(DType::fp32, kCount, 0, 0.1, 24), Values(DType::fp32, kCount)};
      Values copies[2] = {Values::garbage(copy_dtype, kCount), Values::garbage(copy_dtype, kCount)};
      std::memcpy(params[1].data(), params[0].data(), kCount * sizeof(float));
      std::memcpy(m[1].data(), m[0].data(), kCount * sizeof(float));
      std::memcpy(v[1].data(), v[0].data(), kCount * sizeof(float));
      for (int side = 0; side < 2; ++side) {
        zk::AdamStepArgs args;
        args.params = params[side].as<float>();
        args.exp_avg = m[side].as<float>();
        args.exp_avg_sq = v[side].as<float>();
        args.grads = grads.data();
        args.grad_dtype = grad_dtype;
        args.params_16bit = copies[side].data();
        args.params_16bit_dtype = copy_dtype;
        args.count = kCount;
        args.grad_scale = 0.5f;
        args.lr = 3e-3f;
        args.weight_decay = 0.1f;
        args.step = 3;
        if (side == 0)
          zk::adam_step(host, args);
        else
          translated::adam_step(args, nullptr);
      }
      // The same fp32 operations in the same order per element: the same bits.
      EXPECT_TRUE(close(params[0], params[1], Tolerance{}, "adam params " + name));
      EXPECT_TRUE(close(m[0], m[1], Tolerance{}, "adam exp_avg " + name));
      EXPECT_TRUE(close(v[0], v[1], Tolerance{}, "adam exp_avg_sq " + name));
      EXPECT_TRUE(close(copies[0], copies[1], Tolerance{}, "adam 16-bit copy " + name));

      for (const bool nesterov : {false, true}) {
        Values buffers[2] = {Values::uniform(DType::fp32, kCount, -1, 1, 25), Values(DType::fp32, kCount)};
        std::memcpy(buffers[1].data(), buffers[0].data(), kCount * sizeof(float));
        for (int side = 0; side < 2; ++side) {
          zk::SgdStepArgs args;
          args.params = params[side].as<float>();
          args.momentum_buffer = buffers[side].as<float>();
          args.grads = grads.data();
          args.grad_dtype = grad_dtype;
          args.params_16bit = copies[side].data();
          args.params_16bit_dtype = copy_dtype;
          args.count = kCount;
          args.lr = 0.01f;
          args.momentum = 0.9f;
          args.dampening = 0.1f;
          args.weight_decay = 0.01f;
          args.nesterov = nesterov;
          args.first_step = false;
          if (side == 0)
            zk::sgd_step(host, args);
          else
            translated::sgd_step(args, nullptr);
        }
        const std::string sgd = name + (nesterov ? " nesterov" : "");
        EXPECT_TRUE(close(params[0], params[1], Tolerance{}, "sgd params " + sgd));
        EXPECT_TRUE(close(buffers[0], buffers[1], Tolerance{}, "sgd momentum " + sgd));
        EXPECT_TRUE(close(copies[0], copies[1], Tolerance{}, "sgd 16-bit copy " + sgd));
      }
    }
  }
  for (const DType dtype : {DType::fp32, DType::bf16, DType::fp16}) {
    for (const std::int64_t count : {std::int64_t{1}, std::int64_t{5000}, std::int64_t{1100007}}) {
      const std::string name = case_name(dtype, count, 1);
      Values grads = Values::uniform(dtype, count, -2, 2, 26);
      const zk::GradCheck expected = zk::grad_sum_squares(host, grads.data(), dtype, count, 0.25);
      const zk::GradCheck actual = translated::grad_sum_squares(grads.data(), dtype, count, 0.25, nullptr);
      EXPECT_FALSE(actual.found_inf) << name;
      EXPECT_NEAR(actual.sum_sq, expected.sum_sq, 1e-12 * expected.sum_sq) << "grad_sum_squares " << name;
      zk::GradCheckScalars accumulated[2] = {{1.5, 0}, {1.5, 0}};
      zk::grad_sum_squares(host, grads.data(), dtype, count, 0.25, &accumulated[0]);
      translated::grad_sum_squares(grads.data(), dtype, count, 0.25, &accumulated[1], nullptr);
      EXPECT_NEAR(accumulated[1].sum_sq, accumulated[0].sum_sq, 1e-12 * accumulated[0].sum_sq) << name;
      EXPECT_EQ(accumulated[1].found_inf, accumulated[0].found_inf) << name;

      zt::testing::store_as(grads.data(), dtype, static_cast<std::size_t>(count / 2),
                            std::numeric_limits<double>::infinity());
      EXPECT_TRUE(translated::grad_sum_squares(grads.data(), dtype, count, 1.0, nullptr).found_inf) << name;
      translated::grad_sum_squares(grads.data(), dtype, count, 1.0, &accumulated[1], nullptr);
      EXPECT_EQ(accumulated[1].found_inf, 1.0) << "an overflow counts once " << name;
    }
  }
  for (const DType copy_dtype : {DType::bf16, DType::fp16}) {
    const Values params = Values::uniform(DType::fp32, 12345, -70000, 70000, 27);
    Values expected = Values::garbage(copy_dtype, 12345), actual = Values::garbage(copy_dtype, 12345);
    zk::cast_params_to_16bit(host, params.as<float>(), expected.data(), copy_dtype, 12345);
    translated::cast_params_to_16bit(params.as<float>(), actual.data(), copy_dtype, 12345, nullptr);
    EXPECT_TRUE(close(expected, actual, Tolerance{}, "cast_params_to_16bit"));
  }
}

// ---- layers -------------------------------------------------------------------------------------

// (rows, channels): unit.cuda_layers' shapes: a single element, rows shorter than a warp, rows wider
// than the block, a prime width past 4096.
constexpr std::pair<std::int64_t, std::int64_t> kLayernormCases[] = {
    {1, 1}, {7, 33}, {67, 769}, {300, 65}, {3, 4099}};

TEST_F(CudaOnHost, LayernormForwardAndBackwardMatchTheHost) {
  for (const DType dtype : kFloatingTypes) {
    const DType stat = zk::stat_dtype(dtype);
    for (const auto& [rows, channels] : kLayernormCases) {
      const std::string name = case_name(dtype, rows, channels);
      const std::int64_t count = rows * channels;
      const Values x = Values::uniform(dtype, count, -2, 3, 1);
      const Values weight = Values::uniform(dtype, channels, 0.5, 1.5, 2);
      const Values bias = Values::uniform(dtype, channels, -0.5, 0.5, 3);
      Values y[2] = {Values::garbage(dtype, count), Values::garbage(dtype, count)};
      Values mean[2] = {Values::garbage(stat, rows), Values::garbage(stat, rows)};
      Values rstd[2] = {Values::garbage(stat, rows), Values::garbage(stat, rows)};
      zk::layernorm_forward(host, dtype, x.data(), weight.data(), bias.data(), y[0].data(), mean[0].data(),
                            rstd[0].data(), rows, channels, 1e-5);
      translated::layernorm_forward(dtype, x.data(), weight.data(), bias.data(), y[1].data(), mean[1].data(),
                                    rstd[1].data(), rows, channels, 1e-5, nullptr);
      EXPECT_TRUE(close(y[0], y[1], "layernorm output " + name));
      EXPECT_TRUE(close(mean[0], mean[1], "layernorm mean " + name));
      EXPECT_TRUE(close(rstd[0], rstd[1], "layernorm rstd " + name));

      const Values dy = Values::uniform(dtype, count, -1, 1, 7);
      Values dx[2] = {Values::garbage(dtype, count), Values::garbage(dtype, count)};
      Values dweight[2] = {Values::uniform(dtype, channels, -1, 1, 9),
                           Values::uniform(dtype, channels, -1, 1, 9)};
      Values dbias[2] = {Values::uniform(dtype, channels, -1, 1, 10),
                         Values::uniform(dtype, channels, -1, 1, 10)};
      zk::layernorm_backward(host, dtype, dy.data(), x.data(), weight.data(), mean[0].data(), rstd[0].data(),
                             dx[0].data(), dweight[0].data(), dbias[0].data(), rows, channels);
      translated::layernorm_backward(dtype, dy.data(), x.data(), weight.data(), mean[0].data(),
                                     rstd[0].data(), dx[1].data(), dweight[1].data(), dbias[1].data(), rows,
                                     channels, nullptr);
      EXPECT_TRUE(close(dx[0], dx[1], "layernorm grad_input " + name));
      EXPECT_TRUE(close(dweight[0], dweight[1], summed_over_rows_tolerance(dtype, rows),
                        "layernorm grad_weight " + name));
      EXPECT_TRUE(
          close(dbias[0], dbias[1], summed_over_rows_tolerance(dtype, rows), "layernorm grad_bias " + name));
    }
  }
}

TEST_F(CudaOnHost, EmbeddingForwardAndBackwardMatchTheHost) {
  for (const DType dtype : kFloatingTypes) {
    // Repeated tokens (a small vocabulary) so that rows collect several gradients.
    const zk::EmbeddingShape shape{3, 37, 11, 40};
    const std::string name = std::string(zt::dtype_name(dtype));
    const std::int64_t positions = shape.batch * shape.seq_len;
    const std::vector<std::int32_t> tokens =
        random_indices(positions, 0, static_cast<std::int32_t>(shape.vocab_size - 1), 31);
    const Values token_table = Values::uniform(dtype, shape.vocab_size * shape.channels, -1, 1, 32);
    const Values position_table = Values::uniform(dtype, shape.seq_len * shape.channels, -1, 1, 33);
    Values out[2] = {Values::garbage(dtype, positions * shape.channels),
                     Values::garbage(dtype, positions * shape.channels)};
    zk::embedding_forward(host, dtype, tokens.data(), token_table.data(), position_table.data(),
                          out[0].data(), shape);
    translated::embedding_forward(dtype, tokens.data(), token_table.data(), position_table.data(),
                                  out[1].data(), shape, nullptr);
    EXPECT_TRUE(close(out[0], out[1], Tolerance{}, "embedding forward " + name));

    const Values grad_output = Values::uniform(dtype, positions * shape.channels, -1, 1, 34);
    Values grad_tokens[2] = {Values::uniform(dtype, shape.vocab_size * shape.channels, -1, 1, 35),
                             Values::uniform(dtype, shape.vocab_size * shape.channels, -1, 1, 35)};
    Values grad_positions[2] = {Values::uniform(dtype, shape.seq_len * shape.channels, -1, 1, 36),
                                Values::uniform(dtype, shape.seq_len * shape.channels, -1, 1, 36)};
    zk::embedding_backward(host, dtype, tokens.data(), grad_output.data(), grad_tokens[0].data(),
                           grad_positions[0].data(), shape);
    translated::embedding_backward(dtype, tokens.data(), grad_output.data(), grad_tokens[1].data(),
                                   grad_positions[1].data(), shape, nullptr);
    EXPECT_TRUE(close(grad_tokens[0], grad_tokens[1], "embedding token gradient " + name));
    EXPECT_TRUE(close(grad_positions[0], grad_positions[1], "embedding position gradient " + name));

    // Rows [4, 9) of the token table's gradient only.
    zk::EmbeddingShape flat = shape;
    flat.batch = positions;
    flat.seq_len = 1;
    Values grad_rows[2] = {Values::uniform(dtype, 5 * shape.channels, -1, 1, 37),
                           Values::uniform(dtype, 5 * shape.channels, -1, 1, 37)};
    zk::embedding_backward_rows(host, dtype, tokens.data(), grad_output.data(), grad_rows[0].data(), flat, 4,
                                5);
    translated::embedding_backward_rows(dtype, tokens.data(), grad_output.data(), grad_rows[1].data(), flat,
                                        4, 5, nullptr);
    EXPECT_TRUE(close(grad_rows[0], grad_rows[1], "embedding_backward_rows " + name));
  }
}

TEST_F(CudaOnHost, AnEmbeddingTokenOutOfRangeIsRecordedAndThrownByThrowOnIndexErrors) {
  const zk::EmbeddingShape shape{1, 8, 5, 4};
  std::vector<std::int32_t> tokens = {0, 1, 2, 3, 4, 0, 1, 2};
  tokens[6] = 5;
  const Values table = Values::uniform(DType::fp32, shape.vocab_size * shape.channels, -1, 1, 1);
  Values out = Values::garbage(DType::fp32, 8 * shape.channels);
  translated::embedding_forward(DType::fp32, tokens.data(), table.data(), nullptr, out.data(), shape,
                                nullptr);
  try {
    translated::throw_on_index_errors(nullptr);
    ADD_FAILURE() << "the out-of-range token was not reported";
  } catch (const zt::Error& error) {
    EXPECT_NE(std::string(error.what()).find("6"), std::string::npos) << error.what();
  }
  EXPECT_NO_THROW(translated::throw_on_index_errors(nullptr)) << "the record is cleared once thrown";
}

TEST_F(CudaOnHost, CrossEntropyAndMseMatchTheHost) {
  constexpr std::int32_t kIgnoreIndex = -100;
  for (const DType dtype : kFloatingTypes) {
    const DType stat = zk::stat_dtype(dtype);
    for (const auto& [rows, vocab] :
         {std::pair<std::int64_t, std::int64_t>{5, 1}, {5, 7}, {13, 33}, {9, 769}, {13, 1000}, {4, 50257}}) {
      const std::string name = case_name(dtype, rows, vocab);
      std::vector<std::int32_t> targets = random_indices(rows, 0, static_cast<std::int32_t>(vocab - 1), 40);
      targets[1] = kIgnoreIndex;
      const Values logits = Values::uniform(dtype, rows * vocab, -8, 8, 42);
      Values lse[2] = {Values::garbage(stat, rows), Values::garbage(stat, rows)};
      zk::CrossEntropyScalars result[2];
      zk::cross_entropy_forward(host, dtype, logits.data(), targets.data(), lse[0].data(), rows, vocab,
                                kIgnoreIndex, &result[0]);
      translated::cross_entropy_forward(dtype, logits.data(), targets.data(), lse[1].data(), rows, vocab,
                                        kIgnoreIndex, &result[1], nullptr);
      EXPECT_TRUE(close(lse[0], lse[1], summed_over_rows_tolerance(stat, vocab),
                        "cross-entropy log-sum-exp " + name));
      EXPECT_EQ(result[1].counted_rows, result[0].counted_rows) << name;
      EXPECT_NEAR(result[1].mean_loss, result[0].mean_loss, 1e-5 * std::abs(result[0].mean_loss)) << name;

      Values grad[2] = {Values::garbage(dtype, rows * vocab), Values::garbage(dtype, rows * vocab)};
      zk::cross_entropy_backward(host, dtype, logits.data(), targets.data(), lse[0].data(), &result[0],
                                 grad[0].data(), rows, vocab, kIgnoreIndex, 0.75 * static_cast<double>(rows));
      translated::cross_entropy_backward(dtype, logits.data(), targets.data(), lse[1].data(), &result[1],
                                         grad[1].data(), rows, vocab, kIgnoreIndex,
                                         0.75 * static_cast<double>(rows), nullptr);
      Tolerance grad_tolerance = default_tolerance(dtype);
      grad_tolerance.absolute =
          std::max(grad_tolerance.absolute / static_cast<double>(vocab), dtype == DType::fp16 ? 1.2e-7 : 0.0);
      EXPECT_TRUE(close(grad[0], grad[1], grad_tolerance, "cross-entropy grad_logits " + name));
    }
    for (const std::int64_t count : {std::int64_t{1}, std::int64_t{1000}, std::int64_t{300001}}) {
      const std::string name = case_name(dtype, count, 1);
      const Values prediction = Values::uniform(dtype, count, -1, 1, 50);
      const Values target = Values::uniform(dtype, count, -1, 1, 51);
      double loss[2] = {-1, -2};
      zk::mse_forward(host, dtype, prediction.data(), target.data(), count, &loss[0]);
      translated::mse_forward(dtype, prediction.data(), target.data(), count, &loss[1], nullptr);
      EXPECT_NEAR(loss[1], loss[0], 1e-12 * std::abs(loss[0])) << "mse " << name;
      Values grad[2] = {Values::garbage(dtype, count), Values::garbage(dtype, count)};
      zk::mse_backward(host, dtype, prediction.data(), target.data(), grad[0].data(), count, 2.0);
      translated::mse_backward(dtype, prediction.data(), target.data(), grad[1].data(), count, 2.0, nullptr);
      EXPECT_TRUE(close(grad[0], grad[1], "mse backward " + name));
    }
  }
}

// ---- attention ----------------------------------------------------------------------------------

// (batch, seq_len, n_head, head_dim): unit.cuda_attention's seq_len 1, 5, 40, 67 (tiles of 8 queries
// and 32 keys, partial ones) and head_dim 1, 8, 33, 64, 128 (fp64 at 128 needs more than 48 KiB of
// shared memory: the kernel's attribute must be raised), with several batches and heads.
constexpr zk::AttentionShape kAttentionCases[] = {{1, 1, 1, 1},   {1, 5, 2, 8},    {2, 40, 3, 33},
                                                  {1, 67, 2, 64}, {1, 40, 1, 128}, {2, 67, 1, 16}};

TEST_F(CudaOnHost, AttentionForwardAndBackwardMatchTheHost) {
  for (const DType dtype : kFloatingTypes) {
    const DType stat = zk::stat_dtype(dtype);
    for (const zk::AttentionShape& shape : kAttentionCases) {
      const std::string name = std::string(zt::dtype_name(dtype)) + " B" + std::to_string(shape.batch) +
                               " T" + std::to_string(shape.seq_len) + " H" + std::to_string(shape.n_head) +
                               " D" + std::to_string(shape.head_dim);
      const std::int64_t channels = shape.n_head * shape.head_dim;
      const std::int64_t tokens = shape.batch * shape.seq_len;
      const Values qkv = Values::uniform(dtype, tokens * 3 * channels, -1, 1, 60);
      Values output[2] = {Values::garbage(dtype, tokens * channels),
                          Values::garbage(dtype, tokens * channels)};
      const std::int64_t stats = shape.batch * shape.n_head * shape.seq_len;
      Values lse[2] = {Values::garbage(stat, stats), Values::garbage(stat, stats)};
      zk::attention_forward(host, dtype, qkv.data(), output[0].data(), lse[0].data(), shape);
      translated::attention_forward(dtype, qkv.data(), output[1].data(), lse[1].data(), shape, nullptr);
      EXPECT_TRUE(close(output[0], output[1], "attention output " + name));
      EXPECT_TRUE(close(lse[0], lse[1], "attention row_logsumexp " + name));

      const Values grad_output = Values::uniform(dtype, tokens * channels, -1, 1, 61);
      Values grad_qkv[2] = {Values::garbage(dtype, tokens * 3 * channels),
                            Values::garbage(dtype, tokens * 3 * channels)};
      zk::attention_backward(host, dtype, grad_output.data(), qkv.data(), output[0].data(), lse[0].data(),
                             grad_qkv[0].data(), shape);
      translated::attention_backward(dtype, grad_output.data(), qkv.data(), output[1].data(), lse[0].data(),
                                     grad_qkv[1].data(), shape, nullptr);
      EXPECT_TRUE(close(grad_qkv[0], grad_qkv[1], summed_over_rows_tolerance(dtype, shape.seq_len),
                        "attention grad_qkv " + name));
    }
  }
}

// ---- the runtime catches what it claims to -------------------------------------------------------

TEST(CudaFibers, ABlockReductionWithItsBarrierIsExactAndWithoutItIsWrong) {
  std::vector<float> values(256);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  float with_barrier = -1, without_barrier = -1;
  fault_kernels::block_sum(values.data(), &with_barrier, true);
  EXPECT_EQ(fault_kernels::take_launch_error(), "");
  EXPECT_EQ(with_barrier, 255.0f * 256.0f / 2.0f);
  fault_kernels::block_sum(values.data(), &without_barrier, false);
  EXPECT_EQ(fault_kernels::take_launch_error(), "");
  EXPECT_NE(without_barrier, with_barrier)
      << "thread 0 read the other warps' partials before they were written";
}

TEST(CudaFibers, ABarrierOnlySomeThreadsReachIsADeadlock) {
  fault_kernels::divergent_barrier();
  EXPECT_NE(fault_kernels::take_launch_error().find("deadlock"), std::string::npos);
}

TEST(CudaFibers, AShuffleNamingAnExitedLaneIsAFault) {
  fault_kernels::shuffle_after_exit();
  EXPECT_NE(fault_kernels::take_launch_error().find("exited"), std::string::npos);
}

TEST(CudaFibers, LaunchesAGpuRefusesAreRefused) {
  fault_kernels::launch_over_bounds();
  EXPECT_NE(fault_kernels::take_launch_error().find("__launch_bounds__"), std::string::npos);
  fault_kernels::launch_block_of(1025);
  EXPECT_NE(fault_kernels::take_launch_error().find("invalid block"), std::string::npos);
  fault_kernels::launch_with_dynamic_shared(64 * 1024, false);
  EXPECT_NE(fault_kernels::take_launch_error().find("dynamic shared memory"), std::string::npos);
  fault_kernels::launch_with_dynamic_shared(64 * 1024, true);
  EXPECT_EQ(fault_kernels::take_launch_error(), "") << "allowed once cudaFuncSetAttribute raised the limit";
}

}  // namespace
