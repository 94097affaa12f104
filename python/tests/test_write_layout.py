"""StorageWriter.write_data's native item array, kept while DCP hands it the same cached plan:
in this process (dcp.save with no_dist), two saves through one writer."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultSavePlanner

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
