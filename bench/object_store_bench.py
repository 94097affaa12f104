#!/usr/bin/env python3
"""Benchmark: a ~1 GiB checkpoint uploaded to and downloaded from an S3 server (moto on
127.0.0.1, signature checking on), shardpoint vs boto3 moving the same bytes in the same run.

  python3 bench/object_store_bench.py BUILD_DIR [--rounds 3] [--layers 12]

Run with the Python that has moto and boto3 (the pyenv python3 first on PATH here).

Each round:
  1. shardpoint save: BUILD_DIR/bench/dcp_bench save s3://bench/sp-<round> --layers L
     --threads 4 (one process, 4 files written in parallel, each a multipart upload with up
     to 4 parts in flight, 8 MiB parts from the pool).
  2. shardpoint load of it (--threads 4, checksums verified, every value checked).
  3. boto3 upload of the same objects (bytes fetched beforehand, held in memory) to
     s3://bench/boto-<round>/ with upload_fileobj (TransferConfig: 8 MiB parts, 10 threads,
     boto3's defaults), 4 objects at a time in threads like shardpoint's 4 files.
  4. boto3 download of those objects with download_fileobj into memory (same config).
GB/s = bytes moved / seconds (10^9). shardpoint's times are the whole save()/load() call
(planning, checksums and the `.metadata` commit included); boto3's are the transfers only.
moto is a single Python process holding objects in RAM, so it is the ceiling for both;
the table says how close each client gets to it, not what S3 would do.
Needs: moto_server (moto[server]) and boto3; exits 0 with a note when missing.
"""
import argparse
import concurrent.futures
import io
import json
import os
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import benchlib  # noqa: E402


def start_moto():
    port = benchlib.pick_port()
    env = dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT="3")
    log = open(f"/tmp/shardpoint-bench-moto-{port}.log", "w")
    proc = subprocess.Popen([sys.executable, os.path.join(REPO, "tests/storage/s3_moto_server.py"), str(port)],
                            env=env, stdout=log, stderr=log)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.1)
    out = subprocess.run([sys.executable, os.path.join(REPO, "tests/storage/s3_moto_setup.py"), endpoint, "bench"],
                         capture_output=True, text=True, check=True)
    key, secret = out.stdout.split()
    return proc, endpoint, key, secret


def run_dcp_bench(build, mode, url, layers, env):
    cmd = [os.path.join(build, "bench", "dcp_bench"), mode, url, "--layers", str(layers), "--threads", "4"]
    return benchlib.run_json(cmd, env=env, timeout=1800)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--layers", type=int, default=12)
    args = ap.parse_args()
    try:
        import boto3
        from boto3.s3.transfer import TransferConfig
        import moto  # noqa: F401
    except ImportError as e:
        print(f"object_store_bench: skipped ({e}; needs moto[server] and boto3)")
        return 0
    build = os.path.abspath(args.build)
    if not os.path.exists(os.path.join(build, "bench", "dcp_bench")):
        print(f"object_store_bench: skipped ({build}/bench/dcp_bench not built)")
        return 0

    proc, endpoint, key, secret = start_moto()
    try:
        env = dict(os.environ, AWS_ACCESS_KEY_ID=key, AWS_SECRET_ACCESS_KEY=secret, AWS_REGION="us-east-1",
                   AWS_ENDPOINT_URL=endpoint)
        env.pop("AWS_SESSION_TOKEN", None)
        env.pop("AWS_PROFILE", None)
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id=key, aws_secret_access_key=secret)
        config = TransferConfig(multipart_threshold=8 << 20, multipart_chunksize=8 << 20, max_concurrency=10)
        rows = {"sp_up": [], "sp_down": [], "boto_up": [], "boto_down": []}
        sizes = {}
        for rnd in range(args.rounds):
            prefix = f"sp-{rnd}"
            save = run_dcp_bench(build, "save", f"s3://bench/{prefix}", args.layers, env)
            rows["sp_up"].append(save["bytes_written"] / save["seconds"] / 1e9)
            load = run_dcp_bench(build, "load", f"s3://bench/{prefix}", args.layers, env)
            if not load["verified"]:
                raise RuntimeError("shardpoint load from S3 returned wrong values")
            rows["sp_down"].append(load["bytes_read"] / load["seconds"] / 1e9)
            sizes = {"payload": save["bytes"], "written": save["bytes_written"], "read": load["bytes_read"]}

            # boto3 moves the same objects.
            listing = s3.list_objects_v2(Bucket="bench", Prefix=prefix + "/")["Contents"]
            blobs = {}
            for o in listing:
                blobs[o["Key"][len(prefix) + 1:]] = s3.get_object(Bucket="bench", Key=o["Key"])["Body"].read()
            total = sum(len(b) for b in blobs.values())
            pool = concurrent.futures.ThreadPoolExecutor(4)
            t0 = time.perf_counter()
            list(pool.map(lambda kv: s3.upload_fileobj(io.BytesIO(kv[1]), "bench", f"boto-{rnd}/{kv[0]}",
                                                       Config=config), blobs.items()))
            rows["boto_up"].append(total / (time.perf_counter() - t0) / 1e9)

            def fetch(name):
                buf = io.BytesIO()
                s3.download_fileobj("bench", f"boto-{rnd}/{name}", buf, Config=config)
                return len(buf.getvalue())

            t0 = time.perf_counter()
            got = sum(pool.map(fetch, blobs))
            rows["boto_down"].append(total / (time.perf_counter() - t0) / 1e9)
            pool.shutdown()
            if got != total:
                raise RuntimeError("boto3 download size mismatch")
            sizes["objects"] = total
            # Free moto's memory for the next round.
            for o in s3.list_objects_v2(Bucket="bench", Prefix=f"boto-{rnd}/").get("Contents", []):
                s3.delete_object(Bucket="bench", Key=o["Key"])
            for o in listing:
                s3.delete_object(Bucket="bench", Key=o["Key"])
            if os.environ.get("RESULTS"):
                with open(os.environ["RESULTS"], "a") as f:
                    f.write(json.dumps({"bench": "object_store", "round": rnd, "save": save, "load": load,
                                        "boto_up": rows["boto_up"][-1], "boto_down": rows["boto_down"][-1]}) + "\n")

        head = ["direction", "shardpoint GB/s (min/med/max)", "boto3 GB/s (min/med/max)", "shardpoint / boto3"]
        table = [
            ["upload (save)", benchlib.triple(rows["sp_up"]), benchlib.triple(rows["boto_up"]),
             benchlib.ratio(benchlib.median(rows["sp_up"]), benchlib.median(rows["boto_up"]))],
            ["download (load)", benchlib.triple(rows["sp_down"]), benchlib.triple(rows["boto_down"]),
             benchlib.ratio(benchlib.median(rows["sp_down"]), benchlib.median(rows["boto_down"]))],
        ]
        benchlib.print_table(
            f"Object store (moto on 127.0.0.1, SigV4): {args.layers}-layer checkpoint, "
            f"payload {benchlib.gib(sizes.get('payload'))}, objects {benchlib.gib(sizes.get('objects'))}, "
            f"{args.rounds} rounds", head, table)
    finally:
        proc.kill()
        proc.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
