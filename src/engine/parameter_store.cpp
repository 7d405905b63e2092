// ZeRO-3's parameter shard in host memory or on NVMe (see parameter_store.hpp).
#include "src/engine/parameter_store.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>

#include "base/seconds_since.hpp"
#include "zerotrain/error.hpp"

namespace zt::engine_detail {

using base::Clock;
using base::seconds_since;

ParameterStore::ParameterStore(const std::vector<FlatParameter>& layout, DType dtype, std::byte* shard,
                               const ExecutionContext& execution)
    : layout_(layout), execution_(execution), engine_(execution), dtype_(dtype), pieces_(layout.size()) {
  const std::size_t element = dtype_size(dtype_);
  for (std::size_t i = 0; i < layout_.size(); ++i) {
    pieces_[i].host = shard + static_cast<std::size_t>(layout_[i].shard_offset) * element;
    pieces_[i].bytes = static_cast<std::size_t>(layout_[i].piece_numel) * element;
    host_elements_ += layout_[i].piece_numel;
  }
}

ParameterStore::ParameterStore(const std::vector<FlatParameter>& layout, const ParameterStoreOptions& options,
                               const std::byte* initial_shard, const ExecutionContext& engine)
    : layout_(layout),
      execution_(ExecutionContext::host()),
      engine_(engine),
      dtype_(options.dtype),
      pieces_(layout.size()) {
  ZT_CHECK(options.swap.has_value() || options.max_in_cpu == std::numeric_limits<std::int64_t>::max(),
           "ParameterStore: without swap options every piece must be kept in host memory");
  ZT_CHECK_AS(ConfigError, options.buffer_count >= 1, "zero_optimization.offload_param.buffer_count is ",
              options.buffer_count, "; expected >= 1 (pieces read from NVMe at once)");
  ZT_CHECK_AS(ConfigError, options.max_in_cpu >= 0, "zero_optimization.offload_param.max_in_cpu is ",
              options.max_in_cpu, "; expected >= 0 (parameter elements kept in host memory)");
  const std::size_t element = dtype_size(dtype_);
  const std::vector<char> in_host = pieces_kept_in_host(layout_, options.max_in_cpu);
  std::size_t largest_swapped = 0;  // index
  std::size_t swapped = 0;
  for (std::size_t i = 0; i < layout_.size(); ++i) {
    const std::int64_t piece = layout_[i].piece_numel;
    pieces_[i].bytes = static_cast<std::size_t>(piece) * element;
    if (in_host[i] != 0) {
      host_elements_ += piece;
    } else {
      nvme_elements_ += piece;
      if (swapped == 0 || piece > layout_[largest_swapped].piece_numel) largest_swapped = i;
      ++swapped;
    }
  }
  if (swapped > 0) {
    const FlatParameter& largest = layout_[largest_swapped];
    ZT_CHECK_AS(ConfigError, options.buffer_elements >= largest.piece_numel,
                "zero_optimization.offload_param.buffer_size is ", options.buffer_elements,
                " elements, but this rank's piece of parameter '", largest.name, "' (", largest.numel,
                " elements split over the data-parallel ranks) has ", largest.piece_numel,
                ": raise buffer_size to at least ", largest.piece_numel,
                " (or keep more parameters in host memory with max_in_cpu)");
  }
  // The swap file exists even when every piece fits in host memory: a bad nvme_path fails now,
  // not when the model grows. Without swap options (offload_param "cpu" on a device) there is none.
  if (options.swap) swap_ = std::make_unique<SwapEngine>(*options.swap);
  if (host_elements_ > 0) {
    const std::size_t bytes = static_cast<std::size_t>(host_elements_) * element;
    if (options.pin_memory && engine_.device() != execution_.device()) {
      // As DeepSpeed's pinned parameter partitions. The whole shard may be more than the system lets
      // a process lock (ulimit -l, a container's limit): then pageable memory, copied synchronously.
      try {
        host_ = engine_.allocate_pinned_host(bytes, MemoryCategory::parameters);
        kept_pinned_ = true;
      } catch (const CudaError& error) {
        std::fprintf(stderr,
                     "zerotrain: warning: offload_param.pin_memory: %zu bytes of parameter pieces could not "
                     "be page-locked (%s); they stay in pageable memory, copied to the device synchronously "
                     "(raise the locked-memory limit, ulimit -l, or set pin_memory false)\n",
                     bytes, error.what());
      }
    }
    if (!kept_pinned_) host_ = execution_.allocate(bytes, MemoryCategory::parameters);
    kept_copied_ = Event(engine_.device());
  }
  std::size_t host_offset = 0;
  std::vector<std::pair<std::string, std::size_t>> swapped_pieces;
  for (std::size_t i = 0; i < layout_.size(); ++i) {
    if (in_host[i]) {
      pieces_[i].host = host_.as<std::byte>() + host_offset;
      host_offset += pieces_[i].bytes;
    } else {
      pieces_[i].swap_name = "parameter." + layout_[i].name;
      swapped_pieces.emplace_back(pieces_[i].swap_name, pieces_[i].bytes);
    }
  }
  // One reservation for all: a disk too small fails now, with the size the whole file needs.
  if (swap_) swap_->register_tensors(swapped_pieces);
  if (swapped > 0) {
    const std::size_t buffer_bytes = pieces_[largest_swapped].bytes;
    pool_.resize(std::min(options.buffer_count, swapped));
    for (PoolBuffer& buffer : pool_) {
      buffer.memory = swap_->allocate_buffer(buffer_bytes, MemoryCategory::parameters);
      buffer.copied = Event(engine_.device());
    }
  }
  // The first values come from the engine's shard, on its device (initialization: a host wait per
  // piece is fine).
  for (std::size_t i = 0; i < layout_.size(); ++i) {
    std::byte* target = update_target(i);
    engine_.to_host(target, initial_shard + static_cast<std::size_t>(layout_[i].shard_offset) * element,
                    pieces_[i].bytes);
    commit(i);
  }
  finish_updates();
  stats_ = {};  // the initial writes are not training traffic
}

ParameterStore::~ParameterStore() {
  // The kept pieces and the pool's buffers must not be freed under requests or device copies still
  // in flight.
  try {
    wait_for_kept_copies();
  } catch (const std::exception&) {  // an error nobody waited for: the run is over anyway
  }
  if (!swap_) return;
  try {
    for (PoolBuffer& buffer : pool_) wait_for_device_copy(buffer);
    swap_->wait_all();
  } catch (const std::exception&) {  // an error nobody waited for: the run is over anyway
  }
}

std::uint64_t ParameterStore::buffer_bytes() const {
  std::uint64_t bytes = 0;
  for (const PoolBuffer& buffer : pool_) bytes += buffer.memory.size();
  return bytes;
}

void ParameterStore::check_index(std::size_t index, const char* what) const {
  ZT_CHECK(index < pieces_.size(), "ParameterStore::", what, ": parameter ", index, " of ", pieces_.size());
}

ParameterStore::PoolBuffer* ParameterStore::buffer_of(std::size_t index) {
  for (PoolBuffer& buffer : pool_) {
    if (buffer.state != BufferState::free && buffer.piece == index) return &buffer;
  }
  return nullptr;
}

void ParameterStore::set_state(PoolBuffer& buffer, BufferState state) {
  buffer.state = state;
  buffer.stamp = ++clock_;
}

void ParameterStore::complete(PoolBuffer& buffer) {
  const bool was_write = buffer.state == BufferState::writing;
  const SwapHandle io = std::exchange(buffer.io, SwapHandle());
  set_state(buffer, BufferState::free);  // a failed request leaves nothing valid behind
  swap_->wait(io);                       // throws zt::IoError naming the file and offset
  set_state(buffer, BufferState::ready);
  if (was_write) buffer.used = true;
}

ParameterStore::PoolBuffer& ParameterStore::take_buffer() {
  auto oldest = [this](auto&& pick) -> PoolBuffer* {
    PoolBuffer* found = nullptr;
    for (PoolBuffer& buffer : pool_) {
      if (pick(buffer) && (found == nullptr || buffer.stamp < found->stamp)) found = &buffer;
    }
    return found;
  };
  PoolBuffer* chosen = oldest([](const PoolBuffer& b) { return b.state == BufferState::free; });
  if (chosen == nullptr)
    chosen = oldest([](const PoolBuffer& b) { return b.state == BufferState::ready && b.used; });
  if (chosen == nullptr) {
    chosen = oldest([](const PoolBuffer& b) { return b.state == BufferState::writing; });
    if (chosen != nullptr) {
      const auto started = Clock::now();
      complete(*chosen);
      stats_.write_wait_seconds += seconds_since(started);
    }
  }
  if (chosen == nullptr) {  // a piece read ahead and not used yet: its read is wasted
    chosen = oldest([](const PoolBuffer& b) { return b.state == BufferState::ready; });
    if (chosen == nullptr) {
      chosen = oldest([](const PoolBuffer& b) { return b.state == BufferState::reading; });
      if (chosen != nullptr) complete(*chosen);
    }
  }
  ZT_CHECK(chosen != nullptr, "ParameterStore: all ", pool_.size(),
           " offload_param buffers hold pieces in use; none is left for another");
  set_state(*chosen, BufferState::free);
  chosen->used = false;
  wait_for_device_copy(*chosen);  // every caller puts new bytes into it
  return *chosen;
}

void ParameterStore::wait_for_kept_copies() {
  if (!kept_copy_pending_) return;
  const auto started = Clock::now();
  kept_copied_.synchronize();
  stats_.copy_wait_seconds += seconds_since(started);
  kept_copy_pending_ = false;
}

void ParameterStore::wait_for_device_copy(PoolBuffer& buffer) {
  if (!buffer.copy_pending) return;
  // Usually long done: the buffer was released by a gather of an earlier module.
  const auto started = Clock::now();
  buffer.copied.synchronize();
  stats_.copy_wait_seconds += seconds_since(started);
  buffer.copy_pending = false;
}

bool ParameterStore::prefetch(std::size_t index, bool speculative) {
  check_index(index, "prefetch");
  if (!on_nvme(index) || buffer_of(index) != nullptr) return true;
  // Writes that finished make their buffers reusable without waiting.
  for (PoolBuffer& buffer : pool_) {
    if (buffer.state == BufferState::writing && buffer.io.ready()) complete(buffer);
  }
  PoolBuffer* chosen = nullptr;
  std::size_t reusable_count = 0;
  for (PoolBuffer& buffer : pool_) {
    const bool reusable =
        buffer.state == BufferState::free || (buffer.state == BufferState::ready && buffer.used);
    reusable_count += reusable;
    if (reusable && (chosen == nullptr || buffer.stamp < chosen->stamp)) chosen = &buffer;
  }
  if (chosen == nullptr || (speculative && reusable_count < 2)) return false;  // no buffer to spare
  wait_for_device_copy(*chosen);
  chosen->piece = index;
  chosen->used = false;
  chosen->io = swap_->swap_in(pieces_[index].swap_name, chosen->memory.data());
  set_state(*chosen, BufferState::reading);
  ++stats_.reads;
  stats_.bytes_read += pieces_[index].bytes;
  return true;
}

bool ParameterStore::ready(std::size_t index) {
  check_index(index, "ready");
  if (!on_nvme(index)) return true;
  const PoolBuffer* buffer = buffer_of(index);
  if (buffer == nullptr) return false;
  return buffer->state != BufferState::reading || buffer->io.ready();
}

const std::byte* ParameterStore::acquire(std::size_t index) {
  check_index(index, "acquire");
  if (!on_nvme(index)) return pieces_[index].host;
  PoolBuffer* buffer = buffer_of(index);
  ZT_CHECK(buffer == nullptr || buffer->state != BufferState::held, "ParameterStore: parameter '",
           layout_[index].name, "' is acquired twice");
  if (buffer == nullptr) {
    buffer = &take_buffer();
    buffer->piece = index;
    buffer->io = swap_->swap_in(pieces_[index].swap_name, buffer->memory.data());
    set_state(*buffer, BufferState::reading);
    ++stats_.reads;
    stats_.bytes_read += pieces_[index].bytes;
  }
  if (buffer->state == BufferState::reading || buffer->state == BufferState::writing) {
    if (!buffer->io.ready()) ++stats_.reads_waited;
    const auto started = Clock::now();
    complete(*buffer);
    stats_.read_wait_seconds += seconds_since(started);
  } else {
    ++stats_.cache_hits;
  }
  set_state(*buffer, BufferState::held);
  buffer->used = true;
  return buffer->memory.as<std::byte>();
}

bool ParameterStore::copy_to_device(std::size_t index, void* destination) {
  const std::byte* source = acquire(index);
  bool on_transfer_stream = false;
  if (device() == engine_.device()) {
    engine_.copy(destination, source, pieces_[index].bytes);
  } else if (PoolBuffer* buffer = buffer_of(index); buffer != nullptr) {
    // From a pool buffer (pinned with pin_memory): on the transfer stream, so that the compute
    // stream's kernels do not wait behind it; the copy runs on after this returns, and the event
    // keeps the buffer's bytes until it is done.
    engine_.from_host_async(destination, source, pieces_[index].bytes);
    buffer->copied.record(engine_.transfer());
    buffer->copy_pending = true;
    on_transfer_stream = true;
  } else if (kept_pinned_) {
    // A page-locked kept piece: the same, the event keeping its bytes until the copy is done (the
    // last copy's event covers every earlier one: one stream).
    engine_.from_host_async(destination, source, pieces_[index].bytes);
    kept_copied_.record(engine_.transfer());
    kept_copy_pending_ = true;
    on_transfer_stream = true;
  } else {
    // Pageable kept pieces (the optimizer step writes them from the host at any time): read at
    // once, ordered on the compute stream.
    engine_.from_host(destination, source, pieces_[index].bytes);
  }
  release(index);
  return on_transfer_stream;
}

void ParameterStore::release(std::size_t index) {
  check_index(index, "release");
  if (!on_nvme(index)) return;
  PoolBuffer* buffer = buffer_of(index);
  ZT_CHECK(buffer != nullptr && buffer->state == BufferState::held, "ParameterStore: parameter '",
           layout_[index].name, "' is released without being acquired");
  set_state(*buffer, BufferState::ready);
}

std::byte* ParameterStore::update_target(std::size_t index) {
  check_index(index, "update_target");
  if (!on_nvme(index)) {
    wait_for_kept_copies();  // a gather may still be copying the old value to the device
    return pieces_[index].host;
  }
  PoolBuffer* buffer = buffer_of(index);
  if (buffer != nullptr && buffer->state == BufferState::held) return buffer->memory.as<std::byte>();
  if (buffer != nullptr) {
    wait_for_device_copy(*buffer);  // a gather may still be copying the old value to the device
    // Its old value is about to be replaced: let the read or write in flight finish first.
    if (buffer->state == BufferState::reading || buffer->state == BufferState::writing) {
      const auto started = Clock::now();
      complete(*buffer);
      stats_.write_wait_seconds += seconds_since(started);
    }
  } else {
    buffer = &take_buffer();
    buffer->piece = index;
  }
  set_state(*buffer, BufferState::held);
  buffer->used = true;
  return buffer->memory.as<std::byte>();
}

void ParameterStore::commit(std::size_t index) {
  check_index(index, "commit");
  if (!on_nvme(index)) return;
  PoolBuffer* buffer = buffer_of(index);
  ZT_CHECK(buffer != nullptr && buffer->state == BufferState::held, "ParameterStore: parameter '",
           layout_[index].name, "' is committed without update_target");
  buffer->io = swap_->swap_out(pieces_[index].swap_name, buffer->memory.data());
  set_state(*buffer, BufferState::writing);
  stats_.bytes_written += pieces_[index].bytes;
}

void ParameterStore::finish_updates() {
  const auto started = Clock::now();
  for (PoolBuffer& buffer : pool_) {
    if (buffer.state == BufferState::writing) complete(buffer);
  }
  stats_.write_wait_seconds += seconds_since(started);
}

void ParameterStore::write(std::size_t index, const void* source) {
  execution_.from_host(update_target(index), source, pieces_[index].bytes);
  commit(index);
  if (PoolBuffer* buffer = buffer_of(index); buffer != nullptr) complete(*buffer);
}

void ParameterStore::read(std::size_t index, void* destination) {
  execution_.to_host(destination, acquire(index), pieces_[index].bytes);
  release(index);
}

}  // namespace zt::engine_detail
