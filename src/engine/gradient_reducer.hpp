// Gradient reduction across data-parallel ranks in buckets, started as gradients become final
// during backward (ZeRO stages 0-3). Internal to the engine.
//
// Each parameter's gradient is copied into the open bucket's staging buffer when it is final (split
// over buckets when it does not fit, stages 1-3); a full
// bucket (reduce_bucket_size elements) is reduced at once, non-blocking when overlap_comm is set, so
// that it travels while the rest of backward computes. Stage 0 all-reduces the bucket; stages 1-3
// pack it rank-major (rank r's pieces of every member together) and reduce-scatter it, so each rank
// receives the reduced pieces of the parameters it owns (FlatParameter in src/engine/partition_plan.hpp).
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "src/engine/partition_plan.hpp"
#include "zerotrain/communicator.hpp"
#include "zerotrain/engine.hpp"
#include "zerotrain/execution.hpp"
#include "zerotrain/tensor.hpp"

namespace zt::engine_detail {

/// Where the reduced gradient goes.
enum class GradientDestination : std::uint8_t {
  flat_whole,      // stage 0: the whole reduced gradient, at the parameter's place in the flat buffer
  flat_own_piece,  // stage 1: this rank's reduced piece, at its place in the flat buffer
  shard,           // stages 2-3: this rank's reduced piece, into the contiguous gradient shard
};

struct GradientReducerOptions {
  GradientDestination destination = GradientDestination::flat_whole;
  DType gradient_dtype = DType::fp32;  // of the destination
  DType wire_dtype = DType::fp32;      // communication_data_type
  ReduceOp op = ReduceOp::avg;
  /// Elements of one staging buffer, and of each rank's region in it when the destination is
  /// partitioned (the partition plan's reduce_bucket_capacity / reduce_bucket_region).
  std::int64_t bucket_capacity = 0;
  std::int64_t bucket_region = 0;
  bool overlap = false;  // overlap_comm: reduce while backward continues
};

class GradientReducer {
 public:
  /// `destination` is the flat gradient buffer (stages 0-1) or the gradient shard (stages 2-3), in
  /// options.gradient_dtype, laid out as `layout` says.
  GradientReducer(Communicator& communicator, const ExecutionContext& execution,
                  const std::vector<FlatParameter>& layout, GradientReducerOptions options,
                  void* destination);
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  /// Start a pass (one backward). accumulate: add the reduced pieces into the shard (later
  /// micro-batches of an optimizer step); otherwise overwrite it.
  void begin(bool accumulate);
  /// The gradient of parameter `index` is final: copy it (numel elements, any floating dtype) into
  /// the open bucket; a full bucket is launched. `gradient` may be freed when this returns.
  /// add_to_shard: with the shard as destination, add the reduced piece to it even in a pass that
  /// overwrites (a parameter's second contribution in one backward, e.g. a tied embedding's).
  /// Partitioned, a parameter whose pieces do not fit the open bucket's regions is split over
  /// several buckets (piece-local ranges: the same range of every rank's piece).
  void add(std::size_t index, const void* gradient, DType gradient_dtype, bool add_to_shard = false);
  /// The same range by range (stages 1-3; a streamed gradient, nn::GradientSink): begin_range opens
  /// the range of every rank's piece that starts at `piece_offset` and returns its length L (at
  /// least 1, at most what the open bucket's regions have left); then write_range for every rank q
  /// with elements [q piece + piece_offset, min(numel, q piece + piece_offset + L)) of the gradient
  /// (nothing past numel; `values` may be freed when it returns); then end_range.
  std::int64_t begin_range(std::size_t index, std::int64_t piece_offset, bool add_to_shard);
  void write_range(int q, const void* values, DType dtype);
  void end_range();
  /// Let in-flight reductions progress (MPI moves non-blocking collectives only inside MPI calls)
  /// and finish the completed ones.
  void poll();
  /// Launch the open bucket and wait for every reduction; the results are in the destination.
  void finish();

  /// Time blocked waiting for reductions since construction.
  double wait_seconds() const { return wait_seconds_; }
  /// Elements of one staging buffer; the reducer keeps at most two (one filling, one in flight).
  std::int64_t staging_elements() const { return capacity_; }

 private:
  /// A parameter's gradient in a bucket: whole (stage 0), or a range of every rank's piece.
  struct Member {
    std::size_t index = 0;
    std::int64_t offset = 0;        // in the bucket (stage 0) or in each rank region
    std::int64_t piece_offset = 0;  // stages 1-3: where the range starts in the piece
    std::int64_t count = 0;         // elements (stage 0: numel; else the range's length)
    bool add_to_shard = false;      // add into the shard rather than overwrite it
  };
  struct Bucket {
    Tensor staging;  // wire dtype
    std::vector<Member> members;
    std::int64_t used = 0;  // elements per rank region (stages 1-3) or in total (stage 0)
    Work work;
  };

  bool partitioned() const { return options_.destination != GradientDestination::flat_whole; }
  std::int64_t footprint(std::size_t index) const;  // of one parameter in a bucket region
  void open_bucket();
  void launch_open_bucket();
  void complete(Bucket& bucket);
  void wait_oldest();

  Communicator& communicator_;
  const ExecutionContext& execution_;  // staging buffers, conversions and copies on its device
  const std::vector<FlatParameter>& layout_;
  GradientReducerOptions options_;
  std::byte* destination_;
  int ranks_;
  int rank_;
  std::int64_t capacity_ = 0;  // elements of a staging buffer
  std::int64_t region_ = 0;    // stages 1-3: elements per rank region (capacity_ / ranks)
  bool accumulate_ = false;
  std::vector<Tensor> free_staging_;
  std::deque<Bucket> in_flight_;
  Bucket open_;
  bool has_open_ = false;
  bool writing_ = false;  // between begin_range and end_range (the open bucket's last member)
  double wait_seconds_ = 0.0;
};

}  // namespace zt::engine_detail
