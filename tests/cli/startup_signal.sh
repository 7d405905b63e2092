#!/usr/bin/env bash
# A stop signal during start-up, under mpirun (ctest cli.checkpoint_startup_signal; the Slurm
# version is slurm.startup): rank 0 holds before MPI starts (ZT_FAULT_INJECTION=
# hold_before_mpi_init:FILE) while rank 1 waits in MPI's start-up; SIGUSR1 to rank 0 alone. Every
# rank must stop before the checkpoint load with exit 75 and save nothing (the checkpoint of the
# first run stays the newest); the next run resumes from it.
# usage: startup_signal.sh ZEROTRAIN CONFIG MPIEXEC [MPIEXEC_FLAGS...]
set -euo pipefail
zt=$1 config=$2
shift 2
mpiexec=("$@")
work=$(mktemp -d /tmp/zt-startup-signal-XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() {
  echo "FAIL: $*"
  for log in "$work"/*.txt; do echo "--- $log"; cat "$log"; done
  exit 1
}

"${mpiexec[@]}" -n 2 "$zt" train --config "$config" --steps 2 --save-dir "$work/ck" >"$work/run1.txt" 2>&1 ||
  fail "the first run failed"
touch "$work/hold"
ZT_FAULT_INJECTION=hold_before_mpi_init:$work/hold "${mpiexec[@]}" -n 2 -x ZT_FAULT_INJECTION "$zt" train \
  --config "$config" --steps 4 --save-dir "$work/ck" --resume auto >"$work/run2.txt" 2>&1 &
launcher=$!
pid=""
for _ in $(seq 1 240); do
  pid=$(sed -n 's/^zerotrain: test hook: pid \([0-9]*\) holds before MPI starts.*/\1/p' "$work/run2.txt" 2>/dev/null) || true
  [ -n "$pid" ] && break
  sleep 0.25
done
[ -n "$pid" ] || fail "rank 0 never held before MPI starts"
kill -USR1 "$pid"
for _ in $(seq 1 480); do
  kill -0 "$launcher" 2>/dev/null || break
  sleep 0.25
done
if kill -0 "$launcher" 2>/dev/null; then
  kill -KILL "$launcher"
  fail "the ranks did not stop within 120 s of the signal"
fi
set +e
wait "$launcher"
rc=$?
set -e
[ "$rc" -eq 75 ] || fail "exit code $rc, expected 75"
grep -q "zerotrain train: SIGUSR1 received during start-up; stopping before loading the checkpoint (nothing new to save)" \
  "$work/run2.txt" || fail "no start-up stop message"
if grep -q "saved checkpoint" "$work/run2.txt"; then fail "the stopped run saved"; fi
[ "$(cat "$work/ck/latest")" = global_step2 ] || fail "latest is $(cat "$work/ck/latest"), not global_step2"
rm -f "$work/hold"
"${mpiexec[@]}" -n 2 "$zt" train --config "$config" --steps 4 --save-dir "$work/ck" --resume auto \
  >"$work/run3.txt" 2>&1 || fail "the run after the stopped one failed"
grep -q "resumed from $work/ck/global_step2.h5 at step 2" "$work/run3.txt" || fail "did not resume from global_step2"
echo "PASS: startup_signal"
