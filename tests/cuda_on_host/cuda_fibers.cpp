// The fiber scheduler and the host CUDA runtime of tests/cuda_on_host (cuda_fibers.hpp says what it
// checks and what it cannot). One grid at a time on the OS thread that runs the device's work (the
// device thread when streams run late, else the launching thread; StreamScheduler): each block's
// threads are fibers that run until they finish or wait (__syncthreads, a warp shuffle); when every
// fiber waits, the waits that can complete do (a whole warp's shuffle, a whole block's barrier), and
// a wait that never can (a barrier some threads exited before, a shuffle naming a lane that left) is
// a kernel fault, reported with what each thread was doing (through cudaGetLastError at the launch,
// or as the device's sticky error when streams run late).
//
// Fibers are pooled stacks, made once each (makecontext), that loop running the CUDA threads they are
// given: a thread that finishes without waiting hands its stack to the block's next thread that has
// not started, so a kernel without barriers or shuffles runs a whole block on one stack without a
// switch, and one that waits takes as many stacks as threads wait at once. A switch saves the
// callee-saved registers on the stack it leaves and loads the other's (cuda_fibers_switch_stack,
// x86-64); elsewhere, or with CUDA_FIBERS_PORTABLE_SWITCH, _setjmp/_longjmp, which save no signal
// mask (swapcontext makes a system call per switch). The switches were most of the on-host GPU
// tests' time, glibc's _longjmp a quarter of it.
#include "cuda_fibers.hpp"

#include <pthread.h>
#include <setjmp.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

// AddressSanitizer (ZT_ON_HOST_SANITIZE=1 scripts/cuda-on-host.sh): it is told of every fiber switch, and
// device and pinned allocations are poisoned past their size and while freed, so that a kernel or a copy out
// of bounds or out of stream order is reported where it happens.
#if defined(__SANITIZE_ADDRESS__)
#define CUDA_FIBERS_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CUDA_FIBERS_ASAN 1
#endif
#endif
#ifdef CUDA_FIBERS_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace cuda_fibers {
namespace {

constexpr unsigned int kWarpSize = 32;
constexpr unsigned int kMaxBlockThreads = 1024;
constexpr std::size_t kDefaultDynamicShared = 48 * 1024;
constexpr int kOptInSharedPerBlock = 232448;  // H100 / H200: 227 KiB
constexpr std::size_t kStackBytes = 128 * 1024;

/// Fiber stacks, mapped once and reused, each above a guard page so that an overflow faults.
class StackPool {
 public:
  StackPool() = default;
  StackPool(const StackPool&) = delete;
  StackPool& operator=(const StackPool&) = delete;
  ~StackPool() {
    for (void* mapping : mappings_) munmap(mapping, kStackBytes + page_bytes());
  }
  void* stack(std::size_t index) {
    while (mappings_.size() <= index) {
      void* mapping = mmap(nullptr, kStackBytes + page_bytes(), PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (mapping == MAP_FAILED) {
        std::perror("cuda_fibers: mmap of a fiber stack");
        std::abort();
      }
      mprotect(mapping, page_bytes(), PROT_NONE);
      mappings_.push_back(mapping);
    }
    return static_cast<char*>(mappings_[index]) + page_bytes();
  }

 private:
  static std::size_t page_bytes() { return 4096; }
  std::vector<void*> mappings_;
};

#if defined(__x86_64__) && !defined(CUDA_FIBERS_PORTABLE_SWITCH)
}  // namespace
}  // namespace cuda_fibers

// cuda_fibers_switch_stack(save, load): pushes the callee-saved registers (the System V ABI's),
// stores the stack pointer in *save, loads `load` and pops what that stack pushed, returning where its
// own switch was called (or into the entry prepare() put there). The floating-point control words
// (MXCSR, x87) stay as they are: every fiber runs with the thread's, which nothing here changes, and
// saving them (fnstcw, fldcw) was 80 % of a switch's time.
extern "C" __attribute__((visibility("hidden"))) void cuda_fibers_switch_stack(void** save, void* load);
asm(R"(
  .pushsection .text
  .globl cuda_fibers_switch_stack
  .hidden cuda_fibers_switch_stack
  .type cuda_fibers_switch_stack, @function
cuda_fibers_switch_stack:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size cuda_fibers_switch_stack, .-cuda_fibers_switch_stack
  .popsection
)");

namespace cuda_fibers {
namespace {

/// What a switch saves of a fiber (or the scheduler) to go on from it later.
struct SavedContext {
  void* stack_pointer;
};

void raw_switch(SavedContext& from, SavedContext& to) {
  cuda_fibers_switch_stack(&from.stack_pointer, to.stack_pointer);
}

/// The first switch to `point` calls `entry` on the stack [base, base + bytes) (16-byte aligned).
void raw_prepare(SavedContext& point, void* base, std::size_t bytes, void (*entry)()) {
  // From the top: a null return address (backtraces end there), `entry` for the switch's ret (the
  // stack then aligned as after a call), six zero registers.
  auto* top = reinterpret_cast<std::uint64_t*>(static_cast<char*>(base) + bytes);
  top[-1] = 0;
  top[-2] = reinterpret_cast<std::uint64_t>(entry);
  for (int i = 3; i <= 8; ++i) top[-i] = 0;
  point.stack_pointer = top - 8;
}
#else
struct SavedContext {
  jmp_buf jump;
  ucontext_t start;
  bool fresh;  // not entered yet: `start` holds its entry
};

void raw_switch(SavedContext& from, SavedContext& to) {
  if (_setjmp(from.jump) != 0) return;
  if (!to.fresh) _longjmp(to.jump, 1);
  to.fresh = false;
  ucontext_t never_resumed;
  swapcontext(&never_resumed, &to.start);
}

void raw_prepare(SavedContext& point, void* base, std::size_t bytes, void (*entry)()) {
  getcontext(&point.start);
  point.start.uc_stack.ss_sp = base;
  point.start.uc_stack.ss_size = bytes;
  point.start.uc_link = nullptr;
  makecontext(&point.start, entry, 0);
  point.fresh = true;
}
#endif

/// Where a fiber (or the scheduler) goes on when switched to, and its stack.
struct ExecutionPoint {
  SavedContext context;
  const void* stack_bottom;  // for AddressSanitizer
  std::size_t stack_size;
  void* asan_fake_stack;
};

void switch_to(ExecutionPoint& from, ExecutionPoint& to) {
#ifdef CUDA_FIBERS_ASAN
  __sanitizer_start_switch_fiber(&from.asan_fake_stack, to.stack_bottom, to.stack_size);
#endif
  raw_switch(from.context, to.context);
#ifdef CUDA_FIBERS_ASAN
  __sanitizer_finish_switch_fiber(from.asan_fake_stack, nullptr, nullptr);
#endif
}

void prepare(ExecutionPoint& point, void* base, std::size_t bytes, void (*entry)()) {
  point.stack_bottom = base;
  point.stack_size = bytes;
  raw_prepare(point.context, base, bytes, entry);
}

/// The first thing a fiber does: the switch into it is complete.
void entered_fiber() {
#ifdef CUDA_FIBERS_ASAN
  __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
}

/// The stack of the OS thread that runs the scheduler, the first time it does (AddressSanitizer's
/// switches name it; nothing else reads it).
void know_thread_stack(ExecutionPoint& point) {
#ifdef CUDA_FIBERS_ASAN
  if (point.stack_size != 0) return;
  pthread_attr_t attributes;
  void* bottom = nullptr;
  std::size_t size = 0;
  if (pthread_getattr_np(pthread_self(), &attributes) == 0) {
    pthread_attr_getstack(&attributes, &bottom, &size);
    pthread_attr_destroy(&attributes);
  }
  point.stack_bottom = bottom;
  point.stack_size = size;
#else
  (void)point;
#endif
}

/// Device and pinned memory that no one may touch (AddressSanitizer reports who does), and again
/// usable; no-ops unless built with it.
void poison(const void* begin, std::size_t bytes) {
#ifdef CUDA_FIBERS_ASAN
  if (bytes != 0) ASAN_POISON_MEMORY_REGION(begin, bytes);
#else
  (void)begin, (void)bytes;
#endif
}
void unpoison(const void* begin, std::size_t bytes) {
#ifdef CUDA_FIBERS_ASAN
  if (bytes != 0) ASAN_UNPOISON_MEMORY_REGION(begin, bytes);
#else
  (void)begin, (void)bytes;
#endif
}

enum class Waiting { running, block_barrier, warp_barrier, shuffle, finished };

/// One CUDA thread of the running block: where it is and what it waits for.
struct FiberSlot;
struct Fiber {
  CudaThread coordinates{};
  FiberSlot* slot = nullptr;  // the stack it runs on, once started
  Waiting waiting = Waiting::running;
  unsigned int mask = 0;
  std::uint64_t posted = 0;
  ShuffleKind kind = ShuffleKind::index;
  int operand = 0;
  int width = 0;
  std::uint64_t received = 0;
};

/// A pooled stack with its execution state: `point` is valid once started; `idle` when it waits for
/// its next CUDA thread (between threads, not inside a kernel).
struct FiberSlot {
  explicit FiberSlot(std::size_t stack_index_) : stack_index(stack_index_) {}
  std::size_t stack_index;  // in the thread's StackPool
  ExecutionPoint point{};
  bool started = false;
  bool idle = false;
  Fiber* thread = nullptr;
};

struct BlockRun {
  std::vector<Fiber> fibers;
  std::size_t next_unstarted = 0;      // fibers from here on have not run yet
  std::vector<FiberSlot*> free_slots;  // stacks without a thread
  FiberSlot* current_slot = nullptr;
  const std::function<void()>* body = nullptr;
  std::vector<unsigned char> dynamic_shared;
  std::string fault;  // the first fault inside the kernel
};

// Each OS thread that launches runs its grids on its own fibers (the engine launches from more
// than one thread).
// The two read at every switch are initial-exec (cuda_fibers::detail::running_thread says why).
__thread BlockRun* g_block __attribute__((tls_model("initial-exec"))) = nullptr;  // the block that runs now
__thread ExecutionPoint g_scheduler __attribute__((tls_model("initial-exec")));
thread_local StackPool g_stacks;
thread_local std::vector<std::unique_ptr<FiberSlot>> g_slots;

struct RuntimeState {
  cudaError_t last_error = cudaSuccess;  // per thread, as CUDA's
  std::string last_message;
};
RuntimeState& runtime() {
  thread_local RuntimeState state;
  return state;
}

cudaError_t fail(cudaError_t error, std::string message) {
  runtime().last_error = error;
  runtime().last_message = std::move(message);
  return error;
}

void record_fault(const std::string& what) {
  if (g_block->fault.empty()) g_block->fault = what;
}

std::string thread_name(const Fiber& fiber) {
  std::ostringstream name;
  name << "thread (" << fiber.coordinates.thread_index.x << "," << fiber.coordinates.thread_index.y << ","
       << fiber.coordinates.thread_index.z << ") of block (" << fiber.coordinates.block_index.x << ","
       << fiber.coordinates.block_index.y << "," << fiber.coordinates.block_index.z << ")";
  return name.str();
}

unsigned int linear_thread(const Fiber& fiber) {
  const CudaThread& c = fiber.coordinates;
  return c.thread_index.x + c.block_dim.x * (c.thread_index.y + c.block_dim.y * c.thread_index.z);
}

Fiber& current_fiber() {
  return *g_block->current_slot->thread;
}

void run_on(FiberSlot& fiber_slot, Fiber& fiber) {
  fiber_slot.thread = &fiber;
  fiber.slot = &fiber_slot;
  detail::running_thread = &fiber.coordinates;
}

/// The thread to run next in this round of the block, after thread `from` (by index, so each round
/// runs them in order): one that a completed wait released, or else the first not started, given a
/// free stack; nullptr when the round is over (or a fault ends the block).
FiberSlot* next_to_run(BlockRun& block, std::size_t from) {
  if (!block.fault.empty()) return nullptr;
  for (std::size_t i = from; i < block.next_unstarted; ++i)
    if (block.fibers[i].waiting == Waiting::running) return block.fibers[i].slot;
  if (block.next_unstarted == block.fibers.size()) return nullptr;
  if (block.free_slots.empty()) {
    g_slots.push_back(std::make_unique<FiberSlot>(g_slots.size()));
    block.free_slots.push_back(g_slots.back().get());
  }
  FiberSlot* fiber_slot = block.free_slots.back();
  block.free_slots.pop_back();
  fiber_slot->idle = false;
  fiber_slot->thread = &block.fibers[block.next_unstarted++];
  fiber_slot->thread->slot = fiber_slot;
  return fiber_slot;
}

/// Makes `fiber_slot` the one running; its first time, its stack is prepared to start in slot_main.
void enter(FiberSlot& fiber_slot);

/// From a fiber that waits or whose stack is free: straight to the round's next thread (half the
/// switches of going through the scheduler), or to the scheduler at the round's end. Returns when
/// something switches back to it.
void switch_from(FiberSlot& fiber_slot, std::size_t index) {
  if (FiberSlot* next = next_to_run(*g_block, index + 1)) {
    enter(*next);
    switch_to(fiber_slot.point, next->point);
  } else {
    switch_to(fiber_slot.point, g_scheduler);
  }
}

std::size_t index_of(const Fiber& fiber) {
  return static_cast<std::size_t>(&fiber - g_block->fibers.data());
}

// A fiber that waits (its `waiting` set) lets the others run; returns once released and resumed.
void yield_to_others() {
  FiberSlot& fiber_slot = *g_block->current_slot;
  switch_from(fiber_slot, index_of(*fiber_slot.thread));
}

// A slot's life: run the thread it was given, report it finished, go on with the block's next
// thread that has not started (no switch) or else free its stack and let the others run.
[[noreturn]] void slot_main() {
  entered_fiber();
  for (;;) {
    (*g_block->body)();
    // The slot that runs this stack, read again after the body: g_block is per launch.
    BlockRun& block = *g_block;
    FiberSlot& fiber_slot = *block.current_slot;
    fiber_slot.thread->waiting = Waiting::finished;
    if (block.fault.empty() && block.next_unstarted < block.fibers.size()) {
      run_on(fiber_slot, block.fibers[block.next_unstarted++]);
      continue;
    }
    fiber_slot.idle = true;
    block.free_slots.push_back(&fiber_slot);
    switch_from(fiber_slot, index_of(*fiber_slot.thread));
  }
}

void enter(FiberSlot& fiber_slot) {
  g_block->current_slot = &fiber_slot;
  detail::running_thread = &fiber_slot.thread->coordinates;
  if (!fiber_slot.started) {
    fiber_slot.started = true;
    prepare(fiber_slot.point, g_stacks.stack(fiber_slot.stack_index), kStackBytes, slot_main);
  }
}

/// From the scheduler: runs one round of the block's threads, from `fiber_slot`'s, until each
/// waits or finishes.
void run_round(FiberSlot& fiber_slot) {
  know_thread_stack(g_scheduler);
  enter(fiber_slot);
  switch_to(g_scheduler, fiber_slot.point);
  g_block->current_slot = nullptr;
  detail::running_thread = nullptr;
}

/// The lane whose value `fiber` receives, or -1 for its own (a shift past the segment's edge).
int source_lane(const Fiber& fiber, unsigned int lane) {
  const int width = fiber.width;
  const int segment_start = static_cast<int>(lane) / width * width;
  switch (fiber.kind) {
    case ShuffleKind::index:
      return segment_start + ((fiber.operand % width) + width) % width;
    case ShuffleKind::xor_lane: {
      const int source = static_cast<int>(lane) ^ fiber.operand;
      return source / width == static_cast<int>(lane) / width ? source : -1;
    }
    case ShuffleKind::down:
      return static_cast<int>(lane) - segment_start + fiber.operand < width
                 ? static_cast<int>(lane) + fiber.operand
                 : -1;
    case ShuffleKind::up:
      return static_cast<int>(lane) - segment_start - fiber.operand >= 0
                 ? static_cast<int>(lane) - fiber.operand
                 : -1;
  }
  return -1;
}

/// Completes the waits of one warp (shuffles or __syncwarp) once every lane of their mask has
/// arrived; a mask naming a lane that has exited or does not exist, or lanes waiting with different
/// masks, is a fault (undefined on a GPU). Returns whether the waits completed.
bool complete_warp_waits(const std::vector<Fiber*>& warp) {
  unsigned int arrived = 0, present = 0, mask = 0;
  for (unsigned int lane = 0; lane < warp.size(); ++lane) {
    const Fiber* fiber = warp[lane];
    if (fiber->waiting != Waiting::finished) present |= 1u << lane;
    if (fiber->waiting != Waiting::shuffle && fiber->waiting != Waiting::warp_barrier) continue;
    if (arrived != 0 && fiber->mask != mask) {
      record_fault("lanes of one warp wait at a shuffle or __syncwarp with different masks, at " +
                   thread_name(*fiber));
      return false;
    }
    arrived |= 1u << lane;
    mask = fiber->mask;
  }
  if (arrived == 0) return false;
  if ((mask & ~present) != 0) {
    std::ostringstream what;
    what << "a shuffle or __syncwarp with mask 0x" << std::hex << mask
         << " names lanes that have exited or do not exist (lanes present: 0x" << present << "), at "
         << thread_name(*warp.front());
    record_fault(what.str());
    return false;
  }
  if ((mask & arrived) != mask) return false;  // lanes of the mask have not arrived yet
  for (unsigned int lane = 0; lane < warp.size(); ++lane) {
    Fiber* fiber = warp[lane];
    if ((mask >> lane & 1u) == 0 || fiber->waiting != Waiting::shuffle) continue;
    const int source = source_lane(*fiber, lane);
    if (source >= 0 && (mask >> source & 1u) == 0) {
      record_fault("a shuffle reads lane " + std::to_string(source) + ", outside its mask, at " +
                   thread_name(*fiber));
      return false;
    }
    fiber->received = source < 0 ? fiber->posted : warp[static_cast<std::size_t>(source)]->posted;
  }
  for (unsigned int lane = 0; lane < warp.size(); ++lane)
    if ((mask >> lane & 1u) != 0) warp[lane]->waiting = Waiting::running;
  return true;
}

std::string describe_waits(const std::vector<Fiber>& fibers) {
  std::ostringstream what;
  const char* names[] = {"running", "at __syncthreads", "at __syncwarp", "at a shuffle", "exited"};
  Waiting previous = Waiting::running;
  std::size_t first = 0;
  for (std::size_t i = 0; i <= fibers.size(); ++i) {
    if (i == fibers.size() || (i > 0 && fibers[i].waiting != previous)) {
      what << " threads " << first << "-" << i - 1 << " " << names[static_cast<int>(previous)] << ";";
      first = i;
    }
    if (i < fibers.size()) previous = fibers[i].waiting;
  }
  return what.str();
}

/// Runs one block to the end; returns an empty string or the fault.
std::string run_block(BlockRun& block, uint3 block_index, const LaunchConfig& config) {
  const unsigned int threads = config.block.x * config.block.y * config.block.z;
  block.fibers.assign(threads, Fiber{});
  block.next_unstarted = 0;
  std::fill(block.dynamic_shared.begin(), block.dynamic_shared.end(), 0xff);
  for (unsigned int i = 0; i < threads; ++i) {
    Fiber& fiber = block.fibers[i];
    fiber.coordinates.thread_index = {i % config.block.x, i / config.block.x % config.block.y,
                                      i / (config.block.x * config.block.y)};
    fiber.coordinates.block_index = block_index;
    fiber.coordinates.block_dim = config.block;
    fiber.coordinates.grid_dim = config.grid;
  }
  std::vector<std::vector<Fiber*>> warps((threads + kWarpSize - 1) / kWarpSize);
  for (unsigned int i = 0; i < threads; ++i) warps[i / kWarpSize].push_back(&block.fibers[i]);
  // Every stack is free between blocks (the threads before finished, or a fault reset them).
  block.free_slots.clear();
  for (auto it = g_slots.rbegin(); it != g_slots.rend(); ++it) block.free_slots.push_back(it->get());

  for (;;) {
    // A round: the threads a completed wait released, then those not started yet.
    if (FiberSlot* first = next_to_run(block, 0)) run_round(*first);
    if (!block.fault.empty()) return block.fault;
    bool any_completed = false;
    for (auto& warp : warps) any_completed |= complete_warp_waits(warp);
    if (!block.fault.empty()) return block.fault;
    if (any_completed) continue;
    bool all_finished = true, all_at_barrier = true, some_finished = false;
    for (const Fiber& fiber : block.fibers) {
      if (fiber.waiting != Waiting::finished) all_finished = false;
      if (fiber.waiting == Waiting::finished) some_finished = true;
      if (fiber.waiting != Waiting::finished && fiber.waiting != Waiting::block_barrier)
        all_at_barrier = false;
    }
    if (all_finished) return {};
    if (all_at_barrier && !some_finished) {
      for (Fiber& fiber : block.fibers) fiber.waiting = Waiting::running;
      continue;
    }
    std::ostringstream what;
    what << "deadlock in block (" << block_index.x << "," << block_index.y << "," << block_index.z << "): "
         << (all_at_barrier ? "threads exited before a __syncthreads the others wait at (undefined "
                              "on a GPU: it may hang)"
                            : "the threads wait at barriers that cannot complete")
         << ":" << describe_waits(block.fibers);
    return what.str();
  }
}

/// After a fault, slots left inside the kernel start afresh next time (their frames are dropped).
void reset_busy_slots() {
  for (auto& fiber_slot : g_slots)
    if (!fiber_slot->idle) fiber_slot->started = false;
}

std::string dim_text(dim3 d) {
  std::ostringstream text;
  text << "(" << d.x << "," << d.y << "," << d.z << ")";
  return text.str();
}

}  // namespace

/// Device work: a launch, a copy, a memset, an event's record or wait, a stand-in library's call.
struct DeviceWork {
  std::uint64_t id = 0;
  std::string what;
  std::function<void()> run;         // empty for an event's record or wait
  std::vector<std::uint64_t> after;  // work of other streams it waits for
};

/// An error of device work, as the runtime reports it.
struct DeviceFault : std::runtime_error {
  DeviceFault(cudaError_t error_, const std::string& message) : std::runtime_error(message), error(error_) {}
  cudaError_t error;
};

/// The device's streams (cuda_fibers_streams.hpp). Late (CUDA_FIBERS_STREAMS=async): issued work
/// waits in its stream's queue and a device thread of its own runs it, one item at a time, in an
/// order CUDA allows and chosen to break what the program did not order:
///   - nothing runs until a host thread waits for the device, or the oldest pending work has waited
///     CUDA_FIBERS_LATE_MS (default 2 ms; so the device progresses while a host thread waits for
///     something else, such as a peer rank);
///   - then, of the streams' first items whose waits are met, the one issued last runs first: a
///     consumer on another stream that does not wait for its producer runs before it;
///   - the legacy default stream (nullptr) is ordered with every blocking stream both ways (streams
///     made with cudaStreamNonBlocking are not), and NCCL's operations run in their issue order.
/// Every wait is on earlier work, so the earliest pending item can always run: no schedule
/// deadlocks that CUDA's would not. At issue (at_issue): each item runs in the issuing call.
class StreamScheduler {
 public:
  StreamScheduler() : late_(read_late()), delay_(read_delay()) {
    if (late_) device_thread_ = std::thread([this] { run_device(); });
  }
  StreamScheduler(const StreamScheduler&) = delete;
  StreamScheduler& operator=(const StreamScheduler&) = delete;

  bool late() const { return late_; }

  /// Issues work on `stream`; returns its id (0 when it ran at the call).
  std::uint64_t enqueue(cudaStream_t stream, std::string what, std::function<void()> run,
                        std::vector<std::uint64_t> after = {}, bool collective = false) {
    if (!late_) {
      if (run) run_at_issue(what, run);
      return 0;
    }
    std::lock_guard lock(mutex_);
    if (stream == nullptr) {
      for (const auto& [other, queue] : queues_)
        if (other != nullptr && queue.blocking && !queue.pending.empty())
          after.push_back(queue.pending.back().id);
    } else if (StreamQueue& queue = queue_of(stream); queue.blocking) {
      const StreamQueue& legacy = queue_of(nullptr);
      if (!legacy.pending.empty()) after.push_back(legacy.pending.back().id);
    }
    const std::uint64_t id = next_id_++;
    if (collective) {
      if (last_collective_ != 0 && pending_.contains(last_collective_)) after.push_back(last_collective_);
      last_collective_ = id;
    }
    queue_of(stream).pending.push_back({id, std::move(what), std::move(run), std::move(after)});
    pending_.emplace(id, Clock::now());
    changed_.notify_all();
    return id;
  }

  bool reached(std::uint64_t id) {
    if (id == 0) return true;
    std::lock_guard lock(mutex_);
    return !pending_.contains(id);
  }

  /// The last work issued on `stream` that the device has not completed, or 0.
  std::uint64_t last_pending(cudaStream_t stream) {
    std::lock_guard lock(mutex_);
    const auto found = queues_.find(stream);
    return found == queues_.end() || found->second.pending.empty() ? 0 : found->second.pending.back().id;
  }

  /// The host waits until the device completed `id`.
  void wait(std::uint64_t id) {
    wait_until([&] { return !pending_.contains(id); });
  }
  /// The host waits until the device completed every work issued so far.
  void wait_for_everything() {
    std::uint64_t last = 0;
    {
      std::lock_guard lock(mutex_);
      last = next_id_ - 1;
    }
    wait_until([&] { return pending_.empty() || pending_.begin()->first > last; });
  }

  void add_stream(cudaStream_t stream, bool blocking) {
    std::lock_guard lock(mutex_);
    queues_[stream] = StreamQueue{blocking, false, {}};
  }
  /// A stream destroyed with work pending goes on until that work is done (as CUDA's).
  void remove_stream(cudaStream_t stream) {
    std::lock_guard lock(mutex_);
    const auto found = queues_.find(stream);
    if (found == queues_.end()) return;
    if (found->second.pending.empty()) {
      queues_.erase(found);
    } else {
      found->second.destroyed = true;
    }
  }

  /// The device's sticky error (cudaSuccess when none) and its message.
  cudaError_t sticky_error(std::string& message) {
    std::lock_guard lock(mutex_);
    message = sticky_message_;
    return sticky_error_;
  }

 private:
  using Clock = std::chrono::steady_clock;

  struct StreamQueue {
    bool blocking = true;  // ordered with the legacy default stream
    bool destroyed = false;
    std::deque<DeviceWork> pending;
  };

  static bool read_late() {
    const char* value = std::getenv("CUDA_FIBERS_STREAMS");
    const std::string mode = value == nullptr ? "" : value;
#ifdef CUDA_FIBERS_KEEP_NAMES
    const bool late_by_default = true;  // the CUDA-on-host build
#else
    const bool late_by_default = false;  // unit.cuda_on_host
#endif
    if (mode.empty()) return late_by_default;
    if (mode == "async" || mode == "at_issue") return mode == "async";
    std::fprintf(stderr, "cuda_fibers: CUDA_FIBERS_STREAMS='%s': expected async or at_issue\n", mode.c_str());
    std::abort();
  }
  static std::chrono::microseconds read_delay() {
    const char* value = std::getenv("CUDA_FIBERS_LATE_MS");
    const double milliseconds = value != nullptr ? std::atof(value) : 2.0;
    return std::chrono::microseconds(static_cast<long long>(std::max(milliseconds, 0.0) * 1000));
  }

  /// The host waits (the device runs without its delay meanwhile) until `done()` holds.
  template <typename Done>
  void wait_until(Done done) {
    if (!late_) return;
    std::unique_lock lock(mutex_);
    ++host_waiters_;
    changed_.notify_all();
    changed_.wait(lock, done);
    --host_waiters_;
  }

  /// At issue, a fault is the calling thread's error, as a launch's was before streams ran late.
  static void run_at_issue(const std::string& what, const std::function<void()>& run) {
    try {
      run();
    } catch (const DeviceFault& fault) {
      fail(fault.error, fault.what());
    } catch (const std::exception& error) {
      fail(cudaErrorLaunchFailure, "cuda_fibers: " + what + " failed: " + error.what());
    }
  }

  StreamQueue& queue_of(cudaStream_t stream) {
    const auto found = queues_.find(stream);
    if (found != queues_.end()) return found->second;
    return queues_[stream] = StreamQueue{true, false, {}};  // the legacy stream, or one made elsewhere
  }

  bool met(const DeviceWork& work) const {
    return std::none_of(work.after.begin(), work.after.end(),
                        [&](std::uint64_t id) { return pending_.contains(id); });
  }

  void run_device() {
    std::unique_lock lock(mutex_);
    for (;;) {
      if (pending_.empty()) {
        changed_.wait(lock);
        continue;
      }
      const Clock::time_point due = pending_.begin()->second + delay_;
      if (host_waiters_ == 0 && Clock::now() < due) {
        changed_.wait_until(lock, due);
        continue;
      }
      StreamQueue* chosen = nullptr;
      for (auto& [stream, queue] : queues_)
        if (!queue.pending.empty() && met(queue.pending.front()) &&
            (chosen == nullptr || queue.pending.front().id > chosen->pending.front().id))
          chosen = &queue;
      if (chosen == nullptr) {  // cannot be: the earliest pending work waits for nothing pending
        std::fputs("cuda_fibers: no pending device work can run (a bug of the scheduler)\n", stderr);
        std::abort();
      }
      DeviceWork work = std::move(chosen->pending.front());
      chosen->pending.pop_front();
      if (chosen->destroyed && chosen->pending.empty())
        std::erase_if(queues_, [&](const auto& entry) { return &entry.second == chosen; });
      lock.unlock();
      std::optional<DeviceFault> fault;
      if (work.run) {
        try {
          work.run();
        } catch (const DeviceFault& error) {
          fault = error;
        } catch (const std::exception& error) {
          fault = DeviceFault(cudaErrorLaunchFailure,
                              "cuda_fibers: " + work.what + " failed on the device: " + error.what());
        }
      }
      lock.lock();
      if (fault && sticky_error_ == cudaSuccess) {
        sticky_error_ = fault->error;
        sticky_message_ = fault->what();
      }
      pending_.erase(work.id);
      changed_.notify_all();
    }
  }

  const bool late_;
  const std::chrono::microseconds delay_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<cudaStream_t, StreamQueue> queues_;          // nullptr: the legacy default stream
  std::map<std::uint64_t, Clock::time_point> pending_;  // issued, not completed: when issued
  std::uint64_t next_id_ = 1;
  std::uint64_t last_collective_ = 0;
  int host_waiters_ = 0;
  cudaError_t sticky_error_ = cudaSuccess;
  std::string sticky_message_;
  std::thread device_thread_;  // never joined: the scheduler lives until the process ends
};

/// Never destroyed: its device thread may still wait for work while static objects are destroyed
/// at exit, and buffers are freed during static destruction.
StreamScheduler& scheduler() {
  static StreamScheduler* const instance = std::make_unique<StreamScheduler>().release();
  return *instance;
}

/// The device's state that all threads share.
struct DeviceState {
  std::mutex mutex;
  std::map<const void*, int> max_dynamic_shared;  // cudaFuncSetAttribute
  // cudaMallocFromPoolAsync / cudaMallocAsync: the size asked for and the block's own.
  struct PoolBlock {
    std::size_t bytes;
    std::size_t capacity;
  };
  std::map<void*, PoolBlock> pool_blocks;
  // Blocks freed to the pool: reused by an allocation on the stream that freed them at once (stream
  // order), on another once the free is reached. Their host memory goes back once reached, past a cap.
  struct FreedBlock {
    void* pointer;
    std::size_t capacity;
    cudaStream_t stream;
    std::uint64_t freed;  // the free's device work
  };
  std::vector<FreedBlock> freed_blocks;  // the last freed last
  // The default pool as CUDA's counts it: freed blocks stay reserved up to the release threshold.
  std::uint64_t pool_used = 0, pool_used_high = 0, pool_reserved = 0, pool_reserved_high = 0,
                release_threshold = 0;
  std::map<void*, std::size_t> plain_blocks;   // cudaMalloc
  std::map<void*, std::size_t> pinned_blocks;  // cudaHostAlloc
  std::set<void*> streams;
  std::map<void*, std::uint64_t> events;  // each event's last record (0: none, or reached at issue)
  /// Events made without cudaEventDisableTiming: when the device reached each one's last record
  /// (nanoseconds of the steady clock; -1 until then, or never recorded), for cudaEventElapsedTime.
  std::map<void*, std::shared_ptr<std::atomic<std::int64_t>>> timed_events;
  std::uint64_t allocated() const {
    std::uint64_t total = pool_reserved;
    for (const auto& block : plain_blocks) total += block.second;
    return total;
  }
};
DeviceState& device_state() {
  static DeviceState state;
  return state;
}

__thread const CudaThread* detail::running_thread __attribute__((tls_model("initial-exec"))) = nullptr;

void detail::read_outside_a_kernel() {
  std::fputs("cuda_fibers: threadIdx/blockIdx read outside a kernel\n", stderr);
  std::abort();
}

unsigned char* dynamic_shared_memory() {
  return g_block->dynamic_shared.empty() ? nullptr : g_block->dynamic_shared.data();
}

void check_launch_bounds(unsigned int max_threads) {
  const dim3 block = current_thread().block_dim;
  if (block.x * block.y * block.z > max_threads)
    record_fault("the block of " + std::to_string(block.x * block.y * block.z) +
                 " threads exceeds the kernel's __launch_bounds__(" + std::to_string(max_threads) +
                 "): a GPU refuses the launch (too many resources requested)");
}

void sync_block() {
  current_fiber().waiting = Waiting::block_barrier;
  yield_to_others();
}

void sync_warp(unsigned int mask) {
  current_fiber().waiting = Waiting::warp_barrier;
  current_fiber().mask = mask;
  yield_to_others();
}

std::uint64_t shuffle(unsigned int mask, std::uint64_t bits, ShuffleKind kind, int operand, int width) {
  Fiber* fiber = &current_fiber();
  if (width <= 0 || width > 32 || (width & (width - 1)) != 0)
    record_fault("a shuffle's width " + std::to_string(width) + " is not a power of two up to 32");
  if ((mask >> (linear_thread(*fiber) % kWarpSize) & 1u) == 0)
    record_fault("a shuffle by a lane outside its own mask at " + thread_name(*fiber));
  fiber->waiting = Waiting::shuffle;
  fiber->mask = mask;
  fiber->posted = bits;
  fiber->kind = kind;
  fiber->operand = operand;
  fiber->width = width;
  yield_to_others();
  return fiber->received;
}

void launch(const void* kernel, const char* name, const LaunchConfig& config,
            std::function<void()> thread_body) {
  const dim3 grid = config.grid, block = config.block;
  const std::string where = std::string(name) + "<<<" + dim_text(grid) + ", " + dim_text(block) + ", " +
                            std::to_string(config.shared_bytes) + ">>>";
  const unsigned long long threads = 1ull * block.x * block.y * block.z;
  if (threads == 0 || threads > kMaxBlockThreads || block.z > 64) {
    fail(cudaErrorInvalidConfiguration, "cuda_fibers: invalid block in " + where);
    return;
  }
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535) {
    fail(cudaErrorInvalidConfiguration, "cuda_fibers: invalid grid in " + where);
    return;
  }
  std::size_t shared_limit = kDefaultDynamicShared;
  if (kernel != nullptr) {
    const std::lock_guard lock(device_state().mutex);
    const auto found = device_state().max_dynamic_shared.find(kernel);
    if (found != device_state().max_dynamic_shared.end())
      shared_limit = static_cast<std::size_t>(found->second);
  }
  if (config.shared_bytes > shared_limit) {
    fail(cudaErrorInvalidValue, "cuda_fibers: " + where + " asks for " + std::to_string(config.shared_bytes) +
                                    " bytes of dynamic shared memory; the kernel allows " +
                                    std::to_string(shared_limit) +
                                    " (cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize))");
    return;
  }
  scheduler().enqueue(config.stream, where, [config, where, body = std::move(thread_body)] {
    BlockRun block_run;
    block_run.body = &body;
    block_run.dynamic_shared.resize(config.shared_bytes);
    g_block = &block_run;
    std::string fault;
    for (unsigned int z = 0; z < config.grid.z && fault.empty(); ++z)
      for (unsigned int y = 0; y < config.grid.y && fault.empty(); ++y)
        for (unsigned int x = 0; x < config.grid.x && fault.empty(); ++x)
          fault = run_block(block_run, {x, y, z}, config);
    g_block = nullptr;
    if (fault.empty()) return;
    reset_busy_slots();
    throw DeviceFault(cudaErrorLaunchFailure, "cuda_fibers: kernel fault in " + where + ": " + fault);
  });
}

bool streams_run_late() {
  return scheduler().late();
}

void enqueue(cudaStream_t stream, std::string what, std::function<void()> work) {
  scheduler().enqueue(stream, std::move(what), std::move(work));
}

void enqueue_collective(cudaStream_t stream, std::string what, std::function<void()> work) {
  scheduler().enqueue(stream, std::move(what), std::move(work), {}, true);
}

void synchronize_device() {
  scheduler().wait_for_everything();
}

}  // namespace cuda_fibers

// ---- the host CUDA runtime (the names cuda_fibers.hpp renames, or all of them in the CUDA-on-host
// build) ---------------------------------------------------------------------------------------------
// Copies, memsets and launches are device work in their stream's order (StreamScheduler: late, or at
// the call). Synchronous as CUDA documents it ("API synchronization behavior"): a copy to pageable
// host memory returns once done; one from pageable memory takes its source at the call; cudaMemcpy,
// cudaFree and cudaFreeHost wait for the device; cudaMemset does not, unless its target is pinned.
// Stream-ordered allocations are filled with 0xff bytes (NaN) when the stream reaches them and again
// at their free, so work that uses one out of its stream's order reads or leaves NaN.

using cuda_fibers::device_state;
using cuda_fibers::DeviceFault;
using cuda_fibers::DeviceState;
using cuda_fibers::fail;
using cuda_fibers::poison;
using cuda_fibers::runtime;
using cuda_fibers::scheduler;
using cuda_fibers::unpoison;

namespace {

constexpr std::uint64_t kDeviceMemoryBytes = 16ull << 30;  // what cudaMemGetInfo reports as total

// CUDA's alignments: device allocations on 256 bytes (the GEMMs' alignment checks see what a GPU
// gives), cudaHostAlloc's on a page (O_DIRECT reads into pinned buffers rely on it).
constexpr std::size_t kDeviceAlignment = 256;
constexpr std::size_t kPinnedAlignment = 4096;

/// `bytes` rounded up to `alignment`; the bytes past `bytes` poisoned.
void* aligned_block(std::size_t bytes, std::size_t alignment) {
  const std::size_t rounded = (std::max<std::size_t>(bytes, 1) + alignment - 1) / alignment * alignment;
  void* block = std::aligned_alloc(alignment, rounded);
  if (block != nullptr) poison(static_cast<char*>(block) + bytes, rounded - bytes);
  return block;
}

cudaError_t allocate(std::map<void*, std::size_t>& blocks, void** pointer, std::size_t bytes) {
  *pointer = aligned_block(bytes, kDeviceAlignment);
  if (*pointer == nullptr) return fail(cudaErrorMemoryAllocation, "cuda_fibers: out of host memory");
  blocks[*pointer] = bytes;
  return cudaSuccess;
}

cudaError_t release(std::map<void*, std::size_t>& blocks, void* pointer, const char* call) {
  if (pointer == nullptr) return cudaSuccess;
  const auto found = blocks.find(pointer);
  if (found == blocks.end())
    return fail(cudaErrorInvalidValue,
                std::string("cuda_fibers: ") + call + " of a pointer it did not allocate");
  blocks.erase(found);
  std::free(pointer);
  return cudaSuccess;
}

constexpr std::uint64_t kFreedCacheBytes = 512ull << 20;  // freed pool memory kept for reuse, at most

/// A stream-ordered allocation: a block freed on `stream` (pending or not) or whose free the device
/// reached, else new memory; filled with 0xff when the stream reaches the allocation.
cudaError_t pool_allocate(void** pointer, std::size_t bytes, cudaStream_t stream) {
  DeviceState& device = device_state();
  std::size_t capacity = 0;
  {
    const std::lock_guard lock(device.mutex);
    if (device.allocated() + bytes > kDeviceMemoryBytes)
      return fail(cudaErrorMemoryAllocation, "cuda_fibers: out of (modelled) device memory");
    *pointer = nullptr;
    const std::size_t wanted = std::max<std::size_t>(bytes, 1);
    for (auto block = device.freed_blocks.rbegin(); block != device.freed_blocks.rend(); ++block) {
      if (block->capacity < wanted || block->capacity > 2 * wanted + kDeviceAlignment) continue;
      if (block->stream != stream && !scheduler().reached(block->freed)) continue;
      *pointer = block->pointer;
      capacity = block->capacity;
      device.freed_blocks.erase(std::next(block).base());
      break;
    }
    if (*pointer == nullptr) {
      capacity = (wanted + kDeviceAlignment - 1) / kDeviceAlignment * kDeviceAlignment;
      *pointer = aligned_block(capacity, kDeviceAlignment);
      if (*pointer == nullptr) return fail(cudaErrorMemoryAllocation, "cuda_fibers: out of host memory");
    }
    device.pool_blocks[*pointer] = {bytes, capacity};
    device.pool_used += bytes;
    device.pool_used_high = std::max(device.pool_used_high, device.pool_used);
    device.pool_reserved = std::max(device.pool_reserved, device.pool_used);
    device.pool_reserved_high = std::max(device.pool_reserved_high, device.pool_reserved);
  }
  void* const block = *pointer;
  scheduler().enqueue(stream, "cudaMallocAsync", [block, capacity, bytes] {
    unpoison(block, capacity);
    std::memset(block, 0xff, capacity);
    poison(static_cast<char*>(block) + bytes, capacity - bytes);
  });
  return cudaSuccess;
}

cudaError_t pool_free(void* pointer, cudaStream_t stream) {
  if (pointer == nullptr) return cudaSuccess;
  DeviceState& device = device_state();
  std::size_t capacity = 0;
  {
    const std::lock_guard lock(device.mutex);
    const auto found = device.pool_blocks.find(pointer);
    if (found == device.pool_blocks.end())
      return fail(cudaErrorInvalidValue, "cuda_fibers: cudaFreeAsync of a pointer it did not allocate");
    device.pool_used -= found->second.bytes;
    capacity = found->second.capacity;
    const std::uint64_t kept = device.pool_reserved - device.pool_used;
    if (kept > device.release_threshold) device.pool_reserved = device.pool_used + device.release_threshold;
    device.pool_blocks.erase(found);
  }
  const std::uint64_t freed = scheduler().enqueue(stream, "cudaFreeAsync", [pointer, capacity] {
    unpoison(pointer, capacity);
    std::memset(pointer, 0xff, capacity);
    poison(pointer, capacity);
  });
  const std::lock_guard lock(device.mutex);
  device.freed_blocks.push_back({pointer, capacity, stream, freed});
  std::uint64_t cached = 0;
  for (const auto& block : device.freed_blocks) cached += block.capacity;
  for (auto block = device.freed_blocks.begin();
       cached > kFreedCacheBytes && block != device.freed_blocks.end();) {
    if (!scheduler().reached(block->freed)) {
      ++block;
      continue;
    }
    cached -= block->capacity;
    std::free(block->pointer);
    block = device.freed_blocks.erase(block);
  }
  return cudaSuccess;
}

enum class MemoryKind { device, pinned, pageable };

/// Where `pointer` lies: in a device allocation, in pinned host memory, or elsewhere (pageable).
MemoryKind memory_kind(const void* pointer) {
  DeviceState& device = device_state();
  const std::lock_guard lock(device.mutex);
  // A block's extent: a pool block's whole capacity (its rounding lies inside the allocation too).
  struct {
    std::size_t operator()(std::size_t bytes) const { return bytes; }
    std::size_t operator()(const DeviceState::PoolBlock& block) const { return block.capacity; }
  } const extent;
  const auto inside = [pointer, &extent](const auto& blocks) {
    auto after = blocks.upper_bound(const_cast<void*>(pointer));
    if (after == blocks.begin()) return false;
    --after;
    return static_cast<const char*>(pointer) <
           static_cast<const char*>(after->first) + std::max<std::size_t>(extent(after->second), 1);
  };
  if (inside(device.pool_blocks) || inside(device.plain_blocks)) return MemoryKind::device;
  if (inside(device.pinned_blocks)) return MemoryKind::pinned;
  return MemoryKind::pageable;
}

/// The device's sticky error, if any, as this thread's error (cudaGetErrorString reads it).
cudaError_t device_status() {
  std::string message;
  const cudaError_t error = scheduler().sticky_error(message);
  return error == cudaSuccess ? cudaSuccess : fail(error, message);
}

/// A copy as device work on `stream`, each side in the memory `from` and `to` say: a pageable source
/// is taken at the call; to a pageable destination (or between host buffers) the call returns once
/// the copy is done.
cudaError_t copy_on_stream(void* destination, MemoryKind to, const void* source, MemoryKind from,
                           std::size_t bytes, cudaStream_t stream, const char* call) {
  if (bytes == 0) return cudaSuccess;
  std::uint64_t copied = 0;
  if (from == MemoryKind::pageable && to != MemoryKind::pageable) {
    auto taken = std::make_shared<std::vector<unsigned char>>(
        static_cast<const unsigned char*>(source), static_cast<const unsigned char*>(source) + bytes);
    copied = scheduler().enqueue(
        stream, call, [destination, taken] { std::memcpy(destination, taken->data(), taken->size()); });
  } else {
    copied = scheduler().enqueue(stream, call,
                                 [destination, source, bytes] { std::memmove(destination, source, bytes); });
  }
  if (to == MemoryKind::pageable || (from != MemoryKind::device && to != MemoryKind::device)) {
    scheduler().wait(copied);
    return device_status();
  }
  return cudaSuccess;
}

thread_local int g_current_device = 0;  // CUDA's current device is per host thread

/// Devices the runtime models: CUDA_FIBERS_DEVICES (default 4), so that MPI tests can bind one per
/// local rank (each process has its own copy of the state anyway).
int device_count() {
  static const int count = [] {
    const char* value = std::getenv("CUDA_FIBERS_DEVICES");
    const int parsed = value != nullptr ? std::atoi(value) : 4;
    return parsed > 0 ? parsed : 4;
  }();
  return count;
}

cudaError_t check_device(int device) {
  if (device >= 0 && device < device_count()) return cudaSuccess;
  return fail(cudaErrorInvalidDevice,
              "cuda_fibers: device " + std::to_string(device) + " of " + std::to_string(device_count()));
}
cudaMemPool_t default_pool() {
  static int pool_tag = 0;
  return reinterpret_cast<cudaMemPool_t>(&pool_tag);
}

}  // namespace

cudaError_t cudaMalloc(void** pointer, std::size_t bytes) {
  const std::lock_guard lock(device_state().mutex);
  return allocate(device_state().plain_blocks, pointer, bytes);
}
cudaError_t cudaFree(void* pointer) {
  scheduler().wait_for_everything();  // cudaFree waits for the device
  const std::lock_guard lock(device_state().mutex);
  return release(device_state().plain_blocks, pointer, "cudaFree");
}
cudaError_t cudaMallocAsync(void** pointer, std::size_t bytes, cudaStream_t stream) {
  return pool_allocate(pointer, bytes, stream);
}
cudaError_t cudaMallocFromPoolAsync(void** pointer, std::size_t bytes, cudaMemPool_t pool,
                                    cudaStream_t stream) {
  if (pool != default_pool()) return fail(cudaErrorInvalidValue, "cuda_fibers: an unknown memory pool");
  return pool_allocate(pointer, bytes, stream);
}
cudaError_t cudaFreeAsync(void* pointer, cudaStream_t stream) {
  return pool_free(pointer, stream);
}
cudaError_t cudaHostAlloc(void** pointer, std::size_t bytes, unsigned int) {
  *pointer = aligned_block(bytes, kPinnedAlignment);
  if (*pointer == nullptr) return fail(cudaErrorMemoryAllocation, "cuda_fibers: out of host memory");
  const std::lock_guard lock(device_state().mutex);
  device_state().pinned_blocks[*pointer] = bytes;
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void* pointer) {
  scheduler().wait_for_everything();  // cudaFreeHost waits for the device
  {
    const std::lock_guard lock(device_state().mutex);
    if (pointer != nullptr && device_state().pinned_blocks.erase(pointer) == 0)
      return fail(cudaErrorInvalidValue,
                  "cuda_fibers: cudaFreeHost of a pointer cudaHostAlloc did not return");
  }
  std::free(pointer);
  return cudaSuccess;
}
cudaError_t cudaMemset(void* pointer, int value, std::size_t bytes) {
  const std::uint64_t set = scheduler().enqueue(
      nullptr, "cudaMemset", [pointer, value, bytes] { std::memset(pointer, value, bytes); });
  if (memory_kind(pointer) != MemoryKind::pinned) return cudaSuccess;  // asynchronous for device memory
  scheduler().wait(set);
  return device_status();
}
cudaError_t cudaMemsetAsync(void* pointer, int value, std::size_t bytes, cudaStream_t stream) {
  scheduler().enqueue(stream, "cudaMemsetAsync",
                      [pointer, value, bytes] { std::memset(pointer, value, bytes); });
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* destination, const void* source, std::size_t bytes, cudaMemcpyKind) {
  scheduler().wait(scheduler().enqueue(
      nullptr, "cudaMemcpy", [destination, source, bytes] { std::memmove(destination, source, bytes); }));
  return device_status();
}
cudaError_t cudaMemcpyAsync(void* destination, const void* source, std::size_t bytes, cudaMemcpyKind,
                            cudaStream_t stream) {
  return copy_on_stream(destination, memory_kind(destination), source, memory_kind(source), bytes, stream,
                        "cudaMemcpyAsync");
}
// A __device__ or __constant__ variable is host memory here, not in any allocation: the symbol's
// side is taken as device memory, the other side as it is.
cudaError_t cudaMemcpyToSymbolAsync(const void* symbol, const void* source, std::size_t bytes,
                                    std::size_t offset, cudaMemcpyKind, cudaStream_t stream) {
  void* const destination = static_cast<char*>(const_cast<void*>(symbol)) + offset;
  return copy_on_stream(destination, MemoryKind::device, source, memory_kind(source), bytes, stream,
                        "cudaMemcpyToSymbolAsync");
}
cudaError_t cudaMemcpyFromSymbolAsync(void* destination, const void* symbol, std::size_t bytes,
                                      std::size_t offset, cudaMemcpyKind, cudaStream_t stream) {
  const void* const source = static_cast<const char*>(symbol) + offset;
  return copy_on_stream(destination, memory_kind(destination), source, MemoryKind::device, bytes, stream,
                        "cudaMemcpyFromSymbolAsync");
}
cudaError_t cudaMemGetInfo(std::size_t* free_bytes, std::size_t* total_bytes) {
  const std::lock_guard lock(device_state().mutex);
  *total_bytes = kDeviceMemoryBytes;
  *free_bytes = kDeviceMemoryBytes - device_state().allocated();
  return cudaSuccess;
}
cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* pool, int device) {
  if (check_device(device) != cudaSuccess) return cudaErrorInvalidDevice;
  *pool = default_pool();
  return cudaSuccess;
}
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t, cudaMemPoolAttr attribute, void* value) {
  const std::lock_guard lock(device_state().mutex);
  if (attribute == cudaMemPoolAttrReleaseThreshold)
    device_state().release_threshold = *static_cast<std::uint64_t*>(value);
  if (attribute == cudaMemPoolAttrUsedMemHigh) device_state().pool_used_high = device_state().pool_used;
  if (attribute == cudaMemPoolAttrReservedMemHigh)
    device_state().pool_reserved_high = device_state().pool_reserved;
  return cudaSuccess;
}
cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t, cudaMemPoolAttr attribute, void* value) {
  const std::lock_guard lock(device_state().mutex);
  const DeviceState& device = device_state();
  std::uint64_t result = 0;
  switch (attribute) {
    case cudaMemPoolAttrReleaseThreshold:
      result = device.release_threshold;
      break;
    case cudaMemPoolAttrReservedMemCurrent:
      result = device.pool_reserved;
      break;
    case cudaMemPoolAttrUsedMemCurrent:
      result = device.pool_used;
      break;
    case cudaMemPoolAttrReservedMemHigh:
      result = device.pool_reserved_high;
      break;
    case cudaMemPoolAttrUsedMemHigh:
      result = device.pool_used_high;
      break;
    default:
      return fail(cudaErrorInvalidValue, "cuda_fibers: cudaMemPoolGetAttribute(" +
                                             std::to_string(static_cast<int>(attribute)) +
                                             ") is not modelled");
  }
  *static_cast<std::uint64_t*>(value) = result;
  return cudaSuccess;
}
cudaError_t cudaMemPoolTrimTo(cudaMemPool_t, std::size_t keep) {
  const std::lock_guard lock(device_state().mutex);
  DeviceState& device = device_state();
  device.pool_reserved =
      std::max<std::uint64_t>(device.pool_used, std::min<std::uint64_t>(device.pool_reserved, keep));
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* kernel, cudaFuncAttribute attribute, int value) {
  if (attribute != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
  if (value < 0 || value > cuda_fibers::kOptInSharedPerBlock)
    return fail(cudaErrorInvalidValue, "cuda_fibers: cudaFuncSetAttribute of " + std::to_string(value) +
                                           " bytes of dynamic shared memory; the device allows " +
                                           std::to_string(cuda_fibers::kOptInSharedPerBlock));
  const std::lock_guard lock(device_state().mutex);
  device_state().max_dynamic_shared[kernel] = value;
  return cudaSuccess;
}

// The device it models: one Hopper GPU under its own name, so that nothing takes it for a real one
// (the peak tables find no entry for it).
cudaError_t cudaGetDeviceCount(int* count) {
  *count = device_count();
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* properties, int device) {
  if (check_device(device) != cudaSuccess) return cudaErrorInvalidDevice;
  *properties = cudaDeviceProp{};
  std::snprintf(properties->name, sizeof properties->name, "cuda_fibers host device");
  properties->major = 9;
  properties->minor = 0;
  properties->totalGlobalMem = kDeviceMemoryBytes;
  properties->multiProcessorCount = 132;
  properties->warpSize = 32;
  properties->maxThreadsPerBlock = 1024;
  properties->sharedMemPerBlock = cuda_fibers::kDefaultDynamicShared;
  properties->sharedMemPerBlockOptin = cuda_fibers::kOptInSharedPerBlock;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attribute, int device) {
  if (check_device(device) != cudaSuccess) return cudaErrorInvalidDevice;
  switch (attribute) {
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = cuda_fibers::kOptInSharedPerBlock;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor:
      *value = 9;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor:
      *value = 0;
      return cudaSuccess;
    case cudaDevAttrMultiProcessorCount:
      *value = 132;
      return cudaSuccess;
    case cudaDevAttrMemoryClockRate:
      *value = 2619000;  // kHz, an H100 SXM's
      return cudaSuccess;
    case cudaDevAttrGlobalMemoryBusWidth:
      *value = 5120;
      return cudaSuccess;
    default:
      return fail(cudaErrorInvalidValue, "cuda_fibers: cudaDeviceGetAttribute(" +
                                             std::to_string(static_cast<int>(attribute)) +
                                             ") is not modelled");
  }
}
cudaError_t cudaDeviceGetPCIBusId(char* id, int length, int device) {
  if (check_device(device) != cudaSuccess) return cudaErrorInvalidDevice;
  std::snprintf(id, static_cast<std::size_t>(length), "0000:%02x:00.0", device + 1);
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = g_current_device;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (check_device(device) != cudaSuccess) return cudaErrorInvalidDevice;
  g_current_device = device;
  return cudaSuccess;
}
cudaError_t cudaStreamGetDevice(cudaStream_t, int* device) {
  return cudaGetDevice(device);
}

namespace {
/// Streams are opaque handles the device state keeps, so that one not made here is refused. A
/// destroyed stream's handle is not freed: its address stays unique while its work may still run.
void* make_handle(std::set<void*>& handles) {
  const std::lock_guard lock(device_state().mutex);
  void* handle = std::malloc(1);
  handles.insert(handle);
  return handle;
}
cudaError_t forget_handle(std::set<void*>& handles, void* handle, const char* call) {
  const std::lock_guard lock(device_state().mutex);
  if (handles.erase(handle) == 0)
    return fail(cudaErrorInvalidResourceHandle,
                std::string("cuda_fibers: ") + call + " of an unknown handle");
  return cudaSuccess;
}
}  // namespace

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  *stream = static_cast<cudaStream_t>(make_handle(device_state().streams));
  scheduler().add_stream(*stream, (flags & cudaStreamNonBlocking) == 0);
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  const cudaError_t status = forget_handle(device_state().streams, stream, "cudaStreamDestroy");
  if (status == cudaSuccess) scheduler().remove_stream(stream);
  return status;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  void* handle = std::malloc(1);
  const std::lock_guard lock(device_state().mutex);
  device_state().events[handle] = 0;
  if ((flags & cudaEventDisableTiming) == 0)
    device_state().timed_events[handle] = std::make_shared<std::atomic<std::int64_t>>(-1);
  *event = static_cast<cudaEvent_t>(handle);
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  const std::lock_guard lock(device_state().mutex);
  if (device_state().events.erase(event) == 0)
    return fail(cudaErrorInvalidResourceHandle, "cuda_fibers: cudaEventDestroy of an unknown handle");
  device_state().timed_events.erase(event);
  std::free(event);
  return cudaSuccess;
}
namespace {
/// The event's last record (0: none, or reached at the call), or an error for an unknown event.
cudaError_t last_record(cudaEvent_t event, const char* call, std::uint64_t& record) {
  const std::lock_guard lock(device_state().mutex);
  const auto found = device_state().events.find(event);
  if (found == device_state().events.end())
    return fail(cudaErrorInvalidResourceHandle, std::string("cuda_fibers: ") + call + " of an unknown event");
  record = found->second;
  return cudaSuccess;
}
cudaError_t check_stream(cudaStream_t stream, const char* call) {
  const std::lock_guard lock(device_state().mutex);
  if (stream != nullptr && device_state().streams.count(stream) == 0)
    return fail(cudaErrorInvalidResourceHandle,
                std::string("cuda_fibers: ") + call + " on an unknown stream");
  return cudaSuccess;
}
}  // namespace
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  std::uint64_t record = 0;
  if (const cudaError_t status = check_stream(stream, "cudaEventRecord"); status != cudaSuccess)
    return status;
  if (const cudaError_t status = last_record(event, "cudaEventRecord", record); status != cudaSuccess)
    return status;
  // A timing event notes when the device reaches this record (a fresh slot: the previous record's
  // time no longer counts).
  std::shared_ptr<std::atomic<std::int64_t>> reached_at;
  {
    const std::lock_guard lock(device_state().mutex);
    if (const auto timed = device_state().timed_events.find(event);
        timed != device_state().timed_events.end())
      timed->second = reached_at = std::make_shared<std::atomic<std::int64_t>>(-1);
  }
  std::function<void()> note_time;
  if (reached_at) {
    note_time = [reached_at] {
      reached_at->store(std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::steady_clock::now().time_since_epoch())
                            .count());
    };
  }
  record = scheduler().enqueue(stream, "cudaEventRecord", std::move(note_time));
  const std::lock_guard lock(device_state().mutex);
  device_state().events[event] = record;
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* milliseconds, cudaEvent_t start, cudaEvent_t end) {
  std::int64_t times[2] = {};
  const cudaEvent_t events[2] = {start, end};
  for (int i = 0; i < 2; ++i) {
    std::uint64_t record = 0;
    if (const cudaError_t status = last_record(events[i], "cudaEventElapsedTime", record);
        status != cudaSuccess)
      return status;
    std::shared_ptr<std::atomic<std::int64_t>> reached_at;
    {
      const std::lock_guard lock(device_state().mutex);
      const auto timed = device_state().timed_events.find(events[i]);
      if (timed == device_state().timed_events.end())
        return fail(cudaErrorInvalidResourceHandle,
                    "cuda_fibers: cudaEventElapsedTime of an event made with cudaEventDisableTiming");
      reached_at = timed->second;
    }
    if (!scheduler().reached(record))
      return cudaErrorNotReady;  // as cudaEventQuery: not recorded as an error
    times[i] = reached_at->load();
    if (times[i] < 0)
      return fail(cudaErrorInvalidResourceHandle,
                  "cuda_fibers: cudaEventElapsedTime of an event never recorded");
  }
  *milliseconds = static_cast<float>(static_cast<double>(times[1] - times[0]) * 1e-6);
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t event) {
  std::uint64_t record = 0;
  if (const cudaError_t status = last_record(event, "cudaEventQuery", record); status != cudaSuccess)
    return status;
  if (const cudaError_t status = device_status(); status != cudaSuccess) return status;
  return scheduler().reached(record) ? cudaSuccess : cudaErrorNotReady;  // not an error: not recorded as one
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  std::uint64_t record = 0;
  if (const cudaError_t status = last_record(event, "cudaEventSynchronize", record); status != cudaSuccess)
    return status;
  scheduler().wait(record);
  return device_status();
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  std::uint64_t record = 0;
  if (const cudaError_t status = check_stream(stream, "cudaStreamWaitEvent"); status != cudaSuccess)
    return status;
  if (const cudaError_t status = last_record(event, "cudaStreamWaitEvent", record); status != cudaSuccess)
    return status;
  // The record as it is now: a later record of the event does not change what the stream waits for.
  if (!scheduler().reached(record)) scheduler().enqueue(stream, "cudaStreamWaitEvent", {}, {record});
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (const cudaError_t status = check_stream(stream, "cudaStreamSynchronize"); status != cudaSuccess)
    return status;
  scheduler().wait(scheduler().last_pending(stream));
  return device_status();
}
cudaError_t cudaDeviceSynchronize() {
  scheduler().wait_for_everything();
  return device_status();
}

cudaError_t cudaGetLastError() {
  if (const cudaError_t sticky = device_status(); sticky != cudaSuccess) return sticky;  // never cleared
  const cudaError_t error = runtime().last_error;
  runtime().last_error = cudaSuccess;
  return error;
}
cudaError_t cudaPeekAtLastError() {
  if (const cudaError_t sticky = device_status(); sticky != cudaSuccess) return sticky;
  return runtime().last_error;
}
const char* cudaGetErrorString(cudaError_t error) {
  if (error == cudaSuccess) return "no error";
  return runtime().last_message.empty() ? "cuda_fibers: an error" : runtime().last_message.c_str();
}
const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    default:
      return "cudaError (cuda_fibers)";
  }
}
