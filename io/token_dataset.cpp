// Token files: CRC32C, the atomic writer, the memory-mapped reader and TokenView.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include "base/text.hpp"
#include "io/token_storage.hpp"
#include "zerotrain/data.hpp"
#include "zerotrain/error.hpp"

// Tokens are stored little-endian and read by memcpy; every supported target (x86-64, aarch64,
// ppc64le) is little-endian.
static_assert(std::endian::native == std::endian::little,
              "zerotrain token files assume a little-endian host");

namespace zt {
namespace {

// Header byte offsets (docs/data.md).
constexpr std::size_t kOffMagic = 0;
constexpr std::size_t kOffVersion = 8;
constexpr std::size_t kOffHeaderSize = 12;
constexpr std::size_t kOffTokenWidth = 16;
constexpr std::size_t kOffVocabSize = 20;
constexpr std::size_t kOffTokenCount = 24;
constexpr std::size_t kOffTokensCrc = 32;
constexpr std::size_t kOffHeaderCrc = 36;  // CRC32C of bytes [0, 36)
// The token range, in bytes that files written before it hold as zeros (and that their readers
// ignore): min and max token, and a CRC32C of the two, which zeros never match.
constexpr std::size_t kOffMinToken = 40;
constexpr std::size_t kOffMaxToken = 44;
constexpr std::size_t kOffRangeCrc = 48;  // CRC32C of bytes [40, 48)

// Slicing-by-8 tables for the reflected Castagnoli polynomial.
using CrcTables = std::array<std::array<std::uint32_t, 256>, 8>;

constexpr CrcTables make_crc_tables() {
  CrcTables tables{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1U) ? 0x82F63B78U : 0U);
    tables[0][i] = crc;
  }
  for (std::size_t t = 1; t < 8; ++t)
    for (std::uint32_t i = 0; i < 256; ++i)
      tables[t][i] = (tables[t - 1][i] >> 8) ^ tables[0][tables[t - 1][i] & 0xFF];
  return tables;
}

constexpr CrcTables kCrcTables = make_crc_tables();

using io::load_le;
using io::token_extremes;

template <typename T>
void store_le(std::byte* at, T value) {
  std::memcpy(at, &value, sizeof(T));
}

// Expected file size as text; a corrupt count may not fit 64 bits.
std::string expected_file_size(const TokenFileHeader& header) {
  if (header.token_count > (UINT64_MAX - header.header_size) / header.token_width) return "more than 2^64";
  return std::to_string(header.header_size + header.token_count * header.token_width);
}

using base::errno_text;

std::array<std::byte, kTokenFileHeaderSize> encode_header(const TokenFileHeader& header) {
  std::array<std::byte, kTokenFileHeaderSize> bytes{};
  std::memcpy(bytes.data() + kOffMagic, kTokenFileMagic, sizeof(kTokenFileMagic));
  store_le(bytes.data() + kOffVersion, header.version);
  store_le(bytes.data() + kOffHeaderSize, header.header_size);
  store_le(bytes.data() + kOffTokenWidth, header.token_width);
  store_le(bytes.data() + kOffVocabSize, header.vocab_size);
  store_le(bytes.data() + kOffTokenCount, header.token_count);
  store_le(bytes.data() + kOffTokensCrc, header.tokens_crc32c);
  store_le(bytes.data() + kOffHeaderCrc, crc32c(std::span(bytes.data(), kOffHeaderCrc)));
  if (header.token_range_recorded) {
    store_le(bytes.data() + kOffMinToken, header.min_token);
    store_le(bytes.data() + kOffMaxToken, header.max_token);
    store_le(bytes.data() + kOffRangeCrc,
             crc32c(std::span(bytes.data() + kOffMinToken, kOffRangeCrc - kOffMinToken)));
  }
  return bytes;
}

void check_width(std::uint32_t token_width, std::uint32_t vocab_size, const std::filesystem::path& path) {
  if (token_width != 2 && token_width != 4)
    ZT_THROW_AS(IoError, "token file '", path.string(), "': token width ", token_width,
                " bytes is not supported, expected 2 (uint16) or 4 (uint32)");
  if (vocab_size == 0)
    ZT_THROW_AS(IoError, "token file '", path.string(), "': vocab size is 0, expected >= 1");
  if (token_width == 2 && vocab_size > 65536)
    ZT_THROW_AS(IoError, "token file '", path.string(), "': vocab size ", vocab_size,
                " does not fit 2-byte tokens (at most 65536), expected token width 4");
}

// A file descriptor that closes itself.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  [[nodiscard]] int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

#if defined(__x86_64__)
// SSE 4.2's crc32 instruction computes CRC32C (the same polynomial), 8 bytes per instruction:
// several times the tables' speed, which matters since `zerotrain train` checksums its token
// files at the start (docs/benchmarks.md, "Token files").
__attribute__((target("sse4.2"))) std::uint32_t crc32c_sse42(const std::byte* at, std::size_t left,
                                                             std::uint32_t crc) {
  std::uint64_t state = crc;
  for (; left >= 8; left -= 8, at += 8) state = __builtin_ia32_crc32di(state, load_le<std::uint64_t>(at));
  auto narrow = static_cast<std::uint32_t>(state);
  for (; left > 0; --left, ++at) narrow = __builtin_ia32_crc32qi(narrow, std::to_integer<unsigned char>(*at));
  return narrow;
}
#endif

std::uint32_t crc32c(std::span<const std::byte> bytes, std::uint32_t crc) {
  crc = ~crc;
#if defined(__x86_64__)
  static const bool has_sse42 = __builtin_cpu_supports("sse4.2");
  if (has_sse42) return ~crc32c_sse42(bytes.data(), bytes.size(), crc);
#endif
  const std::byte* at = bytes.data();
  std::size_t left = bytes.size();
  while (left >= 8) {
    const std::uint64_t word = load_le<std::uint64_t>(at) ^ crc;
    crc = kCrcTables[7][word & 0xFF] ^ kCrcTables[6][(word >> 8) & 0xFF] ^
          kCrcTables[5][(word >> 16) & 0xFF] ^ kCrcTables[4][(word >> 24) & 0xFF] ^
          kCrcTables[3][(word >> 32) & 0xFF] ^ kCrcTables[2][(word >> 40) & 0xFF] ^
          kCrcTables[1][(word >> 48) & 0xFF] ^ kCrcTables[0][word >> 56];
    at += 8;
    left -= 8;
  }
  for (; left > 0; --left, ++at)
    crc = (crc >> 8) ^ kCrcTables[0][(crc ^ std::to_integer<std::uint32_t>(*at)) & 0xFF];
  return ~crc;
}

std::uint32_t token_width_for_vocab(std::uint32_t vocab_size) {
  return vocab_size <= 65536 ? 2 : 4;
}

// ---- writer ------------------------------------------------------------------------------------

TokenFileWriter::TokenFileWriter(std::filesystem::path path, std::uint32_t vocab_size,
                                 std::uint32_t token_width)
    : path_(std::move(path)) {
  header_.vocab_size = vocab_size;
  header_.token_width = token_width == 0 ? token_width_for_vocab(vocab_size) : token_width;
  header_.token_range_recorded = true;
  header_.min_token = std::numeric_limits<std::uint32_t>::max();  // no token yet: an empty range
  check_width(header_.token_width, header_.vocab_size, path_);
  // Same directory as the final name, so rename() is atomic (same file system).
  temporary_path_ = path_;
  temporary_path_ += ".tmp." + std::to_string(::getpid());
  fd_ = ::open(temporary_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0)
    ZT_THROW_AS(IoError, "cannot create token file '", path_.string(), "' (temporary '",
                temporary_path_.string(), "'): ", errno_text(errno));
  // Placeholder header, rewritten by commit() once count and checksum are known.
  const std::array<std::byte, kTokenFileHeaderSize> zeros{};
  try {
    write_all(zeros.data(), zeros.size(), 0);
  } catch (...) {
    ::close(fd_);
    ::unlink(temporary_path_.c_str());
    throw;
  }
}

TokenFileWriter::~TokenFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temporary_path_.c_str());  // an abandoned file never shows up
}

void TokenFileWriter::write_all(const void* data, std::size_t size, std::uint64_t offset) {
  const auto* bytes = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t written = ::pwrite(fd_, bytes, size, static_cast<off_t>(offset));
    if (written < 0) {
      if (errno == EINTR) continue;
      ZT_THROW_AS(IoError, "writing token file '", temporary_path_.string(), "' at byte ", offset, ": ",
                  errno_text(errno));
    }
    bytes += written;
    size -= static_cast<std::size_t>(written);
    offset += static_cast<std::uint64_t>(written);
  }
}

void TokenFileWriter::append(std::span<const std::uint32_t> tokens) {
  ZT_CHECK_AS(IoError, !committed_ && fd_ >= 0, "token file '", path_.string(), "': append after commit");
  constexpr std::size_t kChunkTokens = 1 << 16;
  while (!tokens.empty()) {
    const std::size_t n = std::min(tokens.size(), kChunkTokens);
    staging_.resize(n * header_.token_width);
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t token = tokens[i];
      if (token >= header_.vocab_size)
        ZT_THROW_AS(IoError, "token file '", path_.string(), "': token ", header_.token_count + i, " is ",
                    token, ", expected < vocab size ", header_.vocab_size);
      header_.min_token = std::min(header_.min_token, token);
      header_.max_token = std::max(header_.max_token, token);
      if (header_.token_width == 2)
        store_le(staging_.data() + 2 * i, static_cast<std::uint16_t>(token));
      else
        store_le(staging_.data() + 4 * i, token);
    }
    write_all(staging_.data(), staging_.size(),
              kTokenFileHeaderSize + header_.token_count * static_cast<std::uint64_t>(header_.token_width));
    header_.tokens_crc32c = crc32c(staging_, header_.tokens_crc32c);
    header_.token_count += n;
    tokens = tokens.subspan(n);
  }
}

TokenFileHeader TokenFileWriter::commit() {
  ZT_CHECK_AS(IoError, !committed_ && fd_ >= 0, "token file '", path_.string(), "': commit called twice");
  const auto header_bytes = encode_header(header_);
  write_all(header_bytes.data(), header_bytes.size(), 0);
  // Data on disk before the rename makes it visible; otherwise a crash could leave a complete-looking
  // name with missing blocks.
  if (::fsync(fd_) != 0)
    ZT_THROW_AS(IoError, "fsync of token file '", temporary_path_.string(), "' failed: ", errno_text(errno));
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0)
    ZT_THROW_AS(IoError, "close of token file '", temporary_path_.string(), "' failed: ", errno_text(errno));
  if (::rename(temporary_path_.c_str(), path_.c_str()) != 0)
    ZT_THROW_AS(IoError, "cannot rename '", temporary_path_.string(), "' to token file '", path_.string(),
                "': ", errno_text(errno));
  committed_ = true;
  // Persist the rename itself. Best effort: some file systems refuse fsync on directories.
  const std::filesystem::path directory = path_.has_parent_path() ? path_.parent_path() : ".";
  FileDescriptor dir(::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir.get() >= 0) (void)::fsync(dir.get());
  return header_;
}

TokenFileHeader write_token_file(const std::filesystem::path& path, std::span<const std::uint32_t> tokens,
                                 std::uint32_t vocab_size, std::uint32_t token_width) {
  TokenFileWriter writer(path, vocab_size, token_width);
  writer.append(tokens);
  return writer.commit();
}

// ---- view --------------------------------------------------------------------------------------

TokenView::TokenView(std::span<const std::uint16_t> tokens, std::uint32_t vocab_size, std::string_view source)
    : data_(reinterpret_cast<const std::byte*>(tokens.data())),
      count_(tokens.size()),
      width_(2),
      vocab_size_(vocab_size),
      source_(source) {}

TokenView::TokenView(std::span<const std::uint32_t> tokens, std::uint32_t vocab_size, std::string_view source)
    : data_(reinterpret_cast<const std::byte*>(tokens.data())),
      count_(tokens.size()),
      width_(4),
      vocab_size_(vocab_size),
      source_(source) {}

TokenView::TokenView(const std::byte* data, std::uint64_t count, std::uint32_t token_width,
                     std::uint32_t vocab_size, std::string_view source)
    : data_(data), count_(count), width_(token_width), vocab_size_(vocab_size), source_(source) {
  ZT_CHECK(token_width == 2 || token_width == 4, "token width of '", source, "' is ", token_width,
           ", expected 2 or 4");
}

struct TokenView::Segments {
  std::vector<Segment> segments;
  std::vector<std::uint64_t> starts;  // where each segment begins in the sequence, ascending

  /// The segment holding token `index` (< the total).
  [[nodiscard]] std::size_t find(std::uint64_t index) const {
    return static_cast<std::size_t>(std::upper_bound(starts.begin(), starts.end(), index) - starts.begin()) -
           1;
  }
};

TokenView::TokenView(std::span<const Segment> segments, std::uint32_t vocab_size, std::string_view source)
    : vocab_size_(vocab_size), source_(source) {
  auto parts = std::make_shared<Segments>();
  for (const Segment& segment : segments) {
    ZT_CHECK(segment.width == 2 || segment.width == 4, "token width of '", segment.source, "' is ",
             segment.width, ", expected 2 or 4");
    if (segment.count == 0) continue;  // nothing to find there
    parts->starts.push_back(count_);
    parts->segments.push_back(segment);
    count_ += segment.count;
  }
  if (parts->segments.size() == 1) {  // one stretch after all: the plain view
    data_ = parts->segments.front().data;
    width_ = parts->segments.front().width;
    return;
  }
  width_ = parts->segments.empty() ? 2 : parts->segments.front().width;
  segments_ = std::move(parts);
}

std::span<const std::byte> TokenView::bytes() const {
  ZT_CHECK(segments_ == nullptr, "the tokens of '", source_, "' lie in ", segments_->segments.size(),
           " separate stretches (shards), not in one span of bytes");
  return {data_, count_ * width_};
}

namespace {

std::uint32_t load_token(const std::byte* data, std::uint32_t width, std::uint64_t index) {
  const std::byte* at = data + index * width;
  return width == 2 ? load_le<std::uint16_t>(at) : load_le<std::uint32_t>(at);
}

}  // namespace

std::uint32_t TokenView::operator[](std::uint64_t index) const {
  if (segments_ == nullptr) return load_token(data_, width_, index);
  const std::size_t s = segments_->find(index);
  const Segment& segment = segments_->segments[s];
  return load_token(segment.data, segment.width, index - segments_->starts[s]);
}

void TokenView::copy_to(std::uint64_t first, std::span<std::int32_t> out) const {
  ZT_CHECK(first <= count_ && out.size() <= count_ - first, "tokens [", first, ", ", first + out.size(),
           ") of '", source_, "' requested, but it holds ", count_, " tokens");
  std::size_t done = 0;
  while (done < out.size()) {
    // The stretch of storage that holds token first + done, and how much of `out` it fills.
    Segment segment{data_, count_, width_, source_};
    std::uint64_t start = 0;
    if (segments_ != nullptr) {
      const std::size_t s = segments_->find(first + done);
      segment = segments_->segments[s];
      start = segments_->starts[s];
    }
    const std::uint64_t offset = first + done - start;
    const auto n =
        static_cast<std::size_t>(std::min<std::uint64_t>(out.size() - done, segment.count - offset));
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t token = load_token(segment.data, segment.width, offset + i);
      // Checked here, where it costs nothing next to the copy, so open() can stay O(1).
      if (token >= vocab_size_)
        ZT_THROW_AS(IoError, "tokens of '", segment.source, "': token ", offset + i, " is ", token,
                    ", expected < vocab size ", vocab_size_);
      out[done + i] = static_cast<std::int32_t>(token);
    }
    done += n;
  }
}

// ---- reader ------------------------------------------------------------------------------------

// A read-only mapping of the whole token file.
struct TokenDataset::Mapping : io::MappedFile {
  Mapping(const std::filesystem::path& path, std::size_t expected_min)
      : MappedFile(path, "token file", expected_min) {}
};

TokenDataset::TokenDataset(std::filesystem::path path, std::unique_ptr<Mapping> mapping,
                           TokenFileHeader header)
    : path_(std::move(path)), path_string_(path_.string()), mapping_(std::move(mapping)), header_(header) {}

TokenDataset::TokenDataset(TokenDataset&&) noexcept = default;
TokenDataset& TokenDataset::operator=(TokenDataset&&) noexcept = default;
TokenDataset::~TokenDataset() = default;

TokenDataset TokenDataset::open(const std::filesystem::path& path, bool verify_tokens) {
  auto mapping = std::make_unique<Mapping>(path, kTokenFileHeaderSize);
  const std::byte* bytes = mapping->bytes();
  const std::string name = path.string();

  if (std::memcmp(bytes + kOffMagic, kTokenFileMagic, sizeof(kTokenFileMagic)) != 0)
    ZT_THROW_AS(IoError, "'", name,
                "' is not a zerotrain token file: bad magic, expected \"ZTTOKENS\" in bytes 0-7");
  TokenFileHeader header;
  header.version = load_le<std::uint32_t>(bytes + kOffVersion);
  header.header_size = load_le<std::uint32_t>(bytes + kOffHeaderSize);
  header.token_width = load_le<std::uint32_t>(bytes + kOffTokenWidth);
  header.vocab_size = load_le<std::uint32_t>(bytes + kOffVocabSize);
  header.token_count = load_le<std::uint64_t>(bytes + kOffTokenCount);
  header.tokens_crc32c = load_le<std::uint32_t>(bytes + kOffTokensCrc);
  if (header.version != kTokenFileVersion)
    ZT_THROW_AS(IoError, "token file '", name, "' has format version ", header.version, ", expected ",
                kTokenFileVersion);
  const std::uint32_t stored_header_crc = load_le<std::uint32_t>(bytes + kOffHeaderCrc);
  const std::uint32_t header_crc = crc32c(std::span(bytes, kOffHeaderCrc));
  if (stored_header_crc != header_crc)
    ZT_THROW_AS(IoError, "token file '", name, "': header checksum mismatch (stored ", stored_header_crc,
                ", computed ", header_crc, "); the header is corrupt");
  if (header.header_size < kTokenFileHeaderSize || header.header_size > mapping->size())
    ZT_THROW_AS(IoError, "token file '", name, "': header size ", header.header_size,
                " is invalid, expected ", kTokenFileHeaderSize, " to the file size ", mapping->size());
  check_width(header.token_width, header.vocab_size, path);

  // Compare in tokens, not bytes, so a corrupt count cannot overflow the size computation.
  const std::uint64_t payload_bytes = mapping->size() - header.header_size;
  const std::uint64_t stored_tokens = payload_bytes / header.token_width;
  if (header.token_count > stored_tokens) {
    ZT_THROW_AS(IoError, "token file '", name, "' is truncated: ", mapping->size(), " bytes, expected ",
                header.header_size, " + ", header.token_count, " tokens * ", header.token_width, " = ",
                expected_file_size(header), " bytes");
  }
  if (header.token_count < stored_tokens || payload_bytes % header.token_width != 0)
    ZT_THROW_AS(IoError, "token file '", name, "' has trailing data: ", mapping->size(), " bytes, expected ",
                header.header_size, " + ", header.token_count, " tokens * ", header.token_width, " = ",
                expected_file_size(header), " bytes");

  const std::uint32_t stored_range_crc = load_le<std::uint32_t>(bytes + kOffRangeCrc);
  header.token_range_recorded =
      stored_range_crc == crc32c(std::span(bytes + kOffMinToken, kOffRangeCrc - kOffMinToken));
  if (header.token_range_recorded) {
    header.min_token = load_le<std::uint32_t>(bytes + kOffMinToken);
    header.max_token = load_le<std::uint32_t>(bytes + kOffMaxToken);
    if (header.token_count > 0 && header.max_token >= header.vocab_size)
      ZT_THROW_AS(IoError, "token file '", name, "': holds tokens up to ", header.max_token,
                  " (its header's range), expected every token < vocab size ", header.vocab_size);
  }

  TokenDataset dataset(path, std::move(mapping), header);
  // verify() reads every token anyway; otherwise a file without a recorded range is read once here,
  // so that a token >= vocab_size stops the run at its start, not hours into it.
  if (verify_tokens || !header.token_range_recorded) dataset.verify(/*checksum=*/verify_tokens);
  return dataset;
}

TokenView TokenDataset::view() const {
  return TokenView(mapping_->bytes() + header_.header_size, header_.token_count, header_.token_width,
                   header_.vocab_size, path_string_);
}

void TokenDataset::verify(bool checksum) const {
  const TokenView tokens = view();
  if (checksum) {
    const std::uint32_t crc = crc32c(tokens.bytes());
    if (crc != header_.tokens_crc32c)
      ZT_THROW_AS(IoError, "token file '", path_string_, "': checksum mismatch, header says CRC32C ",
                  header_.tokens_crc32c, ", tokens give ", crc, "; the file is corrupt");
  }
  if (tokens.size() == 0) return;
  using Range = std::pair<std::uint32_t, std::uint32_t>;
  const auto [low, high] = tokens.token_width() == 2
                               ? Range(token_extremes<std::uint16_t>(tokens.bytes().data(), tokens.size()))
                               : token_extremes<std::uint32_t>(tokens.bytes().data(), tokens.size());
  const bool outside_range =
      header_.token_range_recorded && (low < header_.min_token || high > header_.max_token);
  if (high < header_.vocab_size && !outside_range) return;
  // Something is wrong: find the first token that says what, for the message.
  for (std::uint64_t i = 0; i < tokens.size(); ++i) {
    const std::uint32_t token = tokens[i];
    if (token >= header_.vocab_size)
      ZT_THROW_AS(IoError, "token file '", path_string_, "': token ", i, " is ", token,
                  ", expected < vocab size ", header_.vocab_size);
    if (header_.token_range_recorded && (token < header_.min_token || token > header_.max_token))
      ZT_THROW_AS(IoError, "token file '", path_string_, "': token ", i, " is ", token,
                  ", outside the range its header records (", header_.min_token, "..", header_.max_token,
                  "); the file is corrupt");
  }
}

}  // namespace zt
