"""ctypes binding of libshardpoint's C API (include/shardpoint/c_api.h).

The only module that knows the C ABI. ctypes releases the GIL around every foreign call,
so native I/O runs while other Python threads go on. The library is looked up in
``$SHARDPOINT_LIBRARY`` (a path), then in this package's ``_lib`` folder (wheels).
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Optional, Sequence, Tuple

from . import errors



class SaveOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("thread_count", ctypes.c_int),
        ("checksum", ctypes.c_int),
        ("checksum_block_bytes", ctypes.c_uint64),
        ("durable", ctypes.c_int),
        ("direct_io", ctypes.c_int),
        ("compression", ctypes.c_int),
        ("compression_level", ctypes.c_int),
        ("compression_threads", ctypes.c_int),
    ]


class ReaderOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("verify_checksums", ctypes.c_int),
        ("thread_count", ctypes.c_int),
        ("check_zip_crc", ctypes.c_int),
    ]


class Item(ctypes.Structure):
    _fields_ = [
        ("file", ctypes.c_char_p),
        ("kind", ctypes.c_int),
        ("fqn", ctypes.c_char_p),
        ("dtype", ctypes.c_char_p),
        ("ndim", ctypes.c_int),
        # const int64_t*, set as addresses (torch.py points them into one array per call).
        ("offsets", ctypes.c_void_p),
        ("sizes", ctypes.c_void_p),
        ("data", ctypes.c_void_p),
        ("nbytes", ctypes.c_uint64),
    ]


class TensorRead(ctypes.Structure):
    _fields_ = [
        ("file", ctypes.c_char_p),
        ("blob_offset", ctypes.c_uint64),
        ("blob_length", ctypes.c_uint64),
        ("fqn", ctypes.c_char_p),
        ("dtype", ctypes.c_char_p),
        ("ndim", ctypes.c_int),
        # const int64_t*, set as addresses (torch.py points them into one array per batch).
        ("chunk_offsets", ctypes.c_void_p),
        ("chunk_sizes", ctypes.c_void_p),
        ("storage_offsets", ctypes.c_void_p),
        ("lengths", ctypes.c_void_p),
        ("dest", ctypes.c_void_p),
        ("dest_nbytes", ctypes.c_uint64),
    ]


ITEM_TENSOR = 0
ITEM_BYTES = 1
CHECKSUMS = {"none": 0, "crc32c": 1, "xxh3": 2}

_STATUS_ERRORS = {
    1: errors.FormatError,
    2: errors.StorageError,
    3: errors.NotFoundError,
    4: errors.PlanError,
    5: errors.UsageError,
    6: errors.CommError,
    7: errors.InternalError,
}


def _library_path() -> str:
    explicit = os.environ.get("SHARDPOINT_LIBRARY")
    if explicit:
        return explicit
    lib_dir = Path(__file__).resolve().parent / "_lib"
    # A wheel may carry only the versioned names (pip does not keep the unversioned symlink).
    for name in ("libshardpoint.so", "libshardpoint.so.0"):
        if (lib_dir / name).exists():
            return str(lib_dir / name)
    raise ImportError(
        "shardpoint: libshardpoint.so not found: install the wheel (pip install shardpoint-*.whl) "
        "or set SHARDPOINT_LIBRARY to a built libshardpoint.so"
    )


def _load() -> ctypes.CDLL:
    lib = ctypes.CDLL(_library_path())
    P = ctypes.c_void_p
    status = ctypes.c_int
    err = ctypes.POINTER(ctypes.c_char_p)
    out_buf = ctypes.POINTER(ctypes.c_void_p)
    out_str = ctypes.POINTER(ctypes.c_void_p)
    size_p = ctypes.POINTER(ctypes.c_size_t)
    signatures = {
        "sp_version": (ctypes.c_char_p, []),
        "sp_free": (None, [P]),
        "sp_location_parse": (status, [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int), out_str, out_str, out_str, err]),
        "sp_checkpoint_open": (status, [ctypes.c_char_p, ctypes.POINTER(P), err]),
        "sp_checkpoint_close": (None, [P]),
        "sp_read_object": (status, [P, ctypes.c_char_p, out_buf, size_p, ctypes.POINTER(ctypes.c_int), err]),
        "sp_write_object": (status, [P, ctypes.c_char_p, P, ctypes.c_size_t, ctypes.c_int, err]),
        "sp_remove_object": (status, [P, ctypes.c_char_p, err]),
        "sp_checkpoint_files_per_rank": (ctypes.c_int, [P, ctypes.c_int]),
        "sp_save_options_init": (None, [ctypes.POINTER(SaveOptions)]),
        "sp_write_items": (
            status,
            [P, ctypes.POINTER(Item), ctypes.c_size_t, ctypes.POINTER(SaveOptions), ctypes.POINTER(P), err],
        ),
        "sp_replace_folder": (status, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int, err]),
        "sp_commit": (status, [P, P, ctypes.c_size_t, ctypes.c_char_p, ctypes.POINTER(SaveOptions), err]),
        "sp_reader_options_init": (None, [ctypes.POINTER(ReaderOptions)]),
        "sp_reader_open": (status, [P, ctypes.POINTER(ReaderOptions), ctypes.POINTER(P), err]),
        "sp_reader_close": (None, [P]),
        "sp_reader_metadata": (None, [P, out_buf, size_p]),
        "sp_reader_metadata_rebuilt": (status, [P, out_buf, size_p, err]),
        "sp_metadata_rebuild": (status, [P, ctypes.c_size_t, ctypes.c_char_p, out_buf, size_p, err]),
        "sp_reader_verified": (ctypes.c_int, [P]),
        "sp_reader_checks_zip_crc": (ctypes.c_int, [P]),
        "sp_reader_zip_crc_counts": (
            None,
            [P, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64)],
        ),
        "sp_reader_read_tensors": (status, [P, ctypes.POINTER(TensorRead), ctypes.c_size_t, err]),
        "sp_reader_read_blob": (
            status,
            [P, ctypes.c_char_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_char_p, out_buf, size_p, err],
        ),
        "sp_consolidate": (status, [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(P), err]),
        "sp_reshard": (status, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(P), err]),
        "sp_inspect": (status, [ctypes.c_char_p, ctypes.POINTER(P), err]),
        "sp_verify": (status, [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(P), err]),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


_lib: Optional[ctypes.CDLL] = None


def lib() -> ctypes.CDLL:
    """The loaded library (loaded on first use)."""
    global _lib
    if _lib is None:
        _lib = _load()
    return _lib


def _check(status: int, error: ctypes.c_char_p) -> None:
    if status == 0:
        return
    message = "unknown error"
    if error.value is not None:
        message = error.value.decode("utf-8", "replace")
        lib().sp_free(ctypes.cast(error, ctypes.c_void_p))
    raise _STATUS_ERRORS.get(status, errors.InternalError)(message)


def _address(p: ctypes.c_void_p) -> int:
    """The address in p; a NULL where the library promised memory is its bug."""
    if p.value is None:
        raise errors.InternalError("the library returned NULL where it returns memory")
    return p.value


def _take_string(p: ctypes.c_void_p) -> str:
    """The NUL-terminated string the library returned in p, freed."""
    try:
        return ctypes.string_at(_address(p)).decode("utf-8")
    finally:
        lib().sp_free(p)


def _take_bytes(p: ctypes.c_void_p, size: int) -> bytes:
    try:
        return ctypes.string_at(_address(p), size) if size else b""
    finally:
        lib().sp_free(p)


@dataclasses.dataclass(frozen=True)
class Location:
    """A path or URL as the engine parses it (sp_location_parse): the one set of rules."""

    remote: bool  # an object store or memory:// URL; False for a local path (file:// included)
    text: str  # canonical: a local location's path, or "<scheme>://<bucket>[/<path>][?query]"
    parent: Optional[str]  # the folder or prefix holding it; None at a bucket root, "/" or "."
    name: str  # the last segment ("" when none)


def parse_location(path_or_url: str) -> Location:
    """The engine's parse of ``path_or_url``; UsageError for what no driver would open."""
    remote = ctypes.c_int()
    canonical, parent, name = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    error = ctypes.c_char_p()
    _check(lib().sp_location_parse(os.fsencode(path_or_url), ctypes.byref(remote), ctypes.byref(canonical),
                                   ctypes.byref(parent), ctypes.byref(name), ctypes.byref(error)), error)
    text, up, last = _take_string(canonical), _take_string(parent), _take_string(name)
    return Location(remote=bool(remote.value), text=text, parent=up or None, name=last)


def version() -> str:
    return lib().sp_version().decode()


def int64_array(values: Sequence[int]) -> Any:
    return (ctypes.c_int64 * max(len(values), 1))(*values)


# sp_compression (c_api.h).
COMPRESSIONS = {None: 0, "zstd": 1}


def save_options(thread_count: int, checksum: str, checksum_block_bytes: int, durable: bool, direct_io: bool,
                 compression: Optional[str] = None, compression_threads: int = 0) -> SaveOptions:
    if checksum not in CHECKSUMS:
        raise errors.UsageError(f"checksum must be one of {sorted(CHECKSUMS, key=str)}, found {checksum!r}")
    if compression not in COMPRESSIONS:
        raise errors.UsageError(f"compression must be None or 'zstd', found {compression!r}")
    o = SaveOptions()
    lib().sp_save_options_init(ctypes.byref(o))
    o.thread_count = int(thread_count)
    o.checksum = CHECKSUMS[checksum]
    o.checksum_block_bytes = int(checksum_block_bytes)
    o.durable = int(bool(durable))
    o.direct_io = int(bool(direct_io))
    o.compression = COMPRESSIONS[compression]
    if compression_threads < 0:
        raise errors.UsageError(f"compression_threads must be >= 0, found {compression_threads}")
    o.compression_threads = int(compression_threads)
    return o


class Checkpoint:
    """An opened checkpoint location (folder or object-store prefix)."""

    def __init__(self, path_or_url: str):
        handle = ctypes.c_void_p()
        error = ctypes.c_char_p()
        _check(lib().sp_checkpoint_open(os.fsencode(path_or_url), ctypes.byref(handle), ctypes.byref(error)), error)
        self._handle: Optional[ctypes.c_void_p] = handle

    @property
    def handle(self) -> ctypes.c_void_p:
        if self._handle is None:
            raise errors.UsageError("checkpoint handle used after close()")
        return self._handle

    def close(self) -> None:
        if self._handle is not None:
            lib().sp_checkpoint_close(self._handle)
            self._handle = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone
            pass

    def read_object(self, key: str) -> Optional[bytes]:
        data = ctypes.c_void_p()
        size = ctypes.c_size_t()
        found = ctypes.c_int()
        error = ctypes.c_char_p()
        _check(
            lib().sp_read_object(self.handle, key.encode(), ctypes.byref(data), ctypes.byref(size), ctypes.byref(found),
                                 ctypes.byref(error)),
            error,
        )
        return _take_bytes(data, size.value) if found.value else None

    def write_object(self, key: str, data: bytes, durable: bool = True) -> None:
        error = ctypes.c_char_p()
        buf = ctypes.create_string_buffer(data, len(data))
        _check(lib().sp_write_object(self.handle, key.encode(), buf, len(data), int(durable), ctypes.byref(error)), error)

    def remove_object(self, key: str) -> None:
        error = ctypes.c_char_p()
        _check(lib().sp_remove_object(self.handle, key.encode(), ctypes.byref(error)), error)

    def files_per_rank(self, thread_count: int) -> int:
        """The data files a rank should write in parallel for thread_count: thread_count, or
        more where one object uploads as one sequential stream (gs://, sp_checkpoint_files_per_rank)."""
        return int(lib().sp_checkpoint_files_per_rank(self.handle, int(thread_count)))

    def write_items(self, items: Any, count: int, options: SaveOptions) -> str:
        """Writes the first count items of a ctypes array of Item; returns the engine's JSON
        array of what it wrote (see sp_write_items)."""
        out = ctypes.c_void_p()
        error = ctypes.c_char_p()
        _check(
            lib().sp_write_items(self.handle, items, count, ctypes.byref(options), ctypes.byref(out),
                                 ctypes.byref(error)),
            error,
        )
        return _take_string(out)

    def commit(self, metadata: bytes, written_json: str, options: SaveOptions) -> None:
        """written_json: one JSON array of every rank's records (what write_items returned)."""
        error = ctypes.c_char_p()
        buf = ctypes.create_string_buffer(metadata, len(metadata))
        _check(
            lib().sp_commit(self.handle, buf, len(metadata), written_json.encode(), ctypes.byref(options),
                            ctypes.byref(error)),
            error,
        )


class Reader:
    """An opened committed checkpoint for reads a DCP read plan names."""

    def __init__(self, checkpoint: Checkpoint, verify_checksums: bool, thread_count: int, check_zip_crc: bool = True):
        o = ReaderOptions()
        lib().sp_reader_options_init(ctypes.byref(o))
        o.verify_checksums = int(bool(verify_checksums))
        o.check_zip_crc = int(bool(check_zip_crc))
        o.thread_count = int(thread_count)
        handle = ctypes.c_void_p()
        error = ctypes.c_char_p()
        _check(lib().sp_reader_open(checkpoint.handle, ctypes.byref(o), ctypes.byref(handle), ctypes.byref(error)), error)
        self._checkpoint = checkpoint  # the reader borrows it
        self._handle: Optional[ctypes.c_void_p] = handle

    def close(self) -> None:
        if self._handle is not None:
            lib().sp_reader_close(self._handle)
            self._handle = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def metadata_bytes(self) -> bytes:
        data = ctypes.c_void_p()
        size = ctypes.c_size_t()
        lib().sp_reader_metadata(self._handle, ctypes.byref(data), ctypes.byref(size))
        return ctypes.string_at(_address(data), size.value)

    def metadata_rebuilt(self) -> bytes:
        """The metadata as the engine decoded and encoded it again (sp_reader_metadata_rebuilt):
        a pickle naming only DCP's metadata classes and torch's Size, dtypes and layout."""
        data = ctypes.c_void_p()
        size = ctypes.c_size_t()
        error = ctypes.c_char_p()
        _check(lib().sp_reader_metadata_rebuilt(self._handle, ctypes.byref(data), ctypes.byref(size),
                                                ctypes.byref(error)), error)
        return _take_bytes(data, size.value)

    def verified(self) -> bool:
        return bool(lib().sp_reader_verified(self._handle))

    def checks_zip_crc(self) -> bool:
        return bool(lib().sp_reader_checks_zip_crc(self._handle))

    def zip_crc_counts(self) -> Tuple[int, int, int]:
        """(records checked, records read only in part: unchecked, records without a CRC-32)."""
        checked, partial, none = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_uint64()
        lib().sp_reader_zip_crc_counts(self._handle, ctypes.byref(checked), ctypes.byref(partial), ctypes.byref(none))
        return checked.value, partial.value, none.value

    def read_tensors(self, reads: Any) -> None:
        """reads: a ctypes array of TensorRead, or a sequence of them."""
        array = reads if isinstance(reads, ctypes.Array) else (TensorRead * max(len(reads), 1))(*reads)
        error = ctypes.c_char_p()
        _check(lib().sp_reader_read_tensors(self._handle, array, len(reads), ctypes.byref(error)), error)

    def read_blob(self, file: str, offset: int, length: int, fqn: str) -> bytes:
        data = ctypes.c_void_p()
        size = ctypes.c_size_t()
        error = ctypes.c_char_p()
        _check(
            lib().sp_reader_read_blob(self._handle, file.encode(), offset, length, fqn.encode(), ctypes.byref(data),
                                      ctypes.byref(size), ctypes.byref(error)),
            error,
        )
        return _take_bytes(data, size.value)


def metadata_rebuild(metadata: bytes, source_name: str) -> bytes:
    """``.metadata`` bytes decoded by the engine and encoded again (sp_metadata_rebuild);
    FormatError starting with source_name when they are not DCP metadata."""
    buf = ctypes.create_string_buffer(metadata, len(metadata))
    data = ctypes.c_void_p()
    size = ctypes.c_size_t()
    error = ctypes.c_char_p()
    _check(lib().sp_metadata_rebuild(buf, len(metadata), source_name.encode(), ctypes.byref(data), ctypes.byref(size),
                                     ctypes.byref(error)), error)
    return _take_bytes(data, size.value)


def replace_folder(staged: str, target: str, durable: bool) -> None:
    """Publishes the local folder ``staged`` as ``target`` (exchanged in one step when
    ``target`` exists; the old folder is removed)."""
    error = ctypes.c_char_p()
    _check(lib().sp_replace_folder(os.fsencode(staged), os.fsencode(target), int(durable), ctypes.byref(error)), error)


def _json_call(fn_name: str, *args: Any) -> dict:
    out = ctypes.c_void_p()
    error = ctypes.c_char_p()
    _check(getattr(lib(), fn_name)(*args, ctypes.byref(out), ctypes.byref(error)), error)
    return json.loads(_take_string(out))


def consolidate(folder: str, options: dict) -> dict:
    return _json_call("sp_consolidate", os.fsencode(folder), json.dumps(options).encode())


def reshard(source: str, destination: str, ranks: int, options: dict) -> dict:
    return _json_call("sp_reshard", os.fsencode(source), os.fsencode(destination), int(ranks), json.dumps(options).encode())


def inspect(path: str) -> dict:
    return _json_call("sp_inspect", os.fsencode(path))


def verify(path: str, options: dict) -> dict:
    return _json_call("sp_verify", os.fsencode(path), json.dumps(options).encode())
