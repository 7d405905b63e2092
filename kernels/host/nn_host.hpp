// Host implementations of kernels/nn_kernels.hpp: the same signatures without the stream (the losses
// return their scalars; the entry points store them in device memory).
#pragma once

#include "kernels/nn_kernels.hpp"

namespace zt::kernels::host {

void convert(const void* source, DType source_dtype, void* destination, DType destination_dtype,
             std::int64_t count);
void fill(DType dtype, void* data, std::int64_t count, double value);
void fill_normal(DType dtype, void* data, std::int64_t count, double mean, double stddev, std::uint64_t seed);
void add(DType dtype, const void* a, const void* b, void* output, std::int64_t count);
void accumulate(DType dtype, void* target, const void* source, std::int64_t count);
void scale(DType dtype, void* data, std::int64_t count, double factor);
void matmul_forward(DType dtype, const void* input, const void* weight, const void* bias, void* output,
                    const MatmulShape& shape);
void matmul_backward(DType dtype, const void* grad_output, const void* input, const void* weight,
                     void* grad_input, void* grad_weight, void* grad_bias, const MatmulShape& shape);
void embedding_forward(DType dtype, const std::int32_t* tokens, const void* token_table,
                       const void* position_table, void* output, const EmbeddingShape& shape);
void embedding_backward(DType dtype, const std::int32_t* tokens, const void* grad_output,
                        void* grad_token_table, void* grad_position_table, const EmbeddingShape& shape);
void matmul_weight_grad_rows(DType dtype, const void* grad_output, const void* input, void* grad_weight_rows,
                             const MatmulShape& shape, std::int64_t first_out, std::int64_t count);
void embedding_backward_rows(DType dtype, const std::int32_t* tokens, const void* grad_output,
                             void* grad_rows, const EmbeddingShape& shape, std::int64_t first_row,
                             std::int64_t row_count);
void layernorm_forward(DType dtype, const void* input, const void* weight, const void* bias, void* output,
                       void* mean, void* rstd, std::int64_t rows, std::int64_t channels, double eps);
void layernorm_backward(DType dtype, const void* grad_output, const void* input, const void* weight,
                        const void* mean, const void* rstd, void* grad_input, void* grad_weight,
                        void* grad_bias, std::int64_t rows, std::int64_t channels);
void activation_forward(DType dtype, Activation activation, const void* input, void* output,
                        std::int64_t count);
void activation_backward(DType dtype, Activation activation, const void* input, const void* grad_output,
                         void* grad_input, std::int64_t count);
void dropout_forward(DType dtype, const void* input, void* output, std::int64_t count, double p,
                     std::uint64_t seed, std::uint64_t stream);
void dropout_backward(DType dtype, const void* grad_output, void* grad_input, std::int64_t count, double p,
                      std::uint64_t seed, std::uint64_t stream);
void attention_forward(DType dtype, const void* qkv, void* output, void* row_logsumexp,
                       const AttentionShape& shape);
void attention_backward(DType dtype, const void* grad_output, const void* qkv, const void* output,
                        const void* row_logsumexp, void* grad_qkv, const AttentionShape& shape);
struct CrossEntropyResult {
  double loss = 0;                // mean over counted rows
  std::int64_t counted_rows = 0;  // rows whose target is not ignore_index
};
CrossEntropyResult cross_entropy_forward(DType dtype, const void* logits, const std::int32_t* targets,
                                         void* row_logsumexp, std::int64_t rows, std::int64_t vocab,
                                         std::int32_t ignore_index);
void cross_entropy_backward(DType dtype, const void* logits, const std::int32_t* targets,
                            const void* row_logsumexp, void* grad_logits, std::int64_t rows,
                            std::int64_t vocab, std::int32_t ignore_index, double scale);
double mse_forward(DType dtype, const void* prediction, const void* target, std::int64_t count);
void mse_backward(DType dtype, const void* prediction, const void* target, void* grad_prediction,
                  std::int64_t count, double scale);

}  // namespace zt::kernels::host
