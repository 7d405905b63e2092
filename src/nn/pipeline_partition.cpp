// Splitting a pipelinable model's layers into stages (zt::nn::partition_layers, pipeline.hpp).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include "zerotrain/error.hpp"
#include "zerotrain/pipeline.hpp"

namespace zt::nn {
namespace {

constexpr std::string_view type_prefix = "type:";

std::vector<std::int64_t> uniform_boundaries(std::int64_t layers, int stages) {
  std::vector<std::int64_t> boundaries{0};
  const std::int64_t base = layers / stages;
  const std::int64_t extra = layers % stages;
  for (int s = 0; s < stages; ++s) boundaries.push_back(boundaries.back() + base + (s < extra ? 1 : 0));
  return boundaries;
}

// The fewest consecutive parts of weights[begin, end) with no part above `bound`; every weight is
// at most `bound`. Taking as much as fits into each part is optimal for non-negative weights.
int fewest_parts(const std::vector<std::int64_t>& weights, std::size_t begin, std::size_t end,
                 std::int64_t bound) {
  int parts = 0;
  std::int64_t part = 0;
  for (std::size_t i = begin; i < end; ++i) {
    if (parts == 0 || part + weights[i] > bound) {
      ++parts;
      part = 0;
    }
    part += weights[i];
  }
  return parts;
}

// Minimizes the largest stage weight; among the partitions that reach it, each stage in turn takes
// as many layers as it can (the boundaries are the lexicographically largest). A suffix of layers
// can be split into exactly k non-empty parts within a bound iff it has at least k layers and
// needs at most k parts (parts of non-negative weights split without getting heavier).
std::vector<std::int64_t> balanced_boundaries(const std::vector<std::int64_t>& weights, int stages) {
  const std::size_t n = weights.size();
  std::int64_t low = *std::max_element(weights.begin(), weights.end());
  std::int64_t high = std::accumulate(weights.begin(), weights.end(), std::int64_t{0});
  while (low < high) {  // the smallest bound that `stages` parts can keep
    const std::int64_t bound = low + (high - low) / 2;
    if (fewest_parts(weights, 0, n, bound) <= stages) {
      high = bound;
    } else {
      low = bound + 1;
    }
  }
  const std::int64_t bound = low;
  std::vector<int> parts_after(n + 1);  // parts_after[i]: fewest parts of layers [i, n)
  for (std::size_t i = 0; i <= n; ++i) parts_after[i] = fewest_parts(weights, i, n, bound);

  std::vector<std::int64_t> boundaries{0};
  std::size_t begin = 0;
  for (int s = 0; s < stages; ++s) {
    const std::size_t stages_after = static_cast<std::size_t>(stages - s - 1);
    std::size_t end = begin + 1;  // every stage takes a layer; the bound lets it (weight <= bound)
    std::int64_t weight = weights[begin];
    std::size_t chosen = 0;
    while (true) {
      if (n - end >= stages_after && static_cast<std::size_t>(parts_after[end]) <= stages_after) chosen = end;
      if (end == n || weight + weights[end] > bound) break;
      weight += weights[end];
      ++end;
    }
    ZT_CHECK(chosen > begin, "pipeline partition: stage ", s, " finds no end within the bound ", bound);
    boundaries.push_back(static_cast<std::int64_t>(chosen));
    begin = chosen;
  }
  return boundaries;
}

}  // namespace

std::vector<std::int64_t> partition_layers(const std::vector<LayerSpec>& layers, int stages,
                                           std::string_view method) {
  const std::int64_t count = static_cast<std::int64_t>(layers.size());
  ZT_CHECK_AS(ConfigError, stages >= 1, "pipeline partition \"", method, "\": ", stages,
              " stages, expected at least 1");
  ZT_CHECK_AS(ConfigError, count >= stages, "pipeline partition \"", method, "\": the model has ", count,
              " layers, fewer than the ", stages, " stages (every stage needs at least one layer)");
  if (method == "uniform") return uniform_boundaries(count, stages);

  std::vector<std::int64_t> weights;
  weights.reserve(layers.size());
  if (method == "parameters" || method == "best") {
    for (const LayerSpec& layer : layers) {
      ZT_CHECK_AS(ConfigError, layer.parameter_count >= 0, "pipeline partition \"", method, "\": layer \"",
                  layer.key, "\" has ", layer.parameter_count, " parameters, expected at least 0");
      weights.push_back(layer.parameter_count);
    }
  } else if (method.starts_with(type_prefix)) {
    const std::string pattern(method.substr(type_prefix.size()));
    std::regex type_regex;
    try {
      type_regex = std::regex(pattern, std::regex::ECMAScript | std::regex::icase);
    } catch (const std::regex_error& error) {
      ZT_THROW_AS(ConfigError, "pipeline partition \"", method, "\": \"", pattern,
                  "\" is not a valid regular expression (ECMAScript): ", error.what());
    }
    for (const LayerSpec& layer : layers)
      weights.push_back(std::regex_search(layer.type, type_regex) ? 1 : 0);
    ZT_CHECK_AS(ConfigError, std::find(weights.begin(), weights.end(), 1) != weights.end(),
                "pipeline partition \"", method, "\": the regular expression \"", pattern,
                "\" matches the type of none of the ", count, " layers");
  } else {
    ZT_THROW_AS(ConfigError, "pipeline partition: unknown method \"", method,
                "\", expected \"uniform\", \"parameters\", \"best\" or \"type:<regex>\"");
  }
  return balanced_boundaries(weights, stages);
}

}  // namespace zt::nn
