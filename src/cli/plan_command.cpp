// `zerotrain plan --config FILE [--global-batch B] [...]`: the options of src/engine/plan.hpp's
// run_plan (docs/plan.md). Bad options and configs: the message on rank 0 and exit 2 on every rank.
#include "src/cli/plan_command.hpp"

#include <charconv>
#include <cstdio>
#include <limits>
#include <map>
#include <string>
#include <string_view>

#include "base/text.hpp"
#include "src/cli/plain_message.hpp"
#include "src/engine/plan.hpp"
#include "zerotrain/error.hpp"

namespace zt::cli {
namespace {

std::int64_t integer_option(const std::string& name, const std::string& text, std::int64_t min) {
  std::int64_t value = 0;
  const auto [stop, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  ZT_CHECK_AS(ConfigError, error == std::errc() && stop == text.data() + text.size() && !text.empty(), "--",
              name, " expects an integer >= ", min, ", got '", text, "'");
  ZT_CHECK_AS(ConfigError, value >= min, "--", name, " ", value,
              " is out of range: expected an integer >= ", min);
  return value;
}

engine_detail::PlanOptions parse_options(int argc, char** argv) {
  std::map<std::string, std::string> values;
  for (int i = 2; i < argc; ++i) {
    const std::string_view arg = argv[i];
    ZT_CHECK_AS(ConfigError, arg.starts_with("--") && i + 1 < argc, "unexpected argument '", arg,
                "': expected --name VALUE (see `zerotrain help`)");
    const std::string name(arg.substr(2));
    ZT_CHECK_AS(ConfigError, values.emplace(name, argv[++i]).second, "--", name, " is given twice");
  }
  engine_detail::PlanOptions options;
  for (int i = 0; i < argc; ++i) {
    if (i > 0) options.command_line.push_back(' ');
    options.command_line.append(argv[i]);
  }
  const auto take = [&](const char* name) -> std::optional<std::string> {
    const auto it = values.find(name);
    if (it == values.end()) return std::nullopt;
    std::string value = it->second;
    values.erase(it);
    return value;
  };
  const auto config = take("config");
  ZT_CHECK_AS(ConfigError, config.has_value(), "zerotrain plan needs --config FILE");
  options.config_path = *config;
  if (const auto text = take("global-batch")) options.global_batch = integer_option("global-batch", *text, 1);
  if (const auto text = take("memory-limit")) {
    options.memory_limit = base::parse_byte_size(*text);
    ZT_CHECK_AS(ConfigError, options.memory_limit.has_value() && *options.memory_limit > 0,
                "--memory-limit '", *text,
                "': expected a size in bytes such as 2GiB, 512MiB, 1.5GB or 1073741824");
  }
  options.candidates = take("candidates");
  options.data_path = take("data");
  options.out_dir = take("out").value_or(options.out_dir);
  if (const auto text = take("warmup-steps")) options.warmup_steps = integer_option("warmup-steps", *text, 0);
  if (const auto text = take("measure-steps"))
    options.measure_steps = integer_option("measure-steps", *text, 1);
  if (const auto text = take("check-steps")) options.check_steps = integer_option("check-steps", *text, 2);
  if (const auto text = take("resume-world-size"))
    options.resume_world_size = static_cast<int>(std::min<std::int64_t>(
        integer_option("resume-world-size", *text, 0), std::numeric_limits<int>::max()));
  if (!values.empty())
    ZT_THROW_AS(ConfigError, "unknown option --", values.begin()->first, " (see `zerotrain help`)");
  return options;
}

}  // namespace

int plan_command(Runtime& runtime, int argc, char** argv) {
  try {
    return engine_detail::run_plan(runtime, parse_options(argc, argv));
  } catch (const ConfigError& error) {  // thrown alike on every rank, before anything trains
    if (runtime.world_rank() == 0) std::fprintf(stderr, "zerotrain plan: %s\n", plain_message(error).c_str());
    return 2;
  }
}

}  // namespace zt::cli
