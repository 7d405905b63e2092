#!/usr/bin/env bash
# Set up a Debian 12 machine for zerotrain and build it (Release) into build/.
# Idempotent and incremental: installs only missing packages, configures only once, and the build
# step recompiles only what changed. Run as root (or with sudo available).
#   ZT_BUILD_DIR   build directory (default: build)
#   ZT_CMAKE_ARGS  extra arguments for the first configure (e.g. -DZT_WITH_CUDA=OFF)
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build pkg-config git
  openmpi-bin libopenmpi-dev          # MPI (Open MPI 4.1, UCX transport built in)
  libhdf5-openmpi-dev hdf5-tools      # parallel HDF5 and h5dump
  python3-h5py                        # tests: checkpoints and exports read without zerotrain
  python3-torch                       # tests: an export loaded into PyTorch gives zerotrain's loss
  python3-matplotlib                  # zerotrain plot (scripts/zerotrain-plot) and its test
  python3-venv                        # tests: cli.metrics_sinks reads the event file with PyPI's tensorboard

  liburing-dev libaio-dev             # asynchronous I/O for NVMe offload
  libopenblas-dev                     # host GEMM
  libdnnl-dev                         # oneDNN: bf16 host GEMMs on CPUs with AVX512-BF16/AMX (optional: ZT_WITH_ONEDNN)
  ocl-icd-opencl-dev                  # Debian's dnnl-config.cmake requires OpenCL (its GPU runtime); only Recommended
  nlohmann-json3-dev                  # ds_config parsing
  libgtest-dev libgmock-dev           # tests
  gfortran                            # the Fortran module and example (optional: ZT_WITH_FORTRAN)
  fio                                 # the anchor of the NVMe swap benchmark (bench/run_swap_vs_fio.sh)
  shellcheck                          # tests: slurm.script lints jobscripts/slurm.sbatch
)
packages=($(printf '%s\n' "${packages[@]}" | sed 's/#.*//' | xargs -n1))

missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

build_dir="${ZT_BUILD_DIR:-build}"
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  # shellcheck disable=SC2086
  cmake -S . -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release ${ZT_CMAKE_ARGS:-}
fi
cmake --build "$build_dir" -j "$(nproc)"
