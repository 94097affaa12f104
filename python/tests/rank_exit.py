"""How a rank worker (dcp_worker.py, variants_worker.py, safetensors_worker.py, the Lightning
workers) ends: with os._exit, while its caller's frame still holds the state, without tearing
Python down.

The state references the gloo group (DTensors, ShardedTensors, the DeviceMesh), and letting
Python free it at exit goes wrong in PyTorch's gloo teardown:
- PyTorch 2.6: ~ProcessGroupGloo runs with the GIL held and joins gloo's worker threads,
  while a worker releasing a finished collective's tensors waits for the GIL: a deadlock after
  the rank printed "ok" (main thread in ProcessGroupGloo::~ProcessGroupGloo -> thread::join,
  worker in runLoop -> ~TensorImpl -> PyObjectSlot::maybe_destroy_pyobj -> take_gil; PyTorch
  releases the GIL there from pull request 154976, 2025).
- PyTorch 2.15: the process aborted at exit ("terminate called without an active
  exception") in about one run in five.
Everything the rank had to do is done and checked before it leaves.
"""

from __future__ import annotations

import os
import sys


def leave(code: int) -> None:
    """Flushes the output and ends the process with ``code``; never returns."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
