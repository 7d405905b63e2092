/* zerotrain's C API: train from C (and, through the Fortran module `zerotrain`, from Fortran) with
 * zerotrain's optimizer, ZeRO stages 0-3, offload and HDF5 checkpoints. C99, no C++ types.
 * The reference, with ownership, error handling, thread safety and Fortran's column-major rules,
 * is docs/c-fortran.md; examples/c/ trains an MLP with its own forward and backward.
 *
 *   zt_runtime* runtime;  zt_config* config;  zt_model* model;  zt_engine* engine;
 *   zt_runtime_create_from_comm(MPI_COMM_WORLD, &runtime);       (MPI initialized by the caller)
 *   zt_config_from_file("ds_config.json", &config);
 *   zt_model_create_external(&model);
 *   zt_model_add_parameter(model, "w1", w1, dw1, 2, shape_w1, ZT_DTYPE_FP32, ZT_DEVICE_HOST, 0);
 *   zt_engine_create(runtime, model, config, &engine);
 *   for (...) { my_forward_backward(w1, dw1, ...);    (accumulate into dw1 with +=)
 *               zt_model_report_loss(model, loss);
 *               zt_engine_step(engine, NULL); }        (reduce, update, write w1 back at the boundary)
 *   zt_engine_destroy(engine); zt_model_destroy(model); zt_config_destroy(config);
 *   zt_runtime_destroy(runtime);
 *
 * Errors: every function returns a zt_status (ZT_STATUS_OK = 0) and never lets a C++ exception
 * through; zt_last_error() is the message of this thread's last call. Handles are opaque; each
 * zt_*_create / zt_*_from_* has its zt_*_destroy, which accepts NULL. An engine keeps its runtime
 * and model alive: they may be destroyed in any order (the last reference frees them).
 *
 * Stability: functions, enumerators and struct layouts of API version 1 (ZT_API_VERSION_MAJOR)
 * stay as they are; later minor versions only add. On Linux the library's C symbols carry the
 * ELF version ZEROTRAIN_C_1 (src/capi/zerotrain_c.map). */
#ifndef ZEROTRAIN_ZEROTRAIN_H
#define ZEROTRAIN_ZEROTRAIN_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) || defined(__clang__)
#define ZT_API __attribute__((visibility("default")))
#else
#define ZT_API
#endif

/* ---- version ---------------------------------------------------------------------------- */

/** The C API this header declares: 1.1 (1.1 added zt_engine_loaded_client_state and
 *  zt_checkpoint_client_state). A program compiled against major M runs with a library
 *  whose zt_api_version() has the same major and a minor at least the header's. */
#define ZT_API_VERSION_MAJOR 1
#define ZT_API_VERSION_MINOR 1
#define ZT_API_VERSION (ZT_API_VERSION_MAJOR * 1000 + ZT_API_VERSION_MINOR)

/** The library's C API version, major * 1000 + minor (compare with ZT_API_VERSION). */
ZT_API int zt_api_version(void);
/** The library's version, "0.1.0" (static storage). */
ZT_API const char* zt_version(void);

/* ---- status and errors ------------------------------------------------------------------- */

typedef enum zt_status {
  ZT_STATUS_OK = 0,
  /** A NULL handle or pointer, or an argument out of range; the message names the argument. */
  ZT_STATUS_INVALID_ARGUMENT = 1,
  /** zt::ConfigError: a config key missing, of the wrong type or out of range, or settings the
   *  engine cannot honour (the message names the key and what is expected). */
  ZT_STATUS_CONFIG_ERROR = 2,
  /** zt::CommError: an MPI or NCCL call failed. */
  ZT_STATUS_COMM_ERROR = 3,
  /** zt::IoError: a file, checkpoint or swap file could not be read or written, or is damaged. */
  ZT_STATUS_IO_ERROR = 4,
  /** zt::CudaError: a CUDA runtime or library call failed. */
  ZT_STATUS_CUDA_ERROR = 5,
  /** Any other zerotrain error (a precondition of the engine not met, e.g. a wrong call order). */
  ZT_STATUS_ERROR = 6,
  /** Memory could not be allocated. */
  ZT_STATUS_OUT_OF_MEMORY = 7,
  /** An unexpected exception inside the library (a bug: please report the message). */
  ZT_STATUS_INTERNAL_ERROR = 8
} zt_status;

/** The message of this thread's last zt_* call that returned a status: "" after a success, else
 *  "zerotrain error on rank R (file:line): what went wrong". Valid until this thread's next zt_*
 *  call; never NULL. Per thread (thread-local storage). */
ZT_API const char* zt_last_error(void);
/** "ZT_STATUS_OK", "ZT_STATUS_CONFIG_ERROR", ... ("ZT_STATUS_UNKNOWN" for other values). */
ZT_API const char* zt_status_name(zt_status status);
/** For bindings built on this API (the Fortran module): report an error the binding found itself
 *  (e.g. a non-contiguous array) through zt_last_error(). Sets this thread's message to `message`
 *  ("" for NULL) and returns `status`. */
ZT_API zt_status zt_set_last_error(zt_status status, const char* message);

/* ---- element types and devices ----------------------------------------------------------- */

/** The numbering of zt::DType. Parameters are in the config's compute dtype (fp32, or bf16/fp16
 *  with bf16.enabled / fp16.enabled); batches of a built-in GPT are int32 token ids. */
typedef enum zt_dtype {
  ZT_DTYPE_FP32 = 0,
  ZT_DTYPE_FP64 = 1,
  ZT_DTYPE_BF16 = 2,
  ZT_DTYPE_FP16 = 3,
  ZT_DTYPE_INT32 = 4,
  ZT_DTYPE_INT64 = 5
} zt_dtype;

/** Where a registered buffer lives. This build trains external models in host memory:
 *  zt_model_add_parameter refuses ZT_DEVICE_CUDA (ZT_STATUS_ERROR) until the CUDA path exists. */
typedef enum zt_device_type { ZT_DEVICE_HOST = 0, ZT_DEVICE_CUDA = 1 } zt_device_type;

/** Most dimensions of a zt_tensor. */
#define ZT_MAX_DIMS 8

/** A caller's array, described for the engine (not copied, not owned): `ndim` extents in
 *  `shape[0..ndim-1]`, row-major (the last index varies fastest; Fortran callers reverse their
 *  shape, the Fortran module does it for them). */
typedef struct zt_tensor {
  void* data;
  zt_dtype dtype;
  int32_t ndim;
  int64_t shape[ZT_MAX_DIMS];
} zt_tensor;

/* ---- runtime ------------------------------------------------------------------------------ */

/** The MPI ranks a training runs on. */
typedef struct zt_runtime zt_runtime;

/** The job's runtime over MPI_COMM_WORLD: initializes MPI (MPI_THREAD_MULTIPLE asked) unless the
 *  caller already did, and then finalizes it when destroyed. argc/argv may be NULL. Collective
 *  over MPI_COMM_WORLD. Starts the watchdog for hung collectives (docs/fault-detection.md). */
ZT_API zt_status zt_runtime_create(int* argc, char*** argv, zt_runtime** runtime);
/** A runtime over `comm` (a duplicate of it) in an MPI the caller initialized and will finalize,
 *  e.g. a sub-communicator of a simulation. Collective over `comm`. Destroy it (and the engines
 *  using it) before MPI_Finalize. */
ZT_API zt_status zt_runtime_create_from_comm(MPI_Comm comm, zt_runtime** runtime);
/** The same from a Fortran handle (an `integer` communicator, or a `type(MPI_Comm)`'s MPI_VAL),
 *  converted with MPI_Comm_f2c. */
ZT_API zt_status zt_runtime_create_from_fortran_comm(MPI_Fint comm, zt_runtime** runtime);
/** Drops the caller's reference (NULL: nothing). MPI is finalized here only if this runtime
 *  initialized it and no engine still uses it. */
ZT_API zt_status zt_runtime_destroy(zt_runtime* runtime);
/** This rank and the number of ranks in the runtime's communicator. */
ZT_API zt_status zt_runtime_rank(const zt_runtime* runtime, int* rank);
ZT_API zt_status zt_runtime_size(const zt_runtime* runtime, int* size);

/* ---- config ------------------------------------------------------------------------------- */

/** A parsed ds_config (docs/config.md). */
typedef struct zt_config zt_config;

/** Parse a ds_config JSON file. A bad key or value is ZT_STATUS_CONFIG_ERROR naming it; an
 *  unreadable file ZT_STATUS_CONFIG_ERROR naming the file. Not collective. */
ZT_API zt_status zt_config_from_file(const char* path, zt_config** config);
/** Parse ds_config JSON text (NUL-terminated). */
ZT_API zt_status zt_config_from_string(const char* json, zt_config** config);
ZT_API zt_status zt_config_destroy(zt_config* config);

/* ---- models ------------------------------------------------------------------------------- */

/** The parameters to train: the caller's own buffers (an external model) or a built-in model. */
typedef struct zt_model zt_model;

/** An empty external model: the caller registers its buffers, runs forward and backward itself
 *  and calls zt_engine_step() after each micro-batch (docs/byo_model.md). */
ZT_API zt_status zt_model_create_external(zt_model** model);
/** Register a parameter of an external model (before zt_engine_create): `values` and `gradients`
 *  are distinct buffers of prod(shape[0..ndim-1]) elements of `dtype` (the config's compute dtype)
 *  on `device` (index `device_index`), owned by the caller, alive and at the same address as long
 *  as any engine on this model. `name` is copied; unique, no dots. Every rank registers the same
 *  parameters in the same order with the same initial values. */
ZT_API zt_status zt_model_add_parameter(zt_model* model, const char* name, void* values, void* gradients,
                                        int32_t ndim, const int64_t* shape, zt_dtype dtype,
                                        zt_device_type device, int32_t device_index);
/** An external model's loss of one micro-batch (this rank), for the step's reported loss (the
 *  mean over the step's micro-batches and the data-parallel ranks). Optional. */
ZT_API zt_status zt_model_report_loss(zt_model* model, double loss);
/** The built-in model the config's "model" section describes (GPT or MLP; docs/engine.md),
 *  initialized from the config's seed in the compute dtype. */
ZT_API zt_status zt_model_create_builtin(const zt_config* config, zt_model** model);
/** Number of parameter tensors and of parameter elements (whole model). */
ZT_API zt_status zt_model_parameter_count(const zt_model* model, int64_t* tensors, int64_t* elements);
/** Drops the caller's reference; an engine on it keeps it alive. */
ZT_API zt_status zt_model_destroy(zt_model* model);

/* ---- engine ------------------------------------------------------------------------------- */

/** Optimizer, ZeRO partitioning, mixed precision, offload and checkpoints over a model. */
typedef struct zt_engine zt_engine;

/** Batch sizes as the engine resolved them (the ds_config batch rule; data-parallel size = ranks). */
typedef struct zt_batch_sizes {
  int64_t train_batch_size;
  int64_t micro_batch_size; /* train_micro_batch_size_per_gpu */
  int64_t gradient_accumulation_steps;
  int32_t data_parallel_size;
  int32_t data_parallel_rank;
} zt_batch_sizes;

/** What the last optimizer step did; the same on every rank except the comm_* fields. */
typedef struct zt_step_report {
  int64_t step;             /* global optimizer steps after this one */
  double loss;              /* mean over the step's micro-batches and the data-parallel ranks */
  double grad_norm;         /* global L2 norm before clipping (NaN on overflow) */
  double lr;                /* learning rate used */
  double loss_scale;        /* loss scale of the step's gradients (1 in fp32) */
  int32_t skipped;          /* 1: overflow, no update */
  int32_t reserved0;        /* 0 */
  uint64_t comm_bytes;      /* bytes this rank sent for the step */
  double comm_wait_seconds; /* this rank blocked in the step's collectives */
  double reserved[4];       /* 0; room for later fields */
} zt_step_report;

/** The engine (collective over the runtime's ranks): `config` is copied, `runtime` and `model` are
 *  kept alive by the engine. An external model trains at ZeRO stages 0-3 with optimizer offload
 *  (cpu, nvme) and, at stage 3, parameter offload; at stage 3 the engine keeps only this rank's
 *  piece of each parameter as the master and gathers the full values into the caller's buffers
 *  after every update and load (docs/c-fortran.md, "Stage 3"). A model belongs to one engine. */
ZT_API zt_status zt_engine_create(zt_runtime* runtime, zt_model* model, const zt_config* config,
                                  zt_engine** engine);
ZT_API zt_status zt_engine_destroy(zt_engine* engine);

/** Count a micro-batch (call after each backward). At the accumulation boundary (every
 *  gradient_accumulation_steps calls; collective): reduce the gradients across data-parallel ranks
 *  (for an external model straight from the caller's gradient buffers), check for overflow, clip,
 *  update, write the new values into an external model's value buffers and zero its gradient
 *  buffers. `boundary` (may be NULL) is set to 1 at a boundary, else 0. */
ZT_API zt_status zt_engine_step(zt_engine* engine, int* boundary);
/** Built-in models: forward and backward of one micro-batch with the built-in loss (softmax
 *  cross-entropy for a GPT: int32 inputs and targets [B, T]; mean squared error for an MLP: fp32
 *  inputs [B, in] and targets [B, out]); `loss` (may be NULL) is this rank's unscaled loss. Then
 *  call zt_engine_step(). */
ZT_API zt_status zt_engine_forward_backward(zt_engine* engine, const zt_tensor* inputs,
                                            const zt_tensor* targets, double* loss);
/** Built-in models: one optimizer step over `micro_batches` micro-batches (must equal
 *  gradient_accumulation_steps), inputs[i] and targets[i] as in zt_engine_forward_backward.
 *  `report` (may be NULL) receives the step's report. Collective. */
ZT_API zt_status zt_engine_train_batch(zt_engine* engine, int64_t micro_batches, const zt_tensor* inputs,
                                       const zt_tensor* targets, zt_step_report* report);
/** The report of the last optimizer step (zeros before the first). */
ZT_API zt_status zt_engine_last_step(const zt_engine* engine, zt_step_report* report);
ZT_API zt_status zt_engine_batch_sizes(const zt_engine* engine, zt_batch_sizes* sizes);
/** Global optimizer steps taken (counting skipped ones), as restored by a load. */
ZT_API zt_status zt_engine_global_steps(const zt_engine* engine, int64_t* steps);
ZT_API zt_status zt_engine_zero_stage(const zt_engine* engine, int* stage);
/** Where this rank's optimizer states and parameter pieces live (docs/offload.md), as text:
 *  "optimizer states: host memory; parameters: host memory", or with "nvme <swap file> (<backend>)
 *  ..." for offload. Writes at most `capacity` bytes into `text`, NUL included (truncated to fit;
 *  text may be NULL with capacity 0); `length` (may be NULL) gets the whole text's length, so that
 *  a first call with capacity 0 asks the size. Every call below that returns text does the same. */
ZT_API zt_status zt_engine_placement(const zt_engine* engine, char* text, size_t capacity, size_t* length);

/** Save a checkpoint to DIR/TAG.h5 (collective, at an accumulation boundary; docs/checkpoint-format.md).
 *  `tag` NULL: "global_step<N>". `client_state` NULL: "{}", else JSON text (any JSON value; other
 *  text is ZT_STATUS_INVALID_ARGUMENT) stored with it as given, for zt_engine_loaded_client_state
 *  after a load. `keep_last` > 0 removes older tags beyond that many. */
ZT_API zt_status zt_engine_save_checkpoint(zt_engine* engine, const char* dir, const char* tag,
                                           const char* client_state, int64_t keep_last);
/** Load a checkpoint saved at any world size and ZeRO stage (collective). `tag` NULL: the tag in
 *  DIR/latest. An external model's buffers get the loaded values. A missing, damaged or mismatching
 *  file is ZT_STATUS_IO_ERROR naming the file and dataset. */
ZT_API zt_status zt_engine_load_checkpoint(zt_engine* engine, const char* dir, const char* tag);
/** The client state of the checkpoint the engine last loaded, the text given to
 *  zt_engine_save_checkpoint ("{}" when it was NULL), as zt_engine_placement writes text. Not
 *  collective. ZT_STATUS_ERROR when the engine has loaded none, or its last load failed. (API 1.1) */
ZT_API zt_status zt_engine_loaded_client_state(const zt_engine* engine, char* text, size_t capacity,
                                               size_t* length);
/** Set every parameter from a plain HDF5 file of named tensors (the layout of zt_checkpoint_export;
 *  collective, every rank passes the same path): an external model's buffers get the values; the
 *  optimizer state and counters stay. A missing file, or one whose tensors do not fit the model
 *  (each mismatching, missing and unexpected tensor named), is ZT_STATUS_IO_ERROR
 *  (docs/checkpoint-format.md, "Import"). */
ZT_API zt_status zt_engine_load_weights(zt_engine* engine, const char* path);

/* ---- checkpoint files (one process, not collective) -------------------------------------- */

/** Write the parameters of checkpoint file `path` (DIR/TAG.h5), by name and shape, to a plain HDF5
 *  file `out` in `dtype` (ZT_DTYPE_FP32 or ZT_DTYPE_BF16). */
ZT_API zt_status zt_checkpoint_export(const char* path, const char* out, zt_dtype dtype);
/** The client state stored in checkpoint file `path` (DIR/TAG.h5), as zt_engine_placement writes
 *  text, after the structure checks every reader makes, the attribute checksum (which covers the
 *  client state) among them; ZT_STATUS_IO_ERROR names the file and the problem. The datasets'
 *  checksums are not read (zt_checkpoint_verify). One process. (API 1.1) */
ZT_API zt_status zt_checkpoint_client_state(const char* path, char* text, size_t capacity, size_t* length);
/** Verify every checksum of checkpoint file `path`; ZT_STATUS_IO_ERROR names the first bad dataset. */
ZT_API zt_status zt_checkpoint_verify(const char* path);

/* ---- metrics ------------------------------------------------------------------------------ */

/** A JSON-lines metrics file, written by rank 0 of the runtime (other ranks write nothing). */
typedef struct zt_metrics zt_metrics;

/** Open (truncate) `path` on rank 0 for JSON lines. Not collective. */
ZT_API zt_status zt_metrics_open(const zt_runtime* runtime, const char* path, zt_metrics** metrics);
/** Append one line {"event": "step", "step", "loss", "lr", "grad_norm", "loss_scale", "skipped",
 *  "comm_bytes"} from the engine's last step, merged with the members of `extra_json` (a JSON
 *  object, may be NULL). Flushed at once. */
ZT_API zt_status zt_metrics_record_step(zt_metrics* metrics, const zt_engine* engine, const char* extra_json);
/** Append one line {"event": event, ...members of `json` (a JSON object, may be NULL)}. */
ZT_API zt_status zt_metrics_record(zt_metrics* metrics, const char* event, const char* json);
ZT_API zt_status zt_metrics_close(zt_metrics* metrics);

#ifdef __cplusplus
}
#endif

#endif /* ZEROTRAIN_ZEROTRAIN_H */
