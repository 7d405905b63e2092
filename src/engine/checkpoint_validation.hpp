// What every reader of a checkpoint checks before it reads any data (docs/checkpoint-format.md,
// "What a reader checks"): `zerotrain checkpoint inspect`, `verify` and `export`, and the engine's
// load (rank 0, before the collective read). Internal to the engine.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/hdf5_file.hpp"

namespace zt::engine_detail {

/// The root attribute holding the checksum of every other attribute (format version 2).
inline constexpr const char* kAttributesChecksumKey = "attributes_checksum";
/// The first format version whose files carry the attribute checksum and the dataset counts.
inline constexpr std::int64_t kFirstFormatWithAttributeChecksum = 2;

/// A checkpoint file's own consistency, without a model: the format and its version; hard links
/// only; the attribute checksum (version 2); every object one of the expected kind (the groups
/// /model, /engine, /optimizer/<state>, datasets below them, nothing else); every dataset a
/// readable array (io::H5File::dataset_layout) of the element type its place needs (fp32, int64 for
/// engine/rng_streams); the full set of datasets (as many model tensors and elements as /model
/// records, every optimizer state with exactly the model's names and shapes, the states /optimizer
/// lists, rng_streams of [world_size, dropout streams]); the engine's counters and data position
/// in range. Throws zt::IoError naming the file and what is wrong. Returns the format version.
std::int64_t check_checkpoint_file(const io::H5File& file);

/// The keys (`model.n_head`, ...) of the "model" sections of two configs (as JSON text) that differ,
/// each with both values: "model.n_head: 4 in the checkpoint, 2 in this run". Empty when they agree
/// or when either has no model section (a model built by the caller).
std::vector<std::string> model_config_differences(const std::string& saved_config_json,
                                                  const std::string& current_config_json);

}  // namespace zt::engine_detail
