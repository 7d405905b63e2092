// One dispatch for every kernel: callers name a device, the kernel runs there.
//
// Pattern for a kernel family (e.g. kernels/optimizer_kernels.hpp):
//   - the header declares   void adamw_step(Device device, const AdamWArgs& args, const Stream* stream =
//   nullptr);
//   - kernels/host/<family>.cpp defines   namespace zt::kernels::host { void adamw_step(const AdamWArgs&); }
//   - kernels/cuda/<family>.cu  defines   namespace zt::kernels::cuda { void adamw_step(const AdamWArgs&,
//   void* stream); }
//     (only when CUDA is built)
//   - the entry point calls  dispatch(device, "adamw_step", [&] { host::adamw_step(args); },
//                                     [&](void* stream) { cuda::adamw_step(args, stream); }, stream);
//     with the CUDA lambda inside #if ZT_HAVE_CUDA, and no_cuda_kernel in its place otherwise.
// Adding the CUDA version later changes the family's .cpp, never its callers. Until a family has one,
// pass no_cuda_kernel and a call on a CUDA device raises a clear error naming the kernel.
#pragma once

#include <type_traits>
#include <utility>

#include "zerotrain/build_info.hpp"
#include "zerotrain/device.hpp"
#include "zerotrain/error.hpp"

namespace zt::kernels {

struct NoCudaKernel {};
inline constexpr NoCudaKernel no_cuda_kernel{};

template <typename HostKernel, typename CudaKernel>
decltype(auto) dispatch(Device device, const char* kernel_name, HostKernel&& host_kernel,
                        CudaKernel&& cuda_kernel, const Stream* stream = nullptr) {
  if (device.is_host()) return std::forward<HostKernel>(host_kernel)();
  if constexpr (std::is_same_v<std::decay_t<CudaKernel>, NoCudaKernel>) {
    if constexpr (build_info::have_cuda) {
      ZT_THROW("kernel '", kernel_name, "' has no CUDA version yet; run it on the host");
    } else {
      ZT_THROW_AS(CudaError, "kernel '", kernel_name, "' on ", device.str(),
                  ": zerotrain was built without CUDA");
    }
  } else {
    return std::forward<CudaKernel>(cuda_kernel)(stream != nullptr ? stream->native() : nullptr);
  }
}

}  // namespace zt::kernels
