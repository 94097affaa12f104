#!/usr/bin/python3
"""Benchmark: consolidate a ~4 GiB sharded checkpoint, shardpoint vs PyTorch 2.6 dcp_to_torch_save, vs fio.

  /usr/bin/python3 bench/consolidate_bench.py BUILD_DIR [--rounds 1] [--layers 48] [--dir DIR]

Setup (once): PyTorch 2.6 dcp.save on 4 gloo ranks of bench/dcp_bench.py's GPT-2 style state
(`--layers` layers; 48 = ~4.25 GB of float32 payload in Shard(0) DTensors + Adam state + 0-dim
steps), so the folder is exactly what PyTorch writes (no shardpoint sidecar).
Each round (caches dropped before every job; outputs deleted before every write):
  1. fio ceilings (payload-sized, 1 MiB, 1 job): cold buffered read; O_DIRECT write + end_fsync;
     and both at once (a cold read of one file while another is written O_DIRECT): the copy
     ceiling of this disk, whose reads and writes share one device (GB/s = size / the later
     job's runtime); that copy once more with 16 requests in flight each way (libaio,
     iodepth 16, O_DIRECT read and write): the most this disk copies.
  2. shardpoint consolidate --layout dcp (the same result as dcp_to_torch_save) -> A,
     default --memory-budget-bytes (256 MiB), durable (fsync + rename). Time = the whole process.
  3. PyTorch 2.6 format_utils.dcp_to_torch_save(folder, B) + fsync (scripts/oracle-python).
     Time = the call.
GB/s = tensor payload / time. Peak RSS = VmHWM of the process (shardpoint: whole process;
PyTorch: after `import torch`, reset with clear_refs just before the call, so only the call).
The ceiling is min(cold read, O_DIRECT write): a consolidation reads and writes every byte
once; the fraction of the concurrent copy ceiling is printed next to it. The machine's load
(loadavg, CPU pressure) is printed at the start and the end. Prints min/median/max over rounds, the ratio to PyTorch and the fraction of the ceiling
from medians. Needs root (drop_caches, oracle-python).
"""
import argparse
import json
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

PEER = r"""
import json, os, sys, time, warnings
warnings.filterwarnings("ignore")
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
def status(field):
    for l in open('/proc/self/status'):
        if l.startswith(field): return int(l.split()[1]) * 1024
src, dst = sys.argv[1], sys.argv[2]
open('/proc/self/clear_refs', 'w').write('5')
base = status('VmRSS:')
t = time.perf_counter()
dcp_to_torch_save(src, dst)
fd = os.open(dst, os.O_RDONLY); os.fsync(fd); os.close(fd)
dt = time.perf_counter() - t
print(json.dumps({'seconds': dt, 'peak_rss': status('VmHWM:'), 'base_rss': base}))
"""


def fio_copy_gbps(directory, size, deep=False):
    """Cold read of one file while another is written O_DIRECT (+ fsync), in one fio run:
    GB/s = size / the later job's runtime. Buffered psync reads (queue depth 1, the kernel's
    readahead), or with deep=True O_DIRECT libaio at 16 requests in flight each way. None
    without fio."""
    if shutil.which("fio") is None:
        return None
    common = ["--ioengine=psync", "--bs=1M", "--fallocate=none", f"--size={size}"]
    subprocess.run(["fio", f"--directory={directory}", "--name=copyr", "--rw=write", *common],
                   capture_output=True, text=True, timeout=600)
    benchlib.drop_caches()
    if deep:
        common = ["--ioengine=libaio", "--iodepth=16", "--direct=1", "--bs=1M", "--fallocate=none", f"--size={size}"]
    cmd = ["fio", f"--directory={directory}", "--output-format=json", *common,
           "--name=copyr", "--rw=read", "--name=copyw", "--rw=write", "--direct=1", "--end_fsync=1"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    benchlib.fio_cleanup(directory, "copyr")
    benchlib.fio_cleanup(directory, "copyw")
    if p.returncode != 0:
        return None
    jobs = json.loads(p.stdout)["jobs"]
    nbytes = max(j["read"]["io_bytes"] + j["write"]["io_bytes"] for j in jobs)
    seconds = max(j["job_runtime"] for j in jobs) / 1e3
    return nbytes / seconds / 1e9 if seconds > 0 else None


def machine_load():
    """'loadavg 1/5/15 min, CPU pressure some avg10 %' of this moment."""
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    try:
        with open("/proc/pressure/cpu") as f:
            some = f.readline().split()[1].split("=")[1]
    except OSError:
        some = "?"
    return f"loadavg {load}, CPU pressure {some} %"


def run_shardpoint(tool, ckpt, out):
    t = time.perf_counter()
    p = subprocess.run([tool, "consolidate", ckpt, "--layout", "dcp", "--output_file", out, "--quiet", "--stats"],
                       capture_output=True, text=True, timeout=1800)
    dt = time.perf_counter() - t
    if p.returncode != 0:
        raise RuntimeError(f"shardpoint consolidate failed ({p.returncode}): {p.stderr[-2000:]}")
    stats = json.loads([line for line in p.stderr.splitlines() if line.startswith("{")][-1])
    stats["wall_seconds"] = dt
    return stats


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build_dir")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--layers", type=int, default=48, help="model depth (48 = ~4.25 GB payload)")
    ap.add_argument("--dir", default=None, help="scratch folder on the disk to measure (default: under the build dir)")
    args = ap.parse_args()

    tool = os.path.join(os.path.abspath(args.build_dir), "src", "cli", "shardpoint")
    scratch = args.dir or tempfile.mkdtemp(prefix="sp-consolidate-bench-", dir=os.path.abspath(args.build_dir))
    os.makedirs(scratch, exist_ok=True)
    ckpt = os.path.join(scratch, "ckpt")
    a, b = os.path.join(scratch, "a.pt"), os.path.join(scratch, "b.pt")
    can_drop = benchlib.drop_caches()
    r = {k: [] for k in ["fio_r", "fio_w", "fio_copy", "fio_copy_deep", "sp", "peer"]}
    load_start = machine_load()
    rss = {"sp": [], "peer": []}
    payload = None
    try:
        print(f"saving the checkpoint with PyTorch 2.6 DCP, 4 ranks, {args.layers} layers ...", file=sys.stderr)
        dcp_bench.run_peer("save", ckpt, 4, args.layers, scratch)
        folder_bytes = sum(os.path.getsize(os.path.join(ckpt, f)) for f in os.listdir(ckpt))
        size = f"{max(1, round(folder_bytes / 2**30))}G"
        for rnd in range(args.rounds):
            print(f"round {rnd + 1}/{args.rounds} ...", file=sys.stderr)
            benchlib.fio_gbps(scratch, "ceilr", "write", size=size)
            benchlib.drop_caches()
            r["fio_r"].append(benchlib.fio_gbps(scratch, "ceilr", "read", size=size))
            benchlib.fio_cleanup(scratch, "ceilr")
            r["fio_w"].append(benchlib.fio_gbps(scratch, "ceilw", "write", size=size, direct=True))
            benchlib.fio_cleanup(scratch, "ceilw")
            r["fio_copy"].append(fio_copy_gbps(scratch, size))
            r["fio_copy_deep"].append(fio_copy_gbps(scratch, size, deep=True))

            for f in (a, b):
                if os.path.exists(f):
                    os.remove(f)
            benchlib.drop_caches()
            s = run_shardpoint(tool, ckpt, a)
            payload = s["tensor_bytes"]
            r["sp"].append(payload / s["wall_seconds"] / 1e9)
            rss["sp"].append(s["peak_rss_bytes"])
            os.remove(a)

            benchlib.drop_caches()
            p = benchlib.run_json([os.path.join(REPO, "scripts", "oracle-python"), "-c", PEER, ckpt, b], timeout=1800)
            r["peer"].append(payload / p["seconds"] / 1e9)
            rss["peer"].append(p["peak_rss"] - p["base_rss"])
            os.remove(b)
    finally:
        shutil.rmtree(ckpt, ignore_errors=True)
        for f in (a, b):
            if os.path.exists(f):
                os.remove(f)
        if args.dir is None:
            shutil.rmtree(scratch, ignore_errors=True)

    m = {k: benchlib.median([v for v in vs if v is not None]) if any(v is not None for v in vs) else None
         for k, vs in r.items()}
    ceiling = min(m["fio_r"], m["fio_w"]) if m["fio_r"] and m["fio_w"] else None
    load_end = machine_load()
    print(f"\nmachine load: start {load_start}; end {load_end}")
    print(f"payload {payload / 1e9:.3f} GB ({args.layers} layers, PyTorch 2.6 DCP on 4 ranks), {args.rounds} "
          f"round(s); drop_caches {'on' if can_drop else 'NOT available: cold figures are warm'}")
    benchlib.print_table(
        "consolidate (DCP folder -> one torch.save file, fsynced): GB/s min/median/max",
        ["job", "shardpoint", "PyTorch 2.6 dcp_to_torch_save", "ratio (median)",
         "ceiling min(cold read, O_DIRECT write) (fio)", "fraction of ceiling",
         "copy ceiling (read + write at once, fio QD1 / QD16)", "fraction of copy ceiling (QD1 / QD16)", "target"],
        [["consolidate, cold cache", benchlib.triple(r["sp"]), benchlib.triple(r["peer"]),
          benchlib.ratio(m["sp"], m["peer"]),
          f"read {benchlib.triple(r['fio_r'])}, write {benchlib.triple(r['fio_w'])}",
          benchlib.fraction(m["sp"], ceiling) if ceiling else "-",
          f"{benchlib.triple(r['fio_copy'])} / {benchlib.triple(r['fio_copy_deep'])}",
          " / ".join(benchlib.fraction(m["sp"], m[k]) if m[k] else "-" for k in ("fio_copy", "fio_copy_deep")),
          ">= 3x, >= 0.70"]])
    benchlib.print_table(
        "memory (median over rounds)",
        ["job", "shardpoint (whole process, --memory-budget-bytes 256 MiB)", "PyTorch 2.6 (growth during the call)", "target"],
        [["peak RSS", benchlib.gib(benchlib.median(rss["sp"])), benchlib.gib(benchlib.median(rss["peer"])),
          "< 256 MiB at any size"]])


if __name__ == "__main__":
    main()
