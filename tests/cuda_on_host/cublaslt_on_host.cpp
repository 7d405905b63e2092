// The CUDA-on-host build's cuBLASLt (cmake/ZerotrainCudaOnHost.cmake): the forwarders of
// kernels/cuda/cublaslt_library.hpp implemented on the host from cuBLASLt's documented contract, in
// place of the dlopen'ed library, so that kernels/cuda/gemm.cu's plans (operations, layouts, leading
// dimensions, the bias epilogue, alpha and beta in the scale type) run and are checked against the
// host GEMMs. Written from the documentation, not from gemm.cu: column-major layouts (element (i, j)
// at i + j ld, ld >= rows), op(A) [m, k] stored [k, m] when transposed, D = alpha op(A) op(B) + beta C
// (+ bias[i] on every column with CUBLASLT_EPILOGUE_BIAS, in D's type), accumulated in the compute
// type and rounded once to D's type. Shapes that do not fit are CUBLAS_STATUS_INVALID_VALUE, as
// cuBLASLt's. What it cannot show: which algorithms the real heuristic offers (every shape is taken
// here), TF32's rounding, the real library's speed.
//
// The fused bias is taken too, unless CUBLASLT_ON_HOST_BIAS says how to refuse it, as the real
// heuristic may for a shape, a type or an alignment (the unfused path of gemm.cu then runs):
//   unset or "fused": taken;  "no_algorithm": success with no algorithm returned;
//   "not_supported": CUBLAS_STATUS_NOT_SUPPORTED;  "invalid_value": CUBLAS_STATUS_INVALID_VALUE
// (which status the real library gives is not documented). A matmul with the bias epilogue is then
// CUBLAS_STATUS_NOT_SUPPORTED too: no algorithm was offered for it.
#include <cublasLt.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda_fibers_streams.hpp"
#include "kernels/cuda/cublaslt_library.hpp"
#include "zerotrain/dtype.hpp"

namespace zt::kernels::cuda::lt {
namespace {

struct Layout {
  cudaDataType type;
  std::uint64_t rows, columns;
  std::int64_t ld;
};

struct Descriptor {
  cublasComputeType_t compute;
  cudaDataType_t scale;
  cublasOperation_t op_a = CUBLAS_OP_N, op_b = CUBLAS_OP_N;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
};

struct Preference {};

/// What the heuristic answers for the bias epilogue (CUBLASLT_ON_HOST_BIAS at the top). Read on each
/// query; a value it does not know is a configuration mistake, said loudly.
cublasStatus_t bias_epilogue_refusal(bool& no_algorithm) {
  const char* value = std::getenv("CUBLASLT_ON_HOST_BIAS");
  const std::string mode = value == nullptr ? "" : value;
  no_algorithm = mode == "no_algorithm";
  if (mode.empty() || mode == "fused" || no_algorithm) return CUBLAS_STATUS_SUCCESS;
  if (mode == "not_supported") return CUBLAS_STATUS_NOT_SUPPORTED;
  if (mode == "invalid_value") return CUBLAS_STATUS_INVALID_VALUE;
  throw std::invalid_argument("CUBLASLT_ON_HOST_BIAS='" + mode +
                              "': expected fused, no_algorithm, not_supported or invalid_value");
}

bool bias_epilogue_refused() {
  bool no_algorithm = false;
  return bias_epilogue_refusal(no_algorithm) != CUBLAS_STATUS_SUCCESS || no_algorithm;
}

double load(const void* data, cudaDataType type, std::int64_t index) {
  switch (type) {
    case CUDA_R_32F:
      return static_cast<const float*>(data)[index];
    case CUDA_R_64F:
      return static_cast<const double*>(data)[index];
    case CUDA_R_16BF:
      return static_cast<float>(static_cast<const bf16*>(data)[index]);
    case CUDA_R_16F:
      return static_cast<float>(static_cast<const fp16*>(data)[index]);
    default:
      return 0;
  }
}

void store(void* data, cudaDataType type, std::int64_t index, double value) {
  switch (type) {
    case CUDA_R_32F:
      static_cast<float*>(data)[index] = static_cast<float>(value);
      return;
    case CUDA_R_64F:
      static_cast<double*>(data)[index] = value;
      return;
    case CUDA_R_16BF:
      static_cast<bf16*>(data)[index] = bf16(static_cast<float>(value));
      return;
    case CUDA_R_16F:
      static_cast<fp16*>(data)[index] = fp16(static_cast<float>(value));
      return;
    default:
      return;
  }
}

bool known_type(cudaDataType type) {
  return type == CUDA_R_32F || type == CUDA_R_64F || type == CUDA_R_16BF || type == CUDA_R_16F;
}

/// The product's m, n, k from the layouts and operations, or false when they do not fit.
bool shape_of(const Descriptor& d, const Layout& a, const Layout& b, const Layout& c, const Layout& out,
              std::uint64_t& m, std::uint64_t& n, std::uint64_t& k) {
  m = d.op_a == CUBLAS_OP_N ? a.rows : a.columns;
  k = d.op_a == CUBLAS_OP_N ? a.columns : a.rows;
  const std::uint64_t k_b = d.op_b == CUBLAS_OP_N ? b.rows : b.columns;
  n = d.op_b == CUBLAS_OP_N ? b.columns : b.rows;
  for (const Layout* layout : {&a, &b, &c, &out})
    if (layout->ld < static_cast<std::int64_t>(layout->rows) || !known_type(layout->type)) return false;
  return k == k_b && out.rows == m && out.columns == n && c.rows == m && c.columns == n && a.type == b.type &&
         c.type == out.type;
}

/// D[i, j] = alpha dot(row i of op(A), column j of op(B)) + beta C[i, j] (+ bias[i]), in Compute.
template <typename Compute>
void matmul_columns(const std::vector<Compute>& rows_a, const std::vector<Compute>& columns_b,
                    std::uint64_t m, std::uint64_t n, std::uint64_t k, double alpha, double beta,
                    const Descriptor& desc, const void* c, const Layout& lc, void* d, const Layout& ld) {
  for (std::uint64_t j = 0; j < n; ++j) {
    const Compute* column = columns_b.data() + j * k;
    for (std::uint64_t i = 0; i < m; ++i) {
      const Compute* row = rows_a.data() + i * k;
      // Eight partial sums, as a vector unit keeps them (cuBLASLt's order is its own; the tests allow
      // for any): eight times faster than one chain here. Named, not an array, so that they stay in
      // registers (GCC kept an array of doubles in memory: a store and a load per product).
      Compute s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
      std::uint64_t p = 0;
      for (; p + 8 <= k; p += 8) {
        s0 += row[p] * column[p];
        s1 += row[p + 1] * column[p + 1];
        s2 += row[p + 2] * column[p + 2];
        s3 += row[p + 3] * column[p + 3];
        s4 += row[p + 4] * column[p + 4];
        s5 += row[p + 5] * column[p + 5];
        s6 += row[p + 6] * column[p + 6];
        s7 += row[p + 7] * column[p + 7];
      }
      for (; p < k; ++p) s0 += row[p] * column[p];
      const Compute sum = ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7));
      Compute value = static_cast<Compute>(alpha) * sum;
      if (beta != 0)
        value += static_cast<Compute>(beta) *
                 static_cast<Compute>(load(c, lc.type, static_cast<std::int64_t>(i + j * lc.ld)));
      if (desc.epilogue == CUBLASLT_EPILOGUE_BIAS)
        value += static_cast<Compute>(load(desc.bias, ld.type, static_cast<std::int64_t>(i)));
      store(d, ld.type, static_cast<std::int64_t>(i + j * ld.ld), value);
    }
  }
}

/// D = alpha op(A) op(B) + beta C (+ bias): the matmul as device work.
void matmul(const Descriptor& desc, const Layout& la, const Layout& lb, const Layout& lc, const Layout& ld,
            std::uint64_t m, std::uint64_t n, std::uint64_t k, double alpha_value, double beta_value,
            const void* a, const void* b, const void* c, void* d) {
  const bool double_compute = desc.compute == CUBLAS_COMPUTE_64F;
  // op(A) as rows of k and op(B) as columns of k, widened once: each element of D is then one dot
  // product over contiguous memory, in the order p = 0..k-1.
  std::vector<double> rows_a(m * k), columns_b(n * k);
  for (std::uint64_t i = 0; i < m; ++i)
    for (std::uint64_t p = 0; p < k; ++p)
      rows_a[i * k + p] = load(a, la.type,
                               desc.op_a == CUBLAS_OP_N ? static_cast<std::int64_t>(i + p * la.ld)
                                                        : static_cast<std::int64_t>(p + i * la.ld));
  for (std::uint64_t j = 0; j < n; ++j)
    for (std::uint64_t p = 0; p < k; ++p)
      columns_b[j * k + p] = load(b, lb.type,
                                  desc.op_b == CUBLAS_OP_N ? static_cast<std::int64_t>(p + j * lb.ld)
                                                           : static_cast<std::int64_t>(j + p * lb.ld));
  if (double_compute) {
    matmul_columns<double>(rows_a, columns_b, m, n, k, alpha_value, beta_value, desc, c, lc, d, ld);
  } else {
    const std::vector<float> rows_a_float(rows_a.begin(), rows_a.end());
    const std::vector<float> columns_b_float(columns_b.begin(), columns_b.end());
    matmul_columns<float>(rows_a_float, columns_b_float, m, n, k, alpha_value, beta_value, desc, c, lc, d,
                          ld);
  }
}

template <typename Object, typename Handle>
Object* object(Handle handle) {
  return reinterpret_cast<Object*>(handle);
}

}  // namespace

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  static int tag = 0;
  *handle = reinterpret_cast<cublasLtHandle_t>(&tag);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t) {
  return CUBLAS_STATUS_SUCCESS;
}
const char* cublasLtGetStatusString(cublasStatus_t status) {
  return status == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS" : "cuBLASLt on host: an error";
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* descriptor, cublasComputeType_t compute_type,
                                        cudaDataType_t scale_type) {
  auto created = std::make_unique<Descriptor>(Descriptor{compute_type, scale_type});
  *descriptor = reinterpret_cast<cublasLtMatmulDesc_t>(created.release());
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t descriptor) {
  std::unique_ptr<Descriptor>(object<Descriptor>(descriptor)).reset();
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t descriptor,
                                              cublasLtMatmulDescAttributes_t attribute, const void* buffer,
                                              std::size_t size) {
  Descriptor& d = *object<Descriptor>(descriptor);
  switch (attribute) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
      if (size != sizeof(cublasOperation_t)) return CUBLAS_STATUS_INVALID_VALUE;
      std::memcpy(&d.op_a, buffer, size);
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_TRANSB:
      if (size != sizeof(cublasOperation_t)) return CUBLAS_STATUS_INVALID_VALUE;
      std::memcpy(&d.op_b, buffer, size);
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      if (size != sizeof(cublasLtEpilogue_t)) return CUBLAS_STATUS_INVALID_VALUE;
      std::memcpy(&d.epilogue, buffer, size);
      return d.epilogue == CUBLASLT_EPILOGUE_DEFAULT || d.epilogue == CUBLASLT_EPILOGUE_BIAS
                 ? CUBLAS_STATUS_SUCCESS
                 : CUBLAS_STATUS_NOT_SUPPORTED;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      if (size != sizeof(void*)) return CUBLAS_STATUS_INVALID_VALUE;
      std::memcpy(&d.bias, buffer, size);
      return CUBLAS_STATUS_SUCCESS;
    default:
      return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                          std::uint64_t rows, std::uint64_t cols, std::int64_t ld) {
  auto created = std::make_unique<Layout>(Layout{type, rows, cols, ld});
  *layout = reinterpret_cast<cublasLtMatrixLayout_t>(created.release());
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  std::unique_ptr<Layout>(object<Layout>(layout)).reset();
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* preference) {
  auto created = std::make_unique<Preference>();
  *preference = reinterpret_cast<cublasLtMatmulPreference_t>(created.release());
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t preference) {
  std::unique_ptr<Preference>(object<Preference>(preference)).reset();
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t,
                                                    cublasLtMatmulPreferenceAttributes_t, const void*,
                                                    std::size_t) {
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t operation,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int* returned) {
  std::uint64_t m = 0, n = 0, k = 0;
  if (requested < 1 || !shape_of(*object<Descriptor>(operation), *object<Layout>(a), *object<Layout>(b),
                                 *object<Layout>(c), *object<Layout>(d), m, n, k))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (object<Descriptor>(operation)->epilogue == CUBLASLT_EPILOGUE_BIAS) {
    bool no_algorithm = false;
    const cublasStatus_t refusal = bias_epilogue_refusal(no_algorithm);
    if (refusal != CUBLAS_STATUS_SUCCESS) return refusal;
    if (no_algorithm) {
      *returned = 0;
      return CUBLAS_STATUS_SUCCESS;
    }
  }
  results[0] = cublasLtMatmulHeuristicResult_t{};
  results[0].state = CUBLAS_STATUS_SUCCESS;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t operation, const void* alpha,
                              const void* a, cublasLtMatrixLayout_t a_layout, const void* b,
                              cublasLtMatrixLayout_t b_layout, const void* beta, const void* c,
                              cublasLtMatrixLayout_t c_layout, void* d, cublasLtMatrixLayout_t d_layout,
                              const cublasLtMatmulAlgo_t*, void*, std::size_t, cudaStream_t stream) {
  // Copies: the descriptors may change or go before the matmul runs in its stream's order.
  const Descriptor desc = *object<Descriptor>(operation);
  const Layout la = *object<Layout>(a_layout), lb = *object<Layout>(b_layout), lc = *object<Layout>(c_layout),
               ld = *object<Layout>(d_layout);
  std::uint64_t m = 0, n = 0, k = 0;
  if (!shape_of(desc, la, lb, lc, ld, m, n, k)) return CUBLAS_STATUS_INVALID_VALUE;
  if (desc.epilogue == CUBLASLT_EPILOGUE_BIAS && desc.bias == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (desc.epilogue == CUBLASLT_EPILOGUE_BIAS && bias_epilogue_refused()) return CUBLAS_STATUS_NOT_SUPPORTED;
  const bool double_compute = desc.compute == CUBLAS_COMPUTE_64F;
  if (double_compute != (desc.scale == CUDA_R_64F)) return CUBLAS_STATUS_INVALID_VALUE;
  const double alpha_value =
      double_compute ? *static_cast<const double*>(alpha) : *static_cast<const float*>(alpha);
  const double beta_value =
      double_compute ? *static_cast<const double*>(beta) : *static_cast<const float*>(beta);
  // Alpha and beta are host scalars (the default pointer mode), read at the call as cuBLASLt does;
  // the product is device work in the stream's order.
  cuda_fibers::enqueue(stream, "cublasLtMatmul",
                       [=] { matmul(desc, la, lb, lc, ld, m, n, k, alpha_value, beta_value, a, b, c, d); });
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace zt::kernels::cuda::lt
