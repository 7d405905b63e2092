// A function-local static that is never destroyed, for what the process keeps to its end: the CUDA
// side's library handles (cuBLASLt, cuDNN), their plans and workspaces, the libraries they come from,
// the allocators (host, CUDA, emulated), the emulated device's memory and streams. Static destructors run in
// the reverse order of construction, and CUDA's runtime tears itself down at exit too: destroying a handle
// after it (or a library after the handles that call into it) is undefined, and cuDNN handles destroyed at
// exit are known to crash (pytorch/pytorch#40372), which would fail a test binary whose checks all passed.
// Buffers may also be freed during static destruction, which the allocators must outlive. The process's exit
// gives the memory back.
//
//   static NeverDestroyed<std::map<int, Handle>> handles;
//   handles->emplace(...);
#pragma once

#include <cstddef>
#include <memory>
#include <new>
#include <utility>

namespace zt::base {

template <typename T>
class NeverDestroyed {
 public:
  template <typename... Args>
  explicit NeverDestroyed(Args&&... args) {
    std::construct_at(get(), std::forward<Args>(args)...);
  }
  NeverDestroyed(const NeverDestroyed&) = delete;
  NeverDestroyed& operator=(const NeverDestroyed&) = delete;
  // The implicit destructor leaves the object alone: that is the point.

  T* get() { return std::launder(reinterpret_cast<T*>(storage_)); }
  T& operator*() { return *get(); }
  T* operator->() { return get(); }

 private:
  alignas(T) std::byte storage_[sizeof(T)];
};

}  // namespace zt::base
