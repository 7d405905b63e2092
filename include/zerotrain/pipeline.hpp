// Pipeline parallelism: a model as a list of layers, split into consecutive stages, each rank
// building only its stage's layers (DeepSpeed's PipelineModule and LayerSpec).
//
//   std::vector<zt::nn::LayerSpec> layers = zt::nn::gpt_layers(gpt_config, dtype, seed);
//   zt::nn::PipelineStage stage(std::move(layers), zt::nn::partition_layers(layers, stages, "parameters"),
//                               grid.coordinates().pipeline);
//   auto engine = zt::initialize(runtime, stage, config, {.grid = &grid});
//   engine->train_batch(next_micro_batch);  // the engine runs the pipeline schedule
//
// A layer keeps the names it has in the whole model (a TransformerBlock of layer 3 is "h.3.*" on
// whichever stage it lands), so checkpoints do not depend on the split. Tied layers: a parameter
// whose name is held by more than one stage (GPT's token embedding on the first stage and the LM
// head's copy of it on the last) is one parameter: its stages start from the same values, their
// gradients are summed between them before every update, and checkpoints hold it once.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "zerotrain/nn.hpp"

namespace zt::nn {

class PipelineStage;

/// One layer of a pipelinable model, described without building it.
struct LayerSpec {
  /// Unique among the model's layers ("embeddings", "h.3", "head").
  std::string key;
  /// Where the layer's names sit in the whole model: "h.3" names its parameters "h.3.*"; "" puts
  /// its children at the root (the embeddings' "wte" and "wpe").
  std::string path;
  /// The layer's class ("TransformerBlock"), matched by the partition method "type:<regex>".
  std::string type;
  /// Parameter elements of the layer (for the partition method "parameters"), counted without
  /// building it; a tied copy counts too.
  std::int64_t parameter_count = 0;
  /// Builds the layer on the host. `stage` holds the layers of the stage built before this one: a
  /// tied layer looks there for the parameter it shares and makes its own copy when it is absent.
  std::function<std::unique_ptr<Module>(PipelineStage& stage)> build;
  /// Optional: initializes the layer's parameters once it carries its names (initializers keyed by
  /// the parameter's name, as zt::nn::init_normal, need them).
  std::function<void(Module& layer)> initialize;
};

/// Boundaries of `stages` consecutive parts of `layers`: stage s holds layers
/// [boundaries[s], boundaries[s + 1]); boundaries has stages + 1 entries, the first 0 and the last
/// layers.size(), and every stage holds at least one layer. Methods (DeepSpeed's PipelineModule):
///   "uniform":      layer counts differ by at most one, the first stages taking the extra layers;
///   "parameters":   the largest stage parameter count is as small as it can be ("best" is the same);
///   "type:<regex>": the same over the number of layers whose type matches the regex
///                   (ECMAScript, case-insensitive, anywhere in the type: "type:transformer");
///                   the layers that do not match weigh nothing but are placed all the same.
/// Among the balanced partitions that reach the smallest largest weight, each stage in turn takes
/// as many layers as it can (the earlier stages are as full as allowed: the boundaries are the
/// lexicographically largest): 10 equal layers in 4 stages are 3, 3, 3, 1, and a weightless layer
/// between two stages' layers joins the earlier stage where the later stages can spare it.
/// Fewer layers than stages, an unknown method or a regex that matches no layer is a zt::ConfigError.
std::vector<std::int64_t> partition_layers(const std::vector<LayerSpec>& layers, int stages,
                                           std::string_view method);

/// Activation checkpointing of a stage's layers (DeepSpeed's activation_checkpoint_interval).
struct StageCheckpointing {
  /// Every `interval` consecutive layers of the stage in one nn::ActivationCheckpoint (the last
  /// group may be shorter); 0: none.
  std::int64_t interval = 0;
  bool keep_input_on_host = false;  // cpu_checkpointing
};

/// The layers [boundaries[stage], boundaries[stage + 1]) of a pipelinable model, built on the host
/// in order. forward runs them in order, backward in reverse. Stage 0 takes the model's inputs; the
/// last stage's output is the model's. With checkpointing, groups of layers run inside
/// nn::ActivationCheckpoints that keep the layers' names.
class PipelineStage : public Module {
 public:
  PipelineStage(const std::vector<LayerSpec>& layers, const std::vector<std::int64_t>& boundaries, int stage,
                StageCheckpointing checkpointing = {});

  int stage() const { return stage_; }
  int stages() const { return stages_; }
  bool is_first() const { return stage_ == 0; }
  bool is_last() const { return stage_ + 1 == stages_; }
  /// The model's layer index of this stage's first layer, and one past its last.
  std::int64_t first_layer() const { return first_layer_; }
  std::int64_t end_layer() const { return end_layer_; }
  /// This stage's layers in order.
  const std::vector<Module*>& layers() const { return layers_; }

 protected:
  Tensor forward(const Tensor& input, const RunContext& context) override;
  Tensor backward(const Tensor& grad_output, const RunContext& context) override;

 private:
  int stage_;
  int stages_;
  std::int64_t first_layer_;
  std::int64_t end_layer_;
  std::vector<Module*> layers_;
  std::vector<Module*> runs_;  // what forward runs in order: the layers, or their checkpoints
};

/// GPT-2 as layers: "embeddings" (wte, wpe, drop), "h.0" ... "h.<n_layer-1>" (TransformerBlock),
/// "head" (ln_f, lm_head; with tied embeddings it uses "wte.weight" of its stage, or holds a tied
/// copy named "wte.weight" when the embeddings are on another stage). Parameter names, values and
/// dropout seeds are those of zt::nn::Gpt(config, dtype, seed): stages together compute what the
/// Gpt does.
std::vector<LayerSpec> gpt_layers(const GptConfig& config, DType dtype = DType::fp32, std::uint64_t seed = 0);

/// The Mlp as layers: its children "0", "1", ... (Linear and activation), one layer each, with the
/// names and values of zt::nn::Mlp(config, dtype, seed).
std::vector<LayerSpec> mlp_layers(const MlpConfig& config, DType dtype = DType::fp32, std::uint64_t seed = 0);

}  // namespace zt::nn
