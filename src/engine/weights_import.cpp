// Weights in: a plain HDF5 file of named tensors (the layout of `zerotrain checkpoint export`, or
// scripts/zerotrain_torch.py convert's) loaded into the engine's parameters (Engine::load_weights,
// "init": {"from": PATH}), and `zerotrain checkpoint import`, which saves them as a step-0
// checkpoint (docs/checkpoint-format.md, "Import").
#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include "base/text.hpp"
#include "io/hdf5_file.hpp"
#include "src/engine/checkpointer.hpp"
#include "src/engine/string_broadcast.hpp"
#include "zerotrain/engine.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/mpi_communicator.hpp"
#include "zerotrain/runtime.hpp"

namespace zt::engine_detail {
namespace fs = std::filesystem;

namespace {

/// How a weights file stores one tensor: fp32 or fp64 floats (read as fp32), or bf16 bit patterns
/// (uint16 with attribute dtype = "bf16", what `checkpoint export --dtype bf16` writes).
bool stored_as_bf16(const io::H5File& file, const std::string& name) {
  return file.has_attribute(name, "dtype") && file.string_attribute(name, "dtype") == "bf16";
}

std::string listed(const std::vector<std::string>& names) {
  std::string text;
  for (std::size_t i = 0; i < names.size() && i < 20; ++i) text += (i == 0 ? "" : ", ") + names[i];
  if (names.size() > 20) text += ", ... (" + std::to_string(names.size()) + " in all)";
  return text;
}

/// Elements [first, first + count) of tensor `name` as fp32.
void read_as_fp32(const io::H5File& file, const std::string& name, bool bf16_bits, std::int64_t first,
                  std::int64_t count, float* out) {
  if (!bf16_bits) {
    file.read_range(name, first, count, out, DType::fp32);
    return;
  }
  std::vector<bf16> bits(static_cast<std::size_t>(count));
  file.read_range(name, first, count, bits.data(), DType::bf16);
  std::transform(bits.begin(), bits.end(), out, [](bf16 value) { return static_cast<float>(value); });
}

}  // namespace

void Checkpointer::set_frozen_value(nn::Parameter& parameter, const float* values) const {
  Tensor& value = parameter.value;
  const Tensor converted =
      Tensor::view_of(const_cast<float*>(values), value.shape(), DType::fp32).to(value.dtype());
  execution_.from_host(value.raw_data(), converted.raw_data(), value.nbytes());
  execution_.synchronize();
}

std::vector<float> Checkpointer::frozen_value(const nn::Parameter& parameter) const {
  const Tensor& value = parameter.value;
  Tensor host = Tensor::empty(value.shape(), value.dtype());
  execution_.to_host(host.raw_data(), value.raw_data(), value.nbytes());
  const Tensor widened = host.to(DType::fp32);
  const float* data = widened.data<float>();
  return std::vector<float>(data, data + value.numel());
}

std::size_t Checkpointer::load_weights(const std::string& path) {
  Communicator& everyone = parallel_.everyone();
  // Every parameter of the whole model (every stage's, each once), by name and global shape.
  std::map<std::string, std::vector<std::int64_t>> expected;
  for (const GlobalParameter& parameter : global_) expected[parameter.name] = parameter.shape;
  for (const nn::Parameter* parameter : frozen_) {
    expected[parameter->name] =
        std::vector<std::int64_t>(parameter->value.shape().begin(), parameter->value.shape().end());
  }
  std::string bf16_names;  // one name per line: tensors stored as bf16 bits
  // Rank 0 checks the whole file against the model before any rank reads: every mismatch at once.
  on_rank0_everywhere(everyone, [&] {
    ZT_CHECK_AS(IoError, fs::is_regular_file(path), "weights file '", path, "' does not exist");
    const io::H5File file = io::H5File::open_serial(path);
    file.check_only_hard_links();
    std::vector<std::string> missing, unexpected, wrong;
    std::map<std::string, bool> found;
    for (const std::string& name : file.datasets()) {
      const io::H5File::DatasetLayout layout = file.dataset_layout(name);
      const auto it = expected.find(name);
      if (it == expected.end()) {
        // A tied model has no lm_head: the file's copy is welcome when it is wte's, bit for bit.
        if (name == "lm_head.weight" && expected.contains("wte.weight") && file.exists("wte.weight") &&
            file.shape("wte.weight") == layout.shape) {
          std::vector<float> head(static_cast<std::size_t>(layout.count)), wte(head.size());
          read_as_fp32(file, name, stored_as_bf16(file, name), 0, layout.count, head.data());
          read_as_fp32(file, "wte.weight", stored_as_bf16(file, "wte.weight"), 0, layout.count, wte.data());
          ZT_CHECK_AS(IoError, head == wte, "weights file '", path,
                      "': the model ties lm_head to wte (model.tie_embeddings true) but the file's "
                      "lm_head.weight differs from its wte.weight; set model.tie_embeddings to false to "
                      "import both");
          continue;
        }
        unexpected.push_back(name + " " + base::shape_text(layout.shape));
        continue;
      }
      found[name] = true;
      const bool bits = stored_as_bf16(file, name);
      const bool readable =
          bits ? layout.kind == 'u' && layout.element_size == 2
               : layout.kind == 'f' && (layout.element_size == 4 || layout.element_size == 8);
      if (!readable) {
        wrong.push_back("'" + name + "' is stored as " +
                        (layout.kind == 'f'   ? "float"
                         : layout.kind == 'i' ? "int"
                                              : "uint") +
                        std::to_string(8 * layout.element_size) + (bits ? " with dtype bf16" : "") +
                        ", expected fp32, fp64 or bf16 (uint16 bits with attribute dtype = \"bf16\")");
      } else if (layout.shape != it->second) {
        wrong.push_back("'" + name + "' has shape " + base::shape_text(layout.shape) +
                        ", the model expects " + base::shape_text(it->second));
      }
      if (bits) bf16_names += name + "\n";
    }
    for (const auto& [name, shape] : expected) {
      if (!found.contains(name)) missing.push_back(name + " " + base::shape_text(shape));
    }
    if (missing.empty() && unexpected.empty() && wrong.empty()) return;
    std::string problems;
    if (!wrong.empty()) problems += "; " + listed(wrong);
    if (!missing.empty()) problems += "; missing tensors: " + listed(missing);
    if (!unexpected.empty()) problems += "; unexpected tensors: " + listed(unexpected);
    std::string hint;
    const bool hugging_face = std::any_of(unexpected.begin(), unexpected.end(), [](const std::string& name) {
      return name.starts_with("transformer.");
    });
    if (hugging_face) {
      hint =
          ". Its names are Hugging Face GPT-2's: convert it first (scripts/zerotrain_torch.py convert, "
          "installed in share/zerotrain/python)";
    } else if (std::any_of(missing.begin(), missing.end(),
                           [](const std::string& name) { return name.starts_with("lm_head.weight"); })) {
      hint =
          ". The file has no lm_head.weight: its model ties lm_head to wte (set model.tie_embeddings to "
          "true)";
    }
    ZT_THROW_AS(IoError, "weights file '", path, "' does not fit the model of the config", problems, hint);
  });
  std::set<std::string> bf16_tensors;
  std::istringstream lines(broadcast_string(everyone, bf16_names));
  for (std::string line; std::getline(lines, line);) bf16_tensors.insert(line);
  auto is_bf16 = [&](const std::string& name) { return bf16_tensors.contains(name); };

  io::H5File file = io::H5File::open_parallel(path, parallel_.everyone_comm());
  const std::vector<FlatParameter>& layout = plan_.layout();
  std::vector<float> values;
  std::vector<float> owned;
  for (std::size_t i = 0; i < layout.size(); ++i) {
    const std::string& name = layout[i].name;
    const auto [held_first, held_count] = strategy_.held_range(i);
    values.assign(static_cast<std::size_t>(held_count), 0.0f);
    read_as_fp32(file, name, is_bf16(name), held_first, held_count, values.data());
    strategy_.load_parameter(i, values.data());
    if (plan_.separate_master()) {
      const auto [first, count] = owned_range(i);
      owned.assign(static_cast<std::size_t>(plan_.owned()[i].count), 0.0f);
      std::copy_n(values.data() + (first - held_first), count, owned.data());
      states_.write_master(i, owned.data());
    }
  }
  for (nn::Parameter* parameter : frozen_) {
    values.assign(static_cast<std::size_t>(parameter->value.numel()), 0.0f);
    read_as_fp32(file, parameter->name, is_bf16(parameter->name), 0, parameter->value.numel(), values.data());
    set_frozen_value(*parameter, values.data());
  }
  file.close();
  states_.flush();
  strategy_.after_load();
  return layout.size() + frozen_.size();
}

}  // namespace zt::engine_detail

namespace zt {

std::string import_weights(Runtime& runtime, const std::string& weights, Config config,
                           const std::string& dir, SaveOptions options) {
  config.init.from.reset();  // the weights come from `weights`, once
  const int stages = static_cast<int>(config.pipeline.stage_count());
  std::unique_ptr<nn::Module> model =
      stages > 1 ? build_model(config, pipeline_stage_of(runtime, config)) : build_model(config);
  options.file_mode = config.checkpoint.file_mode;
  options.dir_mode = config.checkpoint.dir_mode;
  Engine engine(runtime, *model, std::move(config));
  engine.load_weights(weights);
  if (!options.tag) options.tag = "global_step0";
  return checkpoint_file(dir, engine.save_checkpoint(dir, options));
}

}  // namespace zt
