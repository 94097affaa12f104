#!/usr/bin/python3
"""Benchmark: reshard a torch.save file into DCP, shardpoint vs PyTorch 2.6 torch_save_to_dcp, vs fio.

  /usr/bin/python3 bench/reshard_bench.py BUILD_DIR [--rounds 1] [--layers 48] [--dir DIR]

Setup (once): Debian's PyTorch 1.13 torch.save of bench/dcp_bench.py's GPT-2 style parameters
(`--layers` layers; 48 = ~1.4 GB float32, random values) into SRC.
Each round (caches dropped before every job; outputs deleted before every write):
  1. fio ceilings (payload-sized, 1 MiB, 1 job): cold buffered read; O_DIRECT write + end_fsync.
  2. shardpoint reshard SRC A --ranks 1 (torch.save -> DCP), default --memory-budget-bytes (256 MiB),
     durable. Time = the whole process.
  3. PyTorch 2.6 format_utils.torch_save_to_dcp(SRC, B) + fsync of every file
     (scripts/oracle-python). Time = the call.
  4. shardpoint reshard SRC C --ranks 4 (no PyTorch equivalent in one call: "-").
GB/s = tensor payload / time. Peak RSS: shardpoint = ru_maxrss of the whole process;
PyTorch = VmHWM growth during the call (after `import torch`, clear_refs just before). The
ceiling is min(cold read, O_DIRECT write): a conversion reads and writes every byte once.
Prints min/median/max over rounds, the ratio to PyTorch and the fraction of the ceiling from
medians. Needs root (drop_caches, oracle-python).
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import benchlib  # noqa: E402
import dcp_bench  # noqa: E402

MAKE_SOURCE = r"""
import collections, sys, torch
specs = [(n, tuple(s)) for n, s in __import__('json').loads(sys.argv[2])]
torch.manual_seed(0)
sd = collections.OrderedDict((n, torch.randn(*s)) for n, s in specs)
torch.save({'model': sd, 'step': 1000}, sys.argv[1])
"""

PEER = r"""
import json, os, sys, time, warnings
warnings.filterwarnings("ignore")
import torch
from torch.distributed.checkpoint.format_utils import torch_save_to_dcp
def status(field):
    for l in open('/proc/self/status'):
        if l.startswith(field): return int(l.split()[1]) * 1024
src, dst = sys.argv[1], sys.argv[2]
open('/proc/self/clear_refs', 'w').write('5')
base = status('VmRSS:')
t = time.perf_counter()
torch_save_to_dcp(src, dst)
for f in os.listdir(dst):
    fd = os.open(os.path.join(dst, f), os.O_RDONLY); os.fsync(fd); os.close(fd)
dt = time.perf_counter() - t
print(json.dumps({'seconds': dt, 'peak_rss': status('VmHWM:'), 'base_rss': base}))
"""


def run_shardpoint(tool, src, dst, ranks):
    """Seconds and peak RSS (bytes) of `shardpoint reshard` as a whole process."""
    t = time.perf_counter()
    p = subprocess.Popen([tool, "reshard", "-q", src, dst, "--ranks", str(ranks)], stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(p.pid, 0)
    dt = time.perf_counter() - t
    err = p.stderr.read()
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise RuntimeError(f"shardpoint reshard failed ({p.returncode}): {err[-2000:]}")
    return dt, usage.ru_maxrss * 1024


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build_dir")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--layers", type=int, default=48, help="model depth (48 = ~1.4 GB payload)")
    ap.add_argument("--dir", default=None, help="scratch folder on the disk to measure (default: under the build dir)")
    args = ap.parse_args()

    tool = os.path.join(os.path.abspath(args.build_dir), "src", "cli", "shardpoint")
    scratch = args.dir or tempfile.mkdtemp(prefix="sp-reshard-bench-", dir=os.path.abspath(args.build_dir))
    os.makedirs(scratch, exist_ok=True)
    src = os.path.join(scratch, "src.pt")
    outs = {k: os.path.join(scratch, k) for k in ("a", "b", "c")}
    can_drop = benchlib.drop_caches()
    r = {k: [] for k in ["fio_r", "fio_w", "sp", "peer", "sp4"]}
    rss = {"sp": [], "peer": [], "sp4": []}
    specs = dcp_bench.gpt2_parameters(args.layers)
    payload = sum(4 * math.prod(s) for _, s in specs)
    try:
        print(f"writing the torch.save source with PyTorch 1.13, {args.layers} layers ...", file=sys.stderr)
        subprocess.run(["/usr/bin/python3", "-c", MAKE_SOURCE, src, json.dumps(specs)], check=True)
        size = f"{max(1, round(os.path.getsize(src) / 2**30))}G"
        for rnd in range(args.rounds):
            print(f"round {rnd + 1}/{args.rounds} ...", file=sys.stderr)
            benchlib.fio_gbps(scratch, "ceilr", "write", size=size)
            benchlib.drop_caches()
            r["fio_r"].append(benchlib.fio_gbps(scratch, "ceilr", "read", size=size))
            benchlib.fio_cleanup(scratch, "ceilr")
            r["fio_w"].append(benchlib.fio_gbps(scratch, "ceilw", "write", size=size, direct=True))
            benchlib.fio_cleanup(scratch, "ceilw")

            for out in outs.values():
                shutil.rmtree(out, ignore_errors=True)
            benchlib.drop_caches()
            dt, peak = run_shardpoint(tool, src, outs["a"], 1)
            r["sp"].append(payload / dt / 1e9)
            rss["sp"].append(peak)
            shutil.rmtree(outs["a"], ignore_errors=True)

            benchlib.drop_caches()
            p = benchlib.run_json([os.path.join(REPO, "scripts", "oracle-python"), "-c", PEER, src, outs["b"]],
                                  timeout=1800)
            r["peer"].append(payload / p["seconds"] / 1e9)
            rss["peer"].append(p["peak_rss"] - p["base_rss"])
            shutil.rmtree(outs["b"], ignore_errors=True)

            benchlib.drop_caches()
            dt, peak = run_shardpoint(tool, src, outs["c"], 4)
            r["sp4"].append(payload / dt / 1e9)
            rss["sp4"].append(peak)
            shutil.rmtree(outs["c"], ignore_errors=True)
    finally:
        if os.path.exists(src):
            os.remove(src)
        for out in outs.values():
            shutil.rmtree(out, ignore_errors=True)
        if args.dir is None:
            shutil.rmtree(scratch, ignore_errors=True)

    m = {k: benchlib.median(vs) for k, vs in r.items()}
    ceiling = min(m["fio_r"], m["fio_w"]) if m["fio_r"] and m["fio_w"] else None
    print(f"\npayload {payload / 1e9:.3f} GB ({args.layers} layers, torch.save by PyTorch 1.13), {args.rounds} "
          f"round(s); drop_caches {'on' if can_drop else 'NOT available: cold figures are warm'}")
    benchlib.print_table(
        "reshard (torch.save file -> DCP folder, fsynced): GB/s min/median/max",
        ["job", "shardpoint", "PyTorch 2.6 torch_save_to_dcp", "ratio (median)",
         "ceiling min(cold read, O_DIRECT write) (fio)", "fraction of ceiling"],
        [["--ranks 1, cold cache", benchlib.triple(r["sp"]), benchlib.triple(r["peer"]),
          benchlib.ratio(m["sp"], m["peer"]),
          f"read {benchlib.triple(r['fio_r'])}, write {benchlib.triple(r['fio_w'])}",
          benchlib.fraction(m["sp"], ceiling) if ceiling else "-"],
         ["--ranks 4, cold cache", benchlib.triple(r["sp4"]), "-", "-", "same",
          benchlib.fraction(m["sp4"], ceiling) if ceiling else "-"]])
    benchlib.print_table(
        "memory (median over rounds)",
        ["job", "shardpoint (whole process, --memory-budget-bytes 256 MiB)", "PyTorch 2.6 (growth during the call)"],
        [["peak RSS, --ranks 1", benchlib.gib(benchlib.median(rss["sp"])), benchlib.gib(benchlib.median(rss["peer"]))],
         ["peak RSS, --ranks 4", benchlib.gib(benchlib.median(rss["sp4"])), "-"]])


if __name__ == "__main__":
    main()
