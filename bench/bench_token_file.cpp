// What checking a token file at open costs (docs/benchmarks.md, "Token files"): open() alone (the
// O(1) header checks and the recorded token range), open() of a file without a recorded range
// (one pass for the range), and open(verify) as `zerotrain train` does it (CRC32C + range, one
// pass), against a plain read of the same bytes (the anchor: what touching every page costs).
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
  std::filesystem::remove(path);
  std::filesystem::remove(old_path);
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
  return sink == 0 ? 1 : 0;
}
