#!/usr/bin/python3
"""Frozen parameters against the same run training everything (docs/benchmarks.md, "Frozen parameters").

    bench/freeze_memory.py ZEROTRAIN CONFIG WORK_DIR NP STEPS MPIEXEC [MPIEXEC_FLAGS...]

Trains CONFIG for STEPS steps on NP ranks at ZeRO stages 0-3, once as it is (the anchor) and once
with "freeze": ["wte.*", "wpe.*", "h.0.*", "h.1.*"], and prints per stage the model-state memory a
rank holds between steps (the metrics' mem.resident), the reduction bytes a rank sends per step
(comm_bytes) and the mean step time of the last STEPS - 1 steps, each frozen / anchor.
"""
import json
import os
import subprocess
import sys

zerotrain, config_path, work, np_ranks, steps = sys.argv[1:6]
mpiexec = sys.argv[6:]
os.makedirs(work, exist_ok=True)
FREEZE = ["wte.*", "wpe.*", "h.0.*", "h.1.*"]


def run(stage, freeze):
    config = json.load(open(config_path))
    config.pop("scheduler", None)
    config["zero_optimization"] = {"stage": stage}
    if freeze:
        config["freeze"] = freeze
    label = f"stage{stage}-{'frozen' if freeze else 'anchor'}"
    path = os.path.join(work, label + ".json")
    json.dump(config, open(path, "w"))
    metrics = os.path.join(work, label + ".jsonl")
    subprocess.run(mpiexec + ["-n", np_ranks, zerotrain, "train", "--config", path, "--steps", steps, "--metrics",
                              metrics, "--print-every", "0"], check=True, capture_output=True, text=True)
    records = [json.loads(line) for line in open(metrics)]
    start = [r for r in records if r["event"] == "start"][0]
    lines = [r for r in records if r["event"] == "step"]
    resident = sum(lines[-1]["mem"]["resident"].values())
    seconds = sum(r["step_time_s"] for r in lines[1:]) / max(1, len(lines) - 1)
    return start, resident, lines[-1]["comm_bytes"], seconds


print(f"{np_ranks} ranks, {steps} steps, freeze {FREEZE}")
for stage in range(4):
    start, anchor_bytes, anchor_comm, anchor_time = run(stage, None)
    frozen_start, frozen_bytes, frozen_comm, frozen_time = run(stage, FREEZE)
    share = 1 - frozen_start["params_frozen"] / frozen_start["params_total"]
    print(f"stage {stage}: trainable share {share:.3f} of {start['params_total']} parameters; model states "
          f"{frozen_bytes} / {anchor_bytes} B = {frozen_bytes / anchor_bytes:.3f}; reduction bytes/step "
          f"{frozen_comm} / {anchor_comm} = {frozen_comm / max(1, anchor_comm):.3f}; step time "
          f"{frozen_time * 1e3:.1f} / {anchor_time * 1e3:.1f} ms = {frozen_time / anchor_time:.3f}")
