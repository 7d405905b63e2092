// The emulated device's streams (kernels/emulated_device.hpp): queues of host closures that run only
// when the host needs their work done, and the page-locked stand-in for host memory.
//
// Why lazily, not on worker threads: a thread per stream would run the work soon after it is queued,
// so a missing wait between two streams would show only now and then, as on a GPU. Run on demand,
// in one of two fixed orders (EmulatedStreamOrder: lazy runs only what the host waits for, eager
// runs the other streams ahead of it), a missing wait shows on every run of the order that puts the
// reader first, and the same way on every run.
#include "kernels/emulated_device.hpp"

#include <cstdio>
#include <cstdlib>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <string_view>
#include <utility>

#include "base/never_destroyed.hpp"
#include "zerotrain/error.hpp"

namespace zt::detail {
namespace {

/// A queued closure; a stream's wait for an event is an item too, marked so that the eager order
/// can stop in front of it.
struct Item {
  std::function<void()> work;
  std::uint64_t waits_for_queue = 0;  // a wait: the event's queue and position
  std::uint64_t waits_for_position = 0;
};

struct Queue {
  std::deque<Item> pending;  // items ran + 1 ... queued
  std::uint64_t queued = 0;
  std::uint64_t ran = 0;
  bool running = false;        // an item of this queue is running (a wait cycle shows here)
  std::exception_ptr failure;  // an item's exception, not yet rethrown
};

EmulatedStreamOrder order_from_environment() {
  const char* value = std::getenv("ZT_EMULATED_STREAM_ORDER");
  if (value == nullptr || std::string_view(value).empty() || std::string_view(value) == "lazy")
    return EmulatedStreamOrder::lazy;
  if (std::string_view(value) == "eager") return EmulatedStreamOrder::eager;
  ZT_THROW_AS(ConfigError, "ZT_EMULATED_STREAM_ORDER=", value, ": expected lazy or eager");
}

/// Every queue, under one recursive mutex: an item that waits for another queue's event runs that
/// queue's work from inside this queue's run.
struct Queues {
  std::recursive_mutex mutex;
  std::map<std::uint64_t, Queue> by_id;
  std::uint64_t next_id = 1;
  int items_running = 0;  // > 0: called from inside a queued item, not by the host
  EmulatedStreamOrder order = order_from_environment();

  static Queues& instance() {
    static base::NeverDestroyed<Queues> queues;  // streams may go during static destruction
    return *queues;
  }

  bool reached(std::uint64_t id, std::uint64_t position) const {
    const auto it = by_id.find(id);
    return it == by_id.end() || it->second.ran >= position;
  }

  /// Runs `queue`'s items up to `position`; an item's exception stays in the queue (the rest dropped).
  void run(Queue& queue, std::uint64_t position) {
    if (queue.ran >= position) return;
    ZT_CHECK(!queue.running,
             "emulated device: work queued on a stream waits for work queued on the same stream after "
             "it (directly, or through an event of another stream); on a GPU this hangs");
    // One access for the whole run: each item opens its own too, but the first open of the device's
    // memory changes the protection of every live region, which per kernel costs more than the kernel.
    const EmulatedDeviceAccess access;
    queue.running = true;
    ++items_running;
    while (queue.ran < position && !queue.pending.empty()) {
      Item item = std::move(queue.pending.front());
      queue.pending.pop_front();
      ++queue.ran;
      try {
        item.work();
      } catch (...) {
        if (!queue.failure) queue.failure = std::current_exception();
        queue.ran = queue.queued;  // later items read what the failed one did not write
        queue.pending.clear();
      }
    }
    --items_running;
    queue.running = false;
  }

  /// The eager order's first step when the host waits: every queue but `except` runs what it can
  /// without a wait for an event not yet reached, so work the host is not waiting for runs before
  /// the work it is, as a GPU may run it.
  void run_others_ahead(const Queue* except) {
    if (order != EmulatedStreamOrder::eager || items_running > 0) return;
    for (auto& [id, queue] : by_id) {
      if (&queue == except || queue.running) continue;
      while (!queue.pending.empty()) {
        const Item& front = queue.pending.front();
        if (front.waits_for_queue != 0 && !reached(front.waits_for_queue, front.waits_for_position)) break;
        run(queue, queue.ran + 1);
      }
    }
  }

  static void rethrow_failure(Queue& queue) {
    if (queue.failure) std::rethrow_exception(std::exchange(queue.failure, nullptr));
  }
};

void print_failure(std::uint64_t id, const std::exception_ptr& failure) noexcept {
  try {
    std::rethrow_exception(failure);
  } catch (const std::exception& error) {
    std::fprintf(stderr,
                 "zerotrain: work queued on emulated stream %llu failed and nothing waited for it: %s\n",
                 static_cast<unsigned long long>(id), error.what());
  } catch (...) {
    std::fprintf(stderr, "zerotrain: work queued on emulated stream %llu failed and nothing waited for it\n",
                 static_cast<unsigned long long>(id));
  }
}

/// Live page-locked stand-in allocations: start -> bytes.
struct PageLockedRanges {
  std::mutex mutex;
  std::map<std::uintptr_t, std::size_t> ranges;

  static PageLockedRanges& instance() {
    static base::NeverDestroyed<PageLockedRanges> ranges;  // outlives the allocator's frees
    return *ranges;
  }
};

class PageLockedStandInAllocator final : public Allocator {
 public:
  explicit PageLockedStandInAllocator(Allocator& host) : host_(host) {}

  void* allocate(std::size_t bytes, std::size_t alignment) override {
    void* pointer = host_.allocate(bytes, alignment);
    PageLockedRanges& registry = PageLockedRanges::instance();
    const std::lock_guard lock(registry.mutex);
    registry.ranges.emplace(reinterpret_cast<std::uintptr_t>(pointer), bytes == 0 ? 1 : bytes);
    return pointer;
  }
  /// Without a stream after every queue's work, as a GPU's pinned free waits for the device.
  void deallocate(void* pointer, std::size_t bytes) noexcept override {
    emulated_run_all_noexcept();
    release(pointer, bytes);
  }
  /// In the stream's order: reused only after the work queued on it before the free (the pinned
  /// cache's fence on a GPU). `stream` is an emulated queue's id, or null.
  void deallocate_on(void* pointer, std::size_t bytes, void* stream) noexcept override {
    const auto queue = reinterpret_cast<std::uintptr_t>(stream);
    if (queue == 0) return deallocate(pointer, bytes);
    try {
      emulated_enqueue(queue, [this, pointer, bytes] { release(pointer, bytes); });
    } catch (...) {  // the queue could not take it: free after the whole device instead
      deallocate(pointer, bytes);
    }
  }
  Device device() const override { return Device::host(); }

 private:
  void release(void* pointer, std::size_t bytes) noexcept {
    {
      PageLockedRanges& registry = PageLockedRanges::instance();
      const std::lock_guard lock(registry.mutex);
      registry.ranges.erase(reinterpret_cast<std::uintptr_t>(pointer));
    }
    host_.deallocate(pointer, bytes);
  }

  Allocator& host_;
};

}  // namespace

std::uint64_t emulated_queue_create() {
  Queues& queues = Queues::instance();
  const std::lock_guard lock(queues.mutex);
  const std::uint64_t id = queues.next_id++;
  queues.by_id.emplace(id, Queue{});
  return id;
}

void emulated_queue_destroy(std::uint64_t queue) noexcept {
  if (queue == 0) return;
  Queues& queues = Queues::instance();
  const std::lock_guard lock(queues.mutex);
  const auto it = queues.by_id.find(queue);
  if (it == queues.by_id.end()) return;
  try {
    queues.run(it->second, it->second.queued);
  } catch (const std::exception& error) {  // a wait cycle: what is left cannot run
    std::fprintf(stderr, "zerotrain: emulated stream %llu destroyed with work that cannot run: %s\n",
                 static_cast<unsigned long long>(queue), error.what());
  }
  if (it->second.failure) print_failure(queue, it->second.failure);
  queues.by_id.erase(it);
}

namespace {
void append(std::uint64_t queue, Item item) {
  Queues& queues = Queues::instance();
  const std::lock_guard lock(queues.mutex);
  const auto it = queues.by_id.find(queue);
  ZT_CHECK(it != queues.by_id.end(), "emulated device: work queued on stream ", queue,
           ", which no longer exists");
  it->second.pending.push_back(std::move(item));
  ++it->second.queued;
}
}  // namespace

void emulated_enqueue(std::uint64_t queue, std::function<void()> work) {
  if (queue == 0) {
    emulated_run_all();
    work();
    return;
  }
  append(queue, Item{std::move(work)});
}

void emulated_enqueue_wait(std::uint64_t queue, std::uint64_t event_queue, std::uint64_t event_position) {
  if (queue == 0) return emulated_run_until(event_queue, event_position);  // runs at once: waits now
  if (event_queue == 0 || event_queue == queue) return;  // reached, or this queue's own earlier work
  append(queue, Item{[event_queue, event_position] { emulated_run_until(event_queue, event_position); },
                     event_queue, event_position});
}

std::uint64_t emulated_queue_position(std::uint64_t queue) {
  if (queue == 0) return 0;
  Queues& queues = Queues::instance();
  const std::lock_guard lock(queues.mutex);
  const auto it = queues.by_id.find(queue);
  return it == queues.by_id.end() ? 0 : it->second.queued;
}

void emulated_run_until(std::uint64_t queue, std::uint64_t position) {
  if (queue == 0) return;
  Queues& queues = Queues::instance();
  const std::lock_guard lock(queues.mutex);
  const auto it = queues.by_id.find(queue);
  if (it == queues.by_id.end()) return;  // destroyed: its work ran then
  if (it->second.ran < position) queues.run_others_ahead(&it->second);
  queues.run(it->second, position);
  Queues::rethrow_failure(it->second);
}

bool emulated_reached(std::uint64_t queue, std::uint64_t position) {
  if (queue == 0) return true;
  Queues& queues = Queues::instance();
  const std::lock_guard lock(queues.mutex);
  return queues.reached(queue, position);
}

void emulated_run_all() {
  Queues& queues = Queues::instance();
  const std::lock_guard lock(queues.mutex);
  // One queue's items may run others' (waits); every queue is run to the end it has now. A failure
  // is rethrown after all of them ran, so that the device is idle either way. Called from a queued
  // item (a kernel freeing its scratch, a stream-less copy inside it), the queues whose item is
  // running are left: what they queued after it follows it anyway.
  queues.run_others_ahead(nullptr);
  for (auto& [id, queue] : queues.by_id)
    if (!queue.running) queues.run(queue, queue.queued);
  for (auto& [id, queue] : queues.by_id) Queues::rethrow_failure(queue);
}

void emulated_run_all_noexcept() noexcept {
  Queues& queues = Queues::instance();
  const std::lock_guard lock(queues.mutex);
  for (auto& [id, queue] : queues.by_id) {
    if (queue.running) continue;  // as in emulated_run_all
    try {
      queues.run(queue, queue.queued);
    } catch (const std::exception& error) {
      std::fprintf(stderr, "zerotrain: emulated stream %llu has work that cannot run: %s\n",
                   static_cast<unsigned long long>(id), error.what());
    }
  }
}

EmulatedStreamOrder emulated_stream_order() {
  Queues& queues = Queues::instance();
  const std::lock_guard lock(queues.mutex);
  return queues.order;
}

void set_emulated_stream_order(EmulatedStreamOrder order) {
  Queues& queues = Queues::instance();
  const std::lock_guard lock(queues.mutex);
  queues.order = order;
}

std::uint64_t emulated_queue_of(const Stream& stream) {
  return stream.emulated_queue_;
}

bool is_page_locked_stand_in(const void* address) {
  PageLockedRanges& registry = PageLockedRanges::instance();
  const auto value = reinterpret_cast<std::uintptr_t>(address);
  const std::lock_guard lock(registry.mutex);
  auto it = registry.ranges.upper_bound(value);
  if (it == registry.ranges.begin()) return false;
  --it;
  return value < it->first + it->second;
}

Allocator& page_locked_stand_in_allocator() {
  // Never destroyed: buffers may be released during static destruction.
  static base::NeverDestroyed<PageLockedStandInAllocator> allocator(
      allocator_for(Device::host(), HostMemoryKind::pageable));
  return *allocator;
}

}  // namespace zt::detail
