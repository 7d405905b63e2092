"""Shared by the tests/cli/check_*.py scripts (each imports it from its own directory, which Python
puts first on sys.path): checks that collect failures, the verdict ctest matches, and the skip
(exit 77, ctest's SKIP_EXIT_CODE) when an optional Python package is missing."""
import contextlib
import os
import re
import sys

failures = []


def check(condition, message):
    """Records and prints `message` as a failure unless `condition` holds; the script goes on, so that
    one run reports every failed check."""
    if not condition:
        failures.append(message)
        print("FAIL:", message)


def finish(success_line):
    """Exits 1 listing the failed checks, or prints `success_line` (what the ctest EXPECT matches) and
    exits 0."""
    if failures:
        print(f"FAIL: {len(failures)} check(s) failed:")
        for message in failures:
            print("  -", message)
        sys.exit(1)
    print(success_line)
    sys.exit(0)


@contextlib.contextmanager
def skipped_without(debian_packages):
    """Imports in this block that fail end the script as skipped (exit 77), naming the packages."""
    try:
        yield
    except ImportError as error:
        print(f"SKIPPED: {error} (Debian: apt-get install {debian_packages})")
        sys.exit(77)


def check_doc_quotes(source, script, region):
    """docs/checkpoint-format.md quotes the code between `script`'s region markers verbatim, after the
    doc's `<!-- region: scripts/... -->` marker."""
    doc = open(os.path.join(source, "docs", "checkpoint-format.md")).read()
    relative = os.path.relpath(script, source)
    opening = rf"<!-- {re.escape(region)}: {re.escape(relative)} -->"
    quoted = re.search(opening + r"\s*```python\n(.*?)```", doc, re.S)
    marker = rf"# --- docs/checkpoint-format.md: {re.escape(region)}"
    code = re.search(rf"{marker} \(begin\) ---\n(.*?){marker} \(end\) ---", open(script).read(), re.S)
    check(quoted is not None and code is not None and quoted.group(1) == code.group(1),
          f"docs/checkpoint-format.md quotes {relative}'s {region} code verbatim")
