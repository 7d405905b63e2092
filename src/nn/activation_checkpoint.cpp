// ActivationCheckpoint: keep a run of layers' input, recompute their activations in the backward.
#include <exception>
#include <memory>
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
  const bool to_host = keep_input_on_host_ && !execution.device().is_host() && input.defined();
  if (to_host) {
    // Pinned, so that the copy is asynchronous (CUDA copies into pageable memory synchronously);
    // freed in the compute stream's order, so it is reused only after the copies that use it.
    saved.host_input = execution.allocate_pinned_host(input.nbytes(), MemoryCategory::activations);
    saved.input = Tensor::view_of(saved.host_input.data(), input.shape(), input.dtype(), Device::host());
  } else {
    saved.input = input;
  }
  void* const host_copy = saved.host_input.data();  // a Buffer keeps its address when moved
  for (const Dropout* dropout : dropouts_of(*this)) saved.dropout_streams.push_back(dropout->next_stream());
  // Saved first: a second forward into an occupied slot fails before any layer runs (and before
  // the copy starts), and a layer that fails releases this slot again (run_forward).
  saved_.save(context, std::move(saved));
  RunContext without_saving = context;
  without_saving.save_for_backward = false;
  if (!to_host) return run_layers(input, without_saving);

  // The copy runs on the transfer stream while the layers' kernels run on the compute stream. Before
  // anything can free `input` or the pinned copy (both freed in the compute stream's order: the
  // caller's tensor after this returns, the slot in the backward or when a layer fails), the compute
  // stream waits for the copy: an event, no host wait.
  execution.to_host_async(host_copy, input.raw_data(), input.nbytes());
  Tensor output;
  try {
    output = run_layers(input, without_saving);
  } catch (...) {
    try {
      execution.compute_waits_for_transfers();
    } catch (const std::exception&) {  // a failed device: the layer's error is the one to report
    }
    throw;
  }
  execution.compute_waits_for_transfers();
  return output;
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
  Tensor input;
  if (saved.uploaded.defined()) {
    // Queued on the transfer stream by the checkpoint after this one: the fence's release orders
    // the compute stream (the recompute, then the frees of the pinned copy) after it.
    saved.upload_fence.reset();
    input = std::move(saved.uploaded);
  } else {
    // Queued on the compute stream ahead of the recompute, which it therefore precedes without a
    // host wait (the source is pinned); the pinned copy's free right after it records its fence on
    // the compute stream after the upload, so the pinned cache cannot reuse it too early.
    input = context.exec().on_device(saved.input, MemoryCategory::activations);
  }
  saved.input = Tensor();
  saved.host_input = Buffer();
  // The checkpoint before this one runs its backward next: its input's upload overlaps this one's
  // recompute and backward. Queued after this one's own fence, which would otherwise make the
  // recompute wait for it too.
  queue_previous_upload(context);
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

void ActivationCheckpoint::queue_previous_upload(const RunContext& context) {
  if (previous_ == nullptr || previous_ == this) return;
  const ExecutionContext& execution = context.exec();
  Saved* slot = previous_->saved_.find(context.micro_batch);
  if (slot == nullptr || slot->host_input.data() == nullptr || slot->uploaded.defined()) return;
  slot->uploaded = execution.empty(slot->input.shape(), slot->input.dtype(), MemoryCategory::activations);
  execution.from_host_async(slot->uploaded.raw_data(), slot->host_input.data(), slot->input.nbytes());
  const ExecutionContext* ordered = &execution;
  slot->upload_fence = std::shared_ptr<const void>(ordered, [](const ExecutionContext* fenced) noexcept {
    try {
      fenced->compute_waits_for_transfers();
    } catch (const std::exception&) {  // a failed device: nothing more can be ordered on it
    }
  });
}

}  // namespace zt::nn
