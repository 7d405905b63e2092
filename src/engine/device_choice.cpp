// The device choice of zt::train (src/engine/device_choice.hpp): every rank's GPU gathered, one
// verdict from all of them, so that an error ends every rank alike instead of leaving some waiting.
#include "src/engine/device_choice.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "kernels/device_backend.hpp"
#include "kernels/gpu_path.hpp"
#include "src/engine/string_broadcast.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/runtime.hpp"
#include "zerotrain/trainer.hpp"

namespace zt::engine_detail {
namespace {

// Fields of RankGpu::to_text: the ASCII unit separator, which no host name or CUDA message holds.
constexpr char kSeparator = '\x1f';

std::string rank_label(std::span<const RankGpu> ranks, std::size_t rank) {
  return "rank " + std::to_string(rank) + " (host " + ranks[rank].host + ", local rank " +
         std::to_string(ranks[rank].local_rank) + ")";
}

/// Why `gpu` cannot compute on its GPU, or empty.
std::string missing_gpu_reason(const RankGpu& gpu) {
  if (!gpu.cuda_usable)
    return gpu.cuda_reason.empty() ? std::string("no usable CUDA device") : gpu.cuda_reason;
  if (gpu.bound_gpu < 0) return "the runtime bound no GPU to it (RuntimeOptions::bind_device is false)";
  return {};
}

}  // namespace

std::string RankGpu::to_text() const {
  std::string text;
  for (const std::string& field :
       {host, std::to_string(local_rank), std::string(cuda_usable ? "1" : "0"), cuda_reason,
        std::to_string(visible_gpus), std::to_string(bound_gpu), gpu_id}) {
    text += field;
    text += kSeparator;
  }
  return text;
}

RankGpu RankGpu::from_text(const std::string& text) {
  std::vector<std::string> fields;
  std::string field;
  std::istringstream in(text);
  while (std::getline(in, field, kSeparator)) fields.push_back(field);
  ZT_CHECK(fields.size() == 7, "a rank's GPU description has ", fields.size(), " fields, expected 7: '", text,
           "'");
  RankGpu gpu;
  gpu.host = fields[0];
  gpu.local_rank = std::stoi(fields[1]);
  gpu.cuda_usable = fields[2] == "1";
  gpu.cuda_reason = fields[3];
  gpu.visible_gpus = std::stoi(fields[4]);
  gpu.bound_gpu = std::stoi(fields[5]);
  gpu.gpu_id = fields[6];
  return gpu;
}

DeviceDecision decide_device(DeviceChoice choice, std::span<const RankGpu> ranks, int rank,
                             bool engine_trains_on_cuda) {
  ZT_CHECK(rank >= 0 && static_cast<std::size_t>(rank) < ranks.size(), "decide_device: rank ", rank, " of ",
           ranks.size());
  if (choice == DeviceChoice::host) return {};
  const std::string key = choice == DeviceChoice::cuda ? "\"device\": \"cuda\"" : "\"device\": \"auto\"";
  std::size_t without = 0, first_without = ranks.size();
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    if (missing_gpu_reason(ranks[r]).empty()) continue;
    ++without;
    first_without = std::min(first_without, r);
  }
  DeviceDecision decision;
  if (choice == DeviceChoice::automatic && !engine_trains_on_cuda) {
    // The host whatever the GPUs: the ranks need not have bound one (`zerotrain train` binds none
    // then, so that no rank makes a CUDA context for nothing), but a GPU left unused is said.
    std::size_t first_seeing = ranks.size();
    for (std::size_t r = 0; r < ranks.size() && first_seeing == ranks.size(); ++r)
      if (ranks[r].cuda_usable && ranks[r].visible_gpus > 0) first_seeing = r;
    if (first_seeing == ranks.size()) return decision;
    decision.notice =
        key + ": " + rank_label(ranks, first_seeing) + " sees " +
        std::to_string(ranks[first_seeing].visible_gpus) +
        " GPU(s), but this build's training engine has not yet been verified on a GPU (zerotrain report, "
        "\"gpu path\"; \"device\": \"cuda\" or --device cuda uses it anyway); training on the host";
    return decision;
  }
  // No rank has a GPU: the host is what anyone expects, so nothing is said (a line on every CPU
  // job, carrying CUDA's error name, would be noise that log scanners take for an error).
  if (choice == DeviceChoice::automatic && without == ranks.size()) return decision;
  // From here on every rank computes on its GPU, or the job stops: ranks cannot train on two kinds.
  if (without > 0) {
    decision.error = key + ": " + rank_label(ranks, first_without) +
                     " has no usable GPU: " + missing_gpu_reason(ranks[first_without]);
    if (without > 1)
      decision.error +=
          " (" + std::to_string(without) + " of " + std::to_string(ranks.size()) + " ranks have none)";
    if (choice == DeviceChoice::automatic)
      decision.error += "; other ranks have one: set \"device\" to \"host\" or \"cuda\" for all of them";
    return decision;
  }
  // One GPU per node-local rank: two ranks of a host on one GPU (more local ranks than GPUs, bound
  // round-robin) would halve each other's memory and speed. PCI bus ids tell GPUs apart also where
  // each rank sees only its own (CUDA_VISIBLE_DEVICES set per rank).
  for (std::size_t a = 0; a < ranks.size(); ++a) {
    for (std::size_t b = a + 1; b < ranks.size(); ++b) {
      if (ranks[a].host != ranks[b].host || ranks[a].gpu_id.empty() || ranks[a].gpu_id != ranks[b].gpu_id)
        continue;
      std::size_t local_ranks = 0;
      for (const RankGpu& other : ranks) local_ranks += other.host == ranks[a].host ? 1 : 0;
      decision.error = key + ": one GPU per node-local rank, but host " + ranks[a].host + " runs " +
                       std::to_string(local_ranks) + " ranks on " + std::to_string(ranks[a].visible_gpus) +
                       " visible GPU(s): " + rank_label(ranks, a) + " and " + rank_label(ranks, b) +
                       " would share GPU " + ranks[a].gpu_id + "; start at most " +
                       std::to_string(ranks[a].visible_gpus) +
                       " ranks per node (mpirun --map-by ppr:N:node, srun --ntasks-per-node) or make "
                       "more GPUs visible";
      return decision;
    }
  }
  decision.device = Device::cuda(ranks[static_cast<std::size_t>(rank)].bound_gpu);
  return decision;
}

bool engine_trains_on_cuda() {
  return kernels::gpu_path_state(kernels::GpuPathPart::engine) == kernels::GpuPathState::ran;
}

RankGpu this_rank_gpu(const Runtime& runtime) {
  const CudaStatus& status = cuda_status();
  RankGpu gpu;
  gpu.host = runtime.host_name();
  gpu.local_rank = runtime.local_rank();
  gpu.cuda_usable = status.usable();
  gpu.cuda_reason = status.reason;
  gpu.visible_gpus = status.device_count;
  if (runtime.device().is_cuda()) {
    gpu.bound_gpu = runtime.device().index;
    gpu.gpu_id = detail::cuda_device_pci_bus_id(gpu.bound_gpu);
  }
  return gpu;
}

Device resolve_training_device(Runtime& runtime, DeviceChoice choice) {
  if (choice == DeviceChoice::host) return Device::host();
  std::vector<RankGpu> ranks;
  for (const std::string& text : all_gather_strings(runtime.world(), this_rank_gpu(runtime).to_text()))
    ranks.push_back(RankGpu::from_text(text));
  // "auto" takes a GPU only once the engine has trained on one and passed its tests there: a default
  // must not send users' jobs down a path that has only compiled ("cuda" asks for it explicitly).
  const DeviceDecision decision = decide_device(choice, ranks, runtime.world_rank(), engine_trains_on_cuda());
  if (!decision.error.empty()) ZT_THROW_AS(DeviceChoiceError, decision.error);
  if (!decision.notice.empty() && runtime.world_rank() == 0) {
    std::fprintf(stderr, "zerotrain train: %s\n", decision.notice.c_str());
    std::fflush(stderr);
  }
  return decision.device;
}

}  // namespace zt::engine_detail

namespace zt {

bool device_choice_may_use_gpu(DeviceChoice choice) {
  switch (choice) {
    case DeviceChoice::host:
      return false;
    case DeviceChoice::cuda:
      return true;
    case DeviceChoice::automatic:
      return engine_detail::engine_trains_on_cuda();
  }
  return true;
}

}  // namespace zt
