// Bring your own model: train parameters that live in the caller's own buffers (hand-written code,
// libtorch, Kokkos views, Fortran arrays) with zerotrain's optimizer, data-parallel reduction and
// ZeRO partitioning, while the caller runs forward and backward itself.
//
//   zt::ExternalModel model;
//   model.add("layer1.weight", w1, dw1, {256, 784}, zt::DType::fp32);   // values and gradients
//   auto engine = zt::initialize(runtime, model, config);
//   for (...) { my_forward_backward(w1, dw1, ...);  // accumulate into dw1 (+=)
//               engine->step(); }                     // reduce, update, write back at the boundary
//
// The engine keeps its own flat copy of the values and gradients (so that communication and the
// optimizer run over one buffer). At each accumulation boundary it copies the caller's gradients
// in, reduces them across data-parallel ranks, updates, writes the new values back into the
// caller's buffers and zeroes the caller's gradients. Between boundaries it touches nothing.
#pragma once

#include <string>

#include "zerotrain/nn.hpp"

namespace zt {

class ExternalModel : public nn::Module {
 public:
  ExternalModel() : Module("ExternalModel") {}

  /// Register a parameter: `values` and `gradients` are buffers of numel(shape) elements of `dtype`
  /// in memory of `device` (the host by default), owned by the caller and alive as long as the
  /// engine. Names must be unique and without dots. Returns the zt view of it.
  nn::Parameter& add(const std::string& name, void* values, void* gradients, const Shape& shape, DType dtype,
                     Device device = Device::host());

  /// Losses computed by the caller, for the engine's step report (mean over the micro-batches of
  /// a step and over ranks). Optional.
  void report_loss(double loss);
  /// Losses reported since the engine last took them (sum, count), and reset.
  std::pair<double, std::int64_t> take_losses();

 protected:
  Tensor forward(const Tensor& input, const nn::RunContext& context) override;
  Tensor backward(const Tensor& grad_output, const nn::RunContext& context) override;

 private:
  double loss_sum_ = 0.0;
  std::int64_t loss_count_ = 0;
};

}  // namespace zt
