// Run-time choice of the host kernels' ISA path (kernels/host_isa.hpp).
#include "kernels/host_isa.hpp"

#include <atomic>
#include <cstdlib>
#include <string>

#include "kernels/host/host_isa_kernels.hpp"
#include "zerotrain/error.hpp"

namespace zt::kernels {
namespace {

constexpr const char* kVariable = "ZT_HOST_ISA";

bool cpu_supports(HostIsa isa) {
#if ZT_HOST_ISA_PATHS
  __builtin_cpu_init();
  // libgcc's checks include the OS's support for the vector state (XGETBV).
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c") && __builtin_cpu_supports("bmi") &&
                    __builtin_cpu_supports("bmi2");
  switch (isa) {
    case HostIsa::baseline:
      return true;
    case HostIsa::avx2:
      return avx2;
    case HostIsa::avx512:
      return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  }
  return false;
#else
  return isa == HostIsa::baseline;  // this build compiles the baseline path only
#endif
}

/// ZT_HOST_ISA when set to a path (not empty, not "auto").
const char* forced_name() {
  const char* text = std::getenv(kVariable);
  if (text == nullptr || *text == '\0' || std::string_view(text) == "auto") return nullptr;
  return text;
}

void require_supported(HostIsa isa, std::string_view what) {
  ZT_CHECK(host_isa_supported(isa), what, " asks for the ", host_isa_name(isa),
           " host kernels, which this CPU (or this build) cannot run; it supports: ", supported_host_isas());
}

HostIsa initial_isa() {
  const char* forced = forced_name();
  if (forced == nullptr) return best_host_isa();
  const std::string what = std::string(kVariable) + "=" + forced;
  const HostIsa isa = parse_host_isa(forced, what);
  require_supported(isa, what);
  return isa;
}

/// The path in use. Initialized on the first call; an invalid ZT_HOST_ISA throws there, and again on
/// every later call (a static whose initializer throws is initialized again next time).
std::atomic<int>& current_isa() {
  static std::atomic<int> isa{static_cast<int>(initial_isa())};
  return isa;
}

}  // namespace

const char* host_isa_name(HostIsa isa) {
  switch (isa) {
    case HostIsa::baseline:
      return "baseline";
    case HostIsa::avx2:
      return "avx2";
    case HostIsa::avx512:
      return "avx512";
  }
  return "unknown";
}

HostIsa parse_host_isa(std::string_view text, std::string_view what) {
  for (int i = 0; i < kHostIsaCount; ++i) {
    const auto isa = static_cast<HostIsa>(i);
    if (text == host_isa_name(isa)) return isa;
  }
  ZT_THROW(what, ": unknown host ISA path '", text, "'; expected avx512, avx2, baseline or auto");
}

bool host_isa_supported(HostIsa isa) {
  static const bool supported[kHostIsaCount] = {cpu_supports(HostIsa::baseline), cpu_supports(HostIsa::avx2),
                                                cpu_supports(HostIsa::avx512)};
  const int index = static_cast<int>(isa);
  return index >= 0 && index < kHostIsaCount && supported[index];
}

HostIsa best_host_isa() {
  for (int i = kHostIsaCount - 1; i > 0; --i) {
    if (host_isa_supported(static_cast<HostIsa>(i))) return static_cast<HostIsa>(i);
  }
  return HostIsa::baseline;
}

std::string supported_host_isas() {
  std::string list;
  for (int i = kHostIsaCount - 1; i >= 0; --i) {
    if (!host_isa_supported(static_cast<HostIsa>(i))) continue;
    if (!list.empty()) list += ", ";
    list += host_isa_name(static_cast<HostIsa>(i));
  }
  return list;
}

HostIsa host_isa() {
  return static_cast<HostIsa>(current_isa().load(std::memory_order_relaxed));
}

void set_host_isa(HostIsa isa) {
  require_supported(isa, std::string("set_host_isa(") + host_isa_name(isa) + ")");
  current_isa().store(static_cast<int>(isa), std::memory_order_relaxed);
}

std::string host_isa_description() {
  try {
    const HostIsa isa = host_isa();
    std::string text = host_isa_name(isa);
    if (const char* forced = forced_name(); forced != nullptr) {
      text += std::string(" (forced by ") + kVariable + "=" + forced + ")";
    } else {
      text += std::string(" (auto: the best this CPU supports; ") + kVariable + " forces one)";
    }
    if (isa == HostIsa::avx512) text += "; layer norm runs its avx2 build";
    return text;
  } catch (const Error& error) {
    return std::string("invalid: ") + error.what();
  }
}

}  // namespace zt::kernels
