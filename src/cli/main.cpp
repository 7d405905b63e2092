// The `zerotrain` command.
//   zerotrain report          what this build and machine offer (run it first when something is off)
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>

#include "zerotrain/report.hpp"
#include "zerotrain/runtime.hpp"

namespace {

void print_usage(std::FILE* out) {
  std::fputs(
      "usage: zerotrain <command> [options]\n"
      "commands:\n"
      "  report    print MPI, CUDA/NCCL, HDF5 and I/O capabilities of this build and machine\n"
      "  help      this text\n",
      out);
}

int report_command(zt::Runtime& runtime) {
  zt::Report report;
  for (const zt::Report& part :
       {zt::build_report(), zt::mpi_report(runtime), zt::device_report(), zt::io_report()}) {
    report.insert(report.end(), part.begin(), part.end());
  }
  if (runtime.world_rank() != 0) return 0;
  std::string section;
  for (const auto& line : report) {
    if (line.section != section) {
      section = line.section;
      std::printf("[%s]\n", section.c_str());
    }
    std::printf("  %-26s %s\n", (line.key + ":").c_str(), line.value.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  zt::Runtime runtime(&argc, &argv);
  return zt::run_and_report([&]() -> int {
    const std::string_view command = argc > 1 ? argv[1] : "help";
    if (command == "report") return report_command(runtime);
    if (command == "help" || command == "--help" || command == "-h") {
      if (runtime.world_rank() == 0) print_usage(stdout);
      return 0;
    }
    if (runtime.world_rank() == 0) {
      std::fprintf(stderr, "zerotrain: unknown command '%s'\n", std::string(command).c_str());
      print_usage(stderr);
    }
    return 2;
  });
}
