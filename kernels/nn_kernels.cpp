// Entry points of the neural-network kernels: dispatch by device to kernels/host (and, later, cuda).
#include "kernels/nn_kernels.hpp"

#include "kernels/dispatch.hpp"
#include "kernels/host/nn_host.hpp"

namespace zt::kernels {

void convert(Device device, const void* source, DType source_dtype, void* destination,
             DType destination_dtype, std::int64_t count) {
  dispatch(
      device, "convert",
      [&] { return host::convert(source, source_dtype, destination, destination_dtype, count); },
      no_cuda_kernel);
}

void fill(Device device, DType dtype, void* data, std::int64_t count, double value) {
  dispatch(
      device, "fill", [&] { return host::fill(dtype, data, count, value); }, no_cuda_kernel);
}

void fill_normal(Device device, DType dtype, void* data, std::int64_t count, double mean, double stddev,
                 std::uint64_t seed) {
  dispatch(
      device, "fill_normal", [&] { return host::fill_normal(dtype, data, count, mean, stddev, seed); },
      no_cuda_kernel);
}

void add(Device device, DType dtype, const void* a, const void* b, void* output, std::int64_t count) {
  dispatch(
      device, "add", [&] { return host::add(dtype, a, b, output, count); }, no_cuda_kernel);
}

void accumulate(Device device, DType dtype, void* target, const void* source, std::int64_t count) {
  dispatch(
      device, "accumulate", [&] { return host::accumulate(dtype, target, source, count); }, no_cuda_kernel);
}

void matmul_forward(Device device, DType dtype, const void* input, const void* weight, const void* bias,
                    void* output, const MatmulShape& shape) {
  dispatch(
      device, "matmul_forward",
      [&] { return host::matmul_forward(dtype, input, weight, bias, output, shape); }, no_cuda_kernel);
}

void matmul_backward(Device device, DType dtype, const void* grad_output, const void* input,
                     const void* weight, void* grad_input, void* grad_weight, void* grad_bias,
                     const MatmulShape& shape) {
  dispatch(
      device, "matmul_backward",
      [&] {
        return host::matmul_backward(dtype, grad_output, input, weight, grad_input, grad_weight, grad_bias,
                                     shape);
      },
      no_cuda_kernel);
}

void embedding_forward(Device device, DType dtype, const std::int32_t* tokens, const void* token_table,
                       const void* position_table, void* output, const EmbeddingShape& shape) {
  dispatch(
      device, "embedding_forward",
      [&] { return host::embedding_forward(dtype, tokens, token_table, position_table, output, shape); },
      no_cuda_kernel);
}

void embedding_backward(Device device, DType dtype, const std::int32_t* tokens, const void* grad_output,
                        void* grad_token_table, void* grad_position_table, const EmbeddingShape& shape) {
  dispatch(
      device, "embedding_backward",
      [&] {
        return host::embedding_backward(dtype, tokens, grad_output, grad_token_table, grad_position_table,
                                        shape);
      },
      no_cuda_kernel);
}

void layernorm_forward(Device device, DType dtype, const void* input, const void* weight, const void* bias,
                       void* output, void* mean, void* rstd, std::int64_t rows, std::int64_t channels,
                       double eps) {
  dispatch(
      device, "layernorm_forward",
      [&] {
        return host::layernorm_forward(dtype, input, weight, bias, output, mean, rstd, rows, channels, eps);
      },
      no_cuda_kernel);
}

void layernorm_backward(Device device, DType dtype, const void* grad_output, const void* input,
                        const void* weight, const void* mean, const void* rstd, void* grad_input,
                        void* grad_weight, void* grad_bias, std::int64_t rows, std::int64_t channels) {
  dispatch(
      device, "layernorm_backward",
      [&] {
        return host::layernorm_backward(dtype, grad_output, input, weight, mean, rstd, grad_input,
                                        grad_weight, grad_bias, rows, channels);
      },
      no_cuda_kernel);
}

void activation_forward(Device device, DType dtype, Activation activation, const void* input, void* output,
                        std::int64_t count) {
  dispatch(
      device, "activation_forward",
      [&] { return host::activation_forward(dtype, activation, input, output, count); }, no_cuda_kernel);
}

void activation_backward(Device device, DType dtype, Activation activation, const void* input,
                         const void* grad_output, void* grad_input, std::int64_t count) {
  dispatch(
      device, "activation_backward",
      [&] { return host::activation_backward(dtype, activation, input, grad_output, grad_input, count); },
      no_cuda_kernel);
}

void dropout_forward(Device device, DType dtype, const void* input, void* output, std::int64_t count,
                     double p, std::uint64_t seed, std::uint64_t stream) {
  dispatch(
      device, "dropout_forward",
      [&] { return host::dropout_forward(dtype, input, output, count, p, seed, stream); }, no_cuda_kernel);
}

void dropout_backward(Device device, DType dtype, const void* grad_output, void* grad_input,
                      std::int64_t count, double p, std::uint64_t seed, std::uint64_t stream) {
  dispatch(
      device, "dropout_backward",
      [&] { return host::dropout_backward(dtype, grad_output, grad_input, count, p, seed, stream); },
      no_cuda_kernel);
}

void attention_forward(Device device, DType dtype, const void* qkv, void* output, void* probabilities,
                       const AttentionShape& shape) {
  dispatch(
      device, "attention_forward",
      [&] { return host::attention_forward(dtype, qkv, output, probabilities, shape); }, no_cuda_kernel);
}

void attention_backward(Device device, DType dtype, const void* grad_output, const void* qkv,
                        const void* probabilities, void* grad_qkv, const AttentionShape& shape) {
  dispatch(
      device, "attention_backward",
      [&] { return host::attention_backward(dtype, grad_output, qkv, probabilities, grad_qkv, shape); },
      no_cuda_kernel);
}

CrossEntropyResult cross_entropy_forward(Device device, DType dtype, const void* logits,
                                         const std::int32_t* targets, void* row_logsumexp, std::int64_t rows,
                                         std::int64_t vocab, std::int32_t ignore_index) {
  return dispatch(
      device, "cross_entropy_forward",
      [&] {
        return host::cross_entropy_forward(dtype, logits, targets, row_logsumexp, rows, vocab, ignore_index);
      },
      no_cuda_kernel);
}

void cross_entropy_backward(Device device, DType dtype, const void* logits, const std::int32_t* targets,
                            const void* row_logsumexp, void* grad_logits, std::int64_t rows,
                            std::int64_t vocab, std::int32_t ignore_index, double scale) {
  dispatch(
      device, "cross_entropy_backward",
      [&] {
        return host::cross_entropy_backward(dtype, logits, targets, row_logsumexp, grad_logits, rows, vocab,
                                            ignore_index, scale);
      },
      no_cuda_kernel);
}

double mse_forward(Device device, DType dtype, const void* prediction, const void* target,
                   std::int64_t count) {
  return dispatch(
      device, "mse_forward", [&] { return host::mse_forward(dtype, prediction, target, count); },
      no_cuda_kernel);
}

void mse_backward(Device device, DType dtype, const void* prediction, const void* target,
                  void* grad_prediction, std::int64_t count, double scale) {
  dispatch(
      device, "mse_backward",
      [&] { return host::mse_backward(dtype, prediction, target, grad_prediction, count, scale); },
      no_cuda_kernel);
}

}  // namespace zt::kernels
