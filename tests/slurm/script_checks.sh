#!/usr/bin/env bash
# jobscripts/slurm.sbatch without a cluster (ctest slurm.script): shellcheck on it and on the test
# scripts, and its dry mode (ZT_DRY_RUN=1), which prints the srun line it would run, for a CPU and
# a GPU allocation as Slurm's environment describes them. Prints "PASS: script" when all holds;
# exits 77 after "SKIPPED: ..." without shellcheck.
# usage: script_checks.sh SOURCE_DIR WORK_DIR
set -euo pipefail
source_dir=$1 work=$2
script=$source_dir/jobscripts/slurm.sbatch
fail() {
  echo "FAIL: $*"
  exit 1
}
command -v shellcheck >/dev/null || {
  echo "SKIPPED: shellcheck is not installed (scripts/setup.sh installs it)"
  exit 77
}
shellcheck "$script" "$source_dir/scripts/slurm-cluster.sh" "$source_dir"/tests/slurm/*.sh ||
  fail "shellcheck found problems"

mkdir -p "$work"
cd "$work"
# dry ENVIRONMENT... -- ARGUMENTS...: the script's dry-run line, with a clean Slurm environment.
dry() {
  local environment=()
  while [ "$1" != -- ]; do
    environment+=("$1")
    shift
  done
  shift
  env -u ZT_PREFIX -u ZT_BIN -u ZT_SAVE_DIR -u ZT_EXTRA_ARGS -u ZT_METRICS_DIR -u SLURM_GPUS_PER_TASK \
    SLURM_JOB_ID=4242 SLURM_SUBMIT_DIR="$work" ZT_DRY_RUN=1 "${environment[@]}" bash "$script" "$@"
}
expect() { # OUTPUT REGEX WHAT
  grep -Eq -- "$2" <<<"$1" || fail "$3: expected /$2/ in: $1"
}
reject() {
  if grep -Eq -- "$2" <<<"$1"; then fail "$3: unexpected /$2/ in: $1"; fi
}

# A CPU partition: --cpus-per-task and OMP_NUM_THREADS from the allocation, no GPU option; the
# per-job checkpoint directory and --resume-job; extra arguments from ZT_EXTRA_ARGS, then the
# script's own; the prefix's zerotrain.
cpu=$(dry SLURM_CPUS_PER_TASK=4 SLURM_RESTART_COUNT=2 ZT_PREFIX=/opt/zt ZT_EXTRA_ARGS="--print-every 5" \
  ZT_METRICS_DIR=/runs -- --data 'my corpus.bin')
expect "$cpu" "^==== zerotrain job 4242 run 3 \(restart count 2\) on " "separator line"
expect "$cpu" "dry run: OMP_NUM_THREADS=4 srun --mpi=pmix --cpus-per-task=4 --cpu-bind=cores /opt/zt/bin/zerotrain train " \
  "CPU srun line"
reject "$cpu" "gpus-per-task" "CPU partition"
expect "$cpu" " --resume auto .*--save-dir $work/checkpoints/job-4242 --resume-job 4242 " "default checkpoint directory"
expect "$cpu" " --metrics /runs/job-4242\.run2\.jsonl --print-every 5 --data my\\\\ corpus\.bin$" \
  "metrics file, ZT_EXTRA_ARGS, then the script's arguments"

# A GPU partition: one GPU per task passed on to srun; ZT_SAVE_DIR: no job check.
gpu=$(dry SLURM_CPUS_PER_TASK=8 SLURM_GPUS_PER_TASK=1 ZT_BIN=/build/bin ZT_SAVE_DIR=/ckpt/run7 --)
expect "$gpu" "srun --mpi=pmix --cpus-per-task=8 --cpu-bind=cores --gpus-per-task=1 /build/bin/zerotrain train " "GPU srun line"
expect "$gpu" " --save-dir /ckpt/run7$" "ZT_SAVE_DIR"
reject "$gpu" "resume-job" "ZT_SAVE_DIR given"

# ZT_RESUME_FOREIGN=1: the default directory without the job check. Outside an allocation:
# one CPU per task, zerotrain from PATH or the submit directory's build.
foreign=$(dry SLURM_CPUS_PER_TASK=2 ZT_RESUME_FOREIGN=1 --)
reject "$foreign" "resume-job" "ZT_RESUME_FOREIGN=1"
bare=$(env -u SLURM_CPUS_PER_TASK SLURM_JOB_ID=1 ZT_DRY_RUN=1 bash "$script")
expect "$bare" "OMP_NUM_THREADS=1 srun --mpi=pmix --cpus-per-task=1 " "no SLURM_CPUS_PER_TASK"
# The header: log appended across requeues, requeue allowed, the warning signal, no GPU request.
for line in "--open-mode=append" "--requeue" "--signal=USR1@120"; do
  grep -q "^#SBATCH $line\$" "$script" || fail "no '#SBATCH $line' line"
done
if grep -q "^#SBATCH --gpus" "$script"; then fail "the header asks for GPUs: it would fail on CPU partitions"; fi
echo "PASS: script"
