/* The MLP that examples/c/mlp.c (C API), examples/c/mlp_cxx.cpp (C++ zt::ExternalModel) and
 * examples/fortran/mlp.f90 (Fortran module) train, written so that all three do the same float
 * operations in the same order and print the same losses bit for bit (ctest examples.c_fortran.*):
 * data and initial weights come from integer formulas, not from a random number generator, and the
 * examples are compiled with -ffp-contract=off (no fused multiply-adds).
 *
 *   y = W2 tanh(W1 x + b1) + b2,  W1 [HIDDEN][INPUTS], W2 [OUTPUTS][HIDDEN] (row-major: the last
 *   index varies fastest; Fortran declares w1(INPUTS, HIDDEN), the same memory),
 *   loss = mean squared error over a micro-batch's rows and outputs.
 * Sample s, feature j: x = h / 1000003 * 2 - 1 with h = (s * 2654435761 + j * 40503 + 7) mod 1000003;
 * targets y_o = tanh(sum_j A[o][j] x_j), A[o][j] = ((o * 31 + j * 17) mod 13 - 6) * 0.08. */
#ifndef ZT_EXAMPLES_MLP_PROBLEM_H
#define ZT_EXAMPLES_MLP_PROBLEM_H

#include <math.h>
#include <stdint.h>

enum { MLP_INPUTS = 16, MLP_HIDDEN = 32, MLP_OUTPUTS = 4, MLP_MICRO_BATCH = 8 };

/** Sample `sample`'s features x[MLP_INPUTS] and targets y[MLP_OUTPUTS]. */
static inline void mlp_sample(int64_t sample, float* x, float* y) {
  for (int64_t j = 0; j < MLP_INPUTS; ++j) {
    const int64_t h = (sample * 2654435761LL + j * 40503 + 7) % 1000003;
    x[j] = (float)h / 1000003.0f * 2.0f - 1.0f;
  }
  for (int64_t o = 0; o < MLP_OUTPUTS; ++o) {
    float sum = 0.0f;
    for (int64_t j = 0; j < MLP_INPUTS; ++j) sum += (float)((o * 31 + j * 17) % 13 - 6) * 0.08f * x[j];
    y[o] = tanhf(sum);
  }
}

/** Initial values (the same on every rank); biases start at zero. */
static inline void mlp_init(float* w1, float* b1, float* w2, float* b2) {
  for (int64_t h = 0; h < MLP_HIDDEN; ++h) {
    for (int64_t i = 0; i < MLP_INPUTS; ++i)
      w1[h * MLP_INPUTS + i] = (float)((h * 7 + i * 13 + 1) % 23 - 11) * 0.03f;
    b1[h] = 0.0f;
  }
  for (int64_t o = 0; o < MLP_OUTPUTS; ++o) {
    for (int64_t h = 0; h < MLP_HIDDEN; ++h)
      w2[o * MLP_HIDDEN + h] = (float)((o * 11 + h * 5 + 3) % 19 - 9) * 0.05f;
    b2[o] = 0.0f;
  }
}

/** Mean squared error of `rows` samples x[rows][MLP_INPUTS], y[rows][MLP_OUTPUTS]; the gradients of
 *  (loss * scale) accumulate (+=) into dw1, db1, dw2, db2. */
static inline double mlp_forward_backward(const float* w1, const float* b1, const float* w2, const float* b2,
                                          float* dw1, float* db1, float* dw2, float* db2, const float* x,
                                          const float* y, int rows, float scale) {
  float hidden[MLP_HIDDEN], dhidden[MLP_HIDDEN], dout[MLP_OUTPUTS];
  const float count = (float)(rows * MLP_OUTPUTS);
  double loss = 0.0;
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + r * MLP_INPUTS;
    const float* yr = y + r * MLP_OUTPUTS;
    for (int h = 0; h < MLP_HIDDEN; ++h) {
      float sum = b1[h];
      for (int i = 0; i < MLP_INPUTS; ++i) sum += w1[h * MLP_INPUTS + i] * xr[i];
      hidden[h] = tanhf(sum);
    }
    for (int o = 0; o < MLP_OUTPUTS; ++o) {
      float sum = b2[o];
      for (int h = 0; h < MLP_HIDDEN; ++h) sum += w2[o * MLP_HIDDEN + h] * hidden[h];
      const float error = sum - yr[o];
      loss += (double)error * (double)error / (double)count;
      dout[o] = 2.0f * error / count * scale;
    }
    for (int h = 0; h < MLP_HIDDEN; ++h) dhidden[h] = 0.0f;
    for (int o = 0; o < MLP_OUTPUTS; ++o) {
      db2[o] += dout[o];
      for (int h = 0; h < MLP_HIDDEN; ++h) {
        dw2[o * MLP_HIDDEN + h] += dout[o] * hidden[h];
        dhidden[h] += dout[o] * w2[o * MLP_HIDDEN + h];
      }
    }
    for (int h = 0; h < MLP_HIDDEN; ++h) {
      const float dpre = dhidden[h] * (1.0f - hidden[h] * hidden[h]);
      db1[h] += dpre;
      for (int i = 0; i < MLP_INPUTS; ++i) dw1[h * MLP_INPUTS + i] += dpre * xr[i];
    }
  }
  return loss;
}

#endif /* ZT_EXAMPLES_MLP_PROBLEM_H */
