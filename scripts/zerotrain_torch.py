#!/usr/bin/python3
"""A `zerotrain checkpoint export` in PyTorch: the GPT of bench/gpt_model.py with the exported
weights, and a Hugging Face-style GPT-2 state_dict (docs/checkpoint-format.md, "Export").

    zerotrain_torch.py EXPORT.h5 [--hf-out DIR] [--loss-text FILE]

--hf-out DIR writes DIR/pytorch_model.bin (the state_dict, GPT2LMHeadModel's names) and
DIR/config.json (GPT2Config's keys). --loss-text FILE prints the mean cross-entropy over every
sample of a text file (bytes as tokens, windows of seq_len + 1 tokens every seq_len, as
zerotrain's data loader cuts them) with the loaded model and with the Hugging Face layout.
Needs h5py and torch (Debian: python3-h5py python3-torch). Installed with gpt_model.py next to it.
"""
import argparse
import json
import math
import os
import sys

import h5py
import numpy as np
import torch
import torch.nn.functional as F

# gpt_model.py: installed next to this script; in the source tree it is bench/gpt_model.py.
_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [_here, os.path.join(_here, "..", "bench")]
from gpt_model import Gpt  # noqa: E402


# --- docs/checkpoint-format.md: export-to-torch (begin) ---
def read_export(path):
    """The model config (the root attributes) and every tensor, as float32, by zerotrain's names."""
    with h5py.File(path, "r") as f:
        config = {key: (value.decode() if isinstance(value, bytes) else value) for key, value in f.attrs.items()}
        tensors = {}
        for name, dataset in f.items():
            values = dataset[()]
            if dataset.attrs.get("dtype") in (b"bf16", "bf16"):  # bfloat16 bits: widen by a shift
                values = (values.astype(np.uint32) << 16).view(np.float32)
            tensors[name] = torch.from_numpy(np.asarray(values, dtype=np.float32))
    return config, tensors


def gpt_from_export(path):
    """bench/gpt_model.py's Gpt built from the export's attributes, every parameter loaded."""
    config, tensors = read_export(path)
    assert config["model_type"] == "gpt", f"{path}: not a GPT ({config['model_type']})"
    model = Gpt(int(config["n_layer"]), int(config["n_head"]), int(config["d_model"]), int(config["seq_len"]),
                int(config["vocab_size"]), tie_embeddings=bool(config["tie_embeddings"]))
    model.load_state_dict(tensors, strict=True)  # every exported name is a parameter, and back
    return model.eval(), config


def hugging_face_state_dict(tensors, config):
    """GPT2LMHeadModel's names; its Conv1D layers keep weights as [in, out], so Linear's transpose."""
    hf = {"transformer.wte.weight": tensors["wte.weight"], "transformer.wpe.weight": tensors["wpe.weight"],
          "transformer.ln_f.weight": tensors["ln_f.weight"], "transformer.ln_f.bias": tensors["ln_f.bias"]}
    renames = {"ln1": "ln_1", "ln2": "ln_2", "attn.qkv": "attn.c_attn", "attn.proj": "attn.c_proj",
               "mlp.fc": "mlp.c_fc", "mlp.proj": "mlp.c_proj"}
    for layer in range(int(config["n_layer"])):
        for ours, theirs in renames.items():
            weight, bias = tensors[f"h.{layer}.{ours}.weight"], tensors[f"h.{layer}.{ours}.bias"]
            conv1d = not ours.startswith("ln")
            hf[f"transformer.h.{layer}.{theirs}.weight"] = weight.t().contiguous() if conv1d else weight
            hf[f"transformer.h.{layer}.{theirs}.bias"] = bias
    hf["lm_head.weight"] = tensors["wte.weight"] if config["tie_embeddings"] else tensors["lm_head.weight"]
    return hf


def hugging_face_config(config):
    """GPT2Config's keys (config.json) for the same model."""
    return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": int(config["n_layer"]),
            "n_head": int(config["n_head"]), "n_embd": int(config["n_embd"]),
            "n_positions": int(config["n_positions"]), "n_ctx": int(config["n_positions"]),
            "vocab_size": int(config["vocab_size"]), "layer_norm_epsilon": float(config["layer_norm_epsilon"]),
            "activation_function": config["activation_function"], "resid_pdrop": float(config["dropout"]),
            "embd_pdrop": float(config["dropout"]), "attn_pdrop": float(config["dropout"]),
            "tie_word_embeddings": bool(config["tie_embeddings"])}
# --- docs/checkpoint-format.md: export-to-torch (end) ---


def hugging_face_logits(hf, config, tokens):
    """GPT-2's forward written over the Hugging Face names (Conv1D: x @ weight + bias), to check them."""
    n_head, eps = int(config["n_head"]), float(config["layer_norm_epsilon"])
    B, T = tokens.shape
    x = hf["transformer.wte.weight"][tokens] + hf["transformer.wpe.weight"][:T]
    C = x.shape[-1]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for layer in range(int(config["n_layer"])):
        p = lambda name: hf[f"transformer.h.{layer}.{name}"]  # noqa: E731
        h = F.layer_norm(x, (C,), p("ln_1.weight"), p("ln_1.bias"), eps=eps)
        q, k, v = (h @ p("attn.c_attn.weight") + p("attn.c_attn.bias")).split(C, dim=2)
        q, k, v = (t.view(B, T, n_head, C // n_head).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(C // n_head)
        y = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v
        x = x + y.transpose(1, 2).reshape(B, T, C) @ p("attn.c_proj.weight") + p("attn.c_proj.bias")
        h = F.layer_norm(x, (C,), p("ln_2.weight"), p("ln_2.bias"), eps=eps)
        h = F.gelu(h @ p("mlp.c_fc.weight") + p("mlp.c_fc.bias"), approximate="tanh")
        x = x + h @ p("mlp.c_proj.weight") + p("mlp.c_proj.bias")
    x = F.layer_norm(x, (C,), hf["transformer.ln_f.weight"], hf["transformer.ln_f.bias"], eps=eps)
    return x @ hf["lm_head.weight"].t()


def text_samples(path, seq_len):
    """Every sample of a text file as zerotrain cuts them: window i = tokens [i T, i T + T + 1)."""
    tokens = torch.tensor(list(open(path, "rb").read()), dtype=torch.long)
    count = (len(tokens) - 1) // seq_len
    windows = torch.stack([tokens[i * seq_len:i * seq_len + seq_len + 1] for i in range(count)])
    return windows[:, :-1], windows[:, 1:]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("export")
    parser.add_argument("--hf-out", metavar="DIR")
    parser.add_argument("--loss-text", metavar="FILE")
    args = parser.parse_args()
    model, config = gpt_from_export(args.export)
    _, tensors = read_export(args.export)
    print(f"loaded {len(tensors)} tensors into bench/gpt_model.py's Gpt: n_layer {config['n_layer']}, "
          f"n_head {config['n_head']}, d_model {config['d_model']}, seq_len {config['seq_len']}, "
          f"vocab_size {config['vocab_size']}, tied {bool(config['tie_embeddings'])}")
    hf = hugging_face_state_dict(tensors, config)
    if args.hf_out:
        os.makedirs(args.hf_out, exist_ok=True)
        torch.save(hf, os.path.join(args.hf_out, "pytorch_model.bin"))
        with open(os.path.join(args.hf_out, "config.json"), "w") as out:
            json.dump(hugging_face_config(config), out, indent=2)
        print(f"wrote {len(hf)} tensors (Hugging Face GPT-2 names) and config.json to {args.hf_out}")
    if args.loss_text:
        inputs, targets = text_samples(args.loss_text, int(config["seq_len"]))
        vocab = int(config["vocab_size"])
        with torch.no_grad():
            loss = F.cross_entropy(model(inputs).reshape(-1, vocab), targets.reshape(-1)).item()
            hf_loss = F.cross_entropy(hugging_face_logits(hf, config, inputs).reshape(-1, vocab),
                                      targets.reshape(-1)).item()
        print(f"loss over {len(inputs)} samples: gpt_model {loss:.9g} hugging_face_layout {hf_loss:.9g}")


if __name__ == "__main__":
    main()
