#!/bin/bash
# zerotrain's single-process GPT training step against PyTorch's, interleaved in one run.
#
#   bench/run_gpt_vs_pytorch.sh [--bin DIR] [--before-bin DIR] [--rounds R] [--threads "1 2"]
#                               [--shapes "small gpt2"] [--small-steps N] [--gpt2-steps N]
#                               [--gpt2-warmup N] [--out DIR]
#
# For each thread count and shape: R rounds of (zerotrain, pytorch), each a fresh process with its own
# warm-up, so both see the same machine load; OMP_WAIT_POLICY=passive and OMP_NUM_THREADS /
# OPENBLAS_NUM_THREADS = threads for both. Per round the ratio PyTorch ms / zerotrain ms of the
# medians; the table gives the median over rounds of each side's median and of the per-round ratio
# (> 1: zerotrain faster). JSON of every run is kept in the --out directory (default: a temp dir).
# --before-bin DIR: another build's zt_bench_gpt_step (e.g. the commit before a change) runs in every
# round too, right after this one, and the table adds its step time and the ratio before/after.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
bin_dir="$here/../build/bin"
before_dir=""
rounds=3
thread_counts="1 2"
shapes="small gpt2"
small_steps=20
gpt2_steps=3
gpt2_warmup=2
out=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bin) bin_dir="$2"; shift 2 ;;
    --before-bin) before_dir="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --threads) thread_counts="$2"; shift 2 ;;
    --shapes) shapes="$2"; shift 2 ;;
    --small-steps) small_steps="$2"; shift 2 ;;
    --gpt2-steps) gpt2_steps="$2"; shift 2 ;;
    --gpt2-warmup) gpt2_warmup="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
bench="$bin_dir/zt_bench_gpt_step"
[[ -x "$bench" ]] || { echo "no $bench: build the target zt_bench_gpt_step first" >&2; exit 1; }
before_bench=""
if [[ -n "$before_dir" ]]; then
  before_bench="$before_dir/zt_bench_gpt_step"
  [[ -x "$before_bench" ]] || { echo "no $before_bench: build zt_bench_gpt_step there first" >&2; exit 1; }
fi
/usr/bin/python3 -c "import torch" 2>/dev/null ||
  { echo "PyTorch missing: apt-get install -y python3-torch" >&2; exit 1; }
[[ -n "$out" ]] || out=$(mktemp -d /tmp/gpt_vs_pytorch.XXXXXX)
mkdir -p "$out"

export OMP_WAIT_POLICY=passive
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores;" \
  "torch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)');" \
  "rounds $rounds; json in $out"
for threads in $thread_counts; do
  for shape in $shapes; do
    steps=$small_steps
    warmup=3
    if [[ "$shape" == gpt2 ]]; then steps=$gpt2_steps; warmup=$gpt2_warmup; fi
    for round in $(seq 1 "$rounds"); do
      OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads \
        "$bench" --shape "$shape" --threads "$threads" --steps "$steps" --warmup "$warmup" \
        --json "$out/zt_${shape}_t${threads}_r${round}.json"
      if [[ -n "$before_bench" ]]; then
        OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads \
          "$before_bench" --shape "$shape" --threads "$threads" --steps "$steps" --warmup "$warmup" \
          --json "$out/before_${shape}_t${threads}_r${round}.json"
      fi
      OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads \
        /usr/bin/python3 "$here/pytorch_gpt_step.py" --shape "$shape" --threads "$threads" --steps "$steps" \
        --warmup "$warmup" --json "$out/pt_${shape}_t${threads}_r${round}.json"
    done
  done
done

/usr/bin/python3 - "$out" <<'EOF'
import glob, json, os, statistics, sys
out = sys.argv[1]
rows = {}
for path in glob.glob(os.path.join(out, "*.json")):
    framework, shape, threads, round_ = os.path.basename(path)[:-5].split("_")
    (result,) = json.load(open(path))
    rows.setdefault((shape, int(threads[1:])), {}).setdefault(int(round_[1:]), {})[framework] = result
before = any("before" in r for cell in rows.values() for r in cell.values())
print()
print("| shape | threads | zerotrain ms/step median (best) | PyTorch ms/step median (best) | "
      "zerotrain tokens/s | PyTorch tokens/s | ratio PyTorch/zerotrain, median of rounds (min-max) |"
      + (" before ms/step median (best) | ratio before/after, median of rounds (min-max) |" if before else ""))
print("|---|---|---|---|---|---|---|" + ("---|---|" if before else ""))
for (shape, threads) in sorted(rows, key=lambda k: (k[0] != "small", k[1])):
    rounds = [r for r in rows[(shape, threads)].values() if "zt" in r and "pt" in r]
    zt_med = statistics.median(r["zt"]["median_ms"] for r in rounds)
    pt_med = statistics.median(r["pt"]["median_ms"] for r in rounds)
    zt_best = min(r["zt"]["best_ms"] for r in rounds)
    pt_best = min(r["pt"]["best_ms"] for r in rounds)
    ratios = [r["pt"]["median_ms"] / r["zt"]["median_ms"] for r in rounds]
    tokens = rounds[0]["zt"]["tokens_per_step"]
    line = (f"| {shape} | {threads} | {zt_med:.1f} ({zt_best:.1f}) | {pt_med:.1f} ({pt_best:.1f}) | "
            f"{tokens / zt_med * 1e3:.0f} | {tokens / pt_med * 1e3:.0f} | "
            f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |")
    if before:
        paired = [r for r in rounds if "before" in r]
        before_med = statistics.median(r["before"]["median_ms"] for r in paired)
        before_best = min(r["before"]["best_ms"] for r in paired)
        changes = [r["before"]["median_ms"] / r["zt"]["median_ms"] for r in paired]
        line += (f" {before_med:.1f} ({before_best:.1f}) | "
                 f"{statistics.median(changes):.2f} ({min(changes):.2f}-{max(changes):.2f}) |")
    print(line)
EOF
