// Real checkpoints for the `zerotrain checkpoint` tests, and damage to one of them.
//
//   mpirun -n 2 zt_test_checkpoint_maker save DIR STEPS   empty DIR, train a small GPT (ZeRO stage 2)
//                                                          for STEPS steps, saving after each
//                                                          (global_step1..N)
//   zt_test_checkpoint_maker corrupt FILE DATASET          flip one byte inside DATASET's stored data
//                                                          (its offset found with HDF5 itself)
#include <hdf5.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "zerotrain/checkpoint.hpp"
#include "zerotrain/engine.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/runtime.hpp"
#include "zerotrain/trainer.hpp"

namespace {

constexpr const char* kConfig = R"({
  "train_micro_batch_size_per_gpu": 2,
  "gradient_accumulation_steps": 1,
  "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.01}},
  "zero_optimization": {"stage": 2},
  "model": {"type": "gpt", "n_layer": 2, "n_head": 2, "d_model": 32, "seq_len": 16, "vocab_size": 256},
  "data": {"format": "builtin", "seed": 5},
  "seed": 11
})";

int save(zt::Runtime& runtime, const std::string& dir, int steps) {
  if (runtime.world_rank() == 0) std::filesystem::remove_all(dir);
  runtime.world().barrier();
  const zt::Config config = zt::Config::from_string(kConfig);
  auto model = zt::build_model(config);
  zt::Engine engine(runtime, *model, config);
  auto data = zt::make_training_data(engine.config(), engine, std::nullopt);
  for (int step = 1; step <= steps; ++step) {
    for (std::int64_t micro = 0; micro < engine.batch().gradient_accumulation_steps; ++micro) {
      engine.forward(data->load(static_cast<std::uint64_t>(micro)));
      engine.backward();
      engine.step();
    }
    data->advance();
    zt::SaveOptions options;
    options.client_state = R"({"made_by": "zt_test_checkpoint_maker", "step": )" + std::to_string(step) + "}";
    options.data_position = data->position();
    const std::string tag = engine.save_checkpoint(dir, options);
    if (runtime.world_rank() == 0) {
      std::printf("saved %s (loss %.4f)\n", zt::checkpoint_file(dir, tag).c_str(), engine.last_step().loss);
    }
  }
  return 0;
}

int corrupt(const std::string& path, const std::string& dataset) {
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ZT_CHECK_AS(zt::IoError, file >= 0, "cannot open '", path, "' with HDF5");
  const hid_t handle = H5Dopen2(file, dataset.c_str(), H5P_DEFAULT);
  const haddr_t offset = handle >= 0 ? H5Dget_offset(handle) : HADDR_UNDEF;
  if (handle >= 0) H5Dclose(handle);
  H5Fclose(file);
  ZT_CHECK_AS(zt::IoError, offset != HADDR_UNDEF, "'", path, "' has no contiguous dataset '", dataset, "'");
  std::fstream bytes(path, std::ios::in | std::ios::out | std::ios::binary);
  const auto at = static_cast<std::streamoff>(offset + 40);
  bytes.seekg(at);
  char byte = 0;
  bytes.read(&byte, 1);
  byte = static_cast<char>(byte ^ 0x5a);
  bytes.seekp(at);
  bytes.write(&byte, 1);
  ZT_CHECK_AS(zt::IoError, bytes.good(), "cannot rewrite byte ", offset + 40, " of '", path, "'");
  std::printf("flipped byte %llu of %s (inside %s)\n", static_cast<unsigned long long>(offset + 40),
              path.c_str(), dataset.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  zt::Runtime runtime(&argc, &argv);
  return zt::run_and_report([&]() -> int {
    const std::string_view command = argc > 1 ? argv[1] : "";
    if (command == "save" && argc == 4) return save(runtime, argv[2], std::atoi(argv[3]));
    if (command == "corrupt" && argc == 4) return runtime.world_rank() == 0 ? corrupt(argv[2], argv[3]) : 0;
    ZT_THROW_AS(zt::ConfigError, "usage: zt_test_checkpoint_maker save DIR STEPS | corrupt FILE DATASET");
  });
}
