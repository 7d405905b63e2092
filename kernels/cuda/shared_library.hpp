// A CUDA library that zerotrain loads when it first needs it (dlopen) instead of linking it: cuBLASLt
// (kernels/cuda/cublaslt_library.hpp says why) and cuDNN (kernels/cuda/cudnn_library.hpp). Each is
// opened once, by soname (found like any library: LD_LIBRARY_PATH, the runpath, the system's paths),
// and never closed (these libraries keep process-wide state until exit). A library that does not open
// is remembered with why: loaded() is false and error() names the library, dlerror() and what to put
// on LD_LIBRARY_PATH, so that a caller may either throw it (cuBLASLt: a GEMM has no other way) or fall
// back (cuDNN: our own attention kernel runs).
#pragma once

#include <mutex>
#include <string>

namespace zt::kernels::cuda {

class SharedLibrary {
 public:
  /// `soname`: "libcudnn.so.9"; `purpose`: what needs it, for errors ("the CUDA GEMMs").
  SharedLibrary(std::string soname, std::string purpose);
  SharedLibrary(const SharedLibrary&) = delete;
  SharedLibrary& operator=(const SharedLibrary&) = delete;

  /// Opens the library on the first call (once, from any thread); false when dlopen failed.
  bool loaded() const;
  /// Why the library did not open (empty when it did): "loading libX.so.N for PURPOSE failed:
  /// <dlerror> (put the directory holding libX.so.N on LD_LIBRARY_PATH)".
  const std::string& error() const;
  const std::string& soname() const { return soname_; }

  /// The address of `name` in the library. Throws zt::CudaError with error() when it did not open,
  /// and naming the symbol when the library lacks it (an older version than the headers').
  void* symbol(const char* name) const;
  /// The address of `name`, or null when the library did not open or lacks it (an optional function).
  void* symbol_or_null(const char* name) const;
  /// symbol(name) as a pointer to `Function` (decltype(&::name) of the header's declaration).
  template <typename Function>
  Function resolve(const char* name) const {
    return reinterpret_cast<Function>(symbol(name));
  }

 private:
  void open() const;

  std::string soname_;
  std::string purpose_;
  mutable std::once_flag opened_;
  mutable void* handle_ = nullptr;
  mutable std::string error_;
};

}  // namespace zt::kernels::cuda

/// The body of a forwarder: resolves ::name from `library` (a SharedLibrary) once, as a function-local
/// static `function` of the declaration's type. decltype of the global declaration is unevaluated: it
/// names the type without linking the library.
#define ZT_SHARED_LIBRARY_FUNCTION(library, name) \
  static const auto function = (library).resolve<decltype(&::name)>(#name)
