#!/usr/bin/python3
"""PyTorch GPT-2 weights in zerotrain give PyTorch's loss (docs/checkpoint-format.md, "Import").

    tests/cli/check_import_torch.py NP ZEROTRAIN CONFIG SOURCE_DIR WORK_DIR MPIEXEC [MPIEXEC_FLAGS...]

bench/gpt_model.py's Gpt with random weights (every tensor perturbed, LayerNorms and biases too, so
that each one shapes the loss) is written as a Hugging Face GPT-2 checkpoint directory
(GPT2LMHeadModel's names, Conv1D weights [in, out], lm_head.weight tied to wte, the attention-mask
buffers; no transformers package) and converted by scripts/zerotrain_torch.py convert, which must
give back the model's own tensors bit for bit. `zerotrain checkpoint import` on 2 ranks makes a
step-0 checkpoint of it. Then, on NP ranks, at ZeRO stages 0-3, fp32: one step of `zerotrain train`
on a text file of exactly one global batch reports the loss of the weights before the update,
which must be PyTorch's loss on the same samples within 1e-6 relative; stages 0 and 2 start from
the weights file ("init": {"from": ...}), stages 1 and 3 resume the imported checkpoint (any world
size and stage). With NP 1 also: export -> import -> export is bitwise the identity, the file
converted is what the import exports, and the errors (a model of other shapes, an unconverted
Hugging Face file, a misspelt init key) name what is wrong, and docs/checkpoint-format.md quotes
the converter's code verbatim. Exit 0 ("PASS: import_torch"), 1 on a
failure, 77 (skipped) without torch or h5py.
"""
import json
import os
import re
import shutil
import subprocess
import sys

from clitest import check, check_doc_quotes, finish, skipped_without

with skipped_without("python3-torch python3-h5py"):
    import h5py
    import numpy as np
    import torch
    import torch.nn.functional as F

np_ranks = int(sys.argv[1])
zerotrain, config_path, source, work = sys.argv[2:6]
mpiexec = sys.argv[6:]
script = os.path.join(source, "scripts", "zerotrain_torch.py")
from torch_gpt_case import one_global_batch, random_gpt, zerotrain_torch  # noqa: E402

def run(command, timeout=240):
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    return result


shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
base = json.load(open(config_path))
model_section = base["model"]
base.pop("scheduler", None)
base["zero_optimization"] = {"stage": 0}
L, H, C, T, V = (model_section[k] for k in ("n_layer", "n_head", "d_model", "seq_len", "vocab_size"))

model = random_gpt(model_section)
tensors = {name: p.detach().clone() for name, p in model.state_dict().items()}

# As a Hugging Face GPT-2 directory: GPT2LMHeadModel's names, tied lm_head, mask buffers.
attributes = {"n_layer": L, "n_head": H, "d_model": C, "n_embd": C, "seq_len": T, "n_positions": T,
              "vocab_size": V, "tie_embeddings": 1, "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new",
              "dropout": 0.0}
hf = zerotrain_torch.hugging_face_state_dict(tensors, attributes)
for layer in range(L):
    hf[f"transformer.h.{layer}.attn.bias"] = torch.tril(torch.ones(T, T)).view(1, 1, T, T)
    hf[f"transformer.h.{layer}.attn.masked_bias"] = torch.tensor(-1e4)
hf_dir = os.path.join(work, "gpt2")
os.makedirs(hf_dir)
torch.save(hf, os.path.join(hf_dir, "pytorch_model.bin"))
json.dump(zerotrain_torch.hugging_face_config(attributes), open(os.path.join(hf_dir, "config.json"), "w"))

weights = os.path.join(work, "weights.h5")
converted = run([sys.executable, script, "convert", hf_dir, "--out", weights])
print(converted.stdout, converted.stderr[-2000:])
check(converted.returncode == 0, f"convert exited {converted.returncode}")
with h5py.File(weights, "r") as f:
    names = sorted(f.keys())
    check(names == sorted(tensors), f"converted names {names} are the model's {sorted(tensors)}")
    for name in names:
        check(np.array_equal(f[name][()], tensors[name].numpy()), f"converted {name} is bitwise the model's")
check('"n_head": %d' % H in converted.stdout, "convert printed the model section with n_head from config.json")

# The batch: a text file of exactly one global batch of samples (bytes as tokens).
samples = base["train_batch_size"]
text = os.path.join(work, "batch.txt")
inputs, targets = one_global_batch(source, text, samples, T)
check(len(inputs) == samples, f"{len(inputs)} samples, one global batch of {samples}")
with torch.no_grad():
    torch_loss = F.cross_entropy(model(inputs).reshape(-1, V), targets.reshape(-1)).item()
print(f"PyTorch loss {torch_loss:.9g}")


def write_config(name, stage, init=None):
    config = json.loads(json.dumps(base))
    config["zero_optimization"] = {"stage": stage}
    if init is not None:
        config["init"] = init
    path = os.path.join(work, name)
    json.dump(config, open(path, "w"))
    return path


def step_one_loss(config, extra, label):
    metrics = os.path.join(work, label + ".jsonl")
    result = run(mpiexec + ["-n", str(np_ranks), zerotrain, "train", "--config", config, "--data", text, "--steps",
                            "1", "--metrics", metrics] + extra)
    if result.returncode != 0:
        print(result.stdout[-3000:], result.stderr[-3000:])
        check(False, f"{label}: train exited {result.returncode}")
        return None, result
    steps = [json.loads(line) for line in open(metrics)]
    return [r for r in steps if r["event"] == "step" and r["step"] == 1][0]["loss"], result


# The step-0 checkpoint, made on 2 ranks under mpirun.
checkpoints = os.path.join(work, "ckpt")
imported = run(mpiexec + ["-n", "2", zerotrain, "checkpoint", "import", weights, "--config",
                          write_config("import.json", 0), "--out", checkpoints])
print(imported.stdout, imported.stderr[-2000:])
check(imported.returncode == 0 and "imported" in imported.stdout, f"import exited {imported.returncode}")

for stage in range(4):
    if stage % 2 == 0:
        config = write_config(f"stage{stage}.json", stage, {"from": weights})
        loss, result = step_one_loss(config, [], f"init-stage{stage}")
        check(result.returncode != 0 or "initialized" in result.stdout, f"stage {stage}: the init line")
    else:
        config = write_config(f"stage{stage}.json", stage)
        loss, result = step_one_loss(config, ["--resume", os.path.join(checkpoints, "global_step0.h5")],
                                     f"resume-stage{stage}")
        check(result.returncode != 0 or "resumed from" in result.stdout, f"stage {stage}: the resume line")
    if loss is None:
        continue
    relative = abs(loss - torch_loss) / abs(torch_loss)
    how = "init.from" if stage % 2 == 0 else "imported checkpoint"
    print(f"np {np_ranks} stage {stage} ({how}): zerotrain {loss:.9g}, PyTorch {torch_loss:.9g}, "
          f"relative {relative:.2e}")
    check(relative <= 1e-6, f"np {np_ranks} stage {stage}: {loss} vs PyTorch {torch_loss}: {relative:.2e} > 1e-6")


def datasets(path):
    with h5py.File(path, "r") as f:
        return {name: (f[name].dtype, f[name][()]) for name in f.keys()}


def model_attributes(path):
    keys = ("model_type", "n_layer", "n_head", "d_model", "seq_len", "vocab_size", "tie_embeddings", "dtype")
    with h5py.File(path, "r") as f:
        return {key: f.attrs[key] for key in keys}


if np_ranks == 1:
    # export -> import -> export is the identity, and the import exports what was converted.
    first = os.path.join(work, "first.h5")
    exported = run([zerotrain, "checkpoint", "export", checkpoints, "--out", first])
    check(exported.returncode == 0, f"export exited {exported.returncode}: {exported.stderr}")
    again_dir = os.path.join(work, "again")
    reimported = run([zerotrain, "checkpoint", "import", first, "--config", write_config("again.json", 3), "--out",
                      again_dir, "--tag", "imported"])
    check(reimported.returncode == 0, f"re-import exited {reimported.returncode}: {reimported.stderr}")
    second = os.path.join(work, "second.h5")
    exported = run([zerotrain, "checkpoint", "export", again_dir, "--out", second])
    check(exported.returncode == 0, f"second export exited {exported.returncode}: {exported.stderr}")
    present = all(os.path.exists(path) for path in (first, second))
    a, b, w = (datasets(first), datasets(second), datasets(weights)) if present else ({}, {}, {})
    check(sorted(a) == sorted(b) == sorted(w), "the same tensors in the exports and the converted file")
    for name in a:
        check(a[name][0] == b[name][0] and a[name][1].tobytes() == b[name][1].tobytes(),
              f"export -> import -> export: {name} bitwise")
        check(a[name][1].tobytes() == w[name][1].tobytes(), f"import -> export: {name} bitwise the converted")
    check(model_attributes(first) == model_attributes(second), "the same model attributes in both exports")
    print(f"export -> import -> export: {len(a)} tensors bitwise equal")

    # Errors name what is wrong.
    other = json.loads(json.dumps(base))
    other["model"]["vocab_size"] = V + 8
    other_path = os.path.join(work, "other.json")
    json.dump(other, open(other_path, "w"))
    wrong = run([zerotrain, "checkpoint", "import", weights, "--config", other_path, "--out",
                 os.path.join(work, "wrong")])
    check(wrong.returncode == 1 and re.search(r"'wte\.weight' has shape \[%d, %d\], the model expects \[%d, %d\]"
                                              % (V, C, V + 8, C), wrong.stderr),
          f"a model of other shapes: exit {wrong.returncode}, {wrong.stderr.strip()}")
    raw = os.path.join(work, "raw.h5")
    zerotrain_torch.write_weights({k: v for k, v in hf.items() if "attn.bias" not in k and "masked" not in k},
                                  raw, {})
    unconverted = run([zerotrain, "checkpoint", "import", raw, "--config", write_config("raw.json", 0), "--out",
                       os.path.join(work, "raw")])
    check(unconverted.returncode == 1 and "missing tensors: " in unconverted.stderr and
          "unexpected tensors: " in unconverted.stderr and "Hugging Face" in unconverted.stderr,
          f"an unconverted Hugging Face file: exit {unconverted.returncode}, {unconverted.stderr.strip()}")
    misspelt = run([zerotrain, "train", "--config", write_config("misspelt.json", 0, {"form": weights}), "--data",
                    text, "--steps", "1"])
    check(misspelt.returncode != 0 and "init.form: unknown key; did you mean 'from'?" in misspelt.stderr,
          f"a misspelt init key: exit {misspelt.returncode}, {misspelt.stderr.strip()[-400:]}")

    # The doc's code is the script's.
    check_doc_quotes(source, script, "torch-to-zerotrain")

finish("PASS: import_torch")
