/* Train the MLP of mlp_problem.h from C through zerotrain's C API: the forward and backward are
 * this file's own (plain C over the registered buffers), zerotrain reduces the gradients across the
 * MPI ranks, partitions them and the optimizer's state (ZeRO), updates and writes the new values
 * back. The same losses, bit for bit, as mlp_cxx.cpp (C++) and examples/fortran/mlp.f90.
 *
 *   mpirun -n 2 build/bin/zt_example_c_mlp [steps] [zero stage] [more zero_optimization members]
 *   e.g. ... 20 3 '"offload_optimizer": {"device": "cpu"}' */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mlp_problem.h"
#include "zerotrain/zerotrain.h"

/* Any failure: print the library's message and end the whole job (a rank alone must not return). */
static void check(zt_status status, const char* call) {
  if (status == ZT_STATUS_OK) return;
  fprintf(stderr, "%s failed: %s: %s\n", call, zt_status_name(status), zt_last_error());
  MPI_Abort(MPI_COMM_WORLD, 1);
}

int main(int argc, char** argv) {
  /* zerotrain needs MPI_THREAD_FUNNELED at least; MULTIPLE lets its watchdog catch hung collectives. */
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  const int steps = argc > 1 ? atoi(argv[1]) : 30;
  const int stage = argc > 2 ? atoi(argv[2]) : 1;
  const char* zero_extra = argc > 3 ? argv[3] : "";
  char config_text[2048];
  snprintf(config_text, sizeof config_text,
           "{\"train_micro_batch_size_per_gpu\": %d, \"gradient_accumulation_steps\": 2, "
           "\"gradient_clipping\": 0.0, \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}, "
           "\"zero_optimization\": {\"stage\": %d%s%s}}",
           MLP_MICRO_BATCH, stage, zero_extra[0] != '\0' ? ", " : "", zero_extra);

  /* The model's buffers: this program's own memory, registered without copies. */
  static float w1[MLP_HIDDEN * MLP_INPUTS], b1[MLP_HIDDEN], w2[MLP_OUTPUTS * MLP_HIDDEN], b2[MLP_OUTPUTS];
  static float dw1[MLP_HIDDEN * MLP_INPUTS], db1[MLP_HIDDEN], dw2[MLP_OUTPUTS * MLP_HIDDEN], db2[MLP_OUTPUTS];
  mlp_init(w1, b1, w2, b2);

  zt_runtime* runtime = NULL;
  zt_config* config = NULL;
  zt_model* model = NULL;
  zt_engine* engine = NULL;
  check(zt_runtime_create_from_comm(MPI_COMM_WORLD, &runtime), "zt_runtime_create_from_comm");
  check(zt_config_from_string(config_text, &config), "zt_config_from_string");
  check(zt_model_create_external(&model), "zt_model_create_external");
  const int64_t shape_w1[2] = {MLP_HIDDEN, MLP_INPUTS}, shape_b1[1] = {MLP_HIDDEN};
  const int64_t shape_w2[2] = {MLP_OUTPUTS, MLP_HIDDEN}, shape_b2[1] = {MLP_OUTPUTS};
  check(zt_model_add_parameter(model, "w1", w1, dw1, 2, shape_w1, ZT_DTYPE_FP32, ZT_DEVICE_HOST, 0),
        "add w1");
  check(zt_model_add_parameter(model, "b1", b1, db1, 1, shape_b1, ZT_DTYPE_FP32, ZT_DEVICE_HOST, 0),
        "add b1");
  check(zt_model_add_parameter(model, "w2", w2, dw2, 2, shape_w2, ZT_DTYPE_FP32, ZT_DEVICE_HOST, 0),
        "add w2");
  check(zt_model_add_parameter(model, "b2", b2, db2, 1, shape_b2, ZT_DTYPE_FP32, ZT_DEVICE_HOST, 0),
        "add b2");
  check(zt_engine_create(runtime, model, config, &engine), "zt_engine_create");
  zt_batch_sizes batch;
  check(zt_engine_batch_sizes(engine, &batch), "zt_engine_batch_sizes");
  int rank = 0;
  check(zt_runtime_rank(runtime, &rank), "zt_runtime_rank");
  char placement[1024];
  check(zt_engine_placement(engine, placement, sizeof placement, NULL), "zt_engine_placement");
  if (rank == 0) {
    printf("mlp (C API): %d ranks, ZeRO stage %d, batch %lld = %lld x %lld x %d\n", batch.data_parallel_size,
           stage, (long long)batch.train_batch_size, (long long)batch.micro_batch_size,
           (long long)batch.gradient_accumulation_steps, batch.data_parallel_size);
    printf("rank 0: %s\n", placement);
  }

  /* Rank r of N takes its slice of every global batch: micro-batch a of step k holds the samples
   * k * train_batch + (a * N + r) * micro + [0, micro). */
  float x[MLP_MICRO_BATCH * MLP_INPUTS], y[MLP_MICRO_BATCH * MLP_OUTPUTS];
  const float scale = 1.0f / (float)batch.gradient_accumulation_steps;
  for (int step = 0; step < steps; ++step) {
    for (int64_t micro = 0; micro < batch.gradient_accumulation_steps; ++micro) {
      const int64_t first = step * batch.train_batch_size +
                            (micro * batch.data_parallel_size + batch.data_parallel_rank) * MLP_MICRO_BATCH;
      for (int r = 0; r < MLP_MICRO_BATCH; ++r)
        mlp_sample(first + r, x + r * MLP_INPUTS, y + r * MLP_OUTPUTS);
      const double loss =
          mlp_forward_backward(w1, b1, w2, b2, dw1, db1, dw2, db2, x, y, MLP_MICRO_BATCH, scale);
      check(zt_model_report_loss(model, loss), "zt_model_report_loss");
      check(zt_engine_step(engine, NULL), "zt_engine_step"); /* at the boundary: reduce, update, write back */
    }
    zt_step_report report;
    check(zt_engine_last_step(engine, &report), "zt_engine_last_step");
    unsigned long long bits;
    memcpy(&bits, &report.loss, sizeof bits);
    if (rank == 0) printf("step %3lld loss %.6f bits %016llX\n", (long long)report.step, report.loss, bits);
  }

  check(zt_engine_destroy(engine), "zt_engine_destroy");
  check(zt_model_destroy(model), "zt_model_destroy");
  check(zt_config_destroy(config), "zt_config_destroy");
  check(zt_runtime_destroy(runtime), "zt_runtime_destroy");
  MPI_Finalize();
  return 0;
}
