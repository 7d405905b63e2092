// Storage helpers of the token files, private to the io layer (ZTTOKENS, the ecosystem's token
// formats, text conversion): a whole file mapped read-only (RAII), little-endian loads, the range of
// a run of tokens, and the refusal to write a conversion onto its input.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <utility>

#include "base/text.hpp"
#include "zerotrain/error.hpp"

namespace zt::io {

/// The file at `path`, mapped read-only; `what` names it in errors ("token file"). A regular file
/// of at least `expected_min` bytes, else an IoError naming it and the sizes.
class MappedFile {
 public:
  MappedFile(const std::filesystem::path& path, const char* what, std::size_t expected_min) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      ZT_THROW_AS(IoError, "cannot open ", what, " '", path.string(), "': ", base::errno_text(errno));
    struct stat info {};
    const int stat_result = ::fstat(fd, &info);
    const int stat_errno = errno;
    if (stat_result != 0 || !S_ISREG(info.st_mode)) {
      ::close(fd);
      if (stat_result != 0)
        ZT_THROW_AS(IoError, "cannot stat ", what, " '", path.string(), "': ", base::errno_text(stat_errno));
      ZT_THROW_AS(IoError, what, " '", path.string(), "' is not a regular file");
    }
    size_ = static_cast<std::size_t>(info.st_size);
    if (size_ < expected_min) {
      ::close(fd);
      ZT_THROW_AS(IoError, what, " '", path.string(), "' is truncated: ", size_,
                  " bytes, expected at least the ", expected_min, "-byte header");
    }
    // mmap of 0 bytes fails; an empty file has nothing to map.
    if (size_ > 0) address_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    const int map_errno = errno;
    ::close(fd);  // the mapping stays valid on its own
    if (address_ == MAP_FAILED) {
      address_ = nullptr;
      ZT_THROW_AS(IoError, "cannot mmap ", what, " '", path.string(), "' (", size_,
                  " bytes): ", base::errno_text(map_errno));
    }
  }
  ~MappedFile() {
    if (address_ != nullptr) ::munmap(address_, size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  [[nodiscard]] const std::byte* bytes() const { return static_cast<const std::byte*>(address_); }
  [[nodiscard]] std::size_t size() const { return size_; }

 private:
  void* address_ = nullptr;
  std::size_t size_ = 0;
};

template <typename T>
T load_le(const std::byte* at) {
  T value;
  std::memcpy(&value, at, sizeof(T));  // any alignment, no aliasing
  return value;
}

/// The smallest and largest of `count` little-endian values of type T: a loop the compiler
/// vectorizes, a small fraction of a checksum's cost.
template <typename T>
std::pair<T, T> token_extremes(const std::byte* data, std::uint64_t count) {
  T low = std::numeric_limits<T>::max();
  T high = std::numeric_limits<T>::lowest();
  for (std::uint64_t i = 0; i < count; ++i) {
    const T token = load_le<T>(data + i * sizeof(T));
    low = std::min(low, token);
    high = std::max(high, token);
  }
  return {low, high};
}

/// A conversion's output replaces whatever is at its name: never the input itself, under any name
/// (the same path, a symbolic or a hard link), compared by device and inode as the kernel knows files.
inline void refuse_output_onto_input(const std::filesystem::path& input, const std::filesystem::path& output,
                                     const char* what) {
  struct stat input_info {};
  struct stat output_info {};
  if (::stat(input.c_str(), &input_info) == 0 && ::stat(output.c_str(), &output_info) == 0 &&
      input_info.st_dev == output_info.st_dev && input_info.st_ino == output_info.st_ino) {
    ZT_THROW_AS(IoError, "output '", output.string(), "' is the input file '", input.string(),
                "' (the same file, through a link or the same path): converting would replace the ", what,
                " with its tokens; choose another output path");
  }
}

}  // namespace zt::io
