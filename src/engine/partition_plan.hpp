// The partition plan: a pure value that says where every element of the model's state lives on
// this rank, computed from the parameters' shapes and roles, the ZeRO stage, the group sizes and
// the alignment. The engine allocates what it says, the checkpoint writes and reads the ranges it
// says, and `zerotrain estimate` prints its byte counts, so the estimate is the allocation
// (docs/zero.md, "Partition layout"; docs/architecture.md, "The engine's seams").
//
// Layout. Every parameter is padded to `padded_numel` = N * piece_numel elements (N data-parallel
// ranks when the optimizer states are partitioned, stages 1-3; N = 1 at stage 0) and split evenly:
// rank r owns elements [r * piece_numel, (r + 1) * piece_numel) of the padded parameter. A rank's
// shard is its pieces of every parameter, concatenated in layout order; the parameter's piece
// starts at `shard_offset`. Parameters start at multiples of `alignment` elements in the flat
// layout. The padding holds zeros that no update moves.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "src/config/zero_partitioning.hpp"
#include "zerotrain/config.hpp"
#include "zerotrain/dtype.hpp"
#include "zerotrain/nn.hpp"
#include "zerotrain/tensor.hpp"

namespace zt {

/// Where one parameter sits in the flat layout and in the ZeRO partition.
struct FlatParameter {
  std::string name;
  Shape shape;  // as this rank holds it (a tensor-parallel slice when sharded)
  nn::ParallelRole role = nn::ParallelRole::replicated;
  int shard_dim = 0;  // sharded: the dimension split across the tensor group
  int pipeline_stage = 0;
  std::int64_t offset = 0;        // in the flat parameter/gradient buffers (aligned)
  std::int64_t numel = 0;         // real elements
  std::int64_t padded_numel = 0;  // multiple of the partition count
  std::int64_t piece_numel = 0;   // elements per rank (padded_numel at stage 0)
  std::int64_t shard_offset = 0;  // start of this rank's piece in its shard (= offset at stage 0)
};

namespace engine_detail {

/// One parameter as the plan sees it: the model's parameters() order.
struct PlannedParameter {
  std::string name;
  Shape shape;
  nn::ParallelRole role = nn::ParallelRole::replicated;
  int shard_dim = 0;
  int pipeline_stage = 0;
};

/// The settings a plan depends on (from the config and the process grid; plan_settings()).
struct PlanSettings {
  int stage = 0;
  int data_size = 1;
  int data_rank = 0;
  int tensor_size = 1;
  int tensor_rank = 0;
  DType compute_dtype = DType::fp32;
  DType wire_dtype = DType::fp32;  // communication_data_type
  std::int64_t alignment = 16;     // elements: 64 bytes of fp32, a SIMD / cache-line boundary
  bool external_model = false;     // the caller's buffers: its values and gradients stay its own
  // Optimizer: fp32 arrays per element besides the master (Adam 2, SGD with momentum 1, plain SGD 0).
  std::size_t optimizer_state_arrays = 2;
  // Buckets (elements).
  std::int64_t reduce_bucket_elements = 500'000'000;
  std::int64_t allgather_bucket_elements = 500'000'000;
  bool overlap_comm = false;
  // Stage 3.
  std::int64_t persistence_threshold = 100'000;
  // Offload.
  OffloadDevice optimizer_offload = OffloadDevice::none;
  std::int64_t sub_group_elements = 1'000'000'000;
  std::int64_t optimizer_buffer_count = 4;
  OffloadDevice parameter_offload = OffloadDevice::none;
  std::int64_t max_in_cpu = 1'000'000'000;
  std::int64_t parameter_buffer_elements = 100'000'000;
  std::int64_t parameter_buffer_count = 5;
  std::size_t io_alignment = 4096;  // bytes: the swap files' O_DIRECT alignment
  /// The engine computes on a device (a GPU, the emulated device): offload_param "cpu" then moves
  /// the pieces off it, into host memory (on the host they are in host memory already).
  bool engine_on_device = false;
};

/// The settings of a config on `data_size` data-parallel ranks (rank `data_rank`), tensor group
/// of `tensor_size`. The single place where the config's ZeRO keys become plan settings.
PlanSettings plan_settings(const Config& config, int data_size, int data_rank, int tensor_size = 1,
                           int tensor_rank = 0, bool engine_on_device = false);

/// This rank's part of one parameter as the optimizer sees it (element offsets).
struct OwnedRange {
  std::int64_t flat_begin = 0;        // in the flat layout
  std::int64_t shard_begin = 0;       // in the shard (master, gradient shard, stage-3 pieces)
  std::int64_t count = 0;             // elements (the real ones at stage 0, the piece at 1-3)
  std::int64_t parameter_offset = 0;  // in the parameter buffer (flat at 0-2, shard at 3)
  std::int64_t gradient_offset = 0;   // in the gradient buffer (flat at 0-1, shard at 2-3)
};

/// NVMe optimizer states: sub-groups of the shard, each array of a sub-group aligned for O_DIRECT.
struct SwapSubGroup {
  std::int64_t first = 0;
  std::int64_t count = 0;
  std::size_t bytes = 0;  // of the sub-group's swap tensor (every array, the last one unpadded)
};

/// Where each model-state byte of this rank is: in memory (the compute device; the host in this
/// build) or in swap files. `zerotrain estimate` prints these; the engine allocates exactly these.
struct ModelStateBytes {
  std::uint64_t parameters = 0;  // parameter buffer, stage-3 kept pieces and persistent tensors,
                                 // NVMe read buffers
  std::uint64_t gradients = 0;
  std::uint64_t optimizer_states = 0;       // fp32 master + moments in memory, or the NVMe sub-group buffers
  std::uint64_t parameters_nvme = 0;        // pieces in the parameter swap file
  std::uint64_t optimizer_states_nvme = 0;  // arrays in the optimizer swap file (unpadded)
  std::uint64_t resident() const { return parameters + gradients + optimizer_states; }
};

class PartitionPlan {
 public:
  PartitionPlan(std::vector<PlannedParameter> parameters, const PlanSettings& settings);

  const PlanSettings& settings() const { return settings_; }
  const ZeroPartitioning& partitioning() const { return partitioning_; }
  const std::vector<FlatParameter>& layout() const { return layout_; }
  const std::vector<OwnedRange>& owned() const { return owned_; }
  std::size_t size() const { return layout_.size(); }
  std::int64_t parameter_count() const { return parameter_count_; }  // real elements
  std::int64_t flat_size() const { return flat_size_; }
  std::int64_t shard_size() const { return shard_size_; }  // = flat_size() without partitioning
  /// Ranks the optimizer states are split over (N when partitioned, else 1), and this rank's index.
  int partition_count() const { return partitioning_.optimizer_states ? settings_.data_size : 1; }
  int partition_rank() const { return partitioning_.optimizer_states ? settings_.data_rank : 0; }

  // ---- buffers (elements of the compute dtype unless said) ----------------------------------
  /// The parameter buffer: flat at stages 0-2, this rank's shard at stage 3 (released once the
  /// NVMe store holds the pieces).
  std::int64_t parameter_buffer_elements() const;
  /// The gradient buffer: flat at stages 0-1, the reduced shard at stages 2-3.
  std::int64_t gradient_buffer_elements() const;
  /// The optimizer updates an fp32 master apart from the parameters: in bf16/fp16 training and with
  /// the parameters in the host store (the update cannot write the swap file in place, and the
  /// master of a device run stays with the host optimizer).
  bool separate_master() const;
  bool parameters_on_nvme() const;
  /// Stage 3's pieces live in the parameter store's host memory, not in a shard on the engine's
  /// device: on NVMe (offload_param "nvme", with the pieces within max_in_cpu in host memory), or
  /// all in host memory (offload_param "cpu" with the engine on a device). Gathers copy them to the
  /// device; the host optimizer writes their new values.
  bool parameters_in_host_store() const;
  /// The master (when separate) and the optimizer's arrays live in the optimizer's swap file.
  bool optimizer_states_on_nvme() const;
  bool master_in_swap() const { return optimizer_states_on_nvme() && separate_master(); }
  /// fp32 elements of the separate master in memory (0 when there is none or it is swapped).
  std::int64_t master_elements() const;
  /// fp32 arrays per element in the optimizer's swap file (master first, when swapped).
  std::size_t swapped_arrays() const;

  // ---- stage 3 --------------------------------------------------------------------------------
  /// Parameters of at most stage3_param_persistence_threshold elements stay gathered for good.
  bool persistent(std::size_t index) const;
  /// offload_param nvme: whole pieces kept in host memory within max_in_cpu, in layout order.
  bool piece_in_host(std::size_t index) const { return piece_in_host_[index] != 0; }
  std::int64_t host_piece_elements() const { return host_piece_elements_; }
  std::int64_t nvme_piece_elements() const { return nvme_piece_elements_; }
  /// The largest piece that goes to NVMe (its index), when any does.
  std::optional<std::size_t> largest_swapped_piece() const { return largest_swapped_; }
  /// NVMe read/write buffers of the parameter store and the bytes of each.
  std::size_t parameter_buffer_count() const;
  std::size_t parameter_buffer_bytes() const;

  // ---- NVMe optimizer states -----------------------------------------------------------------
  const std::vector<SwapSubGroup>& swap_sub_groups() const { return sub_groups_; }
  /// Bytes between consecutive arrays of one sub-group (its fp32 array rounded up to io_alignment).
  std::size_t swap_array_stride(const SwapSubGroup& group) const;
  std::size_t optimizer_swap_buffer_count() const;
  std::size_t optimizer_swap_buffer_bytes() const;  // each

  // ---- buckets --------------------------------------------------------------------------------
  /// Gradient reduction: elements of one staging buffer (wire dtype), and of each rank's region in
  /// it when the gradients go to their owners (reduce-scatter); at most 2 buffers with overlap_comm.
  std::int64_t reduce_bucket_capacity() const { return reduce_capacity_; }
  std::int64_t reduce_bucket_region() const { return reduce_region_; }
  /// Stages 1-2: each rank's region of the all-gather of updated parameters (compute dtype).
  std::int64_t allgather_region() const { return allgather_region_; }
  /// Bytes of communication staging the engine keeps at most (reduce buffers + all-gather).
  std::uint64_t bucket_bytes() const;

  // ---- checkpoints ----------------------------------------------------------------------------
  /// This rank's share of parameter `index` in a checkpoint: elements [first, first + count) of the
  /// parameter (its piece at stages 1-3; an even split at stage 0, where every rank holds all).
  std::pair<std::int64_t, std::int64_t> checkpoint_range(std::size_t index) const;

  /// Model-state bytes of this rank (resident in memory, and in swap files).
  ModelStateBytes model_state_bytes() const;

 private:
  std::vector<FlatParameter> layout_;
  std::vector<OwnedRange> owned_;
  PlanSettings settings_;
  ZeroPartitioning partitioning_;
  std::int64_t parameter_count_ = 0;
  std::int64_t flat_size_ = 0;
  std::int64_t shard_size_ = 0;
  std::vector<char> piece_in_host_;
  std::int64_t host_piece_elements_ = 0;
  std::int64_t nvme_piece_elements_ = 0;
  std::optional<std::size_t> largest_swapped_;
  std::vector<SwapSubGroup> sub_groups_;
  std::int64_t reduce_capacity_ = 0;
  std::int64_t reduce_region_ = 0;
  std::int64_t allgather_region_ = 0;
};

/// offload_param nvme: which pieces stay in host memory (1) and which go to the swap file (0):
/// whole pieces while they fit in `max_in_cpu` elements, in layout order (DeepSpeed keeps its first
/// max_in_cpu elements on the host). Shared by the plan and the parameter store.
std::vector<char> pieces_kept_in_host(const std::vector<FlatParameter>& layout, std::int64_t max_in_cpu);
/// Bytes between consecutive fp32 arrays of a sub-group of `count` elements.
std::size_t swap_array_stride(std::int64_t count, std::size_t alignment);
/// NVMe optimizer states: a shard of `shard` elements in sub-groups of `sub_group` elements with
/// `arrays` fp32 arrays each, every array starting at a multiple of `alignment` bytes. Shared by
/// the plan and the swapped states.
std::vector<SwapSubGroup> swap_sub_groups(std::int64_t shard, std::int64_t sub_group, std::size_t arrays,
                                          std::size_t alignment);

/// The parameters of a model, in parameters() order, as the plan needs them.
std::vector<PlannedParameter> planned_parameters(const std::vector<nn::Parameter*>& parameters);
/// The parameters of the config's "model" section without building it (same names, shapes and
/// order as zt::build_model's model; a test holds the two together).
std::vector<PlannedParameter> planned_parameters_of_config(const Config& config);
/// The parameter count of the config's model in closed form, term by term, each with the keys that
/// drive it ("model.n_layer x model.d_model^2"): O(1) whatever the sizes (planned_parameters_of_config
/// lists every tensor), in doubles so that absurd sizes cannot overflow. The terms sum to the
/// count of planned_parameters_of_config (a test holds the two together).
struct ParameterCountTerm {
  std::string keys;
  double count = 0.0;
};
std::vector<ParameterCountTerm> parameter_count_terms_of_config(const Config& config);
/// The parameters of pipeline stage `stage` of the config's model (pipeline.stages and
/// pipeline.partition) without building it: those of zt::build_model(config, stage), in its order,
/// a tied copy included (a test holds the two together).
std::vector<PlannedParameter> planned_parameters_of_stage(const Config& config, int stage);

}  // namespace engine_detail
}  // namespace zt
