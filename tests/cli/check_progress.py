#!/usr/bin/python3
"""The progress line and the MFU of `zerotrain train` against its metrics (docs/metrics.md, "MFU").

    tests/cli/check_progress.py ZEROTRAIN CONFIGS_DIR WORK_DIR MPIEXEC [MPIEXEC_FLAGS...]

Three short runs, each with --metrics and a progress line per step:
  - gpt-tiny on one process with --peak-flops 2e10: the start record's flops_per_token is
    6 x parameters + 12 x n_layer x seq_len x d_model (computed here from the model's sizes),
    peak_flops 2e10 from "--peak-flops"; every step record's mfu is tokens_per_s x flops_per_token
    / peak_flops; every progress line reads "step i/N | ... | MFU x% | peak ... MiB | elapsed
    H:MM:SS | ETA H:MM:SS" with that mfu (to the printed digit), elapsed not decreasing, ETA 0:00:00
    at the last step; the header names the formula and the peak;
  - mlp-zero0 on one process with --peak-flops: flops_per_token is 6 x parameters;
  - gpt-tiny on 2 ranks without --peak-flops: the peak is the sum of the ranks' matmul probes
    (source "matmul probe", at least rank 0's figure in the header, which names the size, the
    dtype and the calls), and the mfu follows from it as above.
Prints "PASS: progress"; exit 1 when something fails.
"""
import json
import math
import os
import re
import shutil
import subprocess
import sys

from clitest import check, finish

zerotrain, configs, work = sys.argv[1:4]
mpiexec = sys.argv[4:]
def close(a, b):
    return math.isclose(a, b, rel_tol=1e-12)


PROGRESS = re.compile(
    r"^step +(\d+)/(\d+) \| loss [0-9.]+ \| lr [0-9.e+-]+ \| scale [0-9.e+-]+ \| grad norm [0-9.]+ \| "
    r"[0-9]+ tok/s \| [0-9.]+ ms/step \| MFU ([0-9]+\.[0-9])% \| peak [0-9.]+ MiB \| "
    r"elapsed (\d+):([0-5]\d):([0-5]\d) \| ETA (\d+):([0-5]\d):([0-5]\d)$")


def train(name, config, ranks, steps, *extra):
    metrics = os.path.join(work, f"{name}.jsonl")
    command = ([*mpiexec, "-n", str(ranks)] if ranks > 1 else []) + [
        zerotrain, "train", "--config", os.path.join(configs, config), "--steps", str(steps),
        "--print-every", "1", "--metrics", metrics, *extra]
    run = subprocess.run(command, capture_output=True, text=True, timeout=240)
    print(f"--- {name}:", run.stdout[-3000:], run.stderr[-2000:])
    check(run.returncode == 0, f"{name}: exit {run.returncode}")
    records = [json.loads(line) for line in open(metrics)] if os.path.exists(metrics) else []
    start = next((r for r in records if r["event"] == "start"), {})
    step_records = [r for r in records if r["event"] == "step"]
    check(len(step_records) == steps, f"{name}: {steps} step records, got {len(step_records)}")
    lines = [PROGRESS.match(line) for line in run.stdout.splitlines() if line.startswith("step ")]
    check(len(lines) == steps and all(lines), f"{name}: {steps} progress lines in the expected format")
    lines = [m for m in lines if m]
    elapsed = [int(m[4]) * 3600 + int(m[5]) * 60 + int(m[6]) for m in lines]
    check(elapsed == sorted(elapsed), f"{name}: elapsed does not decrease: {elapsed}")
    for m, record in zip(lines, step_records):
        check(int(m[1]) == record["step"] and int(m[2]) == steps, f"{name}: step {m[1]}/{m[2]}")
        mfu = record["tokens_per_s"] * start.get("flops_per_token", 0) / start.get("peak_flops", 1)
        check(close(record["mfu"], mfu), f"{name}: step {record['step']}: mfu {record['mfu']}, expected {mfu}")
        check(m[3] == f"{100 * record['mfu']:.1f}", f"{name}: step {record['step']}: MFU {m[3]}% in the line, "
                                                     f"{100 * record['mfu']:.1f}% in the metrics")
    if lines:
        check(lines[-1].group(7, 8, 9) == ("0", "00", "00"), f"{name}: ETA 0:00:00 at the last step")
    return run.stdout, start


shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)

out, start = train("gpt-flag", "gpt-tiny.json", 1, 3, "--peak-flops", "2e10")
model = start.get("model", {})
expected = 6 * start.get("params_total", 0) + 12 * model.get("n_layer", 0) * model.get("seq_len", 0) * model.get(
    "d_model", 0)
check(expected > 0 and start.get("flops_per_token") == expected,
      f"gpt: flops_per_token {start.get('flops_per_token')}, expected 6 x params + 12 x L x T x d = {expected}")
check(start.get("peak_flops") == 2e10 and start.get("peak_flops_source") == "--peak-flops", f"gpt: peak {start}")
check(f"  MFU: {expected:.4g} model FLOPs per token (6 x parameters + 12 x layers x seq_len x d_model), "
      "peak 2e+10 FLOP/s = 1 rank(s) x --peak-flops 2e+10\n" in out, "gpt: the header's MFU line")

out, start = train("mlp-flag", "mlp-zero0.json", 1, 2, "--peak-flops", "1e9")
check(start.get("flops_per_token") == 6 * start.get("params_total", -1), f"mlp: flops_per_token {start}")
check("model FLOPs per token (6 x parameters), peak 1e+09 FLOP/s = 1 rank(s) x --peak-flops 1e+09\n" in out,
      "mlp: the header's MFU line")

out, start = train("gpt-probe", "gpt-tiny.json", 2, 2)
check(start.get("peak_flops_source") == "matmul probe", f"probe: source {start.get('peak_flops_source')}")
header = re.search(r"\n  MFU: [^\n]*, peak ([0-9.e+]+) FLOP/s = the ranks' matmul probes \(rank 0: ([0-9.e+]+), "
                   r"(\d+)\^3 fp32, best of (\d+) calls in \d+ ms; --peak-flops sets it\)\n", out)
check(header is not None, "probe: the header's MFU line")
if header:
    total, rank0, size, calls = float(header[1]), float(header[2]), int(header[3]), int(header[4])
    check(math.isclose(total, start.get("peak_flops", 0), rel_tol=1e-2), f"probe: header {total} vs metrics {start}")
    check(0 < rank0 < total, f"probe: rank 0's {rank0} is a part of the sum {total} of 2 ranks")
    check(size in (128, 256, 512, 1024) and calls >= 1, f"probe: {size}^3, {calls} calls")

finish("PASS: progress")
