"""The checkpoints the newest PyTorch writes as safetensors, written by PyTorch itself on 2
gloo ranks (safetensors_worker.py save): a Hugging Face folder from HuggingFaceStorageWriter
(consolidated model-*.safetensors + model.safetensors.index.json, and its per-rank sharded/
folder) and a DCP folder with SerializationFormat.SAFETENSORS. shardpoint reads each with
the values that were saved (inspect hashes, the Python StorageReader, the engine's sp_load on
3 ranks), verifies, consolidates and reshards them; PyTorch reads what shardpoint writes. The
Hugging Face folder also from an S3 server on 127.0.0.1 (s3s-fs, servers.py), uploaded with
boto3: read there, and exported there with consolidate --to hf-safetensors."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch

import servers
import shardpoint
from conftest import REPO, run_ranks

WORKER = "safetensors_worker.py"
NEWEST = [sys.executable]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import safetensors_worker as worker  # noqa: E402  (the state's definition)

FOLDERS = ["hf", "hf/sharded", "hf-rank0", "dcp-st"]


def cli() -> Path:
    path = Path(os.environ.get("SHARDPOINT_BUILD_DIR", REPO / "build")) / "src" / "cli" / "shardpoint"
    if not path.exists():
        pytest.skip(f"{path} not built")
    return path


def sha256(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("safetensors")
    run_ranks(NEWEST, 2, [WORKER, "save", str(root)])
    return root


def test_pytorch_wrote_what_we_expect(saved):
    hf = saved / "hf"
    assert sorted(p.name for p in hf.glob("*.safetensors")) == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    index = json.loads((hf / "model.safetensors.index.json").read_text())
    assert index["weight_map"]["head.weight"] == "model-00003-of-00003.safetensors"
    assert len(list((hf / "sharded").glob("shard-0000?-model-0000?-of-00003.safetensors"))) == 6
    # PyTorch 2.15 cannot read its own safetensors serialization; shardpoint can (below).
    outcome = (saved / "dcp-st-torch-load.txt").read_text().strip()
    assert outcome in ("UnpicklingError", "ok"), outcome


@pytest.mark.parametrize("folder", FOLDERS)
def test_inspect_hashes_are_the_saved_values(saved, folder):
    out = subprocess.run([str(cli()), "inspect", "--json", "--hash", str(saved / folder)], check=True,
                         capture_output=True, text=True, timeout=120)
    listing = json.loads(out.stdout)
    assert listing["format"] == ("dcp" if folder == "dcp-st" else "hf-safetensors")
    spec = worker.spec_of(folder)
    assert sorted(listing["tensors"]) == sorted(spec)
    for name, (shape, dtype, _) in spec.items():
        entry = listing["tensors"][name]
        assert entry["shape"] == list(shape) and entry["dtype"] == str(dtype).removeprefix("torch.")
        assert entry["sha256"] == sha256(worker.full(name, shape, dtype)), name
    if folder == "dcp-st":
        assert listing["objects"] == {"step": "7"}


@pytest.mark.parametrize("folder", FOLDERS)
def test_python_storage_reader_loads_on_3_ranks(saved, folder):
    run_ranks(NEWEST, 3, [WORKER, "load-ours", str(saved / folder)])


@pytest.mark.parametrize("folder", FOLDERS)
def test_engine_load_on_3_ranks(saved, folder):
    run_ranks(NEWEST, 3, [WORKER, "load-capi", str(saved / folder)])


@pytest.mark.parametrize("folder", FOLDERS)
def test_verify_is_clean(saved, folder):
    report = shardpoint.verify(saved / folder)
    assert report.ok, report.problems
    assert report.coverage[0].format == ("dcp" if folder == "dcp-st" else "hf-safetensors")
    assert report.verified_bytes == 0  # safetensors carries no checksum
    assert report.tensors == len(worker.spec_of(folder))
    assert report.bytes == sum(worker.full(n, s, d).numel() * d.itemsize for n, (s, d, _) in
                                  worker.spec_of(folder).items())


@pytest.mark.parametrize("folder", FOLDERS)
def test_reshard_2_to_3_then_pytorch_loads_it(saved, folder, tmp_path):
    out = tmp_path / "resharded"
    shardpoint.reshard(saved / folder, out, 3)
    run_ranks(NEWEST, 3, [WORKER, "load-torch", str(out)])


@pytest.mark.parametrize("folder", FOLDERS)
def test_consolidate_to_torch_and_safetensors(saved, folder, tmp_path):
    from safetensors.torch import load_file

    spec = worker.spec_of(folder)
    shardpoint.consolidate(saved / folder, tmp_path / "out.pt", layout="dcp")
    full = torch.load(tmp_path / "out.pt", weights_only=True)
    shardpoint.consolidate(saved / folder, tmp_path / "out.safetensors", layout="dcp", format="safetensors")
    st = load_file(tmp_path / "out.safetensors")
    for name, (shape, dtype, _) in spec.items():
        want = worker.full(name, shape, dtype)
        assert torch.equal(full[name], want) and torch.equal(st[name], want), name
    if folder == "dcp-st":
        assert full["step"] == worker.STEP


def damaged_copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        if f.is_file():
            (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_damaged_headers_are_refused_with_one_line(saved, tmp_path):
    folder = damaged_copy(saved / "hf" / "sharded", tmp_path / "bad")
    victim = folder / "shard-00002-model-00003-of-00003.safetensors"
    data = bytearray(victim.read_bytes())
    data[0:8] = (len(data) * 2).to_bytes(8, "little")  # a header length beyond the file
    victim.write_bytes(bytes(data))
    r = subprocess.run([str(cli()), "verify", str(folder)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert victim.name in r.stdout + r.stderr and "reaches past the end of the file" in r.stdout + r.stderr
    with pytest.raises(shardpoint.errors.FormatError, match=victim.name):
        shardpoint.consolidate(folder, tmp_path / "out.pt", layout="dcp")


def safetensors_tensors(path: Path) -> dict:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


@pytest.mark.parametrize("max_shard_bytes", [0, 1000])
def test_hf_export_equals_pytorchs_consolidation(saved, tmp_path, max_shard_bytes):
    ours = tmp_path / "ours"
    shardpoint.consolidate(saved / "hf" / "sharded", ours, layout="dcp", format="hf-safetensors",
                           max_shard_bytes=max_shard_bytes)
    index = json.loads((ours / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert files == [f"model-{i:05d}-of-{len(files):05d}.safetensors" for i in range(1, len(files) + 1)]
    assert (len(files) > 1) == (max_shard_bytes > 0)
    # PyTorch's HuggingFaceStorageWriter + consolidation of the same state into the same files.
    mapping = {fqn: int(name[6:11]) for fqn, name in index["weight_map"].items()}
    theirs = tmp_path / "theirs"
    run_ranks(NEWEST, 2, [WORKER, "save-hf", str(theirs), json.dumps(mapping)])
    their_index = json.loads((theirs / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == their_index["weight_map"]
    assert index["metadata"]["total_size"] == their_index["metadata"]["total_size"]
    for name in files:
        a, b = safetensors_tensors(ours / name), safetensors_tensors(theirs / name)
        assert sorted(a) == sorted(b), name
        for k in a:
            assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and torch.equal(a[k], b[k]), k
    # PyTorch's HuggingFaceStorageReader loads our export, on 2 ranks.
    run_ranks(NEWEST, 2, [WORKER, "load-hf", str(ours)])


@pytest.mark.parametrize("folder", FOLDERS)
def test_python_inspect_names_the_kind_and_chunks(saved, folder):
    info = shardpoint.inspect(saved / folder)
    assert info.format == ("dcp" if folder == "dcp-st" else "hf-safetensors")
    chunks = info.tensors["embed.weight"].chunks
    whole = folder in ("hf", "hf-rank0")
    assert len(chunks) == (1 if whole else 2)
    # Each chunk's storage is its raw bytes: 37 x 16 float32 rows split 19 / 18 on 2 ranks.
    assert sorted(c.length for c in chunks) == ([37 * 64] if whole else [18 * 64, 19 * 64])


# -- on an object store ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """s3s-fs (servers.py) with the bucket "hf-ckpt"; yields a boto3 client and its variables."""
    boto3 = pytest.importorskip("boto3")
    with servers.s3s_fs(tmp_path_factory.mktemp("s3s"), "hf-ckpt") as env:
        client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name=env["AWS_REGION"],
                              aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                              aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])
        yield client, env


def test_hf_folder_on_s3_reads_and_exports_there(saved, s3, monkeypatch, tmp_path):
    """PyTorch's Hugging Face folder (consolidated files + index, and sharded/) uploaded to
    s3://: verified, consolidated and loaded on 3 ranks from there with the saved values;
    consolidate --to hf-safetensors writes its export into s3:// too, the same files as a
    local export, which PyTorch's HuggingFaceStorageReader loads."""
    client, env = s3
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    prefix = f"run-{uuid.uuid4().hex[:8]}"
    for f in sorted((saved / "hf").rglob("*")):
        if f.is_file():
            client.upload_file(str(f), "hf-ckpt", f"{prefix}/hf/{f.relative_to(saved / 'hf').as_posix()}")
    spec = worker.spec_of("hf")
    for folder in ("hf", "hf/sharded"):
        url = f"s3://hf-ckpt/{prefix}/{folder}"
        assert shardpoint.inspect(url).format == "hf-safetensors"
        report = shardpoint.verify(url)
        assert report.ok, report.problems
        assert report.tensors == len(spec)
        out = tmp_path / f"{folder.replace('/', '-')}.safetensors"
        shardpoint.consolidate(url, out, layout="dcp", format="safetensors")
        got = safetensors_tensors(out)
        for name, (shape, dtype, _) in spec.items():
            assert torch.equal(got[name], worker.full(name, shape, dtype)), (folder, name)
    run_ranks(NEWEST, 3, [WORKER, "load-ours", f"s3://hf-ckpt/{prefix}/hf/sharded"])
    run_ranks(NEWEST, 3, [WORKER, "load-capi", f"s3://hf-ckpt/{prefix}/hf"])

    export = f"s3://hf-ckpt/{prefix}/export"
    shardpoint.consolidate(f"s3://hf-ckpt/{prefix}/hf/sharded", export, layout="dcp", format="hf-safetensors",
                           max_shard_bytes=1000)
    local = tmp_path / "local-export"
    shardpoint.consolidate(saved / "hf" / "sharded", local, layout="dcp", format="hf-safetensors",
                           max_shard_bytes=1000)
    keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket="hf-ckpt", Prefix=f"{prefix}/export/")["Contents"])
    assert [k.rsplit("/", 1)[1] for k in keys] == sorted(p.name for p in local.iterdir())
    fetched = tmp_path / "fetched"
    fetched.mkdir()
    for key in keys:
        name = key.rsplit("/", 1)[1]
        client.download_file("hf-ckpt", key, str(fetched / name))
        assert (fetched / name).read_bytes() == (local / name).read_bytes(), name
    run_ranks(NEWEST, 2, [WORKER, "load-hf", str(fetched)])
