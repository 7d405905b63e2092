// The C++ twin of mlp.c: the same MLP (mlp_problem.h), data and config, trained through the C++ API
// with a zt::ExternalModel. Its losses are the reference the C and Fortran examples must match bit
// for bit (ctest examples.c_fortran.*).
//
//   mpirun -n 2 build/bin/zt_example_c_mlp_cxx [steps] [zero stage] [more zero_optimization members]
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "mlp_problem.h"
#include "zerotrain/zerotrain.hpp"

int main(int argc, char** argv) {
  zt::Runtime runtime(&argc, &argv);
  return zt::run_and_report([&] {
    const int steps = argc > 1 ? std::atoi(argv[1]) : 30;
    const int stage = argc > 2 ? std::atoi(argv[2]) : 1;
    const std::string zero_extra = argc > 3 ? argv[3] : "";
    const zt::Config config = zt::Config::from_string(
        R"({"train_micro_batch_size_per_gpu": )" + std::to_string(MLP_MICRO_BATCH) +
        R"(, "gradient_accumulation_steps": 2, "gradient_clipping": 0.0, "optimizer": {"type": "AdamW",
        "params": {"lr": 0.01}}, "zero_optimization": {"stage": )" +
        std::to_string(stage) + (zero_extra.empty() ? "" : ", " + zero_extra) + "}}");

    static float w1[MLP_HIDDEN * MLP_INPUTS], b1[MLP_HIDDEN], w2[MLP_OUTPUTS * MLP_HIDDEN], b2[MLP_OUTPUTS];
    static float dw1[MLP_HIDDEN * MLP_INPUTS], db1[MLP_HIDDEN], dw2[MLP_OUTPUTS * MLP_HIDDEN],
        db2[MLP_OUTPUTS];
    mlp_init(w1, b1, w2, b2);
    zt::ExternalModel model;
    model.add("w1", w1, dw1, {MLP_HIDDEN, MLP_INPUTS}, zt::DType::fp32);
    model.add("b1", b1, db1, {MLP_HIDDEN}, zt::DType::fp32);
    model.add("w2", w2, dw2, {MLP_OUTPUTS, MLP_HIDDEN}, zt::DType::fp32);
    model.add("b2", b2, db2, {MLP_OUTPUTS}, zt::DType::fp32);
    auto engine = zt::initialize(runtime, model, config);
    const zt::BatchSizes& batch = engine->batch();
    if (runtime.world_rank() == 0) {
      std::printf("mlp (C++ API): %d ranks, ZeRO stage %d, batch %lld = %lld x %lld x %d\n",
                  batch.data_parallel_size, stage, static_cast<long long>(batch.train_batch_size),
                  static_cast<long long>(batch.train_micro_batch_size_per_gpu),
                  static_cast<long long>(batch.gradient_accumulation_steps), batch.data_parallel_size);
      std::printf("rank 0: optimizer states: %s; parameters: %s\n",
                  engine->optimizer_states_placement().describe().c_str(),
                  engine->parameters_placement().describe().c_str());
    }
    float x[MLP_MICRO_BATCH * MLP_INPUTS], y[MLP_MICRO_BATCH * MLP_OUTPUTS];
    const float scale = 1.0f / static_cast<float>(batch.gradient_accumulation_steps);
    for (int step = 0; step < steps; ++step) {
      for (std::int64_t micro = 0; micro < batch.gradient_accumulation_steps; ++micro) {
        const std::int64_t first =
            step * batch.train_batch_size +
            (micro * batch.data_parallel_size + engine->data_parallel_rank()) * MLP_MICRO_BATCH;
        for (int r = 0; r < MLP_MICRO_BATCH; ++r)
          mlp_sample(first + r, x + r * MLP_INPUTS, y + r * MLP_OUTPUTS);
        model.report_loss(
            mlp_forward_backward(w1, b1, w2, b2, dw1, db1, dw2, db2, x, y, MLP_MICRO_BATCH, scale));
        engine->step();
      }
      const zt::StepReport& report = engine->last_step();
      unsigned long long bits = 0;
      std::memcpy(&bits, &report.loss, sizeof bits);
      if (runtime.world_rank() == 0)
        std::printf("step %3lld loss %.6f bits %016llX\n", static_cast<long long>(report.step), report.loss,
                    bits);
    }
    return 0;
  });
}
