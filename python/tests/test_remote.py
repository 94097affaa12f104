"""dcp.save / dcp.load through shardpoint on an object store: az:// on Azurite (the Azure Blob
emulator from npm, started on 127.0.0.1 by tests/storage/azure_azurite.sh), with the same
credential variables as the CLI. Real processes on gloo, both PyTorch versions."""

from __future__ import annotations

import os
import subprocess
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
