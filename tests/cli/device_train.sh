#!/usr/bin/env bash
# `zerotrain train --device emulated` as a user runs it (ctest cli.train_emulated): gpt-tiny at ZeRO
# stage 2 on 2 ranks with the model's state on the emulated test device, whose memory only the
# device API may touch, reaches the host run's losses bit for bit; so does the emulated run with a
# checkpoint per block whose inputs are kept on the host (cpu_checkpointing: the asynchronous copies
# to pinned host memory and back, ExecutionContext::to_host_async, through the device code path).
# usage: device_train.sh ZEROTRAIN CONFIG MPIEXEC [MPIEXEC_FLAGS...]
source "$(dirname "$0")/offload_job.sh" device-cli "$@"
for on_host in false true; do
  python3 - "$config" "$work/checkpointing-$on_host.json" "$on_host" <<'PY'
import json, sys
config = json.load(open(sys.argv[1]))
config["pipeline"] = {"activation_checkpoint_interval": 1}
config["activation_checkpointing"] = {"cpu_checkpointing": sys.argv[3] == "true"}
json.dump(config, open(sys.argv[2], "w"))
PY
done
run() { # NAME DEVICE CONFIG
  "${mpiexec[@]}" -n 2 "$zt" train --config "$3" --steps 6 --print-every 3 --device "$2" \
    --metrics "$work/$1.jsonl" >"$work/$1.txt" 2>&1 || fail "the $1 run failed"
}
run host host "$config"
run emulated emulated "$config"
run emulated-checkpointing emulated "$work/checkpointing-false.json"
run emulated-cpu-checkpointing emulated "$work/checkpointing-true.json"
# mem.activations counts host memory on the emulated device: the kept inputs add to it.
peak_activations() { grep -o '"mem":{"activations":[0-9]*' "$work/$1.jsonl" | grep -o '[0-9]*$' | sort -n | tail -1; }
on_device=$(peak_activations emulated-checkpointing) on_host=$(peak_activations emulated-cpu-checkpointing)
[ -n "$on_device" ] && [ -n "$on_host" ] || fail "no mem.activations in the checkpointed runs' metrics"
[ "$on_host" -gt "$on_device" ] ||
  fail "cpu_checkpointing kept no input in host memory: activation peak $on_host B, $on_device B without it"
host_losses=$(grep -o '"loss":[^,]*' "$work/host.jsonl")
[ -n "$host_losses" ] || fail "no losses in the host run's metrics"
for name in emulated emulated-checkpointing emulated-cpu-checkpointing; do
  losses=$(grep -o '"loss":[^,]*' "$work/$name.jsonl")
  [ "$host_losses" = "$losses" ] || fail "losses differ: host [$host_losses] $name [$losses]"
done
grep "zerotrain train:" "$work/emulated.txt"
grep "zerotrain train:" "$work/emulated-cpu-checkpointing.txt"
echo "host activation peak with checkpoints per block: $on_device B, with cpu_checkpointing $on_host B"
echo "PASS: train_emulated ($(echo "$host_losses" | wc -l) steps, same losses on the emulated device, with checkpoints and cpu_checkpointing too)"
