"""The package parses no location itself: every path or URL goes through the engine's one
parser (sp_location_parse), with the rules every command uses."""

from __future__ import annotations

import pytest

from shardpoint import _native, errors, lightning
from shardpoint.torch import StorageReader, StorageWriter


@pytest.mark.parametrize("text,remote,canonical,parent,name", [
    ("ckpt", False, "ckpt", ".", "ckpt"),
    ("/data/run/./ckpt/", False, "/data/run/ckpt", "/data/run", "ckpt"),
    ("file:///data/ckpt", False, "/data/ckpt", "/data", "ckpt"),
    ("file://localhost/x", False, "/x", "/", "x"),
    ("S3://bucket/prefix/step-3", True, "s3://bucket/prefix/step-3", "s3://bucket/prefix", "step-3"),
    ("gs://bucket", True, "gs://bucket", None, ""),
    ("az://container/p?endpoint=http://127.0.0.1:1", True, "az://container/p?endpoint=http://127.0.0.1:1",
     "az://container?endpoint=http://127.0.0.1:1", "p"),
])
def test_the_engine_parses_every_location(text, remote, canonical, parent, name) -> None:
    location = _native.parse_location(text)
    assert (location.remote, location.text, location.parent, location.name) == (remote, canonical, parent, name)


def test_file_urls_are_local_paths_everywhere() -> None:
    # Before: the Lightning helpers' own parser made "file://localhost/x" the path "localhost/x".
    assert lightning._local("file://localhost/x") == "/x"
    assert not lightning._is_url("file:///x")
    assert lightning._split("file:///data/ckpt") == ("/data", "ckpt")
    assert lightning._split("s3://bucket/run/last.ckpt") == ("s3://bucket/run", "last.ckpt")
    assert StorageWriter("file:///tmp/ckpt").path == "/tmp/ckpt"
    assert StorageReader("file://localhost/tmp/ckpt").path == "/tmp/ckpt"


def test_a_file_url_of_another_host_is_refused() -> None:
    with pytest.raises(errors.UsageError, match="other.host"):
        _native.parse_location("file://other.host/x")
    with pytest.raises(errors.UsageError):
        lightning._split("s3://bucket")
