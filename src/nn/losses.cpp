// Losses: softmax cross-entropy and mean squared error, each a forward (scalar) and a backward
// (gradient of scale * loss).
#include "kernels/nn_kernels.hpp"
#include "zerotrain/nn.hpp"

namespace zt::nn {

double SoftmaxCrossEntropy::forward(const Tensor& logits, const Tensor& targets) {
  ZT_CHECK(logits.defined() && dtype_is_floating(logits.dtype()) && logits.ndim() >= 1,
           "SoftmaxCrossEntropy: logits ", logits.description(), ", expected a floating [..., vocab] tensor");
  ZT_CHECK(targets.defined() && targets.dtype() == DType::int32, "SoftmaxCrossEntropy: targets ",
           targets.description(), ", expected int32");
  const std::int64_t vocab = logits.size(-1);
  const Shape leading(logits.shape().begin(), logits.shape().end() - 1);
  ZT_CHECK(targets.shape() == leading, "SoftmaxCrossEntropy: targets ", targets.description(),
           " do not match logits ", logits.description(), ": expected targets of shape ",
           shape_string(leading));
  const std::int64_t rows = targets.numel();
  saved_logsumexp_ = Tensor::empty({rows}, kernels::stat_dtype(logits.dtype()), logits.device(),
                                   MemoryCategory::activations);
  saved_scalars_ = Tensor::empty({2}, DType::fp64, logits.device(), MemoryCategory::activations);
  auto* scalars = static_cast<kernels::CrossEntropyScalars*>(saved_scalars_.raw_data());
  const Stream& stream = default_stream(logits.device());
  kernels::cross_entropy_forward(stream, logits.dtype(), logits.raw_data(), targets.data<std::int32_t>(),
                                 saved_logsumexp_.raw_data(), rows, vocab, ignore_index_, scalars);
  kernels::CrossEntropyScalars result;
  copy_bytes(&result, Device::host(), scalars, logits.device(), sizeof(result), &stream);
  stream.synchronize();
  saved_logits_ = logits;
  saved_targets_ = targets;
  counted_rows_ = static_cast<std::int64_t>(result.counted_rows);
  return result.mean_loss;
}

Tensor SoftmaxCrossEntropy::backward(double scale) {
  ZT_CHECK(saved_logits_.defined(), "SoftmaxCrossEntropy::backward before forward");
  Tensor grad = Tensor::empty(saved_logits_.shape(), saved_logits_.dtype(), saved_logits_.device(),
                              MemoryCategory::activations);
  kernels::cross_entropy_backward(
      default_stream(saved_logits_.device()), saved_logits_.dtype(), saved_logits_.raw_data(),
      saved_targets_.data<std::int32_t>(), saved_logsumexp_.raw_data(),
      static_cast<const kernels::CrossEntropyScalars*>(saved_scalars_.raw_data()), grad.raw_data(),
      saved_targets_.numel(), saved_logits_.size(-1), ignore_index_, scale);
  return grad;
}

double MseLoss::forward(const Tensor& prediction, const Tensor& target) {
  ZT_CHECK(prediction.defined() && target.defined() && dtype_is_floating(prediction.dtype()) &&
               prediction.dtype() == target.dtype() && prediction.shape() == target.shape(),
           "MseLoss: prediction ", prediction.description(), " and target ", target.description(),
           ": expected floating tensors of the same dtype and shape");
  saved_prediction_ = prediction;
  saved_target_ = target;
  Tensor loss = Tensor::empty({}, DType::fp64, prediction.device(), MemoryCategory::activations);
  const Stream& stream = default_stream(prediction.device());
  kernels::mse_forward(stream, prediction.dtype(), prediction.raw_data(), target.raw_data(),
                       prediction.numel(), loss.data<double>());
  return loss.item_as_double();
}

Tensor MseLoss::backward(double scale) {
  ZT_CHECK(saved_prediction_.defined(), "MseLoss::backward before forward");
  Tensor grad = Tensor::empty(saved_prediction_.shape(), saved_prediction_.dtype(),
                              saved_prediction_.device(), MemoryCategory::activations);
  kernels::mse_backward(default_stream(saved_prediction_.device()), saved_prediction_.dtype(),
                        saved_prediction_.raw_data(), saved_target_.raw_data(), grad.raw_data(),
                        saved_prediction_.numel(), scale);
  return grad;
}

}  // namespace zt::nn
