"""Lightning's ModelParallelStrategy (FSDP2 ``fully_shard``, CPU, gloo) with the real Lightning
2.6 Trainer in real processes (lightning_mp_worker.py, one per rank; it also writes the
fixtures: checkpoints Lightning's own strategy saves):

- ``consolidate`` of its sharded checkpoint (module state under ``"state_dict"``) gives the
  Trainer layout, with the values Lightning's own reader reads (``--to safetensors``: the
  weights); a single-device Trainer, ``load_from_checkpoint`` and Lightning's
  ModelParallelStrategy on 2 ranks use the file as a full checkpoint;
- ``shardpoint.lightning.ModelParallelStrategy``: train, save (async, ``last``), resume on
  another number of ranks, Lightning's reader and strategy read what it writes;
- ``reshard`` keeps Lightning checkpoints Lightning checkpoints (``meta.pt`` carried), for
  the ModelParallel and the FSDP layouts.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch

from conftest import REPO, run_ranks
from test_lightning import assert_same, data_dir, gcs, tensors_of, train  # noqa: F401 - fixtures

pytest.importorskip("lightning")

import shardpoint  # noqa: E402
from shardpoint import lightning as splightning  # noqa: E402

WORKER = "lightning_mp_worker.py"
CLI = REPO / "build" / "src" / "cli" / "shardpoint"


def train_mp(world: int, root: Path, strategy: str, data: Path, max_steps: int, *extra: str) -> dict:
    """Runs lightning_mp_worker.py on ``world`` ranks (``single``: one process, no ranks)."""
    out = root / f"result-{uuid.uuid4().hex[:6]}.json"
    args = [WORKER, "--root", str(root), "--strategy", strategy, "--data", str(data), "--max-steps", str(max_steps),
            "--out", str(out), *extra]
    if strategy == "single":
        from conftest import HERE, worker_env

        done = subprocess.run([sys.executable, *args], check=True, env=worker_env(), cwd=str(HERE), timeout=240,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        stdout = [done.stdout]
    else:
        stdout = [r.stdout for r in run_ranks([sys.executable], world, args, timeout=240)]
    report = json.loads(out.read_text())
    report["stdout"] = stdout
    return report


def lightning_reads(folder: Path) -> dict:
    """What Lightning's own reader (``consolidate_checkpoint``'s) loads from a sharded folder."""
    from lightning.fabric.utilities.load import _load_distributed_checkpoint

    return _load_distributed_checkpoint(Path(folder))


def read_safetensors(path: Path) -> dict:
    """A safetensors file's tensors, by the format's definition (8-byte little-endian header
    length, JSON header, data), F32 only: what the demo model holds."""
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        assert entry["dtype"] == "F32", (name, entry["dtype"])
        begin, end = entry["data_offsets"]
        out[name] = torch.frombuffer(bytearray(data[8 + n + begin:8 + n + end]), dtype=torch.float32).reshape(
            entry["shape"])
    return out


def state_sums(optimizer_state: dict) -> dict:
    return {f"{name}/{k}": float(v.double().sum()) for name, s in optimizer_state["state"].items()
            for k, v in s.items() if isinstance(v, torch.Tensor) and v.dim() > 0}


@pytest.fixture(scope="module")
def stock_mp(tmp_path_factory, data_dir) -> Path:
    """A sharded checkpoint Lightning's ModelParallelStrategy wrote at step 2 on 2 ranks."""
    root = tmp_path_factory.mktemp("stock-mp")
    train_mp(2, root, "stock", data_dir, 2)
    folder = root / "checkpoints" / "epoch=0-step=2.ckpt"
    assert (folder / "meta.pt").is_file() and (folder / ".metadata").is_file()
    return folder


# -- 1. consolidate ----------------------------------------------------------------------------


def test_consolidate_model_parallel_gives_the_trainer_layout(stock_mp, tmp_path):
    from lightning.pytorch.utilities.consolidate_checkpoint import _format_checkpoint

    raw = lightning_reads(stock_mp)
    assert "state_dict" in raw and "model" not in raw and "optimizer_0" in raw
    with pytest.raises(KeyError, match="model"):  # Lightning's own tool fails on it
        _format_checkpoint(lightning_reads(stock_mp))
    outputs = {"python": tmp_path / "python.ckpt"}
    shardpoint.consolidate(stock_mp, outputs["python"])
    if CLI.exists():
        outputs["cli"] = tmp_path / "cli.ckpt"
        subprocess.run([str(CLI), "consolidate", str(stock_mp), "--output_file", str(outputs["cli"]), "-q"], check=True,
                       timeout=120)
    want = {k: v for k, v in raw.items() if k not in ("state_dict", "optimizer_0")}
    want["state_dict"] = raw["state_dict"]
    want["optimizer_states"] = [raw["optimizer_0"]]
    for name, path in outputs.items():
        got = torch.load(path, weights_only=True)  # a plain full checkpoint: no classes inside
        assert list(got) == list(want), (name, list(got))
        assert_same(want, got, name)
        assert len(got["state_dict"]) > 10 and got["global_step"] == 2
        assert any(k.endswith("momentum_buffer") for k in tensors_of(got["optimizer_states"]))
    # --to safetensors: the module's weights, named as in the LightningModule's state dict
    weights = tmp_path / "model.safetensors"
    shardpoint.consolidate(stock_mp, weights, format="safetensors")
    assert_same(raw["state_dict"], read_safetensors(weights), "safetensors")


def test_consolidated_model_parallel_checkpoint_is_a_full_checkpoint(stock_mp, data_dir, tmp_path):
    from lightning_mp_worker import ShardedTransformer

    ckpt = tmp_path / "full.ckpt"
    shardpoint.consolidate(stock_mp, ckpt)
    raw = lightning_reads(stock_mp)
    # LightningModule.load_from_checkpoint: the weights Lightning's reader reads
    vocab = raw["state_dict"]["model.embedding.weight"].shape[0]
    module = ShardedTransformer.load_from_checkpoint(ckpt, vocab_size=vocab)
    assert_same(raw["state_dict"], module.state_dict(), "load_from_checkpoint")
    # Trainer(ckpt_path=...) on one device, and Lightning's ModelParallelStrategy on 2 ranks
    # taking it as a full checkpoint: trainer state, weights and optimizer state restored
    want = state_sums(raw["optimizer_0"])
    assert len(want) > 10
    for world, strategy in ((1, "single"), (2, "stock")):
        report = train_mp(world, tmp_path / strategy, strategy, data_dir, 3, "--ckpt-path", str(ckpt))
        assert report["loaded"]["global_step"] == 2 and report["start_step"] == 2 and report["global_step"] == 3
        assert report["restored"] == {k: report["loaded"][k] for k in ("batches_that_stepped", "batches_completed")}
        assert report["resumed_probe"] == pytest.approx(report["loaded"]["probe_loss"], rel=1e-6), strategy
        assert set(report["optimizer_sums"]) == set(want), strategy
        for name, value in want.items():
            assert report["optimizer_sums"][name] == pytest.approx(value, rel=1e-6, abs=1e-9), (strategy, name)


# -- 2. shardpoint.lightning.ModelParallelStrategy ----------------------------------------------


def test_model_parallel_strategy_saves_what_lightning_saves(stock_mp, data_dir, tmp_path):
    """Same seed, same data: ours writes (async, every step, last) the values Lightning's
    strategy writes, in Lightning's layout, and both consolidate alike."""
    report = train_mp(2, tmp_path, "ours", data_dir, 2, "--async-save", "--every", "1", "--save-last")
    assert report["global_step"] == 2
    ckpts = tmp_path / "checkpoints"
    ours = ckpts / "epoch=0-step=2.ckpt"
    for folder in (ckpts / "epoch=0-step=1.ckpt", ours, ckpts / "last.ckpt"):
        assert splightning.is_committed(folder) and shardpoint.verify(folder).ok, folder
        assert (folder / ".shardpoint-checksums.json").is_file()
    got, want = lightning_reads(ours), lightning_reads(stock_mp)
    assert set(got) == set(want)
    for key in ("state_dict", "optimizer_0"):
        assert_same(want[key], got[key], key)
    assert got["global_step"] == 2 and got["probe_loss"] == want["probe_loss"]
    a, b = tmp_path / "ours.pt", tmp_path / "stock.pt"
    shardpoint.consolidate(ours, a)
    shardpoint.consolidate(stock_mp, b)
    assert_same(torch.load(b, weights_only=True)["state_dict"], torch.load(a, weights_only=True)["state_dict"])
    # a run that died while writing last.ckpt (data there, meta.pt not yet) resumes from the
    # newest committed checkpoint instead
    (ckpts / "last.ckpt" / "meta.pt").unlink()
    resumed = train_mp(2, tmp_path, "ours", data_dir, 3, "--ckpt-path", str(ckpts / "last.ckpt"))
    assert resumed["loaded"]["global_step"] == 2 and resumed["global_step"] == 3
    log = "".join(resumed["stdout"])
    assert "is not committed" in log and "epoch=0-step=2.ckpt" in log


@pytest.mark.parametrize("resumer,world", [("ours", 3), ("stock", 1)])
def test_model_parallel_checkpoints_resume_across_strategies_and_world_sizes(stock_mp, data_dir, tmp_path, resumer,
                                                                             world):
    if resumer == "ours":
        source = stock_mp  # Lightning's checkpoint, resumed by ours on 3 ranks
    else:
        train_mp(2, tmp_path / "a", "ours", data_dir, 2)  # ours, resumed by Lightning's on 1 rank
        source = tmp_path / "a" / "checkpoints" / "epoch=0-step=2.ckpt"
    report = train_mp(world, tmp_path / "b", resumer, data_dir, 3, "--ckpt-path", str(source))
    assert report["loaded"]["global_step"] == 2 and report["start_step"] == 2 and report["global_step"] == 3
    assert report["restored"] == {k: report["loaded"][k] for k in ("batches_that_stepped", "batches_completed")}
    assert report["resumed_probe"] == pytest.approx(report["loaded"]["probe_loss"], rel=1e-5, abs=1e-6)
    want = state_sums(lightning_reads(source)["optimizer_0"])
    assert set(report["optimizer_sums"]) == set(want)
    for name, value in want.items():
        assert report["optimizer_sums"][name] == pytest.approx(value, rel=1e-5, abs=1e-7), name


def test_model_parallel_strategy_full_checkpoint(data_dir, tmp_path):
    train_mp(2, tmp_path / "a", "ours", data_dir, 2, "--full", "--model", "mlp")
    ckpt = tmp_path / "a" / "checkpoints" / "epoch=0-step=2.ckpt"
    assert ckpt.is_file()
    full = torch.load(ckpt, weights_only=True)
    assert full["global_step"] == 2 and full["state_dict"]["net.0.weight"].shape == (64, 16)
    resumed = train_mp(2, tmp_path / "b", "ours", data_dir, 3, "--full", "--model", "mlp", "--ckpt-path", str(ckpt))
    assert resumed["loaded"]["global_step"] == 2 and resumed["global_step"] == 3
    assert resumed["resumed_probe"] == pytest.approx(resumed["loaded"]["probe_loss"], rel=1e-6)


def test_model_parallel_strategy_on_object_store(data_dir, tmp_path, gcs):
    url = "gs://bucket/run/epoch=0-step=2.ckpt"
    first = train_mp(2, tmp_path / "a", "ours", data_dir, 2, "--save-to", url)
    assert first["global_step"] == 2
    assert splightning.is_committed(url) and shardpoint.verify(url).ok
    resumed = train_mp(3, tmp_path / "b", "ours", data_dir, 3, "--ckpt-path", url)
    assert resumed["loaded"]["global_step"] == 2 and resumed["global_step"] == 3
    assert resumed["resumed_probe"] == pytest.approx(resumed["loaded"]["probe_loss"], rel=1e-5, abs=1e-6)


# -- 3. reshard keeps a Lightning checkpoint a Lightning checkpoint ------------------------------


def test_reshard_model_parallel_checkpoint_resumes_in_lightning(stock_mp, data_dir, tmp_path):
    out = tmp_path / "resharded.ckpt"
    report = shardpoint.reshard(stock_mp, out, 3)
    assert report.meta_pt_bytes == (stock_mp / "meta.pt").stat().st_size
    assert (out / "meta.pt").read_bytes() == (stock_mp / "meta.pt").read_bytes()
    assert sorted(p.name for p in out.glob("__*_0.distcp")) == ["__0_0.distcp", "__1_0.distcp", "__2_0.distcp"]
    want, got = lightning_reads(stock_mp), lightning_reads(out)
    assert_same(want, got)
    # Lightning's own strategy resumes from it on 3 ranks
    resumed = train_mp(3, tmp_path / "b", "stock", data_dir, 3, "--ckpt-path", str(out))
    assert resumed["loaded"]["global_step"] == 2 and resumed["global_step"] == 3
    assert resumed["resumed_probe"] == pytest.approx(resumed["loaded"]["probe_loss"], rel=1e-5, abs=1e-6)


def test_reshard_fsdp_checkpoint_resumes_in_lightning(data_dir, tmp_path):
    train(2, tmp_path / "a", "stock", data_dir, 2, "--model", "mlp")
    source = tmp_path / "a" / "checkpoints" / "epoch=0-step=2.ckpt"
    out = tmp_path / "resharded.ckpt"
    if CLI.exists():
        done = subprocess.run([str(CLI), "reshard", str(source), str(out), "--ranks", "1"], check=True, text=True,
                              stdout=subprocess.PIPE, timeout=120)
        assert "meta.pt carried" in done.stdout, done.stdout
    else:
        shardpoint.reshard(source, out, 1)
    assert (out / "meta.pt").read_bytes() == (source / "meta.pt").read_bytes()
    assert_same(lightning_reads(source), lightning_reads(out))
    resumed = train(1, tmp_path / "b", "stock", data_dir, 3, "--model", "mlp", "--ckpt-path", str(out))
    assert resumed["loaded"]["global_step"] == 2 and resumed["global_step"] == 3
    assert resumed["resumed_probe"] == pytest.approx(resumed["loaded"]["probe_loss"], rel=1e-6)


def test_reshard_refuses_a_damaged_meta_pt(stock_mp, tmp_path):
    import shutil
    import zipfile

    source = tmp_path / "source.ckpt"
    shutil.copytree(stock_mp, source)
    meta = bytearray((source / "meta.pt").read_bytes())
    with zipfile.ZipFile(source / "meta.pt") as archive:
        pkl = next(i for i in archive.infolist() if i.filename.endswith("/data.pkl"))
    names, extra = int.from_bytes(meta[pkl.header_offset + 26:pkl.header_offset + 28], "little"), \
        int.from_bytes(meta[pkl.header_offset + 28:pkl.header_offset + 30], "little")
    meta[pkl.header_offset + 30 + names + extra + pkl.file_size // 2] ^= 0x10  # inside data.pkl
    (source / "meta.pt").write_bytes(bytes(meta))
    out = tmp_path / "out.ckpt"
    with pytest.raises(shardpoint.FormatError, match=r"meta\.pt.*CRC-32"):
        shardpoint.reshard(source, out, 2)
    assert not out.exists() or not any(out.iterdir())
