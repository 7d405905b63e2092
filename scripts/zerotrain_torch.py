#!/usr/bin/python3
"""A `zerotrain checkpoint export` in PyTorch: the GPT of bench/gpt_model.py with the exported
weights, and a Hugging Face-style GPT-2 state_dict (docs/checkpoint-format.md, "Export"); and the
way back: PyTorch weights as the file `zerotrain checkpoint import` and "init": {"from": ...} read
(docs/checkpoint-format.md, "Import").

    zerotrain_torch.py EXPORT.h5 [--hf-out DIR] [--loss-text FILE]
    zerotrain_torch.py convert SOURCE --out WEIGHTS.h5 [--untie]

--hf-out DIR writes DIR/pytorch_model.bin (the state_dict, GPT2LMHeadModel's names) and
DIR/config.json (GPT2Config's keys). --loss-text FILE prints the mean cross-entropy over every
sample of a text file (bytes as tokens, windows of seq_len + 1 tokens every seq_len, as
zerotrain's data loader cuts them) with the loaded model and with the Hugging Face layout.
convert: SOURCE is a Hugging Face GPT-2 checkpoint directory (config.json and pytorch_model.bin,
or model.safetensors when the safetensors package is there), or one file holding a state_dict
(torch.save: bench/gpt_model.py's names, or GPT2LMHeadModel's; a dict with "state_dict" or "model"
inside is unwrapped; DDP's "module." and torch.compile's "_orig_mod." prefixes are dropped).
GPT-2's names are mapped to zerotrain's, its Conv1D weights ([in, out]) transposed to Linear's
[out, in], the attention-mask buffers dropped, and lm_head.weight written only when it differs
from wte.weight (untied; --untie writes it anyway, for a config with tie_embeddings false). The
output is fp32 with the export's root attributes; the model section it needs is printed.
Needs h5py and torch (Debian: python3-h5py python3-torch). Installed with gpt_model.py next to it.
"""
import argparse
import json
import math
import os
import re
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


# --- docs/checkpoint-format.md: torch-to-zerotrain (begin) ---
GPT2_RENAMES = {"ln_1": "ln1", "ln_2": "ln2", "attn.c_attn": "attn.qkv", "attn.c_proj": "attn.proj",
                "mlp.c_fc": "mlp.fc", "mlp.c_proj": "mlp.proj"}


def zerotrain_state_dict(state_dict):
    """zerotrain's names (those of bench/gpt_model.py's Gpt) for a GPT-2 state_dict: GPT2LMHeadModel's
    (transformer.h.0.attn.c_attn.weight, ...; Conv1D weights [in, out] transposed) or the twin's own."""
    tensors = {}
    for name, tensor in state_dict.items():
        for prefix in ("module.", "_orig_mod."):  # DDP, torch.compile
            name = name[len(prefix):] if name.startswith(prefix) else name
        if name.endswith(".attn.bias") or name.endswith(".attn.masked_bias"):
            continue  # GPT-2's causal-mask buffers, not parameters
        hugging_face = name.startswith("transformer.")
        name = name[len("transformer."):] if hugging_face else name
        layer = re.fullmatch(r"h\.(\d+)\.(.+)\.(weight|bias)", name)
        if layer and layer.group(2) in GPT2_RENAMES:
            module = GPT2_RENAMES[layer.group(2)]
            if layer.group(3) == "weight" and not module.startswith("ln"):
                tensor = tensor.t()  # Conv1D keeps [in, out]
            name = f"h.{layer.group(1)}.{module}.{layer.group(3)}"
        tensors[name] = tensor.detach().to(torch.float32).contiguous()
    # GPT-2 ties lm_head to wte: one tensor in zerotrain (tie_embeddings true) unless they differ.
    if "lm_head.weight" in tensors and torch.equal(tensors["lm_head.weight"], tensors.get("wte.weight")):
        del tensors["lm_head.weight"]
    return tensors


def write_weights(tensors, path, attributes):
    """The layout of `zerotrain checkpoint export`: one fp32 dataset per tensor at the root, by name."""
    with h5py.File(path, "w") as f:
        for name, tensor in sorted(tensors.items()):
            f.create_dataset(name, data=tensor.numpy())
        for key, value in attributes.items():
            f.attrs[key] = value
# --- docs/checkpoint-format.md: torch-to-zerotrain (end) ---


def load_state_dict(source):
    """The state_dict in SOURCE (a Hugging Face directory or a file), and GPT2Config's keys if any."""
    hf_config = {}
    if os.path.isdir(source):
        if os.path.exists(os.path.join(source, "config.json")):
            hf_config = json.load(open(os.path.join(source, "config.json")))
        for candidate in ("model.safetensors", "pytorch_model.bin"):
            if os.path.exists(os.path.join(source, candidate)):
                source = os.path.join(source, candidate)
                break
        else:
            sys.exit(f"zerotrain_torch.py convert: {source} has neither pytorch_model.bin nor model.safetensors")
    if source.endswith(".safetensors"):
        try:
            from safetensors.torch import load_file
        except ImportError:
            sys.exit(f"zerotrain_torch.py convert: reading {source} needs the safetensors package")
        return load_file(source), hf_config
    try:
        loaded = torch.load(source, map_location="cpu", weights_only=True)
    except TypeError:  # torch before 1.13: no weights_only
        loaded = torch.load(source, map_location="cpu")
    for key in ("state_dict", "model"):
        if isinstance(loaded, dict) and isinstance(loaded.get(key), dict):
            loaded = loaded[key]
    if not isinstance(loaded, dict):
        sys.exit(f"zerotrain_torch.py convert: {source} holds a {type(loaded).__name__}, not a state_dict")
    return loaded, hf_config


def convert_main(argv):
    parser = argparse.ArgumentParser(prog="zerotrain_torch.py convert",
                                     description="PyTorch GPT-2 weights as a file zerotrain imports")
    parser.add_argument("source")
    parser.add_argument("--out", required=True, metavar="WEIGHTS.h5")
    parser.add_argument("--untie", action="store_true", help="write lm_head.weight even when tied to wte")
    args = parser.parse_args(argv)
    state_dict, hf_config = load_state_dict(args.source)
    tensors = zerotrain_state_dict(state_dict)
    tied = "lm_head.weight" not in tensors
    if args.untie and tied:
        tensors["lm_head.weight"] = tensors["wte.weight"].clone()
    missing = [n for n in ("wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias") if n not in tensors]
    if missing:
        sys.exit(f"zerotrain_torch.py convert: {args.source} is not a GPT-2 state_dict: no {', '.join(missing)}")
    vocab, d_model = tensors["wte.weight"].shape
    model = {"type": "gpt", "n_layer": len({n.split(".")[1] for n in tensors if n.startswith("h.")}),
             "n_head": int(hf_config.get("n_head", 0)) or "?", "d_model": int(d_model),
             "seq_len": int(tensors["wpe.weight"].shape[0]), "vocab_size": int(vocab),
             "tie_embeddings": tied and not args.untie}
    attributes = {"source": os.path.abspath(args.source), "model_type": "gpt", "dtype": "fp32",
                  "tie_embeddings": int(model["tie_embeddings"])}
    for key in ("n_layer", "d_model", "seq_len", "vocab_size"):
        attributes[key] = model[key]
    if model["n_head"] != "?":
        attributes["n_head"] = model["n_head"]
    write_weights(tensors, args.out, attributes)
    print(f"wrote {len(tensors)} tensors ({sum(t.numel() for t in tensors.values())} elements, fp32) to {args.out}")
    print('its "model" section: ' + json.dumps(model) + ("" if model["n_head"] != "?" else
          "  (n_head is not in the weights: take it from the model's config)"))


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
    if len(sys.argv) > 1 and sys.argv[1] == "convert":
        return convert_main(sys.argv[2:])
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
