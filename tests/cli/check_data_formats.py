"""The ecosystem's token formats through `zerotrain data convert` and `zerotrain train` (docs/data.md).

Each format is written here by a small writer of its own, independent of zerotrain's reader: NumPy's
numpy.save for .npy, the published layouts with numpy and struct for llm.c's shards
(dev/data/data_common.py: 256 int32 header words, magic, version, token count) and Megatron-LM's
indexed datasets (megatron/core/datasets/indexed_dataset.py: .idx "MMIDIDX\\0\\0", version, dtype
code, counts, sequence lengths, byte pointers, document indices; .bin the tokens). Checks:

- every format, one file or shards (a directory, a glob, a Megatron prefix), converts to a ZTTOKENS
  file holding exactly the tokens written (read back with bench/zt_tokens.py, not zerotrain);
- training on each gives the step losses of training on the ZTTOKENS file of the same tokens, bitwise;
- --eval-data with "eval" in the config: eval lines, "eval" metrics records and the csv_monitor file;
- bad files fail with exit code 1 and a message naming the file, offset and value.

- with MPIEXEC...: on 2 ranks too, the same eval steps, and training losses with eval those without.

Usage: check_data_formats.py ZEROTRAIN CONFIG.json BENCH_DIR [MPIEXEC FLAGS...]. Prints PASS when
everything holds.
"""
import json
import os
import re
import struct
import subprocess
import sys
import tempfile

import numpy as np

from clitest import check, finish

zerotrain, base_config, bench_dir = sys.argv[1:4]
mpiexec = sys.argv[4:]
sys.path.insert(0, bench_dir)
import zt_tokens  # noqa: E402  (bench/zt_tokens.py: the ZTTOKENS writer and reader in Python)

def run(*args, expect=0, pattern=None, name="", launcher=()):
    result = subprocess.run([*launcher, zerotrain, *args], capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    good = result.returncode == expect and (pattern is None or re.search(pattern, output))
    check(bool(good), f"{name or args[0]}: exit {result.returncode} (expected {expect})"
          + (f", output matches {pattern!r}" if pattern else ""))
    if not good:
        print(output[-3000:])
    return output


# ---- the independent writers --------------------------------------------------------------------

def write_llmc(path, tokens, llama3=False):
    header = np.zeros(256, dtype="<i4")
    header[0], header[1] = (20240801, 7) if llama3 else (20240520, 1)
    header[2] = len(tokens)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype="<u4" if llama3 else "<u2").tobytes())


MEGATRON_CODES = {"uint16": 8, "int32": 4, "float32": 7}


def write_megatron(prefix, documents, dtype="uint16"):
    """One sequence per document, as Megatron's preprocess_data.py writes without sentence splitting."""
    item = np.dtype(dtype).itemsize
    lengths = [len(d) for d in documents]
    pointers = np.concatenate([[0], np.cumsum(lengths[:-1]) * item]).astype("<i8")
    doc_index = np.arange(len(documents) + 1, dtype="<i8")
    with open(prefix + ".bin", "wb") as f:
        for d in documents:
            f.write(np.asarray(d, dtype=np.dtype(dtype).newbyteorder("<")).tobytes())
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", MEGATRON_CODES[dtype]))
        f.write(struct.pack("<Q", len(lengths)))
        f.write(struct.pack("<Q", len(doc_index)))
        f.write(np.asarray(lengths, dtype="<i4").tobytes())
        f.write(pointers.tobytes())
        f.write(doc_index.tobytes())


with tempfile.TemporaryDirectory(prefix="zt-formats-") as work:
    w = lambda name: os.path.join(work, name)  # noqa: E731
    tokens = np.random.default_rng(7).integers(0, 256, size=6000, dtype=np.int64)
    zt_tokens.write_token_file(w("ref.tok"), tokens, 256)

    np.save(w("u2.npy"), tokens.astype(np.uint16))
    np.save(w("u4.npy"), tokens.astype(np.uint32))
    np.save(w("i4.npy"), tokens.astype(np.int32))
    for version in [(2, 0), (3, 0)]:  # numpy writes these for headers too long for version 1
        with open(w(f"v{version[0]}.npy"), "wb") as f:
            np.lib.format.write_array(f, tokens.astype(np.uint16), version=version)
    write_llmc(w("gpt2.bin"), tokens)
    write_llmc(w("llama3.bin"), tokens, llama3=True)
    cuts = [0, 17, 900, 901, 2500, 4444, 6000]  # documents of uneven length, one of a single token
    documents = [tokens[a:b] for a, b in zip(cuts, cuts[1:])]
    write_megatron(w("mega16"), documents)
    write_megatron(w("mega32"), documents, "int32")
    os.mkdir(w("shards"))
    for i, (a, b) in enumerate([(0, 1000), (1000, 3500), (3500, 6000)]):
        write_llmc(w(f"shards/train_{i:06d}.bin"), tokens[a:b])
    with open(w("shards/README.txt"), "w") as f:
        f.write("not a shard\n")
    for i, (a, b) in enumerate([(0, 3000), (3000, 6000)]):
        np.save(w(f"part_{i}.npy"), tokens[a:b].astype(np.uint16))

    inputs = {
        "npy uint16": w("u2.npy"), "npy uint32": w("u4.npy"), "npy int32": w("i4.npy"),
        "npy version 2.0": w("v2.npy"), "npy version 3.0": w("v3.npy"),
        "llm.c gpt-2": w("gpt2.bin"), "llm.c llama-3": w("llama3.bin"),
        "megatron uint16 .bin": w("mega16.bin"), "megatron int32 prefix": w("mega32"),
        "megatron .idx": w("mega16.idx"), "llm.c shard directory": w("shards"),
        "npy glob": w("part_*.npy"), "ZTTOKENS": w("ref.tok"),
    }
    # ---- conversion: the very tokens written ----
    for label, path in inputs.items():
        out = w("converted.tok")
        run("data", "convert", path, out, "--vocab-size", "256", name=f"convert {label}",
            pattern=r"converted .*: [0-9]+ file\(s\), 6000 tokens, vocab 256 -> ")
        back, vocab = zt_tokens.read_token_file(out)
        check(vocab == 256 and np.array_equal(back, tokens), f"convert {label}: the tokens written, vocab 256")
    output = run("data", "convert", w("mega16"), w("converted.tok"), name="convert megatron prefix",
                 pattern=r"converted Megatron dataset .*mega16\.bin, 6 documents: 1 file\(s\), 6000 tokens, "
                         r"vocab 256 -> ")  # the largest token + 1: the random tokens reach 255
    output = run("data", "convert", w("shards"), w("converted.tok"), name="convert directory description",
                 pattern=r"3 llm\.c token files .*shards \(train_000000\.bin \.\. train_000002\.bin, 1 other "
                         r"file\(s\) ignored\)")

    # ---- training: the losses of the ZTTOKENS file, bitwise ----
    def losses(data, extra=()):
        metrics = w("metrics.jsonl")
        run("train", "--config", base_config, "--data", data, "--steps", "2", "--print-every", "0",
            "--metrics", metrics, *extra, name=f"train on {os.path.basename(data)}")
        with open(metrics) as f:
            return [json.loads(line) for line in f]

    reference = [r["loss"] for r in losses(w("ref.tok")) if r["event"] == "step"]
    check(len(reference) == 2, "the reference run has 2 steps")
    for label in ["npy uint16", "llm.c gpt-2", "megatron int32 prefix", "llm.c shard directory", "npy glob"]:
        got = [r["loss"] for r in losses(inputs[label]) if r["event"] == "step"]
        check(got == reference, f"train on {label}: losses {got} == ZTTOKENS {reference}")

    # ---- validation loss: --eval-data, progress lines, metrics records, csv_monitor ----
    with open(base_config) as f:
        config = json.load(f)
    config["eval"] = {"interval": 1, "batches": 2}
    config["csv_monitor"] = {"enabled": True, "output_path": w("csv"), "job_name": "run"}
    with open(w("eval.json"), "w") as f:
        json.dump(config, f)
    metrics = w("eval.jsonl")
    output = run("train", "--config", w("eval.json"), "--data", w("ref.tok"), "--eval-data", w("u2.npy"),
                 "--steps", "2", "--print-every", "1", "--metrics", metrics, name="train with --eval-data",
                 pattern=r"eval: npy file .*u2\.npy \(6000 tokens, 93 samples of 64\); 2 batches \(32 samples\) "
                         r"every 1 steps and at the end\n(.|\n)*eval step 1: loss [0-9.]+ ppl [0-9.]+ \(2 batches, "
                         r"[0-9.]+ s\)\n(.|\n)*eval step 2: loss")
    with open(metrics) as f:
        records = [json.loads(line) for line in f]
    evals = [r for r in records if r["event"] == "eval"]
    check([r["step"] for r in evals] == [1, 2], "eval records at steps 1 and 2")
    check(all(abs(r["perplexity"] - np.exp(r["loss"])) < 1e-9 * r["perplexity"] and r["eval_samples"] == 32
              and r["tokens"] == 32 * 64 and r["batches"] == 2 for r in evals),
          "eval records: perplexity = exp(loss), 32 samples, 2048 tokens, 2 batches")
    check([r["loss"] for r in records if r["event"] == "step"] == reference,
          "the training losses with eval are those without")
    start = next(r for r in records if r["event"] == "start")
    check(start.get("eval", {}).get("samples") == 32, "the start record describes the eval set")
    with open(os.path.join(w("csv"), "run", "Eval_Samples_eval_loss.csv")) as f:
        rows = f.read().splitlines()
    check(rows[0] == "step,eval_loss" and [float(r.split(",")[1]) for r in rows[1:]] == [r["loss"] for r in evals],
          "csv_monitor: Eval_Samples_eval_loss.csv holds the eval losses")
    # The eval data the same samples as a ZTTOKENS file of the same tokens: the same eval losses.
    metrics2 = w("eval2.jsonl")
    run("train", "--config", w("eval.json"), "--data", w("ref.tok"), "--eval-data", w("mega16"), "--steps", "2",
        "--print-every", "0", "--metrics", metrics2, name="train with Megatron eval data")
    with open(metrics2) as f:
        check([r["loss"] for r in map(json.loads, f) if r["event"] == "eval"] == [r["loss"] for r in evals],
              "eval on the Megatron dataset == eval on the .npy of the same tokens")
    if mpiexec:  # 2 ranks: eval where 1 rank evaluates, and the training unchanged by it
        two = [*mpiexec, "-n", "2"]
        runs = {}
        for label, extra in [("with eval", ["--eval-data", w("u2.npy")]), ("without eval", [])]:
            path = w(f"np2 {label}.jsonl")
            run("train", "--config", w("eval.json") if extra else base_config, "--data", w("ref.tok"), *extra,
                "--steps", "2", "--print-every", "0", "--metrics", path, name=f"train on 2 ranks {label}",
                launcher=two)
            with open(path) as f:
                runs[label] = [json.loads(line) for line in f]
        check([r["step"] for r in runs["with eval"] if r["event"] == "eval"] == [1, 2],
              "2 ranks: eval records at steps 1 and 2")
        check([r["loss"] for r in runs["with eval"] if r["event"] == "step"]
              == [r["loss"] for r in runs["without eval"] if r["event"] == "step"],
              "2 ranks: the training losses with eval are those without")
    # A config error on one process: a usage error, exit 2 (docs/cli.md).
    run("train", "--config", w("eval.json"), "--steps", "1", name="eval section without data",
        expect=2, pattern=r"zerotrain train: the config's \"eval\" section names no eval data: set eval\.data or "
                          r"pass --eval-data PATH")

    # ---- bad files: exit 1, the file, offset and value named ----
    bad = tokens.astype(np.uint16).copy()
    bad[17] = 300
    np.save(w("out_of_vocab.npy"), bad)
    negative = tokens.astype(np.int32).copy()
    negative[5] = -5
    np.save(w("negative.npy"), negative)
    np.save(w("int64.npy"), tokens)
    np.save(w("matrix.npy"), tokens.astype(np.uint16).reshape(60, 100))
    with open(w("u2.npy"), "rb") as f:
        npy_bytes = f.read()
    with open(w("bad_magic.npy"), "wb") as f:
        f.write(b"\x93NUMPX" + npy_bytes[6:])
    with open(w("gpt2.bin"), "rb") as f:
        llmc_bytes = f.read()
    with open(w("truncated.bin"), "wb") as f:
        f.write(llmc_bytes[:-2])
    header = np.frombuffer(llmc_bytes[:1024], dtype="<i4").copy()
    header[1] = 2
    with open(w("version2.bin"), "wb") as f:
        f.write(header.tobytes() + llmc_bytes[1024:])
    write_megatron(w("short"), documents)
    with open(w("short.bin"), "r+b") as f:
        f.truncate(11998)
    write_megatron(w("float"), [d.astype(np.float32) for d in documents], "float32")
    write_megatron(w("badidx"), documents)
    with open(w("badidx.idx"), "r+b") as f:
        f.seek(34 + 4 * len(documents) + 8 * 2)  # the third sequence's pointer
        f.write(struct.pack("<q", 12))
    os.mkdir(w("empty"))

    train = ["train", "--config", base_config, "--steps", "1", "--data"]
    run(*train, w("out_of_vocab.npy"), expect=1, name="token outside the model's vocab",
        pattern=r"npy file '[^']*out_of_vocab\.npy': token 17 \(byte offset 162\) is 300, expected < vocab size 256")
    run(*train, w("negative.npy"), expect=1, name="negative int32 token",
        pattern=r"npy file '[^']*negative\.npy': token 5 \(byte offset 148\) is -5, expected a token id >= 0")
    run(*train, w("int64.npy"), expect=1, name="npy of int64",
        pattern=r"npy file '[^']*int64\.npy' holds dtype '<i8', expected '<u2' \(uint16\), '<u4' \(uint32\) or "
                r"'<i4' \(int32\) tokens")
    run(*train, w("matrix.npy"), expect=1, name="2-D npy",
        pattern=r"npy file '[^']*matrix\.npy' has shape \(60, 100\), expected a 1-D array")
    run(*train, w("bad_magic.npy"), expect=1, name="npy with a wrong magic",
        pattern=r"data file '[^']*bad_magic\.npy' has none of the token formats' headers")
    run(*train, w("truncated.bin"), expect=1, name="truncated llm.c shard",
        pattern=r"llm\.c token file '[^']*truncated\.bin' is truncated: 13022 bytes, expected the 1024-byte header "
                r"\+ the count in header word 2 = 1024 \+ 6000 tokens \* 2 bytes")
    run(*train, w("version2.bin"), expect=1, name="llm.c shard of an unknown version",
        pattern=r"llm\.c token file '[^']*version2\.bin' has magic 20240520 version 2, expected magic 20240520 "
                r"version 1 \(uint16 tokens\)")
    run(*train, w("short"), expect=1, name="Megatron .bin shorter than its index",
        pattern=r"Megatron dataset '[^']*short\.bin' does not match its index '[^']*short\.idx': the \.bin has "
                r"11998 bytes, the index describes 6000 tokens \* 2 = 12000 bytes")
    run(*train, w("float"), expect=1, name="Megatron dataset of float32",
        pattern=r"Megatron index '[^']*float\.idx' has dtype code 7 \(float32\), expected 8 \(uint16\) or 4 "
                r"\(int32\) tokens")
    run(*train, w("badidx"), expect=1, name="Megatron index with a wrong pointer",
        pattern=r"Megatron index '[^']*badidx\.idx': sequence 2 starts at byte 12 of the \.bin, expected 1800")
    run(*train, w("empty"), expect=1, name="directory without shards",
        pattern=r"data directory '[^']*empty' holds no token file")
    run(*train, w("nothing_*.bin"), expect=1, name="glob matching nothing",
        pattern=r"data pattern '[^']*nothing_\*\.bin' matches no file")
    run("data", "convert", w("u2.npy"), w("small.tok"), "--vocab-size", "100", expect=1,
        name="convert with a smaller vocab", pattern=r"npy file '[^']*u2\.npy': token [0-9]+ \(byte offset [0-9]+\) "
                                                    r"is [0-9]+, expected < vocab size 100")
    run("data", "convert", w("u2.npy"), w("u2.npy"), expect=1, name="convert onto its input",
        pattern=r"output '[^']*u2\.npy' is the input file")
    check(np.array_equal(np.load(w("u2.npy")), tokens), "the input of the refused conversion is unchanged")

finish("PASS: data formats")
