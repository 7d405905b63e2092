#include "kernels/gpu_peaks.hpp"

#include <algorithm>
#include <array>
#include <cctype>

#include "zerotrain/build_info.hpp"
#include "zerotrain/error.hpp"

#if ZT_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/gemm.hpp"
#endif

namespace zt::kernels {
namespace {

/// One GPU model's dense peaks from NVIDIA's data sheets. The data sheets give the tensor-core
/// figures with 2:4 structured sparsity; the dense figures here are those halved. fp32 is the
/// non-tensor fp32 rate. fp64 is not tabled (nullopt: measure it or pass it).
struct DatasheetEntry {
  std::string_view name_part;  // lower case, found in the lower-cased cudaDeviceProp::name
  double bf16_fp16;
  double tf32;
  double fp32;
};
// Most specific first: "h200 nvl" before "h200", "gh200" before "h200", PCIe and NVL before "h100".
constexpr std::array kDatasheet{
    DatasheetEntry{"h200 nvl", 1671e12 / 2, 835e12 / 2, 60e12},
    DatasheetEntry{"h100 nvl", 1671e12 / 2, 835e12 / 2, 60e12},
    DatasheetEntry{"h100 pcie", 1513e12 / 2, 756e12 / 2, 51e12},
    DatasheetEntry{"gh200", 1979e12 / 2, 989e12 / 2, 67e12},
    DatasheetEntry{"h200", 1979e12 / 2, 989e12 / 2, 67e12},
    DatasheetEntry{"h100", 1979e12 / 2, 989e12 / 2, 67e12},  // SXM5 ("NVIDIA H100 80GB HBM3")
    DatasheetEntry{"a100", 624e12 / 2, 312e12 / 2, 19.5e12},
};

std::string lower_case(std::string_view text) {
  std::string lower(text);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return lower;
}

}  // namespace

std::string_view gpu_math_name(GpuMath math) {
  switch (math) {
    case GpuMath::bf16_fp16:
      return "bf16/fp16 tensor";
    case GpuMath::tf32:
      return "TF32 tensor";
    case GpuMath::fp32:
      return "fp32";
    case GpuMath::fp64:
      return "fp64";
  }
  return "?";
}

GpuMath gpu_math_of(DType dtype, bool tf32) {
  switch (dtype) {
    case DType::bf16:
    case DType::fp16:
      return GpuMath::bf16_fp16;
    case DType::fp32:
      return tf32 ? GpuMath::tf32 : GpuMath::fp32;
    case DType::fp64:
      return GpuMath::fp64;
    default:
      ZT_THROW("gpu_math_of: ", dtype_name(dtype), " is not a floating dtype GEMMs compute in");
  }
}

std::optional<double> datasheet_peak_flops(std::string_view gpu_name, GpuMath math) {
  const std::string name = lower_case(gpu_name);
  for (const DatasheetEntry& entry : kDatasheet) {
    if (name.find(entry.name_part) == std::string::npos) continue;
    switch (math) {
      case GpuMath::bf16_fp16:
        return entry.bf16_fp16;
      case GpuMath::tf32:
        return entry.tf32;
      case GpuMath::fp32:
        return entry.fp32;
      case GpuMath::fp64:
        return std::nullopt;
    }
  }
  return std::nullopt;
}

#if ZT_HAVE_CUDA
CudaDeviceFacts cuda_device_facts(int device_index) {
  cudaDeviceProp properties{};
  cudaError_t status = cudaGetDeviceProperties(&properties, device_index);
  int memory_clock_khz = 0;
  if (status == cudaSuccess)
    status = cudaDeviceGetAttribute(&memory_clock_khz, cudaDevAttrMemoryClockRate, device_index);
  CudaDeviceFacts facts;
  if (status == cudaSuccess)
    status = cudaDeviceGetAttribute(&facts.memory_bus_bits, cudaDevAttrGlobalMemoryBusWidth, device_index);
  if (status != cudaSuccess) {
    ZT_THROW_AS(CudaError, "querying the properties of cuda:", device_index, ": ", cudaGetErrorName(status),
                ": ", cudaGetErrorString(status));
  }
  facts.name = properties.name;
  facts.compute_major = properties.major;
  facts.compute_minor = properties.minor;
  facts.multiprocessors = properties.multiProcessorCount;
  facts.memory_clock_hz = 1e3 * memory_clock_khz;
  return facts;
}

CudaPeakFlops cuda_peak_flops(int device_index, DType dtype) {
  CudaPeakFlops peak;
  peak.device = cuda_device_facts(device_index);
  peak.math = gpu_math_of(dtype, dtype == DType::fp32 && cuda::tf32_enabled());
  peak.flops_per_second = datasheet_peak_flops(peak.device.name, peak.math);
  return peak;
}
#else
CudaDeviceFacts cuda_device_facts(int device_index) {
  ZT_THROW_AS(CudaError, "querying the properties of cuda:", device_index,
              ": zerotrain was built without CUDA");
}

CudaPeakFlops cuda_peak_flops(int device_index, DType) {
  return {cuda_device_facts(device_index), GpuMath::bf16_fp16, std::nullopt};
}
#endif

}  // namespace zt::kernels
