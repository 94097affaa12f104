"""shardpoint: sharded checkpoints in PyTorch's DCP format on a native engine.

- ``shardpoint.torch``: DCP ``StorageWriter`` / ``StorageReader`` for ``dcp.save``,
  ``dcp.async_save`` and ``dcp.load`` (imports PyTorch).
- ``consolidate``, ``reshard``, ``verify``, ``inspect``: what the ``shardpoint`` command line
  does, returning frozen dataclasses (``shardpoint.results``; no PyTorch needed).
- ``shardpoint.lightning``: PyTorch Lightning's FSDP strategy with its checkpoints through
  shardpoint, and a ``CheckpointIO`` for single-file checkpoints (imports Lightning).
- ``shardpoint.errors``: the exceptions, one per kind of engine error.

Paths may be local folders or object-store URLs (``s3://``, ``gs://``, ``az://``).
"""

from __future__ import annotations

import os
from typing import Any, Dict, Literal, Optional, Union

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
    layout: Literal["trainer", "fabric", "dcp"] = "trainer",
    format: Literal["torch", "safetensors", "hf-safetensors"] = "torch",
    max_shard_bytes: int = 0,
    memory_budget_bytes: int = 256 << 20,
    verify_checksums: bool = True,
    check_zip_crc: bool = True,
    durable: bool = True,
) -> ConsolidateResult:
    """Merges a sharded checkpoint folder into one file, as Lightning's
    ``consolidate_checkpoint`` does, streaming within ``memory_budget_bytes``.

    Args:
        checkpoint_folder: the DCP folder (Lightning's ``epoch=E-step=S.ckpt/``) or URL.
        output_file: where to write; default ``<folder>.consolidated``.
        layout: ``"trainer"`` (Lightning's Trainer checkpoint), ``"fabric"`` or ``"dcp"``
            (the raw state-dict tree, as ``dcp_to_torch_save``; a folder's ``meta.pt``, when
            it has one, merged on top, as Lightning's ``_load_distributed_checkpoint``).
        format: ``"torch"`` (a ``torch.load``-able file), ``"safetensors"`` or
            ``"hf-safetensors"`` (always Hugging Face's folder: model-0000i-of-0000N.safetensors
            + model.safetensors.index.json, as PyTorch's HuggingFaceStorageWriter consolidates).
        max_shard_bytes: safetensors only: split into files of at most this many bytes.
        memory_budget_bytes: bytes the copy may use.
        verify_checksums: verify the checksum sidecar on every byte read.
        check_zip_crc: where no sidecar covers a blob (PyTorch's checkpoints) and for
            ``meta.pt``, check the CRC-32 each zip record carries.
        durable: fsync the output before publishing it.

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
    verify_checksums: bool = True,
    check_zip_crc: bool = True,
    memory_budget_bytes: int = 256 << 20,
    thread_count: int = 1,
    checksum: Literal["crc32c", "xxh3", "none"] = "crc32c",
    durable: bool = True,
    compression: Optional[Literal["zstd"]] = None,
) -> ReshardResult:
    """Rewrites any checkpoint (a DCP folder or a ``torch.save`` file) as a DCP folder laid
    out as ``ranks`` ranks would save it (dim-0 sharding), streaming within
    ``memory_budget_bytes``.

    ``compression="zstd"``: every item stored as one zstd frame, as PyTorch's ``ZStandard``
    extension stores it (PyTorch >= 2.7 reads it back).

    ``check_zip_crc``: where no sidecar covers a record (PyTorch's checkpoints, torch.save
    files), check its zip CRC-32; a record read only in part is counted, not checked.

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
    )


def verify(checkpoint: PathOrUrl, *, quick: bool = False) -> VerifyResult:
    """Checks a checkpoint (a DCP folder or URL, or a torch.save file such as ``meta.pt``):
    files present, chunks tile every tensor, every blob parses, every byte read is checked
    against the checksum sidecar (shardpoint's saves) and every zip record against the
    CRC-32 its writer stored (PyTorch's saves too). ``quick``: structure only.

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


def inspect(checkpoint: PathOrUrl) -> Dict[str, Any]:
    """The structure of a checkpoint folder (DCP, or Hugging Face safetensors), without
    reading tensor data: the tree ``shardpoint inspect --json`` prints.

    Returns:
        A dict: ``format`` (``"dcp"``/``"hf-safetensors"``), ``tensors`` ({fqn: {dtype, shape, chunks: [{offsets, sizes, file, offset,
        length}]}}), ``objects`` ({fqn: {file, offset, length}}), ``files``, ``checksums``.
    """
    return _native.inspect(os.fspath(checkpoint))
