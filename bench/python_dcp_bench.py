#!/usr/bin/env python3
"""Benchmark: dcp.save / dcp.async_save / dcp.load through shardpoint's StorageWriter and
StorageReader vs PyTorch's FileSystemWriter / FileSystemReader, in the same processes, on the
same state, in one run (run with the project venv's python: scripts/setup-python.sh).

  PY=$(scripts/setup-python.sh); SHARDPOINT_PYTHONPATH=build-wheel/site \\
      $PY bench/python_dcp_bench.py [--rounds 2] [--layers 24] [--dir DIR] [--only async] [--next-saves N]

State: GPT-2 shaped (bench/dcp_bench.py's: `--layers` layers, d=768, vocab 8192, ctx 1024)
with Adam's exp_avg and exp_avg_sq, every tensor a DTensor Shard(0) over the ranks (24
layers: 2.126 GB of float32). Each round:
  save, 4 ranks: FileSystemWriter thread_count 1 and 4, shardpoint thread_count 1 and 4
    (caches dropped and the folder emptied before each);
  async save, 4 ranks: the stall (dcp.async_save until it returns) of both writers, their
    first save (staging memory allocated) and the next (reused), next to the time to copy
    the rank's bytes once in memory (the floor of any staging copy), and shardpoint's
    stage() alone (the writer's own part of the stall);
  at each side's best (PyTorch 2.7+): repeated sync saves with DefaultSavePlanner's plan
    caching (FileSystemWriter t4, shardpoint t1; the second save timed), and async saves with
    PyTorch's DefaultStager (async staging in shared memory) against shardpoint's
    async_staging, both with plan caching, timed three ways: until async_save returns, until
    the state may change, until committed;
  load 4 -> 2 and 4 -> 3: FileSystemReader and shardpoint, cold (caches dropped) then warm;
  DCP alone, save and warm load: a writer that writes nothing and a reader that reads
    nothing (each still resolves and commits every item, as every storage layer must), so
    the time is DCP's own planning, collectives, metadata pickling and garbage collection.
    No storage layer can make dcp.save/dcp.load faster than that: PyTorch's time over it is
    the highest ratio any StorageWriter/StorageReader can reach on this machine;
  fio: the payload written with O_DIRECT by 4 jobs, the disk's write ceiling (DCP alone plus
    the payload at that rate: the least a save can take, up to garbage collections).
--only async: the async saves at each side's best, one memory copy and shardpoint's stage() only
(4 ranks, no loads, no fio), for quick iterations on staging; --next-saves N times N saves after
the first at each side's best (default 1; each a sample of the table's min/median/max).
The full garbage collections (generation 2) during each call are counted, with their time.
Time = the slowest rank's call; GB/s = payload / time; RSS = VmHWM during the call minus
VmRSS before it (the memory the call adds beyond the state), the largest rank's. Every load is
checked against the values. Needs root for drop_caches (else all runs are warm; said).
"""
from __future__ import annotations

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
from benchlib import count_full_collections, drop_caches, fio_cleanup, fio_gbps, median, pick_port, print_table, ratio, triple  # noqa: E402
from dcp_bench import _status, gpt2_parameters, peer_local, shard0_dtensor, shard0_rows  # noqa: E402


# --- one rank ---------------------------------------------------------------------------

def rank_main(args):
    import warnings

    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh

    from shardpoint.torch import StorageReader, StorageWriter

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    NullWriter, NullReader = dcp_alone_classes(dcp)
    import inspect

    from torch.distributed.checkpoint import DefaultSavePlanner
    from torch.distributed.checkpoint import state_dict_saver

    caching = "enable_plan_caching" in inspect.signature(DefaultSavePlanner.__init__).parameters
    async_response = hasattr(state_dict_saver, "AsyncSaveResponse")
    if async_response:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
        from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse
    dist.init_process_group("gloo")
    rank, ws = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (ws,))
    fill = args.phase == "save"
    locals_ = []

    def dt(key, shape):
        if fill:
            local = peer_local(torch, key, shape, ws, rank)
        else:
            start, end = shard0_rows(shape[0], ws, rank)
            local = torch.full((end - start,) + tuple(shape[1:]), -1.0)
        locals_.append((key, shape, local))
        return shard0_dtensor(torch, local, mesh, shape)

    params = gpt2_parameters(args.layers)
    sd = {"model": {n: dt("model." + n, s) for n, s in params},
          "optimizer_0": {"state": {n: {"step": torch.tensor(10.0 if fill else -1.0),
                                        "exp_avg": dt(f"optimizer_0.state.{n}.exp_avg", s),
                                        "exp_avg_sq": dt(f"optimizer_0.state.{n}.exp_avg_sq", s)}
                                    for n, s in params},
                          "param_groups": [{"lr": 1e-3, "params": [n for n, _ in params]}]}}
    own = sum(t.numel() * t.element_size() for _, _, t in locals_)
    results = []
    # Full (generation 2) garbage collections during each call, and their time: they walk every
    # tracked object of the process, which DCP's allocations (plans, items) set off.
    full_collections = count_full_collections()

    def timed(name, path, fn, cold, check=True):
        if rank == 0:
            if args.phase != "load":
                shutil.rmtree(path, ignore_errors=True)
            if cold:
                drop_caches()
        dist.barrier()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = _status("VmRSS")
        full_collections.clear()
        t0, cpu0 = time.perf_counter(), time.process_time()
        fn()
        seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        extra = _status("VmHWM") - before
        t = torch.tensor([seconds, float(extra), len(full_collections), sum(full_collections), cpu], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        ok = torch.tensor([1.0])
        if args.phase == "load" and check:
            good = all(torch.equal(local, peer_local(torch, key, shape, ws, rank)) for key, shape, local in locals_)
            ok = torch.tensor([1.0 if good else 0.0])
        if args.phase == "load":
            for _, _, local in locals_:
                local.fill_(-1.0)
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        if rank == 0:
            print(f"  {name}: {t[0].item():.3f} s", flush=True)
        results.append({"job": name, "seconds": t[0].item(), "extra_rss": t[1].item(), "ok": bool(ok.item()),
                        "bytes": own * ws, "full_gcs": int(t[2].item()), "full_gc_seconds": t[3].item(),
                        "cpu": t[4].item()})

    base = args.dir
    only_async = args.only == "async"
    if args.phase == "save":
        if not only_async:
            for tc in (1, 4):
                timed(f"save fs t{tc}", f"{base}/fs{tc}",
                      lambda tc=tc: dcp.save(sd, storage_writer=dcp.FileSystemWriter(f"{base}/fs{tc}", thread_count=tc)), True)
                timed(f"save sp t{tc}", f"{base}/sp{tc}",
                      lambda tc=tc: dcp.save(sd, storage_writer=StorageWriter(f"{base}/sp{tc}", thread_count=tc)), True)
            # Async: the stall is the time until async_save returns; the write finishes after, in a
            # background thread whose collectives run on their own group (on the default group they
            # would interleave with the timing's all_reduce and deadlock). One writer per kind saves
            # twice, as a training loop does (DCP's reuse: checkpoint_id per save): the first save
            # allocates the staging memory (page faults included), the next ones reuse it. Ours
            # caches its staged copy; FileSystemWriter cannot on a CPU-only machine (its cached
            # staging pins memory, which needs a GPU driver), so each of its saves allocates.
            timed("save dcp alone", f"{base}/null", lambda: dcp.save(sd, storage_writer=NullWriter(f"{base}/null")), True)
            # PyTorch at its best: plan caching (a loop's later saves skip the global planning),
            # each writer at its best thread_count; the second save of each is timed (the first
            # fills the cache). One planner class per writer, so the class-level caches stay apart.
            if caching:
                for name, make in (("fs", lambda path: dcp.FileSystemWriter(path, thread_count=4)),
                                   ("sp", lambda path: StorageWriter(path, thread_count=1)),
                                   ("dcp alone", NullWriter)):
                    folder = f"{base}/{name.replace(' ', '_')}c"
                    planner_class = type(f"{name.replace(' ', '_')}CachingPlanner", (DefaultSavePlanner,), {})
                    for attempt in ("first", "next"):
                        timed(f"save {name} cached {attempt}", folder,
                              lambda make=make, planner_class=planner_class, folder=folder: dcp.save(
                                  sd, storage_writer=make(folder), planner=planner_class(enable_plan_caching=True)), True)
            save_group = dist.new_group(backend="gloo")
            sp_async = StorageWriter(f"{base}/spa", thread_count=4)
            for name, writer in (("fs", dcp.FileSystemWriter(f"{base}/fsa", thread_count=4)), ("sp", sp_async)):
                for attempt in ("first", "next"):
                    futures = []
                    timed(f"async stall {name} {attempt}", f"{base}/{name}a",
                          lambda name=name, writer=writer, futures=futures: futures.append(dcp.async_save(
                              sd, storage_writer=writer, checkpoint_id=f"{base}/{name}a", process_group=save_group)), True)
                    futures[0].result()
                    dist.barrier()
        else:
            save_group = dist.new_group(backend="gloo")
            sp_async = StorageWriter(f"{base}/spa", thread_count=4)
        # Async at each side's best, three times per save: until async_save returns, until the
        # state may change (staging complete), until committed. PyTorch: DefaultStager with
        # async staging in shared memory (pinning needs a GPU) + plan caching; shardpoint:
        # async_staging + plan caching. The next save of each is timed.
        if async_response:
            stager = DefaultStager(StagingOptions(False, True, True, False))
            variants = [
                ("fs", lambda: dcp.FileSystemWriter(f"{base}/fsb", thread_count=4), stager),
                ("sp", lambda: sp_best, None),
            ]
            sp_best = StorageWriter(f"{base}/spb", thread_count=1, async_staging=True)
            for name, make, async_stager in variants:
                planner_class = type(f"{name.upper()}AsyncPlanner", (DefaultSavePlanner,), {})
                for attempt in ("first",) + ("next",) * args.next_saves:
                    path = f"{base}/{name}b"
                    if rank == 0:
                        shutil.rmtree(path, ignore_errors=True)
                        drop_caches()
                    dist.barrier()
                    t0, cpu0 = time.perf_counter(), time.process_time()
                    response = dcp.async_save(sd, storage_writer=make(), checkpoint_id=path, process_group=save_group,
                                              async_stager=async_stager,
                                              planner=planner_class(enable_plan_caching=True))
                    t_return = time.perf_counter() - t0
                    if isinstance(response, AsyncSaveResponse):
                        response.staging_completion.result()
                        upload = response.upload_completion
                    else:
                        upload = response
                    t_staged, cpu_staged = time.perf_counter() - t0, time.process_time() - cpu0
                    upload.result()
                    t_committed = time.perf_counter() - t0
                    t = torch.tensor([t_return, t_staged, t_committed, cpu_staged], dtype=torch.float64)
                    dist.all_reduce(t, op=dist.ReduceOp.MAX)
                    if rank == 0:
                        print(f"  async best {name} {attempt}: {t.tolist()}", flush=True)
                    results.append({"job": f"async best {name} {attempt}", "seconds": t[2].item(),
                                    "returned": t[0].item(), "staged": t[1].item(), "cpu_staged": t[3].item(),
                                    "extra_rss": 0.0, "ok": True,
                                    "bytes": own * ws, "full_gcs": 0, "full_gc_seconds": 0.0})
            stager.close()
            sp_best.close()
        # The floor of a staging copy: the rank's bytes copied once into preallocated memory,
        # already touched (zeros_like writes every page), so no page fault is timed.
        dst = [torch.zeros_like(t) for _, _, t in locals_]
        timed("memory copy", f"{base}/unused", lambda: [d.copy_(t) for d, (_, _, t) in zip(dst, locals_)], False)
        # The same copy with the stores that bypass the cache that shardpoint's staging uses for
        # its large tensors (sp_copy_ranges): the floor of that mechanism.
        from shardpoint import _native

        if hasattr(_native, "copy_ranges"):  # an older package has none
            ptrs = ([d.data_ptr() for d in dst], [t.data_ptr() for _, _, t in locals_], [t.nbytes for _, _, t in locals_])
            timed("memory copy streaming", f"{base}/unused", lambda: _native.copy_ranges(*ptrs), False)
        # The writer's own part of the stall: its stage() alone, every rank at once, buffers
        # reused. The stall adds DCP's executor and, with more ranks than cores, the CPU the
        # background writes of ranks that finished staging take from those still staging.
        if only_async:
            sp_async.stage(sd)  # the buffers, allocated as the async stall's saves do in a full run
        timed("stage sp", f"{base}/unused", lambda: sp_async.stage(sd), False)
    else:
        for name, make in (("fs", lambda: dcp.FileSystemReader(f"{base}/fs4")),
                           ("sp", lambda: StorageReader(f"{base}/sp4"))):
            timed(f"load {ws} cold {name}", f"{base}/{name}4", lambda make=make: dcp.load(sd, storage_reader=make()), True)
            timed(f"load {ws} warm {name}", f"{base}/{name}4", lambda make=make: dcp.load(sd, storage_reader=make()), False)
        timed(f"load {ws} dcp alone", f"{base}/fs4",
              lambda: dcp.load(sd, storage_reader=NullReader(f"{base}/fs4")), False, check=False)
    if rank == 0:
        with open(args.results, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


def dcp_alone_classes(dcp):
    """A FileSystemWriter that writes no tensor bytes and a FileSystemReader that reads none:
    DCP's own part of a save or load. Both still resolve (and commit) every tensor item, as any
    storage layer must (resolve_data may copy; resolve_tensor looks the destination up), and
    move the small pickled objects (param groups, steps saved as bytes) and .metadata for real,
    so what loads is a state the caller can use (its tensors hold whatever they held)."""
    import dataclasses

    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.planner import LoadItemType, WriteItemType
    from torch.distributed.checkpoint.storage import WriteResult
    from torch.futures import Future

    class NullWriter(dcp.FileSystemWriter):
        def write_data(self, plan, planner):
            objects = [item for item in plan.items if item.type == WriteItemType.BYTE_IO]
            results = super().write_data(dataclasses.replace(plan, items=objects), planner).wait()
            for item in plan.items:
                if item.type != WriteItemType.BYTE_IO:
                    planner.resolve_data(item)
                    results.append(WriteResult(index=item.index, size_in_bytes=0,
                                               storage_data=_StorageInfo("null", 0, 0)))
            future = Future()
            future.set_result(results)
            return future

    class NullReader(dcp.FileSystemReader):
        def read_data(self, plan, planner):
            objects = [item for item in plan.items if item.type == LoadItemType.BYTE_IO]
            super().read_data(dataclasses.replace(plan, items=objects), planner).wait()
            for item in plan.items:
                if item.type != LoadItemType.BYTE_IO:
                    planner.commit_tensor(item, planner.resolve_tensor(item))
            future = Future()
            future.set_result(None)
            return future

    return NullWriter, NullReader


# --- the driver -------------------------------------------------------------------------

def run_phase(phase, ws, base, layers, only="all", next_saves=1):
    results = tempfile.mktemp(suffix=".json")
    port = pick_port()
    procs = []
    for r in range(ws):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(ws), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   GLOO_SOCKET_IFNAME="lo", USE_LIBUV="0", OMP_NUM_THREADS="1")
        env["PYTHONPATH"] = os.environ.get("SHARDPOINT_PYTHONPATH", "") + ":" + HERE
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "rank", phase, base,
                                       "--layers", str(layers), "--results", results, "--only", only,
                                       "--next-saves", str(next_saves)], env=env))
    codes = [p.wait(timeout=3600) for p in procs]
    if any(codes):
        raise RuntimeError(f"{phase} on {ws} ranks failed: exit codes {codes}")
    with open(results) as f:
        out = json.load(f)
    os.remove(results)
    return out


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "rank":
        ap = argparse.ArgumentParser()
        ap.add_argument("phase")
        ap.add_argument("dir")
        ap.add_argument("--layers", type=int, default=24)
        ap.add_argument("--results", required=True)
        ap.add_argument("--only", default="all")
        ap.add_argument("--next-saves", type=int, default=1)
        rank_main(ap.parse_args(sys.argv[2:]))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--dir", default=None, help="scratch folder (default: a temporary one under /var/tmp)")
    ap.add_argument("--only", choices=["all", "async"], default="all",
                    help="async: the async saves at each side's best, one memory copy and stage() only")
    ap.add_argument("--next-saves", type=int, default=1,
                    help="saves timed after the first at each side's best async setting, per round")
    a = ap.parse_args()
    if "SHARDPOINT_PYTHONPATH" not in os.environ:
        sys.exit("set SHARDPOINT_PYTHONPATH to the installed package (scripts/test-python.sh makes build-wheel/site)")
    base = a.dir or tempfile.mkdtemp(prefix="python-dcp-bench-", dir="/var/tmp")
    if not drop_caches():
        print("note: not root: caches cannot be dropped, every 'cold' run is warm")
    jobs = {}
    loadavg = []
    fio_write = []  # O_DIRECT writes of the payload, 4 jobs: the disk's write ceiling
    try:
        for rnd in range(a.rounds):
            loadavg.append(os.getloadavg()[0])
            phases = (("save", 4),) if a.only == "async" else (("save", 4), ("load", 2), ("load", 3))
            for phase, ws in phases:
                for r in run_phase(phase, ws, base, a.layers, a.only, a.next_saves):
                    if not r["ok"]:
                        raise RuntimeError(f"{r['job']}: loaded values differ")
                    jobs.setdefault(r["job"], []).append(r)
            if a.only == "async":
                print(f"round {rnd + 1}/{a.rounds} done", flush=True)
                continue
            per_job_mib = jobs["save sp t4"][0]["bytes"] // 4 // 2**20
            rate = fio_gbps(base, "w4", "write", size=f"{per_job_mib}M", direct=True, numjobs=4)
            fio_cleanup(base, "w4")
            if rate:
                fio_write.append(rate)
            print(f"round {rnd + 1}/{a.rounds} done", flush=True)
    finally:
        if a.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    import torch

    print(f"PyTorch {torch.__version__}, {a.layers} layers, {a.rounds} rounds; load average at round start "
          f"{', '.join(f'{x:.1f}' for x in loadavg)} on {os.cpu_count()} CPUs")
    if a.only != "async":
        print_sync_tables(jobs, a, fio_write)
    print_async_tables(jobs)


def print_sync_tables(jobs, a, fio_write):
    """The saves, loads, DCP alone, full collections and repeated sync saves (a full run)."""

    def gbps(job):
        return [r["bytes"] / r["seconds"] / 1e9 for r in jobs[job]]

    def mib(job):
        return median([r["extra_rss"] / 2**20 for r in jobs[job]])

    payload = jobs["save sp t4"][0]["bytes"]
    rows = []
    best_save = max(median(gbps("save fs t1")), median(gbps("save fs t4")))
    for tc in (1, 4):
        rows.append([f"save 4 ranks, thread_count {tc}", triple(gbps(f"save sp t{tc}")), triple(gbps(f"save fs t{tc}")),
                     ratio(median(gbps(f"save sp t{tc}")), best_save), f"{mib(f'save sp t{tc}'):.0f} / {mib(f'save fs t{tc}'):.0f}"])
    for ws in (2, 3):
        for temp in ("cold", "warm"):
            sp, fs = gbps(f"load {ws} {temp} sp"), gbps(f"load {ws} {temp} fs")
            rows.append([f"load 4->{ws} {temp}", triple(sp), triple(fs), ratio(median(sp), median(fs)),
                         f"{mib(f'load {ws} {temp} sp'):.0f} / {mib(f'load {ws} {temp} fs'):.0f}"])
    # DCP alone: the fastest any storage layer could make the call; PyTorch's time over it is the
    # highest ratio reachable (from medians, as the ratios above).
    def secs(job):
        return median([r["seconds"] for r in jobs[job]])

    alone = [["save 4 ranks", secs("save dcp alone"), min(secs("save fs t1"), secs("save fs t4")),
              secs("save sp t4")]]
    for ws in (2, 3):
        alone.append([f"load 4->{ws} warm", secs(f"load {ws} dcp alone"), secs(f"load {ws} warm fs"),
                      secs(f"load {ws} warm sp")])
    alone_rows = [[job, f"{t_alone:.3f}", f"{t_fs:.3f}", f"{t_sp:.3f}", f"{t_fs / t_alone:.2f}x", f"{t_fs / t_sp:.2f}x",
                   f"{(t_sp - t_alone) / (t_fs - t_alone):.2f}" if t_fs > t_alone else "-"]
                  for job, t_alone, t_fs, t_sp in alone]
    if fio_write:
        # A save is DCP's planning, then the writes, then the commit, none overlapping: DCP alone
        # plus the payload at the disk's O_DIRECT rate. A floor only where both calls ran as
        # many full garbage collections (see the next table): one is 0.2-0.8 s here.
        t_alone, t_fs, t_sp = alone[0][1:]
        floor = t_alone + payload / 1e9 / median(fio_write)
        alone_rows.append([f"save 4 ranks, DCP alone + payload at fio O_DIRECT {median(fio_write):.2f} GB/s",
                           f"{floor:.3f}", f"{t_fs:.3f}", f"{t_sp:.3f}", f"{t_fs / floor:.2f}x", f"{t_fs / t_sp:.2f}x", "-"])
    print_table(f"dcp through shardpoint vs FileSystemWriter/Reader, {payload / 1e9:.3f} GB, {a.rounds} rounds "
                "(GB/s min/median/max; ratio of medians, saves to the best FileSystemWriter setting)",
                ["job", "shardpoint GB/s", "PyTorch GB/s", "ratio", "RSS added MiB (sp / torch)"], rows)
    print_table("DCP's own part: dcp.save/dcp.load with a writer that writes nothing and a reader that reads nothing "
                "(s, median; PyTorch = the best FileSystemWriter setting, FileSystemReader warm; ceiling = PyTorch / "
                "DCP alone, the highest ratio any storage layer can reach; I/O share = shardpoint's time beyond DCP's "
                "over PyTorch's)",
                ["job", "DCP alone s", "PyTorch s", "shardpoint s", "ceiling ratio", "shardpoint ratio", "I/O share"],
                alone_rows)
    gc_rows = []
    for job in ("save fs t4", "save sp t4", "save dcp alone", "load 2 warm fs", "load 2 warm sp", "load 2 dcp alone",
                "load 3 warm fs", "load 3 warm sp", "load 3 dcp alone"):
        gc_rows.append([job, triple([r["full_gcs"] for r in jobs[job]]), triple([r["full_gc_seconds"] for r in jobs[job]]),
                        f"{median([r['full_gc_seconds'] / r['seconds'] for r in jobs[job]]) * 100:.0f} %"])
    print_table("full garbage collections during the call (largest rank; min/median/max over rounds)",
                ["job", "collections", "seconds", "share of the call"], gc_rows)
    if "save sp cached next" in jobs:
        fs_s, sp_s = secs("save fs cached next"), secs("save sp cached next")
        cached_rows = [["next save, plan caching", f"{sp_s:.3f}", f"{fs_s:.3f}", f"{fs_s / sp_s:.2f}x"]]
        if fio_write:
            floor = secs("save dcp alone cached next") + payload / 1e9 / median(fio_write)
            cached_rows.append(["DCP alone (plan caching) + payload at fio O_DIRECT", f"{floor:.3f}", "-",
                                f"{sp_s / floor:.2f}x the floor (target <= 1.1)"])
        print_table("repeated sync saves at each side's best (s, median; shardpoint thread_count 1, FileSystemWriter "
                    "thread_count 4, both with DefaultSavePlanner(enable_plan_caching=True), the second save timed)",
                    ["job", "shardpoint s", "PyTorch s", "ratio / floor"], cached_rows)


def print_async_tables(jobs):
    """The async stalls against one memory copy, and the async saves at each side's best."""
    copy = median([r["seconds"] for r in jobs["memory copy"]])
    streaming = median([r["seconds"] for r in jobs.get("memory copy streaming", [])])
    stall_rows = []
    for name, label in (("sp", "shardpoint"), ("fs", "FileSystemWriter")):
        for attempt in ("first", "next"):
            if f"async stall {name} {attempt}" not in jobs:  # --only async
                continue
            s = median([r["seconds"] for r in jobs[f"async stall {name} {attempt}"]])
            stall_rows.append([label, attempt, f"{s:.3f}", f"{copy:.3f}", f"{s / copy:.2f}x"])
    s = median([r["seconds"] for r in jobs["stage sp"]])
    stall_rows.append(["shardpoint, its stage() alone", "next", f"{s:.3f}", f"{copy:.3f}", f"{s / copy:.2f}x"])
    print_table("async save stall, 4 ranks (s, median; first = the save that allocates the staging memory, next = "
                "the saves after it; copy = the rank's bytes copied once into memory already touched)",
                ["writer", "save", "stall s", "copy s", "stall / copy"], stall_rows)
    if "async best sp next" in jobs:
        best_rows = []
        targets = {"returned": ("<= 1.0", None),
                   "staged": ("", "<= 1.2"), "seconds": ("<= 0.6", None)}
        for what, key in (("until async_save returns", "returned"), ("until the state may change", "staged"),
                          ("until committed", "seconds")):
            sp_all = [r[key] for r in jobs["async best sp next"]]
            fs_all = [r[key] for r in jobs["async best fs next"]]
            sp_t, fs_t = median(sp_all), median(fs_all)
            target, copy_target = targets[key]
            best_rows.append([what, triple(sp_all), triple(fs_all), f"{sp_t / fs_t:.2f}" if fs_t > 0 else "-",
                              target, f"{sp_t / copy:.2f} (target {copy_target})" if copy_target else "-"])
        # The same in CPU time (process, all threads; largest rank): what the machine's other
        # jobs do not inflate, against the copy's own CPU time.
        copy_cpu = median([r.get("cpu") for r in jobs["memory copy"]])
        sp_all = [r.get("cpu_staged") for r in jobs["async best sp next"]]
        fs_all = [r.get("cpu_staged") for r in jobs["async best fs next"]]
        if copy_cpu and median(sp_all) is not None:
            best_rows.append(["CPU s until the state may change", triple(sp_all), triple(fs_all),
                              f"{median(sp_all) / median(fs_all):.2f}", "",
                              f"{median(sp_all) / copy_cpu:.2f} (copy's CPU {copy_cpu:.3f} s)"])
        if streaming:
            sp_t = median([r["staged"] for r in jobs["async best sp next"]])
            best_rows.append(["(until the state may change, against one copy with streaming stores)", "", "", "", "",
                              f"{sp_t / streaming:.2f} (that copy {streaming:.3f} s)"])
            cpu_streaming = median([r.get("cpu") for r in jobs["memory copy streaming"]])
            if cpu_streaming and median(sp_all) is not None:
                best_rows.append(["(CPU until the state may change, against that copy's CPU)", "", "", "", "",
                                  f"{median(sp_all) / cpu_streaming:.2f} (its CPU {cpu_streaming:.3f} s)"])
        print_table("async save at each side's best, next save (s, min/median/max, slowest rank; PyTorch: "
                    "FileSystemWriter t4 + DefaultStager(StagingOptions(False, True, True, False)) + plan caching; "
                    "shardpoint: StorageWriter t1, async_staging=True + plan caching; ratios of medians; copy = the "
                    f"rank's bytes copied once into memory already touched, same run: {copy:.3f} s)",
                    ["time", "shardpoint s", "PyTorch s", "shardpoint / PyTorch", "target", "/ one copy"], best_rows)


if __name__ == "__main__":
    main()
