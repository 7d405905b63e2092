// Pipeline schedules as data: the instructions one stage of a pipeline runs for one optimizer step
// (training) or one batch (inference), which an executor runs in order (DeepSpeed's PipeSchedule).
// Keeping them data lets the tests check order, buffers and deadlock freedom without running a
// model, and lets the executor check the schedules it is handed (check_pipe_schedules).
//
// Micro-batches are numbered 0 .. m-1. A stage keeps the activations of a micro-batch in one of
// its `buffers` activation buffers from the instruction that fills it (load or receive) until the
// last instruction of that micro-batch (its backward, or the send of its input gradient).
//
// A forward of micro-batch i on stage s:
//   first stage: load_micro_batch (inputs); other stages: recv_activation;
//   last stage:  load_micro_batch (targets) just before the forward (one load on a one-stage pipeline);
//   forward; then, unless last, send_activation.
// A backward of micro-batch i: unless last, recv_gradient; backward; unless first, send_gradient.
//
// Schedules (p stages, stage s, m micro-batches):
//   1F1B (PipeDream-flush, DeepSpeed's TrainSchedule): w = min(p - s - 1, m) warm-up forwards, then
//     m - w steady pairs (forward of the next micro-batch, backward of the oldest), then w cool-down
//     backwards; min(p - s, m) buffers (the most micro-batches in flight), micro-batch i in buffer
//     i % buffers.
//   GPipe: all m forwards, then all m backwards; m buffers, micro-batch i in buffer i.
//   Both train schedules end with reduce_tied_gradients, reduce_gradients, optimizer_step.
//   Inference: the forwards only; min(2, m) buffers, micro-batch i in buffer i % buffers.
// Backwards run in micro-batch order in both train schedules.
//
// Communication model (what check_pipe_schedules assumes and an executor must provide): sends do
// not block (the executor waits for a send before its buffer is filled again), receives block, and
// messages between two neighbouring stages arrive in the order they were sent.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace zt::engine_detail {

enum class PipeOp : std::uint8_t {
  load_micro_batch,       // inputs on the first stage, targets on the last
  recv_activation,        // from stage - 1
  forward,                //
  send_activation,        // to stage + 1
  recv_gradient,          // of this stage's output, from stage + 1
  backward,               //
  send_gradient,          // of this stage's input, to stage - 1
  reduce_tied_gradients,  // sum tied parameters' gradients between their stages
  reduce_gradients,       // across the stage's data-parallel group
  optimizer_step,         //
};

/// One instruction; `buffer` and `micro_batch` are -1 for the step's reduce and update.
struct PipeInstruction {
  PipeOp op;
  int buffer = -1;
  int micro_batch = -1;
  bool operator==(const PipeInstruction&) const = default;
};

enum class PipeScheduleKind : std::uint8_t { one_f_one_b, gpipe, inference };

/// The instructions of one stage and the number of activation buffers they use (ids 0 .. buffers-1).
struct PipeSchedule {
  std::vector<PipeInstruction> instructions;
  int buffers = 0;
};

/// The schedule of `stage` of `stages` for `micro_batches` micro-batches. Stages below 1, a stage
/// outside [0, stages) or micro_batches below 1 are a zt::ConfigError.
PipeSchedule make_pipe_schedule(PipeScheduleKind kind, int stages, int stage, int micro_batches);

/// "forward(buffer 1, micro-batch 3)"; "optimizer_step" for the instructions without a buffer.
std::string describe(const PipeInstruction& instruction);
/// The op's name as in the enum: "recv_activation".
std::string_view pipe_op_name(PipeOp op);
/// The kind's config name: "1f1b", "gpipe", "inference".
std::string_view pipe_schedule_kind_name(PipeScheduleKind kind);
/// The kind named `name` ("1f1b", "gpipe", "inference"); nullopt for any other name.
std::optional<PipeScheduleKind> pipe_schedule_kind_of(std::string_view name);

/// Checks that the schedules of all stages of one pipeline (per_stage[s] for stage s) run together:
/// simulated with blocking receives and non-blocking, in-order sends, every receive gets the
/// message of the same micro-batch from its neighbour and no stage waits forever; every stage runs
/// each micro-batch's forward exactly once (and backward exactly once when the schedules train)
/// with its inputs there (loaded or received); a buffer is not filled for a micro-batch while it
/// still holds another one's; training ends with reduce_tied_gradients, reduce_gradients,
/// optimizer_step after the last backward. Throws zt::Error naming the stage and the instruction.
void check_pipe_schedules(const std::vector<PipeSchedule>& per_stage);

/// The bubble of a pipeline whose stages take equal time: (p - 1) / (m + p - 1) of each stage's
/// step is idle. Stages or micro_batches below 1 are a zt::ConfigError.
double ideal_bubble_fraction(int stages, int micro_batches);

}  // namespace zt::engine_detail
