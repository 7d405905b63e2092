#!/bin/bash
# Resident memory (what the kernel counts) against the engine's accounted memory, per rank, for one
# GPT shape: is every resident byte explained by the accounted peak plus the runtime's fixed part?
#
#   bench/run_rss_vs_accounted.sh [--bin DIR] [--ranks N] [--stage S] [--dtype fp32|bf16]
#                                 [--layers L] [--width C] [--heads H] [--seq T] [--vocab V]
#                                 [--micro B] [--steps K] [--bucket E] [--out DIR]
#
# Defaults: 2 ranks, stage 2, bf16, 2 layers, d_model 256, 4 heads, seq 64, vocab 50257, micro 2,
# 4 steps, reduce/allgather buckets of 5e7 elements. One zerotrain train run (mpirun, one thread per
# rank); every rank runs under /usr/bin/time, whose maximum RSS covers the whole process (start-up and
# initialization included). Printed, maximum over ranks:
#   runtime   RSS before the model was built (MPI, libraries): the start record's runtime_rss_bytes
#   accounted the engine's peak over the steps (the step records' mem.peak)
#   step RSS  the peak RSS within the steps (mem.peak_rss_bytes; absent with binaries before 2026-12-02)
#   process   /usr/bin/time's maximum resident set of the rank's whole life
# and the ratios (step RSS - runtime) / accounted and process / (accounted + runtime); and the gradients'
# peak within the steps against what is held between steps (the shard at stages 2-3: the ZeRO formula).
# --bin names another build's bin directory (a binary without the RSS metrics reports the process column).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
bin_dir="$here/../build/bin"
ranks=2 stage=2 dtype=bf16 layers=2 width=256 heads=4 seq=64 vocab=50257 micro=2 steps=4 bucket=50000000
out=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bin) bin_dir="$2"; shift 2 ;;
    --ranks) ranks="$2"; shift 2 ;;
    --stage) stage="$2"; shift 2 ;;
    --dtype) dtype="$2"; shift 2 ;;
    --layers) layers="$2"; shift 2 ;;
    --width) width="$2"; shift 2 ;;
    --heads) heads="$2"; shift 2 ;;
    --seq) seq="$2"; shift 2 ;;
    --vocab) vocab="$2"; shift 2 ;;
    --micro) micro="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --bucket) bucket="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "run_rss_vs_accounted.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ -x "$bin_dir/zerotrain" ]] || { echo "run_rss_vs_accounted.sh: no zerotrain in $bin_dir (--bin DIR)" >&2; exit 2; }
[[ -x /usr/bin/time ]] || { echo "run_rss_vs_accounted.sh: needs /usr/bin/time (Debian: apt-get install time)" >&2; exit 2; }
[[ -n "$out" ]] || out=$(mktemp -d /tmp/zt-rss.XXXXXX)
mkdir -p "$out"

precision=""
[[ "$dtype" == bf16 ]] && precision='"bf16": {"enabled": true},'
cat > "$out/config.json" <<JSON
{
  "train_micro_batch_size_per_gpu": $micro,
  "gradient_accumulation_steps": 1,
  "gradient_clipping": 1.0,
  $precision
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
  "zero_optimization": {"stage": $stage, "reduce_bucket_size": $bucket, "allgather_bucket_size": $bucket},
  "model": {"type": "gpt", "n_layer": $layers, "n_head": $heads, "d_model": $width, "seq_len": $seq,
            "vocab_size": $vocab},
  "data": {"format": "builtin"},
  "seed": 1
}
JSON

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=passive
rm -f "$out"/time.* "$out/run.jsonl"
# Each rank under /usr/bin/time, its file named by the rank (expanded by the rank's shell).
# shellcheck disable=SC2016
mpirun --oversubscribe --bind-to none -n "$ranks" \
  bash -c 'exec /usr/bin/time -f "%M" -o "$0/time.$OMPI_COMM_WORLD_RANK" "$1" train --config "$0/config.json" \
             --steps "$2" --metrics "$0/run.jsonl"' "$out" "$bin_dir/zerotrain" "$steps" > "$out/train.log" 2>&1 ||
  { tail -20 "$out/train.log" >&2; exit 1; }

python3 - "$out" "$ranks" <<'PY'
import json, os, sys
out, ranks = sys.argv[1], int(sys.argv[2])
records = [json.loads(line) for line in open(os.path.join(out, "run.jsonl"))]
start = next(r for r in records if r["event"] == "start")
steps = [r for r in records if r["event"] == "step"]
process = max(int(open(os.path.join(out, f"time.{r}")).read().split()[-1]) * 1024 for r in range(ranks))
accounted = max(s["mem"]["peak"] for s in steps)
runtime = start.get("runtime_rss_bytes")
step_rss = max((s["mem"].get("peak_rss_bytes", 0) for s in steps), default=0) or None
mib = lambda b: f"{b / 2**20:8.1f}" if b else "       -"
m = start["model"]
print(f"GPT {m['n_layer']} layers, d_model {m['d_model']}, vocab {m['vocab_size']}: {start['params_total']} parameters, "
      f"{start['dtype']}, stage {start['zero_stage']}, {ranks} ranks")
print(f"MiB per rank: runtime {mib(runtime)} | accounted {mib(accounted)} | step RSS {mib(step_rss)} | "
      f"process {mib(process)}")
gradients = max(s["mem"]["gradients"] for s in steps)
shard = steps[-1]["mem"]["resident"]["gradients"]
print(f"gradients: peak {mib(gradients)} MiB, held between steps {mib(shard)} MiB ({gradients / shard:.3f}x; "
      f"{gradients / start['params_total']:.3f} B/param)")
if step_rss and runtime:
    print(f"(step RSS - runtime) / accounted = {(step_rss - runtime) / accounted:.3f}")
print(f"process / (accounted + runtime) = {process / (accounted + (runtime or 0)):.3f}"
      + ("" if runtime else "  (runtime unknown: accounted only)"))
PY
