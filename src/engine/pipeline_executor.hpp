// Runs one stage's pipeline schedule (pipeline_schedule.hpp): the instructions in order, the
// stage's compute through the engine's callbacks, activations and gradients to and from the
// neighbouring stages over the pipeline group's non-blocking send/recv. Internal to the engine
// (docs/pipeline.md).
//
// Messages between stage s and s + 1, in the order the schedules produce them (MPI keeps the order
// of messages with the same tag between two ranks):
//   - once per run, before the first activation: the activation's shape and dtype (every
//     micro-batch of a run must match them; a mismatch is an error on the sending stage);
//   - activations forward, gradients of the same shape backward.
// The shape travels over the pipeline group's host communicator (MPI), the tensors over the one for
// the engine's device.
// On the host a stage posts its next receive as soon as the previous one completed, so the
// transfer overlaps the compute in between. On a device a send completes only once its receive is
// posted (NCCL, the emulated device), so a send and the receive right after it from the same
// neighbour start together as one exchange (exchanges_with_next, Communicator::isend_irecv), which
// keeps 1F1B's steady state from deadlocking (check_pipe_schedules, rendezvous_with_exchanges).
//
// The stage's time (PipelineTiming): on the host, the clock around its forwards and backwards
// (busy) and around its waits for the neighbours (idle). On a device the host only queues the work
// and waits for little, so both come from the compute stream's timeline instead (StreamMarks):
// busy, the device's time from each forward's or backward's first work to its last; idle, the rest
// of the time from the run's start to its last backward's end (the stream waiting for activations
// and gradients, or for the host to queue more).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <vector>

#include "kernels/stream_marks.hpp"
#include "src/engine/pipeline_schedule.hpp"
#include "zerotrain/communicator.hpp"
#include "zerotrain/engine.hpp"
#include "zerotrain/execution.hpp"
#include "zerotrain/tensor.hpp"

namespace zt::engine_detail {

/// What a schedule's instructions do on this stage, provided by the engine.
struct PipelineStageWork {
  /// Micro-batch i of the step: inputs on the first stage, targets on the last.
  std::function<Batch(std::int64_t micro_batch)> load;
  /// The stage's forward of micro-batch i from `input` (the loaded inputs on the first stage, the
  /// received activation elsewhere); on the last stage `batch` holds the targets for the loss.
  /// Returns the stage's output.
  std::function<Tensor(const Tensor& input, std::int64_t micro_batch, const Batch& batch)> forward;
  /// The stage's backward of micro-batch i from the gradient of its output (undefined on the last
  /// stage: the loss gives it). Returns the gradient of the stage's input.
  std::function<Tensor(const Tensor& grad_output, std::int64_t micro_batch)> backward;
  std::function<void()> reduce_tied_gradients;
  std::function<void()> reduce_gradients;
  std::function<void()> optimizer_step;
};

class PipelineExecutor {
 public:
  /// The most dimensions an activation between stages may have.
  static constexpr std::size_t kMaxShapeDims = 8;

  /// `pipeline`: the pipeline group's communicator for buffers of `execution`'s device (rank = stage);
  /// `pipeline_host`: the same group's for host buffers (the same one when the engine is on the host).
  PipelineExecutor(Communicator& pipeline, Communicator& pipeline_host, const ExecutionContext& execution,
                   int stage, int stages);

  /// Run `schedule` (this stage's) with `work`; returns the stage's busy and idle time.
  PipelineTiming run(const PipeSchedule& schedule, const PipelineStageWork& work);

 private:
  struct Buffer {
    std::int64_t micro_batch = -1;
    Batch batch;
    Tensor input;       // loaded or received
    Tensor output;      // the stage's output (sent to the next stage), then the gradient received for it
    Tensor grad_input;  // the backward's gradient of the input, to send to the previous stage
  };
  struct PendingReceive {
    std::int64_t micro_batch = -1;
    Tensor tensor;
    Work work;
    Tensor sent;  // an exchange's outgoing tensor, held until the exchange completes
  };

  void send_activation(const Tensor& activation, std::int64_t micro_batch, std::size_t position);
  void send_gradient(const Tensor& gradient, std::int64_t micro_batch, std::size_t position);
  /// `tensor` to `peer`: alone, or with the receive at `position` + 1 as one exchange.
  void send(const Tensor& tensor, int peer, int tag, std::size_t position);
  void send_shape_once(const Tensor& activation, std::int64_t micro_batch);
  void receive_shape_once();
  /// The receive buffer and peer for the instruction at `position` (recv_activation or recv_gradient).
  PendingReceive prepare_receive(std::size_t position);
  std::optional<PendingReceive>& pending_of(PipeOp op);
  /// Post the receive of the first activation / gradient the schedule expects at or after `from`.
  void post_next_receive(PipeOp op, std::size_t from);
  Tensor take_receive(std::optional<PendingReceive>& pending, PipeOp op, std::size_t position,
                      std::int64_t micro_batch);
  void complete_sends(bool all);
  /// On a device: a mark on the compute stream before a forward or backward, and after it.
  void begin_compute();
  void end_compute();
  /// The run's busy and idle time from the compute stream's marks (waits for the last).
  PipelineTiming device_timing();

  Communicator& pipeline_;
  Communicator& pipeline_host_;
  const ExecutionContext& execution_;
  int stage_;
  int stages_;
  bool post_early_;  // receives may be posted ahead (host MPI: they do not block)
  bool exchanges_;   // sends wait for their receive (a device communicator): pair them
  std::optional<kernels::StreamMarks> device_marks_;  // on a device: its compute stream's timeline

  // Per run:
  const PipeSchedule* schedule_ = nullptr;
  double idle_seconds_ = 0;
  std::vector<std::pair<std::size_t, std::size_t>> compute_marks_;  // each forward's and backward's
  bool sent_shape_ = false;
  std::array<std::int64_t, 2 + kMaxShapeDims> sent_shape_message_{};
  Work shape_send_;
  Shape sent_shape_value_;
  DType sent_dtype_ = DType::fp32;
  std::optional<Shape> received_shape_;
  DType received_dtype_ = DType::fp32;
  Shape output_shape_;  // of this stage's output: the shape of the gradients it receives
  DType output_dtype_ = DType::fp32;
  std::optional<PendingReceive> next_activation_;
  std::optional<PendingReceive> next_gradient_;
  std::deque<std::pair<Work, Tensor>> sends_;  // in flight, with the tensor they read
};

}  // namespace zt::engine_detail
