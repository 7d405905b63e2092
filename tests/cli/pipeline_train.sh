#!/usr/bin/env bash
# `zerotrain train` with pipeline stages, as a user runs it (ctest cli.train_pipeline): gpt-tiny
# split into 2 stages on 2 ranks (1F1B) and 2 stages x 2 data-parallel ranks on 4 (GPipe) trains
# as one rank does (the same losses within 1e-6 relative), prints the stages and the bubble, writes
# the pipeline metrics for every stage, resumes a checkpoint saved at 2 x 2 on 2 x 1, and trains the
# 2 stages on the emulated device as on the host.
# usage: pipeline_train.sh ZEROTRAIN CONFIG MPIEXEC [MPIEXEC_FLAGS...]
source "$(dirname "$0")/offload_job.sh" pipeline-cli "$@"
/usr/bin/python3 - "$config" "$work" <<'PY'
import json, sys
config, work = sys.argv[1], sys.argv[2]
base = json.load(open(config))
json.dump(base, open(f"{work}/single.json", "w"))
json.dump(dict(base, pipeline={"stages": 2}), open(f"{work}/pp2.json", "w"))
json.dump(dict(base, pipeline={"stages": 2, "schedule": "gpipe", "partition": "uniform"}),
          open(f"{work}/pp2-dp2.json", "w"))
PY
steps=6
run() {  # run NAME RANKS CONFIG
  "${mpiexec[@]}" -n "$2" "$zt" train --config "$work/$3.json" --steps $steps --print-every 2 \
    --metrics "$work/$1.jsonl" >"$work/$1.txt" 2>&1 || fail "the $1 run failed"
}
run single 1 single
run pp2 2 pp2
run pp2-dp2 4 pp2-dp2

for name in pp2 pp2-dp2; do
  grep -Eq "^  pipeline: 2 stages x [12] data-parallel, schedule (1f1b|gpipe), [24] micro-batches \(ideal bubble 0\.[0-9]+\), partition (parameters|uniform)$" \
    "$work/$name.txt" || fail "$name: no pipeline line"
  grep -Eq "^    stage 0: embeddings \.\. h\.[0-9] \([0-9] layers\), [0-9]+ parameters$" "$work/$name.txt" ||
    fail "$name: no line for stage 0"
  grep -Eq "^    stage 1: h\.[0-9] \.\. head \([0-9] layers\), [0-9]+ parameters$" "$work/$name.txt" ||
    fail "$name: no line for stage 1"
  grep -Eq "^step +$steps/$steps \| loss [0-9.]+ \|.* \| MFU [0-9]+\.[0-9]% \| peak [0-9.]+ MiB \| bubble 0\.[0-9]+ \| elapsed [0-9]+:[0-5][0-9]:[0-5][0-9] \| ETA 0:00:00$" \
    "$work/$name.txt" || fail "$name: no progress line"
done

/usr/bin/python3 - "$work" $steps <<'PY' || fail "the metrics are not as expected"
import json, sys
work, steps = sys.argv[1], int(sys.argv[2])
def events(name):
    return [json.loads(line) for line in open(f"{work}/{name}.jsonl")]
def losses(name):
    return [e["loss"] for e in events(name) if e["event"] == "step"]
reference = losses("single")
assert len(reference) == steps, reference
assert all("pipeline" not in e for e in events("single")), "pipeline keys without stages"
for name, schedule, partition in (("pp2", "1f1b", "parameters"), ("pp2-dp2", "gpipe", "uniform")):
    start, *rest = events(name)
    step_lines = [e for e in rest if e["event"] == "step"]
    end = rest[-1]
    assert len(step_lines) == steps, (name, len(step_lines))
    p = start["pipeline"]
    m = start["gradient_accumulation_steps"]
    assert p["stages"] == 2 and p["schedule"] == schedule and p["partition"] == partition, p
    assert p["micro_batches"] == m and abs(p["ideal_bubble"] - 1 / (m + 1)) < 1e-12, p
    assert len(p["stage_layers"]) == 2 and len(p["stage_parameters"]) == 2, p
    # The tied embedding's copy on the last stage: the stages hold more than the model.
    assert sum(p["stage_parameters"]) == start["params_total"] + 256 * 128, (p, start["params_total"])
    for step in step_lines:
        s = step["pipeline"]
        assert s["stages"] == 2 and s["schedule"] == schedule and s["micro_batches"] == m, s
        assert s["ideal_bubble"] == p["ideal_bubble"], s
        for key in ("stage_busy_seconds", "stage_idle_seconds", "bubble_fraction", "stage_peak_activations"):
            assert len(s[key]) == 2, (key, s)
        assert all(b > 0 for b in s["stage_busy_seconds"]), s
        assert all(i >= 0 for i in s["stage_idle_seconds"]), s
        assert all(0 <= b < 1 for b in s["bubble_fraction"]), s
        if start["data_parallel_size"] == 1:  # one rank per stage: its own idle / (busy + idle)
            for busy, idle, bubble in zip(s["stage_busy_seconds"], s["stage_idle_seconds"], s["bubble_fraction"]):
                assert abs(bubble - idle / (busy + idle)) < 1e-9, s
        assert all(a > 0 for a in s["stage_peak_activations"]), s
    got = losses(name)
    worst = max(abs(a - b) / abs(b) for a, b in zip(got, reference))
    assert worst < 1e-6, (name, got, reference)
    assert end["event"] == "end" and end["last_loss"] < end["first_loss"], end
    print(f"{name}: {steps} steps as one rank (worst relative difference {worst:.1e}), "
          f"bubble {[round(b, 2) for b in step_lines[-1]['pipeline']['bubble_fraction']]}")
PY

# A checkpoint saved at 2 stages x 2 data-parallel ranks resumes at 2 stages x 1 and continues the
# one-rank run.
"${mpiexec[@]}" -n 4 "$zt" train --config "$work/pp2-dp2.json" --steps 3 --print-every 1 --save-dir "$work/ckpt" \
  >"$work/save.txt" 2>&1 || fail "the pipelined save failed"
grep -q "saved checkpoint $work/ckpt/global_step3.h5" "$work/save.txt" || fail "no checkpoint saved"
"${mpiexec[@]}" -n 2 "$zt" train --config "$work/pp2.json" --steps $steps --print-every 1 --save-dir "$work/ckpt" \
  --resume auto --metrics "$work/resumed.jsonl" >"$work/resumed.txt" 2>&1 || fail "the pipelined resume failed"
grep -q "resumed from $work/ckpt/global_step3.h5 at step 3" "$work/resumed.txt" || fail "not resumed at step 3"
/usr/bin/python3 - "$work" $steps <<'PY' || fail "the resumed run's losses are not the one-rank run's"
import json, sys
work, steps = sys.argv[1], int(sys.argv[2])
def losses(name):
    return {e["step"]: e["loss"] for e in map(json.loads, open(f"{work}/{name}.jsonl")) if e["event"] == "step"}
reference, resumed = losses("single"), losses("resumed")
assert sorted(resumed) == list(range(4, steps + 1)), sorted(resumed)
worst = max(abs(resumed[s] - reference[s]) / abs(reference[s]) for s in resumed)
assert worst < 1e-6, (resumed, reference)
print(f"resumed at 2 x 1 from 2 x 2: steps 4-{steps} as one rank (worst relative difference {worst:.1e})")
PY
# The same 2 stages with the engine on the emulated device (sends and receives paired as NCCL needs
# them): the host run's losses bit for bit.
"${mpiexec[@]}" -n 2 "$zt" train --config "$work/pp2.json" --steps $steps --print-every 2 --device emulated \
  --metrics "$work/pp2-emulated.jsonl" >"$work/pp2-emulated.txt" 2>&1 || fail "the pipelined run on the emulated device failed"
/usr/bin/python3 - "$work" <<'PY' || fail "the emulated device's pipelined losses are not the host's"
import json, sys
work = sys.argv[1]
def losses(name):
    return [e["loss"] for e in map(json.loads, open(f"{work}/{name}.jsonl")) if e["event"] == "step"]
host, device = losses("pp2"), losses("pp2-emulated")
assert device == host and len(host) > 0, (device, host)
print(f"pp2 on the emulated device: {len(host)} steps, the host's losses bit for bit")
PY
grep "zerotrain train:" "$work/pp2-dp2.txt"
echo "PASS: train_pipeline"
