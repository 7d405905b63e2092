// The CUDA-on-host build's NCCL (cmake/ZerotrainCudaOnHost.cmake): the NCCL functions zerotrain calls
// (mpi_layer/nccl/nccl_communicator.cpp), implemented with MPI over the job's processes, in place of
// libnccl, so that the NCCL communicator and the engine's NCCL path run on the CPU. Written from
// NCCL's documented contract: a communicator of nranks made by every member calling
// ncclCommInitRank with one unique id; collectives with NCCL's in-place rules (all-gather and
// reduce-scatter in place at the rank's slice); ncclAvg; send and receive inside ncclGroupStart/End
// completed at ncclGroupEnd. Each operation is device work on its stream (cuda_fibers_streams.hpp):
// late, on the device thread, in the issue order of this process's NCCL operations; the MPI call
// happens there. The members find each other through files under /tmp
// named by the unique id: one node only, which is what this check build runs on.
// What it cannot show: NCCL's own reduction order and rounding (bf16 and fp16 reduce pairwise in
// fp32 here), its transport, ncclCommAbort interrupting an operation (here operations never hang
// alone: a skipped collective blocks its peers inside MPI), multi-node.
#include <mpi.h>
#include <nccl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cuda_fibers_streams.hpp"
#include "zerotrain/dtype.hpp"

struct ncclComm {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;
  std::atomic<bool> aborted{false};
  // An operation that failed on the device (ncclCommGetAsyncError): its result, then its message.
  std::atomic<ncclResult_t> async_error{ncclSuccess};
  std::string async_message;
};

namespace {

/// A send or receive inside a group: posted with the group's others at ncclGroupEnd.
struct GroupedCall {
  ncclComm_t comm;
  cudaStream_t stream;
  std::function<int(MPI_Request&)> post;  // the MPI_Isend or MPI_Irecv
};
thread_local int g_group_depth = 0;
thread_local std::vector<GroupedCall> g_grouped;
thread_local std::string g_last_error;

ncclResult_t failure(ncclResult_t result, std::string message) {
  g_last_error = std::move(message);
  return result;
}

std::size_t type_size(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;
  }
}

MPI_Datatype mpi_type(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
      return MPI_INT8_T;
    case ncclUint8:
      return MPI_UINT8_T;
    case ncclInt32:
      return MPI_INT32_T;
    case ncclUint32:
      return MPI_UINT32_T;
    case ncclInt64:
      return MPI_INT64_T;
    case ncclUint64:
      return MPI_UINT64_T;
    case ncclFloat32:
      return MPI_FLOAT;
    case ncclFloat64:
      return MPI_DOUBLE;
    case ncclFloat16:
    case ncclBfloat16:
      return MPI_UINT16_T;  // reduced by the user operations below
    default:
      return MPI_DATATYPE_NULL;
  }
}

// Reductions of 16-bit floats: each pair in fp32, rounded back (round to nearest even).
template <typename Half, int kOp>
void reduce_half(void* in, void* inout, int* length, MPI_Datatype*) {
  const auto* a = static_cast<const Half*>(in);
  auto* b = static_cast<Half*>(inout);
  for (int i = 0; i < *length; ++i) {
    const float x = static_cast<float>(a[i]), y = static_cast<float>(b[i]);
    float r = 0;
    switch (kOp) {
      case ncclSum:
        r = x + y;
        break;
      case ncclProd:
        r = x * y;
        break;
      case ncclMax:
        r = x > y ? x : y;
        break;
      default:
        r = x < y ? x : y;
        break;
    }
    b[i] = Half(r);
  }
}

template <typename Half>
MPI_Op half_op(ncclRedOp_t op) {
  static MPI_Op ops[4] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
  static MPI_User_function* const functions[4] = {reduce_half<Half, ncclSum>, reduce_half<Half, ncclProd>,
                                                  reduce_half<Half, ncclMax>, reduce_half<Half, ncclMin>};
  const int index = op == ncclAvg ? 0 : static_cast<int>(op);
  if (ops[index] == MPI_OP_NULL) MPI_Op_create(functions[index], 1, &ops[index]);
  return ops[index];
}

MPI_Op mpi_op(ncclRedOp_t op, ncclDataType_t type) {
  if (type == ncclFloat16) return half_op<zt::fp16>(op);
  if (type == ncclBfloat16) return half_op<zt::bf16>(op);
  switch (op) {
    case ncclSum:
    case ncclAvg:
      return MPI_SUM;
    case ncclProd:
      return MPI_PROD;
    case ncclMax:
      return MPI_MAX;
    case ncclMin:
      return MPI_MIN;
    default:
      return MPI_OP_NULL;
  }
}

/// ncclAvg: the sum divided by the ranks (integers truncate, as NCCL's).
void divide(void* data, std::size_t count, ncclDataType_t type, int ranks) {
  for (std::size_t i = 0; i < count; ++i) {
    switch (type) {
      case ncclFloat32:
        static_cast<float*>(data)[i] /= static_cast<float>(ranks);
        break;
      case ncclFloat64:
        static_cast<double*>(data)[i] /= ranks;
        break;
      case ncclFloat16:
        static_cast<zt::fp16*>(data)[i] =
            zt::fp16(static_cast<float>(static_cast<zt::fp16*>(data)[i]) / ranks);
        break;
      case ncclBfloat16:
        static_cast<zt::bf16*>(data)[i] =
            zt::bf16(static_cast<float>(static_cast<zt::bf16*>(data)[i]) / ranks);
        break;
      case ncclInt32:
        static_cast<std::int32_t*>(data)[i] /= ranks;
        break;
      case ncclInt64:
        static_cast<std::int64_t*>(data)[i] /= ranks;
        break;
      default:
        break;
    }
  }
}

ncclResult_t check_comm(ncclComm_t comm, ncclDataType_t type) {
  if (comm == nullptr) return failure(ncclInvalidArgument, "nccl on host: a null communicator");
  if (comm->aborted) return failure(ncclInvalidUsage, "nccl on host: the communicator was aborted");
  if (type_size(type) == 0) return failure(ncclInvalidArgument, "nccl on host: an unsupported data type");
  return ncclSuccess;
}

ncclResult_t mpi_result(int status, const char* call) {
  if (status == MPI_SUCCESS) return ncclSuccess;
  return failure(ncclSystemError, std::string("nccl on host: ") + call + " failed");
}

/// `operation` (its MPI calls, returning their status) as device work on `stream`, after this
/// process's earlier NCCL operations. On the device a failure is the communicator's asynchronous
/// error; an aborted communicator's operations do nothing.
void enqueue_on_device(ncclComm_t comm, cudaStream_t stream, const char* call,
                       std::function<int()> operation) {
  cuda_fibers::enqueue_collective(stream, call, [comm, call, operation = std::move(operation)] {
    if (comm->aborted.load()) return;
    const int status = operation();
    if (status == MPI_SUCCESS || comm->async_error.load() != ncclSuccess) return;
    comm->async_message =
        std::string("nccl on host: ") + call + " failed in MPI (error " + std::to_string(status) + ")";
    comm->async_error.store(ncclSystemError);
  });
}

/// A send or receive: kept for ncclGroupEnd inside a group, else posted and completed on the device.
ncclResult_t post_or_group(ncclComm_t comm, cudaStream_t stream, const char* call,
                           std::function<int(MPI_Request&)> post) {
  if (g_group_depth > 0) {
    g_grouped.push_back({comm, stream, std::move(post)});
    return ncclSuccess;
  }
  enqueue_on_device(comm, stream, call, [post = std::move(post)] {
    MPI_Request request = MPI_REQUEST_NULL;
    const int status = post(request);
    return status != MPI_SUCCESS ? status : MPI_Wait(&request, MPI_STATUS_IGNORE);
  });
  return ncclSuccess;
}

std::filesystem::path rendezvous_directory(const ncclUniqueId& id) {
  std::uint64_t token = 0;
  std::memcpy(&token, id.internal, sizeof token);
  return std::filesystem::temp_directory_path() / ("zt-nccl-on-host-" + std::to_string(token));
}

}  // namespace

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  *version = NCCL_VERSION_CODE;  // the headers' version: this stands in for that library
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::random_device entropy;
  std::uint64_t token =
      (static_cast<std::uint64_t>(entropy()) << 32) ^ entropy() ^ static_cast<std::uint64_t>(getpid()) ^
      static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  std::memset(id->internal, 0, sizeof id->internal);
  std::memcpy(id->internal, &token, sizeof token);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  int provided = 0;
  MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_MULTIPLE)
    return failure(ncclInvalidUsage,
                   "nccl on host: needs MPI_THREAD_MULTIPLE (NCCL calls come from any thread)");
  if (nranks < 1 || rank < 0 || rank >= nranks) return failure(ncclInvalidArgument, "nccl on host: bad rank");
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  // Each member writes its world rank under the id's directory, then reads everyone's.
  const std::filesystem::path directory = rendezvous_directory(id);
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  {
    const std::filesystem::path partial = directory / (std::to_string(rank) + ".partial");
    std::ofstream(partial) << world_rank << "\n";
    std::filesystem::rename(partial, directory / std::to_string(rank), error);
  }
  std::vector<int> world_ranks(static_cast<std::size_t>(nranks), -1);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  for (int member = 0; member < nranks; ++member) {
    const std::filesystem::path file = directory / std::to_string(member);
    while (!(std::ifstream(file) >> world_ranks[static_cast<std::size_t>(member)])) {
      if (std::chrono::steady_clock::now() > deadline)
        return failure(ncclSystemError, "nccl on host: rank " + std::to_string(member) + " of " +
                                            std::to_string(nranks) + " never joined " + directory.string());
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  MPI_Group world_group = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
  MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  MPI_Group_incl(world_group, nranks, world_ranks.data(), &group);
  std::uint64_t token = 0;
  std::memcpy(&token, id.internal, sizeof token);
  auto created = std::make_unique<ncclComm>();
  const int status =
      MPI_Comm_create_group(MPI_COMM_WORLD, group, static_cast<int>(token % 32768), &created->comm);
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  if (status != MPI_SUCCESS) return mpi_result(status, "MPI_Comm_create_group");
  created->rank = rank;
  created->size = nranks;
  MPI_Barrier(created->comm);  // everyone has read the files
  if (rank == 0) std::filesystem::remove_all(directory, error);
  *comm = created.release();
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  cuda_fibers::synchronize_device();  // as NCCL's, after the operations issued on it
  if (comm->comm != MPI_COMM_NULL) MPI_Comm_free(&comm->comm);
  std::unique_ptr<ncclComm>(comm).reset();
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  // MPI cannot interrupt an operation; the communicator refuses further use and is not freed
  // (its peers may still be in a collective on it).
  if (comm != nullptr) comm->aborted.store(true);
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  *async_error = comm != nullptr ? comm->async_error.load() : ncclSuccess;
  return ncclSuccess;
}

const char* ncclGetLastError(ncclComm_t comm) {
  if (comm != nullptr && comm->async_error.load() != ncclSuccess) return comm->async_message.c_str();
  return g_last_error.c_str();
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclInvalidArgument:
      return "invalid argument (nccl on host)";
    case ncclInvalidUsage:
      return "invalid usage (nccl on host)";
    case ncclSystemError:
      return "system error (nccl on host)";
    default:
      return "error (nccl on host)";
  }
}

ncclResult_t ncclGroupStart() {
  ++g_group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (g_group_depth == 0)
    return failure(ncclInvalidUsage, "nccl on host: ncclGroupEnd without ncclGroupStart");
  if (--g_group_depth > 0) return ncclSuccess;
  std::vector<GroupedCall> calls;
  calls.swap(g_grouped);
  if (calls.empty()) return ncclSuccess;
  for (const GroupedCall& call : calls)
    if (call.stream != calls.front().stream || call.comm != calls.front().comm)
      return failure(ncclInvalidUsage,
                     "nccl on host: a group's sends and receives on more than one stream or communicator "
                     "(not modelled)");
  enqueue_on_device(calls.front().comm, calls.front().stream, "ncclGroupEnd", [calls] {
    std::vector<MPI_Request> requests(calls.size(), MPI_REQUEST_NULL);
    for (std::size_t i = 0; i < calls.size(); ++i)
      if (const int status = calls[i].post(requests[i]); status != MPI_SUCCESS) return status;
    return MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE);
  });
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  if (const ncclResult_t checked = check_comm(comm, type); checked != ncclSuccess) return checked;
  enqueue_on_device(comm, stream, "ncclAllReduce", [=] {
    const int status = MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, static_cast<int>(count),
                                     mpi_type(type), mpi_op(op, type), comm->comm);
    if (status == MPI_SUCCESS && op == ncclAvg) divide(recv, count, type, comm->size);
    return status;
  });
  return ncclSuccess;
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recv_count, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  if (const ncclResult_t checked = check_comm(comm, type); checked != ncclSuccess) return checked;
  enqueue_on_device(comm, stream, "ncclReduceScatter", [=] {
    const std::size_t bytes = recv_count * type_size(type);
    // NCCL's in place is recv at the rank's slice of send; MPI's is the whole buffer: copy the input.
    std::vector<unsigned char> input(
        static_cast<const unsigned char*>(send),
        static_cast<const unsigned char*>(send) + bytes * static_cast<std::size_t>(comm->size));
    const int status = MPI_Reduce_scatter_block(input.data(), recv, static_cast<int>(recv_count),
                                                mpi_type(type), mpi_op(op, type), comm->comm);
    if (status == MPI_SUCCESS && op == ncclAvg) divide(recv, recv_count, type, comm->size);
    return status;
  });
  return ncclSuccess;
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t send_count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream) {
  if (const ncclResult_t checked = check_comm(comm, type); checked != ncclSuccess) return checked;
  enqueue_on_device(comm, stream, "ncclAllGather", [=] {
    const std::size_t bytes = send_count * type_size(type);
    const bool in_place =
        send == static_cast<const unsigned char*>(recv) + bytes * static_cast<std::size_t>(comm->rank);
    return MPI_Allgather(in_place ? MPI_IN_PLACE : send, static_cast<int>(send_count), mpi_type(type), recv,
                         static_cast<int>(send_count), mpi_type(type), comm->comm);
  });
  return ncclSuccess;
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  if (const ncclResult_t checked = check_comm(comm, type); checked != ncclSuccess) return checked;
  enqueue_on_device(comm, stream, "ncclBroadcast", [=] {
    if (comm->rank == root && send != recv) std::memmove(recv, send, count * type_size(type));
    return MPI_Bcast(recv, static_cast<int>(count), mpi_type(type), root, comm->comm);
  });
  return ncclSuccess;
}

ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  if (const ncclResult_t checked = check_comm(comm, type); checked != ncclSuccess) return checked;
  return post_or_group(comm, stream, "ncclSend", [=](MPI_Request& request) {
    return MPI_Isend(send, static_cast<int>(count), mpi_type(type), peer, 0, comm->comm, &request);
  });
}

ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  if (const ncclResult_t checked = check_comm(comm, type); checked != ncclSuccess) return checked;
  return post_or_group(comm, stream, "ncclRecv", [=](MPI_Request& request) {
    return MPI_Irecv(recv, static_cast<int>(count), mpi_type(type), peer, 0, comm->comm, &request);
  });
}

}  // extern "C"
