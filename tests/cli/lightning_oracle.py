"""PyTorch side of the `shardpoint consolidate` interop tests.

    lightning_oracle.py save DIR            (PyTorch 2.6, scripts/oracle-python)
        dcp.save on 3 gloo ranks of a Lightning-Trainer-shaped state (DTensors: uneven
        Shard(0), Shard(1), bf16, 0-dim, nested optimizer state, optimizer_abc), then rank 0
        writes a Lightning-shaped meta.pt (ModelCheckpoint state holding tensors).
    lightning_oracle.py check DIR OUT [--layout trainer|fabric|dcp] [--summary FILE]
        expected = what Lightning 2.6 computes: _load_state_dict(..., _EmptyStateDictLoadPlanner(),
        no_dist=True), meta.pt merged on top (dcp: where the folder has one), _format_checkpoint's renaming
        (trainer). OUT must load with torch.load(weights_only=True) and equal it exactly
        (top-level key order, nested keys, tensor dtype/shape/values/device, objects).
        --summary writes {path: description} for the 1.13 check.
    lightning_oracle.py safetensors DIR FILE_OR_FOLDER
        safetensors.torch.load_file (of every file in the index) equals expected["state_dict"].
    lightning_oracle.py load113 OUT SUMMARY     (Debian's PyTorch 1.13, /usr/bin/python3)
        torch.load(OUT, weights_only=False) and compare with SUMMARY. weights_only=False
        because 1.13's weights-only unpickler has no BINFLOAT opcode and this file holds
        Python floats (lr, betas).
Prints nothing and exits 0 when everything matches; otherwise the differences and exit 1.
"""

import hashlib
import json
import os
import re
import sys
import warnings

warnings.filterwarnings("ignore")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "oracle"))

WORLD = 3
MC_KEY = ("ModelCheckpoint{'monitor': None, 'mode': 'min', 'every_n_train_steps': 0, "
          "'every_n_epochs': 1, 'train_time_interval': None}")


def values(shape, dtype, salt):
    import torch
    n = 1
    for s in shape:
        n *= s
    t = (torch.arange(n, dtype=torch.float64) * 0.25 + salt).reshape(shape)
    return t.to(dtype)


def save_job(rank, world_size, directory):
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world_size,))

    def d(t, dim):
        return distribute_tensor(t, mesh, [Shard(dim)])

    state = {
        "model": {
            "model.layer.weight": d(values((10, 6), torch.float32, 1.0), 0),    # 4, 4, 2 rows
            "model.layer.bias": d(values((7,), torch.bfloat16, -2.0), 0),
            "model.emb.weight": d(values((4, 9), torch.float32, 3.0), 1),      # dim-1 shards
            "model.scale": values((), torch.float32, 42.5),                    # 0-dim, replicated
        },
        "optimizer_0": {
            "state": {
                "model.layer.weight": {
                    "step": torch.tensor(3.0),
                    "exp_avg": d(values((10, 6), torch.float32, -1.0), 0),
                },
            },
            "param_groups": [{"lr": 0.01, "betas": (0.9, 0.999), "weight_decay": 0,
                              "params": ["model.layer.weight", "model.layer.bias"]}],
        },
        "optimizer_abc": {"kept": 1},
    }
    dcp.save(state, checkpoint_id=directory)
    if rank == 0:
        meta = {
            "epoch": 1,
            "global_step": 3,
            "pytorch-lightning_version": "2.6.0",
            "loops": {"fit_loop": {"state_dict": {}, "epoch_progress": {
                "total": {"ready": 2, "started": 2, "processed": 2, "completed": 1},
                "current": {"ready": 2, "started": 2, "processed": 2, "completed": 1}},
                "epoch_loop.state_dict": {"_batches_that_stepped": 3}}},
            "callbacks": {MC_KEY: {
                "monitor": None, "best_model_score": None, "best_model_path": "",
                "current_score": None, "dirpath": "/tmp/ckpts",
                "best_k_models": {"/tmp/ckpts/a.ckpt": torch.tensor(0.5)},
                "kth_best_model_path": "", "kth_value": torch.tensor(float("inf")),
                "last_model_path": ""}},
            "lr_schedulers": [],
        }
        torch.save(meta, os.path.join(directory, "meta.pt"))


def expected_state(directory, layout):
    import torch
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    checkpoint = {}
    _load_state_dict(checkpoint, storage_reader=FileSystemReader(directory),
                     planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    meta = os.path.join(directory, "meta.pt")
    if layout == "dcp" and not os.path.isfile(meta):
        return checkpoint
    checkpoint.update(torch.load(meta, map_location="cpu"))
    if layout == "trainer":  # lightning.pytorch.utilities.consolidate_checkpoint._format_checkpoint
        checkpoint["state_dict"] = checkpoint.pop("model")
        keys = [k for k in checkpoint if re.match("optimizer_[0-9]+", k)]
        if keys:
            checkpoint["optimizer_states"] = [checkpoint.pop(f"optimizer_{i}") for i in range(len(keys))]
    return checkpoint


def diff(want, got, path, out):
    import torch
    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            out.append(f"{path}: expected a tensor, got {type(got).__name__}")
        elif (want.dtype != got.dtype or want.shape != got.shape or got.device.type != "cpu"
              or not torch.equal(want, got) and not (want.isnan().all() and got.isnan().all())):
            out.append(f"{path}: tensor differs: want {want.dtype} {tuple(want.shape)} {want.flatten()[:4].tolist()}, "
                       f"got {got.dtype} {tuple(got.shape)} {got.device} {got.flatten()[:4].tolist()}")
    elif isinstance(want, dict):
        if not isinstance(got, dict):
            out.append(f"{path}: expected a dict, got {type(got).__name__}")
            return
        if list(want.keys()) != list(got.keys()):
            out.append(f"{path}: keys differ: want {list(want.keys())}, got {list(got.keys())}")
            return
        for k in want:
            diff(want[k], got[k], f"{path}[{k!r}]", out)
    elif isinstance(want, (list, tuple)):
        if type(want) is not type(got) or len(want) != len(got):
            out.append(f"{path}: expected {type(want).__name__} of {len(want)}, got {got!r}")
            return
        for i, (a, b) in enumerate(zip(want, got)):
            diff(a, b, f"{path}[{i}]", out)
    elif type(want) is not type(got) or want != got:
        out.append(f"{path}: want {want!r}, got {got!r}")


def summarize(obj, path, out):
    import torch
    if isinstance(obj, torch.Tensor):
        t = obj.contiguous()
        raw = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
        digest = hashlib.sha256(raw.numpy().tobytes()).hexdigest() if t.dim() else repr(raw.item())
        out[path] = f"tensor {str(t.dtype)} {list(t.shape)} {digest}"
    elif isinstance(obj, dict):
        out[path + "/keys"] = repr(list(obj.keys()))
        for k, v in obj.items():
            summarize(v, f"{path}[{k!r}]", out)
    elif isinstance(obj, (list, tuple)):
        out[path + "/len"] = f"{type(obj).__name__} {len(obj)}"
        for i, v in enumerate(obj):
            summarize(v, f"{path}[{i}]", out)
    else:
        out[path] = repr(obj)


def flatten_tensors(obj, prefix, out):
    import torch
    if isinstance(obj, torch.Tensor):
        out[prefix] = obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            flatten_tensors(v, f"{prefix}.{k}" if prefix else str(k), out)


def main(argv):
    cmd = argv[1]
    if cmd == "save":
        import dcp_oracle
        dcp_oracle.run_ranks(save_job, world_size=WORLD, args=(os.path.abspath(argv[2]),), timeout_s=240)
        return 0
    if cmd == "check":
        import torch
        directory, out_path = argv[2], argv[3]
        layout = argv[argv.index("--layout") + 1] if "--layout" in argv else "trainer"
        want = expected_state(directory, layout)
        got = torch.load(out_path, weights_only=True)
        problems = []
        diff(want, got, "checkpoint", problems)
        if "--summary" in argv:
            summary = {}
            summarize(want, "checkpoint", summary)
            with open(argv[argv.index("--summary") + 1], "w") as f:
                json.dump(summary, f, indent=1, sort_keys=True)
        for p in problems:
            print(p)
        return 1 if problems else 0
    if cmd == "safetensors":
        from safetensors.torch import load_file
        directory, out_path = argv[2], argv[3]
        want = {}
        flatten_tensors(expected_state(directory, "trainer")["state_dict"], "", want)
        got = {}
        if os.path.isdir(out_path):
            with open(os.path.join(out_path, "model.safetensors.index.json")) as f:
                index = json.load(f)
            for name in sorted(set(index["weight_map"].values())):
                part = load_file(os.path.join(out_path, name))
                for k in part:
                    if index["weight_map"].get(k) != name:
                        print(f"{k}: in {name}, index says {index['weight_map'].get(k)}")
                        return 1
                got.update(part)
        else:
            got = load_file(out_path)
        problems = []
        if sorted(want) != sorted(got):
            problems.append(f"names differ: want {sorted(want)}, got {sorted(got)}")
        else:
            for k in want:
                diff(want[k], got[k], k, problems)
        for p in problems:
            print(p)
        return 1 if problems else 0
    if cmd == "load113":
        import torch
        got = torch.load(argv[2], weights_only=False, map_location="cpu")
        with open(argv[3]) as f:
            want = json.load(f)
        have = {}
        summarize(got, "checkpoint", have)
        problems = [f"{k}: want {want.get(k)}, got {have.get(k)}" for k in sorted(set(want) | set(have))
                    if want.get(k) != have.get(k)]
        for p in problems:
            print(p)
        return 1 if problems else 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
