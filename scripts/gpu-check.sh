#!/usr/bin/env bash
# The checks that need a GPU, in one short run for a machine that has one (e.g. the device tool's
# H200): configure a CUDA build for Hopper, build only the GPU-relevant targets, run them.
# Prints the results; exits non-zero when a check fails. Needs the same Debian packages as
# scripts/setup.sh (it runs it with ZT_BUILD_DIR=build-gpu).
set -euo pipefail
cd "$(dirname "$0")/.."
export ZT_BUILD_DIR=build-gpu
export ZT_CMAKE_ARGS="-DZT_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=${ZT_CUDA_ARCH:-90} -DZT_BUILD_BENCH=OFF"
if [ ! -f build-gpu/CMakeCache.txt ]; then
  generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  # shellcheck disable=SC2086
  cmake -S . -B build-gpu "${generator[@]}" -DCMAKE_BUILD_TYPE=Release $ZT_CMAKE_ARGS
fi
cmake --build build-gpu -j "$(nproc)" --target zerotrain_cli unit_device unit_device_offload mpi_nccl
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
build-gpu/bin/zerotrain report
build-gpu/bin/unit_device
build-gpu/bin/unit_device_offload
mpirun --oversubscribe -n 1 build-gpu/bin/mpi_nccl
gpus=$(nvidia-smi -L 2>/dev/null | wc -l || echo 0)
if [ "$gpus" -ge 2 ]; then
  mpirun --oversubscribe -n "$gpus" build-gpu/bin/mpi_nccl
fi
