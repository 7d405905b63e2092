#!/usr/bin/python3
"""Compare zerotrain's GPT-2 with the same model written in PyTorch, in fp64.

unit_nn's test GptReference.DumpForPyTorch writes a small GPT's weights, a batch, the loss, the
logits and every parameter gradient; this script rebuilds GPT-2 (pre-LayerNorm blocks, tanh GELU,
causal attention, learned positions, tied or untied head) with PyTorch autograd on the same weights
and compares. Usage:

    tests/python/gpt_reference.py build/bin/unit_nn            # tied and untied embeddings

Needs python3-torch (Debian: apt-get install python3-torch). Exit status 0 when everything matches
to 1e-10 relative.
"""
import math
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

TOLERANCE = 1e-10
TORCH_DTYPES = {"fp64": torch.float64, "fp32": torch.float32, "int32": torch.int32}


def load_dump(directory):
    tensors = {"input": {}, "output": {}, "param": {}, "grad": {}}
    with open(os.path.join(directory, "manifest.txt")) as manifest:
        for line in manifest:
            fields = line.split()
            if fields[0] == "config":
                n_layer, n_head, d_model, seq_len, vocab, tied = map(int, fields[1:])
                config = dict(n_layer=n_layer, n_head=n_head, d_model=d_model, seq_len=seq_len, vocab=vocab,
                              tied=bool(tied))
            elif fields[0] == "loss":
                loss = float(fields[1])
            else:
                kind, name, dtype, file = fields[:4]
                shape = [int(x) for x in fields[4:]]
                with open(os.path.join(directory, file), "rb") as raw:
                    data = bytearray(raw.read())
                tensors[kind][name] = torch.frombuffer(data, dtype=TORCH_DTYPES[dtype]).reshape(shape).clone()
    return config, loss, tensors


def gpt_forward(config, p, tokens):
    B, T = tokens.shape
    C, H = config["d_model"], config["n_head"]
    x = p["wte.weight"][tokens.long()] + p["wpe.weight"][:T]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for layer in range(config["n_layer"]):
        prefix = f"h.{layer}."
        h = F.layer_norm(x, (C,), p[prefix + "ln1.weight"], p[prefix + "ln1.bias"], eps=1e-5)
        qkv = h @ p[prefix + "attn.qkv.weight"].T + p[prefix + "attn.qkv.bias"]
        q, k, v = qkv.split(C, dim=2)
        q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(C // H)
        scores = scores.masked_fill(~mask, float("-inf"))
        y = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ p[prefix + "attn.proj.weight"].T + p[prefix + "attn.proj.bias"]
        h = F.layer_norm(x, (C,), p[prefix + "ln2.weight"], p[prefix + "ln2.bias"], eps=1e-5)
        h = F.gelu(h @ p[prefix + "mlp.fc.weight"].T + p[prefix + "mlp.fc.bias"], approximate="tanh")
        x = x + h @ p[prefix + "mlp.proj.weight"].T + p[prefix + "mlp.proj.bias"]
    x = F.layer_norm(x, (C,), p["ln_f.weight"], p["ln_f.bias"], eps=1e-5)
    head = p["wte.weight"] if config["tied"] else p["lm_head.weight"]
    return x @ head.T


def relative_error(ours, reference):
    scale = reference.abs().max().item()
    return (ours - reference).abs().max().item() / (scale if scale > 0 else 1.0)


def compare(unit_nn, untied):
    with tempfile.TemporaryDirectory() as directory:
        environment = dict(os.environ, ZT_GPT_DUMP_DIR=directory)
        if untied:
            environment["ZT_GPT_DUMP_UNTIED"] = "1"
        subprocess.run([unit_nn, "--gtest_filter=GptReference.DumpForPyTorch"], env=environment, check=True,
                       stdout=subprocess.DEVNULL)
        config, our_loss, tensors = load_dump(directory)
    params = {name: value.clone().requires_grad_(True) for name, value in tensors["param"].items()}
    logits = gpt_forward(config, params, tensors["input"]["tokens"])
    loss = F.cross_entropy(logits.view(-1, config["vocab"]), tensors["input"]["targets"].view(-1).long(),
                           ignore_index=-100)
    loss.backward()
    label = "untied" if untied else "tied"
    failures = []
    checks = [("loss", abs(our_loss - loss.item()) / abs(loss.item())),
              ("logits", relative_error(tensors["output"]["logits"], logits.detach()))]
    checks += [(f"grad {name}", relative_error(tensors["grad"][name], params[name].grad)) for name in params]
    for what, error in checks:
        status = "ok" if error <= TOLERANCE else "MISMATCH"
        if error > TOLERANCE:
            failures.append(what)
        print(f"{label:7s} {what:28s} relative error {error:.2e}  {status}")
    print(f"{label}: loss zerotrain {our_loss:.15f}  pytorch {loss.item():.15f}")
    return failures


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    torch.set_default_dtype(torch.float64)
    failures = compare(sys.argv[1], untied=False) + compare(sys.argv[1], untied=True)
    if failures:
        print("FAILED:", ", ".join(failures))
        sys.exit(1)
    print(f"zerotrain GPT matches PyTorch (fp64, relative error <= {TOLERANCE:g})")


if __name__ == "__main__":
    main()
