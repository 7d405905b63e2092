#!/usr/bin/env bash
# The watchdog's collective timeout from the config (comm.timeout_s) and from the environment
# (ZT_COLLECTIVE_TIMEOUT, which overrides it), with real processes: `zerotrain train` on 2 ranks,
# rank 1 stopped with SIGSTOP once training runs (rank 0 has written 2 metrics lines). The job must
# end with the watchdog's report (exit 86 or 87) within the configured 4 s plus a margin, naming
# where the timeout came from; with the default 600 s the stopped rank was found after 60 s.
# Usage: watchdog_config_timeout.sh ZEROTRAIN CONFIG MPIEXEC [MPIEXEC FLAGS...]
set -euo pipefail
zerotrain=$1 config=$2 mpiexec=$3
shift 3
mpi_flags=("$@")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
unset ZT_COLLECTIVE_TIMEOUT

python3 - "$config" "$work" <<'EOF'
import json, sys
config = json.load(open(sys.argv[1]))
for name, timeout in (("four", 4), ("default", 600)):
    config["comm"] = {"timeout_s": timeout}
    json.dump(config, open(f"{sys.argv[2]}/{name}.json", "w"))
EOF

# Runs `zerotrain train` with rank 1 stopped after 2 steps; prints the output, sets `code`, and
# `detected`: seconds from the stop to the end of the job.
run_stopped() {
  local name=$1
  rm -f "$work/metrics.jsonl" "$work/stopped_at"
  local started=$SECONDS
  set +e
  timeout 90 "$mpiexec" -n 2 "${mpi_flags[@]}" bash -c '
    rank=${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-${SLURM_PROCID:-0}}}
    if [ "$rank" = 1 ]; then
      (
        until [ "$(wc -l < "$0/metrics.jsonl" 2>/dev/null || echo 0)" -ge 2 ]; do sleep 0.1; done
        date +%s.%N > "$0/stopped_at"
        kill -STOP $$
      ) &
    fi
    exec "$@"' "$work" "$zerotrain" train --config "$work/$name.json" --steps 1000000 --print-every 1 \
      --metrics "$work/metrics.jsonl" > "$work/out.txt" 2>&1
  code=$?
  set -e
  local ended
  ended=$(date +%s.%N)
  cat "$work/out.txt"
  [ -f "$work/stopped_at" ] || { echo "FAIL ($name): rank 1 was never stopped (exit $code after $((SECONDS - started)) s)"; exit 1; }
  detected=$(python3 -c "print(round($ended - $(cat "$work/stopped_at"), 1))")
  echo "($name: exit $code, $detected s after rank 1 was stopped)"
}

expect() {  # expect NAME REGEX: the last run's output matches REGEX
  grep -Eq "$2" "$work/out.txt" || { echo "FAIL ($1): output does not match '$2'"; exit 1; }
}

check_detected_within() {  # the job ended with the watchdog's code, within $2 s of the stop
  if [ "$code" != 86 ] && [ "$code" != 87 ]; then echo "FAIL ($1): exit code $code, expected 86 or 87"; exit 1; fi
  python3 -c "import sys; sys.exit(0 if $detected <= $2 else 1)" ||
    { echo "FAIL ($1): the stopped rank was found after $detected s, expected at most $2 s"; exit 1; }
}

# comm.timeout_s: 4 in the config, no environment variable.
run_stopped four
check_detected_within config 14
expect config "zerotrain watchdog: .*(has sent no heartbeat for [4-9]\.[0-9] s|has not completed after [4-9]\.[0-9] s)"
expect config "the collective timeout comes from comm.timeout_s in config file '$work/four.json' \(4 s\), ZT_COLLECTIVE_TIMEOUT not set"

# The environment overrides the config: comm.timeout_s 600, ZT_COLLECTIVE_TIMEOUT=4.
export ZT_COLLECTIVE_TIMEOUT=4
run_stopped default
check_detected_within environment 14
expect environment "the collective timeout comes from ZT_COLLECTIVE_TIMEOUT=4, overriding comm.timeout_s in config file '$work/default.json' \(600 s\)"
unset ZT_COLLECTIVE_TIMEOUT

echo "PASS: watchdog_config_timeout"
