#!/usr/bin/env bash
# The C and Fortran examples print the C++ twin's losses, bit for bit (ctest examples.c.* and
# examples.fortran.*): each program trains the MLP of examples/c/mlp_problem.h on 2 ranks with the
# same config, and every "step N loss L bits B" line must be the reference's; the loss must fall.
# usage: same_losses.sh STEPS STAGE ZERO_EXTRA REFERENCE PROGRAM -- MPIEXEC [FLAGS...]
#   ZERO_EXTRA: more zero_optimization members ("none": none), "@SWAP@" replaced by a fresh swap
#   directory.
#   PROGRAM "skip:<reason>": print the reason and exit 77 (the test shows as skipped).
set -uo pipefail
steps=$1 stage=$2 zero_extra=$3 reference=$4 program=$5
shift 5
[ "$1" = "--" ] && shift
mpiexec=("$@")
if [[ $program == skip:* ]]; then
  echo "SKIP: ${program#skip:}"
  exit 77
fi
fail() { echo "FAIL: $*"; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/zt-same-losses.XXXXXX") || fail "no temporary directory"
trap 'rm -rf "$work"' EXIT
[ "$zero_extra" = none ] && zero_extra=""
zero_extra=${zero_extra//@SWAP@/$work/swap}
mkdir -p "$work/swap"
for run in reference program; do
  executable=$reference
  [ $run = program ] && executable=$program
  "${mpiexec[@]}" -n 2 "$executable" "$steps" "$stage" "$zero_extra" >"$work/$run.txt" 2>&1 ||
    { cat "$work/$run.txt"; fail "$(basename "$executable") exited with $?"; }
  cat "$work/$run.txt"
  grep '^step ' "$work/$run.txt" >"$work/$run.steps"
done
if [[ $3 == *@SWAP@* ]]; then  # the offload really happened: each program says so
  for run in reference program; do
    grep -q "^rank 0: optimizer states: nvme $work/swap/.*; parameters: nvme $work/swap/" "$work/$run.txt" ||
      fail "the $run run does not keep its optimizer states and parameters in $work/swap"
  done
fi
[ "$(wc -l <"$work/reference.steps")" -eq "$steps" ] || fail "the reference printed no $steps step lines"
diff "$work/reference.steps" "$work/program.steps" || fail "$(basename "$program") differs from the C++ run"
first=$(awk 'NR == 1 {print $4}' "$work/reference.steps")
last=$(awk 'END {print $4}' "$work/reference.steps")
awk -v a="$first" -v b="$last" 'BEGIN {exit !(b < 0.5 * a)}' || fail "the loss did not fall: $first -> $last"
[ -z "$(ls -A "$work/swap")" ] || fail "swap files left behind: $(ls "$work/swap")"
echo "PASS: $(basename "$program") printed the C++ run's $steps losses bit for bit ($first -> $last)"
