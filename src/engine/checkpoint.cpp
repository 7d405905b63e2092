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

#include <sstream>
#include "base/text.hpp"
#include "io/hdf5_file.hpp"
#include "src/engine/checkpoint_directory.hpp"
#include "src/engine/checkpoint_validation.hpp"
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

void check_tag(const std::string& tag) {
  ZT_CHECK_AS(ConfigError, is_checkpoint_tag(tag), "checkpoint tag '", tag,
              "': expected a non-empty name of printable characters without '/', '\\' or spaces, not "
              "starting with '.', not 'latest'");
}

/// Rank 0 removes the temporary of a save that failed before it was published.
struct UnpublishedTemporary {
  fs::path path;
  ~UnpublishedTemporary() {
    std::error_code ignored;
    if (!path.empty()) fs::remove(path, ignored);
  }
};

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

/// Whether the checkpoint records parameter `name` as frozen (/model attribute `frozen`).
bool saved_frozen(const io::H5File& file, const std::string& name) {
  if (!file.has_attribute("model", "frozen")) return false;
  std::istringstream lines(file.string_attribute("model", "frozen"));
  for (std::string line; std::getline(lines, line);) {
    if (line == name) return true;
  }
  return false;
}

const char* role_name(nn::ParallelRole role) {
  return role == nn::ParallelRole::sharded ? "sharded" : "replicated";
}

}  // namespace

Checkpointer::Checkpointer(const PartitionPlan& plan, const ParallelContext& parallel, ZeroStrategy& strategy,
                           OptimizerStates& states, nn::Module& model, std::vector<char> saved_here,
                           std::vector<nn::Parameter*> frozen, const ExecutionContext& execution)
    : plan_(plan),
      parallel_(parallel),
      strategy_(strategy),
      states_(states),
      model_(model),
      saved_here_(std::move(saved_here)),
      frozen_(std::move(frozen)),
      execution_(execution) {
  ZT_CHECK(saved_here_.size() == plan_.size(), "checkpointer: ", saved_here_.size(), " flags for ",
           plan_.size(), " parameters");
  for (const FlatParameter& slot : plan_.layout()) {
    ZT_CHECK(slot.role == nn::ParallelRole::replicated || plan_.settings().tensor_size == 1,
             "checkpoints of tensor-parallel slices ('", slot.name,
             "' is sharded across the tensor group) are not available yet");
  }
  // The global layout: what each stage saves, one line per parameter, gathered stage by stage.
  std::ostringstream mine;
  for (std::size_t i = 0; i < plan_.size(); ++i) {
    if (!saved_here_[i]) continue;
    const FlatParameter& slot = plan_.layout()[i];
    mine << slot.name << '\t' << role_name(slot.role) << '\t' << slot.shard_dim << '\t' << i;
    for (std::int64_t extent : global_shape(i)) mine << '\t' << extent;
    mine << '\n';
  }
  const std::vector<std::string> stages = all_gather_strings(*parallel_.pipeline().host, mine.str());
  const int my_stage = parallel_.pipeline().rank();
  global_of_.assign(plan_.size(), -1);
  for (std::size_t stage = 0; stage < stages.size(); ++stage) {
    std::istringstream lines(stages[stage]);
    std::string line;
    while (std::getline(lines, line)) {
      std::istringstream fields(line);
      GlobalParameter parameter;
      std::int64_t index = 0;
      std::getline(fields, parameter.name, '\t');
      std::getline(fields, parameter.role, '\t');
      fields >> parameter.shard_dim >> index;
      for (std::int64_t extent = 0; fields >> extent;) parameter.shape.push_back(extent);
      parameter.stage = static_cast<std::int64_t>(stage);
      if (static_cast<int>(stage) == my_stage) {
        parameter.local = index;
        global_of_[static_cast<std::size_t>(index)] = static_cast<std::int64_t>(global_.size());
      }
      std::int64_t elements = 1;
      for (std::int64_t extent : parameter.shape) elements *= extent;
      global_parameter_count_ += elements;
      global_.push_back(std::move(parameter));
    }
  }
  for (const nn::Parameter* parameter : frozen_) global_parameter_count_ += parameter->value.numel();
}

std::vector<Checkpointer::GlobalDropout> Checkpointer::global_dropouts() const {
  std::ostringstream mine;
  const std::vector<nn::Dropout*> dropouts = dropouts_of(model_);
  for (const nn::Dropout* dropout : dropouts)
    mine << dropout->name() << '\t' << dropout->next_stream() << '\n';
  const std::vector<std::string> stages = all_gather_strings(*parallel_.pipeline().host, mine.str());
  std::vector<GlobalDropout> all;
  for (std::size_t stage = 0; stage < stages.size(); ++stage) {
    std::istringstream lines(stages[stage]);
    std::string line;
    std::size_t position = 0;
    while (std::getline(lines, line)) {
      const std::size_t tab = line.rfind('\t');
      GlobalDropout dropout{.name = line.substr(0, tab), .stream = std::stoull(line.substr(tab + 1))};
      if (static_cast<int>(stage) == parallel_.pipeline().rank()) dropout.local = dropouts[position++];
      all.push_back(std::move(dropout));
    }
  }
  return all;
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

  check_checkpoint_modes(options.file_mode, options.dir_mode);
  const fs::path directory(dir);
  const fs::path final_path = checkpoint_file(dir, tag);
  UnpublishedTemporary unpublished;  // rank 0's
  on_rank0_everywhere(everyone, [&] {
    prepare_checkpoint_directory(directory, options.dir_mode);
    // This job holds the directory from its first save (the trainer from its start) to its end: no
    // other job writes here, so temporaries of other writers are of dead jobs.
    std::shared_ptr<CheckpointDirectoryLock> lock =
        CheckpointDirectoryLock::acquire(directory, options.file_mode);
    if (std::find(directory_locks_.begin(), directory_locks_.end(), lock) == directory_locks_.end())
      directory_locks_.push_back(lock);
    remove_dead_temporaries(directory, lock->held());
    unpublished.path = create_temporary(directory, tag + ".h5", options.file_mode);
  });
  const fs::path temporary = broadcast_string(everyone, unpublished.path.string());

  {
    io::H5File file = io::H5File::create_parallel(temporary.string(), comm);
    std::vector<std::string> names;
    std::vector<std::uint64_t> sums;
    // `owned` holds this rank's owned range of the parameter (owned_range); the checkpoint range
    // lies inside it. Every rank creates every stage's datasets (HDF5's metadata is collective);
    // the ranks of the stage that saves a parameter write it.
    std::vector<float> owned;
    auto write_piece = [&](const std::string& name, const GlobalParameter& parameter) {
      file.create_dataset(name, parameter.shape, DType::fp32);
      std::int64_t first = 0, count = 0;
      const float* source = owned.data();
      if (parameter.local >= 0) {
        const auto index = static_cast<std::size_t>(parameter.local);
        std::tie(first, count) = plan_.checkpoint_range(index);
        if (!writes(index)) count = 0;
        source = owned.data() + (first - owned_range(index).first);
      }
      file.write_range(name, first, count, source, DType::fp32);
      names.push_back(name);
      sums.push_back(io::range_checksum(source, sizeof(float), first, count));
    };
    auto read_owned = [&](const GlobalParameter& parameter, auto&& read) {
      owned.assign(1, 0.0f);
      if (parameter.local < 0) return;
      const auto index = static_cast<std::size_t>(parameter.local);
      owned.assign(static_cast<std::size_t>(plan_.owned()[index].count), 0.0f);
      read(index, owned.data());
    };
    for (const GlobalParameter& parameter : global_) {
      read_owned(parameter, [&](std::size_t index, float* out) { states_.read_master(index, out); });
      const std::string name = "model/" + parameter.name;
      write_piece(name, parameter);
      file.set_attribute(name, "role", parameter.role);
      file.set_attribute(name, "shard_dim", parameter.shard_dim);
      file.set_attribute(name, "pipeline_stage", parameter.stage);
    }
    // Frozen parameters: whole on every rank, in the compute dtype; rank 0 writes them widened to
    // fp32, with no optimizer state.
    std::string frozen_names;
    for (const nn::Parameter* parameter : frozen_) {
      const std::string name = "model/" + parameter->name;
      const Shape& shape = parameter->value.shape();
      file.create_dataset(name, std::vector<std::int64_t>(shape.begin(), shape.end()), DType::fp32);
      const std::vector<float> values = frozen_value(*parameter);
      const std::int64_t count = everyone.rank() == 0 ? parameter->value.numel() : 0;
      file.write_range(name, 0, count, values.data(), DType::fp32);
      names.push_back(name);
      sums.push_back(io::range_checksum(values.data(), sizeof(float), 0, count));
      file.set_attribute(name, "role", std::string("replicated"));
      file.set_attribute(name, "shard_dim", std::int64_t{0});
      file.set_attribute(name, "pipeline_stage", std::int64_t{0});
      frozen_names += parameter->name + "\n";
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
      for (const GlobalParameter& parameter : global_) {
        read_owned(parameter, [&](std::size_t index, float* out) { states_.read_state(k, index, out); });
        write_piece("optimizer/" + std::string(state_names[k]) + "/" + parameter.name, parameter);
      }
    }
    states_.flush();  // releases the read cache
    // The dropout streams of the whole model (every stage's), one row per rank, and their names.
    const std::vector<GlobalDropout> dropouts = global_dropouts();
    const std::int64_t streams = std::max<std::int64_t>(1, static_cast<std::int64_t>(dropouts.size()));
    std::vector<std::uint64_t> row(static_cast<std::size_t>(streams), 0);
    std::string dropout_names;
    for (std::size_t d = 0; d < dropouts.size(); ++d) {
      row[d] = dropouts[d].stream;
      dropout_names += (d == 0 ? "" : "\n") + dropouts[d].name;
    }
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
    file.set_attribute(engine_group, "parameters", global_parameter_count_);
    if (!options.slurm_job_id.empty()) file.set_attribute(engine_group, "slurm_job_id", options.slurm_job_id);
    file.set_attribute(engine_group, "config", state.config.to_json_string(0));
    file.set_attribute(engine_group, "dropout_streams", static_cast<std::int64_t>(dropouts.size()));
    file.set_attribute(engine_group, "dropout_names", dropout_names);
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
    file.set_attribute("model", "parameters", global_parameter_count_);
    file.set_attribute("model", "tensors", static_cast<std::int64_t>(global_.size() + frozen_.size()));
    if (!frozen_names.empty()) file.set_attribute("model", "frozen", frozen_names);
    if (file.exists("optimizer")) {
      std::string listed;
      for (std::string_view state_name : state_names) listed += std::string(state_name) + "\n";
      file.set_attribute("optimizer", "states", listed);
    }
    file.close();
  }

  // Publish: checksum every attribute (whatever was written above), sync the data, give it its
  // name, then point latest at it.
  on_rank0_everywhere(everyone, [&] {
    {
      io::H5File update = io::H5File::open_serial_for_update(temporary.string());
      update.set_attribute("", kAttributesChecksumKey, update.attributes_checksum(kAttributesChecksumKey));
      update.close();
    }
    if ((options.file_mode & 0200) == 0)
      ::chmod(temporary.c_str(), options.file_mode);  // see create_temporary
    fsync_path(temporary, false);
    fs::rename(temporary, final_path);
    unpublished.path.clear();
    fsync_path(directory, true);
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
  const bool load_optimizer = options.load_optimizer_states && !options.load_module_only;
  Optimizer& optimizer = states_.optimizer();
  std::string tag;
  // Rank 0 checks the whole file against this model before any rank reads a byte of data: a file
  // that does not fit is refused here, with the reason, on every rank.
  on_rank0_everywhere(everyone, [&] {
    if (options.tag) {
      check_tag(*options.tag);
      tag = *options.tag;
    } else {
      const std::optional<std::string> latest = latest_checkpoint_tag(dir);
      ZT_CHECK_AS(IoError, latest.has_value(), "no checkpoint to load in '", dir, "': no file '", dir,
                  "/latest' (pass a tag, or save first)");
      tag = *latest;
    }
    const std::string path = checkpoint_file(dir, tag);
    ZT_CHECK_AS(IoError, fs::is_regular_file(path), "checkpoint file '", path, "' does not exist");
    const io::H5File file = io::H5File::open_serial(path);
    check_checkpoint_file(file);
    // The model must match the checkpoint: the same parameter names and global shapes...
    for (const GlobalParameter& parameter : global_) {
      const std::string name = "model/" + parameter.name;
      ZT_CHECK_AS(IoError, file.kind(name) == io::H5File::ObjectKind::dataset, "checkpoint '", path,
                  "' has no dataset '", name, "': it was saved from another model");
      const std::vector<std::int64_t> stored = file.shape(name);
      ZT_CHECK_AS(IoError, stored == parameter.shape, "checkpoint '", path, "' dataset '", name,
                  "' has shape ", base::shape_text(stored), " but the model's parameter has ",
                  base::shape_text(parameter.shape));
    }
    for (const nn::Parameter* parameter : frozen_) {
      const std::string name = "model/" + parameter->name;
      ZT_CHECK_AS(IoError, file.kind(name) == io::H5File::ObjectKind::dataset, "checkpoint '", path,
                  "' has no dataset '", name, "': it was saved from another model");
      const std::vector<std::int64_t> shape(parameter->value.shape().begin(), parameter->value.shape().end());
      ZT_CHECK_AS(IoError, file.shape(name) == shape, "checkpoint '", path, "' dataset '", name,
                  "' has shape ", base::shape_text(file.shape(name)), " but the model's parameter has ",
                  base::shape_text(shape));
    }
    ZT_CHECK_AS(IoError, file.int_attribute("model", "parameters") == global_parameter_count_, "checkpoint '",
                path, "' holds ", file.int_attribute("model", "parameters"),
                " parameter elements, the model ", global_parameter_count_,
                ": it was saved from another model");
    // ...and the same model settings (shapes alike, n_head different is another model).
    const std::vector<std::string> differences =
        model_config_differences(file.string_attribute("engine", "config"), state.config.to_json_string(0));
    if (!differences.empty()) {
      std::string listed;
      for (const std::string& difference : differences) listed += (listed.empty() ? "" : "; ") + difference;
      ZT_THROW_AS(IoError, "checkpoint '", path, "' was saved from another model configuration: ", listed,
                  ". Resume with the model it was saved from");
    }
    if (load_optimizer) {
      ZT_CHECK_AS(
          IoError, optimizer.state_names().empty() || file.kind("optimizer") == io::H5File::ObjectKind::group,
          "checkpoint '", path, "' has no optimizer state; load it with load_optimizer_states = false");
      if (file.kind("optimizer") == io::H5File::ObjectKind::group) {
        const std::string saved = file.string_attribute("optimizer", "type");
        ZT_CHECK_AS(IoError, saved == optimizer.name(), "checkpoint '", path,
                    "' holds the state of optimizer '", saved, "' but the engine runs '", optimizer.name(),
                    "'; load with load_optimizer_states = false to start the optimizer afresh");
      }
      for (std::string_view state_name : optimizer.state_names()) {
        for (const GlobalParameter& parameter : global_) {
          const std::string name = "optimizer/" + std::string(state_name) + "/" + parameter.name;
          if (saved_frozen(file, parameter.name)) continue;  // frozen when saved: its state starts at zero
          ZT_CHECK_AS(IoError, file.kind(name) == io::H5File::ObjectKind::dataset, "checkpoint '", path,
                      "' has no dataset '", name, "'");
          ZT_CHECK_AS(IoError, file.shape(name) == parameter.shape, "checkpoint '", path, "' dataset '", name,
                      "' has shape ", base::shape_text(file.shape(name)), " but the model's parameter has ",
                      base::shape_text(parameter.shape));
        }
      }
    }
  });
  tag = broadcast_string(everyone, tag);
  LoadResult result;
  result.tag = tag;
  result.path = checkpoint_file(dir, tag);

  io::H5File file = io::H5File::open_parallel(result.path, comm);
  const std::string& path = result.path;
  result.client_state = file.string_attribute("", "client_state");
  result.saved_world_size = file.int_attribute("engine", "world_size");
  result.saved_zero_stage = static_cast<int>(file.int_attribute("engine", "zero_stage"));
  const std::vector<FlatParameter>& layout = plan_.layout();

  // Checksums are summed over every rank for every dataset of the global layout (model, then each
  // optimizer state): each rank reads what it holds and counts its checkpoint range once (replicated
  // copies: the first tensor-parallel rank's; a tied copy: the stage that saves it), whatever it read.
  const Optimizer& loading_optimizer = states_.optimizer();
  std::vector<std::string> names;
  for (const GlobalParameter& parameter : global_) names.push_back("model/" + parameter.name);
  for (std::string_view state_name : loading_optimizer.state_names()) {
    for (const GlobalParameter& parameter : global_)
      names.push_back("optimizer/" + std::string(state_name) + "/" + parameter.name);
  }
  std::vector<std::uint64_t> sums(names.size(), 0);
  std::vector<char> verified(names.size(), 0);  // the group of names read (optimizer states may be skipped)
  auto add_checksum = [&](std::size_t group, std::size_t index, const float* values,
                          std::int64_t values_first) {
    const std::int64_t position = global_of_[index];
    if (position < 0) return;  // a tied copy: the stage that saves the parameter counts it
    const auto [first, count] = plan_.checkpoint_range(index);
    const std::size_t k = group * global_.size() + static_cast<std::size_t>(position);
    if (writes(index))
      sums[k] = io::range_checksum(values + (first - values_first), sizeof(float), first, count);
  };
  std::vector<float> values;
  std::vector<float> owned;
  // Parameters frozen when the checkpoint was saved have no optimizer state there.
  std::vector<char> state_skipped(names.size(), 0);
  for (std::size_t g = 0; g < global_.size(); ++g) {
    if (!saved_frozen(file, global_[g].name)) continue;
    for (std::size_t k = 0; k < loading_optimizer.state_names().size(); ++k)
      state_skipped[(1 + k) * global_.size() + g] = 1;
  }
  for (std::size_t i = 0; i < layout.size(); ++i) {
    const std::string name = "model/" + layout[i].name;
    const auto [held_first, held_count] = strategy_.held_range(i);
    values.assign(static_cast<std::size_t>(held_count), 0.0f);
    file.read_range(name, held_first, held_count, values.data(), DType::fp32);
    add_checksum(0, i, values.data(), held_first);
    strategy_.load_parameter(i, values.data());
    if (plan_.separate_master()) {
      // The master of the owned range, from what was read (the padding past the end stays zero).
      const auto [first, count] = owned_range(i);
      owned.assign(static_cast<std::size_t>(plan_.owned()[i].count), 0.0f);
      std::copy_n(values.data() + (first - held_first), count, owned.data());
      states_.write_master(i, owned.data());
    }
  }
  if (load_optimizer) {
    if (file.exists("optimizer")) optimizer.set_step_count(file.int_attribute("optimizer", "step"));
    const std::vector<std::string_view> state_names = optimizer.state_names();
    for (std::size_t k = 0; k < state_names.size(); ++k) {
      for (std::size_t i = 0; i < layout.size(); ++i) {
        const std::string name = "optimizer/" + std::string(state_names[k]) + "/" + layout[i].name;
        const auto [first, count] = owned_range(i);
        owned.assign(static_cast<std::size_t>(plan_.owned()[i].count), 0.0f);
        if (saved_frozen(file, layout[i].name)) {  // trained from here on: its state starts at zero
          states_.write_state(k, i, owned.data());
          continue;
        }
        file.read_range(name, first, count, owned.data(), DType::fp32);
        add_checksum(1 + k, i, owned.data(), first);
        states_.write_state(k, i, owned.data());
      }
    }
  }
  states_.flush();  // the last sub-group's changes reach the swap file
  // Frozen parameters: every rank reads the whole tensor and checks its checksum alone.
  for (nn::Parameter* parameter : frozen_) {
    const std::string name = "model/" + parameter->name;
    values.assign(static_cast<std::size_t>(parameter->value.numel()), 0.0f);
    file.read_range(name, 0, parameter->value.numel(), values.data(), DType::fp32);
    const std::uint64_t sum = io::range_checksum(values.data(), sizeof(float), 0, parameter->value.numel());
    ZT_CHECK_AS(IoError, sum == file.uint_attribute(name, "checksum"), "checkpoint '", path, "' dataset '",
                name, "' does not match its checksum (stored ", file.uint_attribute(name, "checksum"),
                ", computed ", sum, "): the file is corrupted");
    set_frozen_value(*parameter, values.data());
  }
  // Without the optimizer states only the model's datasets were read.
  const std::size_t checked = load_optimizer ? names.size() : global_.size();
  sums.resize(checked);
  sum_checksums(everyone, sums);
  for (std::size_t k = 0; k < checked; ++k) {
    if (state_skipped[k]) continue;
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
    const std::vector<GlobalDropout> dropouts = global_dropouts();
    ZT_CHECK_AS(IoError,
                file.int_attribute("engine", "dropout_streams") == static_cast<std::int64_t>(dropouts.size()),
                "checkpoint '", path, "' has ", file.int_attribute("engine", "dropout_streams"),
                " dropout streams, the model ", dropouts.size());
    // By name where the file has them (a dropout may sit on another stage than when saved), else in
    // the model's order (checkpoints of format 1 without pipeline stages).
    std::vector<std::string> saved_names;
    if (file.has_attribute("engine", "dropout_names")) {
      std::istringstream lines(file.string_attribute("engine", "dropout_names"));
      for (std::string line; std::getline(lines, line);) saved_names.push_back(line);
    }
    const std::int64_t row = everyone.rank() < table[0] ? everyone.rank() : 0;
    for (std::size_t d = 0; d < dropouts.size(); ++d) {
      if (dropouts[d].local == nullptr) continue;
      std::size_t column = d;
      if (!saved_names.empty()) {
        const auto found = std::find(saved_names.begin(), saved_names.end(), dropouts[d].name);
        ZT_CHECK_AS(IoError, found != saved_names.end(), "checkpoint '", path,
                    "' has no dropout stream for '", dropouts[d].name, "': it was saved from another model");
        column = static_cast<std::size_t>(found - saved_names.begin());
      }
      ZT_CHECK_AS(IoError, static_cast<std::int64_t>(column) < table[1], "checkpoint '", path,
                  "' names more dropout streams than 'engine/rng_streams' holds (", table[1], ")");
      dropouts[d].local->set_next_stream(streams[static_cast<std::size_t>(row * table[1]) + column]);
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
