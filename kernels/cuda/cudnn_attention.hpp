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

#include <string>

#include "kernels/nn_kernels.hpp"

namespace zt::kernels::cuda::cudnn {

bool attention_forward(DType dtype, const void* qkv, void* output, void* row_logsumexp,
                       const AttentionShape& shape, void* stream);
bool attention_backward(DType dtype, const void* grad_output, const void* qkv, const void* output,
                        const void* row_logsumexp, void* grad_qkv, const AttentionShape& shape, void* stream);

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
