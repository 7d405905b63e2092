/* The C API as a C program uses it (ctest capi.checks.np1/np2/np4): status codes and messages of
 * the error paths (NULL handles, bad arguments, a bad config key, a missing file), an external
 * model at ZeRO stage 3 whose buffers hold the full values on every rank and come back from a
 * checkpoint, its client state (from the engine after a load and from the file; "{}" without
 * one; text that is not JSON refused), checkpoint verify and export, a built-in MLP trained with
 * train_batch and forward_backward, metrics lines, and the runtime from a Fortran handle.
 *   mpiexec -n N capi_checks WORK_DIR      prints "capi: N checks passed" and exits 0 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zerotrain/zerotrain.h"

static int rank = 0, checks = 0, failures = 0;

#define EXPECT(condition)                                                                                   \
  do {                                                                                                      \
    ++checks;                                                                                               \
    if (!(condition)) {                                                                                     \
      ++failures;                                                                                           \
      fprintf(stderr, "rank %d: FAILED %s:%d: %s (last error: %s)\n", rank, __FILE__, __LINE__, #condition, \
              zt_last_error());                                                                             \
    }                                                                                                       \
  } while (0)

/* `call` returns `expected` and zt_last_error() contains `text`. */
#define EXPECT_STATUS(call, expected, text)                                                                  \
  do {                                                                                                       \
    const zt_status status_ = (call);                                                                        \
    ++checks;                                                                                                \
    if (status_ != (expected) || strstr(zt_last_error(), (text)) == NULL) {                                  \
      ++failures;                                                                                            \
      fprintf(stderr, "rank %d: FAILED %s:%d: %s returned %s (expected %s), message '%s' (expected '%s')\n", \
              rank, __FILE__, __LINE__, #call, zt_status_name(status_), zt_status_name(expected),            \
              zt_last_error(), (text));                                                                      \
    }                                                                                                        \
  } while (0)

#define EXPECT_OK(call) EXPECT_STATUS(call, ZT_STATUS_OK, "")

/* Stops the job at once: the checks after it need what failed. */
#define REQUIRE_OK(call)                                                                      \
  do {                                                                                        \
    const zt_status status_ = (call);                                                         \
    if (status_ != ZT_STATUS_OK) {                                                            \
      fprintf(stderr, "rank %d: FAILED %s:%d: %s: %s: %s\n", rank, __FILE__, __LINE__, #call, \
              zt_status_name(status_), zt_last_error());                                      \
      MPI_Abort(MPI_COMM_WORLD, 2);                                                           \
    }                                                                                         \
  } while (0)

static const char* kLinearConfig =
    "{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": 2, \"gradient_clipping\": 0.0,"
    " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.05}}, \"zero_optimization\": {\"stage\": "
    "3}}";

enum { kIn = 5, kOut = 3 };

static void check_versions_and_names(void) {
  EXPECT(zt_api_version() == ZT_API_VERSION);
  EXPECT(strlen(zt_version()) > 0);
  EXPECT(strcmp(zt_status_name(ZT_STATUS_CONFIG_ERROR), "ZT_STATUS_CONFIG_ERROR") == 0);
  EXPECT(strcmp(zt_status_name((zt_status)99), "ZT_STATUS_UNKNOWN") == 0);
}

static void check_null_handles_and_bad_arguments(void) {
  int value = 0;
  zt_config* config = NULL;
  EXPECT_STATUS(zt_engine_step(NULL, NULL), ZT_STATUS_INVALID_ARGUMENT,
                "zt_engine_step: argument 'engine' is NULL");
  EXPECT_STATUS(zt_runtime_rank(NULL, &value), ZT_STATUS_INVALID_ARGUMENT, "argument 'runtime' is NULL");
  EXPECT_STATUS(zt_config_from_string(NULL, &config), ZT_STATUS_INVALID_ARGUMENT, "argument 'json' is NULL");
  EXPECT(config == NULL);
  EXPECT_STATUS(zt_config_from_string("{}", NULL), ZT_STATUS_INVALID_ARGUMENT, "argument 'config' is NULL");
  EXPECT_STATUS(zt_engine_save_checkpoint(NULL, "dir", NULL, NULL, 0), ZT_STATUS_INVALID_ARGUMENT,
                "argument 'engine' is NULL");
  EXPECT_STATUS(zt_metrics_record(NULL, "x", NULL), ZT_STATUS_INVALID_ARGUMENT, "argument 'metrics' is NULL");
  EXPECT_STATUS(zt_runtime_create_from_comm(MPI_COMM_NULL, NULL), ZT_STATUS_INVALID_ARGUMENT,
                "argument 'runtime' is NULL");
  zt_runtime* runtime = NULL;
  EXPECT_STATUS(zt_runtime_create_from_comm(MPI_COMM_NULL, &runtime), ZT_STATUS_INVALID_ARGUMENT,
                "argument 'comm' is MPI_COMM_NULL");
  /* A success clears the message; destroying NULL is a no-op. */
  EXPECT_OK(zt_engine_destroy(NULL));
  EXPECT(strcmp(zt_last_error(), "") == 0);
  EXPECT_OK(zt_model_destroy(NULL));
  EXPECT_OK(zt_config_destroy(NULL));
  EXPECT_OK(zt_runtime_destroy(NULL));
  EXPECT_OK(zt_metrics_close(NULL));

  zt_model* model = NULL;
  REQUIRE_OK(zt_model_create_external(&model));
  float values[4], gradients[4];
  const int64_t shape[1] = {4}, bad_shape[1] = {0};
  EXPECT_STATUS(
      zt_model_add_parameter(model, "w", NULL, gradients, 1, shape, ZT_DTYPE_FP32, ZT_DEVICE_HOST, 0),
      ZT_STATUS_INVALID_ARGUMENT, "argument 'values' is NULL");
  EXPECT_STATUS(
      zt_model_add_parameter(model, NULL, values, gradients, 1, shape, ZT_DTYPE_FP32, ZT_DEVICE_HOST, 0),
      ZT_STATUS_INVALID_ARGUMENT, "argument 'name' is NULL");
  EXPECT_STATUS(
      zt_model_add_parameter(model, "w", values, gradients, 9, shape, ZT_DTYPE_FP32, ZT_DEVICE_HOST, 0),
      ZT_STATUS_INVALID_ARGUMENT, "has 9 dimensions; expected 0 to 8");
  EXPECT_STATUS(
      zt_model_add_parameter(model, "w", values, gradients, 1, bad_shape, ZT_DTYPE_FP32, ZT_DEVICE_HOST, 0),
      ZT_STATUS_INVALID_ARGUMENT, "extent 0 is 0");
  EXPECT_STATUS(
      zt_model_add_parameter(model, "w", values, gradients, 1, shape, (zt_dtype)42, ZT_DEVICE_HOST, 0),
      ZT_STATUS_INVALID_ARGUMENT, "dtype 42 is not a zt_dtype");
  EXPECT_STATUS(
      zt_model_add_parameter(model, "w", values, values, 1, shape, ZT_DTYPE_FP32, ZT_DEVICE_HOST, 0),
      ZT_STATUS_ERROR, "values and gradients must be different buffers");
  EXPECT_STATUS(
      zt_model_add_parameter(model, "w", values, gradients, 1, shape, ZT_DTYPE_FP32, ZT_DEVICE_CUDA, 0),
      ZT_STATUS_ERROR, "device buffers (ZT_DEVICE_CUDA) are not trained yet");
  EXPECT_STATUS(
      zt_model_add_parameter(model, "w", values, gradients, 1, shape, ZT_DTYPE_FP32, (zt_device_type)7, 0),
      ZT_STATUS_INVALID_ARGUMENT, "device 7 is not a zt_device_type");
  EXPECT_OK(
      zt_model_add_parameter(model, "w", values, gradients, 1, shape, ZT_DTYPE_FP32, ZT_DEVICE_HOST, 0));
  EXPECT_STATUS(
      zt_model_add_parameter(model, "w", values, gradients, 1, shape, ZT_DTYPE_FP32, ZT_DEVICE_HOST, 0),
      ZT_STATUS_ERROR, "twice");
  EXPECT_OK(zt_model_destroy(model));
}

static void check_config_errors(const char* work) {
  zt_config* config = NULL;
  EXPECT_STATUS(zt_config_from_string("{\"zero_optimization\": {\"stage\": 7}}", &config),
                ZT_STATUS_CONFIG_ERROR, "zero_optimization.stage");
  EXPECT(config == NULL);
  EXPECT_STATUS(zt_config_from_string("{\"train_micro_batch_size_per_gpu\": \"eight\"}", &config),
                ZT_STATUS_CONFIG_ERROR, "train_micro_batch_size_per_gpu");
  EXPECT_STATUS(zt_config_from_string("{\"optimizer\": ", &config), ZT_STATUS_CONFIG_ERROR, "");
  char path[1024];
  snprintf(path, sizeof path, "%s/no-such-config.json", work);
  EXPECT_STATUS(zt_config_from_file(path, &config), ZT_STATUS_CONFIG_ERROR, "no-such-config.json");
}

/* The same values on every rank of MPI_COMM_WORLD. */
static int same_on_every_rank(const float* values, int count) {
  float* low = malloc(sizeof(float) * (size_t)count);
  float* high = malloc(sizeof(float) * (size_t)count);
  MPI_Allreduce(values, low, count, MPI_FLOAT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(values, high, count, MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD);
  const int same = memcmp(low, high, sizeof(float) * (size_t)count) == 0;
  free(low);
  free(high);
  return same;
}

/* y = W x + b, mean squared error; one micro-batch of `rows` samples of step `step`. */
static double linear_step(const float* w, const float* b, float* dw, float* db, int sample, int rows) {
  double loss = 0;
  for (int r = 0; r < rows; ++r) {
    float x[kIn];
    for (int i = 0; i < kIn; ++i) x[i] = (float)((sample + r) * 3 + i * 5 % 7) / 7.0f - 0.5f;
    for (int o = 0; o < kOut; ++o) {
      float out = b[o];
      for (int i = 0; i < kIn; ++i) out += w[o * kIn + i] * x[i];
      const float target = x[o] - 0.5f * x[o + 1];
      const float error = out - target;
      loss += (double)error * error / (rows * kOut);
      const float grad = 2.0f * error / (float)(rows * kOut) * 0.5f; /* 1 / gradient_accumulation_steps */
      db[o] += grad;
      for (int i = 0; i < kIn; ++i) dw[o * kIn + i] += grad * x[i];
    }
  }
  return loss;
}

static void train_linear(zt_engine* engine, zt_model* model, float* w, float* b, float* dw, float* db,
                         int steps) {
  zt_batch_sizes batch;
  REQUIRE_OK(zt_engine_batch_sizes(engine, &batch));
  for (int step = 0; step < steps; ++step) {
    for (int micro = 0; micro < batch.gradient_accumulation_steps; ++micro) {
      const int sample =
          (int)(step * batch.train_batch_size +
                (micro * batch.data_parallel_size + batch.data_parallel_rank) * batch.micro_batch_size);
      REQUIRE_OK(zt_model_report_loss(model, linear_step(w, b, dw, db, sample, (int)batch.micro_batch_size)));
      int boundary = -1;
      REQUIRE_OK(zt_engine_step(engine, &boundary));
      EXPECT(boundary == (micro + 1 == batch.gradient_accumulation_steps));
    }
  }
}

/* The client state saved with "saved": any JSON text, kept byte for byte (spacing, UTF-8). */
static const char* kClientState = "{\"epoch\": 1,  \"note\": \"r\xc3\xa9sum\xc3\xa9\", \"steps\": [4, 8]}";

/* `call` (a zt_*_client_state call with text, capacity and length appended) returns kClientState:
 * its length asked first, then the whole text, then cut to a 6-byte buffer. */
#define EXPECT_CLIENT_STATE(call, ...)                                          \
  do {                                                                          \
    char text_[128], cut_[6];                                                   \
    size_t length_ = 0, cut_length_ = 0;                                        \
    memset(text_, 'x', sizeof text_);                                           \
    EXPECT_OK(call(__VA_ARGS__, NULL, 0, &length_));                            \
    EXPECT(length_ == strlen(kClientState));                                    \
    EXPECT_OK(call(__VA_ARGS__, text_, sizeof text_, NULL));                    \
    EXPECT(strcmp(text_, kClientState) == 0);                                   \
    EXPECT_OK(call(__VA_ARGS__, cut_, sizeof cut_, &cut_length_));              \
    EXPECT(strcmp(cut_, "{\"epo") == 0 && cut_length_ == strlen(kClientState)); \
  } while (0)

/* Client states through real checkpoints ("saved", loaded just before, holds kClientState): from
 * the engine after a load and from the file; "{}" for a save without one; text that is not JSON
 * refused before anything is written. Every rank reads the same. */
static void check_client_states(zt_engine* engine, const char* dir) {
  char file[1200], text[64];
  EXPECT_CLIENT_STATE(zt_engine_loaded_client_state, engine);
  snprintf(file, sizeof file, "%s/saved.h5", dir);
  EXPECT_CLIENT_STATE(zt_checkpoint_client_state, file);
  EXPECT_STATUS(zt_engine_loaded_client_state(engine, NULL, 8, NULL), ZT_STATUS_INVALID_ARGUMENT,
                "argument 'text' is NULL with capacity 8");
  EXPECT_STATUS(zt_engine_loaded_client_state(NULL, text, sizeof text, NULL), ZT_STATUS_INVALID_ARGUMENT,
                "argument 'engine' is NULL");
  EXPECT_STATUS(zt_checkpoint_client_state(NULL, text, sizeof text, NULL), ZT_STATUS_INVALID_ARGUMENT,
                "argument 'path' is NULL");

  EXPECT_STATUS(zt_engine_save_checkpoint(engine, dir, "not-json", "epoch 1", 0), ZT_STATUS_INVALID_ARGUMENT,
                "argument 'client_state' is not JSON text: epoch 1");
  snprintf(file, sizeof file, "%s/not-json.h5", dir);
  EXPECT_STATUS(zt_checkpoint_client_state(file, text, sizeof text, NULL), ZT_STATUS_IO_ERROR, "not-json.h5");

  EXPECT_OK(zt_engine_save_checkpoint(engine, dir, "no-state", NULL, 0));
  EXPECT_OK(zt_engine_load_checkpoint(engine, dir, "no-state"));
  EXPECT_OK(zt_engine_loaded_client_state(engine, text, sizeof text, NULL));
  EXPECT(strcmp(text, "{}") == 0);
  snprintf(file, sizeof file, "%s/no-state.h5", dir);
  size_t length = 0;
  EXPECT_OK(zt_checkpoint_client_state(file, text, sizeof text, &length));
  EXPECT(strcmp(text, "{}") == 0 && length == 2);
}

static void check_external_stage3_and_checkpoints(zt_runtime* runtime, const char* work) {
  float w[kOut * kIn], b[kOut], dw[kOut * kIn], db[kOut];
  for (int i = 0; i < kOut * kIn; ++i) w[i] = (float)(i % 4) * 0.1f - 0.15f;
  memset(b, 0, sizeof b);
  memset(dw, 0, sizeof dw);
  memset(db, 0, sizeof db);
  zt_config* config = NULL;
  zt_model* model = NULL;
  zt_engine* engine = NULL;
  REQUIRE_OK(zt_config_from_string(kLinearConfig, &config));
  REQUIRE_OK(zt_model_create_external(&model));
  const int64_t shape_w[2] = {kOut, kIn}, shape_b[1] = {kOut};
  REQUIRE_OK(zt_model_add_parameter(model, "w", w, dw, 2, shape_w, ZT_DTYPE_FP32, ZT_DEVICE_HOST, 0));
  REQUIRE_OK(zt_model_add_parameter(model, "b", b, db, 1, shape_b, ZT_DTYPE_FP32, ZT_DEVICE_HOST, 0));
  int64_t tensors = 0, elements = 0;
  EXPECT_OK(zt_model_parameter_count(model, &tensors, &elements));
  EXPECT(tensors == 2 && elements == kOut * kIn + kOut);
  REQUIRE_OK(zt_engine_create(runtime, model, config, &engine));
  /* The engine copied the config and keeps the model: both may go now. */
  EXPECT_OK(zt_config_destroy(config));
  EXPECT_STATUS(zt_model_add_parameter(model, "late", w, dw, 1, shape_b, ZT_DTYPE_FP32, ZT_DEVICE_HOST, 0),
                ZT_STATUS_INVALID_ARGUMENT, "register every parameter before zt_engine_create");
  int stage = -1;
  EXPECT_OK(zt_engine_zero_stage(engine, &stage));
  EXPECT(stage == 3);
  EXPECT_STATUS(zt_engine_forward_backward(engine, NULL, NULL, NULL), ZT_STATUS_INVALID_ARGUMENT,
                "argument 'inputs' is NULL");

  train_linear(engine, model, w, b, dw, db, 4);
  zt_step_report first;
  EXPECT_OK(zt_engine_last_step(engine, &first));
  EXPECT(first.step == 4);
  /* Stage 3: each rank keeps its pieces, and the caller's buffers hold the full, same values. */
  EXPECT(same_on_every_rank(w, kOut * kIn));
  EXPECT(same_on_every_rank(b, kOut));
  for (int i = 0; i < kOut * kIn; ++i) EXPECT(dw[i] == 0.0f);

  /* Metrics: rank 0 writes the lines. */
  char metrics_path[1100];
  snprintf(metrics_path, sizeof metrics_path, "%s/metrics.jsonl", work);
  zt_metrics* metrics = NULL;
  REQUIRE_OK(zt_metrics_open(runtime, metrics_path, &metrics));
  EXPECT_OK(zt_metrics_record_step(metrics, engine, "{\"phase\": \"first\"}"));
  EXPECT_OK(zt_metrics_record(metrics, "custom", "{\"value\": 42}"));
  EXPECT_STATUS(zt_metrics_record(metrics, "custom", "[1, 2]"), ZT_STATUS_INVALID_ARGUMENT,
                "not a JSON object");
  EXPECT_STATUS(zt_metrics_record_step(metrics, engine, "{"), ZT_STATUS_INVALID_ARGUMENT,
                "not a JSON object");
  EXPECT_OK(zt_metrics_close(metrics));
  if (rank == 0) {
    FILE* in = fopen(metrics_path, "r");
    char line[3][512] = {"", "", ""};
    EXPECT(in != NULL);
    if (in != NULL) {
      EXPECT(fgets(line[0], sizeof line[0], in) != NULL);
      EXPECT(fgets(line[1], sizeof line[1], in) != NULL);
      EXPECT(fgets(line[2], sizeof line[2], in) == NULL);
      fclose(in);
    }
    EXPECT(strstr(line[0], "\"event\":\"step\"") != NULL && strstr(line[0], "\"step\":4") != NULL &&
           strstr(line[0], "\"phase\":\"first\"") != NULL && strstr(line[0], "\"loss\":") != NULL);
    EXPECT(strstr(line[1], "\"event\":\"custom\"") != NULL && strstr(line[1], "\"value\":42") != NULL);
  }

  char dir[1024], file[1200], exported[1200];
  snprintf(dir, sizeof dir, "%s/checkpoints", work);
  EXPECT_STATUS(zt_engine_loaded_client_state(engine, NULL, 0, NULL), ZT_STATUS_ERROR,
                "no checkpoint loaded");
  EXPECT_OK(zt_engine_save_checkpoint(engine, dir, "saved", kClientState, 0));
  float w_saved[kOut * kIn], b_saved[kOut];
  memcpy(w_saved, w, sizeof w);
  memcpy(b_saved, b, sizeof b);
  train_linear(engine, model, w, b, dw, db, 3);
  EXPECT(memcmp(w, w_saved, sizeof w) != 0);
  EXPECT_OK(zt_engine_load_checkpoint(engine, dir, NULL)); /* the tag in dir/latest */
  EXPECT(memcmp(w, w_saved, sizeof w) == 0);
  EXPECT(memcmp(b, b_saved, sizeof b) == 0);
  int64_t steps = 0;
  EXPECT_OK(zt_engine_global_steps(engine, &steps));
  EXPECT(steps == 4);
  check_client_states(engine, dir);
  char missing[1100];
  snprintf(missing, sizeof missing, "%s/no-checkpoints", work);
  EXPECT_STATUS(zt_engine_load_checkpoint(engine, missing, "global_step9"), ZT_STATUS_IO_ERROR,
                "global_step9");
  /* A failed load leaves no client state of the load before it. */
  EXPECT_STATUS(zt_engine_loaded_client_state(engine, NULL, 0, NULL), ZT_STATUS_ERROR,
                "no checkpoint loaded");
  EXPECT_OK(zt_engine_load_checkpoint(engine, dir, "saved"));

  snprintf(file, sizeof file, "%s/saved.h5", dir);
  snprintf(exported, sizeof exported, "%s/weights-rank%d.h5", work, rank);
  EXPECT_OK(zt_checkpoint_verify(file));
  EXPECT_OK(zt_checkpoint_export(file, exported, ZT_DTYPE_FP32));
  EXPECT_STATUS(zt_checkpoint_export(file, exported, ZT_DTYPE_INT32), ZT_STATUS_INVALID_ARGUMENT,
                "cannot be exported");
  EXPECT_STATUS(zt_checkpoint_verify(missing), ZT_STATUS_IO_ERROR, "no-checkpoints");
  /* The export's tensors back into the engine (every rank reads rank 0's export). */
  w[0] += 1.0f; /* the buffers off the saved values, without a step (the counts below stay) */
  b[0] += 1.0f;
  EXPECT(memcmp(w, w_saved, sizeof w) != 0);
  MPI_Barrier(MPI_COMM_WORLD);
  char exported0[1200];
  snprintf(exported0, sizeof exported0, "%s/weights-rank0.h5", work);
  EXPECT_OK(zt_engine_load_weights(engine, exported0));
  EXPECT(memcmp(w, w_saved, sizeof w) == 0);
  EXPECT(memcmp(b, b_saved, sizeof b) == 0);
  EXPECT_STATUS(zt_engine_load_weights(engine, missing), ZT_STATUS_IO_ERROR, "does not exist");

  /* Destroy the model and the runtime's handle before the engine: the engine keeps both alive and
   * still steps (the two micro-batches of one more step, with zero gradients). */
  EXPECT_OK(zt_model_destroy(model));
  EXPECT_OK(zt_engine_step(engine, NULL));
  EXPECT_OK(zt_engine_step(engine, NULL));
  EXPECT_OK(zt_engine_global_steps(engine, &steps));
  EXPECT(steps == 5);
  EXPECT_OK(zt_engine_destroy(engine));
}

static void check_engine_config_error(zt_runtime* runtime) {
  zt_config* config = NULL;
  zt_model* model = NULL;
  zt_engine* engine = NULL;
  float values[4], gradients[4];
  const int64_t shape[1] = {4};
  REQUIRE_OK(zt_config_from_string("{\"train_micro_batch_size_per_gpu\": 1}", &config));
  REQUIRE_OK(zt_model_create_external(&model));
  REQUIRE_OK(
      zt_model_add_parameter(model, "w", values, gradients, 1, shape, ZT_DTYPE_FP32, ZT_DEVICE_HOST, 0));
  EXPECT_STATUS(zt_engine_create(runtime, model, config, &engine), ZT_STATUS_CONFIG_ERROR,
                "the config has no \"optimizer\" section");
  EXPECT(engine == NULL);
  EXPECT_OK(zt_model_destroy(model));
  EXPECT_OK(zt_config_destroy(config));
}

static void check_builtin_mlp(zt_runtime* runtime) {
  const char* text =
      "{\"train_micro_batch_size_per_gpu\": 4, \"gradient_accumulation_steps\": 2, \"gradient_clipping\": "
      "0.0,"
      " \"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 0.1}}, \"zero_optimization\": {\"stage\": 2},"
      " \"model\": {\"type\": \"mlp\", \"sizes\": [3, 8, 2], \"activation\": \"relu\"}, \"seed\": 5}";
  zt_config* config = NULL;
  zt_model* model = NULL;
  zt_engine* engine = NULL;
  REQUIRE_OK(zt_config_from_string(text, &config));
  REQUIRE_OK(zt_model_create_builtin(config, &model));
  float values[1], gradients[1];
  const int64_t one[1] = {1};
  EXPECT_STATUS(
      zt_model_add_parameter(model, "w", values, gradients, 1, one, ZT_DTYPE_FP32, ZT_DEVICE_HOST, 0),
      ZT_STATUS_INVALID_ARGUMENT, "the model is a built-in one");
  EXPECT_STATUS(zt_model_report_loss(model, 1.0), ZT_STATUS_INVALID_ARGUMENT, "built-in");
  REQUIRE_OK(zt_engine_create(runtime, model, config, &engine));
  /* Inputs [4, 3] and targets [4, 2], rows y = (x0 + x1, x1 - x2). */
  float x[2][12], y[2][8];
  zt_tensor inputs[2], targets[2];
  double first_loss = 0, last_loss = 0;
  for (int step = 0; step < 30; ++step) {
    for (int m = 0; m < 2; ++m) {
      for (int r = 0; r < 4; ++r) {
        for (int i = 0; i < 3; ++i)
          x[m][r * 3 + i] = (float)((step * 8 + m * 4 + r + i * 3 + rank) % 5) * 0.25f - 0.5f;
        y[m][r * 2 + 0] = x[m][r * 3 + 0] + x[m][r * 3 + 1];
        y[m][r * 2 + 1] = x[m][r * 3 + 1] - x[m][r * 3 + 2];
      }
      inputs[m] = (zt_tensor){.data = x[m], .dtype = ZT_DTYPE_FP32, .ndim = 2, .shape = {4, 3}};
      targets[m] = (zt_tensor){.data = y[m], .dtype = ZT_DTYPE_FP32, .ndim = 2, .shape = {4, 2}};
    }
    zt_step_report report;
    if (step % 2 == 0) {
      EXPECT_OK(zt_engine_train_batch(engine, 2, inputs, targets, &report));
    } else { /* the same step as micro-batches */
      double loss = -1;
      for (int m = 0; m < 2; ++m) {
        EXPECT_OK(zt_engine_forward_backward(engine, &inputs[m], &targets[m], &loss));
        EXPECT(loss >= 0);
        EXPECT_OK(zt_engine_step(engine, NULL));
      }
      EXPECT_OK(zt_engine_last_step(engine, &report));
    }
    EXPECT(report.step == step + 1);
    EXPECT(isfinite(report.loss) && report.skipped == 0);
    if (step == 0) first_loss = report.loss;
    last_loss = report.loss;
  }
  EXPECT(last_loss < 0.5 * first_loss);
  EXPECT_STATUS(zt_engine_train_batch(engine, 1, inputs, targets, NULL), ZT_STATUS_INVALID_ARGUMENT,
                "argument 'micro_batches' is 1 but gradient_accumulation_steps is 2");
  zt_tensor no_data = inputs[1];
  no_data.data = NULL;
  zt_tensor pair[2] = {inputs[0], no_data};
  EXPECT_STATUS(zt_engine_train_batch(engine, 2, pair, targets, NULL), ZT_STATUS_INVALID_ARGUMENT,
                "inputs[1].data is NULL");
  EXPECT_OK(zt_engine_destroy(engine));
  EXPECT_OK(zt_model_destroy(model));
  EXPECT_OK(zt_config_destroy(config));
}

/* A built-in GPT from int32 token arrays at ZeRO stage 3: a repeating sequence is learned. */
static void check_builtin_gpt(zt_runtime* runtime) {
  const char* text =
      "{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": 1, \"gradient_clipping\": "
      "1.0,"
      " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}, \"zero_optimization\": {\"stage\": "
      "3},"
      " \"model\": {\"type\": \"gpt\", \"n_layer\": 1, \"n_head\": 2, \"d_model\": 16, \"seq_len\": 8,"
      " \"vocab_size\": 16}, \"seed\": 3}";
  zt_config* config = NULL;
  zt_model* model = NULL;
  zt_engine* engine = NULL;
  REQUIRE_OK(zt_config_from_string(text, &config));
  REQUIRE_OK(zt_model_create_builtin(config, &model));
  int64_t tensors = 0, elements = 0, after_tensors = 0, after_elements = 0;
  EXPECT_OK(zt_model_parameter_count(model, &tensors, &elements));
  REQUIRE_OK(zt_engine_create(runtime, model, config, &engine));
  EXPECT_OK(
      zt_model_parameter_count(model, &after_tensors, &after_elements)); /* stage 3 released the values */
  EXPECT(tensors > 4 && elements > 16 * 16 && after_tensors == tensors && after_elements == elements);
  int32_t tokens[2][8], targets[2][8];
  zt_tensor inputs = {.data = tokens, .dtype = ZT_DTYPE_INT32, .ndim = 2, .shape = {2, 8}};
  zt_tensor next = {.data = targets, .dtype = ZT_DTYPE_INT32, .ndim = 2, .shape = {2, 8}};
  zt_step_report report;
  double first_loss = 0;
  for (int step = 0; step < 25; ++step) {
    for (int b = 0; b < 2; ++b) {
      for (int t = 0; t < 8; ++t) {
        tokens[b][t] = (int32_t)((b + t + step + rank) % 4);
        targets[b][t] = (int32_t)((b + t + step + rank + 1) % 4);
      }
    }
    EXPECT_OK(zt_engine_train_batch(engine, 1, &inputs, &next, &report));
    if (step == 0) first_loss = report.loss;
  }
  EXPECT(first_loss > 2.0 && report.loss < 0.5 * first_loss); /* from about ln 16 */
  EXPECT_OK(zt_engine_destroy(engine));
  EXPECT_OK(zt_model_destroy(model));
  EXPECT_OK(zt_config_destroy(config));
}

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (argc != 2) {
    fprintf(stderr, "usage: capi_checks WORK_DIR\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  zt_runtime* runtime = NULL;
  /* From a Fortran handle, as the Fortran module passes it. */
  REQUIRE_OK(zt_runtime_create_from_fortran_comm(MPI_Comm_c2f(MPI_COMM_WORLD), &runtime));
  int zt_rank = -1, size = 0, world_size = 0;
  EXPECT_OK(zt_runtime_rank(runtime, &zt_rank));
  EXPECT_OK(zt_runtime_size(runtime, &size));
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  EXPECT(zt_rank == rank && size == world_size);

  check_versions_and_names();
  check_null_handles_and_bad_arguments();
  check_config_errors(argv[1]);
  check_engine_config_error(runtime);
  check_external_stage3_and_checkpoints(runtime, argv[1]);
  check_builtin_mlp(runtime);
  check_builtin_gpt(runtime);

  EXPECT_OK(zt_runtime_destroy(runtime));
  int all_failures = 0;
  MPI_Allreduce(&failures, &all_failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) {
    if (all_failures == 0)
      printf("capi: %d checks passed on %d ranks\n", checks, world_size);
    else
      printf("capi: %d check(s) failed\n", all_failures);
  }
  MPI_Finalize();
  return all_failures == 0 ? 0 : 1;
}
