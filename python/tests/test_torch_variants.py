"""Checkpoint variants newer PyTorch writes, read and written against the real thing (the
venv's newest PyTorch; PyTorch 2.6 has neither): items compressed by PyTorch's ZStandard
extension ("stream.zstd/1") and per-rank metadata (dcp.save(..., use_collectives=False)).
Every checkpoint is written by 2 gloo ranks (variants_worker.py); values are compared with
what PyTorch wrote uncompressed and collectively (inspect --hash) and loaded bit for bit on
3 ranks (2 -> 3 resharding), through shardpoint's StorageReader and PyTorch's reader."""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

import shardpoint
from conftest import REPO, run_ranks

pytest.importorskip("torch.distributed.checkpoint._extension", reason="PyTorch < 2.7: no stream transforms")
zstandard = pytest.importorskip("zstandard", reason="PyTorch's ZStandard extension needs zstandard")

WORKER = "variants_worker.py"
NEWEST = [sys.executable]


# The C++ build's command line tool (scripts/test-python.sh passes its build folder).
TOOL = Path(os.environ.get("SHARDPOINT_BUILD_DIR", REPO / "build")) / "src" / "cli" / "shardpoint"


def hashes(path) -> dict:
    """`shardpoint inspect --json --hash`: every tensor's dtype, shape and sha256 of its
    values, and the objects' reprs."""
    if not TOOL.exists():
        pytest.fail(f"{TOOL} is missing: build the shardpoint target first")
    r = subprocess.run([str(TOOL), "inspect", "--json", "--hash", str(path)], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    assert r.returncode == 0, r.stdout
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict:
    """The state saved on 2 ranks by PyTorch: plain, zstd, and per rank (no collectives)."""
    root = tmp_path_factory.mktemp("variants")
    out = {}
    for name, flags in {"plain": [], "zstd": ["--zstd"], "per_rank": ["--no-collectives"]}.items():
        out[name] = root / name
        run_ranks(NEWEST, 2, [WORKER, "save", str(out[name]), "--writer", "torch", *flags])
    return out


def test_pytorch_layouts_are_what_the_readers_expect(saved):
    md = dcp.FileSystemReader(str(saved["zstd"])).read_metadata()
    assert {tuple(info.transform_descriptors) for info in md.storage_data.values()} == {("stream.zstd/1",)}
    info = shardpoint.inspect(saved["zstd"])
    assert info.tensors["model.big.weight"].chunks[0].transform_descriptors == ("stream.zstd/1",)
    assert info.objects["extra.epoch"].transform_descriptors == ("stream.zstd/1",)
    names = sorted(p.name for p in saved["per_rank"].iterdir())
    assert names == ["__0.metadata", "__0_0.distcp", "__1.metadata", "__1_0.distcp"]


@pytest.mark.parametrize("variant", ["zstd", "per_rank"])
def test_shardpoint_reads_pytorch_variants_with_pytorch_values(saved, variant, tmp_path):
    want = hashes(saved["plain"])
    assert hashes(saved[variant]) == want
    report = shardpoint.verify(saved[variant])
    assert report.ok and report.problems == () and report.tensors == len(want["tensors"])
    # 2 -> 3 ranks through shardpoint's StorageReader.
    run_ranks(NEWEST, 3, [WORKER, "load", str(saved[variant]), "--reader", "ours"])
    # reshard to 3 ranks: same values, and PyTorch loads the result on 3 ranks.
    out = tmp_path / "r3"
    shardpoint.reshard(saved[variant], out, ranks=3)
    assert hashes(out) == want
    run_ranks(NEWEST, 3, [WORKER, "load", str(out), "--reader", "torch"])
    # ... and compressed again: PyTorch's reader undoes shardpoint's zstd on 2 ranks.
    out_zstd = tmp_path / "r3-zstd"
    shardpoint.reshard(saved[variant], out_zstd, ranks=3, compression="zstd")
    md = dcp.FileSystemReader(str(out_zstd)).read_metadata()
    assert {tuple(i.transform_descriptors) for i in md.storage_data.values()} == {("stream.zstd/1",)}
    assert hashes(out_zstd) == want
    run_ranks(NEWEST, 2, [WORKER, "load", str(out_zstd), "--reader", "torch"])


@pytest.mark.parametrize("variant", ["zstd", "per_rank"])
def test_consolidate_equals_pytorch_consolidation(saved, variant, tmp_path):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    ours, theirs = tmp_path / "ours.pt", tmp_path / "theirs.pt"
    shardpoint.consolidate(saved[variant], ours, layout="dcp")
    dcp_to_torch_save(str(saved["plain"]), str(theirs))
    a, b = torch.load(ours, weights_only=False), torch.load(theirs, weights_only=False)
    # A per-rank checkpoint lists its keys in rank 0's order, not the collective save's.
    assert_same(a, b, "", ordered=variant != "per_rank")
    if variant == "per_rank":
        with open(saved[variant] / "__0.metadata", "rb") as f:
            rank0 = list(pickle.load(f).state_dict_metadata)
        assert [k for k, _ in flatten(a, "")] == [k for k in rank0 if k in dict(flatten(a, ""))]
    st = tmp_path / "model.safetensors"
    shardpoint.consolidate(saved[variant], st, layout="dcp", format="safetensors")
    from safetensors.torch import load_file

    tensors = load_file(str(st))
    flat = dict(flatten(b, ""))
    assert tensors and all(torch.equal(t, flat[k]) for k, t in tensors.items())


def assert_same(a, b, where: str, ordered: bool = True) -> None:
    """Same structure, key order (when ordered), types, dtypes and values."""
    assert type(a) is type(b), where
    if isinstance(b, dict):
        assert (list(a) if ordered else sorted(a)) == (list(b) if ordered else sorted(b)), where
        for key in b:
            assert_same(a[key], b[key], f"{where}.{key}", ordered)
    elif isinstance(b, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]", ordered)
    elif isinstance(b, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), where
    else:
        assert a == b, where


def flatten(value, prefix: str):
    """(dotted key, tensor) of every tensor in nested dicts."""
    if isinstance(value, dict):
        for key, v in value.items():
            yield from flatten(v, f"{prefix}.{key}" if prefix else key)
    elif isinstance(value, torch.Tensor):
        yield prefix, value


def test_pytorch_reads_shardpoint_zstd(tmp_path):
    path = tmp_path / "ours-zstd"
    run_ranks(NEWEST, 2, [WORKER, "save", str(path), "--writer", "ours", "--zstd"])
    md = dcp.FileSystemReader(str(path)).read_metadata()
    assert {tuple(info.transform_descriptors) for info in md.storage_data.values()} == {("stream.zstd/1",)}
    run_ranks(NEWEST, 3, [WORKER, "load", str(path), "--reader", "torch"])
    run_ranks(NEWEST, 3, [WORKER, "load", str(path), "--reader", "ours"])
    assert shardpoint.verify(path).ok


@pytest.mark.parametrize("gone", ["__1.metadata", "__0.metadata"])
def test_missing_rank_metadata_is_one_error_naming_it(saved, tmp_path, gone):
    """A rank's metadata lost, its data file left (rank 0's too): every tool names the file."""
    path = tmp_path / "per_rank"
    shutil.copytree(saved["per_rank"], path)
    (path / gone).unlink()
    with pytest.raises(shardpoint.FormatError) as e:
        shardpoint.inspect(path)
    message = str(e.value)
    assert gone in message and "missing" in message and "\n" not in message
    report = shardpoint.verify(path)
    assert not report.ok and len(report.problems) == 1 and gone in report.problems[0].message
    with pytest.raises(shardpoint.FormatError, match=gone.replace(".", r"\.")):
        shardpoint.consolidate(path, tmp_path / "out.pt", layout="dcp")


# -- damaged zstd items -------------------------------------------------------------------


def _rewrite_item(src: Path, dst: Path, fqn: str, change) -> None:
    """Copies src to dst with the zstd item `fqn` (its first chunk) replaced by
    change(stored bytes) -> new stored bytes, appended at the end of its file; .metadata is
    rewritten to point at it (as a writer would have recorded it)."""
    shutil.copytree(src, dst)
    with open(dst / ".metadata", "rb") as f:
        md = pickle.load(f)
    index = next(i for i in md.storage_data if i.fqn == fqn)
    info = md.storage_data[index]
    data_file = dst / info.relative_path
    stored = data_file.read_bytes()[info.offset : info.offset + info.length]
    new = change(stored)
    with open(data_file, "ab") as f:
        offset = f.tell()
        f.write(new)
    info.offset, info.length = offset, len(new)
    with open(dst / ".metadata", "wb") as f:
        pickle.dump(md, f)


def _decompressed(stored: bytes) -> bytes:
    return zstandard.ZstdDecompressor().stream_reader(io.BytesIO(stored)).read()


DAMAGES = {
    "truncated": lambda b: b[: len(b) // 2],
    "garbage": lambda b: b[:8] + bytes(range(256)) * 4 + b[8 + 1024 :],
    "not zstd": lambda b: b"\x00" * len(b),
    "trailing frame": lambda b: b + zstandard.ZstdCompressor().compress(b"more"),
    "fewer bytes": lambda b: zstandard.ZstdCompressor().compress(_decompressed(b)[:-100]),
    "more bytes": lambda b: zstandard.ZstdCompressor().compress(_decompressed(b) + b"\x00" * 100),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
@pytest.mark.parametrize("fqn", ["model.big.weight", "model.scale", "extra.epoch"])
def test_damaged_zstd_items_are_refused_with_one_line(saved, tmp_path, damage, fqn):
    path = tmp_path / "damaged"
    _rewrite_item(saved["zstd"], path, fqn, DAMAGES[damage])
    report = shardpoint.verify(path)
    assert not report.ok, report
    problems = [p for p in report.problems if p.item.startswith(fqn)]
    assert problems, report.problems
    for p in problems:
        assert "\n" not in p.message and fqn in p.message, p
    # A load of the item fails with one line too.
    with pytest.raises(shardpoint.ShardpointError) as e:
        shardpoint.consolidate(path, tmp_path / "out.pt", layout="dcp")
    assert "\n" not in str(e.value) and fqn in str(e.value)


def test_unknown_transform_is_refused_by_name(saved, tmp_path):
    path = tmp_path / "unknown"
    shutil.copytree(saved["zstd"], path)
    with open(path / ".metadata", "rb") as f:
        md = pickle.load(f)
    for info in md.storage_data.values():
        info.transform_descriptors = ["stream.lz4/1"]
    with open(path / ".metadata", "wb") as f:
        pickle.dump(md, f)
    with pytest.raises(shardpoint.ShardpointError) as e:
        shardpoint.consolidate(path, tmp_path / "out.pt", layout="dcp")
    assert 'unknown stream transform "stream.lz4/1"' in str(e.value) and "\n" not in str(e.value)
