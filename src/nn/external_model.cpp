// zt::ExternalModel: parameters in the caller's buffers.
#include "zerotrain/external_model.hpp"

#include "zerotrain/error.hpp"

namespace zt {

nn::Parameter& ExternalModel::add(const std::string& name, void* values, void* gradients, const Shape& shape,
                                  DType dtype, Device device) {
  ZT_CHECK(values != nullptr && gradients != nullptr, "ExternalModel::add('", name,
           "'): the values and gradient buffers must not be null");
  ZT_CHECK(values != gradients, "ExternalModel::add('", name,
           "'): values and gradients must be different buffers");
  nn::Parameter& parameter = register_parameter(name, Tensor::view_of(values, shape, dtype, device));
  parameter.grad = Tensor::view_of(gradients, shape, dtype, device);  // the caller's, not a zt allocation
  return parameter;
}

void ExternalModel::report_loss(double loss) {
  loss_sum_ += loss;
  ++loss_count_;
}

std::pair<double, std::int64_t> ExternalModel::take_losses() {
  const std::pair<double, std::int64_t> losses{loss_sum_, loss_count_};
  loss_sum_ = 0.0;
  loss_count_ = 0;
  return losses;
}

Tensor ExternalModel::forward(const Tensor&, const nn::RunContext&) {
  ZT_THROW(
      "ExternalModel: the caller runs forward and backward itself; call Engine::step() after each backward");
}

Tensor ExternalModel::backward(const Tensor&, const nn::RunContext&) {
  ZT_THROW(
      "ExternalModel: the caller runs forward and backward itself; call Engine::step() after each backward");
}

}  // namespace zt
