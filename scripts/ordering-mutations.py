#!/usr/bin/env python3
"""Mutation sweep of the device ordering points: does a missing wait fail a test on the CPU?

Each mutation removes one wait, event or fence that orders two streams (or a stream and the host)
in the engine, the execution context or the offload pipelines. For each, this script patches the
source, rebuilds, runs the tests that train or copy on the emulated device (both stream orders:
the eager_streams label), records which fail, and restores the source. A mutation that no test
catches is an ordering the emulated device cannot show (docs/gpu.md, "What the mutations show").

    scripts/ordering-mutations.py [--build-dir build] [--list] [NAME ...]

Slow: a rebuild and about two minutes of tests per mutation on 2 cores (some 40 minutes for all).
Not part of the test suite; run it after changing the emulated device or the engine's ordering.
The source is restored after each mutation, also on Ctrl-C or SIGTERM; never run it in a tree with a
build in flight.
"""
import argparse
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent

# (name, file, text removed or replaced, replacement, what it stands for)
MUTATIONS = [
    ("to_host_async_no_wait", "kernels/execution.cpp",
     "  compute_reached_.record(compute_);  // the kernels that produce `source`\n"
     "  transfer_.wait(compute_reached_);\n",
     "  compute_reached_.record(compute_);  // the kernels that produce `source`\n",
     "a copy to the host on the transfer stream that does not wait for the kernels producing it"),
    ("from_host_async_no_wait", "kernels/execution.cpp",
     "  compute_reached_.record(compute_);  // `destination`'s allocation (and any earlier use of it)\n"
     "  transfer_.wait(compute_reached_);\n",
     "  compute_reached_.record(compute_);  // `destination`'s allocation (and any earlier use of it)\n",
     "an upload on the transfer stream that does not wait for its destination's allocation"),
    ("compute_waits_for_transfers_noop", "kernels/execution.cpp",
     "  compute_.wait(transfers_queued());\n", "  (void)transfers_queued();\n",
     "compute_waits_for_transfers() a no-op"),
    ("checkpoint_forward_no_fence", "src/nn/activation_checkpoint.cpp",
     "    throw;\n  }\n  execution.compute_waits_for_transfers();\n  return output;\n",
     "    throw;\n  }\n  return output;\n",
     "a checkpoint's forward does not wait for the copy of its input to the host"),
    ("checkpoint_upload_no_fence", "src/nn/activation_checkpoint.cpp",
     "      fenced->compute_waits_for_transfers();\n", "      (void)fenced;\n",
     "a checkpoint's backward does not wait for the prefetched upload of its input"),
    ("store_kept_no_wait", "src/engine/parameter_store.cpp",
     "  kept_copied_.synchronize();\n", "",
     "the update writes a page-locked kept parameter piece while its copy to the device may be queued"),
    ("store_buffer_no_wait", "src/engine/parameter_store.cpp",
     "  buffer.copied.synchronize();\n", "",
     "an NVMe pool buffer is reused while its copy to the device may be queued"),
    ("gatherer_no_order_after", "src/engine/parameter_gatherer.cpp",
     "  if (gather.after_transfers) communicator_.order_after(execution_.transfers_queued());\n", "",
     "a stage-3 all-gather does not wait for the pieces copied to the device on the transfer stream"),
    ("gatherer_no_work_wait", "src/engine/parameter_gatherer.cpp",
     "  in_flight_.front().work.wait();\n  wait_seconds_ += seconds_since(started);\n",
     "  wait_seconds_ += seconds_since(started);\n",
     "a gathered parameter is copied out of the staging before its all-gather's Work is waited for"),
    # The same two on the device only: the host engine that the emulated tests compare with keeps its
    # wait, so what fails is the emulated device's own check.
    ("gatherer_no_work_wait_on_device", "src/engine/parameter_gatherer.cpp",
     "  in_flight_.front().work.wait();\n  wait_seconds_ += seconds_since(started);\n",
     "  if (execution_.device().is_host()) in_flight_.front().work.wait();\n"
     "  wait_seconds_ += seconds_since(started);\n",
     "as gatherer_no_work_wait, on a device only"),
    ("reducer_no_work_wait_on_device", "src/engine/gradient_reducer.cpp",
     "  in_flight_.front().work.wait();\n  wait_seconds_ += seconds_since(started);\n",
     "  if (execution_.device().is_host()) in_flight_.front().work.wait();\n"
     "  wait_seconds_ += seconds_since(started);\n",
     "as reducer_no_work_wait, on a device only"),
    ("reducer_no_work_wait", "src/engine/gradient_reducer.cpp",
     "  in_flight_.front().work.wait();\n  wait_seconds_ += seconds_since(started);\n",
     "  wait_seconds_ += seconds_since(started);\n",
     "a reduced gradient bucket is read before its reduction's Work is waited for"),
    ("offload_to_host_no_wait", "src/engine/device_offloaded_update.cpp",
     "    to_host_.wait(gradients_ready_);\n", "",
     "offloaded update: the gradients' copy down does not wait for the backward"),
    ("offload_to_device_no_wait", "src/engine/device_offloaded_update.cpp",
     "    to_device_.wait(gradients_ready_);\n", "",
     "offloaded update: the parameters' copy up does not wait for the kernels still reading them"),
    ("offload_slot_out_no_sync", "src/engine/device_offloaded_update.cpp",
     "      slot.copied_out.synchronize();\n", "",
     "offloaded update: a staging slot is refilled while its parameters are still on their way up"),
    ("offload_slot_in_no_sync", "src/engine/device_offloaded_update.cpp",
     "    slot.copied_in.synchronize();\n", "",
     "offloaded update: the host optimizer reads a slot before its gradients arrived"),
    ("offload_params_no_sync", "src/engine/device_offloaded_update.cpp",
     "  to_device_.synchronize();\n  for (Slot& slot : slots_) slot.out_pending = false;\n",
     "  for (Slot& slot : slots_) slot.out_pending = false;\n",
     "offloaded update: the step ends before the new parameters reached the device"),
    ("pipeline_no_receive_wait", "src/engine/pipeline_executor.cpp",
     "  pending->work.wait();\n", "",
     "a pipeline stage uses a received tensor before its receive's Work is waited for"),
]

TESTS = ("emulated|eager_streams|activation_checkpoint|unit.execution|mpi.pipeline|parameter_store|"
         "device_offload|train_emulated")


def run(command, log):
    with open(log, "w") as out:
        return subprocess.run(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT).returncode


def stop_on_signal(signum, frame):
    raise SystemExit(f"ordering-mutations: stopped by signal {signum}; the source is restored")


def main():
    signal.signal(signal.SIGTERM, stop_on_signal)  # the finally below restores the mutated file
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build-dir", default="build")
    parser.add_argument("--logs", default="ordering-mutations", help="directory for the logs (under the build dir)")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("names", nargs="*", help="mutations to run (default: all)")
    args = parser.parse_args()
    if args.list:
        for name, path, _, _, meaning in MUTATIONS:
            print(f"{name:34} {path}: {meaning}")
        return 0
    chosen = [m for m in MUTATIONS if not args.names or m[0] in args.names]
    unknown = set(args.names) - {m[0] for m in MUTATIONS}
    if unknown:
        print(f"ordering-mutations: unknown mutation(s) {', '.join(sorted(unknown))} (--list shows them)",
              file=sys.stderr)
        return 2
    build = ROOT / args.build_dir
    logs = build / args.logs
    logs.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    uncaught = []
    for name, path, old, new, meaning in chosen:
        source = ROOT / path
        original = source.read_text()
        if original.count(old) != 1:
            print(f"{name}: the text to mutate is not found once in {path}: update this script", file=sys.stderr)
            return 1
        started = time.time()
        try:
            source.write_text(original.replace(old, new))
            if run(["cmake", "--build", str(build), "-j", str(os.cpu_count() or 2)], logs / f"{name}.build.log"):
                print(f"{name}: the build failed ({logs / (name + '.build.log')})")
                return 1
            run(["ctest", "--test-dir", str(build), "-R", TESTS, "-E", "np4", "-j", str(os.cpu_count() or 2),
                 "--timeout", "300"], logs / f"{name}.test.log")
        finally:
            source.write_text(original)
        failed = re.findall(r"^\s*\d+ - (\S+) \(", (logs / f"{name}.test.log").read_text(), re.MULTILINE)
        verdict = f"caught by {', '.join(failed)}" if failed else "NOT CAUGHT"
        if not failed:
            uncaught.append(name)
        print(f"{name}: {verdict} ({time.time() - started:.0f} s)", flush=True)
    run(["cmake", "--build", str(build), "-j", str(os.cpu_count() or 2)], logs / "restore.build.log")
    print(f"{len(chosen) - len(uncaught)} caught, {len(uncaught)} not caught"
          + (f": {', '.join(uncaught)}" if uncaught else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
