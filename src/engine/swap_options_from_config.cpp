#include "src/engine/swap_options_from_config.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <utility>

namespace zt::engine_detail {
namespace {

std::size_t non_negative(std::int64_t value) {
  return static_cast<std::size_t>(std::max<std::int64_t>(value, 0));
}

}  // namespace

SwapOptions swap_options_from_config(const AioConfig& aio, std::filesystem::path nvme_path) {
  SwapOptions options;
  options.nvme_path = std::move(nvme_path);
  options.block_size = non_negative(aio.block_size);
  options.queue_depth = non_negative(aio.queue_depth);
  options.intra_op_parallelism = non_negative(aio.intra_op_parallelism);
  options.single_submit = aio.single_submit;
  options.overlap_events = aio.overlap_events;
  const char* buffered = std::getenv("ZT_SWAP_BUFFERED_IO");
  options.allow_buffered_io = buffered != nullptr && std::string_view(buffered) == "1";
  if (const char* backend = std::getenv("ZT_SWAP_BACKEND"))
    options.backend = swap_backend_from_string(backend);
  return options;
}

}  // namespace zt::engine_detail
