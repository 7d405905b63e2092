// fill_normal (the initialization of every GPT weight) against its definition in the same run.
//
// The anchor is the loop fill_normal was until 2026-12-02: per element, Box-Muller on the element's two
// counter-based uniforms with libm's log and cos, converted once, OpenMP-parallel over the elements.
// fill_normal now gives the same bits with a polynomial cosine where an error bound allows it
// (kernels/host/elementwise.cpp); this program checks that the two outputs are identical and times
// both, interleaved (anchor, kernel, anchor, ...), on `count` elements of fp32 and of bf16.
//
//   zt_bench_fill_normal [--count N] [--reps R] [--threads T]
//
// Defaults: N = 124439808 (GPT-2 124M's parameters), R = 3, T = the OpenMP default.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "bench/bench_helpers.hpp"
#include "kernels/host/host_common.hpp"
#include "kernels/nn_kernels.hpp"
#include "kernels/optimizer_kernels.hpp"
#include "zerotrain/device.hpp"
#include "zerotrain/dtype.hpp"

namespace {

constexpr const char* kUsage = "usage: zt_bench_fill_normal [--count N] [--reps R] [--threads T]";

/// fill_normal as it was: the definition, element by element.
template <typename T>
void definition_fill(T* out, std::int64_t count, double mean, double stddev, std::uint64_t seed) {
  namespace host = zt::kernels::host;
  constexpr double kTwoPi = 6.283185307179586;
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < count; ++i) {
    const auto index = static_cast<std::uint64_t>(i);
    const double u1 = 1.0 - host::to_unit_double(host::counter_random(seed, 0, 2 * index));
    const double u2 = host::to_unit_double(host::counter_random(seed, 0, 2 * index + 1));
    const double normal = std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
    if constexpr (std::is_same_v<T, float>) {
      out[i] = static_cast<float>(mean + stddev * normal);
    } else {
      out[i] = T(static_cast<float>(mean + stddev * normal));
    }
  }
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

template <typename T>
bool run(zt::DType dtype, std::int64_t count, int reps) {
  std::vector<T> anchor(static_cast<std::size_t>(count)), kernel(static_cast<std::size_t>(count));
  std::vector<double> anchor_ms, kernel_ms;
  const auto time_ms = [](auto&& body) {
    const auto start = std::chrono::steady_clock::now();
    body();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  };
  for (int rep = 0; rep < reps; ++rep) {
    const std::uint64_t seed = 1234 + static_cast<std::uint64_t>(rep);
    anchor_ms.push_back(time_ms([&] { definition_fill(anchor.data(), count, 0.0, 0.02, seed); }));
    kernel_ms.push_back(time_ms([&] {
      zt::kernels::fill_normal(zt::default_stream(zt::Device::host()), dtype, kernel.data(), count, 0.0, 0.02,
                               seed);
    }));
    if (std::memcmp(anchor.data(), kernel.data(), anchor.size() * sizeof(T)) != 0) {
      std::printf("%s: fill_normal differs from its definition (seed %llu)\n", zt::dtype_name(dtype).data(),
                  static_cast<unsigned long long>(seed));
      return false;
    }
  }
  const double a = median(anchor_ms), k = median(kernel_ms);
  std::printf(
      "%-4s %lld elements, %d threads, %d reps: definition (libm loop) median %.1f ms, fill_normal "
      "median %.1f ms, %.2fx; outputs identical\n",
      zt::dtype_name(dtype).data(), static_cast<long long>(count), zt::kernels::host_threads(), reps, a, k,
      a / k);
  std::fflush(stdout);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t count = 124439808;
  int reps = 3, threads = 0;
  zt::bench::parse_flags(argc, argv, kUsage, [&](const std::string& flag, const std::string& value) {
    if (flag == "--count") {
      count = std::atoll(value.c_str());
    } else if (flag == "--reps") {
      reps = std::atoi(value.c_str());
    } else if (flag == "--threads") {
      threads = std::atoi(value.c_str());
    } else {
      return false;
    }
    return true;
  });
  if (count < 1 || reps < 1) zt::bench::exit_with_usage("--count and --reps must be at least 1", kUsage);
  zt::kernels::set_host_threads(threads > 0 ? threads : omp_get_max_threads());
  const bool same = run<float>(zt::DType::fp32, count, reps) && run<zt::bf16>(zt::DType::bf16, count, reps);
  return same ? 0 : 1;
}
