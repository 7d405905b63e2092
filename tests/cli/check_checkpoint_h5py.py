#!/usr/bin/python3
"""A zerotrain checkpoint and its export, read without zerotrain (h5py, numpy, h5dump).

    tests/cli/check_checkpoint_h5py.py ZEROTRAIN CHECKPOINT_DIR WORK_DIR DOC

- the checkpoint file (DIR/<tag in DIR/latest>.h5): root, /engine, /model and /optimizer
  attributes, every parameter under /model with its optimizer states under
  /optimizer/<state>/ of the same shape, a checksum attribute on every dataset;
- the checksum snippet of docs/checkpoint-format.md (DOC), executed as written: it recomputes
  every checksum of the file and finds the one dataset damaged in a copy;
- `zerotrain checkpoint export` to fp32 and bf16: the model's names and shapes at the root, fp32
  values equal to /model, bf16 the rounded bit patterns; `h5dump -H` lists them.

Exit status 0 when everything holds, 1 otherwise, 77 (ctest: skipped) without h5py.
"""
import os
import re
import shutil
import subprocess
import sys

from clitest import check, finish, skipped_without

with skipped_without("python3-h5py"):
    import h5py
    import numpy as np


def doc_snippet(doc):
    """The Python block of the doc that follows the marker comment."""
    text = open(doc).read()
    match = re.search(r"<!-- checksum.py.*?-->\s*```python\n(.*?)```", text, re.S)
    if match is None:
        sys.exit(f"{doc}: no ```python block after '<!-- checksum.py' marker")
    return match.group(1)


def datasets_of(file):
    found = {}

    def visit(name, node):  # returning anything but None would stop the visit
        if isinstance(node, h5py.Dataset):
            found[name] = node

    file.visititems(visit)
    return found


def check_checkpoint(path):
    with h5py.File(path, "r") as f:
        root = f.attrs
        check(root["format"] == b"zerotrain-checkpoint" or root["format"] == "zerotrain-checkpoint",
              f"root format attribute: {root['format']!r}")
        check(int(root["format_version"]) == 2, "format_version 2")
        tag = root["tag"].decode() if isinstance(root["tag"], bytes) else root["tag"]
        check(os.path.basename(path) == tag + ".h5", f"tag {tag} names the file")
        engine = f["engine"].attrs
        for key in ("global_steps", "global_samples", "skipped_steps", "world_size", "zero_stage",
                    "compute_dtype", "train_batch_size", "parameters", "config", "dropout_streams",
                    "loss_scale", "lr_scheduler_last_batch_iteration", "has_data_position", "data_seed",
                    "data_num_samples", "data_epoch", "data_offset"):
            check(key in engine, f"/engine has attribute {key}")
        check(int(engine["world_size"]) == 2 and int(engine["zero_stage"]) == 2, "saved at 2 ranks, stage 2")
        check(f["optimizer"].attrs["type"] in (b"adamw", "adamw"), "/optimizer type adamw")
        check(int(f["optimizer"].attrs["step"]) == int(engine["global_steps"]), "/optimizer step")
        datasets = datasets_of(f)
        model = {name[len("model/"):]: d for name, d in datasets.items() if name.startswith("model/")}
        check(len(model) > 0, "parameters under /model")
        check(sum(d.size for d in model.values()) == int(f["model"].attrs["parameters"]),
              "/model parameters attribute = sum of the parameters' elements")
        for state in ("exp_avg", "exp_avg_sq"):
            for name, d in model.items():
                other = f.get(f"optimizer/{state}/{name}")
                check(other is not None and other.shape == d.shape and other.dtype == np.float32,
                      f"optimizer/{state}/{name} has the shape of model/{name}")
        streams = f["engine/rng_streams"]
        check(streams.dtype == np.int64 and streams.shape[0] == 2, "engine/rng_streams: int64, one row per rank")
        for name, d in datasets.items():
            check("checksum" in d.attrs and d.attrs["checksum"].dtype == np.uint64, f"{name}: uint64 checksum")
        return {name: (d.shape, d[...]) for name, d in model.items()}, len(datasets)


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    zerotrain, directory, work, doc = sys.argv[1:]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    tag = open(os.path.join(directory, "latest")).read().strip()
    path = os.path.join(directory, tag + ".h5")
    model, count = check_checkpoint(path)
    print(f"{path}: {count} datasets, {len(model)} parameters, attributes as documented")

    # The doc's snippet as written: every checksum of the real file, then a damaged copy.
    snippet = {"__name__": "checksum_snippet"}
    exec(compile(doc_snippet(doc), doc + " (checksum snippet)", "exec"), snippet)
    check(snippet["verify"](path) == [], "the doc's snippet recomputes every checksum of the file")
    damaged = os.path.join(work, "damaged.h5")
    shutil.copyfile(path, damaged)
    victim = "optimizer/exp_avg/" + sorted(model)[0]
    with h5py.File(damaged, "r") as f:
        offset = f[victim].id.get_offset()
    with open(damaged, "r+b") as raw:
        raw.seek(offset + 4)
        byte = raw.read(1)
        raw.seek(offset + 4)
        raw.write(bytes([byte[0] ^ 0x5A]))
    check(snippet["verify"](damaged) == [victim], f"the snippet finds the flipped byte in {victim}")

    for dtype in ("fp32", "bf16"):
        out = os.path.join(work, f"weights-{dtype}.h5")
        run = subprocess.run([zerotrain, "checkpoint", "export", directory, "--out", out, "--dtype", dtype],
                             capture_output=True, text=True)
        print(run.stdout + run.stderr, end="")
        check(run.returncode == 0, f"export --dtype {dtype} exits 0")
        with h5py.File(out, "r") as f:
            exported = datasets_of(f)
            check(sorted(exported) == sorted(model), f"{dtype}: the export holds exactly the model's names")
            check(f.attrs["tag"] in (tag, tag.encode()), f"{dtype}: tag attribute")
            for name, (shape, values) in model.items():
                d = exported.get(name)
                if d is None:
                    continue
                check(d.shape == shape, f"{dtype}: {name} shape {d.shape} == {shape}")
                if dtype == "fp32":
                    check(d.dtype == np.float32 and np.array_equal(d[...], values), f"fp32: {name} values")
                else:
                    check(d.dtype == np.uint16 and d.attrs["dtype"] in (b"bf16", "bf16"), f"bf16: {name} type")
                    # fp32 rounded to the nearest even bfloat16: the top 16 bits after adding 0x7fff + lsb.
                    u = values.reshape(-1).view(np.uint32).astype(np.uint64)
                    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16).reshape(shape)
                    check(np.array_equal(d[...], rounded), f"bf16: {name} holds the rounded fp32 values")
        dump = subprocess.run(["h5dump", "-H", out], capture_output=True, text=True)
        check(dump.returncode == 0, f"h5dump -H {out} exits 0")
        for name, (shape, _) in model.items():
            dims = ", ".join(str(n) for n in shape)
            pattern = rf'DATASET "{re.escape(name)}" {{\s*DATATYPE\s+\S+\s*DATASPACE\s+SIMPLE {{ \( {dims} \)'
            check(re.search(pattern, dump.stdout) is not None, f"h5dump -H lists {name} ({dims})")

    dump = subprocess.run(["h5dump", "-H", path], capture_output=True, text=True)
    check(dump.returncode == 0 and 'GROUP "optimizer"' in dump.stdout and 'ATTRIBUTE "checksum"' in dump.stdout,
          "h5dump -H reads the checkpoint itself")
    shutil.rmtree(work, ignore_errors=True)
    finish("checkpoint and export read by h5py and h5dump: OK")


if __name__ == "__main__":
    main()
