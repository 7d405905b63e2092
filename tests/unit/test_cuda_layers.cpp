// The CUDA layer kernels (kernels/cuda/layers.cu) against the host kernels on the same inputs: layer
// norm, embedding, cross-entropy and MSE, every floating dtype, odd sizes, ignored rows, accumulating
// gradients (pre-filled), out-of-range indices, and run-to-run determinism. Skips without a usable GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cuda_kernel_checks.hpp"
#include "kernels/nn_kernels.hpp"
#include "zerotrain/device.hpp"
#include "zerotrain/dtype.hpp"
#include "zerotrain/error.hpp"

namespace {

using zt::DType;
using zt::Stream;
using zt::testing::all_close;
using zt::testing::case_name;
using zt::testing::default_tolerance;
using zt::testing::MirroredBuffer;
using zt::testing::random_indices;
using zt::testing::summed_over_rows_tolerance;
using zt::testing::Tolerance;
using zt::testing::uniform_buffer;
namespace zk = zt::kernels;

constexpr DType kFloatingTypes[] = {DType::fp32, DType::fp64, DType::bf16, DType::fp16};

/// The host stream (the reference kernels) and a stream on cuda:0.
struct Streams {
  Stream host;
  Stream cuda{zt::Device::cuda(0)};
};

MirroredBuffer index_buffer(const std::vector<std::int32_t>& values, const Stream& stream) {
  MirroredBuffer buffer(values.size() * sizeof(std::int32_t), stream);
  std::memcpy(buffer.host.data(), values.data(), values.size() * sizeof(std::int32_t));
  buffer.upload();
  return buffer;
}

/// Downloads the device copy and compares it with the host's.
::testing::AssertionResult matches_host(MirroredBuffer& buffer, DType dtype, const std::string& what,
                                        Tolerance tolerance) {
  buffer.download();
  return all_close(buffer, dtype, tolerance, what);
}
::testing::AssertionResult matches_host(MirroredBuffer& buffer, DType dtype, const std::string& what) {
  return matches_host(buffer, dtype, what, default_tolerance(dtype));
}

// ---- layer norm ---------------------------------------------------------------------------------

struct LayernormCase {
  std::int64_t rows, channels;
};
constexpr LayernormCase kLayernormCases[] = {{1, 1}, {7, 33}, {67, 769}, {300, 65}, {3, 4099}};

TEST(CudaLayers, LayernormForwardAndBackwardMatchTheHost) {
  ZT_REQUIRE_GPU();
  const Streams streams;
  for (const DType dtype : kFloatingTypes) {
    const DType stat = zk::stat_dtype(dtype);
    for (const auto [rows, channels] : kLayernormCases) {
      const std::string name = case_name(dtype, rows, channels);
      SCOPED_TRACE(name);
      const std::int64_t count = rows * channels;
      MirroredBuffer x = uniform_buffer(dtype, count, -2, 3, 1, streams.cuda);
      MirroredBuffer weight = uniform_buffer(dtype, channels, 0.5, 1.5, 2, streams.cuda);
      MirroredBuffer bias = uniform_buffer(dtype, channels, -0.5, 0.5, 3, streams.cuda);
      MirroredBuffer y = uniform_buffer(dtype, count, 0, 1, 4, streams.cuda);  // garbage: overwritten
      MirroredBuffer mean = uniform_buffer(stat, rows, 0, 1, 5, streams.cuda);
      MirroredBuffer rstd = uniform_buffer(stat, rows, 0, 1, 6, streams.cuda);
      zk::layernorm_forward(streams.host, dtype, x.host.data(), weight.host.data(), bias.host.data(),
                            y.host.data(), mean.host.data(), rstd.host.data(), rows, channels, 1e-5);
      zk::layernorm_forward(streams.cuda, dtype, x.device_data(), weight.device_data(), bias.device_data(),
                            y.device_data(), mean.device_data(), rstd.device_data(), rows, channels, 1e-5);
      streams.cuda.synchronize();
      EXPECT_TRUE(matches_host(y, dtype, "layernorm output " + name));
      EXPECT_TRUE(matches_host(mean, stat, "layernorm mean " + name));
      EXPECT_TRUE(matches_host(rstd, stat, "layernorm rstd " + name));

      // Backward from the host's saved statistics on both sides; parameter gradients pre-filled: they
      // accumulate.
      MirroredBuffer saved_mean = uniform_buffer(stat, rows, 0, 1, 0, streams.cuda);
      MirroredBuffer saved_rstd = uniform_buffer(stat, rows, 0, 1, 0, streams.cuda);
      std::memcpy(saved_mean.host.data(), mean.host.data(), mean.host.size());
      std::memcpy(saved_rstd.host.data(), rstd.host.data(), rstd.host.size());
      saved_mean.upload();
      saved_rstd.upload();
      MirroredBuffer dy = uniform_buffer(dtype, count, -1, 1, 7, streams.cuda);
      MirroredBuffer dx = uniform_buffer(dtype, count, 0, 1, 8, streams.cuda);
      MirroredBuffer dweight = uniform_buffer(dtype, channels, -1, 1, 9, streams.cuda);
      MirroredBuffer dbias = uniform_buffer(dtype, channels, -1, 1, 10, streams.cuda);
      zk::layernorm_backward(streams.host, dtype, dy.host.data(), x.host.data(), weight.host.data(),
                             saved_mean.host.data(), saved_rstd.host.data(), dx.host.data(),
                             dweight.host.data(), dbias.host.data(), rows, channels);
      zk::layernorm_backward(streams.cuda, dtype, dy.device_data(), x.device_data(), weight.device_data(),
                             saved_mean.device_data(), saved_rstd.device_data(), dx.device_data(),
                             dweight.device_data(), dbias.device_data(), rows, channels);
      streams.cuda.synchronize();
      EXPECT_TRUE(matches_host(dx, dtype, "layernorm grad_input " + name));
      const Tolerance column_sums = summed_over_rows_tolerance(dtype, rows);
      EXPECT_TRUE(matches_host(dweight, dtype, "layernorm grad_weight (accumulated) " + name, column_sums));
      EXPECT_TRUE(matches_host(dbias, dtype, "layernorm grad_bias (accumulated) " + name, column_sums));
    }
  }
}

TEST(CudaLayers, LayernormBackwardIsDeterministicAndSkipsNullGradients) {
  ZT_REQUIRE_GPU();
  const Streams streams;
  const DType dtype = DType::fp32;
  const std::int64_t rows = 1000, channels = 769, count = rows * channels;
  MirroredBuffer x = uniform_buffer(dtype, count, -2, 3, 11, streams.cuda);
  MirroredBuffer weight = uniform_buffer(dtype, channels, 0.5, 1.5, 12, streams.cuda);
  MirroredBuffer mean = uniform_buffer(dtype, rows, -0.1, 0.1, 13, streams.cuda);
  MirroredBuffer rstd = uniform_buffer(dtype, rows, 0.5, 1.5, 14, streams.cuda);
  MirroredBuffer dy = uniform_buffer(dtype, count, -1, 1, 15, streams.cuda);
  std::vector<std::vector<unsigned char>> runs;
  for (int run = 0; run < 2; ++run) {
    MirroredBuffer dweight = uniform_buffer(dtype, channels, -1, 1, 16, streams.cuda);
    zk::layernorm_backward(streams.cuda, dtype, dy.device_data(), x.device_data(), weight.device_data(),
                           mean.device_data(), rstd.device_data(), nullptr, dweight.device_data(), nullptr,
                           rows, channels);
    streams.cuda.synchronize();
    dweight.download();
    const auto* bytes = dweight.downloaded_data<unsigned char>();
    runs.emplace_back(bytes, bytes + dweight.downloaded.size());
  }
  EXPECT_TRUE(runs[0] == runs[1]) << "layernorm grad_weight differs between two identical CUDA runs";
}

// ---- embedding ----------------------------------------------------------------------------------

struct EmbeddingCase {
  std::int64_t batch, seq_len, vocab, channels;
  std::int32_t distinct_tokens;  // tokens drawn from [0, distinct_tokens): repeats when small
};
constexpr EmbeddingCase kEmbeddingCases[] = {{1, 1, 1, 1, 1},
                                             {3, 1, 101, 33, 101},
                                             {2, 67, 101, 769, 7},
                                             {4, 67, 50257, 33, 50257},
                                             {2, 5, 13, 768, 3}};

TEST(CudaLayers, EmbeddingForwardAndBackwardMatchTheHost) {
  ZT_REQUIRE_GPU();
  const Streams streams;
  for (const DType dtype : kFloatingTypes) {
    for (const auto& c : kEmbeddingCases) {
      const std::string name =
          case_name(dtype, c.batch * c.seq_len, c.channels) + " vocab " + std::to_string(c.vocab);
      SCOPED_TRACE(name);
      const zk::EmbeddingShape shape{c.batch, c.seq_len, c.vocab, c.channels};
      const std::int64_t positions = c.batch * c.seq_len, count = positions * c.channels;
      MirroredBuffer tokens =
          index_buffer(random_indices(positions, 0, c.distinct_tokens - 1, 20), streams.cuda);
      MirroredBuffer token_table = uniform_buffer(dtype, c.vocab * c.channels, -1, 1, 21, streams.cuda);
      MirroredBuffer position_table = uniform_buffer(dtype, c.seq_len * c.channels, -1, 1, 22, streams.cuda);
      for (const bool with_positions : {false, true}) {
        MirroredBuffer y = uniform_buffer(dtype, count, 0, 1, 23, streams.cuda);
        zk::embedding_forward(streams.host, dtype, tokens.host_data<std::int32_t>(), token_table.host.data(),
                              with_positions ? position_table.host.data() : nullptr, y.host.data(), shape);
        zk::embedding_forward(streams.cuda, dtype, static_cast<const std::int32_t*>(tokens.device_data()),
                              token_table.device_data(),
                              with_positions ? position_table.device_data() : nullptr, y.device_data(),
                              shape);
        streams.cuda.synchronize();
        // The same additions in the same type: equal bits.
        EXPECT_TRUE(matches_host(y, dtype, "embedding output " + name, {0, 0}));
      }
      MirroredBuffer dy = uniform_buffer(dtype, count, -1, 1, 24, streams.cuda);
      MirroredBuffer dtoken = uniform_buffer(dtype, c.vocab * c.channels, -1, 1, 25, streams.cuda);
      MirroredBuffer dposition = uniform_buffer(dtype, c.seq_len * c.channels, -1, 1, 26, streams.cuda);
      zk::embedding_backward(streams.host, dtype, tokens.host_data<std::int32_t>(), dy.host.data(),
                             dtoken.host.data(), dposition.host.data(), shape);
      zk::embedding_backward(streams.cuda, dtype, static_cast<const std::int32_t*>(tokens.device_data()),
                             dy.device_data(), dtoken.device_data(), dposition.device_data(), shape);
      streams.cuda.synchronize();
      // Each row sums its positions in position order, as the host: equal bits.
      EXPECT_TRUE(matches_host(dtoken, dtype, "embedding grad_token_table (accumulated) " + name, {0, 0}));
      EXPECT_TRUE(
          matches_host(dposition, dtype, "embedding grad_position_table (accumulated) " + name, {0, 0}));

      // The rows [first_row, first_row + row_count) of the token table's gradient only.
      const std::int64_t first_row = c.vocab / 3, row_count = std::max<std::int64_t>(1, c.vocab / 2);
      MirroredBuffer drows = uniform_buffer(dtype, row_count * c.channels, -1, 1, 27, streams.cuda);
      zk::embedding_backward_rows(streams.host, dtype, tokens.host_data<std::int32_t>(), dy.host.data(),
                                  drows.host.data(), shape, first_row, row_count);
      zk::embedding_backward_rows(streams.cuda, dtype, static_cast<const std::int32_t*>(tokens.device_data()),
                                  dy.device_data(), drows.device_data(), shape, first_row, row_count);
      streams.cuda.synchronize();
      EXPECT_TRUE(matches_host(drows, dtype, "embedding_backward_rows " + name, {0, 0}));
    }
  }
  EXPECT_NO_THROW(zk::check_index_errors(streams.cuda)) << "no token was out of range";
}

TEST(CudaLayers, EmbeddingTokenOutOfRangeIsRecordedAndNeverWrittenOutOfBounds) {
  ZT_REQUIRE_GPU();
  const Streams streams;
  const DType dtype = DType::fp32;
  const zk::EmbeddingShape shape{2, 4, 10, 5};
  std::vector<std::int32_t> values = {1, 2, 3, 4, 5, 6, 7, 8};
  values[5] = 10;  // one past the table
  values[6] = -3;
  MirroredBuffer tokens = index_buffer(values, streams.cuda);
  MirroredBuffer token_table = uniform_buffer(dtype, 10 * 5, -1, 1, 30, streams.cuda);
  MirroredBuffer y = uniform_buffer(dtype, 8 * 5, 0, 1, 31, streams.cuda);
  zk::embedding_forward(streams.cuda, dtype, static_cast<const std::int32_t*>(tokens.device_data()),
                        token_table.device_data(), nullptr, y.device_data(), shape);
  try {
    zk::check_index_errors(streams.cuda);
    ADD_FAILURE() << "check_index_errors did not throw for token 10 at position 5";
  } catch (const zt::Error& error) {
    EXPECT_NE(std::string(error.what()).find("token 10 at position 5"), std::string::npos) << error.what();
  }
  EXPECT_NO_THROW(zk::check_index_errors(streams.cuda)) << "the record is cleared by the check";
  y.download();
  const float* out = y.downloaded_data<float>();
  const float* table = token_table.host_data<float>();
  for (int position = 0; position < 8; ++position) {
    for (int c = 0; c < 5; ++c) {
      const float value = out[position * 5 + c];
      if (position == 5 || position == 6) {
        EXPECT_TRUE(std::isnan(value)) << "position " << position << " has a bad token: its row is NaN";
      } else {
        EXPECT_EQ(value, table[values[position] * 5 + c]) << "position " << position;
      }
    }
  }
  // The backward skips the bad tokens (nothing written outside the table) and records them too. The
  // table's gradient sits between guard rows (3 before: token -3, 2 after: token 10) that must stay
  // as they were; the in-range rows must equal the host's embedding_backward_rows over the whole
  // table, which skips out-of-range tokens.
  constexpr std::int64_t kGuardBefore = 3, kGuardAfter = 2, kChannels = 5;
  MirroredBuffer dy = uniform_buffer(dtype, 8 * kChannels, -1, 1, 32, streams.cuda);
  MirroredBuffer dtoken =
      uniform_buffer(dtype, (kGuardBefore + 10 + kGuardAfter) * kChannels, -1, 1, 33, streams.cuda);
  zk::embedding_backward_rows(streams.host, dtype, tokens.host_data<std::int32_t>(), dy.host.data(),
                              dtoken.host_data<float>() + kGuardBefore * kChannels, shape, 0, 10);
  zk::embedding_backward(
      streams.cuda, dtype, static_cast<const std::int32_t*>(tokens.device_data()), dy.device_data(),
      static_cast<float*>(dtoken.device_data()) + kGuardBefore * kChannels, nullptr, shape);
  EXPECT_TRUE(matches_host(dtoken, dtype, "embedding grad_token_table with guard rows", {0, 0}));
  try {
    zk::check_index_errors(streams.cuda);
    ADD_FAILURE() << "check_index_errors did not throw for the backward's token 10 at position 5";
  } catch (const zt::Error& error) {
    EXPECT_NE(std::string(error.what()).find("token 10 at position 5"), std::string::npos) << error.what();
  }
}

// ---- cross-entropy ------------------------------------------------------------------------------

constexpr std::int32_t kIgnoreIndex = -100;

struct CrossEntropyCase {
  std::int64_t rows, vocab;
  double ignored_fraction;  // rows whose target is the ignore index (1: all)
};
constexpr CrossEntropyCase kCrossEntropyCases[] = {{1, 1, 0},       {1, 33, 0},      {67, 33, 0.3},
                                                   {5, 50257, 0.4}, {67, 1000, 1.0}, {3, 769, 0}};

TEST(CudaLayers, CrossEntropyForwardAndBackwardMatchTheHost) {
  ZT_REQUIRE_GPU();
  const Streams streams;
  for (const DType dtype : kFloatingTypes) {
    const DType stat = zk::stat_dtype(dtype);
    for (const auto [rows, vocab, ignored_fraction] : kCrossEntropyCases) {
      const std::string name = case_name(dtype, rows, vocab) + " ignored " + std::to_string(ignored_fraction);
      SCOPED_TRACE(name);
      std::vector<std::int32_t> target_values =
          random_indices(rows, 0, static_cast<std::int32_t>(vocab - 1), 40);
      std::mt19937_64 engine(41);
      std::bernoulli_distribution ignore(ignored_fraction);
      for (auto& target : target_values) {
        if (ignore(engine)) target = kIgnoreIndex;
      }
      MirroredBuffer targets = index_buffer(target_values, streams.cuda);
      MirroredBuffer logits = uniform_buffer(dtype, rows * vocab, -8, 8, 42, streams.cuda);
      MirroredBuffer lse = uniform_buffer(stat, rows, 0, 1, 43, streams.cuda);
      MirroredBuffer result(sizeof(zk::CrossEntropyScalars), streams.cuda);
      zk::cross_entropy_forward(streams.host, dtype, logits.host.data(), targets.host_data<std::int32_t>(),
                                lse.host.data(), rows, vocab, kIgnoreIndex,
                                result.host_data<zk::CrossEntropyScalars>());
      zk::cross_entropy_forward(streams.cuda, dtype, logits.device_data(),
                                static_cast<const std::int32_t*>(targets.device_data()), lse.device_data(),
                                rows, vocab, kIgnoreIndex,
                                static_cast<zk::CrossEntropyScalars*>(result.device_data()));
      streams.cuda.synchronize();
      EXPECT_TRUE(matches_host(lse, stat, "cross-entropy log-sum-exp " + name));
      result.download();
      const auto& host_result = *result.host_data<zk::CrossEntropyScalars>();
      const auto& cuda_result = *result.downloaded_data<zk::CrossEntropyScalars>();
      EXPECT_EQ(cuda_result.counted_rows, host_result.counted_rows);
      const Tolerance loss_tolerance = default_tolerance(stat);
      EXPECT_NEAR(cuda_result.mean_loss, host_result.mean_loss,
                  loss_tolerance.absolute + loss_tolerance.relative * std::abs(host_result.mean_loss));
      if (ignored_fraction == 1.0) {
        EXPECT_EQ(cuda_result.counted_rows, 0.0);
        EXPECT_EQ(cuda_result.mean_loss, 0.0);
      }

      // Backward reads counted_rows from the device scalars (the host's from the host's).
      MirroredBuffer grad = uniform_buffer(dtype, rows * vocab, 0, 1, 44, streams.cuda);  // overwritten
      const double scale = 0.75 * static_cast<double>(rows);  // gradients of order 1 / vocab
      zk::cross_entropy_backward(streams.host, dtype, logits.host.data(), targets.host_data<std::int32_t>(),
                                 lse.host.data(), result.host_data<zk::CrossEntropyScalars>(),
                                 grad.host.data(), rows, vocab, kIgnoreIndex, scale);
      // The device's own saved log-sum-exp (lse.device_data()), as in training.
      zk::cross_entropy_backward(streams.cuda, dtype, logits.device_data(),
                                 static_cast<const std::int32_t*>(targets.device_data()), lse.device_data(),
                                 static_cast<const zk::CrossEntropyScalars*>(result.device_data()),
                                 grad.device_data(), rows, vocab, kIgnoreIndex, scale);
      streams.cuda.synchronize();
      Tolerance grad_tolerance = default_tolerance(dtype);
      // Relative to the gradients' size (about 1 / vocab), but at least two fp16 subnormal steps (6e-8):
      // probabilities that small are subnormal in fp16.
      grad_tolerance.absolute =
          std::max(grad_tolerance.absolute / static_cast<double>(vocab), dtype == DType::fp16 ? 1.2e-7 : 0.0);
      // Each side's gradient is exp(logit - its own log-sum-exp): a difference d between the two
      // log-sum-exps (their sums over the vocabulary in other orders, within the check above) is a
      // relative difference of about d in every gradient of the row. Over 50257 fp32 exponentials, a
      // host sum that is not vectorized (AddressSanitizer's build) differs by 5e-5.
      double lse_difference = 0;
      for (std::int64_t r = 0; r < rows; ++r)
        if (target_values[static_cast<std::size_t>(r)] != kIgnoreIndex)
          lse_difference = std::max(lse_difference,
                                    std::abs(zt::testing::element_as_double(lse.downloaded.data(), stat, r) -
                                             zt::testing::element_as_double(lse.host.data(), stat, r)));
      grad_tolerance.relative += lse_difference;
      EXPECT_TRUE(matches_host(grad, dtype, "cross-entropy grad_logits " + name, grad_tolerance));
      for (std::int64_t r = 0; r < rows; ++r) {
        if (target_values[static_cast<std::size_t>(r)] != kIgnoreIndex) continue;
        for (std::int64_t v = 0; v < vocab; ++v) {
          ASSERT_EQ(zt::testing::element_as_double(grad.downloaded.data(), dtype, r * vocab + v), 0.0)
              << "ignored row " << r << " has a non-zero gradient at " << v;
        }
      }
    }
  }
  EXPECT_NO_THROW(zk::check_index_errors(streams.cuda)) << "no target was out of range";
}

TEST(CudaLayers, CrossEntropyTargetOutOfRangeGivesNaNLossAndIsRecorded) {
  ZT_REQUIRE_GPU();
  const Streams streams;
  const DType dtype = DType::fp32;
  const std::int64_t rows = 4, vocab = 9;
  MirroredBuffer targets = index_buffer({1, kIgnoreIndex, 9, 3}, streams.cuda);
  MirroredBuffer logits = uniform_buffer(dtype, rows * vocab, -1, 1, 50, streams.cuda);
  MirroredBuffer lse = uniform_buffer(dtype, rows, 0, 1, 51, streams.cuda);
  MirroredBuffer result(sizeof(zk::CrossEntropyScalars), streams.cuda);
  zk::cross_entropy_forward(streams.cuda, dtype, logits.device_data(),
                            static_cast<const std::int32_t*>(targets.device_data()), lse.device_data(), rows,
                            vocab, kIgnoreIndex, static_cast<zk::CrossEntropyScalars*>(result.device_data()));
  result.download();
  EXPECT_TRUE(std::isnan(result.downloaded_data<zk::CrossEntropyScalars>()->mean_loss));
  // The bad target is not the ignore index: its row counts (rows 0, 2 and 3), as the backward's factor.
  EXPECT_EQ(result.downloaded_data<zk::CrossEntropyScalars>()->counted_rows, 3.0);
  try {
    zk::check_index_errors(streams.cuda);
    ADD_FAILURE() << "check_index_errors did not throw for target 9 of row 2";
  } catch (const zt::Error& error) {
    EXPECT_NE(std::string(error.what()).find("target 9 of row 2"), std::string::npos) << error.what();
  }
}

TEST(CudaLayers, CrossEntropyOfANaNLogitIsNaNAsOnTheHost) {
  ZT_REQUIRE_GPU();
  const Streams streams;
  const DType dtype = DType::fp32;
  // A NaN first in a thread's columns (column 0, and column 300 of the next row: past the first 256,
  // the block's width) and one last in another row; the 4th row is finite. Vocab beyond the block
  // width, so that each thread sees several columns.
  const std::int64_t rows = 4, vocab = 1000;
  MirroredBuffer targets = index_buffer({5, 6, 7, 8}, streams.cuda);
  MirroredBuffer logits = uniform_buffer(dtype, rows * vocab, -4, 4, 52, streams.cuda);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  float* values = logits.host_data<float>();
  values[0] = nan;
  values[vocab + 300] = nan;
  values[2 * vocab + vocab - 1] = nan;
  logits.upload();
  MirroredBuffer lse = uniform_buffer(dtype, rows, 0, 1, 53, streams.cuda);
  MirroredBuffer result(sizeof(zk::CrossEntropyScalars), streams.cuda);
  zk::cross_entropy_forward(streams.host, dtype, logits.host.data(), targets.host_data<std::int32_t>(),
                            lse.host.data(), rows, vocab, kIgnoreIndex,
                            result.host_data<zk::CrossEntropyScalars>());
  zk::cross_entropy_forward(streams.cuda, dtype, logits.device_data(),
                            static_cast<const std::int32_t*>(targets.device_data()), lse.device_data(), rows,
                            vocab, kIgnoreIndex, static_cast<zk::CrossEntropyScalars*>(result.device_data()));
  streams.cuda.synchronize();
  lse.download();
  result.download();
  ASSERT_TRUE(std::isnan(result.host_data<zk::CrossEntropyScalars>()->mean_loss)) << "the host reference";
  EXPECT_TRUE(std::isnan(result.downloaded_data<zk::CrossEntropyScalars>()->mean_loss));
  for (std::int64_t r = 0; r < 3; ++r)
    EXPECT_TRUE(std::isnan(lse.downloaded_data<float>()[r])) << "row " << r << " holds a NaN logit";
  EXPECT_NEAR(lse.downloaded_data<float>()[3], lse.host_data<float>()[3], 1e-5) << "a finite row";
}

TEST(CudaLayers, CrossEntropyOfNoRowsWritesZeroScalars) {
  ZT_REQUIRE_GPU();
  const Streams streams;
  // No rows: the CUDA path still launches its mean kernel (over a null row-loss scratch), which must
  // overwrite the garbage in the result with (0, 0), as the host does.
  MirroredBuffer result = zt::testing::garbage_buffer(sizeof(zk::CrossEntropyScalars), streams.cuda);
  zk::cross_entropy_forward(streams.cuda, DType::fp32, nullptr, nullptr, nullptr, 0, 33, kIgnoreIndex,
                            static_cast<zk::CrossEntropyScalars*>(result.device_data()));
  result.download();
  EXPECT_EQ(result.downloaded_data<zk::CrossEntropyScalars>()->mean_loss, 0.0);
  EXPECT_EQ(result.downloaded_data<zk::CrossEntropyScalars>()->counted_rows, 0.0);
  // The other kernels with nothing to do return without launching (or failing).
  EXPECT_NO_THROW(zk::cross_entropy_backward(
      streams.cuda, DType::fp32, nullptr, nullptr, nullptr,
      static_cast<const zk::CrossEntropyScalars*>(result.device_data()), nullptr, 0, 33, kIgnoreIndex, 1.0));
  EXPECT_NO_THROW(zk::layernorm_forward(streams.cuda, DType::fp32, nullptr, nullptr, nullptr, nullptr,
                                        nullptr, nullptr, 0, 768, 1e-5));
  EXPECT_NO_THROW(zk::layernorm_backward(streams.cuda, DType::fp32, nullptr, nullptr, nullptr, nullptr,
                                         nullptr, nullptr, nullptr, nullptr, 0, 768));
  const zk::EmbeddingShape no_tokens{0, 4, 10, 5};
  EXPECT_NO_THROW(
      zk::embedding_forward(streams.cuda, DType::fp32, nullptr, nullptr, nullptr, nullptr, no_tokens));
  EXPECT_NO_THROW(
      zk::embedding_backward(streams.cuda, DType::fp32, nullptr, nullptr, nullptr, nullptr, no_tokens));
  EXPECT_NO_THROW(zk::mse_backward(streams.cuda, DType::fp32, nullptr, nullptr, nullptr, 0, 1.0));
  EXPECT_NO_THROW(streams.cuda.synchronize());
  EXPECT_NO_THROW(zk::check_index_errors(streams.cuda));
}

// ---- mean squared error -------------------------------------------------------------------------

TEST(CudaLayers, MseForwardAndBackwardMatchTheHost) {
  ZT_REQUIRE_GPU();
  const Streams streams;
  for (const DType dtype : kFloatingTypes) {
    for (const std::int64_t count :
         {std::int64_t{1}, std::int64_t{33}, std::int64_t{100003}, std::int64_t{3000017}}) {
      const std::string name = std::string(zt::dtype_name(dtype)) + " " + std::to_string(count);
      SCOPED_TRACE(name);
      MirroredBuffer prediction = uniform_buffer(dtype, count, -2, 2, 60, streams.cuda);
      MirroredBuffer target = uniform_buffer(dtype, count, -2, 2, 61, streams.cuda);
      MirroredBuffer loss(sizeof(double), streams.cuda);
      zk::mse_forward(streams.host, dtype, prediction.host.data(), target.host.data(), count,
                      loss.host_data<double>());
      zk::mse_forward(streams.cuda, dtype, prediction.device_data(), target.device_data(), count,
                      static_cast<double*>(loss.device_data()));
      streams.cuda.synchronize();
      // Differences and squares in fp64 on both sides; only the order of the sum differs.
      EXPECT_TRUE(matches_host(loss, DType::fp64, "mse loss " + name, {1e-13, 1e-11}));
      MirroredBuffer grad = uniform_buffer(dtype, count, 0, 1, 62, streams.cuda);
      zk::mse_backward(streams.host, dtype, prediction.host.data(), target.host.data(), grad.host.data(),
                       count, 0.5);
      zk::mse_backward(streams.cuda, dtype, prediction.device_data(), target.device_data(),
                       grad.device_data(), count, 0.5);
      streams.cuda.synchronize();
      // |2 scale (p - t) / count| <= 4 / count here (1.3e-6 at 3000017 elements): the default
      // absolute tolerance (1e-5 in fp32, 1e-2 in bf16) would pass even all zeros or a wrong factor.
      // Relative to the gradients' size instead, but at least two fp16 subnormal steps (6e-8).
      Tolerance grad_tolerance = default_tolerance(dtype);
      grad_tolerance.absolute =
          std::max(grad_tolerance.absolute / static_cast<double>(count), dtype == DType::fp16 ? 1.2e-7 : 0.0);
      EXPECT_TRUE(matches_host(grad, dtype, "mse grad_prediction " + name, grad_tolerance));
    }
  }
}

}  // namespace
