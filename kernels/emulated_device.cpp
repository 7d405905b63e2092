// The emulated device's memory: one reserved address range, a region of whole pages per buffer,
// a registry of live regions whose protection the access guard toggles, and a SIGSEGV handler that
// names faults inside the range.
//
// Why a reservation: the fault handler must decide "is this emulated memory?" without locks (it runs
// in a signal handler), and a fixed range answers with two atomic loads. Regions are carved from it
// with a bump pointer and never reused, so a pointer kept past its buffer's life faults even inside
// the device API, and one PROT_NONE page after each region catches overruns.
//
// Why regions are born in a stream's order: a stream-ordered allocation (cudaMallocFromPoolAsync)
// may be memory that the pool took back from an earlier free on that stream, still read by the
// stream's queued kernels; only work ordered after the allocation may touch it. Emulated memory is
// never reused, so instead a region allocated on a stream stays inaccessible, even inside the device
// API, until that stream's work reaches the allocation: work of another stream not ordered after it
// faults, where on a GPU it could overwrite what the earlier user still reads.
#include "kernels/emulated_device.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "base/never_destroyed.hpp"
#include "zerotrain/error.hpp"

namespace zt::detail {
namespace {

std::size_t page_size() {
  static const std::size_t size = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return size;
}

std::size_t round_up(std::size_t value, std::size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// The reserved range, for the signal handler: set once, before the handler is installed.
std::atomic<std::uintptr_t> reserved_begin{0};
std::atomic<std::uintptr_t> reserved_end{0};
struct sigaction previous_segv_action {};

/// Async-signal-safe: write(2) and arithmetic only.
void write_fault_message(const void* address) {
  char text[256];
  std::size_t length = 0;
  const auto append = [&](const char* part) {
    while (*part != '\0' && length < sizeof(text)) text[length++] = *part++;
  };
  append("zerotrain: access to emulated device memory at 0x");
  auto value = reinterpret_cast<std::uintptr_t>(address);
  char digits[2 * sizeof(value)];
  int count = 0;
  do {
    digits[count++] = "0123456789abcdef"[value & 0xf];
    value >>= 4;
  } while (value != 0);
  while (count > 0 && length < sizeof(text)) text[length++] = digits[--count];
  append(
      " (only kernels, copies and collectives may touch it, ordered after its allocation and before "
      "its free in the order of the stream that made it)\n");
  [[maybe_unused]] const ssize_t written = write(STDERR_FILENO, text, length);
}

void on_segmentation_fault(int signal, siginfo_t* info, void* context) {
  const auto address = reinterpret_cast<std::uintptr_t>(info->si_addr);
  if (address >= reserved_begin.load() && address < reserved_end.load()) write_fault_message(info->si_addr);
  // Whoever handled SIGSEGV before us (a debugger helper, MPI's backtrace) still gets it.
  if ((previous_segv_action.sa_flags & SA_SIGINFO) != 0 && previous_segv_action.sa_sigaction != nullptr) {
    previous_segv_action.sa_sigaction(signal, info, context);
    return;
  }
  if (previous_segv_action.sa_handler != SIG_DFL && previous_segv_action.sa_handler != SIG_IGN) {
    previous_segv_action.sa_handler(signal);
    return;
  }
  // Default action: returning re-runs the faulting access, which now kills the process.
  std::signal(SIGSEGV, SIG_DFL);
}

void install_fault_handler() {
  struct sigaction action {};
  action.sa_sigaction = on_segmentation_fault;
  action.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&action.sa_mask);
  sigaction(SIGSEGV, &action, &previous_segv_action);
}

std::string errno_text() {
  return std::strerror(errno);
}

/// The process-wide state: reservation, bump pointer, live regions, open accesses.
class EmulatedMemory {
 public:
  static EmulatedMemory& instance() {
    // Never destroyed: buffers may be released during static destruction.
    static EmulatedMemory* memory = new EmulatedMemory();
    return *memory;
  }

  /// A region that is `born` is usable at once; one that is not waits for birth() (allocate_on).
  void* allocate(std::size_t bytes, std::size_t alignment, bool born = true) {
    ZT_CHECK(alignment != 0 && (alignment & (alignment - 1)) == 0, "alignment must be a power of two, got ",
             alignment);
    const std::size_t page = page_size();
    const std::size_t length = round_up(bytes == 0 ? 1 : bytes, page);
    const std::lock_guard lock(mutex_);
    reserve();
    const std::uintptr_t start = round_up(next_, alignment > page ? alignment : page);
    ZT_CHECK(start + length + page <= end_, "emulated device memory: allocating ", bytes,
             " bytes exhausts the reserved address range of ", (end_ - begin_) >> 30,
             " GiB (addresses are never reused, so that stale pointers fault); the emulated device is "
             "for tests");
    if (born && open_ > 0) protect(start, length, PROT_READ | PROT_WRITE);
    next_ = start + length + page;  // the page after the region stays PROT_NONE
    regions_.emplace(start, Region{length, born});
    return reinterpret_cast<void*>(start);
  }

  /// The stream that allocated `pointer` reached the allocation: from now on the access guard opens it.
  void birth(void* pointer) noexcept {
    const std::lock_guard lock(mutex_);
    const auto it = regions_.find(reinterpret_cast<std::uintptr_t>(pointer));
    if (it == regions_.end() || it->second.born) return;
    it->second.born = true;
    if (open_ > 0) mprotect(pointer, it->second.length, PROT_READ | PROT_WRITE);
  }

  void deallocate(void* pointer) noexcept {
    const std::lock_guard lock(mutex_);
    const auto it = regions_.find(reinterpret_cast<std::uintptr_t>(pointer));
    if (it == regions_.end()) return;
    // Fresh PROT_NONE pages in place of the region: the memory goes back to the system and the
    // addresses stay ours (no later mmap can land there and be mistaken for emulated memory).
    mmap(pointer, it->second.length, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1,
         0);
    regions_.erase(it);
  }

  void open() {
    const std::lock_guard lock(mutex_);
    if (open_ == 0) {
      for (const auto& [start, region] : regions_) {
        if (!region.born) continue;
        if (mprotect(reinterpret_cast<void*>(start), region.length, PROT_READ | PROT_WRITE) != 0) {
          const std::string reason = errno_text();
          for (const auto& [undo, undone] : regions_) {
            if (undo == start) break;
            mprotect(reinterpret_cast<void*>(undo), undone.length, PROT_NONE);
          }
          ZT_THROW("emulated device memory: mprotect(PROT_READ|PROT_WRITE) of ", region.length,
                   " bytes failed: ", reason, " (", regions_.size(),
                   " live regions; vm.max_map_count may be too low)");
        }
      }
    }
    ++open_;
  }

  void close() noexcept {
    const std::lock_guard lock(mutex_);
    if (--open_ == 0) {
      for (const auto& [start, region] : regions_) {
        if (region.born) mprotect(reinterpret_cast<void*>(start), region.length, PROT_NONE);
      }
    }
  }

  std::size_t region_count() {
    const std::lock_guard lock(mutex_);
    return regions_.size();
  }

 private:
  EmulatedMemory() = default;

  /// The address range, on first use: as large as the system allows, from 1 TiB down to 4 GiB. It
  /// costs no memory: PROT_NONE, MAP_NORESERVE pages are neither backed nor committed.
  void reserve() {
    if (begin_ != 0) return;
    for (std::size_t size = std::size_t{1} << 40; size >= (std::size_t{1} << 32); size /= 2) {
      void* range = mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (range == MAP_FAILED) continue;
      begin_ = next_ = reinterpret_cast<std::uintptr_t>(range);
      end_ = begin_ + size;
      reserved_begin.store(begin_);
      reserved_end.store(end_);
      install_fault_handler();
      return;
    }
    ZT_THROW("emulated device memory: could not reserve 4 GiB of address space: ", errno_text());
  }

  void protect(std::uintptr_t start, std::size_t length, int protection) {
    if (mprotect(reinterpret_cast<void*>(start), length, protection) != 0) {
      ZT_THROW("emulated device memory: mprotect of ", length, " bytes failed: ", errno_text());
    }
  }

  std::mutex mutex_;
  std::uintptr_t begin_ = 0, end_ = 0, next_ = 0;
  struct Region {
    std::size_t length;  // whole pages
    bool born;           // its allocating stream reached the allocation: the access guard opens it
  };
  std::map<std::uintptr_t, Region> regions_;  // live regions by start
  int open_ = 0;                              // EmulatedDeviceAccess objects alive
};

class EmulatedDeviceAllocator final : public Allocator {
 public:
  explicit EmulatedDeviceAllocator(int index) : index_(index) {}
  void* allocate(std::size_t bytes, std::size_t alignment) override {
    return EmulatedMemory::instance().allocate(bytes, alignment);
  }
  /// In the stream's order (`stream`: an emulated queue's id, kernels/device.cpp): inaccessible until
  /// the work queued on it before the allocation has run, so work of other streams not ordered after
  /// the allocation faults, as on a GPU it could touch memory an earlier user of the pool still reads.
  void* allocate_on(std::size_t bytes, std::size_t alignment, void* stream) override {
    const auto queue = reinterpret_cast<std::uintptr_t>(stream);
    if (queue == 0) return allocate(bytes, alignment);
    void* pointer = EmulatedMemory::instance().allocate(bytes, alignment, /*born=*/false);
    try {
      emulated_enqueue(queue, [pointer] { EmulatedMemory::instance().birth(pointer); });
    } catch (...) {
      EmulatedMemory::instance().deallocate(pointer);
      throw;
    }
    return pointer;
  }
  /// Without a stream after every emulated stream's work, as cudaFree waits for the device.
  void deallocate(void* pointer, std::size_t) noexcept override {
    emulated_run_all_noexcept();
    EmulatedMemory::instance().deallocate(pointer);
  }
  /// In the stream's order (`stream`: an emulated queue's id, kernels/device.cpp): unmapped once the
  /// work queued on it before the free has run, so work of other streams not ordered before the free
  /// faults, as it would read reused memory on a GPU.
  void deallocate_on(void* pointer, std::size_t bytes, void* stream) noexcept override {
    const auto queue = reinterpret_cast<std::uintptr_t>(stream);
    if (queue == 0) return deallocate(pointer, bytes);
    try {
      emulated_enqueue(queue, [pointer] { EmulatedMemory::instance().deallocate(pointer); });
    } catch (...) {  // the queue could not take it: free after the whole device instead
      deallocate(pointer, bytes);
    }
  }
  Device device() const override { return Device::emulated(index_); }

 private:
  int index_;
};

}  // namespace

EmulatedDeviceAccess::EmulatedDeviceAccess() {
  EmulatedMemory::instance().open();
}

EmulatedDeviceAccess::~EmulatedDeviceAccess() {
  EmulatedMemory::instance().close();
}

Allocator& emulated_device_allocator(int index) {
  ZT_CHECK(index >= 0, "emulated:", index, " does not exist: expected an index >= 0");
  static std::mutex mutex;
  // Never destroyed: buffers may be released during static destruction.
  static base::NeverDestroyed<std::map<int, std::unique_ptr<EmulatedDeviceAllocator>>> allocators;
  const std::lock_guard lock(mutex);
  auto& slot = (*allocators)[index];
  if (!slot) slot = std::make_unique<EmulatedDeviceAllocator>(index);
  return *slot;
}

bool is_emulated_device_address(const void* address) {
  const auto value = reinterpret_cast<std::uintptr_t>(address);
  return value >= reserved_begin.load() && value < reserved_end.load();
}

std::size_t emulated_device_region_count() {
  return EmulatedMemory::instance().region_count();
}

}  // namespace zt::detail
