"""Python side of the .metadata interop tests (tests/format/metadata_interop_test.cc).

Subcommands:
  stub-write FORM PROTOCOL OUT   Write a .metadata with Python's own pickler, using stand-in
                                 classes registered under the module names PyTorch FORM uses
                                 (1.13, 2.0, 2.3, 2.4, 2.7, 2.9, 3.13) and with PyTorch's
                                 pickling behaviour (TensorProperties 5-tuple state, frozen
                                 MetadataIndex, torch.Size/dtype/layout reductions, enums).
  stub-load IN                   Load a .metadata with the stand-in classes of every form and
                                 print a JSON description of what Python sees.
  torch113-write DIR             Save a state dict with the real PyTorch 1.13
                                 torch.distributed._shard.checkpoint (Debian python3-torch).
  torch113-load-state DIR        load_state_dict the checkpoint torch113-write made (its
                                 .metadata possibly rewritten by shardpoint) and check values.
  torch113-load IN               Load a .metadata with the real 1.13 classes (2.x module names
                                 aliased to them, as the 1.13 TensorProperties etc. are the
                                 same classes) and print the JSON description.

The content written by stub-write is fixed; the C++ test checks the decoded values.
"""

import dataclasses
import enum
import json
import pickle
import sys
import types
from typing import Any, List, Optional

LOADED_GLOBALS = []


def _module(name):
    mod = sys.modules.get(name)
    if mod is None:
        mod = types.ModuleType(name)
        sys.modules[name] = mod
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(_module(parent), child, mod)
    return mod


def _place(obj, module, name):
    obj.__module__ = module
    obj.__qualname__ = name
    obj.__name__ = name
    setattr(_module(module), name, obj)
    return obj


# ---- torch stand-ins ----------------------------------------------------------------

class Size(tuple):
    def __reduce__(self):
        return (Size, (tuple(self),))


class DType:
    def __init__(self, name):
        self.name = name

    def __reduce__(self):
        return self.name  # a global in this object's __module__ ('torch')

    def __repr__(self):
        return "torch." + self.name


class Layout:
    def __init__(self, name):
        self.name = name


def _get_layout(name):
    assert name == "torch.strided", name
    return STRIDED


STRIDED = Layout("torch.strided")
DTYPES = {}


def install_torch():
    _place(Size, "torch", "Size")
    for name in ["float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8",
                 "uint8", "bool", "complex64", "complex128"]:
        d = DType(name)
        d.__module__ = "torch"
        setattr(_module("torch"), name, d)
        DTYPES[name] = d
    setattr(_module("torch"), "float", DTYPES["float32"])
    setattr(_module("torch"), "long", DTYPES["int64"])
    _place(_get_layout, "torch.serialization", "_get_layout")
    import copyreg
    copyreg.pickle(Layout, lambda l: (_get_layout, (l.name,)))


# ---- DCP stand-ins, created per form --------------------------------------------------

FORMS = {
    # form: (metadata module, filesystem module, TensorProperties module, enum name)
    "1.13": ("torch.distributed._shard.checkpoint.metadata", "torch.distributed._shard.checkpoint.filesystem",
             "torch.distributed._shard.sharded_tensor.metadata", "MEM_FORMAT_ENCODING"),
    "2.0": ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem",
            "torch.distributed._shard.sharded_tensor.metadata", "MEM_FORMAT_ENCODING"),
    "2.3": ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem",
            "torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"),
}
for newer in ["2.4", "2.7", "2.9", "3.13"]:
    FORMS[newer] = FORMS["2.3"]


def make_classes(meta_mod, fs_mod, props_mod, enum_name):
    ns = types.SimpleNamespace()

    class MemFormat(enum.Enum):
        TORCH_CONTIGUOUS_FORMAT = 0
        TORCH_CHANNELS_LAST = 1
        TORCH_PRESERVE_FORMAT = 2
    ns.MemFormat = _place(MemFormat, props_mod, enum_name)

    @dataclasses.dataclass
    class TensorProperties:
        dtype: Any = None
        layout: Any = STRIDED
        requires_grad: bool = False
        memory_format: Any = "contiguous_format"
        pin_memory: bool = False

        def __getstate__(self):
            fmt = {"contiguous_format": MemFormat.TORCH_CONTIGUOUS_FORMAT,
                   "channels_last": MemFormat.TORCH_CHANNELS_LAST,
                   "preserve_format": MemFormat.TORCH_PRESERVE_FORMAT}[self.memory_format]
            return (self.dtype, self.layout, self.requires_grad, fmt, self.pin_memory)

        def __setstate__(self, state):
            (self.dtype, self.layout, self.requires_grad, fmt, self.pin_memory) = state
            self.memory_format = {0: "contiguous_format", 1: "channels_last", 2: "preserve_format"}[fmt.value]
    ns.TensorProperties = _place(TensorProperties, props_mod, "TensorProperties")

    @dataclasses.dataclass
    class ChunkStorageMetadata:
        offsets: Any
        sizes: Any
    ns.ChunkStorageMetadata = _place(ChunkStorageMetadata, meta_mod, "ChunkStorageMetadata")

    @dataclasses.dataclass
    class TensorStorageMetadata:
        properties: Any
        size: Any
        chunks: List[Any]
    ns.TensorStorageMetadata = _place(TensorStorageMetadata, meta_mod, "TensorStorageMetadata")

    @dataclasses.dataclass
    class BytesStorageMetadata:
        pass
    ns.BytesStorageMetadata = _place(BytesStorageMetadata, meta_mod, "BytesStorageMetadata")

    @dataclasses.dataclass(frozen=True)
    class MetadataIndex:
        fqn: str
        offset: Optional[Any] = None
        index: Optional[int] = dataclasses.field(hash=False, compare=False, default=None)

        def __init__(self, fqn, offset=None, index=None):
            object.__setattr__(self, "fqn", fqn)
            object.__setattr__(self, "index", index)
            if offset is not None:
                object.__setattr__(self, "offset", Size(offset))
    ns.MetadataIndex = _place(MetadataIndex, meta_mod, "MetadataIndex")

    @dataclasses.dataclass
    class StorageMeta:
        checkpoint_id: Any = None
        save_id: Optional[str] = None
        load_id: Optional[str] = None
    ns.StorageMeta = _place(StorageMeta, meta_mod, "StorageMeta")

    @dataclasses.dataclass
    class Metadata:
        state_dict_metadata: Any
        planner_data: Any = None
        storage_data: Any = None
    ns.Metadata = _place(Metadata, meta_mod, "Metadata")

    @dataclasses.dataclass
    class _StorageInfo:
        relative_path: str
        offset: int
        length: int
        transform_descriptors: Optional[List[str]] = None

        def __getstate__(self):  # 2.7+: drop None values
            return {k: v for k, v in self.__dict__.items() if v is not None}
    ns.StorageInfo = _place(_StorageInfo, fs_mod, "_StorageInfo")
    return ns


class LocalPosixPath:
    """Python 3.13's pathlib._local.PosixPath as it pickles (class + parts)."""

    def __init__(self, *parts):
        self.parts = parts

    def __reduce__(self):
        return (LocalPosixPath, tuple(self.parts))


def stub_write(form, protocol, out):
    install_torch()
    ns = make_classes(*FORMS[form])
    props = lambda dtype, **kw: ns.TensorProperties(dtype=DTYPES[dtype], **kw)
    sdm = {
        "model.w": ns.TensorStorageMetadata(
            props("float32"), Size((4, 6)),
            [ns.ChunkStorageMetadata(Size((0, 0)), Size((2, 6))),
             ns.ChunkStorageMetadata(Size((2, 0)), Size((2, 6)))]),
        "model.b": ns.TensorStorageMetadata(
            props("bfloat16", requires_grad=True), Size((6,)),
            [ns.ChunkStorageMetadata(Size((0,)), Size((6,)))]),
        "s": ns.TensorStorageMetadata(props("int64"), Size(()), [ns.ChunkStorageMetadata(Size(()), Size(()))]),
        "step": ns.BytesStorageMetadata(),
    }
    planner_data = {"model.w": ("model", "w"), "model.b": ("model", "b"), "s": ("s",), "step": ("step",),
                    "opt.0.lr": ("opt", 0, "lr")}
    if form == "1.13":
        planner_data = None
    info = lambda path, off, length, **kw: ns.StorageInfo(path, off, length, **kw)
    transforms = ["stream.zstd/1"] if form in ("2.7", "2.9", "3.13") else None
    storage_data = {
        ns.MetadataIndex("model.w", Size((0, 0)), 0): info("__0_0.distcp", 0, 700, transform_descriptors=transforms),
        ns.MetadataIndex("model.w", Size((2, 0)), 1): info("__1_0.distcp", 0, 700),
        ns.MetadataIndex("model.b", Size((0,)), 0): info("__0_0.distcp", 700, 747),
        ns.MetadataIndex("s", Size(()), 0): info("__0_0.distcp", 1447, 747),
        ns.MetadataIndex("step"): info("__0_0.distcp", 2194, 431),
    }
    md = ns.Metadata(sdm, planner_data, storage_data)
    if form in ("2.4", "2.7", "2.9", "3.13"):
        import pathlib
        if form == "3.13":
            _place(LocalPosixPath, "pathlib._local", "PosixPath")
            ckpt = LocalPosixPath("/", "tmp", "ckpt")
        else:
            ckpt = pathlib.PosixPath("/tmp/ckpt")
        sm = ns.StorageMeta(ckpt, "3f2c6a1e-save", None)
        if form != "2.4":
            sm.modules = ["model", "opt"]
        md.storage_meta = sm
    if form in ("2.9", "3.13"):
        md.version = "1.0.0"
    md.extra_attribute = {"ignored": 1}  # added dynamically, as Megatron does
    with open(out, "wb") as f:
        pickle.dump(md, f, protocol=protocol)


# ---- loading and describing -----------------------------------------------------------

def _shape(x):
    return None if x is None else [int(v) for v in x]


def describe(md):
    out = {"class": type(md).__name__, "keys": sorted(md.__dict__.keys()), "sdm": {}, "storage_data": []}
    for fqn, v in md.state_dict_metadata.items():
        if hasattr(v, "chunks"):
            p = v.properties
            out["sdm"][fqn] = {
                "kind": "tensor", "dtype": repr(p.dtype), "layout": getattr(p.layout, "name", repr(p.layout)),
                "requires_grad": p.requires_grad, "memory_format": str(p.memory_format),
                "pin_memory": p.pin_memory, "size": _shape(v.size), "size_type": type(v.size).__name__,
                "chunks": [[_shape(c.offsets), _shape(c.sizes)] for c in v.chunks]}
        else:
            out["sdm"][fqn] = {"kind": "bytes", "type": type(v).__name__}
    pd = md.planner_data
    out["planner_data"] = None if pd is None else {k: list(v) for k, v in pd.items()}
    for k, v in md.storage_data.items():
        out["storage_data"].append({
            "fqn": k.fqn, "index": k.index, "offset": _shape(getattr(k, "offset", None)),
            "key_has_offset": "offset" in k.__dict__,
            "relative_path": v.relative_path, "file_offset": v.offset, "length": v.length,
            "transform_descriptors": getattr(v, "transform_descriptors", None)})
    out["globals"] = sorted(set(LOADED_GLOBALS))
    return out


class RecordingUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        LOADED_GLOBALS.append(module + "." + name)
        return super().find_class(module, name)


def stub_load(path):
    install_torch()
    # Every module name any release used, with the same stand-ins behind them.
    for form in ("1.13", "2.0", "2.3"):
        make_classes(*FORMS[form])
    make_classes("torch.distributed._shard.checkpoint.metadata", "torch.distributed._shard.checkpoint.filesystem",
                 "torch.distributed._shard.sharded_tensor.metadata", "MEM_FORMAT_ENCODING")
    with open(path, "rb") as f:
        md = RecordingUnpickler(f).load()
    print(json.dumps(describe(md), sort_keys=True))


def _torch113():
    # Python 3.11 rejects a mutable dataclass default in 1.13's ShardedTensorMetadata; give
    # such defaults a factory before torch imports the module (no effect on any bytes).
    orig = dataclasses._get_field

    def patched(cls, a_name, a_type, *args, **kw):
        try:
            return orig(cls, a_name, a_type, *args, **kw)
        except ValueError as e:
            if "mutable default" not in str(e):
                raise
            default = getattr(cls, a_name)
            setattr(cls, a_name, dataclasses.field(default_factory=lambda d=default: d))
            return orig(cls, a_name, a_type, *args, **kw)

    dataclasses._get_field = patched
    import torch
    import torch.distributed._shard.checkpoint as cp
    return torch, cp


def torch113_write(directory):
    torch, cp = _torch113()
    sd = {"model.w": torch.arange(24, dtype=torch.float32).reshape(4, 6),
          "model.b": torch.zeros(6, dtype=torch.bfloat16).requires_grad_(False),
          "s": torch.tensor(7, dtype=torch.int64),
          "step": 5,
          "nested": {"lr": 0.5}}
    cp.save_state_dict(sd, cp.FileSystemWriter(directory, single_file_per_rank=True), no_dist=True)


def torch113_load(path):
    torch, cp = _torch113()
    import torch.distributed._shard.checkpoint.metadata as m
    import torch.distributed._shard.checkpoint.filesystem as fs
    # shardpoint writes the 2.x module names; in 1.13 the same classes live under _shard.
    sys.modules["torch.distributed.checkpoint"] = types.ModuleType("torch.distributed.checkpoint")
    sys.modules["torch.distributed.checkpoint.metadata"] = m
    sys.modules["torch.distributed.checkpoint.filesystem"] = fs
    with open(path, "rb") as f:
        md = RecordingUnpickler(f).load()
    d = describe(md)
    for fqn, v in md.state_dict_metadata.items():
        if hasattr(v, "chunks"):
            assert isinstance(v.size, torch.Size), type(v.size)
            assert v.properties.memory_format == torch.contiguous_format
            assert v.properties.layout == torch.strided
    print(json.dumps(d, sort_keys=True))


def torch113_load_state(directory):
    """Loads the checkpoint with 1.13's load_state_dict (2.x module names aliased to the
    1.13 classes) and checks every value torch113_write saved."""
    torch, cp = _torch113()
    import torch.distributed._shard.checkpoint.metadata as m
    import torch.distributed._shard.checkpoint.filesystem as fs
    sys.modules["torch.distributed.checkpoint"] = types.ModuleType("torch.distributed.checkpoint")
    sys.modules["torch.distributed.checkpoint.metadata"] = m
    sys.modules["torch.distributed.checkpoint.filesystem"] = fs
    sd = {"model.w": torch.zeros(4, 6), "model.b": torch.ones(6, dtype=torch.bfloat16),
          "s": torch.tensor(0, dtype=torch.int64), "step": 0, "nested": {}}
    cp.load_state_dict(sd, cp.FileSystemReader(directory), no_dist=True)
    assert torch.equal(sd["model.w"], torch.arange(24, dtype=torch.float32).reshape(4, 6)), sd["model.w"]
    assert torch.equal(sd["model.b"], torch.zeros(6, dtype=torch.bfloat16)), sd["model.b"]
    assert int(sd["s"]) == 7, sd["s"]
    assert sd["step"] == 5, sd["step"]
    assert sd["nested"] == {"lr": 0.5}, sd["nested"]
    print("ok")


def main(argv):
    cmd = argv[1]
    if cmd == "stub-write":
        stub_write(argv[2], int(argv[3]), argv[4])
    elif cmd == "stub-load":
        stub_load(argv[2])
    elif cmd == "torch113-write":
        torch113_write(argv[2])
    elif cmd == "torch113-load":
        torch113_load(argv[2])
    elif cmd == "torch113-load-state":
        torch113_load_state(argv[2])
    else:
        raise SystemExit("unknown command " + cmd)


if __name__ == "__main__":
    main(sys.argv)
