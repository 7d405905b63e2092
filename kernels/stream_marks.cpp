#include "kernels/stream_marks.hpp"

#include <chrono>

#include "kernels/device_backend.hpp"
#include "kernels/emulated_device.hpp"
#include "zerotrain/error.hpp"

namespace zt::kernels {

namespace {
double clock_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

StreamMarks::StreamMarks(const Stream& stream) : stream_(stream) {}

StreamMarks::~StreamMarks() {
  for (void* event : events_) detail::cuda_event_destroy(event);
}

std::size_t StreamMarks::mark() {
  const std::size_t index = count_;
  if (stream_.device().is_cuda()) {
    if (index == events_.size())
      events_.push_back(detail::cuda_event_create(stream_.device().index, detail::EventTiming::kept));
    detail::cuda_event_record(events_[index], stream_.native());
  } else {
    // A fresh slot each time: a mark forgotten by clear() may still be queued, and writes its own.
    ClockMark clock{.seconds = std::make_shared<double>(0.0)};
    const std::uint64_t queue = detail::emulated_queue_of(stream_);
    if (queue == 0) {
      *clock.seconds = clock_seconds();  // the host's stream, or a stream whose work runs at once
    } else {
      detail::emulated_enqueue(queue, [seconds = clock.seconds] { *seconds = clock_seconds(); });
      clock.queue_position = detail::emulated_queue_position(queue);
    }
    if (index == clocks_.size()) {
      clocks_.push_back(std::move(clock));
    } else {
      clocks_[index] = std::move(clock);
    }
  }
  return count_++;
}

double StreamMarks::seconds_between(std::size_t from, std::size_t to) {
  ZT_CHECK(from <= to && to < count_, "StreamMarks::seconds_between(", from, ", ", to, ") of ", count_,
           " marks on ", stream_.device().str());
  if (stream_.device().is_cuda()) {
    detail::cuda_event_synchronize(events_[to]);
    return detail::cuda_event_seconds(events_[from], events_[to]);
  }
  const std::uint64_t queue = detail::emulated_queue_of(stream_);
  if (queue != 0) detail::emulated_run_until(queue, clocks_[to].queue_position);
  return *clocks_[to].seconds - *clocks_[from].seconds;
}

}  // namespace zt::kernels
