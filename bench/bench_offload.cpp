// Optimizer step time with offload_optimizer "cpu" and "nvme" against the in-memory optimizer, at
// the GPT shapes of zt_bench_gpt_step, in one process and one run (docs/offload.md, "Benchmark").
//
// Each round builds one engine per placement (ZeRO stage 1, one rank, fp32 AdamW), and times the
// boundary engine.step() — gradient norm, optimizer update (with NVMe: the sub-group pipeline of
// reads, updates and writes), zeroing the gradients — after an untimed forward/backward on a short
// sequence (the optimizer's work depends on the parameter count only). Placements alternate within
// each round, in an order rotated by one each round; medians over all rounds' steps are reported
// with their ratio to in-memory.
//
//   zt_bench_offload [--shape small|gpt2] [--rounds N] [--steps N] [--dir PATH] [--sub-group N]
//                    [--buffers N] [--threads N] [--device host|emulated]
//
// --device emulated puts the engine on the emulated test device: its offloaded updates (cpu and
// nvme) bring the gradients down and the parameters up through DeviceOffloadedUpdate's staging
// buffers, the device code path of an engine on a GPU (docs/offload.md).
// --dir is the nvme_path (default: the temporary directory; it must support O_DIRECT). --sub-group
// (default 1e7 elements) and --buffers (default 4, DeepSpeed's buffer_count) set the pipeline; the
// nvme placement is also run with 1 buffer (reads, updates and writes in turn) to show the overlap.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "bench/bench_helpers.hpp"
#include "bench/gpt_bench_shapes.hpp"
#include "kernels/optimizer_kernels.hpp"
#include "zerotrain/engine.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/runtime.hpp"

namespace {

using Shape = zt::bench::GptBenchShape;
const Shape& kSmall = zt::bench::kSmallGpt;
const Shape& kGpt2 = zt::bench::kGpt2;

struct Options {
  Shape shape = kGpt2;
  int rounds = 3;
  int steps = 3;
  std::string dir = std::filesystem::temp_directory_path().string();
  long long sub_group = 10'000'000;
  int buffers = 4;
  int threads = 0;
  zt::Device device = zt::Device::host();
};

constexpr const char* kUsage =
    "usage: zt_bench_offload [--shape small|gpt2] [--rounds N] [--steps N] [--dir PATH] [--sub-group N] "
    "[--buffers N] [--threads N] [--device host|emulated]";

Options parse_options(int argc, char** argv) {
  Options options;
  zt::bench::parse_flags(argc, argv, kUsage, [&](const std::string& flag, const std::string& value) {
    if (flag == "--shape") {
      if (value != "small" && value != "gpt2")
        zt::bench::exit_with_usage("--shape takes small or gpt2", kUsage);
      options.shape = value == "small" ? kSmall : kGpt2;
    } else if (flag == "--rounds") {
      options.rounds = std::max(1, std::atoi(value.c_str()));
    } else if (flag == "--steps") {
      options.steps = std::max(1, std::atoi(value.c_str()));
    } else if (flag == "--dir") {
      options.dir = value;
    } else if (flag == "--sub-group") {
      options.sub_group = std::max(1LL, std::atoll(value.c_str()));
    } else if (flag == "--buffers") {
      options.buffers = std::max(1, std::atoi(value.c_str()));
    } else if (flag == "--threads") {
      options.threads = std::atoi(value.c_str());
    } else if (flag == "--device") {
      if (value != "host" && value != "emulated")
        zt::bench::exit_with_usage("--device takes host or emulated", kUsage);
      options.device = value == "host" ? zt::Device::host() : zt::Device::emulated();
    } else {
      return false;
    }
    return true;
  });
  return options;
}

struct Placement {
  std::string name;
  std::string offload;  // the offload_optimizer entry, or empty
};

std::string config_json(const Shape& shape, const Placement& placement, long long sub_group) {
  return R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
    "optimizer": )" +
         std::string(zt::bench::kBenchAdamW) + R"(, "zero_optimization": {"stage": 1, "sub_group_size": )" +
         std::to_string(sub_group) + (placement.offload.empty() ? "" : ", " + placement.offload) +
         R"(}, "model": )" + zt::bench::gpt_model_json(shape) + R"(, "seed": 1234})";
}

struct Samples {
  std::vector<double> step_ms, wall_ms, update_ms, stalled_ms;
  std::string where;
  std::int64_t parameters = 0;
};

}  // namespace

int main(int argc, char** argv) {
  // Options first: a bad flag exits, which must happen before MPI is up.
  const Options options = parse_options(argc, argv);
  zt::Runtime runtime(&argc, &argv);
  return zt::run_and_report([&] {
    ZT_CHECK(runtime.world_size() == 1, "zt_bench_offload is a single-process benchmark (got ",
             runtime.world_size(), " ranks)");
    const std::string nvme =
        R"("offload_optimizer": {"device": "nvme", "nvme_path": ")" + options.dir + R"(", "buffer_count": )";
    const std::vector<Placement> placements = {
        {"memory", ""},
        {"cpu", R"("offload_optimizer": {"device": "cpu"})"},
        {"nvme", nvme + std::to_string(options.buffers) + "}"},
        {"nvme-1buf", nvme + "1}"},
    };
    const zt::Batch batch = zt::bench::token_batch(options.shape, 16);
    std::vector<Samples> samples(placements.size());
    for (int round = 0; round < options.rounds; ++round) {
      for (std::size_t k = 0; k < placements.size(); ++k) {
        const std::size_t p = (k + static_cast<std::size_t>(round)) % placements.size();  // rotate the order
        const zt::Config config =
            zt::Config::from_string(config_json(options.shape, placements[p], options.sub_group),
                                    zt::ConfigParseOptions{.warning_sink = {}});
        auto model = zt::build_model(config);
        zt::Engine engine(runtime, *model, config, {.device = options.device});
        if (options.threads > 0) zt::kernels::set_host_threads(options.threads);
        samples[p].where = engine.optimizer_states_placement().describe();
        samples[p].parameters = engine.parameter_count();
        for (int step = 0; step < options.steps + 1; ++step) {  // the first is a warmup
          engine.forward(batch);
          engine.backward();
          const auto start = std::chrono::steady_clock::now();
          engine.step();
          const double ms =
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
          if (step == 0) continue;
          const zt::OffloadTiming& offload = engine.last_step().offload;
          samples[p].step_ms.push_back(ms);
          samples[p].wall_ms.push_back(offload.wall_seconds * 1e3);
          samples[p].update_ms.push_back(offload.update_seconds * 1e3);
          samples[p].stalled_ms.push_back(offload.stalled_seconds * 1e3);
        }
      }
    }
    std::printf(
        "GPT %s: %lld parameters, ZeRO stage 1, 1 rank on %s, fp32 AdamW, %d OpenMP threads, sub_group_size "
        "%lld\n",
        options.shape.name.c_str(), static_cast<long long>(samples[0].parameters),
        options.device.str().c_str(), zt::kernels::host_threads(), options.sub_group);
    std::printf("%d rounds x %d timed steps per placement; medians in ms\n\n", options.rounds, options.steps);
    std::printf("| placement | optimizer step | vs memory | pipeline wall | updates | stalled on I/O |\n");
    std::printf("|---|---|---|---|---|---|\n");
    const double base = zt::bench::median(samples[0].step_ms);
    for (std::size_t p = 0; p < placements.size(); ++p) {
      const double step = zt::bench::median(samples[p].step_ms);
      if (placements[p].name.starts_with("nvme")) {
        std::printf("| %s | %.1f | %.2f | %.1f | %.1f | %.1f |\n", placements[p].name.c_str(), step,
                    step / base, zt::bench::median(samples[p].wall_ms),
                    zt::bench::median(samples[p].update_ms), zt::bench::median(samples[p].stalled_ms));
      } else {
        std::printf("| %s | %.1f | %.2f | | | |\n", placements[p].name.c_str(), step, step / base);
      }
    }
    std::printf("\n");
    for (std::size_t p = 0; p < placements.size(); ++p)
      std::printf("%s: %s\n", placements[p].name.c_str(), samples[p].where.c_str());
    return 0;
  });
}
