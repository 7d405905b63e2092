/* world_guard: an MPI profiling-interface shim for the ctest examples.insitu.np4, loaded with
 * LD_PRELOAD. It wraps every MPI function that communicates or makes communicators and that
 * libzerotrain imports (nm -D --undefined-only libzerotrain.so), and counts the calls made from
 * shared libraries (libzerotrain, and HDF5 or anything else it calls into), not from the program
 * itself nor from MPI's own libraries. At MPI_Finalize each rank prints
 *   world_guard: rank R: N MPI calls from libraries (libzerotrain.so.0 N1, ...), W on MPI_COMM_WORLD
 * and every library call on MPI_COMM_WORLD is printed when it happens: a runtime over a
 * sub-communicator must leave MPI_COMM_WORLD alone (W = 0), and the ranks that run no zerotrain
 * must see no library call at all (N = 0). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

enum { kMaxCallers = 16 };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
  char name[128];
  long calls;
} callers[kMaxCallers];
static long library_calls, world_calls;

/* The shared object `address` is in, when it is a library other than MPI's own; else NULL. */
static const char* library_of(const void* address, Dl_info* info) {
  if (!dladdr(address, info) || !info->dli_fname || !strstr(info->dli_fname, ".so"))
    return NULL; /* the program */
  const char* slash = strrchr(info->dli_fname, '/');
  const char* name = slash ? slash + 1 : info->dli_fname;
  if (strncmp(name, "libmpi", 6) == 0 || strncmp(name, "libopen-", 8) == 0 || strncmp(name, "mca_", 4) == 0 ||
      strncmp(name, "libmca", 6) == 0 || strncmp(name, "libuc", 5) == 0)
    return NULL; /* MPI calling itself */
  return name;
}

static void note(const char* function, MPI_Comm comm, const void* caller) {
  Dl_info info;
  const char* library = library_of(caller, &info);
  if (!library) return;
  pthread_mutex_lock(&lock);
  ++library_calls;
  int slot = 0;
  while (slot < kMaxCallers && callers[slot].name[0] && strcmp(callers[slot].name, library) != 0) ++slot;
  if (slot < kMaxCallers) {
    if (!callers[slot].name[0]) snprintf(callers[slot].name, sizeof callers[slot].name, "%s", library);
    ++callers[slot].calls;
  }
  if (comm == MPI_COMM_WORLD) {
    ++world_calls;
    int rank = -1;
    PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    fprintf(stderr, "world_guard: rank %d: %s called %s on MPI_COMM_WORLD\n", rank, library, function);
  }
  pthread_mutex_unlock(&lock);
}

#define GUARD(name, comm) note(#name, comm, __builtin_return_address(0))

int MPI_Barrier(MPI_Comm comm) {
  GUARD(MPI_Barrier, comm);
  return PMPI_Barrier(comm);
}
int MPI_Ibarrier(MPI_Comm comm, MPI_Request* request) {
  GUARD(MPI_Ibarrier, comm);
  return PMPI_Ibarrier(comm, request);
}
int MPI_Bcast(void* buffer, int count, MPI_Datatype type, int root, MPI_Comm comm) {
  GUARD(MPI_Bcast, comm);
  return PMPI_Bcast(buffer, count, type, root, comm);
}
int MPI_Ibcast(void* buffer, int count, MPI_Datatype type, int root, MPI_Comm comm, MPI_Request* request) {
  GUARD(MPI_Ibcast, comm);
  return PMPI_Ibcast(buffer, count, type, root, comm, request);
}
int MPI_Allreduce(const void* send, void* receive, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm) {
  GUARD(MPI_Allreduce, comm);
  return PMPI_Allreduce(send, receive, count, type, op, comm);
}
int MPI_Iallreduce(const void* send, void* receive, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                   MPI_Request* request) {
  GUARD(MPI_Iallreduce, comm);
  return PMPI_Iallreduce(send, receive, count, type, op, comm, request);
}
int MPI_Ireduce(const void* send, void* receive, int count, MPI_Datatype type, MPI_Op op, int root,
                MPI_Comm comm, MPI_Request* request) {
  GUARD(MPI_Ireduce, comm);
  return PMPI_Ireduce(send, receive, count, type, op, root, comm, request);
}
int MPI_Reduce_scatter_block(const void* send, void* receive, int count, MPI_Datatype type, MPI_Op op,
                             MPI_Comm comm) {
  GUARD(MPI_Reduce_scatter_block, comm);
  return PMPI_Reduce_scatter_block(send, receive, count, type, op, comm);
}
int MPI_Ireduce_scatter_block(const void* send, void* receive, int count, MPI_Datatype type, MPI_Op op,
                              MPI_Comm comm, MPI_Request* request) {
  GUARD(MPI_Ireduce_scatter_block, comm);
  return PMPI_Ireduce_scatter_block(send, receive, count, type, op, comm, request);
}
int MPI_Allgather(const void* send, int send_count, MPI_Datatype send_type, void* receive, int receive_count,
                  MPI_Datatype receive_type, MPI_Comm comm) {
  GUARD(MPI_Allgather, comm);
  return PMPI_Allgather(send, send_count, send_type, receive, receive_count, receive_type, comm);
}
int MPI_Iallgather(const void* send, int send_count, MPI_Datatype send_type, void* receive, int receive_count,
                   MPI_Datatype receive_type, MPI_Comm comm, MPI_Request* request) {
  GUARD(MPI_Iallgather, comm);
  return PMPI_Iallgather(send, send_count, send_type, receive, receive_count, receive_type, comm, request);
}
int MPI_Allgatherv(const void* send, int send_count, MPI_Datatype send_type, void* receive,
                   const int counts[], const int displacements[], MPI_Datatype receive_type, MPI_Comm comm) {
  GUARD(MPI_Allgatherv, comm);
  return PMPI_Allgatherv(send, send_count, send_type, receive, counts, displacements, receive_type, comm);
}
int MPI_Iallgatherv(const void* send, int send_count, MPI_Datatype send_type, void* receive,
                    const int counts[], const int displacements[], MPI_Datatype receive_type, MPI_Comm comm,
                    MPI_Request* request) {
  GUARD(MPI_Iallgatherv, comm);
  return PMPI_Iallgatherv(send, send_count, send_type, receive, counts, displacements, receive_type, comm,
                          request);
}
int MPI_Send(const void* buffer, int count, MPI_Datatype type, int destination, int tag, MPI_Comm comm) {
  GUARD(MPI_Send, comm);
  return PMPI_Send(buffer, count, type, destination, tag, comm);
}
int MPI_Isend(const void* buffer, int count, MPI_Datatype type, int destination, int tag, MPI_Comm comm,
              MPI_Request* request) {
  GUARD(MPI_Isend, comm);
  return PMPI_Isend(buffer, count, type, destination, tag, comm, request);
}
int MPI_Recv(void* buffer, int count, MPI_Datatype type, int source, int tag, MPI_Comm comm,
             MPI_Status* status) {
  GUARD(MPI_Recv, comm);
  return PMPI_Recv(buffer, count, type, source, tag, comm, status);
}
int MPI_Irecv(void* buffer, int count, MPI_Datatype type, int source, int tag, MPI_Comm comm,
              MPI_Request* request) {
  GUARD(MPI_Irecv, comm);
  return PMPI_Irecv(buffer, count, type, source, tag, comm, request);
}
int MPI_Comm_dup(MPI_Comm comm, MPI_Comm* copy) {
  GUARD(MPI_Comm_dup, comm);
  return PMPI_Comm_dup(comm, copy);
}
int MPI_Comm_split(MPI_Comm comm, int color, int key, MPI_Comm* part) {
  GUARD(MPI_Comm_split, comm);
  return PMPI_Comm_split(comm, color, key, part);
}
int MPI_Comm_split_type(MPI_Comm comm, int split_type, int key, MPI_Info info, MPI_Comm* part) {
  GUARD(MPI_Comm_split_type, comm);
  return PMPI_Comm_split_type(comm, split_type, key, info, part);
}
int MPI_Comm_set_errhandler(MPI_Comm comm, MPI_Errhandler handler) {
  GUARD(MPI_Comm_set_errhandler, comm);
  return PMPI_Comm_set_errhandler(comm, handler);
}
int MPI_Comm_set_attr(MPI_Comm comm, int keyval, void* value) {
  GUARD(MPI_Comm_set_attr, comm);
  return PMPI_Comm_set_attr(comm, keyval, value);
}
int MPI_Comm_set_name(MPI_Comm comm, const char* name) {
  GUARD(MPI_Comm_set_name, comm);
  return PMPI_Comm_set_name(comm, name);
}

int MPI_Finalize(void) {
  int rank = -1;
  PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
  char by_library[1024] = "";
  pthread_mutex_lock(&lock);
  size_t used = 0;
  for (int slot = 0; slot < kMaxCallers && callers[slot].name[0] && used < sizeof by_library; ++slot) {
    used += (size_t)snprintf(by_library + used, sizeof by_library - used, "%s%s %ld", slot ? ", " : "",
                             callers[slot].name, callers[slot].calls);
  }
  printf("world_guard: rank %d: %ld MPI calls from libraries (%s), %ld on MPI_COMM_WORLD\n", rank,
         library_calls, by_library, world_calls);
  pthread_mutex_unlock(&lock);
  fflush(stdout);
  return PMPI_Finalize();
}
