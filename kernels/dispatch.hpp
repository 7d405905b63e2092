// One dispatch for every kernel: callers name a stream, the kernel runs on its device, in its order.
//
// Pattern for a kernel family (e.g. kernels/optimizer_kernels.hpp):
//   - the header declares   void adam_step(const Stream& stream, const AdamStepArgs& args);
//   - kernels/host/<family>.cpp defines   namespace zt::kernels::host { void adam_step(const AdamStepArgs&);
//   }
//   - kernels/cuda/<family>.cu  defines   namespace zt::kernels::cuda {
//                                           void adam_step(const AdamStepArgs&, void* stream); }
//     (only when CUDA is built)
//   - the entry point calls  dispatch(stream, "adam_step", [=] { host::adam_step(args); },
//                                     [&](void* native) { cuda::adam_step(args, native); });
//     with the CUDA lambda inside #if ZT_HAVE_CUDA, and no_cuda_kernel in its place otherwise.
// By device: the host runs the host kernel; the emulated device queues the host kernel on the stream
// and runs it inside the device API's access (its memory is readable only there,
// kernels/emulated_device.hpp), so the host lambda captures by value ([=]: it runs after the entry
// point has returned; a kernel with a result runs at once, after the stream's work); CUDA runs
// the CUDA kernel on the stream, with the stream's device made current on the calling thread (on the
// default stream after every stream's work, finished on return, as the emulated device). Adding
// the CUDA version later changes the family's .cpp, never its callers. Until a family has one, pass
// no_cuda_kernel and a call on a CUDA device raises a clear error naming the kernel.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include "kernels/device_backend.hpp"
#include "kernels/emulated_device.hpp"
#include "zerotrain/build_info.hpp"
#include "zerotrain/device.hpp"
#include "zerotrain/error.hpp"

namespace zt::kernels {

struct NoCudaKernel {};
inline constexpr NoCudaKernel no_cuda_kernel{};

template <typename HostKernel, typename CudaKernel>
decltype(auto) dispatch(const Stream& stream, const char* kernel_name, HostKernel&& host_kernel,
                        CudaKernel&& cuda_kernel) {
  const Device device = stream.device();
  if (device.is_host()) return std::forward<HostKernel>(host_kernel)();
  if (device.is_emulated()) {
    const std::uint64_t queue = detail::emulated_queue_of(stream);
    if constexpr (std::is_void_v<std::invoke_result_t<HostKernel&>>) {
      if (queue != 0) {
        // Queued as a GPU queues a launch (kernels/emulated_device.hpp): the kernel holds copies of
        // its arguments, so the host lambdas capture by value.
        detail::emulated_enqueue(queue, [kernel = std::decay_t<HostKernel>(host_kernel)]() mutable {
          const detail::EmulatedDeviceAccess access;
          kernel();
        });
        return;
      }
      detail::emulated_run_all();  // the default stream: after every stream's work
    } else if (queue == 0) {
      detail::emulated_run_all();
    } else {
      // A result for the host: after the stream's queued work, as the CUDA kernel's copy back.
      detail::emulated_run_until(queue, detail::emulated_queue_position(queue));
    }
    const detail::EmulatedDeviceAccess access;
    return std::forward<HostKernel>(host_kernel)();
  }
  if constexpr (std::is_same_v<std::decay_t<CudaKernel>, NoCudaKernel>) {
    if constexpr (build_info::have_cuda) {
      ZT_THROW("kernel '", kernel_name, "' has no CUDA version yet; run it on the host");
    } else {
      ZT_THROW_AS(CudaError, "kernel '", kernel_name, "' on ", device.str(),
                  ": zerotrain was built without CUDA");
    }
  } else {
    // On the stream's device, whichever thread calls (a launch on another device's stream fails).
    const detail::CudaDeviceScope current(device.index);
    // A stream without a handle is CUDA's legacy default stream, which does not order against the
    // non-blocking streams zerotrain makes: its kernel first waits for every stream's work and is done
    // on return, as on the emulated device (a stream-less fill_ or to() of a kernel's output would
    // otherwise read or write it while that kernel runs). Never on the engine's hot path.
    const bool legacy_default_stream = stream.native() == nullptr;
    if (legacy_default_stream) detail::cuda_device_synchronize(device.index);
    if constexpr (std::is_void_v<std::invoke_result_t<CudaKernel&, void*>>) {
      std::forward<CudaKernel>(cuda_kernel)(stream.native());
      if (legacy_default_stream) detail::cuda_stream_synchronize(nullptr);
    } else {
      return std::forward<CudaKernel>(cuda_kernel)(stream.native());  // a result: copied back, done
    }
  }
}

}  // namespace zt::kernels
