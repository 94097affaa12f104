"""One rank of the tests of the checkpoint variants newer PyTorch writes
(python/tests/test_torch_variants.py launches it): zstd stream transforms and per-rank
metadata. The state is dcp_worker.py's (every tensor a function of its name) plus one
sharded tensor large enough that each rank's zstd item decompresses to more than 8 MiB
(so readers take the bounded-memory path, not the small-item one).

    python variants_worker.py save PATH --writer torch|ours [--zstd] [--no-collectives]
    python variants_worker.py load PATH --reader torch|ours

save: --writer torch is FileSystemWriter (--zstd: with _extensions=[ZStandard()]); ours is
shardpoint's StorageWriter (--zstd: compression="zstd"). --no-collectives: dcp.save(...,
use_collectives=False), each rank writing its own __<rank>.metadata.
load: dcp.load into this world size's state and check every value bit for bit.
"""

from __future__ import annotations

import argparse
import traceback

import dcp_worker  # noqa: F401 - restores the forwarded environment, enables faulthandler
import rank_exit
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from dcp_worker import DTensor, check_state, full_value, make_state
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

# 5000 x 1024 float32 = 20 MiB: 10 MiB per rank on 2 ranks, 6.7 MiB on 3.
BIG_NAME, BIG_SHAPE = "model.big.weight", (5000, 1024)


def state_with_big(mesh, fill: bool) -> dict:
    state = make_state(mesh, fill)
    full = full_value(BIG_NAME, BIG_SHAPE, torch.float32) if fill else torch.zeros(BIG_SHAPE)
    state["model"][BIG_NAME.split(".", 1)[1]] = distribute_tensor(full, mesh, [Shard(0)])
    return state


def check_big(state) -> None:
    got = state["model"][BIG_NAME.split(".", 1)[1]]
    assert isinstance(got, DTensor)
    local = got.to_local()
    start = got.device_mesh.get_local_rank() * -(-BIG_SHAPE[0] // got.device_mesh.size())
    want = full_value(BIG_NAME, BIG_SHAPE, torch.float32)[start : start + local.shape[0]]
    if not torch.equal(local, want):
        raise AssertionError(f"{BIG_NAME}: loaded values differ on rank {dist.get_rank()}")


def writer_for(kind: str, path: str, zstd: bool):
    if kind == "torch":
        extensions = None
        if zstd:
            from torch.distributed.checkpoint._extension import ZStandard

            extensions = [ZStandard()]
        return dcp.FileSystemWriter(path, _extensions=extensions)
    from shardpoint.torch import StorageWriter

    return StorageWriter(path, compression="zstd") if zstd else StorageWriter(path)


def reader_for(kind: str, path: str):
    if kind == "torch":
        return dcp.FileSystemReader(path)
    from shardpoint.torch import StorageReader

    return StorageReader(path)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("action", choices=["save", "load"])
    p.add_argument("path")
    p.add_argument("--writer", default="torch")
    p.add_argument("--reader", default="ours")
    p.add_argument("--zstd", action="store_true")
    p.add_argument("--no-collectives", action="store_true")
    a = p.parse_args()

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    try:
        if a.action == "save":
            state = state_with_big(mesh, fill=True)
            dcp.save(state, storage_writer=writer_for(a.writer, a.path, a.zstd), use_collectives=not a.no_collectives)
        else:
            state = state_with_big(mesh, fill=False)
            dcp.load(state, storage_reader=reader_for(a.reader, a.path))
            check_state(state)
            check_big(state)
        dist.barrier()
        print(f"rank {dist.get_rank()}: {a.action} ok (torch {torch.__version__})", flush=True)
        code = 0
    except BaseException:  # noqa: BLE001 - printed, then the rank fails
        traceback.print_exc()
        code = 1
    finally:
        dist.destroy_process_group()
    rank_exit.leave(code)


if __name__ == "__main__":
    main()
