#!/usr/bin/python3
"""Benchmark: the training stall per checkpoint at 4 ranks, sharded vs full, sync vs async,
shardpoint vs PyTorch 2.6 DCP, vs the time to write the same bytes at fio's O_DIRECT ceiling.

  /usr/bin/python3 bench/train_stall_bench.py BUILD_DIR [--rounds 2] [--checkpoints 3]
                   [--sizes demo,1b-shape] [--big-layers 4] [--dir DIR]

The state is what shardpoint-train saves for the demo Transformer (src/train/model.cc
param_specs: the same names and shapes, mirrored below in param_specs()) with Adam
moments: {"model": {name: w}, "optimizer_0": {"state": {name: {step, exp_avg,
exp_avg_sq}}, "param_groups": [...]}}, float32, every tensor Shard(0) over 4 ranks, `step`
replicated. Sizes: "demo" (vocab 33278, ninp 200, nhid 200, 2+2 layers: 13.6 M parameters,
0.163 GB with the moments) and "1b-shape" scaled to fit this machine: the 1b-shape widths
(ninp 1024, 64 heads, nhid 4096, vocab 33278) with --big-layers encoder and decoder layers
instead of 32 + 32 (4: 186 M parameters, 2.23 GB; the full 1b-shape is 1.01 B parameters,
12.1 GB, which with a staging copy on 4 ranks would need more than this machine's 23 GiB).
Values are a cheap pattern: nothing is trained.

Jobs (4 ranks each, --checkpoints checkpoints per job into fresh folders, caches dropped
before each job; stall of a checkpoint = the slowest rank's, from a barrier):
  sp sharded sync    engine::save() (bench/train_stall_bench.cc sync)
  sp sharded async   engine::async_save() over a StagingPool kept for the run; stall = until
                     it returns; "committed" = until PendingSave::wait() returns (called
                     right away, after one "training step" changed the tensors)
  sp full            every tensor gathered on rank 0, one torch.save file written there
                     (engine/torch_save.h, O_DIRECT, fsync): the trainer's "full" checkpoint
  PyTorch dcp.save   PyTorch 2.6 (scripts/oracle-python), gloo, the same DTensor state
  PyTorch async_save dcp.async_save: stall = until it returns; committed = future.result().
                     For CPU DTensors its staging copies nothing (state_dict_saver.py ->
                     BlockingAsyncStager.stage -> _offload_state_dict_to_cpu: .to("cpu") of a
                     CPU tensor is the tensor itself), so changes the trainer makes after it
                     returns can reach the checkpoint: a short stall without a snapshot.
  PyTorch copy+async the same, after copying the local tensors into buffers kept between
                     checkpoints (what a snapshot needs; shardpoint's StagingPool equivalent)
Ceiling: fio sequential write, 1 MiB O_DIRECT, 4 jobs, total size = the payload, measured
in the same round; "at ceiling" = payload / that bandwidth. The first checkpoint of a job
(fresh staging memory, first-touch page faults) is reported apart from the later ones.
Needs root (drop_caches, oracle-python). RESULTS=FILE appends the raw per-job JSON lines.
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
from benchlib import pick_port, rm  # noqa: E402
from dcp_bench import _status, collect, shard0_dtensor, shard0_rows  # noqa: E402

WORLD = 4
VOCAB = 33278  # WikiText-2's vocabulary, the trainer's default


def model_config(size, big_layers):
    """(ninp, nhid, nlayers) of src/train/model.cc model_config(); 1b-shape with fewer layers."""
    if size == "demo":
        return 200, 200, 2
    if size == "1b-shape":
        return 1024, 4096, big_layers
    raise SystemExit(f"unknown size {size} (demo, 1b-shape)")


def param_specs(ninp, nhid, nlayers):
    """src/train/model.cc param_specs(): names and shapes in state-dict order."""
    e, f = ninp, nhid
    out = [("model.embedding.weight", (VOCAB, e))]

    def attention(p):
        out.extend([(p + "in_proj_weight", (3 * e, e)), (p + "in_proj_bias", (3 * e,)),
                    (p + "out_proj.weight", (e, e)), (p + "out_proj.bias", (e,))])

    def linear(p, i, o):
        out.extend([(p + "weight", (o, i)), (p + "bias", (o,))])

    def norm(p):
        out.extend([(p + "weight", (e,)), (p + "bias", (e,))])

    for i in range(nlayers):
        p = f"model.transformer.encoder.layers.{i}."
        attention(p + "self_attn.")
        linear(p + "linear1.", e, f)
        linear(p + "linear2.", f, e)
        norm(p + "norm1.")
        norm(p + "norm2.")
    norm("model.transformer.encoder.norm.")
    for i in range(nlayers):
        p = f"model.transformer.decoder.layers.{i}."
        attention(p + "self_attn.")
        attention(p + "multihead_attn.")
        linear(p + "linear1.", e, f)
        linear(p + "linear2.", f, e)
        norm(p + "norm1.")
        norm(p + "norm2.")
        norm(p + "norm3.")
    norm("model.transformer.decoder.norm.")
    linear("model.decoder.", e, VOCAB)
    return out


def read_spec(path):
    specs = []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if parts:
                specs.append((parts[0], tuple(int(x) for x in parts[1:])))
    return specs


# --- the PyTorch 2.6 peer (runs under scripts/oracle-python) ------------------------------

def peer_state(torch, specs, ws, rank):
    """(state dict over DTensors, their local tensors, bytes, rebuild(locals) -> state dict)."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (ws,))
    shapes = [s for _, s in specs for _ in range(3)]  # param, exp_avg, exp_avg_sq

    def local_of(shape):
        start, end = shard0_rows(shape[0], ws, rank)
        n = end - start
        for s in shape[1:]:
            n *= s
        local = (torch.arange(n, dtype=torch.int64) % 1000).to(torch.float32).div_(8)
        return local.reshape((end - start,) + tuple(shape[1:]))

    def dt(local, shape):
        return shard0_dtensor(torch, local, mesh, shape)

    def rebuild(locals_):
        it = iter(zip(locals_, shapes))
        model, state = {}, {}
        for n, _ in specs:
            model[n] = dt(*next(it))
            state[n] = {"step": torch.tensor(10.0), "exp_avg": dt(*next(it)), "exp_avg_sq": dt(*next(it))}
        group = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0, "amsgrad": False,
                 "params": [n for n, _ in specs]}
        return {"model": model, "optimizer_0": {"state": state, "param_groups": [group]}}

    locals_ = [local_of(s) for s in shapes]
    own = sum(t.numel() * t.element_size() for t in locals_)
    return rebuild(locals_), locals_, own, rebuild


def peer_job(rank, ws, mode, folder, spec, checkpoints, results):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    import warnings

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    sd, locals_, own, rebuild = peer_state(torch, read_spec(spec), ws, rank)
    copies, copy_sd = None, None
    rss_before = _status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    stall, committed = [], []
    for k in range(checkpoints):
        if k > 0:
            for t in locals_:
                t.view(-1)[0] += 1
        ckpt = os.path.join(folder, f"ckpt{k}")
        dist.barrier()
        t0 = time.perf_counter()
        if mode == "save":
            dcp.save(sd, checkpoint_id=ckpt)
            stall.append(time.perf_counter() - t0)
            committed.append(stall[-1])
        else:
            target = sd
            if mode == "async_copy":
                # A snapshot the trainer may change right away: dcp.async_save does not copy CPU
                # DTensors (its staging returns them as they are), so copy into buffers kept
                # between checkpoints, as shardpoint's StagingPool does.
                if copies is None:
                    copies = [torch.empty_like(t) for t in locals_]
                    copy_sd = rebuild(copies)
                for c, t in zip(copies, locals_):
                    c.copy_(t)
                target = copy_sd
            fut = dcp.async_save(target, checkpoint_id=ckpt)
            stall.append(time.perf_counter() - t0)
            for t in locals_:
                t.view(-1)[0] += 1
            fut.result()
            committed.append(time.perf_counter() - t0)
    out = {"rank": rank, "world_size": ws, "own_bytes": own, "stall": stall, "committed": committed,
           "peak_rss": _status("VmHWM"), "rss_before": rss_before}
    with open(os.path.join(results, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)


def peer_main(argv):
    ap = argparse.ArgumentParser(prog="train_stall_bench.py peer")
    ap.add_argument("mode", choices=["save", "async_save", "async_copy"])
    ap.add_argument("folder")
    ap.add_argument("--spec", required=True)
    ap.add_argument("--checkpoints", type=int, default=3)
    ap.add_argument("--ws", type=int, default=WORLD)
    ap.add_argument("--results", required=True)
    a = ap.parse_args(argv)
    sys.path.insert(0, os.path.join(REPO, "tests", "oracle"))
    import dcp_oracle

    dcp_oracle.run_ranks(peer_job, a.ws, args=(a.mode, a.folder, a.spec, a.checkpoints, a.results), timeout_s=1200)


# --- the driver (host python3) --------------------------------------------------------------

def run_shardpoint(tool, mode, folder, spec, checkpoints, attempts=3):
    last = ""
    for _ in range(attempts):
        port = pick_port()
        procs = []
        for r in range(WORLD):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
            procs.append(subprocess.Popen([tool, mode, folder, "--spec", spec, "--checkpoints", str(checkpoints)],
                                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outs = [p.communicate(timeout=1800) for p in procs]
        if all(p.returncode == 0 for p in procs):
            return [json.loads([line for line in o.splitlines() if line.startswith("{")][-1]) for o, _ in outs]
        last = "\n".join(f"rank {r} exit {p.returncode}: {e[-1500:]}" for r, (p, (_, e)) in enumerate(zip(procs, outs)))
    raise RuntimeError(f"train_stall_bench {mode} {folder} failed:\n{last}")


def run_peer(mode, folder, spec, checkpoints, scratch):
    results = tempfile.mkdtemp(prefix="peer-", dir=scratch)
    try:
        cmd = [os.path.join(REPO, "scripts", "oracle-python"), os.path.abspath(__file__), "peer", mode, folder,
               "--spec", spec, "--checkpoints", str(checkpoints), "--results", results]
        last = ""
        for _ in range(2):
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=2400)
            if p.returncode == 0:
                return collect(results, WORLD)
            last = p.stderr[-3000:]
        raise RuntimeError(f"peer {mode} {folder} failed:\n{last}")
    finally:
        shutil.rmtree(results, ignore_errors=True)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "peer":
        peer_main(sys.argv[2:])
        return
    import benchlib

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build_dir")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--checkpoints", type=int, default=3, help="checkpoints per job (the first is reported apart)")
    ap.add_argument("--sizes", default="demo,1b-shape")
    ap.add_argument("--big-layers", type=int, default=4, help="encoder (and decoder) layers of the scaled 1b-shape")
    ap.add_argument("--dir", default=None, help="scratch folder on the disk to measure (default: under the build dir)")
    args = ap.parse_args()

    tool = os.path.join(os.path.abspath(args.build_dir), "bench", "train_stall_bench")
    if not os.path.exists(tool):
        sys.exit(f"train_stall_bench.py: {tool} not built (ninja -C {args.build_dir} train_stall_bench)")
    scratch = os.path.abspath(args.dir or tempfile.mkdtemp(prefix="sp-stall-bench-", dir=os.path.abspath(args.build_dir)))
    os.makedirs(scratch, exist_ok=True)
    fio_dir = os.path.join(scratch, "fio")
    os.makedirs(fio_dir, exist_ok=True)
    can_drop = benchlib.drop_caches()
    raw = open(os.environ["RESULTS"], "a") if os.environ.get("RESULTS") else None
    sizes = [s for s in args.sizes.split(",") if s]
    jobs = [("sp_sync", "shardpoint sharded save"), ("sp_async", "shardpoint sharded async_save"),
            ("sp_full", "shardpoint full (rank 0, one torch.save file)"),
            ("pt_save", "PyTorch 2.6 dcp.save"), ("pt_async", "PyTorch 2.6 dcp.async_save (no snapshot of CPU tensors)"),
            ("pt_async_copy", "PyTorch 2.6 copy + dcp.async_save (snapshot)")]
    res = {(size, j): [] for size in sizes for j, _ in jobs}
    ceiling = {size: [] for size in sizes}
    specs, payload = {}, {}
    for size in sizes:
        ninp, nhid, nlayers = model_config(size, args.big_layers)
        params = param_specs(ninp, nhid, nlayers)
        path = os.path.join(scratch, f"spec-{size}.txt")
        with open(path, "w") as f:
            for name, shape in params:
                f.write(name + " " + " ".join(str(d) for d in shape) + "\n")
        specs[size] = path
        numel = sum(math.prod(s) for _, s in params)
        payload[size] = (3 * numel + len(params)) * 4  # params, exp_avg, exp_avg_sq, steps
    loadavg = []
    try:
        for rnd in range(args.rounds):
            for size in sizes:
                loadavg.append(os.getloadavg()[0])
                print(f"round {rnd + 1}/{args.rounds}, {size} (load average {loadavg[-1]:.1f}) ...", file=sys.stderr)
                fio_mib = max(64, payload[size] >> 20)
                benchlib.drop_caches()
                ceiling[size].append(benchlib.fio_gbps(fio_dir, "w4", "write", size=f"{max(16, fio_mib // 4)}M",
                                                       direct=True, numjobs=4))
                benchlib.fio_cleanup(fio_dir, "w4")
                for name, _ in jobs:
                    folder = os.path.join(scratch, name)
                    rm(folder)
                    os.makedirs(folder)
                    benchlib.drop_caches()
                    if name == "pt_save":
                        ranks = run_peer("save", folder, specs[size], args.checkpoints, scratch)
                    elif name == "pt_async":
                        ranks = run_peer("async_save", folder, specs[size], args.checkpoints, scratch)
                    elif name == "pt_async_copy":
                        ranks = run_peer("async_copy", folder, specs[size], args.checkpoints, scratch)
                    else:
                        mode = {"sp_sync": "sync", "sp_async": "async", "sp_full": "full"}[name]
                        ranks = run_shardpoint(tool, mode, folder, specs[size], args.checkpoints)
                    rm(folder)
                    s = {"stall": [max(r["stall"][k] for r in ranks) for k in range(args.checkpoints)],
                         "committed": [max(r["committed"][k] for r in ranks) for k in range(args.checkpoints)],
                         "peak_rss": max(r["peak_rss"] for r in ranks),
                         "transient_rss": max(r["peak_rss"] - r["rss_before"] for r in ranks),
                         "staging": max(r.get("staging_bytes", 0) for r in ranks),
                         "own": max(r["own_bytes"] for r in ranks)}
                    for key in ("plan", "copy"):
                        if key in ranks[0]:
                            s[key] = [max(r[key][k] for r in ranks) for k in range(args.checkpoints)]
                    res[(size, name)].append(s)
                    if raw:
                        raw.write(json.dumps({"round": rnd, "size": size, "job": name, "summary": s, "ranks": ranks}) + "\n")
                        raw.flush()
    finally:
        rm(fio_dir)
        if args.dir is None:
            shutil.rmtree(scratch, ignore_errors=True)
        if raw:
            raw.close()

    print(f"\n{args.rounds} rounds x {args.checkpoints} checkpoints per job, {WORLD} ranks, {os.cpu_count()} CPUs; "
          f"drop_caches {'on' if can_drop else 'NOT available'}; load average at the start of each size's round "
          f"{', '.join(f'{x:.1f}' for x in loadavg)}; 1b-shape scaled to {args.big_layers}+{args.big_layers} layers")
    for size in sizes:
        gbps = benchlib.median(ceiling[size])
        at_ceiling = payload[size] / (gbps * 1e9) if gbps else None

        def later(name, key, size=size):
            return [v for s in res[(size, name)] for v in s[key][1:]] or [v for s in res[(size, name)] for v in s[key]]

        def first(name, key, size=size):
            return [s[key][0] for s in res[(size, name)]]

        pt_stall = benchlib.median(later("pt_save", "stall"))
        rows = []
        for name, label in jobs:
            st = later(name, "stall")
            m = benchlib.median(st)
            rss = max(s["transient_rss"] for s in res[(size, name)])
            staging = max(s["staging"] for s in res[(size, name)])
            rows.append([label, benchlib.triple(st), benchlib.triple(first(name, "stall")),
                         benchlib.triple(later(name, "committed")),
                         benchlib.ratio(pt_stall, m), benchlib.fraction(m, at_ceiling),
                         f"{rss / 2**20:.0f} MiB" + (f" (staging {staging / 2**20:.0f} MiB)" if staging else "")])
        benchlib.print_table(
            f"Training stall per checkpoint, {size}: {payload[size] / 1e9:.3f} GB state, {WORLD} ranks "
            f"(seconds, min/median/max; O_DIRECT ceiling {benchlib.triple(ceiling[size])} GB/s -> "
            f"{at_ceiling:.2f} s for these bytes)" if at_ceiling else f"Training stall per checkpoint, {size}",
            ["job", "stall (later checkpoints)", "stall (1st checkpoint)", "until committed",
             "PyTorch dcp.save stall / this", "stall / time at O_DIRECT ceiling", "peak RSS growth per rank"],
            rows)
        if res[(size, "sp_async")] and "plan" in res[(size, "sp_async")][0]:
            print(f"\nshardpoint async_save stall, later checkpoints (median, slowest rank): planning "
                  f"{benchlib.median(later('sp_async', 'plan')):.3f} s + staging copy "
                  f"{benchlib.median(later('sp_async', 'copy')):.3f} s; first checkpoint copy "
                  f"{benchlib.median(first('sp_async', 'copy')):.3f} s (fresh staging memory)")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
