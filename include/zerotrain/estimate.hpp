// Predicted model-state memory per rank (the ZeRO paper's formulas), for `zerotrain estimate`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "zerotrain/config.hpp"
#include "zerotrain/device.hpp"

namespace zt {

/// Peak activation memory (MemoryCategory::activations) of one rank in a training step, from the
/// built-in model's sizes: its forward and backward replayed on byte counts, layer by layer as
/// zt::nn allocates (src/engine/activation_estimate.cpp), over the engine's loop (unpipelined:
/// load, forward, loss, backward per micro-batch) or the stage's pipeline schedule. Counted from
/// the step's start: what the step allocates above what was held before it, in the memory of the
/// engine's device (`device`): with the engine on a device (a GPU, the emulated device) the
/// micro-batches as loaded stay in host memory and the device holds the engine's copies of them,
/// and with cpu_checkpointing the checkpoints keep their inputs in pinned host memory instead
/// (kept_on_host_per_micro_batch), the device holding each one again from the backward of the
/// checkpoint after it (its upload's prefetch) to its own.
struct ActivationEstimate {
  std::int64_t micro_batch_size = 0;
  std::int64_t micro_batches = 0;  // gradient_accumulation_steps
  int pipeline_stage = 0;
  int pipeline_stages = 1;
  std::string schedule;                  // "unpipelined", "1f1b" or "gpipe"
  DeviceType device = DeviceType::host;  // whose memory the bytes below are (all but the pinned ones)
  std::int64_t checkpoint_interval = 0;  // layers per activation checkpoint (0: none)
  /// What the stage's modules keep for one micro-batch between its forward and its backward (its
  /// input included where a layer saves it; with checkpoints, their inputs and what the layers
  /// outside them save); and the same without checkpointing.
  std::uint64_t kept_per_micro_batch = 0;
  std::uint64_t kept_without_checkpointing = 0;
  /// cpu_checkpointing with the engine on a device: the checkpoints' inputs one micro-batch keeps in
  /// pinned host memory (0 otherwise); the host holds this x in_flight.
  std::uint64_t kept_on_host_per_micro_batch = 0;
  /// Micro-batches whose activations are kept at once: 1 unpipelined, GPipe m, 1F1B min(p - s, m).
  std::int64_t in_flight = 0;
  /// The peak above kept x in_flight: the largest moment of a forward or backward (the logits and
  /// their gradient, a layer's attention qkv, a recomputed checkpoint), the micro-batches' data, the
  /// last stage's losses, pipeline receive buffers and sends in flight.
  std::uint64_t transient = 0;
  /// The step's peak: kept_per_micro_batch x in_flight + transient. Pipelined, with every send
  /// completing at the executor's next test (a fast link); peak_if_sends_wait with sends that hold
  /// their tensors until the stage's blocking flushes. Unpipelined the two are equal.
  std::uint64_t peak = 0;
  std::uint64_t peak_if_sends_wait = 0;
  std::uint64_t peak_without_checkpointing = 0;
  /// A text table (part of MemoryEstimate::table()).
  std::string table() const;
};

/// The activation estimate of the ranks of `pipeline_stage` for the config's "model" (GPT or MLP) on
/// `world_size` ranks (pipeline.stages x data-parallel; the batch sizes resolved for the data size):
/// with the config's activation checkpointing and without it, for the engine on `device` (the host:
/// cpu_checkpointing moves nothing there; any other type: a device's memory, as the engine on a GPU
/// or the emulated device allocates it). Throws ConfigError without a "model" section.
ActivationEstimate estimate_activation_memory(const Config& config, int world_size, int pipeline_stage = 0,
                                              DeviceType device = DeviceType::host);

/// Model-state bytes per rank, computed from the engine's own partition plan (src/engine/
/// partition_plan.hpp): the bytes an engine on the config allocates, padding included, not an
/// approximation of them. `parameters`, `gradients` and `optimizer_states` are the rank's share of
/// each state wherever it lives; `parameters_host` and `optimizer_states_host` the part held in
/// memory (all of it without offload). resident() is what the engine holds between steps: the
/// metrics' mem.resident and the memory counters show exactly these numbers.
struct MemoryEstimate {
  std::int64_t parameters_count = 0;  // Ψ (of the pipeline stage, its tied copies included)
  int world_size = 1;                 // N, the data-parallel size (the ranks / pipeline.stages)
  int zero_stage = 0;
  DType compute_dtype = DType::fp32;
  /// The rank's parameters: the flat buffer (stages 0-2, every parameter padded to N pieces and
  /// aligned to 16 elements) or the shard (stage 3), plus stage 3's persistent parameters, whole.
  std::uint64_t parameters = 0;
  std::uint64_t gradients = 0;         // the flat buffer (stages 0-1) or the reduced shard (2-3)
  std::uint64_t optimizer_states = 0;  // fp32 master (16-bit training) + optimizer moments
  std::uint64_t total() const { return parameters + gradients + optimizer_states; }
  /// In memory between steps: parameters_host + gradients + optimizer_states_host.
  std::uint64_t resident() const { return parameters_host + gradients + optimizer_states_host; }
  /// Communication staging the engine keeps on top (bytes): gradient reduction buckets
  /// (reduce_bucket_size elements of communication_data_type, two with overlap_comm) and, at stages
  /// 1-2, the parameter all-gather bucket (allgather_bucket_size). Each is capped at the model's size
  /// and holds at least its largest parameter, which only a config with a "model" section tells.
  std::uint64_t bucket_buffers = 0;
  /// Bytes of optimizer state per parameter: fp32 master (4, in bf16/fp16) + moments (Adam 8,
  /// SGD with momentum 4, plain SGD 0). Mixed-precision Adam: K = 12 as in the ZeRO paper.
  int optimizer_bytes_per_parameter = 0;
  /// "freeze": the frozen parameters' elements (Ψf, not counted in parameters_count) and their bytes,
  /// included in `parameters` (held whole on every rank, in the compute dtype; no gradient or state).
  std::int64_t frozen_parameters_count = 0;
  std::uint64_t frozen_parameters = 0;

  // ---- zero_optimization.offload_optimizer (docs/offload.md) ----------------------------------
  OffloadDevice offload_device = OffloadDevice::none;
  /// Host memory holding the optimizer states: all of `optimizer_states` without offload and with
  /// "cpu"; with "nvme" the sub-group buffers, buffer_count x min(sub_group_size, shard) elements
  /// of each fp32 array, each array rounded up to 4096 bytes (the direct-I/O alignment).
  std::uint64_t optimizer_states_host = 0;
  /// "nvme": bytes of the rank's swap file (= optimizer_states, before the alignment padding).
  std::uint64_t nvme_bytes = 0;
  // ---- zero_optimization.offload_param (stage 3) ------------------------------------------------
  OffloadDevice param_offload_device = OffloadDevice::none;
  /// Host memory holding the parameter pieces: all of `parameters` without offload_param and with
  /// "cpu". With "nvme", the whole pieces kept within max_in_cpu (in layout order), plus, when some
  /// piece goes to NVMe, min(buffer_count, pieces on NVMe) buffers of the largest piece on NVMe
  /// (rounded up to 4096 bytes), plus stage 3's persistent parameters.
  std::uint64_t parameters_host = 0;
  /// "nvme": bytes of the parameter pieces in the rank's parameter swap file.
  std::uint64_t parameters_nvme = 0;

  /// With CUDA, where DeepSpeed puts model states per rank: the device keeps the 16-bit parameters
  /// and gradients (and the states, without offload); with offload the host keeps the states (or
  /// their buffers). With the engine on the host all of it is host memory.
  std::uint64_t device_bytes_with_cuda = 0;
  std::uint64_t host_bytes_with_cuda = 0;
  /// DeepSpeed's own estimators (estimate_zero2/zero3_model_states_mem_needs, one node with N GPUs,
  /// additional_buffer_factor 1.5) for the same settings: GPU bytes per GPU, CPU bytes per node.
  /// largest_parameter (DeepSpeed's "largest layer", here the largest parameter tensor of the
  /// config's model, or of the pipeline stage; 0 with --params) enters stage 3's formula. With
  /// pipeline stages the formulas take the stage's parameters and its N data-parallel ranks.
  std::uint64_t deepspeed_gpu_bytes = 0;
  std::uint64_t deepspeed_cpu_bytes = 0;
  std::int64_t largest_parameter = 0;
  // ---- pipeline.stages > 1: the numbers are those of one stage's ranks --------------------------
  int pipeline_stage = 0;
  int pipeline_stages = 1;
  std::string stage_layers;  // "h.2 .. head (3 layers)": the stage's layers (empty with one stage)
  /// With a "model" section: the stage's activation memory (estimate_activation_memory).
  std::optional<ActivationEstimate> activations;
  /// A text table with the formula of each line.
  std::string table() const;
};

/// Per-rank model-state bytes for the config's precision and optimizer at ZeRO stage
/// config.zero_optimization.stage on `world_size` ranks, for `parameters_count` parameters (or,
/// when 0, the config's "model"). Without pipelining all ranks are data-parallel (N = world_size);
/// with pipeline.stages = p > 1 they form p stages of N = world_size / p data-parallel ranks each
/// (world_size must be a multiple of p), and the estimate is that of the ranks of stage
/// `pipeline_stage`: the parameters of its layers (pipeline.partition splits the config's model as
/// zt::build_model(config, stage) does; a tied copy counts on every stage that holds one) over its
/// N data-parallel ranks. Per stage (Ψ its parameters):
///   stage 0: params kΨ, grads kΨ, states KΨ          (k = 2 in bf16/fp16, 4 in fp32)
///   stage 1: params kΨ, grads kΨ, states KΨ/N
///   stage 2: params kΨ, grads kΨ/N, states KΨ/N
///   stage 3: params kΨ/N, grads kΨ/N, states KΨ/N   (not with pipeline stages: the engine refuses it)
/// The numbers are the plan's: each parameter padded to a multiple of N elements (and, in the flat
/// layout, to 16), persistent stage-3 parameters whole, swap buffers aligned to 4096 bytes (the usual
/// O_DIRECT alignment; a disk with a larger one takes a little more). With `parameters_count` and
/// no model, one tensor of that many elements (not with pipeline stages). With offload, also where
/// the states live (host, NVMe) and what would be on a GPU with CUDA (fields above). With the
/// config's "model" (not --params), also its activations (estimate_activation_memory, for the
/// engine on `activations_device`).
MemoryEstimate estimate_model_state_memory(const Config& config, int world_size,
                                           std::int64_t parameters_count = 0, int pipeline_stage = 0,
                                           DeviceType activations_device = DeviceType::host);

/// The memory one node's ranks may use together: the smallest of the physical memory (MemTotal),
/// the cgroup's memory limit (memory.max, v2; memory.limit_in_bytes, v1) and the address-space
/// limit of one process (RLIMIT_AS, `ulimit -v`, times the node's ranks); `what` names the one that
/// decides ("23.4 GiB of physical memory (MemTotal)").
struct HostMemory {
  std::uint64_t node_bytes = 0;
  std::string what;
};
/// This host's, for `ranks_on_node` processes of one job (RLIMIT_AS applies to each).
HostMemory host_memory(int ranks_on_node);

/// Refuses (ConfigError) a config whose built-in model cannot fit in `host`, before anything is
/// allocated: `ranks_on_node` ranks of `world_size` each need at least their model states (the
/// estimate of estimate_model_state_memory for the model's parameter count, over its pipeline
/// stages and data-parallel ranks) and, for a GPT, one micro-batch's attention qkv of one layer or
/// its logits, whichever is larger. With the engine on a device (`engine_device` not the host) the
/// host holds less: the stage's model as zt::build_model makes it there before the engine moves it
/// (its parameters in the compute dtype), or, when more, the model states offload keeps on the host;
/// the activations are the device's (check_fits_device_memory). The message names the config keys
/// that drive the size and the memory limit that decides. O(1) in the model's sizes, so
/// `zerotrain train` runs it first. Nothing without a "model" section.
void check_fits_host_memory(const Config& config, int world_size, int ranks_on_node, const HostMemory& host,
                            DeviceType engine_device = DeviceType::host);

/// The memory each rank may use on its device, and where the number comes from ("11.2 GiB free on
/// the GPU with the least (cudaMemGetInfo over the job's 8 ranks)").
struct DeviceMemory {
  std::uint64_t bytes = 0;
  std::string what;
};

/// Refuses (ConfigError) a config whose built-in model cannot fit in the memory of the ranks'
/// devices, before anything is allocated there: each rank of the largest pipeline stage needs at
/// least what the estimate puts on its device, its model states (MemoryEstimate::
/// device_bytes_with_cuda: offload moves states to the host), the gradient-reduction buckets, the
/// step's activation peak on a device (estimate_activation_memory) and, at stages 2-3, the largest
/// parameter whole during its backward (its full gradient; at stage 3 its gathered value too, unless
/// persistent); the rest of the running layer, stage 3's prefetch window and the kernels' workspaces
/// come on top. The message names the sizes, the config keys of the larger part and what to change.
/// Nothing without a "model" section or with device.bytes 0.
void check_fits_device_memory(const Config& config, int world_size, const DeviceMemory& device);

/// Number of parameters of the config's "model" section (without building it).
std::int64_t model_parameter_count(const Config& config);
/// Elements of the config's model's largest parameter tensor (0 without a "model" section).
std::int64_t model_largest_parameter(const Config& config);

}  // namespace zt
