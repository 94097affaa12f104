"""One rank of the multi-process DCP tests (python/tests/test_dcp_*.py launch it).

    python dcp_worker.py ACTION PATH [OPTIONS]

Environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torchrun's); gloo on CPU. The state
is deterministic: every tensor's full value is a function of its name only, so any world
size can build the expected values of its own shards and check a load bit for bit.

ACTION:
  save      dcp.save the state (--writer ours|torch, --async, --thread-count N)
  load      dcp.load into a state of this world size (--reader ours|torch) and check it
  fail-save dcp.save with a writer whose rank 1 fails in write_data
  async-twice  dcp.async_save with one StorageWriter twice: a zeroed state, then (once the
            first is committed) the same tensors filled in place with the real values; the
            second save must hold the new values (its host copy reuses the first's buffers)
  async-staging  dcp.async_save with StorageWriter(async_staging=True), twice: it returns
            DCP's AsyncSaveResponse; once staging_completion is done the state is zeroed in
            place, and the checkpoint must still hold the values before (then load checks);
            then twice more with the same tensor objects and plan caching (the staging's
            remembered walk): a zeroed state filled in place after its staging, then the
            filled state zeroed after its own: the last checkpoint holds the filled values
  cached-saves  a training loop's saves with DCP's plan caching on (where this PyTorch has
            it): --saves N saves of the state bumped by i into PATH/s<i> (a new writer each,
            sync or --async), then N more into PATH/same, removed before each; every
            checkpoint is loaded by PyTorch's reader and ours and must hold its own values
"""

from __future__ import annotations

import argparse
import faulthandler
import inspect
import os
import traceback
import zlib

# A rank that hangs gets SIGABRT from conftest.run_ranks: print every thread's stack.
faulthandler.enable(all_threads=True)

# Variables scripts/oracle-python does not pass into the PyTorch 2.6 root come as
# SHARDPOINT_WORKER_ENV_<NAME> (conftest.worker_env).
for _name, _value in list(os.environ.items()):
    if _name.startswith("SHARDPOINT_WORKER_ENV_"):
        os.environ.setdefault(_name[len("SHARDPOINT_WORKER_ENV_"):], _value)

import rank_exit
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

try:  # torch >= 2.5
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor
except ImportError:  # pragma: no cover - torch 2.4
    from torch.distributed._tensor import DTensor, Shard, distribute_tensor  # type: ignore
from torch.distributed.device_mesh import init_device_mesh

# name -> (shape, dtype); DTensors sharded on dim 0 (FSDP's layout), plus replicated and
# 0-dim tensors and objects.
SHARDED = {
    "model.embedding.weight": ((37, 16), torch.float32),
    "model.layers.0.weight": ((16, 16), torch.bfloat16),
    "model.layers.0.bias": ((16,), torch.float32),
    "model.head.weight": ((11, 5, 3), torch.float16),
    "optim.state.0.exp_avg": ((37, 16), torch.float32),
    "optim.state.0.step_count": ((5,), torch.int64),
    # Shards of 96 KiB or more on up to 4 ranks: with the small items in a rank's first file,
    # these fill the other 3 of the 4 files per rank an object store gets.
    "model.layers.1.weight": ((96, 1024), torch.float32),
    "model.layers.2.weight": ((96, 1024), torch.float32),
    "model.layers.3.weight": ((96, 1024), torch.float32),
}
REPLICATED = {
    "model.scale": ((3, 4), torch.float64),
    "optim.state.0.step": ((), torch.float32),
}


def full_value(name: str, shape, dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    if dtype == torch.int64:
        return torch.randint(-1000, 1000, shape, generator=g, dtype=torch.int64)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)


ST_NAME, ST_SHAPE = "model.st_weight", (13, 6)


def sharded_tensor(fill: bool):
    """A ShardedTensor (DCP's older sharded type) split on dim 0, or None where this PyTorch
    no longer has it."""
    try:
        from torch.distributed._shard.metadata import ShardMetadata
        from torch.distributed._shard.sharded_tensor import Shard as STShard
        from torch.distributed._shard.sharded_tensor import init_from_local_shards
    except ImportError:
        return None
    rank, ws = dist.get_rank(), dist.get_world_size()
    step = -(-ST_SHAPE[0] // ws)
    start, end = rank * step, min(rank * step + step, ST_SHAPE[0])
    full = full_value(ST_NAME, ST_SHAPE, torch.float32)
    local = full[start:end].clone() if fill else torch.zeros(end - start, ST_SHAPE[1])
    meta = ShardMetadata(shard_offsets=[start, 0], shard_sizes=[end - start, ST_SHAPE[1]], placement=f"rank:{rank}/cpu")
    return init_from_local_shards([STShard(local, meta)], list(ST_SHAPE))


def objects() -> dict:
    return {"epoch": 3, "name": "shardpoint", "pair": (1.5, "l2"), "nested": {"lr": [0.1, 0.01]}}


def make_state(mesh, fill: bool) -> dict:
    model, optim = {}, {}
    for name, (shape, dtype) in SHARDED.items():
        full = full_value(name, shape, dtype) if fill else torch.zeros(shape, dtype=dtype)
        t = distribute_tensor(full, mesh, [Shard(0)])
        _place(model, optim, name, t)
    for name, (shape, dtype) in REPLICATED.items():
        t = full_value(name, shape, dtype) if fill else torch.zeros(shape, dtype=dtype)
        _place(model, optim, name, t)
    st = sharded_tensor(fill)
    if st is not None:
        model[ST_NAME.split(".", 1)[1]] = st
    state = {"model": model, "optim": optim}
    state["extra"] = objects() if fill else {"epoch": 0, "name": "", "pair": (0.0, ""), "nested": {"lr": [0.0, 0.0]}}
    return state


def _place(model, optim, name, t):
    head, rest = name.split(".", 1)
    (model if head == "model" else optim)[rest] = t


def check_state(state) -> None:
    for name, (shape, dtype) in {**SHARDED, **REPLICATED}.items():
        head, rest = name.split(".", 1)
        got = state["model" if head == "model" else "optim"][rest]
        full = full_value(name, shape, dtype)
        if isinstance(got, DTensor):
            local = got.to_local()
            start = got.device_mesh.get_local_rank() * -(-shape[0] // got.device_mesh.size())
            want = full[start : start + local.shape[0]]
        else:
            local, want = got, full
        if local.dtype != dtype or not torch.equal(local, want):
            raise AssertionError(f"{name}: loaded values differ on rank {dist.get_rank()}")
    st = state["model"].get(ST_NAME.split(".", 1)[1])
    if st is not None:
        full = full_value(ST_NAME, ST_SHAPE, torch.float32)
        for shard in st.local_shards():
            start = shard.metadata.shard_offsets[0]
            if not torch.equal(shard.tensor, full[start : start + shard.tensor.shape[0]]):
                raise AssertionError(f"{ST_NAME}: loaded ShardedTensor values differ on rank {dist.get_rank()}")
    if state["extra"] != objects():
        raise AssertionError(f"objects differ: {state['extra']!r}")


def fill_in_place(state, values) -> None:
    """Copies values' tensors into state's (same structure), and its objects."""
    for part in ("model", "optim"):
        for key, got in state[part].items():
            want = values[part][key]
            if isinstance(got, DTensor):
                got.to_local().copy_(want.to_local())
            elif isinstance(got, torch.Tensor):
                got.copy_(want)
            else:  # ShardedTensor
                for mine, theirs in zip(got.local_shards(), want.local_shards()):
                    mine.tensor.copy_(theirs.tensor)
    state["extra"] = values["extra"]


def bump(state, k: int) -> None:
    """Adds k to every tensor of state in place, and to its epoch."""
    for part in ("model", "optim"):
        for got in state[part].values():
            if hasattr(got, "local_shards"):  # ShardedTensor (a torch.Tensor subclass)
                for shard in got.local_shards():
                    shard.tensor.add_(k)
            elif isinstance(got, DTensor):
                got.to_local().add_(k)
            else:
                got.add_(k)
    state["extra"]["epoch"] += k


def check_equal(got_state, want_state, what: str) -> None:
    """Every tensor and object of got_state equals want_state's (same structure, same mesh)."""
    for part in ("model", "optim"):
        for key, want in want_state[part].items():
            got = got_state[part][key]
            if hasattr(want, "local_shards"):
                pairs = [(a.tensor, b.tensor) for a, b in zip(got.local_shards(), want.local_shards())]
            elif isinstance(want, DTensor):
                pairs = [(got.to_local(), want.to_local())]
            else:
                pairs = [(got, want)]
            for a, b in pairs:
                if a.dtype != b.dtype or not torch.equal(a, b):
                    raise AssertionError(f"{what}: {part}.{key} differs on rank {dist.get_rank()}")
    if got_state["extra"] != want_state["extra"]:
        raise AssertionError(f"{what}: objects differ: {got_state['extra']!r} != {want_state['extra']!r}")


def async_staging(mesh, path: str) -> None:
    from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse

    from shardpoint.torch import StorageWriter

    state = make_state(mesh, fill=True)
    writer = StorageWriter(path, async_staging=True)
    # The save's collectives run on a group of their own while this thread's run on the
    # default one (distribute_tensor below), as a training loop's would.
    save_group = dist.new_group(backend="gloo")
    for _ in range(2):  # the second save reuses the staging buffers and thread
        response = dcp.async_save(state, storage_writer=writer, checkpoint_id=path, process_group=save_group)
        if not isinstance(response, AsyncSaveResponse):
            raise AssertionError(f"async_save returned {type(response).__name__}, not AsyncSaveResponse")
        response.staging_completion.result()
        zeroed = make_state(mesh, fill=False)
        fill_in_place(state, zeroed)  # training changes the state while the write runs
        response.upload_completion.result()
        state = make_state(mesh, fill=True)
    # The same objects again: the staging reuses what it built for them and must still copy
    # their current values. Saved zeroed (filled after staging), then filled (zeroed after).
    from torch.distributed.checkpoint import DefaultSavePlanner

    caching = "enable_plan_caching" in inspect.signature(DefaultSavePlanner.__init__).parameters
    planner_class = type("StagingPlanner", (DefaultSavePlanner,), {})  # its own plan cache
    fill_in_place(state, make_state(mesh, fill=False))
    for after in (True, False):
        planner = planner_class(enable_plan_caching=True) if caching else planner_class()
        response = dcp.async_save(state, storage_writer=writer, checkpoint_id=path, process_group=save_group,
                                  planner=planner)
        response.staging_completion.result()
        fill_in_place(state, make_state(mesh, fill=after))
        response.upload_completion.result()
    writer.close()


def cached_saves(mesh, root: str, saves: int, use_async: bool) -> None:
    import shutil

    from torch.distributed.checkpoint import DefaultSavePlanner

    from shardpoint.torch import StorageWriter

    caching = "enable_plan_caching" in inspect.signature(DefaultSavePlanner.__init__).parameters

    def planner():
        return DefaultSavePlanner(enable_plan_caching=True) if caching else DefaultSavePlanner()

    def save(state, path):
        writer = StorageWriter(path)
        if use_async:
            dcp.async_save(state, storage_writer=writer, planner=planner()).result()
        else:
            dcp.save(state, storage_writer=writer, planner=planner())

    def check(path, k):
        want = make_state(mesh, fill=True)
        for _ in range(k):  # as the loop did: (x + 1) + 1 rounds differently from x + 2
            bump(want, 1)
        for kind in ("torch", "ours"):
            got = make_state(mesh, fill=False)
            dcp.load(got, storage_reader=reader_for(kind, path))
            check_equal(got, want, f"{path} read by {kind}")

    state = make_state(mesh, fill=True)
    for i in range(saves):
        bump(state, 1)
        save(state, f"{root}/s{i}")
    for i in range(saves):
        check(f"{root}/s{i}", i + 1)
    same = f"{root}/same"
    for i in range(saves):
        dist.barrier()
        if dist.get_rank() == 0:
            shutil.rmtree(same, ignore_errors=True)
        dist.barrier()
        bump(state, 1)
        save(state, same)
        check(same, saves + i + 1)
    print(f"rank {dist.get_rank()}: plan caching {'on' if caching else 'absent'}", flush=True)


def writer_for(kind: str, path: str, thread_count: int):
    if kind == "torch":
        return dcp.FileSystemWriter(path, thread_count=thread_count)
    from shardpoint.torch import StorageWriter

    return StorageWriter(path, thread_count=thread_count)


def reader_for(kind: str, path: str):
    if kind == "torch":
        return dcp.FileSystemReader(path)
    from shardpoint.torch import StorageReader

    return StorageReader(path)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("action", choices=["save", "load", "fail-save", "async-twice", "async-staging", "cached-saves"])
    p.add_argument("path")
    p.add_argument("--writer", default="ours")
    p.add_argument("--reader", default="ours")
    p.add_argument("--async", dest="use_async", action="store_true")
    p.add_argument("--thread-count", type=int, default=2)
    p.add_argument("--saves", type=int, default=3)
    a = p.parse_args()

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    try:
        if a.action == "save":
            state = make_state(mesh, fill=True)
            writer = writer_for(a.writer, a.path, a.thread_count)
            if a.use_async:
                future = dcp.async_save(state, storage_writer=writer)
                future.result()
            else:
                dcp.save(state, storage_writer=writer)
        elif a.action == "async-twice":
            from shardpoint.torch import StorageWriter

            state = make_state(mesh, fill=False)
            writer = StorageWriter(a.path, thread_count=a.thread_count)
            dcp.async_save(state, storage_writer=writer, checkpoint_id=a.path).result()
            buffers = [b.data_ptr() for b in writer._staging._buffers]
            fill_in_place(state, make_state(mesh, fill=True))
            dcp.async_save(state, storage_writer=writer, checkpoint_id=a.path).result()
            if [b.data_ptr() for b in writer._staging._buffers] != buffers:
                raise AssertionError("the second async save allocated new host buffers")
        elif a.action == "async-staging":
            async_staging(mesh, a.path)
        elif a.action == "cached-saves":
            cached_saves(mesh, a.path, a.saves, a.use_async)
        elif a.action == "load":
            state = make_state(mesh, fill=False)
            dcp.load(state, storage_reader=reader_for(a.reader, a.path))
            check_state(state)
        else:
            from shardpoint.torch import StorageWriter

            class FailingWriter(StorageWriter):
                def write_data(self, plan, planner):
                    if dist.get_rank() == 1:
                        raise OSError("injected failure on rank 1")
                    return super().write_data(plan, planner)

            state = make_state(mesh, fill=True)
            dcp.save(state, storage_writer=FailingWriter(a.path))
        dist.barrier()
        print(f"rank {dist.get_rank()}: {a.action} ok (torch {torch.__version__})", flush=True)
        code = 0
    except BaseException:  # noqa: BLE001 - printed, then the rank fails
        traceback.print_exc()
        code = 1
    finally:
        dist.destroy_process_group()
    rank_exit.leave(code)  # from here, while this frame still holds the state


if __name__ == "__main__":
    main()
