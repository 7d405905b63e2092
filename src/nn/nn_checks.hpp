// Small helpers shared by the layers: input checks that name the module, activation allocation.
#pragma once

#include <string>

#include "zerotrain/nn.hpp"

namespace zt::nn::detail {

/// `tensor` must be memory of the run context's device (kernels run there).
inline void check_on_device(const Module& module, const char* what, const Tensor& tensor,
                            const RunContext& context) {
  const Device device = context.exec().device();
  ZT_CHECK(tensor.device() == device, module.type_name(), " '", module.name(), "': ", what, " is ",
           tensor.description(), ", expected memory of the run context's device ", device.str());
}

/// `tensor` must be defined, of `dtype`, on the context's device and (when last_dim >= 0) have
/// `last_dim` as its last extent.
inline void check_input(const Module& module, const char* what, const Tensor& tensor, DType dtype,
                        std::int64_t last_dim, const RunContext& context) {
  ZT_CHECK(tensor.defined(), module.type_name(), " '", module.name(), "': ", what, " is undefined");
  ZT_CHECK(tensor.dtype() == dtype, module.type_name(), " '", module.name(), "': ", what, " is ",
           tensor.description(), ", expected dtype ", dtype_name(dtype), " (the parameters' dtype)");
  ZT_CHECK(last_dim < 0 || (tensor.ndim() >= 1 && tensor.size(-1) == last_dim), module.type_name(), " '",
           module.name(), "': ", what, " is ", tensor.description(), ", expected the last dimension to be ",
           last_dim);
  check_on_device(module, what, tensor, context);
}

/// The parameter's value, checked to be on the context's device.
inline const Tensor& value_of(const Module& module, Parameter& parameter, const RunContext& context) {
  ZT_CHECK(parameter.value.defined(), module.type_name(), " '", module.name(), "': parameter '",
           parameter.name, "' has no value (partitioned away and not gathered?)");
  ZT_CHECK(parameter.value.device() == context.exec().device(), module.type_name(), " '", module.name(),
           "': parameter '", parameter.name, "' is ", parameter.value.description(),
           ", expected memory of the run context's device ", context.exec().device().str());
  return parameter.value;
}

/// A new activation (or activation gradient) tensor on the context's device, in the dtype of `like`.
inline Tensor activation_tensor(const Shape& shape, const Tensor& like, const RunContext& context) {
  return context.exec().empty(shape, like.dtype(), MemoryCategory::activations);
}

/// The parameter's gradient buffer, or nullptr when it has none (frozen parameter).
inline void* grad_pointer(const Module& module, Parameter& parameter, const RunContext& context) {
  // A streaming backward's full-shape part (a bias next to a streamed weight): the sink provides it.
  if (!parameter.grad.defined() && parameter.gradient_sink != nullptr)
    parameter.gradient_sink->full_gradient(parameter);
  if (!parameter.grad.defined()) return nullptr;
  ZT_CHECK(
      parameter.grad.numel() == parameter.value.numel() && parameter.grad.dtype() == parameter.value.dtype(),
      "parameter '", parameter.name, "': grad ", parameter.grad.description(), " does not match value ",
      parameter.value.description());
  ZT_CHECK(parameter.grad.device() == context.exec().device(), module.type_name(), " '", module.name(),
           "': the gradient of '", parameter.name, "' is ", parameter.grad.description(),
           ", expected memory of the run context's device ", context.exec().device().str());
  return parameter.grad.raw_data();
}

/// A parameter's gradient of this backward, given by rows ([rows, numel / rows]; see GradientSink):
/// to its gradient sink when the engine set one, else accumulated into `grad` in one call (none
/// when the parameter has no gradient buffer).
inline void accumulate_gradient_rows(const Module& module, Parameter& parameter, const RunContext& context,
                                     std::int64_t rows, const GradientSink::RowsFunction& compute) {
  if (parameter.gradient_sink != nullptr && !parameter.grad.defined()) {
    parameter.gradient_sink->stream(parameter, rows, compute);
    return;
  }
  if (void* grad = grad_pointer(module, parameter, context)) compute(0, rows, grad);
}

}  // namespace zt::nn::detail
