// Bucketed gradient reduction (see gradient_reducer.hpp).
#include "src/engine/gradient_reducer.hpp"
#include "base/seconds_since.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "kernels/nn_kernels.hpp"
#include "zerotrain/error.hpp"

namespace zt::engine_detail {

using base::Clock;
using base::seconds_since;
namespace {

std::byte* at(void* base, std::int64_t elements, DType dtype) {
  return static_cast<std::byte*>(base) + static_cast<std::size_t>(elements) * dtype_size(dtype);
}

}  // namespace

GradientReducer::GradientReducer(Communicator& communicator, const ExecutionContext& execution,
                                 const std::vector<FlatParameter>& layout, GradientReducerOptions options,
                                 void* destination)
    : communicator_(communicator),
      execution_(execution),
      layout_(layout),
      options_(options),
      destination_(static_cast<std::byte*>(destination)),
      ranks_(communicator.size()),
      rank_(communicator.rank()) {
  ZT_CHECK(options_.bucket_capacity > 0 &&
               (!partitioned() || options_.bucket_region * ranks_ == options_.bucket_capacity),
           "GradientReducer: bucket capacity ", options_.bucket_capacity, " with regions of ",
           options_.bucket_region, " for ", ranks_, " ranks");
  capacity_ = options_.bucket_capacity;
  region_ = options_.bucket_region;
}

GradientReducer::~GradientReducer() = default;

std::int64_t GradientReducer::footprint(std::size_t index) const {
  return partitioned() ? layout_[index].piece_numel : layout_[index].numel;
}

void GradientReducer::begin(bool accumulate) {
  ZT_CHECK(in_flight_.empty() && !has_open_, "GradientReducer::begin while a pass is still open");
  accumulate_ = accumulate;
}

void GradientReducer::open_bucket() {
  const std::size_t allowed_buffers = options_.overlap ? 2 : 1;
  // One buffer fills while at most (allowed - 1) are in flight: wait for the oldest to reuse it.
  if (free_staging_.empty() && !in_flight_.empty() && in_flight_.size() + 1 >= allowed_buffers) wait_oldest();
  open_ = Bucket{};
  if (!free_staging_.empty()) {
    open_.staging = std::move(free_staging_.back());
    free_staging_.pop_back();
  } else {
    open_.staging = execution_.empty({capacity_}, options_.wire_dtype, MemoryCategory::comm_buffers);
  }
  has_open_ = true;
}

void GradientReducer::add(std::size_t index, const void* gradient, DType gradient_dtype, bool add_to_shard) {
  ZT_CHECK(index < layout_.size(), "GradientReducer::add: parameter index ", index, " out of range");
  const FlatParameter& parameter = layout_[index];
  if (!partitioned()) {
    const std::int64_t size = footprint(index);
    if (has_open_ && open_.used + size > capacity_) launch_open_bucket();
    if (!has_open_) open_bucket();
    const DType wire = options_.wire_dtype;
    kernels::convert(execution_.compute(), gradient, gradient_dtype,
                     at(open_.staging.raw_data(), open_.used, wire), wire, parameter.numel);
    open_.members.push_back({.index = index, .offset = open_.used, .count = parameter.numel});
    open_.used += size;
    return;
  }
  const auto* values = static_cast<const std::byte*>(gradient);
  for (std::int64_t piece_offset = 0; piece_offset < parameter.piece_numel;) {
    const std::int64_t length = begin_range(index, piece_offset, add_to_shard);
    for (int q = 0; q < ranks_; ++q) {
      write_range(q,
                  values + static_cast<std::size_t>(q * parameter.piece_numel + piece_offset) *
                               dtype_size(gradient_dtype),
                  gradient_dtype);
    }
    end_range();
    piece_offset += length;
  }
}

std::int64_t GradientReducer::begin_range(std::size_t index, std::int64_t piece_offset, bool add_to_shard) {
  ZT_CHECK(index < layout_.size(), "GradientReducer::begin_range: parameter index ", index, " out of range");
  ZT_CHECK(partitioned() && !writing_, "GradientReducer::begin_range: ",
           partitioned() ? "the previous range is not ended" : "the destination is not partitioned");
  const std::int64_t piece = layout_[index].piece_numel;
  ZT_CHECK(piece_offset >= 0 && piece_offset < piece, "GradientReducer::begin_range: offset ", piece_offset,
           " in a piece of ", piece);
  if (has_open_ && open_.used >= region_) launch_open_bucket();
  if (!has_open_) open_bucket();
  const std::int64_t length = std::min(piece - piece_offset, region_ - open_.used);
  open_.members.push_back({.index = index,
                           .offset = open_.used,
                           .piece_offset = piece_offset,
                           .count = length,
                           .add_to_shard = add_to_shard});
  writing_ = true;
  return length;
}

void GradientReducer::write_range(int q, const void* values, DType dtype) {
  ZT_CHECK(writing_ && q >= 0 && q < ranks_, "GradientReducer::write_range: piece ", q, " of ", ranks_,
           writing_ ? "" : " outside begin_range/end_range");
  // Rank q's range of this parameter goes to rank q's region; the padding past numel is zero.
  const Member& member = open_.members.back();
  const FlatParameter& parameter = layout_[member.index];
  const DType wire = options_.wire_dtype;
  const std::int64_t first = q * parameter.piece_numel + member.piece_offset;
  const std::int64_t real = std::clamp<std::int64_t>(parameter.numel - first, 0, member.count);
  std::byte* target = at(open_.staging.raw_data(), q * region_ + member.offset, wire);
  if (real > 0) kernels::convert(execution_.compute(), values, dtype, target, wire, real);
  if (real < member.count)
    execution_.zero(at(target, real, wire), static_cast<std::size_t>(member.count - real) * dtype_size(wire));
}

void GradientReducer::end_range() {
  ZT_CHECK(writing_, "GradientReducer::end_range without begin_range");
  open_.used += open_.members.back().count;
  writing_ = false;
}

void GradientReducer::launch_open_bucket() {
  if (!has_open_) return;
  has_open_ = false;
  Bucket bucket = std::move(open_);
  if (bucket.used == 0) {
    free_staging_.push_back(std::move(bucket.staging));
    return;
  }
  const DType wire = options_.wire_dtype;
  void* staging = bucket.staging.raw_data();
  const auto count = static_cast<std::size_t>(bucket.used);
  if (partitioned()) {
    // Close the gaps between the rank regions of a bucket that is not full: the reduce-scatter
    // takes ranks x used contiguous elements. Ascending order never overwrites a region not yet moved.
    if (bucket.used < region_) {
      for (int q = 1; q < ranks_; ++q) {
        execution_.move(at(staging, q * bucket.used, wire), at(staging, q * region_, wire),
                        count * dtype_size(wire));
      }
    }
  }
  const auto started = Clock::now();
  bucket.work = partitioned() ? communicator_.ireduce_scatter(staging, staging, count, wire, options_.op)
                              : communicator_.iall_reduce(staging, staging, count, wire, options_.op);
  if (!options_.overlap) {
    bucket.work.wait();
    wait_seconds_ += seconds_since(started);
    complete(bucket);
    return;
  }
  in_flight_.push_back(std::move(bucket));
}

void GradientReducer::complete(Bucket& bucket) {
  const DType wire = options_.wire_dtype;
  const DType target_dtype = options_.gradient_dtype;
  void* staging = bucket.staging.raw_data();
  for (const Member& member : bucket.members) {
    const FlatParameter& parameter = layout_[member.index];
    const std::byte* reduced = at(staging, member.offset, wire);
    switch (options_.destination) {
      case GradientDestination::flat_whole:
        kernels::convert(execution_.compute(), reduced, wire,
                         at(destination_, parameter.offset, target_dtype), target_dtype, parameter.numel);
        break;
      case GradientDestination::flat_own_piece:
        kernels::convert(
            execution_.compute(), reduced, wire,
            at(destination_, parameter.offset + rank_ * parameter.piece_numel + member.piece_offset,
               target_dtype),
            target_dtype, member.count);
        break;
      case GradientDestination::shard: {
        std::byte* target = at(destination_, parameter.shard_offset + member.piece_offset, target_dtype);
        if (!accumulate_ && !member.add_to_shard) {
          kernels::convert(execution_.compute(), reduced, wire, target, target_dtype, member.count);
        } else if (wire == target_dtype) {
          kernels::accumulate(execution_.compute(), target_dtype, target, reduced, member.count);
        } else {
          Tensor converted = execution_.empty({member.count}, target_dtype, MemoryCategory::comm_buffers);
          kernels::convert(execution_.compute(), reduced, wire, converted.raw_data(), target_dtype,
                           member.count);
          kernels::accumulate(execution_.compute(), target_dtype, target, converted.raw_data(), member.count);
        }
        break;
      }
    }
  }
  free_staging_.push_back(std::move(bucket.staging));
}

void GradientReducer::wait_oldest() {
  if (in_flight_.empty()) return;
  const auto started = Clock::now();
  in_flight_.front().work.wait();
  wait_seconds_ += seconds_since(started);
  complete(in_flight_.front());
  in_flight_.pop_front();
}

void GradientReducer::poll() {
  while (!in_flight_.empty() && in_flight_.front().work.test()) {
    complete(in_flight_.front());
    in_flight_.pop_front();
  }
}

void GradientReducer::finish() {
  ZT_CHECK(!writing_, "GradientReducer::finish while a range is being written");
  launch_open_bucket();
  while (!in_flight_.empty()) wait_oldest();
}

}  // namespace zt::engine_detail
