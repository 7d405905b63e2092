// `zerotrain plan`'s pieces that need no MPI: sizes, the --candidates syntax, the batch rule, the
// candidates' configs and their predicted memory (src/engine/plan.hpp, base/text.hpp).
#include <gtest/gtest.h>

#include <string>

#include "base/text.hpp"
#include "src/engine/plan.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/estimate.hpp"

namespace {

using zt::base::parse_byte_size;
using namespace zt::engine_detail;

std::string error_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const zt::ConfigError& error) {
    return error.what();
  }
  return "(no ConfigError)";
}

constexpr const char* kBase = R"({
  "train_batch_size": 16,
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
  "zero_optimization": {"stage": 0, "reduce_bucket_size": 5000,
                        "offload_optimizer": {"device": "nvme", "nvme_path": "/x", "buffer_count": 5}},
  "model": {"type": "gpt", "n_layer": 2, "n_head": 2, "d_model": 32, "seq_len": 16, "vocab_size": 256}
})";

TEST(Plan, ByteSizes) {
  EXPECT_EQ(parse_byte_size("1048576"), 1048576u);
  EXPECT_EQ(parse_byte_size("512MiB"), 512u << 20);
  EXPECT_EQ(parse_byte_size("2 GiB"), 2ull << 30);
  EXPECT_EQ(parse_byte_size("2gib"), 2ull << 30);
  EXPECT_EQ(parse_byte_size("1.5GB"), 1500000000u);
  EXPECT_EQ(parse_byte_size("64k"), 65536u);
  EXPECT_EQ(parse_byte_size("10B"), 10u);
  for (const char* bad : {"", "GiB", "-1", "2XB", "1.2.3", ".", "1e3", "2 G iB", "99999999999TiB"})
    EXPECT_FALSE(parse_byte_size(bad).has_value()) << bad;
}

TEST(Plan, CandidateSyntax) {
  const CandidateSpace space = parse_candidate_space("stage=1,2; offload=none,cpu ;micro=4,8,4");
  EXPECT_EQ(space.stages, (std::vector<int>{1, 2}));
  EXPECT_EQ(space.offloads, (std::vector<PlanOffload>{PlanOffload::none, PlanOffload::cpu}));
  EXPECT_EQ(space.micro_batches, (std::vector<std::int64_t>{4, 8}));  // duplicates dropped
  const CandidateSpace defaults = parse_candidate_space("offload=cpu+params");
  EXPECT_EQ(defaults.stages, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(defaults.offloads, std::vector<PlanOffload>{PlanOffload::cpu_params});
  EXPECT_TRUE(defaults.micro_batches.empty());

  EXPECT_NE(error_of([] { parse_candidate_space("stag=1"); }).find("unknown key 'stag'"), std::string::npos);
  EXPECT_NE(error_of([] { parse_candidate_space("stage"); }).find("'stage' has no '='"), std::string::npos);
  EXPECT_NE(error_of([] { parse_candidate_space("stage=1,"); }).find("has an empty value"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_candidate_space("stage=4"); }).find("out of range: expected 0..3"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_candidate_space("micro=x"); }).find("'x' in 'micro=x' is not a whole number"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_candidate_space("micro=0"); }).find("out of range"), std::string::npos);
  EXPECT_NE(error_of([] { parse_candidate_space("offload=nvme"); }).find("offload 'nvme' is not one of"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_candidate_space("stage=1;stage=2"); }).find("key 'stage' is given twice"),
            std::string::npos);
}

TEST(Plan, BatchRule) {
  EXPECT_NO_THROW(check_global_batch(16, 4));
  EXPECT_NE(error_of([] { check_global_batch(15, 2); }).find("the nearest are 14 and 16"), std::string::npos);
  EXPECT_NE(error_of([] { check_global_batch(3, 4); }).find("the nearest are 4"), std::string::npos);
  EXPECT_NE(error_of([] { check_global_batch(0, 1); }).find("at least 1"), std::string::npos);
  // 64 on 2 ranks: 32 per rank, micro-batches with at most 8 accumulation steps.
  EXPECT_EQ(default_micro_batches(64, 2), (std::vector<std::int64_t>{32, 16, 8, 4}));
  EXPECT_EQ(default_micro_batches(12, 1), (std::vector<std::int64_t>{12, 6, 4, 3, 2}));
  EXPECT_NE(error_of([] {
              expand_candidates(parse_candidate_space("micro=3"), 16, 2);
            }).find("micro=3 does not divide the 8 samples per rank of global batch 16 on 2 rank(s)"),
            std::string::npos);
  EXPECT_NE(
      error_of([] { expand_candidates(parse_candidate_space("micro=3"), 16, 2); }).find("valid: 1, 2, 4, 8"),
      std::string::npos);
}

TEST(Plan, CandidatesWhereTheirStageAllowsTheirOffload) {
  const std::vector<PlanCandidate> all = expand_candidates(CandidateSpace{}, 16, 2);
  // stage 0: none; 1, 2: none, cpu; 3: none, cpu, cpu+params = 8 combinations x micro 8, 4, 2, 1.
  ASSERT_EQ(all.size(), 32u);
  for (const PlanCandidate& candidate : all) {
    EXPECT_EQ(candidate.micro_batch * candidate.accumulation * 2, 16) << candidate.name();
    if (candidate.offload == PlanOffload::cpu) {
      EXPECT_GE(candidate.stage, 1) << candidate.name();
    }
    if (candidate.offload == PlanOffload::cpu_params) {
      EXPECT_EQ(candidate.stage, 3) << candidate.name();
    }
  }
  EXPECT_EQ(all.front().name(), "stage 0, offload none, micro 8 x gas 1");
  EXPECT_NE(error_of([] {
              expand_candidates(parse_candidate_space("stage=0;offload=cpu"), 16, 2);
            }).find("no candidate"),
            std::string::npos);
}

TEST(Plan, CandidateConfigs) {
  const nlohmann::json base = nlohmann::json::parse(kBase);
  const nlohmann::json none = candidate_config_json(base, {2, PlanOffload::none, 4, 2}, 16);
  EXPECT_EQ(none["train_batch_size"], 16);
  EXPECT_EQ(none["train_micro_batch_size_per_gpu"], 4);
  EXPECT_EQ(none["gradient_accumulation_steps"], 2);
  EXPECT_EQ(none["zero_optimization"]["stage"], 2);
  EXPECT_EQ(none["zero_optimization"]["reduce_bucket_size"], 5000);  // the base's other keys stay
  EXPECT_FALSE(none["zero_optimization"].contains("offload_optimizer"));
  const nlohmann::json cpu = candidate_config_json(base, {3, PlanOffload::cpu_params, 8, 1}, 16);
  EXPECT_EQ(cpu["zero_optimization"]["offload_optimizer"]["device"], "cpu");
  EXPECT_EQ(cpu["zero_optimization"]["offload_optimizer"]["buffer_count"], 5);
  EXPECT_FALSE(cpu["zero_optimization"]["offload_optimizer"].contains("nvme_path"));
  EXPECT_EQ(cpu["zero_optimization"]["offload_param"]["device"], "cpu");
  // What the engine parses: the batch rule holds at 2 ranks.
  zt::Config parsed = zt::Config::from_string(cpu.dump(), 2);
  EXPECT_EQ(parsed.batch().gradient_accumulation_steps, 1);
  EXPECT_EQ(parsed.zero_optimization.offload_param.device, zt::OffloadDevice::cpu);
}

TEST(Plan, PredictedPeakIsThePlansStatesBucketsActivationsAndTransients) {
  const nlohmann::json base = nlohmann::json::parse(kBase);
  for (int stage : {0, 1, 2, 3}) {
    const zt::Config config = zt::Config::from_string(
        candidate_config_json(base, {stage, PlanOffload::none, 4, 2}, 16).dump(), zt::ConfigParseOptions{});
    const zt::MemoryEstimate estimate = zt::estimate_model_state_memory(config, 2);
    const PredictedMemory predicted = predict_step_memory(config, 2);
    EXPECT_EQ(predicted.model_states, estimate.resident()) << stage;
    EXPECT_EQ(predicted.buckets, estimate.bucket_buffers) << stage;
    ASSERT_TRUE(estimate.activations.has_value());
    EXPECT_EQ(predicted.activations, estimate.activations->peak) << stage;
    // A block: 4 x 32 x 32 + 4 x 32 (attention) + 8 x 32 x 32 + 5 x 32 (MLP) + 4 x 32 (two layer
    // norms) = 12704 parameters; the embeddings (256 + 16) x 32 = 8704.
    const std::uint64_t block = 4 * 12704;
    const std::uint64_t everything = 4u * static_cast<std::uint64_t>(estimate.parameters_count);
    const std::uint64_t expected = stage < 2 ? 0 : stage == 2 ? block : block + everything;
    EXPECT_EQ(predicted.transient, expected) << stage;
    EXPECT_EQ(predicted.peak(),
              predicted.model_states + predicted.buckets + predicted.activations + predicted.transient);
  }
}

}  // namespace
