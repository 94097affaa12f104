#!/usr/bin/env python3
"""Runs clang-tidy (.clang-tidy) on every translation unit the build compiles: src/, tests/,
fuzz/, bench/, examples/, the LibTorch units included. Run by .ci/run after the build.

    scripts/tidy_tree.py [BUILD] [--jobs N] [--no-cache] [UNIT_SUBSTRING ...]

BUILD (default: build) is the CMake build folder whose compile_commands.json names the units;
UNIT_SUBSTRING limits the run to units whose path contains one of them. Findings in the
repository's own files are printed once each (a header's finding is reported by every unit
that includes it); exit status 0 clean, 1 findings, 2 usage or missing tools.

A unit found clean is remembered in the cache folder (TIDY_CACHE, default
~/.cache/shardpoint-tidy, beside ccache) under the hash of its preprocessed text, its flags, the
clang-tidy version and .clang-tidy, so an unchanged unit is not checked again; a unit with
findings is always checked again.

The LibTorch units (src/torch, src/train) are read with scripts/tidy/libtorch_prelude.h
included first (it says why) and without bugprone-implicit-widening-of-multiplication-result,
which crashes clang-tidy 16 inside LibTorch's dynamic_type.h. The prelude leaves one
libstdc++ redeclaration error in stl_bvector.h, a system header; errors in system headers of
those units are therefore not findings (errors in our files still are).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

ROOT = os.path.realpath(os.path.join(os.path.dirname(__file__), ".."))
CLANG_TIDY = os.environ.get("CLANG_TIDY", "clang-tidy-16")
PRELUDE = os.path.join(ROOT, "scripts", "tidy", "libtorch_prelude.h")
LIBTORCH_MARK = "torch/csrc/api/include"
# clang-tidy 16 crashes in this check on LibTorch 1.13's ATen/core/dynamic_type.h.
LIBTORCH_CHECKS = "-bugprone-implicit-widening-of-multiplication-result"
DIAGNOSTIC = re.compile(r"^(/[^:]+):(\d+):(\d+): (error|warning): (.*) \[([^\]]+)\]$")


def units_of(build: str, only: list[str]) -> list[dict]:
    with open(os.path.join(build, "compile_commands.json")) as f:
        entries = json.load(f)
    units, seen = [], set()
    for e in entries:
        path = os.path.realpath(os.path.join(e["directory"], e["file"]))
        if not path.startswith(ROOT + os.sep) or os.path.relpath(path, ROOT).startswith("build"):
            continue
        if path in seen or (only and not any(s in path for s in only)):
            continue
        seen.add(path)
        args = e.get("arguments") or shlex.split(e["command"])
        units.append({"path": path, "directory": e["directory"], "args": args})
    return sorted(units, key=lambda u: u["path"])


def preprocessed_hash(unit: dict, salt: bytes) -> str | None:
    """The hash of the unit's preprocessed text with its flags; None where it does not preprocess."""
    args = list(unit["args"])
    if "-o" in args:
        i = args.index("-o")
        del args[i : i + 2]
    args = [a for a in args if a != "-c"] + ["-E", "-P", "-o", "-"]
    run = subprocess.run(args, cwd=unit["directory"], capture_output=True)
    if run.returncode != 0:
        return None
    h = hashlib.sha256(salt)
    h.update(" ".join(unit["args"]).encode())
    h.update(run.stdout)
    return h.hexdigest()


def tidy(unit: dict, build: str) -> tuple[int, str]:
    command = [CLANG_TIDY, "-p", build, "--quiet"]
    libtorch = any(LIBTORCH_MARK in a for a in unit["args"])
    if libtorch:
        command += [f"--extra-arg=-include{PRELUDE}", f"--checks={LIBTORCH_CHECKS}"]
    run = subprocess.run(command + [unit["path"]], capture_output=True, text=True)
    findings = []
    for line in run.stdout.splitlines():
        m = DIAGNOSTIC.match(line)
        if not m:
            continue
        path = os.path.realpath(m.group(1))
        if not path.startswith(ROOT + os.sep):
            if libtorch and m.group(6) == "clang-diagnostic-error":
                continue  # the prelude's known redeclaration error (see the top comment)
            if m.group(4) != "error":
                continue
        findings.append(f"{os.path.relpath(path, ROOT)}:{m.group(2)}:{m.group(3)}: {m.group(5)} [{m.group(6)}]")
    if run.returncode != 0 and not findings and not libtorch:
        findings.append(f"{os.path.relpath(unit['path'], ROOT)}: clang-tidy failed: {run.stderr.strip()[-400:]}")
    return len(findings), "\n".join(findings)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("build", nargs="?", default="build")
    parser.add_argument("only", nargs="*", help="check only units whose path contains one of these")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--no-cache", action="store_true")
    opts = parser.parse_args()
    if shutil.which(CLANG_TIDY) is None:
        print(f"tidy_tree: {CLANG_TIDY} not found (scripts/install-deps.sh installs it)", file=sys.stderr)
        return 2
    build = os.path.realpath(opts.build)
    if not os.path.isfile(os.path.join(build, "compile_commands.json")):
        print(f"tidy_tree: {build}/compile_commands.json missing: configure the build first", file=sys.stderr)
        return 2
    cache = os.environ.get("TIDY_CACHE", os.path.expanduser("~/.cache/shardpoint-tidy"))
    version = subprocess.run([CLANG_TIDY, "--version"], capture_output=True).stdout
    with open(os.path.join(ROOT, ".clang-tidy"), "rb") as f:
        config = f.read()
    with open(PRELUDE, "rb") as f:
        salt = version + config + f.read()
    units = units_of(build, opts.only)
    if not opts.no_cache:
        os.makedirs(cache, exist_ok=True)

    def check(unit: dict) -> tuple[dict, int, str, bool]:
        key = None if opts.no_cache else preprocessed_hash(unit, salt)
        marker = os.path.join(cache, key) if key else None
        if marker and os.path.exists(marker):
            return unit, 0, "", True
        count, text = tidy(unit, build)
        if count == 0 and marker:
            open(marker, "w").close()
        return unit, count, text, False

    reported: set[str] = set()
    failed_units, cached = 0, 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=opts.jobs) as pool:
        for unit, count, text, from_cache in pool.map(check, units):
            cached += from_cache
            if count:
                failed_units += 1
                for line in text.splitlines():
                    if line not in reported:
                        reported.add(line)
                        print(line, flush=True)
    print(
        f"tidy_tree: {len(units)} units ({cached} unchanged since a clean run), "
        f"{failed_units} with findings, {len(reported)} distinct findings"
    )
    return 1 if reported else 0


if __name__ == "__main__":
    sys.exit(main())
