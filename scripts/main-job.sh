#!/usr/bin/env bash
# The main job: set up and build, then run across 2 MPI ranks.
# Until the training engine lands this is the collective benchmark (zerotrain vs raw MPI).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ranks="${ZT_RANKS:-2}"
mpi_flags=()
[ "$(id -u)" -eq 0 ] && mpi_flags+=(--allow-run-as-root)
mpi_flags+=(--oversubscribe)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
build/bin/zerotrain report
exec mpirun "${mpi_flags[@]}" -n "$ranks" build/bin/zt_bench_collectives --quick "$@"
