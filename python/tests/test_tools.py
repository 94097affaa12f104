"""shardpoint.consolidate / reshard / verify / inspect on checkpoints the DCP writer made."""

from __future__ import annotations

import dataclasses
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
    assert isinstance(info, shardpoint.InspectResult) and info.format == "dcp"
    w = info.tensors["model.w"]
    assert w.shape == (33, 8) and w.dtype == "float32"
    assert [(c.offsets, c.sizes) for c in w.chunks] == [((0, 0), (33, 8))]
    assert w.chunks[0].file in info.files and w.chunks[0].length > 33 * 8 * 4
    assert w.chunks[0].transform_descriptors == ()
    assert list(info.tensors) == ["model.b", "model.w"]
    epoch = info.objects["epoch"]
    assert epoch.file in info.files and epoch.length > 0
    assert info.files == tuple(sorted(p.name for p in ckpt.glob("*.distcp")))
    assert info.sidecar == "crc32c"
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.sidecar = None  # type: ignore[misc]
    with pytest.raises(shardpoint.NotFoundError):
        shardpoint.inspect(ckpt.parent / "nope")


def test_verify_clean_and_damaged(ckpt):
    report = shardpoint.verify(ckpt)
    assert report.ok and report.problems == () and report.tensors == 2
    assert report.verified_bytes == report.bytes > 0
    assert report.coverage[0].sidecar == "crc32c"
    f = next(ckpt.glob("__0_*.distcp"))
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 1
    f.write_bytes(bytes(data))
    report = shardpoint.verify(ckpt)
    assert not report.ok and report.problems
    assert report.problems[0].file == f.name and f.name in report.problems[0].message
    assert shardpoint.verify(ckpt, quick=True).coverage[0].quick


def test_verify_missing_checkpoint_raises(tmp_path):
    with pytest.raises(shardpoint.NotFoundError):
        shardpoint.verify(tmp_path / "nope")


def test_consolidate_dcp_layout_loads_with_torch(ckpt, tmp_path):
    out = tmp_path / "model.pt"
    report = shardpoint.consolidate(ckpt, out, layout="dcp")
    assert report.output == str(out) and report.tensors == 2
    sd = torch.load(out, weights_only=False)
    want = state()
    assert torch.equal(sd["model"]["w"], want["model"]["w"]) and sd["epoch"] == 2


def test_reshard_then_load(ckpt, tmp_path):
    dst = tmp_path / "three"
    report = shardpoint.reshard(ckpt, dst, 3)
    assert report.source_format == "dcp" and report.tensors == 2
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
    assert info.tensors["model.w"].shape == (33, 8) and info.sidecar is None
    report = shardpoint.verify(path)
    assert report.ok and report.coverage[0].sidecar is None
    assert report.coverage[0].zip_crc32_bytes > 0  # PyTorch's own CRC-32s were checked
    out = tmp_path / "theirs.pt"
    report = shardpoint.consolidate(path, out, layout="dcp")
    assert torch.equal(torch.load(out, weights_only=False)["model"]["w"], state()["model"]["w"])
    # Every tensor record was read whole, so each one's CRC-32 was checked.
    assert report.zip_crc.records_checked >= 2 and report.zip_crc.records_partial == 0
    assert report.zip_crc.bytes_checked >= (33 * 8 + 8) * 4
    unchecked = shardpoint.consolidate(path, tmp_path / "unchecked.pt", layout="dcp", check_zip_crc=False)
    assert unchecked.zip_crc.records_checked == 0


def test_reshard_reports_the_zip_crc_checks(tmp_path):
    """A PyTorch-written checkpoint has no sidecar: reshard checks the zip CRC-32 of every
    record it reads whole and says so in its report."""
    path = tmp_path / "theirs"
    dcp.save(state(), storage_writer=dcp.FileSystemWriter(path))
    report = shardpoint.reshard(path, tmp_path / "two", 2)
    assert report.zip_crc.records_checked >= 2
    assert report.zip_crc.bytes_checked >= (33 * 8 + 8) * 4
    off = shardpoint.reshard(path, tmp_path / "two-unchecked", 2, check_zip_crc=False)
    assert off.zip_crc == shardpoint.ZipCrcCounts(records_checked=0, bytes_checked=0, records_no_checksum=0,
                                                  records_partial=0)


def test_our_save_has_a_load_index(ckpt):
    assert (ckpt / ".shardpoint-index").exists()


def test_results_are_frozen_typed_dataclasses(ckpt, tmp_path):
    import dataclasses

    report = shardpoint.verify(ckpt)
    assert isinstance(report, shardpoint.VerifyResult) and dataclasses.is_dataclass(report)
    assert isinstance(report.coverage[0], shardpoint.VerifyCoverage) and report.coverage[0].format == "dcp"
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.ok = False  # type: ignore[misc]
    resharded = shardpoint.reshard(ckpt, tmp_path / "r", 2, checksum="xxh3", memory_budget_bytes=1 << 20)
    assert isinstance(resharded, shardpoint.ReshardResult) and isinstance(resharded.zip_crc, shardpoint.ZipCrcCounts)
    assert shardpoint.verify(tmp_path / "r").coverage[0].sidecar == "xxh3"
    out = shardpoint.consolidate(ckpt, tmp_path / "m.pt", layout="dcp", memory_budget_bytes=1 << 20)
    assert isinstance(out, shardpoint.ConsolidateResult) and isinstance(out.seconds, float)


def test_unknown_option_names_are_usage_errors_naming_the_accepted_ones(ckpt, tmp_path):
    with pytest.raises(shardpoint.UsageError, match="trainer, fabric, dcp"):
        shardpoint.consolidate(ckpt, tmp_path / "x.pt", layout="nope")  # type: ignore[arg-type]
    with pytest.raises(shardpoint.UsageError, match="torch, safetensors, hf-safetensors"):
        shardpoint.consolidate(ckpt, tmp_path / "x.pt", format="onnx")  # type: ignore[arg-type]
    with pytest.raises(shardpoint.UsageError, match="crc32c"):
        shardpoint.reshard(ckpt, tmp_path / "y", 2, checksum="md5")  # type: ignore[arg-type]
    with pytest.raises(shardpoint.UsageError, match="zstd"):
        shardpoint.reshard(ckpt, tmp_path / "y", 2, compression="lz4")  # type: ignore[arg-type]
    with pytest.raises(shardpoint.UsageError, match="crc32c"):
        StorageWriter(tmp_path / "z", checksum="md5")


def test_writer_splits_items_by_the_engines_rule(tmp_path):
    """thread_count files per rank, items split as the engine's own save splits them
    (sp_split_into_files): bytes items and tensors under 64 KiB in the first file, the other
    tensors largest first onto the lightest file; no empty file is written."""
    g = torch.Generator().manual_seed(5)
    sizes = {"t0": 256, "t1": 512, "b0": 20000, "b1": 30000, "b2": 40000, "b3": 17000}  # float32 elements
    sd = {name: torch.randn(n, generator=g) for name, n in sizes.items()}
    sd["epoch"] = 3
    path = tmp_path / "split"
    dcp.save(sd, storage_writer=StorageWriter(path, thread_count=3))
    files = sorted(p.name for p in path.glob("*.distcp"))
    assert files == ["__0_0.distcp", "__0_1.distcp", "__0_2.distcp"]
    md = StorageReader(path).read_metadata()
    where = {index.fqn: info.relative_path for index, info in md.storage_data.items()}
    # Small: t0, t1 (3 KiB), epoch -> 0. Then b2 (160 kB) -> 1, b1 (120 kB) -> 2, b0 (80 kB)
    # -> 0 (3 KiB so far), b3 (68 kB) -> 0 (83 kB, the lightest).
    assert where == {"t0": "__0_0.distcp", "t1": "__0_0.distcp", "epoch": "__0_0.distcp", "b2": "__0_1.distcp",
                     "b1": "__0_2.distcp", "b0": "__0_0.distcp", "b3": "__0_0.distcp"}
    back = {k: torch.empty_like(v) for k, v in sd.items() if isinstance(v, torch.Tensor)}
    back["epoch"] = 0
    dcp.load(back, storage_reader=StorageReader(path))
    assert all(torch.equal(back[k], sd[k]) for k in back if k != "epoch") and back["epoch"] == 3
    for name, state in {"one": {"t": torch.ones(2)}, "small": {"t0": sd["t0"], "t1": sd["t1"], "epoch": 3}}.items():
        dcp.save(state, storage_writer=StorageWriter(tmp_path / name, thread_count=4))
        assert sorted(p.name for p in (tmp_path / name).glob("*.distcp")) == ["__0_0.distcp"]


def test_options_left_none_take_the_engines_defaults(ckpt, tmp_path):
    """No default is restated in Python: None is the engine's (the *_init structs)."""
    writer = StorageWriter(tmp_path / "w")
    assert writer.thread_count == 1 and writer.sync_files is True
    assert writer._options.checksum_block_bytes == 1 << 20 and writer._options.compression_threads == 0
    reader = StorageReader(ckpt)
    assert reader.thread_count == 4 and reader.verify_checksums and reader.check_zip_crc
    assert StorageReader(ckpt, verify_checksums=False, thread_count=2).thread_count == 2
    with pytest.raises(shardpoint.UsageError):
        StorageWriter(tmp_path / "w", thread_count=0)


def test_reshard_takes_the_compression_options(ckpt, tmp_path):
    report = shardpoint.reshard(ckpt, tmp_path / "z", 2, compression="zstd", compression_level=5,
                                compression_threads=1)
    assert report.tensors == 2
    chunks = shardpoint.inspect(tmp_path / "z").tensors["model.w"].chunks
    assert len(chunks) == 2 and all(c.transform_descriptors == ("stream.zstd/1",) for c in chunks)
    with pytest.raises(shardpoint.UsageError):
        shardpoint.reshard(ckpt, tmp_path / "bad", 2, compression_threads=-1)
