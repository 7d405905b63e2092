#!/bin/bash
# zerotrain's ZeRO stages 0-3 (overlap_comm on and off) against PyTorch DDP (gloo), same GPT, same data,
# same batch, interleaved in rounds, at 2 and 4 MPI ranks.
#
#   bench/run_zero_vs_ddp.sh [--bin DIR] [--ranks "2 4"] [--shapes "small medium"] [--stages "0 1 2 3"]
#                            [--rounds R] [--first-round K] [--out DIR] [--summary-only]
#
# Shapes (GPT-2 layout of bench/gpt_model.py, fp32; micro-batch per rank, global batch = micro x ranks):
#   small:  4 layers, 4 heads, d_model 128, seq 64,  vocab 512,  micro 4, buckets 1 MiB, 23 steps (3 warm-up)
#   medium: 6 layers, 6 heads, d_model 384, seq 256, vocab 8192, micro 1, buckets 8 MiB, 8 steps (2 warm-up)
# Per round, for each rank count and shape: PyTorch DDP (bench/pytorch_ddp_gpt.py) and zerotrain train
# for every stage with overlap_comm true and false, each a fresh mpirun, the order reversed every other
# round, so that all see the same machine load. One thread per rank everywhere (OMP_NUM_THREADS =
# OPENBLAS_NUM_THREADS = 1, OMP_WAIT_POLICY=passive), mpirun --bind-to none. Both read the same random
# token file (zerotrain: data.format "tokens"; PyTorch: bench/zt_tokens.py, zerotrain's sample order).
# Peak RSS of every rank via /usr/bin/time. Metrics, JSON and logs stay in --out (default a temp dir);
# --first-round K numbers the rounds from K (to add rounds to an existing --out); --summary-only prints
# the table of an existing --out again.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
bin_dir="$here/../build/bin"
ranks_list="2 4"
shapes="small medium"
stages="0 1 2 3"
rounds=3
first_round=1
out=""
summary_only=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bin) bin_dir="$2"; shift 2 ;;
    --ranks) ranks_list="$2"; shift 2 ;;
    --shapes) shapes="$2"; shift 2 ;;
    --stages) stages="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --first-round) first_round="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --summary-only) summary_only=1; shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
py=/usr/bin/python3

summarize() {
  "$py" - "$1" <<'EOF'
import glob, json, os, statistics, sys
out = sys.argv[1]
med = statistics.median

def rss(prefix):
    values = []
    for path in glob.glob(prefix + ".rss.*"):
        try:
            values.append(int(open(path).read().split()[-1]) * 1024)
        except (ValueError, IndexError):
            pass
    return max(values) if values else None

runs = {}  # (ranks, shape) -> variant -> round -> result
for path in glob.glob(os.path.join(out, "*.jsonl")) + glob.glob(os.path.join(out, "*.ddp.json")):
    name = os.path.basename(path)
    base = name.split(".")[0]  # n2_small_r1_zt-s2-on | n2_small_r1_ddp
    n, shape, rnd, variant = base.split("_")
    key, rnd = (int(n[1:]), shape), int(rnd[1:])
    prefix = os.path.join(out, base)
    warmup = int(open(prefix + ".warmup").read()) if os.path.exists(prefix + ".warmup") else 0
    if variant == "ddp":
        d = json.load(open(path))
        common = {"tokens": d["tokens_per_step"], "state": d["model_state_bytes"], "peak": None, "rss": rss(prefix) or max(d["peak_rss_bytes_per_rank"]),
                  "comm_mb": None, "busy_ms": d["allreduce_alone_ms"]}
        # DDP as it runs (phase A), and the same buckets all-reduced after backward (phase B, "blocking").
        runs.setdefault(key, {}).setdefault("ddp-on", {})[rnd] = dict(
            common, ms=d["median_ms"], tps=d["tokens_per_s"], wait_ms=d["exposed_comm_ms"], overlap=d["overlap"])
        if d.get("blocking_buffers") != "persistent":
            # An earlier version copied into fresh tensors every step (page faults counted as
            # communication): its blocking numbers and DDP's overlap are left out.
            runs[key]["ddp-on"][rnd]["overlap"] = None
            continue
        blocking_ms = statistics.median(d["blocking_ms"])
        runs[key].setdefault("ddp-off", {})[rnd] = dict(
            common, ms=blocking_ms, tps=d["tokens_per_step"] / blocking_ms * 1e3, wait_ms=d["blocking_comm_ms"],
            overlap=None)
        continue
    else:
        lines = [json.loads(l) for l in open(path)]
        steps = [l for l in lines if l.get("event") == "step"]
        timed = [s for s in steps if s["step"] > warmup]
        if not timed:
            continue
        start = next(l for l in lines if l.get("event") == "start")
        mem = timed[-1]["mem"]
        r = {"ms": med(s["step_time_s"] for s in timed) * 1e3, "tps": med(s["tokens_per_s"] for s in timed),
             "wait_ms": med(s["comm_wait_s"] for s in timed) * 1e3,
             "busy_ms": med(s["comm_busy_s"] for s in timed) * 1e3,
             "state": mem["parameters"] + mem["gradients"] + mem["optimizer_states"],
             "peak": max(s["mem"]["peak"] for s in timed), "rss": rss(prefix),
             "comm_mb": med(s["comm_bytes"] for s in timed) / 2**20,
             "tokens": start["train_batch_size"] * start["model"]["seq_len"]}
    runs.setdefault(key, {}).setdefault(variant, {})[rnd] = r

def fmt(x, spec, none="–"):
    return none if x is None else format(x, spec)

print()
print("| ranks | shape | run | ms/step | tokens/s | DDP ms / this ms | comm wait % of step | comm wait ms "
      "| comm busy ms | overlap | model states MiB | tracked peak MiB | peak RSS MiB | sent MiB/step |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
shape_order = {"small": 0, "medium": 1, "gpt2": 2}
for key in sorted(runs, key=lambda k: (k[0], shape_order.get(k[1], 9), k[1])):
    variants = runs[key]
    ddp = variants.get("ddp-on", {})
    def order(v):
        return (0 if v.startswith("ddp") else 1, v.split("-")[:-1], v.endswith("on"))
    for variant in sorted(variants, key=order):
        rounds = variants[variant]
        rs = list(rounds.values())
        ms = med(r["ms"] for r in rs)
        ratios = [ddp[k]["ms"] / r["ms"] for k, r in rounds.items() if k in ddp and variant != "ddp-off"]
        ratio = (f"{med(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})" if ratios else "–")
        exposed = med(r["wait_ms"] / r["ms"] for r in rs) * 100
        if variant == "ddp-on":
            values = [r["overlap"] for r in rs if r["overlap"] is not None]
            overlap = med(values) if values else None
            label = "PyTorch DDP (gloo)"
        elif variant == "ddp-off":
            overlap = None
            label = "PyTorch DDP, blocking all-reduce"
        else:
            stage, mode = variant.split("-")[1:]
            label = f"zerotrain stage {stage[1:]}, overlap {mode}"
            overlap = None
            if mode == "on":
                off = variants.get(variant[:-2] + "off", {})  # the blocking run's wait = all of it
                per = [1 - r["wait_ms"] / off[k]["wait_ms"] for k, r in rounds.items()
                       if k in off and off[k]["wait_ms"] > 0]
                overlap = med(per) if per else None
        peak = [r["peak"] for r in rs if r["peak"] is not None]
        rss_values = [r["rss"] for r in rs if r["rss"] is not None]
        comm = [r["comm_mb"] for r in rs if r["comm_mb"] is not None]
        print(f"| {key[0]} | {key[1]} | {label} | {ms:.1f} | {rs[0]['tokens'] / ms * 1e3:.0f} | {ratio} | "
              f"{exposed:.0f} % | {med(r['wait_ms'] for r in rs):.1f} | {med(r['busy_ms'] for r in rs):.1f} | "
              f"{fmt(overlap, '.2f')} | {med(r['state'] for r in rs) / 2**20:.1f} | "
              f"{fmt(med(peak) / 2**20 if peak else None, '.1f')} | "
              f"{fmt(med(rss_values) / 2**20 if rss_values else None, '.0f')} | "
              f"{fmt(med(comm) if comm else None, '.2f')} |")
counts = {f"n{k[0]} {k[1]}": max(len(r) for r in v.values()) for k, v in runs.items()}
print()
print("rounds per case:", ", ".join(f"{k}: {c}" for k, c in sorted(counts.items())))
EOF
}

if [[ $summary_only == 1 ]]; then
  [[ -n "$out" ]] || { echo "--summary-only needs --out DIR" >&2; exit 2; }
  summarize "$out"
  exit 0
fi

zt="$bin_dir/zerotrain"
[[ -x "$zt" ]] || { echo "no $zt: build the target zerotrain first" >&2; exit 1; }
# libzerotrain from the same tree as the binary (a copied build keeps working while the original is rebuilt)
[[ -d "$bin_dir/../lib" ]] && export LD_LIBRARY_PATH="$(cd "$bin_dir/../lib" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
"$py" -c "import torch, numpy" 2>/dev/null || { echo "PyTorch missing: apt-get install -y python3-torch" >&2; exit 1; }
[[ -x /usr/bin/time ]] || { echo "/usr/bin/time missing: apt-get install -y time" >&2; exit 1; }
[[ -n "$out" ]] || out=$(mktemp -d /tmp/zero_vs_ddp.XXXXXX)
mkdir -p "$out"

export OMP_WAIT_POLICY=passive OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 MASTER_ADDR=127.0.0.1
mpirun_flags=(--oversubscribe --bind-to none)
run_limit=1200  # seconds per mpirun; a run past it is reported as FAILED and left out of the table

# shape -> n_layer n_head d_model seq_len vocab micro bucket_elements warmup timed ddp_pairs allreduce_reps
declare -A shape_spec=(
  [small]="4 4 128 64 512 4 262144 3 20 15 10"
  [medium]="6 6 384 256 8192 1 2097152 2 6 4 5"
)

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(getconf _NPROCESSORS_ONLN) cores;" \
  "torch $("$py" -c 'import torch; print(torch.__version__)'); zerotrain $zt; rounds $rounds; out $out"
echo "load at start: $(cut -d' ' -f1-3 /proc/loadavg); libzerotrain $(LD_LIBRARY_PATH=$LD_LIBRARY_PATH ldd "$zt" | awk '/libzerotrain/ {print $3}')"

write_config() {  # path stage overlap shape ranks tokens
  "$py" - "$@" <<'EOF'
import json, sys
path, stage, overlap, shape, ranks, tokens = sys.argv[1:7]
layer, head, d, seq, vocab, micro, bucket = (int(x) for x in shape.split()[:7])
zero = {"stage": int(stage), "overlap_comm": overlap == "on", "reduce_bucket_size": bucket,
        "allgather_bucket_size": bucket}
if int(stage) == 3:
    # biases and LayerNorms (<= 4 d_model elements) stay whole; matrices are partitioned and gathered
    # per module, prefetching one bucket ahead; a parameter is kept from forward into backward only when
    # it is used again within one bucket's worth of other parameters.
    zero.update({"stage3_prefetch_bucket_size": bucket, "stage3_param_persistence_threshold": 4 * d,
                 "stage3_max_reuse_distance": bucket})
config = {
    "train_batch_size": micro * int(ranks), "train_micro_batch_size_per_gpu": micro,
    "gradient_clipping": 0.0,
    "optimizer": {"type": "AdamW", "params": {"lr": 6e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
    "zero_optimization": zero,
    "model": {"type": "gpt", "n_layer": layer, "n_head": head, "d_model": d, "seq_len": seq, "vocab_size": vocab},
    "data": {"format": "tokens", "path": tokens},
    "seed": 1234,
}
json.dump(config, open(path, "w"), indent=1)
EOF
}

port=29600
for shape in $shapes; do
  spec=(${shape_spec[$shape]})
  tokens="$out/tokens_$shape.bin"
  [[ -f "$tokens" ]] || "$py" -c "import sys; sys.path.insert(0, '$here'); import zt_tokens as z; \
z.write_token_file('$tokens', z.random_tokens(1000000, ${spec[4]}), ${spec[4]})"
done

run_zt() {  # base config steps ranks
  local base=$1 config=$2 steps=$3 n=$4
  timeout -k 10 "$run_limit" mpirun "${mpirun_flags[@]}" -n "$n" sh -c 'exec /usr/bin/time -f %M -o "$0.rss.$OMPI_COMM_WORLD_RANK" "$@"' \
    "$base" "$zt" train --config "$config" --steps "$steps" --metrics "$base.jsonl" --print-every 1000 \
    >"$base.log" 2>&1 || echo "FAILED: zerotrain $base (see $base.log)" >&2
}

run_ddp() {  # base ranks shape-spec...
  local base=$1 n=$2; shift 2
  local s=("$@")
  port=$((port + 1))
  timeout -k 10 "$run_limit" mpirun "${mpirun_flags[@]}" -n "$n" -x MASTER_PORT=$port \
    sh -c 'exec /usr/bin/time -f %M -o "$0.rss.$OMPI_COMM_WORLD_RANK" "$@"' "$base" \
    "$py" "$here/pytorch_ddp_gpt.py" --data "$out/tokens_$shape.bin" --n-layer "${s[0]}" --n-head "${s[1]}" \
    --d-model "${s[2]}" --seq-len "${s[3]}" --vocab "${s[4]}" --micro-batch "${s[5]}" \
    --bucket-mb "$("$py" -c "print(${s[6]} * 4 / 2**20)")" --warmup "${s[7]}" --steps "${s[8]}" \
    --comm-pairs "${s[9]}" --allreduce-reps "${s[10]}" --threads 1 --json "$base.ddp.json" \
    >"$base.log" 2>&1 || echo "FAILED: ddp $base (see $base.log)" >&2
}

for round in $(seq "$first_round" $((first_round + rounds - 1))); do
  for n in $ranks_list; do
    for shape in $shapes; do
      spec=(${shape_spec[$shape]})
      variants=(ddp)
      for stage in $stages; do variants+=("zt-s$stage-on" "zt-s$stage-off"); done
      if (( round % 2 == 0 )); then
        reversed=(); for ((i = ${#variants[@]} - 1; i >= 0; --i)); do reversed+=("${variants[i]}"); done
        variants=("${reversed[@]}")
      fi
      for variant in "${variants[@]}"; do
        base="$out/n${n}_${shape}_r${round}_${variant}"
        echo "${spec[7]}" >"$base.warmup"
        started=$(date +%s.%N)
        if [[ $variant == ddp ]]; then
          run_ddp "$base" "$n" "${spec[@]}"
        else
          IFS=- read -r _ stage mode <<<"$variant"
          write_config "$base.config.json" "${stage#s}" "$mode" "${shape_spec[$shape]}" "$n" "$out/tokens_$shape.bin"
          run_zt "$base" "$base.config.json" $((spec[7] + spec[8])) "$n"
        fi
        printf '%-40s %6.1f s  load %s\n' "$(basename "$base")" "$(echo "$(date +%s.%N) - $started" | bc)" \
          "$(cut -d' ' -f1 /proc/loadavg)"
      done
    done
  done
done
echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
summarize "$out"
