"""PyTorch distributed checkpoint (DCP) storage on shardpoint's native engine.

``StorageWriter`` and ``StorageReader`` implement DCP's extension point, so ``dcp.save``,
``dcp.async_save`` and ``dcp.load`` keep PyTorch's planning and collectives while the bytes
move through shardpoint: tensor bytes go from the tensor's memory to the file without a
Python-side copy, every item is checksummed (CRC-32C per 1 MiB block) as it streams out,
the commit is durable and atomic, and loads read only the bytes the plan needs, straight
into the destination tensors, verified against the checksums::

    import torch.distributed.checkpoint as dcp
    from shardpoint.torch import StorageWriter, StorageReader

    dcp.save(state_dict, storage_writer=StorageWriter("/ckpt/step-100"))
    dcp.load(state_dict, storage_reader=StorageReader("/ckpt/step-100"))

Paths may be local folders or object-store URLs (``s3://bucket/prefix``, ``gs://...``,
``az://container/prefix``; credentials as for the ``shardpoint`` CLI). The files are PyTorch's
standard layout (``__<rank>_<n>.distcp`` + ``.metadata``): ``FileSystemReader`` loads what
``StorageWriter`` wrote, and ``StorageReader`` loads what ``FileSystemWriter`` wrote
(unverified, said once, when no checksums exist). shardpoint adds two files PyTorch ignores:
``.shardpoint-checksums.json`` and ``.shardpoint-index``.

Call order (DCP's): every rank calls ``reset`` (when given a checkpoint_id),
``set_up_storage_*``, ``prepare_local_plan`` and ``write_data``/``read_data``; the
coordinator alone calls ``prepare_global_plan`` and ``finish``.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import dataclasses
import importlib
import io
import logging
import os
import pickle
import uuid
from typing import Any, Dict, List, Literal, Optional, Sequence, Tuple, Union

import torch
from torch.distributed.checkpoint import (
    LoadPlan,
    LoadPlanner,
    Metadata,
    SavePlan,
    SavePlanner,
)
from torch.distributed.checkpoint import StorageReader as _DcpStorageReader
from torch.distributed.checkpoint import StorageWriter as _DcpStorageWriter
from torch.distributed.checkpoint.filesystem import _StorageInfo, _StoragePrefix
from torch.distributed.checkpoint.metadata import MetadataIndex, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadItemType, ReadItem, WriteItem, WriteItemType
from torch.distributed.checkpoint.staging import BlockingAsyncStager
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from . import _abi, _native, _trust, errors
from ._staging import HostStaging

__all__ = ["StorageWriter", "StorageReader"]

# dcp.async_save returns AsyncSaveResponse when the stager's stage() returns a future (2.9+).
_ASYNC_SAVE_RESPONSE = hasattr(importlib.import_module("torch.distributed.checkpoint.state_dict_saver"),
                               "AsyncSaveResponse")

_log = logging.getLogger("shardpoint")

_DATA_SUFFIX = ".distcp"
# Temporary copies made for non-contiguous or non-CPU destinations, held at once per batch.
_STAGING_BATCH_BYTES = 256 << 20

PathOrUrl = Union[str, "os.PathLike[str]"]


def _location(path: PathOrUrl) -> str:
    """The engine's canonical text of a path or URL (a file:// URL becomes its local path)."""
    text = os.fspath(path)
    if not isinstance(text, str):
        text = os.fsdecode(text)
    return _native.parse_location(text).text


def _is_local(location: str) -> bool:
    return not _native.parse_location(location).remote


# The tag of the staging folder a StorageWriter's save into a committed local checkpoint
# writes first: every rank names it alone, from the target and this tag, so nothing of it
# travels in the plan, which DCP may cache and replay.
_STAGING_TAG = "save"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclasses.dataclass(frozen=True)
class _WriteResultWithChecksums(WriteResult):
    """The first WriteResult of a rank, carrying what the engine recorded for all of the rank's
    items (their checksums), so the coordinator's ``finish`` can write the checksum sidecar:
    one tuple per rank of plain, picklable records (_native.WrittenItem) crosses the gather. ``storage_data`` stays
    PyTorch's own ``_StorageInfo``, so ``.metadata`` holds only PyTorch classes."""

    records: Tuple[_native.WrittenItem, ...] = ()


def _chunk_nbytes(item: WriteItem) -> int:
    """Bytes of the chunk this rank writes for a tensor item (its box, not the whole tensor)."""
    td = item.tensor_data
    if td is None:
        return 0
    numel = 1
    for s in td.chunk.sizes:
        numel *= int(s)
    return numel * td.properties.dtype.itemsize


class StorageWriter(_DcpStorageWriter, BlockingAsyncStager):
    """DCP StorageWriter writing through shardpoint's engine.

    Args:
        path: the checkpoint folder or object-store URL (``dcp.save(checkpoint_id=...)``
            replaces it).
        single_file_per_rank: one file per thread per rank (True, PyTorch's default) or one
            file per item.
        sync_files: fsync files and folder before ``.metadata`` is published (the engine's
            ``durable``; default True). Turn off only for benchmarks: after a crash a
            checkpoint may look complete when not.
        thread_count: files each rank writes in parallel (default 1). Raised to 4 on object stores
            (``s3://``, ``az://``, ``gs://``), where one object per rank would be one upload
            stream and one object to read per rank; items are split into the files by the
            engine's rule (``sp_split_into_files``), as the C++ engine's save splits them.
        checksum: ``"crc32c"`` (default), ``"xxh3"`` or ``"none"``.
        checksum_block_bytes: checksum granularity (default 1 MiB); smaller blocks cost more
            sidecar, let partial reads verify with less widening.
        direct_io: bypass the page cache (O_DIRECT) for data files where supported (default
            True).
        cache_staged_state_dict: for ``dcp.async_save``: keep the host copy's buffers between
            saves (True: the state's size in host memory, held; later saves only copy), or
            allocate them afresh for every save (False: the memory is freed after each write,
            and every save pays the page faults of new memory). Either way the copy is real
            for CPU tensors too, so training may change the state while the write runs.
        compression: ``"zstd"`` stores every item as one zstd frame, recorded as PyTorch's
            ``ZStandard`` extension records it (``transform_descriptors == ["stream.zstd/1"]``),
            so PyTorch >= 2.7's ``FileSystemReader`` (with ``zstandard`` installed) and
            shardpoint read it back. ``"none"`` (the default): items stored as is.
        compression_threads: with ``compression="zstd"``, the threads that compress a
            rank's items at once (ahead of the file threads, in memory: up to 256 MiB per
            file); 0 (default): one per CPU; 1: each file thread compresses its own items.
            Lower it when several ranks share a machine's cores.
        compression_level: the zstd level, 1..19 (default 3, PyTorch's).
        overwrite: allow saving into a folder that holds a committed checkpoint. A local one
            is replaced atomically: the new checkpoint is written into a hidden folder beside
            it and exchanged with it once committed, so a failed save leaves the previous
            checkpoint intact. On an object store the old ``.metadata`` is removed first (the
            old checkpoint stops being one before its files are replaced).
        async_staging: for ``dcp.async_save`` (PyTorch 2.9+): False (default) copies the
            state before ``async_save`` returns its future. True copies it on a thread of
            its own, and ``async_save`` returns at once with DCP's ``AsyncSaveResponse``:
            the state may change once ``staging_completion`` is done, the checkpoint is
            committed once ``upload_completion`` is. On a GPU the copies are non-blocking,
            on a side stream, into pinned buffers kept between saves. Either way, wait for
            a save's ``upload_completion`` before starting the next.
        staging_threads: for ``dcp.async_save``: threads that copy the state into host
            memory. 0 (default): the CPUs this rank may use divided by the ranks on the
            machine (``LOCAL_WORLD_SIZE``, else the world size), at least 1, at most 8; raise
            it where a rank has idle cores, lower it to leave them to the trainer.

    An engine option left at None takes the engine's default (sp_save_options_init), given
    above. Extra positional or keyword arguments newer PyTorch versions pass are accepted.
    """

    def __init__(
        self,
        path: PathOrUrl,
        single_file_per_rank: bool = True,
        sync_files: Optional[bool] = None,
        thread_count: Optional[int] = None,
        checksum: Optional[Literal["crc32c", "xxh3", "none"]] = None,
        checksum_block_bytes: Optional[int] = None,
        direct_io: Optional[bool] = None,
        overwrite: bool = True,
        cache_staged_state_dict: bool = True,
        compression: Optional[Literal["zstd", "none"]] = None,
        *args: Any,
        async_staging: bool = False,
        compression_threads: Optional[int] = None,
        compression_level: Optional[int] = None,
        staging_threads: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        BlockingAsyncStager.__init__(self, cache_staged_state_dict=cache_staged_state_dict)
        self._staging: Optional[HostStaging] = None
        if thread_count is not None and thread_count < 1:
            raise errors.UsageError(f"thread_count must be >= 1, found {thread_count}")
        if async_staging and not _ASYNC_SAVE_RESPONSE:
            raise errors.UsageError(
                f"async_staging needs a PyTorch whose dcp.async_save returns AsyncSaveResponse (2.9+), "
                f"found {torch.__version__}"
            )
        self.async_staging = async_staging
        if staging_threads < 0:
            raise errors.UsageError(f"staging_threads must be >= 0, found {staging_threads}")
        self.staging_threads = staging_threads
        self.path = _location(path)
        self.single_file_per_rank = single_file_per_rank
        self.overwrite = overwrite
        self._options = _native.save_options(thread_count, checksum, checksum_block_bytes, sync_files, direct_io,
                                             compression, compression_threads, compression_level)
        # What the engine takes for each option (its default where None was given).
        self.sync_files = bool(self._options.durable)
        self.thread_count = int(self._options.thread_count)
        self.save_id = uuid.uuid4().hex
        self.is_coordinator = False
        self._checkpoint: Optional[_native.Checkpoint] = None
        self._folder = self.path  # where this save writes (set by write_data)
        self._folder_checkpoint: Optional[_native.Checkpoint] = None
        self._layout: Optional[_ItemLayout] = None  # write_data's, kept for the same plan

    # -- DCP protocol ----------------------------------------------------------------------

    def reset(self, checkpoint_id: Union[str, os.PathLike, None] = None) -> None:
        """(all ranks) Starts a new save, into ``checkpoint_id`` when given."""
        if checkpoint_id is not None:
            self.path = _location(checkpoint_id)
        self.save_id = uuid.uuid4().hex
        self._checkpoint = None
        self._folder = self.path
        self._folder_checkpoint = None

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """(all ranks) Records the rank's role; opens the location."""
        self.is_coordinator = is_coordinator
        self._checkpoint = _native.Checkpoint(self.path)

    def _opened(self) -> _native.Checkpoint:
        if self._checkpoint is None:
            self._checkpoint = _native.Checkpoint(self.path)
        return self._checkpoint

    def stage(  # type: ignore[override]  # DCP's AsyncStager.stage may return a future; BlockingAsyncStager's hint says not
        self, state_dict: Dict[str, Any]
    ) -> Union[Dict[str, Any], "concurrent.futures.Future[Dict[str, Any]]"]:
        """(all ranks, ``dcp.async_save`` only) The copy of the state the background write
        reads: one host copy of every tensor (DTensor and ShardedTensor shards included);
        with ``async_staging``, the future of that copy, made on a thread. With
        ``cache_staged_state_dict`` the buffers are allocated on the first save and reused
        by the next ones (wait for a save's future before starting the next). Pinned only
        where a GPU is present (pinning needs one; PyTorch 2.6's own stager pins
        unconditionally and fails on CPU-only machines)."""
        staging = self._staging if self.cache_staged_state_dict else None
        if staging is None:
            staging = HostStaging(pin_memory=torch.cuda.is_available(), copy_threads=self.staging_threads)
            if self.cache_staged_state_dict:
                self._staging = staging
        if not self.async_staging:
            staged = staging.stage(state_dict)
            if staging is not self._staging:  # a one-save staging: its copy threads end now
                staging.close()
            return staged
        future = staging.stage_async(state_dict)
        if staging is not self._staging:  # a one-save staging: its thread ends with the copy
            future.add_done_callback(lambda _: staging.close(wait=False))
        return future

    def close(self) -> None:
        """Releases the kept host buffers and the staging thread (``async_staging``); the
        next async save allocates them again."""
        if self._staging is not None:
            self._staging.close()
            self._staging = None

    def storage_meta(self) -> Optional[StorageMeta]:
        return StorageMeta(checkpoint_id=self.path, save_id=self.save_id)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        """(all ranks) Unchanged."""
        return plan

    def prepare_global_plan(self, plans: List[SavePlan]) -> List[SavePlan]:
        """(coordinator) Gives rank i the file prefix ``__i_``: the same in every save, so a
        plan DCP caches (``DefaultSavePlanner(enable_plan_caching=True)``) and replays in a
        later save holds nothing that differs between saves; where a rank writes comes from
        the writer's own path (``write_data``). When the location holds a committed
        checkpoint: a local one is kept until the new one is committed (the ranks write into
        a staging folder beside it, which ``finish`` exchanges with it); on an object store
        its ``.metadata`` is removed first, so it stops being a checkpoint before any of its
        files change. DCP calls this before any rank writes, cached plans or not."""
        checkpoint = self._opened()
        if _is_local(self.path):
            _native.remove_stale_staging(self.path)
        if checkpoint.read_object(".metadata") is not None:
            if not self.overwrite:
                raise errors.UsageError(f"{self.path}: holds a committed checkpoint and overwrite=False")
            if not _is_local(self.path):
                checkpoint.remove_object(".metadata")
        return [dataclasses.replace(plan, storage_data=_StoragePrefix(prefix=f"__{i}_")) for i, plan in enumerate(plans)]

    def _destination(self) -> str:
        """Where this rank writes: the checkpoint's folder, or the staging folder beside a
        committed local checkpoint (which the coordinator keeps until ``finish``)."""
        if _is_local(self.path) and os.path.exists(os.path.join(self.path, ".metadata")):
            return _native.staging_folder(self.path, _STAGING_TAG)
        return self.path

    def _writing_to(self, folder: str) -> _native.Checkpoint:
        """The opened folder this save writes and commits into; remembered for ``finish``."""
        if folder == self.path:
            self._folder = folder
            return self._opened()
        if self._folder_checkpoint is None or self._folder != folder:
            self._folder_checkpoint = _native.Checkpoint(folder)
        self._folder = folder
        return self._folder_checkpoint

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> "Future[List[WriteResult]]":
        """(all ranks) Writes this rank's items; the future is already complete. What the
        plan alone decides (files, names, chunk boxes: the native item array) is built once
        per plan and kept: with plan caching DCP hands the same plan object to every later
        save, whose only per-save work here is resolving each item's data."""
        checkpoint = self._writing_to(self._destination())
        split = (self.thread_count, self.single_file_per_rank)
        layout = self._layout
        if layout is None or layout.plan is not plan or layout.split != split:
            layout = self._layout = _item_layout(plan, checkpoint, *split)
        keep_alive: List[Any] = []  # tensors and buffers the native call reads
        for slot, item in zip(layout.native_items, layout.items):
            slot.data, slot.nbytes = self._resolve_item(item, planner, keep_alive)
        by_position = layout.items
        records = checkpoint.write_items(layout.native_items, len(by_position), self._options)
        results: List[WriteResult] = []
        for n, (item, record) in enumerate(zip(by_position, records)):
            info = _StorageInfo(record.file, record.offset, record.length)
            if record.transform_descriptors:  # compressed (the field exists in PyTorch >= 2.7)
                info.transform_descriptors = list(record.transform_descriptors)
            if n == 0:  # the rank's records travel to the coordinator with its first result
                results.append(_WriteResultWithChecksums(index=item.index, size_in_bytes=record.length,
                                                         storage_data=info, records=records))
            else:
                results.append(WriteResult(index=item.index, size_in_bytes=record.length, storage_data=info))
        future: Future[List[WriteResult]] = Future()
        future.set_result(results)
        return future

    def finish(self, metadata: Metadata, results: List[List[WriteResult]]) -> None:
        """(coordinator) Commits: the checksum sidecar, the load index, then ``.metadata``
        atomically (after which the checkpoint exists for every reader)."""
        storage_md: Dict[MetadataIndex, _StorageInfo] = {}
        records: List[_native.WrittenItem] = []  # every rank's
        for rank_results in results:
            for wr in rank_results:
                storage_md[wr.index] = wr.storage_data
                records.extend(getattr(wr, "records", ()))
        metadata.storage_data = storage_md
        metadata.storage_meta = self.storage_meta()
        self._writing_to(self._folder).commit(pickle.dumps(metadata), records, self._options)
        if self._folder != self.path:
            _native.replace_folder(self._folder, self.path, self.sync_files)
            self._folder = self.path
            self._folder_checkpoint = None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Union[str, os.PathLike]) -> bool:
        return isinstance(checkpoint_id, (str, os.PathLike))

    # -- helpers ---------------------------------------------------------------------------

    def _resolve_item(self, item: WriteItem, planner: SavePlanner, keep_alive: List[Any]) -> Tuple[Optional[int], int]:
        """The address and byte count of item's data (planner.resolve_data); appends what the
        native call reads to keep_alive."""
        data = planner.resolve_data(item)
        if item.type == WriteItemType.BYTE_IO:
            # The blob is written verbatim from the BytesIO's own buffer (no copy).
            view = data.getbuffer() if isinstance(data, io.BytesIO) else memoryview(bytearray(data))
            n = view.nbytes
            buf = (ctypes.c_char * n).from_buffer(view) if n else None
            keep_alive.extend([view, buf])
            return (ctypes.addressof(buf) if buf is not None else None), n
        assert isinstance(data, torch.Tensor) and item.tensor_data is not None  # a tensor item
        tensor = data.detach()
        if tensor.device.type != "cpu":
            tensor = tensor.cpu()  # device tensors are copied to host first
        if not tensor.is_contiguous():
            tensor = tensor.contiguous()  # the only copy: the engine writes row-major bytes
        keep_alive.append(tensor)
        td = item.tensor_data
        if tensor.shape != td.chunk.sizes and tuple(tensor.shape) != tuple(td.chunk.sizes):
            raise errors.UsageError(
                f'save: item "{item.index.fqn}": planned chunk sizes {list(td.chunk.sizes)}, '
                f"resolved tensor has shape {list(tensor.shape)}"
            )
        if tensor.dtype != td.properties.dtype:
            raise errors.UsageError(
                f'save: item "{item.index.fqn}": planned dtype {_dtype_name(td.properties.dtype)}, '
                f"resolved tensor has {_dtype_name(tensor.dtype)}"
            )
        nbytes = tensor.numel() * tensor.element_size()
        return (tensor.data_ptr() if nbytes else None), nbytes


@dataclasses.dataclass
class _ItemLayout:
    """The native item array a plan makes, without the data addresses (set per save)."""

    plan: SavePlan  # the plan it was built from, by identity
    split: Tuple[int, bool]  # (thread_count, single_file_per_rank) it was split into files with
    items: List[WriteItem]  # in the order of native_items
    native_items: Any  # ctypes array of _abi.Item; its offsets/sizes point into ints
    ints: Any  # every tensor item's chunk offsets then sizes, one int64 array


def _item_layout(plan: SavePlan, checkpoint: "_native.Checkpoint", thread_count: int,
                 single_file_per_rank: bool) -> _ItemLayout:
    """The native items of plan's items: files (split by the engine's rule,
    ``sp_split_into_files``, each file in the engine's write order), fqn, kind, dtype and chunk
    box. One ctypes array filled in place, pointing into one int64 array: a few objects per
    rank rather than several per item (objects a save keeps alive bring CPython's next full
    garbage collection closer, and those walk the whole process)."""
    prefix = plan.storage_data.prefix
    all_items = plan.items
    file_of_item, order, file_count = checkpoint.split_into_files(
        [_abi.ITEM_BYTES if i.type == WriteItemType.BYTE_IO else _abi.ITEM_TENSOR for i in all_items],
        [_chunk_nbytes(i) for i in all_items],
        thread_count,
        single_file_per_rank,
    )
    file_names = [f"{prefix}{n}{_DATA_SUFFIX}".encode() for n in range(file_count)]
    items: List[WriteItem] = []
    names: List[bytes] = []
    ints: List[int] = []
    starts: List[int] = []
    for position in order:
        item = all_items[position]
        items.append(item)
        names.append(file_names[file_of_item[position]])
        starts.append(len(ints))
        if item.tensor_data is not None:
            ints.extend(item.tensor_data.chunk.offsets)
            ints.extend(item.tensor_data.chunk.sizes)
    int_array = _native.int64_array(ints)
    base = ctypes.addressof(int_array)
    native_items = (_abi.Item * max(len(items), 1))()
    dtypes: Dict[torch.dtype, bytes] = {}
    for slot, item, name, start in zip(native_items, items, names, starts):
        slot.file = name
        slot.fqn = item.index.fqn.encode()
        td = item.tensor_data
        if item.type == WriteItemType.BYTE_IO or td is None:
            slot.kind = _abi.ITEM_BYTES
            continue
        dtype = td.properties.dtype
        encoded = dtypes.get(dtype)
        if encoded is None:
            encoded = dtypes[dtype] = _dtype_name(dtype).encode()
        ndim = len(td.chunk.sizes)
        slot.kind = _abi.ITEM_TENSOR
        slot.dtype = encoded
        slot.ndim = ndim
        slot.offsets = base + 8 * start
        slot.sizes = base + 8 * (start + ndim)
    return _ItemLayout(plan, (thread_count, single_file_per_rank), items, native_items, int_array)


class StorageReader(_DcpStorageReader):
    """DCP StorageReader reading through shardpoint's engine.

    Args:
        path: the checkpoint folder or object-store URL (``dcp.load(checkpoint_id=...)``
            replaces it).
        verify_checksums: verify every byte read against the checksum sidecar when the
            checkpoint has one (shardpoint's saves do; PyTorch's own do not: see
            check_zip_crc). Default True; False: nothing is checked.
        thread_count: blobs read in parallel (default 4).
        check_zip_crc: where no sidecar covers a blob (PyTorch's checkpoints), check the
            zip CRC-32 of every torch.save record read whole; a record this rank reads only
            in part (resharding) is not checked, said once in the log. A mismatch raises
            FormatError naming file, item, record and byte range. Default True.
        trusted: False (default): nothing a checkpoint's pickles name is executed.
            ``.metadata`` is decoded by the engine and rebuilt from DCP's own classes (a
            file holding anything else raises FormatError naming it and the offending
            global), and every bytes item is screened with ``torch.load(weights_only=True)``
            (PyTorch's allowlist plus ``torch.serialization.add_safe_globals``) before DCP's
            planner unpickles it. True: bytes items go to the planner unscreened, as with
            PyTorch's FileSystemReader, running whatever they name; only for checkpoints you
            trust. ``.metadata`` is decoded by the engine either way.

    An engine option left at None takes the engine's default (sp_reader_options_init), given
    above.
    """

    def __init__(
        self,
        path: PathOrUrl,
        verify_checksums: Optional[bool] = None,
        thread_count: Optional[int] = None,
        *args: Any,
        check_zip_crc: Optional[bool] = None,
        trusted: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        self.path = _location(path)
        self._options = _native.reader_options(verify_checksums, thread_count, check_zip_crc)
        # What the engine takes for each option (its default where None was given).
        self.verify_checksums = bool(self._options.verify_checksums)
        self.thread_count = int(self._options.thread_count)
        self.check_zip_crc = bool(self._options.check_zip_crc)
        self.trusted = trusted
        self.load_id = uuid.uuid4().hex
        self._reader: Optional[_native.Reader] = None
        self._storage_data: Dict[MetadataIndex, _StorageInfo] = {}
        self._entries: Dict[str, Any] = {}  # .metadata's state_dict_metadata

    def reset(self, checkpoint_id: Union[str, os.PathLike, None] = None) -> None:
        """(all ranks) Starts a new load, from ``checkpoint_id`` when given."""
        if checkpoint_id is not None:
            self.path = _location(checkpoint_id)
        self.load_id = uuid.uuid4().hex
        self._close()

    def _close(self) -> None:
        if self._reader is not None:
            self._reader.close()
        self._reader = None

    def _opened(self) -> _native.Reader:
        if self._reader is None:
            checkpoint = _native.Checkpoint(self.path)
            self._reader = _native.Reader(checkpoint, self._options)
            if not self._reader.verified() and self.verify_checksums and not self._reader.checks_zip_crc():
                _log.warning("shardpoint: %s has no checksums (written by PyTorch?): loading it unverified", self.path)
        return self._reader

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """(all ranks, or the coordinator) The checkpoint's Metadata: its ``.metadata``, the
        union of every rank's ``__<rank>.metadata`` when it was saved with
        ``use_collectives=False`` (a missing rank's file is a FormatError), or what the
        engine reads from a Hugging Face safetensors folder. Decoded by the engine and rebuilt
        from DCP's own classes, ``trusted`` or not. Raises FormatError naming the file and
        what it holds when it is not DCP metadata."""
        reader = self._opened()
        metadata = _trust.metadata_from_engine(reader.metadata_rebuilt(), f"{self.path}/.metadata")
        storage_meta = getattr(metadata, "storage_meta", None)
        if storage_meta is None:
            storage_meta = metadata.storage_meta = StorageMeta(checkpoint_id=self.path)
        storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """(all ranks) Keeps the index of where every item's bytes are and what each chunk holds
        (looked up per read item, not copied: every object a load keeps alive brings CPython's
        next full garbage collection closer, and those walk the whole process)."""
        self._storage_data = metadata.storage_data
        self._entries = metadata.state_dict_metadata

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: List[LoadPlan]) -> List[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> "Future[None]":
        """(all ranks) Reads every item of the plan: bytes items whole (verified, and screened
        unless ``trusted``), tensor boxes straight into the destination tensors when they are
        contiguous CPU tensors of the saved dtype, else through a temporary copy."""
        reader = self._opened()
        tensor_items: List[ReadItem] = []
        for item in plan.items:
            if item.type == LoadItemType.BYTE_IO:
                info = self._info(item)
                blob = reader.read_blob(info.relative_path, info.offset, info.length, item.storage_index.fqn)
                if not self.trusted:
                    _trust.screen_bytes_item(blob, item.storage_index.fqn, self.path)
                planner.load_bytes(item, io.BytesIO(blob))
            else:
                tensor_items.append(item)
        batch: List[Tuple[ReadItem, torch.Tensor, torch.Tensor, Sequence[int], torch.dtype]] = []
        staged = 0
        for item in tensor_items:
            saved_sizes, saved_dtype = self._saved_chunk(item.storage_index)
            target = planner.resolve_tensor(item)
            if tuple(target.shape) != tuple(item.lengths):
                raise errors.PlanError(
                    f'load: "{item.storage_index.fqn}": the destination has shape {list(target.shape)}, '
                    f"the read plan {list(item.lengths)}"
                )
            direct = target.device.type == "cpu" and target.is_contiguous() and target.dtype == saved_dtype
            dest = target if direct else torch.empty(item.lengths, dtype=saved_dtype)
            batch.append((item, target, dest, saved_sizes, saved_dtype))
            if not direct:
                staged += dest.numel() * dest.element_size()
            if staged >= _STAGING_BATCH_BYTES:
                self._read_batch(reader, batch, planner)
                batch, staged = [], 0
        self._read_batch(reader, batch, planner)
        _, partial, _ = reader.zip_crc_counts()
        if partial:
            _log.info(
                "shardpoint: %s: %d zip records read only in part by this rank (resharding): their CRC-32 was not "
                "checked", self.path, partial,
            )
        future: Future[None] = Future()
        future.set_result(None)
        return future

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Union[str, os.PathLike]) -> bool:
        return isinstance(checkpoint_id, (str, os.PathLike))

    # -- helpers ---------------------------------------------------------------------------

    def _info(self, item: ReadItem) -> _StorageInfo:
        info = self._storage_data.get(item.storage_index)
        if info is None:
            raise errors.FormatError(f'{self.path}: .metadata names no storage for "{item.storage_index.fqn}"')
        # Stream transforms ("stream.zstd/1") are undone by the engine, which reads them from
        # the same .metadata by the item's file and offset.
        return info

    def _saved_chunk(self, index: MetadataIndex) -> Tuple[Sequence[int], torch.dtype]:
        """The sizes and dtype of the saved chunk index names."""
        entry = self._entries.get(index.fqn)
        if isinstance(entry, TensorStorageMetadata) and index.offset is not None:
            offset = tuple(index.offset)
            for chunk in entry.chunks:
                if tuple(chunk.offsets) == offset:
                    return chunk.sizes, entry.properties.dtype
        where = list(index.offset) if index.offset is not None else None
        raise errors.FormatError(f'{self.path}: .metadata has no chunk of "{index.fqn}" at {where}')

    def _read_batch(self, reader: _native.Reader,
                    batch: List[Tuple[ReadItem, torch.Tensor, torch.Tensor, Sequence[int], torch.dtype]],
                    planner: LoadPlanner) -> None:
        """Reads the batch in one native call. The reads are one ctypes array filled in place,
        their integer arrays one int64 array: a few objects per batch, not several per item."""
        if not batch:
            return
        ints: List[int] = []
        for item, _, _, saved_sizes, _ in batch:
            assert item.storage_index.offset is not None  # a tensor chunk's index has one
            ints.extend(item.storage_index.offset)
            ints.extend(saved_sizes)
            ints.extend(item.storage_offsets)
            ints.extend(item.lengths)
        int_array = _native.int64_array(ints)
        base = ctypes.addressof(int_array)
        reads = (_abi.TensorRead * len(batch))()
        files: Dict[str, bytes] = {}  # encoded once per batch
        dtypes: Dict[torch.dtype, bytes] = {}
        at = 0
        for n, (item, _, dest, _, saved_dtype) in enumerate(batch):
            info = self._info(item)
            ndim = len(item.lengths)
            file = files.get(info.relative_path)
            if file is None:
                file = files[info.relative_path] = info.relative_path.encode()
            dtype = dtypes.get(saved_dtype)
            if dtype is None:
                dtype = dtypes[saved_dtype] = _dtype_name(saved_dtype).encode()
            read = reads[n]
            read.file = file
            read.blob_offset = info.offset
            read.blob_length = info.length
            read.fqn = item.storage_index.fqn.encode()
            read.dtype = dtype
            read.ndim = ndim
            read.chunk_offsets = base + 8 * at
            read.chunk_sizes = base + 8 * (at + ndim)
            read.storage_offsets = base + 8 * (at + 2 * ndim)
            read.lengths = base + 8 * (at + 3 * ndim)
            at += 4 * ndim
            nbytes = dest.numel() * dest.element_size()
            read.dest = dest.data_ptr() if nbytes else None
            read.dest_nbytes = nbytes
        reader.read_tensors(reads)
        for item, target, dest, _, _ in batch:
            if dest is not target:
                target.detach().copy_(dest)
            planner.commit_tensor(item, target)
