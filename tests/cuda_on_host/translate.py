#!/usr/bin/env python3
"""Rewrites a CUDA source of kernels/cuda into C++ that g++ compiles for tests/cuda_on_host.

Only what C++ cannot parse or must not share with the real CUDA objects changes; every other line is
the kernel source as nvcc compiles it:
  - `kernel<T><<<grid, block, shared, stream>>>(args)` becomes
    `::cuda_fibers::launch(key, "kernel<T>", {grid, block, shared, stream},
    ::cuda_fibers::with_arguments([](const auto&... arguments) { kernel<T>(arguments...); }, args))`:
    the arguments evaluated and copied at the launch, as CUDA does (the launch may run later, in its
    stream's order), then the kernel run by every CUDA thread of the grid (key: the kernel's address,
    which cudaFuncSetAttribute names, where the launch asks for dynamic shared memory);
  - `extern __shared__ ... T name[];` (dynamic shared memory) becomes a pointer to the launch's buffer;
  - `__launch_bounds__(N)` becomes a check, at the top of the kernel, that the block is at most N threads
    (a GPU refuses such a launch);
  - `#ifdef __CUDACC__` sections are kept (the device half of cuda_common.hpp);
  - namespace zt::kernels::cuda becomes zt::kernels::cuda_on_host and includes of kernels/cuda/ point
    to the translated copies, so these objects link beside the real CUDA ones (unit.cuda_on_host);
    with --keep-namespace both stay (the CUDA-on-host build, ZT_CUDA_ON_HOST, where they replace them).

usage: translate.py [--keep-namespace] INPUT OUTPUT
"""
import re
import sys


LAUNCH = re.compile(r"([A-Za-z_][\w:]*(?:<[^<>;]*>)?)\s*<<<(.*?)>>>\s*\(", re.S)


def matching_paren(text: str, open_index: int) -> int:
    depth = 0
    for index in range(open_index, len(text)):
        if text[index] == "(":
            depth += 1
        elif text[index] == ")":
            depth -= 1
            if depth == 0:
                return index
    raise SystemExit("translate.py: unbalanced parentheses after a launch")


def top_level_arguments(text: str) -> list:
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        depth += char in "([{"
        depth -= char in ")]}"
        if char == "," and depth == 0:
            parts.append(text[start:index].strip())
            start = index + 1
    return parts + [text[start:].strip()]


def rewrite_launches(text: str) -> str:
    while (match := LAUNCH.search(text)) is not None:
        kernel, config = match.group(1), match.group(2).strip()
        close = matching_paren(text, match.end() - 1)
        arguments = text[match.end():close]
        parts = top_level_arguments(config)
        dynamic_shared = len(parts) >= 3 and parts[2] not in ("0", "0u")
        key = f"reinterpret_cast<const void*>(&{kernel})" if dynamic_shared else "nullptr"
        values = f", {arguments}" if arguments.strip() else ""
        text = (text[:match.start()]
                + f"::cuda_fibers::launch({key}, \"{kernel}\", {{{config}}}, ::cuda_fibers::with_arguments("
                + f"[](const auto&... arguments) {{ {kernel}(arguments...); }}{values}))"
                + text[close + 1:])
    return text


def translate(text: str, keep_namespace: bool = False) -> str:
    text = rewrite_launches(text)
    text = re.sub(r"extern\s+__shared__\s+(?:__align__\(\s*\d+\s*\)\s+)?([\w ]+?)\s+(\w+)\s*\[\s*\]\s*;",
                  r"\1* const \2 = reinterpret_cast<\1*>(::cuda_fibers::dynamic_shared_memory());", text)
    # __launch_bounds__(N) ... name(params) {  ->  name(params) { check(N);
    text = re.sub(r"__launch_bounds__\(([^()]*(?:\([^()]*\))?[^()]*)\)([^{;]*?)\{",
                  r"\2{ ::cuda_fibers::check_launch_bounds(\1);", text, flags=re.S)
    text = re.sub(r"#ifdef __CUDACC__", "#if 1  // translated: the device half", text)
    if not keep_namespace:
        text = re.sub(r"\bnamespace zt::kernels::cuda\b", "namespace zt::kernels::cuda_on_host", text)
        text = re.sub(r'#include "kernels/cuda/', '#include "cuda_on_host/kernels/cuda/', text)
    if "<<<" in text or re.search(r"\bextern\s+__shared__", text) or "__launch_bounds__" in text:
        raise SystemExit("translate.py: a launch, dynamic shared array or launch bound was not rewritten")
    return text


def main() -> None:
    arguments = sys.argv[1:]
    keep_namespace = arguments[:1] == ["--keep-namespace"]
    if keep_namespace:
        arguments = arguments[1:]
    if len(arguments) != 2:
        raise SystemExit(__doc__)
    with open(arguments[0], encoding="utf-8") as source:
        text = source.read()
    translated = translate(text, keep_namespace)
    with open(arguments[1], "w", encoding="utf-8") as output:
        output.write(f"// Translated from {arguments[0]} by tests/cuda_on_host/translate.py: do not edit.\n")
        output.write(translated)


if __name__ == "__main__":
    main()
