// DeepSpeed's cpu_adam kernel and zerotrain's host AdamW in one process, side by side with the same
// anchors as zt_bench_adamw (a STREAM triad and AdamW's bytes-moved limit, bench/adamw_anchor.hpp).
//
// Built by bench/run_adamw_vs_deepspeed.sh, not by CMake: it compiles DeepSpeed's own header
// csrc/includes/cpu_adam.h (Adam_Optimizer::Step_AVX, the loop ds_adam_step runs for fp32 tensors) from
// a DeepSpeed source tree with the flags of DeepSpeed's CPUAdamBuilder (-O3 -march=native -fopenmp and
// -D__AVX512__ or -D__AVX256__), with a stand-in for <torch/extension.h> (bench/deepspeed_shim), and
// links libzerotrain for zerotrain's kernel. Same problem as zt_bench_adamw: fp32 AdamW (decoupled
// weight decay 0.01, bias correction, lr 1e-4, betas 0.9/0.999, eps 1e-8), 2 OpenMP threads.
// DeepSpeed's arrays are made as PyTorch's CPU allocator makes its tensors (THP_MEM_ALLOC_ENABLE
// decides whether they are advised as huge pages), zerotrain's are zt::Buffers from its own host
// allocator: each kernel gets the memory it gets in use.
//
//   zt_bench_deepspeed_adam [--params N] [--reps R] [--threads T]
#include <omp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "bench/adamw_anchor.hpp"
#include "bench/bench_helpers.hpp"
#include "cpu_adam.h"  // DeepSpeed
#include "kernels/host_isa.hpp"
#include "kernels/optimizer_kernels.hpp"
#include "zerotrain/device.hpp"

#if defined(__AVX512__)
constexpr const char* kDeepSpeedPath = "AVX512";
constexpr std::size_t kDeepSpeedBlock = 16 * 8;  // SIMD_WIDTH * span of Step_AVX<8>
#elif defined(__AVX256__)
constexpr const char* kDeepSpeedPath = "AVX256";
constexpr std::size_t kDeepSpeedBlock = 8 * 8;
#else
#error "build with -D__AVX512__ or -D__AVX256__, as DeepSpeed's CPUAdamBuilder does"
#endif

namespace {

constexpr const char* kUsage = "usage: zt_bench_deepspeed_adam [--params N] [--reps R] [--threads T]";
constexpr float kLr = 1e-4f, kBeta1 = 0.9f, kBeta2 = 0.999f, kEps = 1e-8f, kWeightDecay = 0.01f;

/// Where an AdamArrays' memory comes from.
enum class Allocation {
  zerotrain,  // zt::Buffers: zerotrain's host allocator (2 MiB huge pages, kernels/host_memory.hpp)
  pytorch,    // as PyTorch's CPU allocator hands it to DeepSpeed's tensors (torch_cpu_block)
};

struct FreeBlock {
  void operator()(float* data) const { std::free(data); }
};
using TorchBlock = std::unique_ptr<float[], FreeBlock>;

/// True when THP_MEM_ALLOC_ENABLE asks PyTorch's CPU allocator for transparent huge pages (off by
/// default), read as c10's alloc_cpu reads it.
bool torch_thp_enabled() {
  const char* env = std::getenv("THP_MEM_ALLOC_ENABLE");
  return env != nullptr && std::atoi(env) != 0;
}

/// A block as PyTorch's CPU allocator (c10::alloc_cpu) makes one for DeepSpeed's CPU tensors:
/// posix_memalign to 64 bytes; with THP_MEM_ALLOC_ENABLE=1 and 2 MiB or more, aligned to the page
/// size instead and madvise(MADV_HUGEPAGE) over its bytes. So by default, with the kernel's THP mode
/// `madvise`, DeepSpeed's optimizer states are on 4 KiB pages.
TorchBlock torch_cpu_block(std::size_t count) {
  const std::size_t bytes = count * sizeof(float);
  const bool huge = torch_thp_enabled() && bytes >= (std::size_t{2} << 20);
  void* data = nullptr;
  if (posix_memalign(&data, huge ? static_cast<std::size_t>(sysconf(_SC_PAGESIZE)) : 64, bytes) != 0)
    throw std::bad_alloc();
  if (huge) (void)madvise(data, bytes, MADV_HUGEPAGE);
  return TorchBlock(static_cast<float*>(data));
}

/// Four fp32 arrays with the benchmarks' initial values, first touched with the kernels' schedule.
class AdamArrays {
 public:
  AdamArrays(std::size_t n, Allocation allocation) {
    float** arrays[] = {&p, &g, &m, &v};
    for (float** array : arrays) {
      if (allocation == Allocation::zerotrain) {
        buffers_.emplace_back(zt::Device::host(), n * sizeof(float), zt::MemoryCategory::optimizer_states);
        *array = buffers_.back().as<float>();
      } else {
        torch_blocks_.push_back(torch_cpu_block(n));
        *array = torch_blocks_.back().get();
      }
    }
    zt::bench::for_blocks(n, [&](std::size_t begin, std::size_t end) {
      for (std::size_t i = begin; i < end; ++i) {
        p[i] = 1.0f + 1e-3f * static_cast<float>(i % 7);
        g[i] = 1e-3f * static_cast<float>(i % 17) - 8e-3f;
        m[i] = 0.0f;
        v[i] = 0.0f;
      }
    });
  }
  float *p = nullptr, *g = nullptr, *m = nullptr, *v = nullptr;

 private:
  std::vector<zt::Buffer> buffers_;
  std::vector<TorchBlock> torch_blocks_;
};

/// DeepSpeed's step as ds_adam_step runs it for fp32 tensors whose size is a multiple of the block.
void deepspeed_step(Adam_Optimizer& optimizer, AdamArrays& arrays, std::size_t n, std::size_t step) {
  optimizer.IncrementStep(step, kBeta1, kBeta2);
  optimizer.update_state(kLr, kEps, kWeightDecay, true);
  std::size_t rounded = 0;
  optimizer.Step_AVX<8>(&rounded, arrays.p, arrays.g, arrays.m, arrays.v, n, true);
  if (rounded != n) {
    std::fprintf(stderr, "DeepSpeed Step_AVX<8> covered %zu of %zu elements\n", rounded, n);
    std::exit(1);
  }
}

void zerotrain_step(AdamArrays& arrays, std::size_t n, std::int64_t step) {
  zt::kernels::AdamStepArgs args;
  args.params = arrays.p;
  args.exp_avg = arrays.m;
  args.exp_avg_sq = arrays.v;
  args.grads = arrays.g;
  args.count = n;
  args.lr = kLr;
  args.beta1 = kBeta1;
  args.beta2 = kBeta2;
  args.eps = kEps;
  args.weight_decay = kWeightDecay;
  args.adam_w_mode = true;
  args.step = step;
  zt::kernels::adam_step(zt::default_stream(zt::Device::host()), args);
}

/// Both kernels from the same state, 3 steps: the largest relative difference of the parameters
/// (DeepSpeed fuses multiply-adds, zerotrain does not: they agree to fp32 roundoff, not bitwise).
double max_relative_difference(std::size_t n) {
  AdamArrays ds(n, Allocation::pytorch), zt(n, Allocation::zerotrain);
  Adam_Optimizer optimizer(kLr, kBeta1, kBeta2, kEps, kWeightDecay, true);
  for (int step = 1; step <= 3; ++step) {
    deepspeed_step(optimizer, ds, n, static_cast<std::size_t>(step));
    zerotrain_step(zt, n, step);
  }
  double worst = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    const double a = ds.p[i], b = zt.p[i];
    worst = std::max(worst, std::abs(a - b) / std::max(std::abs(a), 1e-30));
  }
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  using zt::kernels::HostIsa;
  std::size_t params = 16'777'216;
  int reps = 10;
  int threads = 2;
  try {
    zt::bench::parse_flags(argc, argv, kUsage, [&](const std::string& flag, const std::string& value) {
      if (flag == "--params") {
        params = std::stoull(value);
      } else if (flag == "--reps") {
        reps = std::stoi(value);
      } else if (flag == "--threads") {
        threads = std::stoi(value);
      } else {
        return false;
      }
      return true;
    });
  } catch (const std::exception& error) {
    zt::bench::exit_with_usage(error.what(), kUsage);
  }
  if (params == 0 || params % kDeepSpeedBlock != 0 || reps < 1 || threads < 1) {
    zt::bench::exit_with_usage("need --params a positive multiple of " + std::to_string(kDeepSpeedBlock) +
                                   ", --reps >= 1, --threads >= 1",
                               kUsage);
  }
  omp_set_num_threads(threads);

  const double difference = max_relative_difference(1 << 16);
  AdamArrays ds(params, Allocation::pytorch), zt_arrays(params, Allocation::zerotrain);
  zt::bench::AdamwAnchors anchors(params);
  Adam_Optimizer optimizer(kLr, kBeta1, kBeta2, kEps, kWeightDecay, true);
  std::size_t ds_step = 0;
  std::int64_t zt_step = 0;

  std::printf(
      "DeepSpeed cpu_adam (%s, Step_AVX<8>) vs zerotrain host AdamW per ISA path, same process\n"
      "%zu fp32 params, %d threads, median of %d interleaved rounds; CPU supports: %s\n"
      "max relative difference of the parameters after 3 steps (65536 params): %.2e\n"
      "DeepSpeed's arrays: as PyTorch's CPU allocator makes them, THP_MEM_ALLOC_ENABLE=%d (%s); "
      "zerotrain's: zt::Buffers\n%s\n",
      kDeepSpeedPath, params, threads, reps, zt::kernels::supported_host_isas().c_str(), difference,
      torch_thp_enabled() ? 1 : 0, torch_thp_enabled() ? "advised as huge pages" : "no huge-page advice",
      zt::bench::huge_page_state().c_str());
  zt::bench::Rounds rounds;
  const std::string best = zt::kernels::host_isa_name(zt::kernels::best_host_isa());
  rounds.add("triad a=b+s*c (32 B/elem moved)", best, anchors.triad_bytes(), [&] { anchors.triad(); });
  rounds.add("limit: AdamW's traffic, no math", best, anchors.adamw_bytes(), [&] { anchors.limit(); });
  rounds.add("limit + sw prefetch 2 KiB ahead", best, anchors.adamw_bytes(),
             [&] { anchors.limit_prefetched(); });
  const std::size_t ds_row = rounds.add("deepspeed cpu_adam fp32", kDeepSpeedPath, anchors.adamw_bytes(),
                                        [&] { deepspeed_step(optimizer, ds, params, ++ds_step); });
  std::vector<std::pair<HostIsa, std::size_t>> zt_rows;
  for (int i = zt::kernels::kHostIsaCount - 1; i >= 0; --i) {
    const auto path = static_cast<HostIsa>(i);
    if (!zt::kernels::host_isa_supported(path)) continue;
    zt_rows.emplace_back(path, rounds.add("zerotrain adamw fp32", zt::kernels::host_isa_name(path),
                                          anchors.adamw_bytes(), [&, path] {
                                            zt::kernels::set_host_isa(path);
                                            zerotrain_step(zt_arrays, params, ++zt_step);
                                          }));
  }
  rounds.run(reps);
  const auto results = rounds.results();
  std::printf("%-34s %-9s %9s %8s %11s %9s %9s | %7s %9s\n", "kernel", "path", "ms", "GB/s", "time/triad",
              "of limit", "of triad", "cpu ms", "of limit");
  for (const auto& row : results) {
    std::printf("%-34s %-9s %9.2f %8.1f %11.2f %9.2f %9.2f | %7.2f %9.2f\n", row.name.c_str(),
                row.path.c_str(), row.ms, row.gbps, row.triad_ratio, row.limit_fraction,
                row.bandwidth_fraction, row.cpu_ms, row.cpu_limit_fraction);
  }
  for (const auto& [path, row] : zt_rows) {
    std::printf("zerotrain %s vs deepspeed %s: %.2fx faster (median times; CPU times: %.2fx)\n",
                zt::kernels::host_isa_name(path), kDeepSpeedPath, results[ds_row].ms / results[row].ms,
                results[ds_row].cpu_ms / results[row].cpu_ms);
  }
  return std::isfinite(ds.p[params / 2]) && std::isfinite(zt_arrays.p[params / 2]) ? 0 : 1;
}
