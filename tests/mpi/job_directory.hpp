// A temporary directory every rank of an MPI test job sees: rank 0 makes it, all ranks get its
// name, rank 0 removes it after a barrier at the end of the scope.
#pragma once

#include <mpi.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "mpi_test_main.hpp"

namespace zt::testing {

class JobDirectory {
 public:
  /// Under $`base_variable` when that is set (a file system of the test's choosing), else the
  /// system temporary directory; named `prefix`-XXXXXX.
  explicit JobDirectory(const std::string& prefix, const char* base_variable = nullptr) {
    namespace fs = std::filesystem;
    std::string name;
    if (runtime().world_rank() == 0) {
      const char* base = base_variable != nullptr ? std::getenv(base_variable) : nullptr;
      const std::string pattern_text =
          (fs::path(base != nullptr ? base : fs::temp_directory_path().c_str()) / (prefix + "-XXXXXX"))
              .string();
      std::vector<char> pattern(pattern_text.begin(), pattern_text.end());
      pattern.push_back('\0');
      const char* made = ::mkdtemp(pattern.data());
      name = made != nullptr ? made : "";
    }
    int length = static_cast<int>(name.size());
    MPI_Bcast(&length, 1, MPI_INT, 0, MPI_COMM_WORLD);
    name.resize(static_cast<std::size_t>(length));
    MPI_Bcast(name.data(), length, MPI_CHAR, 0, MPI_COMM_WORLD);
    path_ = name;
  }
  ~JobDirectory() {
    MPI_Barrier(MPI_COMM_WORLD);
    if (runtime().world_rank() == 0 && !path_.empty()) std::filesystem::remove_all(path_);
  }
  JobDirectory(const JobDirectory&) = delete;
  JobDirectory& operator=(const JobDirectory&) = delete;

  const std::string& path() const { return path_; }
  std::string operator/(const std::string& child) const {
    return (std::filesystem::path(path_) / child).string();
  }
  /// Entries in the directory now.
  std::size_t entries() const {
    std::size_t count = 0;
    for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(path_)) ++count;
    return count;
  }

 private:
  std::string path_;
};

}  // namespace zt::testing
