#!/usr/bin/env python3
"""Benchmark: zstd-compressed DCP checkpoints, shardpoint's StorageWriter(compression="zstd")
/ StorageReader vs PyTorch's FileSystemWriter(_extensions=[ZStandard()]) / FileSystemReader,
in one process, on the same state, in one run (the project venv's python, with zstandard).

  PY=$(scripts/setup-python.sh); SHARDPOINT_PYTHONPATH=build-wheel/site \\
      $PY bench/zstd_bench.py [--mib 256] [--rounds 3] [--threads 1,4] [--dir DIR]

State: `--mib` MiB of tensors shaped like a model's: float32 matrices of N(0, 0.02) (what
trained weights look like to a compressor: the exponent bytes compress, the mantissas do
not), a bf16 copy of a quarter of them, and small vectors (biases, norms). dcp.save and
dcp.load with no_dist=True; for each writer thread_count in `--threads`, each round saves
with both writers (folder emptied first) then loads each checkpoint with both readers
(warm: the files were just written). Both compress at zstd level 3 (PyTorch's extension
uses zstandard's default, level 3; shardpoint's default is the same), so sizes compare at
the same setting. Every load is checked against the state. GB/s = uncompressed tensor
bytes / time of the dcp call; ratio = uncompressed / bytes on disk; CPU s/GB = the process's
CPU time (all threads) per uncompressed GB, which a shared machine's other jobs do not
inflate. Prints min/median/max over rounds and the ratio to PyTorch from medians.

Ceiling, same data and run: libzstd (the zstandard module) compressing and decompressing
every tensor's bytes on one thread at level 3, in GB per CPU second of that thread, and that
rate times the CPUs (what item-parallel compression could reach with every core idle).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from benchlib import median, print_table, ratio, triple  # noqa: E402

if os.environ.get("SHARDPOINT_PYTHONPATH"):
    sys.path.insert(0, os.environ["SHARDPOINT_PYTHONPATH"])


def make_state(mib: int):
    import torch

    g = torch.Generator().manual_seed(0)
    state, total = {}, 0
    d = 1024
    i = 0
    while total < mib << 20:
        w = torch.empty(4 * d, d).normal_(0, 0.02, generator=g)
        state[f"layers.{i}.mlp.weight"] = w
        state[f"layers.{i}.mlp.bias"] = torch.zeros(4 * d)
        state[f"layers.{i}.norm.weight"] = torch.ones(d)
        total += w.numel() * 4 + 4 * d * 4 + d * 4
        if i % 4 == 0:
            state[f"layers.{i}.mlp.weight_bf16"] = w.to(torch.bfloat16)
            total += w.numel() * 2
        i += 1
    state["step"] = 1000
    return state, total


def folder_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path) if f.endswith(".distcp"))


def one_core_rates(state) -> tuple:
    """libzstd on one thread over every tensor's bytes, level 3: (compress, decompress) GB
    per CPU second of this thread (on a shared machine the wall clock counts the other jobs'
    time slices; the CPU time is what a core of our own would take)."""
    import torch
    import zstandard

    blobs = [v.contiguous().view(torch.uint8).numpy() for v in state.values() if isinstance(v, torch.Tensor)]
    total = sum(b.nbytes for b in blobs)
    c = zstandard.ZstdCompressor(level=3)
    t0 = time.thread_time()
    frames = [c.compress(b) for b in blobs]
    compress_s = time.thread_time() - t0
    d = zstandard.ZstdDecompressor()
    t0 = time.thread_time()
    for f in frames:
        d.decompress(f)
    decompress_s = time.thread_time() - t0
    return total / compress_s / 1e9, total / decompress_s / 1e9


def cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def main() -> None:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._extension import ZStandard

    from shardpoint.torch import StorageReader, StorageWriter

    warnings.filterwarnings("ignore")
    p = argparse.ArgumentParser()
    p.add_argument("--mib", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", default="1,4")
    p.add_argument("--dir", default=None)
    a = p.parse_args()
    root = tempfile.mkdtemp(prefix="zstd-bench-", dir=a.dir)
    state, payload = make_state(a.mib)
    print(f"state: {len(state) - 1} tensors, {payload / 2**20:.0f} MiB; torch {torch.__version__}; "
          f"{os.cpu_count()} CPUs; load {os.getloadavg()[0]:.2f}", flush=True)

    writers = {
        "pytorch ZStandard": lambda path, t: dcp.FileSystemWriter(path, thread_count=t, _extensions=[ZStandard()]),
        "shardpoint zstd": lambda path, t: StorageWriter(path, thread_count=t, compression="zstd"),
    }
    readers = {"pytorch ZStandard": dcp.FileSystemReader, "shardpoint zstd": StorageReader}
    rows = []
    try:
        for threads in [int(t) for t in a.threads.split(",")]:
            save_s = {k: [] for k in writers}
            load_s = {k: [] for k in readers}
            save_cpu = {k: [] for k in writers}
            load_cpu = {k: [] for k in readers}
            sizes = {}
            for _ in range(a.rounds):
                for name, make in writers.items():
                    path = os.path.join(root, name.split()[0])
                    shutil.rmtree(path, ignore_errors=True)
                    t0, c0 = time.perf_counter(), cpu_seconds()
                    dcp.save(state, storage_writer=make(path, threads), no_dist=True)
                    save_s[name].append(time.perf_counter() - t0)
                    save_cpu[name].append(cpu_seconds() - c0)
                    sizes[name] = folder_bytes(path)
                for name, make in readers.items():
                    path = os.path.join(root, name.split()[0])
                    dest = {k: (torch.empty_like(v) if isinstance(v, torch.Tensor) else 0) for k, v in state.items()}
                    t0, c0 = time.perf_counter(), cpu_seconds()
                    dcp.load(dest, storage_reader=make(path), no_dist=True)
                    load_s[name].append(time.perf_counter() - t0)
                    load_cpu[name].append(cpu_seconds() - c0)
                    if not all(torch.equal(dest[k], v) for k, v in state.items() if isinstance(v, torch.Tensor)):
                        raise AssertionError(f"{name}: loaded values differ")
            for name in writers:
                rows.append([f"{name}, {threads} thread(s)", triple([payload / s / 1e9 for s in save_s[name]]),
                             triple([payload / s / 1e9 for s in load_s[name]]), f"{payload / sizes[name]:.3f}",
                             f"{sizes[name] / 2**20:.1f}", f"{median(save_cpu[name]) / (payload / 1e9):.2f}",
                             f"{median(load_cpu[name]) / (payload / 1e9):.2f}"])
            peer, ours = "pytorch ZStandard", "shardpoint zstd"
            rows.append([f"  ratio shardpoint / pytorch, {threads} thread(s)",
                         ratio(median(save_s[peer]), median(save_s[ours])),
                         ratio(median(load_s[peer]), median(load_s[ours])),
                         f"{(payload / sizes[ours]) / (payload / sizes[peer]):.3f}", "", "", ""])
        rates = [one_core_rates(state) for _ in range(a.rounds)]
        comp, decomp = [r[0] for r in rates], [r[1] for r in rates]
        cpus = os.cpu_count() or 1
        rows.append(["libzstd level 3, one thread, GB per CPU s", triple(comp), triple(decomp), "", "",
                     f"{1 / median(comp):.2f}", f"{1 / median(decomp):.2f}"])
        rows.append([f"ceiling: one core x {cpus} CPUs", f"{median(comp) * cpus:.2f}", f"{median(decomp) * cpus:.2f}",
                     "", "", "", ""])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print_table(f"zstd DCP checkpoints, {payload / 2**20:.0f} MiB, {a.rounds} rounds (GB/s min/median/max); "
                f"load average {os.getloadavg()[0]:.2f} at the end",
                ["writer / reader", "save GB/s", "load GB/s", "ratio", "MiB on disk", "save CPU s/GB",
                 "load CPU s/GB"], rows)


if __name__ == "__main__":
    main()
