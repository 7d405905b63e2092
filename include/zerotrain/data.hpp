// Training data: token files (write, memory-map, verify), text -> byte tokens, fixed-length sample
// windows, a deterministic world-size-invariant sampler with a resumable position, a batch loader,
// and a built-in text corpus. See docs/data.md for the file layout and the sampling rules.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace zt {

// ---- token files -------------------------------------------------------------------------------

/// Layout constants of the token file format (docs/data.md has the byte table).
inline constexpr char kTokenFileMagic[8] = {'Z', 'T', 'T', 'O', 'K', 'E', 'N', 'S'};
inline constexpr std::uint32_t kTokenFileVersion = 1;
inline constexpr std::uint32_t kTokenFileHeaderSize = 64;

/// The fixed header of a token file, decoded.
struct TokenFileHeader {
  std::uint32_t version = kTokenFileVersion;
  std::uint32_t header_size = kTokenFileHeaderSize;
  std::uint32_t token_width = 2;  ///< bytes per token: 2 (uint16) or 4 (uint32)
  std::uint32_t vocab_size = 0;   ///< every token is < vocab_size
  std::uint64_t token_count = 0;
  std::uint32_t tokens_crc32c = 0;  ///< CRC32C of the token bytes as stored (little-endian)
  /// The smallest and largest token, recorded by writers since the range fields were added (in
  /// bytes that older files hold as zeros: both read each other's files); false in older files,
  /// whose range open() finds by reading the tokens once.
  bool token_range_recorded = false;
  std::uint32_t min_token = 0;
  std::uint32_t max_token = 0;
};

/// CRC32C (Castagnoli polynomial 0x1EDC6F41, reflected), continuing from `crc` (0 to start).
std::uint32_t crc32c(std::span<const std::byte> bytes, std::uint32_t crc = 0);

/// Narrowest token width (2 or 4 bytes) that holds every token of a vocabulary of this size.
std::uint32_t token_width_for_vocab(std::uint32_t vocab_size);

/// Streams tokens into a token file atomically: everything goes to a temporary file next to `path`
/// (`<path>.tmp.<pid>`); commit() writes the header, fsyncs, renames it to `path` and fsyncs the
/// directory. If commit() is never reached (an error, an exception, a crash) nothing appears
/// under `path` and an existing file there is left as it was; the destructor removes the
/// temporary file.
class TokenFileWriter {
 public:
  /// token_width 0 = the narrowest that holds vocab_size.
  TokenFileWriter(std::filesystem::path path, std::uint32_t vocab_size, std::uint32_t token_width = 0);
  ~TokenFileWriter();
  TokenFileWriter(const TokenFileWriter&) = delete;
  TokenFileWriter& operator=(const TokenFileWriter&) = delete;

  /// Appends tokens; each must be < vocab_size (checked, IoError naming the file and index).
  void append(std::span<const std::uint32_t> tokens);
  /// Finishes the file and makes it appear under its final name. Returns the header written.
  TokenFileHeader commit();

  [[nodiscard]] std::uint64_t token_count() const { return header_.token_count; }
  [[nodiscard]] const std::filesystem::path& temporary_path() const { return temporary_path_; }

 private:
  void write_all(const void* data, std::size_t size, std::uint64_t offset);

  std::filesystem::path path_;
  std::filesystem::path temporary_path_;
  int fd_ = -1;
  bool committed_ = false;
  TokenFileHeader header_;
  std::vector<std::byte> staging_;
};

/// Writes a whole token file atomically (see TokenFileWriter). token_width 0 = narrowest.
TokenFileHeader write_token_file(const std::filesystem::path& path, std::span<const std::uint32_t> tokens,
                                 std::uint32_t vocab_size, std::uint32_t token_width = 0);

/// A read-only, non-owning view of tokens stored 2 or 4 bytes wide (little-endian): one stretch of
/// storage, or several read as one sequence (the shards of a TokenCorpus). Cheap to copy; whoever
/// owns the storage (TokenDataset, TokenCorpus, a vector) must outlive it.
class TokenView {
 public:
  /// One stretch of a view of several: `count` tokens of `width` bytes at `data`, from `source`.
  struct Segment {
    const std::byte* data = nullptr;
    std::uint64_t count = 0;
    std::uint32_t width = 2;
    std::string_view source;
  };

  TokenView() = default;
  TokenView(std::span<const std::uint16_t> tokens, std::uint32_t vocab_size,
            std::string_view source = "memory");
  TokenView(std::span<const std::uint32_t> tokens, std::uint32_t vocab_size,
            std::string_view source = "memory");
  /// Raw little-endian storage, as in a mapped file.
  TokenView(const std::byte* data, std::uint64_t count, std::uint32_t token_width, std::uint32_t vocab_size,
            std::string_view source);
  /// The segments one after the other, as one sequence of tokens (widths may differ).
  TokenView(std::span<const Segment> segments, std::uint32_t vocab_size, std::string_view source);

  [[nodiscard]] std::uint64_t size() const { return count_; }
  [[nodiscard]] std::uint32_t vocab_size() const { return vocab_size_; }
  /// The width of a view of one segment (a view of several: the first segment's).
  [[nodiscard]] std::uint32_t token_width() const { return width_; }
  /// Where the tokens come from (a file path, "builtin corpus"), for error messages.
  [[nodiscard]] std::string_view source() const { return source_; }
  /// The storage of a view of one segment (ZT_CHECK: a view of several has no one span).
  [[nodiscard]] std::span<const std::byte> bytes() const;
  [[nodiscard]] bool segmented() const { return segments_ != nullptr; }

  [[nodiscard]] std::uint32_t operator[](std::uint64_t index) const;
  /// Copies tokens [first, first + out.size()) into out, checking each is < vocab_size
  /// (IoError naming the source, the index and the value otherwise; in a view of several
  /// segments the segment's source and the index within it).
  void copy_to(std::uint64_t first, std::span<std::int32_t> out) const;

 private:
  struct Segments;  // the segments and where each starts in the sequence
  const std::byte* data_ = nullptr;
  std::uint64_t count_ = 0;
  std::uint32_t width_ = 4;
  std::uint32_t vocab_size_ = 0;
  std::string_view source_;
  std::shared_ptr<const Segments> segments_;  // null: one segment, data_
};

/// A token file mapped read-only into memory. open() checks magic, version, header size and
/// checksum, token width, vocab size, that the file size is exactly header + count * width (a
/// truncated file is an IoError naming the file, the expected and the actual size), and that every
/// token is < vocab_size: from the header's recorded range (O(1)), or, in files written before it
/// was recorded, by reading the tokens once. verify() (or open(path, true)) additionally reads every
/// token for the checksum (CRC32C of the token bytes); `zerotrain train` opens its token files so.
class TokenDataset {
 public:
  static TokenDataset open(const std::filesystem::path& path, bool verify_tokens = false);

  TokenDataset(TokenDataset&&) noexcept;
  TokenDataset& operator=(TokenDataset&&) noexcept;
  ~TokenDataset();

  /// Recomputes the CRC32C of the tokens (unless `checksum` is false) and checks every token
  /// < vocab_size and within the header's recorded range; IoError naming the file otherwise.
  void verify(bool checksum = true) const;

  [[nodiscard]] const TokenFileHeader& header() const { return header_; }
  [[nodiscard]] std::uint64_t size() const { return header_.token_count; }
  [[nodiscard]] std::uint32_t vocab_size() const { return header_.vocab_size; }
  [[nodiscard]] const std::filesystem::path& path() const { return path_; }
  /// The tokens; valid while this dataset lives.
  [[nodiscard]] TokenView view() const;

 private:
  struct Mapping;
  TokenDataset(std::filesystem::path path, std::unique_ptr<Mapping> mapping, TokenFileHeader header);

  std::filesystem::path path_;
  std::string path_string_;  // what view().source() points to
  std::unique_ptr<Mapping> mapping_;
  TokenFileHeader header_;
};

// ---- the ecosystem's token formats and sharded datasets ----------------------------------------

/// The token file formats a data path may hold, told apart by their first bytes (docs/data.md):
/// zerotrain's ZTTOKENS; a NumPy .npy array (1-D, C order, dtype <u2, <u4 or <i4); an llm.c token
/// shard (.bin with a header of 256 int32: magic 20240520 version 1 uint16 tokens, or magic 20240801
/// version 7 uint32 tokens); a Megatron-LM / Megatron-DeepSpeed indexed dataset (PREFIX.bin with
/// PREFIX.idx, whose header starts "MMIDIDX\0\0"; token dtype uint16 or int32).
enum class TokenFileFormat { zttokens, npy, llmc, megatron };
std::string_view to_string(TokenFileFormat format);

/// The format of the file at `path` by its header (a Megatron .bin by the .idx next to it); nullopt
/// when it is none of them (a text file, say). IoError when it cannot be read.
std::optional<TokenFileFormat> detect_token_file_format(const std::filesystem::path& path);

/// Whether `path` names token data for TokenCorpus::open: a directory, a glob pattern (`*?[`) that is
/// no existing file, a Megatron PREFIX (PREFIX.bin and PREFIX.idx exist), or a file of a token
/// format. False for other files (text) and for missing paths.
bool is_token_data_path(const std::string& path);

/// One file of a TokenCorpus.
struct TokenShard {
  std::filesystem::path path;  ///< a Megatron dataset's .bin (its .idx next to it)
  TokenFileFormat format = TokenFileFormat::zttokens;
  std::uint64_t tokens = 0;
  std::uint32_t token_width = 2;
  std::uint32_t vocab_size = 0;  ///< ZTTOKENS: its header's; others: the corpus's (they record none)
  std::uint32_t max_token = 0;   ///< the largest token (0 when empty)
  std::uint64_t documents = 0;   ///< Megatron: documents in its index; 0 for formats without them
};

struct TokenCorpusOptions {
  /// Every token must be < vocab_size (an IoError naming the file, the token's index and byte
  /// offset and its value otherwise); 0: no bound beyond a ZTTOKENS header's own. The formats other
  /// than ZTTOKENS record no vocabulary: theirs is vocab_size, or the largest token + 1 when 0.
  std::uint32_t vocab_size = 0;
  /// ZTTOKENS: check every token file's CRC32C (TokenDataset::verify).
  bool verify_checksums = true;
};

/// A dataset of one or more token files of any TokenFileFormat, memory-mapped (nothing copied) and
/// read as one sequence of tokens: the files in order, each file's tokens (a Megatron dataset's
/// documents in index order) one after the other. `path` is a file, a directory (its files of a
/// known format, in name order; other files are ignored, a directory without any is an error) or a
/// glob pattern (`data/shard_*.bin`, matches in name order). Each file is validated at open: its
/// header, its size against the header (truncated or trailing bytes), a Megatron index against its
/// .bin, and every token against the vocabulary: one pass over the tokens, like the checksum.
class TokenCorpus {
 public:
  static TokenCorpus open(const std::string& path, const TokenCorpusOptions& options = {});

  TokenCorpus(TokenCorpus&&) noexcept;
  TokenCorpus& operator=(TokenCorpus&&) noexcept;
  ~TokenCorpus();

  /// All tokens; valid while this corpus lives.
  [[nodiscard]] TokenView view() const;
  [[nodiscard]] std::uint64_t size() const { return token_count_; }
  /// The largest of the shards' vocabularies (see TokenShard::vocab_size).
  [[nodiscard]] std::uint32_t vocab_size() const { return vocab_size_; }
  [[nodiscard]] const std::vector<TokenShard>& shards() const { return shards_; }
  /// "llm.c token file data/x.bin", "4 npy files in data/ (a.npy .. d.npy)", for logs.
  [[nodiscard]] const std::string& description() const { return description_; }

 private:
  struct Storage;
  TokenCorpus() = default;

  std::unique_ptr<Storage> storage_;
  std::vector<TokenShard> shards_;
  std::uint64_t token_count_ = 0;
  std::uint32_t vocab_size_ = 0;
  std::string description_;
};

/// What convert_token_files did.
struct TokenConvertStats {
  std::uint64_t files = 0;
  std::uint64_t tokens = 0;
  std::uint32_t vocab_size = 0;
  std::string description;  // the input, as TokenCorpus::description
};

/// Converts a TokenCorpus (any format, one file or shards) into one ZTTOKENS file, atomically. The
/// vocabulary written is `vocab_size` (every token checked < it), or when 0 a ZTTOKENS input's own
/// / the largest token + 1. Backs `zerotrain data convert IN OUT` for token inputs.
TokenConvertStats convert_token_files(const std::string& input, const std::filesystem::path& output,
                                      std::uint32_t vocab_size = 0);

// ---- text -> tokens ----------------------------------------------------------------------------

/// Vocabulary of the byte tokenizer: one token per byte value.
inline constexpr std::uint32_t kByteVocabSize = 256;

/// Byte-level tokenization: token i = (unsigned char)text[i].
std::vector<std::uint32_t> tokenize_bytes(std::string_view text);

/// What convert_text_file did.
struct ConvertStats {
  std::uint64_t input_bytes = 0;
  std::uint64_t tokens = 0;
};

/// Converts a text (any bytes) file into a byte-token file (vocab 256, uint16 tokens), streaming,
/// atomically (the output appears only when complete). Backs `zerotrain data convert IN OUT`.
ConvertStats convert_text_file(const std::filesystem::path& input, const std::filesystem::path& output);

// ---- samples -----------------------------------------------------------------------------------

/// Sample i is the token window [i*stride, i*stride + seq_len + 1): input = its first seq_len
/// tokens, target = the same shifted by one. stride 0 means stride = seq_len (non-overlapping).
struct SampleWindows {
  std::uint64_t seq_len = 0;
  std::uint64_t stride = 0;

  [[nodiscard]] std::uint64_t effective_stride() const { return stride == 0 ? seq_len : stride; }
  /// Number of whole windows in token_count tokens; (token_count - 1) / seq_len when stride = seq_len.
  [[nodiscard]] std::uint64_t count(std::uint64_t token_count) const;
  [[nodiscard]] std::uint64_t first_token(std::uint64_t sample) const { return sample * effective_stride(); }
};

// ---- sampler -----------------------------------------------------------------------------------

/// How one global batch is cut: global_batch = micro_batch * grad_accum * data_parallel.
struct BatchShape {
  std::uint64_t micro_batch = 1;
  std::uint64_t grad_accum = 1;
  std::uint64_t data_parallel = 1;

  [[nodiscard]] std::uint64_t global_batch() const { return micro_batch * grad_accum * data_parallel; }
};

/// Where a run stands in the sample stream; plain data, saved in checkpoints and restored for an
/// exact resume. Independent of the world size and of the batch split.
struct DataPosition {
  std::uint64_t seed = 0;
  std::uint64_t num_samples = 0;  ///< of the dataset it was taken on; checked on restore
  std::uint64_t epoch = 0;
  std::uint64_t offset = 0;  ///< samples of this epoch already consumed, < num_samples

  [[nodiscard]] std::uint64_t stream_position() const { return epoch * num_samples + offset; }
  friend bool operator==(const DataPosition&, const DataPosition&) = default;
};

/// The global sample order. Epoch e is a permutation of [0, num_samples): Fisher-Yates driven by
/// splitmix64 seeded from (seed, e) (identity when shuffle is off). Epochs are concatenated into
/// one endless stream; global batch k is stream positions [k*B, (k+1)*B), so a batch may span two
/// epochs and no sample is dropped. Within global batch k, micro-step a on data-parallel rank r
/// takes positions k*B + a*(m*N) + r*m + [0, m). Hence global batch k holds the same samples in
/// the same order for every (micro_batch, grad_accum, data_parallel) with the same B.
class DataSampler {
 public:
  DataSampler(std::uint64_t num_samples, std::uint64_t seed, bool shuffle = true);

  [[nodiscard]] std::uint64_t num_samples() const { return num_samples_; }
  [[nodiscard]] std::uint64_t seed() const { return seed_; }
  [[nodiscard]] bool shuffle() const { return shuffle_; }

  /// The permutation of epoch `epoch` (identity without shuffle).
  [[nodiscard]] std::vector<std::uint64_t> epoch_order(std::uint64_t epoch) const;
  /// Sample id at a stream position (epoch = position / num_samples).
  [[nodiscard]] std::uint64_t sample_at(std::uint64_t stream_position) const;
  /// Sample ids at stream positions [first, first + count).
  [[nodiscard]] std::vector<std::uint64_t> samples_at(std::uint64_t first, std::uint64_t count) const;

  /// The whole global batch `step` (counted from stream position 0), in order.
  [[nodiscard]] std::vector<std::uint64_t> global_batch(std::uint64_t step,
                                                        std::uint64_t global_batch_size) const;
  /// Ids this rank takes at micro-step `micro_step` of global batch `step` (from position 0).
  [[nodiscard]] std::vector<std::uint64_t> sample_ids_for(std::uint64_t step, const BatchShape& shape,
                                                          std::uint64_t rank, std::uint64_t micro_step) const;
  /// The same for a global batch starting at an arbitrary stream position (after a resume).
  [[nodiscard]] std::vector<std::uint64_t> sample_ids_at(std::uint64_t batch_start, const BatchShape& shape,
                                                         std::uint64_t rank, std::uint64_t micro_step) const;

  [[nodiscard]] DataPosition position_at(std::uint64_t stream_position) const;

 private:
  struct Cache;
  std::uint64_t num_samples_;
  std::uint64_t seed_;
  bool shuffle_;
  std::shared_ptr<Cache> cache_;  // permutations of recent epochs; shared by copies, guarded by a mutex
};

/// Rank `rank`'s share of the data: fills int32 [micro_batch, seq_len] inputs and targets for
/// each micro-step of the current global batch, then advance() moves to the next global batch.
/// Holds a TokenView: the token storage must outlive the loader.
class BatchLoader {
 public:
  BatchLoader(TokenView tokens, SampleWindows windows, BatchShape shape, std::uint64_t rank,
              std::uint64_t seed, bool shuffle = true);

  /// Fills inputs and targets (each micro_batch * seq_len, row-major) for micro-step `micro_step`.
  void load(std::uint64_t micro_step, std::span<std::int32_t> inputs, std::span<std::int32_t> targets) const;
  struct MicroBatch {
    std::vector<std::int32_t> inputs;
    std::vector<std::int32_t> targets;
    std::vector<std::uint64_t> sample_ids;
  };
  [[nodiscard]] MicroBatch load(std::uint64_t micro_step) const;
  /// The sample ids that load(micro_step) reads, in row order.
  [[nodiscard]] std::vector<std::uint64_t> sample_ids(std::uint64_t micro_step) const;

  /// Moves to the next global batch (all ranks do this once per optimizer step).
  void advance();
  /// Position of the next global batch to be loaded; restore() resumes there exactly.
  [[nodiscard]] DataPosition position() const { return sampler_.position_at(batch_start_); }
  /// Resumes at a saved position. The seed and sample count must match (ConfigError otherwise:
  /// resuming on different data or with a different seed is not a resume).
  void restore(const DataPosition& position);

  [[nodiscard]] const DataSampler& sampler() const { return sampler_; }
  [[nodiscard]] const SampleWindows& windows() const { return windows_; }
  [[nodiscard]] const BatchShape& shape() const { return shape_; }
  [[nodiscard]] std::uint64_t num_samples() const { return sampler_.num_samples(); }
  /// Stream position of the current global batch's first sample.
  [[nodiscard]] std::uint64_t batch_start() const { return batch_start_; }

 private:
  TokenView tokens_;
  SampleWindows windows_;
  BatchShape shape_;
  std::uint64_t rank_;
  DataSampler sampler_;
  std::uint64_t batch_start_ = 0;
};

// ---- built-in corpus ---------------------------------------------------------------------------

/// A deterministic, self-contained English-like text (about 1.5 MB, printable ASCII and '\n')
/// generated in code: templated sentences over small word lists, names that recur, counting,
/// arithmetic facts, calendar facts. Same bytes on every machine and run. Cached after the first
/// call; thread-safe.
const std::string& builtin_corpus_text();
/// builtin_corpus_text() as byte tokens (vocab 256), cached.
const std::vector<std::uint32_t>& builtin_corpus_tokens();
/// A TokenView of builtin_corpus_tokens() with source "builtin corpus".
TokenView builtin_corpus_view();

// ---- synthetic regression --------------------------------------------------------------------

/// Synthetic data for MLP runs (data.format "synthetic"): sample i has inputs x uniform in [-1, 1)
/// drawn from (seed, i), and targets y = tanh(W x) for a fixed teacher matrix W ~ N(0, 1/input_dim)
/// drawn from the seed. A function of the sample id alone, so it shards like the token data.
class SyntheticRegression {
 public:
  SyntheticRegression(std::uint64_t input_dim, std::uint64_t output_dim, std::uint64_t seed,
                      std::uint64_t num_samples = 65536);
  [[nodiscard]] std::uint64_t num_samples() const { return num_samples_; }
  [[nodiscard]] std::uint64_t input_dim() const { return input_dim_; }
  [[nodiscard]] std::uint64_t output_dim() const { return output_dim_; }
  /// Rows of inputs [ids.size(), input_dim] and targets [ids.size(), output_dim], row-major.
  void fill(std::span<const std::uint64_t> sample_ids, std::span<float> inputs,
            std::span<float> targets) const;

 private:
  std::uint64_t input_dim_, output_dim_, seed_, num_samples_;
  std::vector<float> teacher_;  // [output_dim, input_dim]
};

}  // namespace zt
