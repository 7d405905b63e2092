"""Shared by check_import_torch.py and check_freeze_torch.py: a random PyTorch GPT (bench/gpt_model.py)
shaped as a zerotrain config's model, and a text file of exactly one global batch of samples."""
import os
import sys

import torch

_source = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path[:0] = [os.path.join(_source, "scripts"), os.path.join(_source, "bench")]
import zerotrain_torch  # noqa: E402,F401
from gpt_model import Gpt  # noqa: E402


def random_gpt(model_section, seed=18):
    """GPT-2's initialization, then every tensor moved off it (LayerNorms and biases too), so that
    each one shapes the loss."""
    torch.manual_seed(seed)
    L, H, C, T, V = (model_section[k] for k in ("n_layer", "n_head", "d_model", "seq_len", "vocab_size"))
    model = Gpt(L, H, C, T, V)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            layer_norm = ".ln" in name or name.startswith("ln_f")
            parameter.add_(torch.randn_like(parameter) * (0.2 if layer_norm else 0.05))
    return model


def one_global_batch(source, path, samples, seq_len):
    """A text file of exactly `samples` samples of seq_len + 1 bytes (windows every seq_len): every
    global batch of that size holds each sample once, whatever the order. Returns (inputs, targets)."""
    with open(os.path.join(source, "docs", "engine.md"), "rb") as doc, open(path, "wb") as out:
        out.write(doc.read(samples * seq_len + 1))
    return zerotrain_torch.text_samples(path, seq_len)
