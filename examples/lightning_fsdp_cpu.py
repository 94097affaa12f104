"""The seed's workflow in Python, on CPU: PyTorch Lightning + FSDP with shardpoint's strategy.

    python examples/lightning_fsdp_cpu.py [--workdir DIR] [--data DIR]

1. train Lightning's demo Transformer LM (``lightning.pytorch.demos``) on 4 processes
   (Lightning's own launcher, gloo) with sharded checkpoints through
   ``shardpoint.lightning.FSDPStrategy``: a checkpoint at step 4;
2. resume it on 2 processes (another world size) to step 8;
3. ``shardpoint.consolidate`` the step-8 checkpoint into one file;
4. ``torch.load`` it and print what happened: keys, global_step, the loss curve, times.

Data: the repository's data/tiny-wikitext through Lightning's ``WikiText2`` (no download).
Needs lightning and shardpoint importable (scripts/demo.sh sets PYTHONPATH to the wheel).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def phase_train(args: argparse.Namespace) -> None:
    """One Trainer.fit on ``args.devices`` processes (Lightning re-runs this script for ranks 1..N-1)."""
    import torch
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.demos import LightningTransformer, Transformer, WikiText2
    from torch.utils.data import DataLoader

    from shardpoint.lightning import FSDPStrategy

    class LM(LightningTransformer):
        def __init__(self, vocab_size: int) -> None:
            super().__init__(vocab_size=vocab_size)
            # Lightning's demo Transformer, half as wide (still 2+2 layers) to stay quick on 2 cores
            self.model = Transformer(vocab_size=vocab_size, ninp=64, nhead=2, nhid=128, nlayers=2)
            self.losses: dict = {}

        def prepare_data(self) -> None:
            pass  # the demo's would download WikiText-2; the data is local

        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.losses[self.trainer.global_step + 1] = round(float(loss.detach()), 4)
            return loss

    torch.manual_seed(42)
    dataset = WikiText2(Path(args.data), block_size=32, download=False)
    model = LM(dataset.vocab_size)
    trainer = pl.Trainer(
        accelerator="cpu", devices=args.devices, max_steps=args.max_steps,
        strategy=FSDPStrategy(state_dict_type="sharded", async_save=args.async_save,
                              auto_wrap_policy={torch.nn.TransformerEncoderLayer, torch.nn.TransformerDecoderLayer}),
        callbacks=[ModelCheckpoint(dirpath=args.ckpt_dir, every_n_train_steps=4, save_top_k=-1)],
        default_root_dir=args.workdir, logger=False, enable_progress_bar=False, enable_model_summary=False,
    )
    started = time.perf_counter()
    trainer.fit(model, DataLoader(dataset, batch_size=8), ckpt_path=args.ckpt_path)
    if trainer.is_global_zero:
        Path(args.report).write_text(json.dumps({
            "devices": args.devices, "losses": model.losses, "global_step": trainer.global_step,
            "fit_seconds": round(time.perf_counter() - started, 2),
            "save_stalls": [round(x, 3) for x in trainer.strategy.save_stalls],
            "load_seconds": trainer.strategy.load_seconds and round(trainer.strategy.load_seconds, 3),
        }))


def run_phase(workdir: Path, data: Path, devices: int, max_steps: int, report: Path, ckpt_path: str | None,
              async_save: bool) -> dict:
    cmd = [sys.executable, __file__, "--phase", "train", "--workdir", str(workdir), "--data", str(data),
           "--devices", str(devices), "--max-steps", str(max_steps), "--report", str(report),
           "--ckpt-dir", str(workdir / "checkpoints")]
    if ckpt_path:
        cmd += ["--ckpt-path", ckpt_path]
    if async_save:
        cmd.append("--async-save")
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME=os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
               PYTHONWARNINGS="ignore")
    log = report.with_suffix(".log")
    started = time.perf_counter()
    with open(log, "w") as out:  # Lightning's and every rank's output; shown when a phase fails
        done = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        sys.stdout.write(log.read_text()[-6000:])
        raise SystemExit(f"lightning demo: the {devices}-process phase failed (exit {done.returncode}); log: {log}")
    result = json.loads(report.read_text())
    result["wall_seconds"] = round(time.perf_counter() - started, 1)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--phase", default="all")
    p.add_argument("--workdir", default=None)
    p.add_argument("--data", default=None, help="a folder with wikitext-2.txt (default: data/tiny-wikitext)")
    p.add_argument("--devices", type=int, default=4)
    p.add_argument("--max-steps", type=int, default=4)
    p.add_argument("--report", default=None)
    p.add_argument("--ckpt-dir", default=None)
    p.add_argument("--ckpt-path", default=None)
    p.add_argument("--async-save", action="store_true")
    args = p.parse_args()
    if args.phase == "train":
        phase_train(args)
        return

    import torch

    import shardpoint

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="shardpoint-lightning-demo-"))
    data = Path(args.data) if args.data else workdir / "data"
    if not args.data:
        data.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / "data" / "tiny-wikitext" / "train.txt", data / "wikitext-2.txt")
    ckpts = workdir / "checkpoints"

    print("== 1. train on 4 CPU processes (FSDP, gloo), sharded checkpoint at step 4 through shardpoint")
    first = run_phase(workdir, data, 4, 4, workdir / "phase1.json", None, async_save=False)
    step4 = ckpts / "epoch=0-step=4.ckpt"
    files = sorted(p.name for p in step4.iterdir())
    print(f"   {first['wall_seconds']} s (fit {first['fit_seconds']} s); {step4.name}: {', '.join(files)}")

    print("== 2. resume on 2 processes (another world size) to step 8, async sharded saves")
    second = run_phase(workdir, data, 2, 8, workdir / "phase2.json", str(step4), async_save=True)
    step8 = ckpts / "epoch=0-step=8.ckpt"
    print(f"   {second['wall_seconds']} s (fit {second['fit_seconds']} s, of which loading the step-4 checkpoint"
          f" {second['load_seconds']} s); global_step {second['global_step']}")

    print("== 3. shardpoint.consolidate the step-8 checkpoint")
    report = shardpoint.consolidate(step8, workdir / "model.ckpt")
    print(f"   {report.tensors} tensors, {report.tensor_bytes / 1e6:.2f} MB in {report.seconds:.3f} s"
          f" -> {report.output}")
    print(f"   verify: {'clean' if shardpoint.verify(step8).ok else 'DAMAGED'}")

    print("== 4. torch.load the consolidated file")
    ckpt = torch.load(report.output, weights_only=False)
    params = ckpt["state_dict"]
    print(f"   keys: {list(ckpt)}")
    print(f"   state_dict: {len(params)} tensors, {sum(t.numel() for t in params.values()):,} parameters;"
          f" optimizer_states: {len(ckpt['optimizer_states'])}")
    print(f"   epoch={ckpt['epoch']} global_step={ckpt['global_step']}")
    curve = {**first["losses"], **second["losses"]}
    print("   loss curve: " + ", ".join(f"{s}:{curve[s]:.3f}" + ("|" if s == "4" else "")
                                         for s in sorted(curve, key=int)) + "  (| = resumed on 2 ranks)")
    sizes = {p.name: sum(f.stat().st_size for f in p.iterdir()) for p in sorted(ckpts.iterdir())}
    print("   checkpoints: " + ", ".join(f"{n} {b / 1e6:.2f} MB" for n, b in sizes.items()))
    print(f"   training stalled per save (rank 0): on 4 ranks, sync {first['save_stalls']} s;"
          f" on 2 ranks, async {second['save_stalls']} s (the write went on in the background)")
    print("lightning demo: OK")


if __name__ == "__main__":
    main()
