// The host kernels with ISA paths (kernels/host_isa.hpp), each path side by side, 1 thread, in-cache
// sizes: the anchor is the baseline path (the library's build ISA: what ran before the dispatch),
// measured in the same rounds. Per kernel and path: the median time of a call and the speed-up over
// the baseline path (median over rounds of baseline time / path time).
//
//   zt_bench_host_isa [--reps R] [--calls C]
// Each round runs every kernel on every path, C calls in a row (the first untimed), R rounds.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench_helpers.hpp"
#include "kernels/host_isa.hpp"
#include "kernels/nn_kernels.hpp"
#include "kernels/optimizer_kernels.hpp"
#include "zerotrain/device.hpp"

namespace {

constexpr const char* kUsage = "usage: zt_bench_host_isa [--reps R] [--calls C]";

struct Kernel {
  std::string name;
  std::function<void()> body;
};

std::vector<float> ramp(std::size_t count, float scale) {
  std::vector<float> out(count);
  for (std::size_t i = 0; i < count; ++i) out[i] = scale * (static_cast<float>(i % 1009) / 504.5f - 1.0f);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  using zt::kernels::HostIsa;
  int reps = 15;
  int calls = 20;
  try {
    zt::bench::parse_flags(argc, argv, kUsage, [&](const std::string& flag, const std::string& value) {
      if (flag == "--reps") {
        reps = std::stoi(value);
      } else if (flag == "--calls") {
        calls = std::stoi(value);
      } else {
        return false;
      }
      return true;
    });
  } catch (const std::exception& error) {
    zt::bench::exit_with_usage(error.what(), kUsage);
  }
  if (reps < 1 || calls < 2) zt::bench::exit_with_usage("need --reps >= 1 and --calls >= 2", kUsage);
  zt::kernels::set_host_threads(1);
  const zt::Stream& stream = zt::default_stream(zt::Device::host());

  // GPT-2-small-like rows: 64 tokens x 768 channels; the MLP's 4x width for GELU; 256 x 256 attention.
  constexpr std::int64_t kRows = 64, kChannels = 768, kGelu = kRows * 4 * kChannels;
  const std::vector<float> x = ramp(kGelu, 5.0f), dy = ramp(kGelu, 1.0f);
  std::vector<float> y(kGelu), dx(kGelu);
  const std::vector<float> w = ramp(kChannels, 1.0f), b = ramp(kChannels, 0.1f);
  std::vector<float> mean(kRows), rstd(kRows), dw(kChannels), db(kChannels);
  const zt::kernels::AttentionShape shape{1, 256, 4, 64};
  const std::int64_t attention_channels = shape.n_head * shape.head_dim;
  const std::vector<float> qkv = ramp(shape.seq_len * 3 * attention_channels, 1.0f);
  std::vector<float> attention_out(shape.seq_len * attention_channels), dqkv(qkv.size());
  std::vector<float> row_logsumexp(shape.batch * shape.n_head * shape.seq_len);
  constexpr std::int64_t kLossRows = 8, kVocab = 50257;
  const std::vector<float> logits = ramp(kLossRows * kVocab, 8.0f);
  std::vector<float> grad_logits(logits.size()), lse(kLossRows);
  std::vector<std::int32_t> targets(kLossRows);
  for (std::int64_t r = 0; r < kLossRows; ++r) targets[r] = static_cast<std::int32_t>(r * 4099 % kVocab);
  zt::kernels::CrossEntropyScalars loss;
  constexpr std::size_t kParams = 65536;  // 1.8 MiB of p, g, m, v: in L2
  std::vector<float> p = ramp(kParams, 1.0f), g = ramp(kParams, 1e-2f), m(kParams, 0.0f), v(kParams, 0.0f);
  std::vector<std::uint16_t> p16(kParams);
  std::int64_t step = 0;
  const auto adamw = [&](void* copy, zt::DType dtype) {
    zt::kernels::AdamStepArgs args;
    args.params = p.data();
    args.exp_avg = m.data();
    args.exp_avg_sq = v.data();
    args.grads = g.data();
    args.count = kParams;
    args.weight_decay = 0.01f;
    args.params_16bit = copy;
    args.params_16bit_dtype = dtype;
    args.step = ++step;
    zt::kernels::adam_step(stream, args);
  };
  using zt::DType;
  using zt::kernels::Activation;
  const std::vector<Kernel> kernels = {
      {"adamw fp32 (65536 params)", [&] { adamw(nullptr, DType::bf16); }},
      {"adamw + bf16 copy", [&] { adamw(p16.data(), DType::bf16); }},
      {"adamw + fp16 copy", [&] { adamw(p16.data(), DType::fp16); }},
      {"cast fp32 -> bf16",
       [&] { zt::kernels::cast_params_to_16bit(stream, p.data(), p16.data(), DType::bf16, kParams); }},
      {"grad sum of squares",
       [&] { (void)zt::kernels::grad_sum_squares(stream, g.data(), DType::fp32, kParams); }},
      {"gelu forward (64x3072)",
       [&] {
         zt::kernels::activation_forward(stream, DType::fp32, Activation::gelu, x.data(), y.data(), kGelu);
       }},
      {"gelu backward",
       [&] {
         zt::kernels::activation_backward(stream, DType::fp32, Activation::gelu, x.data(), dy.data(),
                                          dx.data(), kGelu);
       }},
      {"layernorm forward (64x768)",
       [&] {
         zt::kernels::layernorm_forward(stream, DType::fp32, x.data(), w.data(), b.data(), y.data(),
                                        mean.data(), rstd.data(), kRows, kChannels, 1e-5);
       }},
      {"layernorm backward",
       [&] {
         zt::kernels::layernorm_backward(stream, DType::fp32, dy.data(), x.data(), w.data(), mean.data(),
                                         rstd.data(), dx.data(), dw.data(), db.data(), kRows, kChannels);
       }},
      {"attention forward (T 256, 4 heads)",
       [&] {
         zt::kernels::attention_forward(stream, DType::fp32, qkv.data(), attention_out.data(),
                                        row_logsumexp.data(), shape);
       }},
      {"attention backward",
       [&] {
         // attention_out stands in for the output's gradient too: the same values either way.
         zt::kernels::attention_backward(stream, DType::fp32, attention_out.data(), qkv.data(),
                                         attention_out.data(), row_logsumexp.data(), dqkv.data(), shape);
       }},
      {"cross-entropy fwd+bwd (8x50257)",
       [&] {
         zt::kernels::cross_entropy_forward(stream, DType::fp32, logits.data(), targets.data(), lse.data(),
                                            kLossRows, kVocab, -100, &loss);
         zt::kernels::cross_entropy_backward(stream, DType::fp32, logits.data(), targets.data(), lse.data(),
                                             &loss, grad_logits.data(), kLossRows, kVocab, -100, 1.0);
       }},
  };

  std::vector<HostIsa> paths;
  for (int i = zt::kernels::kHostIsaCount - 1; i >= 0; --i) {
    if (zt::kernels::host_isa_supported(static_cast<HostIsa>(i))) paths.push_back(static_cast<HostIsa>(i));
  }
  const HostIsa default_path = zt::kernels::host_isa();
  // times[kernel][path][round]: seconds per call, median of the calls of that round.
  std::vector<std::vector<std::vector<double>>> times(kernels.size(),
                                                      std::vector<std::vector<double>>(paths.size()));
  for (int round = 0; round < reps; ++round) {
    for (std::size_t k = 0; k < kernels.size(); ++k) {
      for (std::size_t j = 0; j < paths.size(); ++j) {
        zt::kernels::set_host_isa(paths[j]);
        kernels[k].body();  // untimed: this kernel's data in cache, this path's code warm
        std::vector<double> call_times;
        for (int c = 1; c < calls; ++c) {
          const auto start = std::chrono::steady_clock::now();
          kernels[k].body();
          call_times.push_back(
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        }
        times[k][j].push_back(zt::bench::median(call_times));
      }
    }
  }
  zt::kernels::set_host_isa(default_path);

  std::printf(
      "host kernels per ISA path, 1 thread; median of %d rounds of %d calls; CPU supports: %s\n"
      "default path: %s\n",
      reps, calls, zt::kernels::supported_host_isas().c_str(), zt::kernels::host_isa_description().c_str());
  std::printf("%-36s", "kernel");
  for (HostIsa path : paths) std::printf(" %9s us", zt::kernels::host_isa_name(path));
  for (HostIsa path : paths) {
    if (path != HostIsa::baseline) std::printf(" %8s/base", zt::kernels::host_isa_name(path));
  }
  std::printf("\n");
  const std::size_t baseline = paths.size() - 1;  // supported_paths order: best first, baseline last
  for (std::size_t k = 0; k < kernels.size(); ++k) {
    std::printf("%-36s", kernels[k].name.c_str());
    for (std::size_t j = 0; j < paths.size(); ++j)
      std::printf(" %12.1f", 1e6 * zt::bench::median(times[k][j]));
    for (std::size_t j = 0; j + 1 < paths.size(); ++j) {
      std::vector<double> speedup;
      for (int round = 0; round < reps; ++round)
        speedup.push_back(times[k][baseline][round] / times[k][j][round]);
      std::printf(" %12.2fx", zt::bench::median(speedup));
    }
    std::printf("\n");
  }
  return 0;
}
