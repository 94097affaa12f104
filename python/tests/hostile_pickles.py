"""A corpus of hostile pickles for the trust tests: each one, when a stock unpickler loads it,
creates a marker file (the proof that code ran); none must when shardpoint reads it.

Every payload is built from real pickle opcodes or by pickling real objects whose
``__reduce__`` names the callable, as an attacker's file would be.
"""

from __future__ import annotations

import copyreg
import os
import pickle
import subprocess
from typing import Any, Callable, Dict, List

# An extension-registry code (copyreg.add_extension) the EXT1 payload uses; registered only
# while a stock reader is shown to run it (register_extension()).
EXTENSION_CODE = 0xF3


class Reduced:
    """An object that pickles as a call of ``fn(*args)``: what a hostile file holds."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self.fn = fn
        self.args = args

    def __reduce__(self):  # noqa: D105
        return self.fn, self.args


def _touch_command(marker: str) -> str:
    return f"touch '{marker}'"


def calls(marker: str) -> Dict[str, Any]:
    """Objects whose unpickling touches marker, one per way of calling code."""
    return {
        "os.system": Reduced(os.system, _touch_command(marker)),
        "subprocess.call": Reduced(subprocess.call, ["touch", marker]),
        "builtins.eval": Reduced(eval, f"open({marker!r}, 'w').close()"),
        "builtins.exec": Reduced(exec, f"open({marker!r}, 'w').close()"),
    }


def _s(text: str) -> bytes:
    return b"S'" + text.replace("'", "\\'").encode() + b"'\n"


def raw_payloads(marker: str) -> Dict[str, bytes]:
    """Pickles written opcode by opcode: tricks a pickler never emits by itself."""
    cmd = _touch_command(marker)
    return {
        # INST: find_class then call with the marked arguments (protocol 0).
        "INST": b"(" + _s(cmd) + b"ios\nsystem\n.",
        # OBJ: the class on the stack after MARK, then its arguments.
        "OBJ": b"(cos\nsystem\n" + _s(cmd) + b"o.",
        # BUILD/__setstate__: an innocent class instance gets os.system as its __setstate__
        # through the slot state of one BUILD; the next BUILD then calls it.
        "BUILD-setstate": (
            b"\x80\x02cargparse\nNamespace\n)\x81"  # Namespace.__new__(Namespace)
            b"N}X\x0c\x00\x00\x00__setstate__cos\nsystem\ns\x86b"  # BUILD (None, {"__setstate__": system})
            + b"X" + len(cmd.encode()).to_bytes(4, "little") + cmd.encode() + b"b."  # BUILD(cmd)
        ),
        # EXT1: a callable named by an extension-registry code, then REDUCE.
        "EXT1": b"\x80\x02\x82" + bytes([EXTENSION_CODE]) + b"X" + len(cmd.encode()).to_bytes(4, "little")
        + cmd.encode() + b"\x85R.",
    }


class register_extension:
    """Registers EXTENSION_CODE as os.system while the stock reader is shown to run EXT1."""

    def __enter__(self) -> None:
        copyreg.add_extension("os", "system", EXTENSION_CODE)

    def __exit__(self, *exc: Any) -> None:
        copyreg.remove_extension("os", "system", EXTENSION_CODE)


def metadata_payloads(marker: str) -> Dict[str, bytes]:
    """Whole ``.metadata`` files: each call at the root, each raw trick, and each call nested
    inside an otherwise real DCP Metadata (storage_meta.modules, planner_data, a chunk size)."""
    import torch
    from torch.distributed.checkpoint.metadata import (
        BytesStorageMetadata,
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        StorageMeta,
        TensorProperties,
        TensorStorageMetadata,
    )
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    def real(modules: List[Any] | None = None, planner: Any = None, size: Any = None) -> Metadata:
        chunk = ChunkStorageMetadata(offsets=torch.Size([0]), sizes=size if size is not None else torch.Size([4]))
        return Metadata(
            state_dict_metadata={
                "w": TensorStorageMetadata(TensorProperties(dtype=torch.float32), torch.Size([4]), [chunk]),
                "obj": BytesStorageMetadata(),
            },
            planner_data={"w": ("w",), "obj": planner if planner is not None else ("obj",)},
            storage_data={
                MetadataIndex("w", [0]): _StorageInfo("__0_0.distcp", 0, 10),
                MetadataIndex("obj"): _StorageInfo("__0_0.distcp", 10, 10),
            },
            storage_meta=StorageMeta(modules=modules or []),
        )

    out: Dict[str, bytes] = {}
    for name, obj in calls(marker).items():
        out[f"root {name}"] = pickle.dumps(obj, protocol=2)
        out[f"storage_meta.modules {name}"] = pickle.dumps(real(modules=[obj]), protocol=2)
        out[f"planner_data {name}"] = pickle.dumps(real(planner=obj), protocol=2)
    out["chunk size os.system"] = pickle.dumps(real(size=calls(marker)["os.system"]), protocol=2)
    for name, blob in raw_payloads(marker).items():
        out[f"raw {name}"] = blob
    return out
