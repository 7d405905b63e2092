// The Linear layers' GEMMs on CUDA through cuBLASLt (kernels/cuda/gemm.hpp), plus two small kernels:
// the bias gradient's column sums and the bias broadcast where the bias cannot be fused.
//
// Row-major to column-major: cuBLASLt is column-major, and a row-major [r, c] matrix is, read
// column-major with leading dimension c, its transpose [c, r]. So every row-major product
// C = op(A) . op(B) runs as the column-major product C^T = op(B)^T . op(A)^T, with the operands
// swapped and no data moved:
//   forward       Y^T[out, rows]  = W^T(op T)[in, out]   . X^T[in, rows]            + bias[out]
//   grad_input    dX^T[in, rows]  = W^T[in, out]          . dY^T[out, rows]
//   grad_weight   dW^T[in, out]  += X^T[in, rows]         . dY^T(op T)[out, rows]
//   weight rows   the same with dY^T's rows [first_out, first_out + count) (pointer offset, ld out)
// where each X^T, W^T, dY^T is the row-major buffer itself read column-major.
//
// Resources: one cuBLASLt handle per device, kept for the process, and one 32 MiB workspace per stream
// (cuBLAS requires a workspace per stream when one handle serves several streams), made on the
// stream's first GEMM, counted as device workspace memory, and freed with the stream. Each distinct GEMM
// (shape, leading dimensions, dtype, math mode, transposes, epilogue, pointer alignments) gets its
// descriptors and heuristic's algorithm once; later calls only enqueue. The chosen algorithm is a function of
// that key, so a run repeats its bits (cuBLASLt is deterministic for a given algorithm and workspace); the
// bias gradient reduces in a fixed order, without atomics.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "base/never_destroyed.hpp"
#include "kernels/cuda/cublaslt_library.hpp"
#include "kernels/cuda/cuda_common.hpp"
#include "kernels/cuda/gemm.hpp"
#include "kernels/device_backend.hpp"
#include "zerotrain/device.hpp"
#include "zerotrain/dtype.hpp"
#include "zerotrain/error.hpp"

namespace zt::kernels::cuda {
namespace {

/// What a GEMM computes, for error messages: the kernel, its product, the layer's shape, the dtype.
struct GemmContext {
  const char* kernel;
  const char* product;
  MatmulShape shape;
  DType dtype;
};

/// "matmul_forward (output = ...) with rows R, in_features I, out_features O, bf16"
std::string describe(const GemmContext& gemm) {
  return detail::concat(gemm.kernel, " (", gemm.product, ") with rows ", gemm.shape.rows, ", in_features ",
                        gemm.shape.in_features, ", out_features ", gemm.shape.out_features, ", ",
                        dtype_name(gemm.dtype));
}

[[noreturn]] void throw_cublas_error(const GemmContext& gemm, const char* call, cublasStatus_t status) {
  ZT_THROW_AS(CudaError, describe(gemm), ": ", call, " failed: ", lt::cublasLtGetStatusString(status), " (",
              static_cast<int>(status), ")");
}

}  // namespace
}  // namespace zt::kernels::cuda

/// Throws zt::CudaError naming the GEMM (a GemmContext), the cuBLASLt call and its status.
#define ZT_CHECK_CUBLAS(call, gemm)                                              \
  do {                                                                           \
    const cublasStatus_t zt_cublas_status_ = (call);                             \
    if (zt_cublas_status_ != CUBLAS_STATUS_SUCCESS)                              \
      ::zt::kernels::cuda::throw_cublas_error((gemm), #call, zt_cublas_status_); \
  } while (0)

namespace zt::kernels::cuda {
namespace {

// ---- math mode ----------------------------------------------------------------------------------

bool tf32_from_environment() {
  const char* value = std::getenv("ZT_CUDA_TF32");
  const std::string_view text = value == nullptr ? std::string_view() : std::string_view(value);
  if (text.empty() || text == "0") return false;
  if (text == "1") return true;
  ZT_THROW_AS(
      ConfigError, "ZT_CUDA_TF32='", text,
      "': expected 0 (fp32 GEMMs compute in fp32, the default) or 1 (fp32 GEMMs on TF32 tensor cores)");
}

/// -1: as ZT_CUDA_TF32 says; 0 or 1: set_tf32_enabled's choice.
std::atomic<int> tf32_override{-1};

// ---- RAII for cuBLASLt and CUDA objects ---------------------------------------------------------

template <typename Handle, cublasStatus_t (*destroy)(Handle)>
struct CublasDestroyer {
  void operator()(Handle handle) const noexcept { destroy(handle); }
};
template <typename Handle, cublasStatus_t (*destroy)(Handle)>
using CublasObject = std::unique_ptr<std::remove_pointer_t<Handle>, CublasDestroyer<Handle, destroy>>;

using LtHandle = CublasObject<cublasLtHandle_t, lt::cublasLtDestroy>;
using MatmulDescriptor = CublasObject<cublasLtMatmulDesc_t, lt::cublasLtMatmulDescDestroy>;
using MatrixLayout = CublasObject<cublasLtMatrixLayout_t, lt::cublasLtMatrixLayoutDestroy>;
using MatmulPreference = CublasObject<cublasLtMatmulPreference_t, lt::cublasLtMatmulPreferenceDestroy>;

/// Makes the stream's device current for the scope (kernel launches, cuBLASLt's heuristics and handles
/// follow the current device), restoring the caller's on exit. Each entry point holds one.
class StreamDeviceScope : public CurrentDeviceScope {
 public:
  explicit StreamDeviceScope(cudaStream_t stream) : CurrentDeviceScope(stream_device(stream)) {}
};

cublasLtHandle_t lt_handle(int device, const GemmContext& gemm) {
  static std::mutex mutex;
  static base::NeverDestroyed<std::map<int, LtHandle>> handles;
  const std::lock_guard lock(mutex);
  LtHandle& handle = (*handles)[device];
  if (!handle) {
    cublasLtHandle_t created = nullptr;
    ZT_CHECK_CUBLAS(lt::cublasLtCreate(&created), gemm);
    handle.reset(created);
  }
  return handle.get();
}

/// cuBLASLt's workspace: 32 MiB, what NVIDIA recommends for Hopper (enough for split-K and stream-K).
constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;

/// The streams' workspaces, by device and stream (the legacy default stream, nullptr, is every
/// device's). Never destroyed: streams may be destroyed during static destruction.
struct StreamWorkspaces {
  std::mutex mutex;
  std::map<std::pair<int, cudaStream_t>, zt::Buffer> by_stream;
};
StreamWorkspaces& stream_workspaces() {
  static base::NeverDestroyed<StreamWorkspaces> workspaces;
  return *workspaces;
}

/// A destroyed stream's workspace goes with it (its work is done): a stream made for a while (the
/// MFU probe's, a test's) would otherwise keep its 32 MiB for the process.
void release_stream_workspace(void* stream) {
  StreamWorkspaces& workspaces = stream_workspaces();
  zt::Buffer released;  // freed outside the lock: the free waits for the device
  {
    const std::lock_guard lock(workspaces.mutex);
    // A stream made by cuda_stream_create belongs to one device: at most one entry.
    for (auto it = workspaces.by_stream.begin(); it != workspaces.by_stream.end(); ++it) {
      if (it->first.second != static_cast<cudaStream_t>(stream)) continue;
      released = std::move(it->second);
      workspaces.by_stream.erase(it);
      break;
    }
  }
}

void* stream_workspace(int device, cudaStream_t stream) {
  static std::once_flag hooked;
  std::call_once(hooked, [] { zt::detail::cuda_add_stream_release_hook(release_stream_workspace); });
  StreamWorkspaces& workspaces = stream_workspaces();
  const std::lock_guard lock(workspaces.mutex);
  zt::Buffer& workspace = workspaces.by_stream[{device, stream}];
  // From the device's pool, counted as workspace memory (device_peak, mem.workspace); made without
  // a stream, so usable on this one at once.
  if (workspace.empty())
    workspace = zt::Buffer(zt::Device::cuda(device), kWorkspaceBytes, zt::MemoryCategory::workspace);
  return workspace.data();
}

// ---- GEMM plans ---------------------------------------------------------------------------------

struct GemmTypes {
  cudaDataType_t data;
  cublasComputeType_t compute;
  cudaDataType_t scale;
};

GemmTypes gemm_types(DType dtype, bool tf32, const GemmContext& gemm) {
  switch (dtype) {
    case DType::fp32:
      return {CUDA_R_32F, tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F};
    case DType::fp64:
      return {CUDA_R_64F, CUBLAS_COMPUTE_64F, CUDA_R_64F};
    case DType::bf16:
      return {CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUDA_R_32F};
    case DType::fp16:
      return {CUDA_R_16F, CUBLAS_COMPUTE_32F, CUDA_R_32F};
    default:
      ZT_THROW(gemm.kernel, ": dtype ", dtype_name(dtype), " is not floating (fp32, fp64, bf16 or fp16)");
  }
}

/// D = op(A) . op(B) + beta C, column-major, in place (D = C), plus bias[m] added to every column when
/// bias is not null (CUBLASLT_EPILOGUE_BIAS). A is [m, k] (stored [k, m] when transposed), B [k, n]
/// (stored [n, k] when transposed), C [m, n].
struct ColumnMajorGemm {
  bool transpose_a = false;
  bool transpose_b = false;
  std::int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  std::int64_t lda = 0;
  const void* b = nullptr;
  std::int64_t ldb = 0;
  void* c = nullptr;
  std::int64_t ldc = 0;
  double beta = 0;
  const void* bias = nullptr;
};

/// The largest power of two up to 256 dividing the address: the heuristic must pick only algorithms
/// that work at that alignment (its default assumes 256 bytes).
std::uint32_t alignment_of(const void* pointer) {
  const auto address = reinterpret_cast<std::uintptr_t>(pointer);
  std::uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

/// Everything the descriptors and the algorithm depend on.
struct GemmKey {
  int device = 0;
  DType dtype = DType::fp32;
  bool tf32 = false;
  bool transpose_a = false;
  bool transpose_b = false;
  bool bias_epilogue = false;
  std::int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  std::uint32_t alignment_a = 0, alignment_b = 0, alignment_c = 0, alignment_bias = 0;

  auto tied() const {
    return std::tie(device, dtype, tf32, transpose_a, transpose_b, bias_epilogue, m, n, k, lda, ldb, ldc,
                    alignment_a, alignment_b, alignment_c, alignment_bias);
  }
  friend bool operator<(const GemmKey& left, const GemmKey& right) { return left.tied() < right.tied(); }
};

/// A GEMM's descriptors and algorithm. The mutex guards the descriptor's bias pointer from setting to
/// enqueueing, so that two threads may run the same plan.
struct GemmPlan {
  MatmulDescriptor descriptor;
  MatrixLayout layout_a, layout_b, layout_c;
  cublasLtMatmulAlgo_t algorithm{};
  std::mutex mutex;
};

MatrixLayout make_layout(cudaDataType_t type, std::int64_t rows, std::int64_t columns, std::int64_t ld,
                         const GemmContext& gemm) {
  cublasLtMatrixLayout_t layout = nullptr;
  ZT_CHECK_CUBLAS(lt::cublasLtMatrixLayoutCreate(&layout, type, static_cast<std::uint64_t>(rows),
                                                 static_cast<std::uint64_t>(columns), ld),
                  gemm);
  return MatrixLayout(layout);
}

template <typename Value>
void set_descriptor(cublasLtMatmulDesc_t descriptor, cublasLtMatmulDescAttributes_t attribute,
                    const Value& value, const GemmContext& gemm) {
  ZT_CHECK_CUBLAS(lt::cublasLtMatmulDescSetAttribute(descriptor, attribute, &value, sizeof(value)), gemm);
}

template <typename Value>
void set_preference(cublasLtMatmulPreference_t preference, cublasLtMatmulPreferenceAttributes_t attribute,
                    const Value& value, const GemmContext& gemm) {
  ZT_CHECK_CUBLAS(lt::cublasLtMatmulPreferenceSetAttribute(preference, attribute, &value, sizeof(value)),
                  gemm);
}

/// The plan for `key`, or null when the heuristic has no algorithm for it.
std::unique_ptr<GemmPlan> make_plan(const GemmKey& key, const void* bias, cublasLtHandle_t handle,
                                    const GemmContext& gemm) {
  const GemmTypes types = gemm_types(key.dtype, key.tf32, gemm);
  auto plan = std::make_unique<GemmPlan>();
  cublasLtMatmulDesc_t descriptor = nullptr;
  ZT_CHECK_CUBLAS(lt::cublasLtMatmulDescCreate(&descriptor, types.compute, types.scale), gemm);
  plan->descriptor.reset(descriptor);
  const cublasOperation_t op_a = key.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = key.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  set_descriptor(descriptor, CUBLASLT_MATMUL_DESC_TRANSA, op_a, gemm);
  set_descriptor(descriptor, CUBLASLT_MATMUL_DESC_TRANSB, op_b, gemm);
  if (key.bias_epilogue) {
    // The bias has the output's type (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE's default); the heuristic
    // reads the pointer for its alignment.
    set_descriptor(descriptor, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS, gemm);
    set_descriptor(descriptor, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias, gemm);
  }
  plan->layout_a = key.transpose_a ? make_layout(types.data, key.k, key.m, key.lda, gemm)
                                   : make_layout(types.data, key.m, key.k, key.lda, gemm);
  plan->layout_b = key.transpose_b ? make_layout(types.data, key.n, key.k, key.ldb, gemm)
                                   : make_layout(types.data, key.k, key.n, key.ldb, gemm);
  plan->layout_c = make_layout(types.data, key.m, key.n, key.ldc, gemm);

  cublasLtMatmulPreference_t created_preference = nullptr;
  ZT_CHECK_CUBLAS(lt::cublasLtMatmulPreferenceCreate(&created_preference), gemm);
  const MatmulPreference preference(created_preference);
  const std::uint64_t workspace_bytes = kWorkspaceBytes;
  set_preference(created_preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, workspace_bytes, gemm);
  set_preference(created_preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.alignment_a, gemm);
  set_preference(created_preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.alignment_b, gemm);
  set_preference(created_preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.alignment_c, gemm);
  set_preference(created_preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.alignment_c, gemm);

  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status = lt::cublasLtMatmulAlgoGetHeuristic(
      handle, descriptor, plan->layout_a.get(), plan->layout_b.get(), plan->layout_c.get(),
      plan->layout_c.get(), created_preference, 1, &result, &found);
  // No algorithm. For a fused bias any failed query counts as none (the unfused GEMM follows): which
  // status an unsupported epilogue gives is not documented.
  if (status == CUBLAS_STATUS_SUCCESS && found == 0) return nullptr;
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || (status != CUBLAS_STATUS_SUCCESS && key.bias_epilogue))
    return nullptr;
  if (status != CUBLAS_STATUS_SUCCESS) throw_cublas_error(gemm, "cublasLtMatmulAlgoGetHeuristic", status);
  plan->algorithm = result.algo;
  return plan;
}

/// Finds or makes the plan; null (remembered too) when cuBLASLt has no algorithm for the key.
GemmPlan* find_plan(const GemmKey& key, const void* bias, cublasLtHandle_t handle, const GemmContext& gemm) {
  static std::mutex mutex;
  static base::NeverDestroyed<std::map<GemmKey, std::unique_ptr<GemmPlan>>> plans;
  const std::lock_guard lock(mutex);
  const auto found = plans->find(key);
  if (found != plans->end()) return found->second.get();
  return plans->emplace(key, make_plan(key, bias, handle, gemm)).first->second.get();
}

/// Enqueues the GEMM on the stream. Returns false, having done nothing, when cuBLASLt has no algorithm
/// for a fused bias (the caller then adds the bias another way); throws when it has none without one.
bool run_gemm(const ColumnMajorGemm& product, DType dtype, const StreamDeviceScope& device,
              cudaStream_t stream, const GemmContext& gemm) {
  const cublasLtHandle_t handle = lt_handle(device.device(), gemm);
  void* workspace = stream_workspace(device.device(), stream);
  GemmKey key;
  key.device = device.device();
  key.dtype = dtype;
  key.tf32 = dtype == DType::fp32 && tf32_enabled();
  key.transpose_a = product.transpose_a;
  key.transpose_b = product.transpose_b;
  key.bias_epilogue = product.bias != nullptr;
  key.m = product.m;
  key.n = product.n;
  key.k = product.k;
  key.lda = product.lda;
  key.ldb = product.ldb;
  key.ldc = product.ldc;
  key.alignment_a = alignment_of(product.a);
  key.alignment_b = alignment_of(product.b);
  key.alignment_c = alignment_of(product.c);
  key.alignment_bias = product.bias != nullptr ? alignment_of(product.bias) : 0;
  GemmPlan* plan = find_plan(key, product.bias, handle, gemm);
  if (plan == nullptr) {
    if (key.bias_epilogue) return false;
    ZT_THROW_AS(CudaError, describe(gemm), ": cuBLASLt has no algorithm for the column-major GEMM m ", key.m,
                ", n ", key.n, ", k ", key.k, " (op A ", key.transpose_a ? "T" : "N", ", op B ",
                key.transpose_b ? "T" : "N", ", lda ", key.lda, ", ldb ", key.ldb, ", ldc ", key.ldc,
                "; alignments ", key.alignment_a, "/", key.alignment_b, "/", key.alignment_c, " bytes)");
  }
  // alpha and beta have the scale type: double for fp64, float otherwise.
  const double alpha_double = 1.0, beta_double = product.beta;
  const float alpha_float = 1.0f, beta_float = static_cast<float>(product.beta);
  const bool double_scale = dtype == DType::fp64;
  const void* alpha = double_scale ? static_cast<const void*>(&alpha_double) : &alpha_float;
  const void* beta = double_scale ? static_cast<const void*>(&beta_double) : &beta_float;

  const std::lock_guard lock(plan->mutex);
  if (key.bias_epilogue) {
    set_descriptor(plan->descriptor.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, product.bias, gemm);
  }
  ZT_CHECK_CUBLAS(
      lt::cublasLtMatmul(handle, plan->descriptor.get(), alpha, product.a, plan->layout_a.get(), product.b,
                         plan->layout_b.get(), beta, product.c, plan->layout_c.get(), product.c,
                         plan->layout_c.get(), &plan->algorithm, workspace, kWorkspaceBytes, stream),
      gemm);
  return true;
}

void run_gemm_unfused(const ColumnMajorGemm& product, DType dtype, const StreamDeviceScope& device,
                      cudaStream_t stream, const GemmContext& gemm) {
  ColumnMajorGemm unfused = product;
  unfused.bias = nullptr;
  run_gemm(unfused, dtype, device, stream, gemm);
}

// ---- bias kernels -------------------------------------------------------------------------------

/// Columns per block of the column sums (one per lane of a warp: coalesced row reads) and the rows
/// each block reads at once; a block's lanes then add their partial sums in lane order.
constexpr unsigned int kSumColumns = 32;
constexpr unsigned int kSumRowLanes = 16;

/// sums[c] += sum over rows of values[r * columns + c], in a fixed order (deterministic).
template <typename T>
__global__ void add_column_sums_kernel(const T* values, std::int64_t rows, std::int64_t columns, T* sums) {
  using C = compute_t<T>;
  __shared__ C partial[kSumRowLanes][kSumColumns];
  const std::int64_t column = static_cast<std::int64_t>(blockIdx.x) * kSumColumns + threadIdx.x;
  C sum = 0;
  if (column < columns) {
    for (std::int64_t r = threadIdx.y; r < rows; r += kSumRowLanes)
      sum += load_float(values + r * columns + column);
  }
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && column < columns) {
    C total = 0;
    for (unsigned int lane = 0; lane < kSumRowLanes; ++lane) total += partial[lane][threadIdx.x];
    store_float(sums + column, load_float(sums + column) + total);
  }
}

/// output[r, c] = row[c] for every row (the bias as the GEMM's C when it is not fused).
template <typename T>
__global__ void broadcast_row_kernel(const T* row, std::int64_t rows, std::int64_t columns, T* output) {
  const std::int64_t total = rows * columns;
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride)
    output[i] = row[i % columns];
}

void add_column_sums(DType dtype, const void* values, std::int64_t rows, std::int64_t columns, void* sums,
                     cudaStream_t stream) {
  if (rows == 0 || columns == 0) return;
  with_dtype(kFloatingDTypes, dtype, "matmul_backward (grad_bias)", [&](auto tag) {
    using T = decltype(tag);
    const auto blocks = static_cast<unsigned int>((columns + kSumColumns - 1) / kSumColumns);
    add_column_sums_kernel<T><<<blocks, dim3(kSumColumns, kSumRowLanes), 0, stream>>>(
        static_cast<const T*>(values), rows, columns, static_cast<T*>(sums));
    ZT_CHECK_LAUNCH("add_column_sums (matmul_backward grad_bias)");
  });
}

void broadcast_row(DType dtype, const void* row, std::int64_t rows, std::int64_t columns, void* output,
                   cudaStream_t stream) {
  with_dtype(kFloatingDTypes, dtype, "matmul_forward (bias)", [&](auto tag) {
    using T = decltype(tag);
    constexpr unsigned int threads = 256;
    broadcast_row_kernel<T><<<grid_blocks(rows * columns, threads), threads, 0, stream>>>(
        static_cast<const T*>(row), rows, columns, static_cast<T*>(output));
    ZT_CHECK_LAUNCH("broadcast_row (matmul_forward bias)");
  });
}

void zero(void* data, std::int64_t count, DType dtype, cudaStream_t stream) {
  ZT_CHECK_CUDA(cudaMemsetAsync(data, 0, static_cast<std::size_t>(count) * dtype_size(dtype), stream));
}

}  // namespace

bool tf32_enabled() {
  const int chosen = tf32_override.load(std::memory_order_relaxed);
  if (chosen >= 0) return chosen == 1;
  static const bool from_environment = tf32_from_environment();
  return from_environment;
}

void set_tf32_enabled(bool enabled) {
  tf32_override.store(enabled ? 1 : 0, std::memory_order_relaxed);
}

void matmul_forward(DType dtype, const void* input, const void* weight, const void* bias, void* output,
                    const MatmulShape& shape, void* stream) {
  const GemmContext gemm{"matmul_forward", "output = input . weight^T + bias", shape, dtype};
  gemm_types(dtype, false, gemm);  // rejects a dtype that is not floating before any size shortcut
  const auto [rows, in, out] = shape;
  const cudaStream_t cuda_stream = as_cuda_stream(stream);
  if (rows == 0 || out == 0) return;
  const StreamDeviceScope device(cuda_stream);
  if (in == 0) {  // an empty product: the output is the bias, or zero
    if (bias != nullptr) {
      broadcast_row(dtype, bias, rows, out, output, cuda_stream);
    } else {
      zero(output, rows * out, dtype, cuda_stream);
    }
    return;
  }
  ColumnMajorGemm product;
  product.transpose_a = true;
  product.m = out;
  product.n = rows;
  product.k = in;
  product.a = weight;
  product.lda = in;
  product.b = input;
  product.ldb = in;
  product.c = output;
  product.ldc = out;
  // The bias in the GEMM's epilogue (added to the fp32 accumulator, one rounding, as the host's beta = 1
  // onto the bias). fp64 and any shape cuBLASLt fuses no bias for: the bias as C, beta = 1.
  if (bias != nullptr && dtype != DType::fp64) {
    product.bias = bias;
    if (run_gemm(product, dtype, device, cuda_stream, gemm)) return;
  }
  if (bias != nullptr) {
    broadcast_row(dtype, bias, rows, out, output, cuda_stream);
    product.beta = 1.0;
  }
  run_gemm_unfused(product, dtype, device, cuda_stream, gemm);
}

void matmul_backward(DType dtype, const void* grad_output, const void* input, const void* weight,
                     void* grad_input, void* grad_weight, void* grad_bias, const MatmulShape& shape,
                     void* stream) {
  const auto [rows, in, out] = shape;
  const cudaStream_t cuda_stream = as_cuda_stream(stream);
  gemm_types(dtype, false, GemmContext{"matmul_backward", "", shape, dtype});
  const StreamDeviceScope device(cuda_stream);
  if (grad_input != nullptr && rows > 0 && in > 0) {
    const GemmContext gemm{"matmul_backward", "grad_input = grad_output . weight", shape, dtype};
    if (out == 0) {
      zero(grad_input, rows * in, dtype, cuda_stream);
    } else {
      ColumnMajorGemm product;
      product.m = in;
      product.n = rows;
      product.k = out;
      product.a = weight;
      product.lda = in;
      product.b = grad_output;
      product.ldb = out;
      product.c = grad_input;
      product.ldc = in;
      run_gemm_unfused(product, dtype, device, cuda_stream, gemm);
    }
  }
  if (grad_weight != nullptr && rows > 0 && in > 0 && out > 0) {
    const GemmContext gemm{"matmul_backward", "grad_weight += grad_output^T . input", shape, dtype};
    ColumnMajorGemm product;
    product.transpose_b = true;
    product.m = in;
    product.n = out;
    product.k = rows;
    product.a = input;
    product.lda = in;
    product.b = grad_output;
    product.ldb = out;
    product.c = grad_weight;
    product.ldc = in;
    product.beta = 1.0;
    run_gemm_unfused(product, dtype, device, cuda_stream, gemm);
  }
  if (grad_bias != nullptr) add_column_sums(dtype, grad_output, rows, out, grad_bias, cuda_stream);
}

void matmul_weight_grad_rows(DType dtype, const void* grad_output, const void* input, void* grad_weight_rows,
                             const MatmulShape& shape, std::int64_t first_out, std::int64_t count,
                             void* stream) {
  const GemmContext gemm{"matmul_weight_grad_rows",
                         "grad_weight_rows += (grad_output^T . input)[first_out : first_out + count]", shape,
                         dtype};
  gemm_types(dtype, false, gemm);
  const auto [rows, in, out] = shape;
  ZT_CHECK(first_out >= 0 && count >= 0 && first_out + count <= out, "matmul_weight_grad_rows: rows [",
           first_out, ", ", first_out + count, ") of a weight with ", out, " output features");
  if (rows == 0 || in == 0 || count == 0) return;
  const cudaStream_t cuda_stream = as_cuda_stream(stream);
  const StreamDeviceScope device(cuda_stream);
  ColumnMajorGemm product;
  product.transpose_b = true;
  product.m = in;
  product.n = count;
  product.k = rows;
  product.a = input;
  product.lda = in;
  // Row first_out of grad_output^T (column-major, leading dimension out) starts first_out elements in.
  product.b =
      static_cast<const std::byte*>(grad_output) + first_out * static_cast<std::int64_t>(dtype_size(dtype));
  product.ldb = out;
  product.c = grad_weight_rows;
  product.ldc = in;
  product.beta = 1.0;
  run_gemm_unfused(product, dtype, device, cuda_stream, gemm);
}

}  // namespace zt::kernels::cuda
