"""The object-store servers object_store_bench.py runs on 127.0.0.1, each counting the requests
and CPU seconds of a job: S3 on s3s-fs or moto (Server), Azure Blob on Azurite and GCS's JSON API
on fake-gcs-server (EmulatorServer), with their request kinds, and the process CPU helpers."""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import benchlib  # noqa: E402

BUCKET = "bench"
REGION = "us-east-1"
AZ_ACCOUNT = "devstoreaccount1"
AZ_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
KINDS = ("GET", "PUT", "POST", "HEAD", "LIST", "DELETE", "other")

def process_cpu():
    """User + system CPU seconds this process used so far, all its threads."""
    t = os.times()
    return t.user + t.system


def process_tree_cpu(pid):
    """User + system CPU seconds used so far by process pid and its live descendants (a
    server started through a wrapper script counts its real process too)."""
    tick = os.sysconf("SC_CLK_TCK")
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except (OSError, IndexError, ValueError):
            continue  # exited meanwhile
    return total


def moto_python():
    """A Python with moto and boto3: this one, else python3 on PATH (where the tests find
    moto_server, tests/storage/s3_moto.h; the bench venv has no moto)."""
    for python in (sys.executable, shutil.which("python3")):
        if python and subprocess.run([python, "-c", "import moto, boto3"], capture_output=True).returncode == 0:
            return python
    sys.exit("object_store_bench: no Python with moto and boto3 (pip install 'moto[server]' boto3)")


class Server:
    """An S3 server on 127.0.0.1 whose log counts the requests of each job."""

    def __init__(self, kind, scratch):
        self.kind = kind
        self.port = benchlib.pick_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log_path = os.path.join(scratch, f"{kind}.log")
        log = open(self.log_path, "w")
        if kind == "s3s":
            binary = subprocess.run([os.path.join(REPO, "scripts", "setup-s3s.sh")], capture_output=True, text=True,
                                    timeout=1500).stdout.strip()
            if not binary:
                sys.exit("object_store_bench: s3s-fs unavailable (scripts/setup-s3s.sh)")
            root = os.path.join(scratch, "s3s-root")
            os.makedirs(os.path.join(root, BUCKET))
            self.key, self.secret = "SPBENCHKEY0000000001", "sp-bench-secret"
            # s3s::ops logs one "resolved route, op: <Operation>" line per request at debug.
            env = dict(os.environ, RUST_LOG="s3s::ops=debug,s3s::ops::signature=info", NO_COLOR="1")
            self.proc = subprocess.Popen([binary, "--host", "127.0.0.1", "--port", str(self.port), "--access-key",
                                          self.key, "--secret-key", self.secret, root], stdout=log, stderr=log, env=env)
            self._wait()
        else:
            python = moto_python()
            env = dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT="3")
            self.proc = subprocess.Popen([python, os.path.join(REPO, "tests/storage/s3_moto_server.py"),
                                          str(self.port)], env=env, stdout=log, stderr=log)
            self._wait()
            out = subprocess.run([python, os.path.join(REPO, "tests/storage/s3_moto_setup.py"), self.endpoint,
                                  BUCKET], capture_output=True, text=True, check=True)
            self.key, self.secret = out.stdout.split()
        self.mark = 0

    def _wait(self):
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.1)
        sys.exit(f"object_store_bench: {self.kind} did not start (log: {self.log_path})")

    def env(self):
        env = dict(os.environ, AWS_ACCESS_KEY_ID=self.key, AWS_SECRET_ACCESS_KEY=self.secret, AWS_REGION=REGION,
                   AWS_DEFAULT_REGION=REGION, AWS_ENDPOINT_URL=self.endpoint, AWS_EC2_METADATA_DISABLED="true")
        for k in ("AWS_SESSION_TOKEN", "AWS_PROFILE"):
            env.pop(k, None)
        return env

    def start_counting(self):
        time.sleep(0.2)  # lines of the previous job still being written
        self.mark = os.path.getsize(self.log_path)
        self.cpu_mark = process_tree_cpu(self.proc.pid)

    def cpu_seconds(self):
        """CPU seconds the server used since start_counting() (on these 2 cores it shares the
        machine with the clients: a job whose server used about its wall time was server-bound)."""
        return process_tree_cpu(self.proc.pid) - self.cpu_mark

    def counts(self):
        """Requests since start_counting(), by kind."""
        time.sleep(0.2)
        with open(self.log_path, "rb") as f:
            f.seek(self.mark)
            text = f.read().decode("utf-8", "replace")
        out = dict.fromkeys(KINDS, 0)
        for kind in self.request_kinds(text):
            out[kind] += 1
        return out

    def request_kinds(self, log_text):
        """The kind of every request the server logged in log_text."""
        if self.kind == "s3s":
            return [s3s_kind(op) for op in re.findall(r"resolved route, op: (\w+)", log_text)]
        return [moto_kind(method, target)
                for method, target in re.findall(r'"(GET|PUT|POST|HEAD|DELETE) (\S+) HTTP', log_text)]

    def stop(self):
        self.proc.kill()
        self.proc.wait()

    def url(self, prefix):
        return f"s3://{BUCKET}/{prefix}"

    def objects(self, prefix):
        return objects(s3_client(self), prefix)

    def remove_prefix(self, prefix):
        remove_prefix(s3_client(self), prefix)


class EmulatorServer(Server):
    """Azurite (kind "azurite") or fake-gcs-server ("fake-gcs") on 127.0.0.1: the same
    interface as Server (env, start_counting, counts, url, objects, remove_prefix, stop)."""

    def __init__(self, kind, scratch):  # Server.__init__ starts an S3 server: not called
        self.kind = kind
        self.port = benchlib.pick_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log_path = os.path.join(scratch, f"{kind}.log")
        out = open(os.path.join(scratch, f"{kind}.out"), "w")
        if kind == "azurite":
            binary = subprocess.run([os.path.join(REPO, "scripts", "setup-azurite.sh")], capture_output=True,
                                    text=True, timeout=1500).stdout.strip()
            if not binary:
                sys.exit("object_store_bench: Azurite unavailable (scripts/setup-azurite.sh)")
            # --debug: one "DispatchMiddleware: Operation=<name>" line per request.
            self.proc = subprocess.Popen([binary, "--blobHost", "127.0.0.1", "--blobPort", str(self.port),
                                          "--location", os.path.join(scratch, "azurite-data"), "--skipApiVersionCheck",
                                          "--loose", "--disableTelemetry", "--debug", self.log_path],
                                         stdout=out, stderr=out)
            self._wait()
            self.connection_string = (f"DefaultEndpointsProtocol=http;AccountName={AZ_ACCOUNT};AccountKey={AZ_KEY};"
                                      f"BlobEndpoint={self.endpoint}/{AZ_ACCOUNT};")
            self._container().create_container()
        else:
            binary = subprocess.run([os.path.join(REPO, "scripts", "setup-fake-gcs.sh")], capture_output=True,
                                    text=True, timeout=1500).stdout.strip()
            if not binary:
                sys.exit("object_store_bench: fake-gcs-server unavailable (scripts/setup-fake-gcs.sh)")
            data = os.path.join(scratch, "gcs-buckets")
            os.makedirs(os.path.join(data, BUCKET))
            # Its access log (level info): one combined-log line per request, on stderr.
            log = open(self.log_path, "w")
            self.proc = subprocess.Popen([binary, "-scheme", "http", "-host", "127.0.0.1", "-port", str(self.port),
                                          "-backend", "filesystem", "-filesystem-root",
                                          os.path.join(scratch, "gcs-root"), "-data", data, "-external-url",
                                          self.endpoint, "-public-host", f"127.0.0.1:{self.port}", "-log-level",
                                          "info"], stdout=log, stderr=log)
            self._wait()
        self.mark = 0

    def env(self):
        env = dict(os.environ)
        for k in list(env):
            if k.startswith(("AWS_", "AZURE_STORAGE_", "GCS_", "GOOGLE_")) or k == "STORAGE_EMULATOR_HOST":
                env.pop(k)
        if self.kind == "azurite":
            env["AZURE_STORAGE_CONNECTION_STRING"] = self.connection_string
        else:
            # shardpoint: a bearer token (fake-gcs-server checks none) on the JSON API at this
            # endpoint; google-cloud-storage and gcsfs: STORAGE_EMULATOR_HOST. gcsfs >= 2026.10
            # first asks the bucket's type over gRPC (storage control API), which the emulator
            # does not serve: every file system waits 60 s for it unless its experimental
            # zonal/hierarchical-bucket support is off.
            env.update(GOOGLE_OAUTH_ACCESS_TOKEN="ya29.sp-bench-token", GCS_JSON_ENDPOINT_URL=self.endpoint,
                       STORAGE_EMULATOR_HOST=self.endpoint, GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT="false")
        return env

    def request_kinds(self, log_text):
        if self.kind == "azurite":
            return [azure_kind(op) for op in re.findall(r"DispatchMiddleware: Operation=(\w+)", log_text)]
        return [gcs_kind(method, target)
                for method, target in re.findall(r'"(GET|PUT|POST|HEAD|DELETE|PATCH) (\S+) HTTP', log_text)]

    def url(self, prefix):
        return f"az://{BUCKET}/{prefix}" if self.kind == "azurite" else f"gs://{BUCKET}/{prefix}"

    def _container(self):
        from azure.storage.blob import ContainerClient
        return ContainerClient.from_connection_string(self.connection_string, BUCKET)

    def _bucket(self):
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage
        client = storage.Client(project="bench", credentials=AnonymousCredentials(),
                                client_options={"api_endpoint": self.endpoint})
        return client.bucket(BUCKET)

    def objects(self, prefix):
        if self.kind == "azurite":
            return [(b.name, b.size) for b in self._container().list_blobs(name_starts_with=prefix + "/")]
        return [(b.name, b.size) for b in self._bucket().list_blobs(prefix=prefix + "/")]

    def remove_prefix(self, prefix):
        if self.kind == "azurite":
            container = self._container()
            names = [b.name for b in container.list_blobs(name_starts_with=prefix + "/")]
            for i in range(0, len(names), 256):
                container.delete_blobs(*names[i:i + 256])
        else:
            for blob in self._bucket().list_blobs(prefix=prefix + "/"):
                blob.delete()


def azure_kind(op):
    """The kind of an Azurite operation name (Blob_Download, BlockBlob_StageBlock, ...)."""
    if op == "Blob_Download":
        return "GET"
    if op.startswith("BlockBlob_") or "Copy" in op:
        return "PUT"  # Put Blob, Put Block, Put Block List (Azurite: BlockBlob_CommitBlockList)
    if op.endswith(("GetProperties", "GetBlockList", "GetAccountInfo")):
        return "HEAD"
    if op.startswith("Container_List"):
        return "LIST"
    if op.endswith("Delete"):
        return "DELETE"
    return "other"


def gcs_kind(method, target):
    """The kind of a GCS JSON API request from its method and target."""
    path, _, query = target.partition("?")
    if method in ("PUT", "POST", "DELETE", "HEAD"):
        return method
    if "alt=media" in query or path.startswith("/download/"):
        return "GET"
    if re.fullmatch(r"(/storage/v1)?/b/[^/]+/o/?", path):
        return "LIST"
    return "HEAD"  # object or bucket metadata


def s3s_kind(op):
    if op == "GetObject":
        return "GET"
    if op in ("PutObject", "UploadPart", "CopyObject", "UploadPartCopy"):
        return "PUT"
    if op in ("CreateMultipartUpload", "CompleteMultipartUpload", "DeleteObjects"):
        return "POST"
    if op.startswith("Head"):
        return "HEAD"
    if op.startswith("List"):
        return "LIST"
    if op in ("DeleteObject", "AbortMultipartUpload"):
        return "DELETE"
    return "other"


def moto_kind(method, target):
    path, _, query = target.partition("?")
    key = path.lstrip("/").partition("/")[2]
    if method == "GET":
        return "GET" if key else "LIST"
    return method if method in KINDS else "other"


def s3_client(server):
    import boto3
    return boto3.client("s3", endpoint_url=server.endpoint, region_name=REGION, aws_access_key_id=server.key,
                        aws_secret_access_key=server.secret)


def objects(s3, prefix):
    out = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix + "/"):
        out += [(o["Key"], o["Size"]) for o in page.get("Contents", [])]
    return out


def remove_prefix(s3, prefix):
    keys = [k for k, _ in objects(s3, prefix)]
    for i in range(0, len(keys), 1000):
        s3.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": k} for k in keys[i:i + 1000]]})
