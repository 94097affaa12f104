"""dcp.save / dcp.async_save / dcp.load through shardpoint's StorageWriter/StorageReader on
gloo with real processes, against PyTorch's FileSystemWriter/Reader, on PyTorch 2.6 and the
newest PyTorch: every pair of writer and reader, resharding 4 -> 3 and 2 -> 4."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_ranks

WORKER = "dcp_worker.py"


@pytest.mark.parametrize(
    "writer,reader",
    [("ours", "ours"), ("ours", "torch"), ("torch", "ours")],
)
def test_save_4_load_3(interpreter, tmp_path, writer, reader):
    path = str(tmp_path / "ckpt")
    run_ranks(interpreter, 4, [WORKER, "save", path, "--writer", writer])
    files = sorted(p.name for p in Path(path).iterdir())
    assert ".metadata" in files
    assert {f"__{r}_0.distcp" for r in range(4)} <= set(files)
    if writer == "ours":
        # What shardpoint adds beside PyTorch's files.
        assert ".shardpoint-checksums.json" in files and ".shardpoint-index" in files
        sidecar = json.loads((Path(path) / ".shardpoint-checksums.json").read_text())
        assert sidecar["algorithm"] == "crc32c" and sidecar["items"]
    run_ranks(interpreter, 3, [WORKER, "load", path, "--reader", reader])


def test_async_save_then_load_on_more_ranks(interpreter, tmp_path):
    path = str(tmp_path / "ckpt")
    run_ranks(interpreter, 2, [WORKER, "save", path, "--async"])
    assert (Path(path) / ".metadata").exists()
    run_ranks(interpreter, 4, [WORKER, "load", path])


def test_failed_save_commits_nothing(interpreter, tmp_path):
    path = tmp_path / "ckpt"
    results = run_ranks(interpreter, 2, [WORKER, "fail-save", str(path)], expect_ok=False)
    assert all(r.returncode != 0 for r in results), [r.stdout[-2000:] for r in results]
    assert any("injected failure on rank 1" in r.stdout for r in results)
    assert not (path / ".metadata").exists()
