// Losses: the helpers (zerotrain/loss.hpp) that keep the loss on the device, and the stateful
// SoftmaxCrossEntropy and MseLoss on top of them.
#include "kernels/nn_kernels.hpp"
#include "zerotrain/loss.hpp"
#include "zerotrain/nn.hpp"

namespace zt {
namespace {

void check_on_context_device(const char* loss, const char* what, const Tensor& tensor,
                             const ExecutionContext& context) {
  ZT_CHECK(tensor.device() == context.device(), loss, ": ", what, " ", tensor.description(),
           ", expected memory of the execution context's device ", context.device().str());
}

}  // namespace

Loss cross_entropy_loss(const Tensor& logits, const Tensor& targets, const ExecutionContext& context,
                        std::int32_t ignore_index) {
  ZT_CHECK(logits.defined() && dtype_is_floating(logits.dtype()) && logits.ndim() >= 1,
           "SoftmaxCrossEntropy: logits ", logits.description(), ", expected a floating [..., vocab] tensor");
  ZT_CHECK(targets.defined() && targets.dtype() == DType::int32, "SoftmaxCrossEntropy: targets ",
           targets.description(), ", expected int32");
  const std::int64_t vocab = logits.size(-1);
  const Shape leading(logits.shape().begin(), logits.shape().end() - 1);
  ZT_CHECK(targets.shape() == leading, "SoftmaxCrossEntropy: targets ", targets.description(),
           " do not match logits ", logits.description(), ": expected targets of shape ",
           shape_string(leading));
  check_on_context_device("SoftmaxCrossEntropy", "logits", logits, context);
  check_on_context_device("SoftmaxCrossEntropy", "targets", targets, context);
  const std::int64_t rows = targets.numel();
  Tensor logsumexp = context.empty({rows}, kernels::stat_dtype(logits.dtype()), MemoryCategory::activations);
  Tensor scalars = context.empty({2}, DType::fp64, MemoryCategory::activations);  // CrossEntropyScalars
  auto* result = static_cast<kernels::CrossEntropyScalars*>(scalars.raw_data());
  kernels::cross_entropy_forward(context.compute(), logits.dtype(), logits.raw_data(),
                                 targets.data<std::int32_t>(), logsumexp.raw_data(), rows, vocab,
                                 ignore_index, result);
  Loss loss;
  loss.value = scalars.flat_slice(0, 1).reshape({});
  loss.counted_rows = scalars.flat_slice(1, 1).reshape({});
  loss.output = logits;
  loss.gradient = [logits, targets, logsumexp, scalars, ignore_index, rows, vocab,
                   context = &context](double scale) {
    Tensor grad = context->empty(logits.shape(), logits.dtype(), MemoryCategory::activations);
    kernels::cross_entropy_backward(context->compute(), logits.dtype(), logits.raw_data(),
                                    targets.data<std::int32_t>(), logsumexp.raw_data(),
                                    static_cast<const kernels::CrossEntropyScalars*>(scalars.raw_data()),
                                    grad.raw_data(), rows, vocab, ignore_index, scale);
    return grad;
  };
  return loss;
}

Loss mse_loss(const Tensor& prediction, const Tensor& target, const ExecutionContext& context) {
  ZT_CHECK(prediction.defined() && target.defined() && dtype_is_floating(prediction.dtype()) &&
               prediction.dtype() == target.dtype() && prediction.shape() == target.shape(),
           "MseLoss: prediction ", prediction.description(), " and target ", target.description(),
           ": expected floating tensors of the same dtype and shape");
  check_on_context_device("MseLoss", "prediction", prediction, context);
  check_on_context_device("MseLoss", "target", target, context);
  Loss loss;
  loss.value = context.empty({}, DType::fp64, MemoryCategory::activations);
  kernels::mse_forward(context.compute(), prediction.dtype(), prediction.raw_data(), target.raw_data(),
                       prediction.numel(), loss.value.data<double>());
  loss.output = prediction;
  loss.gradient = [prediction, target, context = &context](double scale) {
    Tensor grad = context->empty(prediction.shape(), prediction.dtype(), MemoryCategory::activations);
    kernels::mse_backward(context->compute(), prediction.dtype(), prediction.raw_data(), target.raw_data(),
                          grad.raw_data(), prediction.numel(), scale);
    return grad;
  };
  return loss;
}

namespace nn {
namespace {

double read_scalar(const Tensor& scalar, const ExecutionContext& context) {
  double value = 0;
  context.to_host(&value, scalar.raw_data(), sizeof(value));
  return value;
}

}  // namespace

double SoftmaxCrossEntropy::forward(const Tensor& logits, const Tensor& targets,
                                    const ExecutionContext& context) {
  loss_ = cross_entropy_loss(logits, targets, context, ignore_index_);
  counted_rows_ = static_cast<std::int64_t>(read_scalar(loss_.counted_rows, context));
  return read_scalar(loss_.value, context);
}

Tensor SoftmaxCrossEntropy::backward(double scale) {
  ZT_CHECK(loss_.gradient != nullptr, "SoftmaxCrossEntropy::backward before forward");
  return loss_.gradient(scale);
}

double MseLoss::forward(const Tensor& prediction, const Tensor& target, const ExecutionContext& context) {
  loss_ = mse_loss(prediction, target, context);
  return read_scalar(loss_.value, context);
}

Tensor MseLoss::backward(double scale) {
  ZT_CHECK(loss_.gradient != nullptr, "MseLoss::backward before forward");
  return loss_.gradient(scale);
}

}  // namespace nn
}  // namespace zt
