// The ecosystem's token formats (NumPy .npy, llm.c shards, Megatron indexed datasets) next to
// zerotrain's ZTTOKENS, detected by their headers, validated and memory-mapped; a directory or glob
// of such files read as one dataset (TokenCorpus); conversion of any of them to ZTTOKENS.
#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "io/token_storage.hpp"
#include "zerotrain/data.hpp"
#include "zerotrain/error.hpp"

namespace zt {
namespace fs = std::filesystem;
using io::load_le;

namespace {

// ---- the published layouts -----------------------------------------------------------------------

// NumPy's .npy (numpy/lib/format.py): "\x93NUMPY", major and minor version bytes, the header's
// length (uint16 in version 1, uint32 in 2 and 3), then the header: a Python dict literal with
// 'descr', 'fortran_order' and 'shape', padded with spaces and '\n'; the data follows.
constexpr char kNpyMagic[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};

// llm.c's token shards (dev/data/data_common.py, write_datafile): 256 int32 header words, [0] the
// magic, [1] the version, [2] the token count; then the tokens.
constexpr std::size_t kLlmcHeaderBytes = 256 * 4;
constexpr std::int32_t kLlmcGpt2Magic = 20240520;  // version 1, uint16 tokens
constexpr std::int32_t kLlmcGpt2Version = 1;
constexpr std::int32_t kLlmcLlama3Magic = 20240801;  // version 7, uint32 tokens
constexpr std::int32_t kLlmcLlama3Version = 7;

// Megatron-LM's indexed dataset (megatron/core/datasets/indexed_dataset.py, _IndexWriter): the
// .idx holds "MMIDIDX\0\0", uint64 version 1, uint8 dtype code, uint64 sequence count S, uint64
// document count D, int32 sequence lengths [S], int64 sequence byte offsets into the .bin [S],
// int64 document indices [D] (sequence indices: 0, then the end of each document), and for
// multimodal datasets int8 sequence modes [S]. The .bin holds the tokens of the sequences.
constexpr char kMegatronMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr std::size_t kMegatronFixedBytes = 9 + 8 + 1 + 8 + 8;
constexpr std::uint8_t kMegatronUint16 = 8;
constexpr std::uint8_t kMegatronInt32 = 4;

const char* megatron_dtype_name(std::uint8_t code) {
  constexpr std::array<const char*, 9> kNames = {"?",     "uint8",   "int8",    "int16", "int32",
                                                 "int64", "float64", "float32", "uint16"};
  return code < kNames.size() ? kNames[code] : "unknown";
}

std::string format_label(TokenFileFormat format) {
  switch (format) {
    case TokenFileFormat::zttokens:
      return "token file";
    case TokenFileFormat::npy:
      return "npy file";
    case TokenFileFormat::llmc:
      return "llm.c token file";
    case TokenFileFormat::megatron:
      return "Megatron dataset";
  }
  return "token file";
}

/// Up to `count` bytes from the start of the file (fewer when it is shorter).
std::string first_bytes(const fs::path& path, std::size_t count) {
  std::ifstream in(path, std::ios::binary);
  ZT_CHECK_AS(IoError, in.good(), "cannot open data file '", path.string(), "': ", base::errno_text(errno));
  std::string bytes(count, '\0');
  in.read(bytes.data(), static_cast<std::streamsize>(count));
  bytes.resize(static_cast<std::size_t>(in.gcount()));
  return bytes;
}

bool regular_file(const fs::path& path) {
  std::error_code error;
  return fs::is_regular_file(path, error);
}

/// A Megatron dataset's two files from any of: PREFIX, PREFIX.bin, PREFIX.idx.
std::optional<std::pair<fs::path, fs::path>> megatron_pair(const fs::path& path) {
  fs::path prefix = path;
  if (path.extension() == ".bin" || path.extension() == ".idx") prefix.replace_extension();
  fs::path bin = prefix, idx = prefix;
  bin += ".bin";
  idx += ".idx";
  if (!regular_file(bin) || !regular_file(idx)) return std::nullopt;
  const std::string head = first_bytes(idx, sizeof kMegatronMagic);
  if (head.size() != sizeof kMegatronMagic ||
      std::memcmp(head.data(), kMegatronMagic, sizeof kMegatronMagic) != 0)
    return std::nullopt;
  return std::pair{bin, idx};
}

// ---- one shard ---------------------------------------------------------------------------------

/// A file of the corpus, mapped: where its tokens are and what they are.
struct MappedShard {
  std::unique_ptr<TokenDataset> zttokens;  // ZTTOKENS: the checked dataset
  std::unique_ptr<io::MappedFile> file;    // the other formats: the file with the tokens
  const std::byte* tokens = nullptr;
  std::uint64_t token_offset = 0;  // byte offset of the first token in the file
  bool signed_tokens = false;      // int32 tokens (npy <i4, Megatron int32): negatives are refused
  TokenShard info;
  std::string source;  // the path as text, for the view's messages
};

void check_size(const MappedShard& shard, std::uint64_t file_size, const std::string& layout) {
  const std::uint64_t payload = file_size - shard.token_offset;
  const std::uint64_t width = shard.info.token_width;
  if (payload / width < shard.info.tokens)
    ZT_THROW_AS(IoError, format_label(shard.info.format), " '", shard.source, "' is truncated: ", file_size,
                " bytes, expected ", layout, " = ", shard.token_offset, " + ", shard.info.tokens,
                " tokens * ", width, " bytes");
  if (payload / width > shard.info.tokens || payload % width != 0)
    ZT_THROW_AS(IoError, format_label(shard.info.format), " '", shard.source,
                "' has trailing data: ", file_size, " bytes, expected ", layout, " = ", shard.token_offset,
                " + ", shard.info.tokens, " tokens * ", width, " bytes");
}

/// The value of `key` in a .npy header dict (the text after "'key':", trimmed to its end).
std::string npy_field(const std::string& header, const std::string& key, const std::string& name) {
  std::size_t at = header.find("'" + key + "'");
  if (at == std::string::npos) at = header.find("\"" + key + "\"");
  if (at == std::string::npos)
    ZT_THROW_AS(IoError, "npy file '", name, "': its header has no '", key, "' (header: ", header, ")");
  at = header.find(':', at);
  ZT_CHECK_AS(IoError, at != std::string::npos, "npy file '", name, "': malformed header ", header);
  ++at;
  while (at < header.size() && header[at] == ' ') ++at;
  if (at < header.size() && (header[at] == '\'' || header[at] == '"')) {
    const std::size_t end = header.find(header[at], at + 1);
    ZT_CHECK_AS(IoError, end != std::string::npos, "npy file '", name, "': malformed header ", header);
    return header.substr(at + 1, end - at - 1);
  }
  if (at < header.size() && header[at] == '(') {
    const std::size_t end = header.find(')', at);
    ZT_CHECK_AS(IoError, end != std::string::npos, "npy file '", name, "': malformed header ", header);
    return header.substr(at, end - at + 1);
  }
  std::size_t end = at;
  while (end < header.size() && header[end] != ',' && header[end] != '}') ++end;
  return header.substr(at, end - at);
}

void open_npy(MappedShard& shard) {
  const std::string& name = shard.source;
  shard.file = std::make_unique<io::MappedFile>(shard.info.path, "npy file", 10);
  const std::byte* bytes = shard.file->bytes();
  const auto major = std::to_integer<unsigned>(bytes[6]);
  const auto minor = std::to_integer<unsigned>(bytes[7]);
  std::uint64_t header_length = 0;
  std::size_t header_start = 0;
  if (major == 1) {
    header_length = load_le<std::uint16_t>(bytes + 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    ZT_CHECK_AS(IoError, shard.file->size() >= 12, "npy file '", name, "' is truncated: ", shard.file->size(),
                " bytes, shorter than its 12-byte preamble");
    header_length = load_le<std::uint32_t>(bytes + 8);
    header_start = 12;
  } else {
    ZT_THROW_AS(IoError, "npy file '", name, "' has format version ", major, ".", minor,
                ", expected 1.0, 2.0 or 3.0");
  }
  if (header_start + header_length > shard.file->size())
    ZT_THROW_AS(IoError, "npy file '", name, "' is truncated: ", shard.file->size(),
                " bytes, its header says ", header_start, " + ", header_length, " header bytes");
  const std::string header(reinterpret_cast<const char*>(bytes + header_start), header_length);
  const std::string descr = npy_field(header, "descr", name);
  if (descr == "<u2" || descr == "=u2") {
    shard.info.token_width = 2;
  } else if (descr == "<u4" || descr == "=u4") {
    shard.info.token_width = 4;
  } else if (descr == "<i4" || descr == "=i4") {
    shard.info.token_width = 4;
    shard.signed_tokens = true;
  } else {
    ZT_THROW_AS(IoError, "npy file '", name, "' holds dtype '", descr,
                "', expected '<u2' (uint16), '<u4' (uint32) or '<i4' (int32) tokens; convert it with "
                "numpy.save(path, array.astype(numpy.uint16)) (or uint32 for vocabularies above 65536)");
  }
  const std::string fortran = npy_field(header, "fortran_order", name);
  // Of a 1-D array the order does not matter, but numpy writes False for it; refuse anything else.
  ZT_CHECK_AS(IoError, fortran.find("False") != std::string::npos, "npy file '", name,
              "' is in Fortran order (fortran_order ", fortran, "), expected a 1-D array in C order");
  const std::string shape = npy_field(header, "shape", name);
  // "(N,)": one dimension.
  std::uint64_t count = 0;
  std::size_t i = 1;
  bool digits = false;
  while (i < shape.size() && shape[i] == ' ') ++i;
  for (; i < shape.size() && shape[i] >= '0' && shape[i] <= '9'; ++i) {
    ZT_CHECK_AS(IoError, count <= (std::numeric_limits<std::uint64_t>::max() - 9) / 10, "npy file '", name,
                "': shape ", shape, " is out of range");
    count = count * 10 + static_cast<std::uint64_t>(shape[i] - '0');
    digits = true;
  }
  while (i < shape.size() && shape[i] == ' ') ++i;
  const bool one_dimension = digits && i + 1 < shape.size() && shape[i] == ',' &&
                             shape.find_first_not_of(' ', i + 1) == shape.size() - 1;
  ZT_CHECK_AS(IoError, one_dimension, "npy file '", name, "' has shape ", shape,
              ", expected a 1-D array (N,) of tokens; save array.reshape(-1)");
  shard.info.tokens = count;
  shard.token_offset = header_start + header_length;
  check_size(shard, shard.file->size(),
             "the header's " + std::to_string(shard.token_offset) + " bytes + shape");
  shard.tokens = bytes + shard.token_offset;
}

void open_llmc(MappedShard& shard) {
  const std::string& name = shard.source;
  shard.file = std::make_unique<io::MappedFile>(shard.info.path, "llm.c token file", kLlmcHeaderBytes);
  const std::byte* bytes = shard.file->bytes();
  const auto magic = load_le<std::int32_t>(bytes);
  const auto version = load_le<std::int32_t>(bytes + 4);
  const auto count = load_le<std::int32_t>(bytes + 8);
  if (magic == kLlmcGpt2Magic && version == kLlmcGpt2Version) {
    shard.info.token_width = 2;
  } else if (magic == kLlmcLlama3Magic && version == kLlmcLlama3Version) {
    shard.info.token_width = 4;
  } else {
    ZT_THROW_AS(IoError, "llm.c token file '", name, "' has magic ", magic, " version ", version,
                ", expected magic ", kLlmcGpt2Magic, " version ", kLlmcGpt2Version,
                " (uint16 tokens) or magic ", kLlmcLlama3Magic, " version ", kLlmcLlama3Version,
                " (uint32 tokens)");
  }
  ZT_CHECK_AS(IoError, count >= 0, "llm.c token file '", name, "': token count ", count,
              " in header word 2 is negative");
  shard.info.tokens = static_cast<std::uint64_t>(count);
  shard.token_offset = kLlmcHeaderBytes;
  check_size(shard, shard.file->size(), "the 1024-byte header + the count in header word 2");
  shard.tokens = bytes + shard.token_offset;
}

void open_megatron(MappedShard& shard, const fs::path& idx_path) {
  const std::string& name = shard.source;
  const std::string idx_name = idx_path.string();
  const io::MappedFile idx(idx_path, "Megatron index", kMegatronFixedBytes);
  const std::byte* head = idx.bytes();
  ZT_CHECK_AS(IoError, std::memcmp(head, kMegatronMagic, sizeof kMegatronMagic) == 0, "Megatron index '",
              idx_name, "': bad magic, expected \"MMIDIDX\\0\\0\" in bytes 0-8");
  const auto version = load_le<std::uint64_t>(head + 9);
  ZT_CHECK_AS(IoError, version == 1, "Megatron index '", idx_name, "' has version ", version, ", expected 1");
  const auto code = std::to_integer<std::uint8_t>(head[17]);
  if (code == kMegatronUint16) {
    shard.info.token_width = 2;
  } else if (code == kMegatronInt32) {
    shard.info.token_width = 4;
    shard.signed_tokens = true;
  } else {
    ZT_THROW_AS(IoError, "Megatron index '", idx_name, "' has dtype code ", static_cast<unsigned>(code), " (",
                megatron_dtype_name(code), "), expected 8 (uint16) or 4 (int32) tokens");
  }
  const auto sequences = load_le<std::uint64_t>(head + 18);
  const auto document_entries = load_le<std::uint64_t>(head + 26);
  // Sizes in entries first, so that a corrupt count cannot overflow the byte arithmetic.
  const std::uint64_t available = idx.size() - kMegatronFixedBytes;
  ZT_CHECK_AS(IoError, sequences <= available / 12 && document_entries <= available / 8, "Megatron index '",
              idx_name, "' is truncated: ", idx.size(), " bytes cannot hold its ", sequences,
              " sequences and ", document_entries, " document indices");
  const std::uint64_t expected = kMegatronFixedBytes + 12 * sequences + 8 * document_entries;
  // Multimodal datasets add one int8 mode per sequence.
  if (idx.size() != expected && idx.size() != expected + sequences)
    ZT_THROW_AS(IoError, "Megatron index '", idx_name, "' has ", idx.size(), " bytes, expected ", expected,
                " (34 + 12 x ", sequences, " sequences + 8 x ", document_entries,
                " document indices), or that + ", sequences,
                " with sequence modes; it is truncated or corrupt");
  const std::byte* lengths = head + kMegatronFixedBytes;
  const std::byte* pointers = lengths + 4 * sequences;
  const std::byte* documents = pointers + 8 * sequences;
  // The sequences must lie one after the other in the .bin (as Megatron's writer and its merge put
  // them): then the .bin is the token stream itself, mapped as it is.
  std::uint64_t total = 0;
  for (std::uint64_t s = 0; s < sequences; ++s) {
    const auto length = load_le<std::int32_t>(lengths + 4 * s);
    const auto pointer = load_le<std::int64_t>(pointers + 8 * s);
    ZT_CHECK_AS(IoError, length >= 0, "Megatron index '", idx_name, "': sequence ", s, " has length ",
                length);
    if (pointer < 0 || static_cast<std::uint64_t>(pointer) != total * shard.info.token_width)
      ZT_THROW_AS(IoError, "Megatron index '", idx_name, "': sequence ", s, " starts at byte ", pointer,
                  " of the .bin, expected ", total * shard.info.token_width,
                  " (sequences stored one after the other, as Megatron writes them)");
    total += static_cast<std::uint64_t>(length);
  }
  ZT_CHECK_AS(IoError, document_entries >= 1 && load_le<std::int64_t>(documents) == 0, "Megatron index '",
              idx_name, "': its document indices must start with 0 (", document_entries, " entries)");
  for (std::uint64_t d = 1; d < document_entries; ++d) {
    const auto previous = load_le<std::int64_t>(documents + 8 * (d - 1));
    const auto end = load_le<std::int64_t>(documents + 8 * d);
    ZT_CHECK_AS(IoError, end >= previous && static_cast<std::uint64_t>(end) <= sequences, "Megatron index '",
                idx_name, "': document index ", d, " is ", end, ", expected ", previous, " .. ", sequences,
                " (non-decreasing sequence indices)");
  }
  const auto last = load_le<std::int64_t>(documents + 8 * (document_entries - 1));
  ZT_CHECK_AS(IoError, static_cast<std::uint64_t>(last) == sequences, "Megatron index '", idx_name,
              "': its last document ends at sequence ", last, ", expected ", sequences,
              " (every sequence in a document)");
  shard.info.tokens = total;
  shard.info.documents = document_entries - 1;
  shard.file = std::make_unique<io::MappedFile>(shard.info.path, "Megatron .bin", 0);
  const std::uint64_t bin_size = shard.file->size();
  if (bin_size != total * shard.info.token_width)
    ZT_THROW_AS(IoError, "Megatron dataset '", name, "' does not match its index '", idx_name,
                "': the .bin has ", bin_size, " bytes, the index describes ", total, " tokens * ",
                shard.info.token_width, " = ", total * shard.info.token_width, " bytes");
  shard.tokens = shard.file->bytes();
}

/// Every token < vocab_size, none negative (signed formats): one vectorized pass for the range,
/// and on a failure a second to name the first offending token.
void check_tokens(MappedShard& shard, std::uint32_t vocab_size) {
  const std::uint64_t count = shard.info.tokens;
  if (count == 0) return;
  const std::uint32_t width = shard.info.token_width;
  std::uint32_t high = 0;
  bool negative = false;
  if (width == 2) {
    high = io::token_extremes<std::uint16_t>(shard.tokens, count).second;
  } else if (shard.signed_tokens) {
    const auto [low, top] = io::token_extremes<std::int32_t>(shard.tokens, count);
    negative = low < 0;
    high = static_cast<std::uint32_t>(std::max(top, 0));
  } else {
    high = io::token_extremes<std::uint32_t>(shard.tokens, count).second;
  }
  shard.info.max_token = high;
  if (!negative && (vocab_size == 0 || high < vocab_size)) return;
  for (std::uint64_t i = 0; i < count; ++i) {
    const std::byte* at = shard.tokens + i * width;
    const std::int64_t token = width == 2            ? std::int64_t{load_le<std::uint16_t>(at)}
                               : shard.signed_tokens ? std::int64_t{load_le<std::int32_t>(at)}
                                                     : std::int64_t{load_le<std::uint32_t>(at)};
    if (token < 0)
      ZT_THROW_AS(IoError, format_label(shard.info.format), " '", shard.source, "': token ", i,
                  " (byte offset ", shard.token_offset + i * width, ") is ", token,
                  ", expected a token id >= 0");
    if (vocab_size != 0 && token >= vocab_size)
      ZT_THROW_AS(IoError, format_label(shard.info.format), " '", shard.source, "': token ", i,
                  " (byte offset ", shard.token_offset + i * width, ") is ", token,
                  ", expected < vocab size ", vocab_size);
  }
}

MappedShard open_shard(const fs::path& path, TokenFileFormat format, const TokenCorpusOptions& options) {
  MappedShard shard;
  shard.info.format = format;
  if (format == TokenFileFormat::megatron) {
    const auto pair = megatron_pair(path);
    ZT_CHECK_AS(IoError, pair.has_value(), "Megatron dataset '", path.string(),
                "': expected PREFIX.bin and PREFIX.idx next to each other");
    shard.info.path = pair->first;
    shard.source = pair->first.string();
    open_megatron(shard, pair->second);
  } else {
    shard.info.path = path;
    shard.source = path.string();
    if (format == TokenFileFormat::zttokens) {
      shard.zttokens = std::make_unique<TokenDataset>(TokenDataset::open(path, options.verify_checksums));
      const TokenFileHeader& header = shard.zttokens->header();
      shard.info.tokens = header.token_count;
      shard.info.token_width = header.token_width;
      shard.info.vocab_size = header.vocab_size;
      shard.token_offset = header.header_size;
      shard.tokens = shard.zttokens->view().bytes().data();
    } else if (format == TokenFileFormat::npy) {
      open_npy(shard);
    } else {
      open_llmc(shard);
    }
  }
  if (format == TokenFileFormat::zttokens) {
    // Its header's vocabulary bounds its tokens (TokenDataset::open checked them); the caller's
    // bound is checked against that vocabulary by whoever knows the model (the trainer says what to
    // change). The largest token: recorded in the header, or (older files) read once more.
    const TokenFileHeader& header = shard.zttokens->header();
    if (header.token_range_recorded)
      shard.info.max_token = header.token_count > 0 ? header.max_token : 0;
    else
      check_tokens(shard, header.vocab_size);
  } else {
    check_tokens(shard, options.vocab_size);
    shard.info.vocab_size = options.vocab_size != 0 ? options.vocab_size : shard.info.max_token + 1;
  }
  return shard;
}

std::string unrecognized_token_file(const fs::path& path) {
  return "data file '" + path.string() +
         "' has none of the token formats' headers: expected \"ZTTOKENS\" (zerotrain), \"\\x93NUMPY\" "
         "(.npy), "
         "llm.c's magic 20240520 or 20240801 as its first int32 (.bin), or a Megatron dataset (PREFIX.bin "
         "next "
         "to PREFIX.idx beginning \"MMIDIDX\\0\\0\"); the file is damaged or of another format";
}

bool has_glob_characters(const std::string& path) {
  return path.find_first_of("*?[") != std::string::npos;
}

/// The files `path` names, in order, each with its format.
std::vector<std::pair<fs::path, TokenFileFormat>> files_of(const std::string& path, std::string& note) {
  std::vector<std::pair<fs::path, TokenFileFormat>> files;
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  auto add = [&](const fs::path& file, bool named) {
    const std::optional<TokenFileFormat> format = detect_token_file_format(file);
    if (!format) {
      ZT_CHECK_AS(IoError, !named, unrecognized_token_file(file));
      return false;
    }
    fs::path shard = file;
    if (*format == TokenFileFormat::megatron) shard = megatron_pair(file)->first;  // .idx and .bin: once
    for (const auto& [seen, _] : files)
      if (seen == shard) return true;
    files.emplace_back(shard, *format);
    return true;
  };
  if (fs::is_directory(status)) {
    std::vector<fs::path> entries;
    for (const fs::directory_entry& entry : fs::directory_iterator(path, error)) {
      const std::string name = entry.path().filename().string();
      if (!name.starts_with('.') && entry.is_regular_file()) entries.push_back(entry.path());
    }
    ZT_CHECK_AS(IoError, !error, "cannot list data directory '", path, "': ", error.message());
    std::sort(entries.begin(), entries.end());
    std::size_t skipped = 0;
    for (const fs::path& entry : entries) skipped += add(entry, false) ? 0 : 1;
    ZT_CHECK_AS(IoError, !files.empty(), "data directory '", path, "' holds no token file (", entries.size(),
                " file(s) of no token format: ZTTOKENS, .npy, llm.c .bin, Megatron .bin + .idx)");
    if (skipped > 0) note = ", " + std::to_string(skipped) + " other file(s) ignored";
    return files;
  }
  if (fs::exists(status)) {
    add(path, true);
    return files;
  }
  if (megatron_pair(path)) {  // a Megatron prefix, as Megatron's --data-path names datasets
    files.emplace_back(megatron_pair(path)->first, TokenFileFormat::megatron);
    return files;
  }
  ZT_CHECK_AS(IoError, has_glob_characters(path), "data path '", path, "' does not exist");
  glob_t matches{};
  const int result = ::glob(path.c_str(), GLOB_ERR, nullptr, &matches);
  std::vector<fs::path> paths;
  for (std::size_t i = 0; result == 0 && i < matches.gl_pathc; ++i) paths.emplace_back(matches.gl_pathv[i]);
  ::globfree(&matches);
  ZT_CHECK_AS(IoError, result == 0 || result == GLOB_NOMATCH, "data pattern '", path,
              "': the file system could not be read (glob error ", result, ")");
  ZT_CHECK_AS(IoError, !paths.empty(), "data pattern '", path, "' matches no file");
  std::sort(paths.begin(), paths.end());
  for (const fs::path& match : paths)
    if (regular_file(match)) add(match, true);
  ZT_CHECK_AS(IoError, !files.empty(), "data pattern '", path, "' matches no regular file");
  return files;
}

}  // namespace

std::string_view to_string(TokenFileFormat format) {
  switch (format) {
    case TokenFileFormat::zttokens:
      return "zttokens";
    case TokenFileFormat::npy:
      return "npy";
    case TokenFileFormat::llmc:
      return "llm.c";
    case TokenFileFormat::megatron:
      return "megatron";
  }
  return "unknown";
}

std::optional<TokenFileFormat> detect_token_file_format(const fs::path& path) {
  if (path.extension() == ".idx" || path.extension() == ".bin") {
    if (megatron_pair(path)) return TokenFileFormat::megatron;
  }
  const std::string head = first_bytes(path, 12);
  if (head.size() >= sizeof kTokenFileMagic &&
      std::memcmp(head.data(), kTokenFileMagic, sizeof kTokenFileMagic) == 0)
    return TokenFileFormat::zttokens;
  if (head.size() >= sizeof kNpyMagic && std::memcmp(head.data(), kNpyMagic, sizeof kNpyMagic) == 0)
    return TokenFileFormat::npy;
  if (head.size() >= 4) {
    const auto magic = load_le<std::int32_t>(reinterpret_cast<const std::byte*>(head.data()));
    if (magic == kLlmcGpt2Magic || magic == kLlmcLlama3Magic) return TokenFileFormat::llmc;
  }
  return std::nullopt;
}

bool is_token_data_path(const std::string& path) {
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (fs::is_directory(status)) return true;
  if (!fs::exists(status)) return has_glob_characters(path) || megatron_pair(path).has_value();
  if (!fs::is_regular_file(status)) return false;
  if (detect_token_file_format(path)) return true;
  // Named as a token file but none: a damaged header, not text to train on byte by byte.
  const std::string extension = fs::path(path).extension().string();
  if (extension == ".npy" || extension == ".bin" || extension == ".idx" || extension == ".tok")
    ZT_THROW_AS(IoError, unrecognized_token_file(path));
  return false;
}

// ---- the corpus --------------------------------------------------------------------------------

struct TokenCorpus::Storage {
  std::vector<MappedShard> shards;
  std::vector<TokenView::Segment> segments;
  std::string source;  // what the view is called in messages
};

TokenCorpus::TokenCorpus(TokenCorpus&&) noexcept = default;
TokenCorpus& TokenCorpus::operator=(TokenCorpus&&) noexcept = default;
TokenCorpus::~TokenCorpus() = default;

TokenCorpus TokenCorpus::open(const std::string& path, const TokenCorpusOptions& options) {
  std::string note;
  const std::vector<std::pair<fs::path, TokenFileFormat>> files = files_of(path, note);
  TokenCorpus corpus;
  corpus.storage_ = std::make_unique<Storage>();
  Storage& storage = *corpus.storage_;
  storage.shards.reserve(files.size());
  for (const auto& [file, format] : files) {
    storage.shards.push_back(open_shard(file, format, options));
    const MappedShard& shard = storage.shards.back();
    corpus.shards_.push_back(shard.info);
    corpus.token_count_ += shard.info.tokens;
    corpus.vocab_size_ = std::max(corpus.vocab_size_, shard.info.vocab_size);
  }
  // The segments point at the shards' source strings: made once the vector no longer moves.
  for (const MappedShard& shard : storage.shards)
    storage.segments.push_back({shard.tokens, shard.info.tokens, shard.info.token_width, shard.source});
  const TokenShard& first = corpus.shards_.front();
  if (files.size() == 1) {
    corpus.description_ = format_label(first.format) + " " + first.path.string();
  } else {
    bool same_format = true;
    for (const TokenShard& shard : corpus.shards_) same_format = same_format && shard.format == first.format;
    corpus.description_ = std::to_string(files.size()) + " " +
                          (same_format ? format_label(first.format) + "s" : std::string("token files")) +
                          " " + path + " (" + first.path.filename().string() + " .. " +
                          corpus.shards_.back().path.filename().string() + note + ")";
  }
  std::uint64_t documents = 0;
  for (const TokenShard& shard : corpus.shards_) documents += shard.documents;
  if (documents > 0) corpus.description_ += ", " + std::to_string(documents) + " documents";
  storage.source = files.size() == 1 ? storage.shards.front().source : path;
  return corpus;
}

TokenView TokenCorpus::view() const {
  return TokenView(storage_->segments, vocab_size_, storage_->source);
}

TokenConvertStats convert_token_files(const std::string& input, const fs::path& output,
                                      std::uint32_t vocab_size) {
  TokenCorpusOptions options;
  options.vocab_size = vocab_size;
  const TokenCorpus corpus = TokenCorpus::open(input, options);
  for (const TokenShard& shard : corpus.shards()) {
    io::refuse_output_onto_input(shard.path, output, "input");
    if (shard.format == TokenFileFormat::megatron) {
      fs::path idx = shard.path;
      io::refuse_output_onto_input(idx.replace_extension(".idx"), output, "input");
    }
    ZT_CHECK_AS(IoError, vocab_size == 0 || shard.vocab_size <= vocab_size, "token file '",
                shard.path.string(), "' has a vocabulary of ", shard.vocab_size,
                " tokens, larger than --vocab-size ", vocab_size);
  }
  const std::uint32_t vocab = vocab_size != 0 ? vocab_size : corpus.vocab_size();
  TokenFileWriter writer(output, vocab, token_width_for_vocab(vocab));
  const TokenView tokens = corpus.view();
  constexpr std::uint64_t kChunk = 1 << 20;
  std::vector<std::int32_t> signed_chunk;
  std::vector<std::uint32_t> chunk;
  for (std::uint64_t first = 0; first < tokens.size(); first += kChunk) {
    const auto n = static_cast<std::size_t>(std::min(kChunk, tokens.size() - first));
    signed_chunk.resize(n);
    tokens.copy_to(first, signed_chunk);
    chunk.assign(signed_chunk.begin(), signed_chunk.end());
    writer.append(chunk);
  }
  TokenConvertStats stats;
  stats.files = corpus.shards().size();
  stats.tokens = writer.commit().token_count;
  stats.vocab_size = vocab;
  stats.description = corpus.description();
  return stats;
}

}  // namespace zt
