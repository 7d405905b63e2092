// Pipeline schedules as data (see pipeline_schedule.hpp).
#include "src/engine/pipeline_schedule.hpp"

#include <algorithm>
#include <cstddef>
#include <deque>
#include <utility>

#include "zerotrain/error.hpp"

namespace zt::engine_detail {
namespace {

void check_pipe_arguments(int stages, int micro_batches) {
  ZT_CHECK_AS(ConfigError, stages >= 1, "pipeline: stages is ", stages, ", expected at least 1");
  ZT_CHECK_AS(ConfigError, micro_batches >= 1, "pipeline: micro_batches is ", micro_batches,
              ", expected at least 1 micro-batch per step");
}

// Appends the instructions of whole forwards and backwards of one stage.
class ScheduleWriter {
 public:
  ScheduleWriter(PipeSchedule& schedule, int stages, int stage)
      : schedule_(schedule), first_(stage == 0), last_(stage + 1 == stages) {}

  void forward(int micro_batch) {
    const int buffer = buffer_of(micro_batch);
    if (first_) {
      add(PipeOp::load_micro_batch, buffer, micro_batch);
    } else {
      add(PipeOp::recv_activation, buffer, micro_batch);
    }
    // The targets; a one-stage pipeline loads inputs and targets together.
    if (last_ && !first_) add(PipeOp::load_micro_batch, buffer, micro_batch);
    add(PipeOp::forward, buffer, micro_batch);
    if (!last_) add(PipeOp::send_activation, buffer, micro_batch);
  }

  void backward(int micro_batch) {
    const int buffer = buffer_of(micro_batch);
    if (!last_) add(PipeOp::recv_gradient, buffer, micro_batch);
    add(PipeOp::backward, buffer, micro_batch);
    if (!first_) add(PipeOp::send_gradient, buffer, micro_batch);
  }

  void step() {
    add(PipeOp::reduce_tied_gradients, -1, -1);
    add(PipeOp::reduce_gradients, -1, -1);
    add(PipeOp::optimizer_step, -1, -1);
  }

 private:
  int buffer_of(int micro_batch) const { return micro_batch % schedule_.buffers; }
  void add(PipeOp op, int buffer, int micro_batch) {
    schedule_.instructions.push_back({.op = op, .buffer = buffer, .micro_batch = micro_batch});
  }

  PipeSchedule& schedule_;
  bool first_;
  bool last_;
};

bool is_step_op(PipeOp op) {
  return op == PipeOp::reduce_tied_gradients || op == PipeOp::reduce_gradients ||
         op == PipeOp::optimizer_step;
}

bool is_training_op(PipeOp op) {
  return is_step_op(op) || op == PipeOp::recv_gradient || op == PipeOp::backward ||
         op == PipeOp::send_gradient;
}

// What one stage has done with one micro-batch so far.
struct MicroBatchProgress {
  int buffer = -1;  // -1 until its first instruction fills one
  bool loaded = false;
  bool received_activation = false;
  bool forwarded = false;
  bool sent_activation = false;
  bool received_gradient = false;
  bool backwarded = false;
  bool sent_gradient = false;
};

bool is_send(PipeOp op) {
  return op == PipeOp::send_activation || op == PipeOp::send_gradient;
}

// The messages one stage sends to a neighbour: those not yet received, in order, and how many were
// sent and received in all.
struct Channel {
  std::deque<int> in_flight;  // micro-batches
  std::size_t sent = 0;
  std::size_t received = 0;
};

// Runs the schedules of all stages together and checks each instruction as it runs.
class PipelineSimulation {
 public:
  PipelineSimulation(const std::vector<PipeSchedule>& per_stage, PipeTransport transport)
      : per_stage_(per_stage), transport_(transport) {
    stages_ = static_cast<int>(per_stage_.size());
    if (stages_ < 1) ZT_THROW("pipeline schedules: no stage's schedule to check");
    check_fields();
    progress_.assign(stages_, std::vector<MicroBatchProgress>(micro_batches_));
    holders_.resize(stages_);
    last_use_.assign(stages_, std::vector<std::size_t>(micro_batches_, 0));
    for (int s = 0; s < stages_; ++s) {
      holders_[s].assign(per_stage_[s].buffers, -1);
      const auto& instructions = per_stage_[s].instructions;
      for (std::size_t k = 0; k < instructions.size(); ++k) {
        if (!is_step_op(instructions[k].op)) last_use_[s][instructions[k].micro_batch] = k;
      }
    }
    step_ops_done_.assign(stages_, 0);
    next_.assign(stages_, 0);
    send_posted_.assign(stages_, 0);
    joined_receive_done_.assign(stages_, 0);
    activations_.resize(stages_);
    gradients_.resize(stages_);
  }

  void run() {
    // A stage only waits for a message or for the receive of its own message, and messages
    // between two stages stay in order, so whether the stages finish does not depend on the
    // interleaving: running each stage as far as it gets, in turns, finds a deadlock if there is one.
    bool moved = true;
    while (moved) {
      moved = false;
      for (int s = 0; s < stages_; ++s) {
        while (next_[s] < per_stage_[s].instructions.size() && advance(s)) moved = true;
      }
    }
    report_deadlock();
    check_complete();
  }

 private:
  template <typename... Args>
  [[noreturn]] void fail(int stage, std::size_t index, Args&&... what) const {
    ZT_THROW("pipeline schedules: stage ", stage, " of ", stages_, ", instruction ", index, " (",
             describe(per_stage_[stage].instructions[index]), "): ", std::forward<Args>(what)...);
  }

  // Ranges of the fields, and the micro-batch count and whether the schedules train.
  void check_fields() {
    int largest_micro_batch = -1;
    for (int s = 0; s < stages_; ++s) {
      const PipeSchedule& schedule = per_stage_[s];
      if (schedule.buffers < 0)
        ZT_THROW("pipeline schedules: stage ", s, " has ", schedule.buffers, " buffers");
      for (std::size_t k = 0; k < schedule.instructions.size(); ++k) {
        const PipeInstruction& instruction = schedule.instructions[k];
        if (is_training_op(instruction.op)) training_ = true;
        if (is_step_op(instruction.op)) {
          if (instruction.buffer != -1 || instruction.micro_batch != -1) {
            fail(s, k, "the step's instructions take no buffer and no micro-batch (-1)");
          }
          continue;
        }
        if (instruction.buffer < 0 || instruction.buffer >= schedule.buffers) {
          fail(s, k, "buffer ", instruction.buffer, " is outside the stage's ", schedule.buffers, " buffers");
        }
        if (instruction.micro_batch < 0) fail(s, k, "micro-batch ", instruction.micro_batch, " is negative");
        largest_micro_batch = std::max(largest_micro_batch, instruction.micro_batch);
      }
    }
    if (largest_micro_batch < 0) ZT_THROW("pipeline schedules: no stage runs any micro-batch");
    micro_batches_ = largest_micro_batch + 1;
  }

  bool first(int stage) const { return stage == 0; }
  bool last(int stage) const { return stage + 1 == stages_; }

  // A receive waits for its message; everything else runs at once.
  bool can_run(int stage, const PipeInstruction& instruction) const {
    if (instruction.op == PipeOp::recv_activation && !first(stage))
      return !activations_[stage - 1].in_flight.empty();
    if (instruction.op == PipeOp::recv_gradient && !last(stage))
      return !gradients_[stage + 1].in_flight.empty();
    return true;
  }

  // Runs stage s's next instruction, or as much of it as can run now (a send waiting for its
  // receive; an exchange's two halves); returns whether anything happened.
  bool advance(int s) {
    const std::size_t k = next_[s];
    const std::vector<PipeInstruction>& instructions = per_stage_[s].instructions;
    if (transport_ == PipeTransport::buffered || !is_send(instructions[k].op)) {
      if (!can_run(s, instructions[k])) return false;
      execute(s, k);
      ++next_[s];
      return true;
    }
    bool changed = false;
    if (!send_posted_[s]) {
      execute(s, k);
      send_posted_[s] = 1;
      changed = true;
    }
    const bool joined =
        transport_ == PipeTransport::rendezvous_with_exchanges && exchanges_with_next(per_stage_[s], k);
    if (joined && !joined_receive_done_[s] && can_run(s, instructions[k + 1])) {
      execute(s, k + 1);
      joined_receive_done_[s] = 1;
      changed = true;
    }
    const Channel& channel = instructions[k].op == PipeOp::send_activation ? activations_[s] : gradients_[s];
    if (channel.received == channel.sent && (!joined || joined_receive_done_[s])) {  // delivered
      next_[s] += joined ? 2 : 1;
      send_posted_[s] = 0;
      joined_receive_done_[s] = 0;
      return true;
    }
    return changed;
  }

  void receive(int stage, std::size_t index, Channel& channel, int sender, const char* what) {
    const int micro_batch = per_stage_[stage].instructions[index].micro_batch;
    if (channel.in_flight.front() != micro_batch) {
      fail(stage, index, "receives the ", what, " of micro-batch ", micro_batch, " but stage ", sender,
           " sent the ", what, " of micro-batch ", channel.in_flight.front(), " first");
    }
    channel.in_flight.pop_front();
    ++channel.received;
  }

  void send(Channel& channel, int micro_batch) {
    channel.in_flight.push_back(micro_batch);
    ++channel.sent;
  }

  void execute(int s, std::size_t k) {
    const PipeInstruction& instruction = per_stage_[s].instructions[k];
    if (is_step_op(instruction.op)) {
      execute_step_op(s, k);
      return;
    }
    if (step_ops_done_[s] > 0) fail(s, k, "a micro-batch's instruction after the step's reduce started");
    claim_buffer(s, k);
    MicroBatchProgress& done = progress_[s][instruction.micro_batch];
    switch (instruction.op) {
      case PipeOp::load_micro_batch:
        if (!first(s) && !last(s)) fail(s, k, "only the first stage loads inputs and the last loads targets");
        if (done.loaded) fail(s, k, "the micro-batch is loaded twice");
        if (done.forwarded) fail(s, k, "loaded after its forward");
        done.loaded = true;
        break;
      case PipeOp::recv_activation:
        if (first(s)) fail(s, k, "the first stage receives no activation");
        if (done.received_activation) fail(s, k, "the activation is received twice");
        if (done.forwarded) fail(s, k, "received after its forward");
        receive(s, k, activations_[s - 1], s - 1, "activation");
        done.received_activation = true;
        break;
      case PipeOp::forward:
        if (done.forwarded) fail(s, k, "the forward runs twice");
        if ((first(s) || last(s)) && !done.loaded)
          fail(s, k, "the forward runs before the micro-batch is loaded");
        if (!first(s) && !done.received_activation)
          fail(s, k, "the forward runs before its activation arrived");
        done.forwarded = true;
        break;
      case PipeOp::send_activation:
        if (last(s)) fail(s, k, "the last stage sends no activation");
        if (!done.forwarded) fail(s, k, "the activation is sent before its forward");
        if (done.sent_activation) fail(s, k, "the activation is sent twice");
        send(activations_[s], instruction.micro_batch);
        done.sent_activation = true;
        break;
      case PipeOp::recv_gradient:
        if (last(s)) fail(s, k, "the last stage receives no gradient");
        if (done.received_gradient) fail(s, k, "the gradient is received twice");
        if (!done.sent_activation) fail(s, k, "the gradient is received before the activation was sent");
        receive(s, k, gradients_[s + 1], s + 1, "gradient");
        done.received_gradient = true;
        break;
      case PipeOp::backward:
        if (done.backwarded) fail(s, k, "the backward runs twice");
        if (!done.forwarded) fail(s, k, "the backward runs before its forward");
        if (!last(s) && !done.received_gradient) fail(s, k, "the backward runs before its gradient arrived");
        done.backwarded = true;
        break;
      case PipeOp::send_gradient:
        if (first(s)) fail(s, k, "the first stage sends no gradient");
        if (!done.backwarded) fail(s, k, "the gradient is sent before its backward");
        if (done.sent_gradient) fail(s, k, "the gradient is sent twice");
        send(gradients_[s], instruction.micro_batch);
        done.sent_gradient = true;
        break;
      default:
        fail(s, k, "unknown instruction");
    }
  }

  // A micro-batch keeps one buffer on a stage, and takes it only once its previous micro-batch has
  // run its last instruction there.
  void claim_buffer(int s, std::size_t k) {
    const PipeInstruction& instruction = per_stage_[s].instructions[k];
    MicroBatchProgress& done = progress_[s][instruction.micro_batch];
    if (done.buffer == instruction.buffer) return;
    if (done.buffer != -1) {
      fail(s, k, "micro-batch ", instruction.micro_batch, " is held in buffer ", done.buffer, ", not ",
           instruction.buffer);
    }
    const int holder = holders_[s][instruction.buffer];
    if (holder != -1 && k < last_use_[s][holder]) {
      fail(s, k, "buffer ", instruction.buffer, " still holds micro-batch ", holder, " (its instruction ",
           last_use_[s][holder], ", ", describe(per_stage_[s].instructions[last_use_[s][holder]]),
           ", is still to run)");
    }
    holders_[s][instruction.buffer] = instruction.micro_batch;
    done.buffer = instruction.buffer;
  }

  void execute_step_op(int s, std::size_t k) {
    static constexpr PipeOp order[] = {PipeOp::reduce_tied_gradients, PipeOp::reduce_gradients,
                                       PipeOp::optimizer_step};
    const PipeOp op = per_stage_[s].instructions[k].op;
    if (step_ops_done_[s] >= 3 || order[step_ops_done_[s]] != op) {
      fail(s, k,
           "the step runs reduce_tied_gradients, reduce_gradients, optimizer_step once each, in this order");
    }
    if (step_ops_done_[s] == 0) {
      for (int i = 0; i < micro_batches_; ++i) {
        if (!progress_[s][i].backwarded || (!first(s) && !progress_[s][i].sent_gradient)) {
          fail(s, k, "the step's reduce starts before micro-batch ", i, "'s backward finished");
        }
      }
    }
    ++step_ops_done_[s];
  }

  void report_deadlock() const {
    std::string waiting;
    for (int s = 0; s < stages_; ++s) {
      if (next_[s] == per_stage_[s].instructions.size()) continue;
      waiting += detail::concat(waiting.empty() ? "" : "; ", "stage ", s, " waits at instruction ", next_[s],
                                " (", describe(per_stage_[s].instructions[next_[s]]), ")",
                                send_posted_[s] ? " for its receive" : "");
    }
    if (!waiting.empty()) ZT_THROW("pipeline schedules deadlock (", transport_name(), "): ", waiting);
  }

  void check_complete() const {
    for (int s = 0; s < stages_; ++s) {
      auto missing = [&](int micro_batch, const char* what) {
        ZT_THROW("pipeline schedules: stage ", s, " of ", stages_, " never ", what, " of micro-batch ",
                 micro_batch, " (", micro_batches_, " micro-batches, ", training_ ? "training" : "inference",
                 ")");
      };
      for (int i = 0; i < micro_batches_; ++i) {
        const MicroBatchProgress& done = progress_[s][i];
        if ((first(s) || last(s)) && !done.loaded) missing(i, "loads the inputs or targets");
        if (!done.forwarded) missing(i, "runs the forward");
        if (!last(s) && !done.sent_activation) missing(i, "sends the activation");
        if (!training_) continue;
        if (!done.backwarded) missing(i, "runs the backward");
        if (!first(s) && !done.sent_gradient) missing(i, "sends the gradient");
      }
      if (training_ && step_ops_done_[s] != 3) {
        ZT_THROW("pipeline schedules: stage ", s, " of ", stages_,
                 " trains but does not end with reduce_tied_gradients, reduce_gradients, optimizer_step");
      }
    }
  }

  const char* transport_name() const {
    switch (transport_) {
      case PipeTransport::buffered:
        return "sends complete at once";
      case PipeTransport::rendezvous:
        return "a send completes once its receive is posted";
      case PipeTransport::rendezvous_with_exchanges:
        return "a send completes once its receive is posted; exchanges post both";
    }
    return "?";
  }

  const std::vector<PipeSchedule>& per_stage_;
  PipeTransport transport_;
  int stages_ = 0;
  int micro_batches_ = 0;
  bool training_ = false;
  std::vector<std::vector<MicroBatchProgress>> progress_;  // [stage][micro-batch]
  std::vector<std::vector<int>> holders_;                  // [stage][buffer]: micro-batch that filled it last
  std::vector<std::vector<std::size_t>> last_use_;         // [stage][micro-batch]: its last instruction
  std::vector<int> step_ops_done_;                         // [stage]
  std::vector<std::size_t> next_;                          // [stage]: its next instruction
  std::vector<char> send_posted_;                          // [stage]: its next instruction, a send, ran
  std::vector<char> joined_receive_done_;                  // [stage]: and the receive it exchanges with
  std::vector<Channel> activations_;                       // [s]: sent by s to s + 1
  std::vector<Channel> gradients_;                         // [s]: sent by s to s - 1
};

}  // namespace

PipeSchedule make_pipe_schedule(PipeScheduleKind kind, int stages, int stage, int micro_batches) {
  check_pipe_arguments(stages, micro_batches);
  ZT_CHECK_AS(ConfigError, stage >= 0 && stage < stages, "pipeline: stage ", stage,
              " is outside the pipeline's stages [0, ", stages, ")");
  const int m = micro_batches;
  PipeSchedule schedule;
  ScheduleWriter writer(schedule, stages, stage);
  switch (kind) {
    case PipeScheduleKind::one_f_one_b: {
      const int warmup = std::min(stages - stage - 1, m);
      schedule.buffers = std::min(stages - stage, m);
      for (int i = 0; i < warmup; ++i) writer.forward(i);
      for (int i = 0; i < m - warmup; ++i) {
        writer.forward(warmup + i);
        writer.backward(i);
      }
      for (int i = m - warmup; i < m; ++i) writer.backward(i);
      writer.step();
      break;
    }
    case PipeScheduleKind::gpipe:
      schedule.buffers = m;
      for (int i = 0; i < m; ++i) writer.forward(i);
      for (int i = 0; i < m; ++i) writer.backward(i);
      writer.step();
      break;
    case PipeScheduleKind::inference:
      schedule.buffers = std::min(2, m);
      for (int i = 0; i < m; ++i) writer.forward(i);
      break;
    default:
      ZT_THROW_AS(ConfigError, "pipeline: unknown schedule kind ", static_cast<int>(kind));
  }
  return schedule;
}

std::string_view pipe_op_name(PipeOp op) {
  switch (op) {
    case PipeOp::load_micro_batch:
      return "load_micro_batch";
    case PipeOp::recv_activation:
      return "recv_activation";
    case PipeOp::forward:
      return "forward";
    case PipeOp::send_activation:
      return "send_activation";
    case PipeOp::recv_gradient:
      return "recv_gradient";
    case PipeOp::backward:
      return "backward";
    case PipeOp::send_gradient:
      return "send_gradient";
    case PipeOp::reduce_tied_gradients:
      return "reduce_tied_gradients";
    case PipeOp::reduce_gradients:
      return "reduce_gradients";
    case PipeOp::optimizer_step:
      return "optimizer_step";
  }
  return "unknown_op";
}

std::string describe(const PipeInstruction& instruction) {
  std::string text(pipe_op_name(instruction.op));
  if (instruction.buffer == -1 && instruction.micro_batch == -1) return text;
  return detail::concat(text, "(buffer ", instruction.buffer, ", micro-batch ", instruction.micro_batch, ")");
}

std::string_view pipe_schedule_kind_name(PipeScheduleKind kind) {
  switch (kind) {
    case PipeScheduleKind::one_f_one_b:
      return "1f1b";
    case PipeScheduleKind::gpipe:
      return "gpipe";
    case PipeScheduleKind::inference:
      return "inference";
  }
  return "unknown";
}

std::optional<PipeScheduleKind> pipe_schedule_kind_of(std::string_view name) {
  for (PipeScheduleKind kind :
       {PipeScheduleKind::one_f_one_b, PipeScheduleKind::gpipe, PipeScheduleKind::inference}) {
    if (name == pipe_schedule_kind_name(kind)) return kind;
  }
  return std::nullopt;
}

bool exchanges_with_next(const PipeSchedule& schedule, std::size_t position) {
  const std::vector<PipeInstruction>& instructions = schedule.instructions;
  if (position + 1 >= instructions.size()) return false;
  const PipeOp op = instructions[position].op;
  const PipeOp next = instructions[position + 1].op;
  return (op == PipeOp::send_activation && next == PipeOp::recv_gradient) ||
         (op == PipeOp::send_gradient && next == PipeOp::recv_activation);
}

void check_pipe_schedules(const std::vector<PipeSchedule>& per_stage, PipeTransport transport) {
  PipelineSimulation(per_stage, transport).run();
}

double ideal_bubble_fraction(int stages, int micro_batches) {
  check_pipe_arguments(stages, micro_batches);
  return static_cast<double>(stages - 1) / static_cast<double>(micro_batches + stages - 1);
}

}  // namespace zt::engine_detail
