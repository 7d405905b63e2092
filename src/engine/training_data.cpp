// The data sources of `zerotrain train`.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <variant>

#include "base/text.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/execution.hpp"
#include "zerotrain/trainer.hpp"

namespace zt {
namespace {

std::uint64_t data_seed(const Config& config) {
  return config.data.value_or(DataConfig{}).seed.value_or(config.seed);
}

/// Token windows for a GPT from a token file, a text file or the built-in corpus.
class TokenTrainingData final : public TrainingData {
 public:
  /// `evaluation`: the eval data at path_override (its format detected, not the config's
  /// data.format) in file order, without shuffling.
  TokenTrainingData(const Config& config, const Engine& engine,
                    const std::optional<std::string>& path_override, bool evaluation = false) {
    const auto& model = std::get<GptModelConfig>(*config.model);
    const DataConfig data = config.data.value_or(DataConfig{});
    const std::optional<std::string> path = path_override ? path_override : data.path;
    DataFormat format = evaluation ? DataFormat::automatic : data.format;
    if (path_override && (format == DataFormat::builtin || format == DataFormat::synthetic)) {
      format = DataFormat::automatic;  // --data PATH wins over a config that names no file
    }
    if (format == DataFormat::synthetic) {
      ZT_THROW_AS(ConfigError,
                  "data.format \"synthetic\" is for MLP models; a GPT trains on tokens: use \"builtin\", "
                  "\"tokens\" or \"text\"");
    }
    if (format == DataFormat::automatic) format = path ? detect_format(*path) : DataFormat::builtin;
    if (path && format == DataFormat::text) require_data_file(*path);
    switch (format) {
      case DataFormat::builtin:
        tokens_ = builtin_corpus_view();
        description_ = "built-in corpus";
        break;
      case DataFormat::tokens: {
        // Any of the token formats, one file or shards (docs/data.md). The checksum of ZTTOKENS
        // files once at the start (docs/benchmarks.md, "Token files": about 1 s per GB here) rather
        // than a damaged file trained on for hours; every token of the others checked < vocab_size.
        TokenCorpusOptions corpus_options;
        corpus_options.vocab_size = static_cast<std::uint32_t>(model.vocab_size);
        corpus_options.verify_checksums = true;
        corpus_ = std::make_unique<TokenCorpus>(TokenCorpus::open(require_path(path), corpus_options));
        tokens_ = corpus_->view();
        description_ = corpus_->description();
        break;
      }
      case DataFormat::text: {
        std::ifstream in(require_path(path), std::ios::binary);
        ZT_CHECK_AS(IoError, in.good(), "cannot open text file '", *path, "': ", base::errno_text(errno));
        const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        text_tokens_ = tokenize_bytes(text);
        text_path_ = *path;  // the view's name for messages: it must outlive this constructor
        tokens_ = TokenView(std::span<const std::uint32_t>(text_tokens_), kByteVocabSize, text_path_);
        description_ = "text file " + *path + " (bytes as tokens)";
        break;
      }
      default:
        ZT_THROW_AS(ConfigError, "data.format: unexpected value");
    }
    ZT_CHECK_AS(ConfigError, tokens_.vocab_size() <= static_cast<std::uint64_t>(model.vocab_size),
                "the data (", description_, ") has a vocabulary of ", tokens_.vocab_size(),
                " tokens but model.vocab_size is ", model.vocab_size,
                "; set model.vocab_size >= ", tokens_.vocab_size());
    const BatchSizes& batch = engine.batch();
    windows_ = SampleWindows{static_cast<std::uint64_t>(model.seq_len), 0};
    ZT_CHECK_AS(ConfigError, windows_.count(tokens_.size()) > 0, "the data (", description_, ") has ",
                tokens_.size(), " tokens: not one sample of seq_len ", model.seq_len, " + 1");
    loader_ = std::make_unique<BatchLoader>(
        tokens_, windows_,
        BatchShape{static_cast<std::uint64_t>(batch.train_micro_batch_size_per_gpu),
                   static_cast<std::uint64_t>(batch.gradient_accumulation_steps),
                   static_cast<std::uint64_t>(batch.data_parallel_size)},
        static_cast<std::uint64_t>(engine.data_parallel_rank()), data_seed(config), /*shuffle=*/!evaluation);
    description_ += " (" + std::to_string(tokens_.size()) + " tokens, " +
                    std::to_string(loader_->num_samples()) + " samples of " + std::to_string(model.seq_len) +
                    ")";
    micro_batch_ = batch.train_micro_batch_size_per_gpu;
  }

  Batch load(std::uint64_t micro_step) override {
    const auto seq_len = static_cast<std::int64_t>(windows_.seq_len);
    Batch batch{
        ExecutionContext::host().empty({micro_batch_, seq_len}, DType::int32, MemoryCategory::activations),
        ExecutionContext::host().empty({micro_batch_, seq_len}, DType::int32, MemoryCategory::activations)};
    const auto count = static_cast<std::size_t>(micro_batch_ * seq_len);
    loader_->load(micro_step, {batch.inputs.data<std::int32_t>(), count},
                  {batch.targets.data<std::int32_t>(), count});
    return batch;
  }
  void advance() override { loader_->advance(); }
  DataPosition position() const override { return loader_->position(); }
  std::vector<std::uint64_t> sample_ids(std::uint64_t micro_step) const override {
    return loader_->sample_ids(micro_step);
  }
  void restore(const DataPosition& position) override { loader_->restore(position); }
  std::string description() const override { return description_; }
  std::uint64_t tokens_per_sample() const override { return windows_.seq_len; }

 private:
  /// A data path must name a regular file; a directory would otherwise surface as a stream error
  /// without the path ("basic_filebuf::underflow").
  static void require_data_file(const std::string& path) {
    std::error_code error;
    const std::filesystem::file_status status = std::filesystem::status(path, error);
    constexpr const char* expected =
        "expected a token file (ZTTOKENS from `zerotrain data convert` or zt::write_token_file, .npy, llm.c "
        ".bin, Megatron .bin + .idx), a directory or glob of them, or a text file";
    ZT_CHECK_AS(IoError, std::filesystem::exists(status), "data file '", path, "' does not exist (",
                error ? error.message() : std::string("no such file"), "); ", expected);
    ZT_CHECK_AS(IoError, !std::filesystem::is_directory(status), "data path '", path, "' is a directory; ",
                expected);
    ZT_CHECK_AS(IoError, std::filesystem::is_regular_file(status), "data path '", path,
                "' is not a regular file; ", expected);
  }
  /// Tokens: a file of a token format by its header, a directory or glob of shards, a Megatron
  /// PREFIX; text: any other file.
  static DataFormat detect_format(const std::string& path) {
    if (is_token_data_path(path)) return DataFormat::tokens;
    require_data_file(path);
    return DataFormat::text;
  }
  static const std::string& require_path(const std::optional<std::string>& path) {
    ZT_CHECK_AS(ConfigError, path.has_value(), "data.format needs a file: set data.path or pass --data PATH");
    return *path;
  }

  std::unique_ptr<TokenCorpus> corpus_;
  std::vector<std::uint32_t> text_tokens_;
  std::string text_path_;
  TokenView tokens_;
  SampleWindows windows_;
  std::unique_ptr<BatchLoader> loader_;
  std::string description_;
  std::int64_t micro_batch_ = 1;
};

/// Synthetic regression samples for an MLP, sharded with the same sampler rule as tokens.
class SyntheticTrainingData final : public TrainingData {
 public:
  SyntheticTrainingData(const Config& config, const Engine& engine)
      : sizes_(std::get<MlpModelConfig>(*config.model).sizes),
        data_(static_cast<std::uint64_t>(sizes_.front()), static_cast<std::uint64_t>(sizes_.back()),
              data_seed(config)),
        sampler_(data_.num_samples(), data_seed(config)),
        dtype_(engine.compute_dtype()),
        rank_(static_cast<std::uint64_t>(engine.data_parallel_rank())) {
    const BatchSizes& batch = engine.batch();
    shape_ = BatchShape{static_cast<std::uint64_t>(batch.train_micro_batch_size_per_gpu),
                        static_cast<std::uint64_t>(batch.gradient_accumulation_steps),
                        static_cast<std::uint64_t>(batch.data_parallel_size)};
  }

  Batch load(std::uint64_t micro_step) override {
    const auto ids = sampler_.sample_ids_at(batch_start_, shape_, rank_, micro_step);
    const auto rows = static_cast<std::int64_t>(ids.size());
    Tensor inputs =
        ExecutionContext::host().empty({rows, sizes_.front()}, DType::fp32, MemoryCategory::activations);
    Tensor targets =
        ExecutionContext::host().empty({rows, sizes_.back()}, DType::fp32, MemoryCategory::activations);
    data_.fill(ids, {inputs.data<float>(), static_cast<std::size_t>(inputs.numel())},
               {targets.data<float>(), static_cast<std::size_t>(targets.numel())});
    if (dtype_ == DType::fp32) return {inputs, targets};
    return {inputs.to(dtype_, MemoryCategory::activations), targets.to(dtype_, MemoryCategory::activations)};
  }
  void advance() override { batch_start_ += shape_.global_batch(); }
  DataPosition position() const override { return sampler_.position_at(batch_start_); }
  std::vector<std::uint64_t> sample_ids(std::uint64_t micro_step) const override {
    return sampler_.sample_ids_at(batch_start_, shape_, rank_, micro_step);
  }
  void restore(const DataPosition& position) override {
    ZT_CHECK_AS(ConfigError,
                position.seed == sampler_.seed() && position.num_samples == sampler_.num_samples(),
                "cannot resume synthetic data: saved seed/samples ", position.seed, "/", position.num_samples,
                " differ from ", sampler_.seed(), "/", sampler_.num_samples());
    batch_start_ = position.stream_position();
  }
  std::string description() const override {
    return "synthetic regression (" + std::to_string(data_.input_dim()) + " -> " +
           std::to_string(data_.output_dim()) + ", tanh teacher, " + std::to_string(data_.num_samples()) +
           " samples)";
  }
  std::uint64_t tokens_per_sample() const override { return 1; }

 private:
  std::vector<std::int64_t> sizes_;
  SyntheticRegression data_;
  DataSampler sampler_;
  DType dtype_;
  std::uint64_t rank_;
  BatchShape shape_;
  std::uint64_t batch_start_ = 0;
};

}  // namespace

std::unique_ptr<TrainingData> make_training_data(const Config& config, const Engine& engine,
                                                 const std::optional<std::string>& path_override) {
  ZT_CHECK_AS(ConfigError, config.model.has_value(), "the config has no \"model\" section");
  if (std::holds_alternative<GptModelConfig>(*config.model)) {
    return std::make_unique<TokenTrainingData>(config, engine, path_override);
  }
  const DataFormat format = config.data.value_or(DataConfig{}).format;
  ZT_CHECK_AS(
      ConfigError, !path_override && (format == DataFormat::automatic || format == DataFormat::synthetic),
      "an MLP model trains on synthetic regression data (data.format \"synthetic\"); token or text files "
      "are for GPT models");
  return std::make_unique<SyntheticTrainingData>(config, engine);
}

std::unique_ptr<TrainingData> make_eval_data(const Config& config, const Engine& engine,
                                             const std::string& path) {
  ZT_CHECK_AS(
      ConfigError, config.model.has_value() && std::holds_alternative<GptModelConfig>(*config.model),
      "eval data (--eval-data, eval.data) is for GPT models: an MLP trains on synthetic regression data");
  return std::make_unique<TokenTrainingData>(config, engine, path, /*evaluation=*/true);
}

}  // namespace zt
