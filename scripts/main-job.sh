#!/usr/bin/env bash
# The main job: set up and build, then train the built-in GPT on the built-in corpus across 2 MPI
# ranks (data parallel), printing the loss as it falls. Extra arguments go to `zerotrain train`.
#   ZT_RANKS   number of ranks (default 2)
#   ZT_CONFIG  config file (default examples/configs/gpt-tiny.json)
#   ZT_STEPS   optimizer steps (default 300)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ranks="${ZT_RANKS:-2}"
mpi_flags=(--oversubscribe)
if [ "$(id -u)" -eq 0 ]; then
  mpi_flags+=(--allow-run-as-root)
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OMP_WAIT_POLICY=passive  # idle OpenMP threads sleep instead of spinning on shared cores
mkdir -p build/runs
exec mpirun "${mpi_flags[@]}" -n "$ranks" build/bin/zerotrain train \
  --config "${ZT_CONFIG:-examples/configs/gpt-tiny.json}" --steps "${ZT_STEPS:-300}" \
  --metrics build/runs/main-job.jsonl "$@"
