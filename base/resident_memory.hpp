// This process's resident memory as the kernel counts it (Linux /proc; 0 or false elsewhere), and
// the release of what the allocator keeps after frees. The engine's memory accounting counts its own
// buffers; these are what the metrics put next to it (docs/metrics.md, "Resident memory").
#pragma once

#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>

namespace zt::base {

/// Resident set size now (VmRSS) and its high-water mark (VmHWM) in bytes, from /proc/self/status.
struct ResidentMemory {
  std::int64_t current = 0;
  std::int64_t peak = 0;
};

inline ResidentMemory resident_memory() {
  ResidentMemory memory;
  std::ifstream status("/proc/self/status");
  std::string key;
  std::int64_t kib = 0;
  while (status >> key) {
    if (key == "VmRSS:" && status >> kib) memory.current = kib * 1024;
    if (key == "VmHWM:" && status >> kib) memory.peak = kib * 1024;
    status.ignore(1 << 20, '\n');
  }
  return memory;
}

/// Restart the high-water mark from the current resident set (Linux >= 4.0: "5" into
/// /proc/self/clear_refs). false where the kernel does not offer it.
inline bool reset_resident_peak() {
  std::ofstream clear_refs("/proc/self/clear_refs");
  clear_refs << "5";
  clear_refs.flush();
  return static_cast<bool>(clear_refs);
}

/// Hand the pages of freed heap memory back to the kernel (glibc's malloc_trim). The runtime's malloc
/// tuning (zt::RuntimeOptions::keep_freed_memory) keeps freed blocks in the process so that the
/// per-step buffers come back without page faults; what initialization freed for good (the model's
/// own parameter storage once the engine holds them, construction temporaries) would stay resident.
/// true when memory was released.
inline bool release_freed_heap() {
#if defined(__GLIBC__)
  return malloc_trim(0) == 1;
#else
  return false;
#endif
}

}  // namespace zt::base
