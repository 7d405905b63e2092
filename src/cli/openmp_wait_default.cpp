// The zerotrain command's default for how idle OpenMP threads wait (src/cli/openmp_wait_default.hpp).
//
// libgomp reads OMP_WAIT_POLICY and GOMP_SPINCOUNT once, in the constructor that runs when libgomp.so
// is loaded: before main(), since libzerotrain depends on it; OpenMP has no call that changes the
// waiting later. So a setenv() in main() is too late, and so is one in an executable's .preinit_array
// (tried: glibc sets the environment up again after those run, the setting was lost). What works is
// to set the variable and execute the same program again, at the start of main(), once: the exec
// keeps the process id, its arguments, its environment (MPI's and the launcher's variables included)
// and its CPU binding, and nothing of MPI has started yet, so mpirun and srun see the same process.
// The cost is one more program load at startup (a few ms), only when the default applies.
#include "src/cli/openmp_wait_default.hpp"

#include <unistd.h>

#include <cstdlib>

namespace zt::cli {

void apply_openmp_wait_default(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr ||
      std::getenv(kOpenmpWaitDefaultMarker) != nullptr) {
    return;  // the user chose, or this is the re-executed program
  }
  setenv(kOpenmpWaitDefaultVariable, kOpenmpWaitDefaultValue, 1);
  setenv(kOpenmpWaitDefaultMarker, kOpenmpWaitDefaultValue, 1);
  execv("/proc/self/exe", argv);
  // No /proc (or exec refused): run on with OpenMP's own default, and let the report say so.
  unsetenv(kOpenmpWaitDefaultVariable);
  unsetenv(kOpenmpWaitDefaultMarker);
}

std::string openmp_wait_description() {
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  const char* spin = std::getenv("GOMP_SPINCOUNT");
  std::string text = std::string("OMP_WAIT_POLICY=") + (policy != nullptr ? policy : "(unset)") +
                     " GOMP_SPINCOUNT=" + (spin != nullptr ? spin : "(unset)");
  if (std::getenv(kOpenmpWaitDefaultMarker) != nullptr) {
    text += " (zerotrain's default; set OMP_WAIT_POLICY or GOMP_SPINCOUNT to choose)";
  } else if (policy != nullptr || spin != nullptr) {
    text += " (set by the user)";
  } else {
    text += " (OpenMP's default)";
  }
  return text;
}

}  // namespace zt::cli
