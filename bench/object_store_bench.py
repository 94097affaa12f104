#!/usr/bin/env python3
"""Benchmark: the GPT-2 + Adam state saved and loaded on 4 ranks through an object-store server
on 127.0.0.1, shardpoint against the clients a PyTorch user would pick, in one run, on the same
server, same bytes, same machine. Servers: S3 on s3s-fs (the tests' server; moto too if asked),
Azure Blob on Azurite, GCS (JSON API) on fsouza's fake-gcs-server.

  PY=$(scripts/setup-python.sh bench)
  SHARDPOINT_PYTHONPATH=build-wheel/site $PY bench/object_store_bench.py BUILD \\
      [--servers s3s[,moto][,azurite][,fake-gcs]] [--rounds 1] [--layers 24] [--clients ...]

--clients picks from each server's clients (default: all of them); sp and sp-py run on every
server. S3 (s3s, moto):

Clients (each a job of 4 ranks, save then load, every load checked against the values):
  sp       shardpoint's C++ engine: BUILD/bench/dcp_bench save|load s3://... on 4 processes
           (TCP communicator, no LibTorch), checksums written and verified; the save with
           SaveOptions::thread_count --sp-save-threads (default: the engine's own).
  sp-py    shardpoint's Python package: dcp.save/dcp.load with shardpoint.torch.StorageWriter
           / StorageReader (thread_count: the writer's --sp-py-threads, default its own; the
           reader's 4; sync_files off: an object store has no fsync), 4 gloo ranks (the
           package from $SHARDPOINT_PYTHONPATH).
  s3torch  AWS's s3torchconnector: dcp.save/dcp.load with S3StorageWriter (thread_count
           --peer-threads) / S3StorageReader (its default, dcp_optimized), over its CRT client
           pointed at the server (path-style), same ranks.
  s3fs     dcp.save/dcp.load with DCP's FsspecWriter (thread_count --peer-threads, sync_files
           off) / FsspecReader over s3fs, same ranks.
  boto3    one object per rank of that rank's payload in sp's save (its data files' bytes
           together, whatever number of files sp split them into), from and to
           local files: upload_file / download_file with boto3's transfer manager
           (--boto-chunk-mib parts, --boto-concurrency threads per object), one process per
           object started together. No DCP, no .metadata: the bytes alone.
Azure (azurite: Azurite 3.35.0, blocks in files under --dir, its --debug log counts):
  azure-sdk  Microsoft's azure-storage-blob: the same 4 objects as boto3's, one process
           per object started together (as boto3): BlobClient.upload_blob / download_blob(...)
           .readinto(file) with max_concurrency --sdk-concurrency, blocks and ranged GETs of
           --sdk-chunk-mib (max_block_size, max_single_put_size, max_chunk_get_size).
  adlfs    dcp.save/dcp.load with DCP's FsspecWriter (thread_count --peer-threads, sync_files
           off) / FsspecReader over adlfs (abfs://, the connection string), same ranks.
GCS (fake-gcs: fake-gcs-server 1.56.1, filesystem backend under --dir, JSON API; its access
log counts):
  gcsfs    dcp.save/dcp.load with FsspecWriter / FsspecReader over gcsfs, same ranks.
  gcs-sdk  google-cloud-storage: the same 4 objects, one process each: blob.upload_from_filename
           (a resumable upload in --gcs-sdk-upload-chunk-mib chunks, default the SDK's own
           100 MiB; the JSON API takes one session's chunks in order, so it has no parallel
           upload; the transfer manager's parallel upload is the XML API's multipart upload,
           which fake-gcs-server lacks) and
           transfer_manager.download_chunks_concurrently (ranged GETs of --sdk-chunk-mib on
           --sdk-concurrency threads, the CRC-32C of the file checked).
Time = the slowest rank's call (boto3, azure-sdk, gcs-sdk: first start to last end); GB/s =
the state's payload (10^9 bytes) / time, for every client. Requests are counted by the server (s3s-fs:
its debug log of routed operations; moto: its access log) and reported per GB of payload,
by kind: GET (object reads), PUT (PutObject, UploadPart, CopyObject), POST (multipart
create/complete), HEAD, LIST, DELETE. Azure (Azurite's operation names): GET = Get Blob, PUT =
Put Blob, Put Block, Put Block List and copies, HEAD = Get Blob Properties and other property
reads, LIST = List Blobs, DELETE. GCS (HTTP method and path): GET = media downloads, PUT =
resumable chunks, POST = media/multipart uploads, session starts, rewrites and composes, HEAD =
object or bucket metadata GETs, LIST = object lists, DELETE. Server CPU = user + system
seconds of the server's processes during the job, client CPU = the same summed over the
client's processes (ranks), both next to the job's seconds: on these 2 cores a server that
used about as many CPU seconds as the job took was the ceiling, and the client's CPU is
taken from the server's share. Peak RSS = the largest rank's VmHWM during its call
(the state it holds included), and added = VmHWM - VmRSS before the call.
Python ranks (sp-py, s3torch, s3fs, adlfs, gcsfs) run gc.collect() before each timed call, as
timeit and pyperf keep the collector out of what they time: a rank's first save comes right
after it built the state, and a full collection that garbage sets off walks every object of
a torch process (0.12-0.26 s here). Full collections that still run inside a call are
counted and reported ("full GCs" on the per-round lines). Every job starts after os.sync()
(and a Python client's save once more when its ranks built the state), so that no job pays
for the writeback of the bytes the jobs before it wrote. And right before its clock starts,
the driver writes and frees more memory than the job's processes will allocate
(benchlib.back_free_memory, only under a VM's free page reporting): without it, a job that
starts after torch ranks freed gigabytes gets pages the host took back, and the server on
this machine paid 1.5x the CPU for the same requests (the Python package's S3 saves: 0.7x
boto3 in such runs, 1.1x with backed pages).
Ratios: shardpoint (sp, and sp-py) over the best peer's median (the server's other clients),
each beside the CPU seconds per GB of payload (medians over rounds) of the client's processes,
this client's and the best peer's, and of the server in each of the two jobs: a ratio bought
with more CPU would take the machine from the server (or from training) elsewhere.
Order: every round runs each client once, save then load; odd rounds in reverse order (sp
first in the first round: boto3 and the SDKs upload its objects), so that no client always
runs after the same job, whose writeback and server state it would inherit.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import benchlib  # noqa: E402
import dcp_bench  # noqa: E402
from object_store_servers import (BUCKET, KINDS, REGION, EmulatorServer, Server, process_cpu)

RANKS = 4
PEERS = ("s3torch", "s3fs", "boto3", "azure-sdk", "adlfs", "gcsfs", "gcs-sdk")
# Every client each server runs, in order (sp first: the SDK clients move the objects of its save).
SERVER_CLIENTS = {"s3s": ("sp", "sp-py", "s3torch", "s3fs", "boto3"),
                  "moto": ("sp", "sp-py", "s3torch", "s3fs", "boto3"),
                  "azurite": ("sp", "sp-py", "azure-sdk", "adlfs"), "fake-gcs": ("sp", "sp-py", "gcsfs", "gcs-sdk")}
SERVER_NAMES = {"s3s": "S3 on s3s-fs 0.14.1", "moto": "S3 on moto 5.2.1", "azurite": "Azure Blob on Azurite 3.35.0",
                "fake-gcs": "GCS (JSON API) on fake-gcs-server 1.56.1"}


# --- one Python rank (sp-py, s3torch, s3fs) --------------------------------------------------

def rank_main(args):
    import warnings

    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, ws = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (ws,))
    locals_ = []

    def dt(key, shape):
        local = dcp_bench.peer_local(torch, key, shape, ws, rank)
        locals_.append((key, shape, local))
        return dcp_bench.shard0_dtensor(torch, local, mesh, shape)

    params = dcp_bench.gpt2_parameters(args.layers)
    sd = {"model": {n: dt("model." + n, s) for n, s in params},
          "optimizer_0": {"state": {n: {"step": torch.tensor(10.0),
                                        "exp_avg": dt(f"optimizer_0.state.{n}.exp_avg", s),
                                        "exp_avg_sq": dt(f"optimizer_0.state.{n}.exp_avg_sq", s)}
                                    for n, s in params},
                          "param_groups": [{"lr": 1e-3, "params": [n for n, _ in params]}]}}
    own = sum(t.numel() * t.element_size() for _, _, t in locals_)
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    url = args.url

    if args.client == "sp-py":
        from shardpoint.torch import StorageReader, StorageWriter

        def writer():
            return StorageWriter(url, thread_count=args.sp_py_threads or None, sync_files=False)

        def reader():
            return StorageReader(url, thread_count=4)
    elif args.client == "s3torch":
        from s3torchconnector import S3ClientConfig
        from s3torchconnector._s3client import S3Client
        from s3torchconnector.dcp import S3FileSystem, S3StorageReader, S3StorageWriter
        config = S3ClientConfig(force_path_style=True)

        # S3StorageWriter/Reader take no endpoint: their file system is replaced by one whose
        # client has it (the same class, the same reader strategy).
        def writer():
            w = S3StorageWriter(REGION, url, s3client_config=config, thread_count=args.peer_threads)
            w.fs = S3FileSystem(REGION, s3_client=S3Client(REGION, endpoint=endpoint, s3client_config=config))
            return w

        def reader():
            r = S3StorageReader(REGION, url, s3client_config=config)
            r.fs = S3FileSystem(REGION, s3_client=S3Client(REGION, endpoint=endpoint, s3client_config=config),
                                reader_constructor=r._reader_constructor)
            return r
    else:
        if args.client == "adlfs":
            options = {"connection_string": os.environ["AZURE_STORAGE_CONNECTION_STRING"]}
        elif args.client == "gcsfs":
            options = {"endpoint_url": os.environ["STORAGE_EMULATOR_HOST"], "token": "anon", "project": "bench"}
        else:
            options = {"key": os.environ["AWS_ACCESS_KEY_ID"], "secret": os.environ["AWS_SECRET_ACCESS_KEY"],
                       "endpoint_url": endpoint, "client_kwargs": {"region_name": REGION}}

        def writer():
            return dcp.FsspecWriter(url, thread_count=args.peer_threads, sync_files=False, **options)

        def reader():
            return dcp.FsspecReader(url, **options)

    results = {}
    full_gc_seconds = benchlib.count_full_collections()  # inside the timed call

    def timed(name, fn):
        gc.collect()  # the state building's garbage is not the call's (the module's docstring)
        dist.barrier()
        full_gc_seconds.clear()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = dcp_bench._status("VmRSS")
        cpu0 = process_cpu()
        t0 = time.perf_counter()
        fn()
        seconds = time.perf_counter() - t0
        cpu = torch.tensor([process_cpu() - cpu0], dtype=torch.float64)
        hwm = dcp_bench._status("VmHWM")
        gcs = torch.tensor([len(full_gc_seconds), sum(full_gc_seconds)], dtype=torch.float64)
        t = torch.tensor([seconds, float(hwm), float(hwm - before)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        dist.all_reduce(cpu, op=dist.ReduceOp.SUM)
        dist.all_reduce(gcs, op=dist.ReduceOp.SUM)
        results[name] = {"seconds": t[0].item(), "peak_rss": t[1].item(), "added_rss": t[2].item(),
                         "bytes": own * ws, "client_cpu": cpu.item(), "full_gcs": int(gcs[0].item()),
                         "full_gc_seconds": gcs[1].item()}
        dist.barrier()

    # The driver starts counting the server's requests and CPU once the state is built.
    if rank == 0:
        open(args.results + ".built", "w").close()
        while not os.path.exists(args.results + ".count"):
            time.sleep(0.05)
    dist.barrier()
    timed("save", lambda: dcp.save(sd, storage_writer=writer()))
    if rank == 0:
        with open(args.results + ".saved", "w") as f:
            f.write("1")
    # The driver counts the save's requests, then lets the load start.
    while not os.path.exists(args.results + ".go"):
        time.sleep(0.05)
    for _, _, local in locals_:
        local.fill_(-1.0)
    timed("load", lambda: dcp.load(sd, storage_reader=reader()))
    good = all(torch.equal(local, dcp_bench.peer_local(torch, key, shape, ws, rank)) for key, shape, local in locals_)
    ok = torch.tensor([1.0 if good else 0.0])
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    results["load"]["ok"] = bool(ok.item())
    if rank == 0:
        with open(args.results, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


def state_bytes(layers):
    """The payload of the state: every parameter, exp_avg and exp_avg_sq in float32."""
    return 3 * 4 * sum(math.prod(shape) for _, shape in dcp_bench.gpt2_parameters(layers))


def back_memory(payload):
    """Just before a job's clock starts, gives the job pages the host backs
    (benchlib.back_free_memory), more than its processes allocate: the server writes the
    payload twice (S3 parts, then the object they make), the client holds it once; twice the
    payload and 2 GiB more as margin (with 1 GiB, two Python saves in three of one run in
    three still had the server at 1.2x its CPU); at most half of the memory available now."""
    with open("/proc/meminfo") as f:
        available = next(int(line.split()[1]) << 10 for line in f if line.startswith("MemAvailable:"))
    benchlib.back_free_memory(min(5 * payload + (2 << 30), available // 2))


def run_python_client(client, server, url, layers, peer_threads, sp_py_threads, scratch):
    """4 gloo ranks: save (requests counted), then load; returns {"save": job, "load": job}."""
    results = os.path.join(scratch, f"{client}-results.json")
    for p in (results, results + ".built", results + ".count", results + ".saved", results + ".go"):
        if os.path.exists(p):
            os.remove(p)
    port = benchlib.pick_port()
    procs, logs = [], []
    for r in range(RANKS):
        logs.append(open(os.path.join(scratch, f"{client}-rank{r}.log"), "w+"))
        env = dict(server.env(), RANK=str(r), WORLD_SIZE=str(RANKS), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   GLOO_SOCKET_IFNAME="lo", USE_LIBUV="0", OMP_NUM_THREADS="1")
        env["PYTHONPATH"] = os.environ.get("SHARDPOINT_PYTHONPATH", "") + ":" + HERE
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "rank", client, url, "--layers",
                                       str(layers), "--results", results, "--peer-threads", str(peer_threads),
                                       "--sp-py-threads", str(sp_py_threads)],
                                      env=env, stdout=logs[r], stderr=subprocess.STDOUT))
    # The ranks build their state (importing torch: seconds of the job's window), then the
    # save's requests and the server's CPU are counted.
    deadline = time.time() + 3600
    while not os.path.exists(results + ".built"):
        if any(p.poll() not in (None, 0) for p in procs) or time.time() > deadline:
            break
        time.sleep(0.05)
    os.sync()  # the jobs before left dirty pages (the server's objects); see main()
    back_memory(state_bytes(layers))
    server.start_counting()
    open(results + ".count", "w").close()
    while not os.path.exists(results + ".saved"):
        if any(p.poll() not in (None, 0) for p in procs) or time.time() > deadline:
            break
        time.sleep(0.05)
    save_counts, save_cpu = server.counts(), server.cpu_seconds()
    back_memory(state_bytes(layers))
    server.start_counting()
    open(results + ".go", "w").close()
    for p in procs:
        p.wait(timeout=3600)
    if any(p.returncode for p in procs) or not os.path.exists(results):
        tails = []
        for log in logs:
            log.seek(0)
            tails.append(log.read()[-2500:])
        raise RuntimeError(f"{client} on {RANKS} ranks failed:\n" + "\n".join(tails))
    load_counts, load_cpu = server.counts(), server.cpu_seconds()
    with open(results) as f:
        out = json.load(f)
    if not out["load"]["ok"]:
        raise RuntimeError(f"{client}: loaded values differ")
    out["save"]["requests"], out["load"]["requests"] = save_counts, load_counts
    out["save"]["server_cpu"], out["load"]["server_cpu"] = save_cpu, load_cpu
    return out


# --- shardpoint's C++ ranks ------------------------------------------------------------------

def run_cpp(build, server, url, layers, save_threads=0):
    tool = os.path.join(build, "bench", "dcp_bench")
    out = {}
    for mode in ("save", "load"):
        back_memory(state_bytes(layers))
        server.start_counting()
        extra = ("--threads", str(save_threads)) if mode == "save" and save_threads > 0 else ()
        ranks = dcp_bench.run_shardpoint(tool, mode, url, RANKS, layers, extra=extra, env=server.env())
        counts, server_cpu = server.counts(), server.cpu_seconds()
        if mode == "load" and not all(r["verified"] for r in ranks):
            raise RuntimeError("shardpoint load returned wrong values")
        out[mode] = {"seconds": max(r["seconds"] for r in ranks), "bytes": sum(r["bytes"] for r in ranks),
                     "peak_rss": max(r["peak_rss"] for r in ranks),
                     "added_rss": max(r["peak_rss"] - r["rss_before"] for r in ranks), "requests": counts,
                     "server_cpu": server_cpu, "client_cpu": sum(r["cpu_seconds"] for r in ranks)}
    return out


def warm_up(build, server):
    """A small untimed save and load (2 layers) on a fresh server: the first requests a server
    answers are slower (Azurite's JIT, first files and connections), and sp runs first in
    the first round, so without this it alone would pay for them."""
    run_cpp(build, server, server.url("warm-up"), 2)
    server.remove_prefix("warm-up")


# --- boto3 ------------------------------------------------------------------------------------

def boto_main(args):
    """One object: upload_file or download_file when the driver says go (transfer_when_told)."""
    import boto3
    from boto3.s3.transfer import TransferConfig
    s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name=REGION)
    config = TransferConfig(multipart_threshold=args.chunk_mib << 20, multipart_chunksize=args.chunk_mib << 20,
                            max_concurrency=args.concurrency)
    s3.head_bucket(Bucket=BUCKET)  # connection and credentials ready before the clock starts
    if args.way == "up":
        transfer_when_told(args.go, lambda: s3.upload_file(args.file, BUCKET, args.key, Config=config))
    else:
        transfer_when_told(args.go, lambda: s3.download_file(BUCKET, args.key, args.file, Config=config))


def run_boto(server, sizes, prefix, payload, chunk_mib, concurrency, scratch):
    """Uploads then downloads len(sizes) objects with boto3 (one process each); returns {"save", "load"}."""
    return run_object_processes("boto3", ["boto"], ["--chunk-mib", str(chunk_mib), "--concurrency", str(concurrency)],
                                server, sizes, prefix, payload, scratch)


# --- azure-sdk and gcs-sdk ----------------------------------------------------------------------

def sdk_main(args):
    """One object through azure-storage-blob or google-cloud-storage when the driver says go."""
    part = args.chunk_mib << 20
    if args.client == "azure-sdk":
        from azure.storage.blob import BlobClient
        blob = BlobClient.from_connection_string(os.environ["AZURE_STORAGE_CONNECTION_STRING"], BUCKET, args.key,
                                                 max_block_size=part, max_single_put_size=part,
                                                 max_chunk_get_size=part, max_single_get_size=part)
        blob.exists()  # connection and credentials ready before the clock starts

        def up():
            with open(args.file, "rb") as f:
                blob.upload_blob(f, length=os.path.getsize(args.file), overwrite=True,
                                 max_concurrency=args.concurrency)

        def down():
            with open(args.file, "wb") as f:
                blob.download_blob(max_concurrency=args.concurrency).readinto(f)
    else:
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage
        from google.cloud.storage import transfer_manager
        client = storage.Client(project="bench", credentials=AnonymousCredentials(),
                                client_options={"api_endpoint": os.environ["STORAGE_EMULATOR_HOST"]})
        bucket = client.bucket(BUCKET)
        bucket.reload()  # connection ready before the clock starts

        def up():
            bucket.blob(args.key, chunk_size=args.upload_chunk_mib << 20).upload_from_filename(args.file)

        def down():
            transfer_manager.download_chunks_concurrently(bucket.blob(args.key), args.file, chunk_size=part,
                                                          max_workers=args.concurrency,
                                                          worker_type=transfer_manager.THREAD)
    transfer_when_told(args.go, up if args.way == "up" else down)


def run_sdk(client, server, sizes, prefix, payload, chunk_mib, concurrency, scratch, upload_chunk_mib=100):
    """As run_boto, through azure-sdk or gcs-sdk: uploads then downloads len(sizes) objects."""
    return run_object_processes(client, ["sdk", client],
                                ["--chunk-mib", str(chunk_mib), "--concurrency", str(concurrency),
                                 "--upload-chunk-mib", str(upload_chunk_mib)],
                                server, sizes, prefix, payload, scratch)


def transfer_when_told(go, transfer):
    """Creates go.PID (this process is ready), waits for the file go, then runs transfer() at
    the wall-clock time go holds; prints its times and memory as one JSON line."""
    open(f"{go}.{os.getpid()}", "w").close()
    while not os.path.exists(go):
        time.sleep(0.005)
    with open(go) as f:
        start = float(f.read())
    while time.time() < start:
        time.sleep(0.005)
    before = dcp_bench._status("VmRSS")
    cpu0 = process_cpu()
    t0 = time.time()
    transfer()
    t1 = time.time()
    hwm = dcp_bench._status("VmHWM")
    print(json.dumps({"start": t0, "end": t1, "peak_rss": hwm, "added_rss": hwm - before,
                      "cpu": process_cpu() - cpu0}))


def rank_payloads(listing):
    """Bytes of each rank's data files (`__RANK_N.distcp`) in a save's listing, by rank: the
    bytes-only peers upload one object per rank, the shape a user of their API would pick
    (one stream per rank, each with the SDK's own parallelism), whatever number of files
    the save split a rank's items into."""
    per_rank = {}
    for key, size in listing:
        m = re.search(r"__(\d+)_\d+\.distcp$", key)
        if m:
            per_rank[int(m.group(1))] = per_rank.get(int(m.group(1)), 0) + size
    return [per_rank[r] for r in sorted(per_rank)]


def run_object_processes(client, command, options, server, sizes, prefix, payload, scratch):
    """Uploads len(sizes) local files of random bytes as objects, one process each started
    together (`command up KEY FILE`) once all imported their client and connected, then
    downloads them (`command down`), and checks the bytes; returns {"save", "load"} with the
    time from the first start to the last end."""
    folder = os.path.join(scratch, f"{client}-files")
    os.makedirs(folder, exist_ok=True)
    block = os.urandom(1 << 20)
    files = []
    for i, size in enumerate(sizes):
        path = os.path.join(folder, f"up-{i}")
        with open(path, "wb") as f:
            for _ in range(size >> 20):
                f.write(block)
            f.write(block[:size & ((1 << 20) - 1)])
        files.append(path)
    os.sync()  # the files written back before the clock starts
    out = {}
    for way, job in (("up", "save"), ("down", "load")):
        go = os.path.join(scratch, f"{client}-{way}.go")
        procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), *command, way, f"{prefix}/obj-{i}",
                                   path if way == "up" else os.path.join(folder, f"down-{i}"),
                                   "--go", go, *options],
                                  env=server.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for i, path in enumerate(files)]
        deadline = time.time() + 600
        while sum(os.path.exists(f"{go}.{p.pid}") for p in procs) < len(procs):
            if any(p.poll() is not None for p in procs) or time.time() > deadline:
                break  # the failure is reported below
            time.sleep(0.01)
        back_memory(payload)
        server.start_counting()
        start = time.time() + 0.1
        with open(go + ".tmp", "w") as f:
            f.write(repr(start))
        os.rename(go + ".tmp", go)
        outs = [p.communicate(timeout=3600) for p in procs]
        for p in procs:
            benchlib.rm(f"{go}.{p.pid}")
        benchlib.rm(go)
        if any(p.returncode for p in procs):
            raise RuntimeError(f"{client} failed:\n" + "\n".join(e[-2000:] for _, e in outs))
        ranks = [json.loads(o.strip().splitlines()[-1]) for o, _ in outs]
        if min(r["start"] for r in ranks) < start - 0.5:
            raise RuntimeError(f"{client} processes did not start together")
        out[job] = {"seconds": max(r["end"] for r in ranks) - min(r["start"] for r in ranks), "bytes": payload,
                    "moved": sum(sizes), "peak_rss": max(r["peak_rss"] for r in ranks),
                    "added_rss": max(r["added_rss"] for r in ranks), "requests": server.counts(),
                    "server_cpu": server.cpu_seconds(), "client_cpu": sum(r["cpu"] for r in ranks)}
    for i in range(len(sizes)):
        with open(os.path.join(folder, f"up-{i}"), "rb") as a, open(os.path.join(folder, f"down-{i}"), "rb") as b:
            while True:
                x, y = a.read(1 << 24), b.read(1 << 24)
                if x != y:
                    raise RuntimeError(f"{client} downloaded bytes differ from the uploaded ones")
                if not x:
                    break
    shutil.rmtree(folder)
    return out


# --- the driver -------------------------------------------------------------------------------

def main():
    if len(sys.argv) > 1 and sys.argv[1] == "rank":
        ap = argparse.ArgumentParser()
        ap.add_argument("client")
        ap.add_argument("url")
        ap.add_argument("--layers", type=int, required=True)
        ap.add_argument("--results", required=True)
        ap.add_argument("--peer-threads", type=int, default=4)
        ap.add_argument("--sp-py-threads", type=int, default=0)
        rank_main(ap.parse_args(sys.argv[2:]))
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "boto":
        ap = argparse.ArgumentParser()
        ap.add_argument("way", choices=("up", "down"))
        ap.add_argument("key")
        ap.add_argument("file")
        ap.add_argument("--go", required=True)
        ap.add_argument("--chunk-mib", type=int, required=True)
        ap.add_argument("--concurrency", type=int, required=True)
        boto_main(ap.parse_args(sys.argv[2:]))
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "sdk":
        ap = argparse.ArgumentParser()
        ap.add_argument("client", choices=("azure-sdk", "gcs-sdk"))
        ap.add_argument("way", choices=("up", "down"))
        ap.add_argument("key")
        ap.add_argument("file")
        ap.add_argument("--go", required=True)
        ap.add_argument("--chunk-mib", type=int, required=True)
        ap.add_argument("--concurrency", type=int, required=True)
        ap.add_argument("--upload-chunk-mib", type=int, default=100)
        sdk_main(ap.parse_args(sys.argv[2:]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build")
    ap.add_argument("--servers", default="s3s", help="comma-separated: s3s (s3s-fs), moto, azurite, fake-gcs")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--layers", type=int, default=24, help="24: 2.126 GB; 2 for a smoke run")
    ap.add_argument("--clients", default=None, help="comma-separated; default: every client of each server "
                    "(S3: sp,sp-py,s3torch,s3fs,boto3; azurite: sp,sp-py,azure-sdk,adlfs; fake-gcs: sp,sp-py,gcsfs,"
                    "gcs-sdk); each server runs those of the list it has")
    ap.add_argument("--peer-threads", type=int, default=4, help="thread_count of S3StorageWriter and FsspecWriter")
    ap.add_argument("--sp-save-threads", type=int, default=0,
                    help="sp: SaveOptions::thread_count of the save (dcp_bench --threads); 0: the engine's default")
    ap.add_argument("--sp-py-threads", type=int, default=0,
                    help="sp-py: StorageWriter's thread_count; 0: its default (4 files per rank on object stores)")
    ap.add_argument("--boto-chunk-mib", type=int, default=8)
    ap.add_argument("--boto-concurrency", type=int, default=10)
    ap.add_argument("--sdk-chunk-mib", type=int, default=8, help="azure-sdk and gcs-sdk: block / chunk size")
    ap.add_argument("--sdk-concurrency", type=int, default=8, help="azure-sdk and gcs-sdk: threads per object")
    ap.add_argument("--gcs-sdk-upload-chunk-mib", type=int, default=100,
                    help="gcs-sdk: resumable upload chunk (google-cloud-storage's default, 100 MiB)")
    ap.add_argument("--dir", default="/var/tmp", help="where the servers keep their data")
    args = ap.parse_args()
    servers = args.servers.split(",")
    for kind in servers:
        if kind not in SERVER_CLIENTS:
            sys.exit(f"object_store_bench: unknown server {kind!r} (s3s, moto, azurite, fake-gcs)")
    clients = args.clients.split(",") if args.clients else [c for k in servers for c in SERVER_CLIENTS[k]]
    asked = clients
    build = os.path.abspath(args.build)
    if "sp" in clients and not os.path.exists(os.path.join(build, "bench", "dcp_bench")):
        sys.exit(f"object_store_bench: {build}/bench/dcp_bench not built")
    if "sp-py" in clients and "SHARDPOINT_PYTHONPATH" not in os.environ:
        sys.exit("object_store_bench: set SHARDPOINT_PYTHONPATH to the installed package (build-wheel/site)")
    try:
        if {"s3s", "moto"} & set(servers):
            import boto3  # noqa: F401
        if "s3torch" in clients:
            import s3torchconnector  # noqa: F401
        if "s3fs" in clients:
            import s3fs  # noqa: F401
        if "azurite" in servers:
            import azure.storage.blob  # noqa: F401
        if "adlfs" in clients:
            import adlfs  # noqa: F401
        if "gcsfs" in clients:
            import gcsfs  # noqa: F401
        if "fake-gcs" in servers:
            import google.cloud.storage  # noqa: F401
    except ImportError as e:
        sys.exit(f"object_store_bench: {e}: run with the bench venv's python (scripts/setup-python.sh bench)")
    if any(c in clients for c in ("boto3", "azure-sdk", "gcs-sdk")) and "sp" not in clients:
        sys.exit("object_store_bench: boto3, azure-sdk and gcs-sdk move the objects of sp's save: list sp too")

    for kind in servers:
        clients = [c for c in SERVER_CLIENTS[kind] if c in asked]
        scratch = tempfile.mkdtemp(prefix=f"object-store-bench-{kind}-", dir=args.dir)
        server = Server(kind, scratch) if kind in ("s3s", "moto") else EmulatorServer(kind, scratch)
        jobs = {c: [] for c in clients}
        try:
            if "sp" in clients:
                warm_up(build, server)
            sizes = []  # of sp's objects, its latest save: what boto3 and the SDKs upload
            for rnd in range(args.rounds):
                # Every other round runs the clients in reverse order, so that none always
                # follows the same job (its page cache and writeback, the server's state);
                # sp first in the first round: the bytes-only peers upload its objects.
                for client in (clients if rnd % 2 == 0 else clients[::-1]):
                    prefix = f"{client}-{rnd}"
                    url = server.url(prefix)
                    print(f"[{kind} round {rnd + 1}] {client} ... load {os.getloadavg()[0]:.1f}", flush=True)
                    # Every job starts with no dirty pages: the job before wrote 0.3-0.7 GB (the
                    # server's objects, boto3's files), whose writeback (vm.dirty_expire: 30 s)
                    # would otherwise land in a later job.
                    os.sync()
                    if client == "sp":
                        out = run_cpp(build, server, url, args.layers, args.sp_save_threads)
                        listing = server.objects(prefix)
                        sizes = rank_payloads(listing)
                        out["objects"] = listing
                    elif client == "boto3":
                        payload = jobs["sp"][-1]["save"]["bytes"]
                        out = run_boto(server, sizes, prefix, payload, args.boto_chunk_mib, args.boto_concurrency,
                                       scratch)
                    elif client in ("azure-sdk", "gcs-sdk"):
                        payload = jobs["sp"][-1]["save"]["bytes"]
                        out = run_sdk(client, server, sizes, prefix, payload, args.sdk_chunk_mib,
                                      args.sdk_concurrency, scratch, args.gcs_sdk_upload_chunk_mib)
                    else:
                        out = run_python_client(client, server, url, args.layers, args.peer_threads,
                                                args.sp_py_threads, scratch)
                    for job in ("save", "load"):
                        r = out[job]
                        print(f"  {job}: {r['seconds']:.2f} s, {r['bytes'] / r['seconds'] / 1e9:.3f} GB/s, "
                              f"requests {r['requests']}, CPU s server {r['server_cpu']:.1f} "
                              f"client {r['client_cpu']:.1f}, "
                              f"peak RSS {r['peak_rss'] / 2**20:.0f} MiB "
                              f"(+{r['added_rss'] / 2**20:.0f})"
                              + (f", full GCs {r['full_gcs']} ({r['full_gc_seconds']:.2f} s, all ranks)"
                                 if "full_gcs" in r else ""), flush=True)
                    jobs[client].append(out)
                    server.remove_prefix(prefix)
                    if os.environ.get("RESULTS"):
                        with open(os.environ["RESULTS"], "a") as f:
                            f.write(json.dumps({"bench": "object_store", "server": kind, "round": rnd, "client": client,
                                                "layers": args.layers, **{j: out[j] for j in ("save", "load")}}) + "\n")
        finally:
            server.stop()
            shutil.rmtree(scratch, ignore_errors=True)
        report(kind, args, clients, jobs)
    return 0


def report(kind, args, clients, jobs):
    def gbps(client, job):
        return [r[job]["bytes"] / r[job]["seconds"] / 1e9 for r in jobs[client]]

    def cpu_per_gb(client, job, field):
        """Median over rounds of CPU seconds (field: client_cpu or server_cpu) per GB of payload."""
        return benchlib.median([r[job][field] / (r[job]["bytes"] / 1e9) for r in jobs[client]])

    best = {}
    for job in ("save", "load"):
        peers = [(benchlib.median(gbps(c, job)), c) for c in clients if c in PEERS]
        best[job] = max(peers) if peers else (None, "-")

    def cpu_beside(client, job):
        """Client CPU s/GB of this client and of the best peer, then the server's for each."""
        peer = best[job][1]
        if peer == "-":
            return "n/a"
        mine = [cpu_per_gb(client, job, f) for f in ("client_cpu", "server_cpu")]
        theirs = [cpu_per_gb(peer, job, f) for f in ("client_cpu", "server_cpu")]
        return f"{mine[0]:.2f} / {theirs[0]:.2f} (server {mine[1]:.2f} / {theirs[1]:.2f})"

    payload = jobs[clients[0]][0]["save"]["bytes"]
    rows = []
    for c in clients:
        row = [c]
        for job in ("save", "load"):
            row.append(benchlib.triple(gbps(c, job)))
        for job in ("save", "load"):
            row.append(benchlib.ratio(benchlib.median(gbps(c, job)), best[job][0]))
            row.append(cpu_beside(c, job))
        rows.append(row)
    server = SERVER_NAMES[kind]
    benchlib.print_table(
        f"{server}, 127.0.0.1: {args.layers}-layer GPT-2 + Adam, {payload / 1e9:.3f} GB on {RANKS} ranks, "
        f"{args.rounds} round(s), load average {os.getloadavg()[0]:.1f} (GB/s min/median/max; ratio = median over "
        f"the best peer's: save {best['save'][1]}, load {best['load'][1]}; CPU s/GB = CPU seconds per GB of "
        f"payload, medians: this client's processes / the best peer's, and the server's in each job)",
        ["client", "save GB/s", "load GB/s", "save / best peer", "save CPU s/GB: client (this / peer)",
         "load / best peer", "load CPU s/GB: client (this / peer)"], rows)

    def per_gb(client, job):
        gb = jobs[client][0][job]["bytes"] / 1e9
        counts = jobs[client][0][job]["requests"]
        return "/".join(f"{counts[k] / gb:.0f}" for k in KINDS[:-1]) + (f" (+{counts['other']} other)"
                                                                       if counts["other"] else "")

    def mib(client, job, field):
        return f"{benchlib.median([r[job][field] for r in jobs[client]]) / 2**20:.0f}"

    def busy(client, job):
        return "/".join(f"{benchlib.median([r[job][f] for r in jobs[client]]):.1f}"
                        for f in ("server_cpu", "client_cpu", "seconds"))

    rows = [[c, per_gb(c, "save"), per_gb(c, "load"),
             f"{mib(c, 'save', 'peak_rss')} (+{mib(c, 'save', 'added_rss')})",
             f"{mib(c, 'load', 'peak_rss')} (+{mib(c, 'load', 'added_rss')})", busy(c, "save"), busy(c, "load")]
            for c in clients]
    benchlib.print_table(
        f"Requests per GB of payload (GET/PUT/POST/HEAD/LIST/DELETE, first round, counted by "
        f"{server.split(' on ')[-1]}), peak RSS "
        "of the largest rank, MiB (+ added during the call), and CPU seconds of the server and of the "
        "client's processes over the job's seconds (medians)",
        ["client", "save requests/GB", "load requests/GB", "save peak RSS", "load peak RSS",
         "save CPU s: server/client/wall", "load CPU s: server/client/wall"], rows)


if __name__ == "__main__":
    sys.exit(main())
