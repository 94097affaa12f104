"""One rank of the Lightning tests (python/tests/test_lightning.py launches it with run_ranks).

    python lightning_worker.py --root DIR --strategy ours|stock --max-steps N [options]

The real Lightning 2.6 Trainer with FSDP on CPU (gloo), ranks started by the test
(RANK/WORLD_SIZE/LOCAL_RANK set, so Lightning does not launch its own). Models:

- ``transformer``: ``lightning.pytorch.demos.LightningTransformer`` made small (1 encoder
  and 1 decoder layer, width 32) on ``WikiText2`` read from ``--data`` (a folder with
  ``wikitext-2.txt``: the repository's data/tiny-wikitext; no download), SGD with momentum
  (so the optimizer has state);
- ``trainer-tiny``: the same demo model at ``shardpoint-train --model-size tiny``'s dimensions,
  for checkpoints that move between shardpoint-train and Lightning;
- ``mlp``: a two-layer MLP on fixed random data, Adam.

``stock`` is Lightning's own FSDPStrategy subclassed only as far as CPU needs (FSDP's
``device_id``; the accelerator connector accepts a subclass); ``ours`` is
``shardpoint.lightning.FSDPStrategy``. Rank 0 writes ``--out`` (JSON): the loss per step,
the first and last global step, and the "probe" loss (a fixed batch in eval mode) recorded
in the checkpoint at save time and measured again right after a resume.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import time
from pathlib import Path

# A rank that hangs gets SIGABRT from conftest.run_ranks: print every thread's stack.
faulthandler.enable(all_threads=True)

import torch
import torch.nn as nn
import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.demos import LightningTransformer, Transformer, WikiText2
from lightning.pytorch.strategies import FSDPStrategy as LightningFSDPStrategy
from torch.utils.data import DataLoader, TensorDataset

import rank_exit


PLAIN_SGD = False


class StockCpuFSDPStrategy(LightningFSDPStrategy):
    """Lightning's FSDPStrategy; the only change: FSDP gets device_id=cpu on CPU."""

    def _setup_model(self, model):
        from torch.distributed.fsdp import FullyShardedDataParallel

        if self.root_device.type == "cpu" and not any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
            policy_free = {k: v for k, v in self.kwargs.items() if k != "auto_wrap_policy"}
            model = FullyShardedDataParallel(module=model, cpu_offload=self.cpu_offload,
                                             mixed_precision=self.mixed_precision_config,
                                             sharding_strategy=self.sharding_strategy,
                                             device_id=torch.device("cpu"), **self.kwargs)
            saved, self.kwargs = self.kwargs, policy_free
            try:
                return super()._setup_model(model)
            finally:
                self.kwargs = saved
        return super()._setup_model(model)


class TinyTransformer(LightningTransformer):
    def __init__(self, vocab_size: int) -> None:
        super().__init__(vocab_size=vocab_size)
        self.model = Transformer(vocab_size=vocab_size, ninp=32, nhead=2, nhid=32, nlayers=1)
        self.losses: dict = {}

    def prepare_data(self) -> None:
        pass  # the demo's downloads WikiText-2; the test hands it a local folder

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.losses[self.trainer.global_step + 1] = float(loss.detach())
        return loss

    def configure_optimizers(self):
        # momentum: the optimizer has state to restore; plain SGD (the demo's) has none
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.0 if PLAIN_SGD else 0.9)


class TrainerTiny(TinyTransformer):
    """shardpoint-train's ``--model-size tiny`` (width 32, 2 heads, feed-forward 64, 2 encoder
    and 2 decoder layers) with its ``--optimizer sgd --lr 0.1 --momentum 0.9``: the same
    parameter names and shapes, so checkpoints move between the two trainers."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__(vocab_size)
        self.model = Transformer(vocab_size=vocab_size, ninp=32, nhead=2, nhid=64, nlayers=2)


class TinyMLP(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 8))
        self.losses: dict = {}

    def forward(self, x, y):
        return nn.functional.mse_loss(self.net(x), y)

    def training_step(self, batch, batch_idx):
        loss = self(*batch)
        self.losses[self.trainer.global_step + 1] = float(loss.detach())
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def mlp_data() -> TensorDataset:
    g = torch.Generator().manual_seed(7)
    return TensorDataset(torch.randn(256, 16, generator=g), torch.randn(256, 8, generator=g))


class Recorder(Callback):
    """Puts the probe loss into every checkpoint; measures it after a resume; saves the
    resumed state at once when asked (so a test can compare it with what was loaded)."""

    def __init__(self, probe, resave: str | None) -> None:
        self.probe = probe
        self.resave = resave
        self.loaded: dict = {}
        self.resumed_probe = None
        self.restored: dict = {}
        self.start_step = None

    def _probe(self, pl_module) -> float:
        was = pl_module.training
        pl_module.eval()
        with torch.no_grad():
            x, y = self.probe
            if isinstance(pl_module, TinyTransformer):  # TrainerTiny too
                out = pl_module.trainer.strategy.model(x, y)
                loss = nn.functional.nll_loss(out, y.reshape(-1))
            else:
                loss = pl_module.trainer.strategy.model(x, y)
        pl_module.train(was)
        return float(loss)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        checkpoint["probe_loss"] = self._probe(pl_module)

    def on_load_checkpoint(self, trainer, pl_module, checkpoint):
        loops = checkpoint["loops"]["fit_loop"]
        self.loaded = {"probe_loss": checkpoint.get("probe_loss"), "global_step": checkpoint.get("global_step"),
                       "epoch": checkpoint.get("epoch"),
                       "batches_that_stepped": loops["epoch_loop.state_dict"].get("_batches_that_stepped"),
                       "batches_completed": loops["epoch_loop.batch_progress"]["total"]["completed"]}

    def on_train_start(self, trainer, pl_module):
        self.start_step = trainer.global_step
        epoch_loop = trainer.fit_loop.epoch_loop
        self.restored = {"batches_that_stepped": epoch_loop._batches_that_stepped,
                         "batches_completed": epoch_loop.batch_progress.total.completed}
        if self.loaded:
            self.resumed_probe = self._probe(pl_module)
        if self.resave:
            trainer.save_checkpoint(self.resave)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--strategy", choices=["ours", "stock"], required=True)
    p.add_argument("--model", choices=["transformer", "trainer-tiny", "mlp"], default="transformer")
    p.add_argument("--data", default=None)
    p.add_argument("--state-dict-type", default="sharded")
    p.add_argument("--max-steps", type=int, required=True)
    p.add_argument("--every", type=int, default=0, help="save every N steps (default: at max-steps)")
    p.add_argument("--save-last", action="store_true")
    p.add_argument("--ckpt-path", default=None)
    p.add_argument("--async-save", action="store_true")
    p.add_argument("--resave", default=None, help="save to this path right after the resume")
    p.add_argument("--save-to", default=None, help="trainer.save_checkpoint here at the end")
    p.add_argument("--remove", default=None, help="trainer.strategy.remove_checkpoint this at the end")
    p.add_argument("--plain-sgd", action="store_true", help="transformer: SGD without momentum (no state)")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    global PLAIN_SGD
    PLAIN_SGD = args.plain_sgd
    run(args, args.model, args.root, args.out)


def run(args: argparse.Namespace, model_name: str, root: str, out: str | None) -> None:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    torch.manual_seed(1234)
    if model_name in ("transformer", "trainer-tiny"):
        # shardpoint-train's blocks are 35 tokens and its global batch 4 items
        tiny = model_name == "trainer-tiny"
        dataset = WikiText2(Path(args.data), block_size=35 if tiny else 16, download=False)
        model = (TrainerTiny if tiny else TinyTransformer)(dataset.vocab_size)
        loader = DataLoader(dataset, batch_size=max(1, 4 // world) if tiny else 4)
        policy = {nn.TransformerEncoderLayer, nn.TransformerDecoderLayer}
        probe = next(iter(DataLoader(dataset, batch_size=4)))
    else:
        dataset = mlp_data()
        model = TinyMLP()
        loader = DataLoader(dataset, batch_size=8)
        policy = None
        probe = (dataset.tensors[0][:16], dataset.tensors[1][:16])

    kwargs = dict(state_dict_type=args.state_dict_type, auto_wrap_policy=policy)
    if args.strategy == "ours":
        from shardpoint.lightning import FSDPStrategy

        strategy = FSDPStrategy(async_save=args.async_save, **kwargs)
    else:
        strategy = StockCpuFSDPStrategy(**kwargs)

    checkpointing = ModelCheckpoint(dirpath=os.path.join(root, "checkpoints"),
                                    every_n_train_steps=args.every or args.max_steps, save_top_k=-1,
                                    save_last=args.save_last or None)
    recorder = Recorder(probe, args.resave)
    trainer = pl.Trainer(accelerator="cpu", devices=world, strategy=strategy, max_steps=args.max_steps,
                         default_root_dir=root, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[checkpointing, recorder], num_sanity_val_steps=0,
                         limit_val_batches=0)
    started = time.perf_counter()
    trainer.fit(model, train_dataloaders=loader, ckpt_path=args.ckpt_path)
    if args.save_to:
        trainer.save_checkpoint(args.save_to)
    if args.remove:
        trainer.strategy.remove_checkpoint(args.remove)
        trainer.strategy.barrier()
    seconds = time.perf_counter() - started
    if trainer.is_global_zero and out:
        Path(out).write_text(json.dumps({
            "world": world, "losses": model.losses, "start_step": recorder.start_step,
            "global_step": trainer.global_step, "loaded": recorder.loaded, "restored": recorder.restored, "resumed_probe": recorder.resumed_probe,
            "seconds": seconds,
        }))
    print(f"rank {trainer.global_rank}: done, global_step {trainer.global_step}", flush=True)
    rank_exit.leave(0)  # from here, while this frame still holds the trainer and its group


if __name__ == "__main__":
    main()
