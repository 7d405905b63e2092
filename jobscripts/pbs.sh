#!/bin/bash
# zerotrain under PBS Pro / OpenPBS: trains with checkpoints, stops before the walltime, resubmits
# itself and resumes where it stopped (docs/jobscripts.md).
#
#   qsub jobscripts/pbs.sh
#   qsub -l select=4:ncpus=32:mpiprocs=4:ngpus=4 -v ZT_PREFIX=/opt/zerotrain jobscripts/pbs.sh
#
# Ranks and binding come from the chunk: mpiprocs ranks per node, ncpus/mpiprocs cores per rank
# (ZT_RANKS_PER_NODE and ZT_THREADS override), launched as
#   mpirun --map-by ppr:N:node:PE=T --bind-to core
# which binds each rank to its own T cores. (`--map-by ppr:N:node --bind-to core` alone binds every
# rank to one core, and its T OpenMP threads then share that core: docs/jobscripts.md shows the
# masks.)
#
# PBS sends no warning before the walltime (only SIGTERM, then SIGKILL after kill_delay), so the
# script sends SIGUSR1 to mpirun ZT_STOP_MARGIN seconds before the walltime; mpirun forwards it to
# every rank, which finishes its step, saves and exits 75. The script then submits itself again
# (qsub -V) and the next job resumes from the newest checkpoint (--resume auto) in the job name's
# checkpoint directory.
#
# Environment (all optional; the same names as jobscripts/slurm.sbatch):
#   ZT_PREFIX          installed prefix: runs $ZT_PREFIX/bin/zerotrain, configs from
#                      $ZT_PREFIX/share/zerotrain/configs; else ZT_BIN/zerotrain, else zerotrain
#                      from PATH, else ./build/bin/zerotrain of the submit directory
#   ZT_BIN             directory holding zerotrain (a build tree's bin/)
#   ZT_CONFIG          ds_config file (default: gpt-tiny.json of the prefix or examples/configs)
#   ZT_STEPS           train until this global step (default 10000)
#   ZT_SAVE_DIR        checkpoint directory (default: $PBS_O_WORKDIR/checkpoints/$PBS_JOBNAME,
#                      shared by the jobs that resubmit each other)
#   ZT_SAVE_INTERVAL   steps between checkpoints (default 500); ZT_KEEP_LAST: checkpoints kept (3)
#   ZT_METRICS_DIR     metrics (JSON lines): job J writes ZT_METRICS_DIR/job-J.jsonl
#   ZT_EXTRA_ARGS      more `zerotrain train` arguments (split at spaces), then the script's own
#   ZT_RANKS_PER_NODE  ranks per node (default: the chunk's mpiprocs, from $PBS_NODEFILE)
#   ZT_THREADS         cores (and OpenMP threads) per rank (default: ncpus / mpiprocs)
#   ZT_STOP_MARGIN     seconds before the walltime to stop and save (default 120)
#   ZT_WALLTIME        the walltime in seconds (default: qstat's Resource_List.walltime)
#   ZT_RESUBMIT        0: do not resubmit after a stop (default 1)
#   ZT_JOB_SCRIPT      the script qsub resubmits (default: this file in the prefix, else
#                      jobscripts/pbs.sh of the submit directory; PBS runs a copy of it)
#   ZT_DRY_RUN         1: print the mpirun line and exit, running nothing
#PBS -N zerotrain
#PBS -l select=1:ncpus=8:mpiprocs=2
#PBS -l walltime=01:00:00
#PBS -j oe
#PBS -r y
set -euo pipefail

submit_dir=${PBS_O_WORKDIR:-$PWD}
cd "$submit_dir"
job=${PBS_JOBID:-none}
job_name=${PBS_JOBNAME:-zerotrain}
echo "==== zerotrain job $job ($job_name) on $(hostname) at $(date -u '+%Y-%m-%dT%H:%M:%SZ') ===="

if [ -n "${ZT_PREFIX:-}" ]; then
  zerotrain=$ZT_PREFIX/bin/zerotrain
  default_config=$ZT_PREFIX/share/zerotrain/configs/gpt-tiny.json
  job_script=${ZT_JOB_SCRIPT:-$ZT_PREFIX/share/zerotrain/jobscripts/pbs.sh}
else
  if [ -n "${ZT_BIN:-}" ]; then
    zerotrain=$ZT_BIN/zerotrain
  elif command -v zerotrain >/dev/null; then
    zerotrain=$(command -v zerotrain)
  else
    zerotrain=$submit_dir/build/bin/zerotrain
  fi
  default_config=examples/configs/gpt-tiny.json
  job_script=${ZT_JOB_SCRIPT:-$submit_dir/jobscripts/pbs.sh}
fi

train_args=(--config "${ZT_CONFIG:-$default_config}" --steps "${ZT_STEPS:-10000}"
  --save-dir "${ZT_SAVE_DIR:-$submit_dir/checkpoints/$job_name}"
  --save-interval "${ZT_SAVE_INTERVAL:-500}" --keep-last "${ZT_KEEP_LAST:-3}" --resume auto)
[ -z "${ZT_METRICS_DIR:-}" ] || train_args+=(--metrics "$ZT_METRICS_DIR/job-$job.jsonl")
if [ -n "${ZT_EXTRA_ARGS:-}" ]; then
  read -r -a extra <<<"$ZT_EXTRA_ARGS"
  train_args+=("${extra[@]}")
fi
train_args+=("$@")

# The allocation: $PBS_NODEFILE holds one line per rank (mpiprocs per chunk); NCPUS is the cores
# of a chunk.
nodefile=${PBS_NODEFILE:-}
if [ -n "$nodefile" ]; then
  ranks=$(wc -l <"$nodefile")
  nodes=$(sort -u "$nodefile" | wc -l)
else
  ranks=1 nodes=1
fi
ranks_per_node=${ZT_RANKS_PER_NODE:-$((ranks / nodes))}
threads=${ZT_THREADS:-$((${NCPUS:-$ranks_per_node} / ranks_per_node))}
[ "$threads" -ge 1 ] || threads=1
export OMP_NUM_THREADS=$threads

mpirun_args=(-n "$((nodes * ranks_per_node))" --map-by "ppr:$ranks_per_node:node:PE=$threads" --bind-to core)
[ -z "$nodefile" ] || mpirun_args+=(--hostfile "$nodefile")
command_line=(mpirun "${mpirun_args[@]}" "$zerotrain" train "${train_args[@]}")
shown="OMP_NUM_THREADS=$OMP_NUM_THREADS $(printf '%q ' "${command_line[@]}")"
shown=${shown% }

# When to stop: ZT_STOP_MARGIN seconds before the walltime (qstat -f gives it as HH:MM:SS).
walltime=${ZT_WALLTIME:-}
if [ -z "$walltime" ] && [ "$job" != none ]; then
  hms=$(qstat -f "$job" 2>/dev/null | sed -n 's/^ *Resource_List.walltime = //p' || true)
  if [[ $hms =~ ^([0-9]+):([0-9]+):([0-9]+)$ ]]; then
    walltime=$((10#${BASH_REMATCH[1]} * 3600 + 10#${BASH_REMATCH[2]} * 60 + 10#${BASH_REMATCH[3]}))
  fi
fi
stop_after=""
[ -z "$walltime" ] || stop_after=$((walltime - ${ZT_STOP_MARGIN:-120}))
stop_note="no walltime known: no stop signal"
[ -z "$stop_after" ] || stop_note="SIGUSR1 to mpirun after ${stop_after} s"

if [ "${ZT_DRY_RUN:-0}" = 1 ]; then
  echo "pbs.sh: dry run: $shown"
  echo "pbs.sh: dry run: $stop_note"
  exit 0
fi
echo "pbs.sh: $shown"
echo "pbs.sh: $stop_note"

set +e
"${command_line[@]}" &
launcher_pid=$!
stopped=0
if [ -n "$stop_after" ]; then
  # Poll, so that nothing is left behind when the run ends first.
  deadline=$((SECONDS + stop_after))
  while kill -0 "$launcher_pid" 2>/dev/null; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "pbs.sh: ${ZT_STOP_MARGIN:-120} s before the walltime: SIGUSR1 to mpirun (save and exit 75)"
      kill -s USR1 "$launcher_pid" 2>/dev/null
      stopped=1
      break
    fi
    sleep 1
  done
fi
wait "$launcher_pid"
status=$?
set -e

if [ "$status" -eq 75 ]; then
  # Stopped after saving. Continue in a new job only when the stop was the walltime's (a qdel
  # sends SIGTERM, and the ranks save and exit 75 too: that job stays ended).
  if [ "$stopped" = 1 ] && [ "${ZT_RESUBMIT:-1}" = 1 ] && [ "$job" != none ]; then
    echo "pbs.sh: the run exited 75 (stopped before the walltime after saving); resubmitting $job_script"
    qsub -V -N "$job_name" "$job_script" ||
      echo "pbs.sh: qsub $job_script failed; submit it again to continue"
  else
    echo "pbs.sh: the run exited 75 (stopped by a signal after saving); submit the job again to continue"
  fi
fi
echo "pbs.sh: the run exited $status"
exit "$status"
