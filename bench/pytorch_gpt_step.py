#!/usr/bin/python3
"""The anchor of zt_bench_gpt_step: the same GPT-2 training step in PyTorch on the CPU.

Same model as zerotrain's nn::Gpt (bench/gpt_model.py, shared with bench/pytorch_ddp_gpt.py): learned
positions, pre-LayerNorm blocks (eps 1e-5), fused qkv Linear(C, 3C), causal softmax attention, tanh GELU,
tied lm_head, no dropout, fp32. Same optimizer: AdamW lr 6e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on every
parameter, no clipping, no scheduler. Same fixed batch (the LCG of bench_gpt_step.cpp). Times
`warmup` untimed then `steps` timed steps of forward + cross-entropy + backward + optimizer.step()
+ zero_grad(), and prints median and best ms/step and tokens/s, as JSON.

    /usr/bin/python3 bench/pytorch_gpt_step.py --shape small|gpt2|both --threads N [--steps N]
        [--warmup N] [--json PATH]

Thread count: torch.set_num_threads(N) for ATen's OpenMP, and OPENBLAS_NUM_THREADS=N (set here
before torch loads, unless already set) for Debian's pthread OpenBLAS, which PyTorch's GEMMs use.
Needs python3-torch (Debian 12: torch 1.13, CPU).
"""
import argparse
import json
import os
import statistics
import sys
import time

SHAPES = {
    # name: (n_layer, n_head, d_model, seq_len, vocab, micro_batch, default_steps, default_warmup)
    "small": (4, 4, 128, 64, 512, 4, 20, 3),
    "gpt2": (12, 12, 768, 1024, 50257, 1, 3, 2),
}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=["small", "gpt2", "both"], default="both")
    parser.add_argument("--steps", type=int)
    parser.add_argument("--warmup", type=int)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--json")
    return parser.parse_args()


ARGS = parse_args()
os.environ.setdefault("OPENBLAS_NUM_THREADS", str(ARGS.threads))
os.environ.setdefault("OMP_NUM_THREADS", str(ARGS.threads))

import torch  # noqa: E402  (after the thread environment)
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_model import Gpt, adamw  # noqa: E402  (the model, shared with bench/pytorch_ddp_gpt.py)


def fixed_batch(micro_batch, seq_len, vocab):
    """The LCG stream of bench_gpt_step.cpp: inputs and next-token targets."""
    state, stream = 12345, []
    for _ in range(micro_batch * seq_len + 1):
        state = (state * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        stream.append((state >> 33) % vocab)
    data = torch.tensor(stream, dtype=torch.long)
    return data[:-1].view(micro_batch, seq_len), data[1:].view(micro_batch, seq_len)


def run_shape(name, threads, steps, warmup):
    n_layer, n_head, d_model, seq_len, vocab, micro_batch, default_steps, default_warmup = SHAPES[name]
    steps = default_steps if steps is None else steps
    warmup = default_warmup if warmup is None else warmup
    torch.manual_seed(1234)
    model = Gpt(n_layer, n_head, d_model, seq_len, vocab)
    model.train()
    optimizer = adamw(model)
    inputs, targets = fixed_batch(micro_batch, seq_len, vocab)

    def one_step():
        logits = model(inputs)
        loss = F.cross_entropy(logits.view(-1, vocab), targets.view(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    first_loss = last_loss = float("nan")
    for i in range(warmup):
        loss = one_step()
        if i == 0:
            first_loss = loss
    step_ms = []
    for i in range(steps):
        start = time.perf_counter()
        last_loss = one_step()
        step_ms.append((time.perf_counter() - start) * 1000.0)
        if warmup == 0 and i == 0:
            first_loss = last_loss
    median_ms = statistics.median(step_ms)
    tokens = micro_batch * seq_len
    return {"framework": "pytorch", "torch": torch.__version__, "shape": name, "threads": threads,
            "parameters": sum(p.numel() for p in model.parameters()), "tokens_per_step": tokens,
            "steps": steps, "warmup": warmup, "median_ms": median_ms, "best_ms": min(step_ms),
            "tokens_per_s": tokens / (median_ms / 1000.0), "first_loss": first_loss, "last_loss": last_loss,
            "step_ms": step_ms}


def main():
    torch.set_num_threads(ARGS.threads)
    torch.set_grad_enabled(True)
    shapes = ["small", "gpt2"] if ARGS.shape == "both" else [ARGS.shape]
    results = []
    for name in shapes:
        r = run_shape(name, ARGS.threads, ARGS.steps, ARGS.warmup)
        print(f"pytorch   {r['shape']:5s} threads {r['threads']}  params {r['parameters']}  tokens/step "
              f"{r['tokens_per_step']}  steps {r['steps']} (warmup {r['warmup']})  median {r['median_ms']:.2f} ms  "
              f"best {r['best_ms']:.2f} ms  {r['tokens_per_s']:.0f} tokens/s  loss {r['first_loss']:.4f} -> "
              f"{r['last_loss']:.4f}", flush=True)
        results.append(r)
    if ARGS.json:
        with open(ARGS.json, "w") as out:
            json.dump(results, out, indent=2)
            out.write("\n")
    else:
        json.dump(results, sys.stdout)
        print()


if __name__ == "__main__":
    main()
