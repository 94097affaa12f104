"""Interop acceptance with real PyTorch 2.6 DCP (run it with scripts/oracle-python).

    dcp26.py save DIR [--ws 3] [--manifest FILE]
        dcp.save on ws gloo processes (FileSystemWriter(DIR, thread_count=2)) of the
        interop state below; rank 0 then writes the expected manifest (default
        DIR.expected.json, outside DIR) and checks it names exactly the keys of DIR/.metadata.
    dcp26.py load DIR --ws N --expected FILE
        dcp.load on N gloo processes into targets built from the manifest: every tensor with
        dims a DTensor Shard(0) over a 1-D mesh of N, 0-dim tensors plain, objects None
        placeholders. Each rank checks its local shard exactly against the recomputed values;
        rank 0 also checks .metadata (dtype, global shape, kind of every key) and the sha256
        of every full tensor when the manifest has one. Exit 0 only if everything matches.
    dcp26.py to_torch DIR OUT.pt --expected FILE
        format_utils.dcp_to_torch_save(DIR, OUT), then torch.load(OUT) (weights-only, the 2.6
        default) and checks every manifest entry at its nested path. Prints nothing on success.

Values. Every tensor element is a function of (fqn, global row-major index i), so any side,
any world size, can recompute what a box must hold (tests/interop/interop_values.h is the
C++ copy):
    h = FNV-1a 32-bit of the fqn's UTF-8 bytes
    m = (h + 7919 * i) mod 1000
    float32 / float64 / float16:  (m - 500) / 8         (exact in all three)
    bfloat16:                     (m mod 256 - 128) / 2 (8 significant bits: exact)
    int64:                        (m - 500) * 1000000007
    int32 / int16:                m - 500
    int8:                         m mod 256 - 128
    uint8:                        m mod 256
    bool:                         m mod 2

Manifest (JSON):
    {"format": "shardpoint-interop/1", "writer": "...", "world_size": W,
     "entries": {fqn: {"path": [str | int, ...], "kind": "tensor", "dtype": "float32",
                       "shape": [...], "sha256": hex (optional)}
                 fqn: {"path": [...], "kind": "object", "repr": "Python repr"}}}
sha256 is over the full tensor's row-major little-endian bytes (bfloat16 as its int16 view).
"""

import argparse
import hashlib
import json
import os
import sys
import warnings

# DTensor on a CPU mesh and DCP's storage().size() check warn on every rank; not our concern.
warnings.filterwarnings("ignore", category=UserWarning)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "oracle"))
import dcp_oracle  # noqa: E402

FORMAT = "shardpoint-interop/1"


# --- deterministic values ---------------------------------------------------------------

def fnv1a32(text):
    h = 2166136261
    for b in text.encode("utf-8"):
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return h


def expected_full(fqn, dtype_name, shape):
    """The full tensor fqn must hold (CPU, contiguous)."""
    import torch

    numel = 1
    for s in shape:
        numel *= s
    i = torch.arange(numel, dtype=torch.int64)
    m = (fnv1a32(fqn) + 7919 * i) % 1000
    if dtype_name in ("float32", "float64", "float16"):
        v = (m - 500).to(torch.float64) / 8
    elif dtype_name == "bfloat16":
        v = ((m % 256) - 128).to(torch.float64) / 2
    elif dtype_name == "int64":
        v = (m - 500) * 1000000007
    elif dtype_name in ("int32", "int16"):
        v = m - 500
    elif dtype_name == "int8":
        v = (m % 256) - 128
    elif dtype_name == "uint8":
        v = m % 256
    elif dtype_name == "bool":
        v = (m % 2) == 1
    else:
        raise ValueError(f"{fqn}: dtype {dtype_name} not supported by the interop values")
    out = v.to(getattr(torch, dtype_name)).reshape(tuple(shape))
    # The value function promises exactness: the round trip through the dtype is lossless.
    if dtype_name in ("float16", "bfloat16", "float32"):
        assert torch.equal(out.to(torch.float64), v.reshape(tuple(shape))), f"{fqn}: values not exact in {dtype_name}"
    return out


def dtype_name_of(t):
    return str(t.dtype).replace("torch.", "")


def tensor_sha256(t):
    import torch

    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    assert sys.byteorder == "little"
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()


def shard0_range(n, ws, rank):
    """DTensor Shard(0) rows of `rank` over a 1-D mesh of ws (ceil split, maybe empty)."""
    chunk = -(-n // ws)
    start = min(rank * chunk, n)
    return start, min(start + chunk, n)


# --- the state PyTorch saves ------------------------------------------------------------

def build_state(rank, world_size):
    """The interop state (nested, like model + optimizer state dicts) for this rank."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world_size,))
    # A 2-D mesh: (2, 2) on 4 ranks, else (1, ws) (still two mesh dims, both sharding).
    mesh2 = init_device_mesh("cpu", (2, 2) if world_size == 4 else (1, world_size))

    def dt(fqn, dtype, shape, placements, on=mesh):
        return distribute_tensor(expected_full(fqn, dtype, shape), on, placements)

    def plain(fqn, dtype, shape):
        return expected_full(fqn, dtype, shape)

    return {
        "model": {
            "w": dt("model.w", "float32", (10, 4), [Shard(0)]),           # 3 ranks: 4, 4, 2 rows
            "v": dt("model.v", "bfloat16", (3, 7), [Shard(1)]),           # 3 ranks: 3, 3, 1 cols
            "m2d": dt("model.m2d", "float64", (6, 8), [Shard(0), Shard(1)], mesh2),
            "idx": dt("model.idx", "int64", (7,), [Shard(0)]),
            "h": dt("model.h", "float16", (11, 2), [Shard(0)]),
            "rep": plain("model.rep", "float16", (5, 3)),                # replicated plain tensor
            "ids": plain("model.ids", "int64", (6,)),
            "scalar": plain("model.scalar", "float32", ()),               # 0-dim
        },
        "optimizer": {
            "state": {
                "w": {
                    "step": plain("optimizer.state.w.step", "float32", ()),
                    "exp_avg": dt("optimizer.state.w.exp_avg", "float32", (10, 4), [Shard(0)]),
                    "exp_avg_sq": dt("optimizer.state.w.exp_avg_sq", "float32", (10, 4), [Shard(0)]),
                },
            },
            "param_groups": [
                {"lr": 0.1, "betas": (0.9, 0.999), "weight_decay": 0.0, "params": ["w"]},
            ],
        },
        "epoch": 7,
        "loss_scale": 0.25,
        "tag": "run-\u03b1",
        "milestones": [10, 20, 30],
        "extra": {"seed": 1234, "ratio": 0.5, "name": "x", "big": 2 ** 40, "flag": True},
    }


def _has_tensor_or_mapping(value):
    import torch

    if isinstance(value, (torch.Tensor, dict)):
        return True
    if isinstance(value, list):
        return any(_has_tensor_or_mapping(v) for v in value)
    return False


def flatten_paths(state, prefix=()):
    """(path, leaf) pairs by DCP's 2.4+ rule: mappings descended; a list only when it holds
    a tensor or a mapping; everything else is a leaf."""
    import torch

    out = []
    if isinstance(state, dict):
        for k, v in state.items():
            out.extend(flatten_paths(v, prefix + (k,)))
    elif isinstance(state, list) and _has_tensor_or_mapping(state):
        for i, v in enumerate(state):
            out.extend(flatten_paths(v, prefix + (i,)))
    else:
        out.append((prefix, state))
    return out


def fqn_of(path):
    return ".".join(str(p) for p in path)


def make_manifest(state, world_size, writer):
    import torch
    from torch.distributed.tensor import DTensor

    entries = {}
    for path, leaf in flatten_paths(state):
        fqn = fqn_of(path)
        if isinstance(leaf, torch.Tensor):
            full = leaf.full_tensor() if isinstance(leaf, DTensor) else leaf
            want = expected_full(fqn, dtype_name_of(full), tuple(full.shape))
            assert torch.equal(full, want), f"{fqn}: saved value differs from the value function"
            entries[fqn] = {"path": list(path), "kind": "tensor", "dtype": dtype_name_of(full),
                            "shape": list(full.shape), "sha256": tensor_sha256(full)}
        else:
            entries[fqn] = {"path": list(path), "kind": "object", "repr": repr(leaf)}
    return {"format": FORMAT, "writer": writer, "world_size": world_size, "entries": entries}


def check_metadata(directory, manifest):
    """Raises unless DIR/.metadata has exactly the manifest's keys with its dtypes/shapes."""
    import torch
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

    md = FileSystemReader(directory).read_metadata()
    entries = manifest["entries"]
    got, want = set(md.state_dict_metadata), set(entries)
    assert got == want, f".metadata keys differ: only in checkpoint {sorted(got - want)}, only in manifest {sorted(want - got)}"
    for fqn, e in entries.items():
        m = md.state_dict_metadata[fqn]
        if e["kind"] == "tensor":
            assert isinstance(m, TensorStorageMetadata), f"{fqn}: .metadata has {type(m).__name__}"
            assert m.properties.dtype == getattr(torch, e["dtype"]), f"{fqn}: dtype {m.properties.dtype} != {e['dtype']}"
            assert list(m.size) == e["shape"], f"{fqn}: size {list(m.size)} != {e['shape']}"
        else:
            assert isinstance(m, BytesStorageMetadata), f"{fqn}: .metadata has {type(m).__name__}"
    return md


# --- nested paths -----------------------------------------------------------------------

def set_at_path(root, path, value):
    """Places value at path, creating dicts (str element) and lists (int element)."""
    node = root
    for i, key in enumerate(path):
        last = i + 1 == len(path)
        nxt = None if last else ([] if isinstance(path[i + 1], int) else {})
        if isinstance(key, int):
            assert isinstance(node, list), f"path {path}: int element under {type(node).__name__}"
            while len(node) <= key:
                node.append(nxt if not last else None)
            if last:
                node[key] = value
            elif node[key] is None:
                node[key] = nxt
            node = node[key]
        else:
            assert isinstance(node, dict), f"path {path}: str element under {type(node).__name__}"
            if last:
                node[key] = value
            else:
                node = node.setdefault(key, nxt)


def get_at_path(root, path):
    node = root
    for key in path:
        if isinstance(key, int):
            assert isinstance(node, list) and key < len(node), f"path {path}: no list index {key}"
        else:
            assert isinstance(node, dict) and key in node, f"path {path}: no key {key!r} (have {list(node) if isinstance(node, dict) else type(node).__name__})"
        node = node[key]
    return node


def load_manifest(path):
    with open(path, encoding="utf-8") as f:
        manifest = json.load(f)
    assert manifest.get("format") == FORMAT, f"{path}: not a {FORMAT} manifest"
    return manifest


# --- jobs (module level: spawn pickles them by name) -------------------------------------

def save_job(rank, world_size, directory, manifest_path):
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter

    state = build_state(rank, world_size)
    dcp.save(state, storage_writer=FileSystemWriter(directory, thread_count=2))
    manifest = make_manifest(state, world_size, f"torch {torch.__version__}")  # collective (full_tensor)
    if rank == 0:
        check_metadata(directory, manifest)
        tmp = manifest_path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=1, sort_keys=True)
        os.replace(tmp, manifest_path)


def load_job(rank, world_size, directory, manifest_path):
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    manifest = load_manifest(manifest_path)
    entries = manifest["entries"]
    if rank == 0:
        check_metadata(directory, manifest)
    mesh = init_device_mesh("cpu", (world_size,))
    target = {}
    for fqn, e in sorted(entries.items()):
        if e["kind"] == "tensor":
            zeros = torch.zeros(tuple(e["shape"]), dtype=getattr(torch, e["dtype"]))
            value = distribute_tensor(zeros, mesh, [Shard(0)]) if e["shape"] else zeros
        else:
            value = None
        set_at_path(target, e["path"], value)
    dcp.load(target, checkpoint_id=directory)

    problems = []
    for fqn, e in sorted(entries.items()):
        got = get_at_path(target, e["path"])
        if e["kind"] == "object":
            if repr(got) != e["repr"]:
                problems.append(f"{fqn}: object {repr(got)} != expected {e['repr']}")
            continue
        want = expected_full(fqn, e["dtype"], e["shape"])
        if isinstance(got, DTensor):
            start, end = shard0_range(e["shape"][0], world_size, rank)
            local = got.to_local()
            if local.dtype != want.dtype or not torch.equal(local, want[start:end]):
                problems.append(f"{fqn}: local shard rows [{start}, {end}) differ "
                                f"(got {local.dtype} {tuple(local.shape)}, first {local.flatten()[:4].tolist()}; "
                                f"want {want[start:end].flatten()[:4].tolist()})")
            full = got.full_tensor()  # collective: every rank calls it for the same fqns
        else:
            full = got
            if full.dtype != want.dtype or not torch.equal(full, want):
                problems.append(f"{fqn}: tensor differs (got {full.flatten()[:4].tolist()}, want {want.flatten()[:4].tolist()})")
        if rank == 0 and "sha256" in e and tensor_sha256(full) != e["sha256"]:
            problems.append(f"{fqn}: sha256 of the loaded full tensor differs from the manifest")
    if problems:
        raise AssertionError(f"rank {rank}: {len(problems)} mismatches:\n  " + "\n  ".join(problems))
    if rank == 0:
        print(f"dcp26 load ok: ws={world_size} entries={len(entries)} torch {torch.__version__}", flush=True)


def to_torch(directory, out, manifest_path):
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    manifest = load_manifest(manifest_path)
    check_metadata(directory, manifest)
    dcp_to_torch_save(directory, out)
    loaded = torch.load(out)  # weights_only=True is the 2.6 default
    problems = []
    for fqn, e in sorted(manifest["entries"].items()):
        try:
            got = get_at_path(loaded, e["path"])
        except AssertionError as exc:
            problems.append(f"{fqn}: {exc}")
            continue
        if e["kind"] == "object":
            if repr(got) != e["repr"]:
                problems.append(f"{fqn}: object {repr(got)} != expected {e['repr']}")
            continue
        want = expected_full(fqn, e["dtype"], e["shape"])
        if not isinstance(got, torch.Tensor) or got.dtype != want.dtype or not torch.equal(got, want):
            problems.append(f"{fqn}: tensor differs ({type(got).__name__} {getattr(got, 'dtype', '')} "
                            f"{tuple(getattr(got, 'shape', ()))})")
        elif "sha256" in e and tensor_sha256(got) != e["sha256"]:
            problems.append(f"{fqn}: sha256 differs from the manifest")
    if problems:
        sys.exit(f"dcp26 to_torch: {len(problems)} mismatches:\n  " + "\n  ".join(problems))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("save")
    s.add_argument("dir")
    s.add_argument("--ws", type=int, default=3)
    s.add_argument("--manifest")
    l = sub.add_parser("load")
    l.add_argument("dir")
    l.add_argument("--ws", type=int, required=True)
    l.add_argument("--expected", required=True)
    t = sub.add_parser("to_torch")
    t.add_argument("dir")
    t.add_argument("out")
    t.add_argument("--expected")
    a = p.parse_args()
    directory = os.path.abspath(a.dir)
    if a.cmd == "save":
        manifest = os.path.abspath(a.manifest or directory.rstrip("/") + ".expected.json")
        os.makedirs(directory, exist_ok=True)
        dcp_oracle.run_ranks(save_job, world_size=a.ws, args=(directory, manifest), timeout_s=240)
    elif a.cmd == "load":
        dcp_oracle.run_ranks(load_job, world_size=a.ws, args=(directory, os.path.abspath(a.expected)), timeout_s=240)
    else:
        expected = a.expected or directory.rstrip("/") + ".expected.json"
        to_torch(directory, os.path.abspath(a.out), os.path.abspath(expected))


if __name__ == "__main__":
    main()
