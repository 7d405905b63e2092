// `zerotrain plan` (docs/plan.md): choose the ZeRO stage, offload and micro-batch of a config for
// the job's world size. Each candidate's memory is predicted from the engine's partition plan and
// the activation estimate (those that do not fit the memory limit are pruned); the survivors train
// a few steps each and are ranked by measured tokens/s; the chosen one is checked against the
// single-rank baseline on the same data, saved, resumed at the same and at another world size and
// exported; its config and a report of everything measured are written out.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zerotrain/config.hpp"
#include "zerotrain/runtime.hpp"

namespace zt::engine_detail {

/// Where a candidate keeps its optimizer states and parameters: zero_optimization.offload_optimizer
/// and offload_param. `cpu` (ZeRO-Offload) needs stage 1-3, `cpu+params` (both) stage 3.
enum class PlanOffload { none, cpu, cpu_params };
std::string_view plan_offload_name(PlanOffload offload);  // "none", "cpu", "cpu+params"

struct PlanCandidate {
  int stage = 0;
  PlanOffload offload = PlanOffload::none;
  std::int64_t micro_batch = 1;
  std::int64_t accumulation = 1;  // gradient_accumulation_steps: global batch / (micro x ranks)
  /// "stage 2, offload cpu, micro 4 x gas 2"
  std::string name() const;
};

/// The lists a candidate set is the product of. Empty micro_batches: the default sizes.
struct CandidateSpace {
  std::vector<int> stages = {0, 1, 2, 3};
  std::vector<PlanOffload> offloads = {PlanOffload::none, PlanOffload::cpu, PlanOffload::cpu_params};
  std::vector<std::int64_t> micro_batches;
};

/// --candidates "stage=1,2;offload=none,cpu;micro=4,8": keys stage (0-3), offload (none, cpu,
/// cpu+params) and micro (micro-batch sizes per rank), each once, separated by ';', values by ','.
/// A key left out keeps the default list. ConfigError naming the part that is wrong.
CandidateSpace parse_candidate_space(std::string_view text);

/// The batch rule for `global_batch` samples on `ranks` data-parallel ranks: a ConfigError naming
/// the nearest valid global batches when `ranks` does not divide it.
void check_global_batch(std::int64_t global_batch, int ranks);
/// Micro-batch sizes of the default set: the divisors m of global_batch / ranks with at most 8
/// accumulation steps, largest first.
std::vector<std::int64_t> default_micro_batches(std::int64_t global_batch, int ranks);
/// The candidates of `space` (stage x offload x micro; offload only where its stage allows it), in
/// that order. ConfigError for a micro-batch size that does not divide global_batch / ranks, naming
/// the valid ones.
std::vector<PlanCandidate> expand_candidates(const CandidateSpace& space, std::int64_t global_batch,
                                             int ranks);

/// The base config (its JSON as written) with the candidate's settings: the three batch keys,
/// zero_optimization.stage and the two offload sections (other keys of those sections kept).
nlohmann::json candidate_config_json(const nlohmann::json& base, const PlanCandidate& candidate,
                                     std::int64_t global_batch);

/// A rank's predicted peak of accounted memory in a training step, from the engine's plan.
struct PredictedMemory {
  std::uint64_t model_states = 0;  // resident between steps (MemoryEstimate::resident)
  std::uint64_t buckets = 0;       // communication staging (MemoryEstimate::bucket_buffers)
  std::uint64_t activations = 0;   // ActivationEstimate::peak
  /// During the step, stages 2-3: the full gradients of the layer whose backward runs (its
  /// parameters in the compute dtype); stage 3: the gathered parameters of the running layer and
  /// those prefetched or kept (at most stage3_max_live_parameters beyond it, and the model).
  std::uint64_t transient = 0;
  std::uint64_t peak() const { return model_states + buckets + activations + transient; }
};
PredictedMemory predict_step_memory(const Config& config, int ranks);

struct PlanOptions {
  std::string config_path;
  std::optional<std::int64_t> global_batch;   // default: the config's train_batch_size
  std::optional<std::uint64_t> memory_limit;  // bytes per rank; default: what the host has per rank
  std::optional<std::string> candidates;      // parse_candidate_space's syntax
  std::optional<std::string> data_path;       // overrides the config's data.path
  std::string out_dir = "plan";
  std::int64_t warmup_steps = 1;         // per candidate, not timed
  std::int64_t measure_steps = 3;        // per candidate, timed (the median is ranked)
  std::int64_t check_steps = 8;          // the baseline and resume checks
  std::optional<int> resume_world_size;  // default: world / 2 (1 on 2 ranks); 0: none
  std::string command_line;              // for the report
};

/// Collective over the runtime's world. Prints the tables on rank 0 and writes, in out_dir,
/// plan.json (the chosen config), plan-report.json and plan-report.md. Returns the exit code: 0,
/// or 1 when nothing fits or a check failed (each failure printed). ConfigError for bad options or
/// configs, thrown alike on every rank before anything trains.
int run_plan(Runtime& runtime, const PlanOptions& options);

}  // namespace zt::engine_detail
