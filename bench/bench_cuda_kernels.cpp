// Every CUDA kernel family the engine runs, timed on one GPU at GPT-2 124M's shape (B x T = 8 x 1024
// rows, C = 768, vocab 50257), through the engine's own entry points (kernels/nn_kernels.hpp,
// kernels/optimizer_kernels.hpp) on a zt::Stream with zt::Buffers.
//
//   zt_bench_cuda_kernels [--batch B] [--rounds R] [--calls C] [--warmup W]
//
// Per kernel: W untimed launches, then R rounds of C launches between two CUDA events; the time of
// a launch is the median over rounds of (round time / C). Memory-bound kernels report the bytes the
// kernel's contract must move at least (every input read once, every output written once, an
// accumulated output read and written; temporaries and re-reads not counted: "min bytes"), the
// GB/s that makes, its fraction of the device's theoretical DRAM bandwidth (memory clock x bus width
// x 2) and its "ratio to copy anchor": the GB/s over the copy anchor's, a trivial copy kernel timed
// the same way in the same process (bench/cuda_copy_anchor.cu; cudaMemcpyAsync device to device is
// printed next to it). GEMMs (cuBLASLt, the Linear layers of a GPT-2 block and the tied LM head) and
// attention report TFLOP/s of the model count (2 per multiply-add, causal mask not subtracted, as the
// MFU counts them) and its fraction of the data sheet's dense peak for their math
// (kernels/gpu_peaks.hpp), when the table knows the GPU. Without a usable GPU it says "no usable GPU"
// and exits 0.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

#include "bench/bench_helpers.hpp"
#include "bench/cuda_copy_anchor.hpp"
#include "kernels/cuda/gemm.hpp"
#include "kernels/gpu_peaks.hpp"
#include "kernels/nn_kernels.hpp"
#include "kernels/optimizer_kernels.hpp"
#include "zerotrain/device.hpp"
#include "zerotrain/dtype.hpp"
#include "zerotrain/error.hpp"

namespace {

constexpr const char* kUsage =
    "usage: zt_bench_cuda_kernels [--batch B] [--rounds R] [--calls C] [--warmup W]";

using zt::Buffer;
using zt::DType;
using zt::Stream;

/// A cudaEvent_t that records time (zt::Event does not: the engine never times).
class TimingEvent {
 public:
  TimingEvent() { check(cudaEventCreate(&event_), "cudaEventCreate"); }
  TimingEvent(const TimingEvent&) = delete;
  TimingEvent& operator=(const TimingEvent&) = delete;
  ~TimingEvent() { cudaEventDestroy(event_); }
  void record(const Stream& stream) {
    check(cudaEventRecord(event_, static_cast<cudaStream_t>(stream.native())), "cudaEventRecord");
  }
  /// Seconds from `start` to this event, waiting for this one.
  double seconds_since(const TimingEvent& start) const {
    check(cudaEventSynchronize(event_), "cudaEventSynchronize");
    float milliseconds = 0;
    check(cudaEventElapsedTime(&milliseconds, start.event_, event_), "cudaEventElapsedTime");
    return 1e-3 * milliseconds;
  }

 private:
  static void check(cudaError_t status, const char* call) {
    if (status != cudaSuccess) ZT_THROW_AS(zt::CudaError, call, " failed: ", cudaGetErrorString(status));
  }
  cudaEvent_t event_ = nullptr;
};

// Small by default: scripts/gpu-check.sh gives the GPU benchmarks what is left of its 8 minutes
// after the training benchmark (at least 15 s, at most 60 s).
struct TimingPlan {
  int warmup = 2;
  int rounds = 5;
  int calls = 5;
};

/// Seconds per launch of `launch` on `stream` (see the top of the file).
double time_launches(const Stream& stream, const TimingPlan& plan, const std::function<void()>& launch) {
  for (int i = 0; i < plan.warmup; ++i) launch();
  TimingEvent start, stop;
  std::vector<double> per_launch;
  for (int round = 0; round < plan.rounds; ++round) {
    start.record(stream);
    for (int i = 0; i < plan.calls; ++i) launch();
    stop.record(stream);
    per_launch.push_back(stop.seconds_since(start) / plan.calls);
  }
  stream.synchronize();  // a kernel's asynchronous fault surfaces here, naming the stream
  return zt::bench::median(per_launch);
}

/// The device's yardsticks, measured or queried once.
struct Peaks {
  zt::kernels::CudaDeviceFacts device;
  double theoretical_bytes_per_second = 0;  // memory clock x bus width x 2
  double copy_anchor_bytes_per_second = 0;  // the trivial copy kernel, this process
};

/// "41.3% of peak", or "peak unknown" where the device reports no memory clock or bus width.
std::string fraction_of_peak(const Peaks& peaks, double bytes_per_second) {
  if (!(peaks.theoretical_bytes_per_second > 0)) return "peak unknown";
  char text[32];
  std::snprintf(text, sizeof text, "%5.1f%% of peak",
                100.0 * bytes_per_second / peaks.theoretical_bytes_per_second);
  return text;
}

/// Prints one memory-bound kernel's line.
void report_bandwidth(const Peaks& peaks, const std::string& name, DType dtype, const std::string& shape,
                      double seconds, double bytes) {
  const double rate = bytes / seconds;
  std::printf("  %-30s %-5s %-22s %9.4f ms %10.1f MB %8.0f GB/s %s, ratio to copy anchor %.2f\n",
              name.c_str(), std::string(zt::dtype_name(dtype)).c_str(), shape.c_str(), seconds * 1e3,
              bytes / 1e6, rate / 1e9, fraction_of_peak(peaks, rate).c_str(),
              rate / peaks.copy_anchor_bytes_per_second);
}

/// Prints one compute-bound kernel's line: its model FLOPs against the data sheet's peak for `math`.
void report_flops(const Peaks& peaks, const std::string& name, DType dtype, zt::kernels::GpuMath math,
                  const std::string& shape, double seconds, double flops) {
  const double rate = flops / seconds;
  const std::optional<double> peak = zt::kernels::datasheet_peak_flops(peaks.device.name, math);
  char fraction[96] = "";
  if (peak) {
    std::snprintf(fraction, sizeof fraction, "%5.1f%% of %s peak %.0f TFLOP/s", 100.0 * rate / *peak,
                  std::string(zt::kernels::gpu_math_name(math)).c_str(), *peak / 1e12);
  } else {
    std::snprintf(fraction, sizeof fraction, "no data-sheet %s peak for this GPU",
                  std::string(zt::kernels::gpu_math_name(math)).c_str());
  }
  std::printf("  %-30s %-5s %-22s %9.4f ms %8.1f TFLOP/s %s\n", name.c_str(),
              std::string(zt::dtype_name(dtype)).c_str(), shape.c_str(), seconds * 1e3, rate / 1e12,
              fraction);
}

std::string dims(std::int64_t a, std::int64_t b) {
  return std::to_string(a) + "x" + std::to_string(b);
}

/// A device buffer of `count` elements of `dtype`, filled with normal(0, stddev) by the engine's kernel.
Buffer normal_buffer(const Stream& stream, DType dtype, std::int64_t count, double stddev,
                     std::uint64_t seed) {
  Buffer buffer(stream.device(), static_cast<std::size_t>(count) * zt::dtype_size(dtype));
  zt::kernels::fill_normal(stream, dtype, buffer.data(), count, 0.0, stddev, seed);
  return buffer;
}

Buffer zero_buffer(const Stream& stream, std::size_t bytes) {
  Buffer buffer(stream.device(), bytes);
  zt::zero_bytes(buffer.data(), stream.device(), bytes, &stream);
  return buffer;
}

/// `values` uploaded to a device buffer.
Buffer upload(const Stream& stream, const std::vector<std::int32_t>& values) {
  Buffer buffer(stream.device(), values.size() * sizeof(std::int32_t));
  zt::copy_bytes(buffer.data(), stream.device(), values.data(), zt::Device::host(), buffer.size(), &stream);
  stream.synchronize();
  return buffer;
}

struct GptShape {
  std::int64_t batch = 8, seq_len = 1024, channels = 768, n_head = 12, vocab = 50257;
  std::int64_t parameters = 124439808;  // GPT-2 124M, tied embedding (the flat buffer AdamW updates)
  std::int64_t rows() const { return batch * seq_len; }
};

Peaks measure_peaks(const Stream& stream, const TimingPlan& plan) {
  Peaks peaks;
  peaks.device = zt::kernels::cuda_device_facts(stream.device().index);
  peaks.theoretical_bytes_per_second = peaks.device.peak_memory_bytes_per_second();
  // 1 GiB each way: far beyond the L2 (50 MiB on an H100), so DRAM is what is timed.
  constexpr std::size_t kBytes = std::size_t{1} << 30;
  Buffer source = zero_buffer(stream, kBytes), destination = zero_buffer(stream, kBytes);
  const double memcpy_seconds = time_launches(stream, plan, [&] {
    zt::copy_bytes(destination.data(), stream.device(), source.data(), stream.device(), kBytes, &stream);
  });
  const double copy_seconds = time_launches(stream, plan, [&] {
    zt::bench::launch_copy_anchor(source.data(), destination.data(), kBytes, stream.native());
  });
  peaks.copy_anchor_bytes_per_second = 2.0 * kBytes / copy_seconds;
  const double memcpy_rate = 2.0 * kBytes / memcpy_seconds;
  std::printf("device: %s, compute %d.%d, %d SMs; memory clock %.0f MHz x %d-bit bus x 2\n",
              peaks.device.name.c_str(), peaks.device.compute_major, peaks.device.compute_minor,
              peaks.device.multiprocessors, peaks.device.memory_clock_hz / 1e6, peaks.device.memory_bus_bits);
  std::printf("peak bandwidth (theoretical, from the attributes above): %.0f GB/s\n",
              peaks.theoretical_bytes_per_second / 1e9);
  std::printf(
      "anchor cudaMemcpyAsync device to device, 1 GiB (2 GiB moved): %.0f GB/s, %s, ratio to copy anchor "
      "%.2f\n",
      memcpy_rate / 1e9, fraction_of_peak(peaks, memcpy_rate).c_str(),
      memcpy_rate / peaks.copy_anchor_bytes_per_second);
  std::printf(
      "anchor copy kernel (float4 grid-stride), 1 GiB (2 GiB moved): %.0f GB/s, %s, ratio to copy anchor "
      "1.00\n",
      peaks.copy_anchor_bytes_per_second / 1e9,
      fraction_of_peak(peaks, peaks.copy_anchor_bytes_per_second).c_str());
  return peaks;
}

void bench_elementwise(const Stream& stream, const TimingPlan& plan, const Peaks& peaks,
                       const GptShape& gpt) {
  namespace k = zt::kernels;
  const std::int64_t n = gpt.rows() * gpt.channels, n_mlp = 4 * n, n_params = gpt.parameters;
  {  // casts over the flat parameter buffer: the master fp32 copy to bf16 and back
    Buffer fp32 = normal_buffer(stream, DType::fp32, n_params, 1.0, 1);
    Buffer bf16 = zero_buffer(stream, static_cast<std::size_t>(n_params) * 2);
    const std::string shape = std::to_string(n_params);
    double s = time_launches(stream, plan, [&] {
      k::convert(stream, fp32.data(), DType::fp32, bf16.data(), DType::bf16, n_params);
    });
    report_bandwidth(peaks, "convert fp32 -> bf16", DType::bf16, shape, s, 6.0 * n_params);
    s = time_launches(stream, plan, [&] {
      k::convert(stream, bf16.data(), DType::bf16, fp32.data(), DType::fp32, n_params);
    });
    report_bandwidth(peaks, "convert bf16 -> fp32", DType::bf16, shape, s, 6.0 * n_params);
    s = time_launches(stream, plan, [&] {
      k::cast_params_to_16bit(stream, fp32.as<float>(), bf16.data(), DType::bf16, n_params);
    });
    report_bandwidth(peaks, "cast_params_to_16bit", DType::bf16, shape, s, 6.0 * n_params);
  }
  for (DType dtype : {DType::bf16, DType::fp32}) {
    const double size = static_cast<double>(zt::dtype_size(dtype));
    {  // the residual add, out of place: read a and b, write the sum
      Buffer a = normal_buffer(stream, dtype, n, 1.0, 2), b = normal_buffer(stream, dtype, n, 1.0, 3);
      Buffer sum = zero_buffer(stream, a.size());
      const double s =
          time_launches(stream, plan, [&] { k::add(stream, dtype, a.data(), b.data(), sum.data(), n); });
      report_bandwidth(peaks, "residual add", dtype, dims(gpt.rows(), gpt.channels), s, 3.0 * size * n);
    }
    {  // GELU on the MLP's 4C activations: forward reads x, writes y; backward reads x and dy, writes dx
      Buffer x = normal_buffer(stream, dtype, n_mlp, 1.0, 4),
             dy = normal_buffer(stream, dtype, n_mlp, 1.0, 5);
      Buffer y = zero_buffer(stream, x.size());
      const std::string shape = dims(gpt.rows(), 4 * gpt.channels);
      double s = time_launches(stream, plan, [&] {
        k::activation_forward(stream, dtype, k::Activation::gelu, x.data(), y.data(), n_mlp);
      });
      report_bandwidth(peaks, "gelu forward", dtype, shape, s, 2.0 * size * n_mlp);
      s = time_launches(stream, plan, [&] {
        k::activation_backward(stream, dtype, k::Activation::gelu, x.data(), dy.data(), y.data(), n_mlp);
      });
      report_bandwidth(peaks, "gelu backward", dtype, shape, s, 3.0 * size * n_mlp);
    }
  }
}

void bench_layers(const Stream& stream, const TimingPlan& plan, const Peaks& peaks, const GptShape& gpt) {
  namespace k = zt::kernels;
  const std::int64_t rows = gpt.rows(), c = gpt.channels, n = rows * c;
  std::mt19937 engine(1234);
  std::uniform_int_distribution<std::int32_t> pick(0, static_cast<std::int32_t>(gpt.vocab - 1));
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(rows));
  for (auto& token : tokens) token = pick(engine);
  const double distinct_tokens =
      static_cast<double>(std::unordered_set<std::int32_t>(tokens.begin(), tokens.end()).size());
  Buffer device_tokens = upload(stream, tokens);
  for (DType dtype : {DType::bf16, DType::fp32}) {
    const double size = static_cast<double>(zt::dtype_size(dtype));
    {  // layer norm over C: the statistics (mean, rstd) are fp32 per row
      Buffer x = normal_buffer(stream, dtype, n, 1.0, 6), dy = normal_buffer(stream, dtype, n, 1.0, 7);
      Buffer weight = normal_buffer(stream, dtype, c, 1.0, 8), bias = normal_buffer(stream, dtype, c, 0.1, 9);
      Buffer y = zero_buffer(stream, x.size()), dx = zero_buffer(stream, x.size());
      Buffer mean = zero_buffer(stream, rows * 4), rstd = zero_buffer(stream, rows * 4);
      Buffer dweight = zero_buffer(stream, weight.size()), dbias = zero_buffer(stream, bias.size());
      double s = time_launches(stream, plan, [&] {
        k::layernorm_forward(stream, dtype, x.data(), weight.data(), bias.data(), y.data(), mean.data(),
                             rstd.data(), rows, c, 1e-5);
      });
      report_bandwidth(peaks, "layernorm forward", dtype, dims(rows, c), s,
                       size * (2.0 * n + 2 * c) + 8.0 * rows);
      s = time_launches(stream, plan, [&] {
        k::layernorm_backward(stream, dtype, dy.data(), x.data(), weight.data(), mean.data(), rstd.data(),
                              dx.data(), dweight.data(), dbias.data(), rows, c);
      });
      // dy, x read and dx written; weight read, dweight and dbias read and written; mean, rstd read.
      report_bandwidth(peaks, "layernorm backward", dtype, dims(rows, c), s,
                       size * (3.0 * n + 5 * c) + 8.0 * rows);
    }
    {  // token + position embedding; backward scatters into the rows the batch's tokens name
      Buffer token_table = normal_buffer(stream, dtype, gpt.vocab * c, 0.02, 10);
      Buffer position_table = normal_buffer(stream, dtype, gpt.seq_len * c, 0.01, 11);
      Buffer out = zero_buffer(stream, static_cast<std::size_t>(n * size));
      Buffer grad_tokens = zero_buffer(stream, token_table.size());
      Buffer grad_positions = zero_buffer(stream, position_table.size());
      const k::EmbeddingShape shape{gpt.batch, gpt.seq_len, gpt.vocab, c};
      double s = time_launches(stream, plan, [&] {
        k::embedding_forward(stream, dtype, device_tokens.as<std::int32_t>(), token_table.data(),
                             position_table.data(), out.data(), shape);
      });
      // tokens read; one table row read per position; the position table read; the output written.
      report_bandwidth(peaks, "embedding forward", dtype, dims(rows, c), s,
                       4.0 * rows + size * (2.0 * n + gpt.seq_len * c));
      s = time_launches(stream, plan, [&] {
        k::embedding_backward(stream, dtype, device_tokens.as<std::int32_t>(), out.data(), grad_tokens.data(),
                              grad_positions.data(), shape);
      });
      // tokens and grad_output read; each distinct token's row and the position table read and written.
      report_bandwidth(peaks, "embedding backward", dtype, dims(rows, c), s,
                       4.0 * rows + size * (n + 2.0 * distinct_tokens * c + 2.0 * gpt.seq_len * c));
      k::check_index_errors(stream);
    }
    {  // fused softmax cross-entropy over the vocabulary
      const std::int64_t logits_count = rows * gpt.vocab;
      Buffer logits = normal_buffer(stream, dtype, logits_count, 1.0, 12);
      Buffer grad_logits = zero_buffer(stream, logits.size());
      Buffer lse = zero_buffer(stream, rows * 4);
      Buffer result = zero_buffer(stream, sizeof(k::CrossEntropyScalars));
      auto* scalars = static_cast<k::CrossEntropyScalars*>(result.data());
      const std::string shape = dims(rows, gpt.vocab);
      double s = time_launches(stream, plan, [&] {
        k::cross_entropy_forward(stream, dtype, logits.data(), device_tokens.as<std::int32_t>(), lse.data(),
                                 rows, gpt.vocab, -100, scalars);
      });
      report_bandwidth(peaks, "cross-entropy forward", dtype, shape, s,
                       size * logits_count + 8.0 * rows + sizeof(k::CrossEntropyScalars));
      s = time_launches(stream, plan, [&] {
        k::cross_entropy_backward(stream, dtype, logits.data(), device_tokens.as<std::int32_t>(), lse.data(),
                                  scalars, grad_logits.data(), rows, gpt.vocab, -100, 1.0);
      });
      report_bandwidth(peaks, "cross-entropy backward", dtype, shape, s,
                       2.0 * size * logits_count + 8.0 * rows);
      k::check_index_errors(stream);
      k::CrossEntropyScalars loss;
      zt::copy_bytes(&loss, zt::Device::host(), scalars, stream.device(), sizeof loss, &stream);
      stream.synchronize();
      // N(0, 1) logits: E[log-sum-exp] is about ln(vocab) + 1/2, minus E[logit] = 0.
      std::printf(
          "    (cross-entropy %s mean loss %.4f over %.0f rows; about ln(vocab) + 0.5 = %.2f expected)\n",
          std::string(zt::dtype_name(dtype)).c_str(), loss.mean_loss, loss.counted_rows,
          std::log(static_cast<double>(gpt.vocab)) + 0.5);
    }
    {  // causal attention, 12 heads of 64: the rows' log-sum-exps [B, H, T] are saved (fp32)
      const k::AttentionShape shape{gpt.batch, gpt.seq_len, gpt.n_head, c / gpt.n_head};
      const double statistics = static_cast<double>(gpt.batch * gpt.n_head * gpt.seq_len);
      Buffer qkv = normal_buffer(stream, dtype, 3 * n, 1.0, 13),
             grad_out = normal_buffer(stream, dtype, n, 1.0, 14);
      Buffer out = zero_buffer(stream, static_cast<std::size_t>(n * size));
      Buffer grad_qkv = zero_buffer(stream, qkv.size());
      Buffer row_logsumexp = zero_buffer(stream, static_cast<std::size_t>(statistics) * 4);
      const std::string text = std::to_string(gpt.batch) + "x" + std::to_string(gpt.seq_len) + ", " +
                               std::to_string(gpt.n_head) + " heads";
      // Model FLOPs: Q K^T and P V, 2 T^2 C per sequence each, doubled in backward (4 GEMMs); the
      // backward's recomputed Q K^T is not counted (the model's FLOPs, as MFU counts them).
      const double forward_flops = 4.0 * gpt.batch * gpt.seq_len * gpt.seq_len * c;
      // bf16: cuDNN's fused attention where it takes the call, then our own kernel (ZT_CUDNN_ATTENTION=0,
      // read on every call) as its anchor; fp32: our own kernel only.
      const std::vector<const char*> paths =
          dtype == DType::fp32 ? std::vector<const char*>{"own kernel"}
                               : std::vector<const char*>{"cuDNN if it takes it", "own kernel"};
      for (const char* path : paths) {
        if (std::string(path) == "own kernel" && dtype != DType::fp32) ::setenv("ZT_CUDNN_ATTENTION", "0", 1);
        const std::string label = text + ", " + path;
        // Our kernel computes on fp32 cores; cuDNN's on the dtype's tensor cores.
        const zt::kernels::GpuMath math = std::string(path) == "own kernel"
                                              ? zt::kernels::GpuMath::fp32
                                              : zt::kernels::gpu_math_of(dtype, false);
        double s = time_launches(stream, plan, [&] {
          k::attention_forward(stream, dtype, qkv.data(), out.data(), row_logsumexp.data(), shape);
        });
        report_bandwidth(peaks, "attention forward", dtype, label, s, size * 4.0 * n + 4.0 * statistics);
        report_flops(peaks, "attention forward", dtype, math, label, s, forward_flops);
        s = time_launches(stream, plan, [&] {
          k::attention_backward(stream, dtype, grad_out.data(), qkv.data(), out.data(), row_logsumexp.data(),
                                grad_qkv.data(), shape);
        });
        report_bandwidth(peaks, "attention backward", dtype, label, s, size * 8.0 * n + 4.0 * statistics);
        report_flops(peaks, "attention backward", dtype, math, label, s, 2 * forward_flops);
      }
      ::unsetenv("ZT_CUDNN_ATTENTION");
    }
  }
}

void bench_optimizer(const Stream& stream, const TimingPlan& plan, const Peaks& peaks, const GptShape& gpt) {
  namespace k = zt::kernels;
  const std::int64_t n = gpt.parameters;
  const std::string shape = std::to_string(n);
  Buffer params = normal_buffer(stream, DType::fp32, n, 0.02, 20);
  Buffer exp_avg = zero_buffer(stream, params.size()), exp_avg_sq = zero_buffer(stream, params.size());
  Buffer params_bf16 = zero_buffer(stream, static_cast<std::size_t>(n) * 2);
  Buffer accumulator = zero_buffer(stream, sizeof(k::GradCheckScalars));
  for (DType grad_dtype : {DType::bf16, DType::fp32}) {
    const double grad_size = static_cast<double>(zt::dtype_size(grad_dtype));
    Buffer grads = normal_buffer(stream, grad_dtype, n, 1e-3, 21);
    std::int64_t step = 0;
    const auto adamw = [&](void* copy) {
      k::AdamStepArgs args;
      args.params = params.as<float>();
      args.exp_avg = exp_avg.as<float>();
      args.exp_avg_sq = exp_avg_sq.as<float>();
      args.grads = grads.data();
      args.grad_dtype = grad_dtype;
      args.params_16bit = copy;
      args.count = static_cast<std::size_t>(n);
      args.grad_scale = 1.0f / 65536.0f;
      args.lr = 6e-4f;
      args.beta2 = 0.95f;
      args.weight_decay = 0.1f;
      args.step = ++step;
      k::adam_step(stream, args);
    };
    // p, m, v read and written; the gradient read; the bf16 copy written.
    double s = time_launches(stream, plan, [&] { adamw(params_bf16.data()); });
    report_bandwidth(peaks, "adamw + bf16 copy", grad_dtype, shape, s, n * (24.0 + grad_size + 2.0));
    s = time_launches(stream, plan, [&] { adamw(nullptr); });
    report_bandwidth(peaks, "adamw", grad_dtype, shape, s, n * (24.0 + grad_size));
    // The unscale / overflow / norm partial of one buffer: one read, two fp64 scalars accumulated.
    s = time_launches(stream, plan, [&] {
      k::grad_sum_squares(stream, grads.data(), grad_dtype, static_cast<std::size_t>(n), 1.0 / 65536.0,
                          static_cast<k::GradCheckScalars*>(accumulator.data()));
    });
    report_bandwidth(peaks, "grad check (sum sq, inf)", grad_dtype, shape, s, grad_size * n);
    s = time_launches(stream, plan, [&] { k::scale(stream, grad_dtype, grads.data(), n, 1.0); });
    report_bandwidth(peaks, "scale in place (unscale)", grad_dtype, shape, s, 2.0 * grad_size * n);
  }
}

/// The Linear layers of a GPT-2 block and the tied LM head: forward (with bias, except the head) and
/// backward (grad input, grad weight and grad bias: two GEMMs), in bf16, fp32 on TF32 tensor cores
/// and plain fp32.
void bench_gemms(const Stream& stream, const TimingPlan& plan, const Peaks& peaks, const GptShape& gpt) {
  namespace k = zt::kernels;
  struct Layer {
    const char* name;
    std::int64_t in, out;
    bool bias;
  };
  const std::int64_t c = gpt.channels, rows = gpt.rows();
  const std::vector<Layer> layers{{"attn qkv", c, 3 * c, true},
                                  {"attn proj", c, c, true},
                                  {"mlp fc", c, 4 * c, true},
                                  {"mlp proj", 4 * c, c, true},
                                  {"lm head (tied)", c, gpt.vocab, false}};
  struct Mode {
    DType dtype;
    bool tf32;
  };
  for (const Mode mode : {Mode{DType::bf16, false}, Mode{DType::fp32, true}, Mode{DType::fp32, false}}) {
    k::cuda::set_tf32_enabled(mode.tf32);
    const k::GpuMath math = k::gpu_math_of(mode.dtype, mode.tf32);
    for (const Layer& layer : layers) {
      const k::MatmulShape shape{rows, layer.in, layer.out};
      Buffer input = normal_buffer(stream, mode.dtype, rows * layer.in, 1.0, 30);
      Buffer weight = normal_buffer(stream, mode.dtype, layer.out * layer.in, 0.02, 31);
      Buffer bias = normal_buffer(stream, mode.dtype, layer.out, 0.02, 32);
      Buffer output =
          zero_buffer(stream, static_cast<std::size_t>(rows * layer.out) * zt::dtype_size(mode.dtype));
      Buffer grad_input = zero_buffer(stream, input.size()), grad_weight = zero_buffer(stream, weight.size());
      Buffer grad_bias = zero_buffer(stream, bias.size());
      const std::string text =
          std::to_string(rows) + "x" + std::to_string(layer.in) + "->" + std::to_string(layer.out);
      const double flops = 2.0 * rows * layer.in * layer.out;
      const std::string label = std::string(layer.name) + (mode.tf32 ? " (tf32)" : "");
      double s = time_launches(stream, plan, [&] {
        k::matmul_forward(stream, mode.dtype, input.data(), weight.data(), layer.bias ? bias.data() : nullptr,
                          output.data(), shape);
      });
      report_flops(peaks, "gemm " + label + " fwd", mode.dtype, math, text, s, flops);
      s = time_launches(stream, plan, [&] {
        k::matmul_backward(stream, mode.dtype, output.data(), input.data(), weight.data(), grad_input.data(),
                           grad_weight.data(), layer.bias ? grad_bias.data() : nullptr, shape);
      });
      report_flops(peaks, "gemm " + label + " bwd", mode.dtype, math, text, s, 2.0 * flops);
    }
  }
  k::cuda::set_tf32_enabled(false);
}

}  // namespace

int main(int argc, char** argv) {
  TimingPlan plan;
  GptShape gpt;
  try {
    zt::bench::parse_flags(argc, argv, kUsage, [&](const std::string& flag, const std::string& value) {
      if (flag == "--batch") {
        gpt.batch = std::stoll(value);
      } else if (flag == "--rounds") {
        plan.rounds = std::stoi(value);
      } else if (flag == "--calls") {
        plan.calls = std::stoi(value);
      } else if (flag == "--warmup") {
        plan.warmup = std::stoi(value);
      } else {
        return false;
      }
      return true;
    });
  } catch (const std::exception& error) {
    zt::bench::exit_with_usage(error.what(), kUsage);
  }
  if (gpt.batch < 1 || plan.rounds < 1 || plan.calls < 1 || plan.warmup < 0)
    zt::bench::exit_with_usage("need --batch >= 1, --rounds >= 1, --calls >= 1 and --warmup >= 0", kUsage);
  // Line by line: a run cut short by gpu-check's timeout keeps the lines it printed.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const zt::CudaStatus& status = zt::cuda_status();
  if (!status.usable()) {
    std::printf("zt_bench_cuda_kernels: no usable GPU (%s): nothing measured\n", status.reason.c_str());
    return 0;
  }
  try {
    const Stream stream(zt::Device::cuda(0));
    std::printf(
        "zt_bench_cuda_kernels: GPT-2 124M shapes, B %lld x T %lld, C %lld, vocab %lld; per kernel %d "
        "warm-up "
        "launches, median of %d rounds of %d launches timed by CUDA events\n"
        "bytes: the minimum the kernel's contract moves (inputs read once, outputs written once, accumulated "
        "outputs both); GEMM and attention FLOPs: 2 per multiply-add, causal mask not subtracted\n",
        static_cast<long long>(gpt.batch), static_cast<long long>(gpt.seq_len),
        static_cast<long long>(gpt.channels), static_cast<long long>(gpt.vocab), plan.warmup, plan.rounds,
        plan.calls);
    const Peaks peaks = measure_peaks(stream, plan);
    bench_elementwise(stream, plan, peaks, gpt);
    bench_layers(stream, plan, peaks, gpt);
    bench_optimizer(stream, plan, peaks, gpt);
    bench_gemms(stream, plan, peaks, gpt);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "zt_bench_cuda_kernels: %s\n", error.what());
    return 1;
  }
  return 0;
}
