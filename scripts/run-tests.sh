#!/usr/bin/env bash
# Set up and build, then run the whole test suite (unit and MPI tests at 1, 2 and 4 ranks).
# Extra arguments go to ctest, e.g. scripts/run-tests.sh -L mpi   or   -R collectives
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Twice as many tests as cores: the suite waits more than it computes (MPI start-up, watchdog and
# signal timings, Slurm's scheduler). On 2 cores, without the on-host GPU tests: 883 s with -j 2
# (38 % of the CPU idle), 729 s with -j 4 (2026-12-07).
exec ctest --test-dir "${ZT_BUILD_DIR:-build}" --output-on-failure -j "$(($(nproc) * 2))" "$@"
