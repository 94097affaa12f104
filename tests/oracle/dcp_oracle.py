"""Shared helpers for oracle scripts that run PyTorch 2.6 DCP jobs (via scripts/oracle-python).

Typical script:

    import dcp_oracle

    def job(rank, world_size, out_dir):
        ...  # torch.distributed is initialised (gloo, CPU); dcp.save / dcp.load here

    if __name__ == "__main__":
        dcp_oracle.run_ranks(job, world_size=2, args=(sys.argv[1],))

What run_ranks does for you (lessons from running this torch build):
  * picks MASTER_PORT at random in 21000-28999 (outside the kernel's ephemeral range) and
    retries with another port when rank 0 cannot bind it;
  * starts world_size processes with torch.multiprocessing (spawn), each calling
    init_process_group("gloo", init_method="tcp://127.0.0.1:PORT") with a finite timeout;
  * arms faulthandler.dump_traceback_later(timeout_s, exit=True) in every rank, so a hang
    prints every thread's stack and exits instead of blocking the test;
  * ends each rank with barrier() + os._exit(0): in this build, destroying the gloo group
    (destroy_process_group, or the last reference going at exit) can deadlock:
    ~ProcessGroupGloo joins gloo's worker threads with the GIL held while a worker releasing
    a finished collective's tensors waits for the GIL (PyTorch later releases it there: pull request 154976, 2025);
  * a rank whose job raises prints the traceback and exits 1, and run_ranks raises.
"""

import datetime
import errno
import faulthandler
import os
import random
import socket
import sys
import time
import traceback

PORT_RANGE = (21000, 28999)
EXIT_PORT_IN_USE = 98  # EADDRINUSE; tells run_ranks to retry with another port
FAILURE_GRACE_S = 5  # after one rank fails, the others get this long before being killed


def pick_port(attempts=50):
    """Returns a port in PORT_RANGE that 127.0.0.1 could bind just now."""
    for _ in range(attempts):
        port = random.randint(*PORT_RANGE)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise RuntimeError(f"no free port in {PORT_RANGE} after {attempts} attempts")


def _is_port_in_use(exc):
    text = str(exc).lower()
    return "address already in use" in text or getattr(exc, "errno", None) == errno.EADDRINUSE


def _rank_main(rank, job, world_size, port, timeout_s, args):
    import torch.distributed as dist

    faulthandler.dump_traceback_later(timeout_s, exit=True)
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=min(timeout_s, 180)),
        )
    except Exception as exc:  # noqa: BLE001 - reported, then the process exits
        if _is_port_in_use(exc):
            os._exit(EXIT_PORT_IN_USE)
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    try:
        job(rank, world_size, *args)
        dist.barrier()
    except BaseException:  # noqa: BLE001
        print(f"rank {rank} failed:", file=sys.stderr)
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_ranks(job, world_size, args=(), timeout_s=300, port_retries=3):
    """Runs job(rank, world_size, *args) in world_size gloo ranks; raises when a rank fails.

    job must be a module-level function (the spawn start method pickles it by name).
    """
    import torch.multiprocessing as mp

    for attempt in range(port_retries):
        port = pick_port()
        ctx = mp.start_processes(
            _rank_main,
            args=(job, world_size, port, timeout_s, tuple(args)),
            nprocs=world_size,
            join=False,
            start_method="spawn",
        )
        codes = [None] * world_size
        failed_at = None
        while any(c is None for c in codes):
            for i, p in enumerate(ctx.processes):
                p.join(timeout=0.05)
                if p.exitcode is not None:
                    codes[i] = p.exitcode
            if failed_at is None and any(c not in (None, 0) for c in codes):
                failed_at = time.monotonic()
            # After a failure the others may wait in a collective for minutes: stop them.
            if failed_at is not None and time.monotonic() - failed_at > FAILURE_GRACE_S:
                for p in ctx.processes:
                    if p.exitcode is None:
                        p.kill()
        if all(c == 0 for c in codes):
            return
        if codes[0] == EXIT_PORT_IN_USE and attempt + 1 < port_retries:
            print(f"dcp_oracle: port {port} in use, retrying", file=sys.stderr)
            continue
        raise RuntimeError(f"dcp_oracle: ranks exited with codes {codes} (port {port})")


def rank_print(rank, *values):
    """print() with a "rank N:" prefix, flushed (outputs of ranks interleave)."""
    print(f"rank {rank}:", *values, flush=True)
