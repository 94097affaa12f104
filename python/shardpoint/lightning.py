"""PyTorch Lightning integration: FSDP and ModelParallel strategies whose checkpoints go
through shardpoint.

``FSDPStrategy`` is Lightning's own ``lightning.pytorch.strategies.FSDPStrategy`` with the
checkpoint I/O replaced and the changes CPU training needs::

    import lightning.pytorch as pl
    from shardpoint.lightning import FSDPStrategy

    trainer = pl.Trainer(
        accelerator="cpu",          # or "cuda"
        devices=4,
        strategy=FSDPStrategy(state_dict_type="sharded", async_save=True),
        max_steps=1000,
    )
    trainer.fit(model, ckpt_path="last")        # or a folder or "az://container/run/x.ckpt"

What it changes, and what it keeps:

- **Layout kept.** A sharded checkpoint is Lightning's folder ``epoch=E-step=S.ckpt/`` with
  DCP's ``.metadata`` and ``__<rank>_<n>.distcp`` files and ``meta.pt`` (everything that is
  not a module or optimizer state, ``torch.save``-d by rank 0), under the keys ``"model"``,
  ``"optimizer_0"``, ... Lightning's stock strategy and ``consolidate_checkpoint`` read what
  this one writes and the reverse (plus two files PyTorch ignores: shardpoint's checksum
  sidecar and load index).
- **Commit order.** Data through :class:`shardpoint.torch.StorageWriter` (checksummed,
  durable, ``.metadata`` published atomically), then ``meta.pt`` published atomically by rank
  0 only after ``.metadata`` is committed. A folder is a checkpoint when it holds both; an old
  checkpoint being overwritten loses its ``meta.pt`` before any data file changes.
- **Remote roots.** Checkpoint paths may be ``s3://``, ``gs://`` or ``az://`` URLs (credentials as
  for the ``shardpoint`` command line) for saves, loads (``Trainer.fit(ckpt_path=URL)``) and
  ``remove_checkpoint`` (which deletes the files ``.metadata`` names, through the native
  engine; no fsspec driver needed). ``ModelCheckpoint`` and the loggers still reach a remote
  ``default_root_dir`` through fsspec, so they need that scheme's fsspec package
  (``s3fs``, ``gcsfs``, ``adlfs``).
- **Async saves** (``async_save=True``, sharded only): the save returns at once; the state is
  copied to host memory on a staging thread while training goes on (forward and backward do
  not change it), and the optimizer step waits for that copy before it updates anything. The
  copy is then ``dcp.save``-d by a background thread on a gloo process group of its own;
  ``meta.pt`` follows the data commit. The host copy's buffers are kept for the next
  save (the state's size in host memory, held until ``teardown``), so only the first save pays
  for allocating them. The next save, a load, ``remove_checkpoint`` and
  ``teardown`` wait for the save in flight (and raise its error, if it failed).
- **CPU.** Lightning refuses ``strategy="fsdp"`` without CUDA, but accepts this subclass with
  ``accelerator="cpu"`` (gloo). On CPU, FSDP is given ``device_id=torch.device("cpu")``
  (PyTorch >= 2.5 needs it), and full state dicts are gathered without ``offload_to_cpu``
  (Lightning always asks for it: a needless copy on CPU, reported to crash there on some
  PyTorch versions, Lightning issue 21804; with PyTorch 2.15 it does not).
- **Atomic replacement.** A local sharded save is written in a hidden sibling
  (``.<name>.sp-replace-<id>``) and swapped in with ``meta.pt`` once committed (renameat2
  exchange), so saving over ``last.ckpt`` or any committed checkpoint never leaves a moment
  with neither committed; each save removes what killed saves of that name left.
- **"last" that never finished.** When the checkpoint to load is named ``last*`` and is not
  committed (no ``.metadata`` or no ``meta.pt``: the run died while writing it), the newest
  committed checkpoint in the same folder is loaded instead, said in one log line.

``ModelParallelStrategy`` is Lightning's ``ModelParallelStrategy`` (FSDP2 ``fully_shard`` /
tensor parallel in ``configure_model``) with the same checkpoint I/O; its DCP files keep the
module state under ``"state_dict"``, as Lightning's do.

``CheckpointIO`` is the plugin for full (single-file) checkpoints: atomic, durable, checked
on load, remote URLs. ``FSDPStrategy`` uses it by default for ``state_dict_type="full"``.
"""

from __future__ import annotations

import concurrent.futures
import io
import logging
import os
import tempfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Generator, List, Optional, Tuple

import torch
import torch.distributed as dist
from lightning.fabric.plugins import CheckpointIO as _LightningCheckpointIO
from lightning.pytorch.strategies import FSDPStrategy as _LightningFSDPStrategy
from lightning.pytorch.strategies import ModelParallelStrategy as _LightningModelParallelStrategy
from lightning.pytorch.trainer.states import TrainerFn

if TYPE_CHECKING:  # the mixin below is always combined with one of Lightning's strategies
    from lightning.pytorch.strategies import Strategy as _MixinBase
else:
    _MixinBase = object

from . import _native, _trust, errors
from ._lightning_files import (
    _DCP_METADATA,
    _META,
    CheckpointIO,
    PathOrUrl,
    _is_url,
    _local,
    _read_file,
    _remove,
    _save_planner,
    _serialize,
    _split,
    _text,
    _verify_zip,
    find_committed_checkpoints,
    is_committed,
)
from ._staging import HostStaging
from .torch import StorageReader, StorageWriter

__all__ = ["FSDPStrategy", "ModelParallelStrategy", "CheckpointIO", "is_committed", "find_committed_checkpoints"]

_log = logging.getLogger("shardpoint.lightning")


# -- the strategy ---------------------------------------------------------------------------


@contextmanager
def _full_state_dict_context(
    module: torch.nn.Module, offload: bool, rank0_only: bool = True
) -> Generator[None, None, None]:
    from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    with FSDP.state_dict_type(
        module=module,
        state_dict_type=StateDictType.FULL_STATE_DICT,
        state_dict_config=FullStateDictConfig(offload_to_cpu=offload, rank0_only=rank0_only),
        optim_state_dict_config=FullOptimStateDictConfig(offload_to_cpu=offload, rank0_only=rank0_only),
    ):
        yield


@contextmanager
def _sharded_state_dict_context(module: torch.nn.Module, offload: bool) -> Generator[None, None, None]:
    from torch.distributed.fsdp import ShardedOptimStateDictConfig, ShardedStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    with FSDP.state_dict_type(
        module=module,
        state_dict_type=StateDictType.SHARDED_STATE_DICT,
        state_dict_config=ShardedStateDictConfig(offload_to_cpu=offload),
        optim_state_dict_config=ShardedOptimStateDictConfig(offload_to_cpu=offload),
    ):
        yield


def _engine_options(thread_count: Optional[int], sync_files: Optional[bool],
                    verify_checksums: Optional[bool]) -> Tuple[int, bool, bool]:
    """The strategies' engine options with the engine's default for each None
    (sp_save_options_init: thread_count, durable; sp_reader_options_init: verify_checksums)."""
    save = _native.save_options(thread_count=thread_count, durable=sync_files)
    read = _native.reader_options(verify_checksums=verify_checksums)
    return int(save.thread_count), bool(save.durable), bool(read.verify_checksums)


class _EngineCheckpoints(_MixinBase):
    """The checkpoint I/O that :class:`FSDPStrategy` and :class:`ModelParallelStrategy` share
    (see the module's docstring): sharded saves through :class:`shardpoint.torch.StorageWriter`
    (sync or async, ``meta.pt`` after the data commit, atomic replacement, remote URLs), loads
    through :class:`shardpoint.torch.StorageReader` with the ``last`` fallback, full files
    through the ``CheckpointIO``, removal that uncommits first.

    A strategy mixes it in before Lightning's class, calls :meth:`_init_engine` from its
    ``__init__``, and gives what differs between strategies: ``_MODULE_KEY`` (the DCP key of
    the module state), :meth:`_saves_sharded` and :meth:`_load_sharded_states`.
    """

    _MODULE_KEY = "model"  # FSDPStrategy's; ModelParallelStrategy saves under "state_dict"

    def _init_engine(self, async_save: bool, thread_count: int, sync_files: bool, verify_checksums: bool) -> None:
        self.async_save = async_save
        self.thread_count = thread_count
        self.sync_files = sync_files
        self.verify_checksums = verify_checksums
        self._pending: Optional[concurrent.futures.Future] = None
        self._pending_path: Optional[str] = None
        self._executor: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._save_group: Optional[Any] = None
        self._staging: Optional[HostStaging] = None  # async saves' host copy, kept between saves
        self._staged: Optional[concurrent.futures.Future] = None  # that copy, while it is made
        self.save_stalls: List[float] = []  # seconds each save blocked training (every rank's own)
        self.load_seconds: Optional[float] = None  # the last load_checkpoint

    def _saves_sharded(self) -> bool:
        """Whether the state dicts Lightning hands to save_checkpoint are sharded (a DCP
        folder) rather than full (one file)."""
        raise NotImplementedError

    def _load_sharded_states(self, location: str) -> None:
        """(every rank) Loads the module state and, when fitting, the optimizer states from the
        DCP files at ``location`` into the sharded model."""
        raise NotImplementedError

    # -- saving ---------------------------------------------------------------------------

    def save_checkpoint(
        self, checkpoint: Dict[str, Any], filepath: PathOrUrl, storage_options: Optional[Any] = None
    ) -> None:
        """(every rank) Saves ``checkpoint`` (Lightning's dict: ``state_dict``,
        ``optimizer_states`` and the rest) at ``filepath``: a sharded folder, or one file
        through the ``CheckpointIO`` when the strategy saves full state dicts."""
        if storage_options is not None:
            raise TypeError(f"shardpoint.lightning.{type(self).__name__}.save_checkpoint takes no storage_options")
        started = time.perf_counter()
        self.wait_for_save()
        location = _text(self.broadcast(_text(filepath)))
        if self._saves_sharded():
            self._save_sharded(checkpoint, location)
        else:
            self._save_full(checkpoint, location)
        self.save_stalls.append(time.perf_counter() - started)

    def _save_full(self, checkpoint: Dict[str, Any], location: str) -> None:
        if not _is_url(location):
            local = Path(_local(location))
            if local.is_dir():
                if not (local / _META).is_file() and not (local / _DCP_METADATA).is_file():
                    raise IsADirectoryError(f"The checkpoint path exists and is a directory: {local}")
                if self.is_global_zero:
                    _remove(local)
        if self.is_global_zero:
            self.checkpoint_io.save_checkpoint(checkpoint, location)

    def _save_sharded(self, checkpoint: Dict[str, Any], location: str) -> None:
        import torch.distributed.checkpoint as dcp

        target = location
        if not _is_url(location):
            # Local: written in a hidden sibling, meta.pt included, and swapped in once
            # committed (_publish_meta), so a committed checkpoint at the location stays whole
            # until its successor is; leftovers of killed saves go first.
            target = str(Path(_local(location)))
            staging = ""
            if self.is_global_zero:
                _native.remove_stale_staging(target)
                staging = _native.staging_folder(target, uuid.uuid4().hex)
            location = _text(self.broadcast(staging))
            Path(location).mkdir(parents=True, exist_ok=True)
        elif self.is_global_zero:
            # Object stores cannot swap: uncommit an older checkpoint here before any of its
            # files change (StorageWriter removes its .metadata once every rank has planned).
            _native.Checkpoint(location).remove_object(_META)
        state = {self._MODULE_KEY: checkpoint.pop("state_dict")}
        state.update({f"optimizer_{i}": s for i, s in enumerate(checkpoint.pop("optimizer_states", []))})
        meta = _serialize(checkpoint) if self.is_global_zero else b""
        writer = StorageWriter(location, thread_count=self.thread_count, sync_files=self.sync_files)
        planner = _save_planner()

        if not self.async_save:
            dcp.save(state, storage_writer=writer, planner=planner)
            self._publish_meta(location, meta, target)
            return

        # The copy to host memory is made on the staging thread while training goes on; the
        # state changes only in the optimizer step, which waits for the copy first
        # (optimizer_step). dcp.async_save's own stager cannot copy the ShardedTensors of
        # FSDP's sharded state dict (PyTorch 2.15).
        if self._staging is None:
            self._staging = HostStaging(pin_memory=torch.cuda.is_available())
        staged = self._staging.stage_async(state)  # the previous write is done: wait_for_save above
        self._staged = staged
        if self._save_group is None:
            self._save_group = dist.new_group(backend="gloo")  # every rank, in step
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="shardpoint-save")
        group = self._save_group

        def write() -> None:
            dcp.save(staged.result(), storage_writer=writer, planner=planner, process_group=group)
            self._publish_meta(location, meta, target)

        self._pending = self._executor.submit(write)
        self._pending_path = target

    def _publish_meta(self, location: str, meta: bytes, target: str) -> None:
        """(rank 0 publishes) ``meta.pt``, after the data's ``.metadata`` is committed, then
        swaps the folder written at ``location`` into ``target`` when they differ."""
        if self.is_global_zero:
            _native.Checkpoint(location).write_object(_META, meta, self.sync_files)
            if location != target:
                _native.replace_folder(location, target, self.sync_files)

    def wait_for_staging(self) -> None:
        """(every rank) Waits until the async save in flight, if any, has copied the state,
        after which training may change it; the wait counts in that save's stall."""
        staged, self._staged = self._staged, None
        if staged is None:
            return
        started = time.perf_counter()
        try:
            staged.result()
        except Exception as e:
            raise errors.StorageError(f"async save of {self._pending_path}: copying the state failed: {e}") from e
        finally:
            if self.save_stalls:
                self.save_stalls[-1] += time.perf_counter() - started

    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any], model: Any = None, **kwargs: Any) -> Any:
        """Lightning's optimizer step, whose update waits for an async save's copy of the state
        (the closure's forward and backward do not change what is saved, so they overlap it)."""

        if closure is None:
            self.wait_for_staging()
            return super().optimizer_step(optimizer, closure, model, **kwargs)  # type: ignore[misc]

        def closure_then_wait() -> Any:
            result = closure()
            self.wait_for_staging()
            return result

        return super().optimizer_step(optimizer, closure_then_wait, model, **kwargs)  # type: ignore[misc]

    def wait_for_save(self) -> None:
        """(every rank) Waits for the async save in flight, if any, and raises its error."""
        self.wait_for_staging()
        pending, self._pending = self._pending, None
        if pending is not None:
            try:
                pending.result()
            except Exception as e:
                raise errors.StorageError(f"async save of {self._pending_path} failed: {e}") from e

    # -- loading --------------------------------------------------------------------------

    def load_checkpoint(self, checkpoint_path: PathOrUrl, weights_only: Optional[bool] = None) -> Dict[str, Any]:
        """(every rank) Loads the model (and, when fitting, optimizer) state into the sharded
        model and returns the rest of the checkpoint. Sharded folders are read through
        :class:`shardpoint.torch.StorageReader` at any world size; single files through the
        ``CheckpointIO`` (checked) and Lightning's own full-state loading. ``meta.pt`` and
        single files are unpickled with ``weights_only=True`` unless the caller turns that
        off in ``Trainer.fit(..., weights_only=...)``, on every PyTorch."""
        self.wait_for_save()
        started = time.perf_counter()
        location = self._resolve_last(_text(self.broadcast(_text(checkpoint_path))))
        if is_committed(location):
            loaded = self._load_sharded(location, weights_only)
            self.load_seconds = time.perf_counter() - started
            return loaded
        data = self._file_bytes(location)
        if data is not None:
            loaded = self._load_full(location, data, weights_only)
            self.load_seconds = time.perf_counter() - started
            return loaded
        if not _is_url(location) and (Path(_local(location)) / _DCP_METADATA).is_file():
            raise ValueError(
                f"{location}: a DCP checkpoint without Lightning's meta.pt (not committed, or not Lightning's)"
            )
        raise ValueError(
            f"The path {location!r} does not point to a valid checkpoint: neither a committed sharded checkpoint"
            " folder (.metadata and meta.pt) nor a single checkpoint file."
        )

    @staticmethod
    def _file_bytes(location: str) -> Optional[bytes]:
        """The whole single-file checkpoint at ``location``, or None when there is none."""
        if not _is_url(location) and not Path(_local(location)).is_file():
            return None
        try:
            return _read_file(location)
        except (FileNotFoundError, errors.NotFoundError):
            return None

    def _resolve_last(self, location: str) -> str:
        """An uncommitted ``last*`` checkpoint gives way to the newest committed one beside it
        (decided on rank 0, broadcast)."""
        name = _split(location)[1]
        chosen = location
        if self.is_global_zero and name.startswith("last") and not _is_url(location):
            local = Path(_local(location))
            if local.is_dir() and not is_committed(local):
                committed = [p for p in find_committed_checkpoints(local.parent) if p != str(local)]
                if committed:
                    chosen = committed[-1]
                    _log.warning(
                        "shardpoint: %s is not committed (interrupted save); resuming from %s instead", location, chosen
                    )
        return _text(self.broadcast(chosen))

    def _load_sharded(self, location: str, weights_only: Optional[bool]) -> Dict[str, Any]:
        """Loads the module (and optimizer) state from the folder's DCP files into the
        sharded model (_load_sharded_states), then returns ``meta.pt``'s dict, checked."""
        self._load_sharded_states(location)
        meta = _native.Checkpoint(location).read_object(_META)
        if meta is None:
            raise errors.NotFoundError(f"{location}/{_META}: missing")
        if self.verify_checksums:
            _verify_zip(meta, f"{location}/{_META}")
        return torch.load(io.BytesIO(meta), weights_only=_trust.weights_only_default(weights_only))

    def _reader(self, location: str) -> StorageReader:
        return StorageReader(location, verify_checksums=self.verify_checksums)

    def _load_full(self, location: str, data: bytes, weights_only: Optional[bool]) -> Dict[str, Any]:
        """Verifies the file's bytes (CRC-32s of the zip), then Lightning's full-state loading
        reads it from a local path (a remote file's bytes go to a temporary file first)."""
        _verify_zip(data, location)
        if not _is_url(location):
            del data
            return self._lightning_load_full(_local(location), weights_only)
        with tempfile.TemporaryDirectory(prefix="shardpoint-") as tmp:
            local = os.path.join(tmp, "checkpoint.ckpt")
            with open(local, "wb") as f:
                f.write(data)
            del data
            return self._lightning_load_full(local, weights_only)

    def _lightning_load_full(self, local: str, weights_only: Optional[bool]) -> Dict[str, Any]:
        return super().load_checkpoint(local, weights_only=_trust.weights_only_default(weights_only))

    # -- removing and teardown ------------------------------------------------------------

    def remove_checkpoint(self, filepath: PathOrUrl) -> None:
        """(every rank; rank 0 deletes) Removes a sharded folder or a file, local or remote,
        uncommitting it first."""
        self.wait_for_save()
        if self.is_global_zero:
            _remove(filepath)

    def teardown(self) -> None:
        """Waits for an async save in flight, frees the async saves' host copy, then
        Lightning's teardown."""
        try:
            self.wait_for_save()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None
            if self._staging is not None:
                self._staging.close()
            self._staging = None
            super().teardown()


class FSDPStrategy(_EngineCheckpoints, _LightningFSDPStrategy):
    """Lightning's ``FSDPStrategy`` with checkpoints through shardpoint (see the module's
    docstring for what changes). Every argument of Lightning's strategy is accepted, plus:

    Args:
        async_save: sharded saves return at once; the state is copied to host memory
            (buffers kept between saves) while training goes on, and the next optimizer step
            waits for the copy; the write goes on in a background thread (the next save, a
            load, ``remove_checkpoint`` and ``teardown`` wait for it).
        thread_count: files each rank writes in parallel (``StorageWriter``: at least 4 on
            ``gs://``); default (None) the engine's, 1.
        sync_files: fsync before publishing (durable; default True); turn off only for
            benchmarks.
        verify_checksums: verify every byte loaded against shardpoint's checksums, or where there
            are none (checkpoints PyTorch wrote) against the zip CRC-32 of each record read
            whole (``StorageReader``), ``meta.pt`` included (default True). False: nothing is
            checked.
        checkpoint_io: for full state dicts; default :class:`CheckpointIO` (atomic, checked,
            remote URLs).

    Lightning calls ``save_checkpoint``, ``load_checkpoint`` and ``remove_checkpoint`` on every
    rank; rank 0 alone writes ``meta.pt`` and deletes files.
    """

    def __init__(
        self,
        *args: Any,
        async_save: bool = False,
        thread_count: Optional[int] = None,
        sync_files: Optional[bool] = None,
        verify_checksums: Optional[bool] = None,
        checkpoint_io: Optional[_LightningCheckpointIO] = None,
        **kwargs: Any,
    ) -> None:
        thread_count, sync_files, verify_checksums = _engine_options(thread_count, sync_files, verify_checksums)
        # A caller's positional arguments stop before Lightning's checkpoint_io (its 4th).
        super().__init__(*args, checkpoint_io=checkpoint_io or CheckpointIO(durable=sync_files), **kwargs)  # type: ignore[misc]
        self._init_engine(async_save, thread_count, sync_files, verify_checksums)

    # -- CPU ------------------------------------------------------------------------------

    @property
    def _on_cpu(self) -> bool:
        return self.root_device.type == "cpu"

    def _setup_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Lightning's wrapping, but on CPU FSDP gets ``device_id=torch.device("cpu")``."""
        from torch.distributed.fsdp import FullyShardedDataParallel

        if not self._on_cpu or any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
            return super()._setup_model(model)
        wrapped = FullyShardedDataParallel(
            module=model,
            cpu_offload=self.cpu_offload,
            mixed_precision=self.mixed_precision_config,
            sharding_strategy=self.sharding_strategy,
            device_id=torch.device("cpu"),
            **self.kwargs,
        )
        # The rest of Lightning's set-up runs on the wrapped model (it skips re-wrapping).
        kwargs, self.kwargs = self.kwargs, {k: v for k, v in self.kwargs.items() if k != "auto_wrap_policy"}
        try:
            return super()._setup_model(wrapped)
        finally:
            self.kwargs = kwargs

    @contextmanager
    def model_sharded_context(self) -> Generator[None, None, None]:
        if not self._on_cpu:
            with super().model_sharded_context():
                yield
            return
        from torch.distributed.fsdp.fully_sharded_data_parallel import FullyShardedDataParallel
        from torch.distributed.fsdp.wrap import enable_wrap

        with enable_wrap(
            wrapper_cls=FullyShardedDataParallel,
            cpu_offload=self.cpu_offload,
            mixed_precision=self.mixed_precision_config,
            sharding_strategy=self.sharding_strategy,
            device_id=torch.device("cpu"),
            **self.kwargs,
        ):
            yield

    def lightning_module_state_dict(self) -> Dict[str, Any]:
        if self._state_dict_type == "full" and self._on_cpu:
            assert self.model is not None
            with _full_state_dict_context(self.model, offload=False):
                return self.model.state_dict()
        return super().lightning_module_state_dict()

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> Dict[str, Any]:
        if self._state_dict_type == "full" and self._on_cpu:
            from lightning.pytorch.core.optimizer import LightningOptimizer
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            from torch.distributed.fsdp import OptimStateKeyType

            if isinstance(optimizer, LightningOptimizer):
                optimizer = optimizer._optimizer
            assert self.model is not None
            with _full_state_dict_context(self.model, offload=False):
                state = FSDP.optim_state_dict(self.model, optimizer)
                if self.global_rank == 0:
                    state = FSDP.rekey_optim_state_dict(state, OptimStateKeyType.PARAM_ID, self.model)
                return state
        return super().optimizer_state(optimizer)

    def _saves_sharded(self) -> bool:
        if self._state_dict_type not in ("full", "sharded"):
            raise ValueError(f"Unknown state_dict_type: {self._state_dict_type}")
        return self._state_dict_type == "sharded"

    def _load_sharded_states(self, location: str) -> None:
        """FSDP's sharded state dicts of the module and, when fitting, the optimizers, read
        from the DCP files at ``location`` (any world size) and loaded."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.optimizer import load_sharded_optimizer_state_dict
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        assert self.model is not None and self.lightning_module is not None
        with _sharded_state_dict_context(self.model, offload=False):
            module_state = {"model": self.model.state_dict()}
            dcp.load(module_state, storage_reader=self._reader(location))
            self.model.load_state_dict(module_state["model"], strict=self.lightning_module.strict_loading)
            if self.lightning_module.trainer.state.fn == TrainerFn.FITTING and self.optimizers:
                for idx, optimizer in enumerate(self.optimizers):
                    key = f"optimizer_{idx}"
                    optim_state = load_sharded_optimizer_state_dict(
                        model_state_dict=module_state["model"], optimizer_key=key, storage_reader=self._reader(location)
                    )[key]
                    # DCP stores no empty dicts: a stateless optimizer's (plain SGD) "state" is
                    # gone after the round trip, and FSDP refuses a state dict without it.
                    optim_state.setdefault("state", {})
                    optimizer.load_state_dict(
                        FSDP.optim_state_dict_to_load(optim_state_dict=optim_state, model=self.model, optim=optimizer)
                    )


class ModelParallelStrategy(_EngineCheckpoints, _LightningModelParallelStrategy):
    """Lightning's ``ModelParallelStrategy`` (FSDP2 ``fully_shard`` and tensor parallelism,
    applied by the module's ``configure_model``) with checkpoints through shardpoint, as
    :class:`FSDPStrategy` has them (see the module's docstring): async saves, remote URLs,
    atomic replacement, the ``last`` fallback, checked loads. It runs on CPU (gloo) as
    Lightning's does. Every argument of Lightning's strategy is accepted, plus those of
    :class:`FSDPStrategy` (``async_save``, ``thread_count``, ``sync_files``,
    ``verify_checksums``, ``checkpoint_io``)::

        trainer = pl.Trainer(accelerator="cpu", devices=4, max_steps=1000,
                             strategy=ModelParallelStrategy(data_parallel_size=4, tensor_parallel_size=1))

    Layout kept: with ``save_distributed_checkpoint=True`` (the default) a checkpoint is
    Lightning's folder of DCP files (module state under ``"state_dict"``, optimizers under
    ``"optimizer_0"``, ...) and ``meta.pt``; Lightning's own strategy resumes from what this
    one writes and the reverse, at any world size. ``shardpoint consolidate`` turns it into a
    full Lightning checkpoint. With ``save_distributed_checkpoint=False`` rank 0 writes one
    file through the ``CheckpointIO`` (default :class:`CheckpointIO`).
    """

    _MODULE_KEY = "state_dict"  # lightning.pytorch's ModelParallelStrategy.save_checkpoint

    def __init__(
        self,
        *args: Any,
        async_save: bool = False,
        thread_count: Optional[int] = None,
        sync_files: Optional[bool] = None,
        verify_checksums: Optional[bool] = None,
        checkpoint_io: Optional[_LightningCheckpointIO] = None,
        **kwargs: Any,
    ) -> None:
        thread_count, sync_files, verify_checksums = _engine_options(thread_count, sync_files, verify_checksums)
        super().__init__(*args, **kwargs)
        # Lightning's strategy takes no checkpoint_io argument; full files go through it.
        self._checkpoint_io = checkpoint_io or CheckpointIO(durable=sync_files)
        self._init_engine(async_save, thread_count, sync_files, verify_checksums)

    def _saves_sharded(self) -> bool:
        return self._save_distributed_checkpoint

    def _load_sharded_states(self, location: str) -> None:
        """Lightning's sharded loading (``lightning.fabric.strategies.model_parallel``'s
        ``_load_checkpoint``), reading through :class:`shardpoint.torch.StorageReader`: the
        module's DTensor state dict, then each optimizer's, loaded in place."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
            set_optimizer_state_dict,
        )

        assert self.model is not None and self.lightning_module is not None
        module_state = {self._MODULE_KEY: get_model_state_dict(self.model)}
        dcp.load(module_state, storage_reader=self._reader(location))
        self.model.load_state_dict(module_state[self._MODULE_KEY], strict=self.lightning_module.strict_loading)
        for idx, optimizer in enumerate(self.optimizers):  # none unless fitting
            key = f"optimizer_{idx}"
            optim_state = {key: get_optimizer_state_dict(self.model, optimizer)}
            dcp.load(optim_state, storage_reader=self._reader(location))
            set_optimizer_state_dict(
                self.model, optimizer, optim_state_dict=optim_state[key], options=StateDictOptions(cpu_offload=True)
            )
