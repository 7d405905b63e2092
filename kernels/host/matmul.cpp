// Linear layers and embeddings on the host: GEMMs through OpenBLAS, reductions per column so that
// every gradient element is summed by one thread in row order.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/host/host_common.hpp"
#include "kernels/host/nn_host.hpp"

namespace zt::kernels::host {
namespace {

/// Columns one thread reduces at a time: wide enough for SIMD, narrow enough for registers/L1.
constexpr std::int64_t kColumnBlock = 64;

/// sums[c] += sum over rows r (in order) of values[r * columns + c].
template <typename T>
void add_column_sums(const T* values, std::int64_t rows, std::int64_t columns, T* sums) {
  using C = acc_t<T>;
  const std::int64_t blocks = (columns + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
  for (std::int64_t block = 0; block < blocks; ++block) {
    const std::int64_t begin = block * kColumnBlock;
    const std::int64_t width = std::min(kColumnBlock, columns - begin);
    C partial[kColumnBlock] = {};
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* row = values + r * columns + begin;
      for (std::int64_t c = 0; c < width; ++c) partial[c] += load(row[c]);
    }
    for (std::int64_t c = 0; c < width; ++c) sums[begin + c] = store<T>(load(sums[begin + c]) + partial[c]);
  }
}

}  // namespace

void matmul_forward(DType dtype, const void* input, const void* weight, const void* bias, void* output,
                    const MatmulShape& shape) {
  with_floating_type(dtype, "matmul_forward", [&](auto tag) {
    using T = decltype(tag);
    const auto [rows, in, out] = shape;
    T* y = static_cast<T*>(output);
    if (bias != nullptr) {
      // Start from the bias and let the GEMM add onto it (beta = 1): one rounding for 16-bit types.
      const T* b = static_cast<const T*>(bias);
#pragma omp parallel for schedule(static) if (rows * out > 65536)
      for (std::int64_t r = 0; r < rows; ++r) std::copy(b, b + out, y + r * out);
    }
    gemm(false, true, rows, out, in, 1.0, static_cast<const T*>(input), in, static_cast<const T*>(weight), in,
         bias != nullptr ? 1.0 : 0.0, y, out);
  });
}

void matmul_backward(DType dtype, const void* grad_output, const void* input, const void* weight,
                     void* grad_input, void* grad_weight, void* grad_bias, const MatmulShape& shape) {
  with_floating_type(dtype, "matmul_backward", [&](auto tag) {
    using T = decltype(tag);
    const auto [rows, in, out] = shape;
    const T* dy = static_cast<const T*>(grad_output);
    if (grad_input != nullptr) {
      gemm(false, false, rows, in, out, 1.0, dy, out, static_cast<const T*>(weight), in, 0.0,
           static_cast<T*>(grad_input), in);
    }
    if (grad_weight != nullptr) {
      gemm(true, false, out, in, rows, 1.0, dy, out, static_cast<const T*>(input), in, 1.0,
           static_cast<T*>(grad_weight), in);
    }
    if (grad_bias != nullptr) add_column_sums(dy, rows, out, static_cast<T*>(grad_bias));
  });
}

void matmul_weight_grad_rows(DType dtype, const void* grad_output, const void* input, void* grad_weight_rows,
                             const MatmulShape& shape, std::int64_t first_out, std::int64_t count) {
  with_floating_type(dtype, "matmul_weight_grad_rows", [&](auto tag) {
    using T = decltype(tag);
    const auto [rows, in, out] = shape;
    ZT_CHECK(first_out >= 0 && count >= 0 && first_out + count <= out, "matmul_weight_grad_rows: rows [",
             first_out, ", ", first_out + count, ") of a weight with ", out, " output features");
    // Column first_out of grad_output (leading dimension out) is row first_out of its transpose.
    gemm(true, false, count, in, rows, 1.0, static_cast<const T*>(grad_output) + first_out, out,
         static_cast<const T*>(input), in, 1.0, static_cast<T*>(grad_weight_rows), in);
  });
}

void embedding_forward(DType dtype, const std::int32_t* tokens, const void* token_table,
                       const void* position_table, void* output, const EmbeddingShape& shape) {
  const auto [batch, seq_len, vocab, channels] = shape;
  const std::int64_t positions = batch * seq_len;
  for (std::int64_t i = 0; i < positions; ++i) {
    ZT_CHECK(tokens[i] >= 0 && tokens[i] < vocab, "token ", tokens[i], " at batch ", i / seq_len,
             ", position ", i % seq_len, " is outside the embedding table's ", vocab, " rows");
  }
  with_floating_type(dtype, "embedding_forward", [&](auto tag) {
    using T = decltype(tag);
    const T* wte = static_cast<const T*>(token_table);
    const T* wpe = static_cast<const T*>(position_table);
    T* y = static_cast<T*>(output);
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < positions; ++i) {
      const T* token_row = wte + static_cast<std::int64_t>(tokens[i]) * channels;
      T* out = y + i * channels;
      if (wpe == nullptr) {
        std::copy(token_row, token_row + channels, out);
      } else {
        const T* position_row = wpe + (i % seq_len) * channels;
        for (std::int64_t c = 0; c < channels; ++c)
          out[c] = store<T>(load(token_row[c]) + load(position_row[c]));
      }
    }
  });
}

void embedding_backward(DType dtype, const std::int32_t* tokens, const void* grad_output,
                        void* grad_token_table, void* grad_position_table, const EmbeddingShape& shape) {
  const auto [batch, seq_len, vocab, channels] = shape;
  with_floating_type(dtype, "embedding_backward", [&](auto tag) {
    using T = decltype(tag);
    using C = acc_t<T>;
    const T* dy = static_cast<const T*>(grad_output);
    if (grad_position_table != nullptr) {
      T* dwpe = static_cast<T*>(grad_position_table);
#pragma omp parallel for schedule(static)
      for (std::int64_t t = 0; t < seq_len; ++t) {
        for (std::int64_t c = 0; c < channels; ++c) {
          C sum = 0;
          for (std::int64_t b = 0; b < batch; ++b) sum += load(dy[(b * seq_len + t) * channels + c]);
          dwpe[t * channels + c] = store<T>(load(dwpe[t * channels + c]) + sum);
        }
      }
    }
    if (grad_token_table != nullptr) {
      // Tokens repeat, so rows of the table collide; split the channels instead: each thread owns a
      // block of columns and walks the positions in order.
      T* dwte = static_cast<T*>(grad_token_table);
      const std::int64_t blocks = (channels + kColumnBlock - 1) / kColumnBlock;
      const std::int64_t positions = batch * seq_len;
#pragma omp parallel for schedule(static)
      for (std::int64_t block = 0; block < blocks; ++block) {
        const std::int64_t begin = block * kColumnBlock;
        const std::int64_t end = std::min(channels, begin + kColumnBlock);
        for (std::int64_t i = 0; i < positions; ++i) {
          T* table_row = dwte + static_cast<std::int64_t>(tokens[i]) * channels;
          const T* grad_row = dy + i * channels;
          for (std::int64_t c = begin; c < end; ++c)
            table_row[c] = store<T>(load(table_row[c]) + load(grad_row[c]));
        }
      }
      (void)vocab;
    }
  });
}

void embedding_backward_rows(DType dtype, const std::int32_t* tokens, const void* grad_output,
                             void* grad_rows, const EmbeddingShape& shape, std::int64_t first_row,
                             std::int64_t row_count) {
  const std::int64_t positions = shape.batch * std::max<std::int64_t>(shape.seq_len, 1);
  const std::int64_t channels = shape.channels;
  with_floating_type(dtype, "embedding_backward_rows", [&](auto tag) {
    using T = decltype(tag);
    const T* dy = static_cast<const T*>(grad_output);
    T* rows = static_cast<T*>(grad_rows);
    // As embedding_backward: each thread a block of columns, the positions in order.
    const std::int64_t blocks = (channels + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
    for (std::int64_t block = 0; block < blocks; ++block) {
      const std::int64_t begin = block * kColumnBlock;
      const std::int64_t end = std::min(channels, begin + kColumnBlock);
      for (std::int64_t i = 0; i < positions; ++i) {
        const std::int64_t row = static_cast<std::int64_t>(tokens[i]) - first_row;
        if (row < 0 || row >= row_count) continue;
        T* table_row = rows + row * channels;
        const T* grad_row = dy + i * channels;
        for (std::int64_t c = begin; c < end; ++c)
          table_row[c] = store<T>(load(table_row[c]) + load(grad_row[c]));
      }
    }
  });
}

}  // namespace zt::kernels::host
