"""Damaged and hostile checkpoints through shardpoint's StorageReader (newest PyTorch, one
process): every damage is an exception naming the file and the item; nothing is reported
as loaded."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import CheckpointException

import shardpoint
from shardpoint.torch import StorageReader, StorageWriter


def state(fill: bool = True) -> dict:
    g = torch.Generator().manual_seed(7)
    w = torch.randn(64, 1024, generator=g) if fill else torch.zeros(64, 1024)
    b = torch.arange(10, dtype=torch.int64) if fill else torch.zeros(10, dtype=torch.int64)
    return {"w": w, "b": b, "step": 5 if fill else 0}


@pytest.fixture
def ckpt(tmp_path) -> Path:
    path = tmp_path / "ckpt"
    dcp.save(state(), storage_writer=StorageWriter(path))
    return path


def load_error(path) -> str:
    target = state(fill=False)
    with pytest.raises((CheckpointException, shardpoint.ShardpointError)) as info:
        dcp.load(target, storage_reader=StorageReader(path))
    return str(info.value)


def blob_of(path: Path, fqn: str):
    meta = pickle.loads((path / ".metadata").read_bytes())
    for index, info in meta.storage_data.items():
        if index.fqn == fqn:
            return info
    raise KeyError(fqn)


def test_round_trip_loads_and_verifies(ckpt):
    target = state(fill=False)
    dcp.load(target, storage_reader=StorageReader(ckpt))
    want = state()
    assert torch.equal(target["w"], want["w"]) and torch.equal(target["b"], want["b"])
    assert target["step"] == 5


def test_pytorch_reader_loads_ours(ckpt):
    target = state(fill=False)
    dcp.load(target, storage_reader=dcp.FileSystemReader(ckpt))
    assert torch.equal(target["w"], state()["w"])


def test_flipped_tensor_byte_names_file_and_item(ckpt):
    info = blob_of(ckpt, "w")
    f = ckpt / info.relative_path
    data = bytearray(f.read_bytes())
    data[info.offset + info.length // 2] ^= 0x40  # inside the tensor's data (most of the blob)
    f.write_bytes(bytes(data))
    message = load_error(ckpt)
    assert info.relative_path in message and '"w"' in message and "checksum" in message


def test_truncated_file_names_the_file(ckpt):
    info = blob_of(ckpt, "w")
    f = ckpt / info.relative_path
    f.write_bytes(f.read_bytes()[: info.offset + info.length // 2])
    message = load_error(ckpt)
    assert info.relative_path in message


def test_missing_file_names_the_file(ckpt):
    info = blob_of(ckpt, "w")
    (ckpt / info.relative_path).unlink()
    message = load_error(ckpt)
    assert info.relative_path in message


def test_metadata_pointing_outside_the_folder_is_refused(ckpt, tmp_path):
    meta = pickle.loads((ckpt / ".metadata").read_bytes())
    for index, info in list(meta.storage_data.items()):
        if index.fqn == "w":
            meta.storage_data[index] = type(info)("../outside.distcp", info.offset, info.length)
    (tmp_path / "outside.distcp").write_bytes((ckpt / info.relative_path).read_bytes())
    (ckpt / ".metadata").write_bytes(pickle.dumps(meta))
    (ckpt / ".shardpoint-index").unlink(missing_ok=True)  # the index would bypass .metadata
    message = load_error(ckpt)
    assert "../outside.distcp" in message


def test_garbage_metadata_is_a_format_error(ckpt):
    (ckpt / ".metadata").write_bytes(b"not a pickle at all")
    message = load_error(ckpt)
    assert ".metadata" in message


def test_no_checkpoint_is_not_found(tmp_path):
    message = load_error(tmp_path / "nothing-here")
    assert "not a committed checkpoint" in message


def test_pytorch_written_checkpoint_is_checked_by_its_zip_crcs(tmp_path, caplog):
    path = tmp_path / "theirs"
    dcp.save(state(), storage_writer=dcp.FileSystemWriter(path))
    target = state(fill=False)
    with caplog.at_level("WARNING", logger="shardpoint"):
        dcp.load(target, storage_reader=StorageReader(path))
    assert torch.equal(target["w"], state()["w"])
    assert not any("unverified" in r.message for r in caplog.records)

    # No sidecar: a flipped data byte is found by the record's zip CRC-32 ...
    info = blob_of(path, "w")
    f = path / info.relative_path
    data = bytearray(f.read_bytes())
    data[info.offset + info.length // 2] ^= 0x40
    f.write_bytes(bytes(data))
    message = load_error(path)
    assert info.relative_path in message and '"w"' in message and "CRC-32 mismatch" in message
    # ... and loaded as it is, said once in the log, with the check off.
    target = state(fill=False)
    with caplog.at_level("WARNING", logger="shardpoint"):
        dcp.load(target, storage_reader=StorageReader(path, check_zip_crc=False))
    assert not torch.equal(target["w"], state()["w"])
    assert any("unverified" in r.message for r in caplog.records)


def test_resave_into_a_committed_folder_replaces_it(ckpt):
    new = state()
    new["w"] = new["w"] * 2
    dcp.save(new, storage_writer=StorageWriter(ckpt))
    target = state(fill=False)
    dcp.load(target, storage_reader=StorageReader(ckpt))
    assert torch.equal(target["w"], new["w"])
