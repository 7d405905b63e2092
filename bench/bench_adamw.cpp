// Host AdamW on each ISA path (kernels/host_isa.hpp) side by side, against a STREAM triad and AdamW's
// bytes-moved limit measured in the same process (bench/adamw_anchor.hpp).
//
// AdamW in fp32 reads p, g, m, v and writes p, m, v: 28 bytes per parameter, so its ceiling is the
// memory bandwidth. A 16-bit copy adds 4 bytes moved per parameter: the 2 written and the 2 of the
// write-allocate read of its lines (they are written, never read). Every kernel runs once per round (after
// one untimed call of itself), all kernels in each round, `reps` rounds: the anchors and every path see the
// same machine load. Printed per kernel: the median time, GB/s (bytes moved), the time as a ratio to the
// triad's (the figure that travels between machines), the fraction of the limit (limit time / kernel time)
// and of the triad's bandwidth; then the CPU time per thread and the fraction of the limit by CPU times
// (bench/adamw_anchor.hpp: the figures to read when the machine has more runnable threads than cores).
//
//   zt_bench_adamw [--params N] [--reps R] [--threads 2] [--isa avx512,avx2,baseline]
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/adamw_anchor.hpp"
#include "bench/bench_helpers.hpp"
#include "kernels/host_isa.hpp"
#include "kernels/optimizer_kernels.hpp"
#include "zerotrain/device.hpp"
#include "zerotrain/error.hpp"

namespace {

constexpr const char* kUsage =
    "usage: zt_bench_adamw [--params N] [--reps R] [--threads T1,T2,...] [--isa avx512,avx2,baseline]\n"
    "  defaults: 16777216 params, 10 rounds, 2 threads, every ISA path this CPU supports";

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::size_t begin = 0;
  while (begin <= text.size()) {
    const std::size_t comma = text.find(',', begin);
    const std::size_t end = comma == std::string::npos ? text.size() : comma;
    if (end > begin) out.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  using zt::kernels::HostIsa;
  std::size_t params = 16'777'216;  // 16.8M fp32 parameters: 256 MiB of p, g, m, v
  int reps = 10;
  std::vector<int> thread_counts = {2};
  std::vector<HostIsa> paths;
  try {
    zt::bench::parse_flags(argc, argv, kUsage, [&](const std::string& flag, const std::string& value) {
      if (flag == "--params") {
        params = std::stoull(value);
      } else if (flag == "--reps") {
        reps = std::stoi(value);
      } else if (flag == "--threads") {
        thread_counts.clear();
        for (const std::string& item : split(value)) thread_counts.push_back(std::stoi(item));
      } else if (flag == "--isa") {
        for (const std::string& item : split(value))
          paths.push_back(zt::kernels::parse_host_isa(item, "--isa"));
      } else {
        return false;
      }
      return true;
    });
  } catch (const std::exception& error) {
    zt::bench::exit_with_usage(error.what(), kUsage);
  }
  if (paths.empty()) {
    for (int i = zt::kernels::kHostIsaCount - 1; i >= 0; --i) {
      if (zt::kernels::host_isa_supported(static_cast<HostIsa>(i))) paths.push_back(static_cast<HostIsa>(i));
    }
  }
  for (HostIsa path : paths) {
    if (!zt::kernels::host_isa_supported(path)) {
      zt::bench::exit_with_usage(std::string("--isa ") + zt::kernels::host_isa_name(path) +
                                     ": this CPU supports " + zt::kernels::supported_host_isas(),
                                 kUsage);
    }
  }
  if (params == 0 || reps < 1 || thread_counts.empty()) {
    zt::bench::exit_with_usage("need --params > 0, --reps >= 1 and at least one thread count", kUsage);
  }

  const zt::Device host = zt::Device::host();
  const std::size_t bytes32 = params * sizeof(float);
  zt::Buffer p(host, bytes32, zt::MemoryCategory::parameters);
  zt::Buffer g(host, bytes32, zt::MemoryCategory::gradients);
  zt::Buffer m(host, bytes32, zt::MemoryCategory::optimizer_states);
  zt::Buffer v(host, bytes32, zt::MemoryCategory::optimizer_states);
  zt::Buffer p16(host, params * 2, zt::MemoryCategory::parameters);
  {  // first touch in parallel, with the kernels' static block schedule
    float* pp = p.as<float>();
    float* gg = g.as<float>();
    float* mm = m.as<float>();
    float* vv = v.as<float>();
    zt::bench::for_blocks(params, [&](std::size_t begin, std::size_t end) {
      for (std::size_t i = begin; i < end; ++i) {
        pp[i] = 1.0f;
        gg[i] = 1e-3f * static_cast<float>(i % 17) - 8e-3f;
        mm[i] = 0.0f;
        vv[i] = 0.0f;
      }
    });
  }
  zt::bench::AdamwAnchors anchors(params);

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
  const auto adamw = [&](HostIsa path, void* copy, zt::DType copy_dtype) {
    return [&, path, copy, copy_dtype] {
      zt::kernels::set_host_isa(path);
      args.params_16bit = copy;
      args.params_16bit_dtype = copy_dtype;
      args.step = ++step;
      zt::kernels::adam_step(zt::default_stream(host), args);
    };
  };
  volatile double sink = 0.0;

  std::string path_list;
  for (HostIsa path : paths)
    path_list += std::string(path_list.empty() ? "" : ", ") + zt::kernels::host_isa_name(path);
  std::printf(
      "AdamW (host, fused, fp32) per ISA path vs a STREAM triad and AdamW's bytes-moved limit, same process\n"
      "%zu params (%.0f MiB of p,g,m,v); triad %zu doubles x 3 (%.0f MiB); median of %d interleaved rounds\n"
      "CPU supports: %s; default path: %s; paths run: %s\n%s\n",
      params, 4.0 * static_cast<double>(bytes32) / (1 << 20), anchors.triad_elements(),
      3.0 * static_cast<double>(anchors.triad_elements() * sizeof(double)) / (1 << 20), reps,
      zt::kernels::supported_host_isas().c_str(), zt::kernels::host_isa_name(zt::kernels::host_isa()),
      path_list.c_str(), zt::bench::huge_page_state().c_str());
  std::printf("%-7s %-34s %-9s %9s %8s %11s %9s %9s | %7s %9s\n", "threads", "kernel", "path", "ms", "GB/s",
              "time/triad", "of limit", "of triad", "cpu ms", "of limit");
  const HostIsa default_path = zt::kernels::host_isa();
  for (int threads : thread_counts) {
    omp_set_num_threads(threads);
    zt::bench::Rounds rounds;
    const std::string best = zt::kernels::host_isa_name(zt::kernels::best_host_isa());
    rounds.add("triad a=b+s*c (32 B/elem moved)", best, anchors.triad_bytes(), [&] { anchors.triad(); });
    rounds.add("limit: AdamW's traffic, no math", best, anchors.adamw_bytes(), [&] { anchors.limit(); });
    rounds.add("limit + sw prefetch 2 KiB ahead", best, anchors.adamw_bytes(),
               [&] { anchors.limit_prefetched(); });
    std::vector<std::size_t> fp32_rows;
    for (HostIsa path : paths) {
      const std::string name = zt::kernels::host_isa_name(path);
      fp32_rows.push_back(rounds.add("adamw fp32 (28 B/param)", name, 28.0 * static_cast<double>(params),
                                     adamw(path, nullptr, zt::DType::bf16)));
      rounds.add("adamw + bf16 copy (32 B/param)", name, 32.0 * static_cast<double>(params),
                 adamw(path, p16.data(), zt::DType::bf16));
      rounds.add("adamw + fp16 copy (32 B/param)", name, 32.0 * static_cast<double>(params),
                 adamw(path, p16.data(), zt::DType::fp16));
      rounds.add("grad sum of squares (4 B/param)", name, 4.0 * static_cast<double>(params), [&, path] {
        zt::kernels::set_host_isa(path);
        sink =
            sink +
            zt::kernels::grad_sum_squares(zt::default_stream(host), g.data(), zt::DType::fp32, params).sum_sq;
      });
    }
    rounds.run(reps);
    const auto results = rounds.results();
    for (const auto& row : results) {
      std::printf("%-7d %-34s %-9s %9.2f %8.1f %11.2f %9.2f %9.2f | %7.2f %9.2f\n", threads, row.name.c_str(),
                  row.path.c_str(), row.ms, row.gbps, row.triad_ratio, row.limit_fraction,
                  row.bandwidth_fraction, row.cpu_ms, row.cpu_limit_fraction);
    }
    // Speed-up of each path's fp32 AdamW over the baseline path's, when both ran.
    for (std::size_t i = 0; i < paths.size(); ++i) {
      if (paths[i] == HostIsa::baseline) {
        for (std::size_t j = 0; j < paths.size(); ++j) {
          if (j == i) continue;
          std::printf("%-7d adamw fp32 %s / baseline: %.2fx faster (median times; CPU times: %.2fx)\n",
                      threads, zt::kernels::host_isa_name(paths[j]),
                      results[fp32_rows[i]].ms / results[fp32_rows[j]].ms,
                      results[fp32_rows[i]].cpu_ms / results[fp32_rows[j]].cpu_ms);
        }
      }
    }
  }
  zt::kernels::set_host_isa(default_path);
  // Keep the result observable so nothing is optimized away.
  return std::isfinite(p.as<float>()[params / 2]) ? 0 : 1;
}
