// What the I/O layer can use on this machine: HDF5 (parallel?), io_uring, libaio, and the backend
// the NVMe swap engine picks.
#include <hdf5.h>
#include <libaio.h>

#include <string>

#include "base/text.hpp"
#include "zerotrain/build_info.hpp"
#include "zerotrain/report.hpp"
#include "zerotrain/swap.hpp"

#if ZT_HAVE_URING
#include <liburing.h>
#endif

namespace zt {
namespace {

std::string probe_uring() {
#if ZT_HAVE_URING
  io_uring ring{};
  const int status = io_uring_queue_init(4, &ring, 0);
  if (status < 0) {
    return std::string("compiled in, NOT usable: io_uring_queue_init failed: ") + base::errno_text(-status) +
           " (kernel too old, or io_uring disabled by sysctl/seccomp); libaio will be used";
  }
  io_uring_queue_exit(&ring);
  return "usable";
#else
  return "not compiled in (configure with liburing-dev installed or -DZT_WITH_URING=ON)";
#endif
}

std::string probe_libaio() {
  io_context_t context{};
  const int status = io_setup(4, &context);
  if (status < 0) return std::string("NOT usable: io_setup failed: ") + base::errno_text(-status);
  io_destroy(context);
  return "usable";
}

/// What SwapBackend::automatic resolves to here, and why when it is not io_uring.
std::string swap_backend_line() {
  const SwapBackendProbe probe = probe_swap_backend();
  if (probe.backend == SwapBackend::posix) {
    return "NONE usable (" + probe.note + "); NVMe offload needs ZT_SWAP_BACKEND=posix (pread/pwrite)";
  }
  std::string line(to_string(probe.backend));
  if (!probe.note.empty()) line += " (" + probe.note + ")";
  return line;
}

}  // namespace

Report io_report() {
  unsigned major = 0, minor = 0, release = 0;
  H5get_libversion(&major, &minor, &release);
#ifdef H5_HAVE_PARALLEL
  const char* parallel = "yes (MPI-IO)";
#else
  const char* parallel = "NO: collective checkpoints need a parallel HDF5 (Debian: libhdf5-openmpi-dev)";
#endif
  return {
      {"io", "HDF5", std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(release)},
      {"io", "HDF5 parallel", parallel},
      {"io", "io_uring", probe_uring()},
      {"io", "libaio", probe_libaio()},
      {"io", "NVMe swap backend", swap_backend_line()},
  };
}

}  // namespace zt
