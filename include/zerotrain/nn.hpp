// Neural-network modules with explicit forward and backward passes (no autograd).
//
// A Module computes `run_forward(x, context)` and, afterwards, `run_backward(grad_output, context)`:
//   - the RunContext names the execution context (device and streams: every kernel runs on its
//     compute stream, every activation is allocated on its device; default: the host) and the
//     micro-batch;
//   - forward saves what backward needs under the micro-batch's slot, so several forwards may be in
//     flight (slots 0, 1, ...); backward takes the slot's activations and frees them. A second
//     forward into a slot whose backward has not run, and a backward without its forward, are
//     errors naming the module and the micro-batch. Forwards in evaluation mode or with
//     save_for_backward = false save nothing;
//   - backward ACCUMULATES into every parameter's `grad` (so micro-batches accumulate) and returns
//     the gradient of the input (an undefined tensor when the input is integer tokens);
//   - run_forward/run_backward call the module's hooks around the virtual forward/backward, so an
//     engine can gather parameters before a module runs and release them after (ZeRO-3).
// Modules read `param.value` and `param.grad` at every call and never keep raw pointers across
// calls: the engine may re-point both to views into flat buffers or to gathered buffers. Inputs and
// parameters must be memory of the run context's device.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "zerotrain/execution.hpp"
#include "zerotrain/loss.hpp"
#include "zerotrain/tensor.hpp"

namespace zt::nn {

/// How a parameter is held across the tensor-parallel group.
enum class ParallelRole : std::uint8_t {
  replicated,  // every tensor-parallel rank holds the whole tensor (LayerNorms, biases of row-split layers)
  sharded,     // each holds a slice along Parameter::shard_dim of the global tensor
};

/// A trainable tensor and its gradient (same shape and dtype). `name` is the dotted path from the
/// root module ("h.0.attn.qkv.weight"); it is updated when the owner is registered into a parent.
/// `role`, `shard_dim` and `pipeline_stage` say where the tensor belongs in a 3-D parallel job: the
/// engine counts a replicated parameter once in the gradient norm, and checkpoints record the
/// global (unsliced) tensor whatever the grid.
struct Parameter;

/// Takes a parameter's gradient piece by piece instead of a full `grad` (ZeRO stages 2-3: the engine
/// reduces each piece as it is produced, so no full-shape gradient of a large parameter exists). A
/// module whose streams_gradients() is true hands the gradient of each parameter with a sink to it;
/// `compute(first_row, row_count, rows)` must ADD rows [first_row, first_row + row_count) of this
/// backward's gradient (the tensor as [rows, numel / rows]) into `rows`, zeroed memory of the run
/// context's device in the parameter's dtype. Rows may be asked for more than once (a row that two
/// pieces share), and the rows asked for cover the parameter.
class GradientSink {
 public:
  using RowsFunction = std::function<void(std::int64_t first_row, std::int64_t row_count, void* rows)>;
  virtual ~GradientSink() = default;
  virtual void stream(Parameter& parameter, std::int64_t rows, const RowsFunction& compute) = 0;
  /// A full-shape `grad` for a part of the backward that does not stream (a bias, say): zeroed,
  /// taken over by the sink after the module's backward.
  virtual Tensor& full_gradient(Parameter& parameter) = 0;
};

struct Parameter {
  std::string name;
  Tensor value;
  Tensor grad;
  ParallelRole role = ParallelRole::replicated;
  int shard_dim = 0;
  int pipeline_stage = 0;
  /// Set by an engine for the duration of a streaming module's backward (see GradientSink); then
  /// `grad` is undefined and the module gives its gradient to the sink.
  GradientSink* gradient_sink = nullptr;
};

class Module;

/// How one forward or backward runs. Composite modules pass it to their children unchanged.
struct RunContext {
  /// Where kernels run (its compute stream) and activations live; nullptr: ExecutionContext::host().
  const ExecutionContext* execution = nullptr;
  /// The slot the forward saves its activations under and the backward takes them from.
  std::uint32_t micro_batch = 0;
  /// false: a forward that no backward follows (evaluation, finite differences): nothing is saved.
  bool save_for_backward = true;

  const ExecutionContext& exec() const {
    return execution != nullptr ? *execution : ExecutionContext::host();
  }
};

namespace detail {
/// The part of SavedActivations that Module drives (releasing slots); see SavedActivations.
class SavedSlots {
 public:
  virtual ~SavedSlots() = default;
  virtual void release(std::uint32_t micro_batch) = 0;
  virtual void release_all() = 0;
  virtual std::size_t held() const = 0;
};
/// Called by SavedActivations::save: lets a failing run_forward release what it saved.
void note_saved(SavedSlots* slots, std::uint32_t micro_batch);
}  // namespace detail

using ForwardPreHook = std::function<void(Module& module, const Tensor& input)>;
using ForwardPostHook = std::function<void(Module& module, const Tensor& input, const Tensor& output)>;
using BackwardPreHook = std::function<void(Module& module, const Tensor& grad_output)>;
using BackwardPostHook = std::function<void(Module& module, const Tensor& grad_input)>;

/// Identifies one hook for remove_hook().
struct HookHandle {
  std::uint64_t id = 0;
};

class Module {
 public:
  explicit Module(std::string type_name) : type_name_(std::move(type_name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  Module(Module&&) = delete;
  Module& operator=(Module&&) = delete;

  /// Pre-forward hooks, forward, post-forward hooks. Always call modules through this. If the
  /// forward fails, what it saved is released again.
  Tensor run_forward(const Tensor& input, const RunContext& context = {});
  /// Pre-backward hooks, backward, post-backward hooks. If the backward fails, the micro-batch's
  /// activations in this module and its descendants are released.
  Tensor run_backward(const Tensor& grad_output, const RunContext& context = {});

  /// Drop the activations saved for `micro_batch` (or for every micro-batch) in this module and
  /// its descendants: a forward that no backward will follow.
  void release_activations(std::uint32_t micro_batch);
  void release_activations();
  /// Saved slots held by this module and its descendants (one per module and micro-batch).
  std::size_t saved_activation_count();

  /// "Linear", "GPT", ...
  const std::string& type_name() const { return type_name_; }
  /// Dotted path from the root ("" for the root itself, "h.0.attn" for a descendant).
  const std::string& name() const { return name_; }

  /// Every parameter of this module and its descendants, depth-first in registration order.
  std::vector<Parameter*> parameters();
  /// This module's own parameters (not its children's).
  std::vector<Parameter*> direct_parameters();
  /// Parameters this module's forward/backward use but another module owns (a tied lm_head uses the
  /// token embedding). A hook that gathers a module's parameters must gather these too.
  virtual std::vector<Parameter*> borrowed_parameters() { return {}; }
  /// Whether backward can hand its parameters' gradients to their Parameter::gradient_sink (set by
  /// an engine around the backward) instead of accumulating into `grad`. Modules that read `grad`
  /// directly keep the default: the engine then gives them full-shape gradients.
  virtual bool streams_gradients() const { return false; }
  /// Direct children in registration order.
  std::vector<Module*> children();
  /// This module and all its descendants, pre-order.
  std::vector<Module*> modules();
  /// The parameter or module with this dotted name, or nullptr.
  Parameter* find_parameter(const std::string& dotted_name);
  Module* find_module(const std::string& dotted_name);
  /// Total number of elements over parameters().
  std::int64_t parameter_count();

  /// Training mode (dropout active) or evaluation mode; applies to all descendants.
  void train(bool training = true);
  void eval() { train(false); }
  bool training() const { return training_; }
  /// Zero every parameter gradient (recursively), ordered on `execution`'s compute stream (the
  /// gradients must be on its device): on a GPU asynchronous and ordered with the kernels that use
  /// the gradients.
  void zero_grad(const ExecutionContext& execution);
  /// The same for gradients on the host or the emulated device, whose work runs at once. A gradient
  /// on a CUDA device is an error naming it: without a stream the clear would run on the legacy
  /// default stream, which does not order against an execution context's non-blocking streams.
  void zero_grad();

  HookHandle add_forward_pre_hook(ForwardPreHook hook);
  HookHandle add_forward_post_hook(ForwardPostHook hook);
  HookHandle add_backward_pre_hook(BackwardPreHook hook);
  HookHandle add_backward_post_hook(BackwardPostHook hook);
  /// Remove one hook of this module; false when it is not (or no longer) registered here.
  bool remove_hook(HookHandle handle);

 protected:
  virtual Tensor forward(const Tensor& input, const RunContext& context) = 0;
  virtual Tensor backward(const Tensor& grad_output, const RunContext& context) = 0;
  /// Whether a forward under `context` saves activations: in training mode and when asked to.
  bool saves_for_backward(const RunContext& context) const { return training_ && context.save_for_backward; }

  /// A parameter named `local_name` holding `value` (category parameters), with a zero gradient of
  /// the same shape and dtype (category gradients). The reference stays valid for the module's life.
  Parameter& register_parameter(const std::string& local_name, Tensor value);
  /// Take ownership of a child; its modules' and parameters' names get the prefix `local_name.`.
  template <typename ModuleType>
  ModuleType& register_module(const std::string& local_name, std::unique_ptr<ModuleType> child) {
    ZT_CHECK(local_name.find('.') == std::string::npos, "child name '", local_name, "' in module ",
             type_name_, ": expected a name without dots");
    ModuleType& reference = *child;
    adopt_child(local_name, local_name, std::unique_ptr<Module>(std::move(child)));
    return reference;
  }
  /// Take ownership of a child whose modules and parameters are named as if it sat at `path` below
  /// this module ("h.3"; "" for no level at all), under the unique key `key`: layer containers (a
  /// pipeline stage, an activation checkpoint) hold layers without adding a level to their names,
  /// so a parameter has the same name however the model is split.
  template <typename ModuleType>
  ModuleType& register_module_at(const std::string& key, const std::string& path,
                                 std::unique_ptr<ModuleType> child) {
    ModuleType& reference = *child;
    adopt_child(key, path, std::unique_ptr<Module>(std::move(child)));
    return reference;
  }

 private:
  template <typename T>
  friend class SavedActivations;

  void adopt_child(const std::string& key, const std::string& path, std::unique_ptr<Module> child);
  void add_name_prefix(const std::string& prefix);

  template <typename Hook>
  struct Registered {
    std::uint64_t id;
    Hook hook;
  };

  std::string type_name_;
  std::string name_;
  bool training_ = true;
  std::vector<std::unique_ptr<Parameter>> parameters_;
  std::vector<std::pair<std::string, std::unique_ptr<Module>>> children_;
  std::vector<Registered<ForwardPreHook>> forward_pre_hooks_;
  std::vector<Registered<ForwardPostHook>> forward_post_hooks_;
  std::vector<Registered<BackwardPreHook>> backward_pre_hooks_;
  std::vector<Registered<BackwardPostHook>> backward_post_hooks_;
  std::uint64_t next_hook_id_ = 1;
  std::vector<detail::SavedSlots*> saved_;  // this module's SavedActivations members
};

/// What a module's forward keeps for its backward, one slot per micro-batch in flight. A member of
/// the module (constructed with it: `SavedActivations<Tensor> saved_input_{*this};`):
///   forward:  if (saves_for_backward(context)) saved_.save(context, {input, ...});
///   backward: const auto saved = saved_.take(context);   // the slot is empty again
/// Few micro-batches are in flight at once, so the slots are a small vector.
template <typename T>
class SavedActivations final : public detail::SavedSlots {
 public:
  explicit SavedActivations(Module& owner) : owner_(owner) { owner.saved_.push_back(this); }
  SavedActivations(const SavedActivations&) = delete;
  SavedActivations& operator=(const SavedActivations&) = delete;

  void save(const RunContext& context, T value) {
    ZT_CHECK(!holds(context.micro_batch), owner_.type_name(), " '", owner_.name(),
             "': a second forward into micro-batch slot ", context.micro_batch,
             " before its backward; run that backward first, forward into another RunContext::micro_batch, "
             "or forward with save_for_backward = false");
    slots_.emplace_back(context.micro_batch, std::move(value));
    detail::note_saved(this, context.micro_batch);
  }

  T take(const RunContext& context) {
    for (auto it = slots_.begin(); it != slots_.end(); ++it) {
      if (it->first != context.micro_batch) continue;
      T value = std::move(it->second);
      slots_.erase(it);
      return value;
    }
    ZT_THROW("backward of ", owner_.type_name(), " '", owner_.name(), "' for micro-batch ",
             context.micro_batch,
             " without its forward (no forward saved that micro-batch, or its backward ran already)");
  }

  bool holds(std::uint32_t micro_batch) const {
    for (const auto& slot : slots_) {
      if (slot.first == micro_batch) return true;
    }
    return false;
  }
  /// The value saved for `micro_batch`, still in its slot; null if there is none.
  T* find(std::uint32_t micro_batch) {
    for (auto& slot : slots_) {
      if (slot.first == micro_batch) return &slot.second;
    }
    return nullptr;
  }
  void release(std::uint32_t micro_batch) override {
    std::erase_if(slots_, [&](const auto& slot) { return slot.first == micro_batch; });
  }
  void release_all() override { slots_.clear(); }
  std::size_t held() const override { return slots_.size(); }

 private:
  Module& owner_;
  std::vector<std::pair<std::uint32_t, T>> slots_;
};

// ---- layers -----------------------------------------------------------------------------------
// Layers are built on `device` (the host by default) in `dtype` (fp32, fp64, bf16 or fp16). Linear
// and Embedding weights start at zero, LayerNorm at weight 1 / bias 0; models (Gpt, Mlp) initialize
// from a seed with the kernels of that device (the same values on every device), and init_normal()
// fills any parameter.

/// Runs its children in order; backward in reverse order.
class Sequential : public Module {
 public:
  Sequential() : Module("Sequential") {}
  /// Append a child named by its index ("0", "1", ...).
  template <typename ModuleType>
  ModuleType& append(std::unique_ptr<ModuleType> child) {
    return register_module(std::to_string(size_++), std::move(child));
  }
  /// Append a child under the key of its index whose names sit at `path` below this module ("" for
  /// no level: a container of layers such as ActivationCheckpoint, whose layers keep their names).
  template <typename ModuleType>
  ModuleType& append_at(const std::string& path, std::unique_ptr<ModuleType> child) {
    return register_module_at(std::to_string(size_++), path, std::move(child));
  }
  std::size_t size() const { return size_; }

 protected:
  explicit Sequential(std::string type_name) : Module(std::move(type_name)) {}
  Tensor forward(const Tensor& input, const RunContext& context) override;
  Tensor backward(const Tensor& grad_output, const RunContext& context) override;

 private:
  std::size_t size_ = 0;
};

/// y = x . W^T + b over the last dimension; W is [out_features, in_features] (PyTorch layout).
class Linear : public Module {
 public:
  Linear(std::int64_t in_features, std::int64_t out_features, bool bias = true, DType dtype = DType::fp32,
         Device device = Device::host());
  Parameter& weight() { return *weight_; }
  Parameter* bias() { return bias_; }
  std::int64_t in_features() const { return in_features_; }
  std::int64_t out_features() const { return out_features_; }
  /// Streams the weight's gradient by rows of output features (the bias is full-shape).
  bool streams_gradients() const override { return true; }

 protected:
  Tensor forward(const Tensor& input, const RunContext& context) override;
  Tensor backward(const Tensor& grad_output, const RunContext& context) override;

 private:
  std::int64_t in_features_, out_features_;
  Parameter* weight_;
  Parameter* bias_ = nullptr;
  SavedActivations<Tensor> saved_input_{*this};
};

/// Token lookup: int32 indices [...] -> [..., dim]. backward accumulates into the table and returns an
/// undefined tensor (integer inputs have no gradient).
class Embedding : public Module {
 public:
  Embedding(std::int64_t num_embeddings, std::int64_t dim, DType dtype = DType::fp32,
            Device device = Device::host());
  Parameter& weight() { return *weight_; }
  /// Streams the table's gradient by rows (each row only from the tokens that fall in it).
  bool streams_gradients() const override { return true; }

 protected:
  Tensor forward(const Tensor& tokens, const RunContext& context) override;
  Tensor backward(const Tensor& grad_output, const RunContext& context) override;

 private:
  std::int64_t num_embeddings_, dim_;
  Parameter* weight_;
  SavedActivations<Tensor> saved_tokens_{*this};
};

/// Learned absolute positions: x [B, T, C] -> x + weight[:T] (T <= max_positions).
class PositionalEmbedding : public Module {
 public:
  PositionalEmbedding(std::int64_t max_positions, std::int64_t dim, DType dtype = DType::fp32,
                      Device device = Device::host());
  Parameter& weight() { return *weight_; }

 protected:
  Tensor forward(const Tensor& input, const RunContext& context) override;
  Tensor backward(const Tensor& grad_output, const RunContext& context) override;

 private:
  std::int64_t max_positions_, dim_;
  Parameter* weight_;
};

/// Normalizes the last dimension: (x - mean) / sqrt(var + eps) * weight + bias.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(std::int64_t dim, DType dtype = DType::fp32, double eps = 1e-5,
                     Device device = Device::host());

 protected:
  Tensor forward(const Tensor& input, const RunContext& context) override;
  Tensor backward(const Tensor& grad_output, const RunContext& context) override;

 private:
  std::int64_t dim_;
  double eps_;
  Parameter* weight_;
  Parameter* bias_;
  struct Saved {
    Tensor input, mean, rstd;
  };
  SavedActivations<Saved> saved_{*this};
};

enum class ActivationKind : std::uint8_t { gelu, relu, tanh };  // gelu: tanh approximation (GPT-2)
std::string_view activation_name(ActivationKind kind);

/// Element-wise activation without parameters.
class Activation : public Module {
 public:
  explicit Activation(ActivationKind kind);
  ActivationKind kind() const { return kind_; }

 protected:
  Tensor forward(const Tensor& input, const RunContext& context) override;
  Tensor backward(const Tensor& grad_output, const RunContext& context) override;

 private:
  ActivationKind kind_;
  SavedActivations<Tensor> saved_input_{*this};
};

/// GELU with the tanh approximation, as in GPT-2.
class GELU : public Activation {
 public:
  GELU() : Activation(ActivationKind::gelu) {}
};

/// Inverted dropout with a counter-based mask: element i of forward call n is kept iff
/// hash(seed, n, i) >= p, so masks are reproducible on any thread count and are never stored (each
/// micro-batch's backward recomputes its forward's mask). Identity in eval mode or when p == 0.
class Dropout : public Module {
 public:
  explicit Dropout(double p, std::uint64_t seed = 0);
  double p() const { return p_; }
  /// The mask stream the next training forward uses; each training forward advances it by one.
  std::uint64_t next_stream() const { return next_stream_; }
  void set_next_stream(std::uint64_t stream) { next_stream_ = stream; }

 protected:
  Tensor forward(const Tensor& input, const RunContext& context) override;
  Tensor backward(const Tensor& grad_output, const RunContext& context) override;

 private:
  double p_;
  std::uint64_t seed_;
  std::uint64_t next_stream_ = 0;
  struct Mask {
    bool identity = true;
    std::uint64_t stream = 0;  // the mask stream the forward used
  };
  SavedActivations<Mask> saved_mask_{*this};
};

/// Activation checkpointing (recomputation): a run of consecutive layers, run in order, that keeps
/// only its input for the backward. A training forward that saves (RunContext::save_for_backward)
/// keeps, in the micro-batch's slot, the input and the mask streams of the Dropouts among the
/// layers' modules, and runs the layers saving nothing. The backward runs the layers' forward again
/// from that input with those mask streams, saving into the same slot (the Dropouts' streams are put
/// back afterwards), then the layers' backward in reverse. Outputs, gradients and dropout masks are
/// bitwise those of the layers without the wrapper, with several micro-batches in flight too; the
/// activations inside the run exist only while one layer computes in the forward and during the
/// run's own backward, at the price of a second forward. The layers' module hooks fire again for the
/// recompute (ZeRO-3 gathers their parameters again). Other forwards (evaluation, save_for_backward
/// = false) just run the layers. The backward must run in training mode, as its forward did.
///
/// The layers keep the names they would have without the wrapper: append(layer, "h.3") names the
/// layer's modules and parameters as if it sat at "h.3" below the checkpoint, and the checkpoint is
/// registered without a level of its own (register_module_at(key, "", ...), Sequential::append_at).
///
/// `keep_input_on_host` (DeepSpeed's cpu_checkpointing): when the run context's device is not the
/// host, the kept input is copied to pinned host memory (counted as activations there) and back to
/// the device for the backward; on the host nothing changes. On a GPU neither copy waits on the
/// host: the forward's runs on the context's transfer stream after the kernels that produced the
/// input (an event) and overlaps the layers' kernels, the compute stream waits for it at the end
/// of the forward. The backward's upload is queued on the compute stream before the recompute,
/// unless the checkpoint after this one (set_previous_checkpoint) queued it earlier.
class ActivationCheckpoint : public Module {
 public:
  explicit ActivationCheckpoint(bool keep_input_on_host = false);
  /// Append the next layer of the run, its names at `path` ("" for none: its children's names).
  template <typename ModuleType>
  ModuleType& append(std::unique_ptr<ModuleType> layer, const std::string& path) {
    return register_module_at(std::to_string(size_++), path, std::move(layer));
  }
  /// The number of layers.
  std::size_t size() const { return size_; }
  bool keeps_input_on_host() const { return keep_input_on_host_; }
  /// The checkpoint whose backward runs right after this one's: the one before it in a run of
  /// layers (the model builders link consecutive checkpoints; nullptr unlinks). With its input kept
  /// on the host, this checkpoint's backward first queues the upload of `previous`'s input for the
  /// same micro-batch on the transfer stream, so that the copy overlaps this backward instead of
  /// holding up `previous`'s recompute; `previous`'s backward then orders its compute after it. A
  /// link to a checkpoint whose backward does not come next only brings that input to the device
  /// earlier. `previous` must outlive this checkpoint (siblings in one model do).
  void set_previous_checkpoint(ActivationCheckpoint* previous) { previous_ = previous; }

 protected:
  Tensor forward(const Tensor& input, const RunContext& context) override;
  Tensor backward(const Tensor& grad_output, const RunContext& context) override;

 private:
  Tensor run_layers(const Tensor& input, const RunContext& context);
  /// Queue the upload of previous_'s kept input for `context`'s micro-batch (see set_previous_checkpoint).
  void queue_previous_upload(const RunContext& context);

  bool keep_input_on_host_;
  std::size_t size_ = 0;
  ActivationCheckpoint* previous_ = nullptr;
  struct Saved {
    Tensor input;       // on the host (a view of host_input) with keep_input_on_host off the host
    Buffer host_input;  // pinned host memory for the input's asynchronous copies; empty otherwise
    std::vector<std::uint64_t> dropout_streams;  // Dropout::next_stream of the layers' dropouts, pre-order
    // The input on the device, its upload queued on the transfer stream by the next checkpoint.
    Tensor uploaded;
    // Released first (declared last): orders the compute stream after the upload, before `uploaded`
    // and `host_input` are freed in the compute stream's order (also when the slot is dropped).
    std::shared_ptr<const void> upload_fence;
  };
  SavedActivations<Saved> saved_{*this};
};

/// Causal multi-head self-attention: qkv = Linear(C, 3C); softmax(q k^T / sqrt(C/n_head)) v per
/// head with a causal mask; proj = Linear(C, C); then dropout. Input and output [B, T, C].
class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(std::int64_t d_model, std::int64_t n_head, DType dtype = DType::fp32,
                      double dropout = 0, std::uint64_t dropout_seed = 0, Device device = Device::host());

 protected:
  Tensor forward(const Tensor& input, const RunContext& context) override;
  Tensor backward(const Tensor& grad_output, const RunContext& context) override;

 private:
  std::int64_t d_model_, n_head_;
  Linear* qkv_;
  Linear* proj_;
  Dropout* dropout_;
  struct Saved {
    Tensor qkv, attended, row_logsumexp;  // attended: the attention's output, [B, T, C]
  };
  SavedActivations<Saved> saved_{*this};
};

/// Transformer MLP: fc = Linear(C, 4C), GELU, proj = Linear(4C, C), dropout.
class MLPBlock : public Module {
 public:
  MLPBlock(std::int64_t d_model, DType dtype = DType::fp32, double dropout = 0,
           std::uint64_t dropout_seed = 0, Device device = Device::host());

 protected:
  Tensor forward(const Tensor& input, const RunContext& context) override;
  Tensor backward(const Tensor& grad_output, const RunContext& context) override;

 private:
  Linear* fc_;
  GELU* gelu_;
  Linear* proj_;
  Dropout* dropout_;
};

/// Pre-LayerNorm transformer block: x = x + attn(ln1(x)); x = x + mlp(ln2(x)).
class TransformerBlock : public Module {
 public:
  TransformerBlock(std::int64_t d_model, std::int64_t n_head, DType dtype = DType::fp32, double dropout = 0,
                   std::uint64_t dropout_seed = 0, Device device = Device::host());

 protected:
  Tensor forward(const Tensor& input, const RunContext& context) override;
  Tensor backward(const Tensor& grad_output, const RunContext& context) override;

 private:
  LayerNorm* ln1_;
  CausalSelfAttention* attn_;
  LayerNorm* ln2_;
  MLPBlock* mlp_;
};

/// Language-model head: logits = x . W^T without bias. W is the token embedding when tied (the head
/// then owns no parameter and its gradient accumulates into the embedding's), its own weight otherwise.
class LmHead : public Module {
 public:
  /// Tied to `embedding_weight` ([vocab, C]), which must outlive the head.
  explicit LmHead(Parameter& embedding_weight);
  /// Untied, with its own weight [vocab, C].
  LmHead(std::int64_t d_model, std::int64_t vocab_size, DType dtype, Device device = Device::host());
  Parameter& weight() { return *weight_; }
  bool tied() const { return tied_; }
  std::vector<Parameter*> borrowed_parameters() override;
  /// Streams the weight's gradient by rows of the vocabulary.
  bool streams_gradients() const override { return true; }

 protected:
  Tensor forward(const Tensor& input, const RunContext& context) override;
  Tensor backward(const Tensor& grad_output, const RunContext& context) override;

 private:
  Parameter* weight_;
  bool tied_;
  SavedActivations<Tensor> saved_input_{*this};
};

// ---- models -----------------------------------------------------------------------------------

struct GptConfig {
  std::int64_t n_layer = 12;
  std::int64_t n_head = 12;
  std::int64_t d_model = 768;
  std::int64_t seq_len = 1024;  // maximum sequence length (rows of wpe)
  std::int64_t vocab_size = 50257;
  bool tie_embeddings = true;
  double dropout = 0;
  /// Activation checkpointing: every `activation_checkpoint_interval` consecutive blocks run in one
  /// nn::ActivationCheckpoint (the last group may be shorter); 0: off. Parameter names, values and
  /// order are the same either way.
  std::int64_t activation_checkpoint_interval = 0;
  /// With checkpointing: keep the checkpoints' inputs in host memory off the host (cpu_checkpointing).
  bool cpu_checkpointing = false;
};

/// Parameters of a Gpt with this config, counted without building it (GPT-2 124M: 124,439,808).
std::int64_t gpt_parameter_count(const GptConfig& config);

/// GPT-2: tokens int32 [B, T] -> logits [B, T, vocab]. Children wte, wpe, drop, h (blocks h.0 ...),
/// ln_f, lm_head; with activation checkpointing, h holds ActivationCheckpoints (named "h", no level
/// of their own) that hold the blocks, still named h.0 .... Initialized like GPT-2 from `seed`
/// (deterministic): weights normal(0, 0.02), the residual projections (attn.proj, mlp.proj) normal(0, 0.02 /
/// sqrt(2 n_layer)), biases 0, LayerNorm weight 1 and bias 0. backward(grad_logits) returns an undefined
/// tensor.
class Gpt : public Module {
 public:
  explicit Gpt(const GptConfig& config, DType dtype = DType::fp32, std::uint64_t seed = 0,
               Device device = Device::host());
  const GptConfig& config() const { return config_; }
  DType dtype() const { return dtype_; }

 protected:
  Tensor forward(const Tensor& tokens, const RunContext& context) override;
  Tensor backward(const Tensor& grad_output, const RunContext& context) override;

 private:
  GptConfig config_;
  DType dtype_;
  Embedding* wte_;
  PositionalEmbedding* wpe_;
  Dropout* drop_;
  Sequential* blocks_;
  LayerNorm* ln_f_;
  LmHead* lm_head_;
};

struct MlpConfig {
  std::vector<std::int64_t> sizes;  // input, hidden..., output (at least two)
  ActivationKind activation = ActivationKind::gelu;
  /// Activation checkpointing: every `activation_checkpoint_interval` consecutive layers (a Linear
  /// with the activation after it) run in one nn::ActivationCheckpoint; 0: off. Names are the same.
  std::int64_t activation_checkpoint_interval = 0;
  bool cpu_checkpointing = false;  // as in GptConfig
};

/// Linear layers with an activation between consecutive ones (none after the last):
/// modules "0" (Linear), "1" (activation), "2" (Linear), ... Weights normal(0, 1/sqrt(fan_in))
/// from `seed`, biases 0. With activation checkpointing, the children are ActivationCheckpoints
/// (no level of their own) that hold those modules.
class Mlp : public Sequential {
 public:
  explicit Mlp(const MlpConfig& config, DType dtype = DType::fp32, std::uint64_t seed = 0,
               Device device = Device::host());
};

/// Fill `parameter.value` with normal(0, stddev) from a generator keyed by `seed` and the parameter's
/// name (so the result does not depend on construction order or thread count).
void init_normal(Parameter& parameter, double stddev, std::uint64_t seed);
/// GPT-2's initialization of the parameters of `module` and its descendants, named as in the whole
/// model (a Gpt, or one of its pipeline layers): weights normal(0, 0.02), the residual projections
/// (attn.proj, mlp.proj) normal(0, 0.02 / sqrt(2 n_layer)), biases and LayerNorms as constructed.
void init_gpt2(Module& module, std::int64_t n_layer, std::uint64_t seed);

// ---- losses -----------------------------------------------------------------------------------
// Stateful wrappers of the loss helpers (zerotrain/loss.hpp) for host code and tests: forward returns
// the loss as a host double (a synchronous read) and keeps what backward needs; backward gives the
// gradient of (scale * loss) with respect to the last forward's output: the engine folds loss
// scaling and 1/accumulation steps into `scale`. The context must outlive the backward.

/// Mean softmax cross-entropy of logits [..., V] against int32 targets [...] (rows whose target is
/// ignore_index do not count).
class SoftmaxCrossEntropy {
 public:
  explicit SoftmaxCrossEntropy(std::int32_t ignore_index = -100) : ignore_index_(ignore_index) {}
  double forward(const Tensor& logits, const Tensor& targets,
                 const ExecutionContext& context = ExecutionContext::host());
  /// Gradient of scale * mean loss with respect to the logits of the last forward.
  Tensor backward(double scale = 1.0);
  std::int64_t counted_rows() const { return counted_rows_; }

 private:
  std::int32_t ignore_index_;
  Loss loss_;
  std::int64_t counted_rows_ = 0;
};

/// Mean squared error over all elements.
class MseLoss {
 public:
  double forward(const Tensor& prediction, const Tensor& target,
                 const ExecutionContext& context = ExecutionContext::host());
  Tensor backward(double scale = 1.0);

 private:
  Loss loss_;
};

}  // namespace zt::nn
