// ActivationCheckpoint: keep a run of layers' input, recompute their activations in the backward.
#include <vector>

#include "zerotrain/nn.hpp"

namespace zt::nn {
namespace {

/// The Dropouts among `module`'s descendants, pre-order (the order of their saved streams).
std::vector<Dropout*> dropouts_of(Module& module) {
  std::vector<Dropout*> dropouts;
  for (Module* descendant : module.modules()) {
    if (auto* dropout = dynamic_cast<Dropout*>(descendant)) dropouts.push_back(dropout);
  }
  return dropouts;
}

/// For its lifetime, the dropouts draw the masks of the streams they had at the forward; afterwards
/// (also when the recompute fails) they continue where they were, as if no recompute had run.
class ReplayedDropoutStreams {
 public:
  ReplayedDropoutStreams(std::vector<Dropout*> dropouts, const std::vector<std::uint64_t>& forward_streams)
      : dropouts_(std::move(dropouts)) {
    current_.reserve(dropouts_.size());
    for (std::size_t i = 0; i < dropouts_.size(); ++i) {
      current_.push_back(dropouts_[i]->next_stream());
      dropouts_[i]->set_next_stream(forward_streams[i]);
    }
  }
  ~ReplayedDropoutStreams() {
    for (std::size_t i = 0; i < dropouts_.size(); ++i) dropouts_[i]->set_next_stream(current_[i]);
  }
  ReplayedDropoutStreams(const ReplayedDropoutStreams&) = delete;
  ReplayedDropoutStreams& operator=(const ReplayedDropoutStreams&) = delete;

 private:
  std::vector<Dropout*> dropouts_;
  std::vector<std::uint64_t> current_;
};

}  // namespace

ActivationCheckpoint::ActivationCheckpoint(bool keep_input_on_host)
    : Module("ActivationCheckpoint"), keep_input_on_host_(keep_input_on_host) {}

Tensor ActivationCheckpoint::run_layers(const Tensor& input, const RunContext& context) {
  Tensor x = input;
  for (Module* layer : children()) x = layer->run_forward(x, context);
  return x;
}

Tensor ActivationCheckpoint::forward(const Tensor& input, const RunContext& context) {
  if (!saves_for_backward(context)) return run_layers(input, context);
  Saved saved;
  const ExecutionContext& execution = context.exec();
  if (keep_input_on_host_ && !execution.device().is_host() && input.defined()) {
    saved.input = Tensor::empty(input.shape(), input.dtype(), Device::host(), MemoryCategory::activations);
    execution.to_host(saved.input.raw_data(), input.raw_data(), input.nbytes());
  } else {
    saved.input = input;
  }
  for (const Dropout* dropout : dropouts_of(*this)) saved.dropout_streams.push_back(dropout->next_stream());
  // Saved first: a second forward into an occupied slot fails before any layer runs, and a layer
  // that fails releases this slot again (run_forward).
  saved_.save(context, std::move(saved));
  RunContext without_saving = context;
  without_saving.save_for_backward = false;
  return run_layers(input, without_saving);
}

Tensor ActivationCheckpoint::backward(const Tensor& grad_output, const RunContext& context) {
  Saved saved = saved_.take(context);
  ZT_CHECK(training(), "ActivationCheckpoint '", name(), "': backward of micro-batch ", context.micro_batch,
           " in evaluation mode; its training forward is recomputed, so run the backward in training mode "
           "(call train() before it)");
  std::vector<Dropout*> dropouts = dropouts_of(*this);
  ZT_CHECK(dropouts.size() == saved.dropout_streams.size(), "ActivationCheckpoint '", name(),
           "': ", dropouts.size(), " dropouts among its layers at the backward of micro-batch ",
           context.micro_batch, ", ", saved.dropout_streams.size(),
           " at its forward; add layers only between passes");
  const Tensor input = context.exec().on_device(saved.input, MemoryCategory::activations);
  saved.input = Tensor();  // the host copy is not needed any more
  {
    const ReplayedDropoutStreams replay(std::move(dropouts), saved.dropout_streams);
    RunContext saving = context;
    saving.save_for_backward = true;
    (void)run_layers(input, saving);
  }
  Tensor grad = grad_output;
  const std::vector<Module*> layers = children();
  for (auto it = layers.rbegin(); it != layers.rend(); ++it) grad = (*it)->run_backward(grad, context);
  return grad;
}

}  // namespace zt::nn
