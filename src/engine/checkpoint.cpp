// Checkpoints over the partition plan on parallel HDF5 (see checkpointer.hpp, docs/checkpoint-format.md).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <thread>

#include "base/text.hpp"
#include "io/hdf5_file.hpp"
#include "src/engine/checkpointer.hpp"
#include "src/engine/string_broadcast.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/mpi_communicator.hpp"

namespace zt::engine_detail {
namespace fs = std::filesystem;

namespace {

/// Every rank must call a checkpoint operation: wait for all at a non-blocking barrier, and give
/// up with an error (not a hang) when some do not come within ZT_CHECKPOINT_SYNC_TIMEOUT seconds.
void wait_for_all_ranks(MPI_Comm comm, const char* operation) {
  double timeout = 300.0;
  if (const char* text = std::getenv("ZT_CHECKPOINT_SYNC_TIMEOUT")) timeout = std::atof(text);
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Ibarrier(comm, &request);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout);
  int done = 0;
  while (true) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (done) return;
    if (std::chrono::steady_clock::now() > deadline) {
      int rank = 0;
      MPI_Comm_rank(comm, &rank);
      ZT_THROW(operation, " is collective: rank ", rank,
               " called it but not every data-parallel rank did within ", timeout,
               " s (ZT_CHECKPOINT_SYNC_TIMEOUT); call it on all ranks");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

/// Run `work` on rank 0 only; if it throws, every rank throws the same error (so that no rank goes
/// on into a collective the others left).
template <typename Work>
void on_rank0_everywhere(Communicator& communicator, Work&& work) {
  std::string failure;
  if (communicator.rank() == 0) {
    try {
      work();
    } catch (const std::exception& error) {
      failure = error.what();
      if (failure.empty()) failure = "unknown error";
    }
  }
  failure = broadcast_string(communicator, failure);
  if (!failure.empty()) ZT_THROW_AS(IoError, failure);
}

void fsync_path(const fs::path& path, int flags) {
  const int fd = ::open(path.c_str(), flags);
  ZT_CHECK_AS(IoError, fd >= 0, "cannot open '", path.string(), "' to sync it: ", base::errno_text(errno));
  const int status = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  ZT_CHECK_AS(IoError, status == 0, "fsync of '", path.string(), "' failed: ", base::errno_text(saved));
}

/// Write `text` to `path` atomically: a temporary next to it, synced, renamed over it.
void write_file_atomically(const fs::path& path, const std::string& text, std::uint32_t mode) {
  const fs::path temporary = path.parent_path() / ("." + path.filename().string() + ".tmp");
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << text;
    out.close();
    ZT_CHECK_AS(IoError, out.good(), "cannot write '", temporary.string(), "'");
  }
  ::chmod(temporary.c_str(), mode);
  fsync_path(temporary, O_RDONLY);
  fs::rename(temporary, path);
  fsync_path(path.parent_path(), O_RDONLY | O_DIRECTORY);
}

void check_tag(const std::string& tag) {
  ZT_CHECK_AS(ConfigError,
              !tag.empty() && tag.find('/') == std::string::npos && tag.front() != '.' && tag != "latest",
              "checkpoint tag '", tag,
              "': expected a non-empty name without '/', not starting with '.', not 'latest'");
}

std::vector<nn::Dropout*> dropouts_of(nn::Module& model) {
  std::vector<nn::Dropout*> result;
  for (nn::Module* module : model.modules()) {
    if (auto* dropout = dynamic_cast<nn::Dropout*>(module)) result.push_back(dropout);
  }
  return result;
}

/// Checksums travel as int64 sums: two's complement addition is addition mod 2^64.
void sum_checksums(Communicator& communicator, std::vector<std::uint64_t>& sums) {
  if (sums.empty() || communicator.size() == 1) return;
  communicator.all_reduce(sums.data(), sums.data(), sums.size(), DType::int64, ReduceOp::sum);
}

const char* role_name(nn::ParallelRole role) {
  return role == nn::ParallelRole::sharded ? "sharded" : "replicated";
}

}  // namespace

Checkpointer::Checkpointer(const PartitionPlan& plan, const ParallelContext& parallel, ZeroStrategy& strategy,
                           OptimizerStates& states, nn::Module& model)
    : plan_(plan), parallel_(parallel), strategy_(strategy), states_(states), model_(model) {
  for (const FlatParameter& slot : plan_.layout()) {
    ZT_CHECK(slot.role == nn::ParallelRole::replicated || plan_.settings().tensor_size == 1,
             "checkpoints of tensor-parallel slices ('", slot.name,
             "' is sharded across the tensor group) are not available yet");
  }
}

bool Checkpointer::writes(std::size_t index) const {
  return plan_.layout()[index].role == nn::ParallelRole::sharded || parallel_.tensor().rank() == 0;
}

std::vector<std::int64_t> Checkpointer::global_shape(std::size_t index) const {
  const FlatParameter& slot = plan_.layout()[index];
  std::vector<std::int64_t> shape(slot.shape.begin(), slot.shape.end());
  if (slot.role == nn::ParallelRole::sharded && !shape.empty())
    shape[static_cast<std::size_t>(slot.shard_dim)] *= plan_.settings().tensor_size;
  return shape;
}

std::pair<std::int64_t, std::int64_t> Checkpointer::owned_range(std::size_t index) const {
  const FlatParameter& slot = plan_.layout()[index];
  const OwnedRange& owned = plan_.owned()[index];
  const std::int64_t first = owned.flat_begin - slot.offset;
  return {first, std::clamp<std::int64_t>(slot.numel - first, 0, owned.count)};
}

std::string Checkpointer::save(const std::string& dir, const SaveOptions& options,
                               const TrainingState& state) {
  ZT_CHECK(parallel_.pipeline().size() == 1,
           "checkpoints of a pipeline-parallel grid are not available yet (pipeline size ",
           parallel_.pipeline().size(), ")");
  Communicator& everyone = parallel_.everyone();
  const MPI_Comm comm = parallel_.everyone_comm();
  wait_for_all_ranks(comm, "save_checkpoint");
  const TrainingProgress& progress = state.progress;
  const std::string tag = options.tag.value_or("global_step" + std::to_string(progress.global_steps));
  check_tag(tag);
  const std::string agreed_tag = broadcast_string(everyone, tag);
  std::int64_t mismatch = agreed_tag == tag ? 0 : 1;
  everyone.all_reduce(&mismatch, &mismatch, 1, DType::int64, ReduceOp::sum);
  ZT_CHECK(mismatch == 0, "save_checkpoint: the ranks passed different tags (rank 0: '", agreed_tag,
           "', rank ", everyone.rank(), ": '", tag, "')");

  const fs::path directory(dir);
  const fs::path final_path = checkpoint_file(dir, tag);
  fs::path temporary;
  on_rank0_everywhere(everyone, [&] {
    std::error_code error;
    if (!fs::exists(directory)) {
      fs::create_directories(directory, error);
      ZT_CHECK_AS(IoError, !error, "cannot create checkpoint directory '", dir, "': ", error.message());
      ::chmod(directory.c_str(), options.dir_mode);
    }
    ZT_CHECK_AS(IoError, fs::is_directory(directory), "checkpoint directory '", dir, "' is not a directory");
    ZT_CHECK_AS(IoError, ::access(directory.c_str(), W_OK) == 0, "checkpoint directory '", dir,
                "' is not writable: ", base::errno_text(errno));
    // Temporaries of saves that died half-way (a killed job) are garbage: no save of this job runs.
    for (const fs::directory_entry& entry : fs::directory_iterator(directory)) {
      const std::string name = entry.path().filename().string();
      if (name.front() == '.' && name.find(".h5.tmp-") != std::string::npos) fs::remove(entry.path(), error);
    }
  });
  temporary = broadcast_string(everyone,
                               (directory / ("." + tag + ".h5.tmp-" + std::to_string(::getpid()))).string());

  const std::vector<FlatParameter>& layout = plan_.layout();
  {
    io::H5File file = io::H5File::create_parallel(temporary.string(), comm);
    std::vector<std::string> names;
    std::vector<std::uint64_t> sums;
    // `owned` holds this rank's owned range of the parameter (owned_range); the checkpoint range
    // lies inside it.
    std::vector<float> owned;
    auto write_piece = [&](const std::string& name, std::size_t index) {
      auto [first, count] = plan_.checkpoint_range(index);
      if (!writes(index)) count = 0;
      const float* source = owned.data() + (first - owned_range(index).first);
      file.create_dataset(name, global_shape(index), DType::fp32);
      file.write_range(name, first, count, source, DType::fp32);
      names.push_back(name);
      sums.push_back(io::range_checksum(source, sizeof(float), first, count));
    };
    auto owned_buffer = [&](std::size_t index) {
      owned.assign(static_cast<std::size_t>(plan_.owned()[index].count), 0.0f);
      return owned.data();
    };
    for (std::size_t i = 0; i < layout.size(); ++i) {
      states_.read_master(i, owned_buffer(i));
      write_piece("model/" + layout[i].name, i);
      file.set_attribute("model/" + layout[i].name, "role", std::string(role_name(layout[i].role)));
      file.set_attribute("model/" + layout[i].name, "shard_dim",
                         static_cast<std::int64_t>(layout[i].shard_dim));
      file.set_attribute("model/" + layout[i].name, "pipeline_stage",
                         static_cast<std::int64_t>(layout[i].pipeline_stage));
    }
    if (const char* fault = std::getenv("ZT_FAULT_INJECTION");
        fault != nullptr && std::string_view(fault) == "kill_during_checkpoint_save" &&
        everyone.rank() == 0) {
      // Test hook (docs/testing.md): die half-way through writing, as a node failure would.
      std::raise(SIGKILL);
    }
    const Optimizer& optimizer = states_.optimizer();
    const std::vector<std::string_view> state_names = optimizer.state_names();
    for (std::size_t k = 0; k < state_names.size(); ++k) {
      for (std::size_t i = 0; i < layout.size(); ++i) {
        states_.read_state(k, i, owned_buffer(i));
        write_piece("optimizer/" + std::string(state_names[k]) + "/" + layout[i].name, i);
      }
    }
    states_.flush();  // releases the read cache
    // Every rank's dropout streams, one row per rank.
    const std::vector<nn::Dropout*> dropouts = dropouts_of(model_);
    const std::int64_t streams = std::max<std::int64_t>(1, static_cast<std::int64_t>(dropouts.size()));
    std::vector<std::uint64_t> row(static_cast<std::size_t>(streams), 0);
    for (std::size_t d = 0; d < dropouts.size(); ++d) row[d] = dropouts[d]->next_stream();
    file.create_dataset("engine/rng_streams", {everyone.size(), streams}, DType::int64);
    file.write_range("engine/rng_streams", everyone.rank() * streams, streams, row.data(), DType::int64);
    names.push_back("engine/rng_streams");
    sums.push_back(io::range_checksum(row.data(), sizeof(std::uint64_t), everyone.rank() * streams, streams));

    sum_checksums(everyone, sums);
    for (std::size_t k = 0; k < names.size(); ++k) file.set_attribute(names[k], "checksum", sums[k]);

    file.set_attribute("", "format", std::string(kCheckpointFormat));
    file.set_attribute("", "format_version", kCheckpointFormatVersion);
    file.set_attribute("", "tag", tag);
    file.set_attribute("", "client_state", options.client_state);
    const std::string engine_group = "engine";
    file.set_attribute(engine_group, "global_steps", progress.global_steps);
    file.set_attribute(engine_group, "global_samples", progress.global_samples);
    file.set_attribute(engine_group, "skipped_steps", progress.skipped_steps);
    file.set_attribute(engine_group, "world_size", static_cast<std::int64_t>(parallel_.data().size()));
    file.set_attribute(engine_group, "tensor_parallel_size",
                       static_cast<std::int64_t>(parallel_.tensor().size()));
    file.set_attribute(engine_group, "pipeline_parallel_size",
                       static_cast<std::int64_t>(parallel_.pipeline().size()));
    file.set_attribute(engine_group, "zero_stage", static_cast<std::int64_t>(plan_.settings().stage));
    file.set_attribute(engine_group, "compute_dtype",
                       std::string(dtype_name(plan_.settings().compute_dtype)));
    file.set_attribute(engine_group, "train_batch_size", state.train_batch_size);
    file.set_attribute(engine_group, "parameters", plan_.parameter_count());
    file.set_attribute(engine_group, "config", state.config.to_json_string(0));
    file.set_attribute(engine_group, "dropout_streams", static_cast<std::int64_t>(dropouts.size()));
    const LossScalerState scaler = state.loss_scaler.state();
    file.set_attribute(engine_group, "loss_scale", scaler.cur_scale);
    file.set_attribute(engine_group, "loss_scaler_iter", scaler.cur_iter);
    file.set_attribute(engine_group, "loss_scaler_last_overflow_iter", scaler.last_overflow_iter);
    file.set_attribute(engine_group, "loss_scaler_hysteresis", scaler.cur_hysteresis);
    file.set_attribute(engine_group, "loss_scaler_skipped_steps", scaler.skipped_steps);
    file.set_attribute(engine_group, "lr_scheduler_last_batch_iteration",
                       state.scheduler ? state.scheduler->state().last_batch_iteration : std::int64_t{-1});
    file.set_attribute(engine_group, "has_data_position",
                       static_cast<std::int64_t>(options.data_position ? 1 : 0));
    const DataPosition position = options.data_position.value_or(DataPosition{});
    file.set_attribute(engine_group, "data_seed", position.seed);
    file.set_attribute(engine_group, "data_num_samples", position.num_samples);
    file.set_attribute(engine_group, "data_epoch", position.epoch);
    file.set_attribute(engine_group, "data_offset", position.offset);
    if (file.exists("optimizer")) {
      file.set_attribute("optimizer", "type", std::string(optimizer.name()));
      file.set_attribute("optimizer", "step", optimizer.step_count());
    }
    file.set_attribute("model", "parameters", plan_.parameter_count());
    file.close();
  }

  // Publish: sync the data, give it its name, then point latest at it.
  on_rank0_everywhere(everyone, [&] {
    ::chmod(temporary.c_str(), options.file_mode);
    fsync_path(temporary, O_RDONLY);
    fs::rename(temporary, final_path);
    fsync_path(directory, O_RDONLY | O_DIRECTORY);
    write_file_atomically(directory / "latest", tag + "\n", options.file_mode);
    if (options.keep_last > 0) {
      const std::vector<std::string> tags = checkpoint_tags_newest_first(dir);
      for (std::size_t k = static_cast<std::size_t>(options.keep_last); k < tags.size(); ++k) {
        if (tags[k] != tag) fs::remove(checkpoint_file(dir, tags[k]));
      }
    }
  });
  return tag;
}

LoadResult Checkpointer::load(const std::string& dir, const LoadOptions& options, TrainingState state) {
  Communicator& everyone = parallel_.everyone();
  const MPI_Comm comm = parallel_.everyone_comm();
  wait_for_all_ranks(comm, "load_checkpoint");
  std::string tag;
  on_rank0_everywhere(everyone, [&] {
    if (options.tag) {
      tag = *options.tag;
    } else {
      const std::optional<std::string> latest = latest_checkpoint_tag(dir);
      ZT_CHECK_AS(IoError, latest.has_value(), "no checkpoint to load in '", dir, "': no file '", dir,
                  "/latest' (pass a tag, or save first)");
      tag = *latest;
    }
    ZT_CHECK_AS(IoError, fs::exists(checkpoint_file(dir, tag)), "checkpoint file '",
                checkpoint_file(dir, tag), "' does not exist");
  });
  tag = broadcast_string(everyone, tag);
  LoadResult result;
  result.tag = tag;
  result.path = checkpoint_file(dir, tag);

  io::H5File file = io::H5File::open_parallel(result.path, comm);
  const std::string& path = result.path;
  ZT_CHECK_AS(IoError,
              file.has_attribute("", "format") && file.string_attribute("", "format") == kCheckpointFormat,
              "'", path, "' is not a zerotrain checkpoint (no format attribute '", kCheckpointFormat, "')");
  const std::int64_t version = file.int_attribute("", "format_version");
  ZT_CHECK_AS(IoError, version <= kCheckpointFormatVersion, "checkpoint '", path, "' has format version ",
              version, "; this zerotrain reads up to ", kCheckpointFormatVersion);
  result.client_state = file.string_attribute("", "client_state");
  result.saved_world_size = file.int_attribute("engine", "world_size");
  result.saved_zero_stage = static_cast<int>(file.int_attribute("engine", "zero_stage"));

  // The model must match the checkpoint: same parameter names and global shapes.
  const std::vector<FlatParameter>& layout = plan_.layout();
  for (std::size_t i = 0; i < layout.size(); ++i) {
    const std::string name = "model/" + layout[i].name;
    ZT_CHECK_AS(IoError, file.exists(name), "checkpoint '", path, "' has no dataset '", name,
                "': it was saved from another model");
    const std::vector<std::int64_t> stored = file.shape(name);
    const std::vector<std::int64_t> expected = global_shape(i);
    ZT_CHECK_AS(IoError, stored == expected, "checkpoint '", path, "' dataset '", name, "' has shape ",
                base::shape_text(stored), " but the model's parameter has ", base::shape_text(expected));
  }
  ZT_CHECK_AS(IoError, file.int_attribute("model", "parameters") == plan_.parameter_count(), "checkpoint '",
              path, "' holds ", file.int_attribute("model", "parameters"), " parameter elements, the model ",
              plan_.parameter_count(), ": it was saved from another model");

  std::vector<std::string> names;
  std::vector<std::uint64_t> sums;
  // Each rank reads what it holds; the checksum counts each rank's checkpoint range once (replicated
  // copies: the first tensor-parallel rank's), whatever was read.
  auto add_checksum = [&](const std::string& name, std::size_t index, const float* values,
                          std::int64_t values_first) {
    const auto [first, count] = plan_.checkpoint_range(index);
    names.push_back(name);
    sums.push_back(
        writes(index) ? io::range_checksum(values + (first - values_first), sizeof(float), first, count) : 0);
  };
  std::vector<float> values;
  std::vector<float> owned;
  for (std::size_t i = 0; i < layout.size(); ++i) {
    const std::string name = "model/" + layout[i].name;
    const auto [held_first, held_count] = strategy_.held_range(i);
    values.assign(static_cast<std::size_t>(held_count), 0.0f);
    file.read_range(name, held_first, held_count, values.data(), DType::fp32);
    add_checksum(name, i, values.data(), held_first);
    strategy_.load_parameter(i, values.data());
    if (plan_.separate_master()) {
      // The master of the owned range, from what was read (the padding past the end stays zero).
      const auto [first, count] = owned_range(i);
      owned.assign(static_cast<std::size_t>(plan_.owned()[i].count), 0.0f);
      std::copy_n(values.data() + (first - held_first), count, owned.data());
      states_.write_master(i, owned.data());
    }
  }
  const bool load_optimizer = options.load_optimizer_states && !options.load_module_only;
  Optimizer& optimizer = states_.optimizer();
  if (load_optimizer) {
    ZT_CHECK_AS(IoError, optimizer.state_names().empty() || file.exists("optimizer"), "checkpoint '", path,
                "' has no optimizer state; load it with load_optimizer_states = false");
    if (file.exists("optimizer")) {
      const std::string saved = file.string_attribute("optimizer", "type");
      ZT_CHECK_AS(IoError, saved == optimizer.name(), "checkpoint '", path,
                  "' holds the state of optimizer '", saved, "' but the engine runs '", optimizer.name(),
                  "'; load with load_optimizer_states = false to start the optimizer afresh");
      optimizer.set_step_count(file.int_attribute("optimizer", "step"));
    }
    const std::vector<std::string_view> state_names = optimizer.state_names();
    for (std::size_t k = 0; k < state_names.size(); ++k) {
      for (std::size_t i = 0; i < layout.size(); ++i) {
        const std::string name = "optimizer/" + std::string(state_names[k]) + "/" + layout[i].name;
        ZT_CHECK_AS(IoError, file.exists(name), "checkpoint '", path, "' has no dataset '", name, "'");
        const auto [first, count] = owned_range(i);
        owned.assign(static_cast<std::size_t>(plan_.owned()[i].count), 0.0f);
        file.read_range(name, first, count, owned.data(), DType::fp32);
        add_checksum(name, i, owned.data(), first);
        states_.write_state(k, i, owned.data());
      }
    }
  }
  states_.flush();  // the last sub-group's changes reach the swap file
  sum_checksums(everyone, sums);
  for (std::size_t k = 0; k < names.size(); ++k) {
    const std::uint64_t stored = file.uint_attribute(names[k], "checksum");
    ZT_CHECK_AS(IoError, stored == sums[k], "checkpoint '", path, "' dataset '", names[k],
                "' does not match its checksum (stored ", stored, ", computed ", sums[k],
                "): the file is corrupted");
  }

  if (!options.load_module_only) {
    // Dropout streams: every rank reads the whole (small) table and checks it alone; a rank beyond
    // the saved world size continues rank 0's streams.
    const std::vector<std::int64_t> table = file.shape("engine/rng_streams");
    std::vector<std::uint64_t> streams(static_cast<std::size_t>(table[0] * table[1]));
    file.read_range("engine/rng_streams", 0, table[0] * table[1], streams.data(), DType::int64);
    ZT_CHECK_AS(IoError,
                io::range_checksum(streams.data(), sizeof(std::uint64_t), 0, table[0] * table[1]) ==
                    file.uint_attribute("engine/rng_streams", "checksum"),
                "checkpoint '", path,
                "' dataset 'engine/rng_streams' does not match its checksum: the file is corrupted");
    const std::vector<nn::Dropout*> dropouts = dropouts_of(model_);
    ZT_CHECK_AS(IoError,
                file.int_attribute("engine", "dropout_streams") == static_cast<std::int64_t>(dropouts.size()),
                "checkpoint '", path, "' has ", file.int_attribute("engine", "dropout_streams"),
                " dropout streams, the model ", dropouts.size());
    const std::int64_t row = everyone.rank() < table[0] ? everyone.rank() : 0;
    for (std::size_t d = 0; d < dropouts.size(); ++d) {
      dropouts[d]->set_next_stream(streams[static_cast<std::size_t>(row * table[1]) + d]);
    }
    TrainingProgress& progress = state.progress;
    progress.global_steps = file.int_attribute("engine", "global_steps");
    progress.global_samples = file.int_attribute("engine", "global_samples");
    progress.skipped_steps = file.int_attribute("engine", "skipped_steps");
    progress.micro_steps = progress.global_steps * state.gradient_accumulation_steps;
    LossScalerState scaler;
    scaler.cur_scale = file.double_attribute("engine", "loss_scale");
    scaler.cur_iter = file.int_attribute("engine", "loss_scaler_iter");
    scaler.last_overflow_iter = file.int_attribute("engine", "loss_scaler_last_overflow_iter");
    scaler.cur_hysteresis = file.int_attribute("engine", "loss_scaler_hysteresis");
    scaler.skipped_steps = file.int_attribute("engine", "loss_scaler_skipped_steps");
    state.loss_scaler.load_state(scaler);
    if (state.scheduler && options.load_lr_scheduler_states) {
      state.scheduler->load_state({file.int_attribute("engine", "lr_scheduler_last_batch_iteration")});
    }
    if (file.int_attribute("engine", "has_data_position") != 0) {
      result.data_position = DataPosition{
          file.uint_attribute("engine", "data_seed"), file.uint_attribute("engine", "data_num_samples"),
          file.uint_attribute("engine", "data_epoch"), file.uint_attribute("engine", "data_offset")};
    }
  }
  file.close();

  // No gradient survives a load; derived copies follow the new values.
  strategy_.after_load();
  return result;
}

}  // namespace zt::engine_detail
