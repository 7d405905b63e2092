// ZeRO-3 parameter gathering: each rank keeps its piece of every parameter; a module's parameters
// are all-gathered before its forward and its backward and released after, as the engine's module
// hooks say. Internal to the engine.
//
// The first training pass records the order in which modules use parameters (forward, then
// backward); later passes follow that trace to
//   - prefetch: start the all-gathers of the next modules' parameters (up to
//     stage3_prefetch_bucket_size elements ahead) while the current module computes;
//   - keep a parameter gathered when its next use comes within stage3_max_reuse_distance
//     elements of other parameters' use (the tied lm_head's weight from its forward to its backward);
// while never holding more than stage3_max_live_parameters gathered elements (beyond what the
// current module needs). Parameters of at most stage3_param_persistence_threshold elements stay
// gathered for good and are refreshed after each optimizer step. With offload_param "nvme" the
// pieces come from the ParameterStore's swap file through its host buffers (and, with the engine
// on a device, from there into the gather's staging on the device: ParameterStore::copy_to_device,
// on the transfer stream, which the all-gather waits for and the compute stream does not).
// A gather needs its pieces in memory when it is launched, so decided gathers wait in a queue while
// their pieces are read and are launched in queue order (the same on every rank, whatever the
// reads' timing) once the head's pieces are in; prefetching also starts the reads of pieces beyond
// the window, as far as the buffers allow.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "src/engine/partition_plan.hpp"
#include "zerotrain/communicator.hpp"
#include "zerotrain/engine.hpp"
#include "zerotrain/execution.hpp"
#include "zerotrain/nn.hpp"

namespace zt::engine_detail {

class ParameterStore;

struct ParameterGathererOptions {
  DType dtype = DType::fp32;                    // of the parameters and of the shard
  std::int64_t prefetch_elements = 50'000'000;  // stage3_prefetch_bucket_size
                                                /// Per parameter: stays gathered for good (the partition
                                                /// plan's persistent(); stage3_param_
  /// persistence_threshold). Empty: none.
  std::vector<char> persistent;
  std::int64_t max_live = 1'000'000'000;                 // stage3_max_live_parameters
  std::int64_t max_reuse_distance = 1'000'000'000;       // stage3_max_reuse_distance
  std::int64_t allgather_bucket_elements = 500'000'000;  // for refreshing persistent parameters
};

enum class Phase : std::uint8_t { forward, backward };

class ParameterGatherer {
 public:
  /// `uses[u]` lists the parameter indices module use u reads. `shard` holds this rank's pieces;
  /// `parameters[i]->value` is the gathered tensor or undefined.
  /// Non-persistent parameters are released here; persistent ones keep their current value.
  ParameterGatherer(Communicator& communicator, const ExecutionContext& execution,
                    const std::vector<FlatParameter>& layout, std::vector<nn::Parameter*> parameters,
                    std::vector<std::vector<std::size_t>> uses, ParameterStore& shard,
                    ParameterGathererOptions options);
  ~ParameterGatherer();
  ParameterGatherer(const ParameterGatherer&) = delete;
  ParameterGatherer& operator=(const ParameterGatherer&) = delete;

  /// A forward starts: training passes record (first) or follow the trace; eval passes do neither.
  void begin_pass(bool training);
  /// Module use `use` is about to run `phase`: its parameters are gathered when this returns.
  void before(std::size_t use, Phase phase);
  /// Module use `use` finished `phase`: release what will not be reused soon.
  void after(std::size_t use, Phase phase);
  /// Backward is over: release every non-persistent parameter; the trace is complete.
  void end_of_backward();
  /// The shard changed (optimizer step): gather the persistent parameters again.
  void refresh_persistent();
  /// Let in-flight prefetches progress.
  void poll();

  bool persistent(std::size_t index) const { return slots_[index].persistent; }
  std::int64_t live_elements() const { return live_; }
  std::int64_t peak_live_elements() const { return peak_live_; }
  double wait_seconds() const { return wait_seconds_; }

 private:
  // queued: its gather is decided (and its piece being read, when on NVMe) but not launched yet.
  enum class State : std::uint8_t { released, queued, in_flight, available };
  struct Slot {
    State state = State::released;
    bool persistent = false;
  };
  struct Event {
    std::size_t use;
    Phase phase;
    bool operator==(const Event&) const = default;
  };
  struct Gather {
    std::vector<std::size_t> members;
    std::vector<std::int64_t> member_offsets;
    std::int64_t count = 0;  // elements per rank
    Tensor staging;
    bool after_transfers = false;  // pieces copied on the transfer stream: the all-gather waits for them
    Work work;
  };

  Gather pack(const std::vector<std::size_t>& members);
  /// Decide a gather of `members`: their reads start, and gathers are launched in queue order as
  /// soon as every piece of the queue's head is in memory (at once without NVMe).
  void enqueue(std::vector<std::size_t> members);
  void launch_ready();
  void launch_next();  // the queue's head, waiting for its reads
  void launch_all_queued();
  void complete(Gather& gather);
  void wait_oldest();
  void wait_until_available(std::size_t index);
  void release(std::size_t index);
  void make_room(std::int64_t needed, const std::vector<std::size_t>& keep);
  void prefetch();
  /// Start reading the NVMe pieces of the parameters used after event `from` of the trace.
  void read_ahead(std::size_t from);
  bool reused_soon(std::size_t index) const;

  Communicator& communicator_;
  const ExecutionContext& execution_;  // staging and gathered tensors on its device
  const std::vector<FlatParameter>& layout_;
  std::vector<nn::Parameter*> parameters_;
  std::vector<std::vector<std::size_t>> uses_;
  ParameterStore& shard_;
  ParameterGathererOptions options_;
  std::vector<Slot> slots_;
  std::deque<std::vector<std::size_t>> queued_;  // decided gathers, launched in this order
  std::deque<Gather> in_flight_;
  std::vector<Event> trace_;
  bool trace_complete_ = false;
  bool recording_ = false;
  bool following_ = false;
  std::size_t cursor_ = 0;  // next trace event expected
  std::int64_t live_ = 0;   // gathered or in-flight elements of non-persistent parameters
  std::int64_t peak_live_ = 0;
  double wait_seconds_ = 0.0;
};

}  // namespace zt::engine_detail
