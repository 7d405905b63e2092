#!/usr/bin/env bash
# DeepSpeed's cpu_adam against zerotrain's host AdamW, in one process per DeepSpeed SIMD path
# (bench/deepspeed_cpu_adam.cpp), with the triad and limit anchors of zt_bench_adamw.
#
#   bench/run_adamw_vs_deepspeed.sh [bench flags: --params N --reps R --threads T]
#
# Needs a configured and built zerotrain (BUILD_DIR, default build: libzerotrain) and DeepSpeed's
# source: DEEPSPEED_SRC=<unpacked tree>, or else the sdist of DEEPSPEED_VERSION (default 0.19.8) is
# fetched with `pip download` into $BUILD_DIR/deepspeed-src. PyTorch is not needed: the kernel is
# DeepSpeed's header csrc/includes/cpu_adam.h, compiled with the flags of its CPUAdamBuilder
# (-O3 -march=native -fopenmp -D__AVX512__ or -D__AVX256__; AVX512 only where the CPU has it).
# Each path runs twice: DeepSpeed's arrays as PyTorch's CPU allocator makes them by default
# (THP_MEM_ALLOC_ENABLE=0: no huge-page advice) and with PyTorch's opt-in THP_MEM_ALLOC_ENABLE=1;
# DEEPSPEED_THP="0" (or "1") runs one of them only. zerotrain's arrays are zt::Buffers either way.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
build=$(cd "${BUILD_DIR:-$root/build}" && pwd)
[ -f "$build/lib/libzerotrain.so" ] || { echo "no $build/lib/libzerotrain.so: build zerotrain first" >&2; exit 2; }
src=${DEEPSPEED_SRC:-}
if [ -z "$src" ]; then
  version=${DEEPSPEED_VERSION:-0.19.8}
  cache=$build/deepspeed-src
  if [ ! -d "$cache/deepspeed-$version" ]; then
    mkdir -p "$cache"
    python3 -m pip download --quiet --no-deps --no-binary :all: -d "$cache" "deepspeed==$version"
    tar -xzf "$cache/deepspeed-$version.tar.gz" -C "$cache"
  fi
  src=$cache/deepspeed-$version
fi
[ -f "$src/csrc/includes/cpu_adam.h" ] || { echo "$src has no csrc/includes/cpu_adam.h" >&2; exit 2; }

# zerotrain's public headers include mpi.h.
read -ra mpi_includes <<< "$(pkg-config --cflags-only-I ompi 2>/dev/null || mpicxx --showme:compile 2>/dev/null || true)"
paths=(AVX256)
grep -qw avx512f /proc/cpuinfo && paths=(AVX512 AVX256)
for simd in "${paths[@]}"; do
  exe=$build/bin/zt_bench_deepspeed_adam_${simd,,}
  g++ -O3 -std=c++20 -march=native -fopenmp "-D__${simd}__" -Wno-reorder \
    -I"$src/csrc/includes" -I"$here/deepspeed_shim" -I"$root" -I"$root/include" -I"$build/generated" \
    "${mpi_includes[@]}" \
    "$here/deepspeed_cpu_adam.cpp" -L"$build/lib" -Wl,-rpath,"$build/lib" -lzerotrain -o "$exe"
  for thp in ${DEEPSPEED_THP:-0 1}; do
    echo "== $(basename "$exe") (DeepSpeed $(basename "$src"), $simd, THP_MEM_ALLOC_ENABLE=$thp)"
    THP_MEM_ALLOC_ENABLE=$thp OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive} "$exe" "$@"
  done
done
