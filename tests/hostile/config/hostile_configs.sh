#!/usr/bin/env bash
# Hostile and broken configs, options and data through the `zerotrain` command, one process each:
# deep nesting, repeated keys, sizes that cannot fit, bad timeouts (config and environment), bad
# numbers, a conversion onto its own input, a directory as data, token files with tokens outside
# their vocabulary or a damaged checksum. Each case asserts the exit code and the message, and that
# no signal ended the process (exit codes above 128). A config or an option that is wrong is a
# usage error, exit 2 (docs/cli.md); errors in the environment (ZT_COLLECTIVE_TIMEOUT) and the
# data, exit 1.
# Usage: hostile_configs.sh ZEROTRAIN CONFIG (a gpt-tiny config to derive the cases from)
set -uo pipefail
zerotrain=$1 base=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
unset ZT_COLLECTIVE_TIMEOUT
failures=0 cases=0

python3 - "$base" "$work" <<'EOF_PY'
import json, struct, sys
base = json.load(open(sys.argv[1]))
out = sys.argv[2]

def write(name, config):
    json.dump(config, open(f"{out}/{name}.json", "w"))

def variant(name, **sections):
    config = json.loads(json.dumps(base))
    for section, values in sections.items():
        if isinstance(values, dict) and isinstance(config.get(section), dict):
            config[section].update(values)
        else:
            config[section] = values
    write(name, config)

open(f"{out}/deep_arrays.json", "w").write('{"train_batch_size": 4, "x": ' + "[" * 200000 + "]" * 200000 + "}")
open(f"{out}/deep_objects.json", "w").write('{"a": ' * 100000 + "1" + "}" * 100000)
text = json.dumps(base, indent=2)
open(f"{out}/duplicate_section.json", "w").write(
    text[:-2] + ',\n  "zero_optimization": {"stage": 0}\n}\n')
open(f"{out}/duplicate_nested.json", "w").write(
    text.replace('"lr": 2e-3', '"lr": 2e-3, "lr": 1').replace('"lr": 0.002', '"lr": 0.002, "lr": 1'))
variant("huge_layers", model={"n_layer": 1000000})
variant("huge_seq", model={"seq_len": 1e8})
variant("huge_vocab", model={"vocab_size": 10**12})
for name, value in (("timeout_tiny", 0.001), ("timeout_denormal", 1e-300), ("timeout_negative", -1),
                    ("timeout_huge", 1e300), ("timeout_word", "never"), ("timeout_off", "off"),
                    ("timeout_four", 4)):
    variant(name, comm={"timeout_s": value})
open(f"{out}/batch_overflow.json", "w").write(text.replace('"train_batch_size": 16', '"train_batch_size": 1e400'))
open(f"{out}/batch_big_integer.json", "w").write(
    text.replace('"train_batch_size": 16', '"train_batch_size": 99999999999999999999'))
open(f"{out}/batch_fraction.json", "w").write(text.replace('"train_batch_size": 16', '"train_batch_size": 16.5'))
open(f"{out}/nan_literal.json", "w").write(text.replace('"gradient_clipping": 1.0', '"gradient_clipping": NaN'))

# Token files (docs/data.md): 64-byte header, uint16 tokens. One with token 300 in a vocab of 256
# written as older writers did (no recorded range); one whose checksum no longer matches.
def crc32c(data, crc=0):
    crc ^= 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF

def token_file(name, tokens, vocab, damage=False):
    payload = b"".join(struct.pack("<H", t) for t in tokens)
    header = b"ZTTOKENS" + struct.pack("<IIIIQI", 1, 64, 2, vocab, len(tokens), crc32c(payload))
    header += struct.pack("<I", crc32c(header)) + bytes(24)
    if damage:
        payload = payload[:10] + bytes([payload[10] ^ 1]) + payload[11:]
    open(f"{out}/{name}", "wb").write(header + payload)

token_file("out_of_vocab.tok", [i % 256 for i in range(5000)] + [300] + [1] * 100, 256)
token_file("damaged.tok", [i % 256 for i in range(5000)], 256, damage=True)
EOF_PY

# check NAME EXPECTED_EXIT REGEX COMMAND...: runs COMMAND (60 s at most), asserts its exit code and
# that its output matches REGEX (extended), and that no signal ended it.
check() {
  local name=$1 expected=$2 regex=$3
  shift 3
  cases=$((cases + 1))
  local output code started=$SECONDS
  output=$(timeout 60 "$@" 2>&1)
  code=$?
  local verdict=""
  if [ "$code" -gt 128 ]; then
    verdict="ended by signal $((code - 128)) (exit $code)"
  elif [ "$code" != "$expected" ]; then
    verdict="exit code $code, expected $expected"
  elif ! grep -Eq -- "$regex" <<<"$output"; then
    verdict="output does not match '$regex'"
  fi
  if [ -n "$verdict" ]; then
    failures=$((failures + 1))
    echo "FAIL $name: $verdict"
    echo "$output" | head -c 3000 | sed 's/^/    /'
  else
    echo "ok   $name (exit $code, $((SECONDS - started)) s)"
  fi
}

train=("$zerotrain" train --steps 1)
w=$work

# ---- the document's shape -----------------------------------------------------------------------
check deep_arrays 2 "config file '$w/deep_arrays.json': x\[0\]\[0\].*: nesting deeper than 64 levels at line 1, column" "${train[@]}" --config "$w/deep_arrays.json"
check deep_objects 2 "nesting deeper than 64 levels at line 1, column" "${train[@]}" --config "$w/deep_objects.json"
check deep_arrays_report 2 "nesting deeper than 64 levels" "$zerotrain" report --config "$w/deep_arrays.json"
check duplicate_section 2 "zero_optimization: duplicate key 'zero_optimization' at line [0-9]+, column 3 \(first at line [0-9]+, column 3\)" "${train[@]}" --config "$w/duplicate_section.json"
check duplicate_nested 2 "optimizer.params.lr: duplicate key 'lr' at line [0-9]+, column [0-9]+ \(first at line [0-9]+, column [0-9]+\)" "${train[@]}" --config "$w/duplicate_nested.json"

# ---- sizes that cannot fit: refused at once, naming the keys ------------------------------------
check huge_layers 2 "the model cannot fit in this host's memory: .*most from model.n_layer x 12 model.d_model\^2.*Reduce model.n_layer" "${train[@]}" --config "$w/huge_layers.json"
check huge_seq 2 "the model cannot fit in this host's memory: .*(model.seq_len x model.d_model|model.seq_len x 3 model.d_model|model.seq_len x model.vocab_size)" "${train[@]}" --config "$w/huge_seq.json"
check huge_vocab 2 "the model cannot fit in this host's memory: .*model.vocab_size x model.d_model" "${train[@]}" --config "$w/huge_vocab.json"

# ---- the watchdog's timeout: config key and environment variable --------------------------------
check timeout_tiny 2 "comm.timeout_s: 0.001 s is below the minimum of 1 s \(a healthy job would be reported as hung\); expected 0 or \"off\" \(no watchdog\) or 1 to 1e\+09 seconds" "${train[@]}" --config "$w/timeout_tiny.json"
check timeout_denormal 2 "comm.timeout_s: 1e-300 s is below the minimum of 1 s" "${train[@]}" --config "$w/timeout_denormal.json"
check timeout_negative 2 "comm.timeout_s: expected a number >= 0, got -1" "${train[@]}" --config "$w/timeout_negative.json"
check timeout_huge 2 "comm.timeout_s: 1e\+300 s is above the maximum of 1e\+09 s" "${train[@]}" --config "$w/timeout_huge.json"
check timeout_word 2 "comm.timeout_s: expected a number of seconds, or \"off\", got \"never\"" "${train[@]}" --config "$w/timeout_word.json"
check timeout_report_tiny 2 "comm.timeout_s: 0.001 s is below the minimum" "$zerotrain" report --config "$w/timeout_tiny.json"
check timeout_report_four 0 "collective timeout from: +comm.timeout_s in config file '$w/timeout_four.json' \(4 s\), ZT_COLLECTIVE_TIMEOUT not set" "$zerotrain" report --config "$w/timeout_four.json"
check timeout_report_on 0 "watchdog: +on: collective timeout 4.0 s, heartbeat timeout 4.0 s" "$zerotrain" report --config "$w/timeout_four.json"
check timeout_report_off 0 "watchdog: +off: collective timeout 0 from comm.timeout_s in config file '$w/timeout_off.json' \(off\)" "$zerotrain" report --config "$w/timeout_off.json"
check timeout_report_default 0 "collective timeout from: +RuntimeOptions::collective_timeout \(600 s, the default\), ZT_COLLECTIVE_TIMEOUT not set" "$zerotrain" report
check timeout_env_overrides 0 "collective timeout from: +ZT_COLLECTIVE_TIMEOUT=3, overriding comm.timeout_s in config file '$w/timeout_four.json' \(4 s\)" env ZT_COLLECTIVE_TIMEOUT=3 "$zerotrain" report --config "$w/timeout_four.json"
check timeout_env_off 0 "watchdog: +off: collective timeout 0 from ZT_COLLECTIVE_TIMEOUT=off" env ZT_COLLECTIVE_TIMEOUT=off "$zerotrain" report
for value in 0.001 1e-300; do
  check "timeout_env_$value" 1 "ZT_COLLECTIVE_TIMEOUT='$value': $value s is below the minimum of 1 s" env ZT_COLLECTIVE_TIMEOUT=$value "$zerotrain" report
done
check timeout_env_nan 1 "ZT_COLLECTIVE_TIMEOUT='nan': nan is not a number of seconds" env ZT_COLLECTIVE_TIMEOUT=nan "$zerotrain" report
check timeout_env_inf 1 "ZT_COLLECTIVE_TIMEOUT='inf': inf is not a number of seconds" env ZT_COLLECTIVE_TIMEOUT=inf "$zerotrain" report
check timeout_env_negative 1 "ZT_COLLECTIVE_TIMEOUT='-5': -5 s is negative" env ZT_COLLECTIVE_TIMEOUT=-5 "$zerotrain" report
check timeout_env_word 1 "ZT_COLLECTIVE_TIMEOUT='ten' is not a number of seconds" env ZT_COLLECTIVE_TIMEOUT=ten "$zerotrain" train --config "$base"

# ---- bad numbers in the config ------------------------------------------------------------------
check batch_overflow 2 "config file '$w/batch_overflow.json': invalid JSON: number overflow parsing '1e400' at line [0-9]+, column [0-9]+" "${train[@]}" --config "$w/batch_overflow.json"
check batch_big_integer 2 "train_batch_size: expected a positive integer, got 1e\+20|train_batch_size: expected a positive integer, got 99999999999999999999" "${train[@]}" --config "$w/batch_big_integer.json"
check batch_fraction 2 "train_batch_size: expected a positive integer, got 16.5" "${train[@]}" --config "$w/batch_fraction.json"
check nan_literal 2 "config file '$w/nan_literal.json': invalid JSON: .*line [0-9]+, column [0-9]+" "${train[@]}" --config "$w/nan_literal.json"

# ---- bad numbers on the command line: one parser, one rule --------------------------------------
check steps_overflow 2 "--steps 99999999999999999999 is out of range: expected an integer >= 0" "$zerotrain" train --config "$base" --steps 99999999999999999999
check steps_negative 2 "--steps -1 is out of range: expected an integer >= 0" "$zerotrain" train --config "$base" --steps -1
check steps_text 2 "--steps expects an integer >= 0, got '5x'" "$zerotrain" train --config "$base" --steps 5x
check keep_last_negative 2 "--keep-last -2 is out of range: expected an integer >= 0" "${train[@]}" --config "$base" --keep-last -2
check save_interval_negative 2 "--save-interval -1 is out of range: expected an integer >= 0" "${train[@]}" --config "$base" --save-interval -1
check print_every_negative 2 "--print-every -3 is out of range: expected an integer >= 0" "${train[@]}" --config "$base" --print-every -3
check world_size_zero 2 "--world-size 0 is out of range: expected an integer in 1..2147483647" "$zerotrain" estimate --config "$base" --world-size 0
check world_size_overflow 2 "--world-size 4294967296 is out of range: expected an integer in 1..2147483647" "$zerotrain" estimate --config "$base" --world-size 4294967296

# ---- data -----------------------------------------------------------------------------------------
printf 'some text to convert\n' > "$w/a.txt"
ln -s "$w/a.txt" "$w/link.txt"
ln "$w/a.txt" "$w/hard.txt"
for output in a.txt link.txt hard.txt; do
  check "convert_onto_input_$output" 1 "output '$w/$output' is the input file '$w/a.txt'" "$zerotrain" data convert "$w/a.txt" "$w/$output"
done
check convert_input_kept 0 "^some text to convert$" cat "$w/a.txt"
mkdir -p "$w/data_dir"
check data_directory 1 "data directory '$w/data_dir' holds no token file \(0 file\(s\) of no token format: ZTTOKENS, .npy, llm.c .bin, Megatron .bin \+ .idx\)" "${train[@]}" --config "$base" --data "$w/data_dir"
check data_missing 1 "data file '$w/absent.tok' does not exist" "${train[@]}" --config "$base" --data "$w/absent.tok"
check data_out_of_vocab 1 "token file '$w/out_of_vocab.tok': token 5000 is 300, expected < vocab size 256" "${train[@]}" --config "$base" --data "$w/out_of_vocab.tok"
check data_damaged 1 "token file '$w/damaged.tok': checksum mismatch, header says CRC32C [0-9]+, tokens give [0-9]+; the file is corrupt" "${train[@]}" --config "$base" --data "$w/damaged.tok"

echo "$((cases - failures)) of $cases cases as expected"
if [ "$failures" -gt 0 ]; then
  echo "FAIL: hostile_configs ($failures case(s))"
  exit 1
fi
echo "PASS: hostile_configs"
