"""PyTorch 2.6 side of the tests of objects that hold tensors (DCP bytes items whose
torch.save archive has storage records), run with scripts/oracle-python.

    object_items_oracle.py save DIR FILE
        dcp.save (one process) of state() into DIR: every key but "w" and "epoch" is a bytes
        item whose object holds tensors. Also torch.save({"ns": ..., "w": ...}) into FILE (an
        object inspect and reshard do not descend into, holding tensors).
    object_items_oracle.py check RESHARDED FILE_RESHARDED FOLDER=CONSOLIDATED...
        dcp.load of RESHARDED (and of FILE_RESHARDED) gives state() exactly; every
        CONSOLIDATED file, torch.load'ed, equals what format_utils.dcp_to_torch_save(FOLDER)
        gives, torch.load'ed: same structure and key order, same types (Parameter, tuple,
        SimpleNamespace), each tensor's dtype, shape, strides, storage offset, requires_grad
        and values, and the same storage sharing between tensors.
Prints nothing and exits 0 when everything matches; otherwise the differences and exit 1.
weights_only=False throughout: SimpleNamespace is not on the weights-only allow list.
"""

import os
import sys
import tempfile
import types
import warnings

warnings.filterwarnings("ignore")


def state():
    import torch

    base = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    big = torch.arange(3 << 18, dtype=torch.float32)  # 3 MiB: more than one copy buffer
    return {
        "w": torch.arange(6, dtype=torch.float32).reshape(2, 3),
        "pair": (torch.tensor([1.5, 2.5]), "l2"),
        # One storage, two views (the second not at offset 0, the third transposed).
        "views": (base, base[1:], base.t()),
        "ns": types.SimpleNamespace(d={"t": torch.tensor([7, 8, 9], dtype=torch.int64)}, name="x"),
        "param": (torch.nn.Parameter(torch.tensor([0.5, -1.0], dtype=torch.bfloat16)), 3),
        "big": (big, {"n": [big[:4]]}),
        "epoch": 7,
    }


def file_state():
    import torch

    s = state()
    return {"ns": s["ns"], "w": s["w"]}


def save(directory, file):
    import torch
    import torch.distributed.checkpoint as dcp

    dcp.save(state(), checkpoint_id=directory)
    torch.save(file_state(), file)


class Compare:
    def __init__(self):
        self.problems = []
        self.storages = {}  # id of a storage of `got` -> id of the matching one of `want`

    def same(self, got, want, path):
        import torch

        if type(got) is not type(want):
            self.problems.append(f"{path}: {type(got).__name__} != {type(want).__name__}")
            return
        if isinstance(want, torch.Tensor):
            for what in ("dtype", "shape", "requires_grad"):
                if getattr(got, what) != getattr(want, what):
                    self.problems.append(f"{path}: {what} {getattr(got, what)} != {getattr(want, what)}")
                    return
            if got.stride() != want.stride() or got.storage_offset() != want.storage_offset():
                self.problems.append(f"{path}: view {got.stride()}+{got.storage_offset()} != "
                                     f"{want.stride()}+{want.storage_offset()}")
            if got.untyped_storage().nbytes() != want.untyped_storage().nbytes():
                self.problems.append(f"{path}: storage of {got.untyped_storage().nbytes()} bytes != "
                                     f"{want.untyped_storage().nbytes()}")
            if not torch.equal(got.detach(), want.detach()):
                self.problems.append(f"{path}: values differ: {got.flatten()[:4].tolist()} != {want.flatten()[:4].tolist()}")
            mine, theirs = got.untyped_storage().data_ptr(), want.untyped_storage().data_ptr()
            if self.storages.setdefault(mine, theirs) != theirs:
                self.problems.append(f"{path}: storage sharing differs")
        elif isinstance(want, dict):
            if list(got) != list(want):
                self.problems.append(f"{path}: keys {list(got)} != {list(want)}")
                return
            for k in want:
                self.same(got[k], want[k], f"{path}.{k}")
        elif isinstance(want, (list, tuple)):
            if len(got) != len(want):
                self.problems.append(f"{path}: {len(got)} items != {len(want)}")
                return
            for i, (g, w) in enumerate(zip(got, want)):
                self.same(g, w, f"{path}[{i}]")
        elif isinstance(want, types.SimpleNamespace):
            self.same(vars(got), vars(want), path)
        elif got != want:
            self.problems.append(f"{path}: {got!r} != {want!r}")


def loaded_by_dcp(directory, like):
    import torch
    import torch.distributed.checkpoint as dcp

    target = {k: (torch.zeros_like(v) if isinstance(v, torch.Tensor) else None) for k, v in like.items()}
    dcp.load(target, checkpoint_id=directory)
    return target


def check(resharded, file_resharded, consolidated):
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    problems = []
    for folder, like, name in ((resharded, state(), "resharded"), (file_resharded, file_state(), "file resharded")):
        c = Compare()
        c.same(loaded_by_dcp(folder, like), like, name)
        problems += c.problems
    for pair in consolidated:
        folder, path = pair.split("=", 1)
        with tempfile.TemporaryDirectory() as tmp:
            reference = os.path.join(tmp, "reference.pt")
            dcp_to_torch_save(folder, reference)
            want = torch.load(reference, weights_only=False)
        c = Compare()
        c.same(torch.load(path, weights_only=False), want, os.path.basename(path))
        problems += c.problems
    if problems:
        sys.exit(f"object_items_oracle check: {len(problems)} differences:\n  " + "\n  ".join(problems))


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "save":
        save(*args)
    elif cmd == "check":
        check(args[0], args[1], args[2:])
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
