// save_checkpoint called on one rank only: that rank gets an error after
// ZT_CHECKPOINT_SYNC_TIMEOUT seconds and the job ends with it, while the other ranks wait
// elsewhere; never a hang.
#include <filesystem>
#include <string>

#include "zerotrain/config.hpp"
#include "zerotrain/engine.hpp"
#include "zerotrain/runtime.hpp"

int main(int argc, char** argv) {
  zt::Runtime runtime(&argc, &argv);
  return zt::run_and_report([&] {
    const zt::Config config = zt::Config::from_string(
        R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
            "model": {"type": "mlp", "sizes": [4, 8, 2]}})");
    auto model = zt::build_model(config);
    zt::Engine engine(runtime, *model, config);
    const std::string dir = (std::filesystem::temp_directory_path() / "zt-checkpoint-misuse").string();
    if (runtime.world_rank() == 0) engine.save_checkpoint(dir);  // the others never call it
    runtime.world().barrier();
    return 0;
  });
}
