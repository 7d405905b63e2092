// Optimizers over flat fp32 master buffers: SGD, Adam and AdamW with DeepSpeed's semantics.
//
// The engine owns the parameters and gradients; an optimizer is handed spans of fp32 master weights
// (whole flat buffers, or one rank's ZeRO shards of them) and allocates its own state next to them
// (MemoryCategory::optimizer_states). When the state lives elsewhere (NVMe offload swaps it into
// host buffers one sub-group at a time), build the optimizer over no buffers and drive it with
// begin_step() and update_range() on the caller's memory: the same kernels, the same step count. Each step is
// one fused pass per buffer: unscale and clip the gradient (grad_scale), update the state and the master
// weights, and optionally write a 16-bit copy of the new weights. Independent of zt::Config: the engine maps
// the ds_config "optimizer" section to OptimizerParams.
//
// An optimizer works on one device (device(); the host by default): the weights, gradients, 16-bit
// copies and caller-stored state it is handed are memory of that device, its own state is allocated
// and zeroed there, and its kernels run on the stream passed to step()/update_range() (nullptr:
// default_stream(device())). Today the optimizer kernels exist for the host and the emulated device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zerotrain/device.hpp"
#include "zerotrain/dtype.hpp"

namespace zt {

/// A flat fp32 master-weight buffer (or a shard of one), updated in place.
struct ParamBuffer {
  float* data = nullptr;
  std::size_t count = 0;
};

/// The gradient of one ParamBuffer: `count` elements of fp32, bf16 or fp16.
struct GradBuffer {
  const void* data = nullptr;
  DType dtype = DType::fp32;
};

/// Where to write a 16-bit copy of the updated weights (bf16 or fp16); data == nullptr: no copy.
struct HalfParamBuffer {
  void* data = nullptr;
  DType dtype = DType::bf16;
};

/// Hyperparameters. Defaults are DeepSpeed's FusedAdam ones (lr 1e-3, betas (0.9, 0.999), eps 1e-8,
/// weight_decay 0, adam_w_mode true, bias_correction true) and torch SGD's (momentum 0, dampening 0,
/// nesterov false). The learning rate passed to step() wins over `lr`, which is the base value
/// (e.g. the one schedulers start from).
struct OptimizerParams {
  float lr = 1e-3f;
  float beta1 = 0.9f;  // Adam; schedulers that cycle momentum set this one
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  bool adam_w_mode = true;  // "adam": true = decoupled (AdamW), false = L2 in the gradient
  bool bias_correction = true;
  float momentum = 0.0f;  // SGD
  float dampening = 0.0f;
  bool nesterov = false;
};

/// Base of all optimizers. Not thread-safe; one per rank.
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// "sgd", "adam" (adam_w_mode false) or "adamw".
  virtual std::string_view name() const = 0;

  /// One update of every buffer: grads[i] (and params_16bit[i], when given) go with buffer i.
  /// grad_scale multiplies each gradient on the fly (1/loss_scale times the clip coefficient);
  /// lr is this step's learning rate. Increments step_count() once. The kernels run on `stream`
  /// (a stream of device(); nullptr: its default stream).
  void step(std::span<const GradBuffer> grads, float grad_scale, float lr,
            std::span<const HalfParamBuffer> params_16bit = {}, const Stream* stream = nullptr);
  /// The same for an optimizer over exactly one buffer.
  void step(GradBuffer grad, float grad_scale, float lr, HalfParamBuffer params_16bit = {},
            const Stream* stream = nullptr);

  /// Caller-stored state (ZeRO-Infinity's swapped sub-groups): one step is begin_step() once, then
  /// update_range() over every range of master weights, in any order and pieces. begin_step checks
  /// grad_scale and lr as step() does and increments step_count(), so the bias correction (Adam) and
  /// the first-step rule (SGD momentum) are those of step().
  void begin_step(float grad_scale, float lr);
  /// Update `params.count` master weights with the state arrays `state[k]` (state_names()[k], each
  /// params.count floats, caller-owned) and the gradient range `grad`; writes the 16-bit copy when
  /// given. Elementwise: any split of a buffer into ranges gives the bits one call gives.
  void update_range(ParamBuffer params, std::span<float* const> state, GradBuffer grad, float grad_scale,
                    float lr, HalfParamBuffer params_16bit = {}, const Stream* stream = nullptr);

  std::size_t buffer_count() const { return params_.size(); }
  ParamBuffer params(std::size_t buffer) const;

  /// Names of the per-element state, in a fixed order: {"exp_avg", "exp_avg_sq"} for Adam,
  /// {"momentum_buffer"} for SGD with momentum, none for plain SGD.
  std::vector<std::string_view> state_names() const;
  /// One state tensor of one buffer (same length as the buffer), for checkpoints. Unknown names
  /// are an error listing the known ones. Memory of device(): off the host, read and write it
  /// through the device API (copy_bytes), not through the span.
  std::span<float> state(std::string_view name, std::size_t buffer);
  std::span<const float> state(std::string_view name, std::size_t buffer) const;

  /// Number of updates applied (torch's "step"); restore it together with the state.
  std::int64_t step_count() const { return step_count_; }
  void set_step_count(std::int64_t steps);

  const OptimizerParams& hyperparameters() const { return params_hp_; }
  /// Change hyperparameters between steps (e.g. momentum cycling); validated as at construction.
  void set_hyperparameters(const OptimizerParams& hyperparameters);

  Device device() const { return device_; }

 protected:
  Optimizer(std::vector<ParamBuffer> params, const OptimizerParams& hyperparameters, Device device);

  /// Allocate one zeroed state tensor per buffer under `name` (optimizer_states accounting).
  void add_state(std::string name);

  /// Check hyperparameters for this optimizer; throws ConfigError naming the bad value.
  virtual void validate(const OptimizerParams& hyperparameters) const = 0;
  /// Update `params` with its state arrays (in state_names() order) on `stream`; step_count()
  /// already counts this step.
  virtual void update(ParamBuffer params, std::span<float* const> state, GradBuffer grad, float grad_scale,
                      float lr, HalfParamBuffer params_16bit, const Stream& stream) = 0;

 private:
  struct StateSlot {
    std::string name;
    std::vector<Buffer> buffers;  // one per parameter buffer
  };
  std::size_t slot_index(std::string_view name) const;
  void check_step_arguments(float grad_scale, float lr) const;
  void check_range_arguments(std::size_t index, std::size_t count, GradBuffer grad,
                             HalfParamBuffer params_16bit) const;
  const Stream& stream_or_default(const Stream* stream) const;

  std::vector<ParamBuffer> params_;
  OptimizerParams params_hp_;
  Device device_;
  std::vector<StateSlot> states_;
  std::int64_t step_count_ = 0;
};

/// Adam with decoupled (AdamW) or L2 weight decay, DeepSpeed FusedAdam / torch semantics.
class Adam final : public Optimizer {
 public:
  Adam(std::vector<ParamBuffer> params, const OptimizerParams& hyperparameters,
       Device device = Device::host());
  std::string_view name() const override { return hyperparameters().adam_w_mode ? "adamw" : "adam"; }

 private:
  void validate(const OptimizerParams& hyperparameters) const override;
  void update(ParamBuffer params, std::span<float* const> state, GradBuffer grad, float grad_scale, float lr,
              HalfParamBuffer params_16bit, const Stream& stream) override;
};

/// SGD with momentum, dampening, nesterov and (L2) weight decay, torch semantics.
class Sgd final : public Optimizer {
 public:
  Sgd(std::vector<ParamBuffer> params, const OptimizerParams& hyperparameters,
      Device device = Device::host());
  std::string_view name() const override { return "sgd"; }

 private:
  void validate(const OptimizerParams& hyperparameters) const override;
  void update(ParamBuffer params, std::span<float* const> state, GradBuffer grad, float grad_scale, float lr,
              HalfParamBuffer params_16bit, const Stream& stream) override;
  bool has_momentum_buffer_ = false;  // allocated when momentum != 0 at construction
};

/// The optimizer types make_optimizer knows, as written in ds_config (case-insensitive there).
inline constexpr std::string_view kOptimizerTypes[] = {"adam", "adamw", "sgd"};

/// Build an optimizer from a ds_config type name, case-insensitive: "adam" (adam_w_mode as given;
/// DeepSpeed's default true makes it AdamW), "adamw" (adam_w_mode forced true), "sgd". Any other
/// name raises ConfigError listing the supported ones.
std::unique_ptr<Optimizer> make_optimizer(std::string_view type, std::vector<ParamBuffer> params,
                                          const OptimizerParams& hyperparameters,
                                          Device device = Device::host());

}  // namespace zt
