// The gradient side shared by every ZeRO strategy, and the choice of strategy (see zero_strategy.hpp).
#include "src/engine/zero_strategy.hpp"

#include <algorithm>
#include <cstring>

#include "kernels/nn_kernels.hpp"
#include "src/engine/flat_parameters.hpp"
#include "src/engine/sharded_parameters.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/external_model.hpp"

namespace zt::engine_detail {

std::unique_ptr<ZeroStrategy> make_zero_strategy(const StrategyInputs& inputs) {
  if (inputs.plan.partitioning().parameters) return std::make_unique<ShardedParameters>(inputs);
  return std::make_unique<FlatParameters>(inputs);
}

ZeroStrategy::ZeroStrategy(const StrategyInputs& inputs)
    : plan_(inputs.plan),
      execution_(inputs.execution),
      parallel_(inputs.parallel),
      model_parameters_(inputs.parameters),
      external_(inputs.external),
      dtype_(inputs.plan.settings().compute_dtype) {
  ZT_CHECK(model_parameters_.size() == plan_.size(), "ZeRO strategy: ", model_parameters_.size(),
           " parameters for a plan of ", plan_.size());
  const ZeroPartitioning& partitioning = plan_.partitioning();
  ZT_CHECK_AS(
      ConfigError, external_ == nullptr || execution_.device().is_host(),
      "a zt::ExternalModel keeps its parameters in the caller's host buffers; train it on the host, not ",
      execution_.device().str());
  gradients_ = execution_.allocate(
      static_cast<std::size_t>(plan_.gradient_buffer_elements()) * element_size(), MemoryCategory::gradients);
  execution_.zero(gradients_.data(), gradients_.size());
  if (external_ == nullptr) {
    for (std::size_t i = 0; i < model_parameters_.size(); ++i) {
      const FlatParameter& slot = plan_.layout()[i];
      // In place: the module accumulates into its view of the flat buffer. Partitioned: a full
      // gradient exists only while a backward reaches its modules.
      model_parameters_[i]->grad =
          partitioning.gradients
              ? Tensor()
              : Tensor::view_of(gradient_buffer() + static_cast<std::size_t>(slot.offset) * element_size(),
                                slot.shape, dtype_, execution_.device());
    }
  }

  const PlanSettings& settings = plan_.settings();
  GradientReducerOptions reduction;
  reduction.destination = !partitioning.optimizer_states ? GradientDestination::flat_whole
                          : !partitioning.gradients      ? GradientDestination::flat_own_piece
                                                         : GradientDestination::shard;
  reduction.gradient_dtype = dtype_;
  reduction.wire_dtype = settings.wire_dtype;
  reduction.op = inputs.config.gradient_allreduce_op == GradientReduceOp::sum ? ReduceOp::sum : ReduceOp::avg;
  reduction.bucket_capacity = plan_.reduce_bucket_capacity();
  reduction.bucket_region = plan_.reduce_bucket_region();
  reduction.overlap = settings.overlap_comm;
  reducer_ = std::make_unique<GradientReducer>(*parallel_.data().device, execution_, plan_.layout(),
                                               reduction, gradient_buffer());

  uses_per_parameter_.assign(model_parameters_.size(), 0);
  for (const ModuleUse& use : inputs.uses) {
    for (std::size_t index : use.parameters) ++uses_per_parameter_[index];
  }
  pending_uses_ = uses_per_parameter_;
  reduced_this_pass_.assign(model_parameters_.size(), 0);
}

ZeroStrategy::~ZeroStrategy() = default;

const std::byte* ZeroStrategy::gradient(std::size_t index) const {
  return gradients_.as<std::byte>() +
         static_cast<std::size_t>(plan_.owned()[index].gradient_offset) * element_size();
}

std::byte* ZeroStrategy::gradient(std::size_t index) {
  return gradients_.as<std::byte>() +
         static_cast<std::size_t>(plan_.owned()[index].gradient_offset) * element_size();
}

double ZeroStrategy::wait_seconds() const {
  return reducer_->wait_seconds() + parameter_wait_seconds();
}

void ZeroStrategy::begin_backward(BackwardPass pass) {
  // In place (stages 0-1) the gradients are communicated once per step, in the boundary
  // micro-batch's backward; partitioned (stages 2-3), every micro-batch's gradients are reduced
  // into the shard, so no full gradient is kept between micro-batches.
  const bool partitioned = plan_.partitioning().gradients;
  reducing_this_pass_ = partitioned || (pass.boundary && parallel_.data().size() > 1);
  if (!reducing_this_pass_) return;
  reducer_->begin(partitioned && !pass.first_of_step);
  pending_uses_ = uses_per_parameter_;
  std::fill(reduced_this_pass_.begin(), reduced_this_pass_.end(), 0);
}

void ZeroStrategy::before_backward(const ModuleUse& use) {
  gather_for_backward(use);
  if (plan_.partitioning().gradients) {
    // A streaming module hands its gradients to the sink; any other gets zeroed full-shape ones.
    const bool streams = use.module != nullptr && use.module->streams_gradients();
    if (streams) streaming_use_ = &use;
    for (std::size_t index : use.parameters) {
      nn::Parameter& parameter = *model_parameters_[index];
      if (streams) {
        parameter.gradient_sink = this;
      } else if (!parameter.grad.defined()) {
        parameter.grad = execution_.zeros(plan_.layout()[index].shape, dtype_, MemoryCategory::gradients);
      }
    }
  }
  if (reducing_this_pass_) reducer_->poll();
}

void ZeroStrategy::reduce(std::size_t index) {
  nn::Parameter& parameter = *model_parameters_[index];
  // A later contribution of the same backward adds to the shard where the first one overwrote it.
  reducer_->add(index, parameter.grad.raw_data(), dtype_, reduced_this_pass_[index] != 0);
  reduced_this_pass_[index] = 1;
  if (plan_.partitioning().gradients) parameter.grad = Tensor();
}

void ZeroStrategy::stream(nn::Parameter& parameter, std::int64_t rows, const RowsFunction& compute) {
  ZT_CHECK(streaming_use_ != nullptr, "parameter '", parameter.name,
           "': a gradient streamed outside a streaming module's backward");
  const auto found = std::find_if(streaming_use_->parameters.begin(), streaming_use_->parameters.end(),
                                  [&](std::size_t index) { return model_parameters_[index] == &parameter; });
  ZT_CHECK(found != streaming_use_->parameters.end(), "parameter '", parameter.name,
           "': streamed by a module that does not use it");
  const std::size_t index = *found;
  const FlatParameter& slot = plan_.layout()[index];
  ZT_CHECK(rows > 0 && slot.numel % rows == 0, "parameter '", parameter.name, "' (", slot.numel,
           " elements) streamed as ", rows, " rows");
  const std::int64_t row = slot.numel / rows;
  const std::int64_t piece = slot.piece_numel;
  // Range by range of the pieces, as the open bucket takes them: rank q's elements
  // [q piece + offset, + length) lie in rows [first, last), computed into a buffer of those rows
  // only (a row two ranges share is computed for each), then converted into the bucket. One buffer
  // for the longest range (at most a bucket region) serves every range.
  const std::int64_t longest = std::min(piece, plan_.reduce_bucket_region());
  Tensor range_rows =
      execution_.empty({((longest + row - 1) / row + 1) * row}, dtype_, MemoryCategory::gradients);
  for (std::int64_t offset = 0; offset < piece;) {
    const std::int64_t length = reducer_->begin_range(index, offset, reduced_this_pass_[index] != 0);
    for (int q = 0; q < plan_.partition_count(); ++q) {
      const std::int64_t begin = q * piece + offset;
      const std::int64_t end = std::min(slot.numel, begin + length);
      if (begin >= end) {
        reducer_->write_range(q, nullptr, dtype_);  // all padding
        continue;
      }
      const std::int64_t first = begin / row;
      const std::int64_t last = (end + row - 1) / row;
      ZT_CHECK((last - first) * row <= range_rows.numel(), "parameter '", parameter.name, "': a range of ",
               (last - first) * row, " elements for a buffer of ", range_rows.numel());
      execution_.zero(range_rows.raw_data(), static_cast<std::size_t>((last - first) * row) * element_size());
      compute(first, last - first, range_rows.raw_data());
      reducer_->write_range(q,
                            static_cast<const std::byte*>(range_rows.raw_data()) +
                                static_cast<std::size_t>(begin - first * row) * element_size(),
                            dtype_);
    }
    reducer_->end_range();
    offset += length;
  }
  reduced_this_pass_[index] = 1;
}

Tensor& ZeroStrategy::full_gradient(nn::Parameter& parameter) {
  ZT_CHECK(!parameter.grad.defined(), "parameter '", parameter.name, "': a full gradient asked for twice");
  parameter.grad = execution_.zeros(parameter.value.shape(), dtype_, MemoryCategory::gradients);
  return parameter.grad;
}

void ZeroStrategy::after_backward(const ModuleUse& use) {
  const bool partitioned = plan_.partitioning().gradients;
  if (partitioned) {
    for (std::size_t index : use.parameters) model_parameters_[index]->gradient_sink = nullptr;
    streaming_use_ = nullptr;
  }
  if (reducing_this_pass_) {
    for (std::size_t index : use.parameters) {
      if (partitioned) {
        // This module's contribution: streamed already, or a full-shape gradient to reduce now.
        if (model_parameters_[index]->grad.defined()) reduce(index);
        continue;
      }
      // In place, a parameter's gradient is final when every module that uses it has run its
      // backward (a tied embedding gets its last contribution from the token embedding, long
      // after the lm_head).
      if (--pending_uses_[index] > 0 || reduced_this_pass_[index]) continue;
      reduce(index);
    }
    reducer_->poll();
  }
  release_after_backward(use);
}

void ZeroStrategy::end_backward() {
  if (reducing_this_pass_) {
    // Parameters no module's backward reached in this pass (unused ones): their gradient is zero.
    for (std::size_t i = model_parameters_.size(); i-- > 0;) {
      if (reduced_this_pass_[i]) continue;
      nn::Parameter& parameter = *model_parameters_[i];
      if (!parameter.grad.defined()) {
        parameter.grad = execution_.zeros(plan_.layout()[i].shape, dtype_, MemoryCategory::gradients);
      }
      reduce(i);
    }
    reducer_->finish();
    reducing_this_pass_ = false;
  }
  end_of_backward();
}

void ZeroStrategy::take_external_gradients() {
  // The caller's gradients are complete at the boundary; reduce them straight from its buffers.
  if (!plan_.partitioning().gradients && parallel_.data().size() == 1) {
    for (std::size_t i = 0; i < model_parameters_.size(); ++i) {
      const FlatParameter& slot = plan_.layout()[i];
      Tensor::view_of(gradient_buffer() + static_cast<std::size_t>(slot.offset) * element_size(), slot.shape,
                      dtype_)
          .copy_from(model_parameters_[i]->grad);
    }
    return;
  }
  reducer_->begin(false);
  for (std::size_t i = model_parameters_.size(); i-- > 0;) {
    const Tensor& gradient = model_parameters_[i]->grad;
    reducer_->add(i, gradient.raw_data(), gradient.dtype());
  }
  reducer_->finish();
}

void ZeroStrategy::clear_gradients() {
  // Partitioned gradients are overwritten by the next step's first backward.
  if (!plan_.partitioning().gradients) execution_.zero(gradients_.data(), gradients_.size());
}

}  // namespace zt::engine_detail
