#!/bin/bash
# zerotrain's NVMe swap engine against fio: same file system, block size, queue depth and ioengine,
# O_DIRECT, interleaved in one run.
#
#   bench/run_swap_vs_fio.sh [--bin DIR] [--dir DIR] [--size-mib N] [--block-size-kib K]
#                            [--queue-depth Q] [--rounds R] [--engines "io_uring libaio"]
#
# Per ioengine, R rounds (default 5) of (zerotrain, fio), in alternating order so both see the same
# machine load. Each side, in a fresh file of N MiB (default 1024) under DIR (default /tmp): one
# sequential write to allocate the blocks (not counted), then one measured sequential write
# (overwrite) and one measured sequential read. Prints each round, then the medians over rounds of
# each side and of the per-round ratio zerotrain/fio (target >= 0.9). Files are removed at the end.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
bin_dir="$here/../build/bin"
dir=/tmp
size_mib=1024
block_kib=1024
queue_depth=8
rounds=5
engines="io_uring libaio"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bin) bin_dir="$2"; shift 2 ;;
    --dir) dir="$2"; shift 2 ;;
    --size-mib) size_mib="$2"; shift 2 ;;
    --block-size-kib) block_kib="$2"; shift 2 ;;
    --queue-depth) queue_depth="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --engines) engines="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
bench="$bin_dir/zt_bench_swap"
[[ -x "$bench" ]] || { echo "no $bench: build the target zt_bench_swap first" >&2; exit 1; }
command -v fio >/dev/null || { echo "fio missing: apt-get install -y fio" >&2; exit 1; }

fio_file="$dir/zt_swap_vs_fio.$$.dat"
trap 'rm -f "$fio_file"' EXIT

# fio's bandwidth in GiB/s of one sequential pass (rw = write | read).
fio_pass() {
  local engine=$1 rw=$2
  fio --name=swap --filename="$fio_file" --size="${size_mib}M" --bs="${block_kib}k" --iodepth="$queue_depth" \
      --ioengine="$engine" --direct=1 --rw="$rw" --numjobs=1 --output-format=json |
    python3 -c "import json,sys; j=json.load(sys.stdin)['jobs'][0]['$rw']; print(f\"{j['bw_bytes']/2**30:.4f}\")"
}

# Prints "write read" GiB/s for fio: a warm-up write, then the measured write and read.
run_fio() {
  local engine=$1
  rm -f "$fio_file"
  fio_pass "$engine" write >/dev/null
  echo "$(fio_pass "$engine" write) $(fio_pass "$engine" read)"
  rm -f "$fio_file"
}

run_zerotrain() {
  local engine=$1
  "$bench" --path "$dir" --backend "$engine" --size-mib "$size_mib" --block-size-kib "$block_kib" \
           --queue-depth "$queue_depth" --repeats 1 |
    sed -n 's/^RESULT .*write_gib_s=\([0-9.]*\) read_gib_s=\([0-9.]*\).*/\1 \2/p'
}

median() { sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }

echo "fs: $(stat -f -c %T "$dir") at $dir; ${size_mib} MiB, block ${block_kib} KiB, queue depth ${queue_depth}, O_DIRECT; $(fio --version)"
for engine in $engines; do
  printf "\n%-9s %5s  %9s %9s %6s  %9s %9s %6s\n" ioengine round zt_write fio_write ratio zt_read fio_read ratio
  rows=()
  for ((round = 1; round <= rounds; round++)); do
    if ((round % 2)); then
      zt=$(run_zerotrain "$engine"); fio_result=$(run_fio "$engine")
    else
      fio_result=$(run_fio "$engine"); zt=$(run_zerotrain "$engine")
    fi
    read -r zt_write zt_read <<<"$zt"
    read -r fio_write fio_read <<<"$fio_result"
    write_ratio=$(awk -v a="$zt_write" -v b="$fio_write" 'BEGIN {printf "%.3f", a / b}')
    read_ratio=$(awk -v a="$zt_read" -v b="$fio_read" 'BEGIN {printf "%.3f", a / b}')
    rows+=("$zt_write $fio_write $write_ratio $zt_read $fio_read $read_ratio")
    printf "%-9s %5d  %9s %9s %6s  %9s %9s %6s\n" "$engine" "$round" "$zt_write" "$fio_write" "$write_ratio" \
           "$zt_read" "$fio_read" "$read_ratio"
  done
  medians=()
  for column in 1 2 3 4 5 6; do
    medians+=("$(printf '%s\n' "${rows[@]}" | awk -v c="$column" '{print $c}' | median)")
  done
  printf "%-9s %5s  %9s %9s %6s  %9s %9s %6s\n" "$engine" median "${medians[@]}"
done
echo
echo "GiB/s; ratio = zerotrain / fio per round (median of the per-round ratios in the median row)"
