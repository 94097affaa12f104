"""Fixtures of the Python package's tests.

The package under test is the staged install ``$SHARDPOINT_PYTHONPATH`` (python/shardpoint
plus shardpoint/_lib/libshardpoint.so and the libraries it bundles; scripts/test-python.sh
makes it from the build). Every test that runs PyTorch does it in real processes, once per
interpreter:

- ``newest``: this interpreter (the project's venv: CPython 3.11, newest PyTorch from PyPI);
- ``torch26``: CPython 3.13 + PyTorch 2.6 of the Debian trixie oracle root
  (scripts/oracle-python). Missing oracle: skipped, or failed when
  SHARDPOINT_REQUIRE_ORACLES=1.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Sequence

import pytest

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
ORACLE_ROOT = Path(os.environ.get("SHARDPOINT_ORACLE_ROOT", "/var/cache/shardpoint/oracle-trixie"))

# The tests that run in this process import the package under test from there too.
if os.environ.get("SHARDPOINT_PYTHONPATH"):
    sys.path.insert(0, os.environ["SHARDPOINT_PYTHONPATH"])


def _package_path() -> str:
    path = os.environ.get("SHARDPOINT_PYTHONPATH")
    if not path:
        pytest.exit("SHARDPOINT_PYTHONPATH is not set: run the tests through scripts/test-python.sh", 2)
    return path


def _oracle_ready() -> bool:
    return (ORACLE_ROOT / ".shardpoint-oracle-done").exists() and os.geteuid() == 0


INTERPRETERS = ["newest", "torch26"]


@pytest.fixture(scope="module", params=INTERPRETERS)
def interpreter(request) -> List[str]:
    """The command that starts a Python of the parametrised kind."""
    if request.param == "newest":
        return [sys.executable]
    if not _oracle_ready():
        if os.environ.get("SHARDPOINT_REQUIRE_ORACLES") == "1":
            pytest.fail("PyTorch 2.6 oracle missing (SHARDPOINT_REQUIRE_ORACLES=1)")
        pytest.skip("PyTorch 2.6 oracle root not built (make oracle)")
    return [str(REPO / "scripts" / "oracle-python")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Variables the workers need that scripts/oracle-python does not pass into its root (it
# passes SHARDPOINT_*): sent as SHARDPOINT_WORKER_ENV_<NAME>, restored by the worker.
FORWARDED = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "AZURE_STORAGE_CONNECTION_STRING",
             "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "AWS_ENDPOINT_URL",
             "GOOGLE_OAUTH_ACCESS_TOKEN", "GCS_JSON_ENDPOINT_URL")


def worker_env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "MASTER_", "LOCAL_"))}
    env["PYTHONPATH"] = _package_path()
    env["GLOO_SOCKET_IFNAME"] = "lo"
    env["USE_LIBUV"] = "0"
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra or {})
    for name in FORWARDED:
        if name in env:
            env["SHARDPOINT_WORKER_ENV_" + name] = env[name]
    return env


def run_ranks(interpreter: Sequence[str], world: int, args: Sequence[str], timeout: float = 300,
              expect_ok: bool = True) -> List[subprocess.CompletedProcess]:
    """Runs ``world`` processes of ``interpreter args`` as ranks of one gloo job on
    127.0.0.1 and waits for all; fails the test (with every rank's output) when one fails
    and expect_ok, or when one still runs ``timeout`` seconds after the start. A rank that
    hangs gets SIGABRT first: the workers enable faulthandler, so its output ends with the
    Python stack of every thread, which the failure shows."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = worker_env({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                          "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
        procs.append(subprocess.Popen([*interpreter, *args], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, cwd=str(HERE)))
    deadline = time.monotonic() + timeout
    outputs: List[str] = []
    hung: List[int] = []
    try:
        for rank, p in enumerate(procs):
            try:
                out, _ = p.communicate(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                hung.append(rank)
                p.send_signal(signal.SIGABRT)
                try:
                    out, _ = p.communicate(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    out, _ = p.communicate()
            outputs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    results = [subprocess.CompletedProcess(p.args, p.returncode, out, "") for p, out in zip(procs, outputs)]
    failed = [r for r in results if r.returncode != 0]
    if hung or (expect_ok and failed):
        what = f"rank(s) {hung} still ran after {timeout:.0f} s" if hung else f"{len(failed)} of {world} ranks failed"
        report = "\n".join(f"--- rank {i} (exit {r.returncode})\n{r.stdout[-6000:]}" for i, r in enumerate(results))
        pytest.fail(f"{what}:\n{report}")
    return results


def run_python(interpreter: Sequence[str], code: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs ``code`` in one process of ``interpreter``; fails the test when it fails."""
    r = subprocess.run([*interpreter, "-c", code], env=worker_env(), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=timeout, cwd=str(HERE))
    if r.returncode != 0:
        pytest.fail(f"python exited {r.returncode}:\n{r.stdout[-6000:]}")
    return r
