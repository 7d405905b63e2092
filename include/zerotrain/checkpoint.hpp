// Checkpoints on parallel HDF5: one file per tag, written collectively, loadable at any world size
// and ZeRO stage (docs/checkpoint-format.md).
//
//   engine->save_checkpoint("ckpt", {.client_state = R"({"epoch": 3})", .data_position = data->position()});
//   zt::LoadResult loaded = engine->load_checkpoint("ckpt");          // the tag in ckpt/latest
//   data->restore(*loaded.data_position);
//
// The file holds the global, logical state: every parameter by name and shape (fp32 master),
// the optimizer's state per parameter, the engine's counters, scaler, schedule, every rank's RNG
// streams, the sampler position, the config and the client's JSON. Each dataset carries a checksum
// that does not depend on how ranks split it, and one checksum covers every attribute; every reader
// checks the file's structure before it reads data, and loads verify the checksums. A save locks
// the directory for the saving job (docs/checkpoint-format.md, "The directory lock").
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "zerotrain/data.hpp"
#include "zerotrain/dtype.hpp"

namespace zt {

inline constexpr const char* kCheckpointFormat = "zerotrain-checkpoint";
/// 2: every attribute is covered by the root attribute `attributes_checksum`, /model records its
/// tensor count and /optimizer its state names (docs/checkpoint-format.md). Version 1 files load.
inline constexpr std::int64_t kCheckpointFormatVersion = 2;

struct SaveOptions {
  /// Default: "global_step<N>" with N the engine's global steps.
  std::optional<std::string> tag;
  /// Any JSON text; returned by load_checkpoint as given.
  std::string client_state = "{}";
  /// The sampler's position (TrainingData::position()), restored for an exact resume.
  std::optional<DataPosition> data_position;
  /// Newest tags to keep in the directory (older ones are removed after the save); 0 keeps all.
  std::int64_t keep_last = 0;
  /// Permission bits of the file and of a directory the save creates.
  std::uint32_t file_mode = 0640;
  std::uint32_t dir_mode = 0750;
  /// The Slurm job that saves (zt::train passes SLURM_JOB_ID), recorded as /engine attribute
  /// slurm_job_id when not empty, so that a job can tell its own checkpoints from another's.
  std::string slurm_job_id;
};

struct LoadOptions {
  /// Default: the tag named in DIR/latest.
  std::optional<std::string> tag;
  bool load_optimizer_states = true;
  bool load_lr_scheduler_states = true;
  /// Parameters only: no optimizer state, counters, scaler, schedule or data position.
  bool load_module_only = false;
};

struct LoadResult {
  std::string tag;
  std::string path;
  std::string client_state;
  std::optional<DataPosition> data_position;
  std::int64_t saved_world_size = 0;
  int saved_zero_stage = 0;
};

/// Whether `tag` can name a checkpoint: 1 to 200 printable ASCII characters without '/', '\\' or
/// spaces, not starting with '.', not "latest".
bool is_checkpoint_tag(const std::string& tag);
/// DIR/TAG.h5.
std::string checkpoint_file(const std::string& dir, const std::string& tag);
/// The tag DIR/latest names, if the file exists (and is not empty); throws zt::IoError when it
/// holds anything but one tag name (is_checkpoint_tag): a path, a NUL byte, several lines.
std::optional<std::string> latest_checkpoint_tag(const std::string& dir);
/// Finished checkpoint tags in DIR (files TAG.h5, not temporaries), newest global step first.
std::vector<std::string> checkpoint_tags_newest_first(const std::string& dir);

struct CheckpointSummary;

/// The newest checkpoint in DIR that verifies (verify_checkpoint) and passes `also_check` (which
/// throws zt::Error to refuse one): the tag in DIR/latest first, then the others newest first (what
/// `--resume auto` loads). Skipped ones, and a `latest` that names no tag, are reported on stderr.
/// One process; no MPI collective.
std::optional<std::string> newest_valid_checkpoint(
    const std::string& dir, const std::function<void(const CheckpointSummary&)>& also_check = {});

/// One dataset of a checkpoint file.
struct CheckpointDataset {
  std::string name;
  std::vector<std::int64_t> shape;
  std::uint64_t checksum = 0;
  std::string dtype = "fp32";  // element type as stored: fp32, or int64 (engine/rng_streams)
};

struct CheckpointSummary {
  std::string path;
  std::string tag;
  std::int64_t format_version = 0;
  std::int64_t global_steps = 0;
  std::int64_t global_samples = 0;
  std::int64_t world_size = 0;
  int zero_stage = 0;
  std::string compute_dtype;
  std::string optimizer;
  std::int64_t optimizer_step = 0;
  std::int64_t parameters = 0;                // elements of the model's parameters
  std::string client_state;                   // the JSON text given to save_checkpoint
  std::string slurm_job_id;                   // the Slurm job that saved it; empty: saved outside Slurm
  std::optional<DataPosition> data_position;  // when the save was given one
  std::uint64_t file_bytes = 0;
  std::vector<CheckpointDataset> datasets;
};

/// What a checkpoint file holds (one process; no MPI collective), after the checks every reader
/// makes before reading data (format version, hard links only, attribute checksum, the full set of
/// datasets with readable layouts); throws zt::IoError naming the file and the problem.
CheckpointSummary inspect_checkpoint(const std::string& path);
/// inspect_checkpoint's checks, then read every dataset and compare its checksum; throws
/// zt::IoError naming the file and the first problem (a dataset that does not match, or cannot be read).
void verify_checkpoint(const std::string& path);
/// Write the parameters, by the model's names and shapes, to a plain HDF5 file OUT (datasets at
/// the root; fp32, or bf16 stored as uint16 bit patterns with attribute dtype = "bf16").
void export_checkpoint(const std::string& path, const std::string& out, DType dtype = DType::fp32);

}  // namespace zt
