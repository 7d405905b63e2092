#!/usr/bin/env bash
# Set up and build, then run the whole test suite (unit and MPI tests at 1, 2 and 4 ranks).
# Extra arguments go to ctest, e.g. scripts/run-tests.sh -L mpi   or   -R collectives
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec ctest --test-dir "${ZT_BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" "$@"
