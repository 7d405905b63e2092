#!/usr/bin/python3
"""The anchor of bench/run_zero_vs_ddp.sh: the GPT of bench/gpt_model.py trained with PyTorch
DistributedDataParallel over gloo, one process per rank, launched by mpirun.

    mpirun -n N /usr/bin/python3 bench/pytorch_ddp_gpt.py --data TOKENS.bin --n-layer 4 --n-head 4
        --d-model 128 --seq-len 64 --vocab 512 --micro-batch 4 [--steps 20] [--warmup 3]
        [--bucket-mb 1] [--comm-pairs 8] [--allreduce-reps 10] [--threads 1] [--json PATH]

Rank and size come from OMPI_COMM_WORLD_RANK/SIZE (or RANK/WORLD_SIZE); the rendezvous is
tcp://MASTER_ADDR:MASTER_PORT (default 127.0.0.1:29511). Everything that zerotrain's side of the
comparison does, the same way: fp32, AdamW lr 6e-4 betas (0.9, 0.95) eps 1e-8 weight decay 0.1 on every
parameter, no clipping, no scheduler; global batch = micro-batch x ranks, no accumulation; the data is
the zerotrain token file given with --data, read in zerotrain's documented sample order (seed 1234,
bench/zt_tokens.py), so rank r reads the samples zerotrain's rank r reads. Like zerotrain's trainer,
every step ends with a 16-byte all-reduce of the loss (the reported loss is the mean over ranks).

Three phases, in one process:
  A. `warmup` untimed, then `steps` timed DDP steps (forward, cross-entropy, backward with DDP's
     bucketed all-reduce, optimizer.step(), zero_grad(set_to_none=True), loss all-reduce): step time
     and tokens/s, the main numbers. Rank 0's wall time per step (the gradient all-reduce
     synchronizes the ranks every step).
  B. `comm_pairs` rounds of three steps, rotating: DDP as in A; without gradient communication
     (model.no_sync()); and "blocking" (no_sync, then the same buckets as DDP's all-reduced after
     backward, as zerotrain does with overlap_comm false). Exposed communication = median(DDP) -
     median(no communication): the step time DDP's all-reduce adds (waiting, including for the slower
     rank, plus CPU the gloo threads take from the computation); full communication = median(blocking)
     - median(no communication); DDP's overlap = 1 - exposed / full, zerotrain's definition (its
     comm_wait_s with overlap_comm true over the same with false). Phase B continues from A's weights;
     no_sync steps let the replicas drift, which does not change the time of a step.
  C. `allreduce_reps` times the same bucketed all-reduce alone, after a barrier (no skew, no
     computation): the bare transfer time.

Memory: VmHWM (peak RSS) of every rank at the end, and VmRSS after `import torch` and the process
group (before the model): the interpreter and libraries' share. Model state in bytes: parameters,
gradients, Adam moments, DDP's bucket buffers (DDP copies gradients into them: 4 bytes per parameter).

Rank 0 prints one summary line and writes JSON (--json). Needs python3-torch (Debian 12: 1.13).
"""
import argparse
import json
import os
import statistics
import sys
import time


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="zerotrain token file (bench/zt_tokens.py writes one)")
    parser.add_argument("--n-layer", type=int, required=True)
    parser.add_argument("--n-head", type=int, required=True)
    parser.add_argument("--d-model", type=int, required=True)
    parser.add_argument("--seq-len", type=int, required=True)
    parser.add_argument("--vocab", type=int, required=True)
    parser.add_argument("--micro-batch", type=int, required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket_cap_mb (DDP's default 25)")
    parser.add_argument("--comm-pairs", type=int, default=8, help="rounds of phase B")
    parser.add_argument("--allreduce-reps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1234, help="data order seed (zerotrain's top-level seed)")
    parser.add_argument("--json")
    return parser.parse_args()


ARGS = parse_args()
os.environ.setdefault("OPENBLAS_NUM_THREADS", str(ARGS.threads))
os.environ.setdefault("OMP_NUM_THREADS", str(ARGS.threads))

import torch  # noqa: E402  (after the thread environment)
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_model import Gpt, adamw  # noqa: E402
from zt_tokens import Sampler, read_token_file  # noqa: E402


def proc_status_kib(field):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def env_int(*names, default=None):
    for name in names:
        if name in os.environ:
            return int(os.environ[name])
    if default is None:
        raise SystemExit(f"none of {names} set: launch under mpirun (or set RANK and WORLD_SIZE)")
    return default


def main():
    torch.set_num_threads(ARGS.threads)
    rank = env_int("OMPI_COMM_WORLD_RANK", "PMI_RANK", "RANK")
    world = env_int("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "WORLD_SIZE")
    address = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = os.environ.get("MASTER_PORT", "29511")
    dist.init_process_group("gloo", init_method=f"tcp://{address}:{port}", rank=rank, world_size=world)
    baseline_rss_kib = proc_status_kib("VmRSS")

    tokens, file_vocab = read_token_file(ARGS.data)
    if file_vocab > ARGS.vocab:
        raise SystemExit(f"{ARGS.data}: vocab {file_vocab} > model vocab {ARGS.vocab}")
    sampler = Sampler(tokens, ARGS.seq_len, ARGS.seed, ARGS.micro_batch, world, rank)

    torch.manual_seed(1234)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    model = Gpt(ARGS.n_layer, ARGS.n_head, ARGS.d_model, ARGS.seq_len, ARGS.vocab)
    model.train()
    # The causal masks are constant bool buffers, which gloo cannot broadcast: keep them out of DDP's syncs.
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
        model, [name for name, _ in model.named_buffers() if name.endswith(".mask")])
    ddp = DistributedDataParallel(model, bucket_cap_mb=ARGS.bucket_mb)
    optimizer = adamw(ddp)
    parameters = sum(p.numel() for p in model.parameters())
    batch_index = [0]

    ordered = list(reversed(list(model.parameters())))  # gradients become ready roughly in this order
    bucket_groups, group, group_bytes = [], [], 0
    limit = 1024 * 1024  # DDP's first bucket: 1 MiB (dist._DEFAULT_FIRST_BUCKET_BYTES), then bucket_cap_mb
    for p in ordered:
        group.append(p)
        group_bytes += p.numel() * 4
        if group_bytes >= limit:
            bucket_groups.append(group)
            group, group_bytes = [], 0
            limit = int(ARGS.bucket_mb * 1024 * 1024)
    if group:
        bucket_groups.append(group)

    # Persistent flat buffers, as DDP's own buckets are: fresh 8 MiB tensors every step would be fresh
    # mmap'ed pages (PyTorch's CPU allocator does not cache), and page faults cost tens of microseconds
    # each in this VM (see "The cliff" above in docs/benchmarks.md) -- that is not communication.
    blocking_flats = [torch.empty(sum(p.numel() for p in g)) for g in bucket_groups]

    def blocking_all_reduce():
        """What DDP does without overlap: after backward, all buckets all-reduced (mean), then copied back."""
        for g, flat in zip(bucket_groups, blocking_flats):
            offset = 0
            for p in g:
                flat[offset:offset + p.numel()].copy_(p.grad.reshape(-1))
                offset += p.numel()
        works = [dist.all_reduce(f, async_op=True) for f in blocking_flats]
        for w in works:
            w.wait()
        for g, flat in zip(bucket_groups, blocking_flats):
            flat.div_(world)
            offset = 0
            for p in g:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
                offset += p.numel()

    def one_step(mode="ddp"):
        """mode: "ddp" (DDP's overlapped all-reduce), "none" (no_sync: no gradient communication),
        "blocking" (no_sync, then the same buckets all-reduced after backward)."""
        inputs, targets = sampler.batch(batch_index[0])
        batch_index[0] += 1
        inputs = torch.from_numpy(inputs)
        targets = torch.from_numpy(targets)
        logits = ddp(inputs)
        loss = F.cross_entropy(logits.view(-1, ARGS.vocab), targets.reshape(-1))
        if mode == "ddp":
            loss.backward()
        else:
            with ddp.no_sync():
                loss.backward()
            if mode == "blocking":
                blocking_all_reduce()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        reported = torch.tensor([loss.item(), 1.0], dtype=torch.float64)
        dist.all_reduce(reported)
        return float(reported[0] / reported[1])

    def timed(mode="ddp"):
        start = time.perf_counter()
        loss = one_step(mode)
        return (time.perf_counter() - start) * 1000.0, loss

    # A: warm-up, then the timed DDP steps.
    first_loss = float("nan")
    for i in range(ARGS.warmup):
        loss = one_step()
        if i == 0:
            first_loss = loss
    step_ms = []
    last_loss = float("nan")
    for i in range(ARGS.steps):
        ms, last_loss = timed()
        step_ms.append(ms)
        if ARGS.warmup == 0 and i == 0:
            first_loss = last_loss

    # B: DDP, no communication, and blocking communication, rotating.
    mode_ms = {"ddp": [], "none": [], "blocking": []}
    modes = list(mode_ms)
    for i in range(ARGS.comm_pairs):
        for j in range(len(modes)):
            mode = modes[(i + j) % len(modes)]
            ms, _ = timed(mode)
            mode_ms[mode].append(ms)

    # C: the gradient all-reduce alone (after a barrier), the same buckets.
    flats = [torch.ones(sum(p.numel() for p in g)) for g in bucket_groups]
    allreduce_ms = []
    for _ in range(ARGS.allreduce_reps + 1):
        dist.barrier()
        start = time.perf_counter()
        works = [dist.all_reduce(f, async_op=True) for f in flats]
        for w in works:
            w.wait()
        allreduce_ms.append((time.perf_counter() - start) * 1000.0)
    allreduce_ms = allreduce_ms[1:]

    peak_rss_kib = torch.tensor([proc_status_kib("VmHWM")], dtype=torch.int64)
    gathered = [torch.zeros_like(peak_rss_kib) for _ in range(world)]
    dist.all_gather(gathered, peak_rss_kib)
    base = torch.tensor([baseline_rss_kib], dtype=torch.int64)
    dist.all_reduce(base, op=dist.ReduceOp.MAX)

    if rank == 0:
        median_ms = statistics.median(step_ms)
        tokens = ARGS.micro_batch * world * ARGS.seq_len
        ddp_ms, none_ms, blocking_ms = (statistics.median(mode_ms[m]) for m in ("ddp", "none", "blocking"))
        exposed_ms = ddp_ms - none_ms
        full_ms = blocking_ms - none_ms
        alone_ms = statistics.median(allreduce_ms)
        result = {
            "framework": "pytorch-ddp", "torch": torch.__version__, "backend": "gloo", "world_size": world,
            "threads": ARGS.threads, "parameters": parameters, "n_layer": ARGS.n_layer, "n_head": ARGS.n_head,
            "d_model": ARGS.d_model, "seq_len": ARGS.seq_len, "vocab": ARGS.vocab,
            "micro_batch": ARGS.micro_batch, "global_batch": ARGS.micro_batch * world,
            "tokens_per_step": tokens, "bucket_mb": ARGS.bucket_mb, "buckets": len(bucket_groups),
            "steps": ARGS.steps, "warmup": ARGS.warmup, "median_ms": median_ms, "best_ms": min(step_ms),
            "tokens_per_s": tokens / (median_ms / 1000.0), "first_loss": first_loss, "last_loss": last_loss,
            "step_ms": step_ms, "ddp_ms": mode_ms["ddp"], "no_comm_ms": mode_ms["none"],
            "blocking_ms": mode_ms["blocking"], "blocking_buffers": "persistent",
            "exposed_comm_ms": exposed_ms, "blocking_comm_ms": full_ms,
            "allreduce_alone_ms": alone_ms, "allreduce_ms": allreduce_ms,
            "exposed_fraction": exposed_ms / median_ms,
            "overlap": 1.0 - exposed_ms / full_ms if full_ms > 0 else None,
            "peak_rss_bytes_per_rank": [int(x.item()) * 1024 for x in gathered],
            "baseline_rss_bytes": int(base.item()) * 1024,
            "model_state_bytes": parameters * (4 + 4 + 8 + 4),
        }
        print(f"ddp  ranks {world}  params {parameters}  tokens/step {tokens}  median {median_ms:.1f} ms  "
              f"{result['tokens_per_s']:.0f} tokens/s  loss {first_loss:.4f} -> {last_loss:.4f}  "
              f"exposed comm {exposed_ms:.1f} ms, blocking comm {full_ms:.1f} ms (step: ddp {ddp_ms:.1f}, "
              f"no comm {none_ms:.1f}, blocking {blocking_ms:.1f})  all-reduce alone {alone_ms:.1f} ms in "
              f"{len(bucket_groups)} buckets  peak RSS {max(result['peak_rss_bytes_per_rank']) / 2**20:.0f} MiB "
              f"(base {result['baseline_rss_bytes'] / 2**20:.0f} MiB)", flush=True)
        if ARGS.json:
            with open(ARGS.json, "w") as out:
                json.dump(result, out, indent=2)
                out.write("\n")
    dist.barrier()
    # No destroy_process_group(): with torch 1.13's gloo a rank could spin at full CPU in it once rank 0
    # (which hosts the rendezvous store) had exited. Everything is written; leave without teardown.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
