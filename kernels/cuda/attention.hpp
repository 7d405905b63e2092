// CUDA causal self-attention with the host's contract (kernels/nn_kernels.hpp, kernels/host/attention.cpp):
// qkv [B, T, 3C], the causal softmax probabilities [B, n_head, T, T] saved in stat_dtype with zeros above
// the diagonal, grad_qkv overwritten. Our own tiled kernel in plain CUDA (kernels/cuda/attention.cu);
// cuDNN's fused attention does not fit this contract (it keeps no full probabilities). Defined only
// when zerotrain is built with CUDA.
#pragma once

#include "kernels/nn_kernels.hpp"

namespace zt::kernels::cuda {

void attention_forward(DType dtype, const void* qkv, void* output, void* probabilities,
                       const AttentionShape& shape, void* stream);
void attention_backward(DType dtype, const void* grad_output, const void* qkv, const void* probabilities,
                        void* grad_qkv, const AttentionShape& shape, void* stream);

}  // namespace zt::kernels::cuda
