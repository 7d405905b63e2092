// One stage's pipeline schedule, run (see pipeline_executor.hpp).
#include "src/engine/pipeline_executor.hpp"

#include <algorithm>
#include <array>

#include "base/seconds_since.hpp"
#include "base/text.hpp"
#include "zerotrain/error.hpp"

namespace zt::engine_detail {
namespace {

// Tags of the pipeline group's messages (one ordered stream per kind and neighbour).
constexpr int kShapeTag = 1;
constexpr int kActivationTag = 2;
constexpr int kGradientTag = 3;

/// ndim, dtype, then the dimensions: the activation's description, sent once per run.
constexpr std::size_t kMaxDims = PipelineExecutor::kMaxShapeDims;
using ShapeMessage = std::array<std::int64_t, 2 + kMaxDims>;

}  // namespace

PipelineExecutor::PipelineExecutor(Communicator& pipeline, Communicator& pipeline_host,
                                   const ExecutionContext& execution, int stage, int stages)
    : pipeline_(pipeline),
      pipeline_host_(pipeline_host),
      execution_(execution),
      stage_(stage),
      stages_(stages),
      post_early_(pipeline.backend() == CommBackend::mpi && pipeline.device().is_host()),
      exchanges_(!post_early_) {
  ZT_CHECK(pipeline.size() == stages && pipeline.rank() == stage, "pipeline executor for stage ", stage,
           " of ", stages, " on a pipeline group of ", pipeline.size(), " ranks where this one is rank ",
           pipeline.rank());
  if (!execution.device().is_host()) device_marks_.emplace(execution.compute());
  ZT_CHECK(pipeline_host.backend() == CommBackend::mpi && pipeline_host.device().is_host() &&
               pipeline_host.size() == stages && pipeline_host.rank() == stage,
           "pipeline executor for stage ", stage, ": the host communicator '", pipeline_host.name(),
           "' is not the pipeline group's MPI communicator");
}

PipelineTiming PipelineExecutor::run(const PipeSchedule& schedule, const PipelineStageWork& work) {
  schedule_ = &schedule;
  idle_seconds_ = 0;
  sent_shape_ = false;
  received_shape_.reset();
  next_activation_.reset();
  next_gradient_.reset();
  compute_marks_.clear();
  if (device_marks_) {
    device_marks_->clear();
    device_marks_->mark();  // the run's start: mark 0
  }
  double busy = 0;
  std::vector<Buffer> buffers(static_cast<std::size_t>(schedule.buffers));
  auto buffer_of = [&](const PipeInstruction& instruction) -> Buffer& {
    ZT_CHECK(instruction.buffer >= 0 && instruction.buffer < schedule.buffers, "pipeline stage ", stage_,
             ": ", describe(instruction), " names a buffer outside the schedule's ", schedule.buffers);
    return buffers[static_cast<std::size_t>(instruction.buffer)];
  };

  for (std::size_t position = 0; position < schedule.instructions.size(); ++position) {
    const PipeInstruction& instruction = schedule.instructions[position];
    switch (instruction.op) {
      case PipeOp::load_micro_batch: {
        // The first stage's load gives the inputs; on the last stage (of several) the targets.
        Buffer& buffer = buffer_of(instruction);
        buffer.micro_batch = instruction.micro_batch;
        buffer.batch = work.load(instruction.micro_batch);
        if (stage_ == 0) buffer.input = buffer.batch.inputs;
        break;
      }
      case PipeOp::recv_activation: {
        Buffer& buffer = buffer_of(instruction);
        buffer.micro_batch = instruction.micro_batch;
        buffer.input =
            take_receive(next_activation_, PipeOp::recv_activation, position, instruction.micro_batch);
        break;
      }
      case PipeOp::forward: {
        Buffer& buffer = buffer_of(instruction);
        ZT_CHECK(buffer.micro_batch == instruction.micro_batch && buffer.input.defined(), "pipeline stage ",
                 stage_, ": ", describe(instruction),
                 " without its input (the schedule loads or receives it first)");
        const auto started = base::Clock::now();
        begin_compute();
        buffer.output = work.forward(buffer.input, instruction.micro_batch, buffer.batch);
        end_compute();
        busy += base::seconds_since(started);
        if (stage_ + 1 < stages_) {
          output_shape_ = buffer.output.shape();
          output_dtype_ = buffer.output.dtype();
        }
        buffer.input = Tensor();  // the stage's layers keep what their backward needs
        break;
      }
      case PipeOp::send_activation:
        send_activation(buffer_of(instruction).output, instruction.micro_batch, position);
        buffer_of(instruction).output = Tensor();
        break;
      case PipeOp::recv_gradient: {
        Buffer& buffer = buffer_of(instruction);
        buffer.output =
            take_receive(next_gradient_, PipeOp::recv_gradient, position, instruction.micro_batch);
        break;
      }
      case PipeOp::backward: {
        Buffer& buffer = buffer_of(instruction);
        ZT_CHECK(buffer.micro_batch == instruction.micro_batch, "pipeline stage ", stage_, ": ",
                 describe(instruction), " but the buffer holds micro-batch ", buffer.micro_batch);
        const Tensor grad_output = stage_ + 1 < stages_ ? buffer.output : Tensor();
        const auto started = base::Clock::now();
        begin_compute();
        Tensor grad_input = work.backward(grad_output, instruction.micro_batch);
        end_compute();
        busy += base::seconds_since(started);
        buffer = Buffer{};  // free for the next micro-batch
        buffer.grad_input = std::move(grad_input);
        break;
      }
      case PipeOp::send_gradient: {
        Buffer& buffer = buffer_of(instruction);
        send_gradient(buffer.grad_input, instruction.micro_batch, position);
        buffer.grad_input = Tensor();
        break;
      }
      case PipeOp::reduce_tied_gradients:
        complete_sends(true);
        work.reduce_tied_gradients();
        break;
      case PipeOp::reduce_gradients:
        work.reduce_gradients();
        break;
      case PipeOp::optimizer_step:
        work.optimizer_step();
        break;
    }
    complete_sends(false);
  }
  complete_sends(true);
  schedule_ = nullptr;
  if (device_marks_ && !compute_marks_.empty()) return device_timing();
  return {.stage = stage_, .stages = stages_, .busy_seconds = busy, .idle_seconds = idle_seconds_};
}

void PipelineExecutor::begin_compute() {
  if (device_marks_) compute_marks_.emplace_back(device_marks_->mark(), 0);
}

void PipelineExecutor::end_compute() {
  if (device_marks_) compute_marks_.back().second = device_marks_->mark();
}

PipelineTiming PipelineExecutor::device_timing() {
  // The whole span first: one wait, for the last backward's end; the marks before it are reached.
  const double span = device_marks_->seconds_between(0, compute_marks_.back().second);
  double busy = 0;
  for (const auto& [begin, end] : compute_marks_) busy += device_marks_->seconds_between(begin, end);
  return {
      .stage = stage_, .stages = stages_, .busy_seconds = busy, .idle_seconds = std::max(0.0, span - busy)};
}

void PipelineExecutor::send_activation(const Tensor& activation, std::int64_t micro_batch,
                                       std::size_t position) {
  ZT_CHECK(activation.defined(), "pipeline stage ", stage_, ": the forward of micro-batch ", micro_batch,
           " gave no output to send to stage ", stage_ + 1);
  send_shape_once(activation, micro_batch);
  send(activation, stage_ + 1, kActivationTag, position);
}

void PipelineExecutor::send_gradient(const Tensor& gradient, std::int64_t micro_batch, std::size_t position) {
  ZT_CHECK(gradient.defined(), "pipeline stage ", stage_, ": the backward of micro-batch ", micro_batch,
           " gave no input gradient to send to stage ", stage_ - 1,
           " (a stage after the first must take a floating-point input)");
  send(gradient, stage_ - 1, kGradientTag, position);
}

void PipelineExecutor::send(const Tensor& tensor, int peer, int tag, std::size_t position) {
  const auto started = base::Clock::now();
  const OutgoingMessage outgoing{.buffer = tensor.raw_data(),
                                 .count = static_cast<std::size_t>(tensor.numel()),
                                 .type = tensor.dtype(),
                                 .peer = peer,
                                 .tag = tag};
  if (exchanges_ && exchanges_with_next(*schedule_, position)) {
    // The receive the schedule runs next, from the same neighbour, starts with this send.
    const PipeOp receive_op = schedule_->instructions[position + 1].op;
    std::optional<PendingReceive>& pending = pending_of(receive_op);
    ZT_CHECK(!pending, "pipeline stage ", stage_, ": a ", pipe_op_name(receive_op),
             " is already posted when ", describe(schedule_->instructions[position]), " starts its exchange");
    PendingReceive receive = prepare_receive(position + 1);
    receive.work = pipeline_.isend_irecv(
        outgoing, {.buffer = receive.tensor.raw_data(),
                   .count = static_cast<std::size_t>(receive.tensor.numel()),
                   .type = receive.tensor.dtype(),
                   .peer = receive_op == PipeOp::recv_activation ? stage_ - 1 : stage_ + 1,
                   .tag = receive_op == PipeOp::recv_activation ? kActivationTag : kGradientTag});
    receive.sent = tensor;
    pending = std::move(receive);
  } else {
    sends_.emplace_back(pipeline_.isend(outgoing.buffer, outgoing.count, outgoing.type, peer, tag), tensor);
  }
  idle_seconds_ += base::seconds_since(started);
}

void PipelineExecutor::send_shape_once(const Tensor& activation, std::int64_t micro_batch) {
  if (!sent_shape_) {
    ZT_CHECK(activation.ndim() <= static_cast<std::int64_t>(kMaxDims), "pipeline stage ", stage_,
             ": activations of ", activation.ndim(), " dimensions; at most ", kMaxDims,
             " travel between stages");
    shape_send_.wait();  // a run that failed may have left the last one in flight
    sent_shape_message_.fill(0);
    sent_shape_message_[0] = activation.ndim();
    sent_shape_message_[1] = static_cast<std::int64_t>(activation.dtype());
    for (std::int64_t d = 0; d < activation.ndim(); ++d) sent_shape_message_[2 + d] = activation.size(d);
    // Over MPI on host memory, so that it never waits for its receive (completed at the run's end).
    shape_send_ = pipeline_host_.isend(sent_shape_message_.data(), sent_shape_message_.size(), DType::int64,
                                       stage_ + 1, kShapeTag);
    sent_shape_ = true;
    sent_shape_value_ = activation.shape();
    sent_dtype_ = activation.dtype();
  }
  ZT_CHECK(
      activation.shape() == sent_shape_value_ && activation.dtype() == sent_dtype_, "pipeline stage ", stage_,
      ": the activation of micro-batch ", micro_batch, " is ", activation.description(),
      " but this step's first was ", dtype_name(sent_dtype_), " ", base::shape_text(sent_shape_value_),
      ": the stages agree on the shape once per step, so every micro-batch of a step needs the same shape");
}

void PipelineExecutor::receive_shape_once() {
  if (received_shape_) return;
  ShapeMessage message{};
  pipeline_host_.recv(message.data(), message.size(), DType::int64, stage_ - 1, kShapeTag);
  ZT_CHECK(message[0] >= 0 && message[0] <= static_cast<std::int64_t>(kMaxDims), "pipeline stage ", stage_,
           ": stage ", stage_ - 1, " described its activation with ", message[0], " dimensions");
  received_shape_ = Shape(message.begin() + 2, message.begin() + 2 + message[0]);
  received_dtype_ = static_cast<DType>(message[1]);
}

std::optional<PipelineExecutor::PendingReceive>& PipelineExecutor::pending_of(PipeOp op) {
  return op == PipeOp::recv_activation ? next_activation_ : next_gradient_;
}

PipelineExecutor::PendingReceive PipelineExecutor::prepare_receive(std::size_t position) {
  const PipeInstruction& instruction = schedule_->instructions[position];
  PendingReceive pending;
  pending.micro_batch = instruction.micro_batch;
  if (instruction.op == PipeOp::recv_activation) {
    receive_shape_once();
    pending.tensor = execution_.empty(*received_shape_, received_dtype_, MemoryCategory::activations);
  } else {
    pending.tensor = execution_.empty(output_shape_, output_dtype_, MemoryCategory::activations);
  }
  return pending;
}

void PipelineExecutor::post_next_receive(PipeOp op, std::size_t from) {
  const std::vector<PipeInstruction>& instructions = schedule_->instructions;
  for (std::size_t next = from; next < instructions.size(); ++next) {
    if (instructions[next].op != op) continue;
    // Posted ahead only once the shape message came (take_receive receives it).
    if (op == PipeOp::recv_activation && !received_shape_) return;
    PendingReceive pending = prepare_receive(next);
    const bool activation = op == PipeOp::recv_activation;
    pending.work = pipeline_.irecv(
        pending.tensor.raw_data(), static_cast<std::size_t>(pending.tensor.numel()), pending.tensor.dtype(),
        activation ? stage_ - 1 : stage_ + 1, activation ? kActivationTag : kGradientTag);
    pending_of(op) = std::move(pending);
    return;
  }
}

Tensor PipelineExecutor::take_receive(std::optional<PendingReceive>& pending, PipeOp op, std::size_t position,
                                      std::int64_t micro_batch) {
  const auto started = base::Clock::now();
  if (op == PipeOp::recv_activation) receive_shape_once();
  // Not posted ahead (the first of a run, or a device communicator) nor by an exchange: post it now.
  if (!pending) post_next_receive(op, position);
  ZT_CHECK(pending && pending->micro_batch == micro_batch, "pipeline stage ", stage_,
           ": expected to receive ", pipe_op_name(op), " of micro-batch ", micro_batch,
           " but the next posted receive is for micro-batch ", pending ? pending->micro_batch : -1);
  pending->work.wait();
  Tensor received = std::move(pending->tensor);
  pending.reset();
  if (post_early_) post_next_receive(op, position + 1);
  idle_seconds_ += base::seconds_since(started);
  return received;
}

void PipelineExecutor::complete_sends(bool all) {
  // Sends whose transfer finished release their tensors; at the end of a run every send completes.
  const auto started = base::Clock::now();
  // The shape's send too: polled, so that the watchdog does not see it in flight for the whole run.
  if (all) {
    shape_send_.wait();
  } else {
    (void)shape_send_.test();
  }
  while (!sends_.empty()) {
    if (all) {
      sends_.front().first.wait();
    } else if (!sends_.front().first.test()) {
      break;
    }
    sends_.pop_front();
  }
  if (all) idle_seconds_ += base::seconds_since(started);
}

}  // namespace zt::engine_detail
