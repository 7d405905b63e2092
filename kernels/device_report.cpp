// The device part of `zerotrain report`: the host kernels' ISA path and bf16 GEMM path, the host
// huge-page policy, then CUDA.
#include "kernels/gpu_path.hpp"
#include "kernels/host_gemm.hpp"
#include "kernels/host_isa.hpp"
#include "kernels/host_memory.hpp"
#include "zerotrain/build_info.hpp"
#include "zerotrain/device.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/report.hpp"

#if ZT_HAVE_CUDA
#include <cuda_runtime.h>

#include <exception>
#include <string>

#include "kernels/cuda/cudnn_attention.hpp"
#include "kernels/cuda/gemm.hpp"
#if __has_include(<cudnn_version.h>)
#include <cudnn_version.h>
#endif
#endif

namespace zt {
namespace {
std::string cuda_version_text(int version) {
  if (version == 0) return "none";
  return std::to_string(version / 1000) + "." + std::to_string((version % 1000) / 10);
}

#if ZT_HAVE_CUDA
/// The math of fp32 GEMMs on CUDA (ZT_CUDA_TF32, kernels/cuda/gemm.hpp); an invalid value is reported, not
/// thrown.
std::string fp32_gemm_text() {
  try {
    return kernels::cuda::tf32_enabled() ? "TF32 tensor cores (ZT_CUDA_TF32=1)" : "fp32 (ZT_CUDA_TF32 off)";
  } catch (const Error& error) {
    return error.what();
  }
}

/// cuDNN's fused attention (kernels/cuda/cudnn_attention.hpp): the library loaded or why not, whether it
/// is on. Loads libcudnn, needs no GPU; an error is reported, not thrown.
std::string cudnn_attention_text() {
  try {
    return kernels::cuda::cudnn::attention_status();
  } catch (const std::exception& error) {
    return error.what();
  }
}
#endif

/// "ran on a GPU: none; compiled only: device runtime, NCCL communicators; not built: ..." from
/// kernels/gpu_path.hpp, every state named even when empty.
std::string gpu_path_text() {
  std::string text;
  for (kernels::GpuPathState state :
       {kernels::GpuPathState::ran, kernels::GpuPathState::compiled, kernels::GpuPathState::not_built}) {
    std::string parts;
    for (const kernels::GpuPathEntry& entry : kernels::kGpuPath) {
      if (entry.state != state) continue;
      parts += (parts.empty() ? "" : ", ") + std::string(entry.name);
    }
    text += (text.empty() ? "" : "; ") + std::string(kernels::gpu_path_state_name(state)) + ": " +
            (parts.empty() ? std::string("none") : parts);
  }
  return text;
}
}  // namespace

Report device_report() {
  Report report{
      {"host", "host kernels ISA path", kernels::host_isa_description()},
      {"host", "host CPU supports", kernels::supported_host_isas()},
      {"host", "host bf16 GEMM path", kernels::bf16_gemm_description()},
      {"host", "host huge pages", host_huge_pages_description()},
  };
  const CudaStatus& status = cuda_status();
  if (!status.compiled) {
    report.push_back({"cuda", "CUDA", "not compiled in; host kernels only"});
    return report;
  }
  report.push_back({"cuda", "gpu path", gpu_path_text()});
  report.push_back({"cuda", "CUDA runtime", cuda_version_text(status.runtime_version)});
  report.push_back(
      {"cuda", "CUDA driver",
       status.driver_version ? cuda_version_text(status.driver_version) : std::string("none installed")});
#ifdef CUDNN_MAJOR
  report.push_back({"cuda", "cuDNN (headers)",
                    std::to_string(CUDNN_MAJOR) + "." + std::to_string(CUDNN_MINOR) + "." +
                        std::to_string(CUDNN_PATCHLEVEL)});
#endif
#if ZT_HAVE_CUDA
  report.push_back({"cuda", "fp32 GEMMs", fp32_gemm_text()});
  report.push_back({"cuda", "cuDNN attention", cudnn_attention_text()});
#endif
  if (!status.usable()) {
    report.push_back({"cuda", "devices", "none usable: " + status.reason});
    return report;
  }
#if ZT_HAVE_CUDA
  for (int i = 0; i < status.device_count; ++i) {
    cudaDeviceProp properties{};
    if (cudaGetDeviceProperties(&properties, i) != cudaSuccess) continue;
    report.push_back({"cuda", "cuda:" + std::to_string(i),
                      std::string(properties.name) + ", compute " + std::to_string(properties.major) + "." +
                          std::to_string(properties.minor) + ", " +
                          std::to_string(properties.totalGlobalMem >> 20) + " MiB"});
  }
#endif
  return report;
}

}  // namespace zt
