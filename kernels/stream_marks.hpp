// Points on one stream's timeline, for timing the work between two of them where it runs. On a GPU
// the host only queues the work, so a host clock around a forward measures the launches, not the
// forward: the pipeline stages' busy and idle time on a device come from here (pipeline_executor.cpp).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "zerotrain/device.hpp"

namespace zt::kernels {

/// Marks recorded in a stream's order, read once the stream has passed them:
/// - a CUDA stream: timing events, the device's time between two (cudaEventElapsedTime);
/// - the emulated device: a queued item that reads the host's clock when the queue runs it;
/// - the host (work runs at the call): the clock at the call.
/// The events are kept across clear() for reuse. Not thread-safe; the stream must outlive it.
class StreamMarks {
 public:
  explicit StreamMarks(const Stream& stream);
  ~StreamMarks();
  StreamMarks(const StreamMarks&) = delete;
  StreamMarks& operator=(const StreamMarks&) = delete;

  /// A mark after the work queued on the stream so far; returns its index (0, 1, ... since clear()).
  std::size_t mark();
  /// Seconds on the stream's timeline from mark `from` to mark `to` (from <= to), once the stream has
  /// reached `to`, which this waits for.
  double seconds_between(std::size_t from, std::size_t to);
  std::size_t size() const { return count_; }
  /// Forgets the marks (the stream need not have reached them).
  void clear() { count_ = 0; }

 private:
  /// Where an emulated or host mark's time goes: written when the mark is reached.
  struct ClockMark {
    std::shared_ptr<double> seconds;
    std::uint64_t queue_position = 0;  // the emulated queue's position after the mark
  };

  const Stream& stream_;
  std::size_t count_ = 0;
  std::vector<void*> events_;      // CUDA: timing events, one per mark index, reused
  std::vector<ClockMark> clocks_;  // host and emulated: one per mark index, reused
};

}  // namespace zt::kernels
