// Checkpoint files without an engine: where they are, what they hold, are they intact, export.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>

#include "io/hdf5_file.hpp"
#include "src/engine/checkpoint_validation.hpp"
#include "zerotrain/checkpoint.hpp"
#include "zerotrain/config.hpp"
#include "zerotrain/error.hpp"

namespace zt {
namespace fs = std::filesystem;

std::string checkpoint_file(const std::string& dir, const std::string& tag) {
  return (fs::path(dir) / (tag + ".h5")).string();
}

bool is_checkpoint_tag(const std::string& tag) {
  return !tag.empty() && tag.size() <= 200 && tag.front() != '.' && tag != "latest" &&
         std::all_of(tag.begin(), tag.end(),
                     [](char c) { return c > 0x20 && c < 0x7f && c != '/' && c != '\\'; });
}

std::optional<std::string> latest_checkpoint_tag(const std::string& dir) {
  const fs::path path = fs::path(dir) / "latest";
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::string text(4096, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<std::size_t>(in.gcount()));
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ')) text.pop_back();
  if (text.empty()) return std::nullopt;
  if (!is_checkpoint_tag(text)) {
    std::string shown;
    for (char c : text.substr(0, 120)) {
      const auto byte = static_cast<unsigned char>(c);
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\x%02x", byte);
      shown += byte >= 0x20 && byte < 0x7f ? std::string(1, c) : std::string(escaped);
    }
    ZT_THROW_AS(IoError, "'", path.string(), "' does not hold a checkpoint tag: \"", shown,
                text.size() > 120 ? "...\"" : "\"",
                "; expected one plain tag name (the file name without .h5: no '/', no leading '.', "
                "printable characters only)");
  }
  return text;
}

std::vector<std::string> checkpoint_tags_newest_first(const std::string& dir) {
  std::vector<std::pair<std::int64_t, std::string>> found;
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_symlink() || !entry.is_regular_file() || name.front() == '.' ||
        entry.path().extension() != ".h5" || !is_checkpoint_tag(entry.path().stem().string()))
      continue;
    std::int64_t steps = -1;  // unreadable files sort last; verification decides about them
    try {
      io::H5File file = io::H5File::open_serial(entry.path().string());
      file.check_only_hard_links();  // no attribute is read through a link
      steps = file.int_attribute("engine", "global_steps");
    } catch (const Error&) {
    }
    found.emplace_back(steps, entry.path().stem().string());
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second > b.second;
  });
  std::vector<std::string> tags;
  for (auto& [steps, tag] : found) tags.push_back(std::move(tag));
  return tags;
}

std::optional<std::string> newest_valid_checkpoint(
    const std::string& dir, const std::function<void(const CheckpointSummary&)>& also_check) {
  std::vector<std::string> candidates;
  try {
    if (const std::optional<std::string> latest = latest_checkpoint_tag(dir)) candidates.push_back(*latest);
  } catch (const Error& error) {
    std::fprintf(stderr, "zerotrain: ignoring %s/latest: %s\n", dir.c_str(), error.what());
  }
  for (std::string& tag : checkpoint_tags_newest_first(dir)) {
    if (std::find(candidates.begin(), candidates.end(), tag) == candidates.end())
      candidates.push_back(std::move(tag));
  }
  for (const std::string& tag : candidates) {
    try {
      const std::string path = checkpoint_file(dir, tag);
      ZT_CHECK_AS(IoError, fs::is_regular_file(path), "no file '", path, "'");
      verify_checkpoint(path);
      if (also_check) also_check(inspect_checkpoint(path));
      return tag;
    } catch (const Error& error) {
      std::fprintf(stderr, "zerotrain: skipping checkpoint '%s': %s\n", tag.c_str(), error.what());
    }
  }
  return std::nullopt;
}

CheckpointSummary inspect_checkpoint(const std::string& path) {
  ZT_CHECK_AS(IoError, fs::exists(path), "checkpoint file '", path, "' does not exist");
  io::H5File file = io::H5File::open_serial(path);
  engine_detail::check_checkpoint_file(file);
  CheckpointSummary summary;
  summary.path = path;
  summary.tag = file.string_attribute("", "tag");
  summary.format_version = file.int_attribute("", "format_version");
  summary.global_steps = file.int_attribute("engine", "global_steps");
  summary.global_samples = file.int_attribute("engine", "global_samples");
  summary.world_size = file.int_attribute("engine", "world_size");
  summary.zero_stage = static_cast<int>(file.int_attribute("engine", "zero_stage"));
  summary.compute_dtype = file.string_attribute("engine", "compute_dtype");
  summary.parameters = file.int_attribute("model", "parameters");
  summary.client_state = file.string_attribute("", "client_state");
  if (file.has_attribute("engine", "slurm_job_id"))
    summary.slurm_job_id = file.string_attribute("engine", "slurm_job_id");
  summary.file_bytes = static_cast<std::uint64_t>(fs::file_size(path));
  if (file.exists("optimizer")) {
    summary.optimizer = file.string_attribute("optimizer", "type");
    summary.optimizer_step = file.int_attribute("optimizer", "step");
  }
  if (file.int_attribute("engine", "has_data_position") != 0) {
    summary.data_position = DataPosition{
        file.uint_attribute("engine", "data_seed"), file.uint_attribute("engine", "data_num_samples"),
        file.uint_attribute("engine", "data_epoch"), file.uint_attribute("engine", "data_offset")};
  }
  for (const std::string& name : file.datasets()) {
    const io::H5File::DatasetLayout layout = file.dataset_layout(name);
    summary.datasets.push_back(
        {name, layout.shape, file.uint_attribute(name, "checksum"), layout.kind == 'f' ? "fp32" : "int64"});
  }
  return summary;
}

void verify_checkpoint(const std::string& path) {
  const CheckpointSummary summary = inspect_checkpoint(path);
  io::H5File file = io::H5File::open_serial(path);
  for (const CheckpointDataset& dataset : summary.datasets) {
    std::int64_t count = 1;
    for (std::int64_t d : dataset.shape) count *= d;
    const bool integers = dataset.dtype == "int64";
    std::vector<std::uint64_t> storage(static_cast<std::size_t>(count));  // room for 8-byte elements
    std::uint64_t sum = 0;
    if (integers) {
      file.read_range(dataset.name, 0, count, storage.data(), DType::int64);
      sum = io::range_checksum(storage.data(), sizeof(std::uint64_t), 0, count);
    } else {
      auto* values = reinterpret_cast<float*>(storage.data());
      file.read_range(dataset.name, 0, count, values, DType::fp32);
      sum = io::range_checksum(values, sizeof(float), 0, count);
    }
    ZT_CHECK_AS(IoError, sum == dataset.checksum, "checkpoint '", path, "' dataset '", dataset.name,
                "' does not match its checksum (stored ", dataset.checksum, ", computed ", sum,
                "): the file is corrupted");
  }
}

namespace {

/// The model's config as attributes of the export's root, every key needed to rebuild the model
/// without zerotrain (docs/checkpoint-format.md, "Export"), under zerotrain's names and, for a GPT,
/// GPT-2's (n_embd, n_positions) too; `config` keeps the whole effective config (JSON).
void write_model_attributes(io::H5File& exported, const std::string& config_json) {
  exported.set_attribute("", "config", config_json);
  const Config config = Config::from_string(config_json, ConfigParseOptions{.warning_sink = {}});
  if (!config.model) return;  // the application's own model: only it knows how to rebuild it
  if (const auto* gpt = std::get_if<GptModelConfig>(&*config.model)) {
    exported.set_attribute("", "model_type", std::string("gpt"));
    for (const auto& [key, value] :
         {std::pair{"n_layer", gpt->n_layer}, std::pair{"n_head", gpt->n_head},
          std::pair{"d_model", gpt->d_model}, std::pair{"n_embd", gpt->d_model},
          std::pair{"seq_len", gpt->seq_len}, std::pair{"n_positions", gpt->seq_len},
          std::pair{"vocab_size", gpt->vocab_size},
          std::pair{"tie_embeddings", std::int64_t{gpt->tie_embeddings}}}) {
      exported.set_attribute("", key, value);
    }
    exported.set_attribute("", "dropout", gpt->dropout);
    exported.set_attribute("", "layer_norm_epsilon", 1e-5);                      // nn::Gpt's LayerNorms
    exported.set_attribute("", "activation_function", std::string("gelu_new"));  // tanh GELU, GPT-2's name
  } else {
    const auto& mlp = std::get<MlpModelConfig>(*config.model);
    exported.set_attribute("", "model_type", std::string("mlp"));
    std::string sizes = "[";
    for (std::int64_t size : mlp.sizes) sizes += (sizes.size() > 1 ? ", " : "") + std::to_string(size);
    exported.set_attribute("", "sizes", sizes + "]");
    exported.set_attribute("", "activation", std::string(to_string(mlp.activation)));
  }
}

}  // namespace

void export_checkpoint(const std::string& path, const std::string& out, DType dtype) {
  ZT_CHECK_AS(ConfigError, dtype == DType::fp32 || dtype == DType::bf16,
              "export: --dtype must be fp32 or bf16, got ", dtype_name(dtype));
  const CheckpointSummary summary = inspect_checkpoint(path);
  io::H5File file = io::H5File::open_serial(path);
  // Written next to OUT and renamed, so a failed export never leaves a partial file under OUT.
  const std::string temporary = out + ".tmp";
  try {
    io::H5File exported = io::H5File::create_serial(temporary);
    for (const CheckpointDataset& dataset : summary.datasets) {
      if (dataset.name.rfind("model/", 0) != 0) continue;
      const std::string name = dataset.name.substr(6);
      std::int64_t count = 1;
      for (std::int64_t d : dataset.shape) count *= d;
      std::vector<float> values(static_cast<std::size_t>(count));
      file.read_range(dataset.name, 0, count, values.data(), DType::fp32);
      exported.create_dataset(name, dataset.shape, dtype);
      if (dtype == DType::fp32) {
        exported.write_range(name, 0, count, values.data(), DType::fp32);
      } else {
        std::vector<bf16> rounded(values.begin(), values.end());
        exported.write_range(name, 0, count, rounded.data(), DType::bf16);
        exported.set_attribute(name, "dtype", std::string("bf16"));
      }
    }
    exported.set_attribute("", "source", path);
    exported.set_attribute("", "tag", summary.tag);
    exported.set_attribute("", "global_steps", summary.global_steps);
    exported.set_attribute("", "dtype", std::string(dtype_name(dtype)));
    // A stored config that today's parser refuses (an older zerotrain's) costs the model
    // attributes, not the weights: say so and export the tensors.
    try {
      write_model_attributes(exported, file.string_attribute("engine", "config"));
    } catch (const ConfigError& error) {
      std::fprintf(
          stderr,
          "zerotrain checkpoint export: warning: the stored config of '%s' (/engine attribute 'config') "
          "does not parse (%s); the export has no model attributes\n",
          path.c_str(), error.what());
    }
    exported.close();
  } catch (...) {
    std::error_code ignored;
    fs::remove(temporary, ignored);
    throw;
  }
  fs::rename(temporary, out);
}

}  // namespace zt
