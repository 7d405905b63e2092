// Bring your own model: a hand-written two-layer network whose weights live in plain std::vectors,
// trained with zerotrain's optimizer, gradient reduction across MPI ranks and ZeRO-1 partitioning.
// zerotrain never sees the forward or backward pass: the code below computes gradients into its
// own buffers and calls engine->step().
//
//   mpirun -n 2 build/bin/zt_example_byo_model [steps]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "zerotrain/zerotrain.hpp"

namespace {

constexpr int kInputs = 16, kHidden = 32, kOutputs = 4, kMicroBatch = 8;

/// The user's model: y = W2 tanh(W1 x + b1) + b2, with hand-written backward.
struct TwoLayerNet {
  std::vector<float> w1, b1, w2, b2;      // values
  std::vector<float> dw1, db1, dw2, db2;  // gradients (accumulated with +=)

  explicit TwoLayerNet(unsigned seed)
      : w1(kHidden * kInputs),
        b1(kHidden),
        w2(kOutputs * kHidden),
        b2(kOutputs),
        dw1(w1.size()),
        db1(b1.size()),
        dw2(w2.size()),
        db2(b2.size()) {
    std::mt19937 engine(seed);
    std::normal_distribution<float> normal(0.0f, 0.3f);
    for (float& w : w1) w = normal(engine);
    for (float& w : w2) w = normal(engine);
  }

  /// Mean squared error of one micro-batch; gradients of (loss * scale) accumulate into d*.
  double forward_backward(const std::vector<float>& x, const std::vector<float>& y, double scale) {
    double loss = 0;
    const int rows = static_cast<int>(x.size()) / kInputs;
    std::vector<float> hidden(kHidden), out(kOutputs), dout(kOutputs), dhidden(kHidden);
    for (int r = 0; r < rows; ++r) {
      const float* xr = &x[static_cast<std::size_t>(r) * kInputs];
      for (int h = 0; h < kHidden; ++h) {
        float sum = b1[h];
        for (int i = 0; i < kInputs; ++i) sum += w1[h * kInputs + i] * xr[i];
        hidden[h] = std::tanh(sum);
      }
      for (int o = 0; o < kOutputs; ++o) {
        float sum = b2[o];
        for (int h = 0; h < kHidden; ++h) sum += w2[o * kHidden + h] * hidden[h];
        const float error = sum - y[static_cast<std::size_t>(r) * kOutputs + o];
        loss += double(error) * error / (rows * kOutputs);
        dout[o] = static_cast<float>(2.0 * error / (rows * kOutputs) * scale);
      }
      for (int h = 0; h < kHidden; ++h) dhidden[h] = 0;
      for (int o = 0; o < kOutputs; ++o) {
        db2[o] += dout[o];
        for (int h = 0; h < kHidden; ++h) {
          dw2[o * kHidden + h] += dout[o] * hidden[h];
          dhidden[h] += dout[o] * w2[o * kHidden + h];
        }
      }
      for (int h = 0; h < kHidden; ++h) {
        const float dpre = dhidden[h] * (1 - hidden[h] * hidden[h]);
        db1[h] += dpre;
        for (int i = 0; i < kInputs; ++i) dw1[h * kInputs + i] += dpre * xr[i];
      }
    }
    return loss;
  }
};

}  // namespace

int main(int argc, char** argv) {
  zt::Runtime runtime(&argc, &argv);
  return zt::run_and_report([&] {
    const int steps = argc > 1 ? std::atoi(argv[1]) : 200;
    zt::Config config = zt::Config::from_string(R"({
      "train_micro_batch_size_per_gpu": 8,
      "gradient_accumulation_steps": 2,
      "gradient_clipping": 0.0,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
      "zero_optimization": {"stage": 1}
    })");

    TwoLayerNet net(/*seed=*/7);  // the same initial weights on every rank
    zt::ExternalModel model;
    model.add("w1", net.w1.data(), net.dw1.data(), {kHidden, kInputs}, zt::DType::fp32);
    model.add("b1", net.b1.data(), net.db1.data(), {kHidden}, zt::DType::fp32);
    model.add("w2", net.w2.data(), net.dw2.data(), {kOutputs, kHidden}, zt::DType::fp32);
    model.add("b2", net.b2.data(), net.db2.data(), {kOutputs}, zt::DType::fp32);
    auto engine = zt::initialize(runtime, model, config);
    const auto& batch = engine->batch();

    // Data: y = tanh(A x) for a fixed random A, each sample a function of its global index; rank r
    // of N takes its slice of every global batch.
    zt::SyntheticRegression data(kInputs, kOutputs, /*seed=*/3);
    std::vector<float> x(kMicroBatch * kInputs), y(kMicroBatch * kOutputs);
    std::vector<std::uint64_t> ids(kMicroBatch);
    for (int step = 0; step < steps; ++step) {
      for (int micro = 0; micro < batch.gradient_accumulation_steps; ++micro) {
        const std::uint64_t first =
            static_cast<std::uint64_t>(step) * batch.train_batch_size +
            static_cast<std::uint64_t>(micro * batch.data_parallel_size + engine->data_parallel_rank()) *
                kMicroBatch;
        for (int i = 0; i < kMicroBatch; ++i) ids[i] = (first + i) % data.num_samples();
        data.fill(ids, x, y);
        // Mean over the global batch's micro-batches: scale each by 1/accumulation steps.
        model.report_loss(net.forward_backward(x, y, 1.0 / batch.gradient_accumulation_steps));
        engine->step();  // at the boundary: reduce, update, write w1..b2, zero dw1..db2
      }
      if (runtime.world_rank() == 0 && (step % 50 == 0 || step + 1 == steps)) {
        std::printf("step %4d  loss %.5f\n", step + 1, engine->last_step().loss);
      }
    }
    return 0;
  });
}
