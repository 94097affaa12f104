"""Hugging Face safetensors checkpoints: shardpoint vs PyTorch's own tools, same run, same data.

    PY=$(scripts/setup-python.sh); SHARDPOINT_PYTHONPATH=build-wheel/site \\
        $PY bench/hf_safetensors_bench.py [--mib 256] [--files 2] [--dir DIR]

1. PyTorch 2.15 writes a sharded checkpoint on 2 gloo ranks with HuggingFaceStorageWriter
   (save_distributed=True, no consolidation): the per-rank shard files with DCP_SHARDING_INFO.
2. Export to Hugging Face's layout (model-0000i-of-0000N.safetensors + index), N = --files:
   `shardpoint.consolidate(format="hf-safetensors")` vs PyTorch's
   `consolidate_safetensors_files` with the same fqn -> file mapping; neither fsyncs. Each in
   a fresh process; wall time and that process's peak RSS.
3. Load the exported folder into full CPU tensors in one process: dcp.load with PyTorch's
   `HuggingFaceStorageReader` vs dcp.load with shardpoint's `StorageReader`, and vs the
   engine's own load (sp_load into plain buffers, no torch); page cache warm for all.
Prints a table (median of --rounds).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

WRITE = r"""
import os, sys, torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
from torch.distributed.tensor import distribute_tensor, Shard
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageWriter
dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
spec = eval(sys.argv[2])
g = torch.Generator().manual_seed(0)
sd = {k: distribute_tensor(torch.randn(s, generator=g).to(getattr(torch, d)), mesh, [Shard(0)]) for k, (s, d) in spec.items()}
dcp.save(sd, storage_writer=HuggingFaceStorageWriter(sys.argv[1], save_distributed=True))
dist.destroy_process_group()
"""

# Runs one job in this process and prints {"seconds", "peak_rss_mib"}.
RUN = r"""
import json, resource, sys, time
kind, src, dst, extra = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
if kind not in ("export-ours", "load-engine"):  # these need no torch (nor its ~300 MiB)
    import torch
t0 = time.perf_counter()
if kind == "export-ours":
    import shardpoint
    shardpoint.consolidate(src, dst, layout="dcp", format="hf-safetensors", max_shard_bytes=extra["max_shard_bytes"],
                           durable=False)
elif kind == "export-torch":
    from torch.distributed.checkpoint._consolidate_hf_safetensors import consolidate_safetensors_files
    import os
    os.makedirs(dst)
    consolidate_safetensors_files(src, dst, extra["mapping"], num_threads=1)
elif kind == "load-engine":
    # The engine's load (sp_load, one process) into plain buffers: no torch, no DCP planner.
    import ctypes, pathlib, shardpoint
    class T(ctypes.Structure):
        _fields_ = [("fqn", ctypes.c_char_p), ("dtype", ctypes.c_char_p), ("ndim", ctypes.c_int),
                    ("global_shape", ctypes.POINTER(ctypes.c_int64)), ("offsets", ctypes.POINTER(ctypes.c_int64)),
                    ("sizes", ctypes.POINTER(ctypes.c_int64)), ("data", ctypes.c_void_p), ("nbytes", ctypes.c_uint64)]
    lib = ctypes.CDLL(str(pathlib.Path(shardpoint.__file__).parent / "_lib" / "libshardpoint.so"))
    lib.sp_checkpoint_open.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_char_p)]
    lib.sp_load.argtypes = [ctypes.c_void_p, ctypes.POINTER(T), ctypes.c_size_t, ctypes.c_void_p,
                            ctypes.POINTER(ctypes.c_char_p)]
    keep, ts = [], []
    for k, (shape, d) in extra["spec"].items():
        n = shape[0] * shape[1] * (2 if d == "bfloat16" else 4)
        buf = (ctypes.c_char * n)()
        dims = [(ctypes.c_int64 * 2)(*v) for v in (shape, (0, 0), shape)]
        keep.append((buf, dims))
        ts.append(T(k.encode(), d.encode(), 2, dims[0], dims[1], dims[2], ctypes.addressof(buf), n))
    h, err = ctypes.c_void_p(), ctypes.c_char_p()
    assert lib.sp_checkpoint_open(src.encode(), ctypes.byref(h), ctypes.byref(err)) == 0, err.value
    assert lib.sp_load(h, (T * len(ts))(*ts), len(ts), None, ctypes.byref(err)) == 0, err.value
else:
    import torch.distributed.checkpoint as dcp
    spec = extra["spec"]
    sd = {k: torch.empty(s, dtype=getattr(torch, d)) for k, (s, d) in spec.items()}
    if kind == "load-ours":
        from shardpoint.torch import StorageReader
        reader = StorageReader(src)
    else:
        from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageReader
        reader = HuggingFaceStorageReader(src)
    dcp.load(sd, storage_reader=reader, no_dist=True)
    assert float(sd[next(iter(sd))].float().abs().sum()) > 0
seconds = time.perf_counter() - t0
print(json.dumps({"seconds": seconds, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def env() -> dict:
    e = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    if os.environ.get("SHARDPOINT_PYTHONPATH"):
        e["PYTHONPATH"] = os.environ["SHARDPOINT_PYTHONPATH"]
    return e


def run(kind: str, src: Path, dst: Path, extra: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", RUN, kind, str(src), str(dst), json.dumps(extra)], check=True,
                         capture_output=True, text=True, env=env())
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=256, help="checkpoint size in MiB (float32 and bfloat16 tensors)")
    ap.add_argument("--files", type=int, default=2, help="output files of the export")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--keep", action="store_true", help="keep the checkpoints (their folder is printed)")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="hf-bench-", dir=args.dir))
    try:
        # 4 MiB tensors, every fourth bfloat16: a model's mix of large matrices.
        count = max(1, args.mib // 4)
        spec = {f"layers.{i}.weight": ([1024, 1024] if i % 4 else [1024, 2048], "bfloat16" if i % 4 == 0 else "float32")
                for i in range(count)}
        sharded = root / "sharded"
        port = 29000 + os.getpid() % 1000
        procs = [subprocess.Popen([sys.executable, "-c", WRITE, str(sharded), repr(spec)],
                                  env=dict(env(), RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                                           MASTER_PORT=str(port))) for r in range(2)]
        if any(p.wait() for p in procs):
            raise SystemExit("writing the checkpoint failed")
        total = sum(f.stat().st_size for f in sharded.glob("*.safetensors"))
        nbytes = sum(4 * 1024 * 1024 for _ in spec)
        max_shard = -(-nbytes // args.files)

        # One export first (also a warm-up): its file assignment is the mapping PyTorch gets.
        run("export-ours", sharded, root / "probe", {"max_shard_bytes": max_shard})
        index = json.loads((root / "probe" / "model.safetensors.index.json").read_text())
        mapping = {k: int(v[6:11]) for k, v in index["weight_map"].items()}
        results: dict = {k: [] for k in ("export-ours", "export-torch", "load-ours", "load-engine", "load-torch")}
        for r in range(args.rounds):
            for kind in ("export-ours", "export-torch") if r % 2 == 0 else ("export-torch", "export-ours"):
                dst = root / kind
                shutil.rmtree(dst, ignore_errors=True)
                extra = {"max_shard_bytes": max_shard} if kind == "export-ours" else {"mapping": mapping}
                results[kind].append(run(kind, sharded, dst, extra))
            loads = ("load-ours", "load-engine", "load-torch")
            for kind in loads if r % 2 == 0 else loads[::-1]:
                results[kind].append(run(kind, root / "export-ours", root, {"spec": spec}))

        def med(kind, field):
            return statistics.median(x[field] for x in results[kind])

        print(f"\nHugging Face safetensors, {nbytes / 2**20:.0f} MiB of tensors ({len(spec)} tensors, "
              f"{total / 2**20:.0f} MiB in {len(list(sharded.glob('*.safetensors')))} shard files from 2 ranks), "
              f"{args.files} output files, median of {args.rounds} rounds, page cache warm\n")
        print("| job | shardpoint s | PyTorch s | speedup | shardpoint peak RSS MiB | PyTorch peak RSS MiB |")
        print("|---|---|---|---|---|---|")
        for _job, ours, theirs, name in (("export", "export-ours", "export-torch", "export to HF layout "
                                         "(consolidate_safetensors_files)"),
                                        ("load", "load-ours", "load-torch",
                                         "load HF layout: dcp.load, shardpoint StorageReader vs HuggingFaceStorageReader"),
                                        ("load", "load-engine", "load-torch",
                                         "load HF layout: shardpoint's engine (sp_load) vs HuggingFaceStorageReader")):
            print(f"| {name} | {med(ours, 'seconds'):.3f} | {med(theirs, 'seconds'):.3f} | "
                  f"{med(theirs, 'seconds') / med(ours, 'seconds'):.2f}x | {med(ours, 'peak_rss_mib'):.0f} | "
                  f"{med(theirs, 'peak_rss_mib'):.0f} |")
    finally:
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
