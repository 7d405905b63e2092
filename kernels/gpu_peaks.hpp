// The peak rates of GPUs, for MFU (src/engine/trainer.cpp, docs/metrics.md "MFU") and for the kernel
// benchmark's fraction of peak (bench/bench_cuda_kernels.cpp): data-sheet dense FLOP/s by GPU model,
// and what the CUDA runtime says about a device (name, compute capability, memory clock and bus width).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "zerotrain/dtype.hpp"

namespace zt::kernels {

/// How a GEMM of a dtype computes on a GPU: bf16 and fp16 on tensor cores, fp32 either on tensor cores
/// in TF32 (ZT_CUDA_TF32=1, kernels/cuda/gemm.hpp) or on the fp32 pipes, fp64 on the fp64 pipes.
enum class GpuMath { bf16_fp16, tf32, fp32, fp64 };
std::string_view gpu_math_name(GpuMath math);  // "bf16/fp16 tensor", "TF32 tensor", "fp32", "fp64"
GpuMath gpu_math_of(DType dtype, bool tf32);

/// The data sheet's dense peak FLOP/s (no 2:4 sparsity) of the GPU named `gpu_name` (as
/// cudaDeviceProp::name spells it: "NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB")
/// for `math`; nullopt for a GPU or a math the table does not hold (then measure, or pass the figure).
/// Table: A100 (SXM and PCIe), H100 SXM, PCIe and NVL, H200 and H200 NVL, GH200.
std::optional<double> datasheet_peak_flops(std::string_view gpu_name, GpuMath math);

/// What the CUDA runtime says about one device.
struct CudaDeviceFacts {
  std::string name;  // cudaDeviceProp::name
  int compute_major = 0;
  int compute_minor = 0;
  int multiprocessors = 0;
  double memory_clock_hz = 0;  // cudaDevAttrMemoryClockRate (the peak memory clock)
  int memory_bus_bits = 0;     // cudaDevAttrGlobalMemoryBusWidth
  /// 2 transfers per clock (DDR/HBM) x clock x bus width: the theoretical peak DRAM bandwidth.
  double peak_memory_bytes_per_second() const { return 2.0 * memory_clock_hz * memory_bus_bits / 8.0; }
};
/// Throws zt::CudaError when zerotrain is built without CUDA or the device cannot be queried.
CudaDeviceFacts cuda_device_facts(int device_index);

/// The MFU peak of CUDA device `device_index` for GEMMs in `dtype` (TF32 when fp32 and
/// kernels::cuda::tf32_enabled()): the data sheet's figure, or nullopt when the table lacks the GPU.
struct CudaPeakFlops {
  CudaDeviceFacts device;
  GpuMath math = GpuMath::bf16_fp16;
  std::optional<double> flops_per_second;
};
CudaPeakFlops cuda_peak_flops(int device_index, DType dtype);

}  // namespace zt::kernels
