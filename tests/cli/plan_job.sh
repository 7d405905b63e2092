#!/usr/bin/env bash
# `zerotrain plan` as a user runs it (ctest cli.plan.np2, cli.plan.np4): a small built-in GPT with
# a global batch of 16 on RANKS ranks, four candidates that fit the memory limit and four that do
# not. Checks the exit code, the pruned lines, the ranked table (in tokens/s order, the chosen one
# first, predicted against measured), the baseline line, both resumes and their sample ids, the
# export, the report files, and that `zerotrain train --config plan.json` on RANKS ranks gives the
# plan's check-run losses exactly.
# usage: plan_job.sh PYTHON3 RANKS CANDIDATES MEMORY_LIMIT ZEROTRAIN CONFIG MPIEXEC [MPIEXEC_FLAGS...]
set -euo pipefail
python=$1 ranks=$2 candidates=$3 memory_limit=$4 zt=$5 config=$6
shift 6
mpiexec=("$@")
work=$(mktemp -d "${TMPDIR:-/tmp}/zt-plan-XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() {
  echo "FAIL: $*"
  for log in "$work"/*.txt; do echo "--- $log"; cat "$log"; done
  exit 1
}
expect() {  # expect FILE REGEX WHAT
  grep -Eq -- "$2" "$1" || fail "$3: no line matching '$2' in $(basename "$1")"
}

"${mpiexec[@]}" -n "$ranks" "$zt" plan --config "$config" --global-batch 16 --candidates "$candidates" \
  --memory-limit "$memory_limit" --out "$work/plan" --measure-steps 2 >"$work/plan.txt" 2>&1 ||
  fail "zerotrain plan exited with $?"
out=$work/plan.txt
half=$((ranks / 2))
expect "$out" "^zerotrain plan: GPT model, [0-9]+ parameters, fp32, global batch 16 on $ranks rank\(s\)" header
expect "$out" "^  8 candidate\(s\), 4 pruned by their predicted peak:$" "pruned count"
[ "$(grep -Ec "^    pruned: stage [13], offload (none|cpu), micro [0-9]+ x gas [0-9]+: predicted peak .* > limit " "$out")" = 4 ] ||
  fail "four pruned lines with their reason expected"
expect "$out" "^  rank stage offload micro x gas step ms tokens/s predicted peak measured peak measured/predicted +peak RSS$" "table header"
[ "$(grep -Ec "^ +[1-4] +[13] +(none|cpu) +[0-9]+ x [0-9]+ +[0-9.]+ +[0-9]+ +[0-9.]+ [KM]iB +[0-9.]+ [KM]iB +[0-9.]+ +[0-9.]+ MiB$" "$out")" = 4 ] ||
  fail "four ranked rows expected"
expect "$out" "^baseline: 8 steps of $ranks rank\(s\) against 1 rank \(micro [0-9]+ x gas [0-9]+, the same 16 samples per step\): losses (bitwise equal|max relative difference [0-9.e-]+ \(tolerance 1e-5)" baseline
expect "$out" "^resume on $ranks rank\(s\) from step 4: steps 5-8 losses bitwise equal to the uninterrupted run's \(expected bitwise: the same layout\); sample ids identical$" "resume at the same size"
expect "$out" "^resume on $half rank\(s\) from step 4: steps 5-8 losses (bitwise equal|max relative difference [0-9.e-]+) to the uninterrupted run's.*; sample ids identical$" "resume at half the size"
expect "$out" "^export: .*/plan/weights.h5 \([0-9]+ parameter elements of the step-8 checkpoint, verified\)$" export
expect "$out" "^samples: 8 steps x 16 = 128 sample ids, all distinct \(no sample repeated\); each resumed step read the uninterrupted step's samples: none skipped or repeated$" samples
expect "$out" "^zerotrain plan: all checks passed$" verdict
[ -s "$work/plan/weights.h5" ] || fail "no exported weights"
for section in "## Environment" "## Candidates" "## Chosen" "## Checks" "Result: all checks passed"; do
  expect "$work/plan/plan-report.md" "^$section" "plan-report.md"
done

# The report's numbers: pruned ones above the limit, measured ones within it, ranked by tokens/s.
"$python" - "$work/plan/plan-report.json" "$ranks" >"$work/report-check.txt" 2>&1 <<'EOF' || fail "plan-report.json: $(cat "$work/report-check.txt")"
import json, sys
report = json.load(open(sys.argv[1]))
ranks = int(sys.argv[2])
limit = report["memory_limit"]["bytes"]
assert report["world_size"] == ranks and sum(report["ranks_per_node"]) == ranks, "ranks"
assert len(report["devices"]) == ranks, "devices"
for key in ("mpi", "io", "build", "cuda"):
    assert key in report["environment"], key
assert report["environment"]["io"]["HDF5"], "HDF5 version"
measured = [c for c in report["candidates"] if "measured" in c]
pruned = [c for c in report["candidates"] if "pruned" in c]
assert len(measured) == 4 and len(pruned) == 4, (len(measured), len(pruned))
assert all(c["predicted"]["peak"] > limit for c in pruned), "a pruned candidate fits"
assert all(c["predicted"]["peak"] <= limit for c in measured), "a measured candidate does not fit"
ranked = sorted(measured, key=lambda c: c["rank"])
speeds = [c["measured"]["tokens_per_s"] for c in ranked]
assert speeds == sorted(speeds, reverse=True), speeds
best = ranked[0]
assert {k: best[k] for k in report["chosen"]} == report["chosen"], "chosen is not rank 1"
# The resident model states the engine allocated are the plan's prediction, byte for byte.
for c in measured:
    assert c["measured"]["resident_model_states"] == c["predicted"]["model_states"], c
assert report["config"]["zero_optimization"]["stage"] == best["stage"]
assert report["config"]["train_micro_batch_size_per_gpu"] * report["config"]["gradient_accumulation_steps"] * ranks == 16
assert report["passed"] is True
print(json.dumps(report["reproduce"]["losses"]))
EOF

# plan.json through `zerotrain train`: the check run's losses, bit for bit.
"${mpiexec[@]}" -n "$ranks" "$zt" train --config "$work/plan/plan.json" --steps 8 --metrics "$work/train.jsonl" \
  >"$work/train.txt" 2>&1 || fail "zerotrain train --config plan.json failed"
"$python" - "$work/plan/plan-report.json" "$work/train.jsonl" >"$work/reproduce.txt" 2>&1 <<'EOF' || fail "$(cat "$work/reproduce.txt")"
import json, sys
planned = json.load(open(sys.argv[1]))["reproduce"]["losses"]
trained = [r["loss"] for r in map(json.loads, open(sys.argv[2])) if r.get("event") == "step"]
assert trained == planned, f"train --config plan.json: {trained} != the plan's {planned}"
EOF
grep "^chosen:" "$out"
echo "PASS: plan.np$ranks (4 of 8 candidates measured, baseline, resumes at $ranks and $half ranks, export, train --config plan.json reproduces the losses)"
