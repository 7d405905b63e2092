// Loss functions on the host: fused, numerically stable softmax cross-entropy and mean squared error.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/host/host_common.hpp"
#include "kernels/host/nn_host.hpp"

namespace zt::kernels::host {

namespace {

/// sum over v of exp(row[v] - shift): a SIMD sum in a fixed order per ISA path (its vector width),
/// independent of the thread count.
struct SumExpSpan {
  ZT_HOST_ISA_BODY static float run(const float* row, std::int64_t count, float shift) {
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (std::int64_t v = 0; v < count; ++v) sum += vector_exp(row[v] - shift);
    return sum;
  }
};

/// grad[v] = factor * exp(row[v] - shift).
struct ScaledExpSpan {
  ZT_HOST_ISA_BODY static void run(const float* row, float* grad, std::int64_t count, float shift,
                                   float factor) {
#pragma omp simd
    for (std::int64_t v = 0; v < count; ++v) grad[v] = factor * vector_exp(row[v] - shift);
  }
};

}  // namespace

CrossEntropyResult cross_entropy_forward(DType dtype, const void* logits, const std::int32_t* targets,
                                         void* row_logsumexp, std::int64_t rows, std::int64_t vocab,
                                         std::int32_t ignore_index) {
  CrossEntropyResult result;
  for (std::int64_t r = 0; r < rows; ++r) {
    if (targets[r] == ignore_index) continue;
    ZT_CHECK(targets[r] >= 0 && targets[r] < vocab, "target ", targets[r], " of row ", r,
             " is outside the vocabulary [0, ", vocab, ") and is not the ignore index ", ignore_index);
    ++result.counted_rows;
  }
  std::vector<double> row_loss(static_cast<std::size_t>(rows), 0.0);
  with_floating_type(dtype, "cross_entropy_forward", [&](auto tag) {
    using T = decltype(tag);
    using C = acc_t<T>;
    const T* x = static_cast<const T*>(logits);
    C* lse = static_cast<C*>(row_logsumexp);
    const auto sum_exp_span = host_isa_kernel<SumExpSpan>(host_isa());
#pragma omp parallel for schedule(static)
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* row = x + r * vocab;
      C row_max = load(row[0]);
      for (std::int64_t v = 1; v < vocab; ++v) row_max = std::max(row_max, load(row[v]));
      C sum = 0;
      if constexpr (std::is_same_v<T, float>) {
        sum = sum_exp_span(row, vocab, row_max);
      } else {
        // A SIMD sum in a fixed order (per build), independent of the thread count.
#pragma omp simd reduction(+ : sum)
        for (std::int64_t v = 0; v < vocab; ++v) sum += vector_exp(load(row[v]) - row_max);
      }
      lse[r] = row_max + std::log(sum);
      if (targets[r] != ignore_index) row_loss[static_cast<std::size_t>(r)] = lse[r] - load(row[targets[r]]);
    }
  });
  double total = 0;
  for (double loss : row_loss) total += loss;  // in row order: deterministic
  result.loss = result.counted_rows > 0 ? total / static_cast<double>(result.counted_rows) : 0.0;
  return result;
}

void cross_entropy_backward(DType dtype, const void* logits, const std::int32_t* targets,
                            const void* row_logsumexp, void* grad_logits, std::int64_t rows,
                            std::int64_t vocab, std::int32_t ignore_index, double scale) {
  with_floating_type(dtype, "cross_entropy_backward", [&](auto tag) {
    using T = decltype(tag);
    using C = acc_t<T>;
    const T* x = static_cast<const T*>(logits);
    const C* lse = static_cast<const C*>(row_logsumexp);
    T* dx = static_cast<T*>(grad_logits);
    const C factor = C(scale);
    const auto scaled_exp_span = host_isa_kernel<ScaledExpSpan>(host_isa());
#pragma omp parallel for schedule(static)
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* row = x + r * vocab;
      T* grad_row = dx + r * vocab;
      if (targets[r] == ignore_index) {
        std::fill(grad_row, grad_row + vocab, store<T>(C(0)));
        continue;
      }
      const C row_lse = lse[r];
      if constexpr (std::is_same_v<T, float>) {
        scaled_exp_span(row, grad_row, vocab, row_lse, factor);
      } else {
#pragma omp simd
        for (std::int64_t v = 0; v < vocab; ++v)
          grad_row[v] = store<T>(factor * vector_exp(load(row[v]) - row_lse));
      }
      grad_row[targets[r]] = store<T>(factor * (vector_exp(load(row[targets[r]]) - row_lse) - C(1)));
    }
  });
}

double mse_forward(DType dtype, const void* prediction, const void* target, std::int64_t count) {
  ZT_CHECK(count > 0, "mse of an empty tensor: expected at least one element");
  return with_floating_type(dtype, "mse_forward", [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(prediction);
    const T* y = static_cast<const T*>(target);
    const double sum = deterministic_sum(count, [&](std::int64_t i) {
      const double difference = static_cast<double>(load(p[i])) - static_cast<double>(load(y[i]));
      return difference * difference;
    });
    return sum / static_cast<double>(count);
  });
}

void mse_backward(DType dtype, const void* prediction, const void* target, void* grad_prediction,
                  std::int64_t count, double scale) {
  with_floating_type(dtype, "mse_backward", [&](auto tag) {
    using T = decltype(tag);
    using C = acc_t<T>;
    const T* p = static_cast<const T*>(prediction);
    const T* y = static_cast<const T*>(target);
    T* dp = static_cast<T*>(grad_prediction);
    const C factor = C(2.0 * scale / static_cast<double>(count));
#pragma omp parallel for simd schedule(static) if (count > 16384)
    for (std::int64_t i = 0; i < count; ++i) dp[i] = store<T>(factor * (load(p[i]) - load(y[i])));
  });
}

}  // namespace zt::kernels::host
