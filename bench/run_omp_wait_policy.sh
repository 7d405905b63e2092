#!/usr/bin/env bash
# The GPT training step (zt_bench_gpt_step) under each OpenMP waiting choice, interleaved process by
# process: every round runs every choice once, so all see the same machine load; then per choice the
# median over rounds of the step's median time, and its ratio to OMP_WAIT_POLICY=passive's.
#
#   bench/run_omp_wait_policy.sh [--rounds R] [--shape small|gpt2] [bench flags: --steps N --threads T]
#
# The choices (libgomp reads them once, when it is loaded, so each needs its own process):
#   passive             idle threads sleep at once (futex); every parallel region wakes them
#   unset               libgomp's default: spin GOMP_SPINCOUNT=300000 times, then sleep
#   spin=N              OMP_WAIT_POLICY unset, GOMP_SPINCOUNT=N
#   active              spin without end
# The zerotrain command applies its own default (OMP_WAIT_POLICY=passive) when neither variable is set
# (docs/benchmarks.md "OpenMP waiting"); this script sets or unsets them explicitly for every run.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${BUILD_DIR:-$(dirname "$here")/build}" && pwd)
bench=$build/bin/zt_bench_gpt_step
[ -x "$bench" ] || { echo "no $bench: build the target zt_bench_gpt_step first" >&2; exit 2; }
rounds=5
shape=small
choices=(passive unset spin=10000 spin=100000 active)
args=()
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --shape) shape=$2; shift 2 ;;
    --choices) IFS=, read -ra choices <<< "$2"; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done

run_choice() {  # $1: choice; prints the step's median ms
  local -a environment=(env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT)
  case $1 in
    passive | active) environment+=("OMP_WAIT_POLICY=$1") ;;
    unset) ;;
    spin=*) environment+=("GOMP_SPINCOUNT=${1#spin=}") ;;
    *) echo "unknown choice '$1'; expected passive, active, unset or spin=N" >&2; exit 2 ;;
  esac
  "${environment[@]}" "$bench" --shape "$shape" "${args[@]}" | sed -n 's/.* median \([0-9.]*\) ms .*/\1/p'
}

declare -A times
echo "zt_bench_gpt_step --shape $shape ${args[*]}: $rounds interleaved rounds; $(uptime | sed 's/.*load/load/')"
for ((round = 0; round < rounds; ++round)); do
  for ((k = 0; k < ${#choices[@]}; ++k)); do  # rotate the order from round to round
    choice=${choices[$(((k + round) % ${#choices[@]}))]}
    ms=$(run_choice "$choice")
    [ -n "$ms" ] || { echo "no median in the output of the $choice run" >&2; exit 1; }
    times[$choice]="${times[$choice]:-} $ms"
  done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
reference=$(echo "${times[passive]:-}" | median)
printf '%-14s %12s %14s   %s\n' choice "median ms" "passive/this" "per round"
for choice in "${choices[@]}"; do
  ms=$(echo "${times[$choice]}" | median)
  ratio=$([ -n "$reference" ] && awk -v a="$reference" -v b="$ms" 'BEGIN { printf "%.2f", a / b }' || echo -)
  printf '%-14s %12s %14s  %s\n' "$choice" "$ms" "$ratio" "${times[$choice]}"
done
echo "after: $(uptime | sed 's/.*load/load/')"
