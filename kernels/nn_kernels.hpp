// Neural-network kernels: one entry point per operation, dispatched by device (kernels/dispatch.hpp).
//
// Conventions shared by every kernel here:
//   - The first parameter is the stream the kernel is ordered on; it runs on stream.device(). Every
//     pointer is memory of that device (host kernels: host memory; the emulated device: its
//     buffers, touched inside the device API; CUDA: device memory). Results that steer the host
//     (a loss, a norm) are written to device scalars, so that a step reads them once, not per call.
//   - Tensors are raw pointers to contiguous row-major data of the given floating `dtype`
//     (fp32, fp64, bf16, fp16). 16-bit types are computed in fp32 (loads widen, stores round);
//     fp64 is computed in fp64. Token and target indices are int32.
//   - "Statistics" (layernorm mean/rstd, attention and cross-entropy log-sum-exps) are
//     kept in the accumulation type: fp64 for fp64 tensors, fp32 otherwise (see stat_dtype()).
//   - Gradients of parameters ACCUMULATE (+=), gradients of activations are OVERWRITTEN.
//   - Every kernel is deterministic: the result does not depend on the number of OpenMP threads
//     (each output element is reduced by one thread in a fixed order; sums over many elements go
//     through fixed-size chunks added in order).
//   - Thread count: set_host_threads() in kernels/optimizer_kernels.hpp.
//   - Linear layers follow PyTorch: weight is [out_features, in_features].
// CUDA versions: kernels/cuda/<family>.cu (docs/gpu.md); an entry point without one passes no_cuda_kernel.
#pragma once

#include <cstdint>

#include "zerotrain/device.hpp"
#include "zerotrain/dtype.hpp"

namespace zt::kernels {

/// The type statistics are kept in for tensors of `dtype`: fp64 for fp64, fp32 otherwise.
constexpr DType stat_dtype(DType dtype) {
  return dtype == DType::fp64 ? DType::fp64 : DType::fp32;
}

// ---- element-wise utilities -------------------------------------------------------------------

/// destination[i] = source[i] converted; any pair of floating dtypes, or equal integer dtypes.
void convert(const Stream& stream, const void* source, DType source_dtype, void* destination,
             DType destination_dtype, std::int64_t count);
/// data[i] = value (rounded to the dtype).
void fill(const Stream& stream, DType dtype, void* data, std::int64_t count, double value);
/// data[i] = normal(mean, stddev) drawn from a counter-based generator keyed by (seed, i): the same
/// values for the same seed whatever the thread count.
void fill_normal(const Stream& stream, DType dtype, void* data, std::int64_t count, double mean,
                 double stddev, std::uint64_t seed);
/// output = a + b (output may alias a or b).
void add(const Stream& stream, DType dtype, const void* a, const void* b, void* output, std::int64_t count);
/// target += source. With fp64 and count 1 it accumulates a device scalar (a loss sum, say).
void accumulate(const Stream& stream, DType dtype, void* target, const void* source, std::int64_t count);
/// data[i] *= factor in place, computed in the accumulation type (fp64 for fp64, fp32 otherwise;
/// the factor is rounded to it first).
void scale(const Stream& stream, DType dtype, void* data, std::int64_t count, double factor);

// ---- matmul (Linear) ----------------------------------------------------------------------------

struct MatmulShape {
  std::int64_t rows = 0;          // batch * sequence positions
  std::int64_t in_features = 0;   // columns of the input
  std::int64_t out_features = 0;  // columns of the output
};
/// output[rows, out] = input[rows, in] . weight[out, in]^T + bias[out] (bias may be null).
void matmul_forward(const Stream& stream, DType dtype, const void* input, const void* weight,
                    const void* bias, void* output, const MatmulShape& shape);
/// grad_input = grad_output . weight (overwritten; skipped when null);
/// grad_weight += grad_output^T . input and grad_bias += column sums of grad_output (each skipped when null).
void matmul_backward(const Stream& stream, DType dtype, const void* grad_output, const void* input,
                     const void* weight, void* grad_input, void* grad_weight, void* grad_bias,
                     const MatmulShape& shape);
/// The weight gradient of output features [first_out, first_out + count) only:
/// grad_weight_rows[count, in] += (grad_output^T . input)[first_out : first_out + count, :]. Each row is
/// the same GEMM row as in matmul_backward's grad_weight (a streamed gradient, nn::GradientSink).
void matmul_weight_grad_rows(const Stream& stream, DType dtype, const void* grad_output, const void* input,
                             void* grad_weight_rows, const MatmulShape& shape, std::int64_t first_out,
                             std::int64_t count);

// ---- embedding --------------------------------------------------------------------------------

struct EmbeddingShape {
  std::int64_t batch = 0;
  std::int64_t seq_len = 0;
  std::int64_t vocab_size = 0;  // rows of the token table; tokens must lie in [0, vocab_size)
  std::int64_t channels = 0;
};
/// output[b, t, :] = token_table[tokens[b, t], :] (+ position_table[t, :] when not null).
/// Throws naming the position of a token outside [0, vocab_size).
void embedding_forward(const Stream& stream, DType dtype, const std::int32_t* tokens, const void* token_table,
                       const void* position_table, void* output, const EmbeddingShape& shape);
/// grad_token_table[tokens[b, t], :] += grad_output[b, t, :]; grad_position_table[t, :] += sum over b.
/// Either table gradient may be null.
void embedding_backward(const Stream& stream, DType dtype, const std::int32_t* tokens,
                        const void* grad_output, void* grad_token_table, void* grad_position_table,
                        const EmbeddingShape& shape);
/// The token table's gradient of rows [first_row, first_row + row_count) only:
/// grad_rows[tokens[i] - first_row, :] += grad_output[i, :] for the tokens in that range, in position order
/// (each row sums what embedding_backward adds to it, in the same order). shape.batch = token count.
void embedding_backward_rows(const Stream& stream, DType dtype, const std::int32_t* tokens,
                             const void* grad_output, void* grad_rows, const EmbeddingShape& shape,
                             std::int64_t first_row, std::int64_t row_count);

// ---- layer norm -------------------------------------------------------------------------------

/// Per row: output = (x - mean) * rstd * weight + bias, rstd = 1 / sqrt(var + eps) (biased variance).
/// mean and rstd ([rows], stat_dtype) are saved for the backward pass.
void layernorm_forward(const Stream& stream, DType dtype, const void* input, const void* weight,
                       const void* bias, void* output, void* mean, void* rstd, std::int64_t rows,
                       std::int64_t channels, double eps);
/// grad_input overwritten; grad_weight and grad_bias accumulate.
void layernorm_backward(const Stream& stream, DType dtype, const void* grad_output, const void* input,
                        const void* weight, const void* mean, const void* rstd, void* grad_input,
                        void* grad_weight, void* grad_bias, std::int64_t rows, std::int64_t channels);

// ---- activations ------------------------------------------------------------------------------

enum class Activation : std::uint8_t {
  gelu,  // tanh approximation, as GPT-2: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  relu,
  tanh,
};
void activation_forward(const Stream& stream, DType dtype, Activation activation, const void* input,
                        void* output, std::int64_t count);
/// grad_input (overwritten) = activation'(input) * grad_output.
void activation_backward(const Stream& stream, DType dtype, Activation activation, const void* input,
                         const void* grad_output, void* grad_input, std::int64_t count);

// ---- dropout ----------------------------------------------------------------------------------

/// Whether element `index` survives dropout with probability `p` of being dropped, for the mask
/// keyed by (seed, mask stream). Counter-based: no state, identical on any thread count.
bool dropout_keeps(std::uint64_t seed, std::uint64_t mask_stream, std::int64_t index, double p);
/// output = input * keep / (1 - p). The mask is never stored: backward recomputes it from the key.
void dropout_forward(const Stream& stream, DType dtype, const void* input, void* output, std::int64_t count,
                     double p, std::uint64_t seed, std::uint64_t mask_stream);
void dropout_backward(const Stream& stream, DType dtype, const void* grad_output, void* grad_input,
                      std::int64_t count, double p, std::uint64_t seed, std::uint64_t mask_stream);

// ---- causal self-attention --------------------------------------------------------------------

struct AttentionShape {
  std::int64_t batch = 0;
  std::int64_t seq_len = 0;
  std::int64_t n_head = 0;
  std::int64_t head_dim = 0;  // channels = n_head * head_dim
};
/// qkv: [B, T, 3C] (q, k, v side by side, head h at columns h*head_dim of each); output: [B, T, C];
/// row_logsumexp: [B, n_head, T] (stat_dtype), the log of each query row's causal softmax normalizer,
/// lse[t] = log sum over s <= t of exp(q_t . k_s / sqrt(head_dim)). Saved for backward with qkv and
/// output, it is all the backward needs to recompute the probabilities a tile at a time: O(T)
/// statistics per head instead of the O(T^2) probabilities (flash attention's contract, and cuDNN's
/// fused attention's, whose "Stats" output is this tensor).
void attention_forward(const Stream& stream, DType dtype, const void* qkv, void* output, void* row_logsumexp,
                       const AttentionShape& shape);
/// grad_qkv [B, T, 3C] overwritten. output and row_logsumexp are attention_forward's. The softmax
/// backward needs rowsum(P * dP) = rowsum(dO * O): cuDNN reads it from `output`, the host and our CUDA
/// kernels form it from the recomputed probabilities (exactly the forward's arithmetic, no 16-bit
/// rounding of O in it).
void attention_backward(const Stream& stream, DType dtype, const void* grad_output, const void* qkv,
                        const void* output, const void* row_logsumexp, void* grad_qkv,
                        const AttentionShape& shape);

// ---- losses -----------------------------------------------------------------------------------

/// What cross_entropy_forward writes: two fp64 scalars in device memory.
struct CrossEntropyScalars {
  double mean_loss = 0;     // mean over counted rows (0 when no row counts)
  double counted_rows = 0;  // rows whose target is not ignore_index (an integer below 2^53)
};
/// Softmax cross-entropy of logits [rows, vocab] against targets [rows]; rows whose target equals
/// ignore_index are skipped. row_logsumexp ([rows], stat_dtype) is saved for backward, the mean
/// loss and the counted rows go to `result` (device memory). Throws on a target outside [0, vocab)
/// other than ignore_index.
void cross_entropy_forward(const Stream& stream, DType dtype, const void* logits, const std::int32_t* targets,
                           void* row_logsumexp, std::int64_t rows, std::int64_t vocab,
                           std::int32_t ignore_index, CrossEntropyScalars* result);
/// grad_logits (overwritten) = scale / counted_rows * (softmax(logits) - onehot(target)) for counted
/// rows, 0 for ignored rows (and 0 everywhere when no row counts): the gradient of scale * mean loss.
/// `forward_result` is the forward's (device memory; only counted_rows is read).
void cross_entropy_backward(const Stream& stream, DType dtype, const void* logits,
                            const std::int32_t* targets, const void* row_logsumexp,
                            const CrossEntropyScalars* forward_result, void* grad_logits, std::int64_t rows,
                            std::int64_t vocab, std::int32_t ignore_index, double scale);
/// *loss (one fp64 in device memory) = mean((prediction - target)^2) over `count` elements.
void mse_forward(const Stream& stream, DType dtype, const void* prediction, const void* target,
                 std::int64_t count, double* loss);
/// grad_prediction (overwritten) = scale * 2 (prediction - target) / count.
void mse_backward(const Stream& stream, DType dtype, const void* prediction, const void* target,
                  void* grad_prediction, std::int64_t count, double scale);

/// Throws naming the first token (embedding kernels) or target (cross_entropy_forward) outside its range
/// that a kernel on stream.device() met since the last call. The host and emulated kernels throw at
/// once, so there this does nothing; the CUDA kernels cannot without a host sync per call, so they keep
/// clear of the bad index (NaN output row, skipped gradient, NaN loss) and record the first one in
/// device memory (kernels/cuda/layers.hpp), which this reads: a host sync, for where a step reads its
/// device scalars anyway.
void check_index_errors(const Stream& stream);

}  // namespace zt::kernels
