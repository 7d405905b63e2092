// Token files, the text converter, sample windows, the sampler (world-size invariance, resume),
// the batch loader and the built-in corpus.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "zerotrain/data.hpp"
#include "zerotrain/error.hpp"

namespace fs = std::filesystem;

namespace {

// A fresh directory per test, removed afterwards.
class DataFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("zt_test_data_" + std::to_string(::getpid()) + "_" +
                                        info->test_suite_name() + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path file(const std::string& name) const { return dir_ / name; }

  fs::path dir_;
};

std::vector<std::uint32_t> ramp(std::size_t count, std::uint32_t vocab) {
  std::vector<std::uint32_t> tokens(count);
  for (std::size_t i = 0; i < count; ++i) tokens[i] = static_cast<std::uint32_t>((i * 7919 + 13) % vocab);
  return tokens;
}

std::vector<char> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Rewrites a header field and then the header checksum, as a consistent but wrong header would be.
void patch_header_u32(const fs::path& path, std::size_t offset, std::uint32_t value) {
  std::vector<char> bytes = read_bytes(path);
  std::memcpy(bytes.data() + offset, &value, sizeof(value));
  const std::uint32_t header_crc = zt::crc32c(std::as_bytes(std::span(bytes.data(), 36)));
  std::memcpy(bytes.data() + 36, &header_crc, sizeof(header_crc));
  write_bytes(path, bytes);
}

// Runs `body`, expects a zt::IoError whose message contains every one of `parts`.
template <typename Body>
void expect_io_error(Body&& body, std::initializer_list<std::string> parts) {
  try {
    body();
    ADD_FAILURE() << "expected zt::IoError";
  } catch (const zt::IoError& error) {
    const std::string message = error.what();
    for (const std::string& part : parts) EXPECT_NE(message.find(part), std::string::npos) << message;
  }
}

std::vector<std::string> directory_entries(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  return names;
}

// ---- checksum and file format ------------------------------------------------------------------

TEST(Crc32c, MatchesTheStandardCheckValue) {
  const std::string text = "123456789";
  EXPECT_EQ(zt::crc32c(std::as_bytes(std::span(text.data(), text.size()))), 0xE3069283U);
  // Incremental equals one shot (the writer checksums chunk by chunk).
  const auto bytes = std::as_bytes(std::span(text.data(), text.size()));
  EXPECT_EQ(zt::crc32c(bytes.subspan(4), zt::crc32c(bytes.first(4))), 0xE3069283U);
  EXPECT_EQ(zt::crc32c({}), 0U);
}

TEST_F(DataFiles, RoundTripUint16) {
  const auto tokens = ramp(200'001, 50'257);  // more than one writer chunk
  const auto header = zt::write_token_file(file("a.tok"), tokens, 50'257);
  EXPECT_EQ(header.token_width, 2U);
  EXPECT_EQ(fs::file_size(file("a.tok")), 64 + 2 * tokens.size());

  const auto dataset = zt::TokenDataset::open(file("a.tok"), /*verify_tokens=*/true);
  EXPECT_EQ(dataset.size(), tokens.size());
  EXPECT_EQ(dataset.vocab_size(), 50'257U);
  EXPECT_EQ(dataset.header().token_width, 2U);
  EXPECT_EQ(dataset.header().tokens_crc32c, header.tokens_crc32c);
  const zt::TokenView view = dataset.view();
  ASSERT_EQ(view.size(), tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) ASSERT_EQ(view[i], tokens[i]) << i;
  EXPECT_EQ(view.source(), file("a.tok").string());
  EXPECT_EQ(directory_entries(dir_), std::vector<std::string>{"a.tok"});  // no temporary left behind
}

TEST_F(DataFiles, RoundTripUint32) {
  const auto tokens = ramp(10'000, 100'000);
  const auto header = zt::write_token_file(file("b.tok"), tokens, 100'000);
  EXPECT_EQ(header.token_width, 4U);
  auto dataset = zt::TokenDataset::open(file("b.tok"));
  dataset.verify();
  EXPECT_EQ(fs::file_size(file("b.tok")), 64 + 4 * tokens.size());
  std::vector<std::int32_t> out(tokens.size());
  dataset.view().copy_to(0, out);
  for (std::size_t i = 0; i < tokens.size(); ++i) ASSERT_EQ(static_cast<std::uint32_t>(out[i]), tokens[i]);

  // A small vocabulary may still be stored 4 bytes wide on request.
  zt::write_token_file(file("c.tok"), ramp(100, 256), 256, 4);
  EXPECT_EQ(zt::TokenDataset::open(file("c.tok"), true).header().token_width, 4U);
  // Moving the dataset keeps the mapping valid.
  zt::TokenDataset moved = std::move(dataset);
  EXPECT_EQ(moved.view()[5], tokens[5]);
}

TEST_F(DataFiles, EmptyFileRoundTrips) {
  zt::write_token_file(file("empty.tok"), {}, 256);
  const auto dataset = zt::TokenDataset::open(file("empty.tok"), true);
  EXPECT_EQ(dataset.size(), 0U);
  EXPECT_EQ(fs::file_size(file("empty.tok")), 64U);
}

TEST_F(DataFiles, BadMagicIsRejected) {
  zt::write_token_file(file("m.tok"), ramp(100, 256), 256);
  std::vector<char> bytes = read_bytes(file("m.tok"));
  bytes[0] = 'X';
  write_bytes(file("m.tok"), bytes);
  expect_io_error([&] { (void)zt::TokenDataset::open(file("m.tok")); },
                  {file("m.tok").string(), "bad magic", "ZTTOKENS"});
  // A text file is not a token file either.
  write_bytes(file("text.tok"), std::vector<char>(100, 'a'));
  expect_io_error([&] { (void)zt::TokenDataset::open(file("text.tok")); },
                  {file("text.tok").string(), "magic"});
}

TEST_F(DataFiles, TruncatedFileNamesExpectedAndActualSize) {
  zt::write_token_file(file("t.tok"), ramp(100, 256), 256);  // 64 + 200 = 264 bytes
  fs::resize_file(file("t.tok"), 263);
  expect_io_error(
      [&] { (void)zt::TokenDataset::open(file("t.tok")); },
      {file("t.tok").string(), "truncated", "263 bytes", "expected 64 + 100 tokens * 2 = 264 bytes"});
  fs::resize_file(file("t.tok"), 10);  // not even a header
  expect_io_error([&] { (void)zt::TokenDataset::open(file("t.tok")); },
                  {file("t.tok").string(), "truncated", "10 bytes", "64"});
  expect_io_error([&] { (void)zt::TokenDataset::open(file("missing.tok")); },
                  {file("missing.tok").string(), "cannot open"});
}

TEST_F(DataFiles, TrailingDataIsRejected) {
  zt::write_token_file(file("l.tok"), ramp(100, 256), 256);
  fs::resize_file(file("l.tok"), 265);
  expect_io_error([&] { (void)zt::TokenDataset::open(file("l.tok")); },
                  {file("l.tok").string(), "trailing data", "265 bytes", "264"});
}

TEST_F(DataFiles, HeaderFieldsAreValidated) {
  zt::write_token_file(file("h.tok"), ramp(100, 256), 256);
  const std::vector<char> good = read_bytes(file("h.tok"));

  patch_header_u32(file("h.tok"), 8, 99);  // version
  expect_io_error([&] { (void)zt::TokenDataset::open(file("h.tok")); },
                  {file("h.tok").string(), "format version 99", "expected 1"});

  write_bytes(file("h.tok"), good);
  patch_header_u32(file("h.tok"), 16, 3);  // token width
  expect_io_error([&] { (void)zt::TokenDataset::open(file("h.tok")); },
                  {file("h.tok").string(), "token width 3", "expected 2 (uint16) or 4 (uint32)"});

  // A header edited without fixing its checksum.
  std::vector<char> bytes = good;
  bytes[20] = 1;  // vocab size byte
  write_bytes(file("h.tok"), bytes);
  expect_io_error([&] { (void)zt::TokenDataset::open(file("h.tok")); },
                  {file("h.tok").string(), "header checksum mismatch"});
}

TEST_F(DataFiles, TokenOutsideVocabularyIsFound) {
  // Written with vocab 1000, then the header claims 256: token 3 (value 300) is out of range. The
  // range the header records says so at open, before any training reads the tokens.
  std::vector<std::uint32_t> tokens = {1, 2, 3, 300, 4};
  zt::write_token_file(file("v.tok"), tokens, 1000);
  patch_header_u32(file("v.tok"), 20, 256);
  expect_io_error([&] { (void)zt::TokenDataset::open(file("v.tok")); },
                  {file("v.tok").string(), "holds tokens up to 300 (its header's range)",
                   "expected every token < vocab size 256"});
  // A file written before the range was recorded (bytes 40-63 zero) is read once at open.
  std::vector<char> bytes = read_bytes(file("v.tok"));
  std::fill(bytes.begin() + 40, bytes.begin() + 64, '\0');
  write_bytes(file("old.tok"), bytes);
  expect_io_error([&] { (void)zt::TokenDataset::open(file("old.tok")); },
                  {file("old.tok").string(), "token 3 is 300", "expected < vocab size 256"});
  expect_io_error([&] { (void)zt::TokenDataset::open(file("old.tok"), true); },
                  {file("old.tok").string(), "token 3"});
  // The loader catches it too when it reads the window.
  const std::vector<std::uint16_t> narrow = {1, 2, 3, 300, 4};
  std::vector<std::int32_t> out(5);
  expect_io_error([&] { zt::TokenView(std::span(narrow), 256, "memory").copy_to(0, out); },
                  {"memory", "token 3 is 300"});
  // And the writer refuses to write one.
  expect_io_error([&] { zt::write_token_file(file("w.tok"), tokens, 256); },
                  {file("w.tok").string(), "token 3 is 300", "expected < vocab size 256"});
}

TEST_F(DataFiles, TokenRangeIsRecordedAndReadCompatibly) {
  const zt::TokenFileHeader written = zt::write_token_file(file("r.tok"), {{7, 3, 250, 9}}, 256);
  EXPECT_TRUE(written.token_range_recorded);
  EXPECT_EQ(written.min_token, 3u);
  EXPECT_EQ(written.max_token, 250u);
  const zt::TokenDataset dataset = zt::TokenDataset::open(file("r.tok"));
  EXPECT_TRUE(dataset.header().token_range_recorded);
  EXPECT_EQ(dataset.header().min_token, 3u);
  EXPECT_EQ(dataset.header().max_token, 250u);
  // The range sits in bytes older readers ignore; older files (zeros there) open as before.
  std::vector<char> bytes = read_bytes(file("r.tok"));
  std::fill(bytes.begin() + 40, bytes.begin() + 64, '\0');
  write_bytes(file("old.tok"), bytes);
  const zt::TokenDataset old = zt::TokenDataset::open(file("old.tok"), true);
  EXPECT_FALSE(old.header().token_range_recorded);
  EXPECT_EQ(old.size(), 4u);
  // A range that the tokens contradict is found by the checksum pass (a range consistent with
  // itself but not with the tokens: the file was altered after it was written).
  zt::write_token_file(file("forged.tok"), {{7, 3, 250, 9}}, 256);
  std::vector<char> forged = read_bytes(file("forged.tok"));
  const std::uint32_t max_token = 100;
  std::memcpy(forged.data() + 44, &max_token, sizeof max_token);
  const std::uint32_t range_crc = zt::crc32c(std::as_bytes(std::span(forged.data() + 40, 8)));
  std::memcpy(forged.data() + 48, &range_crc, sizeof range_crc);
  write_bytes(file("forged.tok"), forged);
  expect_io_error(
      [&] { (void)zt::TokenDataset::open(file("forged.tok"), true); },
      {file("forged.tok").string(), "token 2 is 250, outside the range its header records (3..100)"});
}

TEST_F(DataFiles, ChecksumMismatchIsFound) {
  zt::write_token_file(file("k.tok"), ramp(1000, 256), 256);
  std::vector<char> bytes = read_bytes(file("k.tok"));
  bytes[64 + 2 * 500] ^= 0x01;  // flip a bit of token 500, still < vocab
  write_bytes(file("k.tok"), bytes);
  const auto dataset = zt::TokenDataset::open(file("k.tok"));
  expect_io_error([&] { dataset.verify(); }, {file("k.tok").string(), "checksum mismatch", "corrupt"});
  expect_io_error([&] { (void)zt::TokenDataset::open(file("k.tok"), true); },
                  {file("k.tok").string(), "checksum mismatch"});
}

// ---- atomic writes -----------------------------------------------------------------------------

TEST_F(DataFiles, AbandonedWriterLeavesNoFile) {
  {
    zt::TokenFileWriter writer(file("x.tok"), 256);
    writer.append(ramp(1000, 256));
    EXPECT_TRUE(fs::exists(writer.temporary_path()));
    EXPECT_FALSE(fs::exists(file("x.tok")));
  }  // destroyed without commit(), as when an exception unwinds through it
  EXPECT_TRUE(directory_entries(dir_).empty());
}

TEST_F(DataFiles, FailureMidWriteLeavesNoFileAndKeepsTheOldOne) {
  // The bad token sits after the first 64 Ki-token chunk, so the writer has already written data
  // into its temporary file when it fails.
  std::vector<std::uint32_t> tokens = ramp(100'000, 256);
  tokens[90'000] = 256;
  expect_io_error([&] { zt::write_token_file(file("y.tok"), tokens, 256); },
                  {file("y.tok").string(), "token 90000 is 256"});
  EXPECT_TRUE(directory_entries(dir_).empty());

  // An existing file under the final name survives a failed rewrite untouched.
  zt::write_token_file(file("y.tok"), ramp(10, 256), 256);
  const std::vector<char> before = read_bytes(file("y.tok"));
  EXPECT_THROW(zt::write_token_file(file("y.tok"), tokens, 256), zt::IoError);
  EXPECT_EQ(read_bytes(file("y.tok")), before);
  EXPECT_EQ(directory_entries(dir_), std::vector<std::string>{"y.tok"});
}

TEST_F(DataFiles, UnwritableDestinationNamesThePath) {
  expect_io_error([&] { zt::write_token_file(file("no/such/dir/z.tok"), ramp(10, 256), 256); },
                  {file("no/such/dir/z.tok").string(), "cannot create"});
  EXPECT_THROW(zt::TokenFileWriter(file("bad_vocab.tok"), 70'000, 2),
               zt::IoError);  // vocab too big for uint16
}

// ---- text -> tokens ----------------------------------------------------------------------------

TEST(Tokenize, BytesAreTokens) {
  const std::string text = "Hi!\n\xff";
  EXPECT_EQ(zt::tokenize_bytes(text), (std::vector<std::uint32_t>{72, 105, 33, 10, 255}));
  EXPECT_TRUE(zt::tokenize_bytes("").empty());
}

TEST(TokenView, SegmentsReadAsOneSequence) {
  const std::vector<std::uint16_t> first = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  const std::vector<std::uint32_t> second = {10, 11, 12, 13, 14, 15, 16, 17, 18, 300};
  const std::vector<zt::TokenView::Segment> segments = {
      {reinterpret_cast<const std::byte*>(first.data()), first.size(), 2, "a"},
      {nullptr, 0, 4, "empty"},
      {reinterpret_cast<const std::byte*>(second.data()), second.size(), 4, "b"}};
  const zt::TokenView view(segments, 256, "a+b");
  EXPECT_TRUE(view.segmented());
  EXPECT_EQ(view.size(), 20U);
  EXPECT_EQ(view[9], 9U);
  EXPECT_EQ(view[10], 10U);
  EXPECT_EQ(view[18], 18U);
  std::vector<std::int32_t> out(10);
  view.copy_to(5, out);  // across the boundary
  EXPECT_EQ(out, (std::vector<std::int32_t>{5, 6, 7, 8, 9, 10, 11, 12, 13, 14}));
  std::vector<std::int32_t> tail(2);
  // The segment's own name and the index within it.
  expect_io_error([&] { view.copy_to(18, tail); },
                  {"tokens of 'b'", "token 9 is 300", "expected < vocab size 256"});
  EXPECT_THROW((void)view.bytes(), zt::Error);
  // One non-empty segment is the plain view.
  const std::vector<zt::TokenView::Segment> one = {segments[0], segments[1]};
  const zt::TokenView plain(one, 256, "a");
  EXPECT_FALSE(plain.segmented());
  EXPECT_EQ(plain.bytes().size(), 20U);
}

TEST_F(DataFiles, CorpusOfShardsIsTheirConcatenationInNameOrder) {
  fs::create_directories(file("shards"));
  const std::vector<std::uint32_t> tokens = ramp(3000, 500);
  // Written out of name order: the corpus sorts by name.
  zt::write_token_file(file("shards/b.tok"), std::span(tokens).subspan(1000, 1500), 500);
  zt::write_token_file(file("shards/a.tok"), std::span(tokens).subspan(0, 1000), 500);
  zt::write_token_file(file("shards/c.tok"), std::span(tokens).subspan(2500), 70000);  // 4-byte tokens
  write_bytes(file("shards/notes.txt"), {'h', 'i', '\n'});
  for (const std::string& path : {file("shards").string(), file("shards").string() + "/*.tok"}) {
    SCOPED_TRACE(path);
    const zt::TokenCorpus corpus = zt::TokenCorpus::open(path);
    ASSERT_EQ(corpus.shards().size(), 3U);
    EXPECT_EQ(corpus.shards()[0].path, file("shards/a.tok"));
    EXPECT_EQ(corpus.shards()[2].token_width, 4U);
    EXPECT_EQ(corpus.size(), 3000U);
    EXPECT_EQ(corpus.vocab_size(), 70000U);  // the largest of the shards'
    std::vector<std::int32_t> all(3000);
    corpus.view().copy_to(0, all);
    EXPECT_TRUE(std::equal(all.begin(), all.end(), tokens.begin()));
    EXPECT_NE(corpus.description().find("3 token files"), std::string::npos) << corpus.description();
  }
  EXPECT_NE(zt::TokenCorpus::open(file("shards").string()).description().find("1 other file(s) ignored"),
            std::string::npos);
  EXPECT_EQ(zt::detect_token_file_format(file("shards/a.tok")), zt::TokenFileFormat::zttokens);
  EXPECT_EQ(zt::detect_token_file_format(file("shards/notes.txt")), std::nullopt);
  EXPECT_TRUE(zt::is_token_data_path(file("shards").string()));
  EXPECT_FALSE(zt::is_token_data_path(file("shards/notes.txt").string()));
  // Converted into one file: the same tokens.
  const zt::TokenConvertStats stats = zt::convert_token_files(file("shards").string(), file("one.tok"));
  EXPECT_EQ(stats.files, 3U);
  EXPECT_EQ(stats.vocab_size, 70000U);
  const zt::TokenDataset one = zt::TokenDataset::open(file("one.tok"), true);
  std::vector<std::int32_t> back(3000);
  one.view().copy_to(0, back);
  EXPECT_TRUE(std::equal(back.begin(), back.end(), tokens.begin()));
  // A ZTTOKENS shard bounds its tokens by its own vocabulary; a corpus bound refuses larger ones
  // only in the formats that record none (tested with them in cli.data_formats).
  expect_io_error([&] { (void)zt::TokenCorpus::open(file("nothing").string()); },
                  {file("nothing").string(), "does not exist"});
  expect_io_error([&] { (void)zt::TokenCorpus::open(file("shards/*.npy").string()); }, {"matches no file"});
}

TEST_F(DataFiles, ConvertTextFile) {
  std::string text;
  for (int i = 0; i < 50'000; ++i) text += "line " + std::to_string(i) + " of the text\n";  // > 1 MiB chunk
  write_bytes(file("in.txt"), std::vector<char>(text.begin(), text.end()));
  const zt::ConvertStats stats = zt::convert_text_file(file("in.txt"), file("out.tok"));
  EXPECT_EQ(stats.input_bytes, text.size());
  EXPECT_EQ(stats.tokens, text.size());
  const auto dataset = zt::TokenDataset::open(file("out.tok"), true);
  EXPECT_EQ(dataset.vocab_size(), zt::kByteVocabSize);
  EXPECT_EQ(dataset.header().token_width, 2U);
  ASSERT_EQ(dataset.size(), text.size());
  for (std::size_t i = 0; i < text.size(); ++i)
    ASSERT_EQ(dataset.view()[i], static_cast<unsigned char>(text[i])) << i;

  expect_io_error([&] { zt::convert_text_file(file("absent.txt"), file("o2.tok")); },
                  {file("absent.txt").string(), "cannot open"});
  EXPECT_FALSE(fs::exists(file("o2.tok")));
}

TEST_F(DataFiles, ConvertRefusesToOverwriteItsInput) {
  const std::vector<char> text = {'h', 'e', 'l', 'l', 'o', '\n'};
  write_bytes(file("a.txt"), text);
  fs::create_symlink(file("a.txt"), file("link.txt"));
  fs::create_hard_link(file("a.txt"), file("hard.txt"));
  for (const char* output : {"a.txt", "link.txt", "hard.txt"}) {
    expect_io_error([&] { zt::convert_text_file(file("a.txt"), file(output)); },
                    {file(output).string(), "is the input file", file("a.txt").string()});
    EXPECT_EQ(read_bytes(file("a.txt")), text) << output;  // the text is still there
  }
  // The input through a link, the output the file itself.
  expect_io_error([&] { zt::convert_text_file(file("link.txt"), file("a.txt")); }, {"is the input file"});
  EXPECT_EQ(read_bytes(file("a.txt")), text);
  expect_io_error([&] { zt::convert_text_file(dir_, file("d.tok")); },
                  {"is a directory; expected a text file"});
}

// ---- sample windows and the loader -------------------------------------------------------------

TEST(SampleWindows, CountFollowsTheRule) {
  const zt::SampleWindows windows{.seq_len = 4};
  EXPECT_EQ(windows.count(0), 0U);
  EXPECT_EQ(windows.count(4), 0U);  // a sample needs seq_len + 1 tokens
  EXPECT_EQ(windows.count(5), 1U);
  EXPECT_EQ(windows.count(8), 1U);
  EXPECT_EQ(windows.count(9), 2U);
  for (std::uint64_t n = 1; n < 100; ++n) EXPECT_EQ(windows.count(n), (n - 1) / 4) << n;
  const zt::SampleWindows overlapping{.seq_len = 4, .stride = 2};
  EXPECT_EQ(overlapping.count(9), 3U);  // starts 0, 2, 4
  EXPECT_EQ(overlapping.first_token(2), 4U);
}

TEST(BatchLoader, WindowsAreInputsAndShiftedTargets) {
  std::vector<std::uint32_t> tokens(101);
  for (std::uint32_t i = 0; i < tokens.size(); ++i) tokens[i] = i;
  const zt::TokenView view(std::span<const std::uint32_t>(tokens), 1000);
  // No shuffle, one rank: micro-batch rows are samples 0, 1, 2.
  zt::BatchLoader loader(view, {.seq_len = 10}, {.micro_batch = 3}, 0, 1, /*shuffle=*/false);
  EXPECT_EQ(loader.num_samples(), 10U);
  const auto batch = loader.load(0);
  EXPECT_EQ(batch.sample_ids, (std::vector<std::uint64_t>{0, 1, 2}));
  ASSERT_EQ(batch.inputs.size(), 30U);
  for (std::size_t row = 0; row < 3; ++row)
    for (std::size_t t = 0; t < 10; ++t) {
      EXPECT_EQ(batch.inputs[row * 10 + t], static_cast<std::int32_t>(row * 10 + t));
      EXPECT_EQ(batch.targets[row * 10 + t], static_cast<std::int32_t>(row * 10 + t + 1));
    }
  loader.advance();
  EXPECT_EQ(loader.sample_ids(0), (std::vector<std::uint64_t>{3, 4, 5}));
  // Caller-provided buffers of the wrong size are refused.
  std::vector<std::int32_t> small(29), right(30);
  EXPECT_THROW(loader.load(0, small, right), zt::Error);
  // Too few tokens for one sample: the error names the source.
  try {
    zt::BatchLoader tiny(view, {.seq_len = 200}, {}, 0, 1);
    ADD_FAILURE();
  } catch (const zt::ConfigError& error) {
    EXPECT_NE(std::string(error.what()).find("'memory' has 101 tokens"), std::string::npos) << error.what();
  }
}

TEST(BatchLoader, UnsignedSixteenBitViewsDecode) {
  std::vector<std::uint16_t> tokens = {65535, 1, 2, 3, 4};
  const zt::TokenView view(std::span<const std::uint16_t>(tokens), 65536);
  EXPECT_EQ(view[0], 65535U);
  std::vector<std::int32_t> out(5);
  view.copy_to(0, out);
  EXPECT_EQ(out, (std::vector<std::int32_t>{65535, 1, 2, 3, 4}));
  EXPECT_THROW(view.copy_to(1, out), zt::Error);  // past the end
}

// ---- sampler -----------------------------------------------------------------------------------

TEST(DataSampler, EpochIsAPermutationDifferentPerEpochAndSeed) {
  const zt::DataSampler sampler(1000, 42);
  std::vector<std::uint64_t> sorted_ids(1000);
  for (std::uint64_t i = 0; i < 1000; ++i) sorted_ids[i] = i;
  std::set<std::vector<std::uint64_t>> seen;
  for (std::uint64_t epoch = 0; epoch < 5; ++epoch) {
    auto order = sampler.epoch_order(epoch);
    EXPECT_NE(order, sorted_ids);
    seen.insert(order);
    std::sort(order.begin(), order.end());
    EXPECT_EQ(order, sorted_ids) << "epoch " << epoch;
  }
  EXPECT_EQ(seen.size(), 5U);  // every epoch differs
  EXPECT_EQ(zt::DataSampler(1000, 42).epoch_order(3), sampler.epoch_order(3));
  EXPECT_NE(zt::DataSampler(1000, 43).epoch_order(0), sampler.epoch_order(0));
  // The stream is the epochs concatenated.
  const auto stream = sampler.samples_at(990, 20);
  const auto epoch0 = sampler.epoch_order(0), epoch1 = sampler.epoch_order(1);
  for (std::size_t i = 0; i < 10; ++i) EXPECT_EQ(stream[i], epoch0[990 + i]);
  for (std::size_t i = 0; i < 10; ++i) EXPECT_EQ(stream[10 + i], epoch1[i]);
  EXPECT_EQ(zt::DataSampler(10, 42, false).samples_at(8, 4), (std::vector<std::uint64_t>{8, 9, 0, 1}));
  EXPECT_EQ(zt::DataSampler(1, 7).epoch_order(0), std::vector<std::uint64_t>{0});
}

TEST(DataSampler, FirstEpochIsPinned) {
  // The permutation is part of the format of a resumed run: changing it silently changes what a
  // checkpoint resumes into. This pins the documented algorithm (docs/data.md).
  EXPECT_EQ(zt::DataSampler(10, 0).epoch_order(0),
            (std::vector<std::uint64_t>{0, 1, 4, 6, 3, 9, 8, 7, 2, 5}));
}

// Every (world, micro, accumulation) split of the same global batch size reads the same samples
// in the same order: concatenating micro-steps a (outer) and ranks r (inner) gives global batch k.
TEST(DataSampler, GlobalBatchIsInvariantUnderTheSplit) {
  const zt::DataSampler sampler(37, 2024);  // 37 samples: batches of 8 cross epoch boundaries
  const std::vector<zt::BatchShape> shapes = {
      {.micro_batch = 8, .grad_accum = 1, .data_parallel = 1},
      {.micro_batch = 4, .grad_accum = 1, .data_parallel = 2},
      {.micro_batch = 2, .grad_accum = 2, .data_parallel = 2},
      {.micro_batch = 1, .grad_accum = 2, .data_parallel = 4},
      {.micro_batch = 1, .grad_accum = 8, .data_parallel = 1},
      {.micro_batch = 2, .grad_accum = 1, .data_parallel = 4},
      {.micro_batch = 1, .grad_accum = 1, .data_parallel = 8},
      {.micro_batch = 4, .grad_accum = 2, .data_parallel = 1},
  };
  for (std::uint64_t step = 0; step < 20; ++step) {
    const auto expected = sampler.global_batch(step, 8);
    ASSERT_EQ(expected.size(), 8U);
    for (const auto& shape : shapes) {
      ASSERT_EQ(shape.global_batch(), 8U);
      std::vector<std::uint64_t> got;
      for (std::uint64_t a = 0; a < shape.grad_accum; ++a)
        for (std::uint64_t r = 0; r < shape.data_parallel; ++r) {
          const auto ids = sampler.sample_ids_for(step, shape, r, a);
          EXPECT_EQ(ids.size(), shape.micro_batch);
          got.insert(got.end(), ids.begin(), ids.end());
        }
      EXPECT_EQ(got, expected) << "step " << step << " micro " << shape.micro_batch << " gas "
                               << shape.grad_accum << " dp " << shape.data_parallel;
    }
  }
  // Over one epoch's worth of whole batches every sample appears once per epoch.
  std::map<std::uint64_t, int> uses;
  for (const auto id : sampler.samples_at(0, 37 * 3)) ++uses[id];
  EXPECT_EQ(uses.size(), 37U);
  for (const auto& [id, n] : uses) EXPECT_EQ(n, 3) << id;
  EXPECT_THROW((void)sampler.sample_ids_for(0, {.micro_batch = 2, .grad_accum = 2, .data_parallel = 2}, 2, 0),
               zt::Error);
  EXPECT_THROW((void)sampler.sample_ids_for(0, {.micro_batch = 2, .grad_accum = 2, .data_parallel = 2}, 0, 2),
               zt::Error);
}

TEST(BatchLoader, ResumeContinuesExactly) {
  const zt::TokenView corpus = zt::builtin_corpus_view();
  const zt::SampleWindows windows{.seq_len = 128};
  const zt::BatchShape shape{.micro_batch = 2, .grad_accum = 2, .data_parallel = 2};
  constexpr std::uint64_t kRank = 1, kSeed = 7, kSteps = 12, kStopAt = 5;

  // Uninterrupted run.
  zt::BatchLoader straight(corpus, windows, shape, kRank, kSeed);
  std::vector<std::vector<std::int32_t>> straight_inputs;
  std::vector<std::uint64_t> straight_ids;
  for (std::uint64_t step = 0; step < kSteps; ++step, straight.advance())
    for (std::uint64_t a = 0; a < shape.grad_accum; ++a) {
      auto batch = straight.load(a);
      straight_inputs.push_back(batch.inputs);
      straight_ids.insert(straight_ids.end(), batch.sample_ids.begin(), batch.sample_ids.end());
    }

  // Stopped after kStopAt steps; the position goes through its plain bytes, as a checkpoint would.
  zt::BatchLoader first(corpus, windows, shape, kRank, kSeed);
  for (std::uint64_t step = 0; step < kStopAt; ++step) first.advance();
  const zt::DataPosition saved = first.position();
  EXPECT_EQ(saved.stream_position(), kStopAt * shape.global_batch());
  std::array<std::byte, sizeof(zt::DataPosition)> bytes{};
  std::memcpy(bytes.data(), &saved, sizeof(saved));

  zt::DataPosition restored_position;
  std::memcpy(&restored_position, bytes.data(), sizeof(restored_position));
  zt::BatchLoader resumed(corpus, windows, shape, kRank, kSeed);
  resumed.restore(restored_position);
  EXPECT_EQ(resumed.position(), saved);
  std::size_t index = kStopAt * shape.grad_accum;
  for (std::uint64_t step = kStopAt; step < kSteps; ++step, resumed.advance())
    for (std::uint64_t a = 0; a < shape.grad_accum; ++a, ++index) {
      const auto batch = resumed.load(a);
      EXPECT_EQ(batch.inputs, straight_inputs[index]) << "step " << step << " micro " << a;
      EXPECT_EQ(batch.sample_ids, std::vector<std::uint64_t>(
                                      straight_ids.begin() + static_cast<std::ptrdiff_t>(index * 2),
                                      straight_ids.begin() + static_cast<std::ptrdiff_t>(index * 2 + 2)));
    }

  // Resuming into a different seed is refused.
  zt::BatchLoader other(corpus, windows, shape, kRank, kSeed + 1);
  EXPECT_THROW(other.restore(saved), zt::ConfigError);
}

TEST(BatchLoader, PositionCarriesAcrossEpochsAndWorldSizes) {
  const zt::TokenView corpus = zt::builtin_corpus_view();
  const zt::SampleWindows windows{.seq_len = 1024};
  // A 4-rank run stops part-way into its second epoch...
  zt::BatchLoader four(corpus, windows, {.micro_batch = 4, .grad_accum = 2, .data_parallel = 4}, 3, 11);
  const std::uint64_t n = four.num_samples();
  const std::uint64_t steps = n / 32 + 3;
  for (std::uint64_t s = 0; s < steps; ++s) four.advance();
  const zt::DataPosition saved = four.position();
  EXPECT_EQ(saved.epoch, 1U);
  EXPECT_EQ(saved.offset, steps * 32 - n);
  // ...and a 1-rank run with another split resumes at the same samples.
  zt::BatchLoader one(corpus, windows, {.micro_batch = 8, .grad_accum = 4, .data_parallel = 1}, 0, 11);
  one.restore(saved);
  std::vector<std::uint64_t> expected;
  for (std::uint64_t a = 0; a < 4; ++a) {
    const auto ids = one.sample_ids(a);
    expected.insert(expected.end(), ids.begin(), ids.end());
  }
  EXPECT_EQ(expected, four.sampler().samples_at(steps * 32, 32));
}

// ---- built-in corpus ---------------------------------------------------------------------------

TEST(BuiltinCorpus, IsDeterministicPrintableAndSized) {
  const std::string& text = zt::builtin_corpus_text();
  EXPECT_GE(text.size(), 1'000'000U);
  EXPECT_LE(text.size(), 2'100'000U);
  EXPECT_EQ(&text, &zt::builtin_corpus_text());  // cached
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    ASSERT_TRUE(c == '\n' || (c >= 0x20 && c <= 0x7e)) << "byte " << i << " is " << static_cast<int>(c);
  }
  EXPECT_EQ(text.back(), '\n');
  // Same bytes on every machine and build: pinned size and checksum (update both, deliberately,
  // if the generator is changed).
  EXPECT_EQ(text.size(), 1'500'172U);
  EXPECT_EQ(zt::crc32c(std::as_bytes(std::span(text.data(), text.size()))), 1533678724U);
  for (const char* phrase : {"Now ", " plus ", "Count with me: ", "Q: what", " comes after "})
    EXPECT_NE(text.find(phrase), std::string::npos) << phrase;

  const auto& tokens = zt::builtin_corpus_tokens();
  ASSERT_EQ(tokens.size(), text.size());
  EXPECT_EQ(tokens[100], static_cast<unsigned char>(text[100]));
  EXPECT_EQ(zt::builtin_corpus_view().vocab_size(), 256U);
  EXPECT_EQ(zt::builtin_corpus_view().source(), "builtin corpus");
}

TEST(BuiltinCorpus, HasLearnableStructure) {
  // The next-byte entropy given the previous byte bounds what even a bigram model reaches; it must
  // sit far below a uniform byte's ln(256) = 5.55 nats for a small GPT to get there quickly.
  const std::string& text = zt::builtin_corpus_text();
  std::vector<double> pair(256 * 256, 0.0), first(256, 0.0);
  for (std::size_t i = 1; i < text.size(); ++i) {
    const auto prev = static_cast<unsigned char>(text[i - 1]), next = static_cast<unsigned char>(text[i]);
    pair[prev * 256 + next] += 1;
    first[prev] += 1;
  }
  double entropy = 0.0;
  const double total = static_cast<double>(text.size() - 1);
  for (std::size_t p = 0; p < 256; ++p)
    for (std::size_t q = 0; q < 256; ++q)
      if (pair[p * 256 + q] > 0)
        entropy -= pair[p * 256 + q] / total * std::log(pair[p * 256 + q] / first[p]);
  EXPECT_LT(entropy, 2.5) << "bigram conditional entropy in nats";
  RecordProperty("bigram_entropy_nats", std::to_string(entropy));
}

}  // namespace
