// CUDA versions of the layer kernels of kernels/nn_kernels.hpp (layer norm, embedding, losses): the
// same arguments as the host kernels (kernels/host/nn_host.hpp) plus the cudaStream_t last. Defined in
// kernels/cuda/layers.cu, only when zerotrain is built with CUDA.
//
// Indices out of range (a token outside [0, vocab), a target outside [0, vocab) that is not the ignore
// index): the host kernels throw at once; a CUDA kernel cannot without a host sync per call. The CUDA
// kernels never touch memory out of bounds for them: embedding_forward writes NaN into that
// position's output row, embedding_backward skips it, cross_entropy_forward makes that row's loss NaN
// (so the mean loss is NaN and the step's overflow check sees it), and the first such position of each
// kind is recorded in device memory. throw_on_index_errors() reads the records (a host sync: call it
// where the step reads its device scalars anyway) and throws naming the position and the value.
#pragma once

#include <cstdint>

#include "kernels/nn_kernels.hpp"

namespace zt::kernels::cuda {

void embedding_forward(DType dtype, const std::int32_t* tokens, const void* token_table,
                       const void* position_table, void* output, const EmbeddingShape& shape, void* stream);
void embedding_backward(DType dtype, const std::int32_t* tokens, const void* grad_output,
                        void* grad_token_table, void* grad_position_table, const EmbeddingShape& shape,
                        void* stream);
void embedding_backward_rows(DType dtype, const std::int32_t* tokens, const void* grad_output,
                             void* grad_rows, const EmbeddingShape& shape, std::int64_t first_row,
                             std::int64_t row_count, void* stream);
void layernorm_forward(DType dtype, const void* input, const void* weight, const void* bias, void* output,
                       void* mean, void* rstd, std::int64_t rows, std::int64_t channels, double eps,
                       void* stream);
void layernorm_backward(DType dtype, const void* grad_output, const void* input, const void* weight,
                        const void* mean, const void* rstd, void* grad_input, void* grad_weight,
                        void* grad_bias, std::int64_t rows, std::int64_t channels, void* stream);
void cross_entropy_forward(DType dtype, const void* logits, const std::int32_t* targets, void* row_logsumexp,
                           std::int64_t rows, std::int64_t vocab, std::int32_t ignore_index,
                           CrossEntropyScalars* result, void* stream);
/// Reads counted_rows from `forward_result` on the device: the factor scale / counted_rows never
/// visits the host.
void cross_entropy_backward(DType dtype, const void* logits, const std::int32_t* targets,
                            const void* row_logsumexp, const CrossEntropyScalars* forward_result,
                            void* grad_logits, std::int64_t rows, std::int64_t vocab,
                            std::int32_t ignore_index, double scale, void* stream);
void mse_forward(DType dtype, const void* prediction, const void* target, std::int64_t count, double* loss,
                 void* stream);
void mse_backward(DType dtype, const void* prediction, const void* target, void* grad_prediction,
                  std::int64_t count, double scale, void* stream);

/// Throws naming the first out-of-range token (embedding kernels) or target (cross_entropy_forward)
/// recorded on the current device since the last call, and clears the records. Synchronizes `stream`.
void throw_on_index_errors(void* stream);

}  // namespace zt::kernels::cuda
