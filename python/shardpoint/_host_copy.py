"""Copies a list of host tensors into their buffers, on one thread or on several.

One memory copy of a rank's state is bound by what one core can move (about 6 GB/s on the
development machines); a rank that has cores to itself finishes sooner with several threads
each copying a share of about equal bytes. The list is split into such shares (a large
contiguous tensor is split between shares); in each, the large pairs whose bytes map one to
one (both contiguous, same dtype) are copied by the engine with stores that bypass the cache
(``sp_copy_ranges``: no read for ownership of the destination, a third less memory traffic
than ``copy_``; one core copies 8.8 GB/s instead of 6.5 here), the rest with one
``torch._foreach_copy_``; the GIL is released during both. The calling thread copies the
first share, pool threads the others. Where ranks share the cores (more ranks than cores, as in the CPU
benchmarks) extra threads only compete for them, so the default is one thread per core
the rank has to itself (``default_threads``).
"""

from __future__ import annotations

import concurrent.futures
import os
from typing import Any, List, Optional, Sequence, Tuple

import torch

# One call for all host copies where PyTorch has it (2.1+); a loop of copy_ otherwise.
_FOREACH_COPY = getattr(torch, "_foreach_copy_", None)

# Least bytes worth a thread of their own: a share's hand-off costs tens of microseconds,
# 16 MiB takes ~3 ms to copy at 6 GB/s.
MIN_SHARE_BYTES = 16 << 20

# Most threads per rank: one core's copy runs at ~6 GB/s, so 8 reach the ~50 GB/s a socket's
# memory gives before they wait on each other.
MAX_THREADS = 8


def default_threads() -> int:
    """Copy threads for this rank: the CPUs it may run on divided by the ranks on this machine
    (``LOCAL_WORLD_SIZE``, as torchrun sets it; else the world size of an initialized
    process group, else 1), at least 1, at most MAX_THREADS."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0)
    if local <= 0:
        import torch.distributed as dist

        local = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    return max(1, min(MAX_THREADS, cpus // max(local, 1)))


# Least bytes the engine's streaming copy takes (core::kStreamingCopyMinBytes): a smaller
# destination fits the caches, where copy_ is as fast.
_STREAMING_MIN_BYTES = 256 << 10

_copy_ranges: Any = False  # _native.copy_ranges, None where the native library does not load


def _native_copy_ranges() -> Any:
    global _copy_ranges
    if _copy_ranges is False:
        try:
            from . import _abi, _native

            _abi.lib()
            _copy_ranges = _native.copy_ranges
        except Exception:  # noqa: BLE001 - the source tree without its library (the CUDA check): copy_ it is
            _copy_ranges = None
    return _copy_ranges


def _copy_share(targets: Sequence[torch.Tensor], sources: Sequence[torch.Tensor]) -> None:
    """targets[i] <- sources[i] for every i: the large pairs whose bytes map one to one by
    the engine's streaming copy, the rest by one foreach call."""
    copy_ranges = _native_copy_ranges()
    rest_targets: List[torch.Tensor] = []
    rest_sources: List[torch.Tensor] = []
    dsts: List[int] = []
    srcs: List[int] = []
    sizes: List[int] = []
    keep: List[torch.Tensor] = []  # what the native call reads, alive until it returns
    for target, source in zip(targets, sources):
        size = target.nbytes
        if (copy_ranges is not None and size >= _STREAMING_MIN_BYTES and source.dtype == target.dtype
                and source.is_cpu and target.is_contiguous() and source.is_contiguous()
                and not source.is_neg() and not source.is_conj() and source.nbytes == size):
            dsts.append(target.data_ptr())
            srcs.append(source.data_ptr())
            sizes.append(size)
            keep.append(source)
        else:
            rest_targets.append(target)
            rest_sources.append(source)
    if sizes:
        copy_ranges(dsts, srcs, sizes)
    with torch.no_grad():  # sources may require gradients (parameters); buffers must not
        if _FOREACH_COPY is not None and rest_targets:
            _FOREACH_COPY(rest_targets, rest_sources)
        else:
            for target, source in zip(rest_targets, rest_sources):
                target.copy_(source)


def split(targets: Sequence[torch.Tensor], sources: Sequence[torch.Tensor],
          shares: int) -> List[Tuple[List[torch.Tensor], List[torch.Tensor]]]:
    """targets/sources cut into at most ``shares`` lists of about equal bytes, in order; a
    pair whose tensors are both contiguous is split between shares where a share fills up
    (views of the same memory), any other pair stays whole."""
    sizes = [t.numel() * t.element_size() for t in targets]
    goal = -(-sum(sizes) // shares)
    out: List[Tuple[List[torch.Tensor], List[torch.Tensor]]] = [([], [])]
    room = goal
    for target, source, size in zip(targets, sources, sizes):
        if size <= room or len(out) == shares or not (target.is_contiguous() and source.is_contiguous()):
            out[-1][0].append(target)
            out[-1][1].append(source)
            room -= size
        else:
            flat_target, flat_source = target.view(-1), source.view(-1)
            item, start, numel = target.element_size(), 0, target.numel()
            while start < numel:
                take = numel - start if len(out) == shares else min(numel - start, max(room // item, 1))
                out[-1][0].append(flat_target[start : start + take])
                out[-1][1].append(flat_source[start : start + take])
                start += take
                room -= take * item
                if start < numel:  # this share is full: the rest goes to the next
                    out.append(([], []))
                    room = goal
        if room <= 0 and len(out) < shares:
            out.append(([], []))
            room = goal
    return [share for share in out if share[0]]


class HostCopier:
    """Copies lists of host tensor pairs with up to ``threads`` threads (1: on the calling
    thread only). Not thread-safe: one copy at a time. Call ``close`` when done."""

    def __init__(self, threads: int = 1) -> None:
        self.threads = max(1, int(threads))
        self._pool: Optional[concurrent.futures.ThreadPoolExecutor] = None

    def copy(self, targets: Sequence[torch.Tensor], sources: Sequence[torch.Tensor]) -> None:
        """Copies sources[i] into targets[i] for every i, complete when this returns; raises
        what a copy raised."""
        if self.threads == 1:
            _copy_share(targets, sources)
            return
        total = sum(t.numel() * t.element_size() for t in targets)
        shares = split(targets, sources, min(self.threads, max(1, total // MIN_SHARE_BYTES)))
        if len(shares) == 1:
            _copy_share(*shares[0])
            return
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(self.threads - 1, thread_name_prefix="shardpoint-copy")
        others = [self._pool.submit(_copy_share, *share) for share in shares[1:]]
        try:
            _copy_share(*shares[0])
        finally:
            for future in others:
                future.result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
