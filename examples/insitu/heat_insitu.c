/* In-situ training (docs/insitu.md): a 2-D heat-equation solver runs on a sub-communicator of its
 * own and trains a surrogate of its time step through zerotrain's C API, on the same ranks, while
 * the simulation runs. The other ranks of the job do work of their own.
 *
 *   mpirun -n 4 build/bin/zt_example_insitu --steps 200 --train-every 10 --checkpoint-dir ckpt
 *   mpirun -n 4 build/bin/zt_example_insitu --steps 300 --train-every 10 --checkpoint-dir ckpt --resume
 *
 * World ranks 0 and 1 (MPI_Comm_split) solve u_t = alpha (u_xx + u_yy) on a 64 x 64 grid with the
 * explicit five-point scheme, rows split between them, a hot top wall and two hot spots. The
 * surrogate is an MLP (9 -> 16 -> 1, tanh) that predicts a point's change over one step, divided
 * by r = alpha dt / dx^2, from the 3 x 3 stencil around it: what the scheme computes, learnt from
 * the solver's own data. Samples are the solver's time levels themselves: it writes each step
 * into the next slot of a ring of train_every + 1 levels, and every train_every steps the trainer
 * reads the last train_every transitions from that ring in place (no sample buffer, no copy);
 * each transition (all of this rank's interior points) is one optimizer step (zt_engine_step),
 * the gradients reduced by zerotrain across the two simulation ranks only. After each training
 * the solver writes its field (MPI-IO, one file) and zerotrain its checkpoint, both at that step;
 * --resume loads the latest checkpoint and the field of the same step and goes on.
 * World ranks 2 and up estimate pi by Monte Carlo with reductions on their own communicator and
 * then wait for the simulation's summary: zerotrain never runs on them, and never uses
 * MPI_COMM_WORLD on the simulation ranks (it works on a duplicate of the sub-communicator).
 *
 * Exit code 0 when every call succeeded; rank 0 prints the losses. */
#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zerotrain/zerotrain.h>

#define CHECK(call)                                                                                    \
  do {                                                                                                 \
    zt_status status_ = (call);                                                                        \
    if (status_ != ZT_STATUS_OK) {                                                                     \
      fprintf(stderr, "insitu: %s failed: %s: %s\n", #call, zt_status_name(status_), zt_last_error()); \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                                    \
    }                                                                                                  \
  } while (0)

#define CHECK_MPI(call, what)                                   \
  do {                                                          \
    if ((call) != MPI_SUCCESS) {                                \
      fprintf(stderr, "insitu: %s failed (%s)\n", #call, what); \
      MPI_Abort(MPI_COMM_WORLD, 1);                             \
    }                                                           \
  } while (0)

enum {
  kSimulationRanks = 2,
  kGlobalRows = 64, /* interior rows, split between the simulation ranks */
  kColumns = 64,    /* including the two boundary columns */
  kInputs = 9,      /* the 3 x 3 stencil */
  kHidden = 16,
  kSummaryTag = 17
};

typedef struct Options {
  long steps;                 /* solver steps to reach (a resumed run goes on from its checkpoint) */
  long train_every;           /* train on the last train_every transitions every train_every steps */
  const char* checkpoint_dir; /* NULL: no checkpoints */
  int resume;
  int zero_stage;
} Options;

static void usage_error(const char* message, const char* argument) {
  fprintf(stderr,
          "insitu: %s%s\nusage: zt_example_insitu [--steps N] [--train-every K] [--checkpoint-dir DIR] "
          "[--resume] [--zero-stage 0-3]\n",
          message, argument ? argument : "");
  MPI_Abort(MPI_COMM_WORLD, 2);
}

static long parse_count(const char* option, const char* text, long min, long max) {
  char* end = NULL;
  const long value = text ? strtol(text, &end, 10) : 0;
  if (!text || *end != '\0' || value < min || value > max) {
    fprintf(stderr, "insitu: %s needs an integer in [%ld, %ld], got '%s'\n", option, min, max,
            text ? text : "");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  return value;
}

static Options parse_options(int argc, char** argv) {
  Options options = {200, 10, NULL, 0, 1};
  for (int i = 1; i < argc; ++i) {
    const char* next = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(argv[i], "--steps") == 0) {
      options.steps = parse_count("--steps", next, 1, 1000000), ++i;
    } else if (strcmp(argv[i], "--train-every") == 0) {
      options.train_every = parse_count("--train-every", next, 1, 1000), ++i;
    } else if (strcmp(argv[i], "--checkpoint-dir") == 0) {
      if (!next) usage_error("--checkpoint-dir needs a directory", NULL);
      options.checkpoint_dir = next, ++i;
    } else if (strcmp(argv[i], "--resume") == 0) {
      options.resume = 1;
    } else if (strcmp(argv[i], "--zero-stage") == 0) {
      options.zero_stage = (int)parse_count("--zero-stage", next, 0, 3), ++i;
    } else {
      usage_error("unknown argument ", argv[i]);
    }
  }
  if (options.resume && !options.checkpoint_dir) usage_error("--resume needs --checkpoint-dir", NULL);
  return options;
}

/* ---- the solver ------------------------------------------------------------------------------ */

typedef struct Solver {
  MPI_Comm comm; /* the simulation's sub-communicator */
  int rank, size;
  int rows;      /* this rank's interior rows */
  int first_row; /* global index of its first interior row */
  long levels;   /* time levels kept in the ring: train_every + 1 */
  float* ring;   /* levels x (rows + 2) x kColumns: halo row, interior rows, halo row */
  long step;     /* solver steps taken: level(step) is the current field */
  double r;      /* alpha dt / dx^2 (stable below 0.25) */
} Solver;

static size_t level_elements(const Solver* solver) {
  return (size_t)(solver->rows + 2) * kColumns;
}

/* The field after `step` steps (valid for the last `levels` steps). */
static float* level(const Solver* solver, long step) {
  return solver->ring + (size_t)(step % solver->levels) * level_elements(solver);
}

static void solver_init(Solver* solver, MPI_Comm comm, long levels) {
  solver->comm = comm;
  MPI_Comm_rank(comm, &solver->rank);
  MPI_Comm_size(comm, &solver->size);
  solver->rows = kGlobalRows / solver->size;
  solver->first_row = solver->rank * solver->rows;
  solver->levels = levels;
  solver->step = 0;
  solver->r = 0.2;
  solver->ring = calloc((size_t)levels * level_elements(solver), sizeof(float));
  if (!solver->ring) {
    fprintf(stderr, "insitu: no memory for %ld time levels\n", levels);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  /* Two hot spots in a cold plate; the walls are set by the halo exchange. */
  float* u = level(solver, 0);
  for (int i = 1; i <= solver->rows; ++i) {
    const double y = solver->first_row + i - 1;
    for (int j = 1; j < kColumns - 1; ++j) {
      const double a = ((y - 20) * (y - 20) + (j - 22) * (j - 22)) / 40.0;
      const double b = ((y - 44) * (y - 44) + (j - 40) * (j - 40)) / 60.0;
      u[(size_t)i * kColumns + j] = (float)(exp(-a) + 0.7 * exp(-b));
    }
  }
}

/* Fill the halo rows of the current level: the neighbours' edge rows, or the walls (top 1, bottom 0). */
static void solver_exchange_halos(Solver* solver) {
  float* u = level(solver, solver->step);
  const int up = solver->rank > 0 ? solver->rank - 1 : MPI_PROC_NULL;
  const int down = solver->rank + 1 < solver->size ? solver->rank + 1 : MPI_PROC_NULL;
  float* top_halo = u;
  float* first = u + kColumns;
  float* last = u + (size_t)solver->rows * kColumns;
  float* bottom_halo = u + (size_t)(solver->rows + 1) * kColumns;
  CHECK_MPI(MPI_Sendrecv(first, kColumns, MPI_FLOAT, up, 0, bottom_halo, kColumns, MPI_FLOAT, down, 0,
                         solver->comm, MPI_STATUS_IGNORE),
            "halo exchange");
  CHECK_MPI(MPI_Sendrecv(last, kColumns, MPI_FLOAT, down, 1, top_halo, kColumns, MPI_FLOAT, up, 1,
                         solver->comm, MPI_STATUS_IGNORE),
            "halo exchange");
  if (up == MPI_PROC_NULL)
    for (int j = 0; j < kColumns; ++j) top_halo[j] = 1.0f;
  if (down == MPI_PROC_NULL)
    for (int j = 0; j < kColumns; ++j) bottom_halo[j] = 0.0f;
}

/* One explicit step into the next slot of the ring; the current level keeps its halos, which the
 * trainer reads as the stencil's edge values. */
static void solver_step(Solver* solver) {
  solver_exchange_halos(solver);
  const float* u = level(solver, solver->step);
  float* next = level(solver, solver->step + 1);
  const float r = (float)solver->r;
  for (int i = 1; i <= solver->rows; ++i) {
    const float* row = u + (size_t)i * kColumns;
    float* out = next + (size_t)i * kColumns;
    out[0] = out[kColumns - 1] = 0.0f;
    for (int j = 1; j < kColumns - 1; ++j) {
      out[j] = row[j] + r * (row[j - kColumns] + row[j + kColumns] + row[j - 1] + row[j + 1] - 4.0f * row[j]);
    }
  }
  ++solver->step;
}

/* The solver's own restart file DIR/heat_step<N>.bin: the interior rows of every rank at its
 * offset, written and read collectively over the simulation's communicator with MPI-IO. */
static void restart_path(char* path, size_t size, const char* dir, long step) {
  snprintf(path, size, "%s/heat_step%ld.bin", dir, step);
}

static void solver_write_restart(const Solver* solver, const char* dir) {
  char path[4096];
  restart_path(path, sizeof path, dir, solver->step);
  MPI_File file;
  CHECK_MPI(MPI_File_open(solver->comm, path, MPI_MODE_CREATE | MPI_MODE_WRONLY, MPI_INFO_NULL, &file), path);
  const MPI_Offset offset = (MPI_Offset)solver->first_row * kColumns * (MPI_Offset)sizeof(float);
  CHECK_MPI(MPI_File_write_at_all(file, offset, level(solver, solver->step) + kColumns,
                                  solver->rows * kColumns, MPI_FLOAT, MPI_STATUS_IGNORE),
            path);
  CHECK_MPI(MPI_File_close(&file), path);
}

/* The checkpoint directory, made by the first simulation rank before anyone writes to it. */
static void make_checkpoint_dir(const Solver* solver, const char* dir) {
  int failed = 0;
  if (solver->rank == 0 && mkdir(dir, 0777) != 0 && errno != EEXIST) {
    fprintf(stderr, "insitu: cannot create the checkpoint directory %s: %s\n", dir, strerror(errno));
    failed = 1;
  }
  CHECK_MPI(MPI_Bcast(&failed, 1, MPI_INT, 0, solver->comm), "checkpoint directory");
  if (failed) MPI_Abort(MPI_COMM_WORLD, 1);
}

static void solver_read_restart(Solver* solver, const char* dir, long step) {
  char path[4096];
  restart_path(path, sizeof path, dir, step);
  MPI_File file;
  if (MPI_File_open(solver->comm, path, MPI_MODE_RDONLY, MPI_INFO_NULL, &file) != MPI_SUCCESS) {
    fprintf(stderr, "insitu: the solver's restart file %s (step %ld, the checkpoint's) cannot be opened\n",
            path, step);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Offset bytes = 0;
  CHECK_MPI(MPI_File_get_size(file, &bytes), path);
  if (bytes != (MPI_Offset)kGlobalRows * kColumns * (MPI_Offset)sizeof(float)) {
    fprintf(stderr, "insitu: %s has %lld bytes, expected %lld (%d x %d floats)\n", path, (long long)bytes,
            (long long)kGlobalRows * kColumns * (long long)sizeof(float), kGlobalRows, kColumns);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  solver->step = step;
  const MPI_Offset offset = (MPI_Offset)solver->first_row * kColumns * (MPI_Offset)sizeof(float);
  CHECK_MPI(MPI_File_read_at_all(file, offset, level(solver, step) + kColumns, solver->rows * kColumns,
                                 MPI_FLOAT, MPI_STATUS_IGNORE),
            path);
  CHECK_MPI(MPI_File_close(&file), path);
}

/* ---- the surrogate: the caller's MLP, trained by zerotrain ---------------------------------- */

typedef struct Surrogate {
  float w1[kHidden * kInputs], b1[kHidden], w2[kHidden], b2[1];     /* values */
  float dw1[kHidden * kInputs], db1[kHidden], dw2[kHidden], db2[1]; /* gradients (+=) */
} Surrogate;

/* The same initial weights on every rank: a fixed-seed generator (a 64-bit LCG). */
static void surrogate_init(Surrogate* net) {
  memset(net, 0, sizeof *net);
  uint64_t state = 12345;
  for (int k = 0; k < kHidden * kInputs; ++k) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    net->w1[k] = (float)(((double)(state >> 11) / 9007199254740992.0 - 0.5) * 0.6);
  }
  for (int k = 0; k < kHidden; ++k) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    net->w2[k] = (float)(((double)(state >> 11) / 9007199254740992.0 - 0.5) * 0.6);
  }
}

/* Mean squared error over this rank's interior points of the transition from `before` to `after`,
 * read in place from the solver's ring; gradients accumulate into the registered buffers. */
static double surrogate_forward_backward(Surrogate* net, const Solver* solver, const float* before,
                                         const float* after) {
  const int points = solver->rows * (kColumns - 2);
  const float inv_r = (float)(1.0 / solver->r);
  double loss = 0;
  float x[kInputs], hidden[kHidden];
  for (int i = 1; i <= solver->rows; ++i) {
    for (int j = 1; j < kColumns - 1; ++j) {
      const size_t center = (size_t)i * kColumns + j;
      for (int di = -1, k = 0; di <= 1; ++di)
        for (int dj = -1; dj <= 1; ++dj, ++k) x[k] = before[center + di * kColumns + dj];
      float prediction = net->b2[0];
      for (int h = 0; h < kHidden; ++h) {
        float sum = net->b1[h];
        for (int k = 0; k < kInputs; ++k) sum += net->w1[h * kInputs + k] * x[k];
        hidden[h] = tanhf(sum);
        prediction += net->w2[h] * hidden[h];
      }
      const float target = (after[center] - before[center]) * inv_r;
      const float error = prediction - target;
      loss += (double)error * error / points;
      const float dprediction = 2.0f * error / (float)points;
      net->db2[0] += dprediction;
      for (int h = 0; h < kHidden; ++h) {
        net->dw2[h] += dprediction * hidden[h];
        const float dpre = dprediction * net->w2[h] * (1.0f - hidden[h] * hidden[h]);
        net->db1[h] += dpre;
        for (int k = 0; k < kInputs; ++k) net->dw1[h * kInputs + k] += dpre * x[k];
      }
    }
  }
  return loss;
}

/* ---- the two roles ------------------------------------------------------------------------- */

static int run_simulation(MPI_Comm comm, const Options* options) {
  Solver solver;
  solver_init(&solver, comm, options->train_every + 1);
  Surrogate net;
  surrogate_init(&net);

  zt_runtime* runtime = NULL;
  zt_config* config = NULL;
  zt_model* model = NULL;
  zt_engine* engine = NULL;
  CHECK(zt_runtime_create_from_comm(comm, &runtime)); /* zerotrain's ranks: the simulation's */
  char json[512];
  snprintf(json, sizeof json,
           "{\"train_micro_batch_size_per_gpu\": %d, \"gradient_accumulation_steps\": 1,"
           " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.003, \"weight_decay\": 0.0}},"
           " \"zero_optimization\": {\"stage\": %d}}",
           solver.rows * (kColumns - 2), options->zero_stage);
  CHECK(zt_config_from_string(json, &config));
  const int64_t shape_w1[2] = {kHidden, kInputs}, shape_b1[1] = {kHidden}, shape_w2[2] = {1, kHidden},
                shape_b2[1] = {1};
  CHECK(zt_model_create_external(&model));
  CHECK(zt_model_add_parameter(model, "w1", net.w1, net.dw1, 2, shape_w1, ZT_DTYPE_FP32, ZT_DEVICE_HOST, 0));
  CHECK(zt_model_add_parameter(model, "b1", net.b1, net.db1, 1, shape_b1, ZT_DTYPE_FP32, ZT_DEVICE_HOST, 0));
  CHECK(zt_model_add_parameter(model, "w2", net.w2, net.dw2, 2, shape_w2, ZT_DTYPE_FP32, ZT_DEVICE_HOST, 0));
  CHECK(zt_model_add_parameter(model, "b2", net.b2, net.db2, 1, shape_b2, ZT_DTYPE_FP32, ZT_DEVICE_HOST, 0));
  CHECK(zt_engine_create(runtime, model, config, &engine));

  if (options->checkpoint_dir) make_checkpoint_dir(&solver, options->checkpoint_dir);
  if (options->resume) {
    /* One optimizer step per solver transition: the checkpoint's step count is the solver step
     * whose field the solver wrote beside it. */
    CHECK(zt_engine_load_checkpoint(engine, options->checkpoint_dir, NULL));
    int64_t optimizer_steps = 0;
    CHECK(zt_engine_global_steps(engine, &optimizer_steps));
    solver_read_restart(&solver, options->checkpoint_dir, (long)optimizer_steps);
    if (solver.rank == 0) {
      printf("insitu: resumed from %s at solver step %ld (optimizer step %lld)\n", options->checkpoint_dir,
             solver.step, (long long)optimizer_steps);
    }
  }
  if (solver.rank == 0) {
    int64_t tensors = 0, elements = 0;
    CHECK(zt_model_parameter_count(model, &tensors, &elements));
    const size_t ring_kib = solver.levels * level_elements(&solver) * sizeof(float) / 1024;
    printf(
        "insitu: simulation on world ranks 0-%d (%d x %d grid, %d rows per rank), ZeRO stage %d, "
        "training every %ld steps; ring of %ld time levels: %zu KiB per rank, surrogate %lld parameters\n",
        solver.size - 1, kGlobalRows, kColumns, solver.rows, options->zero_stage, options->train_every,
        solver.levels, ring_kib, (long long)elements);
  }

  double last_loss = NAN;
  while (solver.step < options->steps) {
    solver_step(&solver);
    if (solver.step % options->train_every != 0) continue;
    /* Train on the transitions the ring holds, oldest first. */
    double loss_sum = 0;
    for (long t = solver.step - options->train_every; t < solver.step; ++t) {
      CHECK(zt_model_report_loss(
          model, surrogate_forward_backward(&net, &solver, level(&solver, t), level(&solver, t + 1))));
      CHECK(zt_engine_step(engine, NULL)); /* reduce over the simulation ranks, update net */
      zt_step_report report;
      CHECK(zt_engine_last_step(engine, &report));
      loss_sum += report.loss;
    }
    last_loss = loss_sum / (double)options->train_every;
    if (solver.rank == 0) printf("insitu: solver step %ld loss %.9e\n", solver.step, last_loss);
    if (options->checkpoint_dir) {
      /* The solver's field first, then zerotrain's checkpoint, whose "latest" names the step. */
      solver_write_restart(&solver, options->checkpoint_dir);
      /* client_state records the step and the field's file for whoever inspects the checkpoint
       * (zerotrain checkpoint inspect, zt_checkpoint_client_state); a resume takes the step from
       * the optimizer's step count, which needs no JSON parser in C. */
      char client_state[256];
      snprintf(client_state, sizeof client_state, "{\"solver_step\": %ld, \"restart\": \"heat_step%ld.bin\"}",
               solver.step, solver.step);
      CHECK(zt_engine_save_checkpoint(engine, options->checkpoint_dir, NULL, client_state, 2));
      /* zerotrain keeps the last 2 checkpoints; keep the fields of the same steps. */
      if (solver.rank == 0 && solver.step > 2 * options->train_every) {
        char old[4096];
        restart_path(old, sizeof old, options->checkpoint_dir, solver.step - 2 * options->train_every);
        remove(old);
      }
    }
  }

  if (solver.rank == 0) {
    /* The summary for the other ranks of the job. */
    double summary[2] = {(double)solver.step, last_loss};
    int world_size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    for (int other = kSimulationRanks; other < world_size; ++other)
      CHECK_MPI(MPI_Send(summary, 2, MPI_DOUBLE, other, kSummaryTag, MPI_COMM_WORLD), "summary");
    printf("insitu: simulation done at step %ld, loss %.9e\n", solver.step, last_loss);
  }
  CHECK(zt_engine_destroy(engine));
  CHECK(zt_model_destroy(model));
  CHECK(zt_config_destroy(config));
  CHECK(zt_runtime_destroy(runtime));
  free(solver.ring);
  return 0;
}

/* The other ranks: a Monte Carlo estimate of pi with reductions on their own communicator. */
static int run_analysis(MPI_Comm comm) {
  int rank = 0, size = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  uint64_t state = 1000003u * (uint64_t)(rank + 1);
  long long inside = 0, total = 0;
  for (int round = 0; round < 100; ++round) {
    long long local = 0;
    for (int i = 0; i < 10000; ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      const double x = (double)(state >> 11) / 9007199254740992.0;
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      const double y = (double)(state >> 11) / 9007199254740992.0;
      local += x * x + y * y < 1.0;
    }
    long long sum = 0;
    CHECK_MPI(MPI_Allreduce(&local, &sum, 1, MPI_LONG_LONG, MPI_SUM, comm), "analysis");
    inside += sum;
    total += 10000LL * size;
  }
  double summary[2];
  CHECK_MPI(MPI_Recv(summary, 2, MPI_DOUBLE, 0, kSummaryTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE), "summary");
  if (rank == 0) {
    printf(
        "insitu: analysis on %d other rank%s: pi ~ %.4f from %lld samples; the simulation reports step %.0f, "
        "loss %.9e\n",
        size, size == 1 ? "" : "s", 4.0 * (double)inside / (double)total, total, summary[0], summary[1]);
  }
  return 0;
}

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int world_rank = 0, world_size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  const Options options = parse_options(argc, argv);
  if (world_size <= kSimulationRanks) {
    if (world_rank == 0)
      fprintf(stderr,
              "insitu: needs more than %d ranks (%d for the simulation, the rest for the analysis); got %d\n",
              kSimulationRanks, kSimulationRanks, world_size);
    MPI_Finalize();
    return 2;
  }
  const int simulation = world_rank < kSimulationRanks;
  MPI_Comm group;
  CHECK_MPI(MPI_Comm_split(MPI_COMM_WORLD, simulation ? 0 : 1, world_rank, &group), "MPI_Comm_split");
  const int code = simulation ? run_simulation(group, &options) : run_analysis(group);
  MPI_Comm_free(&group);
  MPI_Finalize();
  return code;
}
