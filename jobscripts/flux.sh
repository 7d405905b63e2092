#!/bin/bash
# zerotrain under Flux: trains with checkpoints, stops before the time limit, resubmits itself and
# resumes where it stopped (docs/jobscripts.md).
#
#   flux batch jobscripts/flux.sh
#   flux batch -N 4 --env=ZT_PREFIX=/opt/zerotrain --env=ZT_GPUS_PER_RANK=1 jobscripts/flux.sh
#
# The ranks are one Flux job inside the batch instance, each with its own cores (and GPU), bound
# to them by the Flux shell:
#   flux run -N NODES -n RANKS -c T [-g 1] -o cpu-affinity=per-task [-o gpu-affinity=per-task]
# (the shell's default, cpu-affinity=on, binds every rank to all the cores of its node).
#
# ZT_STOP_MARGIN seconds (120) before the time limit Flux sends SIGUSR1 to every rank (the step
# runs with -t <what the batch job has left> --signal=SIGUSR1@120s); each finishes its step, saves
# and exits 75. Flux does not requeue: the script submits itself again to the enclosing instance
# (flux --parent batch), and the next job resumes from the newest checkpoint (--resume auto) in the
# job name's checkpoint directory.
#
# Environment (all optional; the same names as jobscripts/slurm.sbatch):
#   ZT_PREFIX          installed prefix: runs $ZT_PREFIX/bin/zerotrain, configs from
#                      $ZT_PREFIX/share/zerotrain/configs; else ZT_BIN/zerotrain, else zerotrain
#                      from PATH, else ./build/bin/zerotrain of the submit directory
#   ZT_BIN             directory holding zerotrain (a build tree's bin/)
#   ZT_CONFIG          ds_config file (default: gpt-tiny.json of the prefix or examples/configs)
#   ZT_STEPS           train until this global step (default 10000)
#   ZT_SAVE_DIR        checkpoint directory (default: ./checkpoints/$ZT_JOB_NAME, shared by the
#                      jobs that resubmit each other)
#   ZT_JOB_NAME        the job's name (default zerotrain)
#   ZT_SAVE_INTERVAL   steps between checkpoints (default 500); ZT_KEEP_LAST: checkpoints kept (3)
#   ZT_METRICS_DIR     metrics (JSON lines): job J writes ZT_METRICS_DIR/job-J.jsonl
#   ZT_EXTRA_ARGS      more `zerotrain train` arguments (split at spaces), then the script's own
#   ZT_RANKS_PER_NODE  ranks per node (default 2)
#   ZT_THREADS         cores (and OpenMP threads) per rank (default 4)
#   ZT_GPUS_PER_RANK   GPUs per rank (default 0: CPU nodes)
#   ZT_NODES           nodes (default: the batch job's, $FLUX_JOB_NNODES)
#   ZT_STOP_MARGIN     seconds before the time limit to stop and save (default 120)
#   ZT_WALLTIME        seconds the batch job has left (default: flux job timeleft)
#   ZT_RESUBMIT        0: do not resubmit after a stop (default 1)
#   ZT_JOB_SCRIPT      the script resubmitted (default: this file in the prefix, else
#                      jobscripts/flux.sh of the working directory; Flux runs a copy of it)
#   ZT_DRY_RUN         1: print the flux run line and exit, running nothing
#flux: --job-name=zerotrain
#flux: -N 1
#flux: -t 60m
set -euo pipefail

job=${FLUX_JOB_ID:-none}
job_name=${ZT_JOB_NAME:-zerotrain}
echo "==== zerotrain job $job ($job_name) on $(hostname) at $(date -u '+%Y-%m-%dT%H:%M:%SZ') ===="

if [ -n "${ZT_PREFIX:-}" ]; then
  zerotrain=$ZT_PREFIX/bin/zerotrain
  default_config=$ZT_PREFIX/share/zerotrain/configs/gpt-tiny.json
  job_script=${ZT_JOB_SCRIPT:-$ZT_PREFIX/share/zerotrain/jobscripts/flux.sh}
else
  if [ -n "${ZT_BIN:-}" ]; then
    zerotrain=$ZT_BIN/zerotrain
  elif command -v zerotrain >/dev/null; then
    zerotrain=$(command -v zerotrain)
  else
    zerotrain=$PWD/build/bin/zerotrain
  fi
  default_config=examples/configs/gpt-tiny.json
  job_script=${ZT_JOB_SCRIPT:-$PWD/jobscripts/flux.sh}
fi

train_args=(--config "${ZT_CONFIG:-$default_config}" --steps "${ZT_STEPS:-10000}"
  --save-dir "${ZT_SAVE_DIR:-$PWD/checkpoints/$job_name}"
  --save-interval "${ZT_SAVE_INTERVAL:-500}" --keep-last "${ZT_KEEP_LAST:-3}" --resume auto)
[ -z "${ZT_METRICS_DIR:-}" ] || train_args+=(--metrics "$ZT_METRICS_DIR/job-$job.jsonl")
if [ -n "${ZT_EXTRA_ARGS:-}" ]; then
  read -r -a extra <<<"$ZT_EXTRA_ARGS"
  train_args+=("${extra[@]}")
fi
train_args+=("$@")

nodes=${ZT_NODES:-${FLUX_JOB_NNODES:-1}}
ranks_per_node=${ZT_RANKS_PER_NODE:-2}
threads=${ZT_THREADS:-4}
gpus=${ZT_GPUS_PER_RANK:-0}
margin=${ZT_STOP_MARGIN:-120}
export OMP_NUM_THREADS=$threads

flux_args=(-N "$nodes" -n "$((nodes * ranks_per_node))" -c "$threads" -o cpu-affinity=per-task)
[ "$gpus" = 0 ] || flux_args+=(-g "$gpus" -o gpu-affinity=per-task)
# The step's time limit is what the batch job has left, so that the signal comes before its end.
time_left=${ZT_WALLTIME:-$(flux job timeleft 2>/dev/null || true)}
[[ ! $time_left =~ ^[0-9]+$ ]] || [ "$time_left" -eq 0 ] || flux_args+=(-t "${time_left}s")
flux_args+=("--signal=SIGUSR1@${margin}s")
command_line=(flux run "${flux_args[@]}" "$zerotrain" train "${train_args[@]}")
shown="OMP_NUM_THREADS=$OMP_NUM_THREADS $(printf '%q ' "${command_line[@]}")"
shown=${shown% }
if [ "${ZT_DRY_RUN:-0}" = 1 ]; then
  echo "flux.sh: dry run: $shown"
  exit 0
fi
echo "flux.sh: $shown"

set +e
"${command_line[@]}"
status=$?
set -e
if [ "$status" -eq 75 ]; then
  # Stopped by the signal after saving: continue in a new job from that checkpoint.
  if [ "${ZT_RESUBMIT:-1}" = 1 ] && [ "$job" != none ]; then
    echo "flux.sh: the run exited 75 (stopped after saving); resubmitting $job_script"
    flux --parent batch --job-name="$job_name" -N "$nodes" "$job_script" "$@" ||
      echo "flux.sh: flux --parent batch $job_script failed; submit it again to continue"
  else
    echo "flux.sh: the run exited 75 (stopped by a signal after saving); submit the job again to continue"
  fi
fi
echo "flux.sh: the run exited $status"
exit "$status"
