// Module: hooks around forward/backward, saved activations, the parameter and module tree, modes.
#include <algorithm>

#include "zerotrain/nn.hpp"

namespace zt::nn {
namespace {

/// The slots saved by the forwards running on this thread, in order: a run_forward that fails
/// releases the ones saved since it started (and only those: a second forward into an occupied
/// slot must not destroy the first forward's activations).
thread_local std::vector<std::pair<detail::SavedSlots*, std::uint32_t>> forward_journal;
thread_local int forwards_running = 0;

}  // namespace

void detail::note_saved(SavedSlots* slots, std::uint32_t micro_batch) {
  if (forwards_running > 0) forward_journal.emplace_back(slots, micro_batch);
}

Tensor Module::run_forward(const Tensor& input, const RunContext& context) {
  const std::size_t journal_start = forward_journal.size();
  ++forwards_running;
  try {
    for (auto& entry : forward_pre_hooks_) entry.hook(*this, input);
    Tensor output = forward(input, context);
    for (auto& entry : forward_post_hooks_) entry.hook(*this, input, output);
    if (--forwards_running == 0) forward_journal.clear();
    return output;
  } catch (...) {
    for (std::size_t i = journal_start; i < forward_journal.size(); ++i)
      forward_journal[i].first->release(forward_journal[i].second);
    forward_journal.resize(journal_start);
    --forwards_running;
    throw;
  }
}

Tensor Module::run_backward(const Tensor& grad_output, const RunContext& context) {
  try {
    for (auto& entry : backward_pre_hooks_) entry.hook(*this, grad_output);
    Tensor grad_input = backward(grad_output, context);
    for (auto& entry : backward_post_hooks_) entry.hook(*this, grad_input);
    return grad_input;
  } catch (...) {
    release_activations(context.micro_batch);  // this backward owned all of them
    throw;
  }
}

void Module::release_activations(std::uint32_t micro_batch) {
  for (Module* module : modules()) {
    for (detail::SavedSlots* slots : module->saved_) slots->release(micro_batch);
  }
}

void Module::release_activations() {
  for (Module* module : modules()) {
    for (detail::SavedSlots* slots : module->saved_) slots->release_all();
  }
}

std::size_t Module::saved_activation_count() {
  std::size_t count = 0;
  for (Module* module : modules()) {
    for (const detail::SavedSlots* slots : module->saved_) count += slots->held();
  }
  return count;
}

std::vector<Parameter*> Module::direct_parameters() {
  std::vector<Parameter*> result;
  result.reserve(parameters_.size());
  for (auto& parameter : parameters_) result.push_back(parameter.get());
  return result;
}

std::vector<Parameter*> Module::parameters() {
  std::vector<Parameter*> result = direct_parameters();
  for (auto& [local_name, child] : children_) {
    for (Parameter* parameter : child->parameters()) result.push_back(parameter);
  }
  return result;
}

std::vector<Module*> Module::children() {
  std::vector<Module*> result;
  for (auto& [local_name, child] : children_) result.push_back(child.get());
  return result;
}

std::vector<Module*> Module::modules() {
  std::vector<Module*> result{this};
  for (auto& [local_name, child] : children_) {
    for (Module* module : child->modules()) result.push_back(module);
  }
  return result;
}

Parameter* Module::find_parameter(const std::string& dotted_name) {
  for (Parameter* parameter : parameters()) {
    if (parameter->name == dotted_name) return parameter;
  }
  return nullptr;
}

Module* Module::find_module(const std::string& dotted_name) {
  for (Module* module : modules()) {
    if (module->name_ == dotted_name) return module;
  }
  return nullptr;
}

std::int64_t Module::parameter_count() {
  std::int64_t count = 0;
  for (Parameter* parameter : parameters()) count += parameter->value.numel();
  return count;
}

void Module::train(bool training) {
  for (Module* module : modules()) module->training_ = training;
}

void Module::zero_grad(const ExecutionContext& execution) {
  for (Parameter* parameter : parameters()) {
    if (parameter->grad.defined()) execution.zero(parameter->grad);
  }
}

void Module::zero_grad() {
  for (Parameter* parameter : parameters()) {
    if (!parameter->grad.defined()) continue;
    ZT_CHECK(!parameter->grad.device().is_cuda(), type_name_, " '", name_, "': zero_grad() of parameter '",
             parameter->name, "', whose gradient is ", parameter->grad.description(),
             "; pass the ExecutionContext whose compute stream uses it (zero_grad(context)), so that the "
             "clear is ordered with its kernels");
    parameter->grad.zero_();
  }
}

HookHandle Module::add_forward_pre_hook(ForwardPreHook hook) {
  ZT_CHECK(hook != nullptr, "empty forward pre-hook on module '", name_, "' (", type_name_, ")");
  forward_pre_hooks_.push_back({next_hook_id_, std::move(hook)});
  return {next_hook_id_++};
}

HookHandle Module::add_forward_post_hook(ForwardPostHook hook) {
  ZT_CHECK(hook != nullptr, "empty forward post-hook on module '", name_, "' (", type_name_, ")");
  forward_post_hooks_.push_back({next_hook_id_, std::move(hook)});
  return {next_hook_id_++};
}

HookHandle Module::add_backward_pre_hook(BackwardPreHook hook) {
  ZT_CHECK(hook != nullptr, "empty backward pre-hook on module '", name_, "' (", type_name_, ")");
  backward_pre_hooks_.push_back({next_hook_id_, std::move(hook)});
  return {next_hook_id_++};
}

HookHandle Module::add_backward_post_hook(BackwardPostHook hook) {
  ZT_CHECK(hook != nullptr, "empty backward post-hook on module '", name_, "' (", type_name_, ")");
  backward_post_hooks_.push_back({next_hook_id_, std::move(hook)});
  return {next_hook_id_++};
}

bool Module::remove_hook(HookHandle handle) {
  const auto remove_from = [&](auto& hooks) {
    const auto it =
        std::find_if(hooks.begin(), hooks.end(), [&](const auto& entry) { return entry.id == handle.id; });
    if (it == hooks.end()) return false;
    hooks.erase(it);
    return true;
  };
  return remove_from(forward_pre_hooks_) || remove_from(forward_post_hooks_) ||
         remove_from(backward_pre_hooks_) || remove_from(backward_post_hooks_);
}

Parameter& Module::register_parameter(const std::string& local_name, Tensor value) {
  ZT_CHECK(!local_name.empty() && local_name.find('.') == std::string::npos, "parameter name '", local_name,
           "' in module '", name_, "' (", type_name_, "): expected a non-empty name without dots");
  for (auto& existing : parameters_) {
    ZT_CHECK(existing->name != local_name, "module ", type_name_, " registers parameter '", local_name,
             "' twice");
  }
  ZT_CHECK(value.defined() && dtype_is_floating(value.dtype()), "parameter '", local_name, "' of ",
           type_name_, ": expected a defined floating tensor, got ", value.description());
  auto parameter = std::make_unique<Parameter>();
  parameter->name = name_.empty() ? local_name : name_ + "." + local_name;
  parameter->grad = Tensor::zeros(value.shape(), value.dtype(), value.device(), MemoryCategory::gradients);
  parameter->value = std::move(value);
  parameters_.push_back(std::move(parameter));
  return *parameters_.back();
}

void Module::adopt_child(const std::string& key, const std::string& path, std::unique_ptr<Module> child) {
  ZT_CHECK(child != nullptr, "null child '", key, "' registered in ", type_name_);
  ZT_CHECK(!key.empty(), "child of module ", type_name_, ": expected a non-empty name");

  for (auto& [existing, module] : children_) {
    ZT_CHECK(existing != key, "module ", type_name_, " registers child '", key, "' twice");
  }
  const std::string prefix = name_.empty() ? path : path.empty() ? name_ : name_ + "." + path;
  if (!prefix.empty()) child->add_name_prefix(prefix);
  child->train(training_);
  children_.emplace_back(key, std::move(child));
}

void Module::add_name_prefix(const std::string& prefix) {
  // A module's own name is its path; parameters' names are the path plus their local name.
  for (Module* module : modules())
    module->name_ = module->name_.empty() ? prefix : prefix + "." + module->name_;
  for (Parameter* parameter : parameters()) parameter->name = prefix + "." + parameter->name;
}

}  // namespace zt::nn
