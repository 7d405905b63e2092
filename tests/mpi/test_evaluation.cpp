// The validation loss of zt::train (src/engine/evaluation.*, docs/config.md "eval"): the same value,
// bitwise, at every world size, ZeRO stage and pipeline split, equal to an eval of the same samples
// on one rank; it leaves the training untouched (losses with and without it, resume exact), a GPT
// with dropout included.
#include <gtest/gtest.h>

#include <mpi.h>

#include <cmath>
#include <string>
#include <vector>

#include "engine_runs.hpp"
#include "job_directory.hpp"
#include "src/engine/evaluation.hpp"
#include "zerotrain/data.hpp"

namespace {

using namespace zt::testing::engine_runs;

constexpr int kGlobalBatch = 8;
constexpr int kMicro = 2;
constexpr int kEvalBatches = 3;  // 24 eval samples of seq_len 16
constexpr std::int64_t kSeqLen = 16;
// With dropout: the evaluation must switch it off (the layouts' ranks would draw different masks)
// and must not move its streams (the training after it would change).
constexpr const char* kDropoutGpt =
    R"({"type": "gpt", "n_layer": 2, "n_head": 2, "d_model": 32, "seq_len": 16, "vocab_size": 256, "dropout": 0.1})";

/// An eval token file (a stretch of the built-in corpus the training does not start with), written
/// by rank 0, seen by all.
std::string write_eval_tokens(const zt::testing::JobDirectory& directory) {
  const std::string path = directory / "eval.tok";
  if (zt::testing::runtime().world_rank() == 0) {
    const std::vector<std::uint32_t>& corpus = zt::builtin_corpus_tokens();
    const std::vector<std::uint32_t> tokens(corpus.begin() + 700000, corpus.begin() + 700000 + 1000);
    zt::write_token_file(path, tokens, zt::kByteVocabSize);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return path;
}

std::string eval_config(int zero_stage, int stages, const std::string& eval_path, int interval = 0) {
  const int data = zt::testing::runtime().world_size() / stages;
  std::string extra = R"(, "train_batch_size": )" + std::to_string(kGlobalBatch) +
                      R"(, "zero_optimization": {"stage": )" + std::to_string(zero_stage) +
                      R"(}, "eval": {"data": ")" + eval_path + R"(", "interval": )" +
                      std::to_string(interval) + R"(, "batches": )" + std::to_string(kEvalBatches) + "}";
  if (stages > 1) extra += R"(, "pipeline": {"stages": )" + std::to_string(stages) + "}";
  return gpt_config(kMicro, kGlobalBatch / (kMicro * data), extra, kAdamW, kDropoutGpt);
}

/// The layouts this world size can run: (ZeRO stage, pipeline stages).
std::vector<std::pair<int, int>> layouts() {
  std::vector<std::pair<int, int>> result = {{0, 1}, {1, 1}, {2, 1}, {3, 1}};
  const int world = zt::testing::runtime().world_size();
  if (world >= 2) result.emplace_back(0, 2);
  if (world == 4) result.emplace_back(1, 2);
  return result;
}

/// The same eval set on this rank alone: micro-batches of kMicro consecutive eval samples (the
/// blocks every layout's ranks take) through Engine::eval_rows, summed in sample order; and through
/// the plain Engine::eval (the mean over each micro-batch's positions), averaged.
struct OneRankEval {
  double rows = 0.0;
  double means = 0.0;
};

OneRankEval one_rank_eval(const std::string& eval_path) {
  const zt::Config config =
      parse(gpt_config(kMicro, kGlobalBatch / kMicro,
                       R"(, "train_batch_size": )" + std::to_string(kGlobalBatch), kAdamW, kDropoutGpt));
  auto model = zt::build_model(config);
  auto self = zt::testing::engine_runs::self_communicator();
  zt::Engine alone(zt::testing::runtime(), *model, config, {.data_parallel = self.get()});
  const zt::TokenDataset dataset = zt::TokenDataset::open(eval_path);
  zt::BatchLoader loader(dataset.view(), {.seq_len = kSeqLen}, {.micro_batch = kMicro}, 0, 0,
                         /*shuffle=*/false);
  OneRankEval result;
  double row_sum = 0.0, mean_sum = 0.0;
  const int blocks = kEvalBatches * kGlobalBatch / kMicro;
  for (int block = 0; block < blocks; ++block) {
    const zt::BatchLoader::MicroBatch micro = loader.load(0);
    const zt::Batch batch{zt::Tensor::from_vector(micro.inputs, {kMicro, kSeqLen}),
                          zt::Tensor::from_vector(micro.targets, {kMicro, kSeqLen})};
    for (const double loss : alone.eval_rows(batch)) row_sum += loss;
    mean_sum += alone.eval(batch);
    loader.advance();
  }
  result.rows = row_sum / (kEvalBatches * kGlobalBatch);
  result.means = mean_sum / blocks;
  return result;
}

struct Built {
  std::unique_ptr<zt::nn::Module> model;
  std::unique_ptr<zt::Engine> engine;
};

Built build(const zt::Config& config) {
  zt::Runtime& runtime = zt::testing::runtime();
  Built built;
  const int stages = static_cast<int>(config.pipeline.stage_count());
  built.model =
      stages > 1 ? zt::build_model(config, zt::pipeline_stage_of(runtime, config)) : zt::build_model(config);
  built.engine = std::make_unique<zt::Engine>(runtime, *built.model, config);
  return built;
}

TEST(Evaluation, SameLossAtEveryWorldSizeStageAndPipelineAsOnOneRank) {
  const zt::testing::JobDirectory directory("zt-evaluation");
  const std::string eval_path = write_eval_tokens(directory);
  const OneRankEval expected = one_rank_eval(eval_path);
  EXPECT_GT(expected.rows, 0.0);
  // Mean of row means and mean of micro-batch means are the same number in exact arithmetic.
  EXPECT_NEAR(expected.rows, expected.means, 1e-12 * expected.rows);
  for (const auto& [zero_stage, stages] : layouts()) {
    SCOPED_TRACE("ZeRO stage " + std::to_string(zero_stage) + ", pipeline " + std::to_string(stages));
    const zt::Config config = parse(eval_config(zero_stage, stages, eval_path));
    Built built = build(config);
    zt::engine_detail::Evaluator evaluator(zt::testing::runtime(), built.engine->config(), *built.engine,
                                           eval_path);
    EXPECT_EQ(evaluator.samples(), kEvalBatches * kGlobalBatch);
    const zt::engine_detail::EvalResult result = evaluator.run(*built.engine);
    EXPECT_EQ(result.loss, expected.rows);  // bitwise: the same rows, summed in the same order
    EXPECT_EQ(result.perplexity, std::exp(expected.rows));
    EXPECT_EQ(result.tokens, kEvalBatches * kGlobalBatch * kSeqLen);
    // A second evaluation reads the same samples again.
    EXPECT_EQ(evaluator.run(*built.engine).loss, expected.rows);
  }
}

TEST(Evaluation, LeavesTheTrainingUntouched) {
  // Three steps with an evaluation after each give the losses and weights of three steps without.
  const zt::testing::JobDirectory directory("zt-evaluation");
  const std::string eval_path = write_eval_tokens(directory);
  for (const auto& [zero_stage, stages] : layouts()) {
    SCOPED_TRACE("ZeRO stage " + std::to_string(zero_stage) + ", pipeline " + std::to_string(stages));
    const zt::Config config = parse(eval_config(zero_stage, stages, eval_path));
    std::vector<std::vector<double>> losses(2);
    std::vector<double> evals;
    for (int with_eval = 0; with_eval < 2; ++with_eval) {
      Built built = build(config);
      zt::Engine& engine = *built.engine;
      auto data = zt::make_training_data(engine.config(), engine, std::nullopt);
      zt::engine_detail::Evaluator evaluator(zt::testing::runtime(), engine.config(), engine, eval_path);
      for (int step = 0; step < 3; ++step) {
        engine.train_batch([&](std::int64_t micro) { return data->load(static_cast<std::uint64_t>(micro)); });
        data->advance();
        losses[with_eval].push_back(engine.last_step().loss);
        if (with_eval == 1) evals.push_back(evaluator.run(engine).loss);
      }
      EXPECT_EQ(engine.global_steps(), 3);
      EXPECT_EQ(engine.global_samples(), 3 * kGlobalBatch);
    }
    EXPECT_EQ(losses[0], losses[1]);
    ASSERT_EQ(evals.size(), 3U);
    for (const double eval : evals) EXPECT_TRUE(std::isfinite(eval) && eval > 0.0) << eval;
    EXPECT_NE(evals[0], evals[2]);  // the parameters the evaluation sees are the trained ones
  }
}

TEST(Evaluation, ResumeWithEvalIsBitwiseTheUninterruptedRun) {
  // zt::train with eval every 2 steps: 6 steps at once, and 3 steps saved then resumed to 6, give
  // the same training losses and the same validation losses at steps 4 and 6.
  const zt::testing::JobDirectory directory("zt-evaluation");
  const std::string eval_path = write_eval_tokens(directory);
  for (const int zero_stage : {0, 3}) {
    SCOPED_TRACE("ZeRO stage " + std::to_string(zero_stage));
    const zt::Config config = parse(eval_config(zero_stage, 1, eval_path, 2));
    struct Trace {
      std::vector<double> losses;
      zt::TrainSummary summary;
    };
    auto train = [&](std::int64_t steps, const std::string& save_dir, bool resume) {
      Trace trace;
      zt::TrainOptions options;
      options.steps = steps;
      options.print_every = 0;
      if (!save_dir.empty()) options.save_dir = save_dir;
      if (resume) options.resume = "auto";
      options.on_step = [&](const zt::StepReport& report) { trace.losses.push_back(report.loss); };
      trace.summary = zt::train(zt::testing::runtime(), config, options);
      return trace;
    };
    const Trace whole = train(6, "", false);
    EXPECT_EQ(whole.summary.evaluations, 3);  // steps 2, 4, 6
    const std::string save_dir = directory / ("ckpt" + std::to_string(zero_stage));
    const Trace first = train(3, save_dir, false);
    EXPECT_EQ(first.summary.evaluations, 2);  // step 2 and the end (step 3)
    const Trace second = train(6, save_dir, true);
    EXPECT_EQ(second.summary.resumed_from_step, 3);
    EXPECT_EQ(second.summary.evaluations, 2);  // steps 4 and 6
    std::vector<double> joined = first.losses;
    joined.insert(joined.end(), second.losses.begin(), second.losses.end());
    EXPECT_EQ(joined, whole.losses);
    ASSERT_TRUE(whole.summary.last_eval_loss && second.summary.last_eval_loss);
    EXPECT_EQ(*second.summary.last_eval_loss, *whole.summary.last_eval_loss);
  }
}

TEST(Evaluation, TooFewEvalSamplesAreRefusedWithTheNumbers) {
  const zt::testing::JobDirectory directory("zt-evaluation");
  const std::string path = directory / "short.tok";
  if (zt::testing::runtime().world_rank() == 0) {
    const std::vector<std::uint32_t> tokens(100, 7);  // 6 samples of 16
    zt::write_token_file(path, tokens, zt::kByteVocabSize);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const zt::Config config = parse(eval_config(0, 1, path));
  Built built = build(config);
  try {
    zt::engine_detail::Evaluator evaluator(zt::testing::runtime(), built.engine->config(), *built.engine,
                                           path);
    FAIL() << "no error for 6 eval samples where 24 are needed";
  } catch (const zt::ConfigError& error) {
    EXPECT_NE(std::string(error.what())
                  .find("eval.batches 3 x train_batch_size 8 = 24 eval samples, but the "
                        "eval data (token file " +
                        path + " (100 tokens, 6 samples of 16)) holds 6"),
              std::string::npos)
        << error.what();
  }
}

}  // namespace
