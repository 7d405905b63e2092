// Sub-groups through a ring of buffers: read ahead, work, write behind.
#include <algorithm>

#include "base/seconds_since.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/swap.hpp"

namespace zt {
using base::Clock;
using base::seconds_since;

SwapPipeline::SwapPipeline(SwapEngine& engine, std::vector<std::string> tensor_names,
                           std::size_t buffer_count, MemoryCategory category)
    : engine_(engine), names_(std::move(tensor_names)) {
  ZT_CHECK(buffer_count >= 1, "SwapPipeline needs at least one buffer (3 overlap reading, work and writing)");
  std::size_t largest = 0;
  for (const std::string& name : names_) largest = std::max(largest, engine_.slot(name).bytes);
  buffer_count = std::min(buffer_count, std::max<std::size_t>(names_.size(), 1));
  for (std::size_t i = 0; i < buffer_count; ++i)
    buffers_.push_back(engine_.allocate_buffer(largest, category));
}

SwapPipeline::Stats SwapPipeline::run(const Work& work, bool write_back) {
  const std::size_t groups = names_.size();
  const std::size_t buffer_count = buffers_.size();
  // Group g lives in buffer g % buffer_count. Reading ahead by `lookahead` groups leaves one buffer
  // for the write of the previous group; with 2 buffers the read of i+1 waits for the write of i-1,
  // with 1 everything runs in turn.
  std::size_t lookahead = buffer_count >= 3 ? buffer_count - 2 : buffer_count - 1;
  if (!write_back) lookahead = buffer_count - 1;

  std::vector<SwapHandle> reads(groups);
  std::vector<SwapHandle> writes(groups);
  Stats stats;
  const Clock::time_point start = Clock::now();
  auto wait_counted = [&](SwapHandle& handle) {
    if (!handle.valid()) return;
    const Clock::time_point begin = Clock::now();
    engine_.wait(handle);
    handle = {};
    stats.stalled_seconds += seconds_since(begin);
  };
  std::size_t next_read = 0;
  auto read_ahead_to = [&](std::size_t last) {
    for (; next_read <= last && next_read < groups; ++next_read) {
      if (next_read >= buffer_count) wait_counted(writes[next_read - buffer_count]);  // buffer still busy
      reads[next_read] = engine_.swap_in(names_[next_read], buffers_[next_read % buffer_count].data());
    }
  };

  try {
    for (std::size_t group = 0; group < groups; ++group) {
      read_ahead_to(group + lookahead);
      wait_counted(reads[group]);
      Buffer& buffer = buffers_[group % buffer_count];
      const Clock::time_point work_start = Clock::now();
      work(group, std::span<std::byte>(buffer.as<std::byte>(), engine_.slot(names_[group]).bytes));
      stats.work_seconds += seconds_since(work_start);
      if (write_back) writes[group] = engine_.swap_out(names_[group], buffer.data());
    }
    for (SwapHandle& handle : writes) wait_counted(handle);
  } catch (...) {
    // The buffers outlive this call, but the caller's next run must not race with our I/O.
    for (auto* handles : {&reads, &writes}) {
      for (SwapHandle& handle : *handles) {
        if (!handle.valid()) continue;
        try {
          engine_.wait(handle);
        } catch (const IoError&) {  // the first error is the one that propagates
        }
      }
    }
    throw;
  }
  stats.wall_seconds = seconds_since(start);
  return stats;
}

}  // namespace zt
