#!/usr/bin/env bash
# `zerotrain train` with ZeRO-Infinity's NVMe offload, as a user runs it (ctest cli.offload_nvme):
# gpt-tiny at stage 3 with every parameter piece (max_in_cpu 0) and the optimizer states in swap
# files, on 2 ranks, reaches the same losses as the in-memory stage 3 run, says where the states
# live, and leaves no swap file behind.
# usage: offload_train.sh ZEROTRAIN CONFIG MPIEXEC [MPIEXEC_FLAGS...]
source "$(dirname "$0")/offload_job.sh" offload-cli "$@"
/usr/bin/python3 - "$config" "$work" <<'PY'
import json, sys
config, work = sys.argv[1], sys.argv[2]
base = json.load(open(config))
base["zero_optimization"] = {"stage": 3, "overlap_comm": True, "stage3_param_persistence_threshold": 0,
                             "stage3_prefetch_bucket_size": 100000, "sub_group_size": 50000}
json.dump(base, open(f"{work}/memory.json", "w"))
offload = dict(base)
offload["zero_optimization"] = dict(base["zero_optimization"],
    offload_param={"device": "nvme", "nvme_path": f"{work}/swap", "max_in_cpu": 0, "buffer_count": 4},
    offload_optimizer={"device": "nvme", "nvme_path": f"{work}/swap", "buffer_count": 3})
json.dump(offload, open(f"{work}/nvme.json", "w"))
PY
for run in memory nvme; do
  "${mpiexec[@]}" -n 2 "$zt" train --config "$work/$run.json" --steps 12 --print-every 4 \
    --metrics "$work/$run.jsonl" >"$work/$run.txt" 2>&1 || fail "the $run run failed"
done
grep -q "parameters (rank 0): nvme swap file $work/swap/zerotrain-swap.rank0" "$work/nvme.txt" ||
  fail "the nvme run does not say where the parameters are"
grep -q "optimizer states (rank 0): nvme swap file" "$work/nvme.txt" || fail "no optimizer states line"
grep -q '"param_read_bytes":[1-9]' "$work/nvme.jsonl" || fail "no parameter reads in the metrics"
memory_losses=$(grep -o '"loss":[^,]*' "$work/memory.jsonl")
nvme_losses=$(grep -o '"loss":[^,]*' "$work/nvme.jsonl")
[ "$memory_losses" = "$nvme_losses" ] || fail "losses differ: memory [$memory_losses] nvme [$nvme_losses]"
[ -z "$(ls -A "$work/swap")" ] || fail "swap files left: $(ls "$work/swap")"
grep -E "zerotrain train:|parameters \(rank 0\)" "$work/nvme.txt"
echo "PASS: offload_nvme ($(echo "$nvme_losses" | wc -l) steps, same losses)"
