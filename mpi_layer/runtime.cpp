// zt::Runtime: MPI up and down, who and where we are, and which GPU is ours.
#include "zerotrain/runtime.hpp"

#include <malloc.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <mutex>
#include <optional>
#include <sstream>
#include <string_view>
#include <vector>

#include "mpi_layer/mpi_check.hpp"
#include "mpi_layer/watchdog.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/mpi_communicator.hpp"

namespace zt {
namespace {

bool mpi_is_running() {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized != 0 && finalized == 0;
}

[[noreturn]] void abort_job(const std::string& message) {
  std::fprintf(stderr, "%s\n", message.c_str());
  std::fflush(stderr);
  if (mpi_is_running()) MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

std::string rank_label() {
  const int rank = detail::error_rank();
  return rank >= 0 ? "rank " + std::to_string(rank) : std::string("a rank");
}

[[noreturn]] void terminate_with_report() {
  std::string message = "zerotrain: uncaught exception on " + rank_label();
  if (const std::exception_ptr error = std::current_exception()) {
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      message += ": ";
      message += e.what();
    } catch (...) {
      message += " (not a std::exception)";
    }
  } else {
    message = "zerotrain: std::terminate called on " + rank_label() + " without an active exception";
  }
  abort_job(message + "\nzerotrain: aborting the whole job so that the other ranks do not wait forever");
}

std::string detect_launcher() {
  if (std::getenv("SLURM_STEP_ID") != nullptr && std::getenv("SLURM_PROCID") != nullptr) return "srun";
  if (std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr) return "mpirun";
  if (std::getenv("PMI_RANK") != nullptr || std::getenv("PMIX_RANK") != nullptr) return "mpirun";
  return "singleton";
}

}  // namespace

std::string Runtime::thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
    default:
      return "unknown thread level " + std::to_string(level);
  }
}

std::string Runtime::mpi_library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  MPI_Get_library_version(text, &length);
  std::string version(text, static_cast<std::size_t>(length));
  if (auto newline = version.find_first_of("\r\n"); newline != std::string::npos) version.resize(newline);
  while (!version.empty() && (version.back() == ',' || version.back() == ' ')) version.pop_back();
  return version;
}

// ---- what the runtimes of one process share ---------------------------------------------

namespace {

/// The process's one watchdog (started and stopped by a runtime over the whole world), the
/// runtimes over sub-communicators that it watches, and the device the process computes on.
struct ProcessRuntimes {
  std::mutex mutex;
  bool watchdog_running = false;
  double watchdog_timeout_seconds = 0.0;
  std::string watchdog_timeout_source;
  int sub_communicator_runtimes = 0;
  int device_holders = 0;  // live runtimes that bound `device`
  Device device{};
};

ProcessRuntimes& process_runtimes() {
  static ProcessRuntimes instance;
  return instance;
}

/// The collective timeout a runtime asks for, and where it comes from.
struct RequestedTimeout {
  double seconds = 0.0;
  std::string source;  // Runtime::collective_timeout_source()
};

std::string seconds_text(double seconds) {
  std::ostringstream text;
  text << seconds;
  return text.str();
}

/// ZT_COLLECTIVE_TIMEOUT, else the options' timeout (from comm.timeout_s or the caller); a value
/// out of range is a ConfigError naming where it came from.
RequestedTimeout requested_collective_timeout(const RuntimeOptions& options) {
  const std::string options_source = options.collective_timeout_source.empty()
                                         ? std::string("RuntimeOptions::collective_timeout")
                                         : options.collective_timeout_source;
  const double from_options = options.collective_timeout.count();
  const std::string problem = collective_timeout_problem(from_options);
  ZT_CHECK_AS(ConfigError, problem.empty(), options_source, ": ", problem);
  const std::string options_text =
      options_source + " (" + (from_options == 0.0 ? std::string("off") : seconds_text(from_options) + " s") +
      (options.collective_timeout_source.empty() && from_options == kDefaultCollectiveTimeoutSeconds
           ? ", the default)"
           : ")");
  if (const std::optional<double> from_environment = detail::collective_timeout_from_environment()) {
    return {*from_environment, "ZT_COLLECTIVE_TIMEOUT=" + std::string(std::getenv("ZT_COLLECTIVE_TIMEOUT")) +
                                   ", overriding " + options_text};
  }
  return {from_options, options_text + ", ZT_COLLECTIVE_TIMEOUT not set"};
}

/// Before MPI_Init where the runtime initializes MPI, so that MPI's own buffers follow the policy.
bool tune_malloc(const RuntimeOptions& options) {
  const char* malloc_tuning = std::getenv("ZT_MALLOC_TUNING");
  if (!options.keep_freed_memory || (malloc_tuning != nullptr && std::string_view(malloc_tuning) == "0"))
    return false;
  return mallopt(M_MMAP_MAX, 0) == 1 && mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max()) == 1;
}

}  // namespace

struct Runtime::Impl {
  bool owns_mpi = false;
  bool keeps_freed_memory = false;
  bool covers_mpi_world = true;
  bool counted_as_sub_communicator = false;  // in ProcessRuntimes::sub_communicator_runtimes
  bool holds_device = false;                 // in ProcessRuntimes::device_holders
  int thread_level = MPI_THREAD_SINGLE;
  int world_rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_size = 1;
  int node_index = 0;
  std::vector<std::string> hosts;
  MPI_Comm world_comm = MPI_COMM_NULL;
  MPI_Comm node_comm = MPI_COMM_NULL;
  Device device{};
  std::string launcher;
  std::unique_ptr<Communicator> world;
  std::unique_ptr<detail::Watchdog> watchdog;  // when this runtime started the process's watchdog
  std::string collective_timeout_source;       // what this runtime asked for, and from where

  /// Everything once MPI runs: ranks, node, hosts, device, the world communicator over `comm`, and
  /// the watchdog.
  void set_up(MPI_Comm comm, const RuntimeOptions& options);
  /// A runtime over the whole world starts the process's watchdog unless one runs already
  /// (collective over MPI_COMM_WORLD: every process decides alike).
  void start_watchdog(const RuntimeOptions& options, std::vector<std::string> host_of_rank);
  /// A runtime over a sub-communicator is watched by the process's watchdog, if any.
  void join_process_watchdog(const RuntimeOptions& options);
  void bind_device();
  /// Undo this runtime's entries in ProcessRuntimes.
  void leave_process() noexcept;
};

void Runtime::Impl::set_up(MPI_Comm comm, const RuntimeOptions& options) {
  if (options.abort_on_uncaught_exception) std::set_terminate(terminate_with_report);
  // Errors name the process's rank in the job, also under a runtime over a sub-communicator: it
  // is unique in the job, and it is what the launcher and the watchdog report.
  int job_rank = 0;
  ZT_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &job_rank), "MPI_COMM_WORLD");
  detail::error_rank() = job_rank;
  ZT_CHECK_MPI(MPI_Comm_rank(comm, &world_rank), "world");
  ZT_CHECK_MPI(MPI_Comm_size(comm, &world_size), "world");
  ZT_CHECK(thread_level >= MPI_THREAD_FUNNELED, "MPI provides only ", thread_level_name(thread_level),
           "; zerotrain needs at least MPI_THREAD_FUNNELED");

  // Node-local ranks: ranks that can share memory are on one node, whatever the launcher.
  ZT_CHECK_MPI(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &node_comm),
               "world");
  ZT_CHECK_MPI(MPI_Comm_rank(node_comm, &local_rank), "node");
  ZT_CHECK_MPI(MPI_Comm_size(node_comm, &local_size), "node");

  // Host names of all ranks, so that every rank knows the node list in the same order.
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int name_length = 0;
  ZT_CHECK_MPI(MPI_Get_processor_name(name, &name_length), "world");
  std::vector<char> all_names(static_cast<std::size_t>(world_size) * MPI_MAX_PROCESSOR_NAME);
  ZT_CHECK_MPI(MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all_names.data(), MPI_MAX_PROCESSOR_NAME,
                             MPI_CHAR, comm),
               "world");
  std::vector<std::string> host_of_rank;
  host_of_rank.reserve(static_cast<std::size_t>(world_size));
  for (int r = 0; r < world_size; ++r) {
    std::string host(&all_names[static_cast<std::size_t>(r) * MPI_MAX_PROCESSOR_NAME]);
    host_of_rank.push_back(host);
    bool known = false;
    for (const auto& h : hosts) known = known || h == host;
    if (!known) hosts.push_back(host);
    if (r == world_rank) {
      for (std::size_t i = 0; i < hosts.size(); ++i) {
        if (hosts[i] == host) node_index = static_cast<int>(i);
      }
    }
  }

  launcher = detect_launcher();
  if (options.bind_device && cuda_status().usable()) bind_device();
  world = make_mpi_communicator(comm, "world");
  if (covers_mpi_world) {
    start_watchdog(options, std::move(host_of_rank));
  } else {
    join_process_watchdog(options);
  }
}

void Runtime::Impl::bind_device() {
  // A process computes on one device: a second runtime takes the one the first bound.
  ProcessRuntimes& process = process_runtimes();
  {
    const std::lock_guard lock(process.mutex);
    if (process.device_holders == 0) process.device = Device::cuda(local_rank % cuda_status().device_count);
    device = process.device;
    ++process.device_holders;
    holds_device = true;
  }
  set_current_device(device);
}

void Runtime::Impl::start_watchdog(const RuntimeOptions& options, std::vector<std::string> host_of_rank) {
  const RequestedTimeout request = requested_collective_timeout(options);
  const double requested = request.seconds;
  collective_timeout_source = request.source;
  ProcessRuntimes& process = process_runtimes();
  bool already_running = false;
  {
    const std::lock_guard lock(process.mutex);
    already_running = process.watchdog_running;
  }
  // Starting the watchdog is collective, so every rank must decide alike.
  const double running = already_running ? 1.0 : 0.0;
  double extremes[4] = {requested, -requested, running, -running};
  ZT_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, extremes, 4, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD),
               "MPI_COMM_WORLD");
  ZT_CHECK_AS(
      ConfigError, extremes[0] == -extremes[1], "the collective timeout differs between ranks (from ",
      extremes[0], " s to ", -extremes[1],
      " s); set ZT_COLLECTIVE_TIMEOUT, comm.timeout_s and RuntimeOptions::collective_timeout alike on "
      "every rank");
  ZT_CHECK(extremes[2] == -extremes[3],
           "a watchdog runs in some processes of the job but not in others: create the zt::Runtime objects "
           "over MPI_COMM_WORLD in the same order on every rank");
  if (already_running) return;  // this runtime's communicators are watched by the process's watchdog
  if (requested == 0.0) return;
  if (thread_level < MPI_THREAD_MULTIPLE) {
    if (world_rank == 0) {
      std::fprintf(stderr,
                   "zerotrain: the watchdog needs MPI_THREAD_MULTIPLE but MPI provides %s; hangs will not be "
                   "detected\n",
                   thread_level_name(thread_level).c_str());
    }
    return;
  }
  watchdog = std::make_unique<detail::Watchdog>(
      detail::WatchdogSettings::for_timeout(requested, request.source), std::move(host_of_rank));
  const std::lock_guard lock(process.mutex);
  process.watchdog_running = true;
  process.watchdog_timeout_seconds = requested;
  process.watchdog_timeout_source = request.source;
}

void Runtime::Impl::join_process_watchdog(const RuntimeOptions& options) {
  const RequestedTimeout request = requested_collective_timeout(options);
  const double requested = request.seconds;
  collective_timeout_source = request.source;
  ProcessRuntimes& process = process_runtimes();
  bool watched = false;
  {
    const std::lock_guard lock(process.mutex);
    watched = process.watchdog_running;
    ++process.sub_communicator_runtimes;
    counted_as_sub_communicator = true;
  }
  if (!watched && requested > 0.0 && world_rank == 0) {
    std::fprintf(
        stderr,
        "zerotrain: no watchdog watches this runtime over a sub-communicator (%d of the job's ranks): "
        "only a zt::Runtime over MPI_COMM_WORLD starts one; create one on every rank before the runtimes "
        "over sub-communicators to have hangs detected\n",
        world_size);
  }
}

void Runtime::Impl::leave_process() noexcept {
  ProcessRuntimes& process = process_runtimes();
  const std::lock_guard lock(process.mutex);
  if (counted_as_sub_communicator) --process.sub_communicator_runtimes;
  if (holds_device) --process.device_holders;
  counted_as_sub_communicator = holds_device = false;
}

// ---- construction and destruction ---------------------------------------------------------

Runtime::Runtime(int* argc, char*** argv, RuntimeOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->keeps_freed_memory = tune_malloc(options);
  int finalized = 0;
  MPI_Finalized(&finalized);
  ZT_CHECK(finalized == 0, "zt::Runtime created after MPI_Finalize: MPI cannot be initialized twice");
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized == 0) {
    ZT_CHECK_MPI(MPI_Init_thread(argc, argv, options.requested_thread_level, &impl_->thread_level), "world");
    impl_->owns_mpi = true;
  } else {
    ZT_CHECK_MPI(MPI_Query_thread(&impl_->thread_level), "world");
  }
  impl_->world_comm = MPI_COMM_WORLD;
  impl_->set_up(MPI_COMM_WORLD, options);
}

Runtime::Runtime(MPI_Comm comm, RuntimeOptions options) : impl_(std::make_unique<Impl>()) {
  ZT_CHECK(mpi_is_running(),
           "zt::Runtime(MPI_Comm): MPI is not initialized (or already finalized); initialize "
           "it first (MPI_Init_thread), or use zt::Runtime(&argc, &argv)");
  ZT_CHECK(comm != MPI_COMM_NULL,
           "zt::Runtime(MPI_Comm): the communicator is MPI_COMM_NULL; expected one this rank belongs to");
  impl_->keeps_freed_memory = tune_malloc(options);
  ZT_CHECK_MPI(MPI_Query_thread(&impl_->thread_level), "world");
  // MPI_COMM_WORLD's ranks in its order (it, or a duplicate): the runtime may start the watchdog.
  int relation = MPI_UNEQUAL;
  ZT_CHECK_MPI(MPI_Comm_compare(comm, MPI_COMM_WORLD, &relation), "world");
  impl_->covers_mpi_world = relation == MPI_IDENT || relation == MPI_CONGRUENT;
  impl_->set_up(comm, options);
  impl_->world_comm = native_mpi_comm(*impl_->world);
}

Runtime::~Runtime() {
  Impl& impl = *impl_;
  if (!mpi_is_running()) {
    impl.leave_process();
    return;
  }
  if (std::uncaught_exceptions() > 0) {
    // Finalizing here would leave the other ranks waiting in their next collective.
    abort_job("zerotrain: " + rank_label() +
              " is leaving zt::Runtime's scope with an exception in flight; aborting the whole job. "
              "Catch it inside the runtime's scope (zt::run_and_report does) to see its message.");
  }
  if (impl.watchdog) {
    ProcessRuntimes& process = process_runtimes();
    int outliving = 0;
    {
      const std::lock_guard lock(process.mutex);
      outliving = process.sub_communicator_runtimes;
    }
    if (outliving > 0) {
      std::fprintf(stderr,
                   "zerotrain: %s: the runtime that runs the watchdog ends while %d runtime(s) over "
                   "sub-communicators live on; they are no longer watched (destroy them first)\n",
                   rank_label().c_str(), outliving);
    }
    // Every rank stops watching only once all have arrived here, and the barrier itself is watched:
    // a rank that never gets here is reported instead of leaving the others in MPI_Finalize.
    impl.watchdog->begin_shutdown();
    try {
      impl.world->barrier();
    } catch (const std::exception& error) {
      abort_job(std::string("zerotrain: the shutdown barrier failed on ") + rank_label() + ": " +
                error.what());
    }
    impl.watchdog.reset();
    const std::lock_guard lock(process.mutex);
    process.watchdog_running = false;
    process.watchdog_timeout_seconds = 0.0;
    process.watchdog_timeout_source.clear();
  }
  impl.world.reset();
  if (impl.node_comm != MPI_COMM_NULL) MPI_Comm_free(&impl.node_comm);
  impl.leave_process();
  if (impl.owns_mpi) MPI_Finalize();
}

// ---- accessors ----------------------------------------------------------------------------

int Runtime::world_rank() const {
  return impl_->world_rank;
}
int Runtime::world_size() const {
  return impl_->world_size;
}
int Runtime::local_rank() const {
  return impl_->local_rank;
}
int Runtime::local_size() const {
  return impl_->local_size;
}
int Runtime::node_count() const {
  return static_cast<int>(impl_->hosts.size());
}
int Runtime::node_index() const {
  return impl_->node_index;
}
const std::vector<std::string>& Runtime::hosts() const {
  return impl_->hosts;
}
const std::string& Runtime::host_name() const {
  return impl_->hosts[static_cast<std::size_t>(impl_->node_index)];
}
int Runtime::thread_level() const {
  return impl_->thread_level;
}
Device Runtime::device() const {
  return impl_->device;
}
bool Runtime::owns_mpi() const {
  return impl_->owns_mpi;
}
bool Runtime::covers_mpi_world() const {
  return impl_->covers_mpi_world;
}
Communicator& Runtime::world() {
  return *impl_->world;
}
MPI_Comm Runtime::world_comm() const {
  return impl_->world_comm;
}
MPI_Comm Runtime::node_comm() const {
  return impl_->node_comm;
}
const std::string& Runtime::launcher() const {
  return impl_->launcher;
}
bool Runtime::keeps_freed_memory() const {
  return impl_->keeps_freed_memory;
}

std::chrono::duration<double> Runtime::collective_timeout() const {
  ProcessRuntimes& process = process_runtimes();
  const std::lock_guard lock(process.mutex);
  return std::chrono::duration<double>(process.watchdog_running ? process.watchdog_timeout_seconds : 0.0);
}

std::string Runtime::collective_timeout_source() const {
  // A runtime over a sub-communicator is watched with the settings of the runtime that started the
  // watchdog; its own request only says what it asked for.
  ProcessRuntimes& process = process_runtimes();
  const std::lock_guard lock(process.mutex);
  if (process.watchdog_running && !impl_->watchdog) return process.watchdog_timeout_source;
  return impl_->collective_timeout_source;
}

bool Runtime::watchdog_running() const {
  ProcessRuntimes& process = process_runtimes();
  const std::lock_guard lock(process.mutex);
  return process.watchdog_running;
}

int run_and_report(const std::function<int()>& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    // The what() of zerotrain errors already names the rank; other exceptions get it here.
    abort_job(std::string("zerotrain: fatal error on ") + rank_label() + ": " + e.what() +
              "\nzerotrain: aborting the whole job so that the other ranks do not wait forever");
  } catch (...) {
    abort_job("zerotrain: fatal non-standard exception on " + rank_label() + "; aborting the whole job");
  }
}

}  // namespace zt
