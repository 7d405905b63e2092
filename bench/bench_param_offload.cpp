// A ZeRO-3 training step with the parameters on NVMe (offload_param "nvme", max_in_cpu 0) against
// the parameters in memory, at the GPT shapes of zt_bench_gpt_step, in one process and one run
// (docs/offload.md, "Parameters on NVMe").
//
// Each round builds one engine per placement (stage 3, one rank, fp32 AdamW) and times whole steps:
// forward, backward and optimizer step on one micro-batch of --tokens tokens (default 128, or the
// shape's sequence length when shorter). With the parameters
// on NVMe every piece is read when gathered (the defaults keep a gathered parameter from its forward
// to its backward: stage3_max_reuse_distance) and written by the update; reads of the pieces after
// the stage3_prefetch_bucket_size window run ahead of the gathers, as far as buffer_count allows. Placements:
// memory; nvme with DeepSpeed's 5 buffers; nvme with 1 buffer (no read-ahead); nvme for the parameters and
// the optimizer states together (ZeRO-Infinity). The order rotates each round; medians over all rounds'
// steps, with their ratio to memory, the parameter bytes moved per step and the time the step was blocked on
// them.
//
//   zt_bench_param_offload [--shape small|gpt2] [--tokens N] [--rounds N] [--steps N] [--dir PATH]
//                          [--threads N]
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
#include "zerotrain/swap.hpp"

namespace {

using Shape = zt::bench::GptBenchShape;

struct Options {
  Shape shape = zt::bench::kGpt2;
  long long tokens = 0;  // 0: min(128, the shape's seq_len)
  int rounds = 2;
  int steps = 2;
  std::string dir = std::filesystem::temp_directory_path().string();
  int threads = 0;
};

constexpr const char* kUsage =
    "usage: zt_bench_param_offload [--shape small|gpt2] [--tokens N] [--rounds N] [--steps N] [--dir PATH] "
    "[--threads N]";

Options parse_options(int argc, char** argv) {
  Options options;
  zt::bench::parse_flags(argc, argv, kUsage, [&](const std::string& flag, const std::string& value) {
    if (flag == "--shape") {
      if (value != "small" && value != "gpt2")
        zt::bench::exit_with_usage("--shape takes small or gpt2", kUsage);
      options.shape = value == "small" ? zt::bench::kSmallGpt : zt::bench::kGpt2;
    } else if (flag == "--tokens") {
      options.tokens = std::max(1LL, std::atoll(value.c_str()));
    } else if (flag == "--rounds") {
      options.rounds = std::max(1, std::atoi(value.c_str()));
    } else if (flag == "--steps") {
      options.steps = std::max(1, std::atoi(value.c_str()));
    } else if (flag == "--dir") {
      options.dir = value;
    } else if (flag == "--threads") {
      options.threads = std::atoi(value.c_str());
    } else {
      return false;
    }
    return true;
  });
  if (options.tokens == 0) options.tokens = std::min<long long>(128, options.shape.seq_len);
  if (options.tokens > options.shape.seq_len)
    zt::bench::exit_with_usage("--tokens exceeds the shape's seq_len", kUsage);
  return options;
}

struct Placement {
  std::string name;
  std::string offload;  // offload sections, or empty
};

std::string config_json(const Shape& shape, const Placement& placement) {
  return R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
    "optimizer": )" +
         std::string(zt::bench::kBenchAdamW) +
         R"(, "zero_optimization": {"stage": 3, "sub_group_size": 10000000)" +
         (placement.offload.empty() ? "" : ", " + placement.offload) + R"(}, "model": )" +
         zt::bench::gpt_model_json(shape) + R"(, "seed": 1234})";
}

struct Samples {
  std::vector<double> step_ms, wait_ms, read_mb, written_mb;
  std::string where;
  std::int64_t parameters = 0;
  double host_mb = 0;  // host memory holding the parameter pieces: kept pieces + buffers
};

}  // namespace

int main(int argc, char** argv) {
  // Options first: a bad flag exits, which must happen before MPI is up.
  const Options options = parse_options(argc, argv);
  zt::Runtime runtime(&argc, &argv);
  return zt::run_and_report([&] {
    ZT_CHECK(runtime.world_size() == 1, "zt_bench_param_offload is a single-process benchmark (got ",
             runtime.world_size(), " ranks)");
    const std::string params = R"("offload_param": {"device": "nvme", "nvme_path": ")" + options.dir +
                               R"(", "max_in_cpu": 0, "buffer_count": )";
    const std::vector<Placement> placements = {
        {"memory", ""},
        {"nvme", params + "5}"},
        {"nvme-1buf", params + "1}"},
        {"infinity", params + R"(5}, "offload_optimizer": {"device": "nvme", "nvme_path": ")" + options.dir +
                         R"(", "buffer_count": 4})"},
    };
    const zt::Batch batch = zt::bench::token_batch(options.shape, options.tokens);
    std::vector<Samples> samples(placements.size());
    for (int round = 0; round < options.rounds; ++round) {
      for (std::size_t k = 0; k < placements.size(); ++k) {
        const std::size_t p = (k + static_cast<std::size_t>(round)) % placements.size();  // rotate the order
        const zt::Config config = zt::Config::from_string(config_json(options.shape, placements[p]),
                                                          zt::ConfigParseOptions{.warning_sink = {}});
        auto model = zt::build_model(config);
        zt::Engine engine(runtime, *model, config);
        if (options.threads > 0) zt::kernels::set_host_threads(options.threads);
        samples[p].where = engine.parameters_placement().describe();
        samples[p].parameters = engine.parameter_count();
        const zt::ParametersPlacement placement = engine.parameters_placement();
        samples[p].host_mb = static_cast<double>(placement.host_elements * 4 + placement.buffer_bytes) / 1e6;
        for (int step = 0; step < options.steps + 2; ++step) {  // the first two record the trace, warm up
          const auto start = std::chrono::steady_clock::now();
          engine.forward(batch);
          engine.backward();
          engine.step();
          const double ms =
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
          if (step < 2) continue;
          const zt::OffloadTiming& offload = engine.last_step().offload;
          samples[p].step_ms.push_back(ms);
          samples[p].wait_ms.push_back(offload.parameter_wait_seconds * 1e3);
          samples[p].read_mb.push_back(static_cast<double>(offload.parameter_bytes_read) / 1e6);
          samples[p].written_mb.push_back(static_cast<double>(offload.parameter_bytes_written) / 1e6);
        }
      }
    }
    std::printf(
        "GPT %s: %lld parameters, ZeRO stage 3, 1 rank, fp32 AdamW, %lld tokens per step, %d OpenMP "
        "threads, nvme_path %s (%s)\n",
        options.shape.name.c_str(), static_cast<long long>(samples[0].parameters), options.tokens,
        zt::kernels::host_threads(), options.dir.c_str(), zt::file_system_name(options.dir).c_str());
    std::printf("%d rounds x %d timed steps per placement; medians\n\n", options.rounds, options.steps);
    std::printf(
        "| placement | step ms | vs memory | parameter MB read | MB written | blocked on them ms | "
        "MB/s over the step | host MB for parameters |\n");
    std::printf("|---|---|---|---|---|---|---|---|\n");
    const double base = zt::bench::median(samples[0].step_ms);
    for (std::size_t p = 0; p < placements.size(); ++p) {
      const double step = zt::bench::median(samples[p].step_ms);
      const double moved = zt::bench::median(samples[p].read_mb) + zt::bench::median(samples[p].written_mb);
      std::printf("| %s | %.0f | %.2f | %.0f | %.0f | %.0f | %.0f | %.0f |\n", placements[p].name.c_str(),
                  step, step / base, zt::bench::median(samples[p].read_mb),
                  zt::bench::median(samples[p].written_mb), zt::bench::median(samples[p].wait_ms),
                  moved / (step / 1e3), samples[p].host_mb);
    }
    std::printf("\n");
    for (std::size_t p = 0; p < placements.size(); ++p)
      std::printf("%s: %s\n", placements[p].name.c_str(), samples[p].where.c_str());
    return 0;
  });
}
