"""Lightning's sharded checkpoint save and load on CPU: shardpoint.lightning.FSDPStrategy
(sync and async) against Lightning's stock FSDPStrategy, in one invocation.

    python bench/lightning_bench.py [--gib 1.0] [--devices 2] [--saves 3] [--dir DIR]

Each configuration is one Trainer.fit (Lightning's launcher, ``--devices`` CPU processes, gloo)
of an MLP of 2048x2048 Linear layers (each its own FSDP unit) with SGD + momentum, sized so
parameters + optimizer state are about ``--gib`` GiB. After the first optimizer step it saves
``--saves`` sharded checkpoints and measures, on rank 0:

- stall: how long ``trainer.save_checkpoint`` blocked training (async: the copy to host memory);
- of it in ``strategy.save_checkpoint``: the strategy's own part (writing the state dict that
  Lightning and FSDP built before, or staging it for the async write); the rest of the stall,
  building the state dict (FSDP's sharded model and optimizer state dicts), is the same code
  for both strategies;
- done: until the checkpoint was committed (async: after waiting for the background write);
- load: ``strategy.load_checkpoint`` of the last one (model + optimizer), page cache dropped
  first (root; else warm): shardpoint's O_DIRECT writes leave the page cache empty, the stock
  strategy's buffered ones leave it full, so a warm comparison would time one cold load
  against one warm one.

``lightning-alone`` is shardpoint's strategy with a DCP writer that writes no tensor bytes and a
reader that reads none (bench/python_dcp_bench.py's DCP-alone classes): what is left is
Lightning's, FSDP's and DCP's own work, which no storage layer can remove. The stock strategy's
times over it are the highest ratios any storage layer can reach here (printed as "ceiling").

Needs lightning and shardpoint importable (PYTHONPATH=build-wheel/site). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LAYER = 2048
CONFIGS = ["stock", "shardpoint", "shardpoint-async", "lightning-alone"]


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.nn as nn
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.strategies import FSDPStrategy as LightningFSDPStrategy
    from torch.utils.data import DataLoader, TensorDataset

    class StockCpu(LightningFSDPStrategy):
        """Lightning's strategy; only FSDP's device_id=cpu added (what CPU needs)."""

        def _setup_model(self, model):
            from torch.distributed.fsdp import FullyShardedDataParallel

            kwargs = {k: v for k, v in self.kwargs.items()}
            wrapped = FullyShardedDataParallel(module=model, sharding_strategy=self.sharding_strategy,
                                               device_id=torch.device("cpu"), **kwargs)
            saved, self.kwargs = self.kwargs, {k: v for k, v in kwargs.items() if k != "auto_wrap_policy"}
            try:
                return super()._setup_model(wrapped)
            finally:
                self.kwargs = saved

    # parameters + momentum = 2 * 4 bytes per parameter
    layers = max(1, round(args.gib * (1 << 30) / (8 * LAYER * LAYER)))

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(*[nn.Linear(LAYER, LAYER) for _ in range(layers)])

        def training_step(self, batch, batch_idx):
            return self.net(batch[0]).square().mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-6, momentum=0.9)

    class Measure(Callback):
        def __init__(self) -> None:
            self.result: dict = {}

        def on_train_batch_end(self, trainer, *_: object) -> None:
            if trainer.global_step != 1:
                return
            stalls, done = [], []
            # The strategy's own part of a save (what it does with the state dict Lightning
            # built: write it, or stage it for an async write), timed apart from the rest.
            writes: list = []
            strategy = trainer.strategy
            own_save = strategy.save_checkpoint

            def timed_save(*a, **k):
                started = time.perf_counter()
                try:
                    return own_save(*a, **k)
                finally:
                    writes.append(time.perf_counter() - started)

            strategy.save_checkpoint = timed_save
            path = None
            for i in range(args.saves):
                path = os.path.join(args.dir, f"{args.config}-{i}.ckpt")
                started = time.perf_counter()
                trainer.save_checkpoint(path)
                stalls.append(time.perf_counter() - started)
                if hasattr(trainer.strategy, "wait_for_save"):
                    trainer.strategy.wait_for_save()
                trainer.strategy.barrier()
                done.append(time.perf_counter() - started)
            # Cold for every strategy: shardpoint writes with O_DIRECT, which leaves nothing in
            # the page cache, while the stock strategy's buffered writes leave all of it there.
            if trainer.is_global_zero:
                from benchlib import drop_caches

                drop_caches()
            trainer.strategy.barrier()
            started = time.perf_counter()
            trainer.strategy.load_checkpoint(path)
            trainer.strategy.barrier()
            strategy.save_checkpoint = own_save
            self.result = {"stall": stalls, "done": done, "write": writes, "load": time.perf_counter() - started}

    if args.config == "stock":
        strategy = StockCpu(state_dict_type="sharded", auto_wrap_policy={nn.Linear})
    elif args.config == "lightning-alone":
        import torch.distributed.checkpoint as dcp
        import shardpoint.lightning as sp_lightning
        from python_dcp_bench import dcp_alone_classes

        null_writer, null_reader = dcp_alone_classes(dcp)
        sp_lightning.StorageWriter = null_writer  # writes .metadata only; meta.pt as usual
        strategy = sp_lightning.FSDPStrategy(state_dict_type="sharded", auto_wrap_policy={nn.Linear})
        strategy._reader = null_reader
    else:
        from shardpoint.lightning import FSDPStrategy

        strategy = FSDPStrategy(state_dict_type="sharded", auto_wrap_policy={nn.Linear},
                                async_save=args.config.endswith("async"))
    measure = Measure()
    trainer = pl.Trainer(accelerator="cpu", devices=args.devices, strategy=strategy, max_steps=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[measure])
    data = TensorDataset(torch.randn(8 * args.devices, LAYER))
    trainer.fit(Model(), DataLoader(data, batch_size=8))
    if trainer.is_global_zero:
        state_bytes = sum(p.numel() for p in trainer.lightning_module.parameters()) * 4 * args.devices * 2
        Path(args.out).write_text(json.dumps({**measure.result, "layers": layers, "state_bytes": state_bytes}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--saves", type=int, default=3)
    p.add_argument("--dir", default=None)
    p.add_argument("--config", default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.config:
        worker(args)
        return
    root = Path(args.dir or tempfile.mkdtemp(prefix="shardpoint-lightning-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    rows = []
    for config in CONFIGS:
        out = root / f"{config}.json"
        cmd = [sys.executable, __file__, "--config", config, "--out", str(out), "--dir", str(root),
               "--gib", str(args.gib), "--devices", str(args.devices), "--saves", str(args.saves)]
        env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", PYTHONWARNINGS="ignore")
        with open(root / f"{config}.log", "w") as log:
            subprocess.run(cmd, check=True, env=env, stdout=log, stderr=subprocess.STDOUT)
        r = json.loads(out.read_text())
        rows.append((config, r))
        for i in range(args.saves):
            shutil.rmtree(root / f"{config}-{i}.ckpt", ignore_errors=True)
    gib = rows[0][1]["state_bytes"] / (1 << 30)
    print(f"{args.devices} CPU ranks, sharded state {gib:.2f} GiB (parameters + momentum), {args.saves} saves each;"
          " median seconds on rank 0")
    print("| strategy | stall per save | of it in strategy.save_checkpoint | save until committed |"
          " load (model + optimizer) |")
    print("|---|---|---|---|---|")
    for config, r in rows:
        print(f"| {config} | {statistics.median(r['stall']):.2f} | {statistics.median(r['write']):.2f} |"
              f" {statistics.median(r['done']):.2f} | {r['load']:.2f} |")
    by_name = dict(rows)
    if "lightning-alone" in by_name:
        alone, stock = by_name["lightning-alone"], by_name["stock"]
        print(f"ceiling (stock / lightning-alone, the highest ratio a storage layer can reach): save until committed "
              f"{statistics.median(stock['done']) / statistics.median(alone['done']):.2f}x, load "
              f"{stock['load'] / alone['load']:.2f}x; shardpoint's: save "
              f"{statistics.median(stock['done']) / statistics.median(by_name['shardpoint']['done']):.2f}x, load "
              f"{stock['load'] / by_name['shardpoint']['load']:.2f}x")
    print("per save (stall / save_checkpoint / committed): " + "; ".join(
        f"{c}: " + ", ".join(f"{s:.2f}/{w:.2f}/{d:.2f}" for s, w, d in zip(r["stall"], r["write"], r["done"]))
        for c, r in rows))


if __name__ == "__main__":
    main()
