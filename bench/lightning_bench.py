"""Lightning's sharded checkpoint save and load on CPU: shardpoint.lightning.FSDPStrategy
(sync and async) against Lightning's stock FSDPStrategy, at its defaults and at PyTorch's best
settings that run here, in one invocation.

    python bench/lightning_bench.py [--gib 1.0] [--devices 2] [--saves 3] [--rounds 2] [--dir DIR]

Each configuration is one Trainer.fit (Lightning's launcher, ``--devices`` CPU processes, gloo)
of an MLP of 2048x2048 Linear layers (each its own FSDP unit) with SGD + momentum, sized so
parameters + optimizer state are about ``--gib`` GiB. After the first optimizer step it saves
``--saves`` sharded checkpoints and measures, on rank 0, three times per save:

- returned: how long ``trainer.save_checkpoint`` blocked training;
- state may change: until the copy an async save writes from is complete (shardpoint's
  ``wait_for_staging``, what its ``optimizer_step`` waits for; a sync save: = returned);
- committed: until the checkpoint was committed (async: after waiting for the background write);

and, apart: the strategy's own part of ``returned`` (``strategy.save_checkpoint``: writing the
state dict Lightning and FSDP built before, or staging it); ``load``: ``strategy.load_checkpoint``
of the last one (model + optimizer), page cache dropped first (root; else warm): shardpoint's
O_DIRECT writes leave the page cache empty, the stock strategy's buffered ones leave it full, so
a warm comparison would time one cold load against one warm one.

Configurations:
- ``stock``: Lightning's FSDPStrategy as it comes (``dcp.save`` with PyTorch's defaults);
- ``stock-best``: the same strategy with its ``dcp.save`` given PyTorch's best settings that run
  here: ``FileSystemWriter(thread_count=4)`` and ``DefaultSavePlanner(enable_plan_caching=True)``;
- ``stock-best-async``: ``dcp.async_save`` with those settings. PyTorch's ``DefaultStager``
  cannot copy the ShardedTensors of FSDP's sharded state dict (PyTorch 2.15: "torch function
  'data_ptr' ... not supported for ShardedTensor"), so the staging is FileSystemWriter's own
  (blocking; its cached variant pins memory, which needs a GPU): returned = state may change;
- ``shardpoint``, ``shardpoint-async``: shardpoint.lightning.FSDPStrategy (thread_count 1, plan
  caching), sync and ``async_save=True`` (staging on a thread, waited for before the optimizer
  step);
- ``lightning-alone``: shardpoint's strategy with a DCP writer that writes no tensor bytes and a
  reader that reads none (bench/python_dcp_bench.py's DCP-alone classes): what is left is
  Lightning's, FSDP's and DCP's own work, which no storage layer can remove. The best stock
  times over it are the highest ratios any storage layer can reach here (printed as "ceiling").

Ratios are from medians over every save of every round (min/median/max shown), each against
the best stock configuration of its kind (sync: the faster of stock and stock-best; async:
stock-best-async). PyTorch 2.6 has no Lightning in the oracle root, so no 2.6 column.

Needs lightning and shardpoint importable (PYTHONPATH=build-wheel/site). Prints Markdown tables.
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
CONFIGS = ["stock", "stock-best", "stock-best-async", "shardpoint", "shardpoint-async", "lightning-alone"]


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
            stalls, staged, done = [], [], []
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
                if hasattr(trainer.strategy, "wait_for_staging"):
                    trainer.strategy.wait_for_staging()
                staged.append(time.perf_counter() - started)
                if hasattr(trainer.strategy, "wait_for_save"):
                    trainer.strategy.wait_for_save()
                if pending:
                    pending.pop().result()
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
            self.result = {"stall": stalls, "staged": staged, "done": done, "write": writes,
                           "load": time.perf_counter() - started}

    pending: list = []  # stock-best-async: the save in flight's future
    if args.config.startswith("stock-best"):
        import inspect

        import lightning.pytorch.strategies.fsdp as lightning_fsdp
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import DefaultSavePlanner

        caching = "enable_plan_caching" in inspect.signature(DefaultSavePlanner.__init__).parameters
        groups: list = []

        def best_save(converted_state, path) -> None:
            """Lightning's dcp.save call, at PyTorch's best settings (plan caching; 4 threads)."""
            writer = dcp.FileSystemWriter(path, thread_count=4)
            planner = DefaultSavePlanner(enable_plan_caching=True) if caching else DefaultSavePlanner()
            if args.config == "stock-best":
                dcp.save(converted_state, storage_writer=writer, planner=planner)
                return
            if not groups:  # the background save's collectives stay off Lightning's group
                groups.append(dist.new_group(backend="gloo"))
            pending.append(dcp.async_save(converted_state, storage_writer=writer, planner=planner,
                                          process_group=groups[0]))

        lightning_fsdp._distributed_checkpoint_save = best_save
    if args.config.startswith("stock"):
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
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--dir", default=None)
    p.add_argument("--config", default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.config:
        worker(args)
        return
    root = Path(args.dir or tempfile.mkdtemp(prefix="shardpoint-lightning-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    runs: dict = {config: [] for config in CONFIGS}
    loadavg = []
    for rnd in range(args.rounds):
        loadavg.append(os.getloadavg()[0])
        for config in CONFIGS:
            out = root / f"{config}.json"
            cmd = [sys.executable, __file__, "--config", config, "--out", str(out), "--dir", str(root),
                   "--gib", str(args.gib), "--devices", str(args.devices), "--saves", str(args.saves)]
            env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", PYTHONWARNINGS="ignore")
            with open(root / f"{config}.log", "w") as log:
                subprocess.run(cmd, check=True, env=env, stdout=log, stderr=subprocess.STDOUT)
            runs[config].append(json.loads(out.read_text()))
            for i in range(args.saves):
                shutil.rmtree(root / f"{config}-{i}.ckpt", ignore_errors=True)
        print(f"round {rnd + 1}/{args.rounds} done", file=sys.stderr, flush=True)

    def values(config: str, key: str) -> list:
        return [v for r in runs[config] for v in (r[key] if isinstance(r[key], list) else [r[key]])]

    def med(config: str, key: str) -> float:
        return statistics.median(values(config, key))

    def triple(config: str, key: str) -> str:
        v = values(config, key)
        return f"{min(v):.2f} / {statistics.median(v):.2f} / {max(v):.2f}"

    gib = runs["stock"][0]["state_bytes"] / (1 << 30)
    print(f"{args.devices} CPU ranks, sharded state {gib:.2f} GiB (parameters + momentum), {args.saves} saves x "
          f"{args.rounds} rounds each; seconds on rank 0, min / median / max; load average at round start "
          f"{', '.join(f'{x:.1f}' for x in loadavg)} on {os.cpu_count()} CPUs")
    print("| strategy | returned | state may change | committed | of returned: strategy.save_checkpoint |"
          " load (model + optimizer) |")
    print("|---|---|---|---|---|---|")
    for config in CONFIGS:
        print(f"| {config} | {triple(config, 'stall')} | {triple(config, 'staged')} | {triple(config, 'done')} |"
              f" {triple(config, 'write')} | {triple(config, 'load')} |")
    best_sync = min(("stock", "stock-best"), key=lambda c: med(c, "done"))
    best_load = min(("stock", "stock-best"), key=lambda c: med(c, "load"))
    rows = [("sync save, committed", "shardpoint", best_sync, "done"),
            ("async save, returned", "shardpoint-async", "stock-best-async", "stall"),
            ("async save, state may change", "shardpoint-async", "stock-best-async", "staged"),
            ("async save, committed", "shardpoint-async", "stock-best-async", "done"),
            ("load", "shardpoint", best_load, "load")]
    print()
    print("| job (medians) | shardpoint s | PyTorch's best s | which | PyTorch / shardpoint | ceiling (PyTorch / "
          "lightning-alone) |")
    print("|---|---|---|---|---|---|")
    for job, ours, theirs, key in rows:
        ceiling = med(theirs, key) / med("lightning-alone", key) if key in ("done", "load") else None
        print(f"| {job} | {med(ours, key):.3f} | {med(theirs, key):.3f} | {theirs} | "
              f"{med(theirs, key) / med(ours, key):.2f}x | {f'{ceiling:.2f}x' if ceiling else '-'} |")

if __name__ == "__main__":
    main()
