"""ctypes binding of libshardpoint's C API (include/shardpoint/c_api.h): the calls, with
their options and results turned into Python values. The structs, signatures and library
loading are in _abi.py. ctypes releases the GIL around every foreign call, so native I/O
runs while other Python threads go on.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import struct
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple, cast, get_args

from . import _abi, errors, results


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
    _abi.check(_abi.lib().sp_location_parse(os.fsencode(path_or_url), ctypes.byref(remote), ctypes.byref(canonical),
                                   ctypes.byref(parent), ctypes.byref(name), ctypes.byref(error)), error)
    text, up, last = _abi.take_string(canonical), _abi.take_string(parent), _abi.take_string(name)
    return Location(remote=bool(remote.value), text=text, parent=up or None, name=last)


def version() -> str:
    return _abi.lib().sp_version().decode()


def copy_ranges(dsts: Sequence[int], srcs: Sequence[int], sizes: Sequence[int]) -> None:
    """Copies sizes[i] bytes from address srcs[i] to dsts[i] for every i (sp_copy_ranges:
    stores that bypass the cache for large ranges), the GIL released; complete on return.
    REQUIRES: the ranges are valid for their sizes and do not overlap."""
    n = len(sizes)
    if n:
        _abi.lib().sp_copy_ranges((ctypes.c_void_p * n)(*dsts), (ctypes.c_void_p * n)(*srcs), (ctypes.c_uint64 * n)(*sizes), n)


def int64_array(values: Sequence[int]) -> Any:
    return (ctypes.c_int64 * max(len(values), 1))(*values)


def value_of_name(kind: int, name: str) -> int:
    """The C enum value the engine's mapping gives ``name`` (sp_value_of_name); UsageError
    naming the accepted names for any other."""
    if not isinstance(name, str):
        raise errors.UsageError(f"expected a name (str), found {name!r}")
    value = ctypes.c_int()
    error = ctypes.c_char_p()
    _abi.check(_abi.lib().sp_value_of_name(kind, name.encode(), ctypes.byref(value), ctypes.byref(error)), error)
    return value.value


def name_of_value(kind: int, value: int) -> str:
    """The engine's name of a C enum value (sp_name_of_value)."""
    name = _abi.lib().sp_name_of_value(kind, value)
    if name is None:
        raise errors.InternalError(f"the library returned enum value {value} without a name (kind {kind})")
    return name.decode()


def save_options(thread_count: Optional[int] = None, checksum: Optional[str] = None,
                 checksum_block_bytes: Optional[int] = None, durable: Optional[bool] = None,
                 direct_io: Optional[bool] = None, compression: Optional[str] = None,
                 compression_threads: Optional[int] = None, compression_level: Optional[int] = None) -> _abi.SaveOptions:
    """sp_save_options: the engine's defaults (sp_save_options_init) for every None."""
    o = _abi.SaveOptions()
    _abi.lib().sp_save_options_init(ctypes.byref(o))
    if thread_count is not None:
        o.thread_count = int(thread_count)
    if checksum is not None:
        o.checksum = value_of_name(_abi.NAME_CHECKSUM, checksum)
    if checksum_block_bytes is not None:
        o.checksum_block_bytes = int(checksum_block_bytes)
    if durable is not None:
        o.durable = int(bool(durable))
    if direct_io is not None:
        o.direct_io = int(bool(direct_io))
    if compression is not None:
        o.compression = value_of_name(_abi.NAME_COMPRESSION, compression)
    if compression_threads is not None:
        if compression_threads < 0:
            raise errors.UsageError(f"compression_threads must be >= 0, found {compression_threads}")
        o.compression_threads = int(compression_threads)
    if compression_level is not None:
        o.compression_level = int(compression_level)
    return o


def reader_options(verify_checksums: Optional[bool] = None, thread_count: Optional[int] = None,
                   check_zip_crc: Optional[bool] = None) -> _abi.ReaderOptions:
    """sp_reader_options: the engine's defaults (sp_reader_options_init) for every None."""
    o = _abi.ReaderOptions()
    _abi.lib().sp_reader_options_init(ctypes.byref(o))
    if verify_checksums is not None:
        o.verify_checksums = int(bool(verify_checksums))
    if thread_count is not None:
        o.thread_count = int(thread_count)
    if check_zip_crc is not None:
        o.check_zip_crc = int(bool(check_zip_crc))
    return o


class WrittenItem(NamedTuple):
    """What one item became in its file (sp_written_item), as plain values: a rank's records
    pickle into DCP's WriteResult, reach the coordinator, and go back to the engine there
    (Checkpoint.commit). A typed tuple, not a dataclass: one is made per item of every save,
    and a tuple is made (and pickled) in about half the time."""

    fqn: str
    offsets: Optional[Tuple[int, ...]]  # a tensor chunk's global offsets; None for a bytes item
    file: str
    offset: int  # the blob: [offset, offset + length) of file, as stored
    length: int
    transform_descriptors: Tuple[str, ...]  # what .metadata records for the blob (compressed)
    checksum: int  # over the whole blob
    blocks: Tuple[int, ...]  # per checksum block of the blob
    data_offset: Optional[int]  # where the tensor bytes start in the blob; None: bytes item, compressed


# sp_written_item's fields in C's layout, to read a result's whole array in one pass
# (struct.iter_unpack; field by field through ctypes costs twice the time per item).
_WRITTEN_ITEM = struct.Struct("@iPiPPQQNPQNPiQ")
if _WRITTEN_ITEM.size != ctypes.sizeof(_abi.WrittenItemStruct):
    raise ImportError(f"shardpoint: sp_written_item is {ctypes.sizeof(_abi.WrittenItemStruct)} bytes in ctypes, "
                      f"{_WRITTEN_ITEM.size} as a struct format")


def _written_items(r: _abi.WriteResultStruct) -> Tuple[WrittenItem, ...]:
    """The records of an sp_write_result, copied out of the library's memory."""
    count = r.item_count
    if count == 0:
        return ()
    string_at, i64, u64, ptr = ctypes.string_at, ctypes.c_int64, ctypes.c_uint64, ctypes.c_void_p
    raw = string_at(_abi.address(ctypes.cast(r.items, ctypes.c_void_p)), count * _WRITTEN_ITEM.size)
    files: Dict[bytes, str] = {}  # the few file names, decoded once
    out = []
    for (kind, fqn, ndim, offsets, file, offset, length, descriptor_count, descriptors, checksum, block_count,
         blocks, has_data_offset, data_offset) in _WRITTEN_ITEM.iter_unpack(raw):
        file_name = string_at(file)
        name = files.get(file_name)
        if name is None:
            name = files[file_name] = file_name.decode()
        out.append(WrittenItem(
            string_at(fqn).decode(),
            tuple((i64 * ndim).from_address(offsets)) if kind == _abi.ITEM_TENSOR and ndim else
            (() if kind == _abi.ITEM_TENSOR else None),
            name,
            offset,
            length,
            tuple(string_at(d).decode() for d in (ptr * descriptor_count).from_address(descriptors))
            if descriptor_count else (),
            checksum,
            tuple((u64 * block_count).from_address(blocks)) if block_count else (),
            data_offset if has_data_offset else None,
        ))
    return tuple(out)


def _array(ctype: Any, address: Optional[int], count: int) -> Tuple[Any, ...]:
    """The count values of ctype at address (the library's memory), as a tuple."""
    if count == 0:
        return ()
    if address is None:
        raise errors.InternalError("the library returned NULL for a non-empty array")
    return tuple((ctype * count).from_address(address))


def _descriptors(storage: _abi.StorageInfoStruct) -> Tuple[str, ...]:
    return tuple(d.decode() for d in _array(ctypes.c_char_p, storage.transform_descriptors,
                                            storage.transform_descriptor_count))


class _WrittenItemArray:
    """WrittenItems as an array of _abi.WrittenItemStruct, with everything it points into."""

    def __init__(self, records: Sequence[WrittenItem]):
        count = len(records)
        ints: List[int] = []
        blocks: List[int] = []
        names: List[str] = []
        for r in records:
            ints.extend(r.offsets or ())
            blocks.extend(r.blocks)
            names.extend(r.transform_descriptors)
        self.ints = int64_array(ints)
        self.blocks = (ctypes.c_uint64 * max(len(blocks), 1))(*blocks)
        self.names = (ctypes.c_char_p * max(len(names), 1))(*(n.encode() for n in names))
        self.strings: List[bytes] = []  # the fqns and file names the structs point at
        self.items = (_abi.WrittenItemStruct * max(count, 1))()
        int_base = ctypes.addressof(self.ints)
        block_base = ctypes.addressof(self.blocks)
        name_base = ctypes.addressof(self.names)
        at_int = at_block = at_name = 0
        for slot, r in zip(self.items, records):
            fqn, file = r.fqn.encode(), r.file.encode()
            self.strings += [fqn, file]
            slot.fqn = fqn
            if r.offsets is None:
                slot.kind = _abi.ITEM_BYTES
            else:
                slot.kind = _abi.ITEM_TENSOR
                slot.ndim = len(r.offsets)
                slot.offsets = int_base + 8 * at_int
                at_int += len(r.offsets)
            slot.storage.file = file
            slot.storage.offset = r.offset
            slot.storage.length = r.length
            slot.storage.transform_descriptor_count = len(r.transform_descriptors)
            slot.storage.transform_descriptors = name_base + ctypes.sizeof(ctypes.c_char_p) * at_name
            at_name += len(r.transform_descriptors)
            slot.checksum = r.checksum
            slot.block_count = len(r.blocks)
            slot.blocks = block_base + 8 * at_block
            at_block += len(r.blocks)
            if r.data_offset is not None:
                slot.has_data_offset = 1
                slot.data_offset = r.data_offset
        self.count = count


class Checkpoint:
    """An opened checkpoint location (folder or object-store prefix)."""

    def __init__(self, path_or_url: str):
        handle = ctypes.c_void_p()
        error = ctypes.c_char_p()
        _abi.check(_abi.lib().sp_checkpoint_open(os.fsencode(path_or_url), ctypes.byref(handle), ctypes.byref(error)), error)
        self._handle: Optional[ctypes.c_void_p] = handle

    @property
    def handle(self) -> ctypes.c_void_p:
        if self._handle is None:
            raise errors.UsageError("checkpoint handle used after close()")
        return self._handle

    def close(self) -> None:
        if self._handle is not None:
            _abi.lib().sp_checkpoint_close(self._handle)
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
        _abi.check(
            _abi.lib().sp_read_object(self.handle, key.encode(), ctypes.byref(data), ctypes.byref(size), ctypes.byref(found),
                                 ctypes.byref(error)),
            error,
        )
        return _abi.take_bytes(data, size.value) if found.value else None

    def write_object(self, key: str, data: bytes, durable: bool = True) -> None:
        error = ctypes.c_char_p()
        buf = ctypes.create_string_buffer(data, len(data))
        _abi.check(_abi.lib().sp_write_object(self.handle, key.encode(), buf, len(data), int(durable), ctypes.byref(error)), error)

    def remove_object(self, key: str) -> None:
        error = ctypes.c_char_p()
        _abi.check(_abi.lib().sp_remove_object(self.handle, key.encode(), ctypes.byref(error)), error)

    def split_into_files(self, kinds: Sequence[int], nbytes: Sequence[int], thread_count: int,
                         single_file_per_rank: bool) -> Tuple[List[int], List[int], int]:
        """The engine's split of a rank's items into data files (sp_split_into_files): item i
        is of kind kinds[i] (_abi.ITEM_TENSOR, _abi.ITEM_BYTES) and nbytes[i] bytes. Returns (the file
        of each item, the items' positions file by file in write order, the file count)."""
        count = len(kinds)
        file_of_item = (ctypes.c_int * max(count, 1))()
        order = (ctypes.c_size_t * max(count, 1))()
        files = ctypes.c_int()
        error = ctypes.c_char_p()
        _abi.check(
            _abi.lib().sp_split_into_files(self.handle, int(thread_count), int(bool(single_file_per_rank)),
                                      (ctypes.c_int * max(count, 1))(*kinds), (ctypes.c_uint64 * max(count, 1))(*nbytes),
                                      count, file_of_item, order, ctypes.byref(files), ctypes.byref(error)),
            error,
        )
        return list(file_of_item[:count]), list(order[:count]), files.value

    def write_items(self, items: Any, count: int, options: _abi.SaveOptions) -> Tuple[WrittenItem, ...]:
        """Writes the first count items of a ctypes array of _abi.Item; returns what each became,
        in file order (sp_write_items)."""
        r = _abi.WriteResultStruct()
        _abi.lib().sp_write_result_init(ctypes.byref(r))
        error = ctypes.c_char_p()
        try:
            _abi.check(_abi.lib().sp_write_items(self.handle, items, count, ctypes.byref(options), ctypes.byref(r),
                                        ctypes.byref(error)), error)
            return _written_items(r)
        finally:
            _abi.lib().sp_write_result_free(ctypes.byref(r))

    def commit(self, metadata: bytes, written: Sequence[WrittenItem], options: _abi.SaveOptions) -> None:
        """Commits (sp_commit): ``written`` holds every rank's records, as write_items
        returned them."""
        error = ctypes.c_char_p()
        buf = ctypes.create_string_buffer(metadata, len(metadata))
        records = _WrittenItemArray(written)
        _abi.check(
            _abi.lib().sp_commit(self.handle, buf, len(metadata), records.items, records.count, ctypes.byref(options),
                            ctypes.byref(error)),
            error,
        )


class Reader:
    """An opened committed checkpoint for reads a DCP read plan names."""

    def __init__(self, checkpoint: Checkpoint, options: _abi.ReaderOptions):
        o = options
        handle = ctypes.c_void_p()
        error = ctypes.c_char_p()
        _abi.check(_abi.lib().sp_reader_open(checkpoint.handle, ctypes.byref(o), ctypes.byref(handle), ctypes.byref(error)), error)
        self._checkpoint = checkpoint  # the reader borrows it
        self._handle: Optional[ctypes.c_void_p] = handle

    def close(self) -> None:
        if self._handle is not None:
            _abi.lib().sp_reader_close(self._handle)
            self._handle = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def metadata_rebuilt(self) -> bytes:
        """The metadata as the engine decoded and encoded it again (sp_reader_metadata_rebuilt):
        a pickle naming only DCP's metadata classes and torch's Size, dtypes and layout."""
        data = ctypes.c_void_p()
        size = ctypes.c_size_t()
        error = ctypes.c_char_p()
        _abi.check(_abi.lib().sp_reader_metadata_rebuilt(self._handle, ctypes.byref(data), ctypes.byref(size),
                                                ctypes.byref(error)), error)
        return _abi.take_bytes(data, size.value)

    def verified(self) -> bool:
        return bool(_abi.lib().sp_reader_verified(self._handle))

    def checks_zip_crc(self) -> bool:
        return bool(_abi.lib().sp_reader_checks_zip_crc(self._handle))

    def zip_crc_counts(self) -> Tuple[int, int, int]:
        """(records checked, records read only in part: unchecked, records without a CRC-32)."""
        checked, partial, none = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_uint64()
        _abi.lib().sp_reader_zip_crc_counts(self._handle, ctypes.byref(checked), ctypes.byref(partial), ctypes.byref(none))
        return checked.value, partial.value, none.value

    def read_tensors(self, reads: Any) -> None:
        """reads: a ctypes array of _abi.TensorRead, or a sequence of them."""
        array = reads if isinstance(reads, ctypes.Array) else (_abi.TensorRead * max(len(reads), 1))(*reads)
        error = ctypes.c_char_p()
        _abi.check(_abi.lib().sp_reader_read_tensors(self._handle, array, len(reads), ctypes.byref(error)), error)

    def read_blob(self, file: str, offset: int, length: int, fqn: str) -> bytes:
        data = ctypes.c_void_p()
        size = ctypes.c_size_t()
        error = ctypes.c_char_p()
        _abi.check(
            _abi.lib().sp_reader_read_blob(self._handle, file.encode(), offset, length, fqn.encode(), ctypes.byref(data),
                                      ctypes.byref(size), ctypes.byref(error)),
            error,
        )
        return _abi.take_bytes(data, size.value)


def metadata_rebuild(metadata: bytes, source_name: str) -> bytes:
    """``.metadata`` bytes decoded by the engine and encoded again (sp_metadata_rebuild);
    FormatError starting with source_name when they are not DCP metadata."""
    buf = ctypes.create_string_buffer(metadata, len(metadata))
    data = ctypes.c_void_p()
    size = ctypes.c_size_t()
    error = ctypes.c_char_p()
    _abi.check(_abi.lib().sp_metadata_rebuild(buf, len(metadata), source_name.encode(), ctypes.byref(data), ctypes.byref(size),
                                     ctypes.byref(error)), error)
    return _abi.take_bytes(data, size.value)


def replace_folder(staged: str, target: str, durable: bool) -> None:
    """Publishes the local folder ``staged`` as ``target`` (exchanged in one step when
    ``target`` exists; the old folder is removed)."""
    error = ctypes.c_char_p()
    _abi.check(_abi.lib().sp_replace_folder(os.fsencode(staged), os.fsencode(target), int(durable), ctypes.byref(error)), error)


def _zip_crc(c: _abi.ZipCrcCountsStruct) -> results.ZipCrcCounts:
    return results.ZipCrcCounts(records_checked=c.records_checked, bytes_checked=c.bytes_checked,
                                records_no_checksum=c.records_no_checksum, records_partial=c.records_partial)


def _checkpoint_format(value: int) -> results.CheckpointFormat:
    name = name_of_value(_abi.NAME_CHECKPOINT_FORMAT, value)
    if name not in get_args(results.CheckpointFormat):
        raise errors.InternalError(f"the library named a checkpoint format {name!r} this package does not know")
    return cast(results.CheckpointFormat, name)


def consolidate(folder: str, output_file: Optional[str], layout: Optional[str] = None, format: Optional[str] = None,
                max_shard_bytes: Optional[int] = None, memory_budget_bytes: Optional[int] = None,
                verify_checksums: Optional[bool] = None, check_zip_crc: Optional[bool] = None,
                durable: Optional[bool] = None) -> results.ConsolidateResult:
    """sp_consolidate; None: the engine's default (sp_consolidate_options_init)."""
    o = _abi.ConsolidateOptions()
    _abi.lib().sp_consolidate_options_init(ctypes.byref(o))
    output = os.fsencode(output_file) if output_file is not None else None
    o.output_file = output
    if layout is not None:
        o.layout = value_of_name(_abi.NAME_LAYOUT, layout)
    if format is not None:
        o.format = value_of_name(_abi.NAME_OUTPUT_FORMAT, format)
    if max_shard_bytes is not None:
        o.max_shard_bytes = int(max_shard_bytes)
    if memory_budget_bytes is not None:
        o.memory_budget_bytes = int(memory_budget_bytes)
    if verify_checksums is not None:
        o.verify_checksums = int(bool(verify_checksums))
    if check_zip_crc is not None:
        o.check_zip_crc = int(bool(check_zip_crc))
    if durable is not None:
        o.durable = int(bool(durable))
    r = _abi.ConsolidateResultStruct()
    _abi.lib().sp_consolidate_result_init(ctypes.byref(r))
    error = ctypes.c_char_p()
    try:
        _abi.check(_abi.lib().sp_consolidate(os.fsencode(folder), ctypes.byref(o), ctypes.byref(r), ctypes.byref(error)), error)
        written = ctypes.string_at(_abi.address(ctypes.c_void_p(r.output))).decode("utf-8")
    finally:
        _abi.lib().sp_consolidate_result_free(ctypes.byref(r))
    return results.ConsolidateResult(output=written, tensors=r.tensors, objects=r.objects, tensor_bytes=r.tensor_bytes,
                                     bytes_read=r.bytes_read, peak_rss_bytes=r.peak_rss_bytes,
                                     zip_crc=_zip_crc(r.zip_crc), seconds=r.seconds)


def reshard(source: str, destination: str, ranks: int, verify_checksums: Optional[bool] = None,
            check_zip_crc: Optional[bool] = None, memory_budget_bytes: Optional[int] = None,
            thread_count: Optional[int] = None, checksum: Optional[str] = None, durable: Optional[bool] = None,
            compression: Optional[str] = None, compression_level: Optional[int] = None,
            compression_threads: Optional[int] = None) -> results.ReshardResult:
    """sp_reshard; None: the engine's default (sp_reshard_options_init)."""
    o = _abi.ReshardOptions()
    _abi.lib().sp_reshard_options_init(ctypes.byref(o))
    if verify_checksums is not None:
        o.verify_checksums = int(bool(verify_checksums))
    if check_zip_crc is not None:
        o.check_zip_crc = int(bool(check_zip_crc))
    if memory_budget_bytes is not None:
        o.memory_budget_bytes = int(memory_budget_bytes)
    if thread_count is not None:
        o.thread_count = int(thread_count)
    if durable is not None:
        o.durable = int(bool(durable))
    if checksum is not None:
        o.checksum = value_of_name(_abi.NAME_CHECKSUM, checksum)
    if compression is not None:
        o.compression = value_of_name(_abi.NAME_COMPRESSION, compression)
    if compression_level is not None:
        o.compression_level = int(compression_level)
    if compression_threads is not None:
        if compression_threads < 0:
            raise errors.UsageError(f"compression_threads must be >= 0, found {compression_threads}")
        o.compression_threads = int(compression_threads)
    r = _abi.ReshardResultStruct()
    _abi.lib().sp_reshard_result_init(ctypes.byref(r))
    error = ctypes.c_char_p()
    _abi.check(_abi.lib().sp_reshard(os.fsencode(source), os.fsencode(destination), int(ranks), ctypes.byref(o),
                            ctypes.byref(r), ctypes.byref(error)), error)
    return results.ReshardResult(source_format=_checkpoint_format(r.source_format), tensors=r.tensors,
                                 objects=r.objects, payload_bytes=r.payload_bytes, bytes_written=r.bytes_written,
                                 zip_crc=_zip_crc(r.zip_crc), meta_pt_bytes=r.meta_pt_bytes, seconds=r.seconds)


def _text(p: Optional[bytes]) -> str:
    return p.decode("utf-8", "replace") if p is not None else ""


def _sidecar(value: int) -> Optional[results.SidecarChecksum]:
    name = name_of_value(_abi.NAME_CHECKSUM, value)
    return cast(results.SidecarChecksum, name) if name in get_args(results.SidecarChecksum) else None


def verify(path: str, quick: Optional[bool] = None) -> results.VerifyResult:
    """sp_verify; None: the engine's default (sp_verify_options_init)."""
    o = _abi.VerifyOptions()
    _abi.lib().sp_verify_options_init(ctypes.byref(o))
    if quick is not None:
        o.quick = int(bool(quick))
    r = _abi.VerifyResultStruct()
    _abi.lib().sp_verify_result_init(ctypes.byref(r))
    error = ctypes.c_char_p()
    try:
        _abi.check(_abi.lib().sp_verify(os.fsencode(path), ctypes.byref(o), ctypes.byref(r), ctypes.byref(error)), error)
        problems = tuple(
            results.VerifyProblem(file=_text(p.file), item=_text(p.item), message=_text(p.message))
            for p in r.problems[: r.problem_count]
        )
        coverage = tuple(
            results.VerifyCoverage(name=_text(c.name), format=_checkpoint_format(c.format), quick=bool(c.quick),
                                   structure_bytes=c.structure_bytes, zip_records=c.zip_records,
                                   zip_record_bytes=c.zip_record_bytes, zip_crc32_bytes=c.zip_crc32_bytes,
                                   no_checksum_bytes=c.no_checksum_bytes, sidecar=_sidecar(c.sidecar),
                                   sidecar_bytes=c.sidecar_bytes)
            for c in r.coverage[: r.coverage_count]
        )
    finally:
        _abi.lib().sp_verify_result_free(ctypes.byref(r))
    return results.VerifyResult(ok=bool(r.ok), problems=problems, tensors=r.tensors, objects=r.objects, bytes=r.bytes,
                                verified_bytes=r.verified_bytes, coverage=coverage)


def _inspect_chunk(c: _abi.InspectChunkStruct, ndim: int) -> results.InspectChunk:
    return results.InspectChunk(offsets=_array(ctypes.c_int64, c.offsets, ndim),
                                sizes=_array(ctypes.c_int64, c.sizes, ndim),
                                file=c.storage.file.decode() if c.storage.file is not None else None,
                                offset=c.storage.offset, length=c.storage.length,
                                transform_descriptors=_descriptors(c.storage))


def inspect(path: str) -> results.InspectResult:
    """The structure of a checkpoint folder (sp_inspect)."""
    o = _abi.InspectOptions()
    _abi.lib().sp_inspect_options_init(ctypes.byref(o))
    r = _abi.InspectResultStruct()
    _abi.lib().sp_inspect_result_init(ctypes.byref(r))
    error = ctypes.c_char_p()
    try:
        _abi.check(_abi.lib().sp_inspect(os.fsencode(path), ctypes.byref(o), ctypes.byref(r), ctypes.byref(error)), error)
        tensors = {
            t.fqn.decode(): results.InspectTensor(
                dtype=t.dtype.decode(), shape=_array(ctypes.c_int64, t.shape, t.ndim),
                chunks=tuple(_inspect_chunk(c, t.ndim) for c in t.chunks[: t.chunk_count]))
            for t in r.tensors[: r.tensor_count]
        }
        objects = {
            b.fqn.decode(): results.InspectObject(
                file=b.storage.file.decode() if b.storage.file is not None else None, offset=b.storage.offset,
                length=b.storage.length, transform_descriptors=_descriptors(b.storage))
            for b in r.objects[: r.object_count]
        }
        files = tuple(f.decode() for f in r.files[: r.file_count])
    finally:
        _abi.lib().sp_inspect_result_free(ctypes.byref(r))
    return results.InspectResult(format=_checkpoint_format(r.format), tensors=tensors, objects=objects, files=files,
                                 sidecar=_sidecar(r.sidecar))


# -- Lightning's checkpoint folders (the engine's rules, engine/checkpoint_files.h) ---------


def checkpoint_committed(path_or_url: str) -> bool:
    """Whether the folder or URL holds both commit markers, ``.metadata`` and ``meta.pt``."""
    committed = ctypes.c_int()
    error = ctypes.c_char_p()
    _abi.check(_abi.lib().sp_checkpoint_committed(os.fsencode(path_or_url), ctypes.byref(committed), ctypes.byref(error)),
           error)
    return bool(committed.value)


def list_committed_checkpoints(folder: str) -> List[str]:
    """The committed checkpoints directly in a local folder, oldest first."""
    found = _abi.StringList()
    error = ctypes.c_char_p()
    _abi.check(_abi.lib().sp_list_committed_checkpoints(os.fsencode(folder), ctypes.byref(found), ctypes.byref(error)), error)
    try:
        return [os.fsdecode(found.items[i]) for i in range(found.count)]
    finally:
        _abi.lib().sp_string_list_free(ctypes.byref(found))


def remove_checkpoint(path_or_url: str) -> None:
    """Deletes a checkpoint folder (uncommitting it first) or file; nothing there is no error."""
    error = ctypes.c_char_p()
    _abi.check(_abi.lib().sp_remove_checkpoint(os.fsencode(path_or_url), ctypes.byref(error)), error)


def staging_folder(target: str, tag: str) -> str:
    """The hidden folder beside the local ``target`` a save that replaces it writes first."""
    path = ctypes.c_void_p()
    error = ctypes.c_char_p()
    _abi.check(_abi.lib().sp_staging_folder(os.fsencode(target), tag.encode(), ctypes.byref(path), ctypes.byref(error)), error)
    return _abi.take_string(path)


def remove_stale_staging(target: str) -> int:
    """Removes the staging folders failed saves into the local ``target`` left; how many."""
    removed = ctypes.c_size_t()
    error = ctypes.c_char_p()
    _abi.check(_abi.lib().sp_remove_stale_staging(os.fsencode(target), ctypes.byref(removed), ctypes.byref(error)), error)
    return removed.value
