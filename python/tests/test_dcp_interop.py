"""dcp.save / dcp.async_save / dcp.load through shardpoint's StorageWriter/StorageReader on
gloo with real processes, against PyTorch's FileSystemWriter/Reader, on PyTorch 2.6 and the
newest PyTorch: every pair of writer and reader, resharding 4 -> 3 and 2 -> 4."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_ranks

WORKER = "dcp_worker.py"


@pytest.fixture(scope="module")
def saved_on_4(interpreter, tmp_path_factory) -> dict:
    """One checkpoint of the worker's state saved on 4 ranks by each writer."""
    out = {}
    for writer in ("ours", "torch"):
        path = str(tmp_path_factory.mktemp(f"saved-by-{writer}") / "ckpt")
        run_ranks(interpreter, 4, [WORKER, "save", path, "--writer", writer])
        out[writer] = path
    return out


def test_files_are_pytorch_layout_plus_ours(saved_on_4):
    for writer, path in saved_on_4.items():
        files = sorted(p.name for p in Path(path).iterdir())
        assert ".metadata" in files
        assert {f"__{r}_0.distcp" for r in range(4)} <= set(files)
        if writer == "ours":
            # What shardpoint adds beside PyTorch's files.
            assert ".shardpoint-checksums.json" in files and ".shardpoint-index" in files
            sidecar = json.loads((Path(path) / ".shardpoint-checksums.json").read_text())
            assert sidecar["algorithm"] == "crc32c" and sidecar["items"]


@pytest.mark.parametrize("writer,reader", [("ours", "ours"), ("ours", "torch"), ("torch", "ours")])
def test_save_4_load_3(interpreter, saved_on_4, writer, reader):
    run_ranks(interpreter, 3, [WORKER, "load", saved_on_4[writer], "--reader", reader])


def test_async_save_then_load_on_more_ranks(interpreter, tmp_path):
    path = str(tmp_path / "ckpt")
    run_ranks(interpreter, 2, [WORKER, "save", path, "--async"])
    assert (Path(path) / ".metadata").exists()
    run_ranks(interpreter, 4, [WORKER, "load", path])


def test_async_saves_reuse_the_host_copy_and_hold_each_saves_values(interpreter, tmp_path):
    path = str(tmp_path / "ckpt")
    run_ranks(interpreter, 2, [WORKER, "async-twice", path])
    run_ranks(interpreter, 3, [WORKER, "load", path])


def test_failed_save_commits_nothing(interpreter, tmp_path):
    path = tmp_path / "ckpt"
    results = run_ranks(interpreter, 2, [WORKER, "fail-save", str(path)], expect_ok=False)
    assert all(r.returncode != 0 for r in results), [r.stdout[-2000:] for r in results]
    if "oracle-python" not in interpreter[0]:
        # Every rank gets the failing rank's exception. PyTorch 2.6 on CPython 3.13 cannot
        # send it (DCP pickles a traceback.StackSummary, whose frames hold code objects on
        # 3.13: "cannot pickle code objects"); the ranks still all fail.
        assert all("injected failure on rank 1" in r.stdout for r in results)
    assert not (path / ".metadata").exists()


def test_failed_resave_leaves_the_previous_checkpoint_loadable(interpreter, tmp_path):
    path = tmp_path / "last.ckpt"
    run_ranks(interpreter, 2, [WORKER, "save", str(path)])
    run_ranks(interpreter, 2, [WORKER, "fail-save", str(path)], expect_ok=False)
    staging = [p.name for p in tmp_path.iterdir() if p.name.startswith(".last.ckpt.sp-replace-")]
    assert staging, "the failed save wrote beside the checkpoint, not into it"
    run_ranks(interpreter, 3, [WORKER, "load", str(path)])
    # A successful save replaces the checkpoint and removes what the failed one left.
    run_ranks(interpreter, 2, [WORKER, "save", str(path), "--thread-count", "1"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]
    assert sorted(p.name for p in path.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    run_ranks(interpreter, 4, [WORKER, "load", str(path)])


@pytest.mark.parametrize("world,mode", [(2, "sync"), (2, "async"), (4, "sync"), (4, "async")])
def test_plan_caching_never_rewrites_a_committed_checkpoint(interpreter, tmp_path, world, mode):
    """A training loop with DCP's plan caching on (where the PyTorch has it): saves into a new
    folder each, then into one folder removed before each; every checkpoint, read by
    PyTorch's reader and ours, holds its own save's values."""
    args = [WORKER, "cached-saves", str(tmp_path), "--saves", "3"] + (["--async"] if mode == "async" else [])
    results = run_ranks(interpreter, world, args)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s0", "s1", "s2", "same"]
    if "oracle-python" not in interpreter[0]:
        assert all("plan caching on" in r.stdout for r in results)
