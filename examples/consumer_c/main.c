/* The smallest C program that trains with an installed zerotrain through its C API
 * (include/zerotrain/zerotrain.h): it fits y = 2x - 1 with its own forward and backward on every
 * rank's slice of the data, and zerotrain reduces the gradients and updates (ZeRO stage 1).
 * Built two ways: with CMake (CMakeLists.txt, find_package(zerotrain) in a C-only project) and
 * with make and pkg-config (Makefile). Exit code 0 when the fit converged and the ranks agree. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <zerotrain/zerotrain.h>

#define CHECK(call)                                                                                        \
  do {                                                                                                     \
    zt_status status_ = (call);                                                                            \
    if (status_ != ZT_STATUS_OK) {                                                                         \
      fprintf(stderr, "consumer_c: %s failed: %s: %s\n", #call, zt_status_name(status_), zt_last_error()); \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                                        \
    }                                                                                                      \
  } while (0)

enum { kSamplesPerRank = 16, kSteps = 300 };

int main(int argc, char** argv) {
  /* The caller's MPI, initialized with the thread support zerotrain needs (at least FUNNELED; its
   * watchdog uses MPI from its own thread when MULTIPLE is provided: docs/architecture.md). */
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  zt_runtime* runtime = NULL;
  zt_config* config = NULL;
  zt_model* model = NULL;
  zt_engine* engine = NULL;
  CHECK(zt_runtime_create_from_comm(MPI_COMM_WORLD, &runtime));
  CHECK(
      zt_config_from_string("{\"train_micro_batch_size_per_gpu\": 16, \"gradient_accumulation_steps\": 1,"
                            " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.05}},"
                            " \"zero_optimization\": {\"stage\": 1}}",
                            &config));
  float weights[2] = {0.0f, 0.0f}; /* slope, intercept: the same start on every rank */
  float gradients[2] = {0.0f, 0.0f};
  const int64_t shape[1] = {2};
  CHECK(zt_model_create_external(&model));
  CHECK(
      zt_model_add_parameter(model, "line", weights, gradients, 1, shape, ZT_DTYPE_FP32, ZT_DEVICE_HOST, 0));
  CHECK(zt_engine_create(runtime, model, config, &engine));

  double first_loss = 0, last_loss = 0;
  for (int step = 0; step < kSteps; ++step) {
    /* This rank's samples x in [-1, 1), different on every rank; mean squared error and its
     * gradient, accumulated into the registered gradient buffer. */
    double loss = 0;
    for (int i = 0; i < kSamplesPerRank; ++i) {
      const float x = -1.0f + 2.0f * (float)(rank * kSamplesPerRank + i) / (float)(size * kSamplesPerRank);
      const float error = weights[0] * x + weights[1] - (2.0f * x - 1.0f);
      loss += (double)error * error / kSamplesPerRank;
      gradients[0] += 2.0f * error * x / kSamplesPerRank;
      gradients[1] += 2.0f * error / kSamplesPerRank;
    }
    CHECK(zt_model_report_loss(model, loss));
    CHECK(zt_engine_step(engine, NULL));
    zt_step_report report;
    CHECK(zt_engine_last_step(engine, &report));
    if (step == 0) first_loss = report.loss;
    last_loss = report.loss;
  }

  /* Every rank holds the same updated weights: compare with rank 0's. */
  float reference[2] = {weights[0], weights[1]};
  MPI_Bcast(reference, 2, MPI_FLOAT, 0, MPI_COMM_WORLD);
  int differs = reference[0] != weights[0] || reference[1] != weights[1], any_differs = 0;
  MPI_Allreduce(&differs, &any_differs, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
  const int converged = fabsf(weights[0] - 2.0f) < 0.05f && fabsf(weights[1] + 1.0f) < 0.05f;
  if (rank == 0) {
    printf("consumer_c: zerotrain %s (C API %d), %d ranks, loss %.4f -> %.6f, y = %.3f x %+.3f%s%s\n",
           zt_version(), zt_api_version(), size, first_loss, last_loss, weights[0], weights[1],
           converged ? "" : " (NOT CONVERGED)", any_differs ? " (RANKS DIFFER)" : "");
  }

  CHECK(zt_engine_destroy(engine));
  CHECK(zt_model_destroy(model));
  CHECK(zt_config_destroy(config));
  CHECK(zt_runtime_destroy(runtime));
  MPI_Finalize();
  return converged && !any_differs ? 0 : 1;
}
