// What of the CUDA path has run on a GPU, and what has only compiled: the one record of it, read by
// `zerotrain report` ("gpu path") and by the device choice ("device": "auto" takes a GPU only once
// the engine has run on one: `ran`). docs/gpu.md, "What has run on a GPU", says the same in prose.
//
// A session that runs a part on a GPU (scripts/gpu-check.sh) flips its entry to `ran` and records the
// run in docs/benchmarks.md (GPU section); a branch that builds a part flips `not_built` to `compiled`.
#pragma once

#include <array>
#include <cstddef>
#include <string_view>

namespace zt::kernels {

enum class GpuPathState {
  not_built,  // no CUDA code for it yet: it runs on the host only
  compiled,   // nvcc builds it and it links; it has not run on a GPU
  ran,        // it ran on a GPU and its tests passed there
};

enum class GpuPathPart : std::size_t {
  device_runtime,   // allocators (stream-ordered device pool, pinned cache), streams, events, copies
  kernels,          // kernels/cuda/*.cu: the nn and optimizer kernels
  gemms,            // cuBLASLt matmuls
  cudnn_attention,  // cuDNN's fused attention (kernels/cuda/cudnn_attention.cpp)
  nccl,             // NCCL communicators (zt::NcclCommunicator)
  engine,           // zt::Engine and zt::train on a CUDA device
};

struct GpuPathEntry {
  GpuPathPart part;
  std::string_view name;
  GpuPathState state;
};

inline constexpr std::array kGpuPath{
    GpuPathEntry{GpuPathPart::device_runtime, "device runtime", GpuPathState::compiled},
    GpuPathEntry{GpuPathPart::kernels, "CUDA kernels", GpuPathState::compiled},
    GpuPathEntry{GpuPathPart::gemms, "cuBLASLt GEMMs", GpuPathState::compiled},
    GpuPathEntry{GpuPathPart::cudnn_attention, "cuDNN attention", GpuPathState::compiled},
    GpuPathEntry{GpuPathPart::nccl, "NCCL communicators", GpuPathState::compiled},
    GpuPathEntry{GpuPathPart::engine, "training engine", GpuPathState::compiled},
};

constexpr GpuPathState gpu_path_state(GpuPathPart part) {
  for (const GpuPathEntry& entry : kGpuPath)
    if (entry.part == part) return entry.state;
  return GpuPathState::not_built;
}

constexpr std::string_view gpu_path_state_name(GpuPathState state) {
  switch (state) {
    case GpuPathState::not_built:
      return "not built";
    case GpuPathState::compiled:
      return "compiled only";
    case GpuPathState::ran:
      return "ran on a GPU";
  }
  return "?";
}

}  // namespace zt::kernels
