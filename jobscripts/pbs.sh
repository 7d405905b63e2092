#!/bin/bash
# PBS Pro / OpenPBS. Submit: qsub jobscripts/pbs.sh
#PBS -N zerotrain
#PBS -l select=2:ncpus=32:mpiprocs=4:ngpus=4
#PBS -l walltime=01:00:00
#PBS -j oe
set -euo pipefail
cd "${PBS_O_WORKDIR:-$PWD}"
ZT_BIN=${ZT_BIN:-$PWD/build/bin}
ranks=$(wc -l < "$PBS_NODEFILE")
export OMP_NUM_THREADS=8
mpirun -n "$ranks" --hostfile "$PBS_NODEFILE" --map-by ppr:4:node --bind-to core "$ZT_BIN/zerotrain" report
mpirun -n "$ranks" --hostfile "$PBS_NODEFILE" --map-by ppr:4:node --bind-to core "$ZT_BIN/zt_bench_collectives" "$@"
