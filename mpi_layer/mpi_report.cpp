// The MPI part of `zerotrain report`: library, thread level, layout, UCX, NCCL.
#include <dlfcn.h>
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "mpi_layer/watchdog.hpp"
#include "zerotrain/build_info.hpp"
#include "zerotrain/report.hpp"
#include "zerotrain/runtime.hpp"

#if ZT_HAVE_CUDA
#include <nccl.h>
#endif

namespace zt {
namespace {

/// Open MPI loads transports as components next to libmpi; UCX is the "pml_ucx" component.
std::string ucx_status(const std::string& library) {
  if (library.find("Open MPI") == std::string::npos) {
    return "not checked (only Open MPI's UCX component is detected; see your MPI's documentation)";
  }
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&MPI_Init), &info) == 0 || info.dli_fname == nullptr) {
    return "unknown (could not locate libmpi)";
  }
  const std::filesystem::path libmpi_dir = std::filesystem::path(info.dli_fname).parent_path();
  for (const char* component_dir : {"openmpi3", "openmpi"}) {
    const auto component = libmpi_dir / component_dir / "mca_pml_ucx.so";
    if (std::filesystem::exists(component)) {
      const char* selected = std::getenv("OMPI_MCA_pml");
      const bool active = selected != nullptr && std::string(selected).find("ucx") != std::string::npos;
      return std::string(active ? "available and selected (OMPI_MCA_pml=" + std::string(selected) + ")"
                                : "available, not selected") +
             "; select with `mpirun --mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any` "
             "(or OMPI_MCA_pml=ucx); component " +
             component.string();
    }
  }
  return "not available: this Open MPI has no pml_ucx component (build Open MPI with UCX to use it)";
}

std::string watchdog_status(const Runtime& runtime) {
  if (!runtime.watchdog_running()) {
    if (runtime.thread_level() < MPI_THREAD_MULTIPLE) return "off: needs MPI_THREAD_MULTIPLE";
    if (!runtime.covers_mpi_world()) {
      return "off: this runtime over a sub-communicator is watched by the process's watchdog, and no "
             "zt::Runtime over MPI_COMM_WORLD runs one";
    }
    return "off: collective timeout 0 from " + runtime.collective_timeout_source();
  }
  const double timeout = runtime.collective_timeout().count();
  const auto settings = detail::WatchdogSettings::for_timeout(timeout);
  char text[160];
  std::snprintf(text, sizeof text, "on: collective timeout %.1f s, heartbeat timeout %.1f s", timeout,
                settings.heartbeat_timeout_seconds);
  return text;
}

}  // namespace

Report mpi_report(const Runtime& runtime) {
  const std::string library = Runtime::mpi_library_version();
  int major = 0, minor = 0;
  MPI_Get_version(&major, &minor);
  std::string hosts;
  for (const auto& host : runtime.hosts()) hosts += (hosts.empty() ? "" : ", ") + host;
  int job_size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &job_size);
  const std::string sub_communicator =
      runtime.covers_mpi_world() ? "" : " (a sub-communicator of the job's " + std::to_string(job_size) + ")";
  Report report{
      {"mpi", "library", library},
      {"mpi", "standard", std::to_string(major) + "." + std::to_string(minor)},
      {"mpi", "thread level", Runtime::thread_level_name(runtime.thread_level())},
      {"mpi", "launcher", runtime.launcher()},
      {"mpi", "ranks",
       std::to_string(runtime.world_size()) + sub_communicator + " on " +
           std::to_string(runtime.node_count()) + " node(s): " + hosts},
      {"mpi", "local ranks on this node", std::to_string(runtime.local_size())},
      {"mpi", "UCX", ucx_status(library)},
  };
#if ZT_HAVE_CUDA
  int nccl = 0;
  if (ncclGetVersion(&nccl) == ncclSuccess) {
    report.push_back({"mpi", "NCCL",
                      std::to_string(nccl / 10000) + "." + std::to_string((nccl / 100) % 100) + "." +
                          std::to_string(nccl % 100)});
  }
#else
  report.push_back({"mpi", "NCCL", "not compiled in"});
#endif
  report.push_back({"mpi", "rank 0 device", runtime.device().str()});
  report.push_back({"mpi", "freed memory kept",
                    runtime.keeps_freed_memory()
                        ? "yes (no page-fault storm on large reductions; ZT_MALLOC_TUNING=0 to disable)"
                        : "no"});
  report.push_back({"mpi", "watchdog", watchdog_status(runtime)});
  report.push_back({"mpi", "collective timeout from", runtime.collective_timeout_source()});
  return report;
}

}  // namespace zt
