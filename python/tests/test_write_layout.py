"""StorageWriter.write_data's native item array, kept while DCP hands it the same cached plan,
and the written-item records its results carry to the commit: in this process (dcp.save with
no_dist)."""

from __future__ import annotations

import inspect
import pickle

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultSavePlanner

import shardpoint
from shardpoint import _native
from shardpoint.torch import StorageReader, StorageWriter

CACHING = "enable_plan_caching" in inspect.signature(DefaultSavePlanner.__init__).parameters


def _state(scale: float):
    return {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4) * scale, "b": torch.ones(5, dtype=torch.int64),
            "step": 3}


@pytest.mark.skipif(not CACHING, reason="plan caching needs PyTorch 2.7+")
def test_a_cached_plan_reuses_the_item_array_and_each_save_writes_its_own_values(tmp_path):
    planner_class = type("LayoutTestPlanner", (DefaultSavePlanner,), {})  # its own plan cache
    writer = StorageWriter(tmp_path / "a")
    layouts = []
    for n, scale in enumerate((1.0, 2.0)):
        dcp.save(_state(scale), storage_writer=writer, checkpoint_id=tmp_path / f"c{n}", no_dist=True,
                 planner=planner_class(enable_plan_caching=True))
        layouts.append(writer._layout)
    assert layouts[0] is layouts[1]  # the second save got the cached plan: the array was kept
    for n, scale in enumerate((1.0, 2.0)):
        loaded = {"w": torch.zeros(3, 4), "b": torch.zeros(5, dtype=torch.int64), "step": 0}
        dcp.load(loaded, storage_reader=StorageReader(tmp_path / f"c{n}"), no_dist=True)
        assert torch.equal(loaded["w"], _state(scale)["w"]) and loaded["step"] == 3


def test_a_new_plan_rebuilds_the_item_array(tmp_path):
    writer = StorageWriter(tmp_path / "a")
    dcp.save(_state(1.0), storage_writer=writer, checkpoint_id=tmp_path / "c0", no_dist=True)
    first = writer._layout
    dcp.save({"x": torch.ones(2)}, storage_writer=writer, checkpoint_id=tmp_path / "c1", no_dist=True)
    assert writer._layout is not first and [i.index.fqn for i in writer._layout.items] == ["x"]
    loaded = {"x": torch.zeros(2)}
    dcp.load(loaded, storage_reader=StorageReader(tmp_path / "c1"), no_dist=True)
    assert torch.equal(loaded["x"], torch.ones(2))


class _GatheringWriter(StorageWriter):
    """Hands finish what DCP's gather would: every rank's results pickled and unpickled."""

    gathered: list = []

    def finish(self, metadata, results):
        results = pickle.loads(pickle.dumps(results))
        type(self).gathered = [wr for rank in results for wr in rank]
        super().finish(metadata, results)


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_written_records_cross_the_gather_as_plain_values_and_commit(tmp_path, compression):
    """A rank's records (sp_write_items' structs as typed tuples) ride on its first
    WriteResult through pickle, and the coordinator's commit from them writes a sidecar that
    covers every byte."""
    path = tmp_path / "ckpt"
    dcp.save(_state(1.0), storage_writer=_GatheringWriter(path, compression=compression), no_dist=True)
    records = [r for wr in _GatheringWriter.gathered for r in getattr(wr, "records", ())]
    assert sum(1 for wr in _GatheringWriter.gathered if getattr(wr, "records", ())) == 1  # the rank's first
    by_fqn = {r.fqn: r for r in records}
    assert set(by_fqn) == {"w", "b", "step"}
    assert all(isinstance(r, _native.WrittenItem) for r in records)
    w, step = by_fqn["w"], by_fqn["step"]
    assert w.offsets == (0, 0) and len(w.blocks) == 1 and w.checksum != 0
    assert (w.data_offset is None) == (compression is not None)  # a zstd frame has no data record to point at
    assert step.offsets is None and step.data_offset is None
    descriptors = ("stream.zstd/1",) if compression else ()
    assert {r.transform_descriptors for r in records} == {descriptors}
    info = {wr.index.fqn: wr.storage_data for wr in _GatheringWriter.gathered}
    assert (info["w"].relative_path, info["w"].offset, info["w"].length) == (w.file, w.offset, w.length)
    report = shardpoint.verify(path)
    assert report.ok and report.coverage[0].sidecar == "crc32c" and report.verified_bytes == report.bytes > 0
    loaded = {"w": torch.zeros(3, 4), "b": torch.zeros(5, dtype=torch.int64), "step": 0}
    dcp.load(loaded, storage_reader=StorageReader(path), no_dist=True)
    assert torch.equal(loaded["w"], _state(1.0)["w"]) and loaded["step"] == 3
