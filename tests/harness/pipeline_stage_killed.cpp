// A pipeline stage that dies mid-step, for the watchdog tests (tests/harness/CMakeLists.txt): the
// built-in GPT in two stages over the world (stages x world / 2 data-parallel ranks) trains through
// Engine::train_batch; at the second step the last rank (on the last stage) kills itself with
// SIGKILL when its schedule loads the first micro-batch. The first stage then waits for that
// micro-batch's gradient from the dead rank (a receive on the pipeline group), the last stage's
// other data-parallel ranks in its gradient reduction: the job must end with a report naming the
// lost rank, not hang. Should nothing end it, the surviving ranks stay blocked and the test's time
// limit (expect_failure.cmake) reports the hang.
#include <csignal>
#include <cstdio>
#include <string>

#include "zerotrain/engine.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/runtime.hpp"
#include "zerotrain/trainer.hpp"

namespace {

constexpr const char* kConfig = R"({
  "train_micro_batch_size_per_gpu": 2,
  "gradient_accumulation_steps": 4,
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
  "zero_optimization": {"stage": 1},
  "pipeline": {"stages": 2},
  "model": {"type": "gpt", "n_layer": 2, "n_head": 2, "d_model": 32, "seq_len": 16, "vocab_size": 256},
  "data": {"format": "builtin"},
  "seed": 7
})";

}  // namespace

int main(int argc, char** argv) {
  zt::Runtime runtime(&argc, &argv);
  return zt::run_and_report([&] {
    ZT_CHECK(runtime.world_size() % 2 == 0, "pipeline_stage_killed needs an even number of ranks, got ",
             runtime.world_size());
    const zt::Config config = zt::Config::from_string(kConfig);
    auto stage = zt::build_model(config, zt::pipeline_stage_of(runtime, config));
    zt::Engine engine(runtime, *stage, config);
    auto data = zt::make_training_data(engine.config(), engine, std::nullopt);
    const bool culprit = runtime.world_rank() == runtime.world_size() - 1;
    for (int step = 0; step < 3; ++step) {
      engine.train_batch([&](std::int64_t micro) {
        if (culprit && step == 1 && micro == 0) {
          std::fprintf(stderr, "pipeline_stage_killed: rank %d (stage 1) kills itself at step 2\n",
                       runtime.world_rank());
          std::fflush(stderr);
          std::raise(SIGKILL);
        }
        return data->load(static_cast<std::uint64_t>(micro));
      });
      data->advance();
      if (runtime.world_rank() == 0)
        std::printf("pipeline_stage_killed: step %d done, loss %.4f\n", step + 1, engine.last_step().loss);
      std::fflush(stdout);
    }
    std::printf("pipeline_stage_killed: every step completed, which it must not\n");
    return 0;
  });
}
