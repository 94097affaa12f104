"""The exceptions shardpoint raises: one class per kind of engine error.

Every message is the engine's one line, naming the file, the item (fqn and chunk) and what
was expected, as the ``shardpoint`` command line prints it.
"""

from __future__ import annotations

__all__ = [
    "ShardpointError",
    "FormatError",
    "StorageError",
    "NotFoundError",
    "PlanError",
    "UsageError",
    "CommError",
    "InternalError",
]


class ShardpointError(Exception):
    """Base class of every shardpoint error."""


class FormatError(ShardpointError):
    """Bytes are not what the format says: corrupt, truncated, or a checksum mismatch."""


class StorageError(ShardpointError, OSError):
    """I/O failed: permission, full disk, network, object store."""


class NotFoundError(StorageError, FileNotFoundError):
    """A missing object, folder, or committed checkpoint (no ``.metadata``)."""


class PlanError(ShardpointError):
    """The checkpoint cannot satisfy the request (missing keys, shapes that differ)."""


class UsageError(ShardpointError, ValueError):
    """Invalid arguments."""


class CommError(ShardpointError):
    """Communication between ranks failed."""


class InternalError(ShardpointError):
    """A bug in shardpoint; the message says where."""
