#!/usr/bin/env bash
# `zerotrain train` asked for a GPU where none is usable (ctest cli.train_device_cuda_unavailable):
# --device cuda, and "device": "cuda" in the config, exit 2 with one line that names rank 0 and the
# reason `zerotrain report` gives (cuda_status()), alone and on 2 ranks: printed once, every rank
# ends without an abort or a hang. Where a GPU is usable there is nothing to check: exit 77 (skipped).
# usage: device_choice.sh ZEROTRAIN CONFIG MPIEXEC [MPIEXEC_FLAGS...]
source "$(dirname "$0")/offload_job.sh" device-choice "$@"
"$zt" report >"$work/report.txt" 2>&1 || fail "zerotrain report failed"
if grep -q "CUDA: *not compiled in" "$work/report.txt"; then
  reason="zerotrain was built without CUDA"
else
  reason=$(sed -n 's/^ *devices: *none usable: //p' "$work/report.txt")
fi
if [ -z "$reason" ]; then
  echo "SKIPPED: a GPU is usable here"
  exit 77
fi
sed '0,/{/s//{"device": "cuda", /' "$config" >"$work/cuda.json"
expected="zerotrain train: \"device\": \"cuda\": rank 0 (host [^,]*, local rank 0) has no usable GPU: "
check() {  # NAME COMMAND...: exit 2, the error line once with the reason, no abort
  local name=$1
  shift
  local code=0
  "$@" >"$work/$name.txt" 2>&1 || code=$?
  [ "$code" = 2 ] || fail "$name: exit code $code, expected 2"
  local count
  count=$(grep -c "^$expected" "$work/$name.txt" || true)
  [ "$count" = 1 ] || fail "$name: the error line is there $count times, expected once"
  grep -qF "has no usable GPU: $reason" "$work/$name.txt" || fail "$name: the reason '$reason' is not named"
  if grep -Eq "MPI_ABORT|fatal error|aborting" "$work/$name.txt"; then fail "$name: the job was aborted"; fi
}
check flag "$zt" train --config "$config" --steps 1 --device cuda
check config "$zt" train --config "$work/cuda.json" --steps 1
check flag_np2 "${mpiexec[@]}" -n 2 "$zt" train --config "$config" --steps 1 --device cuda
check config_np2 "${mpiexec[@]}" -n 2 "$zt" train --config "$work/cuda.json" --steps 1
cat "$work/flag.txt"
echo "PASS: train_device_cuda_unavailable (reason: $reason)"
