// Layer normalization on the host: rows in parallel for the input gradient, column blocks in
// parallel (rows in order) for the weight and bias gradients.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/host/host_common.hpp"
#include "kernels/host/nn_host.hpp"

namespace zt::kernels::host {
namespace {
constexpr std::int64_t kColumnBlock = 64;

// Kernels with ISA paths (kernels/host/host_isa_kernels.hpp). The row sums stay in order (scalar), so
// every path gives the same bits; the element-wise loops vectorize at the path's width. The in-order
// sums bound these kernels, and their avx2 builds ran faster than 512-bit ones: kWidestIsa.

/// One row of the forward: y = (x - mean) * rstd * w + b, and the row's mean and rstd.
template <typename T>
struct LayernormForwardRow {
  static constexpr HostIsa kWidestIsa = HostIsa::avx2;
  using C = acc_t<T>;
  ZT_HOST_ISA_BODY static void run(const T* row, const T* w, const T* b, T* out, C* saved_mean, C* saved_rstd,
                                   std::int64_t channels, C eps) {
    C sum = 0;
    for (std::int64_t c = 0; c < channels; ++c) sum += load(row[c]);
    const C row_mean = sum / C(channels);
    C squares = 0;
    for (std::int64_t c = 0; c < channels; ++c) {
      const C centered = load(row[c]) - row_mean;
      squares += centered * centered;
    }
    const C row_rstd = C(1) / std::sqrt(squares / C(channels) + eps);
    for (std::int64_t c = 0; c < channels; ++c) {
      out[c] = store<T>((load(row[c]) - row_mean) * row_rstd * load(w[c]) + load(b[c]));
    }
    *saved_mean = row_mean;
    *saved_rstd = row_rstd;
  }
};

/// One row of the input gradient: dx = rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)),
/// dnorm = w * dy.
template <typename T>
struct LayernormInputGradRow {
  static constexpr HostIsa kWidestIsa = HostIsa::avx2;
  using C = acc_t<T>;
  ZT_HOST_ISA_BODY static void run(const T* x_row, const T* dy_row, const T* w, T* dx_row, C row_mean,
                                   C row_rstd, std::int64_t channels) {
    C dnorm_sum = 0, dnorm_norm_sum = 0;
    for (std::int64_t c = 0; c < channels; ++c) {
      const C norm = (load(x_row[c]) - row_mean) * row_rstd;
      const C dnorm = load(w[c]) * load(dy_row[c]);
      dnorm_sum += dnorm;
      dnorm_norm_sum += dnorm * norm;
    }
    const C dnorm_mean = dnorm_sum / C(channels), dnorm_norm_mean = dnorm_norm_sum / C(channels);
    for (std::int64_t c = 0; c < channels; ++c) {
      const C norm = (load(x_row[c]) - row_mean) * row_rstd;
      const C dnorm = load(w[c]) * load(dy_row[c]);
      dx_row[c] = store<T>((dnorm - dnorm_mean - norm * dnorm_norm_mean) * row_rstd);
    }
  }
};

/// The weight and bias gradients of one block of up to kColumnBlock columns, rows in order.
template <typename T>
struct LayernormParamGradBlock {
  static constexpr HostIsa kWidestIsa = HostIsa::avx2;
  using C = acc_t<T>;
  ZT_HOST_ISA_BODY static void run(const T* x, const T* dy, const C* saved_mean, const C* saved_rstd, T* dw,
                                   T* db, std::int64_t rows, std::int64_t channels, std::int64_t begin,
                                   std::int64_t width) {
    C weight_sum[kColumnBlock] = {}, bias_sum[kColumnBlock] = {};
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* x_row = x + r * channels + begin;
      const T* dy_row = dy + r * channels + begin;
      const C row_mean = saved_mean[r], row_rstd = saved_rstd[r];
      for (std::int64_t c = 0; c < width; ++c) {
        const C g = load(dy_row[c]);
        weight_sum[c] += g * (load(x_row[c]) - row_mean) * row_rstd;
        bias_sum[c] += g;
      }
    }
    for (std::int64_t c = 0; c < width; ++c) {
      if (dw != nullptr) dw[begin + c] = store<T>(load(dw[begin + c]) + weight_sum[c]);
      if (db != nullptr) db[begin + c] = store<T>(load(db[begin + c]) + bias_sum[c]);
    }
  }
};

}  // namespace

void layernorm_forward(DType dtype, const void* input, const void* weight, const void* bias, void* output,
                       void* mean, void* rstd, std::int64_t rows, std::int64_t channels, double eps) {
  with_floating_type(dtype, "layernorm_forward", [&](auto tag) {
    using T = decltype(tag);
    using C = acc_t<T>;
    const T* x = static_cast<const T*>(input);
    const T* w = static_cast<const T*>(weight);
    const T* b = static_cast<const T*>(bias);
    T* y = static_cast<T*>(output);
    C* saved_mean = static_cast<C*>(mean);
    C* saved_rstd = static_cast<C*>(rstd);
    const auto forward_row = host_isa_kernel<LayernormForwardRow<T>>(host_isa());
#pragma omp parallel for schedule(static)
    for (std::int64_t r = 0; r < rows; ++r) {
      forward_row(x + r * channels, w, b, y + r * channels, saved_mean + r, saved_rstd + r, channels, C(eps));
    }
  });
}

void layernorm_backward(DType dtype, const void* grad_output, const void* input, const void* weight,
                        const void* mean, const void* rstd, void* grad_input, void* grad_weight,
                        void* grad_bias, std::int64_t rows, std::int64_t channels) {
  with_floating_type(dtype, "layernorm_backward", [&](auto tag) {
    using T = decltype(tag);
    using C = acc_t<T>;
    const T* dy = static_cast<const T*>(grad_output);
    const T* x = static_cast<const T*>(input);
    const T* w = static_cast<const T*>(weight);
    const C* saved_mean = static_cast<const C*>(mean);
    const C* saved_rstd = static_cast<const C*>(rstd);
    const HostIsa isa = host_isa();
    if (grad_input != nullptr) {
      T* dx = static_cast<T*>(grad_input);
      const auto input_grad_row = host_isa_kernel<LayernormInputGradRow<T>>(isa);
#pragma omp parallel for schedule(static)
      for (std::int64_t r = 0; r < rows; ++r) {
        input_grad_row(x + r * channels, dy + r * channels, w, dx + r * channels, saved_mean[r],
                       saved_rstd[r], channels);
      }
    }
    if (grad_weight == nullptr && grad_bias == nullptr) return;
    T* dw = static_cast<T*>(grad_weight);
    T* db = static_cast<T*>(grad_bias);
    const auto param_grad_block = host_isa_kernel<LayernormParamGradBlock<T>>(isa);
    const std::int64_t blocks = (channels + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
    for (std::int64_t block = 0; block < blocks; ++block) {
      const std::int64_t begin = block * kColumnBlock;
      param_grad_block(x, dy, saved_mean, saved_rstd, dw, db, rows, channels, begin,
                       std::min(kColumnBlock, channels - begin));
    }
  });
}

}  // namespace zt::kernels::host
