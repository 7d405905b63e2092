// Causal multi-head self-attention on the host, one (batch, head) pair per task: the score and
// value products are GEMMs on strided views of qkv (no copies), the softmax is masked and stable.
// Probabilities [T, T] per head are kept for backward: O(T^2) memory per head.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/host/host_common.hpp"
#include "kernels/host/nn_host.hpp"

namespace zt::kernels::host {
namespace {

struct HeadView {
  std::int64_t qkv_offset;     // first element of this head's q in qkv
  std::int64_t output_offset;  // first element of this head's columns in the [B, T, C] output
  std::int64_t probability_offset;
};

HeadView head_view(const AttentionShape& shape, std::int64_t batch_head) {
  const std::int64_t b = batch_head / shape.n_head, h = batch_head % shape.n_head;
  const std::int64_t channels = shape.n_head * shape.head_dim;
  return {b * shape.seq_len * 3 * channels + h * shape.head_dim,
          b * shape.seq_len * channels + h * shape.head_dim, batch_head * shape.seq_len * shape.seq_len};
}

/// Causal softmax of row t of a [T, T] score matrix, in place: the first t + 1 entries become
/// probabilities (stable: shifted by their max; summed in order), the rest 0. A kernel with ISA paths:
/// the exps, the scaling and the fill vectorize; the max and the sum stay in order, so every path gives
/// the same bits.
template <typename C>
struct SoftmaxRow {
  ZT_HOST_ISA_BODY static void run(C* row, std::int64_t t, std::int64_t T) {
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
    std::fill(row + t + 1, row + T, C(0));  // masked: future positions
  }
};

/// Softmax backward of row t: ds = p * (ds - sum(p * ds)) over the first t + 1 entries (the sum in
/// order), 0 above the diagonal.
template <typename C>
struct SoftmaxBackwardRow {
  ZT_HOST_ISA_BODY static void run(const C* p_row, C* ds_row, std::int64_t t, std::int64_t T) {
    C dot = 0;
    for (std::int64_t s = 0; s <= t; ++s) dot += p_row[s] * ds_row[s];
#pragma omp simd
    for (std::int64_t s = 0; s <= t; ++s) ds_row[s] = p_row[s] * (ds_row[s] - dot);
    std::fill(ds_row + t + 1, ds_row + T, C(0));
  }
};

template <typename C>
void attention_forward_compute(const C* qkv, C* output, C* probabilities, const AttentionShape& shape) {
  const std::int64_t T = shape.seq_len, head_dim = shape.head_dim;
  const std::int64_t channels = shape.n_head * head_dim, qkv_stride = 3 * channels;
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  const auto softmax_row = host_isa_kernel<SoftmaxRow<C>>(host_isa());
#pragma omp parallel for schedule(static)
  for (std::int64_t batch_head = 0; batch_head < shape.batch * shape.n_head; ++batch_head) {
    const HeadView view = head_view(shape, batch_head);
    const C* q = qkv + view.qkv_offset;
    const C* k = q + channels;
    const C* v = q + 2 * channels;
    C* p = probabilities + view.probability_offset;
    gemm(false, true, T, T, head_dim, scale, q, qkv_stride, k, qkv_stride, 0.0, p, T);  // scores
    for (std::int64_t t = 0; t < T; ++t) softmax_row(p + t * T, t, T);
    gemm(false, false, T, head_dim, T, 1.0, p, T, v, qkv_stride, 0.0, output + view.output_offset, channels);
  }
}

template <typename C>
void attention_backward_compute(const C* grad_output, const C* qkv, const C* probabilities, C* grad_qkv,
                                const AttentionShape& shape) {
  const std::int64_t T = shape.seq_len, head_dim = shape.head_dim;
  const std::int64_t channels = shape.n_head * head_dim, qkv_stride = 3 * channels;
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  const auto softmax_backward_row = host_isa_kernel<SoftmaxBackwardRow<C>>(host_isa());
#pragma omp parallel for schedule(static)
  for (std::int64_t batch_head = 0; batch_head < shape.batch * shape.n_head; ++batch_head) {
    thread_local std::vector<C> score_grad_storage;
    C* ds = scratch(score_grad_storage, static_cast<std::size_t>(T * T));
    const HeadView view = head_view(shape, batch_head);
    const C* q = qkv + view.qkv_offset;
    const C* k = q + channels;
    const C* v = q + 2 * channels;
    const C* p = probabilities + view.probability_offset;
    const C* dout = grad_output + view.output_offset;
    C* dq = grad_qkv + view.qkv_offset;
    C* dk = dq + channels;
    C* dv = dq + 2 * channels;
    gemm(false, true, T, T, head_dim, 1.0, dout, channels, v, qkv_stride, 0.0, ds, T);  // dP = dO . V^T
    // Softmax backward per row: dS = P * (dP - sum(P * dP)); zero above the diagonal.
    for (std::int64_t t = 0; t < T; ++t) softmax_backward_row(p + t * T, ds + t * T, t, T);
    gemm(false, false, T, head_dim, T, scale, ds, T, k, qkv_stride, 0.0, dq, qkv_stride);  // dQ = s dS . K
    gemm(true, false, T, head_dim, T, scale, ds, T, q, qkv_stride, 0.0, dk, qkv_stride);   // dK = s dS^T . Q
    gemm(true, false, T, head_dim, T, 1.0, p, T, dout, channels, 0.0, dv, qkv_stride);     // dV = P^T . dO
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

void attention_forward(DType dtype, const void* qkv, void* output, void* probabilities,
                       const AttentionShape& shape) {
  check_shape(shape);
  with_floating_type(dtype, "attention_forward", [&](auto tag) {
    using T = decltype(tag);
    using C = acc_t<T>;
    if constexpr (std::is_same_v<T, C>) {
      attention_forward_compute(static_cast<const C*>(qkv), static_cast<C*>(output),
                                static_cast<C*>(probabilities), shape);
    } else {
      // 16-bit: compute in fp32 on widened copies, round the output once.
      const std::int64_t tokens = shape.batch * shape.seq_len, channels = shape.n_head * shape.head_dim;
      const std::vector<float> qkv32 = widened(static_cast<const T*>(qkv), tokens * 3 * channels);
      std::vector<float> output32(static_cast<std::size_t>(tokens * channels));
      attention_forward_compute(qkv32.data(), output32.data(), static_cast<float*>(probabilities), shape);
      narrow_into(output32, static_cast<T*>(output));
    }
  });
}

void attention_backward(DType dtype, const void* grad_output, const void* qkv, const void* probabilities,
                        void* grad_qkv, const AttentionShape& shape) {
  check_shape(shape);
  with_floating_type(dtype, "attention_backward", [&](auto tag) {
    using T = decltype(tag);
    using C = acc_t<T>;
    if constexpr (std::is_same_v<T, C>) {
      attention_backward_compute(static_cast<const C*>(grad_output), static_cast<const C*>(qkv),
                                 static_cast<const C*>(probabilities), static_cast<C*>(grad_qkv), shape);
    } else {
      const std::int64_t tokens = shape.batch * shape.seq_len, channels = shape.n_head * shape.head_dim;
      const std::vector<float> grad_output32 = widened(static_cast<const T*>(grad_output), tokens * channels);
      const std::vector<float> qkv32 = widened(static_cast<const T*>(qkv), tokens * 3 * channels);
      std::vector<float> grad_qkv32(static_cast<std::size_t>(tokens * 3 * channels));
      attention_backward_compute(grad_output32.data(), qkv32.data(), static_cast<const float*>(probabilities),
                                 grad_qkv32.data(), shape);
      narrow_into(grad_qkv32, static_cast<T*>(grad_qkv));
    }
  });
}

}  // namespace zt::kernels::host
