"""Lightning's checkpoint-folder rules come from the engine (engine/checkpoint_files.h,
through the C API): the commit rule, the listing of committed checkpoints, removal that
uncommits first, and the staging folder a replacing save writes first. The package keeps
no copy of them."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from shardpoint import _native, errors, lightning


def _checkpoint(path: Path, *, meta: bool = True) -> Path:
    path.mkdir(parents=True)
    (path / ".metadata").write_bytes(b"m")
    (path / "__0_0.distcp").write_bytes(b"d")
    if meta:
        (path / "meta.pt").write_bytes(b"p")
    return path


def test_committed_means_metadata_and_meta_pt(tmp_path: Path) -> None:
    assert lightning.is_committed(_checkpoint(tmp_path / "a"))
    assert not lightning.is_committed(_checkpoint(tmp_path / "b", meta=False))
    assert not lightning.is_committed(tmp_path / "absent")
    assert lightning.is_committed(f"file://{tmp_path / 'a'}")


def test_committed_checkpoints_oldest_first(tmp_path: Path) -> None:
    newer = _checkpoint(tmp_path / "epoch=1-step=20.ckpt")
    older = _checkpoint(tmp_path / "epoch=0-step=3.ckpt")
    nostep = _checkpoint(tmp_path / "last.ckpt")
    _checkpoint(tmp_path / "epoch=2-step=30.ckpt", meta=False)  # not committed
    later = time.time() + 10
    os.utime(nostep / "meta.pt", (later, later))
    assert lightning.find_committed_checkpoints(tmp_path) == [str(nostep), str(older), str(newer)]
    assert lightning.find_committed_checkpoints(tmp_path / "absent") == []
    with pytest.raises(errors.UsageError, match="local folder"):
        lightning.find_committed_checkpoints("s3://bucket/checkpoints")


def test_remove_uncommits_first_and_takes_files_too(tmp_path: Path) -> None:
    from shardpoint._lightning_files import _remove

    folder = _checkpoint(tmp_path / "epoch=0-step=3.ckpt")
    _remove(folder)
    assert not folder.exists()
    single = tmp_path / "full.ckpt"
    single.write_bytes(b"x")
    _remove(single)
    assert not single.exists()
    _remove(tmp_path / "absent")  # nothing there: not an error


def test_staging_folder_and_leftovers(tmp_path: Path) -> None:
    target = tmp_path / "last.ckpt"
    staging = _native.staging_folder(str(target), "0123456789abcdef-and-more")
    assert staging == str(tmp_path / ".last.ckpt.sp-replace-0123456789abcdef")
    Path(staging).mkdir()
    (tmp_path / ".other.ckpt.sp-replace-save").mkdir()
    assert _native.remove_stale_staging(str(target)) == 1
    assert not Path(staging).exists() and (tmp_path / ".other.ckpt.sp-replace-save").exists()
    with pytest.raises(errors.UsageError):
        _native.staging_folder("s3://bucket/last.ckpt", "save")
