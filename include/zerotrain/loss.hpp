// The built-in losses as helpers: a model's forward returns its output, a loss helper turns the
// output into a scalar that stays on the device and a gradient function for the backward.
//
//   const zt::Loss loss = zt::cross_entropy_loss(logits, targets, context);
//   model.run_backward(loss.gradient(loss_scale / accumulation_steps), {&context});
//   double value;  // read once a step, not per micro-batch
//   context.to_host(&value, loss.value.raw_data(), sizeof(value));
//
// Every kernel runs on the context's compute stream; the output and the targets must be memory of
// the context's device, and the context must outlive the gradient function.
#pragma once

#include <cstdint>
#include <functional>

#include "zerotrain/execution.hpp"
#include "zerotrain/tensor.hpp"

namespace zt {

struct Loss {
  /// The loss: an fp64 scalar (shape {}) on the output's device, computed in the accumulation type
  /// and summed in a fixed order.
  Tensor value;
  /// d(scale * loss)/d(output): a new tensor shaped like the output, on its device.
  std::function<Tensor(double scale)> gradient;
  /// What the loss was computed from.
  Tensor output;
  /// cross_entropy_loss: the rows that counted (targets other than ignore_index), an fp64 scalar on
  /// the output's device; undefined for mse_loss.
  Tensor counted_rows;
};

/// Mean softmax cross-entropy of logits [..., V] against int32 targets [...]; rows whose target is
/// ignore_index do not count (no counted row: loss 0 and a zero gradient). A target outside
/// [0, V) other than ignore_index is an error naming its row.
Loss cross_entropy_loss(const Tensor& logits, const Tensor& targets,
                        const ExecutionContext& context = ExecutionContext::host(),
                        std::int32_t ignore_index = -100);

/// Mean squared error over all elements of prediction and target (same dtype and shape).
Loss mse_loss(const Tensor& prediction, const Tensor& target,
              const ExecutionContext& context = ExecutionContext::host());

}  // namespace zt
