// The host attention kernel (kernels/host/attention.cpp) at GPT-2's attention shape, against the GEMMs
// alone of the full-square attention it replaced, in the same run.
//
// The kernel saves each row's log-sum-exp and works in 64-row query blocks over the causal keys only;
// the backward recomputes the probabilities. Until 2026-12-03 it saved the full [B, H, T, T]
// probabilities and ran every product over the whole T x T square. The anchor is those square GEMMs
// without any softmax (forward: Q K^T and P V; backward: dO V^T, dS K, dS^T Q, P^T dO, per head,
// through the same sgemm), so it is a lower bound on the old kernel's time: a ratio anchor/kernel above
// 1 means the kernel is faster than the old one could have been. Interleaved (anchor, kernel, ...).
//
//   zt_bench_attention [--batch B] [--seq-len T] [--heads H] [--head-dim D] [--reps R] [--threads N]
//
// Defaults: B 1, T 1024, H 12, D 64 (GPT-2 124M), R 5, N = the OpenMP default.
#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_helpers.hpp"
#include "kernels/host/host_common.hpp"
#include "kernels/nn_kernels.hpp"
#include "kernels/optimizer_kernels.hpp"
#include "zerotrain/device.hpp"

namespace {

constexpr const char* kUsage =
    "usage: zt_bench_attention [--batch B] [--seq-len T] [--heads H] [--head-dim D] [--reps R] [--threads N]";

/// The square GEMMs of one (batch, head) pair, as the old kernel ran them, over all pairs in parallel.
void square_gemms(const zt::kernels::AttentionShape& shape, bool backward, const float* qkv, float* output,
                  float* grad_qkv) {
  const std::int64_t T = shape.seq_len, D = shape.head_dim, C = shape.n_head * D;
#pragma omp parallel for schedule(static)
  for (std::int64_t pair = 0; pair < shape.batch * shape.n_head; ++pair) {
    thread_local std::vector<float> square, square_grad;
    float* p = zt::kernels::host::scratch(square, static_cast<std::size_t>(T * T));
    const std::int64_t b = pair / shape.n_head, h = pair % shape.n_head;
    const float* q = qkv + b * T * 3 * C + h * D;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* out = output + b * T * C + h * D;
    namespace host = zt::kernels::host;
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    if (!backward) {
      host::gemm(false, true, T, T, D, scale, q, 3 * C, k, 3 * C, 0.0, p, T);  // S = s Q K^T
      host::gemm(false, false, T, D, T, 1.0, p, T, v, 3 * C, 0.0, out, C);     // O = P V
      continue;
    }
    // The old backward read the saved P; its values do not matter to the time.
    float* ds = host::scratch(square_grad, static_cast<std::size_t>(T * T));
    float* dq = grad_qkv + b * T * 3 * C + h * D;
    host::gemm(false, true, T, T, D, 1.0, out, C, v, 3 * C, 0.0, ds, T);           // dP = dO V^T
    host::gemm(false, false, T, D, T, scale, ds, T, k, 3 * C, 0.0, dq, 3 * C);     // dQ = s dS K
    host::gemm(true, false, T, D, T, scale, ds, T, q, 3 * C, 0.0, dq + C, 3 * C);  // dK = s dS^T Q
    host::gemm(true, false, T, D, T, 1.0, p, T, out, C, 0.0, dq + 2 * C, 3 * C);   // dV = P^T dO
  }
}

}  // namespace

int main(int argc, char** argv) {
  zt::kernels::AttentionShape shape{1, 1024, 12, 64};
  int reps = 5, threads = 0;
  zt::bench::parse_flags(argc, argv, kUsage, [&](const std::string& flag, const std::string& value) {
    const long long number = std::atoll(value.c_str());
    if (flag == "--batch")
      shape.batch = number;
    else if (flag == "--seq-len")
      shape.seq_len = number;
    else if (flag == "--heads")
      shape.n_head = number;
    else if (flag == "--head-dim")
      shape.head_dim = number;
    else if (flag == "--reps")
      reps = static_cast<int>(number);
    else if (flag == "--threads")
      threads = static_cast<int>(number);
    else
      return false;
    return true;
  });
  if (shape.batch < 1 || shape.seq_len < 1 || shape.n_head < 1 || shape.head_dim < 1 || reps < 1)
    zt::bench::exit_with_usage("every size and --reps must be at least 1", kUsage);
  zt::kernels::set_host_threads(threads > 0 ? threads : omp_get_max_threads());

  const std::int64_t tokens = shape.batch * shape.seq_len, C = shape.n_head * shape.head_dim;
  std::vector<float> qkv(static_cast<std::size_t>(tokens * 3 * C)),
      output(static_cast<std::size_t>(tokens * C));
  std::vector<float> grad_output(output.size()), grad_qkv(qkv.size());
  std::vector<float> row_logsumexp(static_cast<std::size_t>(shape.batch * shape.n_head * shape.seq_len));
  std::mt19937 random(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : qkv) x = normal(random);
  for (float& x : grad_output) x = normal(random);
  const zt::Stream& stream = zt::default_stream(zt::Device::host());

  const auto time_ms = [](auto&& body) {
    const auto start = std::chrono::steady_clock::now();
    body();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  };
  std::vector<double> anchor_forward, anchor_backward, forward, backward;
  for (int rep = 0; rep <= reps; ++rep) {  // rep 0 warms up
    const double af =
        time_ms([&] { square_gemms(shape, false, qkv.data(), output.data(), grad_qkv.data()); });
    const double ab = time_ms([&] { square_gemms(shape, true, qkv.data(), output.data(), grad_qkv.data()); });
    const double f = time_ms([&] {
      zt::kernels::attention_forward(stream, zt::DType::fp32, qkv.data(), output.data(), row_logsumexp.data(),
                                     shape);
    });
    const double b = time_ms([&] {
      zt::kernels::attention_backward(stream, zt::DType::fp32, grad_output.data(), qkv.data(), output.data(),
                                      row_logsumexp.data(), grad_qkv.data(), shape);
    });
    if (rep == 0) continue;
    anchor_forward.push_back(af);
    anchor_backward.push_back(ab);
    forward.push_back(f);
    backward.push_back(b);
  }
  using zt::bench::median;
  const double saved_mib = static_cast<double>(row_logsumexp.size()) * 4 / (1 << 20);
  const double square_mib =
      static_cast<double>(shape.batch * shape.n_head * shape.seq_len * shape.seq_len) * 4 / (1 << 20);
  std::printf("attention fp32 B %lld T %lld H %lld D %lld, %d threads, %d reps (medians):\n",
              static_cast<long long>(shape.batch), static_cast<long long>(shape.seq_len),
              static_cast<long long>(shape.n_head), static_cast<long long>(shape.head_dim),
              zt::kernels::host_threads(), reps);
  std::printf("  forward:  kernel %.1f ms, square GEMMs alone %.1f ms, anchor/kernel %.2fx\n",
              median(forward), median(anchor_forward), median(anchor_forward) / median(forward));
  std::printf("  backward: kernel %.1f ms, square GEMMs alone %.1f ms, anchor/kernel %.2fx\n",
              median(backward), median(anchor_backward), median(anchor_backward) / median(backward));
  std::printf("  saved for the backward: %.3f MiB of log-sum-exps (the probabilities were %.1f MiB)\n",
              saved_mib, square_mib);
  return 0;
}
