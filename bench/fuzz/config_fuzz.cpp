// libFuzzer target for the configuration parser (docs/testing.md, "Fuzzing"): any bytes given to
// zt::Config::from_string either parse or throw zt::ConfigError with a message; anything else (a
// crash, a sanitizer report, another exception escaping) is a finding. A parsed config is also
// rendered back (to_json_string, summary) and re-parsed, and its batch sizes resolved.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "zerotrain/config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const zt::ConfigParseOptions quiet{.warning_sink = {}};
  try {
    zt::Config config = zt::Config::from_string(text, quiet);
    (void)config.summary();
    const zt::Config again = zt::Config::from_string(config.to_json_string(), quiet);
    (void)again;
    for (int data_parallel : {1, 3}) (void)config.resolve_batch(data_parallel);
  } catch (const zt::ConfigError&) {
    // a refused config: the expected outcome for most inputs
  }
  return 0;
}
