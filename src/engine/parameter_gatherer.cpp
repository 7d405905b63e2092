// ZeRO-3 parameter gathering (see parameter_gatherer.hpp).
#include "src/engine/parameter_gatherer.hpp"
#include "base/seconds_since.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "src/engine/parameter_store.hpp"
#include "zerotrain/error.hpp"

namespace zt::engine_detail {

using base::Clock;
using base::seconds_since;
ParameterGatherer::ParameterGatherer(Communicator& communicator, const ExecutionContext& execution,
                                     const std::vector<FlatParameter>& layout,
                                     std::vector<nn::Parameter*> parameters,
                                     std::vector<std::vector<std::size_t>> uses, ParameterStore& shard,
                                     ParameterGathererOptions options)
    : communicator_(communicator),
      execution_(execution),
      layout_(layout),
      parameters_(std::move(parameters)),
      uses_(std::move(uses)),
      shard_(shard),
      options_(options),
      slots_(layout.size()) {
  ZT_CHECK(parameters_.size() == layout_.size(), "ParameterGatherer: ", parameters_.size(),
           " parameters for a layout of ", layout_.size());
  ZT_CHECK(options_.persistent.empty() || options_.persistent.size() == layout_.size(),
           "ParameterGatherer: persistence flags for ", options_.persistent.size(),
           " parameters, the layout has ", layout_.size());
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    slots_[i].persistent = !options_.persistent.empty() && options_.persistent[i] != 0;
    if (slots_[i].persistent) {
      slots_[i].state = State::available;
    } else {
      parameters_[i]->value = Tensor();  // this rank keeps only its piece, in the shard
    }
  }
}

ParameterGatherer::~ParameterGatherer() {
  // Never leave a collective in flight on buffers about to be freed (Work's destructor waits).
  in_flight_.clear();
}

void ParameterGatherer::begin_pass(bool training) {
  ZT_CHECK((in_flight_.empty() && queued_.empty()) || training,
           "ParameterGatherer: an evaluation pass while gathers are in flight");
  recording_ = training && !trace_complete_;
  following_ = training && trace_complete_;
  if (recording_) trace_.clear();
  cursor_ = 0;
}

ParameterGatherer::Gather ParameterGatherer::pack(const std::vector<std::size_t>& members) {
  Gather gather;
  gather.members = members;
  for (std::size_t index : members) {
    gather.member_offsets.push_back(gather.count);
    gather.count += layout_[index].piece_numel;
  }
  const std::size_t element = dtype_size(options_.dtype);
  const int ranks = communicator_.size();
  gather.staging = execution_.empty({gather.count * ranks}, options_.dtype, MemoryCategory::comm_buffers);
  std::byte* mine = static_cast<std::byte*>(gather.staging.raw_data()) +
                    static_cast<std::size_t>(communicator_.rank() * gather.count) * element;
  // Pieces on NVMe: start every member's read before waiting for the first (as buffers allow).
  for (std::size_t index : members) {
    if (!shard_.prefetch(index)) break;
  }
  // Each piece into this rank's part of the staging: from the shard on the device, or from the
  // store's host memory (NVMe), on the compute stream that the all-gather is ordered after or on
  // the transfer stream (pieces from the swap file's buffers), which the all-gather then waits for.
  for (std::size_t m = 0; m < members.size(); ++m) {
    gather.after_transfers |= shard_.copy_to_device(
        members[m], mine + static_cast<std::size_t>(gather.member_offsets[m]) * element);
  }
  return gather;
}

void ParameterGatherer::enqueue(std::vector<std::size_t> members) {
  if (members.empty()) return;
  for (std::size_t index : members) {
    slots_[index].state = State::queued;
    if (!slots_[index].persistent) live_ += layout_[index].numel;
  }
  peak_live_ = std::max(peak_live_, live_);
  queued_.push_back(std::move(members));
  launch_ready();
}

void ParameterGatherer::launch_ready() {
  // Strictly in queue order, so that every rank launches the same collectives in the same order
  // whatever its reads' timing.
  while (!queued_.empty()) {
    const std::vector<std::size_t>& head = queued_.front();
    if (!std::all_of(head.begin(), head.end(), [&](std::size_t index) { return shard_.ready(index); })) break;
    launch_next();
  }
  // Reads of the queued pieces, in queue order (an earlier gather's piece never waits for a buffer
  // that a later one holds): pieces on NVMe start on their way as buffers come free.
  for (const std::vector<std::size_t>& members : queued_) {
    for (std::size_t index : members) {
      if (!shard_.prefetch(index)) return;
    }
  }
}

void ParameterGatherer::launch_next() {
  ZT_CHECK(!queued_.empty(), "ParameterGatherer: no gather is queued");
  const std::vector<std::size_t> members = std::move(queued_.front());
  queued_.pop_front();
  Gather gather = pack(members);
  const std::size_t element = dtype_size(options_.dtype);
  std::byte* staging = static_cast<std::byte*>(gather.staging.raw_data());
  if (gather.after_transfers) communicator_.order_after(execution_.transfers_queued());
  gather.work = communicator_.iall_gather(
      staging + static_cast<std::size_t>(communicator_.rank() * gather.count) * element, staging,
      static_cast<std::size_t>(gather.count), options_.dtype);
  for (std::size_t index : members) slots_[index].state = State::in_flight;
  in_flight_.push_back(std::move(gather));
}

void ParameterGatherer::launch_all_queued() {
  while (!queued_.empty()) launch_next();
}

void ParameterGatherer::complete(Gather& gather) {
  const std::size_t element = dtype_size(options_.dtype);
  const std::byte* staging = static_cast<const std::byte*>(gather.staging.raw_data());
  const int ranks = communicator_.size();
  for (std::size_t m = 0; m < gather.members.size(); ++m) {
    const std::size_t index = gather.members[m];
    const FlatParameter& parameter = layout_[index];
    nn::Parameter& target = *parameters_[index];
    if (!target.value.defined()) {
      target.value = execution_.empty(parameter.shape, options_.dtype, MemoryCategory::parameters);
    }
    auto* out = static_cast<std::byte*>(target.value.raw_data());
    for (int q = 0; q < ranks; ++q) {
      const std::int64_t begin = q * parameter.piece_numel;
      const std::int64_t real = std::clamp<std::int64_t>(parameter.numel - begin, 0, parameter.piece_numel);
      if (real == 0) continue;
      execution_.copy(
          out + static_cast<std::size_t>(begin) * element,
          staging + static_cast<std::size_t>(q * gather.count + gather.member_offsets[m]) * element,
          static_cast<std::size_t>(real) * element);
    }
    slots_[index].state = State::available;
  }
}

void ParameterGatherer::wait_oldest() {
  const auto started = Clock::now();
  in_flight_.front().work.wait();
  wait_seconds_ += seconds_since(started);
  complete(in_flight_.front());
  in_flight_.pop_front();
}

void ParameterGatherer::wait_until_available(std::size_t index) {
  while (slots_[index].state == State::queued) launch_next();  // its read is waited for in pack()
  while (slots_[index].state == State::in_flight) {
    ZT_CHECK(!in_flight_.empty(), "ParameterGatherer: parameter '", layout_[index].name,
             "' is marked in flight but no gather is pending");
    wait_oldest();
  }
}

void ParameterGatherer::poll() {
  launch_ready();
  while (!in_flight_.empty() && in_flight_.front().work.test()) {
    complete(in_flight_.front());
    in_flight_.pop_front();
  }
}

void ParameterGatherer::release(std::size_t index) {
  Slot& slot = slots_[index];
  if (slot.persistent || slot.state != State::available) return;
  parameters_[index]->value = Tensor();
  slot.state = State::released;
  live_ -= layout_[index].numel;
}

void ParameterGatherer::make_room(std::int64_t needed, const std::vector<std::size_t>& keep) {
  // Drop parameters kept for reuse (not those this module needs) until the new ones fit.
  for (std::size_t i = 0; i < slots_.size() && live_ + needed > options_.max_live; ++i) {
    if (std::find(keep.begin(), keep.end(), i) != keep.end()) continue;
    release(i);
  }
}

void ParameterGatherer::before(std::size_t use, Phase phase) {
  const Event event{use, phase};
  if (recording_) {
    trace_.push_back(event);
  } else if (following_) {
    if (cursor_ < trace_.size() && trace_[cursor_] == event) {
      ++cursor_;
    } else {
      following_ = false;  // this pass runs modules in another order: gather on demand only
    }
  }
  const std::vector<std::size_t>& members = uses_[use];
  std::vector<std::size_t> missing;
  std::int64_t missing_elements = 0;
  for (std::size_t index : members) {
    if (slots_[index].state == State::released) {
      missing.push_back(index);
      missing_elements += layout_[index].numel;
    }
  }
  if (!missing.empty()) {
    make_room(missing_elements, members);
    enqueue(std::move(missing));
  }
  if (following_) prefetch();
  for (std::size_t index : members) wait_until_available(index);
}

void ParameterGatherer::prefetch() {
  // Look ahead at most prefetch_elements of upcoming parameters; start the ones not yet gathered.
  std::int64_t window = 0;
  std::int64_t planned = 0;  // elements chosen but not launched yet
  std::vector<std::size_t> seen;
  for (std::size_t e = cursor_; e < trace_.size(); ++e) {
    std::vector<std::size_t> to_gather;
    for (std::size_t index : uses_[trace_[e].use]) {
      if (slots_[index].persistent || std::find(seen.begin(), seen.end(), index) != seen.end()) continue;
      seen.push_back(index);
      window += layout_[index].numel;
      if (window > options_.prefetch_elements) break;
      if (slots_[index].state != State::released) continue;
      if (live_ + planned + layout_[index].numel > options_.max_live) {
        window = options_.prefetch_elements + 1;  // no room: stop looking
        break;
      }
      to_gather.push_back(index);
      planned += layout_[index].numel;
    }
    planned = 0;
    enqueue(std::move(to_gather));
    if (window > options_.prefetch_elements) {
      read_ahead(e);
      return;
    }
  }
}

void ParameterGatherer::read_ahead(std::size_t from) {
  for (std::size_t e = from; e < trace_.size(); ++e) {
    for (std::size_t index : uses_[trace_[e].use]) {
      if (slots_[index].state != State::released) continue;
      if (!shard_.prefetch(index, /*speculative=*/true)) return;  // no buffer to spare: the rest waits
    }
  }
}

bool ParameterGatherer::reused_soon(std::size_t index) const {
  if (!following_) return false;
  std::int64_t distance = 0;
  for (std::size_t e = cursor_; e < trace_.size(); ++e) {
    const std::vector<std::size_t>& members = uses_[trace_[e].use];
    if (std::find(members.begin(), members.end(), index) != members.end()) {
      return distance < options_.max_reuse_distance;
    }
    for (std::size_t other : members) distance += layout_[other].numel;
    if (distance >= options_.max_reuse_distance) return false;
  }
  return false;
}

void ParameterGatherer::after(std::size_t use, Phase) {
  for (std::size_t index : uses_[use]) {
    if (!reused_soon(index)) release(index);
  }
}

void ParameterGatherer::end_of_backward() {
  launch_all_queued();                        // every rank launches what it queued
  while (!in_flight_.empty()) wait_oldest();  // prefetches the pass did not use
  for (std::size_t i = 0; i < slots_.size(); ++i) release(i);
  if (recording_) trace_complete_ = true;
  recording_ = following_ = false;
  cursor_ = 0;
}

void ParameterGatherer::refresh_persistent() {
  std::vector<std::size_t> group;
  std::int64_t group_elements = 0;
  const std::int64_t limit =
      std::max<std::int64_t>(1, options_.allgather_bucket_elements / communicator_.size());
  launch_all_queued();
  auto flush = [&] {
    if (group.empty()) return;
    enqueue(std::move(group));
    launch_all_queued();
    group.clear();
    group_elements = 0;
    while (!in_flight_.empty()) wait_oldest();
  };
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    if (!slots_[i].persistent) continue;
    if (group_elements + layout_[i].piece_numel > limit) flush();
    group.push_back(i);
    group_elements += layout_[i].piece_numel;
  }
  flush();
}

}  // namespace zt::engine_detail
