#!/usr/bin/python3
"""torch.save oracle for the torchfile tests, run with Debian's PyTorch 1.13 (/usr/bin/python3).

  oracle_torch.py make DIR [--new-dtypes]
      torch.save files covering every dtype 1.13 has, views, shared storages, 0-dim and
      empty tensors, nested containers, OrderedDict, big ints, NaN/inf, unicode, Parameter,
      and objects shardpoint does not interpret (exotic.pt); with --new-dtypes (PyTorch
      2.3+) also new_dtypes.pt (uint16/32/64, float8, complex32); plus DIR/manifest.json:
      {file: {"tensors": {path: desc}, "scalars": {path: desc}}}.
  oracle_torch.py check FILE EXPECTED.json [--unsafe]
      torch.load(FILE, weights_only=True) (False with --unsafe) and compare with EXPECTED
      (same form as one manifest entry). Prints differences; exit 1 when there are any.
      Note: 1.13's weights-only unpickler rejects BINFLOAT, i.e. any Python float, even in
      files torch.save itself wrote; check such trees with --unsafe on 1.13.
  oracle_torch.py same ORIG NEW
      torch.load both with weights_only=False; exit 0 when equal (tensors by value).

Paths: the root is "", a dict value under str key k is "<path>/k", a list or tuple item i
is "<path>/i". A tensor desc has dtype, shape, strides, storage_offset, requires_grad,
is_parameter, storage (a tag equal for tensors sharing a storage; null when empty) and
sha256 of the row-major element bytes (t.contiguous().numpy().tobytes(); bfloat16 viewed
as int16 first).
"""
import argparse
import collections
import enum
import hashlib
import json
import math
import os
import pathlib
import pickle
import sys

import torch


class Color(enum.Enum):
    RED = 1
    GREEN = 2


class Thing:
    def __init__(self, a, b):
        self.a = a
        self.b = b

    def __eq__(self, other):
        return type(other) is Thing and self.a == other.a and self.b == other.b


def row_major_bytes(t):
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    try:
        return t.numpy().tobytes()
    except (TypeError, RuntimeError):  # float8, complex32, ... (PyTorch 2.x): raw bytes
        return t.reshape(-1).view(torch.uint8).numpy().tobytes()


def tensor_desc(t):
    st = t.storage()
    return {
        "dtype": str(t.dtype)[len("torch."):],
        "shape": list(t.shape),
        "strides": list(t.stride()),
        "storage_offset": t.storage_offset(),
        "requires_grad": bool(t.requires_grad),
        "is_parameter": isinstance(t, torch.nn.Parameter),
        "storage": (str(st.data_ptr()) if st.size() > 0 else None),
        "sha256": hashlib.sha256(row_major_bytes(t)).hexdigest(),
    }


def scalar_desc(v):
    if v is None:
        return {"kind": "none"}
    if isinstance(v, bool):
        return {"kind": "bool", "value": v}
    if isinstance(v, int):
        return {"kind": "int", "le": pickle.encode_long(v).hex()}
    if isinstance(v, float):
        return {"kind": "float", "value": repr(v)}
    if isinstance(v, str):
        return {"kind": "str", "utf8": v.encode("utf-8").hex()}
    return {"kind": "other", "repr": repr(v)}


def walk(obj, path, out):
    if isinstance(obj, torch.Tensor):
        out["tensors"][path] = tensor_desc(obj)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            walk(v, path + "/" + str(k), out)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            walk(v, path + "/" + str(i), out)
    else:
        out["scalars"][path] = scalar_desc(obj)
    return out


def describe(obj):
    return walk(obj, "", {"tensors": {}, "scalars": {}})


def make(d, new_dtypes=False):
    os.makedirs(d, exist_ok=True)
    g = torch.Generator().manual_seed(1234)

    def randn(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g).to(dtype)

    def randint(lo, hi, *shape, dtype):
        return torch.randint(lo, hi, shape, generator=g, dtype=torch.int64).to(dtype)

    files = {}
    dtypes = collections.OrderedDict()
    dtypes["float32"] = randn(3, 4)
    dtypes["float64"] = randn(2, 3, dtype=torch.float64)
    dtypes["float16"] = randn(5, dtype=torch.float16)
    dtypes["bfloat16"] = randn(2, 2, 3, dtype=torch.bfloat16)
    dtypes["complex64"] = torch.complex(randn(4), randn(4))
    dtypes["complex128"] = torch.complex(randn(3, dtype=torch.float64), randn(3, dtype=torch.float64))
    dtypes["int8"] = randint(-128, 128, 7, dtype=torch.int8)
    dtypes["int16"] = randint(-30000, 30000, 2, 3, dtype=torch.int16)
    dtypes["int32"] = randint(-2**31, 2**31 - 1, 6, dtype=torch.int32)
    dtypes["int64"] = torch.tensor([-(2**63), 2**63 - 1, 0, 12345678901234], dtype=torch.int64)
    dtypes["uint8"] = randint(0, 256, 3, 3, dtype=torch.uint8)
    dtypes["bool"] = torch.tensor([True, False, True, True])
    dtypes["special"] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 1e-45])
    files["dtypes.pt"] = dict(dtypes)

    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    files["views.pt"] = {
        "base": base,
        "transposed": base.t(),
        "slice": base[1:3],
        "strided": base[:, 1::2],
        "column": base[:, 4],
        "expanded": torch.arange(3, dtype=torch.int16).expand(4, 3),
        "permuted": torch.arange(60, dtype=torch.int32).reshape(3, 4, 5).permute(2, 0, 1),
    }
    files["edge.pt"] = {
        "zero_dim": torch.tensor(3.5),
        "zero_dim_int": torch.tensor(-7, dtype=torch.int64),
        "empty": torch.empty(0),
        "empty_2d": torch.empty(0, 3, dtype=torch.float64),
        "one": torch.ones(1, 1, 1),
    }
    od = collections.OrderedDict()
    od["w"] = torch.nn.Parameter(randn(2, 3))
    od["frozen"] = torch.nn.Parameter(randn(2), requires_grad=False)
    od["b"] = randn(3)
    files["nested.pt"] = {
        "state_dict": od,
        "optimizer": {"state": {0: {"step": 10, "exp_avg": randn(2, 3)}}, "param_groups": [{"lr": 0.1, "params": [0, 1]}]},
        "list": [1, -1, 2**70, -(2**70), 2**63, -(2**63) - 1, 0, 255, 256, -256],
        "tuple": ("a", ("nested", (1.5, float("nan"), float("inf"), -float("inf"), -0.0))),
        "unicode": "héllo wörld ✓ 日本語 \U0001F600",
        "empty_str": "",
        "flags": [True, False, None],
        "grad_tensor": randn(2).requires_grad_(True),
    }
    files["tensor_root.pt"] = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    files["exotic.pt"] = {
        "path": pathlib.PosixPath("/tmp/some/where.txt"),
        "ns": argparse.Namespace(lr=0.1, name="run", layers=[1, 2]),
        "color": Color.GREEN,
        "thing": Thing(3, "x"),
        "t": torch.arange(4, dtype=torch.int64),
        "od": collections.OrderedDict([("a", 1), ("b", [2, 3])]),
    }

    manifest = {}
    for name, obj in files.items():
        torch.save(obj, os.path.join(d, name))
        manifest[name] = describe(obj)
    if new_dtypes:  # PyTorch >= 2.3: saved as UntypedStorage + _rebuild_tensor_v3
        nd = {
            "uint16": torch.tensor([0, 1, 65535], dtype=torch.uint16),
            "uint32": torch.tensor([0, 7, 2**32 - 1], dtype=torch.uint32),
            "uint64": torch.tensor([0, 2**63 - 1], dtype=torch.uint64),
            "float8_e4m3fn": randn(2, 3).to(torch.float8_e4m3fn),
            "float8_e5m2": randn(4).to(torch.float8_e5m2),
            "complex32": torch.complex(randn(3), randn(3)).to(torch.complex32),
            "uint16_t": torch.arange(6, dtype=torch.int32).to(torch.uint16).reshape(2, 3).t(),
        }
        torch.save(nd, os.path.join(d, "new_dtypes.pt"))
        manifest["new_dtypes.pt"] = describe(nd)
    # A torch.save to a stream (archive folder "archive", as DCP blobs).
    import io
    buf = io.BytesIO()
    torch.save({"x": torch.arange(5, dtype=torch.int32)}, buf)
    with open(os.path.join(d, "stream.pt"), "wb") as f:
        f.write(buf.getvalue())
    manifest["stream.pt"] = describe({"x": torch.arange(5, dtype=torch.int32)})
    # Legacy (pre-1.6) format, refused by the reader.
    torch.save({"x": torch.ones(2)}, os.path.join(d, "legacy.pt"), _use_new_zipfile_serialization=False)
    with open(os.path.join(d, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
    return 0


def compare(got, want):
    errors = []
    for kind in ("tensors", "scalars"):
        g, w = got[kind], want.get(kind, {})
        for path in sorted(set(g) | set(w)):
            if path not in g:
                errors.append("%s %s: missing in the loaded file" % (kind, path))
            elif path not in w:
                errors.append("%s %s: not expected" % (kind, path))
            else:
                gd, wd = dict(g[path]), dict(w[path])
                if kind == "tensors":
                    # storage tags are process-local; compare the sharing pattern instead
                    gd.pop("storage", None)
                    wd.pop("storage", None)
                    for key in list(wd):
                        if wd[key] is None:
                            wd.pop(key)
                            gd.pop(key, None)
                    gd = {k: v for k, v in gd.items() if k in wd}
                if gd != wd:
                    errors.append("%s %s: got %s, want %s" % (kind, path, gd, wd))
    return errors


def check(path, expected_path, weights_only=True):
    obj = torch.load(path, weights_only=weights_only)
    with open(expected_path) as f:
        want = json.load(f)
    errors = compare(describe(obj), want)
    for e in errors:
        print(e)
    return 1 if errors else 0


def same(a, b):
    x = torch.load(a, weights_only=False)
    y = torch.load(b, weights_only=False)

    def eq(p, q):
        if isinstance(p, torch.Tensor):
            return (isinstance(q, torch.Tensor) and type(p) is type(q) and p.dtype == q.dtype and p.shape == q.shape
                    and p.stride() == q.stride() and p.requires_grad == q.requires_grad
                    and row_major_bytes(p) == row_major_bytes(q))
        if isinstance(p, float) and math.isnan(p):
            return isinstance(q, float) and math.isnan(q)
        if isinstance(p, argparse.Namespace):
            return isinstance(q, argparse.Namespace) and eq(vars(p), vars(q))
        if isinstance(p, dict):
            return type(p) is type(q) and list(p.keys()) == list(q.keys()) and all(eq(p[k], q[k]) for k in p)
        if isinstance(p, (list, tuple)):
            return type(p) is type(q) and len(p) == len(q) and all(eq(u, v) for u, v in zip(p, q))
        return type(p) is type(q) and p == q

    if not eq(x, y):
        print("different:\n  %r\n  %r" % (x, y))
        return 1
    print("equal: %r" % (y,))
    return 0


def main():
    cmd = sys.argv[1]
    if cmd == "make":
        return make(sys.argv[2], new_dtypes="--new-dtypes" in sys.argv[3:])
    if cmd == "check":
        return check(sys.argv[2], sys.argv[3], weights_only="--unsafe" not in sys.argv[4:])
    if cmd == "same":
        return same(sys.argv[2], sys.argv[3])
    print("usage: oracle_torch.py make DIR | check FILE EXPECTED.json | same ORIG NEW", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
