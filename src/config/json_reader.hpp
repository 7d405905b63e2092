// Typed, path-aware reading of one JSON object of the configuration. Every read names its key, so
// the reader knows the section's vocabulary: keys present in the document but never asked for are
// reported as unknown, with the closest known key as a suggestion.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace zt::config_detail {

using json = nlohmann::json;

/// State shared by all sections of one parse: where the text came from and the warnings so far.
struct ParseContext {
  std::string source;  // "config file 'x.json'" or "config string"
  std::vector<std::string> warnings;

  void warn(std::string message) { warnings.push_back(std::move(message)); }
  /// Throw zt::ConfigError "<source>: <path>: <message>".
  [[noreturn]] void fail(std::string_view path, std::string_view message) const;
};

struct IntRange {
  std::int64_t min = std::numeric_limits<std::int64_t>::min();
  std::int64_t max = std::numeric_limits<std::int64_t>::max();
  std::string describe() const;  // "a positive integer", "an integer in 0..3", ...
};
inline constexpr IntRange kPositive{1};
inline constexpr IntRange kNonNegative{0};

struct NumberRange {
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  bool min_exclusive = false;
  bool max_exclusive = false;
  std::string describe() const;  // "a number >= 0", "a number in [0, 1)", ...
};
inline constexpr NumberRange kAnyNumber{};
inline constexpr NumberRange kNonNegativeNumber{0.0};
inline constexpr NumberRange kPositiveNumber{0.0, std::numeric_limits<double>::infinity(), true};
inline constexpr NumberRange kUnitInterval{0.0, 1.0};

/// Optimal-string-alignment distance (Levenshtein plus adjacent transpositions), case-insensitive.
std::size_t edit_distance(std::string_view a, std::string_view b);
/// The candidate nearest to `word` if it is near enough to be a plausible typo.
std::optional<std::string> closest_match(std::string_view word,
                                         const std::set<std::string, std::less<>>& candidates);

/// Deepest nesting of objects and arrays a configuration may have. ds_config files are 4 levels
/// deep; far deeper documents are not configurations, and the JSON library's recursive serializer
/// (Config::raw_json, messages) would overflow the stack on them.
inline constexpr int kMaxConfigDepth = 64;

/// Checks the document's shape before it is built, with positions (line and column, 1-based):
/// nesting at most kMaxConfigDepth levels, and no object that repeats a key (JSON parsers keep
/// the last one silently: a second "zero_optimization" would replace the first whole). Throws
/// ConfigError "<source>: <path>: ..." naming both positions of a repeated key. Malformed JSON is
/// left to the parser, which reports it with its own position.
void check_document_shape(std::string_view text, const ParseContext& context);

/// Short rendering of a JSON value for messages: "\"two\"", "1.5", "[1,2]" (truncated).
std::string render(const json& value);

class Section {
 public:
  /// `object` may be null (section absent: every read gives its default). `path` is "" at the
  /// top level, else the dotted path of the section ("zero_optimization.offload_param").
  Section(const json* object, std::string path, ParseContext& context);

  const std::string& path() const { return path_; }
  std::string path_of(std::string_view key) const;
  ParseContext& context() const { return *context_; }
  bool present() const { return object_ != nullptr; }

  /// Present and not null. Registers the key as known.
  bool has(std::string_view key);
  /// The value (nullptr when absent or null). Registers the key as known.
  const json* find(std::string_view key);

  bool boolean(std::string_view key, bool fallback);
  std::int64_t integer(std::string_view key, std::int64_t fallback, IntRange range = {});
  std::optional<std::int64_t> optional_integer(std::string_view key, IntRange range = {});
  std::int64_t required_integer(std::string_view key, IntRange range, std::string_view why);
  double number(std::string_view key, double fallback, NumberRange range = kAnyNumber);
  std::optional<double> optional_number(std::string_view key, NumberRange range = kAnyNumber);
  double required_number(std::string_view key, NumberRange range, std::string_view why);
  std::string string(std::string_view key, std::string fallback);
  std::optional<std::string> optional_string(std::string_view key);

  /// A string from a fixed set, mapped to an enum; `names[i].first` are the accepted spellings.
  template <typename Enum>
  Enum choice(std::string_view key, Enum fallback,
              std::initializer_list<std::pair<std::string_view, Enum>> names, bool case_insensitive = false) {
    const json* value = find(key);
    if (value == nullptr) return fallback;
    std::string expected = "one of ";
    for (const auto& [name, _] : names) {
      if (expected.back() == '"') expected += ", ";
      expected.append("\"").append(name).append("\"");
    }
    if (!value->is_string()) type_error(key, *value, expected);
    const std::string& text = value->get_ref<const std::string&>();
    for (const auto& [name, result] : names) {
      if (case_insensitive ? equals_ignoring_case(text, name) : text == name) return result;
    }
    type_error(key, *value, expected);
  }

  /// A sub-object (absent or null gives an empty section).
  Section child(std::string_view key);
  /// Mark a key as known without reading it (e.g. DeepSpeed knobs that mean nothing here).
  void accept(std::string_view key) { known_.emplace(key); }
  /// Warn about every present key that no read asked for. Call after all reads.
  void finish();
  /// The same, but an unknown key is an error (zt::ConfigError naming it and `known_keys`), for
  /// sections where an ignored key would silently change what runs.
  void finish_strict(std::string_view known_keys);

  [[noreturn]] void fail(std::string_view key, std::string_view message) const;
  [[noreturn]] void type_error(std::string_view key, const json& value, std::string_view expected) const;
  /// Missing required key; mentions a present key that looks like a typo of it.
  [[noreturn]] void missing(std::string_view key, std::string_view why) const;

  static bool equals_ignoring_case(std::string_view a, std::string_view b);

 private:
  const json* object_;
  std::string path_;
  ParseContext* context_;
  std::set<std::string, std::less<>> known_;
};

}  // namespace zt::config_detail
