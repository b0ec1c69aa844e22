"""Second reading of the day's changes (review 47): the defects found, each with a test that failed before its fix."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from edgesdk.bundle import unpack_bundle
from edgesdk.errors import BundleError


def _zstd_frame(data: bytes) -> bytes:
    """One zstd frame of a single raw block (RFC 8878 §3.1.1): magic, a header with a 4-byte content size, a block."""
    return b"\x28\xb5\x2f\xfd" + bytes([0xA0]) + struct.pack("<I", len(data)) + \
        (1 | (len(data) << 3)).to_bytes(3, "little") + data


def _way_out(archive) -> str:
    with pytest.raises(BundleError) as info:
        unpack_bundle(archive, archive.parent / "dest")
    found = re.search(r"decompress it first \((.*)\) and unpack the \.tar", info.value.fix)
    assert found, info.value.fix
    return found.group(1)


@pytest.mark.parametrize("name", ["b.tar", "B.TAR", "my bundle.tar.zst"])
def test_the_way_out_of_a_zstd_archive_leaves_the_archive_whole(tmp_path, name):
    """``zstd -dc b.tar > b.tar`` (a zstd stream named .tar, as ``tar --zstd -cf b.tar`` writes it): the shell emptied
    the archive before zstd read it; a name with a space split into two words."""
    payload = b"the tar inside" * 8
    archive = tmp_path / name
    archive.write_bytes(_zstd_frame(payload))
    command = _way_out(archive)
    words = shlex.split(command)  # as the shell splits it
    assert words[:4] == ["zstd", "-dc", str(archive), ">"], words
    assert Path(words[4]).parent == tmp_path, words
    assert Path(words[4]).name.lower() != name.lower(), words  # never into the archive itself
    if shutil.which("zstd") is None:
        return
    subprocess.run(command, shell=True, check=True, capture_output=True, cwd=tmp_path)
    assert archive.read_bytes() == _zstd_frame(payload)  # the archive is as it was
    written = [path for path in tmp_path.iterdir() if path != archive]
    assert [path.suffix.lower() for path in written] == [".tar"], written
    assert written[0].read_bytes() == payload


# ------------------------------------------------------------------------------------- Ollama options past a double

@pytest.fixture(scope="module")
def ollama_served(tiny_bundle):
    from edgesdk.runtime.session import open_runtime
    from edgesdk.serve.completion import ServeDefaults
    from tests.unit.test_serve import Served

    server = Served(open_runtime(tiny_bundle.path, threads=1), ServeDefaults(max_tokens=4))
    yield server
    server.close()


@pytest.mark.parametrize("options", [{"num_ctx": 10**400}, {"top_k": 10**400}, {"temperature": -(10**400)}])
def test_an_ollama_option_written_as_an_integer_past_a_double_is_no_server_error(ollama_served, options):
    """A JSON integer of 400 digits is a Python int that math.isfinite cannot convert: reading the options as Ollama
    reads them raised OverflowError, and the request got a 500 where the reading before answered it (a count that
    large is no limit: the bundle's context, top-k off; a temperature below 0 greedy)."""
    status, body = ollama_served.post("/api/generate", {"model": "tiny-host", "prompt": "Once upon a time",
                                                        "stream": False, "options": options})
    assert status == 200, body
    assert body["done"] is True


@pytest.mark.parametrize(("route", "body"), [
    ("/completion", {"prompt": "Once upon a time", "n_predict": 2}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    ("/api/generate", {"model": "tiny-host", "prompt": "Once upon a time", "stream": False}),
])
def test_a_temperature_written_as_an_integer_past_a_double_is_a_400_naming_it(ollama_served, route, body):
    """/completion's own temperature check (new today, for llama-server's range) and the OpenAI routes' raised
    OverflowError on a JSON integer of 400 digits (math.isfinite cannot convert it): a server error, not a 400."""
    if route == "/api/generate":
        body = {**body, "options": {"temperature": 10**400}}
    else:
        body = {**body, "temperature": 10**400}
    status, answer = ollama_served.post(route, body)
    assert status == 400, answer
    assert "temperature" in json.dumps(answer)
