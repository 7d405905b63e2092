// The MFU (model FLOPs utilization) of zt::train (docs/metrics.md, "MFU"): the training FLOPs a
// model needs per token, and the peak they are compared with, measured where not given.
#pragma once

#include <cstdint>

#include "zerotrain/config.hpp"
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
/// The engine's host matmul kernel (the one Linear layers run, its threads included) on n x n
/// operands in `dtype`: n doubles from 128 until one call takes an eighth of `budget_seconds` (or n
/// reaches 1024), then calls at that size while the budget lasts (at least 3 within twice the
/// budget); the best call counts. The first call, a warm-up (threads started), is not timed.
MatmulProbe probe_matmul(DType dtype, double budget_seconds = 0.03);

}  // namespace zt::engine_detail
