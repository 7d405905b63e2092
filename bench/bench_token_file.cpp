// What checking a token file at open costs (docs/benchmarks.md, "Token files"): open() alone (the
// O(1) header checks and the recorded token range), open() of a file without a recorded range
// (one pass for the range), and open(verify) as `zerotrain train` does it (CRC32C + range, one
// pass), against a plain read of the same bytes (the anchor: what touching every page costs); and
// zt::TokenCorpus::open of the same tokens as a NumPy .npy and as 4 llm.c shards (header checks and
// one pass over the tokens for the vocabulary range, what `zerotrain train` does for them).
//   zt_bench_token_file [--tokens N] [--dir DIR] [--repeats R]
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "bench_helpers.hpp"
#include "zerotrain/data.hpp"

namespace {

constexpr const char* kUsage =
    "usage: zt_bench_token_file [--tokens N (default 134217728)] [--dir DIR (default /tmp)] [--repeats R "
    "(5)]";

template <typename Body>
double median_seconds(int repeats, Body&& body) {
  std::vector<double> seconds;
  for (int r = 0; r < repeats; ++r) {
    const auto began = std::chrono::steady_clock::now();
    body();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count());
  }
  return zt::bench::median(seconds);
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t tokens = 128ull << 20;
  std::filesystem::path dir = "/tmp";
  int repeats = 5;
  zt::bench::parse_flags(argc, argv, kUsage, [&](const std::string& flag, const std::string& value) {
    if (flag == "--tokens")
      tokens = std::stoull(value);
    else if (flag == "--dir")
      dir = value;
    else if (flag == "--repeats")
      repeats = std::stoi(value);
    else
      return false;
    return true;
  });
  const std::filesystem::path path = dir / "zt_bench_token_file.tok";
  const std::filesystem::path old_path = dir / "zt_bench_token_file_old.tok";
  {
    std::vector<std::uint32_t> data(tokens);
    for (std::uint64_t i = 0; i < tokens; ++i)
      data[i] = static_cast<std::uint32_t>((i * 2654435761u) % 50257);
    zt::write_token_file(path, data, 50257);
  }
  // A file as written before the range was recorded: the same, with bytes 40-63 zero.
  std::filesystem::copy_file(path, old_path, std::filesystem::copy_options::overwrite_existing);
  {
    std::fstream file(old_path, std::ios::in | std::ios::out | std::ios::binary);
    const char zeros[24] = {};
    file.seekp(40);
    file.write(zeros, sizeof zeros);
  }
  // The same tokens as .npy (version 1.0, '<u2') and as 4 llm.c shards (magic 20240520 version 1).
  const std::filesystem::path npy_path = dir / "zt_bench_token_file.npy";
  const std::filesystem::path shard_dir = dir / "zt_bench_token_file_shards";
  {
    const zt::TokenDataset source = zt::TokenDataset::open(path);
    const auto* token_bytes = reinterpret_cast<const char*>(source.view().bytes().data());
    std::string header =
        "{'descr': '<u2', 'fortran_order': False, 'shape': (" + std::to_string(tokens) + ",), }";
    header.append(64 - (10 + header.size() + 1) % 64, ' ');
    header += '\n';
    std::ofstream npy(npy_path, std::ios::binary | std::ios::trunc);
    const char preamble[8] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0};
    const auto length = static_cast<std::uint16_t>(header.size());
    npy.write(preamble, sizeof preamble);
    npy.write(reinterpret_cast<const char*>(&length), sizeof length);
    npy << header;
    npy.write(token_bytes, static_cast<std::streamsize>(2 * tokens));
    std::filesystem::create_directories(shard_dir);
    for (std::uint64_t shard = 0; shard < 4; ++shard) {
      const std::uint64_t first = shard * tokens / 4, count = (shard + 1) * tokens / 4 - first;
      std::int32_t words[256] = {20240520, 1, static_cast<std::int32_t>(count)};
      std::ofstream out(shard_dir / ("shard_" + std::to_string(shard) + ".bin"),
                        std::ios::binary | std::ios::trunc);
      out.write(reinterpret_cast<const char*>(words), sizeof words);
      out.write(token_bytes + 2 * first, static_cast<std::streamsize>(2 * count));
    }
  }
  const double bytes = static_cast<double>(std::filesystem::file_size(path));
  const std::size_t block = 1 << 20;
  std::vector<char> buffer(block);
  std::uint64_t sink = 0;
  const double read_s = median_seconds(repeats, [&] {
    std::ifstream in(path, std::ios::binary);
    while (in.read(buffer.data(), static_cast<std::streamsize>(block)) || in.gcount() > 0)
      sink += static_cast<unsigned char>(buffer[0]);
  });
  const double open_s = median_seconds(repeats, [&] { sink += zt::TokenDataset::open(path).size(); });
  const double old_open_s = median_seconds(repeats, [&] { sink += zt::TokenDataset::open(old_path).size(); });
  const double verify_s = median_seconds(repeats, [&] { sink += zt::TokenDataset::open(path, true).size(); });
  const zt::TokenCorpusOptions vocab{.vocab_size = 50257};
  const double npy_s =
      median_seconds(repeats, [&] { sink += zt::TokenCorpus::open(npy_path, vocab).size(); });
  const double shards_s =
      median_seconds(repeats, [&] { sink += zt::TokenCorpus::open(shard_dir, vocab).size(); });
  std::filesystem::remove(path);
  std::filesystem::remove(old_path);
  std::filesystem::remove(npy_path);
  std::filesystem::remove_all(shard_dir);
  const double gib = bytes / (1024.0 * 1024.0 * 1024.0);
  std::printf("token file: %llu tokens of 2 bytes, %.3f GiB, median of %d (page cache warm)\n",
              static_cast<unsigned long long>(tokens), gib, repeats);
  std::printf("%-44s %10s %12s\n", "operation", "seconds", "s per GiB");
  const auto row = [&](const char* name, double seconds) {
    std::printf("%-44s %10.4f %12.3f\n", name, seconds, seconds / gib);
  };
  row("read every byte (ifstream, 1 MiB blocks)", read_s);
  row("open(), range recorded in the header", open_s);
  row("open(), older file: range read once", old_open_s);
  row("open(path, true): CRC32C + range (train)", verify_s);
  row("TokenCorpus .npy: header + vocab range pass", npy_s);
  row("TokenCorpus 4 llm.c shards: the same", shards_s);
  return sink == 0 ? 1 : 0;
}
