// cuDNN's fused (flash) attention through the backend graph API (kernels/cuda/cudnn_attention.hpp):
// the graphs below are the ones cudnn-frontend's SDPA nodes lower to for cuDNN 9.x (composite SDPA
// forward and backward, causal mask as gen_index/cmp_ge/binary_select, the softmax with its Stats
// output as max/sub/exp/sum/log/add/div), written here against cudnn_graph.h directly: cuDNN's
// heuristics recognise the pattern and give a fused flash-attention engine for it.
//
//   Tensors (as cuDNN sees them, [B, H, rows, columns], strides in elements; C = H * D):
//     Q, dQ     [B, H, T, D]  {T*3C, D, 3C, 1} at qkv (grad_qkv) + 0      read in place, no copies
//     K^T, V^T  [B, H, D, T]  {T*3C, D, 1, 3C} at qkv + C, + 2C            the same memory, transposed
//     V, dK, dV [B, H, T, D]  {T*3C, D, 3C, 1} at qkv + 2C (grad_qkv + C, + 2C)
//     O, dO     [B, H, T, D]  {T*C, D, C, 1}
//     Stats     [B, H, T, 1]  {H*T, T, 1, 1}   fp32: lse = max + log(sum exp), natural log
//   forward:  S = Q K^T (matmul), S *= scale (mul, by-value), causal mask (gen_index rows, gen_index
//             columns, cmp_ge, binary_select with -inf), M = max over rows (reduction), E = exp(S - M),
//             Z = sum E (reduction), Stats = M + log Z, P = E / Z (16-bit), O = P V (matmul).
//   backward: softmax_sum = rowsum(dO * O) (mul, reduction, mul by 1: an fp32 [B, H, T, 1] tensor in
//             our workspace, as cudnn-frontend makes it), P = exp(scale Q K^T - Stats) masked,
//             dV = P^T dO (reshape to the transpose, matmul), dP = dO V^T, dS = scale P (dP - softmax_sum),
//             dK = dS^T Q (reshape, matmul), dQ = dS K (K^T reshaped back, matmul).
//
// Determinism: cudnn-frontend's SDPA backward, asked for the deterministic algorithm (its comment: "on
// hopper"), builds exactly this graph, dQ written by the dS K matmul (the "dP workspace" variant), instead
// of its default one, which accumulates dQ in an fp32 workspace tensor (dQ_accum) across key tiles with
// atomics: not bitwise run-to-run deterministic. We build the deterministic graph only, and also skip any
// engine cuDNN marks CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC, forward or backward. On compute capability 10
// and 11 (Blackwell) cudnn-frontend also pins a particular engine and knobs for a deterministic backward,
// which we do not do: there the backward is refused (our own kernel runs, deterministic) and the forward
// is taken. So a gradient is meant to repeat its bits run to run (the plan cache fixes the engine per
// shape) — cudnn-frontend's choice, not yet checked on a GPU (unit.cudnn_attention checks it there).
//
// Plans: one per (device, dtype, B, T, H, D, direction), built on the first call of its key under a
// mutex (operation graph, then heuristics mode A, then FALLBACK, the first engine config whose
// execution plan finalizes) and kept for the process; a key cuDNN refuses (any status other than
// success while building, no engine, or an engine wanting more than kMaxWorkspaceBytes) is remembered
// as refused and never asked again. One cuDNN handle per device, guarded by a mutex; each call sets
// its stream on it (cudnnSetStream) and executes. The workspace comes from a StreamScratch on the
// call's stream. Only a failure after a plan finalized (the variant pack, the execution) throws.
#include "kernels/cuda/cudnn_attention.hpp"

// Without cuDNN's headers at build time (a CUDA toolkit without cuDNN) the stubs at the end refuse every
// call: our own kernel runs.
#if __has_include(<cudnn_graph.h>)

#include <cuda_runtime.h>
#include <cudnn_graph.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "base/never_destroyed.hpp"
#include "kernels/cuda/cuda_common.hpp"
#include "kernels/cuda/cudnn_library.hpp"
#include "kernels/cuda/stream_scratch.hpp"
#include "zerotrain/dtype.hpp"
#include "zerotrain/error.hpp"

namespace zt::kernels::cuda::cudnn {
namespace {

enum class Direction { forward, backward };

/// The oldest cuDNN each direction is taken with. The forward's operations are all in cuDNN 9.0; older
/// backwards need cudnn-frontend's workarounds, which we do not have (9.10.0/9.10.1: known wrong
/// results; up to 9.15: a padding mask added when T is not a multiple of 128).
constexpr std::size_t kOldestForwardVersion = 90000;
constexpr std::size_t kOldestBackwardVersion = 91600;
/// cudnn-frontend refuses 16-bit attention, both directions, on these (known bugs).
constexpr std::size_t kFirstBrokenVersion = 91000;
constexpr std::size_t kFirstFixedVersion = 91002;

/// Plans wanting more workspace than this are refused (the deterministic backward's dP workspace is
/// about B H T^2 2 bytes: 200 MB for GPT-2 small at batch 8, T 1024).
constexpr std::int64_t kMaxWorkspaceBytes = std::int64_t{4} << 30;

/// Alignment of every data pointer (the tensors declare it): 16 bytes, cudnn-frontend's default.
constexpr std::int64_t kAlignment = 16;

std::string version_text(std::size_t version) {
  return std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
         std::to_string(version % 100);
}

const char* direction_name(Direction direction) {
  return direction == Direction::forward ? "forward" : "backward";
}

/// "cuDNN attention backward (bf16, batch 4, seq_len 1024, n_head 12, head_dim 64)"
std::string describe(Direction direction, DType dtype, const AttentionShape& shape) {
  return detail::concat("cuDNN attention ", direction_name(direction), " (", dtype_name(dtype), ", batch ",
                        shape.batch, ", seq_len ", shape.seq_len, ", n_head ", shape.n_head, ", head_dim ",
                        shape.head_dim, ")");
}

/// "CUDNN_STATUS_NOT_SUPPORTED (3000): <cuDNN's last error message>"
std::string status_text(cudnnStatus_t status) {
  std::array<char, 1024> message{};
  dnn::cudnnGetLastErrorString(message.data(), message.size());
  std::string text = detail::concat(dnn::cudnnGetErrorString(status), " (", static_cast<int>(status), ")");
  if (message[0] != '\0') text += detail::concat(": ", message.data());
  return text;
}

// ---- switches and the library -------------------------------------------------------------------

/// ZT_CUDNN_ATTENTION: unset, empty or 1: on; 0: off; anything else: a ConfigError naming it. Read on
/// every call (getenv is cheap next to an attention), so that a test can switch it.
bool enabled_by_environment() {
  const char* value = std::getenv("ZT_CUDNN_ATTENTION");
  const std::string_view text = value == nullptr ? std::string_view() : std::string_view(value);
  if (text.empty() || text == "1") return true;
  if (text == "0") return false;
  ZT_THROW_AS(ConfigError, "ZT_CUDNN_ATTENTION='", text,
              "': expected 1 (cuDNN's fused attention for the 16-bit calls it takes, the default) or 0 (our "
              "own attention kernel for every call)");
}

/// The cuDNN version loaded, 0 when libcudnn does not load (tried once).
std::size_t loaded_version() {
  static const std::size_t version = dnn::loaded() ? dnn::cudnnGetVersion() : 0;
  return version;
}

/// Whether the call's arguments are ones cuDNN may take (before anything is loaded or asked).
bool call_supported(DType dtype, const AttentionShape& shape, Direction direction) {
  if (dtype != DType::bf16 && dtype != DType::fp16) return false;
  if (shape.batch <= 0 || shape.seq_len <= 0 || shape.n_head <= 0) return false;
  if (shape.head_dim <= 0 || shape.head_dim % 8 != 0 || shape.head_dim > 128) return false;
  // cudnn-frontend refuses the backward of T = 1 (s_q = s_kv = 1).
  if (direction == Direction::backward && shape.seq_len < 2) return false;
  return true;
}

bool aligned(const void* pointer) {
  return reinterpret_cast<std::uintptr_t>(pointer) % kAlignment == 0;
}

/// The last refusal, for attention_status().
std::mutex refusal_mutex;
std::string last_refusal;

void record_refusal(std::string reason) {
  const std::lock_guard lock(refusal_mutex);
  last_refusal = std::move(reason);
}

// ---- RAII for backend descriptors ---------------------------------------------------------------

struct DescriptorDestroyer {
  void operator()(void* descriptor) const noexcept { dnn::cudnnBackendDestroyDescriptor(descriptor); }
};
/// One backend descriptor (cudnnBackendDescriptor_t is a void*), destroyed with it.
using Descriptor = std::unique_ptr<void, DescriptorDestroyer>;

/// A failed cuDNN call while a graph or plan is built: cuDNN does not take this call's key.
struct Refusal {
  std::string reason;
};

void check(cudnnStatus_t status, std::string_view what) {
  if (status != CUDNN_STATUS_SUCCESS) throw Refusal{detail::concat(what, ": ", status_text(status))};
}

Descriptor create(cudnnBackendDescriptorType_t type) {
  cudnnBackendDescriptor_t created = nullptr;
  check(dnn::cudnnBackendCreateDescriptor(type, &created), "cudnnBackendCreateDescriptor");
  return Descriptor(created);
}

void set(cudnnBackendDescriptor_t descriptor, cudnnBackendAttributeName_t name,
         cudnnBackendAttributeType_t type, std::int64_t count, const void* elements) {
  const cudnnStatus_t status = dnn::cudnnBackendSetAttribute(descriptor, name, type, count, elements);
  // cuDNN has no names for its attributes at run time: the enumerators' values (cudnn_graph.h).
  if (status != CUDNN_STATUS_SUCCESS)
    check(status, detail::concat("cudnnBackendSetAttribute (attribute ", static_cast<int>(name), ", type ",
                                 static_cast<int>(type), ", ", count, " elements)"));
}
void set_descriptor(cudnnBackendDescriptor_t descriptor, cudnnBackendAttributeName_t name,
                    cudnnBackendDescriptor_t value) {
  set(descriptor, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value);
}
void finalize(cudnnBackendDescriptor_t descriptor, const char* what) {
  check(dnn::cudnnBackendFinalize(descriptor), what);
}

/// How many elements `descriptor`'s attribute `name` holds (asked with no array).
std::int64_t element_count(cudnnBackendDescriptor_t descriptor, cudnnBackendAttributeName_t name,
                           cudnnBackendAttributeType_t type, const char* what) {
  std::int64_t count = 0;
  check(dnn::cudnnBackendGetAttribute(descriptor, name, type, 0, &count, nullptr), what);
  return count;
}

/// Descriptors of one type for a descriptor-array attribute that cuDNN fills (cudnnBackendGetAttribute
/// writes into descriptors the caller made): the descriptors and their handles side by side.
struct DescriptorArray {
  std::vector<Descriptor> owned;
  std::vector<cudnnBackendDescriptor_t> handles;

  DescriptorArray(cudnnBackendDescriptorType_t type, std::int64_t count) {
    for (std::int64_t i = 0; i < count; ++i) {
      owned.push_back(create(type));
      handles.push_back(owned.back().get());
    }
  }
  /// Fills them from `descriptor`'s `name`; returns how many cuDNN filled.
  std::int64_t fill_from(cudnnBackendDescriptor_t descriptor, cudnnBackendAttributeName_t name,
                         const char* what) {
    std::int64_t filled = 0;
    check(dnn::cudnnBackendGetAttribute(descriptor, name, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                        static_cast<std::int64_t>(handles.size()), &filled, handles.data()),
          what);
    return std::clamp<std::int64_t>(filled, 0, static_cast<std::int64_t>(handles.size()));
  }
};

// ---- graphs -------------------------------------------------------------------------------------

/// Unique ids of the tensors the variant pack binds (the virtual ones are numbered from kFirstVirtual).
enum Uid : std::int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kGradOutput,
  kGradQ,
  kGradK,
  kGradV,
  kSoftmaxSum,
  kScale,
  kNegativeInfinity,
  kOne,
  kFirstVirtual = 100,
};

struct Layout {
  std::array<std::int64_t, 4> dims;
  std::array<std::int64_t, 4> strides;
};

/// The layouts of the table at the top for one shape.
struct Layouts {
  Layout qkv, qkv_transposed, output, rows, scores, scores_transposed, grad_output_times_output;

  explicit Layouts(const AttentionShape& s) {
    const std::int64_t b = s.batch, t = s.seq_len, h = s.n_head, d = s.head_dim, c = h * d;
    qkv = {{b, h, t, d}, {t * 3 * c, d, 3 * c, 1}};
    qkv_transposed = {{b, h, d, t}, {t * 3 * c, d, 1, 3 * c}};
    output = {{b, h, t, d}, {t * c, d, c, 1}};
    rows = {{b, h, t, 1}, {h * t, t, 1, 1}};
    scores = {{b, h, t, t}, {h * t * t, t * t, t, 1}};
    scores_transposed = {{b, h, t, t}, {h * t * t, t * t, 1, t}};
    grad_output_times_output = {{b, h, t, d}, {h * t * d, t * d, h * d, 1}};  // cudnn-frontend's (virtual)
  }
};

/// One pointwise operation: y = mode(x[, b[, t]]).
struct Pointwise {
  cudnnPointwiseMode_t mode;
  cudnnBackendDescriptor_t x;
  cudnnBackendDescriptor_t b = nullptr;
  cudnnBackendDescriptor_t t = nullptr;  // binary_select's condition
  cudnnDataType_t precision = CUDNN_DATA_FLOAT;
  std::int64_t axis = -1;  // gen_index's
};

/// A finalized execution plan and everything it was built from (kept alive with it).
struct Plan {
  std::vector<Descriptor> descriptors;
  cudnnBackendDescriptor_t plan = nullptr;
  std::int64_t workspace_bytes = 0;
  // The by-value scalars: the variant pack points at them.
  float scale = 1;
  float negative_infinity = -std::numeric_limits<float>::infinity();
  float one = 1;
};

/// Builds an operation graph: tensors and operations, in the order cudnn-frontend adds them.
class GraphBuilder {
 public:
  explicit GraphBuilder(cudnnHandle_t handle) : handle_(handle) {}

  /// A tensor the variant pack binds (16-byte aligned).
  cudnnBackendDescriptor_t tensor(Uid uid, const Layout& layout, cudnnDataType_t type) {
    return make_tensor(uid, layout, type, false, false);
  }
  /// An intermediate cuDNN keeps on chip.
  cudnnBackendDescriptor_t temporary(const Layout& layout, cudnnDataType_t type = CUDNN_DATA_FLOAT) {
    return make_tensor(next_virtual_++, layout, type, true, false);
  }
  /// An fp32 scalar passed by value (the variant pack points at a host float).
  cudnnBackendDescriptor_t scalar(Uid uid) {
    return make_tensor(uid, Layout{{1, 1, 1, 1}, {1, 1, 1, 1}}, CUDNN_DATA_FLOAT, false, true);
  }

  void pointwise(const Pointwise& op, cudnnBackendDescriptor_t y) {
    const cudnnBackendDescriptor_t descriptor = keep(create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR));
    set(descriptor, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &op.mode);
    set(descriptor, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &op.precision);
    if (op.mode == CUDNN_POINTWISE_GEN_INDEX)
      set(descriptor, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &op.axis);
    finalize(descriptor, "pointwise descriptor");
    const cudnnBackendDescriptor_t pointwise_operation =
        operation(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR,
                  {{CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, descriptor},
                   {CUDNN_ATTR_OPERATION_POINTWISE_XDESC, op.x}});
    if (op.b != nullptr) set_descriptor(pointwise_operation, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, op.b);
    if (op.t != nullptr) set_descriptor(pointwise_operation, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, op.t);
    set_descriptor(pointwise_operation, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    const float alpha = 1.0f;
    set(pointwise_operation, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &alpha);
    set(pointwise_operation, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &alpha);
    add_operation(pointwise_operation, "pointwise operation");
  }

  /// c = a b, batched over the first two dimensions, fp32 accumulation.
  void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    const cudnnBackendDescriptor_t descriptor =
        fp32_descriptor(CUDNN_BACKEND_MATMUL_DESCRIPTOR, CUDNN_ATTR_MATMUL_COMP_TYPE);
    finalize(descriptor, "matmul descriptor");
    add_operation(operation(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR,
                            {{CUDNN_ATTR_OPERATION_MATMUL_ADESC, a},
                             {CUDNN_ATTR_OPERATION_MATMUL_BDESC, b},
                             {CUDNN_ATTR_OPERATION_MATMUL_CDESC, c},
                             {CUDNN_ATTR_OPERATION_MATMUL_DESC, descriptor}}),
                  "matmul operation");
  }

  /// y = reduce(x) over the dimensions where y has extent 1, fp32.
  void reduction(cudnnReduceTensorOp_t reduce, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    const cudnnBackendDescriptor_t descriptor =
        fp32_descriptor(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, CUDNN_ATTR_REDUCTION_COMP_TYPE);
    set(descriptor, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &reduce);
    finalize(descriptor, "reduction descriptor");
    add_operation(operation(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR,
                            {{CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x},
                             {CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y},
                             {CUDNN_ATTR_OPERATION_REDUCTION_DESC, descriptor}}),
                  "reduction operation");
  }

  /// y = x with y's dims and strides (a transpose here).
  void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    add_operation(
        operation(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR,
                  {{CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x}, {CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y}}),
        "reshape operation");
  }

  // The same operations into a new temporary of `layout` (and `type`), returned.
  cudnnBackendDescriptor_t pointwise(const Pointwise& op, const Layout& layout,
                                     cudnnDataType_t type = CUDNN_DATA_FLOAT) {
    const cudnnBackendDescriptor_t y = temporary(layout, type);
    pointwise(op, y);
    return y;
  }
  cudnnBackendDescriptor_t matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                                  const Layout& layout) {
    const cudnnBackendDescriptor_t c = temporary(layout);
    matmul(a, b, c);
    return c;
  }
  cudnnBackendDescriptor_t reduction(cudnnReduceTensorOp_t reduce, cudnnBackendDescriptor_t x,
                                     const Layout& layout) {
    const cudnnBackendDescriptor_t y = temporary(layout);
    reduction(reduce, x, y);
    return y;
  }
  cudnnBackendDescriptor_t reshape(cudnnBackendDescriptor_t x, const Layout& layout, cudnnDataType_t type) {
    const cudnnBackendDescriptor_t y = temporary(layout, type);
    reshape(x, y);
    return y;
  }

  /// The causal mask: x where row >= column, else -inf (cudnn-frontend's top-left diagonal band with
  /// right bound 0).
  cudnnBackendDescriptor_t causal_mask(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t negative_infinity,
                                       const Layout& layout) {
    const cudnnBackendDescriptor_t row =
        pointwise({.mode = CUDNN_POINTWISE_GEN_INDEX, .x = x, .axis = 2}, layout, CUDNN_DATA_INT32);
    const cudnnBackendDescriptor_t column =
        pointwise({.mode = CUDNN_POINTWISE_GEN_INDEX, .x = x, .axis = 3}, layout, CUDNN_DATA_INT32);
    const cudnnBackendDescriptor_t keep_score =
        pointwise({.mode = CUDNN_POINTWISE_CMP_GE, .x = row, .b = column, .precision = CUDNN_DATA_BOOLEAN},
                  layout, CUDNN_DATA_BOOLEAN);
    return pointwise({.mode = CUDNN_POINTWISE_BINARY_SELECT, .x = x, .b = negative_infinity, .t = keep_score},
                     layout);
  }

  /// The operations added so far (each finalized by cuDNN when added).
  std::size_t operation_count() const { return operations_.size(); }

  /// The finalized operation graph of the operations added so far; with the builder's handle, or
  /// without one (cuDNN 9.8 and later: heuristics and plans then take device properties instead).
  cudnnBackendDescriptor_t operation_graph() {
    const cudnnBackendDescriptor_t graph = keep(create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR));
    set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
        static_cast<std::int64_t>(operations_.size()), operations_.data());
    if (handle_ != nullptr) set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_);
    finalize(graph, "operation graph");
    return graph;
  }

  /// The operation graph, then the first engine config of heuristics mode A (else FALLBACK) whose
  /// execution plan finalizes; throws Refusal when there is none.
  std::unique_ptr<Plan> build_plan() {
    auto plan = std::make_unique<Plan>();
    const cudnnBackendDescriptor_t graph = operation_graph();

    std::string tried;
    for (const cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
      const char* mode_name = mode == CUDNN_HEUR_MODE_A ? "heuristics mode A" : "heuristics FALLBACK";
      try {
        if (try_engines(graph, mode, *plan, tried, mode_name)) {
          plan->descriptors = std::move(descriptors_);
          return plan;
        }
      } catch (const Refusal& refusal) {
        tried += detail::concat(tried.empty() ? "" : "; ", mode_name, ": ", refusal.reason);
      }
    }
    throw Refusal{"no engine takes the graph (" + (tried.empty() ? std::string("no configs") : tried) + ")"};
  }

 private:
  cudnnBackendDescriptor_t keep(Descriptor descriptor) {
    descriptors_.push_back(std::move(descriptor));
    return descriptors_.back().get();
  }

  cudnnBackendDescriptor_t make_tensor(std::int64_t uid, const Layout& layout, cudnnDataType_t type,
                                       bool is_virtual, bool by_value) {
    const cudnnBackendDescriptor_t tensor = keep(create(CUDNN_BACKEND_TENSOR_DESCRIPTOR));
    set(tensor, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    set(tensor, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, layout.dims.data());
    set(tensor, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, layout.strides.data());
    set(tensor, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    set(tensor, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &kAlignment);
    set(tensor, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
    if (by_value) set(tensor, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
    finalize(tensor, "tensor descriptor");
    return tensor;
  }

  /// A matmul or reduction descriptor computing in fp32 (not finalized).
  cudnnBackendDescriptor_t fp32_descriptor(cudnnBackendDescriptorType_t type,
                                           cudnnBackendAttributeName_t compute_attribute) {
    const cudnnBackendDescriptor_t descriptor = keep(create(type));
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    set(descriptor, compute_attribute, CUDNN_TYPE_DATA_TYPE, 1, &compute);
    return descriptor;
  }

  /// An operation descriptor of `type` with its descriptor-valued attributes set (not finalized).
  cudnnBackendDescriptor_t operation(
      cudnnBackendDescriptorType_t type,
      std::initializer_list<std::pair<cudnnBackendAttributeName_t, cudnnBackendDescriptor_t>> attributes) {
    const cudnnBackendDescriptor_t created = keep(create(type));
    for (const auto& [name, value] : attributes) set_descriptor(created, name, value);
    return created;
  }

  void add_operation(cudnnBackendDescriptor_t operation, const char* what) {
    finalize(operation, what);
    operations_.push_back(operation);
  }

  /// Whether the engine carries CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC (false when it cannot be read).
  static bool nondeterministic(cudnnBackendDescriptor_t config) {
    const Descriptor engine = create(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    cudnnBackendDescriptor_t engine_handle = engine.get();
    std::int64_t count = 0;
    if (dnn::cudnnBackendGetAttribute(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                      &count, &engine_handle) != CUDNN_STATUS_SUCCESS)
      return false;
    std::array<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT> notes{};
    if (dnn::cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
                                      CUDNN_TYPE_NUMERICAL_NOTE, static_cast<std::int64_t>(notes.size()),
                                      &count, notes.data()) != CUDNN_STATUS_SUCCESS)
      return false;
    count = std::clamp<std::int64_t>(count, 0, static_cast<std::int64_t>(notes.size()));
    return std::find(notes.begin(), notes.begin() + count, CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) !=
           notes.begin() + count;
  }

  /// The heuristics' engine configs in order; the first deterministic one whose plan finalizes and
  /// fits kMaxWorkspaceBytes goes into `plan`. Appends why each config was passed over to `tried`.
  bool try_engines(cudnnBackendDescriptor_t graph, cudnnBackendHeurMode_t mode, Plan& plan,
                   std::string& tried, const char* mode_name) {
    Descriptor heuristics = create(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    set_descriptor(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
    set(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    finalize(heuristics.get(), "engine heuristics");
    const std::int64_t available =
        element_count(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                      "engine heuristics' result count");
    if (available <= 0) {
      tried += detail::concat(tried.empty() ? "" : "; ", mode_name, ": no engine configs");
      return false;
    }
    DescriptorArray configs(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, available);
    const std::int64_t returned =
        configs.fill_from(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, "engine heuristics' results");
    std::int64_t skipped_nondeterministic = 0, not_finalized = 0, too_large = 0;
    for (std::int64_t i = 0; i < returned; ++i) {
      const cudnnBackendDescriptor_t config = configs.handles[static_cast<std::size_t>(i)];
      if (nondeterministic(config)) {
        ++skipped_nondeterministic;
        continue;
      }
      Descriptor execution = create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      set(execution.get(), CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_);
      set_descriptor(execution.get(), CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config);
      if (dnn::cudnnBackendFinalize(execution.get()) != CUDNN_STATUS_SUCCESS) {
        ++not_finalized;
        continue;
      }
      std::int64_t workspace = 0, count = 0;
      check(dnn::cudnnBackendGetAttribute(execution.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                          CUDNN_TYPE_INT64, 1, &count, &workspace),
            "execution plan's workspace size");
      if (workspace > kMaxWorkspaceBytes) {
        ++too_large;
        continue;
      }
      plan.workspace_bytes = std::max<std::int64_t>(workspace, 0);
      plan.plan = execution.get();
      keep(std::move(configs.owned[static_cast<std::size_t>(i)]));
      keep(std::move(execution));
      keep(std::move(heuristics));
      return true;
    }
    tried += detail::concat(tried.empty() ? "" : "; ", mode_name, ": ", returned, " engine configs, ",
                            skipped_nondeterministic, " nondeterministic, ", not_finalized,
                            " whose plan did not finalize, ", too_large, " wanting more than ",
                            kMaxWorkspaceBytes, " bytes of workspace");
    return false;
  }

  cudnnHandle_t handle_;
  std::int64_t next_virtual_ = kFirstVirtual;
  std::vector<Descriptor> descriptors_;
  std::vector<cudnnBackendDescriptor_t> operations_;
};

cudnnDataType_t io_type(DType dtype) {
  return dtype == DType::bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
}

/// The tensors both graphs bind: Q, K^T, O, the Stats, and the scalars.
struct CommonTensors {
  cudnnBackendDescriptor_t q, k_transposed, o, stats, scale, negative_infinity;

  CommonTensors(GraphBuilder& graph, const Layouts& layouts, cudnnDataType_t io)
      : q(graph.tensor(kQ, layouts.qkv, io)),
        k_transposed(graph.tensor(kK, layouts.qkv_transposed, io)),
        o(graph.tensor(kO, layouts.output, io)),
        stats(graph.tensor(kStats, layouts.rows, CUDNN_DATA_FLOAT)),
        scale(graph.scalar(kScale)),
        negative_infinity(graph.scalar(kNegativeInfinity)) {}

  /// scale Q K^T: the scores both graphs start from.
  cudnnBackendDescriptor_t scaled_scores(GraphBuilder& graph, const Layouts& layouts) const {
    const cudnnBackendDescriptor_t scores = graph.matmul(q, k_transposed, layouts.scores);
    return graph.pointwise({.mode = CUDNN_POINTWISE_MUL, .x = scores, .b = scale}, layouts.scores);
  }
};

void build_forward(GraphBuilder& graph, const Layouts& layouts, cudnnDataType_t io) {
  const CommonTensors t(graph, layouts, io);
  const cudnnBackendDescriptor_t v = graph.tensor(kV, layouts.qkv, io);

  const cudnnBackendDescriptor_t masked =
      graph.causal_mask(t.scaled_scores(graph, layouts), t.negative_infinity, layouts.scores);
  // The softmax with its Stats, as cudnn-frontend's composite softmax.
  const cudnnBackendDescriptor_t row_max = graph.reduction(CUDNN_REDUCE_TENSOR_MAX, masked, layouts.rows);
  const cudnnBackendDescriptor_t exps = graph.pointwise(
      {.mode = CUDNN_POINTWISE_EXP,
       .x = graph.pointwise({.mode = CUDNN_POINTWISE_SUB, .x = masked, .b = row_max}, layouts.scores)},
      layouts.scores);
  const cudnnBackendDescriptor_t row_sum = graph.reduction(CUDNN_REDUCE_TENSOR_ADD, exps, layouts.rows);
  const cudnnBackendDescriptor_t log_sum =
      graph.pointwise({.mode = CUDNN_POINTWISE_LOG, .x = row_sum}, layouts.rows);
  graph.pointwise({.mode = CUDNN_POINTWISE_ADD, .x = row_max, .b = log_sum}, t.stats);
  const cudnnBackendDescriptor_t probabilities =
      graph.pointwise({.mode = CUDNN_POINTWISE_DIV, .x = exps, .b = row_sum}, layouts.scores, io);
  graph.matmul(probabilities, v, t.o);
}

void build_backward(GraphBuilder& graph, const Layouts& layouts, cudnnDataType_t io) {
  const CommonTensors t(graph, layouts, io);
  const cudnnBackendDescriptor_t v_transposed = graph.tensor(kV, layouts.qkv_transposed, io);
  const cudnnBackendDescriptor_t grad_output = graph.tensor(kGradOutput, layouts.output, io);
  const cudnnBackendDescriptor_t grad_q = graph.tensor(kGradQ, layouts.qkv, io);
  const cudnnBackendDescriptor_t grad_k = graph.tensor(kGradK, layouts.qkv, io);
  const cudnnBackendDescriptor_t grad_v = graph.tensor(kGradV, layouts.qkv, io);
  const cudnnBackendDescriptor_t softmax_sum = graph.tensor(kSoftmaxSum, layouts.rows, CUDNN_DATA_FLOAT);
  const cudnnBackendDescriptor_t one = graph.scalar(kOne);

  // softmax_sum = rowsum(dO * O) (= rowsum(P * dP)).
  const cudnnBackendDescriptor_t products = graph.pointwise(
      {.mode = CUDNN_POINTWISE_MUL, .x = grad_output, .b = t.o}, layouts.grad_output_times_output);
  const cudnnBackendDescriptor_t row_sums = graph.reduction(CUDNN_REDUCE_TENSOR_ADD, products, layouts.rows);
  graph.pointwise({.mode = CUDNN_POINTWISE_MUL, .x = row_sums, .b = one}, softmax_sum);

  // P = exp(scale Q K^T - Stats), causal; dV = P^T dO.
  const cudnnBackendDescriptor_t shifted = graph.pointwise(
      {.mode = CUDNN_POINTWISE_SUB, .x = t.scaled_scores(graph, layouts), .b = t.stats}, layouts.scores);
  const cudnnBackendDescriptor_t probabilities = graph.pointwise(
      {.mode = CUDNN_POINTWISE_EXP, .x = graph.causal_mask(shifted, t.negative_infinity, layouts.scores)},
      layouts.scores);
  graph.matmul(graph.reshape(probabilities, layouts.scores_transposed, io), grad_output, grad_v);

  // dS = scale P (dO V^T - softmax_sum); dK = dS^T Q.
  const cudnnBackendDescriptor_t grad_probabilities = graph.matmul(grad_output, v_transposed, layouts.scores);
  const cudnnBackendDescriptor_t centered = graph.pointwise(
      {.mode = CUDNN_POINTWISE_SUB, .x = grad_probabilities, .b = softmax_sum}, layouts.scores);
  const cudnnBackendDescriptor_t unscaled =
      graph.pointwise({.mode = CUDNN_POINTWISE_MUL, .x = centered, .b = probabilities}, layouts.scores);
  const cudnnBackendDescriptor_t grad_scores =
      graph.pointwise({.mode = CUDNN_POINTWISE_MUL, .x = unscaled, .b = t.scale}, layouts.scores);
  graph.matmul(graph.reshape(grad_scores, layouts.scores_transposed, io), t.q, grad_k);

  // dQ = dS K, written by the matmul itself (the deterministic graph; see the top). K's view is a
  // virtual tensor of the intermediate type, fp32, as cudnn-frontend's "reshape_k" (its type unset,
  // filled from the context); only the views feeding dV and dK are declared in the I/O type.
  graph.matmul(grad_scores, graph.reshape(t.k_transposed, layouts.qkv, CUDNN_DATA_FLOAT), grad_q);
}

void build(Direction direction, GraphBuilder& graph, const AttentionShape& shape, DType dtype) {
  const Layouts layouts(shape);
  if (direction == Direction::forward)
    build_forward(graph, layouts, io_type(dtype));
  else
    build_backward(graph, layouts, io_type(dtype));
}

// ---- without a device: which engines take a graph -----------------------------------------------

/// A knob's type and its range of values.
struct KnobRange {
  cudnnBackendKnobType_t type;
  std::int64_t minimum, maximum;
};

std::vector<KnobRange> knob_ranges(cudnnBackendDescriptor_t engine) {
  DescriptorArray infos(CUDNN_BACKEND_KNOB_INFO_DESCRIPTOR, CUDNN_KNOB_TYPE_COUNTS);
  const std::int64_t count = infos.fill_from(engine, CUDNN_ATTR_ENGINE_KNOB_INFO, "engine's knob info");
  std::vector<KnobRange> ranges;
  for (std::int64_t i = 0; i < count; ++i) {
    KnobRange range{};
    std::int64_t elements = 0;
    const cudnnBackendDescriptor_t info = infos.handles[static_cast<std::size_t>(i)];
    check(dnn::cudnnBackendGetAttribute(info, CUDNN_ATTR_KNOB_INFO_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &elements,
                                        &range.type),
          "knob's type");
    check(dnn::cudnnBackendGetAttribute(info, CUDNN_ATTR_KNOB_INFO_MINIMUM_VALUE, CUDNN_TYPE_INT64, 1,
                                        &elements, &range.minimum),
          "knob's minimum");
    check(dnn::cudnnBackendGetAttribute(info, CUDNN_ATTR_KNOB_INFO_MAXIMUM_VALUE, CUDNN_TYPE_INT64, 1,
                                        &elements, &range.maximum),
          "knob's maximum");
    ranges.push_back(range);
  }
  return ranges;
}

/// Whether the engine config of `engine` with these knob values finalizes, or stops only for want of
/// the driver (CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING: cuDNN compiles the engine's
/// kernel for the graph once the engine has accepted it, and without a GPU there is no driver to
/// compile with). Any other status is the engine refusing the graph, the shape or the device.
bool config_accepted(cudnnBackendDescriptor_t engine, const std::vector<KnobRange>& ranges,
                     const std::vector<std::int64_t>& values) {
  std::vector<Descriptor> choices;
  std::vector<cudnnBackendDescriptor_t> choice_handles;
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    choices.push_back(create(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR));
    set(choices.back().get(), CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &ranges[i].type);
    set(choices.back().get(), CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &values[i]);
    finalize(choices.back().get(), "knob choice");
    choice_handles.push_back(choices.back().get());
  }
  const Descriptor config = create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
  set_descriptor(config.get(), CUDNN_ATTR_ENGINECFG_ENGINE, engine);
  if (!choice_handles.empty())
    set(config.get(), CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR,
        static_cast<std::int64_t>(choice_handles.size()), choice_handles.data());
  const cudnnStatus_t status = dnn::cudnnBackendFinalize(config.get());
  return status == CUDNN_STATUS_SUCCESS || status == CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING;
}

/// The global indices of the engines that accept `graph` on the device `properties` describes, with at
/// least one of their knob settings (all of them are tried: the heuristics, which would pick them, drop
/// every config whose kernel cannot be compiled, so without a driver they return none).
std::vector<std::int64_t> engines_taking(cudnnBackendDescriptor_t graph,
                                         cudnnBackendDescriptor_t properties) {
  /// More settings than this on one engine are not tried beyond it (ours have at most 3 x 37).
  constexpr std::int64_t kMaxSettingsPerEngine = 4096;
  std::int64_t engine_count = 0, elements = 0;
  check(dnn::cudnnBackendGetAttribute(graph, CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT, CUDNN_TYPE_INT64,
                                      1, &elements, &engine_count),
        "operation graph's engine count");
  std::vector<std::int64_t> taking;
  for (std::int64_t index = 0; index < engine_count; ++index) {
    const Descriptor engine = create(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    set_descriptor(engine.get(), CUDNN_ATTR_ENGINE_OPERATION_GRAPH, graph);
    set(engine.get(), CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &index);
    set_descriptor(engine.get(), CUDNN_ATTR_ENGINE_DEVICEPROP, properties);
    if (dnn::cudnnBackendFinalize(engine.get()) != CUDNN_STATUS_SUCCESS) continue;
    const std::vector<KnobRange> ranges = knob_ranges(engine.get());
    std::vector<std::int64_t> values;
    for (const KnobRange& range : ranges) values.push_back(range.minimum);
    // Every combination of knob values, the first knob fastest.
    for (std::int64_t tried = 0; tried < kMaxSettingsPerEngine; ++tried) {
      if (config_accepted(engine.get(), ranges, values)) {
        taking.push_back(index);
        break;
      }
      std::size_t knob = 0;
      for (; knob < ranges.size(); ++knob) {
        if (++values[knob] <= ranges[knob].maximum) break;
        values[knob] = ranges[knob].minimum;
      }
      if (knob == ranges.size()) break;
    }
  }
  return taking;
}

/// The first version with device properties (deviceless heuristics and plans).
constexpr std::size_t kOldestDevicelessVersion = 90800;

// ---- handles and the plan cache -----------------------------------------------------------------

struct HandleDestroyer {
  void operator()(cudnnHandle_t handle) const noexcept { dnn::cudnnDestroy(handle); }
};

/// A device's cuDNN handle (null, with why, when cudnnCreate failed: remembered) and its compute
/// capability. The mutex orders cudnnSetStream and the execution of each call.
struct DeviceContext {
  std::unique_ptr<cudnnContext, HandleDestroyer> handle;
  std::string error;
  int compute_major = 0;
  std::mutex mutex;
};

DeviceContext& device_context(int device) {
  static std::mutex mutex;
  static base::NeverDestroyed<std::map<int, std::unique_ptr<DeviceContext>>> contexts;
  const std::lock_guard lock(mutex);
  std::unique_ptr<DeviceContext>& context = (*contexts)[device];
  if (!context) {
    context = std::make_unique<DeviceContext>();
    ZT_CHECK_CUDA(cudaDeviceGetAttribute(&context->compute_major, cudaDevAttrComputeCapabilityMajor, device));
    cudnnHandle_t created = nullptr;
    const cudnnStatus_t status = dnn::cudnnCreate(&created);
    if (status == CUDNN_STATUS_SUCCESS) {
      context->handle.reset(created);
    } else {
      context->error = detail::concat("cudnnCreate on cuda:", device, " failed: ", status_text(status));
      record_refusal(context->error);
    }
  }
  return *context;
}

struct PlanKey {
  int device = 0;
  DType dtype = DType::bf16;
  std::int64_t batch = 0, seq_len = 0, n_head = 0, head_dim = 0;
  Direction direction = Direction::forward;

  auto tied() const { return std::tie(device, dtype, batch, seq_len, n_head, head_dim, direction); }
  friend bool operator<(const PlanKey& left, const PlanKey& right) { return left.tied() < right.tied(); }
};

/// The plan for `key`, made on first use; null (remembered) when cuDNN refuses the key.
const Plan* find_plan(const PlanKey& key, const AttentionShape& shape, cudnnHandle_t handle) {
  static std::mutex mutex;
  static base::NeverDestroyed<std::map<PlanKey, std::unique_ptr<Plan>>> plans;
  const std::lock_guard lock(mutex);
  const auto found = plans->find(key);
  if (found != plans->end()) return found->second.get();
  std::unique_ptr<Plan> plan;
  try {
    GraphBuilder graph(handle);
    build(key.direction, graph, shape, key.dtype);
    plan = graph.build_plan();
    plan->scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(shape.head_dim)));
    // The masked scores' value: -inf, or the lowest float before cuDNN 9.10 (cudnn-frontend's choice).
    if (loaded_version() < 91000) plan->negative_infinity = std::numeric_limits<float>::lowest();
  } catch (const Refusal& refusal) {
    record_refusal(detail::concat(describe(key.direction, key.dtype, shape), " on cuda:", key.device, ": ",
                                  refusal.reason));
    plan.reset();
  }
  return plans->emplace(key, std::move(plan)).first->second.get();
}

/// One tensor the variant pack binds: its uid and address.
struct Binding {
  std::int64_t uid;
  void* data;
};

[[noreturn]] void throw_execution_error(Direction direction, DType dtype, const AttentionShape& shape,
                                        const char* call, cudnnStatus_t status) {
  ZT_THROW_AS(CudaError, describe(direction, dtype, shape), ": ", call, " failed: ", status_text(status));
}

/// Whether cuDNN `version` (0: not loaded) is taken for `direction` at all.
bool version_takes(Direction direction, std::size_t version) {
  if (version == 0) return false;
  if (version < (direction == Direction::forward ? kOldestForwardVersion : kOldestBackwardVersion))
    return false;
  return version < kFirstBrokenVersion || version >= kFirstFixedVersion;
}

/// Runs a call that call_supported() accepted through cuDNN when it takes it; false (nothing written)
/// otherwise. `bindings` are the call's tensors, without the scalars and the workspace's softmax_sum.
bool run(Direction direction, DType dtype, const AttentionShape& shape, std::vector<Binding> bindings,
         void* native_stream) {
  if (!enabled_by_environment() || !version_takes(direction, loaded_version())) return false;
  for (const Binding& binding : bindings)
    if (!aligned(binding.data)) return false;

  const cudaStream_t stream = as_cuda_stream(native_stream);
  const int device = stream_device(stream);
  const CurrentDeviceScope current(device);
  DeviceContext& context = device_context(device);
  if (!context.handle) return false;
  // Blackwell: no deterministic backward without cudnn-frontend's engine pinning (see the top).
  if (direction == Direction::backward && (context.compute_major == 10 || context.compute_major == 11))
    return false;
  // The handle is one thread's at a time (cuDNN's rule): the plan's finalization below uses it too.
  // Lock order: the context's, then the plan cache's.
  const std::lock_guard lock(context.mutex);
  const PlanKey key{device, dtype, shape.batch, shape.seq_len, shape.n_head, shape.head_dim, direction};
  const Plan* plan = find_plan(key, shape, context.handle.get());
  if (plan == nullptr) return false;

  // The workspace: the engine's, then (backward) the fp32 softmax_sum [B, H, T] at a 256-byte offset.
  const std::size_t engine_bytes = (static_cast<std::size_t>(plan->workspace_bytes) + 255) / 256 * 256;
  const std::size_t softmax_sum_bytes =
      direction == Direction::backward
          ? static_cast<std::size_t>(shape.batch * shape.n_head * shape.seq_len) * sizeof(float)
          : 0;
  const StreamScratch workspace(engine_bytes + softmax_sum_bytes, stream, "the cuDNN attention workspace");
  if (softmax_sum_bytes > 0) bindings.push_back({kSoftmaxSum, workspace.as<void>(engine_bytes)});
  bindings.push_back({kScale, const_cast<float*>(&plan->scale)});
  bindings.push_back({kNegativeInfinity, const_cast<float*>(&plan->negative_infinity)});
  if (direction == Direction::backward) bindings.push_back({kOne, const_cast<float*>(&plan->one)});
  std::vector<std::int64_t> uids;
  std::vector<void*> pointers;
  for (const Binding& binding : bindings) {
    uids.push_back(binding.uid);
    pointers.push_back(binding.data);
  }
  void* workspace_data = plan->workspace_bytes > 0 ? workspace.as<void>() : nullptr;

  cudnnBackendDescriptor_t pack_handle = nullptr;
  cudnnStatus_t status =
      dnn::cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack_handle);
  if (status != CUDNN_STATUS_SUCCESS)
    throw_execution_error(direction, dtype, shape, "cudnnBackendCreateDescriptor (variant pack)", status);
  const Descriptor pack(pack_handle);
  const auto set_pack = [&](cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                            std::int64_t size, const void* elements) {
    const cudnnStatus_t set_status = dnn::cudnnBackendSetAttribute(pack.get(), name, type, size, elements);
    if (set_status != CUDNN_STATUS_SUCCESS)
      throw_execution_error(direction, dtype, shape, "cudnnBackendSetAttribute (variant pack)", set_status);
  };
  const auto count = static_cast<std::int64_t>(uids.size());
  set_pack(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, count, uids.data());
  set_pack(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, count, pointers.data());
  set_pack(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace_data);
  status = dnn::cudnnBackendFinalize(pack.get());
  if (status != CUDNN_STATUS_SUCCESS)
    throw_execution_error(direction, dtype, shape, "cudnnBackendFinalize (variant pack)", status);

  status = dnn::cudnnSetStream(context.handle.get(), stream);
  if (status != CUDNN_STATUS_SUCCESS)
    throw_execution_error(direction, dtype, shape, "cudnnSetStream", status);
  status = dnn::cudnnBackendExecute(context.handle.get(), plan->plan, pack.get());
  if (status != CUDNN_STATUS_SUCCESS)
    throw_execution_error(direction, dtype, shape, "cudnnBackendExecute", status);
  return true;
}

/// `elements` 16-bit elements past `data` (bf16 and fp16 only: call_supported() came first).
void* offset(const void* data, std::int64_t elements) {
  return const_cast<char*>(static_cast<const char*>(data)) + elements * 2;
}

}  // namespace

bool attention_forward(DType dtype, const void* qkv, void* output, void* row_logsumexp,
                       const AttentionShape& shape, void* stream) {
  if (!call_supported(dtype, shape, Direction::forward)) return false;
  const std::int64_t channels = shape.n_head * shape.head_dim;
  return run(Direction::forward, dtype, shape,
             {{kQ, const_cast<void*>(qkv)},
              {kK, offset(qkv, channels)},
              {kV, offset(qkv, 2 * channels)},
              {kO, output},
              {kStats, row_logsumexp}},
             stream);
}

bool attention_backward(DType dtype, const void* grad_output, const void* qkv, const void* output,
                        const void* row_logsumexp, void* grad_qkv, const AttentionShape& shape,
                        void* stream) {
  if (!call_supported(dtype, shape, Direction::backward)) return false;
  const std::int64_t channels = shape.n_head * shape.head_dim;
  return run(Direction::backward, dtype, shape,
             {{kQ, const_cast<void*>(qkv)},
              {kK, offset(qkv, channels)},
              {kV, offset(qkv, 2 * channels)},
              {kO, const_cast<void*>(output)},
              {kStats, const_cast<void*>(row_logsumexp)},
              {kGradOutput, const_cast<void*>(grad_output)},
              {kGradQ, grad_qkv},
              {kGradK, offset(grad_qkv, channels)},
              {kGradV, offset(grad_qkv, 2 * channels)}},
             stream);
}

GraphCheck check_graphs_without_device(DType dtype, const AttentionShape& shape,
                                       std::string_view device_properties_json) {
  ZT_CHECK(dtype == DType::bf16 || dtype == DType::fp16,
           "cuDNN attention graphs are built for bf16 and fp16, not ", dtype_name(dtype));
  if (!dnn::loaded()) ZT_THROW_AS(CudaError, dnn::load_error());
  const std::size_t version = loaded_version();
  if (!device_properties_json.empty() && version < kOldestDevicelessVersion)
    ZT_THROW_AS(CudaError, "cuDNN ", version_text(version), " has no device properties (cuDNN ",
                version_text(kOldestDevicelessVersion),
                " or later): the engines cannot be asked without a GPU");
  Descriptor properties;
  GraphCheck check;
  for (const Direction direction : {Direction::forward, Direction::backward}) {
    GraphDirectionCheck& result = direction == Direction::forward ? check.forward : check.backward;
    GraphBuilder graph(nullptr);
    try {
      build(direction, graph, shape, dtype);
      result.operations = graph.operation_count();
      // Before 9.8 an operation graph needs a handle, hence a GPU.
      if (version < kOldestDevicelessVersion) continue;
      const cudnnBackendDescriptor_t operation_graph = graph.operation_graph();
      if (device_properties_json.empty()) continue;
      if (!properties) {
        properties = create(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR);
        // The JSON as a NUL-terminated char array (cuDNN parses it at finalization).
        const std::string json(device_properties_json);
        set(properties.get(), CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
            static_cast<std::int64_t>(json.size() + 1), json.c_str());
        finalize(properties.get(), "device properties (the JSON given)");
      }
      result.engines_taking = engines_taking(operation_graph, properties.get());
    } catch (const Refusal& refusal) {
      ZT_THROW_AS(CudaError, describe(direction, dtype, shape), ": cuDNN ", version_text(version),
                  " refused ", refusal.reason);
    }
  }
  return check;
}

std::string device_properties_json(int device) {
  if (!dnn::loaded()) ZT_THROW_AS(CudaError, dnn::load_error());
  const std::size_t version = loaded_version();
  if (version < kOldestDevicelessVersion)
    ZT_THROW_AS(CudaError, "cuDNN ", version_text(version), " has no device properties (cuDNN ",
                version_text(kOldestDevicelessVersion), " or later)");
  try {
    const Descriptor properties = create(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR);
    const std::int32_t id = device;
    set(properties.get(), CUDNN_ATTR_DEVICEPROP_DEVICE_ID, CUDNN_TYPE_INT32, 1, &id);
    finalize(properties.get(), "device properties (read from the device)");
    std::int64_t size = element_count(properties.get(), CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION,
                                      CUDNN_TYPE_CHAR, "device properties' JSON size");
    std::string json(static_cast<std::size_t>(std::max<std::int64_t>(size, 0)), '\0');
    check(dnn::cudnnBackendGetAttribute(properties.get(), CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION,
                                        CUDNN_TYPE_CHAR, size, &size, json.data()),
          "device properties' JSON");
    json.resize(std::strlen(json.c_str()));
    return json;
  } catch (const Refusal& refusal) {
    ZT_THROW_AS(CudaError, "cuDNN ", version_text(version), " on cuda:", device, ": ", refusal.reason);
  }
}

TakenDirections taken_directions() {
  if (!dnn::loaded() || !enabled_by_environment()) return {};
  const std::size_t version = loaded_version();
  return {version_takes(Direction::forward, version), version_takes(Direction::backward, version)};
}

std::string attention_status() {
  if (!dnn::loaded()) return "not used: " + dnn::load_error() + "; our own attention kernel runs";
  const std::size_t version = loaded_version();
  std::string text = detail::concat("cuDNN ", version_text(version), " (", dnn::soname(), ")");
  bool enabled = false;
  try {
    enabled = enabled_by_environment();
  } catch (const Error& error) {
    return text + ": " + error.what();
  }
  if (!enabled) return text + ": fused attention off (ZT_CUDNN_ATTENTION=0); our own attention kernel runs";
  if (version < kOldestForwardVersion)
    return text + ": older than " + version_text(kOldestForwardVersion) + "; our own attention kernel runs";
  if (version >= kFirstBrokenVersion && version < kFirstFixedVersion)
    return text + ": known wrong 16-bit attention (cudnn-frontend refuses " +
           version_text(kFirstBrokenVersion) + " and " + version_text(kFirstBrokenVersion + 1) +
           "); our own attention kernel runs";
  text += ": fused attention for bf16/fp16, head_dim a multiple of 8 up to 128 (forward";
  text +=
      version < kOldestBackwardVersion
          ? "; backward needs cuDNN " + version_text(kOldestBackwardVersion) + " or later)"
          : std::string(" and backward, deterministic graph; backward refused on compute capability 10/11)");
  text += "; ZT_CUDNN_ATTENTION=0 turns it off";
  const std::lock_guard lock(refusal_mutex);
  if (!last_refusal.empty()) text += "; last refusal: " + last_refusal;
  return text;
}

}  // namespace zt::kernels::cuda::cudnn

#else  // no cudnn_graph.h

namespace zt::kernels::cuda::cudnn {

bool attention_forward(DType, const void*, void*, void*, const AttentionShape&, void*) {
  return false;
}
bool attention_backward(DType, const void*, const void*, const void*, const void*, void*,
                        const AttentionShape&, void*) {
  return false;
}
GraphCheck check_graphs_without_device(DType, const AttentionShape&, std::string_view) {
  ZT_THROW_AS(CudaError, "cuDNN attention graphs: no cuDNN headers (cudnn_graph.h) when zerotrain was built");
}
std::string device_properties_json(int) {
  ZT_THROW_AS(CudaError,
              "cuDNN device properties: no cuDNN headers (cudnn_graph.h) when zerotrain was built");
}
TakenDirections taken_directions() {
  return {};
}
std::string attention_status() {
  return "not compiled: no cuDNN headers (cudnn_graph.h) when zerotrain was built; our own attention kernel "
         "runs";
}

}  // namespace zt::kernels::cuda::cudnn

#endif
