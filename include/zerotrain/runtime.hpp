// The MPI runtime: initialization and finalization (RAII), world and node-local ranks, hosts,
// and the binding of local ranks to GPUs. Works under mpirun, srun, and as a singleton.
#pragma once

#include <mpi.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "zerotrain/communicator.hpp"
#include "zerotrain/device.hpp"
#include "zerotrain/watchdog.hpp"

namespace zt {

namespace detail {
class Watchdog;
}

struct RuntimeOptions {
  /// Thread level asked of MPI. MULTIPLE lets a watchdog or progress thread call MPI; the runtime
  /// accepts FUNNELED or better and reports what it got (Runtime::thread_level()).
  int requested_thread_level = MPI_THREAD_MULTIPLE;
  /// Bind this rank to GPU (local_rank % visible devices) when CUDA is usable.
  bool bind_device = true;
  /// Install a terminate handler that reports an uncaught exception with its rank and calls
  /// MPI_Abort, so that one failing rank ends the whole job instead of leaving the others hanging.
  bool abort_on_uncaught_exception = true;
  /// Keep freed large blocks in the process instead of returning them to the kernel
  /// (mallopt M_MMAP_MAX = 0, M_TRIM_THRESHOLD = 2 GiB, the largest it takes). Training allocates and frees
  /// buffers of the same sizes every step, and so does MPI for the temporaries of large reductions; handed
  /// back to the kernel, each comes back as fresh pages whose faults can cost 10x the collective itself. The
  /// environment variable ZT_MALLOC_TUNING=0 turns it off.
  bool keep_freed_memory = true;
  /// Watchdog (docs/fault-detection.md): an operation on any communicator still in flight after
  /// this long ends the job with a report of the operation and of the ranks that have not arrived
  /// (exit code kWatchdogTimeoutExitCode); a rank without heartbeat for min(this, 60 s) ends it too
  /// (kWatchdogRankLostExitCode). 0 turns the watchdog off. The environment variable
  /// ZT_COLLECTIVE_TIMEOUT (seconds) overrides it. Needs MPI_THREAD_MULTIPLE.
  std::chrono::duration<double> collective_timeout{kDefaultCollectiveTimeoutSeconds};
};

class Runtime {
 public:
  /// Initializes MPI unless the caller already did (then it neither initializes nor finalizes).
  Runtime(int* argc, char*** argv, RuntimeOptions options = {});
  explicit Runtime(RuntimeOptions options = {}) : Runtime(nullptr, nullptr, options) {}
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;
  ~Runtime();

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  int node_count() const { return static_cast<int>(hosts_.size()); }
  /// Index of this rank's node in hosts().
  int node_index() const { return node_index_; }
  /// Distinct host names, in order of their lowest world rank.
  const std::vector<std::string>& hosts() const { return hosts_; }
  const std::string& host_name() const { return hosts_[node_index_]; }
  int thread_level() const { return thread_level_; }
  static std::string thread_level_name(int level);
  /// The device this rank computes on: a bound GPU, or the host.
  Device device() const { return device_; }
  /// Whether this object initialized MPI (and so will finalize it).
  bool owns_mpi() const { return owns_mpi_; }
  /// MPI_COMM_WORLD behind the communicator interface.
  Communicator& world() { return *world_; }
  MPI_Comm world_comm() const { return MPI_COMM_WORLD; }
  MPI_Comm node_comm() const { return node_comm_; }
  /// What launched us: "mpirun", "srun", or "singleton" (no launcher).
  const std::string& launcher() const { return launcher_; }

  /// The collective timeout in effect (options or ZT_COLLECTIVE_TIMEOUT); 0 when off.
  std::chrono::duration<double> collective_timeout() const { return collective_timeout_; }
  /// Whether the watchdog thread runs (a timeout above 0 and MPI_THREAD_MULTIPLE).
  bool watchdog_running() const { return watchdog_ != nullptr; }

  /// Whether keep_freed_memory is in effect for this process.
  bool keeps_freed_memory() const { return keeps_freed_memory_; }

  /// MPI library version string (MPI_Get_library_version), first line.
  static std::string mpi_library_version();

 private:
  void start_watchdog(const RuntimeOptions& options, std::vector<std::string> host_of_rank);

  bool owns_mpi_ = false;
  bool keeps_freed_memory_ = false;
  int thread_level_ = MPI_THREAD_SINGLE;
  int world_rank_ = 0;
  int world_size_ = 1;
  int local_rank_ = 0;
  int local_size_ = 1;
  int node_index_ = 0;
  std::vector<std::string> hosts_;
  MPI_Comm node_comm_ = MPI_COMM_NULL;
  Device device_{};
  std::string launcher_;
  std::unique_ptr<Communicator> world_;
  std::chrono::duration<double> collective_timeout_{0.0};
  std::unique_ptr<detail::Watchdog> watchdog_;  // last: stopped first
};

/// Run `body` and turn any exception into a report naming the rank, then MPI_Abort the job with
/// exit code 1. Use around main() in programs that use zerotrain.
int run_and_report(const std::function<int()>& body);

}  // namespace zt
