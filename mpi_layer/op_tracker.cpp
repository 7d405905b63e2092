// In-flight operations per communicator and the process-wide registry of communicators.
#include "mpi_layer/op_tracker.hpp"

#include <algorithm>
#include <limits>
#include <utility>

namespace zt::detail {

bool is_collective(CommOp op) {
  return op != CommOp::send && op != CommOp::recv;
}

OpTracker::OpTracker(std::string name, int rank, int size, CommIdentity identity)
    : name_(std::move(name)), rank_(rank), size_(size), identity_(std::move(identity)) {
  in_flight_.reserve(8);  // no allocation per operation in the common case
}

std::uint64_t OpTracker::begin(CommOp op, std::uint64_t bytes, std::optional<DType> type, int peer, int tag) {
  const auto start = WatchdogClock::now();
  const std::lock_guard lock(mutex_);
  const std::uint64_t seq = is_collective(op) ? ++collectives_started_ : ++point_to_point_started_;
  const std::uint64_t token = next_token_++;
  in_flight_.push_back({token, op, seq, bytes, type, peer, tag, start});
  return token;
}

void OpTracker::finish(std::uint64_t token) {
  const std::lock_guard lock(mutex_);
  // Operations usually complete in the order they started, so the match is near the back.
  for (auto it = in_flight_.rbegin(); it != in_flight_.rend(); ++it) {
    if (it->token == token) {
      in_flight_.erase(std::next(it).base());
      return;
    }
  }
}

void OpTracker::link_exchange(std::uint64_t send_token, std::uint64_t recv_token) {
  const std::lock_guard lock(mutex_);
  for (OpRecord& record : in_flight_) {
    if (record.token == send_token || record.token == recv_token) record.exchange = send_token;
  }
}

std::vector<std::uint64_t> OpTracker::begin_device_side(std::size_t operations) {
  const std::lock_guard lock(mutex_);
  const std::uint64_t first = next_token_ - std::min<std::uint64_t>(operations, next_token_ - 1);
  const std::uint64_t end = next_token_;
  std::vector<std::uint64_t> tokens;
  tokens.reserve(operations);
  for (std::uint64_t original = first; original < end; ++original) {
    OpRecord copy;
    copy.start = WatchdogClock::now();
    for (auto it = in_flight_.rbegin(); it != in_flight_.rend(); ++it) {
      if (it->token == original) {
        copy = *it;
        break;
      }
    }
    copy.token = next_token_++;
    in_flight_.push_back(copy);
    tokens.push_back(copy.token);
  }
  return tokens;
}

void OpTracker::set_device_hooks(std::function<void()> retire, std::function<void()> abort) {
  const std::lock_guard lock(hooks_mutex_);
  retire_ = std::move(retire);
  abort_ = std::move(abort);
}

void OpTracker::clear_device_hooks() {
  const std::lock_guard lock(hooks_mutex_);
  retire_ = nullptr;
  abort_ = nullptr;
}

void OpTracker::retire_device_work() {
  const std::lock_guard lock(hooks_mutex_);
  if (retire_) retire_();
}

void OpTracker::abort_device_work() {
  const std::lock_guard lock(hooks_mutex_);
  if (abort_) abort_();
}

OpTracker::Snapshot OpTracker::snapshot() const {
  Snapshot result;
  {
    const std::lock_guard lock(mutex_);
    result.collectives_started = collectives_started_;
    result.in_flight = in_flight_;
  }
  std::uint64_t oldest_pending = std::numeric_limits<std::uint64_t>::max();
  for (const OpRecord& record : result.in_flight) {
    if (is_collective(record.op)) oldest_pending = std::min(oldest_pending, record.seq);
  }
  result.collectives_completed = std::min(result.collectives_started, oldest_pending - 1);
  return result;
}

std::uint64_t OpTracker::collectives_started() const {
  const std::lock_guard lock(mutex_);
  return collectives_started_;
}

int OpTracker::world_rank_of(int rank) const {
  if (rank < 0 || static_cast<std::size_t>(rank) >= identity_.world_ranks.size()) return -1;
  return identity_.world_ranks[static_cast<std::size_t>(rank)];
}

namespace {

struct Registry {
  std::mutex mutex;
  std::vector<std::weak_ptr<OpTracker>> trackers;
};

Registry& registry() {
  static Registry instance;  // never destroyed before the communicators that register in it
  return instance;
}

}  // namespace

void register_tracker(const std::shared_ptr<OpTracker>& tracker) {
  Registry& r = registry();
  const std::lock_guard lock(r.mutex);
  std::erase_if(r.trackers, [](const std::weak_ptr<OpTracker>& entry) { return entry.expired(); });
  r.trackers.push_back(tracker);
}

std::vector<std::shared_ptr<OpTracker>> live_trackers() {
  Registry& r = registry();
  const std::lock_guard lock(r.mutex);
  std::vector<std::shared_ptr<OpTracker>> result;
  result.reserve(r.trackers.size());
  for (const auto& entry : r.trackers) {
    if (auto tracker = entry.lock()) result.push_back(std::move(tracker));
  }
  return result;
}

std::shared_ptr<OpTracker> find_tracker(std::uint64_t id) {
  if (id == 0) return nullptr;
  for (auto& tracker : live_trackers()) {
    if (tracker->identity().id == id) return tracker;
  }
  return nullptr;
}

void retire_device_work_everywhere() {
  for (const auto& tracker : live_trackers()) tracker->retire_device_work();
}

void abort_device_work_everywhere() {
  // The job is ending: one communicator that cannot abort must not keep the others from it.
  for (const auto& tracker : live_trackers()) {
    try {
      tracker->abort_device_work();
    } catch (...) {
    }
  }
}

}  // namespace zt::detail
