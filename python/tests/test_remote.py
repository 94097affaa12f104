"""dcp.save / dcp.load through shardpoint on object stores, with the same credential variables
as the CLI, real processes on gloo:
- az:// on Azurite (the Azure Blob emulator from npm, tests/storage/azure_azurite.sh), both
  PyTorch versions;
- s3:// on s3s-fs (SigV4 checked, multipart; scripts/setup-s3s.sh) and gs:// on fsouza's
  fake-gcs-server (the JSON API; scripts/setup-fake-gcs.sh), newest PyTorch (the Python side
  is the same for every store; the stores differ only in the native drivers).
Every server is started on 127.0.0.1 by its fixture and stopped after the module."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

import servers
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
        servers.unavailable("Azurite unavailable")
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
    assert {"run/step-3/.metadata", "run/step-3/__0_0.distcp", "run/step-3/__1_3.distcp",
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
    assert shardpoint.verify(url).ok
    assert shardpoint.inspect(url).tensors["w"].shape == (3, 4)
    target = {"w": torch.zeros(3, 4), "epoch": 0}
    dcp.load(target, storage_reader=StorageReader(url))
    assert torch.equal(target["w"], state["w"]) and target["epoch"] == 1


@pytest.fixture(scope="module")
def s3s(tmp_path_factory):
    """s3s-fs (servers.py) with one bucket; yields (env, bucket)."""
    with servers.s3s_fs(tmp_path_factory.mktemp("s3s"), "ckpt-py") as env:
        yield env, "ckpt-py"


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    """fake-gcs-server (servers.py) with one bucket; yields (env, bucket)."""
    with servers.fake_gcs(tmp_path_factory.mktemp("fake-gcs"), "ckpt-py") as env:
        yield env, "ckpt-py"


@pytest.fixture(params=["s3", "gs"])
def object_store(request, monkeypatch):
    """(scheme, bucket, names) of a running test server, its credential variables set;
    names(prefix) lists the objects under prefix."""
    env, bucket = request.getfixturevalue("s3s" if request.param == "s3" else "gcs")
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "GCS_HMAC_ACCESS_ID", "GCS_HMAC_SECRET"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if request.param == "s3":
        return "s3", bucket, lambda prefix: servers.s3_object_names(env, bucket, prefix)
    return "gs", bucket, lambda prefix: servers.gcs_object_names(env["GCS_JSON_ENDPOINT_URL"], bucket, prefix)


def test_save_on_s3_and_gcs_load_resharded(object_store, tmp_path):
    """2 ranks save to s3:// or gs:// with dcp.async_save, 3 ranks load it; the tools read it there."""
    import shardpoint

    scheme, bucket, names_under = object_store
    url = f"{scheme}://{bucket}/run-{uuid.uuid4().hex[:8]}/step-3"
    newest = [sys.executable]
    run_ranks(newest, 2, ["dcp_worker.py", "save", url, "--async"])
    run_ranks(newest, 3, ["dcp_worker.py", "load", url])
    report = shardpoint.verify(url)
    assert report.ok, report
    names = set(shardpoint.inspect(url).tensors)
    assert names, "inspect found no tensors"
    # A rank writes its thread_count files (2 here), at least 4 on an object store (every
    # scheme here: StorageWriter's thread_count): its small items in the first, its 3 larger
    # shards (dcp_worker.SHARDED) in the other 3.
    per_rank = 4
    prefix = url.split("/", 3)[3] + "/"
    written = {n[len(prefix):] for n in names_under(prefix) if n.endswith(".distcp")}
    assert written == {f"__{r}_{f}.distcp" for r in range(2) for f in range(per_rank)}, sorted(written)
