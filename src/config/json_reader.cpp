#include "src/config/json_reader.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <iterator>
#include <map>
#include <sstream>

#include "zerotrain/error.hpp"

namespace zt::config_detail {

namespace {

char lower(char c) {
  return static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
}

std::string format_number(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

// Hugging Face's Trainer fills "auto" values in before DeepSpeed sees them; a file copied from
// such a setup reaches us with them unfilled.
constexpr std::string_view kAutoHint =
    " ('auto' is a placeholder of the Hugging Face Trainer integration; zerotrain needs a value)";

/// Iterates over the text like a plain pointer and records how far the JSON library has read, so
/// that the SAX events below know where they are in the text.
class TrackedCursor {
 public:
  using iterator_category = std::input_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;

  TrackedCursor(const char* at, const char** read_up_to) : at_(at), read_up_to_(read_up_to) {}
  reference operator*() const { return *at_; }
  TrackedCursor& operator++() {
    *read_up_to_ = ++at_;
    return *this;
  }
  TrackedCursor operator++(int) {
    TrackedCursor before = *this;
    ++*this;
    return before;
  }
  bool operator==(const TrackedCursor& other) const { return at_ == other.at_; }

 private:
  const char* at_;
  const char** read_up_to_;
};

/// SAX handler of check_document_shape: tracks the path and the keys of every open object.
class ShapeChecker {
 public:
  ShapeChecker(std::string_view text, const char* const* read_up_to, const ParseContext& context)
      : text_(text), read_up_to_(read_up_to), context_(context) {}

  bool null() { return value(); }
  bool boolean(bool) { return value(); }
  bool number_integer(json::number_integer_t) { return value(); }
  bool number_unsigned(json::number_unsigned_t) { return value(); }
  bool number_float(json::number_float_t, const json::string_t&) { return value(); }
  bool string(json::string_t&) { return value(); }
  bool binary(json::binary_t&) { return value(); }
  bool start_object(std::size_t) { return open(true); }
  bool start_array(std::size_t) { return open(false); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(json::string_t& name) {
    Frame& frame = frames_.back();
    const std::size_t at = key_start();
    const auto [previous, inserted] = frame.keys.emplace(name, at);
    frame.key = name;
    if (!inserted) {
      context_.fail(path(), "duplicate key '" + name + "' at " + position(at) + " (first at " +
                                position(previous->second) +
                                "); JSON keeps only the last one silently: give each key once");
    }
    return true;
  }
  /// Syntax errors are left to the parser that builds the document (its message has the position);
  /// other failures of the JSON library (a number too large for a double: 1e400) are reported here,
  /// where the position is known.
  bool parse_error(std::size_t at, const std::string&, const json::exception& error) {
    if (dynamic_cast<const json::parse_error*>(&error) != nullptr) return false;
    std::string message = error.what();
    if (const auto end = message.find("] ");
        message.starts_with("[json.exception") && end != std::string::npos)
      message.erase(0, end + 2);
    ZT_THROW_AS(ConfigError, context_.source, ": invalid JSON: ", message, " at ",
                position(std::min(at, text_.size())));
  }

 private:
  struct Frame {
    bool object = false;
    std::map<std::string, std::size_t> keys;  // key -> offset of its opening quote
    std::string key;                          // the current member's key
    std::int64_t index = -1;                  // the current element's index
  };

  std::size_t offset() const { return static_cast<std::size_t>(*read_up_to_ - text_.data()); }
  /// The key's opening quote: the JSON library has just read its closing one, and the first quote
  /// before it that no backslash escapes opens it.
  std::size_t key_start() const {
    std::size_t at = offset() - 1;
    while (at > 0) {
      --at;
      if (text_[at] != '"') continue;
      std::size_t backslashes = 0;
      while (at > backslashes && text_[at - 1 - backslashes] == '\\') ++backslashes;
      if (backslashes % 2 == 0) break;
    }
    return at;
  }
  std::string position(std::size_t at) const {
    const std::string_view before = text_.substr(0, at);
    const std::size_t line = 1 + static_cast<std::size_t>(std::count(before.begin(), before.end(), '\n'));
    const std::size_t line_start = before.rfind('\n');
    const std::size_t column = at + 1 - (line_start == std::string_view::npos ? 0 : line_start + 1);
    return "line " + std::to_string(line) + ", column " + std::to_string(column);
  }
  std::string path() const {
    std::string text;
    for (const Frame& frame : frames_) {
      if (frame.object) {
        if (frame.key.empty() && text.empty()) continue;
        if (!text.empty()) text.push_back('.');
        text.append(frame.key);
      } else if (frame.index >= 0) {
        text.push_back('[');
        text.append(std::to_string(frame.index));
        text.push_back(']');
      }
    }
    return text.empty() ? std::string("<document>") : text;
  }
  bool value() {
    if (!frames_.empty() && !frames_.back().object) ++frames_.back().index;
    return true;
  }
  bool open(bool object) {
    value();
    if (static_cast<int>(frames_.size()) >= kMaxConfigDepth) {
      std::string where = path();
      if (where.size() > 40) where = where.substr(0, 40) + "...";
      context_.fail(where, "nesting deeper than " + std::to_string(kMaxConfigDepth) + " levels at " +
                               position(offset() - 1) + "; a configuration is a few levels deep");
    }
    frames_.push_back(Frame{.object = object, .keys = {}, .key = {}, .index = -1});
    return true;
  }
  bool close() {
    frames_.pop_back();
    return true;
  }

  std::string_view text_;
  const char* const* read_up_to_;
  const ParseContext& context_;
  std::vector<Frame> frames_;
};

}  // namespace

void check_document_shape(std::string_view text, const ParseContext& context) {
  const char* read_up_to = text.data();
  ShapeChecker checker(text, &read_up_to, context);
  json::sax_parse(TrackedCursor(text.data(), &read_up_to),
                  TrackedCursor(text.data() + text.size(), &read_up_to), &checker, json::input_format_t::json,
                  /*strict=*/true, /*ignore_comments=*/true);
}

void ParseContext::fail(std::string_view path, std::string_view message) const {
  ZT_THROW_AS(ConfigError, source, ": ", path, ": ", message);
}

std::string IntRange::describe() const {
  constexpr auto lowest = std::numeric_limits<std::int64_t>::min();
  constexpr auto highest = std::numeric_limits<std::int64_t>::max();
  if (min == lowest && max == highest) return "an integer";
  if (max == highest) {
    if (min == 1) return "a positive integer";
    if (min == 0) return "a non-negative integer";
    return "an integer >= " + std::to_string(min);
  }
  if (min == lowest) return "an integer <= " + std::to_string(max);
  return "an integer in " + std::to_string(min) + ".." + std::to_string(max);
}

std::string NumberRange::describe() const {
  const bool has_min = std::isfinite(min);
  const bool has_max = std::isfinite(max);
  if (!has_min && !has_max) return "a finite number";
  if (!has_max) return std::string("a number ") + (min_exclusive ? "> " : ">= ") + format_number(min);
  if (!has_min) return std::string("a number ") + (max_exclusive ? "< " : "<= ") + format_number(max);
  return std::string("a number in ") + (min_exclusive ? "(" : "[") + format_number(min) + ", " +
         format_number(max) + (max_exclusive ? ")" : "]");
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  // Rolling rows of the dynamic-programming table; three rows are needed for transpositions.
  std::vector<std::size_t> before(b.size() + 1), previous(b.size() + 1), current(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) previous[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    current[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t substitution = lower(a[i - 1]) == lower(b[j - 1]) ? 0 : 1;
      current[j] = std::min({previous[j] + 1, current[j - 1] + 1, previous[j - 1] + substitution});
      if (i > 1 && j > 1 && lower(a[i - 1]) == lower(b[j - 2]) && lower(a[i - 2]) == lower(b[j - 1])) {
        current[j] = std::min(current[j], before[j - 2] + 1);
      }
    }
    std::swap(before, previous);
    std::swap(previous, current);
  }
  return previous[b.size()];
}

std::optional<std::string> closest_match(std::string_view word,
                                         const std::set<std::string, std::less<>>& candidates) {
  // Allow about one edit per four characters, so that short keys need a near-exact match.
  const std::size_t allowed = std::max<std::size_t>(1, std::min<std::size_t>(3, (word.size() + 1) / 4));
  std::optional<std::string> best;
  std::size_t best_distance = allowed + 1;
  for (const std::string& candidate : candidates) {
    const std::size_t distance = edit_distance(word, candidate);
    if (distance < best_distance) {
      best_distance = distance;
      best = candidate;
    }
  }
  return best;
}

std::string render(const json& value) {
  std::string text = value.dump();
  constexpr std::size_t kMax = 60;
  if (text.size() > kMax) text = text.substr(0, kMax - 3) + "...";
  return text;
}

Section::Section(const json* object, std::string path, ParseContext& context)
    : object_(object != nullptr && !object->is_null() ? object : nullptr),
      path_(std::move(path)),
      context_(&context) {
  if (object_ != nullptr && !object_->is_object()) {
    context.fail(path_.empty() ? "<document>" : path_, "expected a JSON object, got " + render(*object_));
  }
}

std::string Section::path_of(std::string_view key) const {
  return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
}

const json* Section::find(std::string_view key) {
  known_.emplace(key);
  if (object_ == nullptr) return nullptr;
  auto it = object_->find(key);
  if (it == object_->end() || it->is_null()) return nullptr;
  return &*it;
}

bool Section::has(std::string_view key) {
  return find(key) != nullptr;
}

bool Section::boolean(std::string_view key, bool fallback) {
  const json* value = find(key);
  if (value == nullptr) return fallback;
  if (!value->is_boolean()) type_error(key, *value, "a boolean (true or false)");
  return value->get<bool>();
}

std::optional<std::int64_t> Section::optional_integer(std::string_view key, IntRange range) {
  const json* value = find(key);
  if (value == nullptr) return std::nullopt;
  std::int64_t result = 0;
  if (value->is_number_unsigned()) {
    const auto unsigned_value = value->get<std::uint64_t>();
    if (unsigned_value > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      type_error(key, *value, range.describe());
    }
    result = static_cast<std::int64_t>(unsigned_value);
  } else if (value->is_number_integer()) {
    result = value->get<std::int64_t>();
  } else if (value->is_number_float()) {
    // DeepSpeed configs write sizes as 5e8, which JSON parsers read as floats; accept those that
    // are whole numbers within range (2^63 itself is the first double past INT64_MAX).
    const double number = value->get<double>();
    if (!std::isfinite(number) || std::trunc(number) != number || number < -9.223372036854775808e18 ||
        number >= 9.223372036854775808e18) {
      type_error(key, *value, range.describe());
    }
    result = static_cast<std::int64_t>(number);
  } else {
    type_error(key, *value, range.describe());
  }
  if (result < range.min || result > range.max) type_error(key, *value, range.describe());
  return result;
}

std::int64_t Section::integer(std::string_view key, std::int64_t fallback, IntRange range) {
  return optional_integer(key, range).value_or(fallback);
}

std::int64_t Section::required_integer(std::string_view key, IntRange range, std::string_view why) {
  auto value = optional_integer(key, range);
  if (!value) missing(key, why);
  return *value;
}

std::optional<double> Section::optional_number(std::string_view key, NumberRange range) {
  const json* value = find(key);
  if (value == nullptr) return std::nullopt;
  if (!value->is_number()) type_error(key, *value, range.describe());
  const double result = value->get<double>();
  const bool below = range.min_exclusive ? result <= range.min : result < range.min;
  const bool above = range.max_exclusive ? result >= range.max : result > range.max;
  if (!std::isfinite(result) || below || above) type_error(key, *value, range.describe());
  return result;
}

double Section::number(std::string_view key, double fallback, NumberRange range) {
  return optional_number(key, range).value_or(fallback);
}

double Section::required_number(std::string_view key, NumberRange range, std::string_view why) {
  auto value = optional_number(key, range);
  if (!value) missing(key, why);
  return *value;
}

std::optional<std::string> Section::optional_string(std::string_view key) {
  const json* value = find(key);
  if (value == nullptr) return std::nullopt;
  if (!value->is_string()) type_error(key, *value, "a string");
  return value->get<std::string>();
}

std::string Section::string(std::string_view key, std::string fallback) {
  return optional_string(key).value_or(std::move(fallback));
}

Section Section::child(std::string_view key) {
  const json* value = find(key);
  if (value != nullptr && !value->is_object()) type_error(key, *value, "a JSON object");
  return Section(value, path_of(key), *context_);
}

void Section::finish() {
  if (object_ == nullptr) return;
  for (const auto& [key, value] : object_->items()) {
    if (known_.contains(key)) continue;
    std::string message = path_of(key) + ": unknown key";
    if (auto suggestion = closest_match(key, known_)) message += "; did you mean '" + *suggestion + "'?";
    message += " (ignored)";
    context_->warn(std::move(message));
  }
}

void Section::finish_strict(std::string_view known_keys) {
  if (object_ == nullptr) return;
  for (const auto& [key, value] : object_->items()) {
    if (known_.contains(key)) continue;
    std::string message = "unknown key";
    if (auto suggestion = closest_match(key, known_)) message += "; did you mean '" + *suggestion + "'?";
    fail(key, message + "; expected " + std::string(known_keys));
  }
}

void Section::fail(std::string_view key, std::string_view message) const {
  context_->fail(path_of(key), message);
}

void Section::type_error(std::string_view key, const json& value, std::string_view expected) const {
  std::string message = "expected " + std::string(expected) + ", got " + render(value);
  if (value.is_string() && value.get_ref<const std::string&>() == "auto" && !expected.starts_with("one of")) {
    message += kAutoHint;
  }
  fail(key, message);
}

void Section::missing(std::string_view key, std::string_view why) const {
  std::string message = "required";
  if (!why.empty()) message += " " + std::string(why);
  if (object_ != nullptr) {
    std::set<std::string, std::less<>> wanted{std::string(key)};
    for (const auto& [present, value] : object_->items()) {
      if (!known_.contains(present) && closest_match(present, wanted)) {
        message += " (found '" + present + "': a typo?)";
        break;
      }
    }
  }
  fail(key, message);
}

bool Section::equals_ignoring_case(std::string_view a, std::string_view b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) { return lower(x) == lower(y); });
}

}  // namespace zt::config_detail
