#!/usr/bin/env python3
"""Hostile and damaged checkpoint files, and a checkpoint directory shared by jobs (issue 16).

    hostile_checkpoints.py setup  ZEROTRAIN WORK -- MPIEXEC [FLAGS...]
    hostile_checkpoints.py CASE   ZEROTRAIN WORK -- MPIEXEC [FLAGS...]

`setup` trains a small GPT on 2 ranks with a checkpoint every step: WORK/pristine holds
global_step1..3 (latest: global_step3). Each CASE copies it, damages it with h5py as the case says
(most cases damage global_step3, the latest), then runs under mpirun, as a user would:

  zerotrain checkpoint verify DIR, zerotrain checkpoint inspect DIR, and
  zerotrain train --resume auto --save-dir DIR --steps 4,

asserting each one's exit code and message. No run may end by a signal (a crash). The damage most
cases make is invisible to the attribute checksum (it is recomputed after the edit, as a deliberate
edit would), so that the check the case is about is the one that must catch it.

Exit 0 and "PASS: CASE" when every assertion holds; 77 (ctest skip) when h5py is missing.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

try:
    import h5py
    import numpy as np
except ImportError as missing:  # pragma: no cover
    print(f"SKIPPED: {missing} (install python3-h5py: scripts/setup.sh does)")
    sys.exit(77)

CONFIG = {
    "train_batch_size": 4,
    "train_micro_batch_size_per_gpu": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
    "zero_optimization": {"stage": 1},
    "model": {"type": "gpt", "n_layer": 1, "n_head": 2, "d_model": 16, "seq_len": 8, "vocab_size": 256},
    "data": {"format": "builtin"},
    "steps_per_print": 1,
    "seed": 7,
}
NO_VALID_CHECKPOINT_EXIT = 74  # zt::kNoValidCheckpointExitCode
PREEMPTED_EXIT = 75  # zt::kPreemptedExitCode


class Failure(Exception):
    pass


def check(condition, message, output=""):
    if not condition:
        raise Failure(message + ("\n--- output ---\n" + output if output else ""))


# ---- the attribute checksum, as docs/checkpoint-format.md defines it --------------------------------
def attributes_checksum(path):
    """FNV-1a 64 over (object, attribute, kind, value) of every attribute but /attributes_checksum."""
    fnv = 0xCBF29CE484222325

    def feed(data):
        nonlocal fnv
        for byte in len(data).to_bytes(8, "little") + data:
            fnv = ((fnv ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF

    def attributes(name, node):
        obj = "/" if name == "" else "/" + name
        for key in sorted(node.attrs.keys(), key=lambda k: k.encode()):
            if obj == "/" and key == "attributes_checksum":
                continue
            value = node.attrs[key]
            feed(obj.encode())
            feed(key.encode())
            if isinstance(value, bytes):
                feed(b"s")
                feed(value.split(b"\0")[0])
            elif np.issubdtype(np.asarray(value).dtype, np.floating):
                feed(b"f")
                feed(np.float64(value).tobytes())
            elif np.issubdtype(np.asarray(value).dtype, np.unsignedinteger):
                feed(b"u")
                feed(int(value).to_bytes(8, "little"))
            else:
                feed(b"i")
                feed(int(value).to_bytes(8, "little", signed=True))

    with h5py.File(path, "r") as f:
        attributes("", f)
        names = []
        f.visit(names.append)  # hard links only, in name order per group
        for name in sorted(names, key=lambda n: [part.encode() for part in n.split("/")]):
            link = f.get(name, getlink=True)
            if isinstance(link, h5py.HardLink):
                attributes(name, f[name])
    return fnv


def forge(path):
    """Recompute the attribute checksum after an edit, as someone who edits a file on purpose would."""
    value = attributes_checksum(path)
    with h5py.File(path, "r+") as f:
        f.attrs.create("attributes_checksum", value, dtype=np.uint64)


# ---- running zerotrain ------------------------------------------------------------------------
class Runner:
    def __init__(self, zerotrain, work, mpiexec):
        self.zerotrain, self.work, self.mpiexec = zerotrain, work, mpiexec

    def run(self, ranks, *args, expect_code, expect=(), absent=(), timeout=240):
        command = self.mpiexec + ["-n", str(ranks), self.zerotrain] + [str(a) for a in args]
        began = time.monotonic()
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              errors="replace", timeout=timeout, env=dict(os.environ, ZT_CHECKPOINT_SYNC_TIMEOUT="60"))
        out = done.stdout
        shown = f"$ {' '.join(command)}  (exit {done.returncode}, {time.monotonic() - began:.1f} s)"
        print(shown)
        check(done.returncode >= 0 and done.returncode < 128, f"{shown}: ended by a signal", out)
        check(not re.search(r"Segmentation fault|signal 11|signal 6|core dumped|exited on signal", out),
              f"{shown}: a process crashed", out)
        check(done.returncode == expect_code, f"{shown}: exit {done.returncode}, expected {expect_code}", out)
        for pattern in expect:
            check(re.search(pattern, out, re.S), f"{shown}: no match for {pattern!r}", out)
        for pattern in absent:
            check(not re.search(pattern, out, re.S), f"{shown}: unexpected match for {pattern!r}", out)
        return out

    def config(self, name, **model):
        config = json.loads(json.dumps(CONFIG))
        config["model"].update(model)
        path = os.path.join(self.work, name)
        with open(path, "w") as out:
            json.dump(config, out)
        return path

    def train(self, directory, *extra, ranks=2, steps=4, config="config.json", **kwargs):
        return self.run(ranks, "train", "--config", os.path.join(self.work, config), "--steps", steps,
                        "--save-dir", directory, *extra, **kwargs)


def fresh_copy(runner, case):
    directory = os.path.join(runner.work, case, "ck")
    shutil.rmtree(os.path.join(runner.work, case), ignore_errors=True)
    shutil.copytree(os.path.join(runner.work, "pristine"), directory)
    lock = os.path.join(directory, ".zerotrain.lock")
    if os.path.exists(lock):
        os.remove(lock)
    return directory


# ---- the cases ----------------------------------------------------------------------------------
# Each: (damage(dir) -> None, verify/inspect message, inspect's exit code). Damage goes into
# global_step3.h5 (the latest); --resume auto then falls back to global_step2.
def replace_dataset(directory, name, make):
    with h5py.File(os.path.join(directory, "global_step3.h5"), "r+") as f:
        del f[name]
        make(f, name)
    forge(os.path.join(directory, "global_step3.h5"))


def edit_attribute(directory, owner, key, change, forged):
    path = os.path.join(directory, "global_step3.h5")
    with h5py.File(path, "r+") as f:
        node = f[owner] if owner else f
        old = node.attrs[key]
        node.attrs.create(key, change(old), dtype=np.asarray(old).dtype)
    if forged:
        forge(path)


def write_outside_file(directory):
    outside = os.path.join(os.path.dirname(directory), "outside.h5")
    with h5py.File(outside, "w") as f:
        f.create_dataset("data", data=np.zeros(16, dtype=np.float32))
    return outside


FILE_CASES = {
    "scalar_dataset": (
        lambda d: replace_dataset(d, "model/ln_f.bias", lambda f, n: f.create_dataset(n, data=np.float32(1))),
        r"dataset 'model/ln_f\.bias' has a scalar \(0-d\) dataspace; expected an array of rank >= 1"),
    "null_dataspace": (
        lambda d: replace_dataset(d, "model/ln_f.bias", lambda f, n: f.create_dataset(n, data=h5py.Empty("f4"))),
        r"dataset 'model/ln_f\.bias' has a null dataspace"),
    "missing_model_dataset": (
        lambda d: replace_dataset(d, "model/ln_f.bias", lambda f, n: None),
        r"holds [0-9]+ parameter elements in [0-9]+ datasets under /model, but records [0-9]+"),
    "missing_optimizer_dataset": (
        lambda d: replace_dataset(d, "optimizer/exp_avg/ln_f.bias", lambda f, n: None),
        r"has no dataset 'optimizer/exp_avg/ln_f\.bias'"),
    "group_for_dataset": (
        lambda d: replace_dataset(d, "model/ln_f.bias", lambda f, n: f.create_group(n)),
        r"object 'model/ln_f\.bias' is a group; expected a dataset"),
    "wrong_dtype": (
        lambda d: replace_dataset(d, "model/ln_f.bias",
                                  lambda f, n: f.create_dataset(n, data=np.zeros(16, dtype=np.int32))),
        r"dataset 'model/ln_f\.bias' holds 4-byte integers; expected fp32"),
    "changed_data_offset": (
        lambda d: edit_attribute(d, "engine", "data_offset", lambda v: v + 8, forged=False),
        r"has attributes that do not match their checksum"),
    "changed_optimizer_step": (
        lambda d: edit_attribute(d, "optimizer", "step", lambda v: v + 1, forged=False),
        r"has attributes that do not match their checksum"),
    "format_999": (
        lambda d: edit_attribute(d, "", "format_version", lambda v: 999, forged=True),
        r"has format version 999; this zerotrain reads versions 1 to [0-9]+"),
    "external_link": (
        lambda d: replace_dataset(d, "model/ln_f.bias",
                                  lambda f, n: f.__setitem__(n, h5py.ExternalLink(write_outside_file(d), "/data"))),
        r"'model/ln_f\.bias' is an external link \(to another file\); a checkpoint holds hard links only"),
    "soft_link": (
        lambda d: replace_dataset(d, "model/ln_f.bias", lambda f, n: f.__setitem__(n, h5py.SoftLink("/model/ln_f.weight"))),
        r"'model/ln_f\.bias' is a soft link; a checkpoint holds hard links only"),
    "truncated": (
        lambda d: os.truncate(os.path.join(d, "global_step3.h5"), os.path.getsize(os.path.join(d, "global_step3.h5")) // 2),
        r"global_step3\.h5"),
}


def file_case(runner, case):
    damage, message = FILE_CASES[case]
    directory = fresh_copy(runner, case)
    damage(directory)
    failed = r"FAILED: [^\n]*checkpoint '[^']*global_step3\.h5'[^\n]*" if case != "truncated" else r"FAILED: "
    runner.run(2, "checkpoint", "verify", directory, expect_code=1, expect=[failed, message])
    runner.run(2, "checkpoint", "inspect", directory, expect_code=1, expect=[failed, message])
    # The older checkpoints still verify, and --resume auto falls back to the newest of them.
    runner.run(2, "checkpoint", "verify", directory, "--tag", "global_step2", expect_code=0, expect=[r"^OK "])
    runner.train(directory, "--resume", "auto", expect_code=0,
                 expect=[r"skipping checkpoint 'global_step3': [^\n]*" + (message if case != "truncated" else ""),
                         r"resumed from [^\n]*/global_step2\.h5 at step 2", r"saved checkpoint [^\n]*global_step4\.h5"])


def forged_data_offset(runner, case):
    """data_offset moved by 8 samples and the attribute checksum recomputed: the file is consistent
    by itself (verify passes), but its data position is not where its global samples end."""
    directory = fresh_copy(runner, case)
    edit_attribute(directory, "engine", "data_offset", lambda v: v + 8, forged=True)
    runner.run(2, "checkpoint", "verify", directory, expect_code=0, expect=[r"^OK "])
    runner.train(directory, "--resume", "auto", expect_code=0,
                 expect=[r"skipping checkpoint 'global_step3': [^\n]*its data position \(epoch [0-9]+, offset [0-9]+ of "
                         r"[0-9]+ samples\) is not where its 12 global samples end",
                         r"resumed from [^\n]*/global_step2\.h5 at step 2"])
    # Named explicitly, it is refused too (exit 1: an error, not a fallback).
    runner.train(directory, "--resume", os.path.join(directory, "global_step3.h5"), expect_code=1,
                 expect=[r"its data position \(epoch [0-9]+, offset [0-9]+ of [0-9]+ samples\) is not where 12 "
                         r"global samples end"])


def latest_case(runner, case):
    directory = fresh_copy(runner, case)
    if case == "latest_traversal":
        other = os.path.join(runner.work, case, "other")
        shutil.copytree(os.path.join(runner.work, "pristine"), other)
        content, shown = b"../other/global_step3\n", r"\.\./other/global_step3"
    else:  # latest_nul
        content, shown = b"global_step3\0../../etc\n", r"global_step3\\x00\.\./\.\./etc"
    with open(os.path.join(directory, "latest"), "wb") as out:
        out.write(content)
    message = r"'[^']*/latest' does not hold a checkpoint tag: \"" + shown + r"\"; expected one plain tag name"
    runner.run(2, "checkpoint", "verify", directory, expect_code=1, expect=[message])
    runner.run(2, "checkpoint", "inspect", directory, expect_code=1, expect=[message])
    out = runner.train(directory, "--resume", "auto", expect_code=0,
                       expect=[r"ignoring [^\n]*/latest: [^\n]*does not hold a checkpoint tag",
                               r"resumed from [^\n]*/ck/global_step3\.h5 at step 3"],
                       absent=[r"MPI_ERR|MPI-IO|other/global_step3\.h5 at step"])
    check(len(out.splitlines()) < 60, "too much output for a bad latest", out)


def symlinked_temp(runner, case):
    """A link planted at the old fixed temporary name (and at the lock file) must not be followed."""
    directory = fresh_copy(runner, case)
    victim = os.path.join(runner.work, case, "victim.txt")
    with open(victim, "w") as out:
        out.write("precious\n")
    os.symlink(victim, os.path.join(directory, ".latest.tmp"))
    runner.train(directory, "--resume", "auto", expect_code=0, expect=[r"saved checkpoint [^\n]*global_step4\.h5"])
    with open(victim) as f:
        check(f.read() == "precious\n", "the file behind the planted link was overwritten")
    check(not os.path.islink(os.path.join(directory, "latest")), "latest became a link")
    with open(os.path.join(directory, "latest")) as f:
        check(f.read() == "global_step4\n", "latest does not name global_step4")
    mode = os.stat(os.path.join(directory, "latest")).st_mode & 0o7777
    check(mode == 0o640, f"latest has mode {mode:o}, expected 640")
    # A link in place of the lock file is refused at the start, naming it.
    os.remove(os.path.join(directory, ".zerotrain.lock"))
    os.symlink(victim, os.path.join(directory, ".zerotrain.lock"))
    runner.train(directory, "--resume", "auto", steps=5, expect_code=1,
                 expect=[r"cannot open the checkpoint directory's lock file '[^']*\.zerotrain\.lock': [^\n]*"
                         r"\(it is a symbolic link; remove it\)"], absent=[r"step +5/[0-9]+ \|"])
    with open(victim) as f:
        check(f.read() == "precious\n", "the file behind the planted lock link was changed")


def all_damaged(runner, case):
    directory = fresh_copy(runner, case)
    for step in (1, 2, 3):
        edit_attribute_path = os.path.join(directory, f"global_step{step}.h5")
        with h5py.File(edit_attribute_path, "r+") as f:
            f["engine"].attrs.create("global_samples", 99, dtype=np.int64)
    runner.run(2, "checkpoint", "verify", directory, expect_code=1, expect=[r"do not match their checksum"])
    out = runner.train(directory, "--resume", "auto", expect_code=NO_VALID_CHECKPOINT_EXIT,
                       expect=[r"skipping checkpoint 'global_step3'", r"skipping checkpoint 'global_step1'",
                               r"--resume auto: none of the 3 checkpoint\(s\) in '[^']*' is valid [^\n]*refusing "
                               r"to start from step 0 over them"],
                       absent=[r"step +1/[0-9]+ \|"])
    check(sorted(n for n in os.listdir(directory) if n.endswith(".h5")) ==
          ["global_step1.h5", "global_step2.h5", "global_step3.h5"], "the damaged checkpoints were touched", out)
    # With no checkpoint at all, --resume auto starts afresh (the first run of a requeue loop).
    empty = os.path.join(runner.work, case, "empty")
    runner.train(empty, "--resume", "auto", steps=1, expect_code=0,
                 expect=[r"no checkpoint in [^\n]* yet; starting from step 0"])


def other_model(runner, case):
    """Same shapes, another model: n_head 4 instead of 2 (d_model 16 either way)."""
    directory = fresh_copy(runner, case)
    runner.config("config-n_head4.json", n_head=4)
    runner.train(directory, "--resume", "auto", config="config-n_head4.json", expect_code=1,
                 expect=[r"was saved from another model configuration: model\.n_head: 2 in the checkpoint, 4 in "
                         r"this run"], absent=[r"step +4/[0-9]+ \|"])


def wait_for(predicate, seconds, what):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise Failure(f"timed out waiting for {what}")


def two_jobs(runner, case):
    """Job A trains and saves every step; job B on the same --save-dir fails at its start naming A's
    host and pid, and A goes on saving. Temporaries of live writers are kept, of dead ones removed."""
    directory = os.path.join(runner.work, case, "ck")
    shutil.rmtree(os.path.join(runner.work, case), ignore_errors=True)
    os.makedirs(directory)
    host = socket.gethostname()
    sleeper = subprocess.Popen(["sleep", "600"])  # a live process of this host
    dead = subprocess.Popen(["true"])
    dead.wait()
    live_temporary = f".global_step90.h5.tmp-{host}-{sleeper.pid}-0"
    dead_temporary = f".global_step91.h5.tmp-{host}-{dead.pid}-0"
    other_host_temporary = ".global_step92.h5.tmp-elsewhere.example-12345-0"
    for name in (live_temporary, dead_temporary, other_host_temporary):
        open(os.path.join(directory, name), "w").close()
    log = open(os.path.join(runner.work, case, "job-a.txt"), "w")
    job_a = subprocess.Popen(runner.mpiexec + ["-n", "2", runner.zerotrain, "train", "--config",
                                               os.path.join(runner.work, "config.json"), "--steps", "100000",
                                               "--save-dir", directory, "--save-interval", "1", "--print-every", "1"],
                             stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: os.path.exists(os.path.join(directory, "global_step2.h5")), 180, "job A's second save")
        with open(os.path.join(directory, ".zerotrain.lock")) as f:
            holder = f.read()
        match = re.match(r"host (\S+) pid ([0-9]+) \(since ", holder)
        check(match is not None and match.group(1) == host, f"lock file content {holder!r}")
        pid = int(match.group(2))
        check(os.path.exists(f"/proc/{pid}"), f"the lock names pid {pid}, which does not run")
        out = runner.train(directory, "--save-interval", "1", expect_code=1,
                           expect=[rf"checkpoint directory '[^']*' is in use by another job: its lock [^\n]*"
                                   rf"\.zerotrain\.lock is held by host {re.escape(host)} pid {pid} \(since "],
                           absent=[r"step +1/[0-9]+ \|"])
        saved = len([n for n in os.listdir(directory) if n.endswith(".h5")])
        wait_for(lambda: len([n for n in os.listdir(directory) if n.endswith(".h5")]) > saved + 1, 180,
                 "job A to go on saving after job B was refused")
        names = os.listdir(directory)
        check(live_temporary in names, "the temporary of a live process was removed", "\n".join(names))
        check(dead_temporary not in names, "the temporary of a dead process is still there", "\n".join(names))
        check(other_host_temporary not in names, "another host's temporary is still there under the lock")
    finally:
        os.killpg(job_a.pid, signal.SIGUSR1)  # mpirun forwards it: A saves and exits 75
        try:
            code = job_a.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(job_a.pid, signal.SIGKILL)
            code = job_a.wait()
        sleeper.kill()
        log.close()
    with open(os.path.join(runner.work, case, "job-a.txt")) as f:
        a_out = f.read()
    check(code == PREEMPTED_EXIT, f"job A exited {code}, expected {PREEMPTED_EXIT}", a_out)
    check("FAILED" not in a_out and "error" not in a_out.lower(), "job A reported an error", a_out)
    runner.run(2, "checkpoint", "verify", directory, expect_code=0, expect=[r"^OK "])
    # A is gone: its lock went with it, and the next job resumes.
    runner.train(directory, "--resume", "auto", steps=int(open(os.path.join(directory, "latest")).read().strip()
                                                          .replace("global_step", "")) + 1,
                 expect_code=0, expect=[r"resumed from "])


def unwritable_dir(runner, case):
    """A --save-dir that cannot be written fails at the start, not at the first save."""
    if os.geteuid() == 0:
        directory = "/proc/zerotrain-checkpoints"  # not even root creates files in /proc
        expect = r"cannot create checkpoint directory '/proc/zerotrain-checkpoints'"
        runner.train(directory, expect_code=1, expect=[expect], absent=[r"step +1/[0-9]+ \|"])
        directory, expect = "/proc", r"(cannot create the temporary file '/proc/\.write-test\.tmp-|is not writable)"
    else:
        directory = os.path.join(runner.work, case, "read-only")
        os.makedirs(directory, exist_ok=True)
        os.chmod(directory, 0o500)
        expect = r"checkpoint directory '[^']*read-only' is not writable: Permission denied"
    runner.train(directory, expect_code=1, expect=[expect], absent=[r"step +1/[0-9]+ \|"])


CASES = {name: file_case for name in FILE_CASES}
CASES.update({"forged_data_offset": forged_data_offset, "latest_traversal": latest_case, "latest_nul": latest_case,
              "symlinked_temp": symlinked_temp, "all_damaged": all_damaged, "other_model": other_model,
              "two_jobs": two_jobs, "unwritable_dir": unwritable_dir})


def setup(runner):
    shutil.rmtree(runner.work, ignore_errors=True)
    os.makedirs(runner.work)
    runner.config("config.json")
    pristine = os.path.join(runner.work, "pristine")
    runner.train(pristine, "--save-interval", "1", steps=3, expect_code=0,
                 expect=[r"saved checkpoint [^\n]*global_step3\.h5"])
    # The attribute checksum as documented matches what zerotrain computed.
    for step in (1, 2, 3):
        path = os.path.join(pristine, f"global_step{step}.h5")
        with h5py.File(path, "r") as f:
            stored = int(f.attrs["attributes_checksum"])
        check(attributes_checksum(path) == stored, f"{path}: the documented attribute checksum differs")


def main():
    if len(sys.argv) < 6 or sys.argv[4] != "--":
        print(__doc__)
        return 2
    case, zerotrain, work = sys.argv[1], sys.argv[2], sys.argv[3]
    runner = Runner(zerotrain, work, sys.argv[5:])
    try:
        if case == "setup":
            setup(runner)
        else:
            check(case in CASES, f"unknown case {case}; known: {', '.join(sorted(CASES))}")
            CASES[case](runner, case)
    except Failure as failure:
        print(f"FAIL: {case}: {failure}")
        return 1
    print(f"PASS: {case}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
