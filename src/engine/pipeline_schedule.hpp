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
// Communication models (PipeTransport; check_pipe_schedules checks a schedule under one): receives
// block and messages between two neighbouring stages arrive in the order they were sent. On the
// host a send does not block (the executor waits for it only before its buffer is filled again).
// On a device a send completes only once its receive is posted (NCCL, the emulated device), under
// which 1F1B deadlocks in its steady state (stage s sends activation i + 1 while stage s + 1 sends
// gradient i): there the executor starts a send and the receive right after it from the same
// neighbour together (exchanges_with_next; Communicator::isend_irecv), as Megatron-LM's
// send_forward_recv_backward does.
#pragma once

#include <cstddef>
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

/// How sends between stages complete.
enum class PipeTransport : std::uint8_t {
  buffered,                   // at once (MPI's isend on host buffers)
  rendezvous,                 // once the receive is posted; every send and receive alone
  rendezvous_with_exchanges,  // rendezvous, with exchanges_with_next: what the executor does on a device
};

/// Whether instruction `position` of `schedule` is a send that the next instruction, a receive from
/// the same neighbour, joins as one exchange: send_activation then recv_gradient (both with
/// stage + 1), or send_gradient then recv_activation (both with stage - 1).
bool exchanges_with_next(const PipeSchedule& schedule, std::size_t position);

/// Checks that the schedules of all stages of one pipeline (per_stage[s] for stage s) run together:
/// simulated with blocking receives and in-order sends that complete as `transport` says, every receive gets
/// the message of the same micro-batch from its neighbour and no stage waits forever; every stage runs each
/// micro-batch's forward exactly once (and backward exactly once when the schedules train) with its inputs
/// there (loaded or received); a buffer is not filled for a micro-batch while it still holds another one's;
/// training ends with reduce_tied_gradients, reduce_gradients, optimizer_step after the last backward. Throws
/// zt::Error naming the stage and the instruction.
void check_pipe_schedules(const std::vector<PipeSchedule>& per_stage,
                          PipeTransport transport = PipeTransport::buffered);

/// The bubble of a pipeline whose stages take equal time: (p - 1) / (m + p - 1) of each stage's
/// step is idle. Stages or micro_batches below 1 are a zt::ConfigError.
double ideal_bubble_fraction(int stages, int micro_batches);

}  // namespace zt::engine_detail
