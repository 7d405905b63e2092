// The MPI part of `zerotrain report`: library, thread level, layout, UCX, NCCL.
#include <dlfcn.h>
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "mpi_layer/watchdog.hpp"
#include "zerotrain/build_info.hpp"
#include "zerotrain/report.hpp"
#include "zerotrain/runtime.hpp"

#if ZT_HAVE_CUDA
#include <nccl.h>
#endif

namespace zt {
namespace {

/// Open MPI's control variables through the MPI tool interface (what `ompi_info` lists): every
/// registered component registers its parameters, so "pml_ucx_*" exists exactly when this Open MPI
/// has the UCX pml; "pml" is the selection in force (Debian sets "^ucx" in openmpi-mca-params.conf).
class ControlVariables {
 public:
  ControlVariables() {
    int provided = 0;
    ready_ = MPI_T_init_thread(MPI_THREAD_SINGLE, &provided) == MPI_SUCCESS;
  }
  ~ControlVariables() {
    if (ready_) MPI_T_finalize();
  }
  ControlVariables(const ControlVariables&) = delete;
  ControlVariables& operator=(const ControlVariables&) = delete;

  bool ready() const { return ready_; }

  /// Whether a variable whose name starts with `prefix` is registered.
  bool has_prefix(std::string_view prefix) const {
    bool found = false;
    for_each([&](int, const std::string& name, MPI_Datatype) { found = found || name.starts_with(prefix); });
    return found;
  }

  /// The value of a string variable; nullopt when it is not registered or cannot be read.
  std::optional<std::string> string_value(std::string_view wanted) const {
    std::optional<std::string> value;
    for_each([&](int index, const std::string& name, MPI_Datatype type) {
      if (value || name != wanted || type != MPI_CHAR) return;
      MPI_T_cvar_handle handle{};
      int count = 0;
      if (MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count) != MPI_SUCCESS) return;
      std::string text(static_cast<std::size_t>(std::max(count, 1)) + 1, '\0');
      if (MPI_T_cvar_read(handle, text.data()) == MPI_SUCCESS) value = std::string(text.c_str());
      MPI_T_cvar_handle_free(&handle);
    });
    return value;
  }

 private:
  template <class Visit>
  void for_each(Visit&& visit) const {
    int count = 0;
    if (!ready_ || MPI_T_cvar_get_num(&count) != MPI_SUCCESS) return;
    for (int index = 0; index < count; ++index) {
      char name[256];
      int name_length = sizeof name;
      int verbosity = 0, binding = 0, scope = 0;
      MPI_Datatype type = MPI_DATATYPE_NULL;
      MPI_T_enum enumtype{};
      if (MPI_T_cvar_get_info(index, name, &name_length, &verbosity, &type, &enumtype, nullptr, nullptr,
                              &binding, &scope) == MPI_SUCCESS) {
        visit(index, std::string(name), type);
      }
    }
  }

  bool ready_ = false;
};

/// The pml this process runs on: Open MPI's `mca_pml` module holds the selected component's
/// functions (its first member is pml_add_procs), and the shared object they live in is named after
/// the component (mca_pml_ob1.so, mca_pml_ucx.so).
std::string pml_in_use() {
  void* module = dlsym(RTLD_DEFAULT, "mca_pml");
  if (module == nullptr) return "unknown (not Open MPI, or its pml module is not exported)";
  void* first_function = nullptr;
  std::memcpy(&first_function, module, sizeof first_function);
  Dl_info info{};
  if (first_function == nullptr || dladdr(first_function, &info) == 0 || info.dli_fname == nullptr)
    return "unknown (no pml selected yet)";
  const std::string object = std::filesystem::path(info.dli_fname).filename().string();
  constexpr std::string_view kPrefix = "mca_pml_";
  if (object.starts_with(kPrefix)) return object.substr(kPrefix.size(), object.find('.') - kPrefix.size());
  return "built into " + object;
}

/// UCX's own version when its library is loaded in this process (by the UCX pml or osc).
std::string loaded_ucx_version() {
  void* library = dlopen("libucp.so.0", RTLD_LAZY | RTLD_NOLOAD);
  if (library == nullptr) return "";
  std::string version;
  if (void* symbol = dlsym(library, "ucp_get_version_string")) {
    const auto get_version = reinterpret_cast<const char* (*)()>(symbol);
    version = get_version();
  }
  dlclose(library);
  return version;
}

/// Whether Open MPI has the UCX pml, whether it is selected, and what selects it.
std::string ucx_status(const std::string& library, const std::string& pml) {
  if (library.find("Open MPI") == std::string::npos) {
    return "not checked (only Open MPI's UCX component is detected; see your MPI's documentation)";
  }
  const ControlVariables variables;
  if (!variables.ready()) return "unknown (the MPI tool interface is not available)";
  // A component excluded by the pml setting registers no variables: look for its file on Open MPI's
  // own component path too.
  std::string component;
  if (const auto path = variables.string_value("mca_base_component_path")) {
    std::string_view rest = *path;
    while (component.empty() && !rest.empty()) {
      const std::size_t colon = rest.find(':');
      const std::filesystem::path candidate =
          std::filesystem::path(std::string(rest.substr(0, colon))) / "mca_pml_ucx.so";
      std::error_code error;
      if (std::filesystem::exists(candidate, error)) component = candidate.string();
      rest = colon == std::string_view::npos ? std::string_view{} : rest.substr(colon + 1);
    }
  }
  if (component.empty() && !variables.has_prefix("pml_ucx_")) {
    return "not available: this Open MPI has no pml ucx component (build Open MPI with UCX to use it)";
  }
  const std::string version = loaded_ucx_version();
  std::string status = "available (Open MPI component pml ucx" + (version.empty() ? "" : ", UCX " + version) +
                       (component.empty() ? "" : ", " + component) + ")";
  if (pml == "ucx") return status + ", in use";
  const std::optional<std::string> selection = variables.string_value("pml");
  status += ", not in use";
  if (selection && !selection->empty()) status += " (the pml setting in force is \"" + *selection + "\")";
  return status +
         "; select it with `mpirun --mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any` (or "
         "OMPI_MCA_pml=ucx)";
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
  const std::string pml = pml_in_use();
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
      {"mpi", "pml in use", pml},
      {"mpi", "UCX", ucx_status(library, pml)},
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
