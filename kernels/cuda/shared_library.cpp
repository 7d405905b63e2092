// dlopen'ed CUDA libraries (kernels/cuda/shared_library.hpp).
#include "kernels/cuda/shared_library.hpp"

#include <dlfcn.h>

#include <utility>

#include "zerotrain/error.hpp"

namespace zt::kernels::cuda {

SharedLibrary::SharedLibrary(std::string soname, std::string purpose)
    : soname_(std::move(soname)), purpose_(std::move(purpose)) {}

void SharedLibrary::open() const {
  std::call_once(opened_, [this] {
    handle_ = dlopen(soname_.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle_ != nullptr) return;
    const char* reason = dlerror();
    error_ = detail::concat("loading ", soname_, " for ", purpose_,
                            " failed: ", reason ? reason : "unknown reason", " (put the directory holding ",
                            soname_, " on LD_LIBRARY_PATH)");
  });
}

bool SharedLibrary::loaded() const {
  open();
  return handle_ != nullptr;
}

const std::string& SharedLibrary::error() const {
  open();
  return error_;
}

void* SharedLibrary::symbol_or_null(const char* name) const {
  return loaded() ? dlsym(handle_, name) : nullptr;
}

void* SharedLibrary::symbol(const char* name) const {
  if (!loaded()) ZT_THROW_AS(CudaError, error_);
  void* address = dlsym(handle_, name);
  if (address == nullptr)
    ZT_THROW_AS(CudaError, soname_, " (for ", purpose_, ") has no symbol ", name,
                ": an older version than the headers zerotrain was built with?");
  return address;
}

}  // namespace zt::kernels::cuda
