"""shardpoint-train (the C++ trainer) and the real Lightning 2.6 Trainer resume each other's
sharded checkpoints, and write the same meta.pt.

The model is the same on both sides: shardpoint-train's ``--model-size tiny`` and
lightning_worker.py's ``trainer-tiny`` (Lightning's demo Transformer at the same dimensions),
SGD with lr 0.1 and momentum 0.9 (so the optimizer has state), the tiny-wikitext corpus.
Lightning runs its stock FSDPStrategy (subclassed only as far as CPU needs), real processes
on gloo; shardpoint-train starts its own ranks. The trainer comes from the C++ build
(``$SHARDPOINT_BUILD_DIR``, default ``build/``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch

from conftest import REPO, run_ranks

pytest.importorskip("lightning")

WORKER = "lightning_worker.py"
NEWEST = [sys.executable]
# The trainer's flags for the model and optimizer lightning_worker.py's trainer-tiny uses.
TRAINER_MODEL = ["--model-size", "tiny", "--optimizer", "sgd", "--lr", "0.1", "--momentum", "0.9",
                 "--state-dict-type", "sharded"]
CHECKPOINT = "epoch=0-step=3.ckpt"


@pytest.fixture(scope="module")
def trainer_exe() -> Path:
    exe = Path(os.environ.get("SHARDPOINT_BUILD_DIR", REPO / "build")) / "src" / "train" / "shardpoint-train"
    if not exe.is_file():
        if os.environ.get("SHARDPOINT_REQUIRE_ORACLES") == "1":
            pytest.fail(f"{exe} not built (SHARDPOINT_REQUIRE_ORACLES=1)")
        pytest.skip(f"{exe} not built (make build)")
    return exe


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """The repository's corpus under both names: train.txt (shardpoint-train) and
    wikitext-2.txt (Lightning's WikiText2)."""
    d = tmp_path_factory.mktemp("corpus")
    for name in ("train.txt", "wikitext-2.txt"):
        shutil.copy(REPO / "data" / "tiny-wikitext" / "train.txt", d / name)
    return d


def run_trainer(exe: Path, root: Path, data: Path, *args: str) -> dict:
    """Runs shardpoint-train; returns its output and the loss it printed per step."""
    r = subprocess.run([str(exe), "--root", str(root), "--data", str(data), *TRAINER_MODEL, *args],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    if r.returncode != 0:
        pytest.fail(f"shardpoint-train exited {r.returncode}:\n{r.stdout[-4000:]}")
    losses = {int(m.group(1)): float(m.group(2)) for m in re.finditer(r"^step (\d+)/\d+ .*?loss ([\d.]+)", r.stdout, re.M)}
    return {"stdout": r.stdout, "losses": losses}


def run_lightning(world: int, root: Path, data: Path, max_steps: int, *extra: str) -> dict:
    out = root.parent / f"result-{uuid.uuid4().hex[:6]}.json"
    run_ranks(NEWEST, world, [WORKER, "--root", str(root), "--strategy", "stock", "--model", "trainer-tiny",
                              "--data", str(data), "--max-steps", str(max_steps), "--out", str(out), *extra],
              timeout=300)
    report = json.loads(out.read_text())
    report["losses"] = {int(k): v for k, v in report["losses"].items()}
    return report


def load_sharded(folder: Path) -> dict:
    """Every tensor and value of a sharded checkpoint, through Lightning's own loader."""
    from lightning.fabric.utilities.load import _load_distributed_checkpoint

    return _load_distributed_checkpoint(folder)


def flatten(tree, prefix: str = "") -> dict:
    """{"a/b/0": leaf}; an empty dict or list is a leaf too (so its presence is compared)."""
    if isinstance(tree, dict) and tree:
        out = {}
        for k, v in tree.items():
            out.update(flatten(v, f"{prefix}{k}/"))
        return out
    if isinstance(tree, (list, tuple)) and tree and not all(isinstance(x, (int, float, str)) for x in tree):
        out = {}
        for i, v in enumerate(tree):
            out.update(flatten(v, f"{prefix}{i}/"))
        return out
    return {prefix[:-1]: tree}


@pytest.fixture(scope="module")
def trainer_run(trainer_exe, corpus, tmp_path_factory) -> dict:
    """shardpoint-train, 2 ranks, 3 steps, a sharded checkpoint at step 3."""
    root = tmp_path_factory.mktemp("trainer")
    run = run_trainer(trainer_exe, root, corpus, "--devices", "2", "--max-steps", "3", "--every-n-train-steps", "3")
    run["checkpoint"] = root / "lightning_logs" / "version_0" / "checkpoints" / CHECKPOINT
    return run


@pytest.fixture(scope="module")
def lightning_run(corpus, tmp_path_factory) -> dict:
    """The stock Lightning Trainer, 2 ranks, 3 steps, a sharded checkpoint at step 3."""
    root = tmp_path_factory.mktemp("lightning") / "run"
    run = run_lightning(2, root, corpus, 3, "--every", "3")
    run["checkpoint"] = root / "checkpoints" / CHECKPOINT
    return run


def test_trainer_checkpoint_resumes_in_lightning_exactly(trainer_run, corpus, tmp_path):
    """Lightning resumes shardpoint-train's step-3 checkpoint on 3 ranks: the loops and global
    step restored, every parameter and momentum buffer equal to the checkpoint's (Lightning
    saves what it restored, right after the resume), the loss going on from there."""
    resaved = tmp_path / "resaved.ckpt"
    report = run_lightning(3, tmp_path / "resume", corpus, 5, "--ckpt-path", str(trainer_run["checkpoint"]),
                           "--resave", str(resaved))
    assert report["loaded"]["global_step"] == 3 and report["start_step"] == 3 and report["global_step"] == 5
    assert report["restored"] == {k: report["loaded"][k] for k in ("batches_that_stepped", "batches_completed")}
    want, got = load_sharded(trainer_run["checkpoint"]), load_sharded(resaved)
    # the model and optimizer state (ModelCheckpoint's kth_value tensor is the callback's own)
    want_tensors = {k: v for k, v in flatten(want).items() if isinstance(v, torch.Tensor) and "callbacks/" not in k}
    got_tensors = {k: v for k, v in flatten(got).items() if isinstance(v, torch.Tensor) and "callbacks/" not in k}
    assert set(want_tensors) == set(got_tensors)
    assert any("momentum_buffer" in k for k in want_tensors) and any(k.startswith("model/") for k in want_tensors)
    for name, tensor in want_tensors.items():
        assert torch.equal(tensor, got_tensors[name]), name
    # trained weights: the first resumed step's loss is below the trainer's first (untrained) one
    assert set(report["losses"]) == {4, 5}
    assert report["losses"][4] < trainer_run["losses"][1]


def test_lightning_checkpoint_resumes_in_trainer(trainer_exe, lightning_run, corpus, tmp_path):
    """shardpoint-train resumes the stock Lightning step-3 checkpoint on 3 ranks and goes on to
    step 5; its checkpoints carry the continued loops."""
    run = run_trainer(trainer_exe, tmp_path, corpus, "--devices", "3", "--ckpt-path", str(lightning_run["checkpoint"]),
                      "--max-steps", "5", "--every-n-train-steps", "1")
    assert set(run["losses"]) == {4, 5}, run["stdout"][-2000:]
    assert run["losses"][4] < lightning_run["losses"][1]
    saved = tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "epoch=0-step=5.ckpt"
    meta = torch.load(saved / "meta.pt", weights_only=False)
    assert meta["global_step"] == 5
    steps = meta["loops"]["fit_loop"]["epoch_loop.automatic_optimization.optim_progress"]["optimizer"]["step"]
    assert steps["total"]["completed"] == 5


def test_meta_pt_matches_lightning_key_by_key(trainer_run, lightning_run):
    """The meta.pt of shardpoint-train and of Lightning for the same run (model, world size,
    ModelCheckpoint settings, step) hold the same keys with the same values. What differs, and
    why: "shardpoint" (the trainer's data position and seed, which Lightning ignores), the
    folders named in ModelCheckpoint's state (two runs, two roots), "probe_loss" (the test
    worker's own callback)."""
    ours = flatten(torch.load(trainer_run["checkpoint"] / "meta.pt", weights_only=False))
    theirs = flatten(torch.load(lightning_run["checkpoint"] / "meta.pt", weights_only=False))
    assert {k.split("/")[0] for k in set(ours) - set(theirs)} == {"shardpoint"}
    assert set(theirs) - set(ours) == {"probe_loss"}
    roots = (str(trainer_run["checkpoint"].parent), str(lightning_run["checkpoint"].parent))
    differ = []
    for key in sorted(set(ours) & set(theirs)):
        a, b = ours[key], theirs[key]
        if isinstance(a, str) and isinstance(b, str):
            a = a.replace(roots[0], "<dir>")
            b = b.replace(roots[1], "<dir>")
        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            same = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
        else:
            same = type(a) is type(b) and a == b
        if not same:
            differ.append((key, a, b))
    assert not differ, differ
    assert ours["pytorch-lightning_version"] == __import__("lightning").__version__
