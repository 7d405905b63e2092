// Entry points of the neural-network kernels: dispatch by the stream's device to kernels/host or
// kernels/cuda. On the emulated device the host kernel runs inside the device API's access, so the
// device scalars of the losses are written there too.
#include "kernels/nn_kernels.hpp"

#include "kernels/dispatch.hpp"
#include "kernels/host/nn_host.hpp"
#if ZT_HAVE_CUDA
#include "kernels/cuda/attention.hpp"
#include "kernels/cuda/cudnn_attention.hpp"
#include "kernels/cuda/elementwise.hpp"
#include "kernels/cuda/gemm.hpp"
#include "kernels/cuda/layers.hpp"
#endif

namespace zt::kernels {

void convert(const Stream& stream, const void* source, DType source_dtype, void* destination,
             DType destination_dtype, std::int64_t count) {
  dispatch(
      stream, "convert",
      [=] { return host::convert(source, source_dtype, destination, destination_dtype, count); },
#if ZT_HAVE_CUDA
      [&](void* native) {
        cuda::convert(source, source_dtype, destination, destination_dtype, count, native);
      }
#else
      no_cuda_kernel
#endif
  );
}

void fill(const Stream& stream, DType dtype, void* data, std::int64_t count, double value) {
  dispatch(
      stream, "fill", [=] { return host::fill(dtype, data, count, value); },
#if ZT_HAVE_CUDA
      [&](void* native) { cuda::fill(dtype, data, count, value, native); }
#else
      no_cuda_kernel
#endif
  );
}

void fill_normal(const Stream& stream, DType dtype, void* data, std::int64_t count, double mean,
                 double stddev, std::uint64_t seed) {
  dispatch(
      stream, "fill_normal", [=] { return host::fill_normal(dtype, data, count, mean, stddev, seed); },
#if ZT_HAVE_CUDA
      [&](void* native) { cuda::fill_normal(dtype, data, count, mean, stddev, seed, native); }
#else
      no_cuda_kernel
#endif
  );
}

void add(const Stream& stream, DType dtype, const void* a, const void* b, void* output, std::int64_t count) {
  dispatch(
      stream, "add", [=] { return host::add(dtype, a, b, output, count); },
#if ZT_HAVE_CUDA
      [&](void* native) { cuda::add(dtype, a, b, output, count, native); }
#else
      no_cuda_kernel
#endif
  );
}

void accumulate(const Stream& stream, DType dtype, void* target, const void* source, std::int64_t count) {
  dispatch(
      stream, "accumulate", [=] { return host::accumulate(dtype, target, source, count); },
#if ZT_HAVE_CUDA
      [&](void* native) { cuda::accumulate(dtype, target, source, count, native); }
#else
      no_cuda_kernel
#endif
  );
}

void matmul_forward(const Stream& stream, DType dtype, const void* input, const void* weight,
                    const void* bias, void* output, const MatmulShape& shape) {
  dispatch(
      stream, "matmul_forward",
      [=] { return host::matmul_forward(dtype, input, weight, bias, output, shape); },
#if ZT_HAVE_CUDA
      [&](void* native) { cuda::matmul_forward(dtype, input, weight, bias, output, shape, native); });
#else
      no_cuda_kernel);
#endif
}

void matmul_backward(const Stream& stream, DType dtype, const void* grad_output, const void* input,
                     const void* weight, void* grad_input, void* grad_weight, void* grad_bias,
                     const MatmulShape& shape) {
  dispatch(
      stream, "matmul_backward",
      [=] {
        return host::matmul_backward(dtype, grad_output, input, weight, grad_input, grad_weight, grad_bias,
                                     shape);
      },
#if ZT_HAVE_CUDA
      [&](void* native) {
        cuda::matmul_backward(dtype, grad_output, input, weight, grad_input, grad_weight, grad_bias, shape,
                              native);
      });
#else
      no_cuda_kernel);
#endif
}

void matmul_weight_grad_rows(const Stream& stream, DType dtype, const void* grad_output, const void* input,
                             void* grad_weight_rows, const MatmulShape& shape, std::int64_t first_out,
                             std::int64_t count) {
  dispatch(
      stream, "matmul_weight_grad_rows",
      [=] {
        return host::matmul_weight_grad_rows(dtype, grad_output, input, grad_weight_rows, shape, first_out,
                                             count);
      },
#if ZT_HAVE_CUDA
      [&](void* native) {
        cuda::matmul_weight_grad_rows(dtype, grad_output, input, grad_weight_rows, shape, first_out, count,
                                      native);
      });
#else
      no_cuda_kernel);
#endif
}

void embedding_backward_rows(const Stream& stream, DType dtype, const std::int32_t* tokens,
                             const void* grad_output, void* grad_rows, const EmbeddingShape& shape,
                             std::int64_t first_row, std::int64_t row_count) {
  dispatch(
      stream, "embedding_backward_rows",
      [=] {
        return host::embedding_backward_rows(dtype, tokens, grad_output, grad_rows, shape, first_row,
                                             row_count);
      },
#if ZT_HAVE_CUDA
      [&](void* native) {
        cuda::embedding_backward_rows(dtype, tokens, grad_output, grad_rows, shape, first_row, row_count,
                                      native);
      });
#else
      no_cuda_kernel);
#endif
}

void embedding_forward(const Stream& stream, DType dtype, const std::int32_t* tokens, const void* token_table,
                       const void* position_table, void* output, const EmbeddingShape& shape) {
  dispatch(
      stream, "embedding_forward",
      [=] { return host::embedding_forward(dtype, tokens, token_table, position_table, output, shape); },
#if ZT_HAVE_CUDA
      [&](void* native) {
        cuda::embedding_forward(dtype, tokens, token_table, position_table, output, shape, native);
      });
#else
      no_cuda_kernel);
#endif
}

void embedding_backward(const Stream& stream, DType dtype, const std::int32_t* tokens,
                        const void* grad_output, void* grad_token_table, void* grad_position_table,
                        const EmbeddingShape& shape) {
  dispatch(
      stream, "embedding_backward",
      [=] {
        return host::embedding_backward(dtype, tokens, grad_output, grad_token_table, grad_position_table,
                                        shape);
      },
#if ZT_HAVE_CUDA
      [&](void* native) {
        cuda::embedding_backward(dtype, tokens, grad_output, grad_token_table, grad_position_table, shape,
                                 native);
      });
#else
      no_cuda_kernel);
#endif
}

void layernorm_forward(const Stream& stream, DType dtype, const void* input, const void* weight,
                       const void* bias, void* output, void* mean, void* rstd, std::int64_t rows,
                       std::int64_t channels, double eps) {
  dispatch(
      stream, "layernorm_forward",
      [=] {
        return host::layernorm_forward(dtype, input, weight, bias, output, mean, rstd, rows, channels, eps);
      },
#if ZT_HAVE_CUDA
      [&](void* native) {
        cuda::layernorm_forward(dtype, input, weight, bias, output, mean, rstd, rows, channels, eps, native);
      });
#else
      no_cuda_kernel);
#endif
}

void layernorm_backward(const Stream& stream, DType dtype, const void* grad_output, const void* input,
                        const void* weight, const void* mean, const void* rstd, void* grad_input,
                        void* grad_weight, void* grad_bias, std::int64_t rows, std::int64_t channels) {
  dispatch(
      stream, "layernorm_backward",
      [=] {
        return host::layernorm_backward(dtype, grad_output, input, weight, mean, rstd, grad_input,
                                        grad_weight, grad_bias, rows, channels);
      },
#if ZT_HAVE_CUDA
      [&](void* native) {
        cuda::layernorm_backward(dtype, grad_output, input, weight, mean, rstd, grad_input, grad_weight,
                                 grad_bias, rows, channels, native);
      });
#else
      no_cuda_kernel);
#endif
}

void activation_forward(const Stream& stream, DType dtype, Activation activation, const void* input,
                        void* output, std::int64_t count) {
  dispatch(
      stream, "activation_forward",
      [=] { return host::activation_forward(dtype, activation, input, output, count); },
#if ZT_HAVE_CUDA
      [&](void* native) { cuda::activation_forward(dtype, activation, input, output, count, native); }
#else
      no_cuda_kernel
#endif
  );
}

void activation_backward(const Stream& stream, DType dtype, Activation activation, const void* input,
                         const void* grad_output, void* grad_input, std::int64_t count) {
  dispatch(
      stream, "activation_backward",
      [=] { return host::activation_backward(dtype, activation, input, grad_output, grad_input, count); },
#if ZT_HAVE_CUDA
      [&](void* native) {
        cuda::activation_backward(dtype, activation, input, grad_output, grad_input, count, native);
      }
#else
      no_cuda_kernel
#endif
  );
}

void dropout_forward(const Stream& stream, DType dtype, const void* input, void* output, std::int64_t count,
                     double p, std::uint64_t seed, std::uint64_t mask_stream) {
  dispatch(
      stream, "dropout_forward",
      [=] { return host::dropout_forward(dtype, input, output, count, p, seed, mask_stream); },
#if ZT_HAVE_CUDA
      [&](void* native) { cuda::dropout_forward(dtype, input, output, count, p, seed, mask_stream, native); }
#else
      no_cuda_kernel
#endif
  );
}

void dropout_backward(const Stream& stream, DType dtype, const void* grad_output, void* grad_input,
                      std::int64_t count, double p, std::uint64_t seed, std::uint64_t mask_stream) {
  dispatch(
      stream, "dropout_backward",
      [=] { return host::dropout_backward(dtype, grad_output, grad_input, count, p, seed, mask_stream); },
#if ZT_HAVE_CUDA
      [&](void* native) {
        cuda::dropout_backward(dtype, grad_output, grad_input, count, p, seed, mask_stream, native);
      }
#else
      no_cuda_kernel
#endif
  );
}

void attention_forward(const Stream& stream, DType dtype, const void* qkv, void* output, void* row_logsumexp,
                       const AttentionShape& shape) {
  dispatch(
      stream, "attention_forward",
      [=] { return host::attention_forward(dtype, qkv, output, row_logsumexp, shape); },
#if ZT_HAVE_CUDA
      [&](void* native) {
        if (!cuda::cudnn::attention_forward(dtype, qkv, output, row_logsumexp, shape, native))
          cuda::attention_forward(dtype, qkv, output, row_logsumexp, shape, native);
      });
#else
      no_cuda_kernel);
#endif
}

void attention_backward(const Stream& stream, DType dtype, const void* grad_output, const void* qkv,
                        const void* output, const void* row_logsumexp, void* grad_qkv,
                        const AttentionShape& shape) {
  dispatch(
      stream, "attention_backward",
      [=] {
        return host::attention_backward(dtype, grad_output, qkv, output, row_logsumexp, grad_qkv, shape);
      },
#if ZT_HAVE_CUDA
      [&](void* native) {
        if (!cuda::cudnn::attention_backward(dtype, grad_output, qkv, output, row_logsumexp, grad_qkv, shape,
                                             native))
          cuda::attention_backward(dtype, grad_output, qkv, output, row_logsumexp, grad_qkv, shape, native);
      });
#else
      no_cuda_kernel);
#endif
}

void scale(const Stream& stream, DType dtype, void* data, std::int64_t count, double factor) {
  dispatch(
      stream, "scale", [=] { return host::scale(dtype, data, count, factor); },
#if ZT_HAVE_CUDA
      [&](void* native) { cuda::scale(dtype, data, count, factor, native); }
#else
      no_cuda_kernel
#endif
  );
}

void cross_entropy_forward(const Stream& stream, DType dtype, const void* logits, const std::int32_t* targets,
                           void* row_logsumexp, std::int64_t rows, std::int64_t vocab,
                           std::int32_t ignore_index, CrossEntropyScalars* result) {
  ZT_CHECK(result != nullptr, "cross_entropy_forward: the result scalars are null");
  dispatch(
      stream, "cross_entropy_forward",
      [=] {
        const host::CrossEntropyResult forward =
            host::cross_entropy_forward(dtype, logits, targets, row_logsumexp, rows, vocab, ignore_index);
        result->mean_loss = forward.loss;
        result->counted_rows = static_cast<double>(forward.counted_rows);
      },
#if ZT_HAVE_CUDA
      [&](void* native) {
        cuda::cross_entropy_forward(dtype, logits, targets, row_logsumexp, rows, vocab, ignore_index, result,
                                    native);
      });
#else
      no_cuda_kernel);
#endif
}

void cross_entropy_backward(const Stream& stream, DType dtype, const void* logits,
                            const std::int32_t* targets, const void* row_logsumexp,
                            const CrossEntropyScalars* forward_result, void* grad_logits, std::int64_t rows,
                            std::int64_t vocab, std::int32_t ignore_index, double scale) {
  ZT_CHECK(forward_result != nullptr, "cross_entropy_backward: the forward's result scalars are null");
  dispatch(
      stream, "cross_entropy_backward",
      [=] {
        const double counted = forward_result->counted_rows;
        const double row_scale = counted > 0 ? scale / counted : 0.0;
        return host::cross_entropy_backward(dtype, logits, targets, row_logsumexp, grad_logits, rows, vocab,
                                            ignore_index, row_scale);
      },
#if ZT_HAVE_CUDA
      [&](void* native) {
        cuda::cross_entropy_backward(dtype, logits, targets, row_logsumexp, forward_result, grad_logits, rows,
                                     vocab, ignore_index, scale, native);
      });
#else
      no_cuda_kernel);
#endif
}

void mse_forward(const Stream& stream, DType dtype, const void* prediction, const void* target,
                 std::int64_t count, double* loss) {
  ZT_CHECK(loss != nullptr, "mse_forward: the loss scalar is null");
  dispatch(
      stream, "mse_forward", [=] { *loss = host::mse_forward(dtype, prediction, target, count); },
#if ZT_HAVE_CUDA
      [&](void* native) { cuda::mse_forward(dtype, prediction, target, count, loss, native); });
#else
      no_cuda_kernel);
#endif
}

void mse_backward(const Stream& stream, DType dtype, const void* prediction, const void* target,
                  void* grad_prediction, std::int64_t count, double scale) {
  dispatch(
      stream, "mse_backward",
      [=] { return host::mse_backward(dtype, prediction, target, grad_prediction, count, scale); },
#if ZT_HAVE_CUDA
      [&](void* native) {
        cuda::mse_backward(dtype, prediction, target, grad_prediction, count, scale, native);
      });
#else
      no_cuda_kernel);
#endif
}

void check_index_errors(const Stream& stream) {
  dispatch(
      stream, "check_index_errors", [] {},
#if ZT_HAVE_CUDA
      [&](void* native) { cuda::throw_on_index_errors(native); });
#else
      no_cuda_kernel);
#endif
}

}  // namespace zt::kernels
