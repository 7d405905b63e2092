// cuDNN's fused scaled-dot-product attention (flash attention), through cuDNN's backend graph API,
// with the attention contract of kernels/nn_kernels.hpp: causal, scale 1/sqrt(head_dim), q/k/v read
// in place from qkv [B, T, 3C], output [B, T, C], the rows' log-sum-exps [B, n_head, T] (fp32: cuDNN's
// "Stats") saved, grad_qkv [B, T, 3C] overwritten. libcudnn is loaded when the first call needs it
// (dlopen, like cuBLASLt: kernels/cuda/cublaslt_library.hpp), never linked.
//
// Each call returns whether cuDNN took it; false means it wrote nothing and our own kernel
// (kernels/cuda/attention.cu) must run. cuDNN takes a call when: the dtype is bf16 or fp16, head_dim
// is a multiple of 8 and at most 128, batch >= 1 (and seq_len >= 2 for the backward), every pointer is
// 16-byte aligned, ZT_CUDNN_ATTENTION is not "0" (a value other than "", "0" or "1" throws
// zt::ConfigError), libcudnn.so.<major> loads (cuDNN >= 9.0 for the forward, >= 9.16 for the
// backward; neither on 9.10.0 and 9.10.1, which cudnn-frontend refuses for known bugs), a cuDNN handle is
// made on the stream's device, the device is not a Blackwell one (compute capability 10 or 11) for the
// backward, and cuDNN's heuristics give a deterministic engine for the graph on this device. The finalized
// plans are cached per (device, dtype, shape, direction); a shape cuDNN refused is remembered, and not asked
// again. A failure after a plan finalized (the execution) throws zt::CudaError naming the shape.
// kernels/cuda/cudnn_attention.cpp has the graphs and says what determinism they give; docs/gpu.md, "Kernels:
// cuDNN fused attention". Defined only when zerotrain is built with CUDA.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/nn_kernels.hpp"

namespace zt::kernels::cuda::cudnn {

bool attention_forward(DType dtype, const void* qkv, void* output, void* row_logsumexp,
                       const AttentionShape& shape, void* stream);
bool attention_backward(DType dtype, const void* grad_output, const void* qkv, const void* output,
                        const void* row_logsumexp, void* grad_qkv, const AttentionShape& shape, void* stream);

/// What cuDNN says of the forward and backward graphs of (dtype, shape), asked without a GPU: each graph
/// is built as attention_forward/backward would build it, and cuDNN itself finalizes every tensor and
/// operation descriptor in it (it checks each attribute's type and count, and each operation's operands:
/// a matmul's dimensions, a pointwise operation's broadcast, a reduction's), and from cuDNN 9.8 on the
/// operation graph (older ones need a handle for it).
/// With `device_properties_json` (cuDNN's device-properties JSON, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION,
/// cuDNN 9.8 or later) it also lists the engines that take each graph on the device described: those
/// with a knob setting whose engine config finalizes or stops only for want of the driver to compile
/// its kernel (which comes after the engine's graph-pattern and shape checks). The execution plan, its
/// workspace and the numerics need a GPU. Throws zt::CudaError naming the direction, the shape, the cuDNN
/// version and the descriptor refused with cuDNN's message (or why libcudnn does not load, or that the
/// version has no device properties). bf16 and fp16 only. unit.cudnn_attention runs it in CI.
struct GraphDirectionCheck {
  std::size_t operations = 0;
  std::vector<std::int64_t> engines_taking;  // global engine indices
};
struct GraphCheck {
  GraphDirectionCheck forward, backward;
};
GraphCheck check_graphs_without_device(DType dtype, const AttentionShape& shape,
                                       std::string_view device_properties_json = {});

/// cuDNN's device-properties JSON of CUDA device `device`, the form check_graphs_without_device takes
/// (needs the GPU, and cuDNN 9.8 or later; throws zt::CudaError otherwise).
std::string device_properties_json(int device);

/// The directions the loaded cuDNN's version is taken for, with ZT_CUDNN_ATTENTION (none when
/// libcudnn does not load or the variable turns it off); the device, dtype and shape may still refuse
/// a call. Throws zt::ConfigError for a bad ZT_CUDNN_ATTENTION.
struct TakenDirections {
  bool forward = false;
  bool backward = false;
};
TakenDirections taken_directions();

/// One line for `zerotrain report`: the cuDNN version loaded (or why it is not), whether the fused
/// attention is enabled, and the last refusal's reason if any. Loads libcudnn (no GPU needed for that);
/// never throws for a bad ZT_CUDNN_ATTENTION (it names it instead).
std::string attention_status();

}  // namespace zt::kernels::cuda::cudnn
