#include "src/engine/model_flops.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <variant>

#include "kernels/gpu_peaks.hpp"
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

namespace {
/// probe_matmul's measurement, whose operands, stream (and its GEMM workspace) are freed on return.
MatmulProbe measure_matmul(DType dtype, Device device, double budget_seconds) {
  using Clock = std::chrono::steady_clock;
  // A GPU needs larger operands than the host before a call outlasts its launch and sync.
  const std::int64_t largest = device.is_cuda() ? 8192 : 1024;
  const Stream stream = device.is_host() ? Stream() : Stream(device);
  const std::size_t bytes = static_cast<std::size_t>(largest * largest) * dtype_size(dtype);
  Buffer input(device, bytes), weight(device, bytes), output(device, bytes);
  zero_bytes(input.data(), device, bytes, &stream);  // finite operands: no NaN slow paths
  zero_bytes(weight.data(), device, bytes, &stream);
  auto seconds_since = [](Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  stream.synchronize();
  auto call = [&](std::int64_t n) {
    const auto start = Clock::now();
    kernels::matmul_forward(stream, dtype, input.data(), weight.data(), nullptr, output.data(),
                            kernels::MatmulShape{.rows = n, .in_features = n, .out_features = n});
    stream.synchronize();
    return seconds_since(start);
  };
  call(128);  // warm-up, outside the budget: the thread team starts, the code and buffers page in
  const auto began = Clock::now();
  MatmulProbe probe;
  probe.size = 128;
  double best = call(probe.size);
  while (probe.size < largest && best < budget_seconds / 8) {
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
}  // namespace

MatmulProbe probe_matmul(DType dtype, Device device, double budget_seconds) {
  const MatmulProbe probe = measure_matmul(dtype, device, budget_seconds);
  // On a GPU the operands (3 x 8192^2 elements, 384 MiB in bf16) and the stream's GEMM workspace
  // would stay reserved in the caching pool, held from NCCL's and the libraries' own allocations for
  // the whole run: given back now.
  if (device.is_cuda()) release_cached_memory(DeviceType::cuda);
  return probe;
}

RankPeakFlops rank_peak_flops(Device device, DType dtype) {
  if (device.is_cuda()) {
    const kernels::CudaPeakFlops gpu = kernels::cuda_peak_flops(device.index, dtype);
    if (gpu.flops_per_second) {
      return {*gpu.flops_per_second, "data sheet",
              gpu.device.name + ", dense " + std::string(kernels::gpu_math_name(gpu.math))};
    }
  }
  // The emulated device runs the host's kernels: the host is what it would measure, without the page faults.
  const Device probed = device.is_cuda() ? device : Device::host();
  const MatmulProbe probe = probe_matmul(dtype, probed);
  char detail[160];
  std::snprintf(detail, sizeof detail, "%lld^3 %s%s%s, best of %d calls in %.0f ms",
                static_cast<long long>(probe.size), std::string(dtype_name(dtype)).c_str(),
                probed.is_host() ? "" : " on ", probed.is_host() ? "" : probed.str().c_str(), probe.calls,
                probe.seconds * 1e3);
  return {probe.flops_per_second, "matmul probe", detail};
}

}  // namespace zt::engine_detail
