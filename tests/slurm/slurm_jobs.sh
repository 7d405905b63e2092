#!/usr/bin/env bash
# jobscripts/slurm.sbatch on a real one-node Slurm (ctest -L slurm; the cluster comes from
# scripts/slurm-cluster.sh, started by the slurm.cluster.start fixture). Each mode submits real
# jobs of a tiny GPT on 2 CPUs and prints "PASS: MODE" when everything it checks holds:
#   two_tasks  2 tasks x 1 CPU: the job completes, its checkpoint (in the per-job default directory,
#              recording the job id) verifies; a copy of it in another job's default directory is
#              refused naming both ids, and loads with ZT_RESUME_FOREIGN=1
#   timelimit  --time=1 --signal=USR1@30: the time-limit warning (sent at one of slurmctld's 30 s
#              checks, which the test times from its log) stops the run, which saves, exits 75 and
#              requeues; the job completes with every step's loss bitwise equal to an uninterrupted
#              run, and the output file holds every run's log
#   startup    SIGUSR1 to rank 0 alone while it holds before MPI starts (test hook): every rank exits
#              75 without saving, the job requeues and completes
#   batch      scancel --signal=USR1 --batch: the batch shell forwards it to the step; requeued and
#              completed with the uninterrupted losses
#   scancel    scancel mid-run: every rank saves (SIGTERM), the checkpoint verifies, no requeue
#   binding    the CPUs each rank may run on (Cpus_allowed_list, read inside the script's step) are
#              exactly its --cpus-per-task cores: 1 task x 2 CPUs, then 2 tasks x 1 CPU
#   forgotten_srun  a batch script of 2 tasks that runs zerotrain without srun: one warning naming
#              SLURM_NTASKS=2 and srun; none from srun -n 1 and srun -n 2 in the same script
#   usage_error  srun -n 1 and -n 2 of `zerotrain train --stpes 5`: exit 2, the usage error's line
#              once, no MPI_Abort
# usage: slurm_jobs.sh MODE ZEROTRAIN SOURCE_DIR CLUSTER_DIR WORK_DIR
# Exits 77 after "SKIPPED: ..." when the cluster is not up. Every wait is bounded.
set -euo pipefail
mode=$1 zt=$2 source_dir=$3 cluster=$4 work_root=$5
script=$source_dir/jobscripts/slurm.sbatch

[ -f "$cluster/up" ] || {
  echo "SKIPPED: the test Slurm cluster in $cluster is not up (see the slurm.cluster.start test)"
  exit 77
}
# Run inside an outer Slurm job (CI on a cluster), its variables would point sbatch and srun at it.
# shellcheck disable=SC2046  # variable names
unset $(compgen -e | grep -E '^(SLURM|SBATCH|SRUN|SALLOC)_') ZT_PREFIX ZT_SAVE_DIR ZT_RESUME_FOREIGN ZT_FAULT_INJECTION
eval "$("$source_dir/scripts/slurm-cluster.sh" env "$cluster")"
work=$work_root/$mode
rm -rf "$work"
mkdir -p "$work"
cd "$work"
# Whatever happens, no job of this test outlives it (submit runs in $(...): the ids go to a file).
cleanup() {
  local job
  [ -f "$work/jobs" ] || return 0
  while read -r job; do
    scontrol hold "$job" 2>/dev/null || true # a pending requeue must not start again
    scancel "$job" 2>/dev/null || true
  done <"$work/jobs"
}
trap cleanup EXIT

# On stderr: fail may run inside $(...).
fail() {
  {
    echo "FAIL: $*"
    for file in "$work"/*.out; do [ -f "$file" ] && { echo "--- $file"; cat "$file"; }; done
    [ ! -f "$work/jobs" ] || while read -r job; do scontrol show job "$job" 2>&1 || true; done <"$work/jobs"
    echo "--- slurmctld log (last lines)"
    grep -v debug2 "$cluster/log/slurmctld.log" | tail -20 || true
  } >&2
  exit 1
}

# A GPT small enough that a step takes milliseconds: the tests time Slurm, not training.
cat >"$work/nano.json" <<'EOF'
{
  "train_batch_size": 8,
  "train_micro_batch_size_per_gpu": 4,
  "gradient_clipping": 1.0,
  "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.01}},
  "zero_optimization": {"stage": 2},
  "model": {"type": "gpt", "n_layer": 1, "n_head": 2, "d_model": 32, "seq_len": 16, "vocab_size": 256},
  "data": {"format": "builtin"},
  "seed": 1234
}
EOF
export ZT_BIN=${zt%/*} ZT_CONFIG=$work/nano.json ZT_SAVE_INTERVAL=0 ZT_METRICS_DIR=$work
export ZT_EXTRA_ARGS="--print-every 100"

# submit [SBATCH OPTIONS...] SCRIPT: prints the job id. -n T -c C: T tasks of C CPUs on the node.
submit() {
  local job
  job=$(sbatch --parsable --nodes=1 --output="$work/job-%j.out" "$@") || fail "sbatch $* failed"
  echo "$job" >>"$work/jobs"
  echo "$job"
}
# field JOB NAME: a field of `scontrol show job` (JobState, Restarts, ...).
field() {
  local line
  line=$(scontrol show job -o "$1")
  sed -n "s/.*\b$2=\([^ ]*\).*/\1/p" <<<"$line"
}
# wait_job JOB SECONDS: until the job has ended for good (not requeued); prints its state.
wait_job() {
  local job=$1 deadline=$((SECONDS + $2)) state
  while :; do
    state=$(field "$job" JobState)
    case "$state" in
      COMPLETED | FAILED | CANCELLED | TIMEOUT | OUT_OF_MEMORY | NODE_FAIL | PREEMPTED | BOOT_FAIL | DEADLINE)
        echo "$state"
        return
        ;;
    esac
    [ "$SECONDS" -lt "$deadline" ] || fail "job $job still $state after $2 s"
    sleep 0.5
  done
}
# wait_for SECONDS WHAT COMMAND...: until COMMAND succeeds.
wait_for() {
  local seconds=$1 deadline=$((SECONDS + $1)) what=$2
  shift 2
  until "$@"; do
    [ "$SECONDS" -lt "$deadline" ] || fail "no $what after $seconds s"
    sleep 0.2
  done
}
# losses FILES...: "step loss" per step line of metrics files, in order.
losses() {
  cat "$@" | python3 -c '
import json, sys
for line in sys.stdin:
    record = json.loads(line)
    if record.get("event") == "step":
        print(record["step"], repr(record["loss"]))'
}
# reference STEPS: the losses of an uninterrupted run on 2 tasks, straight from srun.
reference() {
  timeout 300 srun -n 2 -c 1 --mpi=pmix "$zt" train --config "$ZT_CONFIG" --steps "$1" \
    --metrics "$work/reference.jsonl" >"$work/reference.txt" 2>&1 || fail "the reference run failed: $(tail "$work/reference.txt")"
  losses "$work/reference.jsonl"
}
# check_resumed_run JOB: requeued at least once and ended by scancel; every run's log in the
# output file under its separator line; the losses of all runs, step by step, bitwise equal to an
# uninterrupted run of as many steps.
check_resumed_run() {
  local job=$1 restarts out=$work/job-$1.out steps
  restarts=$(field "$job" Restarts)
  [ "$restarts" -ge 1 ] || fail "job $job was not requeued (restarts $restarts)"
  for run in $(seq 0 "$restarts"); do
    grep -qs "^==== zerotrain job $job run $((run + 1)) (restart count $run) on " "$out" ||
      fail "the output lacks run $((run + 1))'s separator line"
    [ -f "$work/job-$job.run$run.jsonl" ] || fail "no metrics of run $((run + 1))"
  done
  grep -qs "requeueing job $job" "$out" || fail "no requeue message"
  grep -qs "zerotrain train: resumed from $work/checkpoints/job-$job/global_step" "$out" || fail "no resume"
  # shellcheck disable=SC2046  # one file name per run
  losses $(seq -f "$work/job-$job.run%g.jsonl" 0 "$restarts") >"$work/losses.txt"
  steps=$(wc -l <"$work/losses.txt")
  reference "$steps" >"$work/reference-losses.txt"
  cmp -s "$work/losses.txt" "$work/reference-losses.txt" ||
    fail "the losses differ from the uninterrupted run: $(diff "$work/losses.txt" "$work/reference-losses.txt" | head -5)"
  echo "job $job: $restarts requeue(s), $steps steps, every loss bitwise equal to the uninterrupted run"
}
steps_of() {
  local n
  n=$(grep -c '"event":"step"' "$1" 2>/dev/null) || true
  echo "${n:-0}"
}
# cancel_running_run JOB: once the job's requeued run has trained 20 steps, scancel it: SIGTERM to
# every task (each saves), and the job stays cancelled.
cancel_running_run() {
  local job=$1 run state
  requeued_and_running() { [ "$(field "$job" Restarts)" -ge 1 ] && [ "$(field "$job" JobState)" = RUNNING ]; }
  wait_for 60 "requeued run of job $job" requeued_and_running
  run=$(field "$job" Restarts)
  twenty_steps() { [ "$(steps_of "$work/job-$job.run$run.jsonl")" -ge 20 ]; }
  wait_for 60 "20 steps in run $((run + 1)) of job $job" twenty_steps
  scancel "$job"
  state=$(wait_job "$job" 60)
  [ "$state" = CANCELLED ] || fail "job $job ended $state after scancel"
  grep -qs "but job $job is [A-Z]*: not requeueing" "$work/job-$job.out" || fail "no 'not requeueing' after scancel"
}
# first_run_steps JOB N: until the job's first run has trained N steps.
first_run_steps() {
  local job=$1 n=$2
  enough() { [ "$(steps_of "$work/job-$job.run0.jsonl")" -ge "$n" ]; }
  wait_for 60 "$n steps in job $job" enough
}

case "$mode" in
  two_tasks)
    export ZT_STEPS=40
    job=$(submit -n 2 --ntasks-per-node=2 -c 1 "$script")
    state=$(wait_job "$job" 120)
    [ "$state" = COMPLETED ] || fail "job $job ended $state"
    out=$work/job-$job.out
    grep -qs "2 rank(s) on 1 node(s)" "$out" || fail "not 2 ranks"
    grep -qs "zerotrain train: 40 steps, loss" "$out" || fail "no summary line"
    ckpt=$work/checkpoints/job-$job
    verified=$("$zt" checkpoint verify "$ckpt") || fail "the checkpoint does not verify: $verified"
    grep -q "^OK $ckpt/global_step40.h5" <<<"$verified" || fail "not the checkpoint of step 40: $verified"
    inspected=$("$zt" checkpoint inspect "$ckpt") || fail "checkpoint inspect failed"
    grep -q "^saved at .*, by Slurm job $job$" <<<"$inspected" || fail "no job id in the checkpoint: $inspected"
    # Another job finding this one's checkpoint in its default directory (ids come back after a
    # cluster's state is reset): refused, naming both jobs; loaded when asked for.
    export ZT_STEPS=50
    foreign() { # JOB: a copy of the first job's checkpoints in JOB's default directory
      mkdir -p "$work/checkpoints/job-$1" && cp "$ckpt"/* "$work/checkpoints/job-$1/"
      scontrol release "$1"
    }
    other=$(submit -n 2 --ntasks-per-node=2 -c 1 --hold "$script")
    foreign "$other"
    state=$(wait_job "$other" 120)
    [ "$state" = FAILED ] || fail "job $other resumed another job's checkpoint: $state"
    grep -qs "refusing to resume from '$work/checkpoints/job-$other/global_step40.h5': it was saved by Slurm job $job, and this is Slurm job $other" \
      "$work/job-$other.out" || fail "no refusal naming both jobs"
    [ ! -e "$work/checkpoints/job-$other/global_step50.h5" ] || fail "the refused job trained"
    continued=$(ZT_RESUME_FOREIGN=1 submit -n 2 --ntasks-per-node=2 -c 1 --hold "$script")
    foreign "$continued"
    state=$(wait_job "$continued" 120)
    [ "$state" = COMPLETED ] || fail "job $continued with ZT_RESUME_FOREIGN=1 ended $state"
    grep -qs "resumed from $work/checkpoints/job-$continued/global_step40.h5 at step 40" "$work/job-$continued.out" ||
      fail "ZT_RESUME_FOREIGN=1 did not continue job $job's run"
    ;;
  timelimit)
    # slurmctld tests time limits every 30 s and sends the --signal warning at the first test where
    # the time left is at most the lead time + 30 s: with --time=1 and USR1@30, at the first test
    # after the job starts. Submitted 20 s before one (their times are in slurmctld's debug2 log),
    # the job gets it while its first run trains. Not closer: the signal must find the training's
    # handler installed, and on 2 cores beside the rest of the suite the job's start (srun, MPI,
    # the model) took more than 4 s (with 6 s, the signal killed the run at 4 s in a CI run).
    export ZT_STEPS=1000000
    log=$cluster/log/slurmctld.log
    check_times() { grep 'Testing job time limits' "$log" | sed 's/^\[\([^]]*\)\].*/\1/'; }
    have_check() { [ -n "$(check_times | tail -1)" ]; }
    wait_for 40 "time-limit test in $log" have_check
    next=$(($(date -d "$(check_times | tail -1)" +%s) + 30))
    while [ "$((next - 20))" -lt "$(date +%s)" ]; do next=$((next + 30)); done
    sleep $((next - 20 - $(date +%s)))
    job=$(submit -n 2 --ntasks-per-node=2 -c 1 --time=1 --signal=USR1@30 "$script")
    wait_for 60 "time-limit warning to job $job" grep -qs "warning signal 10 to JobId=$job" "$log"
    wait_for 60 "SIGUSR1 in job $job's first run" grep -qs "zerotrain train: SIGUSR1 received" "$work/job-$job.out"
    grep -qs "zerotrain train: SIGUSR1 received; stopping after step" "$work/job-$job.out" ||
      fail "the warning did not come while the first run trained"
    cancel_running_run "$job"
    check_resumed_run "$job"
    ;;
  batch)
    # A signal to the batch shell alone (like --signal=B:USR1@...): the script forwards it.
    export ZT_STEPS=1000000
    job=$(submit -n 2 --ntasks-per-node=2 -c 1 "$script")
    first_run_steps "$job" 30
    scancel --signal=USR1 --batch "$job"
    cancel_running_run "$job"
    grep -qs "slurm.sbatch: SIGUSR1 received by the batch shell; forwarding it to the training step" \
      "$work/job-$job.out" || fail "the batch shell did not forward SIGUSR1"
    check_resumed_run "$job"
    ;;
  scancel)
    export ZT_STEPS=1000000
    job=$(submit -n 2 --ntasks-per-node=2 -c 1 "$script")
    first_run_steps "$job" 30
    scancel "$job"
    state=$(wait_job "$job" 60)
    [ "$state" = CANCELLED ] || fail "job $job ended $state after scancel"
    [ "$(field "$job" Restarts)" = 0 ] || fail "the cancelled job was requeued"
    out=$work/job-$job.out
    grep -qs "zerotrain train: saved checkpoint .* (step [0-9]*, SIGTERM)" "$out" || fail "no checkpoint saved on SIGTERM"
    grep -qs "but job $job is [A-Z]*: not requeueing" "$out" || fail "no 'not requeueing' message"
    ckpt=$work/checkpoints/job-$job
    verified=$("$zt" checkpoint verify "$ckpt") || fail "the checkpoint after scancel does not verify: $verified"
    grep "^OK $ckpt/global_step[0-9]*.h5: .*every checksum matches" <<<"$verified" || fail "unexpected: $verified"
    ;;
  startup)
    # Rank 0 holds before MPI starts (test hook) and gets SIGUSR1 alone; rank 1 waits in MPI's
    # start-up meanwhile. Both must stop together with 75 and nothing saved; the requeued run
    # (the hold file gone) trains from step 0.
    export ZT_STEPS=30 ZT_FAULT_INJECTION=hold_before_mpi_init:$work/hold
    touch "$work/hold"
    job=$(submit -n 2 --ntasks-per-node=2 -c 1 "$script")
    out=$work/job-$job.out
    wait_for 60 "holding rank 0 in job $job" grep -qs "zerotrain: test hook: pid [0-9]* holds before MPI starts" "$out"
    pid=$(sed -n 's/^zerotrain: test hook: pid \([0-9]*\) holds.*/\1/p' "$out" | head -1)
    kill -USR1 "$pid"
    requeued() { [ "$(field "$job" Restarts)" -ge 1 ]; }
    wait_for 60 "the requeue of job $job" requeued
    rm -f "$work/hold"
    state=$(wait_job "$job" 120)
    [ "$state" = COMPLETED ] || fail "job $job ended $state"
    grep -qs "zerotrain train: SIGUSR1 received during start-up; stopping before .* (nothing new to save)" "$out" ||
      fail "no start-up stop message"
    grep -qs "tasks 0-1: Exited with exit code 75" "$out" || fail "the ranks did not all exit 75"
    grep -qs "requeueing job $job" "$out" || fail "not requeued"
    grep -qs "no checkpoint in $work/checkpoints/job-$job yet; starting from step 0" "$out" ||
      fail "the first run saved something, or the second did not start from step 0"
    [ "$(ls "$work/checkpoints/job-$job")" = "$(printf 'global_step30.h5\nlatest')" ] ||
      fail "checkpoints other than the final one: $(ls "$work/checkpoints/job-$job")"
    grep -qs "zerotrain train: 30 steps, loss" "$out" || fail "the requeued run did not train"
    ;;
  binding)
    # The script's own step through a prefix whose zerotrain reports the CPUs it may run on.
    mkdir -p "$work/prefix/bin"
    # shellcheck disable=SC2016  # expanded by the wrapper, inside the step
    printf '%s\n' '#!/bin/bash' \
      'echo "binding: rank $SLURM_PROCID cpus $(sed -n "s/^Cpus_allowed_list:[[:space:]]*//p" /proc/self/status) OMP_NUM_THREADS $OMP_NUM_THREADS"' \
      "exec $zt \"\$@\"" >"$work/prefix/bin/zerotrain"
    chmod +x "$work/prefix/bin/zerotrain"
    export ZT_PREFIX=$work/prefix ZT_STEPS=5
    count_cpus() { # a Cpus_allowed_list (0-1,3) -> how many CPUs
      local n=0 part
      for part in ${1//,/ }; do
        if [[ $part == *-* ]]; then n=$((n + ${part#*-} - ${part%-*} + 1)); else n=$((n + 1)); fi
      done
      echo "$n"
    }
    for shape in "1 2" "2 1"; do
      read -r tasks cpus <<<"$shape"
      job=$(submit -n "$tasks" --ntasks-per-node="$tasks" -c "$cpus" "$script")
      state=$(wait_job "$job" 120)
      [ "$state" = COMPLETED ] || fail "job $job ($tasks x $cpus) ended $state"
      grep -qs "srun .* $work/prefix/bin/zerotrain train" "$work/job-$job.out" || fail "ZT_PREFIX not used"
      lines=$(grep "^binding: rank" "$work/job-$job.out" || true)
      [ "$(wc -l <<<"$lines")" = "$tasks" ] || fail "job $job: expected $tasks binding lines: $lines"
      while read -r _ _ rank _ list _ threads; do
        [ "$(count_cpus "$list")" = "$cpus" ] || fail "job $job: rank $rank may run on CPUs $list, not $cpus"
        [ "$threads" = "$cpus" ] || fail "job $job: rank $rank has OMP_NUM_THREADS $threads, not $cpus"
      done <<<"$lines"
      [ "$(awk '{print $5}' <<<"$lines" | sort -u | wc -l)" = "$tasks" ] || fail "job $job: ranks share CPUs: $lines"
      echo "$tasks task(s) x $cpus CPU(s): $(tr '\n' ';' <<<"$lines")"
    done
    ;;
  forgotten_srun)
    # One batch script: zerotrain without srun, then under srun -n 1 and -n 2.
    run_args="train --config $ZT_CONFIG --steps 2 --peak-flops 1e9"
    printf '%s\n' '#!/bin/bash' "echo '==== direct'" "$zt $run_args 2>&1" "echo '==== srun -n 1'" \
      "srun -n 1 --mpi=pmix $zt $run_args 2>&1" "echo '==== srun -n 2'" "srun -n 2 --mpi=pmix $zt $run_args 2>&1" \
      "echo '==== end'" >"$work/direct.sh"
    job=$(submit -n 2 -c 1 "$work/direct.sh")
    state=$(wait_job "$job" 120)
    [ "$state" = COMPLETED ] || fail "job $job ended $state"
    part() { sed -n "/^==== $1\$/,/^==== /p" "$work/job-$job.out"; }
    direct=$(part direct)
    warning='warning: the Slurm allocation has 2 tasks (SLURM_NTASKS=2) but zerotrain runs as one process: start it with `srun zerotrain train'
    [ "$(grep -cF "$warning" <<<"$direct")" = 1 ] || fail "not one forgotten-srun warning in the direct run: $direct"
    grep -q "1 rank(s) on 1 node(s)" <<<"$direct" || fail "the direct run is not one process: $direct"
    for shape in "1" "2"; do
      run=$(part "srun -n $shape")
      grep -q "zerotrain train: 2 steps, loss" <<<"$run" || fail "srun -n $shape did not train: $run"
      grep -q "$shape rank(s) on 1 node(s)" <<<"$run" || fail "srun -n $shape did not start $shape rank(s): $run"
      if grep -q "warning" <<<"$run"; then fail "a warning under srun -n $shape: $run"; fi
    done
    echo "job $job: the warning without srun; none under srun -n 1 and srun -n 2"
    ;;
  usage_error)
    # Under srun as under mpirun: exit 2, the one line once, no MPI_Abort (docs/cli.md).
    line="zerotrain train: unknown option '--stpes' (see 'zerotrain train --help')"
    for tasks in 1 2; do
      code=0
      output=$(timeout 120 srun -n "$tasks" -c 1 --mpi=pmix "$zt" train --config "$ZT_CONFIG" --stpes 5 2>&1) || code=$?
      [ "$code" = 2 ] || fail "srun -n $tasks: exit $code, expected 2: $output"
      [ "$(grep -cxF "$line" <<<"$output")" = 1 ] || fail "srun -n $tasks: not the line once: $output"
      if grep -q "MPI_ABORT\|fatal error" <<<"$output"; then fail "srun -n $tasks: an abort: $output"; fi
      echo "srun -n $tasks: exit 2, the line once; all the output: $(tr '\n' '|' <<<"$output")"
    done
    ;;
  *)
    echo "unknown mode $mode" >&2
    exit 2
    ;;
esac
echo "PASS: $mode"
