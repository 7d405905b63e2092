// The MPI runtime: initialization and finalization (RAII), world and node-local ranks, hosts,
// and the binding of local ranks to GPUs. Works under mpirun, srun, and as a singleton, and over a
// sub-communicator of an MPI the caller runs (several trainings in one job).
#pragma once

#include <mpi.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "zerotrain/communicator.hpp"
#include "zerotrain/device.hpp"
#include "zerotrain/watchdog.hpp"

namespace zt {

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
  /// (kWatchdogRankLostExitCode). 0 turns the watchdog off; otherwise at least
  /// kMinimumCollectiveTimeoutSeconds (ConfigError). The environment variable ZT_COLLECTIVE_TIMEOUT
  /// (seconds, or "off") overrides it. Needs MPI_THREAD_MULTIPLE. Applies to the runtime that starts
  /// the process's watchdog (see Runtime). zt::runtime_options_for(config) sets it from the config's
  /// comm.timeout_s.
  std::chrono::duration<double> collective_timeout{kDefaultCollectiveTimeoutSeconds};
  /// Where collective_timeout came from, as `zerotrain report` and the watchdog's messages name it
  /// (e.g. "comm.timeout_s in config file 'x.json'"); empty: "RuntimeOptions::collective_timeout".
  std::string collective_timeout_source{};
};

/// The ranks a training runs on, and the process around them.
///
/// Runtime(&argc, &argv) is the job's runtime: its world is MPI_COMM_WORLD. Runtime(comm) is a
/// runtime over a communicator of an MPI that is already running, e.g. one half of a job split
/// into two trainings: world(), world_rank(), world_size(), the node-local ranks and hosts() are
/// then those of `comm`, and the runtime neither initializes nor finalizes MPI.
///
/// The watchdog (docs/fault-detection.md) is one per process. Only a runtime over the whole world
/// (Runtime(&argc, &argv), or Runtime(comm) with comm MPI_COMM_WORLD or a duplicate) starts it,
/// and only if none runs yet; it watches every communicator of the process, whichever runtime
/// made it, and is stopped by the runtime that started it. A runtime over a sub-communicator
/// never starts one (that takes every process of the job): its communicators are watched by the
/// process's watchdog when one runs, so keep a runtime over the world alive around such runtimes
/// (as the MPI test main does) to have their hangs detected, and destroy them first.
class Runtime {
 public:
  /// Initializes MPI unless the caller already did (then it neither initializes nor finalizes).
  Runtime(int* argc, char*** argv, RuntimeOptions options = {});
  explicit Runtime(RuntimeOptions options = {}) : Runtime(nullptr, nullptr, options) {}
  /// A runtime over `comm` (its own duplicate of it) in an MPI the caller initialized and will
  /// finalize. Collective over `comm`. options.requested_thread_level does not apply (MPI is up).
  /// With bind_device, it takes the device another live runtime of this process bound, else
  /// local_rank() % visible devices (local to `comm`: where two trainings share a node without a
  /// world runtime, set bind_device = false and choose the devices yourself).
  explicit Runtime(MPI_Comm comm, RuntimeOptions options = {});
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;
  ~Runtime();

  int world_rank() const;
  int world_size() const;
  int local_rank() const;
  int local_size() const;
  int node_count() const;
  /// Index of this rank's node in hosts().
  int node_index() const;
  /// Distinct host names, in order of their lowest world rank.
  const std::vector<std::string>& hosts() const;
  const std::string& host_name() const;
  int thread_level() const;
  static std::string thread_level_name(int level);
  /// The device this rank computes on: a bound GPU, or the host.
  Device device() const;
  /// Whether this object initialized MPI (and so will finalize it).
  bool owns_mpi() const;
  /// Whether world() is all of MPI_COMM_WORLD, rank for rank (false: a sub-communicator).
  bool covers_mpi_world() const;
  /// The runtime's ranks behind the communicator interface ("world").
  Communicator& world();
  /// The MPI communicator of world()'s ranks: MPI_COMM_WORLD for Runtime(&argc, &argv), else this
  /// runtime's duplicate of `comm` (valid as long as the runtime).
  MPI_Comm world_comm() const;
  /// The ranks of world() on this node.
  MPI_Comm node_comm() const;
  /// What launched us: "mpirun", "srun", or "singleton" (no launcher).
  const std::string& launcher() const;

  /// The collective timeout of the watchdog that watches this runtime's communicators (this
  /// process's one: see above); 0 when none runs.
  std::chrono::duration<double> collective_timeout() const;
  /// Where the collective timeout in force comes from, and what it overrides: e.g.
  /// "ZT_COLLECTIVE_TIMEOUT=3, overriding comm.timeout_s in config file 'x.json' (4 s)" or
  /// "comm.timeout_s in config file 'x.json' (ZT_COLLECTIVE_TIMEOUT not set)". For this runtime's
  /// request also when no watchdog runs (e.g. "ZT_COLLECTIVE_TIMEOUT=off").
  std::string collective_timeout_source() const;
  /// Whether a watchdog watches this runtime's communicators (a timeout above 0 and
  /// MPI_THREAD_MULTIPLE, and for a runtime over a sub-communicator, a runtime over the world
  /// that started it).
  bool watchdog_running() const;

  /// Whether keep_freed_memory is in effect for this process.
  bool keeps_freed_memory() const;

  /// MPI library version string (MPI_Get_library_version), first line.
  static std::string mpi_library_version();

 private:
  struct Impl;  // mpi_layer/runtime.cpp
  std::unique_ptr<Impl> impl_;
};

/// Run `body` and turn any exception into a report naming the rank, then MPI_Abort the job with
/// exit code 1. Use around main() in programs that use zerotrain.
int run_and_report(const std::function<int()>& body);

}  // namespace zt
