// zt::Runtime: MPI up and down, who and where we are, and which GPU is ours.
#include "zerotrain/runtime.hpp"

#include <malloc.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
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

Runtime::Runtime(int* argc, char*** argv, RuntimeOptions options) {
  const char* malloc_tuning = std::getenv("ZT_MALLOC_TUNING");
  if (options.keep_freed_memory && !(malloc_tuning != nullptr && std::string_view(malloc_tuning) == "0")) {
    // Before MPI_Init, so that MPI's own buffers follow the same policy.
    keeps_freed_memory_ =
        mallopt(M_MMAP_MAX, 0) == 1 && mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max()) == 1;
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  ZT_CHECK(finalized == 0, "zt::Runtime created after MPI_Finalize: MPI cannot be initialized twice");
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized == 0) {
    ZT_CHECK_MPI(MPI_Init_thread(argc, argv, options.requested_thread_level, &thread_level_), "world");
    owns_mpi_ = true;
  } else {
    ZT_CHECK_MPI(MPI_Query_thread(&thread_level_), "world");
  }
  if (options.abort_on_uncaught_exception) std::set_terminate(terminate_with_report);

  ZT_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_), "world");
  ZT_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &world_size_), "world");
  detail::error_rank() = world_rank_;
  ZT_CHECK(thread_level_ >= MPI_THREAD_FUNNELED, "MPI provides only ", thread_level_name(thread_level_),
           "; zerotrain needs at least MPI_THREAD_FUNNELED");

  // Node-local ranks: ranks that can share memory are on one node, whatever the launcher.
  ZT_CHECK_MPI(
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank_, MPI_INFO_NULL, &node_comm_),
      "world");
  ZT_CHECK_MPI(MPI_Comm_rank(node_comm_, &local_rank_), "node");
  ZT_CHECK_MPI(MPI_Comm_size(node_comm_, &local_size_), "node");

  // Host names of all ranks, so that every rank knows the node list in the same order.
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int name_length = 0;
  ZT_CHECK_MPI(MPI_Get_processor_name(name, &name_length), "world");
  std::vector<char> all_names(static_cast<std::size_t>(world_size_) * MPI_MAX_PROCESSOR_NAME);
  ZT_CHECK_MPI(MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all_names.data(), MPI_MAX_PROCESSOR_NAME,
                             MPI_CHAR, MPI_COMM_WORLD),
               "world");
  std::vector<std::string> host_of_rank;
  host_of_rank.reserve(static_cast<std::size_t>(world_size_));
  for (int r = 0; r < world_size_; ++r) {
    std::string host(&all_names[static_cast<std::size_t>(r) * MPI_MAX_PROCESSOR_NAME]);
    host_of_rank.push_back(host);
    bool known = false;
    for (const auto& h : hosts_) known = known || h == host;
    if (!known) hosts_.push_back(host);
    if (r == world_rank_) {
      for (std::size_t i = 0; i < hosts_.size(); ++i) {
        if (hosts_[i] == host) node_index_ = static_cast<int>(i);
      }
    }
  }

  launcher_ = detect_launcher();
  if (options.bind_device && cuda_status().usable()) {
    device_ = Device::cuda(local_rank_ % cuda_status().device_count);
    set_current_device(device_);
  }
  world_ = make_mpi_communicator(MPI_COMM_WORLD, "world");
  start_watchdog(options, std::move(host_of_rank));
}

void Runtime::start_watchdog(const RuntimeOptions& options, std::vector<std::string> host_of_rank) {
  const double requested =
      detail::collective_timeout_from_environment().value_or(options.collective_timeout.count());
  ZT_CHECK_AS(ConfigError, requested >= 0.0, "RuntimeOptions::collective_timeout is ", requested,
              " s; expected 0 (off) or a positive number of seconds");
  // Starting the watchdog is collective, so every rank must decide alike.
  double extremes[2] = {requested, -requested};
  ZT_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, extremes, 2, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD), "world");
  ZT_CHECK_AS(ConfigError, extremes[0] == -extremes[1], "the collective timeout differs between ranks (from ",
              extremes[0], " s to ", -extremes[1],
              " s); set ZT_COLLECTIVE_TIMEOUT and RuntimeOptions::collective_timeout alike on every rank");
  if (requested == 0.0) return;
  if (thread_level_ < MPI_THREAD_MULTIPLE) {
    if (world_rank_ == 0) {
      std::fprintf(stderr,
                   "zerotrain: the watchdog needs MPI_THREAD_MULTIPLE but MPI provides %s; hangs will not be "
                   "detected\n",
                   thread_level_name(thread_level_).c_str());
    }
    return;
  }
  watchdog_ = std::make_unique<detail::Watchdog>(detail::WatchdogSettings::for_timeout(requested),
                                                 std::move(host_of_rank));
  collective_timeout_ = std::chrono::duration<double>(requested);
}

Runtime::~Runtime() {
  if (!mpi_is_running()) return;
  if (std::uncaught_exceptions() > 0) {
    // Finalizing here would leave the other ranks waiting in their next collective.
    abort_job("zerotrain: " + rank_label() +
              " is leaving zt::Runtime's scope with an exception in flight; aborting the whole job. "
              "Catch it inside the runtime's scope (zt::run_and_report does) to see its message.");
  }
  if (watchdog_) {
    // Every rank stops watching only once all have arrived here, and the barrier itself is watched:
    // a rank that never gets here is reported instead of leaving the others in MPI_Finalize.
    watchdog_->begin_shutdown();
    try {
      world_->barrier();
    } catch (const std::exception& error) {
      abort_job(std::string("zerotrain: the shutdown barrier failed on ") + rank_label() + ": " +
                error.what());
    }
    watchdog_.reset();
  }
  world_.reset();
  if (node_comm_ != MPI_COMM_NULL) MPI_Comm_free(&node_comm_);
  if (owns_mpi_) MPI_Finalize();
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
