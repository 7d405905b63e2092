#!/usr/bin/env bash
# `zerotrain swap clean` after a job killed by SIGKILL (ctest cli.swap_clean): a 2-rank training with
# its optimizer states and parameters on NVMe is killed mid-run, which runs no destructor, so its
# swap files stay; `swap list` calls them stale, `swap clean` removes them and keeps a file whose
# process still runs.
# usage: swap_clean.sh ZEROTRAIN CONFIG MPIEXEC [MPIEXEC_FLAGS...]
source "$(dirname "$0")/offload_job.sh" swap-clean "$@"
/usr/bin/python3 - "$config" "$work" <<'PY'
import json, sys
config, work = sys.argv[1], sys.argv[2]
c = json.load(open(config))
c["zero_optimization"] = {"stage": 3, "sub_group_size": 50000,
    "offload_param": {"device": "nvme", "nvme_path": f"{work}/swap", "max_in_cpu": 0},
    "offload_optimizer": {"device": "nvme", "nvme_path": f"{work}/swap"}}
json.dump(c, open(f"{work}/nvme.json", "w"))
PY
"${mpiexec[@]}" -n 2 "$zt" train --config "$work/nvme.json" --steps 100000 --metrics "$work/m.jsonl" \
  >"$work/run.txt" 2>&1 &
launcher=$!
for _ in $(seq 1 480); do
  grep -q '"step":2,' "$work/m.jsonl" 2>/dev/null && break
  sleep 0.25
done
grep -q '"step":2,' "$work/m.jsonl" 2>/dev/null || fail "the job did not reach step 2"
for rank in $(pgrep -P "$launcher"); do kill -KILL "$rank"; done
wait "$launcher" || true
left=$(ls "$work/swap" | wc -l)
[ "$left" -eq 4 ] || fail "expected 4 swap files left by the killed job (2 ranks x parameters, states), found $left"
# A file whose process is alive (this shell) must be kept.
live="$work/swap/zerotrain-swap.rank9.$(hostname).$$.0.bin"
touch "$live"
# The launcher kills the other rank after the first; give it time to go.
for _ in $(seq 1 80); do
  "$zt" swap list "$work/swap" >"$work/list.txt" 2>&1 || fail "swap list failed"
  [ "$(grep -c 'stale (its process is gone)' "$work/list.txt")" -eq 4 ] && break
  sleep 0.25
done
[ "$(grep -c 'stale (its process is gone)' "$work/list.txt")" -eq 4 ] || fail "swap list does not call the 4 files stale"
"$zt" swap clean "$work/swap" >"$work/clean.txt" 2>&1 || fail "swap clean failed"
grep -q "removed 4 of 5 swap file(s)" "$work/clean.txt" || fail "swap clean did not report 4 of 5 removed"
[ "$(ls "$work/swap")" = "$(basename "$live")" ] || fail "left after clean: $(ls "$work/swap")"
cat "$work/clean.txt"
echo "PASS: swap_clean"
