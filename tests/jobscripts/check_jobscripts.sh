#!/usr/bin/env bash
# ctest jobscripts.*: the PBS, LSF and Flux job scripts (jobscripts/; docs/jobscripts.md).
#   check_jobscripts.sh lint SOURCE_DIR
#       every job script and this file through shellcheck.
#   check_jobscripts.sh dry SOURCE_DIR WORK_DIR
#       each script's dry mode (ZT_DRY_RUN=1) for allocations described the way each scheduler's
#       environment does: the launch line with its binding, the train arguments, the stop signal.
#   check_jobscripts.sh installed BUILD_DIR WORK_DIR
#       `cmake --install` into WORK_DIR/prefix: configs, job scripts and benchmarks under
#       share/zerotrain; each script's dry run from that prefix names files that are there.
#   check_jobscripts.sh pbs_stop BUILD_DIR WORK_DIR
#       pbs.sh really run (no PBS: its environment made by hand, 2 ranks on this machine) from the
#       installed prefix with a walltime that ends in a few seconds: mpirun gets SIGUSR1, the ranks
#       save and exit 75, the script tries to resubmit itself; run again, it resumes from that
#       checkpoint and trains to the end.
#   check_jobscripts.sh gpu_bundle SOURCE_DIR
#       scripts/gpu-bundle.sh --check on SOURCE_DIR/.gpu-bundle/zt-gpu-bundle.tar.xz (docs/gpu.md):
#       skipped when no bundle was packed.
#   check_jobscripts.sh binding WORK_DIR SOURCE_DIR
#       pbs.sh's mpirun line on this machine with a stand-in zerotrain that prints its CPU mask:
#       2 ranks of 1 core get a core each, 1 rank of 2 cores gets both.
# Prints "PASS: <mode>"; exits 77 after "SKIPPED: ..." where a tool is missing.
set -euo pipefail
mode=$1
fail() {
  echo "FAIL: $*"
  exit 1
}
expect() { # OUTPUT REGEX WHAT
  grep -Eq -- "$2" <<<"$1" || fail "$3: expected /$2/ in: $1"
}
reject() {
  if grep -Eq -- "$2" <<<"$1"; then fail "$3: unexpected /$2/ in: $1"; fi
}
# The variables the scripts read, so that the caller's environment cannot leak in.
clean_env=(-u ZT_PREFIX -u ZT_BIN -u ZT_CONFIG -u ZT_STEPS -u ZT_SAVE_DIR -u ZT_EXTRA_ARGS -u ZT_METRICS_DIR
  -u ZT_RANKS_PER_NODE -u ZT_THREADS -u ZT_GPUS_PER_RANK -u ZT_NODES -u ZT_WALLTIME -u ZT_STOP_MARGIN
  -u ZT_RESUBMIT -u ZT_JOB_SCRIPT -u ZT_JOB_NAME -u OMP_NUM_THREADS -u PBS_JOBID -u PBS_NODEFILE -u NCPUS
  -u LSB_JOBID -u LSB_DJOB_HOSTFILE -u FLUX_JOB_ID -u FLUX_JOB_NNODES)
dry() { # SCRIPT ENVIRONMENT... -- ARGUMENTS...
  local script=$1 environment=()
  shift
  while [ "$1" != -- ]; do
    environment+=("$1")
    shift
  done
  shift
  env "${clean_env[@]}" ZT_DRY_RUN=1 "${environment[@]}" bash "$script" "$@"
}
# Every script trains with checkpoints and resume, and never runs a benchmark.
common_checks() { # OUTPUT WHAT
  expect "$1" " train --config [^ ]+ --steps [0-9]+ --save-dir [^ ]+ --save-interval [0-9]+ --keep-last [0-9]+ --resume auto" "$2: train arguments"
  reject "$1" "zt_bench|report" "$2: runs something other than training"
}

case $mode in
lint)
  source_dir=$2
  command -v shellcheck >/dev/null || {
    echo "SKIPPED: shellcheck is not installed (scripts/setup.sh installs it)"
    exit 77
  }
  shellcheck "$source_dir"/jobscripts/pbs.sh "$source_dir"/jobscripts/lsf.bsub "$source_dir"/jobscripts/flux.sh \
    "$source_dir"/jobscripts/slurm.sbatch "$source_dir"/Spack/checksum-release.sh "$0" \
    "$source_dir"/tests/spack/check_release.sh "$source_dir"/scripts/gpu-bundle.sh "$source_dir"/scripts/gpu-check.sh ||
    fail "shellcheck found problems"
  ;;

dry)
  source_dir=$2 work=$3
  rm -rf "$work"
  mkdir -p "$work"
  cd "$work"
  # PBS: select=2:ncpus=32:mpiprocs=4 lists each node 4 times; 32 cores a chunk: 8 per rank.
  printf 'n1\nn1\nn1\nn1\nn2\nn2\nn2\nn2\n' >nodefile
  pbs=$(dry "$source_dir/jobscripts/pbs.sh" PBS_O_WORKDIR="$work" PBS_JOBID=77.server PBS_JOBNAME=run7 \
    PBS_NODEFILE="$work/nodefile" NCPUS=32 ZT_WALLTIME=3600 ZT_PREFIX=/opt/zt ZT_EXTRA_ARGS="--print-every 5" \
    -- --data 'my corpus.bin')
  expect "$pbs" "^pbs\.sh: dry run: OMP_NUM_THREADS=8 mpirun -n 8 --map-by ppr:4:node:PE=8 --bind-to core --hostfile $work/nodefile /opt/zt/bin/zerotrain train " \
    "PBS launch line: 8 cores per rank"
  expect "$pbs" " --config /opt/zt/share/zerotrain/configs/gpt-tiny\.json " "PBS: the prefix's config"
  expect "$pbs" " --save-dir $work/checkpoints/run7 " "PBS: the job name's checkpoint directory"
  expect "$pbs" " --resume auto --print-every 5 --data my\\\\ corpus\.bin$" "PBS: ZT_EXTRA_ARGS, then the script's arguments"
  expect "$pbs" "^pbs\.sh: dry run: SIGUSR1 to mpirun after 3480 s$" "PBS: stop 120 s before the walltime"
  reject "$pbs" "ppr:[0-9]+:node --bind-to" "PBS: ppr without PE binds every rank to one core"
  common_checks "$pbs" PBS
  # ZT_RANKS_PER_NODE and ZT_THREADS override; no walltime known: no stop signal.
  pbs=$(dry "$source_dir/jobscripts/pbs.sh" PBS_O_WORKDIR="$work" PBS_NODEFILE="$work/nodefile" NCPUS=32 \
    ZT_RANKS_PER_NODE=2 ZT_THREADS=16 ZT_BIN=/b/bin --)
  expect "$pbs" "OMP_NUM_THREADS=16 mpirun -n 4 --map-by ppr:2:node:PE=16 --bind-to core .* /b/bin/zerotrain train --config examples/configs/gpt-tiny\.json " \
    "PBS: ZT_RANKS_PER_NODE, ZT_THREADS, ZT_BIN"
  expect "$pbs" "no walltime known: no stop signal" "PBS without a walltime"
  grep -q '^#PBS -r y$' "$source_dir/jobscripts/pbs.sh" || fail "pbs.sh: no '#PBS -r y' (rerunnable)"

  # LSF (CSM): the launch node first in the host file, then 2 compute nodes.
  printf 'batch3\nh1\nh1\nh2\nh2\n' >lsf_hosts
  lsf=$(dry "$source_dir/jobscripts/lsf.bsub" LSB_JOBID=55 LS_SUBCWD="$work" LSB_DJOB_HOSTFILE="$work/lsf_hosts" \
    ZT_PREFIX=/opt/zt --)
  expect "$lsf" "^lsf\.bsub: dry run: OMP_NUM_THREADS=7 jsrun -n 8 -a 1 -c 7 -g 1 -b packed:7 -r 4 /opt/zt/bin/zerotrain train " \
    "LSF launch line: one resource set per rank, 7 cores bound"
  expect "$lsf" " --save-dir $work/checkpoints/job-55 " "LSF: the job's checkpoint directory (kept on requeue)"
  common_checks "$lsf" LSF
  lsf=$(dry "$source_dir/jobscripts/lsf.bsub" LSB_JOBID=56 LS_SUBCWD="$work" ZT_NODES=3 ZT_RANKS_PER_NODE=2 \
    ZT_THREADS=20 ZT_GPUS_PER_RANK=0 --)
  expect "$lsf" "OMP_NUM_THREADS=20 jsrun -n 6 -a 1 -c 20 -g 0 -b packed:20 -r 2 " "LSF: CPU nodes"
  for line in '-wa USR1' '-wt 2' '-Q "75"'; do
    grep -q "^#BSUB $line\$" "$source_dir/jobscripts/lsf.bsub" || fail "lsf.bsub: no '#BSUB $line' line"
  done

  # Flux: a batch job of 2 nodes with 3500 s left; GPUs, then CPU nodes.
  flux=$(dry "$source_dir/jobscripts/flux.sh" FLUX_JOB_ID=f3Kx FLUX_JOB_NNODES=2 ZT_WALLTIME=3500 \
    ZT_GPUS_PER_RANK=1 ZT_PREFIX=/opt/zt --)
  expect "$flux" "^flux\.sh: dry run: OMP_NUM_THREADS=4 flux run -N 2 -n 4 -c 4 -o cpu-affinity=per-task -g 1 -o gpu-affinity=per-task -t 3500s --signal=SIGUSR1@120s /opt/zt/bin/zerotrain train " \
    "Flux launch line with GPUs"
  expect "$flux" " --save-dir $work/checkpoints/zerotrain " "Flux: the job name's checkpoint directory"
  common_checks "$flux" Flux
  flux=$(dry "$source_dir/jobscripts/flux.sh" FLUX_JOB_NNODES=1 ZT_RANKS_PER_NODE=4 ZT_THREADS=8 --)
  expect "$flux" "OMP_NUM_THREADS=8 flux run -N 1 -n 4 -c 8 -o cpu-affinity=per-task --signal=SIGUSR1@120s " "Flux: CPU nodes"
  reject "$flux" " -g |gpu-affinity" "Flux: CPU nodes ask for no GPU"
  ;;

installed | pbs_stop)
  build_dir=$2 work=$3
  rm -rf "$work"
  mkdir -p "$work"
  prefix=$work/prefix
  cmake --install "$build_dir" --prefix "$prefix" >"$work/install.log" 2>&1 || {
    cat "$work/install.log"
    fail "cmake --install failed"
  }
  share=$prefix/share/zerotrain
  for file in jobscripts/pbs.sh jobscripts/lsf.bsub jobscripts/flux.sh jobscripts/slurm.sbatch \
    configs/gpt-tiny.json configs/mlp-zero0.json bench/zt_bench_collectives; do
    [ -f "$share/$file" ] || fail "not installed: $share/$file"
  done
  [ -x "$share/jobscripts/pbs.sh" ] || fail "$share/jobscripts/pbs.sh is not executable"
  library=$(ldd "$share/bench/zt_bench_collectives" | sed -n 's/.*libzerotrain\.so[^ ]* => \([^ ]*\) .*/\1/p')
  case $(realpath -m "${library:-none}") in
  "$(realpath "$prefix")"/lib*/libzerotrain.so*) ;;
  *) fail "the installed benchmark does not load the prefix's libzerotrain (ldd: '$library')" ;;
  esac
  cd "$work"
  printf 'localhost\nlocalhost\n' >nodefile
  if [ "$mode" = installed ]; then
    for script in pbs.sh lsf.bsub flux.sh; do
      line=$(dry "$share/jobscripts/$script" PBS_O_WORKDIR="$work" PBS_NODEFILE="$work/nodefile" LS_SUBCWD="$work" \
        ZT_PREFIX="$prefix" --)
      binary=$(grep -o "[^ ]*/bin/zerotrain train" <<<"$line" | head -1)
      binary=${binary% train}
      config=$(sed -nE 's/.* --config ([^ ]+) .*/\1/p' <<<"$line")
      if [ "$binary" != "$prefix/bin/zerotrain" ] || [ ! -x "$binary" ]; then
        fail "$script: runs '$binary', not the prefix's zerotrain"
      fi
      if [ "$config" != "$share/configs/gpt-tiny.json" ] || [ ! -f "$config" ]; then
        fail "$script: config '$config' is not the installed one"
      fi
    done
    echo "PASS: installed"
    exit 0
  fi
  # pbs_stop: 2 ranks, 1 core each; the walltime ends 6 s after the start.
  save_dir=$work/checkpoints
  run_pbs() { # ENVIRONMENT...
    env "${clean_env[@]}" PBS_O_WORKDIR="$work" PBS_JOBID=88.test PBS_JOBNAME=stoptest PBS_NODEFILE="$work/nodefile" \
      NCPUS=2 ZT_PREFIX="$prefix" ZT_CONFIG="$share/configs/mlp-zero0.json" ZT_SAVE_DIR="$save_dir" \
      ZT_SAVE_INTERVAL=100000 PATH="$work/nobin:$PATH" "$@" bash "$share/jobscripts/pbs.sh"
  }
  set +e
  first=$(run_pbs ZT_STEPS=100000000 ZT_WALLTIME=$((120 + 6)) 2>&1)
  status=$?
  set -e
  [ "$status" = 75 ] || fail "the stopped run exited $status, not 75: $first"
  expect "$first" "SIGUSR1 to mpirun after 6 s" "stop time"
  expect "$first" "SIGUSR1 to mpirun \(save and exit 75\)" "the signal sent"
  expect "$first" "zerotrain train: SIGUSR1 received; stopping after step [0-9]+" "the ranks got SIGUSR1 through mpirun"
  expect "$first" "resubmitting $share/jobscripts/pbs\.sh" "resubmission after the walltime stop"
  expect "$first" "qsub $share/jobscripts/pbs\.sh failed; submit it again" "no qsub here: the message that says what to do"
  step=$(sed -nE 's/.*stopping after step ([0-9]+).*/\1/p' <<<"$first" | head -1)
  saved=("$save_dir"/*)
  [ -e "${saved[0]}" ] || fail "nothing saved in $save_dir: $first"
  second=$(run_pbs ZT_STEPS=$((step + 3)) 2>&1) || fail "the resumed run failed: $second"
  expect "$second" "no walltime known: no stop signal" "second run"
  expect "$second" "zerotrain train: resumed from .* at step $step " "resumed from the saved step $step"
  expect "$second" "the run exited 0" "second run's end"
  printf -- '--- the stopped run:\n%s\n--- the resumed run:\n%s\n' "$first" "$second"
  ;;
binding)
  # pbs.sh's launch line run by the real mpirun, with a stand-in `zerotrain` that prints the CPU
  # mask it gets: PE=T must give each rank T cores of its own.
  work=$2 source_dir=$3
  [ "$(nproc)" -ge 2 ] || {
    echo "SKIPPED: needs 2 cores for 2 ranks of 1 core or 1 rank of 2 (nproc: $(nproc))"
    exit 77
  }
  rm -rf "$work"
  mkdir -p "$work/bin"
  cd "$work"
  # shellcheck disable=SC2016  # expanded by the stand-in when it runs
  printf '#!/bin/sh\necho "rank mask: $(grep Cpus_allowed_list /proc/self/status | cut -f2) threads $OMP_NUM_THREADS"\n' >bin/zerotrain
  chmod +x bin/zerotrain
  masks() { # LINES_IN_NODEFILE NCPUS
    yes localhost | head -n "$1" >nodefile
    env "${clean_env[@]}" PBS_O_WORKDIR="$work" PBS_NODEFILE="$work/nodefile" NCPUS="$2" ZT_BIN="$work/bin" \
      bash "$source_dir/jobscripts/pbs.sh" 2>&1 | sed -n 's/^rank mask: //p' | sort
  }
  two=$(masks 2 2)
  [ "$(wc -l <<<"$two")" = 2 ] || fail "2 ranks: expected two masks, got: $two"
  grep -Eq '^[0-9]+ threads 1$' <<<"$two" || fail "2 ranks of 1 core: each one core, 1 thread: $two"
  [ "$(cut -d ' ' -f 1 <<<"$two" | sort -u | wc -l)" = 2 ] || fail "2 ranks share a core: $two"
  if grep -Evq '^[0-9]+ threads 1$' <<<"$two"; then fail "2 ranks of 1 core: $two"; fi
  one=$(masks 1 2)
  grep -Eq '^[0-9]+[-,][0-9]+ threads 2$' <<<"$one" || fail "1 rank of 2 cores: expected a 2-core mask: $one"
  echo "masks: 2 ranks x 1 core: $(tr '\n' ';' <<<"$two") 1 rank x 2 cores: $one"
  ;;
gpu_bundle)
  source_dir=$2
  archive=$source_dir/.gpu-bundle/zt-gpu-bundle.tar.xz
  [ -f "$archive" ] || {
    echo "SKIPPED: no bundle at $archive (scripts/gpu-bundle.sh packs one)"
    exit 77
  }
  bash "$source_dir/scripts/gpu-bundle.sh" --check "$archive" || fail "scripts/gpu-bundle.sh --check $archive"
  ;;
*)
  fail "unknown mode '$mode'"
  ;;
esac
echo "PASS: $mode"
