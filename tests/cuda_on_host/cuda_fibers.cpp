// The fiber scheduler and the host CUDA runtime of tests/cuda_on_host (cuda_fibers.hpp says what it
// checks and what it cannot). One grid at a time on the calling OS thread: each block's threads are
// fibers that run until they finish or wait (__syncthreads, a warp shuffle); when every fiber waits,
// the waits that can complete do (a whole warp's shuffle, a whole block's barrier), and a wait that
// never can (a barrier some threads exited before, a shuffle naming a lane that left) is a kernel
// fault, reported through cudaGetLastError with what each thread was doing.
//
// Fibers are pooled stacks, one per thread of the largest block so far: each is made once
// (makecontext) and then loops, running the CUDA thread it is given; switches are _setjmp/_longjmp,
// which save no signal mask (swapcontext makes a system call per switch, most of the run time).
#include "cuda_fibers.hpp"

#include <setjmp.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

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

enum class Waiting { running, block_barrier, warp_barrier, shuffle, finished };

/// One CUDA thread of the running block: where it is and what it waits for.
struct Fiber {
  CudaThread coordinates{};
  Waiting waiting = Waiting::running;
  unsigned int mask = 0;
  std::uint64_t posted = 0;
  ShuffleKind kind = ShuffleKind::index;
  int operand = 0;
  int width = 0;
  std::uint64_t received = 0;
};

/// A pooled stack with its execution state: `resume_point` is valid once started; `idle` when it
/// waits for its next CUDA thread (between threads, not inside a kernel).
struct FiberSlot {
  ucontext_t start{};
  jmp_buf resume_point;
  bool started = false;
  bool idle = false;
  Fiber* thread = nullptr;
};

struct BlockRun {
  std::vector<Fiber> fibers;
  FiberSlot* current_slot = nullptr;
  const std::function<void()>* body = nullptr;
  std::vector<unsigned char> dynamic_shared;
  std::string fault;  // the first fault inside the kernel
};

BlockRun* g_block = nullptr;  // the block that runs now (one grid at a time, on one OS thread)
StackPool g_stacks;
std::vector<std::unique_ptr<FiberSlot>> g_slots;
jmp_buf g_scheduler;
ucontext_t g_scheduler_context;  // written by the first swapcontext into a slot; never resumed

struct RuntimeState {
  cudaError_t last_error = cudaSuccess;
  std::string last_message;
  std::map<const void*, int> max_dynamic_shared;  // cudaFuncSetAttribute
};
RuntimeState& runtime() {
  static RuntimeState state;
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

// Back to the scheduler from a fiber that waits; returns when the scheduler resumes it.
void yield_to_scheduler() {
  if (_setjmp(g_block->current_slot->resume_point) == 0) _longjmp(g_scheduler, 1);
}

// A slot's life: run the thread it was given, report it finished, wait for the next.
void slot_main() {
  for (;;) {
    FiberSlot* slot = g_block->current_slot;
    (*g_block->body)();
    slot = g_block->current_slot;
    slot->thread->waiting = Waiting::finished;
    slot->idle = true;
    if (_setjmp(slot->resume_point) == 0) _longjmp(g_scheduler, 1);
  }
}

FiberSlot& slot(std::size_t index) {
  while (g_slots.size() <= index) g_slots.push_back(std::make_unique<FiberSlot>());
  return *g_slots[index];
}

/// Runs slot `index`'s thread until it waits or finishes.
void resume(std::size_t index) {
  FiberSlot& fiber_slot = slot(index);
  g_block->current_slot = &fiber_slot;
  if (_setjmp(g_scheduler) == 0) {
    if (!fiber_slot.started) {
      fiber_slot.started = true;
      getcontext(&fiber_slot.start);
      fiber_slot.start.uc_stack.ss_sp = g_stacks.stack(index);
      fiber_slot.start.uc_stack.ss_size = kStackBytes;
      fiber_slot.start.uc_link = nullptr;
      makecontext(&fiber_slot.start, slot_main, 0);
      swapcontext(&g_scheduler_context, &fiber_slot.start);
    } else {
      _longjmp(fiber_slot.resume_point, 1);
    }
  }
  g_block->current_slot = nullptr;
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
  std::fill(block.dynamic_shared.begin(), block.dynamic_shared.end(), 0xff);
  for (unsigned int i = 0; i < threads; ++i) {
    Fiber& fiber = block.fibers[i];
    fiber.coordinates.thread_index = {i % config.block.x, i / config.block.x % config.block.y,
                                      i / (config.block.x * config.block.y)};
    fiber.coordinates.block_index = block_index;
    fiber.coordinates.block_dim = config.block;
    fiber.coordinates.grid_dim = config.grid;
    FiberSlot& fiber_slot = slot(i);
    fiber_slot.thread = &fiber;
    fiber_slot.idle = false;
  }
  std::vector<std::vector<Fiber*>> warps((threads + kWarpSize - 1) / kWarpSize);
  for (unsigned int i = 0; i < threads; ++i) warps[i / kWarpSize].push_back(&block.fibers[i]);

  for (;;) {
    for (unsigned int i = 0; i < threads; ++i)
      if (block.fibers[i].waiting == Waiting::running) resume(i);
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

const CudaThread& current_thread() {
  if (g_block == nullptr || g_block->current_slot == nullptr) {
    std::fputs("cuda_fibers: threadIdx/blockIdx read outside a kernel\n", stderr);
    std::abort();
  }
  return current_fiber().coordinates;
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
  yield_to_scheduler();
}

void sync_warp(unsigned int mask) {
  current_fiber().waiting = Waiting::warp_barrier;
  current_fiber().mask = mask;
  yield_to_scheduler();
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
  yield_to_scheduler();
  return fiber->received;
}

void launch(const void* kernel, const LaunchConfig& config, const std::function<void()>& thread_body) {
  const dim3 grid = config.grid, block = config.block;
  const std::string where =
      "<<<" + dim_text(grid) + ", " + dim_text(block) + ", " + std::to_string(config.shared_bytes) + ">>>";
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
    const auto found = runtime().max_dynamic_shared.find(kernel);
    if (found != runtime().max_dynamic_shared.end()) shared_limit = static_cast<std::size_t>(found->second);
  }
  if (config.shared_bytes > shared_limit) {
    fail(cudaErrorInvalidValue, "cuda_fibers: " + where + " asks for " + std::to_string(config.shared_bytes) +
                                    " bytes of dynamic shared memory; the kernel allows " +
                                    std::to_string(shared_limit) +
                                    " (cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize))");
    return;
  }
  BlockRun block_run;
  block_run.body = &thread_body;
  block_run.dynamic_shared.resize(config.shared_bytes);
  g_block = &block_run;
  std::string fault;
  for (unsigned int z = 0; z < grid.z && fault.empty(); ++z)
    for (unsigned int y = 0; y < grid.y && fault.empty(); ++y)
      for (unsigned int x = 0; x < grid.x && fault.empty(); ++x)
        fault = run_block(block_run, {x, y, z}, config);
  g_block = nullptr;
  if (!fault.empty()) reset_busy_slots();
  if (!fault.empty()) fail(cudaErrorLaunchFailure, "cuda_fibers: kernel fault in " + where + ": " + fault);
}

}  // namespace cuda_fibers

// ---- the host CUDA runtime (the names cuda_fibers.hpp renames) ----------------------------------

using cuda_fibers::fail;
using cuda_fibers::runtime;

cudaError_t cudaMalloc(void** pointer, std::size_t bytes) {
  *pointer = std::malloc(bytes == 0 ? 1 : bytes);
  return *pointer != nullptr ? cudaSuccess : fail(cudaErrorMemoryAllocation, "cuda_fibers: out of memory");
}
cudaError_t cudaFree(void* pointer) {
  std::free(pointer);
  return cudaSuccess;
}
cudaError_t cudaMallocAsync(void** pointer, std::size_t bytes, cudaStream_t) {
  return cudaMalloc(pointer, bytes);
}
cudaError_t cudaFreeAsync(void* pointer, cudaStream_t) {
  return cudaFree(pointer);
}
cudaError_t cudaMemset(void* pointer, int value, std::size_t bytes) {
  std::memset(pointer, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* pointer, int value, std::size_t bytes, cudaStream_t) {
  return cudaMemset(pointer, value, bytes);
}
cudaError_t cudaMemcpy(void* destination, const void* source, std::size_t bytes, cudaMemcpyKind) {
  std::memmove(destination, source, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* destination, const void* source, std::size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t) {
  return cudaMemcpy(destination, source, bytes, kind);
}
cudaError_t cudaMemcpyToSymbolAsync(const void* symbol, const void* source, std::size_t bytes,
                                    std::size_t offset, cudaMemcpyKind, cudaStream_t) {
  std::memcpy(static_cast<char*>(const_cast<void*>(symbol)) + offset, source, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyFromSymbolAsync(void* destination, const void* symbol, std::size_t bytes,
                                      std::size_t offset, cudaMemcpyKind, cudaStream_t) {
  std::memcpy(destination, static_cast<const char*>(symbol) + offset, bytes);
  return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void* kernel, cudaFuncAttribute attribute, int value) {
  if (attribute != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
  if (value < 0 || value > cuda_fibers::kOptInSharedPerBlock)
    return fail(cudaErrorInvalidValue, "cuda_fibers: cudaFuncSetAttribute of " + std::to_string(value) +
                                           " bytes of dynamic shared memory; the device allows " +
                                           std::to_string(cuda_fibers::kOptInSharedPerBlock));
  runtime().max_dynamic_shared[kernel] = value;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attribute, int) {
  switch (attribute) {
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = cuda_fibers::kOptInSharedPerBlock;
      return cudaSuccess;
    default:
      return fail(cudaErrorInvalidValue, "cuda_fibers: cudaDeviceGetAttribute(" +
                                             std::to_string(static_cast<int>(attribute)) +
                                             ") is not modelled");
  }
}
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  return device == 0 ? cudaSuccess : fail(cudaErrorInvalidDevice, "cuda_fibers: only device 0");
}
cudaError_t cudaStreamGetDevice(cudaStream_t, int* device) {
  return cudaGetDevice(device);
}
cudaError_t cudaGetLastError() {
  const cudaError_t error = runtime().last_error;
  runtime().last_error = cudaSuccess;
  return error;
}
const char* cudaGetErrorString(cudaError_t error) {
  return error == cudaSuccess ? "no error" : runtime().last_message.c_str();
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
    default:
      return "cudaError (cuda_fibers)";
  }
}
cudaError_t cudaStreamSynchronize(cudaStream_t) {
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() {
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t) {
  return cudaSuccess;
}
