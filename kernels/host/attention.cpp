// Causal multi-head self-attention on the host, in blocks of kQueryBlock query rows: the score and
// value products are GEMMs on strided views of qkv (no copies), over the keys at or below the block's
// last row only (the masked upper triangle is not computed), the softmax is masked and stable. Only
// each row's log-sum-exp is saved (kernels/nn_kernels.hpp): the backward recomputes a block's
// probabilities from it, so attention keeps O(T) statistics per head, not the O(T^2) probabilities,
// and a thread's scratch is two [kQueryBlock, T] blocks.
//
// Determinism: the forward's tasks are (batch, head, query block) and write disjoint rows; the
// backward's are (batch, head) pairs and walk their query blocks in order, accumulating dK and dV
// block after block. Neither result depends on the thread count.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/host/host_common.hpp"
#include "kernels/host/nn_host.hpp"

namespace zt::kernels::host {
namespace {

/// Query rows per block: the GEMMs stay large enough for BLAS (64 x T x head_dim), the per-thread
/// scratch small (two 64 x T blocks), and the skipped upper triangle is all but the diagonal blocks.
constexpr std::int64_t kQueryBlock = 64;

struct HeadView {
  std::int64_t qkv_offset;     // first element of this head's q in qkv
  std::int64_t output_offset;  // first element of this head's columns in the [B, T, C] output
  std::int64_t row_offset;     // first of this head's T rows in row_logsumexp
};

HeadView head_view(const AttentionShape& shape, std::int64_t batch_head) {
  const std::int64_t b = batch_head / shape.n_head, h = batch_head % shape.n_head;
  const std::int64_t channels = shape.n_head * shape.head_dim;
  return {b * shape.seq_len * 3 * channels + h * shape.head_dim,
          b * shape.seq_len * channels + h * shape.head_dim, batch_head * shape.seq_len};
}

/// The query rows [first, first + count) of one block, and the keys they see: [0, first + count).
struct QueryBlock {
  std::int64_t first, count;
  std::int64_t keys() const { return first + count; }
};

QueryBlock query_block(const AttentionShape& shape, std::int64_t index) {
  const std::int64_t first = index * kQueryBlock;
  return {first, std::min(kQueryBlock, shape.seq_len - first)};
}

std::int64_t query_blocks(const AttentionShape& shape) {
  return (shape.seq_len + kQueryBlock - 1) / kQueryBlock;
}

/// Causal softmax of row t of a block of scores (`width` keys), in place: the first t + 1 entries
/// become probabilities (stable: shifted by their max; summed in order), the rest 0; returns the row's
/// log-sum-exp. A kernel with ISA paths: the exps, the scaling and the fill vectorize; the max and the
/// sum stay in order, so every path gives the same bits.
template <typename C>
struct SoftmaxRow {
  ZT_HOST_ISA_BODY static C run(C* row, std::int64_t t, std::int64_t width) {
    C row_max = row[0];
    for (std::int64_t s = 1; s <= t; ++s) row_max = std::max(row_max, row[s]);
    if constexpr (std::is_same_v<C, float>) {
#pragma omp simd
      for (std::int64_t s = 0; s <= t; ++s) row[s] = vector_exp(row[s] - row_max);
    } else {
      for (std::int64_t s = 0; s <= t; ++s) row[s] = vector_exp(row[s] - row_max);  // std::exp
    }
    C sum = 0;
    for (std::int64_t s = 0; s <= t; ++s) sum += row[s];  // in order
    const C inverse_sum = C(1) / sum;
#pragma omp simd
    for (std::int64_t s = 0; s <= t; ++s) row[s] *= inverse_sum;
    std::fill(row + t + 1, row + width, C(0));  // masked: future positions
    return row_max + std::log(sum);
  }
};

/// The probabilities of row t again, from its scores and the forward's log-sum-exp, in place:
/// exp(score - lse) for the first t + 1 entries, 0 above the diagonal.
template <typename C>
struct RecomputedSoftmaxRow {
  ZT_HOST_ISA_BODY static void run(C* row, C row_logsumexp, std::int64_t t, std::int64_t width) {
    if constexpr (std::is_same_v<C, float>) {
#pragma omp simd
      for (std::int64_t s = 0; s <= t; ++s) row[s] = vector_exp(row[s] - row_logsumexp);
    } else {
      for (std::int64_t s = 0; s <= t; ++s) row[s] = vector_exp(row[s] - row_logsumexp);  // std::exp
    }
    std::fill(row + t + 1, row + width, C(0));
  }
};

/// Softmax backward of row t: ds = p * (ds - sum(p * ds)) over the first t + 1 entries (the sum in
/// order), 0 above the diagonal.
template <typename C>
struct SoftmaxBackwardRow {
  ZT_HOST_ISA_BODY static void run(const C* p_row, C* ds_row, std::int64_t t, std::int64_t width) {
    C dot = 0;
    for (std::int64_t s = 0; s <= t; ++s) dot += p_row[s] * ds_row[s];
#pragma omp simd
    for (std::int64_t s = 0; s <= t; ++s) ds_row[s] = p_row[s] * (ds_row[s] - dot);
    std::fill(ds_row + t + 1, ds_row + width, C(0));
  }
};

template <typename C>
void attention_forward_compute(const C* qkv, C* output, C* row_logsumexp, const AttentionShape& shape) {
  const std::int64_t head_dim = shape.head_dim;
  const std::int64_t channels = shape.n_head * head_dim, qkv_stride = 3 * channels;
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  const auto softmax_row = host_isa_kernel<SoftmaxRow<C>>(host_isa());
  const std::int64_t blocks = query_blocks(shape);
  // Later blocks see more keys: dynamic scheduling balances them; each task writes its own rows.
#pragma omp parallel for schedule(dynamic)
  for (std::int64_t task = 0; task < shape.batch * shape.n_head * blocks; ++task) {
    thread_local std::vector<C> probability_storage;
    const HeadView view = head_view(shape, task / blocks);
    const QueryBlock block = query_block(shape, task % blocks);
    const std::int64_t width = block.keys();
    C* p = scratch(probability_storage, static_cast<std::size_t>(kQueryBlock * shape.seq_len));
    const C* q = qkv + view.qkv_offset + block.first * qkv_stride;
    const C* k = qkv + view.qkv_offset + channels;
    const C* v = qkv + view.qkv_offset + 2 * channels;
    gemm(false, true, block.count, width, head_dim, scale, q, qkv_stride, k, qkv_stride, 0.0, p, width);
    for (std::int64_t i = 0; i < block.count; ++i)
      row_logsumexp[view.row_offset + block.first + i] = softmax_row(p + i * width, block.first + i, width);
    gemm(false, false, block.count, head_dim, width, 1.0, p, width, v, qkv_stride, 0.0,
         output + view.output_offset + block.first * channels, channels);
  }
}

template <typename C>
void attention_backward_compute(const C* grad_output, const C* qkv, const C* row_logsumexp, C* grad_qkv,
                                const AttentionShape& shape) {
  const std::int64_t T = shape.seq_len, head_dim = shape.head_dim;
  const std::int64_t channels = shape.n_head * head_dim, qkv_stride = 3 * channels;
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  const auto recomputed_row = host_isa_kernel<RecomputedSoftmaxRow<C>>(host_isa());
  const auto softmax_backward_row = host_isa_kernel<SoftmaxBackwardRow<C>>(host_isa());
  const std::int64_t blocks = query_blocks(shape);
#pragma omp parallel for schedule(static)
  for (std::int64_t batch_head = 0; batch_head < shape.batch * shape.n_head; ++batch_head) {
    thread_local std::vector<C> probability_storage, score_grad_storage;
    C* p = scratch(probability_storage, static_cast<std::size_t>(kQueryBlock * T));
    C* ds = scratch(score_grad_storage, static_cast<std::size_t>(kQueryBlock * T));
    const HeadView view = head_view(shape, batch_head);
    const C* q = qkv + view.qkv_offset;
    const C* k = q + channels;
    const C* v = q + 2 * channels;
    C* dq = grad_qkv + view.qkv_offset;
    C* dk = dq + channels;
    C* dv = dq + 2 * channels;
    for (std::int64_t t = 0; t < T; ++t) {  // dK and dV accumulate over the blocks below
      std::fill(dk + t * qkv_stride, dk + t * qkv_stride + head_dim, C(0));
      std::fill(dv + t * qkv_stride, dv + t * qkv_stride + head_dim, C(0));
    }
    for (std::int64_t index = 0; index < blocks; ++index) {
      const QueryBlock block = query_block(shape, index);
      const std::int64_t width = block.keys();
      const C* q_block = q + block.first * qkv_stride;
      const C* dout = grad_output + view.output_offset + block.first * channels;
      gemm(false, true, block.count, width, head_dim, scale, q_block, qkv_stride, k, qkv_stride, 0.0, p,
           width);  // the scores again
      for (std::int64_t i = 0; i < block.count; ++i)
        recomputed_row(p + i * width, row_logsumexp[view.row_offset + block.first + i], block.first + i,
                       width);
      gemm(false, true, block.count, width, head_dim, 1.0, dout, channels, v, qkv_stride, 0.0, ds,
           width);  // dP = dO . V^T
      // Softmax backward per row: dS = P * (dP - sum(P * dP)); zero above the diagonal.
      for (std::int64_t i = 0; i < block.count; ++i)
        softmax_backward_row(p + i * width, ds + i * width, block.first + i, width);
      gemm(false, false, block.count, head_dim, width, scale, ds, width, k, qkv_stride, 0.0,
           dq + block.first * qkv_stride, qkv_stride);  // dQ = s dS . K
      gemm(true, false, width, head_dim, block.count, scale, ds, width, q_block, qkv_stride, 1.0, dk,
           qkv_stride);  // dK += s dS^T . Q
      gemm(true, false, width, head_dim, block.count, 1.0, p, width, dout, channels, 1.0, dv,
           qkv_stride);  // dV += P^T . dO
    }
  }
}

template <typename T>
std::vector<float> widened(const T* values, std::int64_t count) {
  std::vector<float> out(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i) out[static_cast<std::size_t>(i)] = static_cast<float>(values[i]);
  return out;
}

template <typename T>
void narrow_into(const std::vector<float>& values, T* out) {
  for (std::size_t i = 0; i < values.size(); ++i) out[i] = T(values[i]);
}

void check_shape(const AttentionShape& shape) {
  ZT_CHECK(shape.batch >= 0 && shape.seq_len > 0 && shape.n_head > 0 && shape.head_dim > 0,
           "attention shape needs seq_len, n_head and head_dim > 0, got batch ", shape.batch, ", seq_len ",
           shape.seq_len, ", n_head ", shape.n_head, ", head_dim ", shape.head_dim);
}

}  // namespace

void attention_forward(DType dtype, const void* qkv, void* output, void* row_logsumexp,
                       const AttentionShape& shape) {
  check_shape(shape);
  with_floating_type(dtype, "attention_forward", [&](auto tag) {
    using T = decltype(tag);
    using C = acc_t<T>;
    if constexpr (std::is_same_v<T, C>) {
      attention_forward_compute(static_cast<const C*>(qkv), static_cast<C*>(output),
                                static_cast<C*>(row_logsumexp), shape);
    } else {
      // 16-bit: compute in fp32 on widened copies, round the output once.
      const std::int64_t tokens = shape.batch * shape.seq_len, channels = shape.n_head * shape.head_dim;
      const std::vector<float> qkv32 = widened(static_cast<const T*>(qkv), tokens * 3 * channels);
      std::vector<float> output32(static_cast<std::size_t>(tokens * channels));
      attention_forward_compute(qkv32.data(), output32.data(), static_cast<float*>(row_logsumexp), shape);
      narrow_into(output32, static_cast<T*>(output));
    }
  });
}

// `output` is not read: rowsum(P * dP) is formed from the recomputed probabilities (nn_kernels.hpp).
void attention_backward(DType dtype, const void* grad_output, const void* qkv, const void* /*output*/,
                        const void* row_logsumexp, void* grad_qkv, const AttentionShape& shape) {
  check_shape(shape);
  with_floating_type(dtype, "attention_backward", [&](auto tag) {
    using T = decltype(tag);
    using C = acc_t<T>;
    if constexpr (std::is_same_v<T, C>) {
      attention_backward_compute(static_cast<const C*>(grad_output), static_cast<const C*>(qkv),
                                 static_cast<const C*>(row_logsumexp), static_cast<C*>(grad_qkv), shape);
    } else {
      const std::int64_t tokens = shape.batch * shape.seq_len, channels = shape.n_head * shape.head_dim;
      const std::vector<float> grad_output32 = widened(static_cast<const T*>(grad_output), tokens * channels);
      const std::vector<float> qkv32 = widened(static_cast<const T*>(qkv), tokens * 3 * channels);
      std::vector<float> grad_qkv32(static_cast<std::size_t>(tokens * 3 * channels));
      attention_backward_compute(grad_output32.data(), qkv32.data(), static_cast<const float*>(row_logsumexp),
                                 grad_qkv32.data(), shape);
      narrow_into(grad_qkv32, static_cast<T*>(grad_qkv));
    }
  });
}

}  // namespace zt::kernels::host
