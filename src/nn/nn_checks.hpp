// Small helpers shared by the layers: input checks that name the module, activation allocation.
#pragma once

#include <string>

#include "zerotrain/nn.hpp"

namespace zt::nn::detail {

/// `tensor` must be defined, of `dtype`, and (when last_dim >= 0) have `last_dim` as its last extent.
inline void check_input(const Module& module, const char* what, const Tensor& tensor, DType dtype,
                        std::int64_t last_dim) {
  ZT_CHECK(tensor.defined(), module.type_name(), " '", module.name(), "': ", what, " is undefined");
  ZT_CHECK(tensor.dtype() == dtype, module.type_name(), " '", module.name(), "': ", what, " is ",
           tensor.description(), ", expected dtype ", dtype_name(dtype), " (the parameters' dtype)");
  ZT_CHECK(last_dim < 0 || (tensor.ndim() >= 1 && tensor.size(-1) == last_dim), module.type_name(), " '",
           module.name(), "': ", what, " is ", tensor.description(), ", expected the last dimension to be ",
           last_dim);
}

/// A new activation (or activation gradient) tensor on the device and in the dtype of `like`.
inline Tensor activation_tensor(const Shape& shape, const Tensor& like) {
  return Tensor::empty(shape, like.dtype(), like.device(), MemoryCategory::activations);
}

/// The parameter's gradient buffer, or nullptr when it has none (frozen parameter).
inline void* grad_pointer(Parameter& parameter) {
  if (!parameter.grad.defined()) return nullptr;
  ZT_CHECK(
      parameter.grad.numel() == parameter.value.numel() && parameter.grad.dtype() == parameter.value.dtype(),
      "parameter '", parameter.name, "': grad ", parameter.grad.description(), " does not match value ",
      parameter.value.description());
  return parameter.grad.raw_data();
}

}  // namespace zt::nn::detail
