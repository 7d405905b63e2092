#!/usr/bin/python3
"""Frozen parameters train as PyTorch's with requires_grad=False (docs/adaptation-reference.md).

    tests/cli/check_freeze_torch.py NP ZEROTRAIN CONFIG SOURCE_DIR WORK_DIR MPIEXEC [MPIEXEC_FLAGS...]

A random PyTorch GPT (tests/cli/torch_gpt_case.py) is the starting point ("init": {"from": ...}) of
20 steps of `zerotrain train` on NP ranks with "freeze": ["wte.*", "h.0.*"], fp32, AdamW with weight
decay, no clipping, constant lr, on a text file of exactly one global batch (every step's gradient
is the mean over the same samples, whatever their order), at ZeRO stages 0-3, with the optimizer
states offloaded to the CPU (stage 2) and parameters and states on NVMe (stage 3). PyTorch trains
the same model with requires_grad=False on the same parameters and AdamW over the others (so no
weight decay touches the frozen ones). Checked for every run: each step's loss within 1e-5
relative of PyTorch's, the trainable tensors of the final checkpoint within 1e-3 of how far PyTorch
moved each (L2 norms: Adam turns rounding noise in near-zero gradients into steps of lr, so single
elements may differ more), the frozen ones bitwise the initial weights, the checkpoint listing
them (/model attribute frozen) without optimizer state; and against a run without freeze (stage 2)
less reduction traffic per step, at most the trainable share of it; at stages 0-3 the memory the
run holds between steps (parameters, gradients, optimizer states) is what `zerotrain estimate`
prints for the config with its freeze. With NP 1 also `estimate`
with the freeze (no gradient or optimizer bytes for the frozen tensors) and a resume that unfreezes
h.0 (its optimizer state starts at zero). Exit 0 ("PASS: freeze_torch"), 1 on a failure, 77
(skipped) without torch or h5py.
"""
import json
import os
import re
import shutil
import subprocess
import sys

from clitest import check, finish, skipped_without

with skipped_without("python3-torch python3-h5py"):
    import h5py
    import numpy as np
    import torch
    import torch.nn.functional as F

np_ranks = int(sys.argv[1])
zerotrain, config_path, source, work = sys.argv[2:6]
mpiexec = sys.argv[6:]
from torch_gpt_case import one_global_batch, random_gpt, zerotrain_torch  # noqa: E402

STEPS = 20
FREEZE = ["wte.*", "h.0.*"]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
base = json.load(open(config_path))
base["model"].update({"n_layer": 2, "d_model": 64, "seq_len": 32})  # small: 6 runs of 20 steps per rank count
model_section = base["model"]
base.pop("scheduler", None)
base["gradient_clipping"] = 0.0
base["optimizer"] = {"type": "AdamW", "params": {"lr": 2e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                                                 "weight_decay": 0.1}}
T, V = model_section["seq_len"], model_section["vocab_size"]

model = random_gpt(model_section)
initial = {name: p.detach().clone() for name, p in model.state_dict().items()}
weights = os.path.join(work, "weights.h5")
zerotrain_torch.write_weights(initial, weights, {})
frozen = sorted(n for n in initial if any(re.fullmatch(p.replace(".", r"\.").replace("*", ".*"), n) for p in FREEZE))
check(len(frozen) == 1 + 12, f"{len(frozen)} frozen tensors: wte and block 0's twelve")

text = os.path.join(work, "batch.txt")
inputs, targets = one_global_batch(source, text, base["train_batch_size"], T)

# PyTorch: requires_grad=False on the frozen tensors, AdamW over the others.
for name, parameter in model.named_parameters():
    parameter.requires_grad_(name not in frozen)
trainable = [p for p in model.parameters() if p.requires_grad]
optimizer = torch.optim.AdamW(trainable, lr=2e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
torch_losses = []
for step in range(STEPS):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(inputs).reshape(-1, V), targets.reshape(-1))
    loss.backward()
    optimizer.step()
    torch_losses.append(loss.item())
final = {name: p.detach().clone() for name, p in model.state_dict().items()}
for name in frozen:
    check(torch.equal(final[name], initial[name]), f"PyTorch left {name} unchanged")
print(f"PyTorch losses: {torch_losses[0]:.7g} ... {torch_losses[-1]:.7g}")


def config_for(label, zero, freeze=FREEZE):
    config = json.loads(json.dumps(base))
    config["zero_optimization"] = zero
    config["init"] = {"from": weights}
    if freeze:
        config["freeze"] = freeze
    path = os.path.join(work, label + ".json")
    json.dump(config, open(path, "w"))
    return path


def train(label, zero, freeze=FREEZE, steps=STEPS, extra=()):
    save_dir = os.path.join(work, label)
    metrics = os.path.join(work, label + ".jsonl")
    result = subprocess.run(mpiexec + ["-n", str(np_ranks), zerotrain, "train", "--config",
                                       config_for(label, zero, freeze), "--data", text, "--steps", str(steps),
                                       "--save-dir", save_dir, "--metrics", metrics] + list(extra),
                            capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        print(result.stdout[-3000:], result.stderr[-3000:])
        check(False, f"{label}: train exited {result.returncode}")
        return None, None, result
    records = [json.loads(line) for line in open(metrics)]
    return [r for r in records if r["event"] == "step"], save_dir, result


def row(output, name):
    """A byte count of `zerotrain estimate`'s table."""
    found = re.search(rf"^  {name}\s+(\d+) B", output, re.M)
    return int(found.group(1)) if found else -1


def exported(save_dir, label):
    out = os.path.join(work, label + "-export.h5")
    result = subprocess.run([zerotrain, "checkpoint", "export", save_dir, "--out", out], capture_output=True,
                            text=True, timeout=120)
    check(result.returncode == 0, f"{label}: export exited {result.returncode}: {result.stderr}")
    _, tensors = zerotrain_torch.read_export(out)
    return tensors


nvme = os.path.join(work, "nvme")
os.makedirs(nvme)
runs = [("stage0", {"stage": 0}), ("stage1", {"stage": 1}), ("stage2", {"stage": 2}), ("stage3", {"stage": 3}),
        ("stage2-offload-cpu", {"stage": 2, "offload_optimizer": {"device": "cpu"}}),
        ("stage3-nvme", {"stage": 3, "sub_group_size": 100000,
                         "offload_param": {"device": "nvme", "nvme_path": nvme, "max_in_cpu": 0},
                         "offload_optimizer": {"device": "nvme", "nvme_path": nvme}})]
traffic = {}
for label, zero in runs:
    steps, save_dir, result = train(label, zero)
    if steps is None:
        continue
    check("13 parameter tensors frozen" in result.stdout, f"{label}: the freeze line ({result.stdout[-500:]})")
    losses = [r["loss"] for r in steps]
    worst = max(abs(a - b) / abs(b) for a, b in zip(losses, torch_losses))
    check(len(losses) == STEPS and worst <= 1e-5, f"{label}: losses within 1e-5 of PyTorch's (worst {worst:.2e})")
    traffic[label] = steps[-1]["comm_bytes"]
    if "offload" not in label and "nvme" not in label:
        # The memory the run holds between steps is what `estimate` prints with the freeze.
        estimate = subprocess.run([zerotrain, "estimate", "--config", os.path.join(work, label + ".json"),
                                   "--world-size", str(np_ranks)], capture_output=True, text=True, timeout=60)
        resident = steps[-1]["mem"]["resident"]
        for state in ("parameters", "gradients", "optimizer_states"):
            check(row(estimate.stdout, state) == resident[state],
                  f"{label}: estimate's {state} {row(estimate.stdout, state)} B = the run's {resident[state]} B")
    tensors = exported(save_dir, label)
    deviation, worst_tensor = 0.0, ""
    for name, value in tensors.items():
        if name in frozen:
            check(value.numpy().tobytes() == initial[name].numpy().tobytes(),
                  f"{label}: frozen {name} bitwise unchanged after {STEPS} steps")
        else:
            # Against how far PyTorch moved the tensor: Adam divides by the gradient's own scale, so
            # an element whose exact gradient is zero (the key third of qkv.bias: softmax ignores a
            # shift of every score of a query) moves by rounding noise in both, and is left out.
            ours, theirs, start = value, final[name], initial[name]
            if name.endswith("attn.qkv.bias"):  # the key third moves by noise in both: left out
                C = model_section["d_model"]
                ours, theirs, start = (torch.cat([t[:C], t[2 * C:]]) for t in (ours, theirs, start))
            moved = (theirs - start).norm().item()
            off = (ours - theirs).norm().item() / moved
            deviation = max(deviation, off)
            worst_tensor = name if off == deviation else worst_tensor
            check(off <= 1e-3, f"{label}: {name} is PyTorch's after {STEPS} steps (differs by {off:.2e} of "
                               f"its movement, L2 {moved:.2e})")
    checkpoint = os.path.join(save_dir, f"global_step{STEPS}.h5")
    with h5py.File(checkpoint, "r") as f:
        listed = sorted(f["model"].attrs["frozen"].decode().split()) if "frozen" in f["model"].attrs else []
        check(listed == frozen, f"{label}: the checkpoint lists the frozen tensors ({listed})")
        states = [f"optimizer/{s}/{n}" for s in f["optimizer"].keys() for n in frozen]
        check(not any(name in f for name in states), f"{label}: no optimizer state of a frozen tensor")
    print(f"np {np_ranks} {label}: losses within {worst:.1e} of PyTorch's, trainable tensors within "
          f"{deviation:.1e} of their movement ({worst_tensor}), {len(frozen)} frozen tensors bitwise unchanged, comm {traffic[label]} B/step")

# Reduction traffic: the frozen tensors' gradients are not reduced.
if np_ranks > 1 and "stage2" in traffic:
    steps, _, _ = train("stage2-unfrozen", {"stage": 2}, freeze=None, steps=2)
    if steps is not None:
        share = sum(t.numel() for n, t in initial.items() if n not in frozen) / sum(t.numel() for t in initial.values())
        ratio = traffic["stage2"] / steps[-1]["comm_bytes"]
        print(f"reduction traffic with freeze / without: {ratio:.3f} (trainable share {share:.3f})")
        check(ratio <= share + 0.01, f"traffic ratio {ratio:.3f} above the trainable share {share:.3f}")

if np_ranks == 1:
    result = subprocess.run([zerotrain, "estimate", "--config", config_for("estimate", {"stage": 2}),
                             "--world-size", "2"], capture_output=True, text=True, timeout=60)
    unfrozen = subprocess.run([zerotrain, "estimate", "--config", config_for("estimate-unfrozen", {"stage": 2},
                                                                              freeze=None),
                               "--world-size", "2"], capture_output=True, text=True, timeout=60)
    frozen_elements = sum(initial[n].numel() for n in frozen)
    check(result.returncode == 0 and f"freeze: {frozen_elements} frozen parameters" in result.stdout,
          f"estimate shows the frozen parameters: {result.stdout}{result.stderr}")

    for name in ("gradients", "optimizer_states"):
        check(0 < row(result.stdout, name) < row(unfrozen.stdout, name), f"estimate: fewer {name} bytes with freeze")
    print(f"estimate: gradients {row(unfrozen.stdout, 'gradients')} -> {row(result.stdout, 'gradients')} B, "
          f"optimizer states {row(unfrozen.stdout, 'optimizer_states')} -> {row(result.stdout, 'optimizer_states')} B")
    # Unfreezing h.0 on resume: its tensors train from here, their optimizer state starting at zero.
    steps, _, result = train("unfreeze", {"stage": 1}, freeze=["wte.*"], steps=STEPS + 1,
                             extra=["--resume", os.path.join(work, "stage1", f"global_step{STEPS}.h5")])
    check(steps is not None and "resumed from" in result.stdout and len(steps) == 1,
          "a resume with h.0 unfrozen trains on")

finish("PASS: freeze_torch")
