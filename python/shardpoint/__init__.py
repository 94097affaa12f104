"""shardpoint: sharded checkpoints in PyTorch's DCP format on a native engine.

- ``shardpoint.torch``: DCP ``StorageWriter`` / ``StorageReader`` for ``dcp.save``,
  ``dcp.async_save`` and ``dcp.load`` (imports PyTorch).
- ``consolidate``, ``reshard``, ``verify``, ``inspect``: what the ``shardpoint`` command line
  does, returning frozen dataclasses (``shardpoint.results``; no PyTorch needed).
- ``shardpoint.lightning``: PyTorch Lightning's FSDP strategy with its checkpoints through
  shardpoint, and a ``CheckpointIO`` for single-file checkpoints (imports Lightning).
- ``shardpoint.errors``: the exceptions, one per kind of engine error.

Paths may be local folders or object-store URLs (``s3://``, ``gs://``, ``az://``). An option
left at ``None`` takes the engine's default (the one the C API's ``*_init`` and the CLI use),
given in each docstring.
"""

from __future__ import annotations

import os
from typing import Literal, Optional, Union

from . import _native
from .errors import (
    CommError,
    FormatError,
    InternalError,
    NotFoundError,
    PlanError,
    ShardpointError,
    StorageError,
    UsageError,
)
from .results import (
    ConsolidateResult,
    InspectChunk,
    InspectObject,
    InspectResult,
    InspectTensor,
    ReshardResult,
    VerifyCoverage,
    VerifyProblem,
    VerifyResult,
    ZipCrcCounts,
)

__all__ = [
    "consolidate",
    "reshard",
    "verify",
    "inspect",
    "native_version",
    "ConsolidateResult",
    "ReshardResult",
    "VerifyResult",
    "VerifyProblem",
    "VerifyCoverage",
    "ZipCrcCounts",
    "InspectResult",
    "InspectTensor",
    "InspectChunk",
    "InspectObject",
    "ShardpointError",
    "FormatError",
    "StorageError",
    "NotFoundError",
    "PlanError",
    "UsageError",
    "CommError",
    "InternalError",
]

__version__ = "0.1.0"

PathOrUrl = Union[str, "os.PathLike[str]"]


def native_version() -> str:
    """The version of the loaded libshardpoint."""
    return _native.version()


def consolidate(
    checkpoint_folder: PathOrUrl,
    output_file: Optional[PathOrUrl] = None,
    *,
    layout: Optional[Literal["trainer", "fabric", "dcp"]] = None,
    format: Optional[Literal["torch", "safetensors", "hf-safetensors"]] = None,
    max_shard_bytes: Optional[int] = None,
    memory_budget_bytes: Optional[int] = None,
    verify_checksums: Optional[bool] = None,
    check_zip_crc: Optional[bool] = None,
    durable: Optional[bool] = None,
) -> ConsolidateResult:
    """Merges a sharded checkpoint folder into one file, as Lightning's
    ``consolidate_checkpoint`` does, streaming within ``memory_budget_bytes``.

    Args:
        checkpoint_folder: the DCP folder (Lightning's ``epoch=E-step=S.ckpt/``) or URL.
        output_file: where to write; default ``<folder>.consolidated``.
        layout: ``"trainer"`` (default: Lightning's Trainer checkpoint), ``"fabric"`` or
            ``"dcp"`` (the raw state-dict tree, as ``dcp_to_torch_save``; a folder's
            ``meta.pt``, when it has one, merged on top, as Lightning's
            ``_load_distributed_checkpoint``).
        format: ``"torch"`` (default: a ``torch.load``-able file), ``"safetensors"`` or
            ``"hf-safetensors"`` (always Hugging Face's folder: model-0000i-of-0000N.safetensors
            + model.safetensors.index.json, as PyTorch's HuggingFaceStorageWriter consolidates).
        max_shard_bytes: safetensors only: split into files of at most this many bytes
            (default 0: one file).
        memory_budget_bytes: bytes the copy may use (default 256 MiB).
        verify_checksums: verify the checksum sidecar on every byte read (default True).
        check_zip_crc: where no sidecar covers a blob (PyTorch's checkpoints) and for
            ``meta.pt``, check the CRC-32 each zip record carries (default True).
        durable: fsync the output before publishing it (default True).

    Returns:
        :class:`ConsolidateResult`: ``output`` (path written), ``tensors``, ``objects``,
        ``tensor_bytes``, ``bytes_read``, ``peak_rss_bytes``, ``zip_crc``
        (:class:`ZipCrcCounts`), ``seconds``.

    Raises:
        PlanError: Lightning's validation (not a folder, no ``.metadata``/``meta.pt``).
        FormatError, StorageError: damaged input, I/O.
        UsageError: an unknown ``layout`` or ``format`` (the message lists the accepted ones).
    """
    return _native.consolidate(
        os.fspath(checkpoint_folder),
        None if output_file is None else os.fspath(output_file),
        layout=layout,
        format=format,
        max_shard_bytes=max_shard_bytes,
        memory_budget_bytes=memory_budget_bytes,
        verify_checksums=verify_checksums,
        check_zip_crc=check_zip_crc,
        durable=durable,
    )


def reshard(
    source: PathOrUrl,
    destination: PathOrUrl,
    ranks: int,
    *,
    verify_checksums: Optional[bool] = None,
    check_zip_crc: Optional[bool] = None,
    memory_budget_bytes: Optional[int] = None,
    thread_count: Optional[int] = None,
    checksum: Optional[Literal["crc32c", "xxh3", "none"]] = None,
    durable: Optional[bool] = None,
    compression: Optional[Literal["zstd", "none"]] = None,
    compression_level: Optional[int] = None,
    compression_threads: Optional[int] = None,
) -> ReshardResult:
    """Rewrites any checkpoint (a DCP folder or a ``torch.save`` file) as a DCP folder laid
    out as ``ranks`` ranks would save it (dim-0 sharding), streaming within
    ``memory_budget_bytes`` (default 256 MiB).

    Args:
        verify_checksums: verify the source's checksum sidecar on every byte read (default
            True).
        check_zip_crc: where no sidecar covers a record (PyTorch's checkpoints, torch.save
            files), check its zip CRC-32; a record read only in part is counted, not checked
            (default True).
        thread_count: files each rank writes in parallel (default 1; at least 4 on object stores).
        checksum: the new sidecar's ``"crc32c"`` (default), ``"xxh3"`` or ``"none"``.
        durable: fsync files and folder before ``.metadata`` is published (default True).
        compression: ``"zstd"``: every item stored as one zstd frame, as PyTorch's
            ``ZStandard`` extension stores it (PyTorch >= 2.7 reads it back); ``"none"``
            (default): as is.
        compression_level: zstd level 1..19 (default 3, PyTorch's).
        compression_threads: threads compressing a rank's items at once (default 0: one per
            CPU; 1: none beyond the file threads).

    A Lightning sharded checkpoint stays one: the source folder's ``meta.pt`` (trainer
    state) is carried over byte for byte, checked by its zip CRC-32s, and written after
    ``.metadata``, so Lightning resumes from ``destination`` at any world size.

    Returns:
        :class:`ReshardResult`: ``source_format`` (``"dcp"``/``"hf-safetensors"``/``"torch"``),
        ``tensors``, ``objects``, ``payload_bytes``, ``bytes_written``, ``zip_crc`` (as in
        :func:`consolidate`), ``meta_pt_bytes`` (the ``meta.pt`` carried; 0 when there is
        none), ``seconds``.
    """
    return _native.reshard(
        os.fspath(source),
        os.fspath(destination),
        int(ranks),
        verify_checksums=verify_checksums,
        check_zip_crc=check_zip_crc,
        memory_budget_bytes=memory_budget_bytes,
        thread_count=thread_count,
        checksum=checksum,
        durable=durable,
        compression=compression,
        compression_level=compression_level,
        compression_threads=compression_threads,
    )


def verify(checkpoint: PathOrUrl, *, quick: Optional[bool] = None) -> VerifyResult:
    """Checks a checkpoint (a DCP folder or URL, or a torch.save file such as ``meta.pt``):
    files present, chunks tile every tensor, every blob parses, every byte read is checked
    against the checksum sidecar (shardpoint's saves) and every zip record against the
    CRC-32 its writer stored (PyTorch's saves too). ``quick``: structure only (default False).

    Returns:
        :class:`VerifyResult`: ``ok``; ``problems`` (:class:`VerifyProblem` each: ``file``,
        ``item``, ``message``, the message naming file, item, record and byte range);
        ``tensors``, ``objects``; ``bytes`` (data read) and ``verified_bytes`` (of those,
        covered by a checksum that matched: never the bytes no checksum covers);
        ``coverage`` (:class:`VerifyCoverage` per checkpoint and ``meta.pt``: which checks
        covered how many bytes).

    Raises:
        NotFoundError: nothing there to verify.
    """
    return _native.verify(os.fspath(checkpoint), quick=quick)


def inspect(checkpoint: PathOrUrl) -> InspectResult:
    """The structure of a checkpoint folder (DCP, or Hugging Face safetensors), from its
    ``.metadata`` (or safetensors headers) and checksum sidecar, without reading tensor data
    or objects. (``shardpoint inspect`` on the command line lists keys and values instead.)

    Returns:
        :class:`InspectResult`: ``format`` (``"dcp"``/``"hf-safetensors"``), ``tensors``
        ({fqn: :class:`InspectTensor`: ``dtype``, ``shape``, ``chunks``, each an
        :class:`InspectChunk`: ``offsets``, ``sizes``, ``file``, ``offset``, ``length``,
        ``transform_descriptors``}), ``objects`` ({fqn: :class:`InspectObject`: ``file``,
        ``offset``, ``length``, ``transform_descriptors``}), ``files`` (the data files) and
        ``sidecar`` (the checksum sidecar's algorithm, None without one).

    Raises:
        NotFoundError: no committed checkpoint there.
        FormatError: a damaged ``.metadata`` or sidecar.
    """
    return _native.inspect(os.fspath(checkpoint))
