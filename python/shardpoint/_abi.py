"""The C ABI of libshardpoint (include/shardpoint/c_api.h) as ctypes sees it: the options,
item and result structs mirrored field by field, the functions' signatures, the library's
loading, and the status-to-exception mapping. Only _native.py and the adapters that fill the
item structs use it; nothing here knows what a call means.

The library is looked up in ``$SHARDPOINT_LIBRARY`` (a path), then in this package's ``_lib``
folder (wheels).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Optional

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


class ZipCrcCountsStruct(ctypes.Structure):
    _fields_ = [
        ("records_checked", ctypes.c_uint64),
        ("bytes_checked", ctypes.c_uint64),
        ("records_no_checksum", ctypes.c_uint64),
        ("records_partial", ctypes.c_uint64),
    ]


class ConsolidateOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("output_file", ctypes.c_char_p),
        ("layout", ctypes.c_int),
        ("format", ctypes.c_int),
        ("max_shard_bytes", ctypes.c_uint64),
        ("memory_budget_bytes", ctypes.c_uint64),
        ("verify_checksums", ctypes.c_int),
        ("check_zip_crc", ctypes.c_int),
        ("durable", ctypes.c_int),
    ]


class ConsolidateResultStruct(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("output", ctypes.c_void_p),  # char*, freed by sp_consolidate_result_free
        ("tensors", ctypes.c_uint64),
        ("objects", ctypes.c_uint64),
        ("tensor_bytes", ctypes.c_uint64),
        ("bytes_read", ctypes.c_uint64),
        ("peak_rss_bytes", ctypes.c_uint64),
        ("zip_crc", ZipCrcCountsStruct),
        ("seconds", ctypes.c_double),
    ]


class ReshardOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("verify_checksums", ctypes.c_int),
        ("check_zip_crc", ctypes.c_int),
        ("memory_budget_bytes", ctypes.c_uint64),
        ("thread_count", ctypes.c_int),
        ("durable", ctypes.c_int),
        ("checksum", ctypes.c_int),
        ("compression", ctypes.c_int),
        ("compression_level", ctypes.c_int),
        ("compression_threads", ctypes.c_int),
    ]


class ReshardResultStruct(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("source_format", ctypes.c_int),
        ("tensors", ctypes.c_uint64),
        ("objects", ctypes.c_uint64),
        ("payload_bytes", ctypes.c_uint64),
        ("bytes_written", ctypes.c_uint64),
        ("zip_crc", ZipCrcCountsStruct),
        ("meta_pt_bytes", ctypes.c_uint64),
        ("seconds", ctypes.c_double),
    ]


class VerifyOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("quick", ctypes.c_int)]


class VerifyProblemStruct(ctypes.Structure):
    _fields_ = [("file", ctypes.c_char_p), ("item", ctypes.c_char_p), ("message", ctypes.c_char_p)]


class VerifyCoverageStruct(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("format", ctypes.c_int),
        ("quick", ctypes.c_int),
        ("structure_bytes", ctypes.c_uint64),
        ("zip_records", ctypes.c_uint64),
        ("zip_record_bytes", ctypes.c_uint64),
        ("zip_crc32_bytes", ctypes.c_uint64),
        ("no_checksum_bytes", ctypes.c_uint64),
        ("sidecar", ctypes.c_int),
        ("sidecar_bytes", ctypes.c_uint64),
    ]


class VerifyResultStruct(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("owner", ctypes.c_void_p),
        ("ok", ctypes.c_int),
        ("tensors", ctypes.c_uint64),
        ("objects", ctypes.c_uint64),
        ("bytes", ctypes.c_uint64),
        ("verified_bytes", ctypes.c_uint64),
        ("problem_count", ctypes.c_size_t),
        ("problems", ctypes.POINTER(VerifyProblemStruct)),
        ("coverage_count", ctypes.c_size_t),
        ("coverage", ctypes.POINTER(VerifyCoverageStruct)),
    ]


class StringList(ctypes.Structure):
    _fields_ = [("count", ctypes.c_size_t), ("items", ctypes.POINTER(ctypes.c_char_p))]


# Pointers to arrays are c_void_p (addresses): read with from_address, set from the
# addresses of arrays the caller keeps alive.
class StorageInfoStruct(ctypes.Structure):
    _fields_ = [
        ("file", ctypes.c_char_p),
        ("offset", ctypes.c_uint64),
        ("length", ctypes.c_uint64),
        ("transform_descriptor_count", ctypes.c_size_t),
        ("transform_descriptors", ctypes.c_void_p),  # const char* const*
    ]


class WrittenItemStruct(ctypes.Structure):
    _fields_ = [
        ("kind", ctypes.c_int),
        ("fqn", ctypes.c_char_p),
        ("ndim", ctypes.c_int),
        ("offsets", ctypes.c_void_p),  # const int64_t*
        ("storage", StorageInfoStruct),
        ("checksum", ctypes.c_uint64),
        ("block_count", ctypes.c_size_t),
        ("blocks", ctypes.c_void_p),  # const uint64_t*
        ("has_data_offset", ctypes.c_int),
        ("data_offset", ctypes.c_uint64),
    ]


class WriteResultStruct(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("owner", ctypes.c_void_p),
        ("item_count", ctypes.c_size_t),
        ("items", ctypes.POINTER(WrittenItemStruct)),
    ]


class InspectOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t)]


class InspectChunkStruct(ctypes.Structure):
    _fields_ = [("offsets", ctypes.c_void_p), ("sizes", ctypes.c_void_p), ("storage", StorageInfoStruct)]


class InspectTensorStruct(ctypes.Structure):
    _fields_ = [
        ("fqn", ctypes.c_char_p),
        ("dtype", ctypes.c_char_p),
        ("ndim", ctypes.c_int),
        ("shape", ctypes.c_void_p),
        ("chunk_count", ctypes.c_size_t),
        ("chunks", ctypes.POINTER(InspectChunkStruct)),
    ]


class InspectObjectStruct(ctypes.Structure):
    _fields_ = [("fqn", ctypes.c_char_p), ("storage", StorageInfoStruct)]


class InspectResultStruct(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("owner", ctypes.c_void_p),
        ("format", ctypes.c_int),
        ("sidecar", ctypes.c_int),
        ("tensor_count", ctypes.c_size_t),
        ("tensors", ctypes.POINTER(InspectTensorStruct)),
        ("object_count", ctypes.c_size_t),
        ("objects", ctypes.POINTER(InspectObjectStruct)),
        ("file_count", ctypes.c_size_t),
        ("files", ctypes.POINTER(ctypes.c_char_p)),
    ]


ITEM_TENSOR = 0
ITEM_BYTES = 1

# sp_name_kind (c_api.h): the enums whose names the engine maps.
NAME_CHECKSUM = 0
NAME_COMPRESSION = 1
NAME_LAYOUT = 2
NAME_OUTPUT_FORMAT = 3
NAME_CHECKPOINT_FORMAT = 4

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
        "sp_save_options_init": (None, [ctypes.POINTER(SaveOptions)]),
        "sp_write_result_init": (None, [ctypes.POINTER(WriteResultStruct)]),
        "sp_write_result_free": (None, [ctypes.POINTER(WriteResultStruct)]),
        "sp_write_items": (
            status,
            [P, ctypes.POINTER(Item), ctypes.c_size_t, ctypes.POINTER(SaveOptions), ctypes.POINTER(WriteResultStruct),
             err],
        ),
        "sp_replace_folder": (status, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int, err]),
        "sp_commit": (
            status,
            [P, P, ctypes.c_size_t, ctypes.POINTER(WrittenItemStruct), ctypes.c_size_t, ctypes.POINTER(SaveOptions),
             err],
        ),
        "sp_reader_options_init": (None, [ctypes.POINTER(ReaderOptions)]),
        "sp_reader_open": (status, [P, ctypes.POINTER(ReaderOptions), ctypes.POINTER(P), err]),
        "sp_reader_close": (None, [P]),
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
        "sp_value_of_name": (status, [ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int), err]),
        "sp_name_of_value": (ctypes.c_char_p, [ctypes.c_int, ctypes.c_int]),
        "sp_consolidate_options_init": (None, [ctypes.POINTER(ConsolidateOptions)]),
        "sp_consolidate_result_init": (None, [ctypes.POINTER(ConsolidateResultStruct)]),
        "sp_consolidate_result_free": (None, [ctypes.POINTER(ConsolidateResultStruct)]),
        "sp_consolidate": (
            status,
            [ctypes.c_char_p, ctypes.POINTER(ConsolidateOptions), ctypes.POINTER(ConsolidateResultStruct), err],
        ),
        "sp_reshard_options_init": (None, [ctypes.POINTER(ReshardOptions)]),
        "sp_reshard_result_init": (None, [ctypes.POINTER(ReshardResultStruct)]),
        "sp_reshard": (
            status,
            [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ReshardOptions),
             ctypes.POINTER(ReshardResultStruct), err],
        ),
        "sp_verify_options_init": (None, [ctypes.POINTER(VerifyOptions)]),
        "sp_verify_result_init": (None, [ctypes.POINTER(VerifyResultStruct)]),
        "sp_verify_result_free": (None, [ctypes.POINTER(VerifyResultStruct)]),
        "sp_verify": (
            status, [ctypes.c_char_p, ctypes.POINTER(VerifyOptions), ctypes.POINTER(VerifyResultStruct), err]
        ),
        "sp_inspect_options_init": (None, [ctypes.POINTER(InspectOptions)]),
        "sp_inspect_result_init": (None, [ctypes.POINTER(InspectResultStruct)]),
        "sp_inspect_result_free": (None, [ctypes.POINTER(InspectResultStruct)]),
        "sp_inspect": (
            status, [ctypes.c_char_p, ctypes.POINTER(InspectOptions), ctypes.POINTER(InspectResultStruct), err]
        ),
        "sp_string_list_free": (None, [ctypes.POINTER(StringList)]),
        "sp_checkpoint_committed": (status, [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int), err]),
        "sp_list_committed_checkpoints": (status, [ctypes.c_char_p, ctypes.POINTER(StringList), err]),
        "sp_remove_checkpoint": (status, [ctypes.c_char_p, err]),
        "sp_staging_folder": (status, [ctypes.c_char_p, ctypes.c_char_p, out_str, err]),
        "sp_remove_stale_staging": (status, [ctypes.c_char_p, size_p, err]),
        "sp_split_into_files": (
            status,
            [P, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_uint64),
             ctypes.c_size_t, ctypes.POINTER(ctypes.c_int), size_p, ctypes.POINTER(ctypes.c_int), err],
        ),
        "sp_copy_ranges": (
            None, [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_uint64),
                   ctypes.c_size_t],
        ),
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


def check(status: int, error: ctypes.c_char_p) -> None:
    if status == 0:
        return
    message = "unknown error"
    if error.value is not None:
        message = error.value.decode("utf-8", "replace")
        lib().sp_free(ctypes.cast(error, ctypes.c_void_p))
    raise _STATUS_ERRORS.get(status, errors.InternalError)(message)


def address(p: ctypes.c_void_p) -> int:
    """The address in p; a NULL where the library promised memory is its bug."""
    if p.value is None:
        raise errors.InternalError("the library returned NULL where it returns memory")
    return p.value


def take_string(p: ctypes.c_void_p) -> str:
    """The NUL-terminated string the library returned in p, freed."""
    try:
        return ctypes.string_at(address(p)).decode("utf-8")
    finally:
        lib().sp_free(p)


def take_bytes(p: ctypes.c_void_p, size: int) -> bytes:
    try:
        return ctypes.string_at(address(p), size) if size else b""
    finally:
        lib().sp_free(p)
