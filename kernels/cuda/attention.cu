// Causal multi-head self-attention on CUDA, the host's contract (kernels/nn_kernels.hpp,
// kernels/host/attention.cpp): the rows' log-sum-exps [B, H, T] (stat dtype) are saved for backward, not
// the probabilities. Tiled in plain CUDA: a block owns one (batch, head) pair and a tile of kQueryTile
// query rows (or, for dK/dV, key rows) and walks the other side in tiles of kKeyTile rows staged in
// shared memory. Each output element is accumulated by one thread in increasing row order and every
// reduction is a fixed tree: the results are deterministic.
//
//   forward:  S = scale Q K^T (s <= t), P = softmax rows (a temporary [B, H, T, T] buffer),
//             lse[t] = max + log(sum of the exps) (written to `row_logsumexp`), O = P V.
//   backward: P = exp(S - lse) recomputed (a temporary [B, H, T, T] buffer; S with the forward's
//             arithmetic), dP = dO V^T, dS = P (dP - rowsum(P dP)) (another temporary [B, H, T, T] buffer),
//             dQ = scale dS K (query tiles), dK = scale dS^T Q and dV = P^T dO (key tiles).
// The temporaries are stream-ordered (StreamScratch) and live for one call: a call needs O(B H T^2)
// memory while it runs, what is saved from forward to backward is O(B H T). This is not flash
// attention: the score tiles go through global memory (cuDNN's fused attention,
// kernels/cuda/cudnn_attention.hpp, takes the 16-bit calls it supports).
#include "kernels/cuda/attention.hpp"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/cuda_common.hpp"
#include "kernels/cuda/stream_scratch.hpp"

namespace zt::kernels::cuda {
namespace {

constexpr int kQueryTile = 8;                    // rows a block owns (one warp each in the softmax)
constexpr int kKeyTile = 32;                     // rows of the other side staged per step
constexpr int kThreads = kQueryTile * kKeyTile;  // one thread per (owned row, staged row) product
constexpr std::size_t kDefaultSharedBytes = 48 * 1024;
// The kernels rely on this shape of the block: one thread per (owned row, staged row) product in
// causal_tile_products, one whole warp per owned row in the softmaxes (full-mask shuffles), and
// block-wide loops over the kQueryTile x kKeyTile weights. Changing a tile size must keep these.
static_assert(kThreads % kWarpSize == 0 && kThreads <= 1024, "whole warps, at most 1024 threads");
static_assert(kThreads / kWarpSize >= kQueryTile, "the softmaxes take one warp per owned row");

/// Where one (batch, head) pair lives: row t of q is q + t * row_stride (k and v follow at +C, +2C).
struct HeadLayout {
  std::int64_t seq_len, head_dim, channels, qkv_row_stride;

  __device__ std::int64_t qkv_offset(std::int64_t batch_head, std::int64_t n_head) const {
    return (batch_head / n_head) * seq_len * qkv_row_stride + (batch_head % n_head) * head_dim;
  }
  __device__ std::int64_t output_offset(std::int64_t batch_head, std::int64_t n_head) const {
    return (batch_head / n_head) * seq_len * channels + (batch_head % n_head) * head_dim;
  }
};

/// rows[j][d] (row stride `shared_stride`) = source row (first + j), column d, widened; 0 past `limit`.
template <typename T, typename C>
__device__ __forceinline__ void stage_rows(C* rows, int shared_stride, int row_count, const T* source,
                                           std::int64_t source_stride, std::int64_t first, std::int64_t limit,
                                           std::int64_t head_dim) {
  for (std::int64_t i = threadIdx.x; i < row_count * head_dim; i += blockDim.x) {
    const std::int64_t j = i / head_dim, d = i % head_dim;
    const std::int64_t row = first + j;
    rows[j * shared_stride + d] = row < limit ? C(load_float(&source[row * source_stride + d])) : C(0);
  }
}

/// How many of the kQueryTile rows from `first` exist (first < seq_len).
__device__ __forceinline__ int rows_from(std::int64_t first, std::int64_t seq_len) {
  return seq_len - first < kQueryTile ? static_cast<int>(seq_len - first) : kQueryTile;
}

__device__ __forceinline__ double negative_infinity() {
  return -__longlong_as_double(0x7ff0000000000000LL);
}

/// scores[t][s] = scale * owned[t - first_row] . staged[s - first_staged] for the owned rows and the
/// staged rows s <= t (causal), written into `scores` (a [T, T] matrix in global memory). Thread
/// (owned row, staged row) = (threadIdx.x / kKeyTile, threadIdx.x % kKeyTile).
template <typename C>
__device__ __forceinline__ void causal_tile_products(const C* owned, const C* staged, int staged_stride,
                                                     std::int64_t first_row, int owned_rows,
                                                     std::int64_t first_staged, std::int64_t head_dim,
                                                     C scale, C* scores, std::int64_t seq_len) {
  const int row = threadIdx.x / kKeyTile, column = threadIdx.x % kKeyTile;
  const std::int64_t t = first_row + row, s = first_staged + column;
  if (row >= owned_rows || s > t) return;
  C dot = 0;
  for (std::int64_t d = 0; d < head_dim; ++d)
    dot += owned[row * head_dim + d] * staged[column * staged_stride + d];
  scores[t * seq_len + s] = scale * dot;
}

/// scores[t][s] = scale * q_t . k_s for the owned query rows (staged in `queries`) and every key s <= t,
/// walking the key tiles at or below the last owned row through `staged`. Called by the whole block;
/// on return the scores are visible to every thread of it.
template <typename T, typename C>
__device__ __forceinline__ void causal_scores(const C* queries, C* staged, int staged_stride, const T* k,
                                              const HeadLayout& layout, std::int64_t first_row,
                                              int owned_rows, C scale, C* scores) {
  const std::int64_t last_row = first_row + owned_rows - 1;
  for (std::int64_t first_key = 0; first_key <= last_row; first_key += kKeyTile) {
    stage_rows(staged, staged_stride, kKeyTile, k, layout.qkv_row_stride, first_key, layout.seq_len,
               layout.head_dim);
    __syncthreads();
    causal_tile_products(queries, staged, staged_stride, first_row, owned_rows, first_key, layout.head_dim,
                         scale, scores, layout.seq_len);
    __syncthreads();  // the scores written above are read by other threads after the call
  }
}

/// accumulators[r][d] += sum over j (in order) of weights[r][j] * staged[j][d], r < kQueryTile.
template <typename C>
__device__ __forceinline__ void accumulate_weighted_rows(C* accumulators, const C* weights, const C* staged,
                                                         int staged_stride, std::int64_t head_dim) {
  for (std::int64_t i = threadIdx.x; i < kQueryTile * head_dim; i += blockDim.x) {
    const std::int64_t r = i / head_dim, d = i % head_dim;
    C sum = accumulators[i];
    for (int j = 0; j < kKeyTile; ++j) sum += weights[r * kKeyTile + j] * staged[j * staged_stride + d];
    accumulators[i] = sum;
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(const T* __restrict__ qkv, T* __restrict__ output,
                             compute_t<T>* __restrict__ probabilities,
                             compute_t<T>* __restrict__ row_logsumexp, HeadLayout layout, std::int64_t n_head,
                             compute_t<T> scale) {
  using C = compute_t<T>;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  const std::int64_t seq_len = layout.seq_len, head_dim = layout.head_dim;
  const int staged_stride = static_cast<int>(head_dim) + 1;  // padded: conflict-free column reads
  C* queries = reinterpret_cast<C*>(shared_bytes);           // [kQueryTile][head_dim]
  C* staged = queries + kQueryTile * head_dim;               // [kKeyTile][head_dim + 1]
  C* accumulators = staged + kKeyTile * staged_stride;       // [kQueryTile][head_dim]
  C* weights = accumulators + kQueryTile * head_dim;         // [kQueryTile][kKeyTile]

  const std::int64_t batch_head = blockIdx.x;
  const T* q = qkv + layout.qkv_offset(batch_head, n_head);
  const T* k = q + layout.channels;
  const T* v = q + 2 * layout.channels;
  C* p = probabilities + batch_head * seq_len * seq_len;
  const std::int64_t first_row = static_cast<std::int64_t>(blockIdx.y) * kQueryTile;
  const int owned_rows = rows_from(first_row, seq_len);
  const std::int64_t last_row = first_row + owned_rows - 1;

  stage_rows(queries, static_cast<int>(head_dim), kQueryTile, q, layout.qkv_row_stride, first_row, seq_len,
             head_dim);
  for (std::int64_t i = threadIdx.x; i < kQueryTile * head_dim; i += blockDim.x) accumulators[i] = 0;
  __syncthreads();

  // Scores of the key tiles at or below the diagonal, into p.
  causal_scores(queries, staged, staged_stride, k, layout, first_row, owned_rows, scale, p);

  // Causal softmax of each owned row by one warp: max, exps and their sum, scaled; lane 0 saves the
  // row's log-sum-exp. Only s <= t of p is read below: the temporary is not cleared above the diagonal.
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  if (warp < owned_rows) {
    const std::int64_t t = first_row + warp;
    C* row = p + t * seq_len;
    C row_max = C(negative_infinity());
    for (std::int64_t s = lane; s <= t; s += kWarpSize) row_max = max(row_max, row[s]);
    row_max = warp_max(row_max);
    C sum = 0;
    for (std::int64_t s = lane; s <= t; s += kWarpSize) {
      const C e = exp(row[s] - row_max);
      row[s] = e;
      sum += e;
    }
    sum = warp_sum(sum);  // every lane holds the same sum
    if (lane == 0) row_logsumexp[batch_head * seq_len + t] = row_max + log(sum);
    const C inverse_sum = C(1) / sum;
    for (std::int64_t s = lane; s <= t; s += kWarpSize) row[s] *= inverse_sum;
  }
  __syncthreads();  // the probabilities written above are read by other threads below

  // O = P V over the same key tiles.
  for (std::int64_t first_key = 0; first_key <= last_row; first_key += kKeyTile) {
    stage_rows(staged, staged_stride, kKeyTile, v, layout.qkv_row_stride, first_key, seq_len, head_dim);
    for (int i = threadIdx.x; i < kQueryTile * kKeyTile; i += blockDim.x) {
      const int r = i / kKeyTile, j = i % kKeyTile;
      const std::int64_t t = first_row + r, s = first_key + j;
      weights[i] = r < owned_rows && s <= t ? p[t * seq_len + s] : C(0);
    }
    __syncthreads();
    accumulate_weighted_rows(accumulators, weights, staged, staged_stride, head_dim);
    __syncthreads();
  }
  T* out = output + layout.output_offset(batch_head, n_head);
  for (std::int64_t i = threadIdx.x; i < owned_rows * head_dim; i += blockDim.x) {
    const std::int64_t r = i / head_dim, d = i % head_dim;
    store_float(&out[(first_row + r) * layout.channels + d], accumulators[i]);
  }
}

/// Per query tile, the probabilities the forward normalized, recomputed from Q, K and the saved
/// log-sum-exps: S = scale Q K^T (s <= t) with the forward's arithmetic, then per owned row one warp
/// writes P[t][s] = exp(S[t][s] - lse[t]) for s <= t and 0 above the diagonal.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    attention_probabilities_kernel(const T* __restrict__ qkv, const compute_t<T>* __restrict__ row_logsumexp,
                                   compute_t<T>* __restrict__ probabilities, HeadLayout layout,
                                   std::int64_t n_head, compute_t<T> scale) {
  using C = compute_t<T>;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  const std::int64_t seq_len = layout.seq_len, head_dim = layout.head_dim;
  const int staged_stride = static_cast<int>(head_dim) + 1;  // padded: conflict-free column reads
  C* queries = reinterpret_cast<C*>(shared_bytes);           // [kQueryTile][head_dim]
  C* staged = queries + kQueryTile * head_dim;               // [kKeyTile][head_dim + 1]: rows of K

  const std::int64_t batch_head = blockIdx.x;
  const T* q = qkv + layout.qkv_offset(batch_head, n_head);
  const T* k = q + layout.channels;
  C* p = probabilities + batch_head * seq_len * seq_len;
  const C* lse = row_logsumexp + batch_head * seq_len;
  const std::int64_t first_row = static_cast<std::int64_t>(blockIdx.y) * kQueryTile;
  const int owned_rows = rows_from(first_row, seq_len);

  stage_rows(queries, static_cast<int>(head_dim), kQueryTile, q, layout.qkv_row_stride, first_row, seq_len,
             head_dim);
  __syncthreads();
  causal_scores(queries, staged, staged_stride, k, layout, first_row, owned_rows, scale, p);

  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  if (warp < owned_rows) {
    const std::int64_t t = first_row + warp;
    C* row = p + t * seq_len;
    const C row_lse = lse[t];
    for (std::int64_t s = lane; s <= t; s += kWarpSize) row[s] = exp(row[s] - row_lse);
    for (std::int64_t s = t + 1 + lane; s < seq_len; s += kWarpSize) row[s] = 0;
  }
}

/// Per query tile: dP = dO V^T into score_grad, then dS = P (dP - rowsum(P dP)) in place, then
/// dQ = scale dS K.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    attention_query_grad_kernel(const T* __restrict__ grad_output, const T* __restrict__ qkv,
                                const compute_t<T>* __restrict__ probabilities,
                                compute_t<T>* __restrict__ score_grad, T* __restrict__ grad_qkv,
                                HeadLayout layout, std::int64_t n_head, compute_t<T> scale) {
  using C = compute_t<T>;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  const std::int64_t seq_len = layout.seq_len, head_dim = layout.head_dim;
  const int staged_stride = static_cast<int>(head_dim) + 1;
  C* output_grads = reinterpret_cast<C*>(shared_bytes);  // [kQueryTile][head_dim]: rows of dO
  C* staged = output_grads + kQueryTile * head_dim;      // [kKeyTile][head_dim + 1]: rows of V, then K
  C* accumulators = staged + kKeyTile * staged_stride;   // [kQueryTile][head_dim]: dQ
  C* weights = accumulators + kQueryTile * head_dim;     // [kQueryTile][kKeyTile]: dS

  const std::int64_t batch_head = blockIdx.x;
  const std::int64_t qkv_offset = layout.qkv_offset(batch_head, n_head);
  const T* k = qkv + qkv_offset + layout.channels;
  const T* v = qkv + qkv_offset + 2 * layout.channels;
  const T* dout = grad_output + layout.output_offset(batch_head, n_head);
  const C* p = probabilities + batch_head * seq_len * seq_len;
  C* ds = score_grad + batch_head * seq_len * seq_len;
  const std::int64_t first_row = static_cast<std::int64_t>(blockIdx.y) * kQueryTile;
  const int owned_rows = rows_from(first_row, seq_len);
  const std::int64_t last_row = first_row + owned_rows - 1;

  stage_rows(output_grads, static_cast<int>(head_dim), kQueryTile, dout, layout.channels, first_row, seq_len,
             head_dim);
  for (std::int64_t i = threadIdx.x; i < kQueryTile * head_dim; i += blockDim.x) accumulators[i] = 0;
  __syncthreads();
  for (std::int64_t first_key = 0; first_key <= last_row; first_key += kKeyTile) {
    stage_rows(staged, staged_stride, kKeyTile, v, layout.qkv_row_stride, first_key, seq_len, head_dim);
    __syncthreads();
    causal_tile_products(output_grads, staged, staged_stride, first_row, owned_rows, first_key, head_dim,
                         C(1), ds, seq_len);
    __syncthreads();
  }

  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  if (warp < owned_rows) {
    const std::int64_t t = first_row + warp;
    const C* p_row = p + t * seq_len;
    C* ds_row = ds + t * seq_len;
    C dot = 0;
    for (std::int64_t s = lane; s <= t; s += kWarpSize) dot += p_row[s] * ds_row[s];
    dot = warp_sum(dot);
    for (std::int64_t s = lane; s <= t; s += kWarpSize) ds_row[s] = p_row[s] * (ds_row[s] - dot);
  }
  __syncthreads();

  for (std::int64_t first_key = 0; first_key <= last_row; first_key += kKeyTile) {
    stage_rows(staged, staged_stride, kKeyTile, k, layout.qkv_row_stride, first_key, seq_len, head_dim);
    for (int i = threadIdx.x; i < kQueryTile * kKeyTile; i += blockDim.x) {
      const int r = i / kKeyTile, j = i % kKeyTile;
      const std::int64_t t = first_row + r, s = first_key + j;
      weights[i] = r < owned_rows && s <= t ? ds[t * seq_len + s] : C(0);
    }
    __syncthreads();
    accumulate_weighted_rows(accumulators, weights, staged, staged_stride, head_dim);
    __syncthreads();
  }
  T* dq = grad_qkv + qkv_offset;
  for (std::int64_t i = threadIdx.x; i < owned_rows * head_dim; i += blockDim.x) {
    const std::int64_t r = i / head_dim, d = i % head_dim;
    store_float(&dq[(first_row + r) * layout.qkv_row_stride + d], scale * accumulators[i]);
  }
}

/// Per key tile (kQueryTile key rows s): dK[s] = scale sum over t >= s of dS[t][s] Q[t] and
/// dV[s] = sum over t >= s of P[t][s] dO[t], t in increasing order.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    attention_key_value_grad_kernel(const T* __restrict__ grad_output, const T* __restrict__ qkv,
                                    const compute_t<T>* __restrict__ probabilities,
                                    const compute_t<T>* __restrict__ score_grad, T* __restrict__ grad_qkv,
                                    HeadLayout layout, std::int64_t n_head, compute_t<T> scale) {
  using C = compute_t<T>;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  const std::int64_t seq_len = layout.seq_len, head_dim = layout.head_dim;
  const int row_stride = static_cast<int>(head_dim);
  C* queries = reinterpret_cast<C*>(shared_bytes);                 // [kKeyTile][head_dim]: rows of Q
  C* output_grads = queries + kKeyTile * head_dim;                 // [kKeyTile][head_dim]: rows of dO
  C* key_grads = output_grads + kKeyTile * head_dim;               // [kQueryTile][head_dim]: dK
  C* value_grads = key_grads + kQueryTile * head_dim;              // [kQueryTile][head_dim]: dV
  C* score_weights = value_grads + kQueryTile * head_dim;          // [kQueryTile][kKeyTile]: dS^T
  C* probability_weights = score_weights + kQueryTile * kKeyTile;  // [kQueryTile][kKeyTile]: P^T

  const std::int64_t batch_head = blockIdx.x;
  const std::int64_t qkv_offset = layout.qkv_offset(batch_head, n_head);
  const T* q = qkv + qkv_offset;
  const T* dout = grad_output + layout.output_offset(batch_head, n_head);
  const C* p = probabilities + batch_head * seq_len * seq_len;
  const C* ds = score_grad + batch_head * seq_len * seq_len;
  const std::int64_t first_key = static_cast<std::int64_t>(blockIdx.y) * kQueryTile;
  const int owned_keys = rows_from(first_key, seq_len);

  for (std::int64_t i = threadIdx.x; i < kQueryTile * head_dim; i += blockDim.x)
    key_grads[i] = value_grads[i] = 0;
  // Query tiles from the one holding the diagonal of the first owned key down to the last row.
  for (std::int64_t first_query = first_key / kKeyTile * kKeyTile; first_query < seq_len;
       first_query += kKeyTile) {
    stage_rows(queries, row_stride, kKeyTile, q, layout.qkv_row_stride, first_query, seq_len, head_dim);
    stage_rows(output_grads, row_stride, kKeyTile, dout, layout.channels, first_query, seq_len, head_dim);
    for (int i = threadIdx.x; i < kQueryTile * kKeyTile; i += blockDim.x) {
      // Neighbouring threads read neighbouring keys of one query row.
      const int key = i % kQueryTile, query = i / kQueryTile;
      const std::int64_t s = first_key + key, t = first_query + query;
      const bool causal = key < owned_keys && t < seq_len && t >= s;
      score_weights[key * kKeyTile + query] = causal ? ds[t * seq_len + s] : C(0);
      probability_weights[key * kKeyTile + query] = causal ? p[t * seq_len + s] : C(0);
    }
    __syncthreads();
    accumulate_weighted_rows(key_grads, score_weights, queries, row_stride, head_dim);
    accumulate_weighted_rows(value_grads, probability_weights, output_grads, row_stride, head_dim);
    __syncthreads();
  }
  T* dk = grad_qkv + qkv_offset + layout.channels;
  T* dv = grad_qkv + qkv_offset + 2 * layout.channels;
  for (std::int64_t i = threadIdx.x; i < owned_keys * head_dim; i += blockDim.x) {
    const std::int64_t r = i / head_dim, d = i % head_dim;
    const std::int64_t offset = (first_key + r) * layout.qkv_row_stride + d;
    store_float(&dk[offset], scale * key_grads[i]);
    store_float(&dv[offset], value_grads[i]);
  }
}

void check_shape(const AttentionShape& shape, const char* kernel_name) {
  ZT_CHECK(shape.batch >= 0 && shape.seq_len > 0 && shape.n_head > 0 && shape.head_dim > 0, kernel_name,
           ": attention shape needs seq_len, n_head and head_dim > 0, got batch ", shape.batch, ", seq_len ",
           shape.seq_len, ", n_head ", shape.n_head, ", head_dim ", shape.head_dim);
  const std::int64_t row_tiles = (shape.seq_len + kQueryTile - 1) / kQueryTile;
  ZT_CHECK(row_tiles <= 65535 && shape.batch * shape.n_head <= 0x7fffffff, kernel_name, ": seq_len ",
           shape.seq_len, " and batch * n_head ", shape.batch * shape.n_head,
           " exceed the CUDA attention kernel's grid (seq_len at most ", 65535 * kQueryTile, ")");
}

/// Lets `kernel` use `bytes` of dynamic shared memory (above the default 48 KiB it must opt in);
/// throws naming the head size when the device cannot give that much.
template <typename Kernel>
void reserve_shared_memory(Kernel* kernel, std::size_t bytes, const AttentionShape& shape,
                           const char* kernel_name) {
  if (bytes <= kDefaultSharedBytes) return;
  int device = 0, limit = 0;
  ZT_CHECK_CUDA(cudaGetDevice(&device));
  ZT_CHECK_CUDA(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  ZT_CHECK(bytes <= static_cast<std::size_t>(limit), kernel_name, ": head_dim ", shape.head_dim, " needs ",
           bytes, " bytes of shared memory per block; this device allows ", limit);
  ZT_CHECK_CUDA(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

HeadLayout head_layout(const AttentionShape& shape) {
  const std::int64_t channels = shape.n_head * shape.head_dim;
  return {shape.seq_len, shape.head_dim, channels, 3 * channels};
}

dim3 tile_grid(const AttentionShape& shape) {
  return {static_cast<unsigned int>(shape.batch * shape.n_head),
          static_cast<unsigned int>((shape.seq_len + kQueryTile - 1) / kQueryTile)};
}

/// Shared memory of the forward and query-gradient kernels: two [kQueryTile][D] tiles, one padded
/// [kKeyTile][D + 1] tile and the [kQueryTile][kKeyTile] weights.
template <typename C>
std::size_t query_tile_shared_bytes(std::int64_t head_dim) {
  return static_cast<std::size_t>(2 * kQueryTile * head_dim + kKeyTile * (head_dim + 1) +
                                  kQueryTile * kKeyTile) *
         sizeof(C);
}

/// Shared memory of the probability recomputation: a [kQueryTile][D] tile and a padded
/// [kKeyTile][D + 1] tile.
template <typename C>
std::size_t score_tile_shared_bytes(std::int64_t head_dim) {
  return static_cast<std::size_t>(kQueryTile * head_dim + kKeyTile * (head_dim + 1)) * sizeof(C);
}

/// Bytes of one [B, H, T, T] temporary of C.
template <typename C>
std::size_t score_matrix_bytes(const AttentionShape& shape) {
  return static_cast<std::size_t>(shape.batch * shape.n_head * shape.seq_len * shape.seq_len) * sizeof(C);
}

}  // namespace

void attention_forward(DType dtype, const void* qkv, void* output, void* row_logsumexp,
                       const AttentionShape& shape, void* stream) {
  check_shape(shape, "attention_forward");
  if (shape.batch == 0) return;
  const cudaStream_t cuda_stream = as_cuda_stream(stream);
  with_dtype(kFloatingDTypes, dtype, "attention_forward", [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    const std::size_t shared_bytes = query_tile_shared_bytes<C>(shape.head_dim);
    reserve_shared_memory(attention_forward_kernel<T>, shared_bytes, shape, "attention_forward");
    const C scale = C(1.0 / std::sqrt(static_cast<double>(shape.head_dim)));
    const StreamScratch probabilities(score_matrix_bytes<C>(shape), cuda_stream,
                                      "attention_forward probabilities");
    attention_forward_kernel<T><<<tile_grid(shape), kThreads, shared_bytes, cuda_stream>>>(
        static_cast<const T*>(qkv), static_cast<T*>(output), probabilities.as<C>(),
        static_cast<C*>(row_logsumexp), head_layout(shape), shape.n_head, scale);
    ZT_CHECK_LAUNCH("attention_forward");
  });
}

// `output` is for cuDNN's backward, which forms rowsum(P dP) as rowsum(dO O); this kernel forms it from
// the recomputed probabilities (the host's arithmetic, no 16-bit rounding of O in it) and ignores it.
void attention_backward(DType dtype, const void* grad_output, const void* qkv, const void* /*output*/,
                        const void* row_logsumexp, void* grad_qkv, const AttentionShape& shape,
                        void* stream) {
  check_shape(shape, "attention_backward");
  if (shape.batch == 0) return;
  const cudaStream_t cuda_stream = as_cuda_stream(stream);
  with_dtype(kFloatingDTypes, dtype, "attention_backward", [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    const C scale = C(1.0 / std::sqrt(static_cast<double>(shape.head_dim)));
    const StreamScratch probabilities(score_matrix_bytes<C>(shape), cuda_stream,
                                      "attention_backward probabilities");
    const StreamScratch score_grad(score_matrix_bytes<C>(shape), cuda_stream,
                                   "attention_backward score gradients");
    const std::size_t score_bytes = score_tile_shared_bytes<C>(shape.head_dim);
    reserve_shared_memory(attention_probabilities_kernel<T>, score_bytes, shape, "attention_backward");
    attention_probabilities_kernel<T><<<tile_grid(shape), kThreads, score_bytes, cuda_stream>>>(
        static_cast<const T*>(qkv), static_cast<const C*>(row_logsumexp), probabilities.as<C>(),
        head_layout(shape), shape.n_head, scale);
    ZT_CHECK_LAUNCH("attention_backward (probabilities)");
    const std::size_t query_bytes = query_tile_shared_bytes<C>(shape.head_dim);
    reserve_shared_memory(attention_query_grad_kernel<T>, query_bytes, shape, "attention_backward");
    attention_query_grad_kernel<T><<<tile_grid(shape), kThreads, query_bytes, cuda_stream>>>(
        static_cast<const T*>(grad_output), static_cast<const T*>(qkv), probabilities.as<C>(),
        score_grad.as<C>(), static_cast<T*>(grad_qkv), head_layout(shape), shape.n_head, scale);
    ZT_CHECK_LAUNCH("attention_backward (query gradient)");
    const std::size_t key_bytes = static_cast<std::size_t>((2 * kKeyTile + 2 * kQueryTile) * shape.head_dim +
                                                           2 * kQueryTile * kKeyTile) *
                                  sizeof(C);
    reserve_shared_memory(attention_key_value_grad_kernel<T>, key_bytes, shape, "attention_backward");
    attention_key_value_grad_kernel<T><<<tile_grid(shape), kThreads, key_bytes, cuda_stream>>>(
        static_cast<const T*>(grad_output), static_cast<const T*>(qkv), probabilities.as<C>(),
        score_grad.as<C>(), static_cast<T*>(grad_qkv), head_layout(shape), shape.n_head, scale);
    ZT_CHECK_LAUNCH("attention_backward (key and value gradients)");
  });
}

}  // namespace zt::kernels::cuda
