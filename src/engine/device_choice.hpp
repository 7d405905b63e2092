// Where zt::train computes: the config's "device" ("auto" | "cuda" | "host", docs/config.md) or
// TrainOptions::device, checked on every rank alike. The runtime binds node-local rank i to GPU
// i % visible GPUs (mpi_layer/runtime.cpp); a CUDA run takes that GPU and needs one GPU per
// node-local rank. Internal to the engine.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "zerotrain/config.hpp"
#include "zerotrain/device.hpp"

namespace zt {
class Runtime;
}

namespace zt::engine_detail {

/// What one rank knows about its GPU, gathered from every rank (RankGpu::to_text / from_text).
struct RankGpu {
  std::string host;
  int local_rank = 0;
  bool cuda_usable = false;
  std::string cuda_reason;  // cuda_status().reason when not usable
  int visible_gpus = 0;     // cuda_status().device_count
  int bound_gpu = -1;       // the runtime's GPU (Runtime::device()), -1 when it bound none
  std::string gpu_id;       // the bound GPU's PCI bus id: two ranks with one id share a GPU

  std::string to_text() const;
  static RankGpu from_text(const std::string& text);
};

struct DeviceDecision {
  Device device = Device::host();
  std::string notice;  // one line for rank 0 to print ("auto" falling back to the host), or empty
  std::string error;   // why the choice cannot be met, the same on every rank; empty when it can
};

/// The decision for rank `rank` from every rank's RankGpu: the same verdict (error or not) on every
/// rank. `engine_trains_on_cuda`: whether "auto" may take a GPU (kernels/gpu_path.hpp).
DeviceDecision decide_device(DeviceChoice choice, std::span<const RankGpu> ranks, int rank,
                             bool engine_trains_on_cuda);

/// Whether this build's training engine has run on a GPU and passed its tests there
/// (kernels/gpu_path.hpp): what lets "auto" take a GPU.
bool engine_trains_on_cuda();

/// This rank's RankGpu, from cuda_status() and the runtime's binding.
RankGpu this_rank_gpu(const Runtime& runtime);

/// decide_device over the runtime's world (collective); throws ConfigError on every rank when the
/// choice cannot be met, and prints the notice on rank 0 (stderr).
Device resolve_training_device(Runtime& runtime, DeviceChoice choice);

}  // namespace zt::engine_detail
