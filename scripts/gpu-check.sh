#!/usr/bin/env bash
# The checks that need a GPU, in one run of under 8 minutes on a machine that has one (the device
# tool's H200; docs/gpu.md, "Running the GPU checks"):
#   scripts/gpu-check.sh SUMMARY
# 1. The bundle scripts/gpu-bundle.sh packed on the development machine (ZT_GPU_BUNDLE, default
#    .gpu-bundle/zt-gpu-bundle.tar.xz: the device tool carries .gpu-bundle), unpacked under
#    ${TMPDIR:-/tmp}. Without one, on a machine that has the Debian packages (scripts/setup.sh), the
#    same bundle staged here: build-gpu configured, built and staged by scripts/gpu-bundle.sh stage.
# 2. The machine: GPUs, driver, glibc against what the bundle needs, where each CUDA library comes from.
# 3. `zerotrain report`.
# 4. Every GPU test (ctest label gpu: unit.cuda_*, unit.device, unit.device_offload, mpi.nccl, ...) with
#    ctest's pass and skip rules; MPI tests of more ranks than GPUs are skipped (one GPU per rank).
# 5. A short benchmark: `zerotrain train --device cuda` on GPT-2 124M's shape in bf16 (when the CLI has
#    --device cuda), at ZeRO-0 and (fewer steps) ZeRO-3, the same step in PyTorch on the GPU as the
#    anchor, and every GPU benchmark the bundle holds (bin/zt_bench_cuda_*, bin/zt_bench_gpu_*).
# SUMMARY gets the results (tests passed/failed/skipped with names, tok/s, MFU, the benchmarks' lines);
# SUMMARY.log the whole output. Exits 1 when a test or a step failed, 0 otherwise.
#   ZT_GPU_BUNDLE       the archive (or an unpacked bundle directory)
#   ZT_GPU_BENCH_STEPS  training steps of the benchmark (default 12)
#   ZT_GPU_PEAK_FLOPS   the MFU's peak per GPU (--peak-flops; default: the one zerotrain picks for the GPU)
set -uo pipefail
[ $# -ge 1 ] || {
  sed -n '2,/^set -uo/p' "$0" | sed '$d'
  exit 2
}
summary=$1
log=$summary.log
cd "$(dirname "$0")/.." || exit 1
source_dir=$(pwd)
mkdir -p "$(dirname "$summary")"
: >"$summary"
: >"$log"
began=$(date +%s)
status=0

say() { echo "$*" | tee -a "$summary"; }
logged() { # CMD...: output to the log and the terminal
  "$@" 2>&1 | tee -a "$log"
  return "${PIPESTATUS[0]}"
}
elapsed() { echo $(($(date +%s) - began)); }
# Seconds a step may take so that it ends by second END of the run, at most CAP; 0 when under 15 left.
budget() { # END CAP
  local left=$(($1 - $(elapsed)))
  [ "$left" -gt "$2" ] && left=$2
  [ "$left" -ge 15 ] || left=0
  echo "$left"
}
step_failed() {
  say "FAILED: $*"
  status=1
}

say "# scripts/gpu-check.sh, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"

# ---- 1. the bundle ---------------------------------------------------------------------------------
archive=${ZT_GPU_BUNDLE:-.gpu-bundle/zt-gpu-bundle.tar.xz}
work=${TMPDIR:-/tmp}/zt-gpu-check
bundle=""
if [ -d "$archive" ] && [ -f "$archive/MANIFEST" ]; then
  bundle=$(cd "$archive" && pwd) # absolute: the benchmarks below run from other directories
elif [ -f "$archive" ]; then
  rm -rf "$work"
  mkdir -p "$work"
  if command -v xz >/dev/null; then
    tar -C "$work" -xJf "$archive"
  else # the image's python3 reads .tar.xz too
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$archive" "$work"
  fi || {
    say "FAILED: cannot unpack $archive"
    exit 1
  }
  bundle=$work/zt-gpu-bundle
  say "bundle: $archive ($(du -h "$archive" | cut -f1)), unpacked in $(elapsed) s into $bundle"
elif command -v ompi_info >/dev/null && command -v python3 >/dev/null && command -v nvcc >/dev/null; then
  say "bundle: no archive at $archive; this machine has Open MPI and nvcc: building build-gpu and staging it here"
  rm -rf "$work"
  logged scripts/gpu-bundle.sh stage "$work" >/dev/null || {
    say "FAILED: scripts/gpu-bundle.sh stage (see $log)"
    exit 1
  }
  bundle=$work/zt-gpu-bundle
else
  say "FAILED: no bundle at $archive, and this machine cannot build one (it needs Open MPI, HDF5, OpenBLAS,"
  say "        GoogleTest and nlohmann-json: scripts/setup.sh). Run scripts/gpu-bundle.sh on the development"
  say "        machine and carry .gpu-bundle (docs/gpu.md, 'Running the GPU checks')."
  exit 1
fi
in_bundle() { "$bundle/gpu-bundle.sh" exec "$@"; }
sed 's/^/  /' "$bundle/MANIFEST" >>"$summary"
bundle_commit=$(sed -n 's/^commit=//p' "$bundle/MANIFEST")
tree_commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ "${bundle_commit%+changes}" != "$tree_commit" ]; then
  say "note: the bundle was built from commit $bundle_commit, this tree is at $tree_commit"
fi

# ---- 2. the machine ----------------------------------------------------------------------------------
# The GPU count decides which tests may skip for want of a GPU (none, when there is one) and which
# MPI tests run (one GPU per rank): nvidia-smi, else PyTorch.
if command -v nvidia-smi >/dev/null; then
  say "GPUs: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tr '\n' ';')"
  ZT_GPU_COUNT=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
else
  ZT_GPU_COUNT=$(python3 -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
  say "GPUs: no nvidia-smi on this machine; PyTorch counts $ZT_GPU_COUNT"
fi
export ZT_GPU_COUNT
glibc_have=$(getconf GNU_LIBC_VERSION 2>/dev/null | cut -d' ' -f2)
glibc_need=$(sed -n 's/^glibc_needed=//p' "$bundle/MANIFEST")
if [ -n "$glibc_need" ] && [ "$(printf '%s\n%s\n' "$glibc_need" "$glibc_have" | sort -V | head -1)" != "$glibc_need" ]; then
  say "FAILED: this machine's glibc $glibc_have is older than the $glibc_need the bundle needs: build here instead"
  say "        (a machine with the Debian packages: ZT_GPU_BUNDLE=none scripts/gpu-check.sh $summary)"
  exit 1
fi
ZT_CUDA_LIBRARY_DIRS=$("$bundle/gpu-bundle.sh" cuda-dirs)
export ZT_CUDA_LIBRARY_DIRS # found once, with this machine's python3, before our environment
say "glibc $glibc_have (bundle needs $glibc_need); CUDA library directories: ${ZT_CUDA_LIBRARY_DIRS:-none found}"
resolved=$(in_bundle ldd "$bundle/bin/zerotrain" 2>&1)
read -ra cuda_sonames <<<"$(sed -n 's/^cuda_sonames=//p' "$bundle/MANIFEST")"
for soname in "${cuda_sonames[@]}"; do
  say "  $soname => $(awk -v s="$soname" '$1 == s { print $3 }' <<<"$resolved")"
done
if grep -q 'not found' <<<"$resolved"; then
  step_failed "libraries not found for zerotrain: $(grep 'not found' <<<"$resolved" | tr '\n' ' ')"
fi

# ---- 3. zerotrain report -------------------------------------------------------------------------------
say "## zerotrain report"
if report=$(in_bundle zerotrain report 2>&1); then
  awk '{ print "  " $0 }' <<<"$report" >>"$summary"
else
  echo "$report" >>"$log"
  step_failed "zerotrain report exited non-zero: $(tail -3 <<<"$report" | tr '\n' ' ')"
fi

# ---- 4. the GPU tests -------------------------------------------------------------------------------------
say "## GPU tests"
# The NVMe offload tests need a file system with O_DIRECT (tmpfs has none before Linux 6.6): the first
# of the temporary directory, the checkout and the home directory that takes a direct write, else
# buffered I/O (ZT_SWAP_BUFFERED_IO=1), said in the summary either way.
direct_io_dir() {
  local dir probe
  for dir in "${ZT_TEST_SWAP_DIR:-}" "${TMPDIR:-/tmp}" "$source_dir" "${HOME:-}"; do
    if [ -z "$dir" ] || [ ! -d "$dir" ] || [ ! -w "$dir" ]; then continue; fi
    probe="$dir/.zt-direct-io-probe.$$"
    if dd if=/dev/zero of="$probe" bs=4096 count=1 oflag=direct status=none 2>/dev/null; then
      rm -f "$probe"
      echo "$dir"
      return 0
    fi
    rm -f "$probe"
  done
  return 1
}
if swap_dir=$(direct_io_dir); then
  export ZT_TEST_SWAP_DIR=$swap_dir
  say "NVMe test files in $swap_dir ($(df -PT "$swap_dir" 2>/dev/null | awk 'NR == 2 { print $2 }'), O_DIRECT works)"
else
  export ZT_SWAP_BUFFERED_IO=1
  say "no directory here takes O_DIRECT writes: the NVMe tests run with buffered I/O (ZT_SWAP_BUFFERED_IO=1)"
fi
test_summary=$(mktemp)
# Time (of the 8 minutes): the tests end by 270 s from the start (2 minutes at most each), the
# training benchmark by 400 s, its ZeRO-3 run by 420 s, the PyTorch anchor by 440 s, the GPU benchmarks by 470 s.
ZT_GPU_TESTS_DEADLINE=$((began + 270)) ZT_GPU_TEST_TIMEOUT=120 ZT_SOURCE_DIR=$source_dir \
  "$bundle/gpu-bundle.sh" tests "$test_summary" "$log.tests" >/dev/null || status=1
cat "$test_summary" >>"$summary"
cat "$log.tests" >>"$log"
rm -f "$log.tests" "$test_summary"
grep -E '^(FAIL|# tests)' "$summary" | tail -20

# ---- 5. benchmarks --------------------------------------------------------------------------------------------
say "## benchmark: GPT-2 124M shape (12 layers, d 768, 12 heads, seq 1024, vocab 50257), bf16, micro batch 8, 1 GPU"
bench_dir=$(mktemp -d)
cat >"$bench_dir/gpt2-124m-bf16.json" <<'EOF'
{
  "train_micro_batch_size_per_gpu": 8,
  "gradient_accumulation_steps": 1,
  "gradient_clipping": 1.0,
  "optimizer": {"type": "AdamW", "params": {"lr": 6e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
  "bf16": {"enabled": true},
  "zero_optimization": {"stage": 0},
  "model": {"type": "gpt", "n_layer": 12, "n_head": 12, "d_model": 768, "seq_len": 1024, "vocab_size": 50257,
            "tie_embeddings": true, "dropout": 0.0},
  "data": {"format": "builtin"},
  "seed": 1234
}
EOF
steps=${ZT_GPU_BENCH_STEPS:-12}
if ! in_bundle zerotrain train --help 2>&1 | grep -Eq -- '--device [^ ]*cuda'; then
  say "zerotrain train: no '--device cuda' in this build's CLI (zerotrain train --help): training benchmark not run"
elif [ "$(budget 400 120)" = 0 ]; then
  say "zerotrain train: not run, $(elapsed) s used of the 8 minutes"
else
  # MFU against the peak zerotrain picks for the GPU (the data sheet's dense bf16 figure for a tabled
  # GPU, e.g. an H200's 989.5 TFLOP/s, else a cuBLASLt matmul probe; docs/metrics.md, "MFU"), or
  # ZT_GPU_PEAK_FLOPS when set; the run's header line says which. The PyTorch anchor below is the ratio.
  peak_flag=()
  [ -n "${ZT_GPU_PEAK_FLOPS:-}" ] && peak_flag=(--peak-flops "$ZT_GPU_PEAK_FLOPS")
  train=$(cd "$bench_dir" && in_bundle timeout "$(budget 400 120)" zerotrain train --config gpt2-124m-bf16.json --device cuda \
    --steps "$steps" --print-every 1 "${peak_flag[@]}" 2>&1)
  train_status=$?
  echo "$train" >>"$log"
  # Steady state: the median tok/s of the steps after the first 2; MFU from the last step.
  zt_tokens=$(grep -E '^step ' <<<"$train" | awk -F'|' 'NR > 2 { for (i = 1; i <= NF; ++i) if ($i ~ /tok\/s/) { split($i, a, " "); print a[1] } }' |
    sort -n | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }')
  zt_mfu=$(grep -E '^step ' <<<"$train" | tail -1 | grep -Eo 'MFU [0-9.]+%')
  if [ "$train_status" != 0 ]; then
    step_failed "zerotrain train --device cuda exited $train_status: $(tail -3 <<<"$train" | tr '\n' ' ')"
  fi
  zt_peak=$(grep -E '^  MFU: ' <<<"$train" | head -1 | sed -E 's/^  MFU: //')
  say "zerotrain: ${zt_tokens:-no} tok/s (median of steps 3-$steps), ${zt_mfu:-no MFU}; last step: $(grep -E '^step ' <<<"$train" | tail -1)"
  say "  MFU of: ${zt_peak:-(no MFU line in the header of the run)}"
  # The same shape at ZeRO-3 (ZeRO-1 on one GPU partitions nothing: the stage-0 run above does its work):
  # every module's parameters gathered around its forward and backward, here through the single-rank
  # communicator's copies. Fewer steps, by 420 s.
  sed 's/"stage": 0/"stage": 3/' "$bench_dir/gpt2-124m-bf16.json" >"$bench_dir/gpt2-124m-bf16-zero3.json"
  if [ "$(budget 420 60)" = 0 ]; then
    say "zerotrain ZeRO-3: not run, $(elapsed) s used"
  else
    train3=$(cd "$bench_dir" && in_bundle timeout "$(budget 420 60)" zerotrain train --config gpt2-124m-bf16-zero3.json \
      --device cuda --steps 6 --print-every 1 "${peak_flag[@]}" 2>&1)
    train3_status=$?
    echo "$train3" >>"$log"
    zt3_tokens=$(grep -E '^step ' <<<"$train3" | awk -F'|' 'NR > 2 { for (i = 1; i <= NF; ++i) if ($i ~ /tok\/s/) { split($i, a, " "); print a[1] } }' |
      sort -n | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }')
    [ "$train3_status" = 0 ] || step_failed "zerotrain train --device cuda at ZeRO-3 exited $train3_status: $(tail -3 <<<"$train3" | tr '\n' ' ')"
    say "zerotrain ZeRO-3: ${zt3_tokens:-no} tok/s (median of steps 3-6), $(grep -E '^step ' <<<"$train3" | tail -1 | grep -Eo 'MFU [0-9.]+%' || echo no MFU)"
  fi
fi
if [ "$(budget 440 60)" != 0 ] && python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  # The anchor, same run: bench/gpt_model.py's GPT (the model nn::Gpt implements), AdamW, bf16 autocast.
  anchor=$(timeout "$(budget 440 60)" python3 - "$source_dir/bench" <<'EOF' 2>&1
import sys, time, statistics, torch
import torch.nn.functional as F
sys.path.insert(0, sys.argv[1])
from gpt_model import Gpt, adamw
torch.manual_seed(1234)
B, T, V = 8, 1024, 50257
model = Gpt(12, 12, 768, T, V).cuda()
optimizer = adamw(model)
x = torch.randint(0, 256, (B, T + 1), device="cuda")
inputs, targets = x[:, :-1], x[:, 1:]
times = []
for i in range(12):
    torch.cuda.synchronize(); start = time.perf_counter()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(inputs).view(-1, V).float(), targets.reshape(-1))
    loss.backward(); optimizer.step(); optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize(); times.append(time.perf_counter() - start)
print(f"pytorch {torch.__version__}: {B * T / statistics.median(times[2:]):.0f} tok/s (median of steps 3-12, bf16 autocast, eager)")
EOF
  )
  echo "$anchor" >>"$log"
  say "anchor: $(tail -1 <<<"$anchor")"
  torch_tokens=$(tail -1 <<<"$anchor" | sed -nE 's/.*: ([0-9]+) tok\/s.*/\1/p')
  if [ -n "${zt_tokens:-}" ] && [ -n "$torch_tokens" ]; then
    say "zerotrain / pytorch: $(awk -v a="$zt_tokens" -v b="$torch_tokens" 'BEGIN { printf "%.3f", a / b }')"
  fi
else
  say "anchor: not run ($(elapsed) s used of the 8 minutes, or no PyTorch with CUDA here)"
fi
shopt -s nullglob
for bench in "$bundle"/bin/zt_bench_cuda_* "$bundle"/bin/zt_bench_gpu_*; do
  if [ "$(budget 470 60)" = 0 ]; then
    say "$(basename "$bench"): not run, $(elapsed) s used"
    continue
  fi
  say "## $(basename "$bench")"
  output=$(cd "$bench_dir" && in_bundle timeout "$(budget 470 60)" "$bench" 2>&1)
  bench_status=$?
  echo "$output" >>"$log"
  # Its result lines (the device, bandwidth and TFLOP/s per kernel: zt_bench_cuda_kernels prints ~80).
  grep -Ei '^device:|no usable GPU|GB/s|TB/s|TFLOP|bandwidth|ratio' <<<"$output" | head -120 | sed 's/^/  /' >>"$summary"
  [ "$bench_status" = 0 ] || step_failed "$(basename "$bench") exited $bench_status"
done
rm -rf "$bench_dir"
say "# done in $(elapsed) s, status $status"
exit "$status"
