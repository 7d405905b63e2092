// Bring your own model: parameters in the caller's buffers, trained across ranks (ZeRO stages 0-3)
// against the same program on one process.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <string>
#include <vector>

#include "job_directory.hpp"
#include "mpi_test_main.hpp"
#include "test_helpers.hpp"
#include "zerotrain/data.hpp"
#include "zerotrain/engine.hpp"
#include "zerotrain/external_model.hpp"
#include "zerotrain/mpi_communicator.hpp"

namespace {

constexpr int kIn = 5, kOut = 3, kGlobalBatch = 8, kSteps = 12;

/// y = W x + b with hand-written gradients of the mean squared error, in the caller's vectors.
struct Linear {
  std::vector<float> w = std::vector<float>(kOut * kIn), b = std::vector<float>(kOut);
  std::vector<float> dw = std::vector<float>(kOut * kIn), db = std::vector<float>(kOut);
  Linear() {
    for (int i = 0; i < kOut * kIn; ++i) w[i] = 0.1f * static_cast<float>((i * 7) % 11) - 0.5f;
  }
  double accumulate(const std::vector<float>& x, const std::vector<float>& y, double scale) {
    const int rows = static_cast<int>(x.size()) / kIn;
    double loss = 0;
    for (int r = 0; r < rows; ++r) {
      for (int o = 0; o < kOut; ++o) {
        double out = b[o];
        for (int i = 0; i < kIn; ++i) out += double(w[o * kIn + i]) * x[r * kIn + i];
        const double error = out - y[r * kOut + o];
        loss += error * error / (rows * kOut);
        const auto grad = static_cast<float>(2 * error / (rows * kOut) * scale);
        db[o] += grad;
        for (int i = 0; i < kIn; ++i) dw[o * kIn + i] += grad * x[r * kIn + i];
      }
    }
    return loss;
  }
};

struct Result {
  std::vector<double> losses;
  std::vector<float> w, b;
};

/// `zero_keys`: more zero_optimization keys, from a comma (offload sections).
Result train(int stage, int gas, zt::Communicator* data_parallel, const std::string& zero_keys = "") {
  zt::Runtime& runtime = zt::testing::runtime();
  const int ranks = data_parallel ? data_parallel->size() : runtime.world_size();
  const int micro = kGlobalBatch / ranks / gas;
  zt::Config config = zt::Config::from_string(
      R"({"train_micro_batch_size_per_gpu": )" + std::to_string(micro) +
          R"(, "gradient_accumulation_steps": )" + std::to_string(gas) +
          R"(, "gradient_clipping": 0.0, "optimizer": {"type": "SGD", "params": {"lr": 0.2,
          "momentum": 0.5}}, "zero_optimization": {"stage": )" +
          std::to_string(stage) + zero_keys + "}}",
      zt::ConfigParseOptions{.warning_sink = {}});
  Linear net;
  zt::ExternalModel model;
  model.add("w", net.w.data(), net.dw.data(), {kOut, kIn}, zt::DType::fp32);
  model.add("b", net.b.data(), net.db.data(), {kOut}, zt::DType::fp32);
  zt::Engine engine(runtime, model, config, zt::EngineOptions{.data_parallel = data_parallel});
  zt::SyntheticRegression data(kIn, kOut, 9);
  Result result;
  for (int step = 0; step < kSteps; ++step) {
    for (int a = 0; a < gas; ++a) {
      std::vector<std::uint64_t> ids(static_cast<std::size_t>(micro));
      for (int i = 0; i < micro; ++i) {
        ids[static_cast<std::size_t>(i)] = static_cast<std::uint64_t>(
            step * kGlobalBatch + (a * ranks + engine.data_parallel_rank()) * micro + i);
      }
      std::vector<float> x(static_cast<std::size_t>(micro * kIn)), y(static_cast<std::size_t>(micro * kOut));
      data.fill(ids, x, y);
      const std::vector<float> w_before = net.w;
      model.report_loss(net.accumulate(x, y, 1.0 / gas));
      const bool boundary = engine.step();
      EXPECT_EQ(boundary, a + 1 == gas);
      if (!boundary) {
        EXPECT_EQ(net.w, w_before) << "values must not change between boundaries";
        EXPECT_NE(net.dw, std::vector<float>(net.dw.size(), 0.0f))
            << "gradients accumulate between boundaries";
      }
    }
    // At the boundary the engine wrote the new values back and zeroed the caller's gradients.
    EXPECT_EQ(net.dw, std::vector<float>(net.dw.size(), 0.0f));
    EXPECT_EQ(net.db, std::vector<float>(net.db.size(), 0.0f));
    result.losses.push_back(engine.last_step().loss);
  }
  result.w = net.w;
  result.b = net.b;
  return result;
}

class ExternalModelStages : public ::testing::TestWithParam<int> {};

TEST_P(ExternalModelStages, MatchesTheSingleProcessRun) {
  auto self = zt::make_mpi_communicator(MPI_COMM_SELF, "self");
  const Result baseline = train(0, 1, self.get());
  const Result distributed = train(GetParam(), 1, nullptr);
  const Result accumulated = train(GetParam(), 2, nullptr);
  // SGD is linear in the gradient; only the order of the float sums differs (micro-batch rows on
  // one process vs the all-reduce): 1e-5 relative on the loss, 1e-5 absolute on O(1) weights.
  for (std::size_t i = 0; i < baseline.losses.size(); ++i) {
    EXPECT_NEAR(distributed.losses[i], baseline.losses[i], 1e-5 * baseline.losses[i]) << "step " << i + 1;
    EXPECT_NEAR(accumulated.losses[i], baseline.losses[i], 1e-5 * baseline.losses[i]) << "step " << i + 1;
  }
  for (std::size_t i = 0; i < baseline.w.size(); ++i) {
    EXPECT_NEAR(distributed.w[i], baseline.w[i], 1e-5);
    EXPECT_NEAR(accumulated.w[i], baseline.w[i], 1e-5);
  }
  for (std::size_t i = 0; i < baseline.b.size(); ++i) EXPECT_NEAR(distributed.b[i], baseline.b[i], 1e-5);
  EXPECT_LT(distributed.losses.back(), 0.5 * distributed.losses.front());
}

INSTANTIATE_TEST_SUITE_P(Stages, ExternalModelStages, ::testing::Values(0, 1, 2, 3),
                         [](const auto& param_info) { return "stage" + std::to_string(param_info.param); });

/// The caller's buffers with the optimizer's state offloaded, to the host or to NVMe (the momentum
/// in the swap file, updated sub-group by sub-group): the same run, bit for bit.
TEST(ExternalModel, OptimizerOffloadTrainsAsInMemoryBitwise) {
  zt::testing::JobDirectory directory("zt-external-offload", "ZT_TEST_SWAP_DIR");
  for (int stage : {1, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const Result in_memory = train(stage, 2, nullptr);
    for (const std::string& offload :
         {std::string(R"(, "offload_optimizer": {"device": "cpu"})"),
          R"(, "sub_group_size": 7, "offload_optimizer": {"device": "nvme", "nvme_path": ")" +
              directory.path() + R"(", "buffer_count": 2})"}) {
      SCOPED_TRACE(offload);
      const Result offloaded = train(stage, 2, nullptr, offload);
      EXPECT_EQ(offloaded.losses, in_memory.losses);
      EXPECT_EQ(offloaded.w, in_memory.w);
      EXPECT_EQ(offloaded.b, in_memory.b);
    }
  }
}

/// Stage 3: the engine keeps only this rank's pieces; the caller's buffers get the full values
/// gathered after every update, with the pieces in memory, on NVMe, and with the optimizer's state
/// offloaded too: the same run as stage 2, bit for bit (the update is elementwise, the reduction the
/// same reduce-scatter).
TEST(ExternalModel, Stage3GathersIntoTheCallersBuffersBitwise) {
  zt::testing::JobDirectory directory("zt-external-stage3", "ZT_TEST_SWAP_DIR");
  const Result stage2 = train(2, 2, nullptr);
  for (const std::string& offload :
       {std::string(), std::string(R"(, "allgather_bucket_size": 4)"),
        R"(, "offload_param": {"device": "nvme", "nvme_path": ")" + directory.path() +
            R"(", "buffer_count": 2, "max_in_cpu": 0}, "offload_optimizer": {"device": "cpu"})"}) {
    SCOPED_TRACE(offload);
    const Result stage3 = train(3, 2, nullptr, offload);
    EXPECT_EQ(stage3.losses, stage2.losses);
    EXPECT_EQ(stage3.w, stage2.w);
    EXPECT_EQ(stage3.b, stage2.b);
  }
}

TEST(ExternalModel, RejectsBadBuffers) {
  zt::ExternalModel model;
  std::vector<float> values(4), grads(4);
  EXPECT_NE(zt::testing::error_of([&] {
              model.add("w", nullptr, grads.data(), {4}, zt::DType::fp32);
            }).find("must not be null"),
            std::string::npos);
  EXPECT_NE(zt::testing::error_of([&] {
              model.add("w", values.data(), values.data(), {4}, zt::DType::fp32);
            }).find("different buffers"),
            std::string::npos);
  model.add("w", values.data(), grads.data(), {4}, zt::DType::fp32);
  EXPECT_NE(zt::testing::error_of([&] {
              model.add("w", values.data(), grads.data(), {4}, zt::DType::fp32);
            }).find("twice"),
            std::string::npos);
  EXPECT_NE(zt::testing::error_of([&] {
              model.run_forward(zt::Tensor::zeros({1}, zt::DType::fp32));
            }).find("the caller runs forward and backward"),
            std::string::npos);
}

}  // namespace
