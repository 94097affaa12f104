"""One rank of the ModelParallelStrategy tests (test_lightning_model_parallel.py launches it
with run_ranks; it also generates the fixtures those tests read).

    python lightning_mp_worker.py --root DIR --strategy ours|stock --max-steps N [options]

The real Lightning 2.6 Trainer with ``ModelParallelStrategy`` on CPU (gloo): the models of
lightning_worker.py given a ``configure_model`` that applies FSDP2's ``fully_shard`` over
the data-parallel mesh (every rank: data_parallel_size = world, tensor_parallel_size = 1),
each transformer layer first, then the root. ``stock`` is Lightning's own
``ModelParallelStrategy`` untouched (it runs on CPU as it is); ``ours`` is
``shardpoint.lightning.ModelParallelStrategy``. ``single``, run as one process without
ranks, is a single-device Trainer (no strategy, no sharding) that resumes from a full
checkpoint, such as the output of ``shardpoint consolidate``. Rank 0 writes ``--out`` (JSON) as
lightning_worker.py does, plus the optimizer state restored by a resume.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import time
from pathlib import Path

faulthandler.enable(all_threads=True)

import torch
import torch.nn as nn
import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos import WikiText2
from torch.utils.data import DataLoader

import rank_exit
from lightning_worker import Recorder, TinyMLP, TinyTransformer, mlp_data


def shard(module: nn.Module, mesh, layer_types) -> None:
    from torch.distributed.fsdp import fully_shard

    for sub in module.modules():
        if isinstance(sub, layer_types):
            fully_shard(sub, mesh=mesh)
    fully_shard(module, mesh=mesh)


class ShardedTransformer(TinyTransformer):
    def configure_model(self) -> None:
        if self.device_mesh is not None:
            shard(self.model, self.device_mesh["data_parallel"], (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer))


class ShardedMLP(TinyMLP):
    def configure_model(self) -> None:
        if self.device_mesh is not None:
            shard(self.net, self.device_mesh["data_parallel"], (nn.Linear,))


class OptimizerProbe(Recorder):
    """Recorder, plus the restored optimizer state's tensors (sum of each) right after a resume."""

    def on_train_start(self, trainer, pl_module):
        # Named before the probe's forward: FSDP2 leaves the root's parameters unsharded
        # after it, so named_parameters() would no longer give the optimizer's.
        names = {id(p): n for n, p in pl_module.named_parameters()}
        super().on_train_start(trainer, pl_module)
        if not self.loaded:
            return
        optimizer = trainer.optimizers[0]
        entries = sorted(((f"{names[id(p)]}/{k}", v) for p, s in optimizer.state.items() for k, v in s.items()
                          if isinstance(v, torch.Tensor) and v.dim() > 0), key=lambda e: e[0])
        # A DTensor's full value is gathered (every rank, in the same order).
        self.optimizer_sums = {name: float((v.full_tensor() if hasattr(v, "full_tensor") else v).double().sum())
                               for name, v in entries}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--strategy", choices=["ours", "stock", "single"], required=True)
    p.add_argument("--model", choices=["transformer", "mlp"], default="transformer")
    p.add_argument("--data", default=None)
    p.add_argument("--max-steps", type=int, required=True)
    p.add_argument("--every", type=int, default=0, help="save every N steps (default: at max-steps)")
    p.add_argument("--save-last", action="store_true")
    p.add_argument("--ckpt-path", default=None)
    p.add_argument("--async-save", action="store_true")
    p.add_argument("--full", action="store_true", help="save_distributed_checkpoint=False")
    p.add_argument("--save-to", default=None, help="trainer.save_checkpoint here at the end")
    p.add_argument("--out", default=None)
    args = p.parse_args()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    torch.manual_seed(1234)
    if args.model == "transformer":
        dataset = WikiText2(Path(args.data), block_size=16, download=False)
        model = ShardedTransformer(dataset.vocab_size)
        loader = DataLoader(dataset, batch_size=4)
        probe = next(iter(DataLoader(dataset, batch_size=4)))
    else:
        dataset = mlp_data()
        model = ShardedMLP()
        loader = DataLoader(dataset, batch_size=8)
        probe = (dataset.tensors[0][:16], dataset.tensors[1][:16])

    if args.strategy == "single":
        strategy = "auto"
    else:
        kwargs = dict(data_parallel_size=world, tensor_parallel_size=1, save_distributed_checkpoint=not args.full)
        if args.strategy == "ours":
            from shardpoint.lightning import ModelParallelStrategy

            strategy = ModelParallelStrategy(async_save=args.async_save, **kwargs)
        else:
            from lightning.pytorch.strategies import ModelParallelStrategy

            strategy = ModelParallelStrategy(**kwargs)

    checkpointing = ModelCheckpoint(dirpath=os.path.join(args.root, "checkpoints"),
                                    every_n_train_steps=args.every or args.max_steps, save_top_k=-1,
                                    save_last=args.save_last or None)
    recorder = OptimizerProbe(probe, None)
    trainer = pl.Trainer(accelerator="cpu", devices=world, strategy=strategy, max_steps=args.max_steps,
                         default_root_dir=args.root, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[checkpointing, recorder], num_sanity_val_steps=0,
                         limit_val_batches=0)
    started = time.perf_counter()
    trainer.fit(model, train_dataloaders=loader, ckpt_path=args.ckpt_path)
    if args.save_to:
        trainer.save_checkpoint(args.save_to)
    seconds = time.perf_counter() - started
    if trainer.is_global_zero and args.out:
        Path(args.out).write_text(json.dumps({
            "world": world, "losses": model.losses, "start_step": recorder.start_step,
            "global_step": trainer.global_step, "loaded": recorder.loaded, "restored": recorder.restored,
            "resumed_probe": recorder.resumed_probe, "optimizer_sums": getattr(recorder, "optimizer_sums", {}),
            "seconds": seconds,
        }))
    print(f"rank {trainer.global_rank}: done, global_step {trainer.global_step}", flush=True)
    # Lightning's ModelParallelStrategy leaves its process group to exit, where gloo's
    # threads abort the process ("terminate called without an active exception").
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    rank_exit.leave(0)


if __name__ == "__main__":
    main()
