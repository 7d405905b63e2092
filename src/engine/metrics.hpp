// zt::train's metrics (docs/metrics.md): every record goes to one place, MetricsWriter, which
// hands it to its sinks: the JSON-lines file (--metrics), DeepSpeed's csv_monitor files and a
// TensorBoard event file. The CSV and TensorBoard sinks take the scalars of step records, named
// as DeepSpeed names them (step_scalars).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "zerotrain/config.hpp"

namespace zt::engine_detail {

/// One value of a step for the CSV and TensorBoard sinks. `step` is the x axis: the global
/// samples, as DeepSpeed's monitor writes them.
struct MetricScalar {
  std::string tag;  // "Train/Samples/train_loss"
  double value = 0.0;
  std::int64_t step = 0;
};

/// The scalars of a record: a "step" record's loss, lr, loss scale, gradient norm, throughput and
/// MFU, communication and memory by category; an "eval" record's loss and perplexity
/// (Eval/Samples/eval_loss, eval_perplexity); none for other events.
std::vector<MetricScalar> step_scalars(const nlohmann::json& record);

class MetricsSink {
 public:
  virtual ~MetricsSink() = default;
  virtual void write(const nlohmann::json& record, std::span<const MetricScalar> scalars) = 0;
};

/// The sinks a run writes to (rank 0's; other ranks have none). Thread-safe: the watchdog's
/// thread writes its report through it while the training thread may be writing a step.
class MetricsWriter {
 public:
  MetricsWriter() = default;
  /// `jsonl`: the --metrics file; the config's tensorboard and csv_monitor when enabled.
  MetricsWriter(const std::optional<std::string>& jsonl, const Config& config);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  bool active() const { return !sinks_.empty(); }
  void write(const nlohmann::json& record);
  /// Like write(), but gives up (returns false) when the lock is not free within `seconds`: for
  /// the watchdog, which must end the job whatever the training thread is doing.
  bool try_write(const nlohmann::json& record, double seconds);
  /// Where each sink writes, for the run's header ("metrics: run.jsonl, csv_monitor DIR, ...").
  std::vector<std::string> destinations() const;

 private:
  void write_locked(const nlohmann::json& record);

  std::vector<std::unique_ptr<MetricsSink>> sinks_;
  std::vector<std::string> destinations_;
  std::timed_mutex mutex_;
};

/// A warning line on stderr (with the rank) and an {"event": "alert", "kind", "message", ...}
/// record; `details` adds fields.
void raise_alert(MetricsWriter& metrics, int rank, const std::string& kind, const std::string& message,
                 nlohmann::json details = nlohmann::json::object());

/// A rank's host memory limit: alerts.memory_limit, else the smaller of the cgroup's (what Slurm's
/// --mem and containers set) and the physical memory.
struct MemoryLimit {
  std::int64_t bytes = 0;  // 0: unknown
  std::string source;      // "alerts.memory_limit", "cgroup memory.max", "physical memory"
};
MemoryLimit host_memory_limit(const AlertsConfig& alerts);
/// This process's resident set size in bytes (VmRSS), 0 where unknown.
std::int64_t resident_bytes();

}  // namespace zt::engine_detail
