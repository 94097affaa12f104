"""dcp.save / dcp.load through shardpoint on object stores, with the same credential variables
as the CLI, real processes on gloo:
- az:// on Azurite (the Azure Blob emulator from npm, tests/storage/azure_azurite.sh), both
  PyTorch versions;
- s3:// on moto_server (tests/storage/s3_moto_server.py, signatures checked) and gs:// on the
  GCS JSON API server of the C++ tests (tests/storage/gcs_json_server.py), newest PyTorch (the
  Python side is the same for every store; the stores differ only in the native drivers).
Every server is started on 127.0.0.1 by its fixture and stopped after the module."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import uuid

import pytest

from conftest import REPO, run_ranks

ACCOUNT = "devstoreaccount1"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


@pytest.fixture(scope="module")
def azurite(tmp_path_factory):
    """An Azurite on a free port and a fresh container; yields the connection string."""
    state = tmp_path_factory.mktemp("azurite")
    script = REPO / "tests" / "storage" / "azure_azurite.sh"
    subprocess.run([str(script), "start", str(state)], check=True, timeout=900)
    endpoint_file = state / "endpoint"
    if not endpoint_file.exists():
        if os.environ.get("SHARDPOINT_REQUIRE_ORACLES") == "1":
            pytest.fail("Azurite unavailable (SHARDPOINT_REQUIRE_ORACLES=1)")
        pytest.skip("Azurite unavailable")
    endpoint = endpoint_file.read_text().strip()
    connection = (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
                  f"BlobEndpoint={endpoint}/{ACCOUNT};")
    try:
        yield connection
    finally:
        subprocess.run([str(script), "stop", str(state)], check=False, timeout=60)


@pytest.fixture
def container(azurite, monkeypatch) -> str:
    from azure.storage.blob import BlobServiceClient

    name = "ckpt" + uuid.uuid4().hex[:12]
    BlobServiceClient.from_connection_string(azurite).create_container(name)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite)
    return name


def test_save_on_azure_load_resharded(interpreter, container):
    url = f"az://{container}/run/step-3"
    run_ranks(interpreter, 2, ["dcp_worker.py", "save", url])
    from azure.storage.blob import BlobServiceClient

    client = BlobServiceClient.from_connection_string(os.environ["AZURE_STORAGE_CONNECTION_STRING"])
    names = {b.name for b in client.get_container_client(container).list_blobs()}
    assert {"run/step-3/.metadata", "run/step-3/__0_0.distcp", "run/step-3/__1_0.distcp",
            "run/step-3/.shardpoint-checksums.json"} <= names
    run_ranks(interpreter, 3, ["dcp_worker.py", "load", url])


def test_tools_on_azure(container, tmp_path):
    import torch
    import torch.distributed.checkpoint as dcp

    import shardpoint
    from shardpoint.torch import StorageReader, StorageWriter

    url = f"az://{container}/single"
    state = {"w": torch.arange(12.0).reshape(3, 4), "epoch": 1}
    dcp.save(state, storage_writer=StorageWriter(url))
    assert shardpoint.verify(url)["ok"]
    assert shardpoint.inspect(url)["tensors"]["w"]["shape"] == [3, 4]
    target = {"w": torch.zeros(3, 4), "epoch": 0}
    dcp.load(target, storage_reader=StorageReader(url))
    assert torch.equal(target["w"], state["w"]) and target["epoch"] == 1


def _python_with(module: str) -> str | None:
    """A python3 on PATH that imports ``module`` (moto lives outside the test venv)."""
    for candidate in ("python3", "python3.11"):
        path = shutil.which(candidate)
        if path and subprocess.run([path, "-c", f"import {module}"], capture_output=True).returncode == 0:
            return path
    return None


def _unavailable(why: str):
    if os.environ.get("SHARDPOINT_REQUIRE_ORACLES") == "1":
        pytest.fail(f"{why} (SHARDPOINT_REQUIRE_ORACLES=1)")
    pytest.skip(why)


def _wait_accepting(port: int, proc: subprocess.Popen, what: str, seconds: float = 30):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{what} exited at start (exit {proc.returncode})")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    proc.kill()
    pytest.fail(f"{what} did not accept connections on port {port} within {seconds} s")


@pytest.fixture(scope="module")
def moto(tmp_path_factory):
    """moto_server with signature checks, an IAM user and one bucket; yields (env, bucket)."""
    from conftest import free_port

    python = _python_with("moto, boto3")
    if python is None:
        _unavailable("moto_server missing: no python3 on PATH imports moto and boto3")
    port, bucket = free_port(), "ckpt-py"
    log = open(tmp_path_factory.mktemp("moto") / "moto.log", "w")
    server = subprocess.Popen([python, str(REPO / "tests" / "storage" / "s3_moto_server.py"), str(port)],
                              env=dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT="3"), stdout=log, stderr=log)
    try:
        _wait_accepting(port, server, "moto_server")
        endpoint = f"http://127.0.0.1:{port}"
        keys = subprocess.run([python, str(REPO / "tests" / "storage" / "s3_moto_setup.py"), endpoint, bucket],
                              check=True, capture_output=True, text=True, timeout=120).stdout.split()
        yield {"AWS_ACCESS_KEY_ID": keys[0], "AWS_SECRET_ACCESS_KEY": keys[1], "AWS_REGION": "us-east-1",
               "AWS_ENDPOINT_URL": endpoint}, bucket
    finally:
        server.kill()
        server.wait()
        log.close()


@pytest.fixture(scope="module")
def gcs():
    """The GCS JSON API test server with one bucket; yields (env, bucket)."""
    token, bucket = "py-test-token", "ckpt-py"
    server = subprocess.Popen(["python3", str(REPO / "tests" / "storage" / "gcs_json_server.py"), token, bucket],
                              stdout=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline().split()
        if len(line) != 2 or line[0] != "PORT":
            pytest.fail(f"gcs_json_server.py did not report its port: {line}")
        yield {"GOOGLE_OAUTH_ACCESS_TOKEN": token, "GCS_JSON_ENDPOINT_URL": f"http://127.0.0.1:{line[1]}"}, bucket
    finally:
        server.kill()
        server.wait()


@pytest.fixture(params=["s3", "gs"])
def object_store(request, monkeypatch):
    """(scheme, bucket) of a running test server, its credential variables set."""
    env, bucket = request.getfixturevalue("moto" if request.param == "s3" else "gcs")
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "GCS_HMAC_ACCESS_ID", "GCS_HMAC_SECRET"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return request.param, bucket


def test_save_on_s3_and_gcs_load_resharded(object_store, tmp_path):
    """2 ranks save to s3:// or gs:// with dcp.async_save, 3 ranks load it; the tools read it there."""
    import shardpoint

    scheme, bucket = object_store
    url = f"{scheme}://{bucket}/run-{uuid.uuid4().hex[:8]}/step-3"
    newest = [sys.executable]
    run_ranks(newest, 2, ["dcp_worker.py", "save", url, "--async"])
    run_ranks(newest, 3, ["dcp_worker.py", "load", url])
    report = shardpoint.verify(url)
    assert report["ok"], report
    names = set(shardpoint.inspect(url)["tensors"])
    assert names, "inspect found no tensors"
