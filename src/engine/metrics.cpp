// zt::train's metrics: the record -> sinks fan-out, DeepSpeed's CSV layout, TensorBoard, alerts.
#include "src/engine/metrics.hpp"

#include <unistd.h>

#include <charconv>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "base/resident_memory.hpp"
#include "io/tensorboard_events.hpp"
#include "zerotrain/error.hpp"

namespace zt::engine_detail {
namespace fs = std::filesystem;
namespace {

/// Shortest text that reads back as the same double (what Python's csv module writes for a float).
std::string number_text(double value) {
  char text[32];
  const auto result = std::to_chars(text, text + sizeof text, value);
  return std::string(text, result.ptr);
}

class JsonLinesSink final : public MetricsSink {
 public:
  explicit JsonLinesSink(const std::string& path) : path_(path) {
    out_.open(path, std::ios::out | std::ios::trunc);
    ZT_CHECK_AS(IoError, out_.good(), "cannot write metrics to '", path, "'");
  }
  void write(const nlohmann::json& record, std::span<const MetricScalar>) override {
    out_ << record.dump() << '\n';
    out_.flush();  // a run killed midway still leaves every finished step on disk
    ZT_CHECK_AS(IoError, out_.good(), "writing metrics to '", path_, "' failed");
  }

 private:
  std::string path_;
  std::ofstream out_;
};

/// DeepSpeed's csv_monitor layout: one file per scalar, DIR/<tag with '/' and ' ' as '_'>.csv,
/// a header row "step,<last part of the tag>", then one "step,value" row per step. A file that
/// exists already (a resumed run) is appended to, without a second header.
class CsvMonitorSink final : public MetricsSink {
 public:
  explicit CsvMonitorSink(std::string directory) : directory_(std::move(directory)) {
    std::error_code error;
    fs::create_directories(directory_, error);
    ZT_CHECK_AS(IoError, !error, "csv_monitor: cannot create directory '", directory_,
                "': ", error.message());
  }
  void write(const nlohmann::json&, std::span<const MetricScalar> scalars) override {
    for (const MetricScalar& scalar : scalars) {
      std::ofstream& out = file_of(scalar.tag);
      out << scalar.step << ',' << number_text(scalar.value) << '\n';
      out.flush();
      ZT_CHECK_AS(IoError, out.good(), "csv_monitor: writing '", path_of(scalar.tag), "' failed");
    }
  }

 private:
  std::string path_of(const std::string& tag) const {
    std::string name = tag;
    for (char& c : name)
      if (c == '/' || c == ' ') c = '_';
    return (fs::path(directory_) / (name + ".csv")).string();
  }
  std::ofstream& file_of(const std::string& tag) {
    auto found = files_.find(tag);
    if (found != files_.end()) return found->second;
    const std::string path = path_of(tag);
    std::error_code error;
    const bool fresh = !fs::exists(path, error) || fs::file_size(path, error) == 0;
    std::ofstream& out = files_[tag];
    out.open(path, std::ios::out | std::ios::app);
    ZT_CHECK_AS(IoError, out.good(), "csv_monitor: cannot write '", path, "'");
    if (fresh) out << "step," << tag.substr(tag.rfind('/') + 1) << '\n';
    return out;
  }

  std::string directory_;
  std::map<std::string, std::ofstream> files_;
};

class TensorBoardSink final : public MetricsSink {
 public:
  explicit TensorBoardSink(const std::string& directory) : file_(directory) {}
  void write(const nlohmann::json&, std::span<const MetricScalar> scalars) override {
    if (scalars.empty()) return;
    const double now =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    for (const MetricScalar& scalar : scalars) file_.add_scalar(scalar.tag, scalar.value, scalar.step, now);
    file_.flush();
  }
  const std::string& path() const { return file_.path(); }

 private:
  io::TensorBoardEventFile file_;
};

std::int64_t read_cgroup_limit() {
  // cgroup v2: "0::/path" in /proc/self/cgroup, the limit in /sys/fs/cgroup/path/memory.max
  // ("max": none); cgroup v1: the memory controller's memory.limit_in_bytes.
  std::ifstream cgroups("/proc/self/cgroup");
  std::string line;
  std::int64_t limit = 0;
  auto read_number = [](const fs::path& file) -> std::int64_t {
    std::ifstream in(file);
    std::string text;
    if (!(in >> text) || text == "max") return 0;
    std::int64_t value = 0;
    const auto result = std::from_chars(text.data(), text.data() + text.size(), value);
    // v1 writes a huge page-rounded number for "no limit".
    return result.ec == std::errc() && value > 0 && value < (std::int64_t{1} << 60) ? value : 0;
  };
  while (std::getline(cgroups, line)) {
    const auto first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1);
    std::int64_t found = 0;
    if (controllers.empty()) {
      found = read_number(fs::path("/sys/fs/cgroup") / fs::path(path).relative_path() / "memory.max");
    } else if (controllers.find("memory") != std::string::npos) {
      found = read_number(fs::path("/sys/fs/cgroup/memory") / fs::path(path).relative_path() /
                          "memory.limit_in_bytes");
    }
    if (found > 0 && (limit == 0 || found < limit)) limit = found;
  }
  return limit;
}

}  // namespace

std::vector<MetricScalar> step_scalars(const nlohmann::json& record) {
  std::vector<MetricScalar> scalars;
  if (record.value("event", "") == "eval") {  // the validation loss, against the same x axis
    const std::int64_t samples = record.at("samples").get<std::int64_t>();
    scalars.push_back({"Eval/Samples/eval_loss", record.at("loss").get<double>(), samples});
    scalars.push_back({"Eval/Samples/eval_perplexity", record.at("perplexity").get<double>(), samples});
    return scalars;
  }
  if (record.value("event", "") != "step") return scalars;
  const std::int64_t samples = record.at("samples").get<std::int64_t>();
  auto add = [&](const std::string& name, const nlohmann::json* value) {
    if (value != nullptr && value->is_number())
      scalars.push_back({"Train/Samples/" + name, value->get<double>(), samples});
  };
  auto field = [&](const char* key) { return record.contains(key) ? &record.at(key) : nullptr; };
  // DeepSpeed's names first (its engine writes these three), then zerotrain's.
  add("train_loss", field("loss"));
  add("lr", field("lr"));
  add("loss_scale", field("loss_scale"));
  for (const char* key :
       {"grad_norm", "tokens_per_s", "mfu", "step_time_s", "comm_bytes", "comm_wait_s", "comm_busy_s"})
    add(key, field(key));
  if (const nlohmann::json* memory = field("mem")) {
    for (const auto& [category, bytes] : memory->items())
      if (bytes.is_number()) add("mem_" + category, &bytes);
  }
  return scalars;
}

MetricsWriter::MetricsWriter(const std::optional<std::string>& jsonl, const Config& config) {
  if (jsonl) {
    sinks_.push_back(std::make_unique<JsonLinesSink>(*jsonl));
    destinations_.push_back(*jsonl);
  }
  if (config.csv_monitor.enabled) {
    sinks_.push_back(std::make_unique<CsvMonitorSink>(config.csv_monitor.directory()));
    destinations_.push_back("csv_monitor " + config.csv_monitor.directory() + "/");
  }
  if (config.tensorboard.enabled) {
    auto sink = std::make_unique<TensorBoardSink>(config.tensorboard.directory());
    destinations_.push_back("tensorboard " + sink->path());
    sinks_.push_back(std::move(sink));
  }
}

MetricsWriter::~MetricsWriter() = default;

void MetricsWriter::write(const nlohmann::json& record) {
  if (sinks_.empty()) return;
  const std::lock_guard lock(mutex_);
  write_locked(record);
}

bool MetricsWriter::try_write(const nlohmann::json& record, double seconds) {
  if (sinks_.empty()) return false;
  std::unique_lock lock(mutex_, std::chrono::duration<double>(seconds));
  if (!lock.owns_lock()) return false;
  write_locked(record);
  return true;
}

void MetricsWriter::write_locked(const nlohmann::json& record) {
  const std::vector<MetricScalar> scalars = step_scalars(record);
  for (const std::unique_ptr<MetricsSink>& sink : sinks_) sink->write(record, scalars);
}

std::vector<std::string> MetricsWriter::destinations() const {
  return destinations_;
}

void raise_alert(MetricsWriter& metrics, int rank, const std::string& kind, const std::string& message,
                 nlohmann::json details) {
  std::fprintf(stderr, "zerotrain train: warning: %s\n", message.c_str());
  std::fflush(stderr);
  nlohmann::json record = {{"event", "alert"}, {"kind", kind}, {"rank", rank}, {"message", message}};
  record.update(details);
  metrics.write(record);
}

MemoryLimit host_memory_limit(const AlertsConfig& alerts) {
  if (alerts.memory_limit) return {*alerts.memory_limit, "alerts.memory_limit"};
  const long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGE_SIZE);
  MemoryLimit limit;
  if (pages > 0 && page_size > 0) limit = {static_cast<std::int64_t>(pages) * page_size, "physical memory"};
  if (const std::int64_t cgroup = read_cgroup_limit();
      cgroup > 0 && (limit.bytes == 0 || cgroup < limit.bytes))
    limit = {cgroup, "cgroup memory limit"};
  return limit;
}

std::int64_t resident_bytes() {
  return base::resident_memory().current;
}

}  // namespace zt::engine_detail
