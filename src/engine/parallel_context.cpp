// The engine's process grid (see parallel_context.hpp).
#include "src/engine/parallel_context.hpp"

#include <cstdlib>
#include <string_view>

#include "zerotrain/error.hpp"
#include "zerotrain/mpi_communicator.hpp"
#include "zerotrain/nccl_communicator.hpp"
#include "zerotrain/runtime.hpp"

namespace zt::engine_detail {

namespace {
/// ZT_ONE_RANK_GROUPS: how a group of one rank on a device communicates. "copy" (the default): its
/// collectives are copies on the compute stream. "device": through the device's communicator, as a
/// group of several ranks does (NCCL on a GPU, the emulated one on the emulated device), so that one
/// GPU runs the engine's NCCL path: collectives on NCCL's stream, ordered by events and Work::wait(),
/// under the watchdog. One GPU cannot check that otherwise (NCCL refuses two ranks on one GPU).
bool one_rank_groups_use_the_device_communicator() {
  const char* value = std::getenv("ZT_ONE_RANK_GROUPS");
  if (value == nullptr || std::string_view(value) == "copy") return false;
  ZT_CHECK_AS(ConfigError, std::string_view(value) == "device", "ZT_ONE_RANK_GROUPS='", value,
              "': expected 'copy' (a group of one rank copies on the compute stream; the default) or "
              "'device' (it uses the device's communicator, NCCL on a GPU, as a group of several ranks "
              "does: to check the engine's NCCL path on one GPU)");
  return true;
}
}  // namespace

ParallelContext::ParallelContext(Runtime& runtime, ProcessGrid* grid, Communicator* data_parallel,
                                 const ExecutionContext& execution, int pipeline_stages)
    : execution_(execution) {
  ZT_CHECK(grid == nullptr || data_parallel == nullptr,
           "EngineOptions: pass a process grid or a data-parallel communicator, not both");
  ZT_CHECK_AS(ConfigError, data_parallel == nullptr || pipeline_stages == 1,
              "EngineOptions.data_parallel with pipeline.stages = ", pipeline_stages,
              ": a data-parallel communicator alone has no pipeline dimension; pass a zt::ProcessGrid "
              "(EngineOptions.grid) or neither");
  if (grid == nullptr && data_parallel == nullptr) {
    ZT_CHECK_AS(
        ConfigError, pipeline_stages >= 1 && runtime.world_size() % pipeline_stages == 0,
        "pipeline.stages is ", pipeline_stages, " but the job has ", runtime.world_size(),
        " ranks: the ranks must split into stages of equal data-parallel size (ranks = stages x data)");
    own_grid_ = std::make_unique<ProcessGrid>(runtime, GridShape{0, pipeline_stages, 1});
    grid = own_grid_.get();
  }
  if (grid != nullptr) {
    data_ = group_of(grid->data(), "data");
    tensor_ = group_of(grid->tensor(), "tensor");
    pipeline_ = group_of(grid->pipeline(), "pipeline");
    everyone_ = &runtime.world();
  } else {
    data_ = group_of(*data_parallel, "data");
    // A data-parallel group alone: the other two dimensions have one rank each.
    own_comms_.push_back(make_mpi_communicator(MPI_COMM_SELF, "tensor"));
    tensor_ = group_of(*own_comms_.back(), "tensor");
    own_comms_.push_back(make_mpi_communicator(MPI_COMM_SELF, "pipeline"));
    pipeline_ = group_of(*own_comms_.back(), "pipeline");
    everyone_ = data_parallel;
  }
}

ParallelContext::~ParallelContext() = default;

ParallelContext::Group ParallelContext::group_of(Communicator& host, const char* name) {
  ZT_CHECK(host.device().is_host(), "the ", name, " group's communicator is a ",
           comm_backend_name(host.backend()), " communicator on ", host.device().str(),
           "; the engine takes MPI communicators and makes the device "
           "ones itself");
  Group group;
  group.host = &host;
  const Device device = execution_.device();
  const std::string device_name = std::string(name) + "@" + device.str();
  if (device.is_host()) {
    group.device = &host;
  } else if (host.size() == 1 && !one_rank_groups_use_the_device_communicator()) {
    // Its collectives are copies: no NCCL communicator (buffers, a proxy thread, an init) for them.
    own_comms_.push_back(make_single_rank_communicator(device, device_name, execution_.compute()));
    group.device = own_comms_.back().get();
  } else if (device.is_emulated()) {
    own_comms_.push_back(
        make_emulated_device_communicator(native_mpi_comm(host), device_name, device, &execution_.compute()));
    group.device = own_comms_.back().get();
  } else {
    ZT_CHECK_AS(ConfigError, kHaveNccl, "the engine on ", device.str(),
                " needs NCCL communicators, and zerotrain was built without CUDA; train on the host");
    own_comms_.push_back(make_nccl_communicator(host, device, device_name, &execution_.compute()));
    group.device = own_comms_.back().get();
  }
  return group;
}

ParallelContext::Group ParallelContext::split(int color, const std::string& name) {
  MPI_Comm split = MPI_COMM_NULL;
  const MPI_Comm everyone = everyone_comm();
  ZT_CHECK(
      MPI_Comm_split(everyone, color >= 0 ? color : MPI_UNDEFINED, everyone_->rank(), &split) == MPI_SUCCESS,
      "MPI_Comm_split of the '", name, "' group failed");
  if (split == MPI_COMM_NULL) return {};
  own_comms_.push_back(make_mpi_communicator(split, name));
  MPI_Comm_free(&split);
  return group_of(*own_comms_.back(), name.c_str());
}

MPI_Comm ParallelContext::everyone_comm() const {
  return native_mpi_comm(*everyone_);
}

void ParallelContext::sum(void* values, std::size_t count, DType type, GroupSpan span) const {
  for (const auto& [group, member] :
       {std::pair{GroupSpan::data, &data_}, std::pair{GroupSpan::tensor, &tensor_},
        std::pair{GroupSpan::pipeline, &pipeline_}}) {
    if (spans(span, group) && member->size() > 1)
      member->device->all_reduce(values, values, count, type, ReduceOp::sum);
  }
}

}  // namespace zt::engine_detail
