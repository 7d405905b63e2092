// Engine::save_checkpoint / load_checkpoint on parallel HDF5 (docs/checkpoint-format.md).
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

#include "io/hdf5_file.hpp"
#include "kernels/nn_kernels.hpp"
#include "src/engine/parameter_gatherer.hpp"
#include "src/engine/parameter_store.hpp"
#include "src/engine/string_broadcast.hpp"
#include "src/engine/swapped_optimizer_states.hpp"
#include "zerotrain/engine.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/external_model.hpp"
#include "zerotrain/mpi_communicator.hpp"

namespace zt {
namespace fs = std::filesystem;

namespace {

using engine_detail::broadcast_string;

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
  ZT_CHECK_AS(IoError, fd >= 0, "cannot open '", path.string(), "' to sync it: ", std::strerror(errno));
  const int status = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  ZT_CHECK_AS(IoError, status == 0, "fsync of '", path.string(), "' failed: ", std::strerror(saved));
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

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
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

}  // namespace

std::pair<std::int64_t, std::int64_t> Engine::checkpoint_range(std::size_t index) const {
  const FlatParameter& slot = layout_[index];
  const int ranks = data_->size();
  const std::int64_t piece = stage_ >= 1 ? slot.piece_numel : (slot.numel + ranks - 1) / ranks;
  const std::int64_t first = std::min<std::int64_t>(data_->rank() * piece, slot.numel);
  return {first, std::clamp<std::int64_t>(slot.numel - first, 0, piece)};
}

std::string Engine::save_checkpoint(const std::string& dir, const SaveOptions& options) {
  Communicator& data = *data_;
  const MPI_Comm comm = native_mpi_comm(data);
  wait_for_all_ranks(comm, "save_checkpoint");
  const std::int64_t accumulation = batch().gradient_accumulation_steps;
  ZT_CHECK(
      !forward_pending_ && micro_steps_ % accumulation == 0, "save_checkpoint at micro-step ",
      micro_steps_ % accumulation, " of ", accumulation,
      ": save at an accumulation boundary (after the step() that updates), where no gradient is pending");
  const std::string tag = options.tag.value_or("global_step" + std::to_string(global_steps_));
  check_tag(tag);
  const std::string agreed_tag = broadcast_string(data, tag);
  std::int64_t mismatch = agreed_tag == tag ? 0 : 1;
  data.all_reduce(&mismatch, &mismatch, 1, DType::int64, ReduceOp::sum);
  ZT_CHECK(mismatch == 0, "save_checkpoint: the ranks passed different tags (rank 0: '", agreed_tag,
           "', rank ", data.rank(), ": '", tag, "')");

  const fs::path directory(dir);
  const fs::path final_path = checkpoint_file(dir, tag);
  fs::path temporary;
  on_rank0_everywhere(data, [&] {
    std::error_code error;
    if (!fs::exists(directory)) {
      fs::create_directories(directory, error);
      ZT_CHECK_AS(IoError, !error, "cannot create checkpoint directory '", dir, "': ", error.message());
      ::chmod(directory.c_str(), options.dir_mode);
    }
    ZT_CHECK_AS(IoError, fs::is_directory(directory), "checkpoint directory '", dir, "' is not a directory");
    ZT_CHECK_AS(IoError, ::access(directory.c_str(), W_OK) == 0, "checkpoint directory '", dir,
                "' is not writable: ", std::strerror(errno));
    // Temporaries of saves that died half-way (a killed job) are garbage: no save of this job runs.
    for (const fs::directory_entry& entry : fs::directory_iterator(directory)) {
      const std::string name = entry.path().filename().string();
      if (name.front() == '.' && name.find(".h5.tmp-") != std::string::npos) fs::remove(entry.path(), error);
    }
  });
  temporary =
      broadcast_string(data, (directory / ("." + tag + ".h5.tmp-" + std::to_string(::getpid()))).string());

  {
    io::H5File file = io::H5File::create_parallel(temporary.string(), comm);
    std::vector<std::string> names;
    std::vector<std::uint64_t> sums;
    auto write_piece = [&](const std::string& name, const FlatParameter& slot, std::size_t index,
                           const float* piece) {
      // `piece` holds this rank's owned range of the parameter (whole parameter at stage 0).
      const auto [first, count] = checkpoint_range(index);
      const float* source = stage_ == 0 ? piece + first : piece;
      file.create_dataset(name, std::vector<std::int64_t>(slot.shape.begin(), slot.shape.end()), DType::fp32);
      file.write_range(name, first, count, source, DType::fp32);
      names.push_back(name);
      sums.push_back(io::range_checksum(source, sizeof(float), first, count));
    };
    // With NVMe offload the master (16-bit training) and the states are read from the swap file,
    // one sub-group's array at a time (each is read once: pieces come in shard order).
    std::vector<float> swapped_piece;
    auto from_swap = [&](std::size_t array, std::size_t index) -> const float* {
      swapped_piece.resize(static_cast<std::size_t>(owned_[index].count));
      swapped_->read(array, owned_[index].shard_begin, owned_[index].count, swapped_piece.data());
      return swapped_piece.data();
    };
    for (std::size_t i = 0; i < layout_.size(); ++i) {
      write_piece("model/" + layout_[i].name, layout_[i], i,
                  master_in_swap_ ? from_swap(0, i) : master_of(owned_[i]));
    }
    if (const char* fault = std::getenv("ZT_FAULT_INJECTION");
        fault != nullptr && std::string_view(fault) == "kill_during_checkpoint_save" && data.rank() == 0) {
      // Test hook (docs/testing.md): die half-way through writing, as a node failure would.
      std::raise(SIGKILL);
    }
    const std::vector<std::string_view> states = optimizer_->state_names();
    for (std::size_t k = 0; k < states.size(); ++k) {
      for (std::size_t i = 0; i < layout_.size(); ++i) {
        write_piece(
            "optimizer/" + std::string(states[k]) + "/" + layout_[i].name, layout_[i], i,
            swapped_ ? from_swap(swapped_array_of_state(k), i) : optimizer_->state(states[k], i).data());
      }
    }
    if (swapped_) swapped_->flush();  // releases the read cache
    // Every rank's dropout streams, one row per rank.
    const std::vector<nn::Dropout*> dropouts = dropouts_of(model_);
    const std::int64_t streams = std::max<std::int64_t>(1, static_cast<std::int64_t>(dropouts.size()));
    std::vector<std::uint64_t> row(static_cast<std::size_t>(streams), 0);
    for (std::size_t d = 0; d < dropouts.size(); ++d) row[d] = dropouts[d]->next_stream();
    file.create_dataset("engine/rng_streams", {data.size(), streams}, DType::int64);
    file.write_range("engine/rng_streams", data.rank() * streams, streams, row.data(), DType::int64);
    names.push_back("engine/rng_streams");
    sums.push_back(io::range_checksum(row.data(), sizeof(std::uint64_t), data.rank() * streams, streams));

    sum_checksums(data, sums);
    for (std::size_t k = 0; k < names.size(); ++k) file.set_attribute(names[k], "checksum", sums[k]);

    file.set_attribute("", "format", std::string(kCheckpointFormat));
    file.set_attribute("", "format_version", kCheckpointFormatVersion);
    file.set_attribute("", "tag", tag);
    file.set_attribute("", "client_state", options.client_state);
    const std::string engine_group = "engine";
    file.set_attribute(engine_group, "global_steps", global_steps_);
    file.set_attribute(engine_group, "global_samples", global_samples_);
    file.set_attribute(engine_group, "skipped_steps", skipped_steps_);
    file.set_attribute(engine_group, "world_size", static_cast<std::int64_t>(data.size()));
    file.set_attribute(engine_group, "zero_stage", static_cast<std::int64_t>(stage_));
    file.set_attribute(engine_group, "compute_dtype", std::string(dtype_name(compute_dtype_)));
    file.set_attribute(engine_group, "train_batch_size", batch().train_batch_size);
    file.set_attribute(engine_group, "parameters", parameter_count_);
    file.set_attribute(engine_group, "config", config_.to_json_string(0));
    file.set_attribute(engine_group, "dropout_streams", static_cast<std::int64_t>(dropouts.size()));
    const LossScalerState scaler = loss_scaler_.state();
    file.set_attribute(engine_group, "loss_scale", scaler.cur_scale);
    file.set_attribute(engine_group, "loss_scaler_iter", scaler.cur_iter);
    file.set_attribute(engine_group, "loss_scaler_last_overflow_iter", scaler.last_overflow_iter);
    file.set_attribute(engine_group, "loss_scaler_hysteresis", scaler.cur_hysteresis);
    file.set_attribute(engine_group, "loss_scaler_skipped_steps", scaler.skipped_steps);
    file.set_attribute(engine_group, "lr_scheduler_last_batch_iteration",
                       scheduler_ ? scheduler_->state().last_batch_iteration : std::int64_t{-1});
    file.set_attribute(engine_group, "has_data_position",
                       static_cast<std::int64_t>(options.data_position ? 1 : 0));
    const DataPosition position = options.data_position.value_or(DataPosition{});
    file.set_attribute(engine_group, "data_seed", position.seed);
    file.set_attribute(engine_group, "data_num_samples", position.num_samples);
    file.set_attribute(engine_group, "data_epoch", position.epoch);
    file.set_attribute(engine_group, "data_offset", position.offset);
    if (file.exists("optimizer")) {
      file.set_attribute("optimizer", "type", std::string(optimizer_->name()));
      file.set_attribute("optimizer", "step", optimizer_->step_count());
    }
    file.set_attribute("model", "parameters", parameter_count_);
    file.close();
  }

  // Publish: sync the data, give it its name, then point latest at it.
  on_rank0_everywhere(data, [&] {
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

LoadResult Engine::load_checkpoint(const std::string& dir, const LoadOptions& options) {
  Communicator& data = *data_;
  const MPI_Comm comm = native_mpi_comm(data);
  wait_for_all_ranks(comm, "load_checkpoint");
  std::string tag;
  on_rank0_everywhere(data, [&] {
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
  tag = broadcast_string(data, tag);
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

  // The model must match the checkpoint: same parameter names and shapes.
  for (const FlatParameter& slot : layout_) {
    const std::string name = "model/" + slot.name;
    ZT_CHECK_AS(IoError, file.exists(name), "checkpoint '", path, "' has no dataset '", name,
                "': it was saved from another model");
    const std::vector<std::int64_t> stored = file.shape(name);
    const std::vector<std::int64_t> expected(slot.shape.begin(), slot.shape.end());
    ZT_CHECK_AS(IoError, stored == expected, "checkpoint '", path, "' dataset '", name, "' has shape ",
                shape_text(stored), " but the model's parameter has ", shape_text(expected));
  }
  ZT_CHECK_AS(IoError, file.int_attribute("model", "parameters") == parameter_count_, "checkpoint '", path,
              "' holds ", file.int_attribute("model", "parameters"), " parameter elements, the model ",
              parameter_count_, ": it was saved from another model");

  std::vector<std::string> names;
  std::vector<std::uint64_t> sums;
  const std::size_t element = dtype_size(compute_dtype_);
  // Parameters: stages 0-2 keep every parameter, so every rank reads whole ones; stage 3 reads its
  // pieces. The checksum counts each rank's checkpoint range once, whatever was read.
  for (std::size_t i = 0; i < layout_.size(); ++i) {
    const FlatParameter& slot = layout_[i];
    const std::string name = "model/" + slot.name;
    const auto [first, count] = checkpoint_range(i);
    const OwnedRange& owned = owned_[i];
    if (stage_ <= 2) {
      std::vector<float> whole(static_cast<std::size_t>(slot.numel));
      file.read_range(name, 0, slot.numel, whole.data(), DType::fp32);
      sums.push_back(io::range_checksum(whole.data() + first, sizeof(float), first, count));
      kernels::convert(default_stream(Device::host()), whole.data(), DType::fp32,
                       parameters_.as<std::byte>() + static_cast<std::size_t>(slot.offset) * element,
                       compute_dtype_, slot.numel);
      if (keeps_separate_master()) {
        const std::int64_t begin = stage_ == 0 ? 0 : data.rank() * slot.piece_numel;
        const std::int64_t real = std::clamp<std::int64_t>(slot.numel - begin, 0, owned.count);
        if (master_in_swap_) {
          std::vector<float> piece(static_cast<std::size_t>(owned.count), 0.0f);
          std::copy_n(whole.data() + begin, real, piece.data());
          swapped_->write(0, owned.shard_begin, owned.count, piece.data());
        } else {
          std::fill_n(master_of(owned), owned.count, 0.0f);
          std::copy_n(whole.data() + begin, real, master_of(owned));
        }
      }
    } else {
      std::vector<float> piece(static_cast<std::size_t>(owned.count), 0.0f);
      file.read_range(name, first, count, piece.data(), DType::fp32);
      sums.push_back(io::range_checksum(piece.data(), sizeof(float), first, count));
      if (master_in_swap_) {
        swapped_->write(0, owned.shard_begin, owned.count, piece.data());
      } else if (keeps_separate_master()) {
        std::copy(piece.begin(), piece.end(), master_of(owned));
      }
      // The piece goes where stage 3 keeps it: the shard in host memory, or the parameter swap file.
      std::vector<std::byte> converted(static_cast<std::size_t>(owned.count) * element);
      kernels::convert(default_stream(Device::host()), piece.data(), DType::fp32, converted.data(),
                       compute_dtype_, owned.count);
      parameter_store_->write(i, converted.data());
    }
    names.push_back(name);
  }
  const bool load_optimizer = options.load_optimizer_states && !options.load_module_only;
  if (load_optimizer) {
    ZT_CHECK_AS(IoError, optimizer_->state_names().empty() || file.exists("optimizer"), "checkpoint '", path,
                "' has no optimizer state; load it with load_optimizer_states = false");
    if (file.exists("optimizer")) {
      const std::string saved = file.string_attribute("optimizer", "type");
      ZT_CHECK_AS(IoError, saved == optimizer_->name(), "checkpoint '", path,
                  "' holds the state of optimizer '", saved, "' but the engine runs '", optimizer_->name(),
                  "'; load with load_optimizer_states = false to start the optimizer afresh");
      optimizer_->set_step_count(file.int_attribute("optimizer", "step"));
    }
    const std::vector<std::string_view> states = optimizer_->state_names();
    std::vector<float> swapped_piece;  // NVMe offload: read here, then written to the swap file
    for (std::size_t k = 0; k < states.size(); ++k) {
      for (std::size_t i = 0; i < layout_.size(); ++i) {
        const std::string name = "optimizer/" + std::string(states[k]) + "/" + layout_[i].name;
        ZT_CHECK_AS(IoError, file.exists(name), "checkpoint '", path, "' has no dataset '", name, "'");
        const auto [first, count] = checkpoint_range(i);
        if (swapped_) swapped_piece.resize(static_cast<std::size_t>(owned_[i].count));
        std::span<float> target =
            swapped_ ? std::span<float>(swapped_piece) : optimizer_->state(states[k], i);
        std::fill(target.begin(), target.end(), 0.0f);
        if (stage_ == 0) {
          file.read_range(name, 0, layout_[i].numel, target.data(), DType::fp32);
          sums.push_back(io::range_checksum(target.data() + first, sizeof(float), first, count));
        } else {
          file.read_range(name, first, count, target.data(), DType::fp32);
          sums.push_back(io::range_checksum(target.data(), sizeof(float), first, count));
        }
        if (swapped_)
          swapped_->write(swapped_array_of_state(k), owned_[i].shard_begin, owned_[i].count, target.data());
        names.push_back(name);
      }
    }
  }
  if (swapped_) swapped_->flush();  // the last sub-group's changes reach the swap file
  sum_checksums(data, sums);
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
    const std::int64_t row = data.rank() < table[0] ? data.rank() : 0;
    for (std::size_t d = 0; d < dropouts.size(); ++d) {
      dropouts[d]->set_next_stream(streams[static_cast<std::size_t>(row * table[1]) + d]);
    }
    global_steps_ = file.int_attribute("engine", "global_steps");
    global_samples_ = file.int_attribute("engine", "global_samples");
    skipped_steps_ = file.int_attribute("engine", "skipped_steps");
    micro_steps_ = global_steps_ * batch().gradient_accumulation_steps;
    LossScalerState scaler;
    scaler.cur_scale = file.double_attribute("engine", "loss_scale");
    scaler.cur_iter = file.int_attribute("engine", "loss_scaler_iter");
    scaler.last_overflow_iter = file.int_attribute("engine", "loss_scaler_last_overflow_iter");
    scaler.cur_hysteresis = file.int_attribute("engine", "loss_scaler_hysteresis");
    scaler.skipped_steps = file.int_attribute("engine", "loss_scaler_skipped_steps");
    loss_scaler_.load_state(scaler);
    if (scheduler_ && options.load_lr_scheduler_states) {
      scheduler_->load_state({file.int_attribute("engine", "lr_scheduler_last_batch_iteration")});
    }
    if (file.int_attribute("engine", "has_data_position") != 0) {
      result.data_position = DataPosition{
          file.uint_attribute("engine", "data_seed"), file.uint_attribute("engine", "data_num_samples"),
          file.uint_attribute("engine", "data_epoch"), file.uint_attribute("engine", "data_offset")};
    }
  }
  file.close();

  // No gradient survives a load; stage 3's resident parameters are gathered from the new pieces.
  if (stage_ <= 1) std::memset(gradients_.data(), 0, gradients_.size());
  accumulated_loss_ = 0.0;
  accumulated_micro_batches_ = 0;
  step_started_ = false;
  if (gatherer_) gatherer_->refresh_persistent();
  if (external_ != nullptr) copy_parameters_out();
  return result;
}

}  // namespace zt
