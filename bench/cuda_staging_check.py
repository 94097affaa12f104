#!/usr/bin/env python3
"""One short check of async staging on a CUDA device (scripts/device-check-cuda-staging.sh runs it):
shardpoint._staging.HostStaging with pinned buffers, non-blocking copies on a side stream, staging
complete = the side stream's event; then, where the native package loads, dcp.async_save through
StorageWriter(async_staging=True) on one rank, loaded back and compared.

    python bench/cuda_staging_check.py [--mib 1024] [--rounds 5] [--dir DIR]

Checks (each prints PASS or FAIL; exit 1 on any FAIL, 77 when there is no CUDA device):
  1. values: the staged copy equals the device state, including work the caller's stream had
     queued (a kernel launched just before stage_async) and strided and mixed-dtype tensors;
  2. pinned and reused: every buffer is pinned, and the second save reuses the first's buffers;
  3. independence: changing the device state after the future completes leaves the copy alone;
  4. overlap: stage_async returns before the copy completes (its return time vs staging complete);
  5. speed: staging complete vs one device-to-host copy of the same bytes into pinned memory
     already allocated, same run (target <= 1.2x, medians over --rounds);
  6. dcp.async_save on one rank (gloo for the CPU side): AsyncSaveResponse, the state may change
     once staging_completion is done, the checkpoint loads back equal to the state as it was;
  7. with 2+ devices: staging for a rank whose device is cuda:1.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
failures: list = []


def check(name: str, ok: bool, detail: str = "") -> None:
    print(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)
    if not ok:
        failures.append(name)


def host_staging_class():
    """HostStaging from the source tree (it needs only torch), so the check runs even where the
    native package was built for another machine."""
    try:
        from shardpoint._staging import HostStaging

        return HostStaging
    except Exception:
        # The package's folder as a bare package (its __init__ loads the native library):
        # _staging and the _host_copy it imports, nothing else.
        import types

        package = types.ModuleType("sp_source")
        package.__path__ = [os.path.join(REPO, "python", "shardpoint")]
        sys.modules["sp_source"] = package
        return importlib.import_module("sp_source._staging").HostStaging


def state_of(torch, mib: int):
    n = mib * (1 << 20) // 4 // 8  # 8 float32 tensors make up most of the bytes
    return {
        "w": [torch.randn(n, device="cuda") for _ in range(8)],
        "t": torch.randn(64, 32, device="cuda").t(),  # dense, transposed strides
        "v": torch.randn(100, 4, device="cuda")[::2],  # a strided view
        "h": torch.randn(1000, device="cuda").half(),
        "i": torch.arange(10, device="cuda"),
        "p": torch.nn.Parameter(torch.randn(10, device="cuda")),  # requires grad: its copy must not
        "cpu": torch.ones(5),
        "step": 3,
    }


def tensors(obj):
    if isinstance(obj, dict):
        for v in obj.values():
            yield from tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from tensors(v)
    elif hasattr(obj, "is_cuda"):
        yield obj


def staging_checks(torch, HostStaging, mib: int, rounds: int) -> None:
    state = state_of(torch, mib)
    nbytes = sum(t.numel() * t.element_size() for t in tensors(state))
    staging = HostStaging(pin_memory=True)
    try:
        # 1. values, with a kernel queued on the caller's stream just before.
        state["w"][0].mul_(2)
        future = staging.stage_async(state)
        staged = future.result()
        expected = {k: v for k, v in state.items()}
        ok = all(torch.equal(s.cpu() if s.is_cuda else s, d.cpu()) for s, d in zip(tensors(expected), tensors(staged)))
        check("1 values (queued kernel, strided, mixed dtypes)", ok)
        check("1 strides kept for a dense transposed tensor", staged["t"].stride() == state["t"].stride())
        check("1 a parameter's copy needs no gradient", not staged["p"].requires_grad and staged["p"].grad_fn is None)
        # 2. pinned and reused.
        buffers = list(tensors(staged))
        check("2 buffers pinned", all(b.is_pinned() for b in buffers if b.device.type == "cpu"))
        pointers = [b.data_ptr() for b in buffers]
        again = staging.stage_async(state).result()
        check("2 buffers reused by the next save", [b.data_ptr() for b in tensors(again)] == pointers)
        # 3. independence.
        before = again["w"][1][:4].clone()
        state["w"][1].add_(1)
        torch.cuda.synchronize()
        check("3 the copy is independent of the device state", torch.equal(again["w"][1][:4], before))
        # 4/5. overlap and speed against one pinned device-to-host copy of the same bytes.
        pinned = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors(state) if t.is_cuda]
        sources = [t for t in tensors(state) if t.is_cuda]
        returned, complete, copy = [], [], []
        for _ in range(rounds):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.no_grad():
                for p, s in zip(pinned, sources):
                    p.copy_(s, non_blocking=True)
            torch.cuda.synchronize()
            copy.append(time.perf_counter() - t0)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            f = staging.stage_async(state)
            returned.append(time.perf_counter() - t0)
            f.result()
            complete.append(time.perf_counter() - t0)
        r, c, k = (statistics.median(x) for x in (returned, complete, copy))
        check("4 stage_async returns before the copy completes", r < c, f"returned {r * 1e3:.2f} ms, complete "
              f"{c * 1e3:.2f} ms")
        check("5 staging complete <= 1.2x one pinned D2H copy", c <= 1.2 * k,
              f"{nbytes / 1e9:.3f} GB: staging {c:.4f} s, one copy {k:.4f} s = {c / k:.2f}x "
              f"({nbytes / k / 1e9:.1f} GB/s); min/max staging {min(complete):.4f}/{max(complete):.4f}")
        # 7. a rank on another device than 0 (the staging thread starts on device 0).
        if torch.cuda.device_count() > 1:
            torch.cuda.set_device(1)
            other = {"x": torch.randn(1 << 20, device="cuda:1")}
            other["x"].mul_(3)  # queued on cuda:1's current stream just before
            copy1 = HostStaging(pin_memory=True)
            try:
                check("7 staging on cuda:1 orders after the caller's stream there",
                      torch.equal(copy1.stage_async(other).result()["x"], other["x"].cpu()))
            finally:
                copy1.close()
                torch.cuda.set_device(0)
    finally:
        staging.close()


def dcp_check(torch, directory: str) -> None:
    try:
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        from shardpoint.torch import StorageReader, StorageWriter
    except Exception as e:  # the native package was built for another machine
        print(f"SKIP 6 dcp.async_save: shardpoint.torch does not import here ({e})")
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29591")
    dist.init_process_group("cpu:gloo,cuda:nccl", rank=0, world_size=1)
    try:
        state = {"w": torch.randn(1 << 20, device="cuda"), "b": torch.randn(7, device="cuda"), "step": 1}
        expected = {k: (v.cpu() if hasattr(v, "cpu") else v) for k, v in state.items()}
        writer = StorageWriter(os.path.join(directory, "ckpt"), async_staging=True)
        response = dcp.async_save(state, storage_writer=writer)
        check("6 async_save returns AsyncSaveResponse", hasattr(response, "staging_completion"))
        response.staging_completion.result()
        state["w"].add_(1)  # allowed now: the copy is complete
        response.upload_completion.result()
        writer.close()
        loaded = {"w": torch.zeros(1 << 20), "b": torch.zeros(7), "step": 0}
        dcp.load(loaded, storage_reader=StorageReader(os.path.join(directory, "ckpt")))
        check("6 loads back the state as it was when saved",
              torch.equal(loaded["w"], expected["w"]) and torch.equal(loaded["b"], expected["b"]) and loaded["step"] == 1)
    finally:
        dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default=None)
    a = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        sys.exit(77)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}", flush=True)
    staging_checks(torch, host_staging_class(), a.mib, a.rounds)
    with tempfile.TemporaryDirectory(dir=a.dir) as directory:
        dcp_check(torch, directory)
    print("FAILED: " + ", ".join(failures) if failures else "ALL PASSED")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
