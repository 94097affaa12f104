#!/usr/bin/python3
"""Benchmark: save on 4 ranks and load on 2 and 3 ranks, shardpoint vs PyTorch DCP at its best
settings that run here (the newest PyTorch, from the project's venv, and PyTorch 2.6), vs fio.

  /usr/bin/python3 bench/dcp_bench.py BUILD_DIR [--rounds 3] [--layers 24] [--dir DIR] [--only load|zip-crc]

The state is the one the PyTorch peer baseline was measured on: GPT-2 style,
`--layers` layers, d=768, ff=3072, vocab 8192, ctx 1024, + LayerNorm, with Adam exp_avg and
exp_avg_sq and a 0-dim `step` per parameter (24 layers: 2.126 GB of float32 payload). Every
tensor is Shard(0) over a 1-D mesh of the world size (PyTorch: DTensor.from_local on a CPU
mesh; shardpoint: engine/chunking.h shard_box); steps are replicated. Ranks are processes
(shardpoint: BUILD_DIR/bench/dcp_bench with torchrun's env and SHARDPOINT_COMM=tcp, its
LibTorch-free communicator; PyTorch: this file under the venv's python (scripts/setup-python.sh,
the newest PyTorch) and under scripts/oracle-python (PyTorch 2.6), gloo, torch.set_num_threads(1)).

PyTorch at its best: saves with FileSystemWriter(thread_count=4) and, where the version has it
(2.7+), DefaultSavePlanner(enable_plan_caching=True); each peer save process saves twice and the
second save is timed (the first fills the plan cache; folder removed and caches dropped between),
as a training loop's later saves run. shardpoint's save is one save per process (its C++ engine
keeps no plan between processes): its first save against PyTorch's cached second. Loads:
FileSystemReader (no setting changes its speed). PyTorch 2.6 runs the save and the 4->2 loads as
a second column; the zip CRC-32 step loads PyTorch 2.6's checkpoint, as before.

Each round (caches dropped before every write and every cold job; files deleted before
every write):
  1. fio ceilings: seq write 1 MiB O_DIRECT 4 jobs, buffered + end_fsync 4 jobs; cold
     buffered seq read 1 job and 4 jobs (total size = the payload, at least 256 MiB).
  2. shardpoint save, 4 ranks -> A        3. PyTorch dcp.save, 4 ranks -> B (newest), B26 (2.6)
  4. shardpoint load A on 2 ranks cold, warm twice (first and second re-read), on 3 ranks cold
  5. PyTorch dcp.load B on 2 ranks cold, warm twice, on 3 ranks cold; 2.6 loads B26 on 2 ranks
     cold and warm
  6. shardpoint load B26 (PyTorch 2.6's checkpoint) on 2 ranks (interop check, no sidecar: the zip
     CRC-32s are checked): cold with the check on and off (the order alternates between
     rounds), then warm: one untimed re-read, then off, on, off, on
Time = the longest rank's call (ranks start after a barrier); GB/s = payload / time. Peak
RSS = VmHWM during the call (reset with clear_refs just before). Every load is verified
against the values. Needs root (drop_caches, oracle-python).

Two warm loads: the first re-read after a cold load and the second. They differ on this
kernel: pages that readahead brought in as 4 KiB folios (POSIX_FADV_WILLNEED, which
shardpoint's cold loads use for a deep queue) are moved to the active LRU list on their
first re-read (folio_batch_move_lru / workingset_activation: ~20 % of that load's CPU in
perf); plain sequential reads (PyTorch's) bring large folios, so few moves.

Prints tables like bench/torchfile_bench.py: min/median/max over rounds, ratio to PyTorch
and fraction of the ceiling from medians, and the CPU seconds of each call (less disturbed
than wall time on a shared machine). RESULTS=FILE appends the raw per-job JSON lines.

--only load (needs --dir): the loads and the read ceilings only, for quick iterations on the
load path; both checkpoints are saved into DIR once (untimed) when missing, and kept.
--only zip-crc (needs --dir): step 6 and PyTorch 2.6's loads of B26 (cold, warm) only: the cost of
the zip CRC-32 check on load, with the peer in the same run.
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
from benchlib import pick_port, rm  # noqa: E402

MIB = 1 << 20


# --- the PyTorch peer (runs under the venv's python or scripts/oracle-python) ----------------

def fnv1a32(text):
    h = 2166136261
    for b in text.encode("utf-8"):
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return h


def gpt2_parameters(layers):
    """Same names and shapes as bench/bench_util.h gpt2_parameters()."""
    d, ff, vocab, ctx = 768, 3072, 8192, 1024
    specs = [("wte.weight", (vocab, d)), ("wpe.weight", (ctx, d))]
    for layer in range(layers):
        p = f"h.{layer}."
        for n, s in [("ln_1.weight", (d,)), ("ln_1.bias", (d,)),
                     ("attn.c_attn.weight", (3 * d, d)), ("attn.c_attn.bias", (3 * d,)),
                     ("attn.c_proj.weight", (d, d)), ("attn.c_proj.bias", (d,)),
                     ("ln_2.weight", (d,)), ("ln_2.bias", (d,)),
                     ("mlp.c_fc.weight", (ff, d)), ("mlp.c_fc.bias", (ff,)),
                     ("mlp.c_proj.weight", (d, ff)), ("mlp.c_proj.bias", (d,))]:
            specs.append((p + n, s))
    specs += [("ln_f.weight", (d,)), ("ln_f.bias", (d,))]
    return specs


def shard0_rows(n, ws, rank):
    chunk = -(-n // ws)
    start = min(rank * chunk, n)
    return start, min(start + chunk, n)


def shard0_dtensor(torch, local, mesh, shape):
    """local (this rank's rows) as a DTensor Shard(0) over mesh of a row-major tensor of shape."""
    from torch.distributed.tensor import DTensor, Shard

    stride, acc = [], 1
    for s in reversed(shape):
        stride.insert(0, acc)
        acc *= s
    return DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=torch.Size(shape),
                              stride=tuple(stride))


def peer_local(torch, key, shape, ws, rank):
    """This rank's rows of key's tensor: ((fnv1a32(key) + 7919 i) mod 1000 - 500) / 8."""
    start, end = shard0_rows(shape[0], ws, rank)
    row = 1
    for s in shape[1:]:
        row *= s
    i = torch.arange(start * row, end * row, dtype=torch.int64)
    v = ((fnv1a32(key) + 7919 * i) % 1000 - 500).to(torch.float32) / 8
    return v.reshape((end - start,) + tuple(shape[1:]))


def peer_state(torch, layers, ws, rank, fill):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    mesh = init_device_mesh("cpu", (ws,))
    locals_ = []

    def dt(key, shape):
        if fill:
            local = peer_local(torch, key, shape, ws, rank)
        else:
            start, end = shard0_rows(shape[0], ws, rank)
            local = torch.full((end - start,) + tuple(shape[1:]), -1.0)  # pre-faulted
        locals_.append((key, shape, local))
        stride = []
        acc = 1
        for s in reversed(shape):
            stride.insert(0, acc)
            acc *= s
        return DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=torch.Size(shape),
                                  stride=tuple(stride))

    params = gpt2_parameters(layers)
    model = {n: dt("model." + n, s) for n, s in params}
    state = {n: {"step": torch.tensor(10.0 if fill else -1.0),
                 "exp_avg": dt(f"optimizer_0.state.{n}.exp_avg", s),
                 "exp_avg_sq": dt(f"optimizer_0.state.{n}.exp_avg_sq", s)} for n, s in params}
    group = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0, "amsgrad": False,
             "foreach": None, "maximize": False, "capturable": False, "differentiable": False,
             "fused": None, "params": [n for n, _ in params]}
    sd = {"model": model, "optimizer_0": {"state": state, "param_groups": [group]}}
    own = sum(t.numel() * t.element_size() for _, _, t in locals_)
    return sd, locals_, own


def _status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _io(field):
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def peer_save_best(torch, dist, dcp, sd, ckpt, rank):
    """PyTorch's best sync save that runs here: FileSystemWriter with 4 threads and, where the
    version has it, plan caching. Saves once untimed (fills the plan cache), removes the folder
    and drops the page cache (rank 0), and returns the function that makes the timed save."""
    import inspect

    from torch.distributed.checkpoint import DefaultSavePlanner

    caching = "enable_plan_caching" in inspect.signature(DefaultSavePlanner.__init__).parameters

    def save():
        planner = DefaultSavePlanner(enable_plan_caching=True) if caching else DefaultSavePlanner()
        dcp.save(sd, storage_writer=dcp.FileSystemWriter(ckpt, thread_count=4), planner=planner)

    save()
    dist.barrier()
    if rank == 0:
        shutil.rmtree(ckpt, ignore_errors=True)
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3")
        except OSError:
            pass
    return save


def peer_job(rank, ws, mode, ckpt, layers, results):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    import warnings

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    sd, locals_, own = peer_state(torch, layers, ws, rank, fill=(mode == "save"))
    save = peer_save_best(torch, dist, dcp, sd, ckpt, rank) if mode == "save" else None
    rss_before = _status("VmRSS")
    rchar0, read0 = _io("rchar"), _io("read_bytes")
    import resource
    dist.barrier()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    if save is not None:
        save()
    else:
        dcp.load(sd, checkpoint_id=ckpt)
    seconds = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    out = {"rank": rank, "world_size": ws, "torch": torch.__version__, "seconds": seconds, "bytes": own, "own_bytes": own,
           "peak_rss": _status("VmHWM"), "rss_before": rss_before,
           "bytes_read": _io("rchar") - rchar0, "device_read_bytes": _io("read_bytes") - read0, "cpu_seconds": cpu,
           "verified": True}
    if mode == "load":
        ok = True
        for key, shape, local in locals_:
            if not torch.equal(local, peer_local(torch, key, shape, ws, rank)):
                ok = False
        for n, _ in gpt2_parameters(layers):
            ok = ok and float(sd["optimizer_0"]["state"][n]["step"]) == 10.0
        out["verified"] = ok
        out["bytes_needed"] = own
    with open(os.path.join(results, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)


def peer_main(argv):
    ap = argparse.ArgumentParser(prog="dcp_bench.py peer")
    ap.add_argument("mode", choices=["save", "load"])
    ap.add_argument("ckpt")
    ap.add_argument("--ws", type=int, required=True)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--results", required=True)
    a = ap.parse_args(argv)
    sys.path.insert(0, os.path.join(REPO, "tests", "oracle"))
    import dcp_oracle

    dcp_oracle.run_ranks(peer_job, a.ws, args=(a.mode, a.ckpt, a.layers, a.results), timeout_s=600)


# --- the driver (host python3) --------------------------------------------------------------

def collect(results, ws):
    ranks = []
    for r in range(ws):
        with open(os.path.join(results, f"rank{r}.json")) as f:
            ranks.append(json.load(f))
    return ranks


def run_shardpoint(tool, mode, ckpt, ws, layers, extra=(), attempts=3, env=None):
    """Runs ws dcp_bench processes (environment: env, default os.environ); returns the per-rank JSON objects."""
    last = ""
    for _ in range(attempts):
        port = pick_port()
        procs = []
        for r in range(ws):
            rank_env = dict(env or os.environ, RANK=str(r), WORLD_SIZE=str(ws), MASTER_ADDR="127.0.0.1",
                            MASTER_PORT=str(port), SHARDPOINT_COMM="tcp")
            procs.append(subprocess.Popen([tool, mode, ckpt, "--layers", str(layers), *extra], env=rank_env,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outs = [p.communicate(timeout=900) for p in procs]
        if all(p.returncode == 0 for p in procs):
            return [json.loads([line for line in o.splitlines() if line.startswith("{")][-1]) for o, _ in outs]
        last = "\n".join(f"rank {r} exit {p.returncode}: {e[-1500:]}" for r, (p, (_, e)) in enumerate(zip(procs, outs)))
        if any(p.returncode == 1 for p in procs):
            break  # a value differs: no retry
    raise RuntimeError(f"dcp_bench {mode} {ckpt} ws={ws} failed:\n{last}")


ORACLE = os.path.join(REPO, "scripts", "oracle-python")  # PyTorch 2.6


def newest_python():
    """The project venv's python (the newest PyTorch), or None when there is none."""
    p = subprocess.run([os.path.join(REPO, "scripts", "setup-python.sh")], capture_output=True, text=True)
    return p.stdout.strip() or None


def run_peer(mode, ckpt, ws, layers, scratch, python=ORACLE):
    results = tempfile.mkdtemp(prefix="peer-", dir=scratch)
    try:
        cmd = [python, os.path.abspath(__file__), "peer", mode, ckpt,
               "--ws", str(ws), "--layers", str(layers), "--results", results]
        last = ""
        for _ in range(3):
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
            if p.returncode == 0:
                return collect(results, ws)
            last = p.stderr[-3000:]
        raise RuntimeError(f"peer {mode} {ckpt} ws={ws} failed:\n{last}")
    finally:
        shutil.rmtree(results, ignore_errors=True)


def summarize(ranks):
    """One job's figures from its ranks."""
    s = {"seconds": max(r["seconds"] for r in ranks),
         "bytes": sum(r["bytes"] for r in ranks),
         "peak_rss": max(r["peak_rss"] for r in ranks),
         "excess_rss": max(r["peak_rss"] - r["own_bytes"] for r in ranks),
         "before_rss": max(r["rss_before"] for r in ranks),
         "transient_rss": max(r["peak_rss"] - r["rss_before"] for r in ranks),
         "own": max(r["own_bytes"] for r in ranks),
         "cpu": max(r.get("cpu_seconds", 0) for r in ranks),
         "cpu_total": sum(r.get("cpu_seconds", 0) for r in ranks),
         "verified": all(r.get("verified", True) for r in ranks),
         "torch": ranks[0].get("torch", "")}
    if "bytes_needed" in ranks[0]:
        s["needed"] = sum(r["bytes_needed"] for r in ranks)
        s["read"] = sum(r["bytes_read"] for r in ranks)
        if "data_bytes_read" in ranks[0]:
            s["data_read"] = sum(r["data_bytes_read"] for r in ranks)
        s["device_read"] = sum(r.get("device_read_bytes", 0) for r in ranks)
    return s


def zip_crc_round(tool, ckpt, layers, rnd, res, raw, scratch, peer=True):
    """Step 6: shardpoint loads PyTorch's checkpoint on 2 ranks with the zip CRC-32 check on
    and off, cold (order alternating by round) and warm (after one untimed re-read: off, on,
    off, on); with peer, PyTorch's own cold and warm loads of it too."""
    import benchlib

    def job(name, fn):
        ranks = fn()
        s = summarize(ranks)
        if not s["verified"]:
            raise RuntimeError(f"{name}: loaded values differ")
        s["zip_crc_records"] = sum(r.get("zip_crc_records", 0) for r in ranks)
        res[name].append(s)
        if raw:
            raw.write(json.dumps({"round": rnd, "job": name, "summary": s, "ranks": ranks}) + "\n")
            raw.flush()

    on = lambda: run_shardpoint(tool, "load", ckpt, 2, layers)  # noqa: E731
    off = lambda: run_shardpoint(tool, "load", ckpt, 2, layers, extra=("--no-zip-crc",))  # noqa: E731
    for name, fn in ([("sp_l2c_pt", on), ("sp_l2c_pt_off", off)] if rnd % 2 == 0 else
                     [("sp_l2c_pt_off", off), ("sp_l2c_pt", on)]):
        benchlib.drop_caches()
        job(name, fn)
    job("sp_l2w_pt_warmup", on)
    for name, fn in [("sp_l2w_pt_off", off), ("sp_l2w_pt", on), ("sp_l2w_pt_off", off), ("sp_l2w_pt", on)]:
        job(name, fn)
    floor = subprocess.run([tool, "crc-floor", ckpt], capture_output=True, text=True, check=True)
    res["crc_floor"].append(json.loads(floor.stdout.splitlines()[-1]))
    if peer:
        benchlib.drop_caches()
        job("pt26_l2c", lambda: run_peer("load", ckpt, 2, layers, scratch))
        job("pt26_l2w", lambda: run_peer("load", ckpt, 2, layers, scratch))


def print_zip_crc_table(res, g, m):
    """The zip CRC-32 check's cost: shardpoint loading PyTorch's checkpoint with it on and off, and
    the least it can cost on this machine (dcp_bench crc-floor)."""
    import benchlib

    def cost(on, off):
        t_on = benchlib.median([s["seconds"] for s in res[on]])
        t_off = benchlib.median([s["seconds"] for s in res[off]])
        return f"{(t_on / t_off - 1) * 100:+.1f} %" if t_on and t_off else "-"

    def cpu_cost(on, off):
        # The check's extra CPU (both ranks) over the unchecked load's wall time x ranks: what
        # the check would add if none of it overlapped anything (an upper bound for a cold load,
        # where the CPU waits on the disk; about the cost itself for a CPU-bound warm load).
        c_on = benchlib.median([s["cpu_total"] for s in res[on]])
        c_off = benchlib.median([s["cpu_total"] for s in res[off]])
        t_off = benchlib.median([s["seconds"] for s in res[off]])
        return f"{(c_on - c_off) / (2 * t_off) * 100:+.1f} %" if t_off else "-"

    def records(name):
        return str(int(benchlib.median([s.get("zip_crc_records", 0) for s in res[name]]))) if res[name] else "-"

    benchlib.print_table(
        "zip CRC-32 check on load: shardpoint loads PyTorch 2.6's checkpoint (4 ranks -> 2, no sidecar), "
        "check on vs off (GB/s min/median/max; cost from median times; CPU cost: the extra CPU seconds over "
        "the unchecked wall time)",
        ["job", "check on", "check off", "cost of the check", "CPU cost", "records checked (on / off)",
         "PyTorch 2.6 dcp.load", "target"],
        [["cold", benchlib.triple(g["sp_l2c_pt"]), benchlib.triple(g["sp_l2c_pt_off"]), cost("sp_l2c_pt", "sp_l2c_pt_off"),
          cpu_cost("sp_l2c_pt", "sp_l2c_pt_off"), f"{records('sp_l2c_pt')} / {records('sp_l2c_pt_off')}",
          benchlib.triple(g["pt26_l2c"]), "<= 3 %"],
         ["warm", benchlib.triple(g["sp_l2w_pt"]), benchlib.triple(g["sp_l2w_pt_off"]), cost("sp_l2w_pt", "sp_l2w_pt_off"),
          cpu_cost("sp_l2w_pt", "sp_l2w_pt_off"), f"{records('sp_l2w_pt')} / {records('sp_l2w_pt_off')}",
          benchlib.triple(g["pt26_l2w"]), "<= 10 %"]])
    if res["crc_floor"]:
        f = res["crc_floor"]
        copy = benchlib.median([x["copy_seconds"] for x in f])
        both = benchlib.median([x["copy_crc_seconds"] for x in f])
        print(f"\nfloor (dcp_bench crc-floor, 1 thread, the checkpoint's files from the page cache): pread in 256 KiB "
              f"pieces {f[0]['bytes'] / copy / 1e9:.2f} GB/s, with CRC-32 of each piece {f[0]['bytes'] / both / 1e9:.2f} "
              f"GB/s: the check costs a warm copy {(both / copy - 1) * 100:+.1f} %; CRC-32 alone "
              f"{benchlib.median([x['crc_gbps'] for x in f]):.1f} GB/s on a cached piece")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "peer":
        peer_main(sys.argv[2:])
        return
    import benchlib

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build_dir")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--layers", type=int, default=24, help="model depth (24 = ~2 GiB state; 2-4 for smoke runs)")
    ap.add_argument("--dir", default=None, help="scratch folder on the disk to measure (default: a temp dir under the build dir)")
    ap.add_argument("--only", choices=["all", "load", "zip-crc"], default="all",
                    help="load: skip the saves and write ceilings; zip-crc: only the loads of PyTorch's "
                         "checkpoint, zip CRC-32 check on and off; checkpoints are kept in --dir")
    args = ap.parse_args()
    only_load = args.only == "load"
    only_crc = args.only == "zip-crc"
    if (only_load or only_crc) and args.dir is None:
        sys.exit(f"dcp_bench.py: --only {args.only} needs --dir (the checkpoints are kept there between runs)")

    tool = os.path.join(os.path.abspath(args.build_dir), "bench", "dcp_bench")
    if not os.path.exists(tool):
        sys.exit(f"dcp_bench.py: {tool} not built (ninja -C {args.build_dir} dcp_bench)")
    scratch = os.path.abspath(args.dir or tempfile.mkdtemp(prefix="sp-dcp-bench-", dir=os.path.abspath(args.build_dir)))
    os.makedirs(scratch, exist_ok=True)
    a, b, fio_dir = os.path.join(scratch, "sp_ckpt"), os.path.join(scratch, "pt_ckpt"), os.path.join(scratch, "fio")
    b26 = os.path.join(scratch, "pt26_ckpt")
    newest = newest_python()
    if newest is None:
        print("note: no project venv (scripts/setup-python.sh): PyTorch 2.6 is both columns", file=sys.stderr)
        newest = ORACLE
    os.makedirs(fio_dir, exist_ok=True)
    can_drop = benchlib.drop_caches()
    raw = open(os.environ["RESULTS"], "a") if os.environ.get("RESULTS") else None
    jobs = ["sp_save", "pt_save", "pt26_save", "sp_l2c", "sp_l2w", "sp_l2s", "sp_l3c", "pt_l2c", "pt_l2w", "pt_l2s",
            "pt_l3c", "pt26_l2c", "pt26_l2w", "sp_l2c_pt", "sp_l2c_pt_off", "sp_l2w_pt_warmup", "sp_l2w_pt",
            "sp_l2w_pt_off"]
    res = {k: [] for k in jobs}
    res["crc_floor"] = []  # dcp_bench crc-floor's figures, one per zip-crc round
    ceil = {k: [] for k in ["odirect4", "buf4", "read1", "read4"]}
    # fio total = the payload (per-rank numbers are what matter; at least 256 MiB)
    payload_est = sum(3 * 4 * (s[0] * (s[1] if len(s) > 1 else 1)) for _, s in gpt2_parameters(args.layers))
    fio_mib = max(256, payload_est // MIB)
    loadavg = []
    if only_load or only_crc:
        if only_load and not os.path.exists(os.path.join(a, ".metadata")):
            rm(a)
            run_shardpoint(tool, "save", a, 4, args.layers)
        if only_load and not os.path.exists(os.path.join(b, ".metadata")):
            rm(b)
            run_peer("save", b, 4, args.layers, scratch, python=newest)
        if not os.path.exists(os.path.join(b26, ".metadata")):
            rm(b26)
            run_peer("save", b26, 4, args.layers, scratch)
    try:
        for rnd in range(args.rounds):
            loadavg.append(os.getloadavg()[0])
            print(f"round {rnd + 1}/{args.rounds} (load average {loadavg[-1]:.1f}) ...", file=sys.stderr)
            if only_crc:
                zip_crc_round(tool, b26, args.layers, rnd, res, raw, scratch)
                continue
            # 1. ceilings
            benchlib.drop_caches()
            if only_load:
                benchlib.fio_gbps(fio_dir, "w4", "write", size=f"{fio_mib // 4}M", numjobs=4)  # files to read
            else:
                ceil["odirect4"].append(benchlib.fio_gbps(fio_dir, "w4", "write", size=f"{fio_mib // 4}M", direct=True,
                                                          numjobs=4))
                benchlib.fio_cleanup(fio_dir, "w4")
                benchlib.drop_caches()
                ceil["buf4"].append(benchlib.fio_gbps(fio_dir, "w4", "write", size=f"{fio_mib // 4}M", numjobs=4))
            benchlib.drop_caches()
            ceil["read4"].append(benchlib.fio_gbps(fio_dir, "w4", "read", size=f"{fio_mib // 4}M", numjobs=4))
            benchlib.fio_cleanup(fio_dir, "w4")
            benchlib.fio_gbps(fio_dir, "r1", "write", size=f"{fio_mib}M")  # lay out the file to read
            benchlib.drop_caches()
            ceil["read1"].append(benchlib.fio_gbps(fio_dir, "r1", "read", size=f"{fio_mib}M"))
            benchlib.fio_cleanup(fio_dir, "r1")

            def job(name, fn, rnd=rnd):
                ranks = fn()
                s = summarize(ranks)
                if not s["verified"]:
                    raise RuntimeError(f"{name}: loaded values differ")
                res[name].append(s)
                if raw:
                    raw.write(json.dumps({"round": rnd, "job": name, "summary": s, "ranks": ranks}) + "\n")
                    raw.flush()

            # 2-3. saves (fresh folders, caches dropped)
            if not only_load:
                for ck in (a, b, b26):
                    rm(ck)
                benchlib.drop_caches()
                job("sp_save", lambda: run_shardpoint(tool, "save", a, 4, args.layers))
                benchlib.drop_caches()
                job("pt_save", lambda: run_peer("save", b, 4, args.layers, scratch, python=newest))
                benchlib.drop_caches()
                job("pt26_save", lambda: run_peer("save", b26, 4, args.layers, scratch))
            # 4. shardpoint loads
            benchlib.drop_caches()
            job("sp_l2c", lambda: run_shardpoint(tool, "load", a, 2, args.layers))
            job("sp_l2w", lambda: run_shardpoint(tool, "load", a, 2, args.layers))
            job("sp_l2s", lambda: run_shardpoint(tool, "load", a, 2, args.layers))
            benchlib.drop_caches()
            job("sp_l3c", lambda: run_shardpoint(tool, "load", a, 3, args.layers))
            # 5. PyTorch loads
            benchlib.drop_caches()
            job("pt_l2c", lambda: run_peer("load", b, 2, args.layers, scratch, python=newest))
            job("pt_l2w", lambda: run_peer("load", b, 2, args.layers, scratch, python=newest))
            job("pt_l2s", lambda: run_peer("load", b, 2, args.layers, scratch, python=newest))
            benchlib.drop_caches()
            job("pt_l3c", lambda: run_peer("load", b, 3, args.layers, scratch, python=newest))
            benchlib.drop_caches()
            job("pt26_l2c", lambda: run_peer("load", b26, 2, args.layers, scratch))
            job("pt26_l2w", lambda: run_peer("load", b26, 2, args.layers, scratch))
            # 6. shardpoint reads PyTorch 2.6's checkpoint, zip CRC-32 check on and off
            zip_crc_round(tool, b26, args.layers, rnd, res, raw, scratch, peer=False)
            if not only_load:
                for ck in (a, b, b26):
                    rm(ck)
    finally:
        for ck in ((fio_dir,) if only_load else (a, b, b26, fio_dir)):
            rm(ck)
        if args.dir is None:
            shutil.rmtree(scratch, ignore_errors=True)
        if raw:
            raw.close()

    def gbps(name):
        return [s["bytes"] / s["seconds"] / 1e9 for s in res[name]]

    def med(name, key):
        return benchlib.median([s[key] for s in res[name]])

    g = {k: gbps(k) for k in jobs}
    m = {k: benchlib.median(v) for k, v in g.items()}
    c = {k: benchlib.median(v) for k, v in ceil.items()}
    if only_crc:
        print(f"\npayload {res['sp_l2c_pt'][0]['bytes'] / 1e9:.3f} GB ({args.layers} layers), {args.rounds} rounds; "
              f"drop_caches {'on' if can_drop else 'NOT available: cold figures are warm'}; load average at round "
              f"start {', '.join(f'{x:.1f}' for x in loadavg)} on {os.cpu_count()} CPUs")
        print_zip_crc_table(res, g, m)
        return
    cold_ceiling = max(x for x in (c["read1"], c["read4"]) if x) if (c["read1"] or c["read4"]) else None
    payload = (res["sp_save"] or res["sp_l2c"])[0]["bytes"]
    print(f"\npayload {payload / 1e9:.3f} GB ({args.layers} layers), {args.rounds} rounds; drop_caches "
          f"{'on' if can_drop else 'NOT available: cold figures are warm'}; load average at round start "
          f"{', '.join(f'{x:.1f}' for x in loadavg)} on {os.cpu_count()} CPUs")
    def version(name):
        return next((x["torch"] for x in res[name] if x.get("torch")), "?")

    def vs26(name):
        return (f"{benchlib.triple(g['pt26_' + name])} ({benchlib.ratio(m['sp_' + name], m['pt26_' + name])})"
                if g["pt26_" + name] else "-")

    newest_v = version("pt_save") if res["pt_save"] else version("pt_l2c")
    benchlib.print_table(
        f"DCP checkpoint: shardpoint vs PyTorch {newest_v} DCP at its best (saves: FileSystemWriter thread_count 4 "
        f"+ plan caching, the second save timed), PyTorch {version('pt26_l2c')} beside it (GB/s min/median/max; "
        "ratios of medians)",
        ["job", "shardpoint", f"PyTorch {newest_v}", "ratio (median)", f"PyTorch {version('pt26_l2c')} (ratio)",
         "ceiling (fio, median)", "fraction of ceiling", "target"],
        [
            ["save, 4 ranks", benchlib.triple(g["sp_save"]), benchlib.triple(g["pt_save"]),
             benchlib.ratio(m["sp_save"], m["pt_save"]), vs26("save"),
             f"O_DIRECT write 4 jobs {benchlib.triple(ceil['odirect4'])}",
             benchlib.fraction(m["sp_save"], c["odirect4"]), ">= 2x, >= 0.80"],
            ["(save vs buffered+fsync)", "", "", "", "", f"buffered+fsync 4 jobs {benchlib.triple(ceil['buf4'])}",
             benchlib.fraction(m["sp_save"], c["buf4"]), ""],
            ["load 4->2, cold", benchlib.triple(g["sp_l2c"]), benchlib.triple(g["pt_l2c"]),
             benchlib.ratio(m["sp_l2c"], m["pt_l2c"]), vs26("l2c"),
             f"cold read best of 1/4 jobs {benchlib.triple(ceil['read1'])} / {benchlib.triple(ceil['read4'])}",
             benchlib.fraction(m["sp_l2c"], cold_ceiling), ">= 0.90"],
            ["load 4->2, warm (first re-read)", benchlib.triple(g["sp_l2w"]), benchlib.triple(g["pt_l2w"]),
             benchlib.ratio(m["sp_l2w"], m["pt_l2w"]), vs26("l2w"), "-", "-", ">= 2.5x"],
            ["load 4->2, warm (second re-read)", benchlib.triple(g["sp_l2s"]), benchlib.triple(g["pt_l2s"]),
             benchlib.ratio(m["sp_l2s"], m["pt_l2s"]), "-", "-", "-", ">= 2.5x"],
            ["load 4->3, cold", benchlib.triple(g["sp_l3c"]), benchlib.triple(g["pt_l3c"]),
             benchlib.ratio(m["sp_l3c"], m["pt_l3c"]), "-", "as 4->2 cold",
             benchlib.fraction(m["sp_l3c"], cold_ceiling), ">= 0.90"],
            ["shardpoint loads PyTorch 2.6's checkpoint 4->2, cold", benchlib.triple(g["sp_l2c_pt"]), "-", "-", "-",
             "-", benchlib.fraction(m["sp_l2c_pt"], cold_ceiling), "-"],
        ])

    print_zip_crc_table(res, g, m)

    def amp(name, key):
        v = [s[key] / s["needed"] for s in res[name] if s.get("needed")]
        return f"{benchlib.median(v):.2f}x" if v else "n/a"

    benchlib.print_table(
        "bytes read per byte needed (median; read() bytes / payload of the requested boxes)",
        ["job", "shardpoint: all bytes read", "shardpoint: tensor data read", "PyTorch: read() bytes (rchar)",
         "device reads shardpoint / PyTorch", "target"],
        [[n, amp(f"sp_{k}", "read"), amp(f"sp_{k}", "data_read"), amp(f"pt_{k}", "read"),
          f"{amp(f'sp_{k}', 'device_read')} / {amp(f'pt_{k}', 'device_read')}", "1.00x"]
         for n, k in [("load 4->2, cold", "l2c"), ("load 4->3, cold", "l3c")]])
    def cpu(name):
        v = [s["cpu"] for s in res[name] if s.get("cpu")]
        return benchlib.triple(v) if v else "-"

    benchlib.print_table(
        "CPU seconds per call (largest rank; user + system, all threads; min/median/max)",
        ["job", "shardpoint", f"PyTorch {newest_v}"],
        [[n, cpu(f"sp_{k}"), cpu(f"pt_{k}")]
         for n, k in [("save, 4 ranks", "save"), ("load 4->2, cold", "l2c"), ("load 4->2, warm", "l2w"),
                      ("load 4->2, warm (second)", "l2s"), ("load 4->3, cold", "l3c")]])
    benchlib.print_table(
        "memory per rank (median over rounds of the largest rank; before = runtime + own data, "
        "transient = peak - before)",
        ["job", "own data", "shardpoint peak RSS", "PyTorch peak RSS", "shardpoint peak - own data",
         "PyTorch peak - own data", "shardpoint before / transient", "PyTorch before / transient", "target"],
        [[n, benchlib.gib(med(f"sp_{k}", "own")), benchlib.gib(med(f"sp_{k}", "peak_rss")),
          benchlib.gib(med(f"pt_{k}", "peak_rss")), benchlib.gib(med(f"sp_{k}", "excess_rss")),
          benchlib.gib(med(f"pt_{k}", "excess_rss")),
          f"{benchlib.gib(med(f'sp_{k}', 'before_rss'))} / {benchlib.gib(med(f'sp_{k}', 'transient_rss'))}",
          f"{benchlib.gib(med(f'pt_{k}', 'before_rss'))} / {benchlib.gib(med(f'pt_{k}', 'transient_rss'))}",
          "peak <= own + 0.125 GiB"]
         for n, k in [("save, 4 ranks", "save"), ("load 4->2, cold", "l2c"), ("load 4->3, cold", "l3c")]
         if res[f"sp_{k}"]])


if __name__ == "__main__":
    main()
