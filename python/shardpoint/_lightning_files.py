"""Lightning checkpoint files through the engine: where a checkpoint is (locations parsed by
the engine), whether it is committed, which are committed, how one is removed (the engine's
rules, engine/checkpoint_files.h, through the C API), and ``CheckpointIO``, the plugin for
full (single-file) checkpoints: atomic, durable, checked on load, ``weights_only`` by default,
remote URLs. ``shardpoint.lightning``'s strategies build on these; users import them from
there.
"""

from __future__ import annotations

import inspect
import io
import os
import zipfile
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import torch
from lightning.fabric.plugins import CheckpointIO as _LightningCheckpointIO

from . import _native, _trust, errors

_META = "meta.pt"  # Lightning's name for the non-tensor part of a sharded checkpoint
_DCP_METADATA = ".metadata"

PathOrUrl = Union[str, "os.PathLike[str]"]


# -- locations ------------------------------------------------------------------------------


def _text(path: PathOrUrl) -> str:
    text = os.fspath(path)
    return text if isinstance(text, str) else os.fsdecode(text)


def _is_url(path: PathOrUrl) -> bool:
    """Whether the engine's location parser calls ``path`` remote (file:// is local)."""
    return _native.parse_location(_text(path)).remote


def _local(path: PathOrUrl) -> str:
    """The local path of a local location (a file:// URL's path, normalised)."""
    return _native.parse_location(_text(path)).text


def _split(path: PathOrUrl) -> Tuple[str, str]:
    """(parent location, last name) of a file path or URL, as the engine parses it."""
    location = _native.parse_location(_text(path))
    if location.remote:
        if location.parent is None or not location.name:
            raise errors.UsageError(f"{location.text}: a checkpoint URL needs a bucket or container and a name")
        return location.parent, location.name
    return os.path.dirname(os.path.abspath(location.text)), os.path.basename(location.text)


def is_committed(path: PathOrUrl) -> bool:
    """Whether ``path`` (folder or URL) holds a complete sharded checkpoint: both
    ``.metadata`` (the DCP data is committed) and ``meta.pt`` (written after it). The
    engine's rule (``sp_checkpoint_committed``), the C++ trainer's too."""
    return _native.checkpoint_committed(_text(path))


def find_committed_checkpoints(folder: PathOrUrl) -> List[str]:
    """The committed sharded checkpoints directly in a local ``folder``, oldest first (by the
    ``step=N`` in their names, then by ``meta.pt``'s modification time): the engine's
    listing (``sp_list_committed_checkpoints``). A URL raises ``UsageError``."""
    return _native.list_committed_checkpoints(_text(folder))


def _save_planner() -> Any:
    """DCP's default save planner, with plan caching where this PyTorch has it (2.7+): a
    training loop saves the same state shapes again and again, and a cached plan skips the
    gather and the global planning of every later save."""
    from torch.distributed.checkpoint import DefaultSavePlanner

    if "enable_plan_caching" in inspect.signature(DefaultSavePlanner.__init__).parameters:
        return DefaultSavePlanner(enable_plan_caching=True)
    return DefaultSavePlanner()


def _remove(path: PathOrUrl) -> None:
    """Deletes a sharded checkpoint folder or a checkpoint file, uncommitting first (the
    engine's ``sp_remove_checkpoint``): ``meta.pt`` and ``.metadata`` go before the data
    files, so a crash mid-way leaves no folder that looks complete."""
    _native.remove_checkpoint(_text(path))


# -- single-file checkpoints ----------------------------------------------------------------


def _serialize(obj: Any) -> bytes:
    buffer = io.BytesIO()
    config = getattr(getattr(torch.utils, "serialization", None), "config", None)
    save_config = getattr(config, "save", None)
    previous = getattr(save_config, "compute_crc32", None)
    if previous is False and save_config is not None:  # the CRC-32s are what load verifies
        save_config.compute_crc32 = True
    try:
        torch.save(obj, buffer)
    finally:
        if previous is False and save_config is not None:
            save_config.compute_crc32 = previous
    return buffer.getvalue()


def _verify_zip(data: bytes, where: str) -> None:
    """Checks every record of a ``torch.save`` zip against the CRC-32 the zip stores for it
    (zlib's, at memory speed); a truncated file has no central directory and fails too. A
    record stored with CRC-32 0 was written without one (PyTorch's ``compute_crc32 = False``)
    or is empty: there is nothing to check it against, and it passes ("no checksum")."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, EOFError, ValueError) as e:
        raise errors.FormatError(f"{where}: not a complete torch.save file: {e}") from e
    with archive:
        for info in archive.infolist():
            if info.CRC == 0:
                continue
            try:
                with archive.open(info) as record:
                    while record.read(1 << 20):
                        pass
            except (zipfile.BadZipFile, EOFError, ValueError) as e:
                what = "does not match its CRC-32" if "CRC" in str(e) else f"cannot be read: {e}"
                raise errors.FormatError(f"{where}: record {info.filename!r} {what} (damaged file)") from e


def _read_file(path: PathOrUrl) -> bytes:
    parent, name = _split(path)
    data = _native.Checkpoint(parent).read_object(name)
    if data is None:
        raise FileNotFoundError(f"{_text(path)}: no such checkpoint")
    return data


class CheckpointIO(_LightningCheckpointIO):
    """Lightning ``CheckpointIO`` for full (single-file) checkpoints over shardpoint's engine.

    - **Atomic**: the file is published in one step (local: temporary file, fsync, rename,
      folder fsync; object stores: one upload), so a reader sees the old checkpoint or the
      new one, never a part.
    - **Durable** (``durable=True``): on disk before ``save_checkpoint`` returns.
    - **Checked**: the file is a plain ``torch.save`` zip (``torch.load`` reads it); the zip
      already stores a CRC-32 per record, which saving always computes and
      ``load_checkpoint`` verifies (``check_zip_crc=True``) before unpickling: a flipped bit
      or a truncated file raises ``shardpoint.FormatError`` instead of loading wrong values.
    - **Remote**: paths may be ``s3://``, ``gs://``, ``az://`` URLs.

    Lightning calls ``save_checkpoint`` and ``remove_checkpoint`` on global rank 0 only, and
    ``load_checkpoint`` on every rank that loads::

        trainer = pl.Trainer(plugins=[shardpoint.lightning.CheckpointIO()], ...)
    """

    def __init__(self, durable: bool = True, check_zip_crc: bool = True) -> None:
        self.durable = durable
        self.check_zip_crc = check_zip_crc

    def save_checkpoint(self, checkpoint: Dict[str, Any], path: PathOrUrl,
                        storage_options: Optional[Any] = None) -> None:

        """(global rank 0) Serializes ``checkpoint`` with ``torch.save`` and publishes it
        atomically at ``path`` (the parent folder is created when local)."""
        if storage_options is not None:
            raise TypeError("shardpoint.lightning.CheckpointIO.save_checkpoint takes no storage_options")
        parent, name = _split(path)
        if not _is_url(parent):
            os.makedirs(parent, exist_ok=True)
        _native.Checkpoint(parent).write_object(name, _serialize(checkpoint), self.durable)

    def load_checkpoint(
        self,
        path: PathOrUrl,
        map_location: Optional[Callable] = lambda storage, loc: storage,
        weights_only: Optional[bool] = None,
    ) -> Dict[str, Any]:
        """(every loading rank) Reads the file, verifies its CRC-32s, ``torch.load``-s it with
        ``weights_only=True`` unless the caller turns that off (on every PyTorch: a
        checkpoint's pickle runs no code unless the caller trusts it).

        Raises:
            FileNotFoundError: no file at ``path``.
            shardpoint.FormatError: damaged or truncated.
            pickle.UnpicklingError: with ``weights_only`` unset or True, the file names a global
                outside PyTorch's allowlist (and ``torch.serialization.add_safe_globals``).
        """
        data = _read_file(path)
        if self.check_zip_crc:
            _verify_zip(data, _text(path))
        return torch.load(
            io.BytesIO(data), map_location=map_location, weights_only=_trust.weights_only_default(weights_only)
        )

    def remove_checkpoint(self, path: PathOrUrl) -> None:
        """(global rank 0) Deletes the file (or a sharded checkpoint folder, uncommitting it
        first)."""
        _remove(path)
