"""A checkpoint is untrusted input: no pickle from one runs code through the package.

Each hostile pickle (hostile_pickles.py) is put where a checkpoint holds pickles -- the
``.metadata``, a bytes item, ``meta.pt`` / a full checkpoint file -- and read through every
Python entry point. Each is refused with one message naming the file (and item) and the
offending global, and the marker file it would create stays absent. The same test shows the
stock reader does create it, so the corpus is live. A benign corpus still loads equal.
"""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp

import hostile_pickles
from shardpoint import errors
from shardpoint.torch import StorageReader

METADATA = hostile_pickles.metadata_payloads("MARKER")


def _marker(tmp_path: Path) -> Path:
    return tmp_path / "ran"


def _metadata_folder(tmp_path: Path, blob: bytes) -> Path:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / ".metadata").write_bytes(blob)
    return folder


def _global_of(case: str) -> str:
    """The global the engine or torch must name for a case (protocol 2 writes subprocess.call
    as Python 2's commands.call)."""
    for name, want in (("os.system", "posix.system"), ("subprocess.call", "commands.call"),
                       ("builtins.eval", "eval"), ("builtins.exec", "exec"), ("INST", "os.system"),
                       ("OBJ", "os.system")):
        if name in case:
            return want
    return ""


@pytest.mark.parametrize("case", sorted(METADATA))
def test_hostile_metadata_is_refused_by_every_entry_point(tmp_path: Path, case: str) -> None:
    marker = _marker(tmp_path)
    blob = hostile_pickles.metadata_payloads(str(marker))[case]
    folder = _metadata_folder(tmp_path, blob)

    if case.startswith("planner_data"):
        # Custom planners keep objects there; the engine reads them as data and the rebuild
        # leaves them out (a load needs only the (fqn,) paths), so nothing is called.
        metadata = StorageReader(str(folder)).read_metadata()
        assert metadata.planner_data == {"w": ("w",), "obj": ("obj",)}
        assert not marker.exists()
        return
    with pytest.raises(errors.FormatError) as refused:
        StorageReader(str(folder)).read_metadata()
    message = str(refused.value)
    assert ".metadata" in message and "\n" not in message, message
    assert _global_of(case) in message, message

    # DCP wraps the reader's error into its CheckpointException, the engine's line inside.
    with pytest.raises(BaseException) as through_dcp:  # CheckpointException is a BaseException
        dcp.load({"w": torch.zeros(4)}, storage_reader=StorageReader(str(folder)))
    assert message in str(through_dcp.value)

    # Lightning's listing and commit test are the engine's (sp_list_committed_checkpoints,
    # sp_checkpoint_committed): they read no pickle.
    from shardpoint import _lightning_files

    torch.save({"global_step": 1}, folder / "meta.pt")  # a Lightning checkpoint: both markers
    assert _lightning_files.is_committed(folder)
    assert str(folder) in [str(p) for p in _lightning_files.find_committed_checkpoints(folder.parent)]
    assert not marker.exists(), "a shardpoint entry point ran the payload"

    # The corpus is live: PyTorch's own reader runs it.
    with hostile_pickles.register_extension():
        try:
            dcp.FileSystemReader(str(folder)).read_metadata()
        except Exception:  # noqa: BLE001 - most payloads are not Metadata after they ran
            pass
    assert marker.exists(), f"the stock reader did not run {case}: the corpus is dead"


def test_trusted_reader_still_decodes_metadata_with_the_engine(tmp_path: Path) -> None:
    # trusted=True only stops the screening of bytes items: .metadata is never unpickled.
    marker = _marker(tmp_path)
    folder = _metadata_folder(tmp_path, hostile_pickles.metadata_payloads(str(marker))["storage_meta.modules os.system"])
    with pytest.raises(errors.FormatError) as refused:
        StorageReader(str(folder), trusted=True).read_metadata()
    assert "system" in str(refused.value), refused.value
    assert not marker.exists(), "a trusted reader ran the .metadata pickle"


def _save_no_dist(state: dict, path: Path) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=str(path), no_dist=True)


@pytest.mark.parametrize("case", sorted(hostile_pickles.calls("x")))
def test_hostile_bytes_item_is_screened(tmp_path: Path, case: str) -> None:
    marker = _marker(tmp_path)
    folder = tmp_path / "ckpt"
    _save_no_dist({"w": torch.arange(4.0), "extra": {"obj": hostile_pickles.calls(str(marker))[case]}}, folder)
    assert not marker.exists()

    target = {"w": torch.zeros(4), "extra": {"obj": None}}
    with pytest.raises(BaseException) as refused:  # DCP's CheckpointException around our FormatError
        dcp.load(target, storage_reader=StorageReader(str(folder)))
    message = str(refused.value)
    assert 'bytes item "extra.obj"' in message and _global_of(case) in message, message
    assert not marker.exists(), "the bytes item ran through shardpoint's reader"

    dcp.load({"w": torch.zeros(4), "extra": {"obj": None}}, storage_reader=dcp.FileSystemReader(str(folder)))
    assert marker.exists(), "the stock reader did not run the bytes item: the corpus is dead"


def test_hostile_bytes_item_runs_only_when_trusted(tmp_path: Path) -> None:
    marker = _marker(tmp_path)
    folder = tmp_path / "ckpt"
    _save_no_dist({"obj": hostile_pickles.calls(str(marker))["os.system"]}, folder)
    dcp.load({"obj": None}, storage_reader=StorageReader(str(folder), trusted=True))
    assert marker.exists()


@dataclasses.dataclass
class HyperParameters:
    lr: float
    layers: int
    name: str


def _benign_state() -> dict:
    return {
        "w": torch.arange(12, dtype=torch.float32).reshape(3, 4),
        "objects": {
            "dict": {"a": 1, "b": [1.5, "x", None]},
            "tuple": (1, "two", 3.0, None, True),
            "string": "shardpoint",
            "number": 2**40,
            "none": None,
            "tensor_in_tuple": (torch.tensor([1, 2, 3]), "t"),
            "size": torch.Size([2, 3]),
            "dtype": torch.bfloat16,
            "numpy_scalar": np.float64(0.25),
            "hparams": HyperParameters(lr=0.1, layers=4, name="tiny"),
        },
    }


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def test_benign_corpus_loads_equal(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    saved = _benign_state()
    _save_no_dist(saved, folder)
    user_safe = [HyperParameters, np.dtype, type(np.dtype(np.float64)), np._core.multiarray.scalar]

    def blank(value):
        if isinstance(value, dict):
            return {k: blank(v) for k, v in value.items()}
        return torch.zeros_like(value) if isinstance(value, torch.Tensor) else None

    def target() -> dict:
        return blank(saved)

    theirs = target()
    dcp.load(theirs, storage_reader=dcp.FileSystemReader(str(folder)))
    with torch.serialization.safe_globals(user_safe):
        ours = target()
        dcp.load(ours, storage_reader=StorageReader(str(folder)))
    assert _equal(ours, saved) and _equal(ours, theirs)

    # Without the user's safe globals the dataclass (or the numpy scalar) is refused, by name.
    with pytest.raises(BaseException, match="HyperParameters|numpy"):
        dcp.load(target(), storage_reader=StorageReader(str(folder)))


def test_metadata_rebuilt_equals_pytorchs(tmp_path: Path) -> None:
    """The rebuilt Metadata is what PyTorch's own reader gives, less what loads never use."""
    folder = tmp_path / "ckpt"
    _save_no_dist(_benign_state(), folder)
    theirs = dcp.FileSystemReader(str(folder)).read_metadata()
    ours = StorageReader(str(folder)).read_metadata()
    assert ours.state_dict_metadata.keys() == theirs.state_dict_metadata.keys()
    for key, want in theirs.state_dict_metadata.items():
        got = ours.state_dict_metadata[key]
        assert type(got) is type(want), key
        if hasattr(want, "chunks"):
            assert got.size == want.size and got.chunks == want.chunks, key
            assert got.properties.dtype == want.properties.dtype, key
            assert got.properties.memory_format == want.properties.memory_format, key
            assert got.properties.layout == want.properties.layout, key
    assert ours.storage_data == theirs.storage_data
    assert ours.planner_data == theirs.planner_data


def _path_class_pickle(module: str) -> bytes:
    """A real DCP Metadata whose storage_meta.checkpoint_id pickles as ``module.PosixPath``:
    ``pathlib._local`` is what Python 3.13 writes, ``pathlib`` what 3.9-3.12 write."""
    import sys
    import types

    from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

    fake = types.ModuleType(module)

    class PosixPath:
        def __init__(self, *parts: str) -> None:
            self.parts = parts

        def __reduce__(self):  # noqa: D105
            return PosixPath, self.parts

    PosixPath.__module__ = module
    PosixPath.__qualname__ = "PosixPath"
    fake.PosixPath = PosixPath  # type: ignore[attr-defined]
    saved = sys.modules.get(module)
    sys.modules[module] = fake
    try:
        md = Metadata(state_dict_metadata={}, storage_meta=StorageMeta(checkpoint_id=PosixPath("/ckpt", "step-1")))
        return pickle.dumps(md, protocol=2)
    finally:
        if saved is None:
            del sys.modules[module]
        else:
            sys.modules[module] = saved


@pytest.mark.parametrize("module", ["pathlib._local", "pathlib"])
def test_metadata_from_any_python_reads(tmp_path: Path, module: str) -> None:
    blob = _path_class_pickle(module)
    assert f"{module}\nPosixPath".encode() in blob
    folder = _metadata_folder(tmp_path, blob)
    metadata = StorageReader(str(folder)).read_metadata()
    assert metadata.state_dict_metadata == {}
    if module == "pathlib._local":  # what PyTorch's own reader cannot read under 3.11
        with pytest.raises(Exception, match="pathlib._local"):
            dcp.FileSystemReader(str(folder)).read_metadata()


def test_full_checkpoint_file_loads_weights_only(tmp_path: Path) -> None:
    from shardpoint.lightning import CheckpointIO

    marker = _marker(tmp_path)
    path = tmp_path / "model.ckpt"
    torch.save({"epoch": 1, "hook": hostile_pickles.calls(str(marker))["os.system"]}, str(path))
    with pytest.raises(pickle.UnpicklingError, match="system"):
        CheckpointIO().load_checkpoint(str(path))
    assert not marker.exists()
    CheckpointIO().load_checkpoint(str(path), weights_only=False)
    assert marker.exists()

    benign = tmp_path / "benign.ckpt"
    torch.save({"epoch": 2, "state_dict": {"w": torch.ones(2)}}, str(benign))
    loaded = CheckpointIO().load_checkpoint(str(benign))
    assert loaded["epoch"] == 2 and torch.equal(loaded["state_dict"]["w"], torch.ones(2))


def test_engine_refuses_the_same_metadata(tmp_path: Path) -> None:
    """The Python refusal is the engine's: inspect (C API) gives the same message."""
    import shardpoint

    folder = _metadata_folder(tmp_path, hostile_pickles.metadata_payloads(str(_marker(tmp_path)))["root os.system"])
    with pytest.raises(errors.FormatError) as python_side:
        StorageReader(str(folder)).read_metadata()
    with pytest.raises(errors.ShardpointError) as engine_side:
        shardpoint.inspect(str(folder))
    assert "posix.system" in str(python_side.value) and "posix.system" in str(engine_side.value)
    assert os.listdir(tmp_path) == ["ckpt"]


def test_bytes_screen_allows_what_weights_only_allows() -> None:
    from shardpoint import _trust

    buf = io.BytesIO()
    torch.save({"step": torch.tensor(3), "lr": [0.1], "name": "x"}, buf)
    _trust.screen_bytes_item(buf.getvalue(), "optim.param_groups", "ckpt")


@pytest.mark.parametrize("module", ["pathlib._local", "pathlib"])
def test_metadata_from_any_python_reads_on_each_interpreter(interpreter, tmp_path: Path, module: str) -> None:
    """The same files read under each supported interpreter (CPython 3.11 with the newest
    PyTorch, 3.13 with PyTorch 2.6), through the StorageReader's engine rebuild."""
    from conftest import run_python

    folder = _metadata_folder(tmp_path, _path_class_pickle(module))
    r = run_python(interpreter, "import sys; from shardpoint.torch import StorageReader; "
                                f"md = StorageReader({str(folder)!r}).read_metadata(); "
                                "print('read', sys.version_info[:2], md.state_dict_metadata)")
    assert "read" in r.stdout and "{}" in r.stdout, r.stdout
