"""One rank of the safetensors interop tests (python/tests/test_safetensors.py launches it):
the checkpoints PyTorch writes as safetensors, written by PyTorch itself, and loads of them
(or of what shardpoint made of them) on any world size, checked against the state saved.

    python safetensors_worker.py ACTION PATH

Environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torchrun's); gloo on CPU.

ACTION:
  save         writes PATH/hf (HuggingFaceStorageWriter(save_distributed=True,
               enable_consolidation=True, fqn_to_index_mapping=MAPPING): model-*.safetensors
               + model.safetensors.index.json, and the per-rank files of hf/sharded/),
               PATH/hf-rank0 (rank 0 alone, save_distributed=False: full tensors) and
               PATH/dcp-st (FileSystemWriter(serialization_format=SAFETENSORS)), then tries
               PyTorch's own FileSystemReader on dcp-st and writes the outcome to
               PATH/dcp-st-torch-load.txt
  load-ours    dcp.load PATH through shardpoint.torch.StorageReader (the C API's reader)
  load-capi    sp_load of this rank's dim-0 boxes (the engine's load, over TCP)
  load-torch   dcp.load PATH through PyTorch's FileSystemReader
  load-hf      dcp.load PATH through PyTorch's HuggingFaceStorageReader
  save-hf MAPPING  the HF state alone through HuggingFaceStorageWriter (as in save) into PATH,
               with fqn_to_index_mapping MAPPING (JSON)
Every load checks each tensor bit for bit; the HF state only for HF folders.
"""

from __future__ import annotations

import ctypes
import faulthandler
import json
import os
import sys
import traceback
import zlib
from pathlib import Path

faulthandler.enable(all_threads=True)

import rank_exit
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

# name -> (shape, dtype, placement); float dtypes only: PyTorch's consolidation cannot
# handle integer tensors (torch.finfo of an int dtype). Shard(1) gives column chunks, 11
# rows on 2 ranks uneven ones, "tiny" an empty shard on rank 1.
HF_STATE = {
    "embed.weight": ((37, 16), torch.float32, Shard(0)),
    "layers.0.weight": ((16, 12), torch.bfloat16, Shard(1)),
    "layers.0.bias": ((16,), torch.float16, Shard(0)),
    "head.weight": ((11, 5, 3), torch.float32, Shard(0)),
    "norm.weight": ((3, 4), torch.float64, Replicate()),
    "tiny": ((1,), torch.float32, Shard(0)),
}
# DCP's safetensors serialization also carries integers and objects.
DCP_EXTRA = {"ids": ((6,), torch.int64, Shard(0))}
MAPPING = {"embed.weight": 1, "layers.0.weight": 2, "layers.0.bias": 2, "head.weight": 3, "norm.weight": 3, "tiny": 3}
STEP = 7


def full(name: str, shape, dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 10).to(dtype)
    return torch.randint(-(2**40), 2**40, shape, generator=g, dtype=dtype)


def spec_of(path: str) -> dict:
    return dict(HF_STATE, **DCP_EXTRA) if "dcp-st" in path or "hf-rank0" in path else dict(HF_STATE)


def state(spec: dict, mesh, empty: bool) -> dict:
    out = {}
    for name, (shape, dtype, placement) in spec.items():
        value = torch.zeros(shape, dtype=dtype) if empty else full(name, shape, dtype)
        out[name] = distribute_tensor(value, mesh, [placement])
    return out


def check(loaded: dict, spec: dict) -> None:
    for name, (shape, dtype, _) in spec.items():
        got = loaded[name]
        got = got.full_tensor() if isinstance(got, DTensor) else got
        want = full(name, shape, dtype)
        if got.dtype != dtype or not torch.equal(got, want):
            raise AssertionError(f"{name}: loaded {got.dtype} {list(got.shape)} differs from the saved value")


def save(root: Path) -> None:
    from torch.distributed.checkpoint.filesystem import SerializationFormat
    from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageWriter

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    dcp.save(state(HF_STATE, mesh, False), storage_writer=HuggingFaceStorageWriter(
        str(root / "hf"), fqn_to_index_mapping=MAPPING, save_distributed=True, enable_consolidation=True))
    # Rank-0 checkpointing (save_distributed=False): full tensors straight into the folder,
    # index from the write results; integers are fine without consolidation.
    if dist.get_rank() == 0:
        full_state = {k: full(k, s, d) for k, (s, d, _) in dict(HF_STATE, **DCP_EXTRA).items()}
        dcp.save(full_state, storage_writer=HuggingFaceStorageWriter(str(root / "hf-rank0"), fqn_to_index_mapping=dict(
            MAPPING, ids=3)), no_dist=True)
    dist.barrier()
    st = state(dict(HF_STATE, **DCP_EXTRA), mesh, False)
    st["step"] = STEP
    dcp.save(st, storage_writer=dcp.FileSystemWriter(str(root / "dcp-st"),
                                                     serialization_format=SerializationFormat.SAFETENSORS))
    # PyTorch's reader on its own safetensors serialization (2.15: it fails).
    try:
        back = state(dict(HF_STATE, **DCP_EXTRA), mesh, True)
        dcp.load(back, checkpoint_id=str(root / "dcp-st"))
        check(back, dict(HF_STATE, **DCP_EXTRA))
        outcome = "ok"
    except BaseException as e:  # noqa: BLE001 - the outcome is the result (CheckpointException is one)
        text = str(e)
        outcome = "UnpicklingError" if "UnpicklingError" in text else f"{type(e).__name__}: {text[:200]}"
    if dist.get_rank() == 0:
        (root / "dcp-st-torch-load.txt").write_text(outcome + "\n")


def load(path: str, reader) -> None:
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    spec = spec_of(path)
    st = state(spec, mesh, True)
    if "dcp-st" in path:
        st["step"] = 0
    dcp.load(st, storage_reader=reader)
    check(st, spec)
    if "dcp-st" in path and st["step"] != STEP:
        raise AssertionError(f"step: loaded {st['step']!r}, saved {STEP}")


class SpTensor(ctypes.Structure):
    _fields_ = [("fqn", ctypes.c_char_p), ("dtype", ctypes.c_char_p), ("ndim", ctypes.c_int),
                ("global_shape", ctypes.POINTER(ctypes.c_int64)), ("offsets", ctypes.POINTER(ctypes.c_int64)),
                ("sizes", ctypes.POINTER(ctypes.c_int64)), ("data", ctypes.c_void_p), ("nbytes", ctypes.c_uint64)]


def load_capi(path: str) -> None:
    """The engine's load() through sp_load: each rank asks for its dim-0 rows."""
    import shardpoint

    lib = ctypes.CDLL(str(Path(shardpoint.__file__).parent / "_lib" / "libshardpoint.so"))
    lib.sp_checkpoint_open.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p),
                                       ctypes.POINTER(ctypes.c_char_p)]
    lib.sp_load.argtypes = [ctypes.c_void_p, ctypes.POINTER(SpTensor), ctypes.c_size_t, ctypes.c_void_p,
                            ctypes.POINTER(ctypes.c_char_p)]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    spec = {k: v for k, v in spec_of(path).items()}
    keep, tensors = [], []
    for name, (shape, dtype, _) in spec.items():
        rows = -(-shape[0] // world)
        begin, end = min(rank * rows, shape[0]), min((rank + 1) * rows, shape[0])
        sizes = (end - begin, *shape[1:])
        buf = torch.zeros(sizes, dtype=dtype)
        arrays = [(ctypes.c_int64 * len(shape))(*v) for v in (shape, (begin,) + (0,) * (len(shape) - 1), sizes)]
        keep.append((buf, arrays, begin, end))
        tensors.append(SpTensor(name.encode(), str(dtype).removeprefix("torch.").encode(), len(shape), arrays[0],
                                arrays[1], arrays[2], buf.data_ptr(), buf.numel() * buf.element_size()))
    handle, err = ctypes.c_void_p(), ctypes.c_char_p()
    if lib.sp_checkpoint_open(path.encode(), ctypes.byref(handle), ctypes.byref(err)) != 0:
        raise RuntimeError(err.value.decode())
    if lib.sp_load(handle, (SpTensor * len(tensors))(*tensors), len(tensors), None, ctypes.byref(err)) != 0:
        raise RuntimeError(err.value.decode())
    for (name, (shape, dtype, _)), (buf, _, begin, end) in zip(spec.items(), keep):
        if not torch.equal(buf, full(name, shape, dtype)[begin:end]):
            raise AssertionError(f"{name}: rows [{begin}, {end}) differ from the saved value")


def main() -> None:
    action, path = sys.argv[1], sys.argv[2]
    if action == "load-capi":
        load_capi(path)
        return
    dist.init_process_group("gloo")
    code = 1
    try:
        if action == "save":
            save(Path(path))
        elif action == "save-hf":
            from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageWriter

            mesh = init_device_mesh("cpu", (dist.get_world_size(),))
            dcp.save(state(HF_STATE, mesh, False), storage_writer=HuggingFaceStorageWriter(
                path, fqn_to_index_mapping=json.loads(sys.argv[3]), save_distributed=True, enable_consolidation=True))
        elif action == "load-ours":
            from shardpoint.torch import StorageReader

            load(path, StorageReader(path))
        elif action == "load-torch":
            load(path, dcp.FileSystemReader(path))
        elif action == "load-hf":
            from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageReader

            load(path, HuggingFaceStorageReader(path))
        else:
            raise SystemExit(f"unknown action {action}")
        code = 0
    except BaseException:  # noqa: BLE001 - printed, then the rank fails
        traceback.print_exc()
    finally:
        dist.destroy_process_group()
    rank_exit.leave(code)


if __name__ == "__main__":
    main()
