"""shardpoint.lightning with the real Lightning 2.6 Trainer: FSDP on CPU over gloo, real
processes (lightning_worker.py, one per rank), the tiny-wikitext corpus through Lightning's
own WikiText2 demo dataset.

- checkpoints Lightning's stock strategy writes resume in shardpoint's at another world size,
  and the reverse (global step, loops, model and optimizer state, the loss on a fixed batch);
- shardpoint.consolidate (and the CLI when built) equals Lightning's consolidate_checkpoint;
- async saves, the "last" fallback, full state dicts on CPU, CheckpointIO, object stores.
"""

from __future__ import annotations

import io
import json
import shutil
import struct
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path

import pytest
import torch

import servers
from conftest import REPO, run_ranks, worker_env

pytest.importorskip("lightning")

import shardpoint  # noqa: E402
from shardpoint import lightning as splightning  # noqa: E402

WORKER = "lightning_worker.py"
NEWEST = [sys.executable]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """WikiText2's folder layout (``wikitext-2.txt``) holding the repository's corpus."""
    d = tmp_path_factory.mktemp("wikitext")
    shutil.copy(REPO / "data" / "tiny-wikitext" / "train.txt", d / "wikitext-2.txt")
    return d


def train(world: int, root: Path, strategy: str, data: Path, max_steps: int, *extra: str) -> dict:
    out = root / f"result-{uuid.uuid4().hex[:6]}.json"
    results = run_ranks(NEWEST, world, [WORKER, "--root", str(root), "--strategy", strategy, "--data", str(data),
                                        "--max-steps", str(max_steps), "--out", str(out), *extra], timeout=240)
    report = json.loads(out.read_text())
    report["stdout"] = [r.stdout for r in results]
    return report


def lightning_consolidated(folder: Path) -> dict:
    """What ``python -m lightning.pytorch.utilities.consolidate_checkpoint`` writes, in memory."""
    from lightning.fabric.utilities.load import _load_distributed_checkpoint
    from lightning.pytorch.utilities.consolidate_checkpoint import _format_checkpoint

    return _format_checkpoint(_load_distributed_checkpoint(folder))


def raw_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(-1).contiguous().view(torch.uint8)


def assert_same(a, b, where: str = "") -> None:
    """Same keys, tensors bit for bit (dtype, shape, bytes), same other values."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
        assert torch.equal(raw_bytes(a), raw_bytes(b)), f"{where}: values differ"
        return
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{where}: keys {list(a)} vs {list(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{where}/{k}")
        return
    if isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
        return
    assert a == b or (a != a and b != b), f"{where}: {a!r} vs {b!r}"


def tensors_of(tree, prefix: str = "") -> dict:
    if isinstance(tree, torch.Tensor):
        return {prefix: tree}
    out = {}
    if isinstance(tree, dict):
        for k, v in tree.items():
            out.update(tensors_of(v, f"{prefix}/{k}"))
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            out.update(tensors_of(v, f"{prefix}[{i}]"))
    return out


class StockCheckpoints(dict):
    """Sharded checkpoints Lightning's own strategy wrote at step 2, {(model, world): folder},
    each trained on first use."""

    def __init__(self, tmp_path_factory, data: Path) -> None:
        super().__init__()
        self.tmp_path_factory = tmp_path_factory
        self.data = data

    def __missing__(self, key) -> Path:
        model, world = key
        root = self.tmp_path_factory.mktemp(f"stock-{model}-{world}")
        train(world, root, "stock", self.data, 2, "--model", model)
        folder = root / "checkpoints" / "epoch=0-step=2.ckpt"
        assert (folder / "meta.pt").is_file() and (folder / ".metadata").is_file()
        self[key] = folder
        return folder


@pytest.fixture(scope="module")
def stock_checkpoints(tmp_path_factory, data_dir) -> StockCheckpoints:
    return StockCheckpoints(tmp_path_factory, data_dir)


# -- 1. resume across strategies and world sizes ---------------------------------------------


def test_stock_checkpoint_resumes_in_shardpoint_on_another_world_size(stock_checkpoints, data_dir, tmp_path):
    source = stock_checkpoints[("transformer", 4)]
    resaved = tmp_path / "resaved.ckpt"
    report = train(2, tmp_path, "ours", data_dir, 4, "--ckpt-path", str(source), "--resave", str(resaved))
    # global step and loops restored; training went on to step 4
    assert report["loaded"]["global_step"] == 2 and report["start_step"] == 2 and report["global_step"] == 4
    for counter in ("batches_that_stepped", "batches_completed"):
        assert report["restored"][counter] == report["loaded"][counter], counter
    assert sorted(int(s) for s in report["losses"]) == [3, 4]
    # the weights are the saved ones: the loss on the fixed batch is what it was at save time
    assert report["resumed_probe"] == pytest.approx(report["loaded"]["probe_loss"], rel=1e-5, abs=1e-6)
    # model and optimizer state, saved again by 2 ranks right after the resume, equal what 4 saved
    want = tensors_of({k: v for k, v in lightning_consolidated(source).items() if k in ("state_dict", "optimizer_states")})
    got = tensors_of({k: v for k, v in lightning_consolidated(resaved).items() if k in ("state_dict", "optimizer_states")})
    assert set(want) == set(got) and len(want) > 10
    for name in want:
        assert torch.equal(want[name], got[name]), name
    assert any("momentum_buffer" in n for n in want)
    # shardpoint's files are there (and Lightning's reader read them above)
    assert (resaved / ".shardpoint-checksums.json").is_file() and (resaved / "meta.pt").is_file()
    assert shardpoint.verify(resaved).ok
    # the loss goes on from where it was, not from the untrained model's
    assert report["losses"]["3"] < report["loaded"]["probe_loss"] + 1.0


def test_shardpoint_checkpoint_resumes_in_stock_lightning(data_dir, tmp_path):
    first = train(2, tmp_path / "a", "ours", data_dir, 2)
    ckpt = tmp_path / "a" / "checkpoints" / "epoch=0-step=2.ckpt"
    names = sorted(p.name for p in ckpt.iterdir())
    assert {".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt"} <= set(names), names
    assert first["global_step"] == 2
    report = train(3, tmp_path / "b", "stock", data_dir, 3, "--ckpt-path", str(ckpt))
    assert report["loaded"]["global_step"] == 2 and report["start_step"] == 2 and report["global_step"] == 3
    assert report["restored"] == {k: report["loaded"][k] for k in ("batches_that_stepped", "batches_completed")}
    assert report["resumed_probe"] == pytest.approx(report["loaded"]["probe_loss"], rel=1e-5, abs=1e-6)


# -- 2. consolidation equals Lightning's --------------------------------------------------------


@pytest.mark.parametrize("model,world", [("transformer", 2), ("transformer", 4), ("mlp", 2), ("mlp", 4)])
def test_consolidate_equals_lightning(stock_checkpoints, tmp_path, model, world):
    folder = stock_checkpoints[(model, world)]
    ours = tmp_path / "ours.ckpt"
    shardpoint.consolidate(folder, ours)
    want = lightning_consolidated(folder)
    got = torch.load(ours, weights_only=False)
    assert list(got) == list(want) or set(got) == set(want), (list(got), list(want))
    assert_same(want, got)
    assert "state_dict" in got and "optimizer_states" in got and got["global_step"] == 2


def test_consolidate_cli_equals_lightning_cli(stock_checkpoints, tmp_path):
    folder = stock_checkpoints[("mlp", 4)]
    theirs = tmp_path / "theirs.ckpt"
    subprocess.run([sys.executable, "-m", "lightning.pytorch.utilities.consolidate_checkpoint", str(folder),
                    "--output_file", str(theirs)], check=True, env=worker_env(), timeout=120)
    outputs = {"python": tmp_path / "python.ckpt"}
    shardpoint.consolidate(folder, outputs["python"])
    cli = REPO / "build" / "src" / "cli" / "shardpoint"
    if cli.exists():
        outputs["cli"] = tmp_path / "cli.ckpt"
        subprocess.run([str(cli), "consolidate", str(folder), "--output_file", str(outputs["cli"])], check=True,
                       timeout=120)
    want = torch.load(theirs, weights_only=False)
    for name, path in outputs.items():
        assert_same(want, torch.load(path, weights_only=False), name)


@pytest.mark.parametrize("layout", ["trainer", "fabric", "dcp"])
def test_every_layout_keeps_the_trainer_state(stock_checkpoints, tmp_path, layout):
    """Each layout of a Lightning folder holds meta.pt's trainer state as Lightning gives it:
    trainer = consolidate_checkpoint's file; fabric and dcp = _load_distributed_checkpoint's
    dict (the DCP state with meta.pt merged on top, keys as saved)."""
    from lightning.fabric.utilities.load import _load_distributed_checkpoint

    folder = stock_checkpoints[("mlp", 2)]
    ours = tmp_path / f"{layout}.ckpt"
    shardpoint.consolidate(folder, ours, layout=layout)
    want = lightning_consolidated(folder) if layout == "trainer" else _load_distributed_checkpoint(folder)
    got = torch.load(ours, weights_only=False)
    assert list(got) == list(want), (list(got), list(want))
    assert_same(want, got)
    meta = torch.load(folder / "meta.pt", weights_only=False)
    assert {"global_step", "loops", "callbacks"} <= set(meta) <= set(got)
    assert got["global_step"] == 2


# -- 3. async saves, "last", full state dicts -----------------------------------------------------


def test_async_saves_and_uncommitted_last_falls_back(data_dir, tmp_path):
    report = train(2, tmp_path, "ours", data_dir, 3, "--async-save", "--every", "1", "--save-last")
    assert report["global_step"] == 3
    ckpts = tmp_path / "checkpoints"
    for step in (1, 2, 3):
        assert splightning.is_committed(ckpts / f"epoch=0-step={step}.ckpt")
        assert shardpoint.verify(ckpts / f"epoch=0-step={step}.ckpt").ok
    last = ckpts / "last.ckpt"
    assert splightning.is_committed(last)
    # a run that died while writing last.ckpt: data there, meta.pt not yet
    (last / "meta.pt").unlink()
    resumed = train(2, tmp_path, "ours", data_dir, 4, "--ckpt-path", str(last))
    assert resumed["loaded"]["global_step"] == 3 and resumed["global_step"] == 4
    log = "".join(resumed["stdout"])
    assert "is not committed" in log and "epoch=0-step=3.ckpt" in log


def test_full_state_dict_on_cpu(data_dir, tmp_path):
    report = train(2, tmp_path, "ours", data_dir, 2, "--state-dict-type", "full", "--model", "mlp")
    ckpt = tmp_path / "checkpoints" / "epoch=0-step=2.ckpt"
    assert ckpt.is_file()
    full = torch.load(ckpt, weights_only=False)
    assert full["global_step"] == 2 and full["state_dict"]["net.0.weight"].shape == (64, 16)
    assert report["global_step"] == 2
    resumed = train(2, tmp_path / "b", "ours", data_dir, 3, "--state-dict-type", "full", "--model", "mlp",
                    "--ckpt-path", str(ckpt))
    assert resumed["loaded"]["global_step"] == 2 and resumed["global_step"] == 3
    assert resumed["resumed_probe"] == pytest.approx(resumed["loaded"]["probe_loss"], rel=1e-6)


# -- 4. CheckpointIO ------------------------------------------------------------------------------


def checkpoint() -> dict:
    g = torch.Generator().manual_seed(5)
    return {"state_dict": {"w": torch.randn(64, 32, generator=g), "b": torch.zeros(32, dtype=torch.bfloat16)},
            "global_step": 7, "loops": {"fit_loop": {"epoch": 1}}, "hparams": {"lr": 0.1, "name": "x"}}


def test_checkpoint_io_round_trip_and_layout(tmp_path):
    io_ = splightning.CheckpointIO()
    path = tmp_path / "sub" / "model.ckpt"
    io_.save_checkpoint(checkpoint(), path)
    assert_same(checkpoint(), torch.load(path, weights_only=False))  # a plain torch.save file
    assert_same(checkpoint(), io_.load_checkpoint(path, weights_only=False))
    assert [p.name for p in path.parent.iterdir()] == ["model.ckpt"]  # no temporary left behind
    io_.save_checkpoint({"global_step": 8}, path)  # replaced atomically
    assert io_.load_checkpoint(path)["global_step"] == 8
    io_.remove_checkpoint(path)
    assert not path.exists()
    with pytest.raises(FileNotFoundError):
        io_.load_checkpoint(path)


def test_checkpoint_io_detects_damage(tmp_path):
    io_ = splightning.CheckpointIO()
    path = tmp_path / "model.ckpt"
    io_.save_checkpoint(checkpoint(), path)
    data = bytearray(path.read_bytes())
    # flip one bit inside the tensor data (torch.load alone would load the wrong value)
    raw = checkpoint()["state_dict"]["w"].numpy().tobytes()
    at = bytes(data).find(raw[:64]) + 1000
    data[at] ^= 0x10
    path.write_bytes(bytes(data))
    damaged = torch.load(io.BytesIO(bytes(data)), weights_only=False)["state_dict"]["w"]
    assert not torch.equal(damaged, checkpoint()["state_dict"]["w"])
    with pytest.raises(shardpoint.FormatError, match="CRC-32"):
        io_.load_checkpoint(path, weights_only=False)
    path.write_bytes(bytes(data[: len(data) // 2]))  # truncated
    with pytest.raises(shardpoint.FormatError):
        io_.load_checkpoint(path, weights_only=False)
    path.write_bytes(bytes(data))  # damaged, loaded unchecked when asked
    unchecked = splightning.CheckpointIO(check_zip_crc=False).load_checkpoint(path, weights_only=False)
    assert torch.equal(unchecked["state_dict"]["w"], damaged)


def test_verify_zip_passes_records_without_a_crc_and_names_a_damaged_one():
    from torch.utils.serialization import config as serialization_config

    config = serialization_config.save
    previous = config.compute_crc32
    config.compute_crc32 = False  # PyTorch then stores CRC-32 0: "no checksum", not damage
    try:
        buffer = io.BytesIO()
        torch.save({"w": torch.arange(100.0)}, buffer)
    finally:
        config.compute_crc32 = previous
    splightning._verify_zip(buffer.getvalue(), "nocrc.pt")
    data = bytearray(splightning._serialize({"w": torch.arange(100.0)}))
    data[bytes(data).find(torch.arange(100.0).numpy().tobytes()) + 10] ^= 0x10
    with pytest.raises(shardpoint.FormatError, match=r"damaged.pt: record 'archive/data/0' does not match its CRC-32"):
        splightning._verify_zip(bytes(data), "damaged.pt")


def test_sharded_resume_checks_meta_pt(data_dir, tmp_path):
    train(1, tmp_path / "a", "ours", data_dir, 2)
    ckpt = tmp_path / "a" / "checkpoints" / "epoch=0-step=2.ckpt"
    meta = bytearray((ckpt / "meta.pt").read_bytes())
    with zipfile.ZipFile(io.BytesIO(bytes(meta))) as archive:
        pkl = next(i for i in archive.infolist() if i.filename.endswith("/data.pkl"))
    names, extra = struct.unpack("<HH", meta[pkl.header_offset + 26:pkl.header_offset + 30])
    meta[pkl.header_offset + 30 + names + extra + pkl.file_size // 2] ^= 0x10  # inside data.pkl
    (ckpt / "meta.pt").write_bytes(bytes(meta))
    out = tmp_path / "b" / "result.json"
    results = run_ranks(NEWEST, 1, [WORKER, "--root", str(tmp_path / "b"), "--strategy", "ours", "--data", str(data_dir),
                                    "--max-steps", "3", "--out", str(out), "--ckpt-path", str(ckpt)],
                        timeout=240, expect_ok=False)
    assert results[0].returncode != 0
    assert "meta.pt: record" in results[0].stdout and "CRC-32" in results[0].stdout, results[0].stdout[-3000:]


def test_sharded_resume_runs_no_code_from_meta_pt(data_dir, tmp_path):
    """meta.pt is loaded with weights_only=True unless the caller passes False: a meta.pt that
    calls os.system stops the resume, naming the global, and the command never runs."""
    import hostile_pickles

    train(1, tmp_path / "a", "ours", data_dir, 2)
    ckpt = tmp_path / "a" / "checkpoints" / "epoch=0-step=2.ckpt"
    marker = tmp_path / "ran"
    meta = torch.load(ckpt / "meta.pt", weights_only=True)
    meta["hparams_name"] = hostile_pickles.calls(str(marker))["os.system"]
    torch.save(meta, ckpt / "meta.pt")
    out = tmp_path / "b" / "result.json"
    results = run_ranks(NEWEST, 1, [WORKER, "--root", str(tmp_path / "b"), "--strategy", "ours", "--data", str(data_dir),
                                    "--max-steps", "3", "--out", str(out), "--ckpt-path", str(ckpt)],
                        timeout=240, expect_ok=False)
    assert results[0].returncode != 0
    assert "posix.system" in results[0].stdout, results[0].stdout[-3000:]
    assert not marker.exists()
    torch.load(ckpt / "meta.pt", weights_only=False)  # the payload is live
    assert marker.exists()


# -- 5. object stores ----------------------------------------------------------------------------


@pytest.fixture
def gcs(monkeypatch, tmp_path_factory):
    """fsouza's fake-gcs-server (servers.py) on 127.0.0.1 with one bucket; gs:// URLs reach it
    through the engine's environment variables. Yields a function counting the bucket's objects."""
    with servers.fake_gcs(tmp_path_factory.mktemp("fake-gcs"), "bucket") as env:
        for name in ("GCS_HMAC_ACCESS_ID", "GCS_HMAC_SECRET"):
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        yield lambda: len(servers.gcs_object_names(env["GCS_JSON_ENDPOINT_URL"], "bucket"))


def test_remote_sharded_save_resume_remove(data_dir, tmp_path, gcs):
    url = "gs://bucket/run/epoch=0-step=2.ckpt"
    # plain SGD: an optimizer without state (DCP drops its empty "state" dict)
    first = train(2, tmp_path / "a", "ours", data_dir, 2, "--save-to", url, "--plain-sgd")
    assert first["global_step"] == 2
    assert splightning.is_committed(url) and shardpoint.verify(url).ok
    written = gcs()
    assert written >= 5  # .metadata, 2 data files, meta.pt, checksums (+ index)
    resumed = train(3, tmp_path / "b", "ours", data_dir, 3, "--ckpt-path", url, "--remove", url, "--plain-sgd")
    assert resumed["loaded"]["global_step"] == 2 and resumed["global_step"] == 3
    assert resumed["resumed_probe"] == pytest.approx(resumed["loaded"]["probe_loss"], rel=1e-5, abs=1e-6)
    assert not splightning.is_committed(url) and gcs() == 0


def test_checkpoint_io_on_object_store(gcs):
    io_ = splightning.CheckpointIO()
    url = "gs://bucket/full/model.ckpt"
    io_.save_checkpoint(checkpoint(), url)
    assert gcs() == 1
    assert_same(checkpoint(), io_.load_checkpoint(url, weights_only=False))
    io_.remove_checkpoint(url)
    assert gcs() == 0
    with pytest.raises(FileNotFoundError):
        io_.load_checkpoint(url)


def test_remote_full_checkpoint_save_resume(data_dir, tmp_path, gcs):
    url = "gs://bucket/full/epoch=0-step=2.ckpt"
    first = train(2, tmp_path / "a", "ours", data_dir, 2, "--model", "mlp", "--state-dict-type", "full",
                  "--save-to", url)
    assert first["global_step"] == 2 and gcs() == 1
    resumed = train(2, tmp_path / "b", "ours", data_dir, 3, "--model", "mlp", "--state-dict-type", "full",
                    "--ckpt-path", url)
    assert resumed["loaded"]["global_step"] == 2 and resumed["global_step"] == 3
    assert resumed["resumed_probe"] == pytest.approx(resumed["loaded"]["probe_loss"], rel=1e-6)
