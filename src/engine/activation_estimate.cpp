// Peak activation memory of a training step for `zerotrain estimate`: the built-in models' forward
// and backward replayed on byte counts. Each simulated layer below mirrors its zt::nn layer
// (src/nn/layers.cpp, models.cpp, pipeline_stage.cpp, activation_checkpoint.cpp): the same
// allocations (MemoryCategory::activations) in the same order, held by the same references for
// the same C++ lifetimes (a temporary until the end of its full expression, a local until its
// scope ends), so the replay's peak is the allocation's peak. tests/mpi/test_estimate.cpp compares
// it with measured runs; a change to a layer's allocations must change its mirror here.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <utility>
#include <variant>
#include <vector>

#include "src/engine/estimate_table.hpp"
#include "src/engine/model_layers.hpp"
#include "src/engine/pipeline_schedule.hpp"
#include "zerotrain/config.hpp"
#include "zerotrain/engine.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/estimate.hpp"

namespace zt {
namespace {

/// Current and peak bytes of the simulated allocations.
struct Tally {
  std::uint64_t current = 0;
  std::uint64_t peak = 0;
};

/// A simulated tensor: shared like zt::Tensor's storage, its bytes counted until the last
/// reference drops. Default-constructed: an undefined tensor.
class Bytes {
 public:
  Bytes() = default;
  Bytes(Tally& tally, std::uint64_t bytes) : block_(std::make_shared<Block>(tally, bytes)) {}
  bool defined() const { return block_ != nullptr; }
  std::uint64_t size() const { return block_ != nullptr ? block_->bytes_ : 0; }

 private:
  struct Block {
    Block(Tally& tally, std::uint64_t bytes) : tally_(tally), bytes_(bytes) {
      tally_.current += bytes_;
      tally_.peak = std::max(tally_.peak, tally_.current);
    }
    ~Block() { tally_.current -= bytes_; }
    Block(const Block&) = delete;
    Block& operator=(const Block&) = delete;
    Tally& tally_;
    std::uint64_t bytes_;
  };
  std::shared_ptr<Block> block_;
};

/// What a forward or backward runs with: RunContext's micro-batch and save_for_backward; `tally`
/// counts the engine's device (the host, or a GPU), `host` the pinned host copies of checkpoint
/// inputs (cpu_checkpointing on a device).
struct Pass {
  Tally& tally;
  int micro_batch = 0;
  bool save = true;
  Tally* host = nullptr;
  Bytes allocate(std::uint64_t bytes) const { return Bytes(tally, bytes); }
};

/// nn::SavedActivations: one slot per micro-batch in flight.
template <typename T>
class Slots {
 public:
  void save(const Pass& pass, T value) {
    if (pass.save) slots_.emplace(pass.micro_batch, std::move(value));
  }
  T take(const Pass& pass) {
    auto it = slots_.find(pass.micro_batch);
    ZT_CHECK(it != slots_.end(), "activation estimate: backward of micro-batch ", pass.micro_batch,
             " without its forward");
    T value = std::move(it->second);
    slots_.erase(it);
    return value;
  }
  T* find(const Pass& pass) {
    auto it = slots_.find(pass.micro_batch);
    return it == slots_.end() ? nullptr : &it->second;
  }

 private:
  std::map<int, T> slots_;
};

class SimModule {
 public:
  virtual ~SimModule() = default;
  virtual Bytes forward(const Bytes& input, const Pass& pass) = 0;
  virtual Bytes backward(const Bytes& grad_output, const Pass& pass) = 0;
};
using SimPtr = std::unique_ptr<SimModule>;

/// Shapes of one micro-batch: `rows` positions (batch x seq_len, or the MLP's batch) of `element`
/// bytes per value, statistics (LayerNorm mean/rstd, attention log-sum-exps) of `stat` bytes.
struct Widths {
  std::uint64_t rows = 0;
  std::uint64_t element = 0;
  std::uint64_t stat = 0;
  std::uint64_t values(std::int64_t width) const {
    return rows * static_cast<std::uint64_t>(width) * element;
  }
};

/// A module that saves its input and returns a new tensor both ways: nn::Linear and nn::LmHead
/// (in -> out features; no bias: the same bytes), nn::Activation (GELU, ReLU, tanh: width -> width).
class SimSavesInput final : public SimModule {
 public:
  SimSavesInput(Widths widths, std::int64_t in, std::int64_t out) : widths_(widths), in_(in), out_(out) {}
  Bytes forward(const Bytes& input, const Pass& pass) override {
    Bytes output = pass.allocate(widths_.values(out_));
    saved_input_.save(pass, input);
    return output;
  }
  Bytes backward(const Bytes&, const Pass& pass) override {
    const Bytes input = saved_input_.take(pass);
    Bytes grad_input = pass.allocate(widths_.values(in_));
    return grad_input;
  }

 private:
  Widths widths_;
  std::int64_t in_, out_;
  Slots<Bytes> saved_input_;
};

class SimDropout final : public SimModule {  // nn::Dropout in training mode: a mask stream, no bytes
 public:
  SimDropout(Widths widths, std::int64_t width, double p) : widths_(widths), width_(width), active_(p > 0) {}
  Bytes forward(const Bytes& input, const Pass& pass) override {
    if (!active_) return input;
    return pass.allocate(widths_.values(width_));
  }
  Bytes backward(const Bytes& grad_output, const Pass& pass) override {
    if (!active_) return grad_output;
    return pass.allocate(widths_.values(width_));
  }

 private:
  Widths widths_;
  std::int64_t width_;
  bool active_;
};

class SimLayerNorm final : public SimModule {  // nn::LayerNorm: input, mean and rstd saved
 public:
  SimLayerNorm(Widths widths, std::int64_t dim) : widths_(widths), dim_(dim) {}
  Bytes forward(const Bytes& input, const Pass& pass) override {
    Bytes output = pass.allocate(widths_.values(dim_));
    Saved saved{input, pass.allocate(widths_.rows * widths_.stat),
                pass.allocate(widths_.rows * widths_.stat)};
    saved_.save(pass, saved);
    return output;
  }
  Bytes backward(const Bytes&, const Pass& pass) override {
    const Saved saved = saved_.take(pass);
    Bytes grad_input = pass.allocate(widths_.values(dim_));
    return grad_input;
  }

 private:
  struct Saved {
    Bytes input, mean, rstd;
  };
  Widths widths_;
  std::int64_t dim_;
  Slots<Saved> saved_;
};

class SimEmbedding final : public SimModule {  // nn::Embedding: saves the tokens, no input gradient
 public:
  SimEmbedding(Widths widths, std::int64_t dim) : widths_(widths), dim_(dim) {}
  Bytes forward(const Bytes& tokens, const Pass& pass) override {
    Bytes output = pass.allocate(widths_.values(dim_));
    saved_tokens_.save(pass, tokens);
    return output;
  }
  Bytes backward(const Bytes&, const Pass& pass) override {
    const Bytes tokens = saved_tokens_.take(pass);
    return {};
  }

 private:
  Widths widths_;
  std::int64_t dim_;
  Slots<Bytes> saved_tokens_;
};

class SimPositional final : public SimModule {  // nn::PositionalEmbedding: saves nothing
 public:
  SimPositional(Widths widths, std::int64_t dim) : widths_(widths), dim_(dim) {}
  Bytes forward(const Bytes&, const Pass& pass) override { return pass.allocate(widths_.values(dim_)); }
  Bytes backward(const Bytes& grad_output, const Pass&) override { return grad_output; }

 private:
  Widths widths_;
  std::int64_t dim_;
};

class SimAttention final : public SimModule {  // nn::CausalSelfAttention
 public:
  SimAttention(Widths widths, std::int64_t d_model, std::int64_t n_head, double dropout)
      : widths_(widths),
        d_model_(d_model),
        row_logsumexp_(widths.rows * static_cast<std::uint64_t>(n_head) * widths.stat),
        qkv_(widths, d_model, 3 * d_model),
        proj_(widths, d_model, d_model),
        dropout_(widths, d_model, dropout) {}
  Bytes forward(const Bytes& input, const Pass& pass) override {
    Saved saved{qkv_.forward(input, pass), pass.allocate(widths_.values(d_model_)),
                pass.allocate(row_logsumexp_)};
    const Bytes attended = saved.attended;  // also proj's saved input
    saved_.save(pass, saved);
    return dropout_.forward(proj_.forward(attended, pass), pass);
  }
  Bytes backward(const Bytes& grad_output, const Pass& pass) override {
    const Saved saved = saved_.take(pass);
    const Bytes grad_attended = proj_.backward(dropout_.backward(grad_output, pass), pass);
    Bytes grad_qkv = pass.allocate(widths_.values(3 * d_model_));
    return qkv_.backward(grad_qkv, pass);
  }

 private:
  struct Saved {
    Bytes qkv, attended, row_logsumexp;
  };
  Widths widths_;
  std::int64_t d_model_;
  std::uint64_t row_logsumexp_;  // [batch, n_head, T] in the statistics' dtype
  SimSavesInput qkv_, proj_;
  SimDropout dropout_;
  Slots<Saved> saved_;
};

class SimMlpBlock final : public SimModule {  // nn::MLPBlock
 public:
  SimMlpBlock(Widths widths, std::int64_t d_model, double dropout)
      : fc_(widths, d_model, 4 * d_model),
        gelu_(widths, 4 * d_model, 4 * d_model),
        proj_(widths, 4 * d_model, d_model),
        dropout_(widths, d_model, dropout) {}
  Bytes forward(const Bytes& input, const Pass& pass) override {
    const Bytes hidden = gelu_.forward(fc_.forward(input, pass), pass);
    return dropout_.forward(proj_.forward(hidden, pass), pass);
  }
  Bytes backward(const Bytes& grad_output, const Pass& pass) override {
    const Bytes grad_hidden = proj_.backward(dropout_.backward(grad_output, pass), pass);
    return fc_.backward(gelu_.backward(grad_hidden, pass), pass);
  }

 private:
  SimSavesInput fc_;
  SimSavesInput gelu_;
  SimSavesInput proj_;
  SimDropout dropout_;
};

class SimTransformerBlock final : public SimModule {  // nn::TransformerBlock
 public:
  SimTransformerBlock(Widths widths, const GptModelConfig& gpt)
      : widths_(widths),
        d_model_(gpt.d_model),
        ln1_(widths, gpt.d_model),
        attn_(widths, gpt.d_model, gpt.n_head, gpt.dropout),
        ln2_(widths, gpt.d_model),
        mlp_(widths, gpt.d_model, gpt.dropout) {}
  Bytes forward(const Bytes& input, const Pass& pass) override {
    const Bytes attended = attn_.forward(ln1_.forward(input, pass), pass);
    Bytes residual = pass.allocate(widths_.values(d_model_));
    const Bytes transformed = mlp_.forward(ln2_.forward(residual, pass), pass);
    Bytes output = pass.allocate(widths_.values(d_model_));
    return output;
  }
  Bytes backward(const Bytes& grad_output, const Pass& pass) override {
    Bytes grad_residual = ln2_.backward(mlp_.backward(grad_output, pass), pass);
    Bytes grad_input = ln1_.backward(attn_.backward(grad_residual, pass), pass);
    return grad_input;
  }

 private:
  Widths widths_;
  std::int64_t d_model_;
  SimLayerNorm ln1_;
  SimAttention attn_;
  SimLayerNorm ln2_;
  SimMlpBlock mlp_;
};

/// nn::Sequential, nn::PipelineStage's runs and nn::ActivationCheckpoint's layers: one after another.
class SimSequence : public SimModule {
 public:
  explicit SimSequence(std::vector<SimPtr> layers) : layers_(std::move(layers)) {}
  Bytes forward(const Bytes& input, const Pass& pass) override {
    Bytes x = input;
    for (const SimPtr& layer : layers_) x = layer->forward(x, pass);
    return x;
  }
  Bytes backward(const Bytes& grad_output, const Pass& pass) override {
    Bytes grad = grad_output;
    for (auto it = layers_.rbegin(); it != layers_.rend(); ++it) grad = (*it)->backward(grad, pass);
    return grad;
  }

 protected:
  std::vector<SimPtr> layers_;
};

/// nn::ActivationCheckpoint: keeps its input, runs its layers without saving, and recomputes them
/// with saving in the backward. With its input on the host (cpu_checkpointing with the engine on a
/// device) it keeps a pinned host copy instead of the device's input, and its backward holds the
/// input uploaded again: queued by the backward of the checkpoint after it (set_previous_checkpoint,
/// `previous` here), which therefore also holds it, or by its own backward for the last one.
class SimCheckpoint final : public SimSequence {
 public:
  SimCheckpoint(std::vector<SimPtr> layers, bool input_on_host, SimCheckpoint* previous)
      : SimSequence(std::move(layers)), input_on_host_(input_on_host), previous_(previous) {}
  Bytes forward(const Bytes& input, const Pass& pass) override {
    if (!pass.save) return SimSequence::forward(input, pass);
    if (input_on_host_) {
      ZT_CHECK(pass.host != nullptr,
               "activation estimate: a checkpoint input on the host without a host tally");
      on_host_.save(pass, {Bytes(*pass.host, input.size()), input.size(), Bytes()});
    } else {
      saved_input_.save(pass, input);
    }
    Pass without_saving = pass;
    without_saving.save = false;
    return SimSequence::forward(input, without_saving);
  }
  Bytes backward(const Bytes& grad_output, const Pass& pass) override {
    Bytes input;
    if (input_on_host_) {
      OnHost kept = on_host_.take(pass);
      input = kept.uploaded.defined() ? kept.uploaded : pass.allocate(kept.bytes);
      kept = OnHost{};  // the slot's pinned copy and its reference to the upload go
      if (previous_ != nullptr) previous_->queue_upload(pass);
    } else {
      input = saved_input_.take(pass);
    }
    (void)SimSequence::forward(input, pass);
    return SimSequence::backward(grad_output, pass);
  }

 private:
  struct OnHost {
    Bytes host_copy;
    std::uint64_t bytes = 0;
    Bytes uploaded;  // on the device, queued by the next checkpoint's backward
  };
  void queue_upload(const Pass& pass) {
    OnHost* kept = on_host_.find(pass);
    if (kept == nullptr || kept->uploaded.defined()) return;
    kept->uploaded = pass.allocate(kept->bytes);
  }

  bool input_on_host_;
  SimCheckpoint* previous_;
  Slots<Bytes> saved_input_;
  Slots<OnHost> on_host_;
};

/// Layers grouped into checkpoints of `interval` (0: none), as nn::Gpt's blocks, nn::Mlp's linear
/// layers with their activations, and nn::PipelineStage's layers are, each checkpoint linked to the
/// one before it; `inputs_on_host`: their inputs kept in host memory (cpu_checkpointing on a device).
std::vector<SimPtr> checkpointed(std::vector<std::vector<SimPtr>> groups, std::int64_t interval,
                                 bool inputs_on_host) {
  std::vector<SimPtr> runs;
  std::vector<SimPtr> group;
  SimCheckpoint* previous = nullptr;
  auto close_group = [&] {
    if (!group.empty()) {
      auto checkpoint = std::make_unique<SimCheckpoint>(std::move(group), inputs_on_host, previous);
      previous = checkpoint.get();
      runs.push_back(std::move(checkpoint));
    }
    group.clear();
  };
  for (std::size_t i = 0; i < groups.size(); ++i) {
    if (interval > 0 && static_cast<std::int64_t>(i) % interval == 0) close_group();
    for (SimPtr& layer : groups[i]) {
      if (interval > 0) {
        group.push_back(std::move(layer));
      } else {
        runs.push_back(std::move(layer));
      }
    }
  }
  close_group();
  return runs;
}

/// nn::Gpt (unpipelined): drop(wpe(wte(tokens))), the blocks, ln_f, the LM head.
class SimGpt final : public SimModule {
 public:
  SimGpt(Widths widths, const GptModelConfig& gpt, std::int64_t interval, bool inputs_on_host)
      : wte_(widths, gpt.d_model),
        wpe_(widths, gpt.d_model),
        drop_(widths, gpt.d_model, gpt.dropout),
        blocks_(blocks(widths, gpt, interval, inputs_on_host)),
        ln_f_(widths, gpt.d_model),
        lm_head_(widths, gpt.d_model, gpt.vocab_size) {}
  Bytes forward(const Bytes& tokens, const Pass& pass) override {
    Bytes x = drop_.forward(wpe_.forward(wte_.forward(tokens, pass), pass), pass);
    x = ln_f_.forward(blocks_.forward(x, pass), pass);
    return lm_head_.forward(x, pass);
  }
  Bytes backward(const Bytes& grad_output, const Pass& pass) override {
    Bytes grad = ln_f_.backward(lm_head_.backward(grad_output, pass), pass);
    grad = drop_.backward(blocks_.backward(grad, pass), pass);
    return wte_.backward(wpe_.backward(grad, pass), pass);
  }

 private:
  static std::vector<SimPtr> blocks(Widths widths, const GptModelConfig& gpt, std::int64_t interval,
                                    bool inputs_on_host) {
    std::vector<std::vector<SimPtr>> layers;
    for (std::int64_t i = 0; i < gpt.n_layer; ++i) {
      layers.emplace_back();
      layers.back().push_back(std::make_unique<SimTransformerBlock>(widths, gpt));
    }
    return checkpointed(std::move(layers), interval, inputs_on_host);
  }
  SimEmbedding wte_;
  SimPositional wpe_;
  SimDropout drop_;
  SimSequence blocks_;
  SimLayerNorm ln_f_;
  SimSavesInput lm_head_;
};

class SimGptEmbeddings final : public SimModule {  // pipeline_stage.cpp's GptEmbeddings
 public:
  SimGptEmbeddings(Widths widths, const GptModelConfig& gpt)
      : wte_(widths, gpt.d_model), wpe_(widths, gpt.d_model), drop_(widths, gpt.d_model, gpt.dropout) {}
  Bytes forward(const Bytes& tokens, const Pass& pass) override {
    return drop_.forward(wpe_.forward(wte_.forward(tokens, pass), pass), pass);
  }
  Bytes backward(const Bytes& grad_output, const Pass& pass) override {
    return wte_.backward(wpe_.backward(drop_.backward(grad_output, pass), pass), pass);
  }

 private:
  SimEmbedding wte_;
  SimPositional wpe_;
  SimDropout drop_;
};

class SimGptHead final : public SimModule {  // pipeline_stage.cpp's GptHead
 public:
  SimGptHead(Widths widths, const GptModelConfig& gpt)
      : ln_f_(widths, gpt.d_model), lm_head_(widths, gpt.d_model, gpt.vocab_size) {}
  Bytes forward(const Bytes& input, const Pass& pass) override {
    return lm_head_.forward(ln_f_.forward(input, pass), pass);
  }
  Bytes backward(const Bytes& grad_output, const Pass& pass) override {
    return ln_f_.backward(lm_head_.backward(grad_output, pass), pass);
  }

 private:
  SimLayerNorm ln_f_;
  SimSavesInput lm_head_;
};

/// The layer specs of the config's model (gpt_layers / mlp_layers), simulated: one entry per layer.
std::vector<std::vector<SimPtr>> layer_specs(const ModelConfig& model, Widths widths) {
  std::vector<std::vector<SimPtr>> layers;
  auto add = [&layers](SimPtr layer) {
    layers.emplace_back();
    layers.back().push_back(std::move(layer));
  };
  if (const auto* gpt = std::get_if<GptModelConfig>(&model)) {
    add(std::make_unique<SimGptEmbeddings>(widths, *gpt));
    for (std::int64_t i = 0; i < gpt->n_layer; ++i) add(std::make_unique<SimTransformerBlock>(widths, *gpt));
    add(std::make_unique<SimGptHead>(widths, *gpt));
  } else {
    const std::vector<std::int64_t>& sizes = std::get<MlpModelConfig>(model).sizes;
    for (std::size_t i = 0; i + 1 < sizes.size(); ++i) {
      add(std::make_unique<SimSavesInput>(widths, sizes[i], sizes[i + 1]));
      if (i + 2 < sizes.size()) add(std::make_unique<SimSavesInput>(widths, sizes[i + 1], sizes[i + 1]));
    }
  }
  return layers;
}

/// nn::Mlp (unpipelined): a checkpoint starts at every interval-th linear layer and holds the
/// activations that follow its linear layers.
SimPtr unpipelined_mlp(const MlpModelConfig& mlp, Widths widths, std::int64_t interval, bool inputs_on_host) {
  std::vector<std::vector<SimPtr>> linears;
  for (std::size_t i = 0; i + 1 < mlp.sizes.size(); ++i) {
    linears.emplace_back();
    linears.back().push_back(std::make_unique<SimSavesInput>(widths, mlp.sizes[i], mlp.sizes[i + 1]));
    if (i + 2 < mlp.sizes.size())
      linears.back().push_back(std::make_unique<SimSavesInput>(widths, mlp.sizes[i + 1], mlp.sizes[i + 1]));
  }
  return std::make_unique<SimSequence>(checkpointed(std::move(linears), interval, inputs_on_host));
}

/// A micro-batch as the training data loads it (src/engine/training_data.cpp): GPT int32 inputs and
/// targets [micro, seq_len]; MLP fp32 [micro, in] and [micro, out], converted to a 16-bit compute
/// dtype (both copies alive during the conversion). In host memory: with the engine on a device the
/// device holds only the copies the engine makes (ExecutionContext::on_device): the inputs' for the
/// forward, the targets' for the loss (device_inputs, loss_of).
struct SimBatch {
  Bytes inputs, targets;
};

struct StepShape {
  const ModelConfig* model = nullptr;
  std::uint64_t micro = 0;
  std::uint64_t element = 0;
  std::uint64_t stat = 0;
  std::uint64_t rows = 0;  // GPT: micro x seq_len; MLP: micro
  std::uint64_t output_width = 0;
  std::uint64_t input_width = 0;  // MLP inputs; GPT: 1 token per row
  bool gpt = false;
  bool on_device = false;  // the engine on a device: the tallies count the device's memory
  std::uint64_t input_bytes() const { return gpt ? rows * 4 : rows * input_width * element; }
  std::uint64_t target_bytes() const { return gpt ? rows * 4 : rows * output_width * element; }
};

SimBatch load(const StepShape& shape, Tally& tally) {
  if (shape.on_device) return {};  // host memory
  if (shape.gpt) return {Bytes(tally, shape.rows * 4), Bytes(tally, shape.rows * 4)};
  Bytes inputs(tally, shape.rows * shape.input_width * 4);
  Bytes targets(tally, shape.rows * shape.output_width * 4);
  if (shape.element == 4) return {inputs, targets};
  return {Bytes(tally, shape.rows * shape.input_width * shape.element),
          Bytes(tally, shape.rows * shape.output_width * shape.element)};
}

/// zt::cross_entropy_loss (logsumexp per row and two fp64 scalars) or zt::mse_loss (one fp64).
struct SimLoss {
  Bytes output, targets, statistics, scalars;
};
SimLoss loss_of(const StepShape& shape, const Bytes& output, const Bytes& loaded_targets, Tally& tally) {
  const Bytes targets = shape.on_device ? Bytes(tally, shape.target_bytes()) : loaded_targets;
  if (shape.gpt) return {output, targets, Bytes(tally, shape.rows * shape.stat), Bytes(tally, 2 * 8)};
  return {output, targets, Bytes(), Bytes(tally, 8)};
}
/// What the model's forward gets for the loaded inputs: the device's copy, or the inputs themselves.
Bytes device_inputs(const StepShape& shape, const Bytes& loaded, Tally& tally) {
  return shape.on_device ? Bytes(tally, shape.input_bytes()) : loaded;
}
Bytes loss_gradient(const StepShape& shape, Tally& tally) {
  return Bytes(tally, shape.rows * shape.output_width * shape.element);
}

/// Engine::train_batch without pipelining: forward, loss, backward, step per micro-batch.
std::uint64_t unpipelined_step_peak(SimModule& model, const StepShape& shape, std::int64_t micro_batches,
                                    Tally& tally, Tally& host) {
  for (std::int64_t micro = 0; micro < micro_batches; ++micro) {
    const SimBatch next = load(shape, tally);
    const Bytes output = model.forward(device_inputs(shape, next.inputs, tally), {tally, 0, true, &host});
    const SimLoss loss = loss_of(shape, output, next.targets, tally);
    const Bytes grad_output = loss_gradient(shape, tally);
    (void)model.backward(grad_output, {tally, 0, true, &host});
  }
  return tally.peak;
}

/// The pipeline executor (src/engine/pipeline_executor.cpp) and Engine::train_pipelined running one
/// stage's schedule: buffers, the receive posted ahead (MPI on the host posts the next one as soon as
/// one is taken), the last stage's losses, and sends that hold their tensor until they complete. On
/// a device nothing is posted ahead: a receive is posted when it is taken, or with the send before
/// it from the same neighbour (an exchange, exchanges_with_next), which holds the sent tensor until
/// that receive is taken.
/// `sends_complete_at_once`: every send completes at the executor's next test (its lower bound);
/// otherwise only at the blocking flushes (reduce_tied_gradients, the end of the run: the upper).
std::uint64_t pipelined_step_peak(SimModule& model, const StepShape& shape,
                                  const engine_detail::PipeSchedule& schedule, int stage, int stages,
                                  std::uint64_t input_bytes, std::uint64_t output_bytes,
                                  bool sends_complete_at_once, Tally& tally, Tally& host) {
  struct Buffer {
    SimBatch batch;
    Bytes input, output, grad_input;
  };
  std::vector<Buffer> buffers(static_cast<std::size_t>(schedule.buffers));
  std::optional<Bytes> next_activation, next_gradient;
  std::optional<Bytes> exchanged;  // an exchange's sent tensor, until its receive is taken
  std::deque<Bytes> sends;
  const bool post_early = !shape.on_device;
  std::deque<std::pair<int, SimLoss>> losses;
  const bool last = stage + 1 == stages;
  const auto& instructions = schedule.instructions;
  auto post = [&](engine_detail::PipeOp op, std::size_t from) {
    for (std::size_t next = from; next < instructions.size(); ++next) {
      if (instructions[next].op != op) continue;
      (op == engine_detail::PipeOp::recv_activation ? next_activation : next_gradient) =
          Bytes(tally, op == engine_detail::PipeOp::recv_activation ? input_bytes : output_bytes);
      return;
    }
  };
  auto take = [&](std::optional<Bytes>& pending, engine_detail::PipeOp op, std::size_t position) {
    if (!pending) post(op, position);
    Bytes received = *pending;
    pending.reset();
    exchanged.reset();
    if (post_early) post(op, position + 1);
    return received;
  };
  auto send = [&](Bytes& tensor, std::size_t position) {
    if (!post_early && engine_detail::exchanges_with_next(schedule, position)) {
      post(instructions[position + 1].op, position + 1);
      exchanged = tensor;
    } else {
      sends.push_back(tensor);
    }
    tensor = Bytes();
  };
  for (std::size_t position = 0; position < instructions.size(); ++position) {
    const engine_detail::PipeInstruction& instruction = instructions[position];
    Buffer& buffer = buffers.at(static_cast<std::size_t>(instruction.buffer >= 0 ? instruction.buffer : 0));
    const Pass pass{tally, instruction.micro_batch, true, &host};
    switch (instruction.op) {
      case engine_detail::PipeOp::load_micro_batch:
        buffer.batch = load(shape, tally);
        if (stage == 0) buffer.input = buffer.batch.inputs;
        break;
      case engine_detail::PipeOp::recv_activation:
        buffer.input = take(next_activation, instruction.op, position);
        break;
      case engine_detail::PipeOp::forward:
        buffer.output =
            model.forward(stage == 0 ? device_inputs(shape, buffer.batch.inputs, tally) : buffer.input, pass);
        if (last)
          losses.emplace_back(instruction.micro_batch,
                              loss_of(shape, buffer.output, buffer.batch.targets, tally));
        buffer.input = Bytes();
        break;
      case engine_detail::PipeOp::send_activation:
        send(buffer.output, position);
        break;
      case engine_detail::PipeOp::recv_gradient:
        buffer.output = take(next_gradient, instruction.op, position);
        break;
      case engine_detail::PipeOp::backward: {
        Bytes gradient = last ? Bytes() : buffer.output;
        if (last) {
          const SimLoss loss = std::move(losses.front().second);
          losses.pop_front();
          gradient = loss_gradient(shape, tally);
        }
        Bytes grad_input = model.backward(gradient, pass);
        gradient = Bytes();
        buffer = Buffer{};
        buffer.grad_input = std::move(grad_input);
        break;
      }
      case engine_detail::PipeOp::send_gradient:
        send(buffer.grad_input, position);
        break;
      case engine_detail::PipeOp::reduce_tied_gradients:
        sends.clear();
        break;
      case engine_detail::PipeOp::reduce_gradients:
      case engine_detail::PipeOp::optimizer_step:
        break;
    }
    if (sends_complete_at_once) sends.clear();
  }
  return tally.peak;
}

}  // namespace

ActivationEstimate estimate_activation_memory(const Config& config, int world_size, int pipeline_stage,
                                              DeviceType device) {
  ZT_CHECK_AS(ConfigError, config.model.has_value(),
              "the activation estimate needs the config's \"model\" section (its layers and sizes)");
  const int stages = static_cast<int>(config.pipeline.stage_count());
  ZT_CHECK_AS(ConfigError, world_size >= 1 && world_size % stages == 0, "--world-size ", world_size,
              " with pipeline.stages = ", stages, ": expected a positive multiple of the stages");
  ZT_CHECK_AS(ConfigError, pipeline_stage >= 0 && pipeline_stage < stages, "pipeline stage ", pipeline_stage,
              " of ", stages, " stages");
  Config resolved = config;
  const BatchSizes batch = resolved.resolve_batch(world_size / stages);
  const DType dtype = compute_dtype_of(config);
  StepShape shape;
  shape.model = &*config.model;
  shape.micro = static_cast<std::uint64_t>(batch.train_micro_batch_size_per_gpu);
  shape.element = dtype_size(dtype);
  shape.stat = dtype == DType::fp64 ? 8 : 4;  // kernels::stat_dtype
  shape.on_device = device != DeviceType::host;
  // nn::ActivationCheckpoint keeps its input on the host only when the engine's device is not.
  const bool inputs_on_host = shape.on_device && config.activation_checkpointing.cpu_checkpointing;
  std::int64_t layers = 0;
  if (const auto* gpt = std::get_if<GptModelConfig>(&*config.model)) {
    shape.gpt = true;
    shape.rows = shape.micro * static_cast<std::uint64_t>(gpt->seq_len);
    shape.output_width = static_cast<std::uint64_t>(gpt->vocab_size);
    shape.input_width = 1;
    layers = gpt->n_layer;
  } else {
    const auto& sizes = std::get<MlpModelConfig>(*config.model).sizes;
    shape.rows = shape.micro;
    shape.input_width = static_cast<std::uint64_t>(sizes.front());
    shape.output_width = static_cast<std::uint64_t>(sizes.back());
    layers = static_cast<std::int64_t>(sizes.size()) - 1;
  }
  const Widths widths{shape.rows, shape.element, shape.stat};

  ActivationEstimate estimate;
  estimate.micro_batch_size = batch.train_micro_batch_size_per_gpu;
  estimate.micro_batches = batch.gradient_accumulation_steps;
  estimate.pipeline_stage = pipeline_stage;
  estimate.pipeline_stages = stages;
  estimate.device = device;
  const int m = static_cast<int>(batch.gradient_accumulation_steps);
  const bool gpipe = config.pipeline.schedule == PipelineSchedule::gpipe;
  estimate.schedule = stages == 1 ? "unpipelined" : gpipe ? "gpipe" : "1f1b";
  estimate.in_flight = stages == 1 ? 1 : gpipe ? m : std::min(stages - pipeline_stage, m);

  // The stage's layers (specs [first, end)) and its checkpoint interval, as zt::build_model builds them.
  std::vector<std::int64_t> boundaries{0, 0};
  if (stages > 1) boundaries = engine_detail::stage_boundaries_of_config(config);
  const std::int64_t first = boundaries[static_cast<std::size_t>(pipeline_stage)];
  const std::int64_t end = boundaries[static_cast<std::size_t>(pipeline_stage) + 1];
  // nn::Gpt checkpoints its blocks, nn::Mlp its linear layers, a stage all its layers.
  estimate.checkpoint_interval =
      config.activation_checkpoint_interval_for(stages == 1 ? layers : end - first);
  auto build = [&](std::int64_t interval) -> SimPtr {
    if (stages == 1) {
      if (shape.gpt)
        return std::make_unique<SimGpt>(widths, std::get<GptModelConfig>(*config.model), interval,
                                        inputs_on_host);
      return unpipelined_mlp(std::get<MlpModelConfig>(*config.model), widths, interval, inputs_on_host);
    }
    std::vector<std::vector<SimPtr>> all = layer_specs(*config.model, widths);
    std::vector<std::vector<SimPtr>> mine;
    for (std::int64_t i = first; i < end; ++i) mine.push_back(std::move(all[static_cast<std::size_t>(i)]));
    return std::make_unique<SimSequence>(checkpointed(std::move(mine), interval, inputs_on_host));
  };
  // What crosses a stage boundary: [micro, T, d_model] for GPT, [micro, width] for the MLP.
  auto boundary_bytes = [&](std::int64_t layer) -> std::uint64_t {
    if (shape.gpt) return widths.values(std::get<GptModelConfig>(*config.model).d_model);
    const auto& sizes = std::get<MlpModelConfig>(*config.model).sizes;
    return widths.values(sizes[static_cast<std::size_t>(layer / 2 + 1)]);  // linear i is layer 2i
  };

  auto measure = [&](std::int64_t interval, std::uint64_t& kept, std::uint64_t& peak, std::uint64_t* upper,
                     std::uint64_t* kept_on_host) {
    {  // kept: what one micro-batch's forward leaves in the modules (its input and output not counted)
      Tally tally, host;
      SimPtr model = build(interval);
      std::optional<Bytes> input;
      if (pipeline_stage == 0) {
        input = Bytes(tally, shape.input_bytes());
      } else {
        input = Bytes(tally, boundary_bytes(first - 1));
      }
      std::optional<Bytes> output = model->forward(*input, {tally, 0, true, &host});
      input.reset();
      output.reset();
      kept = tally.current;
      if (kept_on_host != nullptr) *kept_on_host = host.current;
    }
    if (stages == 1) {
      Tally tally, host;
      SimPtr model = build(interval);
      peak = unpipelined_step_peak(*model, shape, m, tally, host);
      return;
    }
    const engine_detail::PipeSchedule schedule = engine_detail::make_pipe_schedule(
        gpipe ? engine_detail::PipeScheduleKind::gpipe : engine_detail::PipeScheduleKind::one_f_one_b, stages,
        pipeline_stage, m);
    const std::uint64_t input_bytes = pipeline_stage == 0 ? 0 : boundary_bytes(first - 1);
    const std::uint64_t output_bytes = pipeline_stage + 1 == stages ? 0 : boundary_bytes(end - 1);
    for (bool at_once : {true, false}) {
      if (!at_once && upper == nullptr) break;
      Tally tally, host;
      SimPtr model = build(interval);
      const std::uint64_t value = pipelined_step_peak(*model, shape, schedule, pipeline_stage, stages,
                                                      input_bytes, output_bytes, at_once, tally, host);
      (at_once ? peak : *upper) = value;
    }
  };
  std::uint64_t upper = 0;
  measure(estimate.checkpoint_interval, estimate.kept_per_micro_batch, estimate.peak,
          stages > 1 ? &upper : nullptr, &estimate.kept_on_host_per_micro_batch);
  estimate.peak_if_sends_wait = stages > 1 ? upper : estimate.peak;
  measure(0, estimate.kept_without_checkpointing, estimate.peak_without_checkpointing, nullptr, nullptr);
  const std::uint64_t in_flight_bytes =
      estimate.kept_per_micro_batch * static_cast<std::uint64_t>(estimate.in_flight);
  estimate.transient = estimate.peak > in_flight_bytes ? estimate.peak - in_flight_bytes : 0;
  return estimate;
}

std::string ActivationEstimate::table() const {
  const auto line = engine_detail::write_estimate_row;
  std::ostringstream out;
  out << "activations per rank: micro-batch " << micro_batch_size << ", " << micro_batches
      << " micro-batch(es) per step, " << schedule;
  if (pipeline_stages > 1) out << " (stage " << pipeline_stage << " of " << pipeline_stages << ")";
  out << ", " << in_flight << " in flight, "
      << (checkpoint_interval > 0 ? "checkpoints of " + std::to_string(checkpoint_interval) + " layer(s)"
                                  : std::string("no activation checkpointing"))
      << (device == DeviceType::host ? ", engine on the host" : ", engine on a device: the device's memory")
      << "\n";
  line(out, "kept / micro-batch", kept_per_micro_batch, "saved between forward and backward");
  line(out, "transient", transient, "peak - kept x in flight (logits + gradient, recompute, data, buffers)");
  line(out, "peak", peak, "kept x " + std::to_string(in_flight) + " + transient");
  if (pipeline_stages > 1)
    line(out, "peak, sends wait", peak_if_sends_wait, "sends held until the stage's blocking flushes");
  if (kept_on_host_per_micro_batch > 0) {
    line(out, "host, pinned", kept_on_host_per_micro_batch * static_cast<std::uint64_t>(in_flight),
         "cpu_checkpointing: the checkpoints' inputs x " + std::to_string(in_flight) + " in flight");
  }
  if (checkpoint_interval > 0) {
    line(out, "kept, no ckpt", kept_without_checkpointing, "without activation checkpointing");
    line(out, "peak, no ckpt", peak_without_checkpointing, "without activation checkpointing");
  }
  out << "  (the built-in model's allocations replayed over the step: exact unpipelined; pipelined, sends\n"
         "   completing between peak and 'sends wait'.)\n";
  return out.str();
}

}  // namespace zt
