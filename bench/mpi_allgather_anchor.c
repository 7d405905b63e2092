/* A plain MPI_Allgather program: the outside anchor for zt_bench_collectives' all_gather rows.
 *
 * No zerotrain, no malloc tuning, nothing but MPI: fp32 MPI_Allgather of S bytes of output (S/n per rank,
 * as NCCL-tests and zt_bench_collectives count it), buffers from malloc and first-touched before timing.
 * It runs the variants a caller of MPI_Allgather can choose between, interleaved call by call (the order
 * rotates every call) so that all see the same machine load:
 *   out-of-place   separate send (S/n) and receive (S) buffers, as zt_bench_collectives' raw column did
 *   in-place       MPI_IN_PLACE, the rank's own block already in the receive buffer (what zerotrain's
 *                  parameter gather and FlatParameters call)
 * Printed: per variant the median over calls of the slowest rank's time, algbw = S / t and busbw =
 * algbw * (n-1)/n. Built by CMake as zt_bench_mpi_allgather (bench/CMakeLists.txt); by hand:
 *
 *   mpicc -O2 bench/mpi_allgather_anchor.c -o mpi_allgather_anchor
 *   mpirun -n 2 ./mpi_allgather_anchor [MiB of output, default 64] [calls per variant, default 20]
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { kVariants = 2 };
static const char* const kVariantNames[kVariants] = {"out-of-place", "in-place"};

static int compare_doubles(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static void* checked_malloc(size_t bytes, const char* what, int rank) {
  void* memory = malloc(bytes);
  if (memory == NULL) {
    fprintf(stderr, "rank %d: cannot allocate %zu bytes for the %s buffer\n", rank, bytes, what);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  return memory;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const long mib = argc > 1 ? atol(argv[1]) : 64;
  const int calls = argc > 2 ? atoi(argv[2]) : 20;
  if (mib <= 0 || calls <= 0) {
    if (rank == 0) fprintf(stderr, "usage: mpi_allgather_anchor [MiB of output > 0] [calls > 0]\n");
    MPI_Finalize();
    return 2;
  }
  const size_t count = ((size_t)mib << 20) / sizeof(float) / (size_t)ranks; /* elements per rank */
  const size_t bytes = count * (size_t)ranks * sizeof(float);
  float* send = checked_malloc(count * sizeof(float), "send", rank);
  float* recv = checked_malloc(bytes, "receive", rank);
  for (size_t i = 0; i < count; ++i) send[i] = (float)rank; /* first touch: no page faults when timed */
  memset(recv, 0, bytes);

  double* times = checked_malloc(sizeof(double) * (size_t)calls * kVariants, "times", rank);
  for (int call = -1; call < calls; ++call) { /* call -1: untimed warm-up of every variant */
    for (int k = 0; k < kVariants; ++k) {
      const int variant = (k + (call < 0 ? 0 : call)) % kVariants;
      MPI_Barrier(MPI_COMM_WORLD);
      const double start = MPI_Wtime();
      if (variant == 0) {
        MPI_Allgather(send, (int)count, MPI_FLOAT, recv, (int)count, MPI_FLOAT, MPI_COMM_WORLD);
      } else {
        MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, (int)count, MPI_FLOAT, MPI_COMM_WORLD);
      }
      double elapsed = MPI_Wtime() - start;
      MPI_Allreduce(MPI_IN_PLACE, &elapsed, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (call >= 0) times[variant * calls + call] = elapsed;
    }
  }
  if (rank == 0) {
    printf("plain MPI_Allgather, fp32, %d ranks, %zu MiB output (%zu floats per rank), median of %d calls\n",
           ranks, bytes >> 20, count, calls);
    for (int variant = 0; variant < kVariants; ++variant) {
      double* mine = times + variant * calls;
      qsort(mine, (size_t)calls, sizeof(double), compare_doubles);
      const double median = calls % 2 ? mine[calls / 2] : 0.5 * (mine[calls / 2 - 1] + mine[calls / 2]);
      const double algbw = (double)bytes / median / 1e9;
      printf("%-13s %10.1f us  algbw %7.3f GB/s  busbw %7.3f GB/s  (fastest %.1f us)\n",
             kVariantNames[variant], median * 1e6, algbw, algbw * (ranks - 1) / ranks, mine[0] * 1e6);
    }
  }
  free(times);
  free(recv);
  free(send);
  MPI_Finalize();
  return 0;
}
