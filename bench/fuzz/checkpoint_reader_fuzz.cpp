// libFuzzer target for the checkpoint reader (issue 16): any bytes, written to a file, go through
// what `zerotrain checkpoint inspect` and `verify` do (zt::inspect_checkpoint, zt::verify_checkpoint:
// the format checks, links, attribute checksum, dataset layouts, every dataset read and summed).
// A zt::Error is the expected answer to a bad file; a crash, a sanitizer report, a hang or any other
// exception is a bug. Built by bench/fuzz_checkpoint.cmake where clang with -fsanitize=fuzzer is
// available; how to run it: docs/testing.md, "Fuzzing".
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "zerotrain/checkpoint.hpp"
#include "zerotrain/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // One file per process, rewritten for every input (HDF5 reads files, not memory, through the tools).
  static const std::string path = "/tmp/zt-fuzz-checkpoint-" + std::to_string(::getpid()) + ".h5";
  std::FILE* out = std::fopen(path.c_str(), "wb");
  if (out == nullptr) return 0;
  std::fwrite(data, 1, size, out);
  std::fclose(out);
  try {
    zt::inspect_checkpoint(path);
    zt::verify_checkpoint(path);
  } catch (const zt::Error&) {
  }
  return 0;
}
