#!/usr/bin/python3
"""A `zerotrain checkpoint export` loaded into PyTorch gives zerotrain's loss (docs/checkpoint-format.md).

    tests/cli/check_export_torch.py ZEROTRAIN CONFIG SOURCE_DIR WORK_DIR MPIEXEC [MPIEXEC_FLAGS...]

gpt-tiny (fp32, constant lr 5e-3 so that the weights move far from their initialization) trains 9
steps on 2 ranks on a text file of exactly one global batch of samples (16 x 64 + 1 bytes: every
global batch holds each sample once, in some order), saving after step 8. The loss zerotrain
reports for step 9 is the mean over those samples with the weights of step 8: the export of
global_step8, loaded by scripts/zerotrain_torch.py into bench/gpt_model.py's Gpt and
into the Hugging Face layout it writes, must give it within 1e-5 relative. Also: the export's model
attributes, every name mapped, the Hugging Face state_dict's names and Conv1D transposes, and
docs/checkpoint-format.md quoting the script's code verbatim. Exit 0 when everything holds ("PASS:
export_torch"), 1 otherwise, 77 (skipped) without torch or h5py.
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
    import torch

zerotrain, config_path, source, work = sys.argv[1:5]
mpiexec = sys.argv[5:]
script = os.path.join(source, "scripts", "zerotrain_torch.py")

shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
config = json.load(open(config_path))
model = config["model"]
config.pop("scheduler", None)
config["optimizer"]["params"]["lr"] = 5e-3
trained_config = os.path.join(work, "config.json")
json.dump(config, open(trained_config, "w"))
text = os.path.join(work, "batch.txt")
samples = config["train_batch_size"]
with open(os.path.join(source, "docs", "engine.md"), "rb") as doc, open(text, "wb") as out:
    out.write(doc.read(samples * model["seq_len"] + 1))

train = subprocess.run(mpiexec + ["-n", "2", zerotrain, "train", "--config", trained_config, "--data", text,
                                  "--steps", "9", "--save-dir", os.path.join(work, "ckpt"), "--save-interval", "8",
                                  "--metrics", os.path.join(work, "run.jsonl")],
                       capture_output=True, text=True, timeout=240)
print(train.stdout[-2000:], train.stderr[-2000:])
if train.returncode != 0:
    sys.exit(f"FAIL: train exited {train.returncode}")
steps = [json.loads(line) for line in open(os.path.join(work, "run.jsonl"))]
zerotrain_loss = [r for r in steps if r["event"] == "step" and r["step"] == 9][0]["loss"]
# Trained, not near-uniform predictions (ln 256 = 5.55), so every weight shapes the loss.
check(zerotrain_loss < 4.5, f"step 9's loss {zerotrain_loss} is below 4.5: the weights have trained")

export = os.path.join(work, "weights.h5")
exported = subprocess.run([zerotrain, "checkpoint", "export", os.path.join(work, "ckpt"), "--tag", "global_step8",
                           "--out", export], capture_output=True, text=True, timeout=120)
check(exported.returncode == 0, f"export exited {exported.returncode}: {exported.stderr}")

with h5py.File(export, "r") as f:
    attributes = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
    names = sorted(f.keys())
for key in ("n_layer", "n_head", "d_model", "seq_len", "vocab_size"):
    check(int(attributes.get(key, -1)) == model[key], f"attribute {key} = {attributes.get(key)}, config {model[key]}")
check(int(attributes["n_embd"]) == model["d_model"] and int(attributes["n_positions"]) == model["seq_len"],
      "GPT-2's names n_embd and n_positions")
check(attributes["model_type"] == "gpt" and int(attributes["tie_embeddings"]) == 1, "model_type, tie_embeddings")
check(float(attributes["layer_norm_epsilon"]) == 1e-5 and attributes["activation_function"] == "gelu_new",
      "layer norm epsilon, activation")
check(json.loads(attributes["config"])["model"]["n_layer"] == model["n_layer"], "the whole config as JSON")
check(len(names) == 4 + 12 * model["n_layer"], f"{len(names)} exported tensors")

hf_dir = os.path.join(work, "hf")
run = subprocess.run([sys.executable, script, export, "--hf-out", hf_dir, "--loss-text", text],
                     capture_output=True, text=True, timeout=300)
print(run.stdout, run.stderr[-2000:])
check(run.returncode == 0, f"zerotrain_torch.py exited {run.returncode}")
match = re.search(r"loss over (\d+) samples: gpt_model (\S+) hugging_face_layout (\S+)", run.stdout)
check(match is not None, "the script printed the losses")
if match:
    check(int(match.group(1)) == samples, f"{match.group(1)} samples, one global batch of {samples}")
    for label, loss in (("gpt_model", float(match.group(2))), ("Hugging Face layout", float(match.group(3)))):
        relative = abs(loss - zerotrain_loss) / abs(zerotrain_loss)
        print(f"{label}: loss {loss:.9g}, zerotrain {zerotrain_loss:.9g}, relative difference {relative:.2e}")
        check(relative <= 1e-5, f"{label} loss {loss} vs zerotrain {zerotrain_loss}: {relative:.2e} > 1e-5")

hf = torch.load(os.path.join(hf_dir, "pytorch_model.bin"))
C = model["d_model"]
check(len(hf) == len(names) + 1, f"{len(hf)} Hugging Face tensors (the export's and lm_head.weight)")
check(tuple(hf["transformer.h.0.attn.c_attn.weight"].shape) == (C, 3 * C), "c_attn is Conv1D [in, out]")
check(tuple(hf["transformer.h.0.mlp.c_fc.weight"].shape) == (C, 4 * C), "c_fc is Conv1D [in, out]")
with h5py.File(export, "r") as f:
    check(torch.equal(hf["transformer.h.1.mlp.c_proj.weight"], torch.from_numpy(f["h.1.mlp.proj.weight"][()]).t()),
          "c_proj = mlp.proj.weight transposed")
hf_config = json.load(open(os.path.join(hf_dir, "config.json")))
check(hf_config["n_embd"] == C and hf_config["n_layer"] == model["n_layer"] and hf_config["model_type"] == "gpt2",
      f"config.json: {hf_config}")

# The doc's code is the script's.
check_doc_quotes(source, script, "export-to-torch")

finish("PASS: export_torch")
