#!/usr/bin/env python3
"""Azure Blob benchmark: shardpoint save/load of a ~1 GiB checkpoint to az:// on Azurite,
side by side with the Python Azure SDK (azure.storage.blob) moving the same bytes.

    python3 bench/azure_bench.py BUILD_DIR [--ranks 4] [--layers 12] [--rounds 2]

1. Starts Azurite on a free 127.0.0.1 port (scripts/setup-azurite.sh installs it; data in a
   temp folder on the build dir's disk), creates a container.
2. shardpoint: BUILD_DIR/bench/dcp_bench save/load on --ranks processes (dcp_bench.py's launcher, TCP communicator),
   state = GPT-2 style parameters + Adam moments (bench/dcp_bench.cc; 12 layers ~ 1.0 GiB),
   az://bench/sp-N. GB/s = checkpoint payload bytes / slowest rank's seconds.
3. SDK: the same byte count as --ranks blobs uploaded (upload_blob, max_concurrency=8) and
   downloaded (download_blob().readinto) from --ranks threads. Skipped with a note when
   azure.storage.blob is not importable (Debian: apt-get install python3-azure-storage, 543 MB).
Prints one JSON object (with ratio_upload and ratio_download = shardpoint / SDK from the
medians over rounds); Azurite is killed by PID at the end.

Azurite (node, one process) keeps blocks in files under --location and is the bottleneck on
loopback: these numbers compare clients against the same emulator, not Azure itself.
"""
import argparse
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ACCOUNT = "devstoreaccount1"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import benchlib  # noqa: E402
import dcp_bench  # noqa: E402


def start_azurite(location):
    binary = subprocess.run([os.path.join(ROOT, "scripts", "setup-azurite.sh")], capture_output=True, text=True,
                            timeout=1000).stdout.strip()
    if not binary:
        sys.exit("azure_bench: Azurite unavailable (scripts/setup-azurite.sh)")
    port = benchlib.pick_port()
    log = open(os.path.join(location, "azurite.log"), "w")
    proc = subprocess.Popen([binary, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", location,
                             "--skipApiVersionCheck", "--loose", "--disableTelemetry"], stdout=log, stderr=log)
    for _ in range(600):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.1)
    proc.kill()
    sys.exit("azure_bench: Azurite did not start")


def create_container(port, name):
    """Create Container, signed with SharedKey (the canonical form of azure_auth.h)."""
    import base64
    import hashlib
    import hmac
    import urllib.request
    date = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime())
    headers = {"x-ms-date": date, "x-ms-version": "2021-12-02"}
    canon = "".join(f"{k}:{v}\n" for k, v in sorted(headers.items()))
    # VERB, 4 empty fields, Content-Type, 6 empty fields (Date is x-ms-date), x-ms headers.
    to_sign = "PUT\n" + "\n" * 4 + "application/octet-stream\n" + "\n" * 6 + canon + f"/{ACCOUNT}/{ACCOUNT}/{name}\nrestype:container"
    sig = base64.b64encode(hmac.new(base64.b64decode(KEY), to_sign.encode(), hashlib.sha256).digest()).decode()
    headers["Authorization"] = f"SharedKey {ACCOUNT}:{sig}"
    headers["Content-Type"] = "application/octet-stream"
    req = urllib.request.Request(f"http://127.0.0.1:{port}/{ACCOUNT}/{name}?restype=container", method="PUT",
                                 headers=headers, data=b"")
    urllib.request.urlopen(req, timeout=30).close()


def conn_string(port):
    return (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
            f"BlobEndpoint=http://127.0.0.1:{port}/{ACCOUNT};")


def shardpoint_round(tool, port, ranks, layers, name):
    env = dict(os.environ, AZURE_STORAGE_CONNECTION_STRING=conn_string(port))
    url = f"az://bench/{name}"
    save = dcp_bench.run_shardpoint(tool, "save", url, ranks, layers, env=env)
    load = dcp_bench.run_shardpoint(tool, "load", url, ranks, layers, env=env)
    total = sum(r["bytes"] for r in save)
    return total, total / max(r["seconds"] for r in save) / 1e9, total / max(r["seconds"] for r in load) / 1e9


def sdk_round(port, ranks, total, name):
    try:
        from azure.storage.blob import BlobServiceClient
    except ImportError:
        return None
    service = BlobServiceClient.from_connection_string(conn_string(port))
    container = service.get_container_client("bench")
    per = total // ranks
    payload = os.urandom(1 << 20) * (per >> 20) + os.urandom(per % (1 << 20))

    def each(fn):
        errors = []

        def run(i):
            try:
                fn(i)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)
        threads = [threading.Thread(target=run, args=(i,)) for i in range(ranks)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return time.perf_counter() - t0

    up = each(lambda i: container.upload_blob(f"{name}/{i}", payload, overwrite=True, max_concurrency=8))
    down = each(lambda i: container.download_blob(f"{name}/{i}", max_concurrency=8).readinto(io.BytesIO()))
    return per * ranks / up / 1e9, per * ranks / down / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build_dir")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--layers", type=int, default=12, help="12 = ~1.0 GiB checkpoint; 1-2 for a smoke run")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    tool = os.path.join(args.build_dir, "bench", "dcp_bench")
    if not os.access(tool, os.X_OK):
        sys.exit(f"azure_bench: {tool} not built")
    scratch = tempfile.mkdtemp(prefix="azure-bench-", dir=args.build_dir)
    proc, port = start_azurite(scratch)
    try:
        create_container(port, "bench")
        result = {"ranks": args.ranks, "layers": args.layers, "shardpoint": [], "sdk": []}
        for i in range(args.rounds):
            total, up, down = shardpoint_round(tool, port, args.ranks, args.layers, f"sp-{i}")
            result["bytes"] = total
            result["shardpoint"].append({"upload_GBps": round(up, 3), "download_GBps": round(down, 3)})
            sdk = sdk_round(port, args.ranks, total, f"sdk-{i}")
            if sdk is None:
                result["sdk"] = "azure.storage.blob not installed (apt-get install python3-azure-storage)"
            else:
                result["sdk"].append({"upload_GBps": round(sdk[0], 3), "download_GBps": round(sdk[1], 3)})
        if isinstance(result["sdk"], list):  # shardpoint / SDK, from the medians over rounds
            for way in ("upload_GBps", "download_GBps"):
                result[f"ratio_{way.split('_')[0]}"] = benchlib.ratio(
                    benchlib.median([r[way] for r in result["shardpoint"]]), benchlib.median([r[way] for r in result["sdk"]]))
        print(json.dumps(result))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
