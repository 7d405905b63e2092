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
// On the host a stage posts its next receive as soon as the previous one completed, so the
// transfer overlaps the compute in between.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <vector>

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
  /// `pipeline`: the pipeline group's communicator for buffers of `execution`'s device (rank = stage).
  PipelineExecutor(Communicator& pipeline, const ExecutionContext& execution, int stage, int stages);

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
  };

  void send_activation(const Tensor& activation, std::int64_t micro_batch);
  Tensor receive_activation(std::int64_t micro_batch);
  void send_gradient(const Tensor& gradient, std::int64_t micro_batch);
  Tensor receive_gradient(std::int64_t micro_batch);
  /// Post the receive of the first activation / gradient the schedule expects at or after `from`.
  void post_next_receive(PipeOp op, std::size_t from);
  Tensor take_receive(std::optional<PendingReceive>& pending, PipeOp op, std::size_t position,
                      std::int64_t micro_batch);
  void complete_sends(bool all);

  Communicator& pipeline_;
  const ExecutionContext& execution_;
  int stage_;
  int stages_;
  bool post_early_;  // receives may be posted ahead (host MPI: they do not block)

  // Per run:
  const PipeSchedule* schedule_ = nullptr;
  double idle_seconds_ = 0;
  bool sent_shape_ = false;
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
