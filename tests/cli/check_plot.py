#!/usr/bin/python3
"""`zerotrain plot` on two real runs' metrics (docs/metrics.md).

    tests/cli/check_plot.py ZEROTRAIN CONFIG WORK_DIR MPIEXEC [MPIEXEC_FLAGS...]

Trains gpt-tiny twice on 2 ranks for 3 steps (the second with 3x the learning rate), then runs
`zerotrain plot a.jsonl b.jsonl --out DIR` and checks: exit 0; loss.png, lr.png, tokens_per_s.png,
memory.png and comm_wait.png written, each a PNG that reads back with pixels of both runs' line
colours (matplotlib's first two, C0 and C1) in it; a usage error exits 2. Prints "PASS: plot";
exit 1 when something fails, 77 (skipped) without matplotlib.
"""
import json
import os
import shutil
import subprocess
import sys

from clitest import check, finish, skipped_without

with skipped_without("python3-matplotlib"):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.image
    import numpy as np

zerotrain, config_path, work = sys.argv[1:4]
mpiexec = sys.argv[4:]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
config = json.load(open(config_path))
runs = []
for name, factor in (("base", 1.0), ("fast", 3.0)):
    config["optimizer"]["params"]["lr"] *= factor
    path = os.path.join(work, f"{name}.json")
    json.dump(config, open(path, "w"))
    metrics = os.path.join(work, f"{name}.jsonl")
    run = subprocess.run(mpiexec + ["-n", "2", zerotrain, "train", "--config", path, "--steps", "3",
                                    "--metrics", metrics], capture_output=True, text=True, timeout=240)
    check(run.returncode == 0, f"train {name} exited {run.returncode}: {run.stderr[-1000:]}")
    runs.append(metrics)

out = os.path.join(work, "plots")
plot = subprocess.run([zerotrain, "plot", *runs, "--out", out], capture_output=True, text=True, timeout=120)
print(plot.stdout, plot.stderr[-2000:])
check(plot.returncode == 0, f"zerotrain plot exited {plot.returncode}")
colours = [np.array(matplotlib.colors.to_rgb(c)) for c in ("C0", "C1")]
for name in ("loss", "lr", "tokens_per_s", "memory", "comm_wait"):
    path = os.path.join(out, f"{name}.png")
    check(f"{path}: 2 run(s)" in plot.stdout, f"{name}.png reported with 2 runs")
    if not os.path.isfile(path):
        check(False, f"{path} written")
        continue
    check(open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n", f"{path} is a PNG")
    pixels = matplotlib.image.imread(path)[:, :, :3]
    for index, colour in enumerate(colours):
        near = (np.abs(pixels - colour).max(axis=2) < 0.02).sum()
        check(near > 50, f"{path}: run {index} (colour C{index}) drawn ({near} pixels)")

usage = subprocess.run([zerotrain, "plot", runs[0]], capture_output=True, text=True, timeout=60)
check(usage.returncode == 2 and "--out" in usage.stderr, f"missing --out: exit {usage.returncode}, {usage.stderr}")
finish("PASS: plot")
