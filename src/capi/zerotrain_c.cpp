// The C API (include/zerotrain/zerotrain.h) over the C++ one. Every entry point runs its body in
// guarded(), which turns each exception into a zt_status and this thread's message, so that no C++
// exception crosses into C or Fortran.
#include "zerotrain/zerotrain.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>
#include <new>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>

#include "zerotrain/build_info.hpp"
#include "zerotrain/checkpoint.hpp"
#include "zerotrain/config.hpp"
#include "zerotrain/engine.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/external_model.hpp"
#include "zerotrain/runtime.hpp"

// The handles: each holds shared ownership of what it uses, so that the caller may destroy them in
// any order (an engine keeps its runtime and model alive).
struct zt_runtime {
  std::shared_ptr<zt::Runtime> runtime;
};

struct zt_config {
  zt::Config config;
};

struct zt_model {
  std::shared_ptr<zt::nn::Module> module;
  zt::ExternalModel* external = nullptr;  // module, when it is the caller's buffers
  bool has_engine = false;                // registered buffers are fixed once an engine uses them
  // Counted while the model is built: at stage 3 an engine releases a built-in model's gathered values.
  int64_t tensors = 0;
  int64_t elements = 0;
};

struct zt_engine {
  std::shared_ptr<zt::Runtime> runtime;
  std::shared_ptr<zt::nn::Module> module;
  bool external = false;  // the model is the caller's buffers (forward and backward are the caller's)
  std::optional<std::string> loaded_client_state;  // of the last zt_engine_load_checkpoint
  std::unique_ptr<zt::Engine> engine;              // declared last: destroyed before what it refers to
};

struct zt_metrics {
  std::ofstream out;  // open on rank 0 only
  std::string path;
};

namespace {

/// A NULL handle or pointer, or an argument out of range: ZT_STATUS_INVALID_ARGUMENT.
class InvalidArgument : public zt::Error {
 public:
  using Error::Error;
};

#define ZT_C_REQUIRE(condition, ...) ZT_CHECK_AS(InvalidArgument, condition, __VA_ARGS__)
#define ZT_C_NOT_NULL(function, argument) \
  ZT_C_REQUIRE((argument) != nullptr, function, ": argument '" #argument "' is NULL")

std::string& last_error() {
  thread_local std::string message;
  return message;
}

zt_status fail(zt_status status, const char* message) {
  try {
    last_error() = message;
  } catch (...) {  // no memory for the message: the status still says what happened
  }
  return status;
}

template <typename Body>
zt_status guarded(Body&& body) noexcept {
  try {
    body();
    last_error().clear();
    return ZT_STATUS_OK;
  } catch (const InvalidArgument& error) {
    return fail(ZT_STATUS_INVALID_ARGUMENT, error.what());
  } catch (const zt::ConfigError& error) {
    return fail(ZT_STATUS_CONFIG_ERROR, error.what());
  } catch (const zt::CommError& error) {
    return fail(ZT_STATUS_COMM_ERROR, error.what());
  } catch (const zt::IoError& error) {
    return fail(ZT_STATUS_IO_ERROR, error.what());
  } catch (const zt::CudaError& error) {
    return fail(ZT_STATUS_CUDA_ERROR, error.what());
  } catch (const zt::Error& error) {
    return fail(ZT_STATUS_ERROR, error.what());
  } catch (const std::bad_alloc&) {
    return fail(ZT_STATUS_OUT_OF_MEMORY, "zerotrain error: out of memory");
  } catch (const std::exception& error) {
    return fail(ZT_STATUS_INTERNAL_ERROR, error.what());
  } catch (...) {
    return fail(ZT_STATUS_INTERNAL_ERROR, "zerotrain error: an unknown exception inside the library");
  }
}

zt::DType dtype_of(const char* function, int value) {
  ZT_C_REQUIRE(value >= ZT_DTYPE_FP32 && value <= ZT_DTYPE_INT64, function, ": dtype ", value,
               " is not a zt_dtype (ZT_DTYPE_FP32 .. ZT_DTYPE_INT64)");
  return static_cast<zt::DType>(value);
}

zt::Shape shape_of(const char* function, const char* argument, int32_t ndim, const int64_t* shape) {
  ZT_C_REQUIRE(ndim >= 0 && ndim <= ZT_MAX_DIMS, function, ": ", argument, " has ", ndim,
               " dimensions; expected 0 to ", ZT_MAX_DIMS);
  ZT_C_REQUIRE(ndim == 0 || shape != nullptr, function, ": ", argument, " shape is NULL with ", ndim,
               " dimensions");
  zt::Shape result;
  for (int32_t d = 0; d < ndim; ++d) {
    ZT_C_REQUIRE(shape[d] > 0, function, ": ", argument, " extent ", d, " is ", shape[d],
                 "; expected a positive extent");
    result.push_back(shape[d]);
  }
  return result;
}

zt::Tensor view_of(const char* function, const char* argument, const zt_tensor& tensor) {
  ZT_C_REQUIRE(tensor.data != nullptr, function, ": ", argument, ".data is NULL");
  return zt::Tensor::view_of(tensor.data, shape_of(function, argument, tensor.ndim, tensor.shape),
                             dtype_of(function, tensor.dtype));
}

zt::Engine& engine_of(const char* function, zt_engine* engine) {
  ZT_C_REQUIRE(engine != nullptr && engine->engine != nullptr, function, ": argument 'engine' is NULL");
  return *engine->engine;
}

const zt::Engine& engine_of(const char* function, const zt_engine* engine) {
  ZT_C_REQUIRE(engine != nullptr && engine->engine != nullptr, function, ": argument 'engine' is NULL");
  return *engine->engine;
}

void require_builtin(const char* function, const zt_engine* engine) {
  ZT_C_REQUIRE(!engine->external, function,
               ": the engine trains an external model; run its forward and backward yourself and call "
               "zt_engine_step()");
}

zt_step_report report_of(const zt::StepReport& report) {
  zt_step_report out{};
  out.step = report.step;
  out.loss = report.loss;
  out.grad_norm = report.grad_norm;
  out.lr = report.lr;
  out.loss_scale = report.loss_scale;
  out.skipped = report.skipped ? 1 : 0;
  out.comm_bytes = report.comm_bytes;
  out.comm_wait_seconds = report.comm.wait_seconds;
  return out;
}

/// `text` as a JSON object (NULL: an empty one); anything else is the caller's mistake.
nlohmann::json json_object_of(const char* function, const char* argument, const char* text) {
  if (text == nullptr) return nlohmann::json::object();
  nlohmann::json parsed = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  ZT_C_REQUIRE(parsed.is_object(), function, ": argument '", argument, "' is not a JSON object: ", text);
  return parsed;
}

/// The (text, capacity, length) convention of the calls that return text: at most `capacity` bytes
/// into `text`, NUL included (truncated to fit; text may be NULL with capacity 0), and the whole
/// length into `length` (may be NULL), so that a caller can ask the size first.
void copy_text_out(const char* function, const std::string& value, char* text, size_t capacity,
                   size_t* length) {
  ZT_C_REQUIRE(text != nullptr || capacity == 0, function, ": argument 'text' is NULL with capacity ",
               capacity);
  if (capacity > 0) {
    const std::size_t copied = std::min(value.size(), capacity - 1);
    value.copy(text, copied);
    text[copied] = '\0';
  }
  if (length != nullptr) *length = value.size();
}

void write_line(zt_metrics& metrics, const nlohmann::json& line) {
  if (!metrics.out.is_open()) return;
  metrics.out << line.dump() << '\n';
  metrics.out.flush();  // a run killed midway still leaves every line written so far
  ZT_CHECK_AS(zt::IoError, metrics.out.good(), "writing metrics to '", metrics.path, "' failed");
}

}  // namespace

extern "C" {

int zt_api_version(void) {
  return ZT_API_VERSION;
}

const char* zt_version(void) {
  return zt::build_info::version;
}

const char* zt_last_error(void) {
  return last_error().c_str();
}

zt_status zt_set_last_error(zt_status status, const char* message) {
  return fail(status, message != nullptr ? message : "");
}

const char* zt_status_name(zt_status status) {
  switch (status) {
    case ZT_STATUS_OK:
      return "ZT_STATUS_OK";
    case ZT_STATUS_INVALID_ARGUMENT:
      return "ZT_STATUS_INVALID_ARGUMENT";
    case ZT_STATUS_CONFIG_ERROR:
      return "ZT_STATUS_CONFIG_ERROR";
    case ZT_STATUS_COMM_ERROR:
      return "ZT_STATUS_COMM_ERROR";
    case ZT_STATUS_IO_ERROR:
      return "ZT_STATUS_IO_ERROR";
    case ZT_STATUS_CUDA_ERROR:
      return "ZT_STATUS_CUDA_ERROR";
    case ZT_STATUS_ERROR:
      return "ZT_STATUS_ERROR";
    case ZT_STATUS_OUT_OF_MEMORY:
      return "ZT_STATUS_OUT_OF_MEMORY";
    case ZT_STATUS_INTERNAL_ERROR:
      return "ZT_STATUS_INTERNAL_ERROR";
  }
  return "ZT_STATUS_UNKNOWN";
}

// ---- runtime ------------------------------------------------------------------------------------

zt_status zt_runtime_create(int* argc, char*** argv, zt_runtime** runtime) {
  return guarded([&] {
    ZT_C_NOT_NULL("zt_runtime_create", runtime);
    *runtime = nullptr;
    ZT_C_REQUIRE((argc == nullptr) == (argv == nullptr),
                 "zt_runtime_create: arguments 'argc' and 'argv' must both be NULL or both be set");
    auto handle = std::make_unique<zt_runtime>();
    handle->runtime = std::make_shared<zt::Runtime>(argc, argv);
    *runtime = handle.release();
  });
}

zt_status zt_runtime_create_from_comm(MPI_Comm comm, zt_runtime** runtime) {
  return guarded([&] {
    ZT_C_NOT_NULL("zt_runtime_create_from_comm", runtime);
    *runtime = nullptr;
    ZT_C_REQUIRE(comm != MPI_COMM_NULL, "zt_runtime_create_from_comm: argument 'comm' is MPI_COMM_NULL");
    int initialized = 0;
    MPI_Initialized(&initialized);
    ZT_C_REQUIRE(
        initialized != 0,
        "zt_runtime_create_from_comm: MPI is not initialized; call MPI_Init first, or zt_runtime_create");
    auto handle = std::make_unique<zt_runtime>();
    handle->runtime = std::make_shared<zt::Runtime>(comm);
    *runtime = handle.release();
  });
}

zt_status zt_runtime_create_from_fortran_comm(MPI_Fint comm, zt_runtime** runtime) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized == 0) return zt_runtime_create_from_comm(MPI_COMM_NULL, runtime);
  return zt_runtime_create_from_comm(MPI_Comm_f2c(comm), runtime);
}

zt_status zt_runtime_destroy(zt_runtime* runtime) {
  return guarded([&] { std::unique_ptr<zt_runtime> owned(runtime); });
}

zt_status zt_runtime_rank(const zt_runtime* runtime, int* rank) {
  return guarded([&] {
    ZT_C_NOT_NULL("zt_runtime_rank", runtime);
    ZT_C_NOT_NULL("zt_runtime_rank", rank);
    *rank = runtime->runtime->world_rank();
  });
}

zt_status zt_runtime_size(const zt_runtime* runtime, int* size) {
  return guarded([&] {
    ZT_C_NOT_NULL("zt_runtime_size", runtime);
    ZT_C_NOT_NULL("zt_runtime_size", size);
    *size = runtime->runtime->world_size();
  });
}

// ---- config -------------------------------------------------------------------------------------

zt_status zt_config_from_file(const char* path, zt_config** config) {
  return guarded([&] {
    ZT_C_NOT_NULL("zt_config_from_file", config);
    *config = nullptr;
    ZT_C_NOT_NULL("zt_config_from_file", path);
    auto handle = std::make_unique<zt_config>();
    handle->config = zt::Config::from_file(path);
    *config = handle.release();
  });
}

zt_status zt_config_from_string(const char* json, zt_config** config) {
  return guarded([&] {
    ZT_C_NOT_NULL("zt_config_from_string", config);
    *config = nullptr;
    ZT_C_NOT_NULL("zt_config_from_string", json);
    auto handle = std::make_unique<zt_config>();
    handle->config = zt::Config::from_string(json);
    *config = handle.release();
  });
}

zt_status zt_config_destroy(zt_config* config) {
  return guarded([&] { std::unique_ptr<zt_config> owned(config); });
}

// ---- models -------------------------------------------------------------------------------------

zt_status zt_model_create_external(zt_model** model) {
  return guarded([&] {
    ZT_C_NOT_NULL("zt_model_create_external", model);
    *model = nullptr;
    auto handle = std::make_unique<zt_model>();
    auto external = std::make_shared<zt::ExternalModel>();
    handle->external = external.get();
    handle->module = std::move(external);
    *model = handle.release();
  });
}

zt_status zt_model_add_parameter(zt_model* model, const char* name, void* values, void* gradients,
                                 int32_t ndim, const int64_t* shape, zt_dtype dtype, zt_device_type device,
                                 int32_t device_index) {
  return guarded([&] {
    constexpr const char* function = "zt_model_add_parameter";
    ZT_C_NOT_NULL(function, model);
    ZT_C_NOT_NULL(function, name);
    ZT_C_NOT_NULL(function, values);
    ZT_C_NOT_NULL(function, gradients);
    ZT_C_REQUIRE(
        model->external != nullptr, function, "('", name,
        "'): the model is a built-in one; register buffers with a model from zt_model_create_external");
    ZT_C_REQUIRE(!model->has_engine, function, "('", name,
                 "'): an engine already trains this model; register every parameter before zt_engine_create");
    ZT_C_REQUIRE(device == ZT_DEVICE_HOST || device == ZT_DEVICE_CUDA, function, "('", name, "'): device ",
                 static_cast<int>(device), " is not a zt_device_type");
    ZT_C_REQUIRE(device_index >= 0, function, "('", name, "'): device_index is ", device_index,
                 "; expected >= 0");
    // The engine trains external models on the host (zero_strategy.cpp); say so here, where the
    // buffer is named, rather than when the engine meets it.
    ZT_CHECK(device == ZT_DEVICE_HOST, function, "('", name,
             "'): device buffers (ZT_DEVICE_CUDA) are not trained yet; ",
             "this build trains external models in host memory (ZT_DEVICE_HOST)");
    const zt::Shape parameter_shape = shape_of(function, "the parameter's", ndim, shape);
    model->external->add(name, values, gradients, parameter_shape, dtype_of(function, dtype),
                         zt::Device::host());
    ++model->tensors;
    model->elements += zt::shape_numel(parameter_shape);
  });
}

zt_status zt_model_report_loss(zt_model* model, double loss) {
  return guarded([&] {
    ZT_C_NOT_NULL("zt_model_report_loss", model);
    ZT_C_REQUIRE(model->external != nullptr,
                 "zt_model_report_loss: the model is a built-in one; the engine computes its loss");
    model->external->report_loss(loss);
  });
}

zt_status zt_model_create_builtin(const zt_config* config, zt_model** model) {
  return guarded([&] {
    ZT_C_NOT_NULL("zt_model_create_builtin", model);
    *model = nullptr;
    ZT_C_NOT_NULL("zt_model_create_builtin", config);
    auto handle = std::make_unique<zt_model>();
    handle->module = zt::build_model(config->config);
    for (const zt::nn::Parameter* parameter : handle->module->parameters()) {
      ++handle->tensors;
      handle->elements += zt::shape_numel(parameter->value.shape());
    }
    *model = handle.release();
  });
}

zt_status zt_model_parameter_count(const zt_model* model, int64_t* tensors, int64_t* elements) {
  return guarded([&] {
    ZT_C_NOT_NULL("zt_model_parameter_count", model);
    if (tensors != nullptr) *tensors = model->tensors;
    if (elements != nullptr) *elements = model->elements;
  });
}

zt_status zt_model_destroy(zt_model* model) {
  return guarded([&] { std::unique_ptr<zt_model> owned(model); });
}

// ---- engine -------------------------------------------------------------------------------------

zt_status zt_engine_create(zt_runtime* runtime, zt_model* model, const zt_config* config,
                           zt_engine** engine) {
  return guarded([&] {
    constexpr const char* function = "zt_engine_create";
    ZT_C_NOT_NULL(function, engine);
    *engine = nullptr;
    ZT_C_NOT_NULL(function, runtime);
    ZT_C_NOT_NULL(function, model);
    ZT_C_NOT_NULL(function, config);
    ZT_C_REQUIRE(!model->has_engine, function,
                 ": an engine already trains this model; a model belongs to one engine");
    auto handle = std::make_unique<zt_engine>();
    handle->runtime = runtime->runtime;
    handle->module = model->module;
    handle->external = model->external != nullptr;
    handle->engine = std::make_unique<zt::Engine>(*handle->runtime, *handle->module, config->config);
    model->has_engine = true;
    *engine = handle.release();
  });
}

zt_status zt_engine_destroy(zt_engine* engine) {
  return guarded([&] { std::unique_ptr<zt_engine> owned(engine); });
}

zt_status zt_engine_step(zt_engine* engine, int* boundary) {
  return guarded([&] {
    const bool at_boundary = engine_of("zt_engine_step", engine).step();
    if (boundary != nullptr) *boundary = at_boundary ? 1 : 0;
  });
}

zt_status zt_engine_forward_backward(zt_engine* engine, const zt_tensor* inputs, const zt_tensor* targets,
                                     double* loss) {
  return guarded([&] {
    constexpr const char* function = "zt_engine_forward_backward";
    zt::Engine& trained = engine_of(function, engine);
    ZT_C_NOT_NULL(function, inputs);
    ZT_C_NOT_NULL(function, targets);
    require_builtin(function, engine);
    const double value = trained.forward(
        zt::Batch{view_of(function, "inputs", *inputs), view_of(function, "targets", *targets)});
    trained.backward();
    if (loss != nullptr) *loss = value;
  });
}

zt_status zt_engine_train_batch(zt_engine* engine, int64_t micro_batches, const zt_tensor* inputs,
                                const zt_tensor* targets, zt_step_report* report) {
  return guarded([&] {
    constexpr const char* function = "zt_engine_train_batch";
    zt::Engine& trained = engine_of(function, engine);
    ZT_C_NOT_NULL(function, inputs);
    ZT_C_NOT_NULL(function, targets);
    require_builtin(function, engine);
    ZT_C_REQUIRE(micro_batches == trained.batch().gradient_accumulation_steps, function,
                 ": argument 'micro_batches' is ", micro_batches, " but gradient_accumulation_steps is ",
                 trained.batch().gradient_accumulation_steps);
    // Check every micro-batch before the first is trained: a bad one fails without a partial step.
    std::vector<zt::Batch> batches;
    for (int64_t i = 0; i < micro_batches; ++i) {
      const std::string in = "inputs[" + std::to_string(i) + "]";
      const std::string out = "targets[" + std::to_string(i) + "]";
      batches.push_back(
          {view_of(function, in.c_str(), inputs[i]), view_of(function, out.c_str(), targets[i])});
    }
    const zt::StepReport& done =
        trained.train_batch([&](std::int64_t micro) { return batches.at(static_cast<std::size_t>(micro)); });
    if (report != nullptr) *report = report_of(done);
  });
}

zt_status zt_engine_last_step(const zt_engine* engine, zt_step_report* report) {
  return guarded([&] {
    const zt::Engine& trained = engine_of("zt_engine_last_step", engine);
    ZT_C_NOT_NULL("zt_engine_last_step", report);
    *report = report_of(trained.last_step());
  });
}

zt_status zt_engine_batch_sizes(const zt_engine* engine, zt_batch_sizes* sizes) {
  return guarded([&] {
    const zt::Engine& trained = engine_of("zt_engine_batch_sizes", engine);
    ZT_C_NOT_NULL("zt_engine_batch_sizes", sizes);
    const zt::BatchSizes& batch = trained.batch();
    sizes->train_batch_size = batch.train_batch_size;
    sizes->micro_batch_size = batch.train_micro_batch_size_per_gpu;
    sizes->gradient_accumulation_steps = batch.gradient_accumulation_steps;
    sizes->data_parallel_size = trained.data_parallel_size();
    sizes->data_parallel_rank = trained.data_parallel_rank();
  });
}

zt_status zt_engine_global_steps(const zt_engine* engine, int64_t* steps) {
  return guarded([&] {
    const zt::Engine& trained = engine_of("zt_engine_global_steps", engine);
    ZT_C_NOT_NULL("zt_engine_global_steps", steps);
    *steps = trained.global_steps();
  });
}

zt_status zt_engine_zero_stage(const zt_engine* engine, int* stage) {
  return guarded([&] {
    const zt::Engine& trained = engine_of("zt_engine_zero_stage", engine);
    ZT_C_NOT_NULL("zt_engine_zero_stage", stage);
    *stage = trained.zero_stage();
  });
}

zt_status zt_engine_placement(const zt_engine* engine, char* text, size_t capacity, size_t* length) {
  return guarded([&] {
    const zt::Engine& trained = engine_of("zt_engine_placement", engine);
    const std::string placement = "optimizer states: " + trained.optimizer_states_placement().describe() +
                                  "; parameters: " + trained.parameters_placement().describe();
    copy_text_out("zt_engine_placement", placement, text, capacity, length);
  });
}

zt_status zt_engine_save_checkpoint(zt_engine* engine, const char* dir, const char* tag,
                                    const char* client_state, int64_t keep_last) {
  return guarded([&] {
    constexpr const char* function = "zt_engine_save_checkpoint";
    zt::Engine& trained = engine_of(function, engine);
    ZT_C_NOT_NULL(function, dir);
    ZT_C_REQUIRE(keep_last >= 0, function, ": argument 'keep_last' is ", keep_last, "; expected >= 0");
    // Checked here, before the collective save: a load hands the text back as JSON.
    ZT_C_REQUIRE(client_state == nullptr || nlohmann::json::accept(client_state), function,
                 ": argument 'client_state' is not JSON text: ", client_state);
    zt::SaveOptions options;
    if (tag != nullptr) options.tag = tag;
    if (client_state != nullptr) options.client_state = client_state;
    options.keep_last = keep_last;
    trained.save_checkpoint(dir, options);
  });
}

zt_status zt_engine_load_checkpoint(zt_engine* engine, const char* dir, const char* tag) {
  return guarded([&] {
    zt::Engine& trained = engine_of("zt_engine_load_checkpoint", engine);
    ZT_C_NOT_NULL("zt_engine_load_checkpoint", dir);
    zt::LoadOptions options;
    if (tag != nullptr) options.tag = tag;
    engine->loaded_client_state.reset();  // a failed load leaves no state of an earlier one
    engine->loaded_client_state = trained.load_checkpoint(dir, options).client_state;
  });
}

zt_status zt_engine_loaded_client_state(const zt_engine* engine, char* text, size_t capacity,
                                        size_t* length) {
  return guarded([&] {
    constexpr const char* function = "zt_engine_loaded_client_state";
    engine_of(function, engine);
    ZT_CHECK(engine->loaded_client_state.has_value(), function,
             ": no checkpoint loaded (none yet, or the last zt_engine_load_checkpoint failed)");
    copy_text_out(function, *engine->loaded_client_state, text, capacity, length);
  });
}

zt_status zt_engine_load_weights(zt_engine* engine, const char* path) {
  return guarded([&] {
    zt::Engine& trained = engine_of("zt_engine_load_weights", engine);
    ZT_C_NOT_NULL("zt_engine_load_weights", path);
    trained.load_weights(path);
  });
}

// ---- checkpoint files ---------------------------------------------------------------------------

zt_status zt_checkpoint_export(const char* path, const char* out, zt_dtype dtype) {
  return guarded([&] {
    ZT_C_NOT_NULL("zt_checkpoint_export", path);
    ZT_C_NOT_NULL("zt_checkpoint_export", out);
    ZT_C_REQUIRE(dtype == ZT_DTYPE_FP32 || dtype == ZT_DTYPE_BF16, "zt_checkpoint_export: dtype ",
                 static_cast<int>(dtype), " cannot be exported; expected ZT_DTYPE_FP32 or ZT_DTYPE_BF16");
    zt::export_checkpoint(path, out, static_cast<zt::DType>(dtype));
  });
}

zt_status zt_checkpoint_client_state(const char* path, char* text, size_t capacity, size_t* length) {
  return guarded([&] {
    ZT_C_NOT_NULL("zt_checkpoint_client_state", path);
    copy_text_out("zt_checkpoint_client_state", zt::inspect_checkpoint(path).client_state, text, capacity,
                  length);
  });
}

zt_status zt_checkpoint_verify(const char* path) {
  return guarded([&] {
    ZT_C_NOT_NULL("zt_checkpoint_verify", path);
    zt::verify_checkpoint(path);
  });
}

// ---- metrics ------------------------------------------------------------------------------------

zt_status zt_metrics_open(const zt_runtime* runtime, const char* path, zt_metrics** metrics) {
  return guarded([&] {
    ZT_C_NOT_NULL("zt_metrics_open", metrics);
    *metrics = nullptr;
    ZT_C_NOT_NULL("zt_metrics_open", runtime);
    ZT_C_NOT_NULL("zt_metrics_open", path);
    auto handle = std::make_unique<zt_metrics>();
    handle->path = path;
    if (runtime->runtime->world_rank() == 0) {
      handle->out.open(path, std::ios::out | std::ios::trunc);
      ZT_CHECK_AS(zt::IoError, handle->out.good(), "cannot write metrics to '", path, "'");
    }
    *metrics = handle.release();
  });
}

zt_status zt_metrics_record_step(zt_metrics* metrics, const zt_engine* engine, const char* extra_json) {
  return guarded([&] {
    ZT_C_NOT_NULL("zt_metrics_record_step", metrics);
    const zt::Engine& trained = engine_of("zt_metrics_record_step", engine);
    const nlohmann::json extra = json_object_of("zt_metrics_record_step", "extra_json", extra_json);
    const zt::StepReport& report = trained.last_step();
    nlohmann::json line = {
        {"event", "step"},
        {"step", report.step},
        {"loss", report.loss},
        {"lr", report.lr},
        {"grad_norm", std::isfinite(report.grad_norm) ? nlohmann::json(report.grad_norm) : nlohmann::json()},
        {"loss_scale", report.loss_scale},
        {"skipped", report.skipped},
        {"comm_bytes", report.comm_bytes}};
    line.update(extra);
    write_line(*metrics, line);
  });
}

zt_status zt_metrics_record(zt_metrics* metrics, const char* event, const char* json) {
  return guarded([&] {
    ZT_C_NOT_NULL("zt_metrics_record", metrics);
    ZT_C_NOT_NULL("zt_metrics_record", event);
    nlohmann::json line = {{"event", event}};
    line.update(json_object_of("zt_metrics_record", "json", json));
    write_line(*metrics, line);
  });
}

zt_status zt_metrics_close(zt_metrics* metrics) {
  return guarded([&] {
    std::unique_ptr<zt_metrics> owned(metrics);
    if (owned && owned->out.is_open()) {
      owned->out.close();
      ZT_CHECK_AS(zt::IoError, !owned->out.fail(), "closing metrics file '", owned->path, "' failed");
    }
  });
}

}  // extern "C"
