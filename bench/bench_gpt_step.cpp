// Single-process GPT training step time: forward + backward + AdamW step through zt::Engine.
//
// The anchor is the same model in PyTorch (bench/pytorch_gpt_step.py); bench/run_gpt_vs_pytorch.sh
// runs both interleaved and prints the ratio. This program times zerotrain alone: it builds a GPT with
// zt::build_model from an in-code config (fp32, AdamW lr 6e-4, betas 0.9/0.95, eps 1e-8, weight decay
// 0.1, no clipping, no dropout, no scheduler), then runs `warmup` untimed and `steps` timed optimizer
// steps on a fixed batch, and reports median and best ms/step and tokens/s, and the time to build the
// model (its weights' fill_normal) and the engine.
//
//   zt_bench_gpt_step [--shape small|gpt2|both] [--steps N] [--warmup N] [--threads N] [--json PATH]
//                     [--precision fp32|bf16] [--bf16-gemm auto|fp32|bf16|compare]
//
// --precision bf16 trains in bf16 (fp32 master weights, "bf16": {"enabled": true}). --bf16-gemm picks
// the path of the bf16 GEMMs (kernels/host_gemm.hpp; auto: as ZT_BF16_GEMM or the CPU decides);
// compare times both paths on the same engine in the same run, interleaved step by step (fp32, bf16,
// fp32, ...; `warmup` untimed steps of each first), and prints the fp32-widening / bf16 ratio.
//
// Shapes: small = 4 layers, 4 heads, d_model 128, seq_len 64, vocab 512, micro-batch 4;
//         gpt2  = GPT-2 124M (12, 12, 768, 1024, 50257), micro-batch 1.
// --steps/--warmup default to 20/3 for small and 3/2 for gpt2. --threads defaults to
// OMP_NUM_THREADS or all cores. One process: run it without mpirun or with mpirun -n 1.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <sys/resource.h>

#include <nlohmann/json.hpp>

#include "bench/bench_helpers.hpp"
#include "bench/gpt_bench_shapes.hpp"
#include "kernels/host_gemm.hpp"
#include "kernels/optimizer_kernels.hpp"
#include "zerotrain/engine.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/runtime.hpp"

namespace {

struct Shape : zt::bench::GptBenchShape {
  int micro_batch;
  int default_steps, default_warmup;
};

const Shape kSmall{zt::bench::kSmallGpt, 4, 20, 3};
const Shape kGpt2{zt::bench::kGpt2, 1, 3, 2};

struct Options {
  std::string shape = "both";
  std::optional<int> steps, warmup;
  int threads = 0;
  std::string json_path;
  std::string precision = "fp32";
  std::string bf16_gemm = "auto";
};

constexpr const char* kUsage =
    "usage: zt_bench_gpt_step [--shape small|gpt2|both] [--steps N] [--warmup N] [--threads N] [--json PATH] "
    "[--precision fp32|bf16] [--bf16-gemm auto|fp32|bf16|compare]";

Options parse_options(int argc, char** argv) {
  Options options;
  zt::bench::parse_flags(argc, argv, kUsage, [&](const std::string& flag, const std::string& value) {
    if (flag == "--shape") {
      options.shape = value;
      if (value != "small" && value != "gpt2" && value != "both")
        zt::bench::exit_with_usage("--shape takes small, gpt2 or both", kUsage);
    } else if (flag == "--steps") {
      options.steps = std::atoi(value.c_str());
    } else if (flag == "--warmup") {
      options.warmup = std::atoi(value.c_str());
    } else if (flag == "--threads") {
      options.threads = std::atoi(value.c_str());
    } else if (flag == "--json") {
      options.json_path = value;
    } else if (flag == "--precision") {
      options.precision = value;
      if (value != "fp32" && value != "bf16")
        zt::bench::exit_with_usage("--precision takes fp32 or bf16", kUsage);
    } else if (flag == "--bf16-gemm") {
      options.bf16_gemm = value;
      if (value != "auto" && value != "fp32" && value != "bf16" && value != "compare")
        zt::bench::exit_with_usage("--bf16-gemm takes auto, fp32, bf16 or compare", kUsage);
    } else {
      return false;
    }
    return true;
  });
  if (options.steps && *options.steps < 1) zt::bench::exit_with_usage("--steps must be at least 1", kUsage);
  if (options.warmup && *options.warmup < 0)
    zt::bench::exit_with_usage("--warmup must be at least 0", kUsage);
  if (options.bf16_gemm == "compare" && options.precision != "bf16")
    zt::bench::exit_with_usage("--bf16-gemm compare needs --precision bf16", kUsage);
  return options;
}

std::string config_json(const Shape& shape, const std::string& precision) {
  return R"({"train_micro_batch_size_per_gpu": )" + std::to_string(shape.micro_batch) +
         (precision == "bf16" ? R"(, "bf16": {"enabled": true})" : "") +
         R"(, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0, "optimizer": )" +
         zt::bench::kBenchAdamW + R"(, "model": )" + zt::bench::gpt_model_json(shape) + R"(, "seed": 1234})";
}

/// Fixed tokens: a simple LCG, so the batch is the same on every run (and in the PyTorch script).
zt::Batch fixed_batch(const Shape& shape) {
  const std::int64_t B = shape.micro_batch, T = shape.seq_len;
  std::vector<std::int32_t> stream(static_cast<std::size_t>(B * T + 1));
  std::uint64_t state = 12345;
  for (auto& token : stream) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    token = static_cast<std::int32_t>((state >> 33) % static_cast<std::uint64_t>(shape.vocab));
  }
  std::vector<std::int32_t> inputs(stream.begin(), stream.end() - 1);
  std::vector<std::int32_t> targets(stream.begin() + 1, stream.end());
  return {zt::Tensor::from_vector(inputs, {B, T}), zt::Tensor::from_vector(targets, {B, T})};
}

long minor_page_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

struct Result {
  std::string shape, precision, bf16_gemm;
  int threads = 0, steps = 0, warmup = 0;
  std::int64_t parameters = 0, tokens_per_step = 0;
  double median_ms = 0, best_ms = 0, first_loss = 0, last_loss = 0, page_faults_per_step = 0;
  double model_init_ms = 0, engine_init_ms = 0;  // build_model (the weights' fill_normal) and initialize
  std::vector<double> step_ms;
};

void summarize(Result& result) {
  std::vector<double> sorted = result.step_ms;
  std::sort(sorted.begin(), sorted.end());
  result.best_ms = sorted.front();
  result.median_ms = sorted.size() % 2 == 1
                         ? sorted[sorted.size() / 2]
                         : 0.5 * (sorted[sorted.size() / 2 - 1] + sorted[sorted.size() / 2]);
}

/// The bf16 GEMM paths to time: both for --bf16-gemm compare (fp32 first), else the one in use.
std::vector<zt::kernels::Bf16GemmPath> bf16_gemm_paths(const Options& options) {
  using zt::kernels::Bf16GemmPath;
  if (options.bf16_gemm == "compare") return {Bf16GemmPath::fp32, Bf16GemmPath::bf16};
  if (options.bf16_gemm == "fp32") return {Bf16GemmPath::fp32};
  if (options.bf16_gemm == "bf16") return {Bf16GemmPath::bf16};
  return {zt::kernels::bf16_gemm_path()};
}

std::vector<Result> run_shape(zt::Runtime& runtime, const Shape& shape, const Options& options, int threads) {
  const zt::Config config = zt::Config::from_string(config_json(shape, options.precision),
                                                    zt::ConfigParseOptions{.warning_sink = {}});
  const auto model_start = std::chrono::steady_clock::now();
  auto model = zt::build_model(config);
  const auto engine_start = std::chrono::steady_clock::now();
  auto engine = zt::initialize(runtime, *model, config);
  const auto engine_end = std::chrono::steady_clock::now();
  zt::kernels::set_host_threads(threads);  // after the engine, which sets a default of its own
  const zt::Batch batch = fixed_batch(shape);

  const std::vector<zt::kernels::Bf16GemmPath> paths = bf16_gemm_paths(options);
  std::vector<Result> results(paths.size());
  for (std::size_t p = 0; p < paths.size(); ++p) {
    Result& result = results[p];
    result.shape = shape.name;
    result.precision = options.precision;
    result.bf16_gemm = zt::kernels::bf16_gemm_path_name(paths[p]);
    result.threads = threads;
    result.steps = options.steps.value_or(shape.default_steps);
    result.warmup = options.warmup.value_or(shape.default_warmup);
    result.parameters = engine->parameter_count();
    result.tokens_per_step = static_cast<std::int64_t>(shape.micro_batch) * shape.seq_len;
    result.model_init_ms = std::chrono::duration<double, std::milli>(engine_start - model_start).count();
    result.engine_init_ms = std::chrono::duration<double, std::milli>(engine_end - engine_start).count();
  }

  auto one_step = [&] {
    const double loss = engine->forward(batch);
    engine->backward();
    engine->step();
    return loss;
  };
  for (std::size_t p = 0; p < paths.size(); ++p) {
    zt::kernels::set_bf16_gemm_path(paths[p]);
    for (int i = 0; i < results[p].warmup; ++i) {
      const double loss = one_step();
      if (i == 0) results[p].first_loss = loss;
    }
  }
  std::vector<long> faults(paths.size(), 0);
  // Interleaved: step i of every path before step i + 1 of any, so that a change of machine load
  // reaches all paths alike.
  for (int i = 0; i < results.front().steps; ++i) {
    for (std::size_t p = 0; p < paths.size(); ++p) {
      Result& result = results[p];
      zt::kernels::set_bf16_gemm_path(paths[p]);
      const long faults_before = minor_page_faults();
      const auto start = std::chrono::steady_clock::now();
      const double loss = one_step();
      const std::chrono::duration<double, std::milli> elapsed = std::chrono::steady_clock::now() - start;
      faults[p] += minor_page_faults() - faults_before;
      result.step_ms.push_back(elapsed.count());
      if (result.warmup == 0 && i == 0) result.first_loss = loss;
      result.last_loss = loss;
    }
  }
  for (std::size_t p = 0; p < paths.size(); ++p) {
    results[p].page_faults_per_step = static_cast<double>(faults[p]) / results[p].steps;
    summarize(results[p]);
  }
  return results;
}

}  // namespace

int main(int argc, char** argv) {
  // Options first: a bad flag exits, which must happen before MPI is up.
  const Options options = parse_options(argc, argv);
  zt::Runtime runtime(&argc, &argv);
  return zt::run_and_report([&] {
    ZT_CHECK(runtime.world_size() == 1, "zt_bench_gpt_step is a single-process benchmark; run it with ",
             "mpirun -n 1 or without mpirun (got ", runtime.world_size(), " ranks)");
    int threads = options.threads;
    if (threads <= 0) {
      const char* env = std::getenv("OMP_NUM_THREADS");
      threads = env != nullptr ? std::atoi(env) : 0;
      if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    }
    std::vector<Shape> shapes;
    if (options.shape == "small" || options.shape == "both") shapes.push_back(kSmall);
    if (options.shape == "gpt2" || options.shape == "both") shapes.push_back(kGpt2);

    nlohmann::json results = nlohmann::json::array();
    for (const Shape& shape : shapes) {
      const std::vector<Result> shape_results = run_shape(runtime, shape, options, threads);
      for (const Result& r : shape_results) {
        const double tokens_per_second = static_cast<double>(r.tokens_per_step) / (r.median_ms / 1000.0);
        std::printf(
            "zerotrain %-5s %s (bf16 GEMM %s) threads %d  params %lld  tokens/step %lld  steps %d (warmup "
            "%d)  "
            "median %.2f ms  best %.2f ms  %.0f tokens/s  loss %.4f -> %.4f  page faults/step %.0f  "
            "init: model %.0f ms, engine %.0f ms\n",
            r.shape.c_str(), r.precision.c_str(), r.precision == "bf16" ? r.bf16_gemm.c_str() : "unused",
            r.threads, static_cast<long long>(r.parameters), static_cast<long long>(r.tokens_per_step),
            r.steps, r.warmup, r.median_ms, r.best_ms, tokens_per_second, r.first_loss, r.last_loss,
            r.page_faults_per_step, r.model_init_ms, r.engine_init_ms);
        std::fflush(stdout);
        results.push_back({{"framework", "zerotrain"},
                           {"shape", r.shape},
                           {"precision", r.precision},
                           {"bf16_gemm", r.bf16_gemm},
                           {"threads", r.threads},
                           {"parameters", r.parameters},
                           {"tokens_per_step", r.tokens_per_step},
                           {"steps", r.steps},
                           {"warmup", r.warmup},
                           {"median_ms", r.median_ms},
                           {"best_ms", r.best_ms},
                           {"tokens_per_s", tokens_per_second},
                           {"first_loss", r.first_loss},
                           {"last_loss", r.last_loss},
                           {"page_faults_per_step", r.page_faults_per_step},
                           {"model_init_ms", r.model_init_ms},
                           {"engine_init_ms", r.engine_init_ms},
                           {"step_ms", r.step_ms}});
      }
      if (shape_results.size() == 2) {
        std::printf("zerotrain %-5s bf16 step, fp32-widening GEMM / bf16 GEMM: median %.2fx, best %.2fx\n",
                    shape.name.c_str(), shape_results[0].median_ms / shape_results[1].median_ms,
                    shape_results[0].best_ms / shape_results[1].best_ms);
        std::fflush(stdout);
      }
    }
    if (!options.json_path.empty()) {
      std::ofstream out(options.json_path);
      ZT_CHECK(out.good(), "cannot write ", options.json_path);
      out << results.dump(2) << "\n";
    }
    return 0;
  });
}
