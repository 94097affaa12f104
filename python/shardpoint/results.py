"""What ``consolidate``, ``reshard``, ``verify`` and ``inspect`` return: frozen dataclasses
with typed fields, filled from the engine's result structs (include/shardpoint/c_api.h)."""

from __future__ import annotations

import dataclasses
from typing import Literal, Mapping, Optional, Tuple

__all__ = [
    "CheckpointFormat",
    "ChecksumName",
    "SidecarChecksum",
    "ZipCrcCounts",
    "ConsolidateResult",
    "ReshardResult",
    "VerifyProblem",
    "VerifyCoverage",
    "VerifyResult",
    "InspectChunk",
    "InspectTensor",
    "InspectObject",
    "InspectResult",
]

CheckpointFormat = Literal["dcp", "hf-safetensors", "torch"]
ChecksumName = Literal["crc32c", "xxh3", "none"]
SidecarChecksum = Literal["crc32c", "xxh3"]


@dataclasses.dataclass(frozen=True)
class ZipCrcCounts:
    """The zip CRC-32 checks of the blobs no checksum sidecar covers (PyTorch's checkpoints)
    and of ``meta.pt``: records and bytes checked, and the records left unchecked: written
    without a CRC-32 (``records_no_checksum``) or read only in part (``records_partial``)."""

    records_checked: int
    bytes_checked: int
    records_no_checksum: int
    records_partial: int


@dataclasses.dataclass(frozen=True)
class ConsolidateResult:
    """What :func:`shardpoint.consolidate` wrote."""

    output: str  # the path or URL written
    tensors: int
    objects: int
    tensor_bytes: int
    bytes_read: int
    peak_rss_bytes: int
    zip_crc: ZipCrcCounts
    seconds: float


@dataclasses.dataclass(frozen=True)
class ReshardResult:
    """What :func:`shardpoint.reshard` wrote."""

    source_format: CheckpointFormat
    tensors: int
    objects: int
    payload_bytes: int  # tensor bytes, each tensor once
    bytes_written: int  # all ranks, blobs with headers
    zip_crc: ZipCrcCounts
    meta_pt_bytes: int  # Lightning's meta.pt carried over; 0 when the source has none
    seconds: float


@dataclasses.dataclass(frozen=True)
class VerifyProblem:
    """One problem :func:`shardpoint.verify` found; ``message`` names file, item, record and
    byte range itself."""

    file: str  # "" when it concerns no one file
    item: str  # "" when it concerns a whole file
    message: str


@dataclasses.dataclass(frozen=True)
class VerifyCoverage:
    """Which checks covered the bytes of one checkpoint (or of its ``meta.pt``)."""

    name: str
    format: CheckpointFormat
    quick: bool  # structure only: no checksum was checked
    structure_bytes: int
    zip_records: int
    zip_record_bytes: int
    zip_crc32_bytes: int
    no_checksum_bytes: int
    sidecar: Optional[SidecarChecksum]  # None: no checksum sidecar (or quick)
    sidecar_bytes: int


@dataclasses.dataclass(frozen=True)
class VerifyResult:
    """What :func:`shardpoint.verify` found."""

    ok: bool
    problems: Tuple[VerifyProblem, ...]  # in the order found
    tensors: int
    objects: int
    bytes: int  # data read
    verified_bytes: int  # of those, covered by a checksum that matched
    coverage: Tuple[VerifyCoverage, ...]  # the checkpoint, then its meta.pt when present


@dataclasses.dataclass(frozen=True)
class InspectChunk:
    """One saved chunk of a tensor: the box ``[offsets, offsets + sizes)`` and where its
    blob lies (DCP's ``_StorageInfo``)."""

    offsets: Tuple[int, ...]
    sizes: Tuple[int, ...]
    file: Optional[str]  # None where ``.metadata`` names no blob for the chunk
    offset: int  # the blob: [offset, offset + length) of file, as stored
    length: int
    transform_descriptors: Tuple[str, ...]  # ("stream.zstd/1",) for a zstd frame; () as is


@dataclasses.dataclass(frozen=True)
class InspectTensor:
    """A tensor of a checkpoint: its dtype (a PyTorch dtype name without ``torch.``), global
    shape and saved chunks."""

    dtype: str
    shape: Tuple[int, ...]
    chunks: Tuple[InspectChunk, ...]  # in ``.metadata``'s order


@dataclasses.dataclass(frozen=True)
class InspectObject:
    """A bytes item (a pickled object) of a checkpoint and where its blob lies."""

    file: Optional[str]  # None where ``.metadata`` names no blob
    offset: int
    length: int
    transform_descriptors: Tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class InspectResult:
    """What :func:`shardpoint.inspect` found: the structure of a checkpoint folder."""

    format: CheckpointFormat  # "dcp" or "hf-safetensors"
    tensors: Mapping[str, InspectTensor]  # by fqn, sorted
    objects: Mapping[str, InspectObject]  # by fqn, sorted
    files: Tuple[str, ...]  # the data files the items name, sorted
    sidecar: Optional[SidecarChecksum]  # the checksum sidecar's algorithm; None: no sidecar
