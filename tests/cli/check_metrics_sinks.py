#!/usr/bin/python3
"""zerotrain train's metrics sinks and alerts, read back without zerotrain (docs/metrics.md).

    tests/cli/check_metrics_sinks.py ZEROTRAIN CONFIG WORK_DIR MPIEXEC [MPIEXEC_FLAGS...]

Trains gpt-tiny on 2 ranks for 4 steps with "csv_monitor" and "tensorboard" enabled, a JSON-lines
file and an alerts.memory_limit the run passes at once, then checks:
- csv_monitor: DeepSpeed's layout, WORK/csv/job/Train_Samples_<name>.csv, header "step,<name>",
  one row per step at the global samples, the values of the JSON lines;
- tensorboard: WORK/tb/job/events.out.tfevents.*, decoded by an independent reader of TFRecord
  (both masked CRC32Cs checked) and of the Event/Summary protobufs written here from the
  published formats; and, where the tensorboard package can be had (Debian has none: a venv in
  WORK/.. with `pip install tensorboard`), by its EventAccumulator: the same scalars;
- the memory alert: one warning line on stderr and one {"event": "alert", "kind": "memory"} record;
- the watchdog's report in the metrics file: rank 1 stopped (SIGSTOP) mid-run, rank 0's watchdog
  ends the job and its report is an alert record (kind rank_lost or collective_timeout).
Prints "PASS: metrics_sinks" when everything holds; exit 1 otherwise.
"""
import glob
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time

from clitest import check, finish

zerotrain, config_path, work = sys.argv[1:4]
mpiexec = sys.argv[4:]
# ---- an independent TFRecord + protobuf reader (formats as published by TensorFlow) -------------
def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(crc):
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecords(path):
    data = open(path, "rb").read()
    offset = 0
    while offset < len(data):
        header = data[offset:offset + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[offset + 8:offset + 12])
        check(length_crc == masked(crc32c(header)), f"{path}: record at {offset}: length CRC")
        payload = data[offset + 12:offset + 12 + length]
        (payload_crc,) = struct.unpack("<I", data[offset + 12 + length:offset + 16 + length])
        check(payload_crc == masked(crc32c(payload)), f"{path}: record at {offset}: data CRC")
        yield payload
        offset += 16 + length


def protobuf_fields(data):
    """(field number, wire type, value) of a message: varint ints, fixed as bytes, nested as bytes."""
    offset = 0

    def varint():
        nonlocal offset
        value, shift = 0, 0
        while True:
            byte = data[offset]
            offset += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return value

    while offset < len(data):
        key = varint()
        field, wire = key >> 3, key & 7
        if wire == 0:
            yield field, wire, varint()
        elif wire == 1:
            yield field, wire, data[offset:offset + 8]
            offset += 8
        elif wire == 2:
            length = varint()
            yield field, wire, data[offset:offset + length]
            offset += length
        elif wire == 5:
            yield field, wire, data[offset:offset + 4]
            offset += 4
        else:
            raise ValueError(f"wire type {wire}")


def read_events(path):
    """file_version and {tag: [(step, value)]} of an event file."""
    version, scalars = None, {}
    for record in tfrecords(path):
        step = 0
        values = []
        for field, wire, value in protobuf_fields(record):
            if field == 2 and wire == 0:
                step = value
            elif field == 3 and wire == 2:
                version = value.decode()
            elif field == 5 and wire == 2:  # Summary
                for f, w, summary_value in protobuf_fields(value):
                    if f == 1 and w == 2:  # Summary.Value
                        tag, simple = None, None
                        for vf, vw, v in protobuf_fields(summary_value):
                            if vf == 1 and vw == 2:
                                tag = v.decode()
                            elif vf == 2 and vw == 5:
                                (simple,) = struct.unpack("<f", v)
                        values.append((tag, simple))
        for tag, simple in values:
            scalars.setdefault(tag, []).append((step, simple))
    return version, scalars


def float32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


# ---- the run -------------------------------------------------------------------------------------
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
config = json.load(open(config_path))
config["csv_monitor"] = {"enabled": True, "output_path": os.path.join(work, "csv"), "job_name": "job"}
config["tensorboard"] = {"enabled": True, "output_path": os.path.join(work, "tb"), "job_name": "job"}
config["alerts"] = {"memory_limit": 1 << 20}  # 1 MiB: every rank passes 95 % of it at step 1
with open(os.path.join(work, "config.json"), "w") as out:
    json.dump(config, out)
run = subprocess.run(mpiexec + ["-n", "2", zerotrain, "train", "--config", os.path.join(work, "config.json"),
                                "--steps", "4", "--metrics", os.path.join(work, "run.jsonl")],
                     capture_output=True, text=True, timeout=240)
print(run.stdout[-3000:], run.stderr[-3000:])
check(run.returncode == 0, f"train exited {run.returncode}")
records = [json.loads(line) for line in open(os.path.join(work, "run.jsonl"))]
steps = [r for r in records if r["event"] == "step"]
check(len(steps) == 4, f"4 step records, got {len(steps)}")
check(f"metrics: csv_monitor {work}/csv/job/" in run.stdout, "the header names the csv_monitor directory")

# Resident memory next to the accounted peak: every step's, the run's peak in the end record, the
# runtime's own in the start record, and the summary line.
start = [r for r in records if r["event"] == "start"][0]
end = [r for r in records if r["event"] == "end"][0]
check(start.get("runtime_rss_bytes", 0) > 0, f"start record: runtime_rss_bytes {start.get('runtime_rss_bytes')}")
for s in steps:
    mem = s["mem"]
    check(mem.get("peak_rss_bytes", 0) >= mem.get("rss_bytes", 0) > start["runtime_rss_bytes"] // 2,
          f"step {s['step']}: rss_bytes {mem.get('rss_bytes')}, peak_rss_bytes {mem.get('peak_rss_bytes')}")
check(end.get("peak_rss_bytes") == max(s["mem"]["peak_rss_bytes"] for s in steps)
      and end.get("peak_bytes") == max(s["mem"]["peak"] for s in steps), f"end record: {end}")
check(re.search(r"memory per rank: accounted peak [0-9.]+ MiB, peak RSS [0-9.]+ MiB \([0-9.]+ MiB before the model",
                run.stdout) is not None, "the summary names the accounted peak and the peak RSS")
rss_csv = os.path.join(work, "csv", "job", "Train_Samples_mem_peak_rss_bytes.csv")
check(os.path.isfile(rss_csv), "peak RSS in the CSV files")

# Memory alert: once (not every step), on stderr and in the metrics.
alerts = [r for r in records if r["event"] == "alert"]
check(len(alerts) == 1 and alerts[0]["kind"] == "memory", f"one memory alert, got {alerts}")
if alerts:
    alert = alerts[0]
    check(alert["limit"] == "alerts.memory_limit" and alert["limit_bytes"] == 1 << 20, f"alert limit: {alert}")
    check(alert["bytes"] > 0.95 * (1 << 20) and alert["step"] == 1 and alert["rank"] in (0, 1), f"alert: {alert}")
warnings = [line for line in run.stderr.splitlines() if "warning: memory of rank" in line]
check(len(warnings) == 1 and "passed 95 % of its limit at step 1" in warnings[0] and "alerts.memory_limit" in warnings[0],
      f"one warning line on stderr, got {warnings}")

# CSV: DeepSpeed's csv_monitor layout and the JSON lines' values.
expected = {"train_loss": "loss", "lr": "lr", "loss_scale": "loss_scale", "grad_norm": "grad_norm",
            "tokens_per_s": "tokens_per_s", "mfu": "mfu", "comm_wait_s": "comm_wait_s"}
for name, key in expected.items():
    path = os.path.join(work, "csv", "job", f"Train_Samples_{name}.csv")
    check(os.path.isfile(path), f"{path} exists")
    if not os.path.isfile(path):
        continue
    rows = [line.split(",") for line in open(path).read().splitlines()]
    check(rows[0] == ["step", name], f"{path}: header {rows[0]}")
    check([int(r[0]) for r in rows[1:]] == [s["samples"] for s in steps], f"{path}: steps are the global samples")
    check([float(r[1]) for r in rows[1:]] == [float(s[key]) for s in steps], f"{path}: values of '{key}'")
memory_csv = os.path.join(work, "csv", "job", "Train_Samples_mem_optimizer_states.csv")
check(os.path.isfile(memory_csv) and open(memory_csv).readline().strip() == "step,mem_optimizer_states",
      "memory by category in the CSV files")

# TensorBoard: the independent reader.
files = glob.glob(os.path.join(work, "tb", "job", "events.out.tfevents.*"))
check(len(files) == 1, f"one event file, got {files}")
tags = {}
if files:
    version, tags = read_events(files[0])
    check(version == "brain.Event:2", f"file_version {version}")
    for name, key in expected.items():
        got = tags.get(f"Train/Samples/{name}", [])
        check(got == [(s["samples"], float32(s[key])) for s in steps], f"event file Train/Samples/{name}: {got}")

# TensorBoard: its own EventAccumulator, where the package can be installed.
venv = os.path.join(os.path.dirname(os.path.abspath(work)), "tensorboard-venv")
python = os.path.join(venv, "bin", "python3")
if not os.path.exists(os.path.join(venv, ".installed")):
    made = subprocess.run([sys.executable, "-m", "venv", venv], capture_output=True, text=True)
    made = made if made.returncode else subprocess.run(
        [os.path.join(venv, "bin", "pip"), "install", "-q", "tensorboard"], capture_output=True, text=True,
        timeout=600)
    if made.returncode == 0:
        open(os.path.join(venv, ".installed"), "w").close()
    else:
        print("tensorboard package unavailable (venv + pip install tensorboard failed):", made.stderr[-500:])
if files and os.path.exists(os.path.join(venv, ".installed")):
    reader = ("import json, sys\n"
              "from tensorboard.backend.event_processing.event_accumulator import EventAccumulator\n"
              "acc = EventAccumulator(sys.argv[1]); acc.Reload()\n"
              "print(json.dumps({t: [[e.step, e.value] for e in acc.Scalars(t)] for t in acc.Tags()['scalars']}))\n")
    read = subprocess.run([python, "-c", reader, os.path.join(work, "tb", "job")], capture_output=True, text=True)
    check(read.returncode == 0, f"EventAccumulator failed: {read.stderr[-1000:]}")
    if read.returncode == 0:
        accumulated = json.loads(read.stdout.splitlines()[-1])
        check({t: [tuple(e) for e in v] for t, v in accumulated.items()} == tags,
              "EventAccumulator reads the same scalars as the independent reader")
        check(len(accumulated) >= 10, f"EventAccumulator tags: {sorted(accumulated)}")
        print(f"tensorboard EventAccumulator: {len(accumulated)} scalar tags, as the independent reader")
else:
    print("checked with the independent TFRecord/protobuf reader only")

# The watchdog's report as an alert: rank 1 stopped, rank 0 ends the job.
environment = dict(os.environ, ZT_COLLECTIVE_TIMEOUT="5")
metrics = os.path.join(work, "lost.jsonl")
job = subprocess.Popen(mpiexec + ["-n", "2", "-x", "ZT_COLLECTIVE_TIMEOUT", zerotrain, "train", "--config", config_path,
                                  "--steps", "100000", "--metrics", metrics],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environment)
stopped = None
deadline = time.time() + 120
while time.time() < deadline and stopped is None:
    time.sleep(0.25)
    if os.path.exists(metrics) and '"step":3,' in open(metrics).read():
        for child in subprocess.run(["pgrep", "-P", str(job.pid)], capture_output=True, text=True).stdout.split():
            try:
                environ = open(f"/proc/{child}/environ", "rb").read().split(b"\0")
            except OSError:
                continue
            if b"OMPI_COMM_WORLD_RANK=1" in environ:
                os.kill(int(child), signal.SIGSTOP)
                stopped = int(child)
check(stopped is not None, "found rank 1 to stop")
try:
    output, _ = job.communicate(timeout=90)
except subprocess.TimeoutExpired:
    job.kill()
    output, _ = job.communicate()
    check(False, "the job with a stopped rank did not end")
if stopped is not None:
    try:
        os.kill(stopped, signal.SIGKILL)
    except OSError:
        pass
check(job.returncode != 0, "the job with a stopped rank failed")
lost = [json.loads(line) for line in open(metrics) if line.strip().endswith("}")]
watchdog = [r for r in lost if r["event"] == "alert" and r["kind"] in ("rank_lost", "collective_timeout")]
check(len(watchdog) == 1, f"one watchdog alert in the metrics, got {watchdog}; output: {output[-2000:]}")
if watchdog:
    check(watchdog[0]["rank"] == 0 and watchdog[0]["exit_code"] in (86, 87), f"watchdog alert: {watchdog[0]}")
    check("zerotrain watchdog" in watchdog[0]["report"] and watchdog[0]["report"].strip() in output,
          "the alert carries the report the watchdog printed")
finish("PASS: metrics_sinks")
