// Host AdamW throughput against the machine's memory bandwidth, measured in the same run.
//
// AdamW in fp32 reads p, g, m, v and writes p, m, v: 28 bytes per parameter, so its ceiling is the
// memory bandwidth. The anchor is a STREAM triad (a[i] = b[i] + s * c[i], doubles, 24 bytes per
// element as STREAM counts them; 32 really move, as the store first reads its line) over arrays of the same
// total size (256 MiB by default, far past the caches). Each kernel runs `reps` times at 1 and 2 OpenMP
// threads; we print the best and the median GB/s and the AdamW / triad ratio. The machine is noisy (+-20-30
// %), hence the same-run anchor, run alternately with AdamW (rep by rep), and the ratio.
//
//   zt_bench_adamw [--params N] [--reps R] [--threads 1,2]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/optimizer_kernels.hpp"
#include "zerotrain/device.hpp"
#include "zerotrain/error.hpp"

namespace {

struct Stats {
  double best = 0.0;
  double median = 0.0;
};

Stats summarize(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return {values.back(), values[values.size() / 2]};
}

/// GB/s of one timed run of `body` that moves `bytes`.
double rate(double bytes, const std::function<void()>& body) {
  const auto start = std::chrono::steady_clock::now();
  body();
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
  return bytes / elapsed.count() / 1e9;
}

/// Run `body` once to warm up, then `reps` timed times.
Stats measure(int reps, double bytes, const std::function<void()>& body) {
  body();
  std::vector<double> rates;
  for (int r = 0; r < reps; ++r) rates.push_back(rate(bytes, body));
  return summarize(rates);
}

/// The anchor and the kernel alternately, rep by rep, so both see the same machine load; the ratio
/// is also taken per pair.
struct Paired {
  Stats anchor, kernel, ratio;
};
Paired measure_paired(int reps, double anchor_bytes, const std::function<void()>& anchor, double kernel_bytes,
                      const std::function<void()>& kernel) {
  anchor();
  kernel();
  std::vector<double> a, k, ratio;
  for (int r = 0; r < reps; ++r) {
    a.push_back(rate(anchor_bytes, anchor));
    k.push_back(rate(kernel_bytes, kernel));
    ratio.push_back(k.back() / a.back());
  }
  return {summarize(a), summarize(k), summarize(ratio)};
}

std::vector<int> parse_list(const char* text) {
  std::vector<int> out;
  for (const char* p = text; *p != '\0';) {
    char* end = nullptr;
    out.push_back(static_cast<int>(std::strtol(p, &end, 10)));
    p = (*end == ',') ? end + 1 : end;
    if (end == p && *end != '\0') break;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t params = 16'777'216;  // 16.8M fp32 parameters: 256 MiB of p, g, m, v
  int reps = 10;
  std::vector<int> thread_counts = {1, 2};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--params" && i + 1 < argc) {
      params = std::strtoull(argv[++i], nullptr, 10);
    } else if (arg == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (arg == "--threads" && i + 1 < argc) {
      thread_counts = parse_list(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--params N] [--reps R] [--threads 1,2]\n", argv[0]);
      return 2;
    }
  }
  if (params == 0 || reps < 1 || thread_counts.empty()) {
    std::fprintf(stderr, "need --params > 0, --reps >= 1 and at least one thread count\n");
    return 2;
  }

  const zt::Device host = zt::Device::host();
  const std::size_t bytes32 = params * sizeof(float);
  zt::Buffer p(host, bytes32, zt::MemoryCategory::parameters);
  zt::Buffer g(host, bytes32, zt::MemoryCategory::gradients);
  zt::Buffer m(host, bytes32, zt::MemoryCategory::optimizer_states);
  zt::Buffer v(host, bytes32, zt::MemoryCategory::optimizer_states);
  zt::Buffer p16(host, params * 2, zt::MemoryCategory::parameters);
  // Triad arrays: the same total footprint as AdamW's four fp32 arrays.
  const std::size_t triad_n = 4 * bytes32 / (3 * sizeof(double));
  zt::Buffer ta(host, triad_n * sizeof(double)), tb(host, triad_n * sizeof(double)),
      tc(host, triad_n * sizeof(double));
  double* a = ta.as<double>();
  double* b = tb.as<double>();
  double* c = tc.as<double>();

  // First touch in parallel with the kernels' static schedule.
  {
    float* pp = p.as<float>();
    float* gg = g.as<float>();
    float* mm = m.as<float>();
    float* vv = v.as<float>();
    const auto n = static_cast<std::ptrdiff_t>(params);
#pragma omp parallel for schedule(static)
    for (std::ptrdiff_t i = 0; i < n; ++i) {
      pp[i] = 1.0f;
      gg[i] = 1e-3f * static_cast<float>(i % 17 - 8);
      mm[i] = 0.0f;
      vv[i] = 0.0f;
    }
    const auto tn = static_cast<std::ptrdiff_t>(triad_n);
#pragma omp parallel for schedule(static)
    for (std::ptrdiff_t i = 0; i < tn; ++i) {
      a[i] = 0.0;
      b[i] = 1.0;
      c[i] = 2.0;
    }
  }

  zt::kernels::AdamStepArgs args;
  args.params = p.as<float>();
  args.exp_avg = m.as<float>();
  args.exp_avg_sq = v.as<float>();
  args.grads = g.data();
  args.grad_dtype = zt::DType::fp32;
  args.count = params;
  args.grad_scale = 1.0f / 1024.0f;
  args.lr = 1e-4f;
  args.weight_decay = 0.01f;
  args.adam_w_mode = true;
  std::int64_t step = 0;

  std::printf(
      "AdamW (host, fused, fp32) vs STREAM triad; %zu params (%.0f MiB of p,g,m,v), triad %zu doubles x 3 "
      "(%.0f MiB), best/median of %d\n",
      params, 4.0 * bytes32 / (1 << 20), triad_n, 3.0 * triad_n * sizeof(double) / (1 << 20), reps);
  std::printf("%-8s %-34s %10s %10s\n", "threads", "kernel", "best GB/s", "median");
  for (int threads : thread_counts) {
    omp_set_num_threads(threads);
    const double s = 3.0;
    const auto tn = static_cast<std::ptrdiff_t>(triad_n);
    const Paired paired = measure_paired(
        reps, 24.0 * static_cast<double>(triad_n),
        [&] {
#pragma omp parallel for simd schedule(static)
          for (std::ptrdiff_t i = 0; i < tn; ++i) a[i] = b[i] + s * c[i];
        },
        28.0 * static_cast<double>(params),
        [&] {
          args.params_16bit = nullptr;
          args.step = ++step;
          zt::kernels::adam_step(zt::default_stream(host), args);
        });
    const Stats& triad = paired.anchor;
    const Stats& adamw = paired.kernel;
    const Stats adamw_bf16 = measure(reps, 30.0 * static_cast<double>(params), [&] {
      args.params_16bit = p16.data();
      args.params_16bit_dtype = zt::DType::bf16;
      args.step = ++step;
      zt::kernels::adam_step(zt::default_stream(host), args);
    });
    const Stats adamw_fp16 = measure(reps, 30.0 * static_cast<double>(params), [&] {
      args.params_16bit = p16.data();
      args.params_16bit_dtype = zt::DType::fp16;
      args.step = ++step;
      zt::kernels::adam_step(zt::default_stream(host), args);
    });
    volatile double sink = 0.0;
    const Stats sumsq = measure(reps, 4.0 * static_cast<double>(params), [&] {
      sink =
          sink +
          zt::kernels::grad_sum_squares(zt::default_stream(host), g.data(), zt::DType::fp32, params).sum_sq;
    });
    std::printf("%-8d %-34s %10.1f %10.1f\n", threads, "triad a=b+s*c (24 B/elem)", triad.best, triad.median);
    std::printf("%-8d %-34s %10.1f %10.1f\n", threads, "adamw fp32 (28 B/param)", adamw.best, adamw.median);
    std::printf("%-8d %-34s %10.1f %10.1f\n", threads, "adamw + bf16 copy (30 B/param)", adamw_bf16.best,
                adamw_bf16.median);
    std::printf("%-8d %-34s %10.1f %10.1f\n", threads, "adamw + fp16 copy (30 B/param)", adamw_fp16.best,
                adamw_fp16.median);
    std::printf("%-8d %-34s %10.1f %10.1f\n", threads, "grad sum of squares (4 B/param)", sumsq.best,
                sumsq.median);
    std::printf("%-8d %-34s %10.2f %10.2f   (best/best, median/median; target >= 0.90)\n", threads,
                "ratio adamw / triad", adamw.best / triad.best, adamw.median / triad.median);
    std::printf("%-8d %-34s %10.2f %10.2f   (best, median of the per-rep ratios)\n", threads,
                "ratio per interleaved pair", paired.ratio.best, paired.ratio.median);
    // The triad's store to `a` also reads `a` first (write-allocate): 32 bytes move per element, 24
    // counted. AdamW writes only what it has read, so against the bytes really moved:
    std::printf("%-8d %-34s %10.2f %10.2f   (triad counted at 32 B/elem, its real traffic)\n", threads,
                "ratio adamw / triad incl. w-alloc", paired.ratio.best * 0.75, paired.ratio.median * 0.75);
    std::printf("%-8d %-34s %10.2f ms\n", threads, "adamw step time (best)",
                28.0 * params / adamw.best / 1e6);
  }
  // Keep the result observable so nothing is optimized away.
  return std::isfinite(p.as<float>()[params / 2]) ? 0 : 1;
}
