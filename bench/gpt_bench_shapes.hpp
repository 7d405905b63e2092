// The GPT shapes the C++ benchmarks train (the "small" and "gpt2" of bench/gpt_model.py) and their
// ds_config pieces, shared by zt_bench_gpt_step and zt_bench_offload.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zerotrain/engine.hpp"

namespace zt::bench {

struct GptBenchShape {
  std::string name;
  int n_layer, n_head, d_model, seq_len, vocab;
};

inline const GptBenchShape kSmallGpt{"small", 4, 4, 128, 64, 512};
inline const GptBenchShape kGpt2{"gpt2", 12, 12, 768, 1024, 50257};

/// The "model" section: GPT-2 layout, no dropout, tied embeddings.
inline std::string gpt_model_json(const GptBenchShape& shape) {
  return R"({"type": "gpt", "n_layer": )" + std::to_string(shape.n_layer) + R"(, "n_head": )" +
         std::to_string(shape.n_head) + R"(, "d_model": )" + std::to_string(shape.d_model) +
         R"(, "seq_len": )" + std::to_string(shape.seq_len) + R"(, "vocab_size": )" +
         std::to_string(shape.vocab) + R"(, "dropout": 0.0, "tie_embeddings": true})";
}

/// The "optimizer" section: AdamW as bench/pytorch_gpt_step.py sets it.
inline constexpr const char* kBenchAdamW =
    R"({"type": "AdamW", "params": {"lr": 6e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}})";

/// One micro-batch of `tokens` token ids (and next-token targets) spread over the vocabulary: the
/// work of a step that does not depend on the data.
inline Batch token_batch(const GptBenchShape& shape, std::int64_t tokens) {
  std::vector<std::int32_t> inputs(static_cast<std::size_t>(tokens)),
      targets(static_cast<std::size_t>(tokens));
  for (std::int64_t t = 0; t < tokens; ++t) {
    inputs[static_cast<std::size_t>(t)] = static_cast<std::int32_t>((t * 7919) % shape.vocab);
    targets[static_cast<std::size_t>(t)] = static_cast<std::int32_t>((t * 7919 + 1) % shape.vocab);
  }
  return {Tensor::from_vector(inputs, {1, tokens}), Tensor::from_vector(targets, {1, tokens})};
}

}  // namespace zt::bench
