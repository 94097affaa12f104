"""Shared helpers of shardpoint's benchmark drivers (run with /usr/bin/python3).

Every benchmark measures the peer (PyTorch) and the machine's ceilings (fio) in the same
run, because these machines are shared and noisy; figures are reported as min/median/max
over rounds, with ratios to the peer and fractions of the ceiling taken from medians.
"""
import gc
import json
import mmap
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import time


def drop_caches():
    """Flush dirty pages and drop the page cache (root only); returns False when not allowed."""
    subprocess.run(["sync"], check=True)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def free_page_reporting():
    """True when this kernel returns free memory to a hypervisor (virtio-balloon's free page
    reporting, /sys/module/page_reporting): see back_free_memory()."""
    return os.path.isdir("/sys/module/page_reporting")


def back_free_memory(nbytes):
    """Writes nbytes of fresh anonymous memory, then frees it; returns the seconds it took
    (0 without free page reporting, where it does nothing).

    Under free page reporting the guest hands pages it has freed back to the host, and the
    first write to such a page is a hypervisor fault: writing 2 GB of fresh memory took
    1.0-6.4 s here, as the host's state went. The allocator hands out the
    backed pages first, so a job whose ranks take gigabytes (4 torch ranks: 3.6 GB) leaves a
    server on the same machine with reclaimed pages for its page cache: s3s-fs's kernel copy
    into it went from 4 % to 32 % of its samples, 1.5x its CPU for the same requests. Called
    just before a job's clock starts, with more than the job's processes will allocate, it
    gives every job backed pages (they are freed first, and handed out first).
    """
    if nbytes <= 0 or not free_page_reporting():
        return 0.0
    t0 = time.perf_counter()
    region = mmap.mmap(-1, nbytes)
    zeros = bytes(1 << 20)
    for _ in range(nbytes >> 20):
        region.write(zeros)
    region.close()
    return time.perf_counter() - t0


def run_json(cmd, env=None, timeout=900):
    """Runs cmd, returns the last stdout line parsed as JSON; raises with stderr on failure."""
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    lines = [line for line in p.stdout.splitlines() if line.strip().startswith("{")]
    return json.loads(lines[-1])


def fio_gbps(directory, name, rw, size="2G", direct=False, numjobs=1):
    """Runs one fio job in directory and returns its bandwidth in GB/s (10^9)."""
    if shutil.which("fio") is None:
        return None
    cmd = ["fio", f"--directory={directory}", "--ioengine=psync", "--bs=1M", "--fallocate=none",
           "--output-format=json", f"--name={name}", f"--size={size}", f"--numjobs={numjobs}",
           "--group_reporting", f"--rw={rw}"]
    if direct:
        cmd.append("--direct=1")
    if rw == "write":
        cmd.append("--end_fsync=1")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        return None
    job = json.loads(p.stdout)["jobs"][0]
    part = job["write"] if rw == "write" else job["read"]
    return part["bw_bytes"] / 1e9


def fio_cleanup(directory, name):
    for f in os.listdir(directory):
        if f.startswith(name + "."):
            os.remove(os.path.join(directory, f))


def rm(path):
    """Removes a folder tree or a file; nothing when absent."""
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.remove(path)


def pick_port():
    """A free TCP port on 127.0.0.1 in 21000-28999, drawn at random (concurrent runs rarely collide)."""
    for _ in range(100):
        port = random.randint(21000, 28999)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise RuntimeError("no free port in 21000-28999")


def triple(values):
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    return f"{min(values):.2f}/{statistics.median(values):.2f}/{max(values):.2f}"


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def ratio(a, b):
    return f"{a / b:.2f}x" if a and b else "n/a"


def fraction(a, b):
    return f"{a / b:.2f}" if a and b else "n/a"


def print_table(title, header, rows):
    print(f"\n### {title}\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for r in rows:
        print("| " + " | ".join(str(c) for c in r) + " |")
    sys.stdout.flush()


def gib(n):
    return f"{n / 2**30:.3f} GiB" if n is not None else "n/a"


def count_full_collections():
    """A list that gains the seconds of every full (generation 2) garbage collection of this
    process from now on (clear it before a timed call): those walk every object of a torch
    process, and what sets them off is any allocation, not only the call's."""
    seconds = []
    started = []

    def callback(phase, info):
        if phase == "start":
            started[:] = [time.perf_counter()]
        elif info["generation"] == 2 and started:
            seconds.append(time.perf_counter() - started[0])

    gc.callbacks.append(callback)
    return seconds
