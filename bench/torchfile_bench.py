#!/usr/bin/python3
"""Benchmark: one ~2 GiB torch.save file, shardpoint vs Debian's PyTorch 1.13, vs fio.

  /usr/bin/python3 bench/torchfile_bench.py BUILD_DIR [--rounds 3] [--layers 24] [--dir DIR]

Each round (caches dropped before every cold job; files deleted before every write):
  1. fio ceilings: O_DIRECT write + end_fsync (1 job), buffered cold read (1 job), 2 GiB.
  2. shardpoint writes the state (O_DIRECT, durable commit) -> A.
  3. PyTorch 1.13: torch.load(A) cold and warm (weights_only=True), then torch.save of
     the loaded state -> B + fsync: the peer writes exactly the same data.
  4. shardpoint reads A cold and warm (mapped, every byte touched).
Prints GB/s (payload / time) min/median/max, ratio to the peer and fraction of the fio
ceiling, and peak RSS. Needs root for drop_caches (otherwise cold == warm, noted).
"""
import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

PEER = r"""
import json, os, sys, time, torch
torch.set_num_threads(2)
def hwm():
    for l in open('/proc/self/status'):
        if l.startswith('VmHWM:'): return int(l.split()[1]) * 1024
def rss():
    for l in open('/proc/self/status'):
        if l.startswith('VmRSS:'): return int(l.split()[1]) * 1024
mode, path = sys.argv[1], sys.argv[2]
if mode == 'load':
    base = rss(); open('/proc/self/clear_refs', 'w').write('5')
    t = time.perf_counter(); sd = torch.load(path, weights_only=True); dt = time.perf_counter() - t
    n = 0
    def walk(o):
        global n
        if isinstance(o, torch.Tensor): n += o.numel() * o.element_size()
        elif isinstance(o, dict): [walk(v) for v in o.values()]
    walk(sd)
    print(json.dumps({'seconds': dt, 'bytes': n, 'peak_rss_growth': hwm() - base}))
else:
    src = sys.argv[3]
    sd = torch.load(src, weights_only=True)
    base = rss(); open('/proc/self/clear_refs', 'w').write('5')
    t = time.perf_counter(); torch.save(sd, path)
    fd = os.open(path, os.O_RDONLY); os.fsync(fd); os.close(fd)
    dt = time.perf_counter() - t
    print(json.dumps({'seconds': dt, 'peak_rss_growth': hwm() - base}))
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build_dir")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--layers", type=int, default=24, help="model depth (24 = ~2 GiB state)")
    ap.add_argument("--dir", default=None, help="scratch folder on the disk to measure (default: a temp dir under the build dir)")
    args = ap.parse_args()

    tool = os.path.join(args.build_dir, "bench", "torchfile_bench")
    scratch = args.dir or tempfile.mkdtemp(prefix="sp-bench-", dir=os.path.abspath(args.build_dir))
    os.makedirs(scratch, exist_ok=True)
    a, b = os.path.join(scratch, "state_a.pt"), os.path.join(scratch, "state_b.pt")
    can_drop = benchlib.drop_caches()
    r = {k: [] for k in ["fio_w", "fio_r", "w", "peer_w", "rc", "rw", "peer_rc", "peer_rw"]}
    rss = {"w": [], "rc": [], "peer_w": [], "peer_rc": []}
    payload = None
    try:
        for rnd in range(args.rounds):
            print(f"round {rnd + 1}/{args.rounds} ...", file=sys.stderr)
            r["fio_w"].append(benchlib.fio_gbps(scratch, "ceilw", "write", direct=True))
            benchlib.fio_cleanup(scratch, "ceilw")
            benchlib.fio_gbps(scratch, "ceilr", "write")  # lay out the file to read
            benchlib.drop_caches()
            r["fio_r"].append(benchlib.fio_gbps(scratch, "ceilr", "read"))
            benchlib.fio_cleanup(scratch, "ceilr")

            for f in (a, b):
                if os.path.exists(f):
                    os.remove(f)
            benchlib.drop_caches()
            w = benchlib.run_json([tool, "write", a, "--layers", str(args.layers)])
            payload = w["bytes"]
            r["w"].append(payload / w["seconds"] / 1e9)
            rss["w"].append(w["extra_peak_rss"])

            benchlib.drop_caches()
            pc = benchlib.run_json(["/usr/bin/python3", "-c", PEER, "load", a])
            r["peer_rc"].append(payload / pc["seconds"] / 1e9)
            rss["peer_rc"].append(pc["peak_rss_growth"])
            pw = benchlib.run_json(["/usr/bin/python3", "-c", PEER, "load", a])
            r["peer_rw"].append(payload / pw["seconds"] / 1e9)
            ps = benchlib.run_json(["/usr/bin/python3", "-c", PEER, "save", b, a])
            r["peer_w"].append(payload / ps["seconds"] / 1e9)
            rss["peer_w"].append(ps["peak_rss_growth"])
            os.remove(b)

            benchlib.drop_caches()
            rc = benchlib.run_json([tool, "read", a])
            r["rc"].append(payload / rc["seconds"] / 1e9)
            rss["rc"].append(rc["anon_rss"])
            rw = benchlib.run_json([tool, "read", a])
            r["rw"].append(payload / rw["seconds"] / 1e9)
    finally:
        for f in (a, b):
            if os.path.exists(f):
                os.remove(f)
        if args.dir is None:
            os.rmdir(scratch)

    m = {k: benchlib.median(v) for k, v in r.items()}
    print(f"\npayload {payload / 1e9:.3f} GB, {args.rounds} rounds; drop_caches "
          f"{'on' if can_drop else 'NOT available: cold figures are warm'}")
    benchlib.print_table(
        "torch.save file: shardpoint vs PyTorch 1.13 (GB/s min/median/max)",
        ["job", "shardpoint", "PyTorch 1.13", "ratio (median)", "ceiling (fio, median)", "fraction of ceiling", "target"],
        [
            ["write + fsync", benchlib.triple(r["w"]), benchlib.triple(r["peer_w"]), benchlib.ratio(m["w"], m["peer_w"]),
             f"O_DIRECT write {benchlib.triple(r['fio_w'])}", benchlib.fraction(m["w"], m["fio_w"]), ">= 2x, >= 0.80"],
            ["read, cold cache", benchlib.triple(r["rc"]), benchlib.triple(r["peer_rc"]), benchlib.ratio(m["rc"], m["peer_rc"]),
             f"buffered cold read {benchlib.triple(r['fio_r'])}", benchlib.fraction(m["rc"], m["fio_r"]), ">= 0.90"],
            ["read, warm cache", benchlib.triple(r["rw"]), benchlib.triple(r["peer_rw"]), benchlib.ratio(m["rw"], m["peer_rw"]),
             "-", "-", ">= 3x"],
        ])
    benchlib.print_table(
        "memory (median over rounds)",
        ["job", "shardpoint", "PyTorch 1.13", "target"],
        [
            ["writer: peak RSS beyond the state", benchlib.gib(benchlib.median(rss["w"])),
             benchlib.gib(benchlib.median(rss["peer_w"])), "<= 64 MiB"],
            ["reader: anonymous RSS (mapped, nothing copied) / peer peak growth",
             benchlib.gib(benchlib.median(rss["rc"])), benchlib.gib(benchlib.median(rss["peer_rc"])), "<= 64 MiB"],
        ])


if __name__ == "__main__":
    main()
