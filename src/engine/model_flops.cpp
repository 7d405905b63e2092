#include "src/engine/model_flops.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <variant>
#include <vector>

#include "kernels/nn_kernels.hpp"
#include "zerotrain/device.hpp"

namespace zt::engine_detail {

double model_flops_per_token(const Config& config, std::int64_t parameters) {
  double flops = 6.0 * static_cast<double>(parameters);
  if (config.model) {
    if (const auto* gpt = std::get_if<GptModelConfig>(&*config.model)) {
      flops += 12.0 * static_cast<double>(gpt->n_layer) * static_cast<double>(gpt->seq_len) *
               static_cast<double>(gpt->d_model);
    }
  }
  return flops;
}

MatmulProbe probe_matmul(DType dtype, double budget_seconds) {
  using Clock = std::chrono::steady_clock;
  constexpr std::int64_t kLargest = 1024;
  const Stream stream;  // the host stream
  std::vector<std::byte> input(static_cast<std::size_t>(kLargest * kLargest) * dtype_size(dtype));
  std::vector<std::byte> weight(input.size());
  std::vector<std::byte> output(input.size());
  auto seconds_since = [](Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  auto call = [&](std::int64_t n) {
    const auto start = Clock::now();
    kernels::matmul_forward(stream, dtype, input.data(), weight.data(), nullptr, output.data(),
                            kernels::MatmulShape{.rows = n, .in_features = n, .out_features = n});
    return seconds_since(start);
  };
  call(128);  // warm-up, outside the budget: the thread team starts, the code and buffers page in
  const auto began = Clock::now();
  MatmulProbe probe;
  probe.size = 128;
  double best = call(probe.size);
  while (probe.size < kLargest && best < budget_seconds / 8) {
    probe.size *= 2;
    best = call(probe.size);
  }
  probe.calls = 1;
  // At least 3 calls at the size, unless a loaded machine makes them take twice the budget.
  while (seconds_since(began) < budget_seconds ||
         (probe.calls < 3 && seconds_since(began) < 2 * budget_seconds)) {
    best = std::min(best, call(probe.size));
    ++probe.calls;
  }
  const auto n = static_cast<double>(probe.size);
  probe.flops_per_second = 2.0 * n * n * n / best;
  probe.seconds = seconds_since(began);  // without the warm-up
  return probe;
}

}  // namespace zt::engine_detail
