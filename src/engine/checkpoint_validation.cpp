// A checkpoint file's consistency before any data is read (see checkpoint_validation.hpp).
#include "src/engine/checkpoint_validation.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "base/text.hpp"
#include "zerotrain/checkpoint.hpp"
#include "zerotrain/error.hpp"

namespace zt::engine_detail {
namespace {

using Kind = io::H5File::ObjectKind;

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::dataset:
      return "a dataset";
    case Kind::group:
      return "a group";
    case Kind::missing:
      return "missing";
    default:
      return "an object of another kind";
  }
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

}  // namespace

std::int64_t check_checkpoint_file(const io::H5File& file) {
  const std::string& path = file.path();
  const auto fail = [&](auto&&... what) { ZT_THROW_AS(IoError, "checkpoint '", path, "' ", what...); };
  if (!file.has_attribute("", "format") || file.string_attribute("", "format") != kCheckpointFormat)
    fail("is not a zerotrain checkpoint (no root attribute format = '", kCheckpointFormat, "')");
  const std::int64_t version = file.int_attribute("", "format_version");
  if (version < 1 || version > kCheckpointFormatVersion)
    fail("has format version ", version, "; this zerotrain reads versions 1 to ", kCheckpointFormatVersion,
         version > kCheckpointFormatVersion ? " (written by a newer zerotrain?)" : "");
  // Before any object is opened by name: no link may lead out of the file or elsewhere in it.
  file.check_only_hard_links();
  if (version >= kFirstFormatWithAttributeChecksum) {
    if (!file.has_attribute("", kAttributesChecksumKey))
      fail("has no root attribute '", kAttributesChecksumKey, "' (format version ", version, " has one)");
    const std::uint64_t stored = file.uint_attribute("", kAttributesChecksumKey);
    const std::uint64_t computed = file.attributes_checksum(kAttributesChecksumKey);
    if (stored != computed)
      fail("has attributes that do not match their checksum (stored ", stored, ", computed ", computed,
           "): an attribute of /engine, /optimizer, /model, the root or a dataset was changed or damaged");
  }

  // Every object in its place: /model/<name>, /optimizer/<state>/<name>, /engine/rng_streams.
  std::map<std::string, std::vector<std::int64_t>> model;  // name -> shape
  std::map<std::string, std::map<std::string, std::vector<std::int64_t>>> states;
  bool has_rng = false;
  for (const auto& [name, kind] : file.objects()) {
    const std::size_t slash = name.find('/');
    const std::string top = name.substr(0, slash);
    const std::string rest = slash == std::string::npos ? "" : name.substr(slash + 1);
    if (top != "model" && top != "engine" && top != "optimizer")
      fail("holds an unexpected object '", name, "' (", kind_name(kind), ")");
    // The three groups, and the state groups /optimizer/<state>; datasets everywhere below.
    if (rest.empty() || (top == "optimizer" && rest.find('/') == std::string::npos)) {
      if (kind != Kind::group) fail("object '", name, "' is ", kind_name(kind), "; expected a group");
      if (!rest.empty()) states[rest];
      continue;
    }
    if (kind != Kind::dataset) fail("object '", name, "' is ", kind_name(kind), "; expected a dataset");
    const io::H5File::DatasetLayout layout = file.dataset_layout(name);
    if (top == "engine") {
      if (rest != "rng_streams") fail("holds an unexpected dataset '", name, "'");
      if (layout.kind == 'f' || layout.element_size != 8 || layout.shape.size() != 2)
        fail("dataset '", name, "' must be a 2-D array of 64-bit integers, is ", layout.shape.size(),
             "-D of ", layout.element_size, "-byte ", layout.kind == 'f' ? "floats" : "integers");
      has_rng = true;
      continue;
    }
    if (layout.kind != 'f' || layout.element_size != 4)
      fail("dataset '", name, "' holds ", layout.element_size, "-byte ",
           layout.kind == 'f' ? "floats" : "integers", "; expected fp32");
    if (top == "model") {
      model[rest] = layout.shape;
    } else {
      const std::size_t state_slash = rest.find('/');
      if (rest.find('/', state_slash + 1) != std::string::npos)
        fail("holds an unexpected dataset '", name, "'");
      states[rest.substr(0, state_slash)][rest.substr(state_slash + 1)] = layout.shape;
    }
  }
  if (file.kind("model") != Kind::group) fail("has no group /model");
  if (file.kind("engine") != Kind::group) fail("has no group /engine");

  // The full set: what /model records, and every optimizer state with the model's names and shapes.
  std::int64_t elements = 0;
  for (const auto& [name, shape] : model) {
    std::int64_t count = 1;
    for (std::int64_t extent : shape) count *= extent;
    elements += count;
  }
  const std::int64_t recorded = file.int_attribute("model", "parameters");
  if (elements != recorded)
    fail("holds ", elements, " parameter elements in ", model.size(), " datasets under /model, but records ",
         recorded, ": a parameter's dataset is missing or was replaced");
  if (version >= kFirstFormatWithAttributeChecksum) {
    const std::int64_t tensors = file.int_attribute("model", "tensors");
    if (static_cast<std::int64_t>(model.size()) != tensors)
      fail("holds ", model.size(), " datasets under /model, but records ", tensors,
           ": a parameter's dataset is missing");
  }
  if (file.kind("optimizer") == Kind::group) {
    file.string_attribute("optimizer", "type");
    if (file.int_attribute("optimizer", "step") < 0) fail("has a negative optimizer step");
    if (version >= kFirstFormatWithAttributeChecksum) {
      const std::vector<std::string> listed = lines_of(file.string_attribute("optimizer", "states"));
      for (const std::string& state : listed) {
        if (!states.count(state))
          fail("has no optimizer state group '/optimizer/", state, "' (/optimizer lists it)");
      }
      for (const auto& [state, names] : states) {
        if (std::find(listed.begin(), listed.end(), state) == listed.end())
          fail("holds an optimizer state '/optimizer/", state, "' that /optimizer does not list");
      }
    }
    // Frozen parameters (/model attribute `frozen`, one name per line) have no optimizer state.
    std::vector<std::string> frozen;
    if (file.has_attribute("model", "frozen")) frozen = lines_of(file.string_attribute("model", "frozen"));
    for (const std::string& name : frozen) {
      if (!model.count(name))
        fail("records '", name, "' as frozen (/model attribute frozen) but has no dataset 'model/", name,
             "'");
    }
    for (const auto& [state, names] : states) {
      for (const auto& [name, shape] : model) {
        if (std::find(frozen.begin(), frozen.end(), name) != frozen.end()) {
          if (names.count(name))
            fail("has a dataset 'optimizer/", state, "/", name, "' of a frozen parameter");
          continue;
        }
        const auto found = names.find(name);
        if (found == names.end()) fail("has no dataset 'optimizer/", state, "/", name, "'");
        if (found->second != shape)
          fail("dataset 'optimizer/", state, "/", name, "' has shape ", base::shape_text(found->second),
               " but its parameter has ", base::shape_text(shape));
      }
      for (const auto& [name, shape] : names) {
        if (!model.count(name)) fail("has a dataset 'optimizer/", state, "/", name, "' of no parameter");
      }
    }
  } else if (!states.empty()) {
    fail("holds optimizer states but no group /optimizer");
  }
  if (!has_rng) fail("has no dataset 'engine/rng_streams'");
  const std::vector<std::int64_t> rng = file.shape("engine/rng_streams");
  // One row per rank of the grid that saved it: data x tensor x pipeline ranks.
  std::int64_t ranks = file.int_attribute("engine", "world_size");
  for (const char* key : {"tensor_parallel_size", "pipeline_parallel_size"}) {
    if (file.has_attribute("engine", key)) ranks *= file.int_attribute("engine", key);
  }
  const std::int64_t dropouts = file.int_attribute("engine", "dropout_streams");
  if (ranks < 1 || dropouts < 0 || rng[0] != ranks || rng[1] != std::max<std::int64_t>(1, dropouts))
    fail("dataset 'engine/rng_streams' has shape ", base::shape_text(rng),
         "; expected [world_size x tensor_parallel_size x pipeline_parallel_size, max(1, dropout_streams)] = "
         "[",
         ranks, ", ", std::max<std::int64_t>(1, dropouts), "]");

  // Counters and the data position in range.
  for (const char* key : {"global_steps", "global_samples", "skipped_steps"}) {
    if (file.int_attribute("engine", key) < 0) fail("has a negative /engine ", key);
  }
  if (file.int_attribute("engine", "has_data_position") != 0) {
    const std::uint64_t samples = file.uint_attribute("engine", "data_num_samples");
    const std::uint64_t offset = file.uint_attribute("engine", "data_offset");
    if (samples == 0 || offset >= samples)
      fail("has a data position at offset ", offset, " of an epoch of ", samples,
           " samples; expected offset < samples");
  }
  return version;
}

std::vector<std::string> model_config_differences(const std::string& saved_config_json,
                                                  const std::string& current_config_json) {
  const nlohmann::json saved = nlohmann::json::parse(saved_config_json, nullptr, false);
  const nlohmann::json current = nlohmann::json::parse(current_config_json, nullptr, false);
  std::vector<std::string> differences;
  if (saved.is_discarded() || current.is_discarded()) {
    differences.push_back(std::string("config: the checkpoint's ") +
                          (saved.is_discarded() ? "saved config" : "current config") + " is not valid JSON");
    return differences;
  }
  const auto model_of = [](const nlohmann::json& config) -> const nlohmann::json* {
    if (!config.is_object() || !config.contains("model") || !config["model"].is_object()) return nullptr;
    return &config["model"];
  };
  const nlohmann::json* before = model_of(saved);
  const nlohmann::json* now = model_of(current);
  if (before == nullptr || now == nullptr) return differences;
  std::set<std::string> keys;
  for (const auto& [key, value] : before->items()) keys.insert(key);
  for (const auto& [key, value] : now->items()) keys.insert(key);
  for (const std::string& key : keys) {
    const std::string old_value = before->contains(key) ? (*before)[key].dump() : "absent";
    const std::string new_value = now->contains(key) ? (*now)[key].dump() : "absent";
    if (old_value != new_value)
      differences.push_back("model." + key + ": " + old_value + " in the checkpoint, " + new_value +
                            " in this run");
  }
  return differences;
}

}  // namespace zt::engine_detail
