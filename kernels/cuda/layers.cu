// CUDA layer kernels: embedding, layer norm, softmax cross-entropy, mean squared error (the host
// versions: kernels/host/matmul.cpp, layernorm.cpp, loss.cpp). Every kernel is deterministic: each
// output element is written by one thread, sums run in a fixed order (block_reduce.cuh), and the
// gradients that collect many contributions (layer-norm weight and bias, embedding rows) go through
// per-block partials or a stable sort, never float atomics. Index errors: see layers.hpp.
#include "kernels/cuda/layers.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/cuda_common.hpp"
#include "kernels/cuda/stream_scratch.hpp"

namespace zt::kernels::cuda {
namespace {

// The first out-of-range index of each kind since the last throw_on_index_errors(), per device, as
// (position << 32) | uint32(value): atomicMin (an integer atomic, order-independent) keeps the
// lowest position.
constexpr unsigned long long kNoIndexError = ~0ull;
__device__ unsigned long long g_first_bad_token = kNoIndexError;
__device__ unsigned long long g_first_bad_target = kNoIndexError;

constexpr unsigned int kRowThreads = 256;
constexpr unsigned int kReduceThreads = 1024;
// block_reduce (block_reduce.cuh) needs whole warps and at most 32 of them.
static_assert(kRowThreads % kWarpSize == 0 && kRowThreads <= 1024, "block_reduce needs whole warps");
static_assert(kReduceThreads % kWarpSize == 0 && kReduceThreads <= 1024, "block_reduce needs whole warps");
// Grid limit for kernels that walk rows (or sorted positions) with a block-stride loop.
constexpr std::int64_t kMaxRowBlocks = 65535 * 16;

unsigned int row_blocks(std::int64_t rows) {
  return static_cast<unsigned int>(std::clamp<std::int64_t>(rows, 1, kMaxRowBlocks));
}

__device__ __forceinline__ void record_index_error(unsigned long long* record, std::int64_t position,
                                                   std::int32_t value) {
  const unsigned long long clamped =
      position < 0xffffffffLL ? static_cast<unsigned long long>(position) : 0xffffffffull;
  atomicMin(record, (clamped << 32) | static_cast<unsigned long long>(static_cast<std::uint32_t>(value)));
}

__device__ __forceinline__ double quiet_nan() {
  return __longlong_as_double(0x7ff8000000000000LL);
}
__device__ __forceinline__ double infinity() {
  return __longlong_as_double(0x7ff0000000000000LL);
}

/// `value` rounded to the storage type T and widened back (a no-op for float and double): the host's
/// row += grad in T, one rounding per addition.
template <typename T>
__device__ __forceinline__ compute_t<T> rounded(compute_t<T> value) {
  T stored;
  store_float(&stored, value);
  return load_float(&stored);
}

__device__ __forceinline__ std::int64_t global_thread() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::int64_t grid_threads() {
  return static_cast<std::int64_t>(gridDim.x) * blockDim.x;
}

// ---- embedding ----------------------------------------------------------------------------------

template <typename T>
__global__ void embedding_forward_kernel(const std::int32_t* __restrict__ tokens,
                                         const T* __restrict__ token_table,
                                         const T* __restrict__ position_table, T* __restrict__ output,
                                         std::int64_t positions, std::int64_t seq_len, std::int64_t vocab,
                                         std::int64_t channels) {
  using C = compute_t<T>;
  const std::int64_t total = positions * channels;
  for (std::int64_t i = global_thread(); i < total; i += grid_threads()) {
    const std::int64_t position = i / channels, c = i % channels;
    const std::int32_t token = tokens[position];
    if (token < 0 || token >= vocab) {
      store_float(&output[i], C(quiet_nan()));
      if (c == 0) record_index_error(&g_first_bad_token, position, token);
      continue;
    }
    const T* token_row = token_table + static_cast<std::int64_t>(token) * channels;
    if (position_table == nullptr) {
      output[i] = token_row[c];
    } else {
      store_float(&output[i], load_float(&token_row[c]) +
                                  load_float(&position_table[(position % seq_len) * channels + c]));
    }
  }
}

/// grad_position_table[t, c] += sum over b (in order) of grad_output[b, t, c], as the host.
template <typename T>
__global__ void embedding_position_grad_kernel(const T* __restrict__ grad_output,
                                               T* __restrict__ grad_positions, std::int64_t batch,
                                               std::int64_t seq_len, std::int64_t channels) {
  using C = compute_t<T>;
  const std::int64_t per_batch = seq_len * channels;
  for (std::int64_t i = global_thread(); i < per_batch; i += grid_threads()) {
    C sum = 0;
    for (std::int64_t b = 0; b < batch; ++b) sum += load_float(&grad_output[b * per_batch + i]);
    store_float(&grad_positions[i], load_float(&grad_positions[i]) + sum);
  }
}

__global__ void iota_kernel(std::int32_t* values, std::int64_t count) {
  for (std::int64_t i = global_thread(); i < count; i += grid_threads())
    values[i] = static_cast<std::int32_t>(i);
}

/// After a stable sort of (token, position) by token: the block at the first position of each token's
/// run adds that token's gradient rows into its table row, positions in increasing order, rounding
/// to T after each addition (the host's order and roundings). Tokens outside
/// [first_row, first_row + row_count) are skipped, and recorded when `record_out_of_range`.
template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    embedding_token_grad_kernel(const std::int32_t* __restrict__ sorted_tokens,
                                const std::int32_t* __restrict__ sorted_positions,
                                const T* __restrict__ grad_output, T* __restrict__ grad_rows,
                                std::int64_t positions, std::int64_t channels, std::int64_t first_row,
                                std::int64_t row_count, bool record_out_of_range) {
  using C = compute_t<T>;
  for (std::int64_t k = blockIdx.x; k < positions; k += gridDim.x) {
    const std::int32_t token = sorted_tokens[k];
    if (k > 0 && sorted_tokens[k - 1] == token) continue;  // not the first of its run (uniform per block)
    const std::int64_t row = static_cast<std::int64_t>(token) - first_row;
    if (row < 0 || row >= row_count) {
      if (record_out_of_range && threadIdx.x == 0)
        record_index_error(&g_first_bad_token, sorted_positions[k], token);
      continue;
    }
    std::int64_t end = k + 1;
    while (end < positions && sorted_tokens[end] == token) ++end;
    T* table_row = grad_rows + row * channels;
    for (std::int64_t c = threadIdx.x; c < channels; c += blockDim.x) {
      C value = load_float(&table_row[c]);
      for (std::int64_t j = k; j < end; ++j) {
        value = rounded<T>(
            value + load_float(&grad_output[static_cast<std::int64_t>(sorted_positions[j]) * channels + c]));
      }
      store_float(&table_row[c], value);
    }
  }
}

/// grad_rows[tokens[i] - first_row, :] += grad_output[i, :] for the tokens in range, each row in
/// position order: sort (token, position) pairs stably by token (CUB radix sort, deterministic), then
/// one block per distinct token.
template <typename T>
void add_token_rows(const std::int32_t* tokens, const T* grad_output, T* grad_rows, std::int64_t positions,
                    std::int64_t channels, std::int64_t first_row, std::int64_t row_count,
                    bool record_out_of_range, cudaStream_t stream, const char* kernel_name) {
  if (positions == 0 || channels == 0) return;
  ZT_CHECK(positions < (std::int64_t{1} << 31), kernel_name, ": ", positions,
           " token positions; the CUDA kernel sorts them with 32-bit indices (at most 2^31 - 1)");
  const int items = static_cast<int>(positions);
  std::size_t sort_bytes = 0;
  ZT_CHECK_CUDA(cub::DeviceRadixSort::SortPairs(
      nullptr, sort_bytes, tokens, static_cast<std::int32_t*>(nullptr),
      static_cast<const std::int32_t*>(nullptr), static_cast<std::int32_t*>(nullptr), items, 0, 32, stream));
  const std::size_t index_bytes =
      (static_cast<std::size_t>(positions) * sizeof(std::int32_t) + 255) / 256 * 256;
  const StreamScratch scratch(3 * index_bytes + sort_bytes, stream, kernel_name);
  auto* sorted_tokens = scratch.as<std::int32_t>(0);
  auto* positions_in = scratch.as<std::int32_t>(index_bytes);
  auto* sorted_positions = scratch.as<std::int32_t>(2 * index_bytes);
  iota_kernel<<<grid_blocks(positions), 256, 0, stream>>>(positions_in, positions);
  ZT_CHECK_LAUNCH(kernel_name);
  ZT_CHECK_CUDA(cub::DeviceRadixSort::SortPairs(scratch.as<void>(3 * index_bytes), sort_bytes, tokens,
                                                sorted_tokens, positions_in, sorted_positions, items, 0, 32,
                                                stream));
  embedding_token_grad_kernel<T><<<row_blocks(positions), kRowThreads, 0, stream>>>(
      sorted_tokens, sorted_positions, grad_output, grad_rows, positions, channels, first_row, row_count,
      record_out_of_range);
  ZT_CHECK_LAUNCH(kernel_name);
}

// ---- layer norm ---------------------------------------------------------------------------------

template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    layernorm_forward_kernel(const T* __restrict__ input, const T* __restrict__ weight,
                             const T* __restrict__ bias, T* __restrict__ output,
                             compute_t<T>* __restrict__ mean, compute_t<T>* __restrict__ rstd,
                             std::int64_t rows, std::int64_t channels, compute_t<T> eps) {
  using C = compute_t<T>;
  __shared__ C scratch[kWarpSize];
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* row = input + r * channels;
    T* out = output + r * channels;
    C sum = 0;
    for (std::int64_t c = threadIdx.x; c < channels; c += blockDim.x) sum += load_float(&row[c]);
    const C row_mean = block_sum(sum, scratch) / C(channels);
    C squares = 0;  // two passes, as the host: the variance of centered values
    for (std::int64_t c = threadIdx.x; c < channels; c += blockDim.x) {
      const C centered = load_float(&row[c]) - row_mean;
      squares += centered * centered;
    }
    const C row_rstd = C(1) / sqrt(block_sum(squares, scratch) / C(channels) + eps);
    for (std::int64_t c = threadIdx.x; c < channels; c += blockDim.x) {
      store_float(&out[c], (load_float(&row[c]) - row_mean) * row_rstd * load_float(&weight[c]) +
                               load_float(&bias[c]));
    }
    if (threadIdx.x == 0) {
      mean[r] = row_mean;
      rstd[r] = row_rstd;
    }
  }
}

/// dx = rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)), dnorm = w * dy; one block per row.
template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    layernorm_input_grad_kernel(const T* __restrict__ grad_output, const T* __restrict__ input,
                                const T* __restrict__ weight, const compute_t<T>* __restrict__ mean,
                                const compute_t<T>* __restrict__ rstd, T* __restrict__ grad_input,
                                std::int64_t rows, std::int64_t channels) {
  using C = compute_t<T>;
  __shared__ C scratch[kWarpSize];
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* x_row = input + r * channels;
    const T* dy_row = grad_output + r * channels;
    T* dx_row = grad_input + r * channels;
    const C row_mean = mean[r], row_rstd = rstd[r];
    C dnorm_sum = 0, dnorm_norm_sum = 0;
    for (std::int64_t c = threadIdx.x; c < channels; c += blockDim.x) {
      const C norm = (load_float(&x_row[c]) - row_mean) * row_rstd;
      const C dnorm = load_float(&weight[c]) * load_float(&dy_row[c]);
      dnorm_sum += dnorm;
      dnorm_norm_sum += dnorm * norm;
    }
    const C dnorm_mean = block_sum(dnorm_sum, scratch) / C(channels);
    const C dnorm_norm_mean = block_sum(dnorm_norm_sum, scratch) / C(channels);
    for (std::int64_t c = threadIdx.x; c < channels; c += blockDim.x) {
      const C norm = (load_float(&x_row[c]) - row_mean) * row_rstd;
      const C dnorm = load_float(&weight[c]) * load_float(&dy_row[c]);
      store_float(&dx_row[c], (dnorm - dnorm_mean - norm * dnorm_norm_mean) * row_rstd);
    }
  }
}

/// Partial weight and bias gradients of one chunk of rows (blockIdx.y), rows in order, one thread
/// per column: partials[chunk, c].
template <typename T>
__global__ void layernorm_param_partials_kernel(const T* __restrict__ grad_output,
                                                const T* __restrict__ input,
                                                const compute_t<T>* __restrict__ mean,
                                                const compute_t<T>* __restrict__ rstd,
                                                compute_t<T>* __restrict__ weight_partials,
                                                compute_t<T>* __restrict__ bias_partials, std::int64_t rows,
                                                std::int64_t channels, std::int64_t rows_per_chunk) {
  using C = compute_t<T>;
  const std::int64_t c = global_thread();
  if (c >= channels) return;
  const std::int64_t chunk = blockIdx.y;
  const std::int64_t begin = chunk * rows_per_chunk;
  const std::int64_t end = begin + rows_per_chunk < rows ? begin + rows_per_chunk : rows;
  C weight_sum = 0, bias_sum = 0;
  for (std::int64_t r = begin; r < end; ++r) {
    const C g = load_float(&grad_output[r * channels + c]);
    weight_sum += g * (load_float(&input[r * channels + c]) - mean[r]) * rstd[r];
    bias_sum += g;
  }
  weight_partials[chunk * channels + c] = weight_sum;
  bias_partials[chunk * channels + c] = bias_sum;
}

/// grad_weight[c] += sum of the chunks' partials in chunk order (likewise grad_bias); one rounding.
template <typename T>
__global__ void layernorm_param_finish_kernel(const compute_t<T>* __restrict__ weight_partials,
                                              const compute_t<T>* __restrict__ bias_partials,
                                              T* __restrict__ grad_weight, T* __restrict__ grad_bias,
                                              std::int64_t chunks, std::int64_t channels) {
  using C = compute_t<T>;
  for (std::int64_t c = global_thread(); c < channels; c += grid_threads()) {
    C weight_sum = 0, bias_sum = 0;
    for (std::int64_t chunk = 0; chunk < chunks; ++chunk) {
      weight_sum += weight_partials[chunk * channels + c];
      bias_sum += bias_partials[chunk * channels + c];
    }
    if (grad_weight != nullptr) store_float(&grad_weight[c], load_float(&grad_weight[c]) + weight_sum);
    if (grad_bias != nullptr) store_float(&grad_bias[c], load_float(&grad_bias[c]) + bias_sum);
  }
}

// ---- cross-entropy ------------------------------------------------------------------------------

/// Merges a (max, sum of exp(x - max)) pair into another; max == -inf marks an empty pair.
template <typename C>
__device__ __forceinline__ void merge_max_sum(C& max_value, C& sum, C other_max, C other_sum) {
  if (other_max == C(-infinity())) return;
  if (max_value == C(-infinity())) {
    max_value = other_max;
    sum = other_sum;
    return;
  }
  const C merged = max(max_value, other_max);
  sum = sum * exp(max_value - merged) + other_sum * exp(other_max - merged);
  max_value = merged;
}

template <typename C>
__device__ __forceinline__ void warp_merge_max_sum(C& max_value, C& sum) {
  for (unsigned int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const C other_max = __shfl_xor_sync(kFullWarpMask, max_value, offset);
    const C other_sum = __shfl_xor_sync(kFullWarpMask, sum, offset);
    merge_max_sum(max_value, sum, other_max, other_sum);
  }
}

/// One block per row, one pass over the logits: each thread keeps an online (max, sum of exps), the
/// block merges them in a fixed tree; thread 0 writes the row's log-sum-exp and loss.
template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    cross_entropy_forward_kernel(const T* __restrict__ logits, const std::int32_t* __restrict__ targets,
                                 compute_t<T>* __restrict__ row_logsumexp, double* __restrict__ row_loss,
                                 std::int64_t rows, std::int64_t vocab, std::int32_t ignore_index) {
  using C = compute_t<T>;
  __shared__ C max_scratch[kWarpSize], sum_scratch[kWarpSize];
  const unsigned int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* row = logits + r * vocab;
    C max_value = C(-infinity()), sum = 0;
    for (std::int64_t v = threadIdx.x; v < vocab; v += blockDim.x) {
      const C x = load_float(&row[v]);
      // Written so that a NaN takes this branch: it makes the sum NaN for good, as on the host
      // (x > max_value would skip a NaN seen first and report a finite loss).
      if (!(x <= max_value)) {
        sum = sum * exp(max_value - x) + C(1);
        max_value = x;
      } else if (max_value != C(-infinity())) {
        sum += exp(x - max_value);
      }
    }
    warp_merge_max_sum(max_value, sum);
    if (lane == 0) {
      max_scratch[warp] = max_value;
      sum_scratch[warp] = sum;
    }
    __syncthreads();
    if (warp == 0) {
      const unsigned int warps = blockDim.x / kWarpSize;
      max_value = lane < warps ? max_scratch[lane] : C(-infinity());
      sum = lane < warps ? sum_scratch[lane] : C(0);
      warp_merge_max_sum(max_value, sum);
      if (lane == 0) {
        const C lse = max_value + log(sum);
        row_logsumexp[r] = lse;
        const std::int32_t target = targets[r];
        if (target == ignore_index) {
          row_loss[r] = 0;
        } else if (target < 0 || target >= vocab) {
          row_loss[r] = quiet_nan();
          record_index_error(&g_first_bad_target, r, target);
        } else {
          row_loss[r] = static_cast<double>(lse - load_float(&row[target]));
        }
      }
    }
    __syncthreads();  // the scratch is reused by the next row
  }
}

/// One block: the mean over counted rows, summed in a fixed order, and the counted rows.
__global__ void __launch_bounds__(kReduceThreads)
    cross_entropy_mean_kernel(const double* __restrict__ row_loss, const std::int32_t* __restrict__ targets,
                              std::int64_t rows, std::int32_t ignore_index, CrossEntropyScalars* result) {
  __shared__ double scratch[kWarpSize];
  double total = 0, counted = 0;
  for (std::int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    if (targets[r] == ignore_index) continue;
    total += row_loss[r];
    counted += 1;
  }
  total = block_sum(total, scratch);
  counted = block_sum(counted, scratch);  // integers below 2^53: exact in any order
  if (threadIdx.x == 0) {
    result->mean_loss = counted > 0 ? total / counted : 0.0;
    result->counted_rows = counted;
  }
}

template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    cross_entropy_backward_kernel(const T* __restrict__ logits, const std::int32_t* __restrict__ targets,
                                  const compute_t<T>* __restrict__ row_logsumexp,
                                  const CrossEntropyScalars* __restrict__ forward_result,
                                  T* __restrict__ grad_logits, std::int64_t rows, std::int64_t vocab,
                                  std::int32_t ignore_index, double scale) {
  using C = compute_t<T>;
  const double counted = forward_result->counted_rows;
  const C factor = C(counted > 0 ? scale / counted : 0.0);  // as the host: in double, then rounded
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* row = logits + r * vocab;
    T* grad_row = grad_logits + r * vocab;
    const std::int32_t target = targets[r];
    if (target == ignore_index) {
      for (std::int64_t v = threadIdx.x; v < vocab; v += blockDim.x) store_float(&grad_row[v], C(0));
      continue;
    }
    const C lse = row_logsumexp[r];
    for (std::int64_t v = threadIdx.x; v < vocab; v += blockDim.x) {
      const C probability = exp(load_float(&row[v]) - lse);
      store_float(&grad_row[v], factor * (v == target ? probability - C(1) : probability));
    }
  }
}

// ---- mean squared error -------------------------------------------------------------------------

constexpr unsigned int kMsePartials = kReduceThreads;  // at most one partial per thread of the finish

template <typename T>
__global__ void __launch_bounds__(256)
    mse_partials_kernel(const T* __restrict__ prediction, const T* __restrict__ target, std::int64_t count,
                        double* __restrict__ partials) {
  __shared__ double scratch[kWarpSize];
  double sum = 0;
  for (std::int64_t i = global_thread(); i < count; i += grid_threads()) {
    const double difference =
        static_cast<double>(load_float(&prediction[i])) - static_cast<double>(load_float(&target[i]));
    sum += difference * difference;
  }
  sum = block_sum(sum, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

__global__ void __launch_bounds__(kReduceThreads)
    mse_finish_kernel(const double* __restrict__ partials, unsigned int partial_count, std::int64_t count,
                      double* __restrict__ loss) {
  __shared__ double scratch[kWarpSize];
  const double total = block_sum(threadIdx.x < partial_count ? partials[threadIdx.x] : 0.0, scratch);
  if (threadIdx.x == 0) *loss = total / static_cast<double>(count);
}

template <typename T>
__global__ void mse_backward_kernel(const T* __restrict__ prediction, const T* __restrict__ target,
                                    T* __restrict__ grad_prediction, std::int64_t count,
                                    compute_t<T> factor) {
  for (std::int64_t i = global_thread(); i < count; i += grid_threads())
    store_float(&grad_prediction[i], factor * (load_float(&prediction[i]) - load_float(&target[i])));
}

}  // namespace

// ---- entry points -------------------------------------------------------------------------------

void embedding_forward(DType dtype, const std::int32_t* tokens, const void* token_table,
                       const void* position_table, void* output, const EmbeddingShape& shape, void* stream) {
  const std::int64_t positions = shape.batch * shape.seq_len, total = positions * shape.channels;
  if (total == 0) return;
  with_dtype(kFloatingDTypes, dtype, "embedding_forward", [&](auto tag) {
    using T = decltype(tag);
    embedding_forward_kernel<T><<<grid_blocks(total), 256, 0, as_cuda_stream(stream)>>>(
        tokens, static_cast<const T*>(token_table), static_cast<const T*>(position_table),
        static_cast<T*>(output), positions, shape.seq_len, shape.vocab_size, shape.channels);
    ZT_CHECK_LAUNCH("embedding_forward");
  });
}

void embedding_backward(DType dtype, const std::int32_t* tokens, const void* grad_output,
                        void* grad_token_table, void* grad_position_table, const EmbeddingShape& shape,
                        void* stream) {
  const cudaStream_t cuda_stream = as_cuda_stream(stream);
  with_dtype(kFloatingDTypes, dtype, "embedding_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* dy = static_cast<const T*>(grad_output);
    const std::int64_t per_batch = shape.seq_len * shape.channels;
    if (grad_position_table != nullptr && per_batch > 0) {
      embedding_position_grad_kernel<T><<<grid_blocks(per_batch), 256, 0, cuda_stream>>>(
          dy, static_cast<T*>(grad_position_table), shape.batch, shape.seq_len, shape.channels);
      ZT_CHECK_LAUNCH("embedding_backward (position table)");
    }
    if (grad_token_table != nullptr) {
      add_token_rows(tokens, dy, static_cast<T*>(grad_token_table), shape.batch * shape.seq_len,
                     shape.channels, 0, shape.vocab_size, true, cuda_stream, "embedding_backward");
    }
  });
}

void embedding_backward_rows(DType dtype, const std::int32_t* tokens, const void* grad_output,
                             void* grad_rows, const EmbeddingShape& shape, std::int64_t first_row,
                             std::int64_t row_count, void* stream) {
  const std::int64_t positions = shape.batch * std::max<std::int64_t>(shape.seq_len, 1);  // as the host
  with_dtype(kFloatingDTypes, dtype, "embedding_backward_rows", [&](auto tag) {
    using T = decltype(tag);
    add_token_rows(tokens, static_cast<const T*>(grad_output), static_cast<T*>(grad_rows), positions,
                   shape.channels, first_row, row_count, false, as_cuda_stream(stream),
                   "embedding_backward_rows");
  });
}

void layernorm_forward(DType dtype, const void* input, const void* weight, const void* bias, void* output,
                       void* mean, void* rstd, std::int64_t rows, std::int64_t channels, double eps,
                       void* stream) {
  if (rows == 0) return;
  ZT_CHECK(channels > 0, "layernorm_forward: ", rows, " rows of ", channels,
           " channels; expected channels > 0");
  with_dtype(kFloatingDTypes, dtype, "layernorm_forward", [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    layernorm_forward_kernel<T><<<row_blocks(rows), kRowThreads, 0, as_cuda_stream(stream)>>>(
        static_cast<const T*>(input), static_cast<const T*>(weight), static_cast<const T*>(bias),
        static_cast<T*>(output), static_cast<C*>(mean), static_cast<C*>(rstd), rows, channels, C(eps));
    ZT_CHECK_LAUNCH("layernorm_forward");
  });
}

void layernorm_backward(DType dtype, const void* grad_output, const void* input, const void* weight,
                        const void* mean, const void* rstd, void* grad_input, void* grad_weight,
                        void* grad_bias, std::int64_t rows, std::int64_t channels, void* stream) {
  if (rows == 0 || channels == 0) return;
  const cudaStream_t cuda_stream = as_cuda_stream(stream);
  with_dtype(kFloatingDTypes, dtype, "layernorm_backward", [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    const T* dy = static_cast<const T*>(grad_output);
    const T* x = static_cast<const T*>(input);
    const C* saved_mean = static_cast<const C*>(mean);
    const C* saved_rstd = static_cast<const C*>(rstd);
    if (grad_input != nullptr) {
      layernorm_input_grad_kernel<T><<<row_blocks(rows), kRowThreads, 0, cuda_stream>>>(
          dy, x, static_cast<const T*>(weight), saved_mean, saved_rstd, static_cast<T*>(grad_input), rows,
          channels);
      ZT_CHECK_LAUNCH("layernorm_backward (input gradient)");
    }
    if (grad_weight == nullptr && grad_bias == nullptr) return;
    // Chunks of at least 64 rows, at most 4096 chunks (grid.y): the partition depends on the shape only.
    const std::int64_t rows_per_chunk = std::max<std::int64_t>(64, (rows + 4095) / 4096);
    const std::int64_t chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
    const std::size_t partial_bytes = static_cast<std::size_t>(chunks * channels) * sizeof(C);
    const StreamScratch partials(2 * partial_bytes, cuda_stream, "layernorm_backward partial sums");
    C* weight_partials = partials.as<C>(0);
    C* bias_partials = partials.as<C>(partial_bytes);
    const dim3 grid(static_cast<unsigned int>((channels + 255) / 256), static_cast<unsigned int>(chunks));
    layernorm_param_partials_kernel<T><<<grid, 256, 0, cuda_stream>>>(
        dy, x, saved_mean, saved_rstd, weight_partials, bias_partials, rows, channels, rows_per_chunk);
    ZT_CHECK_LAUNCH("layernorm_backward (weight and bias partials)");
    layernorm_param_finish_kernel<T><<<grid_blocks(channels), 256, 0, cuda_stream>>>(
        weight_partials, bias_partials, static_cast<T*>(grad_weight), static_cast<T*>(grad_bias), chunks,
        channels);
    ZT_CHECK_LAUNCH("layernorm_backward (weight and bias)");
  });
}

void cross_entropy_forward(DType dtype, const void* logits, const std::int32_t* targets, void* row_logsumexp,
                           std::int64_t rows, std::int64_t vocab, std::int32_t ignore_index,
                           CrossEntropyScalars* result, void* stream) {
  ZT_CHECK(rows == 0 || vocab > 0, "cross_entropy_forward: ", rows, " rows of vocabulary ", vocab,
           "; expected vocab > 0");
  const cudaStream_t cuda_stream = as_cuda_stream(stream);
  const StreamScratch row_loss(static_cast<std::size_t>(rows) * sizeof(double), cuda_stream,
                               "cross_entropy_forward row losses");
  with_dtype(kFloatingDTypes, dtype, "cross_entropy_forward", [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    if (rows > 0) {
      cross_entropy_forward_kernel<T><<<row_blocks(rows), kRowThreads, 0, cuda_stream>>>(
          static_cast<const T*>(logits), targets, static_cast<C*>(row_logsumexp), row_loss.as<double>(), rows,
          vocab, ignore_index);
      ZT_CHECK_LAUNCH("cross_entropy_forward");
    }
  });
  // Also with no rows: the result becomes (0, 0), as on the host.
  cross_entropy_mean_kernel<<<1, kReduceThreads, 0, cuda_stream>>>(row_loss.as<double>(), targets, rows,
                                                                   ignore_index, result);
  ZT_CHECK_LAUNCH("cross_entropy_forward (mean)");
}

void cross_entropy_backward(DType dtype, const void* logits, const std::int32_t* targets,
                            const void* row_logsumexp, const CrossEntropyScalars* forward_result,
                            void* grad_logits, std::int64_t rows, std::int64_t vocab,
                            std::int32_t ignore_index, double scale, void* stream) {
  if (rows == 0 || vocab == 0) return;
  with_dtype(kFloatingDTypes, dtype, "cross_entropy_backward", [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    cross_entropy_backward_kernel<T><<<row_blocks(rows), kRowThreads, 0, as_cuda_stream(stream)>>>(
        static_cast<const T*>(logits), targets, static_cast<const C*>(row_logsumexp), forward_result,
        static_cast<T*>(grad_logits), rows, vocab, ignore_index, scale);
    ZT_CHECK_LAUNCH("cross_entropy_backward");
  });
}

void mse_forward(DType dtype, const void* prediction, const void* target, std::int64_t count, double* loss,
                 void* stream) {
  ZT_CHECK(count > 0, "mse of an empty tensor: expected at least one element");
  const cudaStream_t cuda_stream = as_cuda_stream(stream);
  const unsigned int blocks = grid_blocks(count, 256, kMsePartials);  // fixed by count: deterministic
  const StreamScratch partials(blocks * sizeof(double), cuda_stream, "mse_forward partial sums");
  with_dtype(kFloatingDTypes, dtype, "mse_forward", [&](auto tag) {
    using T = decltype(tag);
    mse_partials_kernel<T><<<blocks, 256, 0, cuda_stream>>>(
        static_cast<const T*>(prediction), static_cast<const T*>(target), count, partials.as<double>());
    ZT_CHECK_LAUNCH("mse_forward");
  });
  mse_finish_kernel<<<1, kReduceThreads, 0, cuda_stream>>>(partials.as<double>(), blocks, count, loss);
  ZT_CHECK_LAUNCH("mse_forward (finish)");
}

void mse_backward(DType dtype, const void* prediction, const void* target, void* grad_prediction,
                  std::int64_t count, double scale, void* stream) {
  if (count == 0) return;
  with_dtype(kFloatingDTypes, dtype, "mse_backward", [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    mse_backward_kernel<T><<<grid_blocks(count), 256, 0, as_cuda_stream(stream)>>>(
        static_cast<const T*>(prediction), static_cast<const T*>(target), static_cast<T*>(grad_prediction),
        count, C(2.0 * scale / static_cast<double>(count)));
    ZT_CHECK_LAUNCH("mse_backward");
  });
}

void throw_on_index_errors(void* stream) {
  const cudaStream_t cuda_stream = as_cuda_stream(stream);
  unsigned long long first_bad_token = kNoIndexError, first_bad_target = kNoIndexError;
  static const unsigned long long cleared = kNoIndexError;
  ZT_CHECK_CUDA(cudaMemcpyFromSymbolAsync(&first_bad_token, g_first_bad_token, sizeof(first_bad_token), 0,
                                          cudaMemcpyDeviceToHost, cuda_stream));
  ZT_CHECK_CUDA(cudaMemcpyFromSymbolAsync(&first_bad_target, g_first_bad_target, sizeof(first_bad_target), 0,
                                          cudaMemcpyDeviceToHost, cuda_stream));
  ZT_CHECK_CUDA(cudaMemcpyToSymbolAsync(g_first_bad_token, &cleared, sizeof(cleared), 0,
                                        cudaMemcpyHostToDevice, cuda_stream));
  ZT_CHECK_CUDA(cudaMemcpyToSymbolAsync(g_first_bad_target, &cleared, sizeof(cleared), 0,
                                        cudaMemcpyHostToDevice, cuda_stream));
  ZT_CHECK_CUDA(cudaStreamSynchronize(cuda_stream));
  const auto position = [](unsigned long long record) { return static_cast<std::int64_t>(record >> 32); };
  const auto value = [](unsigned long long record) {
    return static_cast<std::int32_t>(static_cast<std::uint32_t>(record & 0xffffffffull));
  };
  if (first_bad_token != kNoIndexError) {
    ZT_THROW("token ", value(first_bad_token), " at position ", position(first_bad_token),
             " (flat index into [batch, seq_len]) is outside the embedding table (found by a CUDA embedding "
             "kernel: its output row was set to NaN, its gradient skipped)");
  }
  if (first_bad_target != kNoIndexError) {
    ZT_THROW(
        "target ", value(first_bad_target), " of row ", position(first_bad_target),
        " is outside the vocabulary and is not the ignore index (found by the CUDA cross_entropy_forward: "
        "that row's loss, and so the mean loss, is NaN)");
  }
}

}  // namespace zt::kernels::cuda
