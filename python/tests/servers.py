"""Real object-store servers for the Python tests, on 127.0.0.1 at a free port, each started
by a context manager and killed when it exits:

- ``s3s_fs``: s3s-fs, the s3s project's S3 server over a folder (SigV4 checked, multipart,
  conditional writes; installed into the project's cache by scripts/setup-s3s.sh);
- ``fake_gcs``: fsouza's fake-gcs-server (the GCS JSON API: resumable uploads, ranged reads,
  preconditions; scripts/setup-fake-gcs.sh), in memory.

A server that is not installed and cannot be skips the test, or fails it under
SHARDPOINT_REQUIRE_ORACLES=1 (the scripts' own policy)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Dict, Iterator, Set

import pytest

from conftest import REPO, free_port


def unavailable(why: str) -> None:
    """Skips the test, or fails it when SHARDPOINT_REQUIRE_ORACLES=1."""
    if os.environ.get("SHARDPOINT_REQUIRE_ORACLES") == "1":
        pytest.fail(f"{why} (SHARDPOINT_REQUIRE_ORACLES=1)")
    pytest.skip(why)


def _installed(script: str, what: str) -> str:
    """The binary scripts/<script> installs (at once when cached)."""
    path = subprocess.run([str(REPO / "scripts" / script)], capture_output=True, text=True,
                          timeout=1500).stdout.strip()
    if not path or not os.access(path, os.X_OK):
        unavailable(f"{what} unavailable (scripts/{script})")
    return path


def _wait_accepting(port: int, proc: subprocess.Popen, what: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{what} exited at start (exit {proc.returncode})")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    pytest.fail(f"{what} did not accept connections on port {port} within {seconds} s")


@contextlib.contextmanager
def _running(command, port: int, what: str, log_path: Path) -> Iterator[None]:
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=log)
        try:
            _wait_accepting(port, proc, what)
            yield
        finally:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def s3s_fs(folder: Path, bucket: str) -> Iterator[Dict[str, str]]:
    """s3s-fs over folder with one (empty) bucket; yields the variables an s3:// URL needs."""
    binary = _installed("setup-s3s.sh", "s3s-fs")
    port = free_port()
    root = folder / "root"
    (root / bucket).mkdir(parents=True)
    key, secret = "SPPYTESTKEY000000001", f"sp-py-secret-{os.getpid()}"
    with _running([binary, "--host", "127.0.0.1", "--port", str(port), "--access-key", key, "--secret-key", secret,
                   str(root)], port, "s3s-fs", folder / "s3s-fs.log"):
        yield {"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret, "AWS_REGION": "us-east-1",
               "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}


@contextlib.contextmanager
def fake_gcs(folder: Path, bucket: str) -> Iterator[Dict[str, str]]:
    """fake-gcs-server in memory with one (empty) bucket; yields the variables a gs:// URL
    needs for the JSON API (any bearer token: the server checks none)."""
    binary = _installed("setup-fake-gcs.sh", "fake-gcs-server")
    port = free_port()
    data = folder / "data"
    (data / bucket).mkdir(parents=True)  # -data: its folders name the buckets
    endpoint = f"http://127.0.0.1:{port}"
    # -external-url: the resumable session URLs it returns point back at this port.
    with _running([binary, "-scheme", "http", "-host", "127.0.0.1", "-port", str(port), "-backend", "memory",
                   "-data", str(data), "-external-url", endpoint, "-public-host", f"127.0.0.1:{port}",
                   "-log-level", "warn"], port, "fake-gcs-server", folder / "fake-gcs-server.log"):
        yield {"GOOGLE_OAUTH_ACCESS_TOKEN": "ya29.sp-py-test", "GCS_JSON_ENDPOINT_URL": endpoint}


def gcs_object_names(endpoint: str, bucket: str, prefix: str = "") -> Set[str]:
    """Every object name under prefix in bucket, as the JSON API lists them (all pages)."""
    names: Set[str] = set()
    token = ""
    while True:
        query = {"prefix": prefix, **({"pageToken": token} if token else {})}
        url = f"{endpoint}/storage/v1/b/{bucket}/o?{urllib.parse.urlencode(query)}"
        with urllib.request.urlopen(url) as r:
            page = json.load(r)
        names.update(item["name"] for item in page.get("items", []))
        token = page.get("nextPageToken", "")
        if not token:
            return names


def s3_object_names(env: Dict[str, str], bucket: str, prefix: str = "") -> Set[str]:
    """Every key under prefix in bucket (boto3, the server's credentials)."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name=env["AWS_REGION"],
                      aws_access_key_id=env["AWS_ACCESS_KEY_ID"], aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])
    names: Set[str] = set()
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        names.update(o["Key"] for o in page.get("Contents", []))
    return names
