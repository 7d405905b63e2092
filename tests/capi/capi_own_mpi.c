/* zt_runtime_create in a program that leaves MPI to zerotrain (ctest capi.own_mpi.np2): the runtime
 * initializes MPI with at least MPI_THREAD_FUNNELED, and its destruction finalizes it; the last error
 * is per thread (a failing call on another thread leaves this thread's message alone).
 *   mpiexec -n N capi_own_mpi      prints "own_mpi: ok on N ranks" and exits 0 */
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "zerotrain/zerotrain.h"

static int failed = 0;
#define EXPECT(condition)                                                                    \
  do {                                                                                       \
    if (!(condition)) {                                                                      \
      failed = 1;                                                                            \
      fprintf(stderr, "FAILED %s:%d: %s (last error: %s)\n", __FILE__, __LINE__, #condition, \
              zt_last_error());                                                              \
    }                                                                                        \
  } while (0)

static void* fail_on_another_thread(void* message_out) {
  zt_engine_step(NULL, NULL);
  strncpy((char*)message_out, zt_last_error(), 255);
  return NULL;
}

int main(int argc, char** argv) {
  int initialized = 1, finalized = 1, provided = 0, rank = -1, size = 0;
  MPI_Initialized(&initialized);
  EXPECT(initialized == 0);
  zt_runtime* runtime = NULL;
  EXPECT(zt_runtime_create(&argc, &argv, &runtime) == ZT_STATUS_OK);
  MPI_Initialized(&initialized);
  EXPECT(initialized == 1);
  MPI_Query_thread(&provided);
  EXPECT(provided >= MPI_THREAD_FUNNELED);
  EXPECT(zt_runtime_rank(runtime, &rank) == ZT_STATUS_OK && zt_runtime_size(runtime, &size) == ZT_STATUS_OK);

  /* This thread's message stays "" while another thread fails. */
  char other[256] = "";
  pthread_t thread;
  EXPECT(pthread_create(&thread, NULL, fail_on_another_thread, other) == 0);
  pthread_join(thread, NULL);
  EXPECT(strstr(other, "zt_engine_step: argument 'engine' is NULL") != NULL);
  EXPECT(strcmp(zt_last_error(), "") == 0);

  EXPECT(zt_runtime_destroy(runtime) == ZT_STATUS_OK);
  MPI_Finalized(&finalized);
  EXPECT(finalized == 1);
  if (!failed && rank == 0) printf("own_mpi: ok on %d ranks\n", size);
  return failed;
}
