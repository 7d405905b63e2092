// Pipeline schedules as data: instruction counts, exact orders, buffers, and the checker that runs
// all stages' schedules together (deadlocks, buffers filled too early, missing instructions).
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "src/engine/pipeline_schedule.hpp"
#include "zerotrain/error.hpp"

namespace {

using zt::engine_detail::check_pipe_schedules;
using zt::engine_detail::describe;
using zt::engine_detail::make_pipe_schedule;
using zt::engine_detail::PipeInstruction;
using zt::engine_detail::PipeOp;
using zt::engine_detail::PipeSchedule;
using zt::engine_detail::PipeScheduleKind;

constexpr PipeScheduleKind all_kinds[] = {PipeScheduleKind::one_f_one_b, PipeScheduleKind::gpipe,
                                          PipeScheduleKind::inference};
constexpr PipeOp all_ops[] = {
    PipeOp::load_micro_batch, PipeOp::recv_activation, PipeOp::forward,       PipeOp::send_activation,
    PipeOp::recv_gradient,    PipeOp::backward,        PipeOp::send_gradient, PipeOp::reduce_tied_gradients,
    PipeOp::reduce_gradients, PipeOp::optimizer_step};

std::vector<PipeSchedule> pipeline(PipeScheduleKind kind, int stages, int micro_batches) {
  std::vector<PipeSchedule> per_stage;
  for (int s = 0; s < stages; ++s) per_stage.push_back(make_pipe_schedule(kind, stages, s, micro_batches));
  return per_stage;
}

std::string listing(const PipeSchedule& schedule) {
  std::string text;
  for (const PipeInstruction& instruction : schedule.instructions) text += describe(instruction) + "\n";
  return text;
}

std::string case_name(PipeScheduleKind kind, int stages, int stage, int micro_batches) {
  return std::string(zt::engine_detail::pipe_schedule_kind_name(kind)) + " p=" + std::to_string(stages) +
         " stage " + std::to_string(stage) + " m=" + std::to_string(micro_batches);
}

// Instructions from a compact list: {op, buffer, micro-batch}; the step's three at the end.
std::vector<PipeInstruction> with_step(std::vector<PipeInstruction> instructions) {
  instructions.push_back({PipeOp::reduce_tied_gradients});
  instructions.push_back({PipeOp::reduce_gradients});
  instructions.push_back({PipeOp::optimizer_step});
  return instructions;
}

// `action` throws a zt::Error whose message has every one of `parts`.
template <typename ErrorType = zt::Error>
void expect_error(const std::function<void()>& action, std::initializer_list<std::string> parts) {
  try {
    action();
  } catch (const ErrorType& error) {
    const std::string message = error.what();
    for (const std::string& part : parts) EXPECT_NE(message.find(part), std::string::npos) << message;
    return;
  }
  ADD_FAILURE() << "no error thrown";
}

// Index of the first instruction equal to `wanted` on `schedule`.
std::size_t index_of(const PipeSchedule& schedule, PipeInstruction wanted) {
  auto found = std::find(schedule.instructions.begin(), schedule.instructions.end(), wanted);
  EXPECT_NE(found, schedule.instructions.end()) << describe(wanted) << " not in\n" << listing(schedule);
  return static_cast<std::size_t>(found - schedule.instructions.begin());
}

// ---- every schedule for p = 1..4, m = 1..8 ------------------------------------------------------

TEST(PipeSchedule, CountsBuffersAndOrderForEveryShape) {
  for (PipeScheduleKind kind : all_kinds) {
    const bool training = kind != PipeScheduleKind::inference;
    for (int p = 1; p <= 4; ++p) {
      for (int m = 1; m <= 8; ++m) {
        for (int s = 0; s < p; ++s) {
          SCOPED_TRACE(case_name(kind, p, s, m));
          const PipeSchedule schedule = make_pipe_schedule(kind, p, s, m);
          const bool first = s == 0;
          const bool last = s == p - 1;
          auto count = [&](PipeOp op) {
            return std::count_if(schedule.instructions.begin(), schedule.instructions.end(),
                                 [op](const PipeInstruction& instruction) { return instruction.op == op; });
          };
          EXPECT_EQ(count(PipeOp::load_micro_batch), first || last ? m : 0);
          EXPECT_EQ(count(PipeOp::recv_activation), first ? 0 : m);
          EXPECT_EQ(count(PipeOp::forward), m);
          EXPECT_EQ(count(PipeOp::send_activation), last ? 0 : m);
          EXPECT_EQ(count(PipeOp::recv_gradient), training && !last ? m : 0);
          EXPECT_EQ(count(PipeOp::backward), training ? m : 0);
          EXPECT_EQ(count(PipeOp::send_gradient), training && !first ? m : 0);
          EXPECT_EQ(count(PipeOp::reduce_tied_gradients), training ? 1 : 0);
          EXPECT_EQ(count(PipeOp::reduce_gradients), training ? 1 : 0);
          EXPECT_EQ(count(PipeOp::optimizer_step), training ? 1 : 0);
          std::int64_t counted = 0;
          for (PipeOp op : all_ops) counted += count(op);
          EXPECT_EQ(counted, static_cast<std::int64_t>(schedule.instructions.size()));

          const int buffers = kind == PipeScheduleKind::one_f_one_b ? std::min(p - s, m)
                              : kind == PipeScheduleKind::gpipe     ? m
                                                                    : std::min(2, m);
          EXPECT_EQ(schedule.buffers, buffers);
          std::vector<int> forwards, backwards;
          int in_flight = 0, most_in_flight = 0, forwards_before_first_backward = -1;
          for (const PipeInstruction& instruction : schedule.instructions) {
            const bool step_op = instruction.op == PipeOp::reduce_tied_gradients ||
                                 instruction.op == PipeOp::reduce_gradients ||
                                 instruction.op == PipeOp::optimizer_step;
            if (step_op) {
              EXPECT_EQ(instruction.buffer, -1);
              EXPECT_EQ(instruction.micro_batch, -1);
              continue;
            }
            EXPECT_EQ(instruction.buffer, instruction.micro_batch % buffers) << describe(instruction);
            if (instruction.op == PipeOp::forward) {
              forwards.push_back(instruction.micro_batch);
              most_in_flight = std::max(most_in_flight, ++in_flight);
            }
            if (instruction.op == PipeOp::backward) {
              if (backwards.empty()) forwards_before_first_backward = static_cast<int>(forwards.size());
              backwards.push_back(instruction.micro_batch);
              --in_flight;
            }
          }
          std::vector<int> in_order(m);
          for (int i = 0; i < m; ++i) in_order[i] = i;
          EXPECT_EQ(forwards, in_order);
          if (training) {
            EXPECT_EQ(backwards, in_order);
            EXPECT_EQ(most_in_flight, buffers);  // the buffers are the micro-batches in flight, no more
            const int warmup = std::min(p - s - 1, m);
            EXPECT_EQ(forwards_before_first_backward,
                      kind == PipeScheduleKind::gpipe ? m : std::min(warmup + 1, m));
            // The step closes the list.
            ASSERT_GE(schedule.instructions.size(), 3u);
            const auto tail = schedule.instructions.end() - 3;
            EXPECT_EQ(tail[0].op, PipeOp::reduce_tied_gradients);
            EXPECT_EQ(tail[1].op, PipeOp::reduce_gradients);
            EXPECT_EQ(tail[2].op, PipeOp::optimizer_step);
          }
        }
        SCOPED_TRACE(case_name(kind, p, -1, m));
        EXPECT_NO_THROW(check_pipe_schedules(pipeline(kind, p, m)));
      }
    }
  }
}

// ---- exact orders written by hand ----------------------------------------------------------------

TEST(PipeSchedule, OneFOneBTwoStagesThreeMicroBatches) {
  // Stage 0: one warm-up forward, two steady pairs, one cool-down backward; two buffers.
  const PipeSchedule first = make_pipe_schedule(PipeScheduleKind::one_f_one_b, 2, 0, 3);
  EXPECT_EQ(first.buffers, 2);
  const std::vector<PipeInstruction> first_expected = with_step({
      {PipeOp::load_micro_batch, 0, 0},
      {PipeOp::forward, 0, 0},
      {PipeOp::send_activation, 0, 0},  // warm-up
      {PipeOp::load_micro_batch, 1, 1},
      {PipeOp::forward, 1, 1},
      {PipeOp::send_activation, 1, 1},
      {PipeOp::recv_gradient, 0, 0},
      {PipeOp::backward, 0, 0},  // pair 1
      {PipeOp::load_micro_batch, 0, 2},
      {PipeOp::forward, 0, 2},
      {PipeOp::send_activation, 0, 2},
      {PipeOp::recv_gradient, 1, 1},
      {PipeOp::backward, 1, 1},  // pair 2
      {PipeOp::recv_gradient, 0, 2},
      {PipeOp::backward, 0, 2},  // cool-down
  });
  EXPECT_EQ(first.instructions, first_expected) << listing(first);

  // Stage 1 (last): no warm-up, one buffer; receives, loads the targets, forward, backward, sends.
  const PipeSchedule last = make_pipe_schedule(PipeScheduleKind::one_f_one_b, 2, 1, 3);
  EXPECT_EQ(last.buffers, 1);
  std::vector<PipeInstruction> last_expected;
  for (int i = 0; i < 3; ++i) {
    for (PipeOp op : {PipeOp::recv_activation, PipeOp::load_micro_batch, PipeOp::forward, PipeOp::backward,
                      PipeOp::send_gradient}) {
      last_expected.push_back({op, 0, i});
    }
  }
  EXPECT_EQ(last.instructions, with_step(last_expected)) << listing(last);
}

TEST(PipeSchedule, GpipeAndInferenceTwoStagesThreeMicroBatches) {
  const PipeSchedule last = make_pipe_schedule(PipeScheduleKind::gpipe, 2, 1, 3);
  EXPECT_EQ(last.buffers, 3);
  std::vector<PipeInstruction> last_expected;
  for (int i = 0; i < 3; ++i) {
    for (PipeOp op : {PipeOp::recv_activation, PipeOp::load_micro_batch, PipeOp::forward}) {
      last_expected.push_back({op, i, i});
    }
  }
  for (int i = 0; i < 3; ++i)
    last_expected.insert(last_expected.end(), {{PipeOp::backward, i, i}, {PipeOp::send_gradient, i, i}});
  EXPECT_EQ(last.instructions, with_step(last_expected)) << listing(last);

  const PipeSchedule first = make_pipe_schedule(PipeScheduleKind::inference, 2, 0, 3);
  EXPECT_EQ(first.buffers, 2);
  const std::vector<PipeInstruction> first_expected = {
      {PipeOp::load_micro_batch, 0, 0}, {PipeOp::forward, 0, 0}, {PipeOp::send_activation, 0, 0},
      {PipeOp::load_micro_batch, 1, 1}, {PipeOp::forward, 1, 1}, {PipeOp::send_activation, 1, 1},
      {PipeOp::load_micro_batch, 0, 2}, {PipeOp::forward, 0, 2}, {PipeOp::send_activation, 0, 2},
  };
  EXPECT_EQ(first.instructions, first_expected) << listing(first);
}

TEST(PipeSchedule, OneFOneBFourStagesEightMicroBatchesWarmsUpWithThreeForwards) {
  const PipeSchedule first = make_pipe_schedule(PipeScheduleKind::one_f_one_b, 4, 0, 8);
  EXPECT_EQ(first.buffers, 4);
  std::vector<PipeInstruction> head;
  for (int i = 0; i < 4; ++i) {  // three warm-up forwards and the first steady forward
    for (PipeOp op : {PipeOp::load_micro_batch, PipeOp::forward, PipeOp::send_activation})
      head.push_back({op, i, i});
  }
  head.insert(head.end(),
              {{PipeOp::recv_gradient, 0, 0}, {PipeOp::backward, 0, 0}, {PipeOp::load_micro_batch, 0, 4}});
  ASSERT_GE(first.instructions.size(), head.size());
  EXPECT_EQ(
      std::vector<PipeInstruction>(first.instructions.begin(), first.instructions.begin() + head.size()),
      head)
      << listing(first);
  // The cool-down: the last three backwards in a row, then the step.
  std::vector<PipeInstruction> tail;
  for (int i = 5; i < 8; ++i)
    tail.insert(tail.end(), {{PipeOp::recv_gradient, i % 4, i}, {PipeOp::backward, i % 4, i}});
  tail = with_step(tail);
  EXPECT_EQ(std::vector<PipeInstruction>(first.instructions.end() - tail.size(), first.instructions.end()),
            tail)
      << listing(first);

  // Stage 2 warms up with one forward.
  const PipeSchedule third = make_pipe_schedule(PipeScheduleKind::one_f_one_b, 4, 2, 8);
  EXPECT_EQ(third.buffers, 2);
  const std::vector<PipeInstruction> third_head = {
      {PipeOp::recv_activation, 0, 0}, {PipeOp::forward, 0, 0},  {PipeOp::send_activation, 0, 0},
      {PipeOp::recv_activation, 1, 1}, {PipeOp::forward, 1, 1},  {PipeOp::send_activation, 1, 1},
      {PipeOp::recv_gradient, 0, 0},   {PipeOp::backward, 0, 0}, {PipeOp::send_gradient, 0, 0},
      {PipeOp::recv_activation, 0, 2},
  };
  EXPECT_EQ(std::vector<PipeInstruction>(third.instructions.begin(),
                                         third.instructions.begin() + third_head.size()),
            third_head)
      << listing(third);
}

TEST(PipeSchedule, OneStageLoadsOnceAndNeedsNoCommunication) {
  const PipeSchedule one_f_one_b = make_pipe_schedule(PipeScheduleKind::one_f_one_b, 1, 0, 2);
  EXPECT_EQ(one_f_one_b.buffers, 1);
  EXPECT_EQ(one_f_one_b.instructions, with_step({{PipeOp::load_micro_batch, 0, 0},
                                                 {PipeOp::forward, 0, 0},
                                                 {PipeOp::backward, 0, 0},
                                                 {PipeOp::load_micro_batch, 0, 1},
                                                 {PipeOp::forward, 0, 1},
                                                 {PipeOp::backward, 0, 1}}))
      << listing(one_f_one_b);

  const PipeSchedule gpipe = make_pipe_schedule(PipeScheduleKind::gpipe, 1, 0, 2);
  EXPECT_EQ(gpipe.buffers, 2);
  EXPECT_EQ(gpipe.instructions, with_step({{PipeOp::load_micro_batch, 0, 0},
                                           {PipeOp::forward, 0, 0},
                                           {PipeOp::load_micro_batch, 1, 1},
                                           {PipeOp::forward, 1, 1},
                                           {PipeOp::backward, 0, 0},
                                           {PipeOp::backward, 1, 1}}))
      << listing(gpipe);

  const PipeSchedule inference = make_pipe_schedule(PipeScheduleKind::inference, 1, 0, 1);
  EXPECT_EQ(inference.buffers, 1);
  EXPECT_EQ(inference.instructions,
            (std::vector<PipeInstruction>{{PipeOp::load_micro_batch, 0, 0}, {PipeOp::forward, 0, 0}}))
      << listing(inference);
}

// ---- names, errors, the bubble --------------------------------------------------------------------

TEST(PipeSchedule, NamesAndDescriptions) {
  EXPECT_EQ(describe({PipeOp::forward, 1, 3}), "forward(buffer 1, micro-batch 3)");
  EXPECT_EQ(describe({PipeOp::recv_gradient, 0, 7}), "recv_gradient(buffer 0, micro-batch 7)");
  EXPECT_EQ(describe({PipeOp::optimizer_step}), "optimizer_step");
  EXPECT_EQ(zt::engine_detail::pipe_op_name(PipeOp::reduce_tied_gradients), "reduce_tied_gradients");
  EXPECT_EQ(zt::engine_detail::pipe_op_name(PipeOp::load_micro_batch), "load_micro_batch");
  EXPECT_EQ(zt::engine_detail::pipe_schedule_kind_of("1f1b"), PipeScheduleKind::one_f_one_b);
  EXPECT_EQ(zt::engine_detail::pipe_schedule_kind_of("gpipe"), PipeScheduleKind::gpipe);
  EXPECT_EQ(zt::engine_detail::pipe_schedule_kind_of("inference"), PipeScheduleKind::inference);
  EXPECT_EQ(zt::engine_detail::pipe_schedule_kind_of("pipedream"), std::nullopt);
  EXPECT_EQ(zt::engine_detail::pipe_schedule_kind_of(""), std::nullopt);
  for (PipeScheduleKind kind : all_kinds) {
    EXPECT_EQ(zt::engine_detail::pipe_schedule_kind_of(zt::engine_detail::pipe_schedule_kind_name(kind)),
              kind);
  }
  // Every op has its own name.
  std::vector<std::string> names;
  for (PipeOp op : all_ops) names.emplace_back(zt::engine_detail::pipe_op_name(op));
  std::sort(names.begin(), names.end());
  EXPECT_EQ(std::unique(names.begin(), names.end()), names.end());
}

TEST(PipeSchedule, InvalidArgumentsAreConfigErrors) {
  using zt::ConfigError;
  const auto kind = PipeScheduleKind::one_f_one_b;
  expect_error<ConfigError>([&] { make_pipe_schedule(kind, 0, 0, 4); }, {"stages is 0", "at least 1"});
  expect_error<ConfigError>([&] { make_pipe_schedule(kind, 4, 4, 4); }, {"stage 4", "[0, 4)"});
  expect_error<ConfigError>([&] { make_pipe_schedule(kind, 4, -1, 4); }, {"stage -1", "[0, 4)"});
  expect_error<ConfigError>([&] { make_pipe_schedule(PipeScheduleKind::inference, 2, 0, 0); },
                            {"micro_batches is 0", "at least 1"});
  expect_error<ConfigError>([&] { zt::engine_detail::ideal_bubble_fraction(2, 0); }, {"micro_batches is 0"});
  expect_error<ConfigError>([&] { zt::engine_detail::ideal_bubble_fraction(0, 3); }, {"stages is 0"});
}

TEST(PipeSchedule, IdealBubbleFraction) {
  EXPECT_DOUBLE_EQ(zt::engine_detail::ideal_bubble_fraction(4, 8), 3.0 / 11.0);
  EXPECT_DOUBLE_EQ(zt::engine_detail::ideal_bubble_fraction(2, 1), 0.5);
  EXPECT_EQ(zt::engine_detail::ideal_bubble_fraction(1, 5), 0.0);
}

// ---- the checker refuses broken schedules ---------------------------------------------------------

TEST(PipeScheduleCheck, SendMovedAfterALaterReceiveDeadlocks) {
  auto per_stage = pipeline(PipeScheduleKind::one_f_one_b, 2, 3);
  ASSERT_NO_THROW(check_pipe_schedules(per_stage));
  // Stage 0 waits for micro-batch 0's gradient before sending its activation.
  auto& first = per_stage[0].instructions;
  std::swap(first[index_of(per_stage[0], {PipeOp::send_activation, 0, 0})],
            first[index_of(per_stage[0], {PipeOp::recv_gradient, 0, 0})]);
  expect_error([&] { check_pipe_schedules(per_stage); },
               {"deadlock", "stage 0 waits at instruction", "recv_gradient(buffer 0, micro-batch 0)",
                "stage 1 waits at instruction 0 (recv_activation(buffer 0, micro-batch 0))"});

  // The same in the middle of a deeper pipeline: stage 2 of 4 holds back micro-batch 0's
  // activation until it has its gradient; the stages before wait for gradients, the last for it.
  auto deep = pipeline(PipeScheduleKind::one_f_one_b, 4, 8);
  ASSERT_NO_THROW(check_pipe_schedules(deep));
  auto& third = deep[2].instructions;
  std::swap(third[index_of(deep[2], {PipeOp::send_activation, 0, 0})],
            third[index_of(deep[2], {PipeOp::recv_gradient, 0, 0})]);
  expect_error(
      [&] { check_pipe_schedules(deep); },
      {"deadlock", "stage 1 waits", "stage 2 waits at instruction 2 (recv_gradient(buffer 0, micro-batch 0))",
       "stage 3 waits at instruction 0 (recv_activation(buffer 0, micro-batch 0))"});

  // Stage 1 of 4 holds back micro-batch 2's activation until micro-batch 1's gradient: stage 2
  // cannot send that gradient without micro-batch 2, and what arrives first is micro-batch 0's.
  auto crossed = pipeline(PipeScheduleKind::one_f_one_b, 4, 8);
  auto& second = crossed[1].instructions;
  std::swap(second[index_of(crossed[1], {PipeOp::send_activation, 2, 2})],
            second[index_of(crossed[1], {PipeOp::recv_gradient, 1, 1})]);
  expect_error([&] { check_pipe_schedules(crossed); },
               {"stage 1 of 4", "receives the gradient of micro-batch 1",
                "stage 2 sent the gradient of micro-batch 0 first"});

  // An inference schedule whose first stage never sends.
  auto silent = pipeline(PipeScheduleKind::inference, 2, 1);
  silent[0].instructions.pop_back();
  expect_error([&] { check_pipe_schedules(silent); },
               {"deadlock", "stage 1 waits at instruction 0 (recv_activation(buffer 0, micro-batch 0))"});
}

// ---- a device's transport: sends that wait for their receive ------------------------------------

TEST(PipeScheduleCheck, DeviceSendsDeadlockOneFOneBUnlessExchangesPairThem) {
  using zt::engine_detail::exchanges_with_next;
  using zt::engine_detail::PipeTransport;
  // 1F1B p=2, m=2. Stage 0: load, forward, send_activation(0), load, forward, send_activation(1),
  // recv_gradient(0), ...; stage 1: recv_activation(0), load, forward, backward, send_gradient(0),
  // recv_activation(1), ... Each sends before it receives what the other sends.
  const auto per_stage = pipeline(PipeScheduleKind::one_f_one_b, 2, 2);
  ASSERT_NO_THROW(check_pipe_schedules(per_stage, PipeTransport::buffered));
  expect_error([&] { check_pipe_schedules(per_stage, PipeTransport::rendezvous); },
               {"deadlock (a send completes once its receive is posted)",
                "stage 0 waits at instruction 5 (send_activation(buffer 1, micro-batch 1)) for its receive",
                "stage 1 waits at instruction 4 (send_gradient(buffer 0, micro-batch 0)) for its receive"});
  EXPECT_NO_THROW(check_pipe_schedules(per_stage, PipeTransport::rendezvous_with_exchanges));
  // The exchanges: a send and the receive right after it from the same neighbour.
  EXPECT_FALSE(exchanges_with_next(per_stage[0], 2));  // send_activation(0), then a load
  EXPECT_TRUE(exchanges_with_next(per_stage[0], 5));   // send_activation(1) + recv_gradient(0)
  EXPECT_TRUE(exchanges_with_next(per_stage[1], 4));   // send_gradient(0) + recv_activation(1)
  EXPECT_FALSE(exchanges_with_next(per_stage[1], 0));  // a receive
  EXPECT_FALSE(exchanges_with_next(per_stage[1], per_stage[1].instructions.size() - 1));

  // Every schedule the executor runs, on p = 1..8 stages and m = 1..12 micro-batches, runs with
  // exchanges; 1F1B without them deadlocks whenever a stage has a steady state after its warm-up.
  for (PipeScheduleKind kind : all_kinds) {
    for (int p = 1; p <= 8; ++p) {
      for (int m = 1; m <= 12; ++m) {
        SCOPED_TRACE(case_name(kind, p, -1, m));
        const auto stages = pipeline(kind, p, m);
        EXPECT_NO_THROW(check_pipe_schedules(stages, PipeTransport::rendezvous_with_exchanges));
        if (kind == PipeScheduleKind::one_f_one_b && p >= 2 && m >= 2) {
          EXPECT_THROW(check_pipe_schedules(stages, PipeTransport::rendezvous), zt::Error);
        }
      }
    }
  }

  // The checker still finds a schedule broken for any transport: stage 0 holding back its first
  // activation until it has that micro-batch's gradient.
  auto broken = pipeline(PipeScheduleKind::one_f_one_b, 2, 3);
  auto& first = broken[0].instructions;
  std::swap(first[index_of(broken[0], {PipeOp::send_activation, 0, 0})],
            first[index_of(broken[0], {PipeOp::recv_gradient, 0, 0})]);
  expect_error([&] { check_pipe_schedules(broken, PipeTransport::rendezvous_with_exchanges); },
               {"deadlock", "stage 0 waits at instruction", "stage 1 waits at instruction 0"});
}

TEST(PipeScheduleCheck, BufferFilledBeforeItsMicroBatchFinished) {
  // Stage 0 of 1F1B p=2, m=3 puts micro-batch 2 into buffer 1, which micro-batch 1 holds until its
  // backward (after micro-batch 2's forward).
  auto per_stage = pipeline(PipeScheduleKind::one_f_one_b, 2, 3);
  for (PipeInstruction& instruction : per_stage[0].instructions) {
    if (instruction.micro_batch == 2) instruction.buffer = 1;
  }
  expect_error([&] { check_pipe_schedules(per_stage); },
               {"stage 0 of 2", "load_micro_batch(buffer 1, micro-batch 2)",
                "buffer 1 still holds micro-batch 1", "backward(buffer 1, micro-batch 1)"});

  // One buffer fewer than 1F1B needs on stage 1 of 3 (two micro-batches in flight there).
  auto squeezed = pipeline(PipeScheduleKind::one_f_one_b, 3, 4);
  squeezed[1].buffers = 1;
  for (PipeInstruction& instruction : squeezed[1].instructions) {
    if (instruction.buffer >= 0) instruction.buffer = 0;
  }
  expect_error([&] { check_pipe_schedules(squeezed); },
               {"stage 1 of 3", "recv_activation(buffer 0, micro-batch 1)", "still holds micro-batch 0"});

  // GPipe keeps all micro-batches: sharing one buffer between two fails on the second forward.
  auto gpipe = pipeline(PipeScheduleKind::gpipe, 2, 2);
  for (PipeInstruction& instruction : gpipe[1].instructions) {
    if (instruction.micro_batch == 1) instruction.buffer = 0;
  }
  expect_error([&] { check_pipe_schedules(gpipe); }, {"stage 1 of 2", "still holds micro-batch 0"});

  // A micro-batch that changes buffers within a stage.
  auto moved = pipeline(PipeScheduleKind::gpipe, 2, 2);
  moved[0].instructions[index_of(moved[0], {PipeOp::backward, 1, 1})].buffer = 0;
  expect_error([&] { check_pipe_schedules(moved); }, {"micro-batch 1 is held in buffer 1, not 0"});

  // A buffer id outside the stage's buffers.
  auto outside = pipeline(PipeScheduleKind::inference, 2, 3);
  outside[1].instructions[0].buffer = 2;
  expect_error([&] { check_pipe_schedules(outside); },
               {"stage 1 of 2, instruction 0", "outside the stage's 2 buffers"});
}

TEST(PipeScheduleCheck, DroppedBackwardOrForward) {
  // Stage 0 drops micro-batch 1's backward: the step would reduce before it.
  auto per_stage = pipeline(PipeScheduleKind::one_f_one_b, 2, 3);
  auto& first = per_stage[0].instructions;
  first.erase(first.begin() + static_cast<std::ptrdiff_t>(index_of(per_stage[0], {PipeOp::backward, 1, 1})));
  expect_error([&] { check_pipe_schedules(per_stage); },
               {"stage 0 of 2", "reduce_tied_gradients", "before micro-batch 1's backward finished"});

  // The last stage drops a backward: it sends a gradient it never computed.
  auto last_dropped = pipeline(PipeScheduleKind::gpipe, 3, 2);
  auto& last = last_dropped[2].instructions;
  last.erase(last.begin() + static_cast<std::ptrdiff_t>(index_of(last_dropped[2], {PipeOp::backward, 0, 0})));
  expect_error([&] { check_pipe_schedules(last_dropped); },
               {"stage 2 of 3", "send_gradient(buffer 0, micro-batch 0)", "before its backward"});

  // The last stage without micro-batch 0's whole backward (backward and send).
  auto whole = pipeline(PipeScheduleKind::gpipe, 2, 2);
  std::erase_if(whole[1].instructions, [](const PipeInstruction& instruction) {
    return instruction.micro_batch == 0 &&
           (instruction.op == PipeOp::backward || instruction.op == PipeOp::send_gradient);
  });
  expect_error([&] { check_pipe_schedules(whole); },
               {"stage 1 of 2", "reduce_tied_gradients", "before micro-batch 0's backward finished"});

  // Inference without the last forward on the last stage.
  auto inference = pipeline(PipeScheduleKind::inference, 2, 3);
  inference[1].instructions.erase(inference[1].instructions.end() - 1);
  expect_error([&] { check_pipe_schedules(inference); },
               {"stage 1 of 2 never runs the forward of micro-batch 2", "inference"});

  // A train schedule without its optimizer step.
  auto stepless = pipeline(PipeScheduleKind::one_f_one_b, 2, 2);
  stepless[1].instructions.pop_back();
  expect_error([&] { check_pipe_schedules(stepless); }, {"stage 1 of 2 trains but does not end with"});
}

TEST(PipeScheduleCheck, MessagesArriveInOrderAndInputsBeforeForwards) {
  // Stage 1 receives micro-batch 1 before micro-batch 0 (GPipe forwards swapped there).
  auto per_stage = pipeline(PipeScheduleKind::gpipe, 2, 2);
  auto& second = per_stage[1].instructions;
  std::rotate(second.begin(), second.begin() + 3, second.begin() + 6);
  expect_error([&] { check_pipe_schedules(per_stage); },
               {"stage 1 of 2, instruction 0", "receives the activation of micro-batch 1",
                "stage 0 sent the activation of micro-batch 0 first"});

  // The last stage forgets to load its targets.
  auto unloaded = pipeline(PipeScheduleKind::one_f_one_b, 2, 2);
  auto& last = unloaded[1].instructions;
  last.erase(last.begin() +
             static_cast<std::ptrdiff_t>(index_of(unloaded[1], {PipeOp::load_micro_batch, 0, 1})));
  expect_error([&] { check_pipe_schedules(unloaded); },
               {"forward(buffer 0, micro-batch 1)", "before the micro-batch is loaded"});

  // A middle stage loads.
  auto middle = pipeline(PipeScheduleKind::inference, 3, 1);
  middle[1].instructions.insert(middle[1].instructions.begin(), {PipeOp::load_micro_batch, 0, 0});
  expect_error([&] { check_pipe_schedules(middle); }, {"stage 1 of 3", "only the first stage loads inputs"});

  // The step's reduce before the last backward.
  auto early = pipeline(PipeScheduleKind::gpipe, 1, 2);
  std::rotate(early[0].instructions.end() - 4, early[0].instructions.end() - 3,
              early[0].instructions.end() - 2);
  expect_error([&] { check_pipe_schedules(early); },
               {"reduce_tied_gradients", "before micro-batch 1's backward finished"});

  // Two forwards of one micro-batch.
  auto twice = pipeline(PipeScheduleKind::inference, 1, 2);
  twice[0].instructions.push_back({PipeOp::forward, 1, 1});
  expect_error([&] { check_pipe_schedules(twice); }, {"instruction 4", "the forward runs twice"});
}

}  // namespace
