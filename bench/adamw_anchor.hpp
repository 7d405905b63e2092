// The anchors of the host AdamW benchmarks (bench/bench_adamw.cpp, bench/deepspeed_cpu_adam.cpp):
// a STREAM triad and AdamW's bytes-moved limit, measured in the same process as the kernels, in
// interleaved rounds so that all see the same machine load.
//
//   triad   a[i] = b[i] + s * c[i] over three double arrays whose total size is AdamW's (p, g, m, v),
//           as STREAM runs it (regular stores, no software prefetch). It moves 32 bytes per element:
//           STREAM counts 24, but a regular store to `a` first reads the line (write-allocate), so the
//           bandwidth printed for it counts the 32 it moves. Its time travels between machines:
//           report a kernel's time as a ratio to it.
//   limit   AdamW's memory traffic without its arithmetic: read p, g, m, v, write p, m, v (28 bytes
//           per parameter; no write-allocate, each line written was read first), as a plain vector
//           loop like the kernel's: the fastest AdamW can be on this machine, so a kernel's "fraction
//           of the limit" is limit time / kernel time. limit_prefetched() is the same loop with
//           software prefetch 2 KiB ahead of every stream, printed as a row of its own: where it
//           beats the plain limit, the limit is too low. (Non-temporal stores do not lower it: they
//           save the write-allocate read only for lines not read before, and for AdamW's
//           read-modify-write streams they measured slower.)
// The anchors' arrays are zt::Buffers, so they get the pages zerotrain's kernels get (2 MiB
// transparent huge pages unless ZT_HOST_HUGE_PAGES=0, kernels/host_memory.hpp). Both run on the best
// ISA path of this CPU (kernels/host/host_isa_kernels.hpp) and the same OpenMP static block schedule
// as the kernels.
#pragma once

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench_helpers.hpp"
#include "kernels/host/host_isa_kernels.hpp"
#include "kernels/host_isa.hpp"
#include "kernels/host_memory.hpp"
#include "zerotrain/device.hpp"

namespace zt::bench {

/// Seconds of one run of `body`.
inline double seconds(const std::function<void()>& body) {
  const auto start = std::chrono::steady_clock::now();
  body();
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
  return elapsed.count();
}

/// CPU seconds this process has used (all threads, user and system).
inline double process_cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

struct TriadSpan {
  ZT_HOST_ISA_BODY static void run(double* a, const double* b, const double* c, double s, std::size_t begin,
                                   std::size_t end) {
#pragma omp simd
    for (std::size_t i = begin; i < end; ++i) a[i] = b[i] + s * c[i];
  }
};

/// Software prefetch of the kPrefetchChunk elements of `data` kPrefetchDistance after `index`, when they
/// lie inside [0, count) (no pointer past the array is formed); non-temporal hint.
inline constexpr std::size_t kPrefetchChunk = 64;
inline constexpr std::size_t kPrefetchDistance = 512;
template <typename T>
[[gnu::always_inline]] inline void prefetch_ahead(const T* data, std::size_t index, std::size_t count) {
  constexpr std::size_t kLine = 64;
  const std::size_t first = index + kPrefetchDistance;
  if (first + kPrefetchChunk > count) return;
  const char* bytes = reinterpret_cast<const char*>(data + first);
  for (std::size_t offset = 0; offset < kPrefetchChunk * sizeof(T); offset += kLine)
    __builtin_prefetch(bytes + offset, 0, 0);
}

template <bool kPrefetch>
struct LimitSpan {
  ZT_HOST_ISA_BODY static void run(float* p, const float* g, float* m, float* v, std::size_t begin,
                                   std::size_t end, std::size_t count) {
    for (std::size_t chunk = begin; chunk < end; chunk += kPrefetchChunk) {
      if constexpr (kPrefetch) {
        prefetch_ahead(g, chunk, count);
        prefetch_ahead(p, chunk, count);
        prefetch_ahead(m, chunk, count);
        prefetch_ahead(v, chunk, count);
      }
      const std::size_t chunk_end = std::min(end, chunk + kPrefetchChunk);
#pragma omp simd
      for (std::size_t i = chunk; i < chunk_end; ++i) {
        const float gi = g[i];
        p[i] = p[i] - 1e-9f * gi;
        m[i] = m[i] + gi;
        v[i] = v[i] + gi;
      }
    }
  }
};

/// What pages the large host arrays of this process get: zerotrain's policy on this kernel
/// (kernels/host_memory.hpp) and the process's anonymous memory on huge pages so far.
inline std::string huge_page_state() {
  std::string huge = "?";
  std::ifstream smaps("/proc/self/smaps_rollup");
  for (std::string line; std::getline(smaps, line);) {
    if (line.rfind("AnonHugePages:", 0) == 0) huge = line.substr(line.find_first_not_of(' ', 14));
  }
  return "zerotrain host huge pages: " + host_huge_pages_description() + "; process AnonHugePages " + huge;
}

/// Run span(begin, end) over blocks of 4096 elements of [0, count), statically spread over the threads,
/// as the host kernels do.
template <typename Span>
void for_blocks(std::size_t count, Span&& span) {
  constexpr std::size_t kBlock = 4096;
  const auto blocks = static_cast<std::ptrdiff_t>((count + kBlock - 1) / kBlock);
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t b = 0; b < blocks; ++b) {
    const std::size_t begin = static_cast<std::size_t>(b) * kBlock;
    span(begin, std::min(count, begin + kBlock));
  }
}

/// The anchors' arrays (zt::Buffers), first touched in parallel with the kernels' schedule.
class AdamwAnchors {
 public:
  explicit AdamwAnchors(std::size_t params)
      : params_(params),
        triad_n_(4 * params * sizeof(float) / (3 * sizeof(double))),
        a_(host_array<double>(triad_n_)),
        b_(host_array<double>(triad_n_)),
        c_(host_array<double>(triad_n_)),
        p_(host_array<float>(params)),
        g_(host_array<float>(params)),
        m_(host_array<float>(params)),
        v_(host_array<float>(params)) {
    double *a = a_.as<double>(), *b = b_.as<double>(), *c = c_.as<double>();
    for_blocks(triad_n_, [&](std::size_t begin, std::size_t end) {
      std::fill(a + begin, a + end, 0.0);
      std::fill(b + begin, b + end, 1.0);
      std::fill(c + begin, c + end, 2.0);
    });
    float *p = p_.as<float>(), *g = g_.as<float>(), *m = m_.as<float>(), *v = v_.as<float>();
    for_blocks(params_, [&](std::size_t begin, std::size_t end) {
      for (std::size_t i = begin; i < end; ++i) {
        p[i] = 1.0f;
        g[i] = 1e-3f * static_cast<float>(i % 17) - 8e-3f;
        m[i] = 0.0f;
        v[i] = 0.0f;
      }
    });
  }

  std::size_t triad_elements() const { return triad_n_; }
  /// Bytes the triad moves (32 per element with the write-allocate read of `a`) and the bytes AdamW
  /// moves (28 per parameter).
  double triad_bytes() const { return 32.0 * static_cast<double>(triad_n_); }
  double adamw_bytes() const { return 28.0 * static_cast<double>(params_); }

  void triad() {
    const auto span = kernels::host::host_isa_kernel<TriadSpan>(kernels::best_host_isa());
    double* a = a_.as<double>();
    const double* b = b_.as<double>();
    const double* c = c_.as<double>();
    for_blocks(triad_n_, [&](std::size_t begin, std::size_t end) { span(a, b, c, 3.0, begin, end); });
  }

  void limit() { run_limit<false>(); }
  void limit_prefetched() { run_limit<true>(); }

 private:
  template <typename T>
  static Buffer host_array(std::size_t count) {
    return Buffer(Device::host(), count * sizeof(T), MemoryCategory::other);
  }

  template <bool kPrefetch>
  void run_limit() {
    const auto span = kernels::host::host_isa_kernel<LimitSpan<kPrefetch>>(kernels::best_host_isa());
    float* p = p_.as<float>();
    const float* g = g_.as<float>();
    float* m = m_.as<float>();
    float* v = v_.as<float>();
    const std::size_t count = params_;
    for_blocks(params_, [&](std::size_t begin, std::size_t end) { span(p, g, m, v, begin, end, count); });
  }

  std::size_t params_;
  std::size_t triad_n_;
  Buffer a_, b_, c_;
  Buffer p_, g_, m_, v_;
};

/// Timed kernels run in rounds: each round runs every kernel once, in order, so that all see the same
/// machine load; per-kernel medians of the times and of the per-round ratios to the anchors.
///
/// Besides the wall time, each call's CPU time per thread (the process's CPU time over the call,
/// divided by the OpenMP thread count; run with OMP_WAIT_POLICY=passive so that waiting threads use
/// none): on a machine shared with more runnable threads than cores, the wall time mostly measures
/// how long the threads waited for a core, the CPU time how long they ran, memory stalls included.
/// For these memory-bound kernels it is the better estimate of the time on an idle machine.
class Rounds {
 public:
  /// Add a kernel; returns its index. The first two must be the triad and the limit.
  std::size_t add(std::string name, std::string path, double bytes, std::function<void()> body) {
    kernels_.push_back({std::move(name), std::move(path), bytes, std::move(body), {}, {}});
    return kernels_.size() - 1;
  }

  /// Each timed call follows an untimed call of the same kernel, so that every kernel starts from its
  /// own arrays in whatever cache level they fit (in-cache sizes would otherwise favour the kernels
  /// that share arrays with the one before them).
  void run(int rounds) {
    for (int r = 0; r < rounds; ++r) {
      for (auto& kernel : kernels_) {
        kernel.body();
        const double cpu_start = process_cpu_seconds();
        kernel.times.push_back(seconds(kernel.body));
        kernel.cpu_times.push_back((process_cpu_seconds() - cpu_start) / omp_get_max_threads());
      }
    }
  }

  struct Result {
    std::string name, path;
    double ms = 0, gbps = 0;
    double triad_ratio = 0;         // kernel time / triad time, median over rounds
    double limit_fraction = 0;      // limit time / kernel time, median over rounds
    double bandwidth_fraction = 0;  // kernel GB/s / triad GB/s (bytes moved), median over rounds
    double cpu_ms = 0;              // CPU time per thread, median over rounds
    double cpu_limit_fraction = 0;  // limit CPU time / kernel CPU time, median over rounds
  };

  std::vector<Result> results() const {
    std::vector<Result> out;
    const auto& triad = kernels_.at(0).times;
    const auto& limit = kernels_.at(1).times;
    const auto& limit_cpu = kernels_.at(1).cpu_times;
    for (const auto& kernel : kernels_) {
      std::vector<double> triad_ratio, limit_fraction, bandwidth_fraction, cpu_limit_fraction;
      for (std::size_t r = 0; r < kernel.times.size(); ++r) {
        triad_ratio.push_back(kernel.times[r] / triad[r]);
        limit_fraction.push_back(limit[r] / kernel.times[r]);
        bandwidth_fraction.push_back((kernel.bytes / kernel.times[r]) / (kernels_[0].bytes / triad[r]));
        cpu_limit_fraction.push_back(limit_cpu[r] / kernel.cpu_times[r]);
      }
      const double time = median(kernel.times);
      out.push_back({kernel.name, kernel.path, 1e3 * time, kernel.bytes / time / 1e9, median(triad_ratio),
                     median(limit_fraction), median(bandwidth_fraction), 1e3 * median(kernel.cpu_times),
                     median(cpu_limit_fraction)});
    }
    return out;
  }

 private:
  struct Kernel {
    std::string name, path;
    double bytes;
    std::function<void()> body;
    std::vector<double> times, cpu_times;
  };
  std::vector<Kernel> kernels_;
};

}  // namespace zt::bench
