// The engine's ds_config "aio" section as io's SwapOptions: io knows swap files, not the config.
#pragma once

#include <filesystem>

#include "zerotrain/config.hpp"
#include "zerotrain/swap.hpp"

namespace zt::engine_detail {

/// SwapOptions for a swap file under `nvme_path` (an offload section's nvme_path) with the "aio"
/// section's block size, queue depth, I/O threads and submission flags. The environment variables
/// ZT_SWAP_BACKEND (auto, io_uring, libaio, posix) and ZT_SWAP_BUFFERED_IO=1 (allow the page cache
/// where O_DIRECT is refused) override the backend and allow_buffered_io. rank and job_id keep
/// their defaults (the MPI_COMM_WORLD rank; host, pid, counter).
SwapOptions swap_options_from_config(const AioConfig& aio, std::filesystem::path nvme_path);

}  // namespace zt::engine_detail
