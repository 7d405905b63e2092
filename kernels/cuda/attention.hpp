// CUDA causal self-attention with the host's contract (kernels/nn_kernels.hpp, kernels/host/attention.cpp):
// qkv [B, T, 3C], the rows' log-sum-exps [B, n_head, T] saved in stat_dtype (not the probabilities),
// grad_qkv overwritten. cuDNN's fused scaled-dot-product attention takes the 16-bit calls it supports
// (kernels/cuda/cudnn_attention.hpp); our own tiled kernel in plain CUDA (kernels/cuda/attention.cu)
// takes the rest, and either backward continues either forward. Defined only when zerotrain is built
// with CUDA.
#pragma once

#include "kernels/nn_kernels.hpp"

namespace zt::kernels::cuda {

void attention_forward(DType dtype, const void* qkv, void* output, void* row_logsumexp,
                       const AttentionShape& shape, void* stream);
void attention_backward(DType dtype, const void* grad_output, const void* qkv, const void* output,
                        const void* row_logsumexp, void* grad_qkv, const AttentionShape& shape, void* stream);

}  // namespace zt::kernels::cuda
