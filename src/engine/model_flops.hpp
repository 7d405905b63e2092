// The MFU (model FLOPs utilization) of zt::train (docs/metrics.md, "MFU"): the training FLOPs a
// model needs per token, and the peak they are compared with, measured where not given.
#pragma once

#include <cstdint>
#include <string>

#include "zerotrain/config.hpp"
#include "zerotrain/device.hpp"
#include "zerotrain/dtype.hpp"

namespace zt::engine_detail {

/// Training FLOPs (forward and backward) per token of the config's model with `parameters`
/// parameters (all of them, as llm.c counts): 6 per parameter for the matmuls, plus, for a GPT,
/// 12 * n_layer * seq_len * d_model for the attention scores and their weighted sums (PaLM's
/// appendix B; causal masking is not subtracted). An MLP's token is a sample.
double model_flops_per_token(const Config& config, std::int64_t parameters);

/// One rank's measured matmul rate.
struct MatmulProbe {
  double flops_per_second = 0.0;  // the best call's 2 n^3 / seconds
  std::int64_t size = 0;          // n
  int calls = 0;                  // at size n
  double seconds = 0.0;           // the whole probe
};
/// The engine's matmul kernel on `device` (the one Linear layers run: on the host its threads
/// included, on a GPU cuBLASLt) on n x n operands in `dtype`: n doubles from 128 until one call takes
/// an eighth of `budget_seconds` (or n reaches 1024 on the host, 8192 on a GPU, where a call is timed
/// to its stream's end), then calls at that size while the budget lasts (at least 3 within twice the
/// budget); the best call counts. The first call, a warm-up (threads started), is not timed. On a
/// GPU it ends by giving the device's cached memory back (release_cached_memory), so that its
/// operands do not stay reserved in the pool.
MatmulProbe probe_matmul(DType dtype, Device device = Device::host(), double budget_seconds = 0.03);

/// One rank's peak FLOP/s for the MFU when none is given (--peak-flops): on a CUDA device whose GPU
/// kernels/gpu_peaks.hpp tables, the data sheet's dense figure for how its GEMMs compute `dtype`
/// (bf16/fp16 tensor cores; fp32 in TF32 or not, as ZT_CUDA_TF32 says); otherwise (the host, an
/// untabled GPU) the matmul probe on `device` (on the host for the emulated device, which runs the
/// host's kernels).
struct RankPeakFlops {
  double flops_per_second = 0.0;
  std::string source;  // "data sheet" or "matmul probe" (the start record's peak_flops_source)
  std::string detail;  // "NVIDIA H200, dense bf16/fp16 tensor" or "512^3 fp32, best of 9 calls in 31 ms"
};
RankPeakFlops rank_peak_flops(Device device, DType dtype);

}  // namespace zt::engine_detail
