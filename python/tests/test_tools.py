"""shardpoint.consolidate / reshard / verify / inspect on checkpoints the DCP writer made."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

import shardpoint
from shardpoint.torch import StorageReader, StorageWriter


def state() -> dict:
    g = torch.Generator().manual_seed(3)
    return {"model": {"w": torch.randn(33, 8, generator=g), "b": torch.randn(8, generator=g)}, "epoch": 2}


@pytest.fixture
def ckpt(tmp_path) -> Path:
    path = tmp_path / "ckpt"
    dcp.save(state(), storage_writer=StorageWriter(path))
    return path


def test_inspect(ckpt):
    info = shardpoint.inspect(ckpt)
    assert info["tensors"]["model.w"]["shape"] == [33, 8]
    assert info["tensors"]["model.w"]["dtype"] == "float32"
    assert "epoch" in info["objects"]
    assert info["checksums"] == "crc32c"


def test_verify_clean_and_damaged(ckpt):
    report = shardpoint.verify(ckpt)
    assert report["ok"] and report["problems"] == [] and report["tensors"] == 2
    assert report["verified_bytes"] == report["bytes"] > 0
    assert report["coverage"][0]["sidecar"] == "crc32c"
    f = next(ckpt.glob("__0_*.distcp"))
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 1
    f.write_bytes(bytes(data))
    report = shardpoint.verify(ckpt)
    assert not report["ok"] and report["problems"]
    assert report["problems"][0]["file"] == f.name and f.name in report["problems"][0]["message"]
    assert shardpoint.verify(ckpt, quick=True)["coverage"][0]["quick"]


def test_verify_missing_checkpoint_raises(tmp_path):
    with pytest.raises(shardpoint.NotFoundError):
        shardpoint.verify(tmp_path / "nope")


def test_consolidate_dcp_layout_loads_with_torch(ckpt, tmp_path):
    out = tmp_path / "model.pt"
    report = shardpoint.consolidate(ckpt, out, layout="dcp")
    assert report["output"] == str(out) and report["tensors"] == 2
    sd = torch.load(out, weights_only=False)
    want = state()
    assert torch.equal(sd["model"]["w"], want["model"]["w"]) and sd["epoch"] == 2


def test_reshard_then_load(ckpt, tmp_path):
    dst = tmp_path / "three"
    report = shardpoint.reshard(ckpt, dst, 3)
    assert report["source_format"] == "dcp" and report["tensors"] == 2
    assert sorted(p.name for p in dst.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp", "__2_0.distcp"]
    target = {"model": {"w": torch.zeros(33, 8), "b": torch.zeros(8)}, "epoch": 0}
    dcp.load(target, storage_reader=StorageReader(dst))
    assert torch.equal(target["model"]["w"], state()["model"]["w"])


def test_errors_carry_the_engine_message(tmp_path):
    (tmp_path / "not-a-ckpt").mkdir()
    with pytest.raises(shardpoint.PlanError) as info:
        shardpoint.consolidate(tmp_path / "not-a-ckpt")
    assert "not-a-ckpt" in str(info.value)


def test_engine_reads_what_this_pytorch_wrote(tmp_path):
    """The engine decodes the `.metadata` this PyTorch pickles (newer ones add fields, such as
    the tensors' strides) for inspect, verify and consolidate."""
    path = tmp_path / "theirs"
    dcp.save(state(), storage_writer=dcp.FileSystemWriter(path))
    info = shardpoint.inspect(path)
    assert info["tensors"]["model.w"]["shape"] == [33, 8] and info["checksums"] is None
    report = shardpoint.verify(path)
    assert report["ok"] and report["coverage"][0]["sidecar"] is None
    assert report["coverage"][0]["zip_crc32_bytes"] > 0  # PyTorch's own CRC-32s were checked
    out = tmp_path / "theirs.pt"
    report = shardpoint.consolidate(path, out, layout="dcp")
    assert torch.equal(torch.load(out, weights_only=False)["model"]["w"], state()["model"]["w"])
    # Every tensor record was read whole, so each one's CRC-32 was checked.
    assert report["zip_crc"]["records_checked"] >= 2 and report["zip_crc"]["records_partial"] == 0
    assert report["zip_crc"]["bytes_checked"] >= (33 * 8 + 8) * 4
    unchecked = shardpoint.consolidate(path, tmp_path / "unchecked.pt", layout="dcp", check_zip_crc=False)
    assert unchecked["zip_crc"]["records_checked"] == 0


def test_reshard_reports_the_zip_crc_checks(tmp_path):
    """A PyTorch-written checkpoint has no sidecar: reshard checks the zip CRC-32 of every
    record it reads whole and says so in its report."""
    path = tmp_path / "theirs"
    dcp.save(state(), storage_writer=dcp.FileSystemWriter(path))
    report = shardpoint.reshard(path, tmp_path / "two", 2)
    assert report["zip_crc"]["records_checked"] >= 2
    assert report["zip_crc"]["bytes_checked"] >= (33 * 8 + 8) * 4
    off = shardpoint.reshard(path, tmp_path / "two-unchecked", 2, check_zip_crc=False)
    assert off["zip_crc"] == {"records_checked": 0, "bytes_checked": 0, "records_no_checksum": 0,
                              "records_partial": 0}


def test_our_save_has_a_load_index(ckpt):
    assert (ckpt / ".shardpoint-index").exists()
