// The zerotrain command's default for how idle OpenMP threads wait: applied before OpenMP starts
// (src/cli/openmp_wait_default.cpp says how), only when the user set neither OMP_WAIT_POLICY nor
// GOMP_SPINCOUNT; the user's setting always wins. Programs that link libzerotrain themselves keep
// OpenMP's own default (docs/benchmarks.md "OpenMP waiting").
#pragma once

#include <string>

namespace zt::cli {

/// The variable and value the command sets by default: idle threads sleep at once instead of spinning
/// (libgomp's own default spins 300000 times first). Measured fastest on both benchmark shapes, by
/// 6-10x on the small one on a shared machine, where a spinning thread takes the core that another
/// rank's or OpenBLAS's thread needs (docs/benchmarks.md "OpenMP waiting").
inline constexpr const char* kOpenmpWaitDefaultVariable = "OMP_WAIT_POLICY";
inline constexpr const char* kOpenmpWaitDefaultValue = "passive";
/// Set alongside: tells the report zerotrain's default from the user's choice, and the re-executed
/// program that the default is applied.
inline constexpr const char* kOpenmpWaitDefaultMarker = "ZT_OPENMP_WAIT_DEFAULT";

/// At the start of main(), before anything else: when neither variable is set, set the default and
/// execute this program again with the same arguments (returns only where the default is not applied).
void apply_openmp_wait_default(char** argv);

/// One line for `zerotrain report`: OMP_WAIT_POLICY and GOMP_SPINCOUNT as OpenMP read them, and
/// whether they are zerotrain's default or the user's.
std::string openmp_wait_description();

}  // namespace zt::cli
