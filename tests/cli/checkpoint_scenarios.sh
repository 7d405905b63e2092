#!/usr/bin/env bash
# Checkpoint scenarios with real processes and real signals (ctest cli.checkpoint_*):
#   preempt   SIGTERM to one rank mid-run (as Slurm signals every task): every rank finishes the
#             step, the checkpoint is saved, the job exits 75; --resume auto then continues from
#             that step on 4 ranks.
#   usr1      SIGUSR1 to mpirun, which forwards it to every rank: the same save and exit 75. (SIGTERM
#             to mpirun itself kills the ranks after a few seconds, whatever they do.)
#   killsave  rank 0 killed half-way through writing a checkpoint (ZT_FAULT_INJECTION): the previous
#             checkpoint stays 'latest' and loads, the half-written file never gets its final name
#             (it had mode 0640 from its creation), and the next save removes it (its writer is gone).
# usage: checkpoint_scenarios.sh MODE ZEROTRAIN CONFIG MPIEXEC [MPIEXEC_FLAGS...]
set -euo pipefail
mode=$1 zt=$2 config=$3
shift 3
mpiexec=("$@")
work=$(mktemp -d /tmp/zt-checkpoint-scenario-XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() {
  echo "FAIL: $*"
  for log in "$work"/*.txt; do echo "--- $log"; cat "$log"; done
  exit 1
}
train() { "${mpiexec[@]}" "$@"; }

case "$mode" in
preempt | usr1)
  signal=SIGTERM
  [ "$mode" = usr1 ] && signal=SIGUSR1
  "${mpiexec[@]}" -n 2 "$zt" train --config "$config" --steps 100000 --save-dir "$work/ck" \
    --metrics "$work/m1.jsonl" --print-every 1 >"$work/run1.txt" 2>&1 &
  launcher=$!
  for _ in $(seq 1 480); do
    grep -q '"step":3,' "$work/m1.jsonl" 2>/dev/null && break
    sleep 0.25
  done
  if [ "$mode" = usr1 ]; then
    kill -USR1 "$launcher"
  else
    rank=$(pgrep -P "$launcher" | head -1 || true)
    [ -n "$rank" ] || fail "no rank process under the launcher $launcher"
    kill -TERM "$rank"
  fi
  set +e
  wait "$launcher"
  rc=$?
  set -e
  [ "$rc" -eq 75 ] || fail "exit code $rc, expected 75"
  grep -q "$signal received; stopping after step" "$work/run1.txt" || fail "no stop message"
  tag=$(cat "$work/ck/latest")
  step=${tag#global_step}
  grep -q "saved checkpoint $work/ck/$tag.h5 (step $step, $signal)" "$work/run1.txt" || fail "no save of $tag"
  train -n 4 "$zt" train --config "$config" --steps $((step + 2)) --save-dir "$work/ck" --resume auto \
    --metrics "$work/m2.jsonl" >"$work/run2.txt" 2>&1 || fail "the resumed run failed"
  grep -q "resumed from $work/ck/$tag.h5 at step $step (saved on 2 rank(s)" "$work/run2.txt" ||
    fail "did not resume from $tag"
  grep '"event":"step"' "$work/m2.jsonl" | head -1 | grep -q "\"step\":$((step + 1))," ||
    fail "the resumed run did not go on at step $((step + 1))"
  [ "$(cat "$work/ck/latest")" = "global_step$((step + 2))" ] || fail "no checkpoint at the end of the resumed run"
  ;;
killsave)
  train -n 2 "$zt" train --config "$config" --steps 2 --save-dir "$work/ck" >"$work/run1.txt" 2>&1 ||
    fail "the first run failed"
  [ "$(cat "$work/ck/latest")" = global_step2 ] || fail "latest is not global_step2"
  set +e
  ZT_FAULT_INJECTION=kill_during_checkpoint_save train -n 2 -x ZT_FAULT_INJECTION "$zt" train --config "$config" \
    --steps 4 --save-dir "$work/ck" --save-interval 1 --resume auto >"$work/run2.txt" 2>&1
  rc=$?
  set -e
  [ "$rc" -ne 0 ] || fail "the run killed during its save exited 0"
  [ "$(cat "$work/ck/latest")" = global_step2 ] || fail "latest changed to $(cat "$work/ck/latest")"
  [ ! -e "$work/ck/global_step3.h5" ] || fail "a half-written checkpoint got its final name"
  ls -a "$work/ck" | grep -q '^\.global_step3\.h5\.tmp-' || fail "no temporary left: the kill did not come mid-save"
  # The temporary had the final mode from its creation (0640), not the umask's 0644 (issue 16).
  temporary=$(ls -a "$work/ck" | grep '^\.global_step3\.h5\.tmp-' | head -1)
  temporary_mode=$(stat -c %a "$work/ck/$temporary")
  [ "$temporary_mode" = 640 ] || fail "the half-written temporary has mode $temporary_mode, expected 640 (umask $(umask))"
  train -n 2 "$zt" train --config "$config" --steps 3 --save-dir "$work/ck" --resume auto >"$work/run3.txt" 2>&1 ||
    fail "resuming after the killed save failed"
  grep -q "resumed from $work/ck/global_step2.h5 at step 2" "$work/run3.txt" || fail "did not resume from global_step2"
  if ls -a "$work/ck" | grep -q '\.tmp-'; then fail "the dead save's temporary is still there"; fi
  ;;
*)
  echo "unknown mode $mode" >&2
  exit 2
  ;;
esac
echo "PASS: $mode"
