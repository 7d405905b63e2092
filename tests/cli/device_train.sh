#!/usr/bin/env bash
# `zerotrain train --device emulated` as a user runs it (ctest cli.train_emulated): gpt-tiny at ZeRO
# stage 2 on 2 ranks with the model's state on the emulated test device, whose memory only the
# device API may touch, reaches the host run's losses bit for bit.
# usage: device_train.sh ZEROTRAIN CONFIG MPIEXEC [MPIEXEC_FLAGS...]
source "$(dirname "$0")/offload_job.sh" device-cli "$@"
for device in host emulated; do
  "${mpiexec[@]}" -n 2 "$zt" train --config "$config" --steps 6 --print-every 3 --device "$device" \
    --metrics "$work/$device.jsonl" >"$work/$device.txt" 2>&1 || fail "the $device run failed"
done
host_losses=$(grep -o '"loss":[^,]*' "$work/host.jsonl")
emulated_losses=$(grep -o '"loss":[^,]*' "$work/emulated.jsonl")
[ -n "$host_losses" ] || fail "no losses in the host run's metrics"
[ "$host_losses" = "$emulated_losses" ] || fail "losses differ: host [$host_losses] emulated [$emulated_losses]"
grep "zerotrain train:" "$work/emulated.txt"
echo "PASS: train_emulated ($(echo "$emulated_losses" | wc -l) steps, same losses)"
