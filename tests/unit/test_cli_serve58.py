"""``edgesdk serve --host``: a URL, an address with a port or one with spaces around it refused by name before the
model loads, each with the --host (and --port) it meant; an address the machine cannot listen on (EINVAL) told to
pick another --host, not another --port."""

from __future__ import annotations

import errno
import json
import os
import re
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from click.testing import CliRunner

from edgesdk.cli import main


def _serve(args: list[str], env: dict[str, str] | None = None):
    return CliRunner().invoke(main, ["serve", *args], env=env)


@pytest.mark.parametrize(("host", "meant"), [
    ("127.0.0.1:8080", "--host 127.0.0.1 --port 8080"),
    ("localhost:8080", "--host localhost --port 8080"),
    ("[::1]:8080", "--host ::1 --port 8080"),
])
def test_host_with_a_port_is_refused_naming_host_and_port(tiny_bundle, host, meant):
    result = _serve([str(tiny_bundle.path), "--host", host, "--port", "0"])
    assert result.exit_code == 2, result.output
    assert f"{host!r} is an address with a port" in result.output
    assert f"pass {meant}" in result.output
    assert "loaded" not in result.output  # refused before the model loads


def test_host_that_is_a_url_is_not_called_a_unix_socket(tiny_bundle):
    result = _serve([str(tiny_bundle.path), "--host", "http://192.168.1.30:8081/v1"])
    assert result.exit_code == 2, result.output
    assert "is a URL" in result.output
    assert "pass --host 192.168.1.30 --port 8081" in result.output
    assert "unix socket" not in result.output


def test_host_with_a_port_from_the_environment_names_the_variable(tiny_bundle):
    result = _serve([str(tiny_bundle.path)], env={"LLAMA_ARG_HOST": "0.0.0.0:8080"})
    assert result.exit_code == 2, result.output
    assert "pass --host 0.0.0.0 --port 8080" in result.output
    assert "LLAMA_ARG_HOST='0.0.0.0:8080'" in result.output


def test_host_with_spaces_around_it_is_refused_by_name(tiny_bundle):
    result = _serve([str(tiny_bundle.path), "--port", "0"], env={"LLAMA_ARG_HOST": "127.0.0.1 "})
    assert result.exit_code == 2, result.output
    assert "'127.0.0.1 ' has spaces around the address" in result.output
    assert "--host 127.0.0.1" in result.output
    assert "loaded" not in result.output


@pytest.mark.parametrize("host", ["::1", "[::1]", "fe80::1%lo", "localhost", "0.0.0.0"])
def test_addresses_are_not_taken_for_a_port(host):
    from edgesdk.cli_serve import _refuse_url_or_port

    _refuse_url_or_port(host)  # no refusal


def _bind_error(host: str) -> OSError | None:
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, 0))
        except OSError as exc:
            return exc
    return None


def test_address_the_machine_cannot_listen_on_asks_for_another_host(tiny_bundle):
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    try:
        refused = _bind_error("ff02::1")  # a multicast address: Linux's bind says EINVAL
    except OSError:
        pytest.skip("no IPv6 socket on this machine")
    if refused is None or refused.errno != errno.EINVAL:
        pytest.skip(f"binding ff02::1 here gives {refused!r}, not EINVAL")
    result = _serve([str(tiny_bundle.path), "--host", "ff02::1", "--port", "0", "--quiet"])
    assert result.exit_code != 0, result.output
    assert "cannot listen on [ff02::1]:0" in result.output
    assert "pass an address of this machine to --host" in result.output
    assert "pick another --port" not in result.output


# --- --api-key's help against what the server leaves open ----------------------------------------------------------


def _started_url(process) -> str:
    """The base URL of a started ``edgesdk serve`` (its start line on stderr: '... on http://HOST:PORT/v1 ...')."""
    for line in process.stderr:
        found = re.search(r" on (http://\S+)/v1 ", line)
        if found:
            return found[1]
    raise AssertionError(f"edgesdk serve ended (exit {process.wait()}) without its start line")


def test_api_key_help_names_the_routes_left_open(tiny_bundle):
    words = " ".join(CliRunner().invoke(main, ["serve", "--help"]).output.split())
    assert "on every route but /health, / and the model list GET /v1/models (/models)" in words
    process = subprocess.Popen([sys.executable, "-m", "edgesdk.cli", "serve", str(tiny_bundle.path), "--port", "0",
                                "--quiet"], stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "EDGESDK_API_KEY": "s3cret"})
    try:
        url = _started_url(process)
        with urllib.request.urlopen(f"{url}/v1/models", timeout=60) as answer:  # open, as the help says
            assert json.loads(answer.read())["data"][0]["id"]
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{url}/props", timeout=60)
        assert refused.value.code == 401
    finally:
        process.terminate()
        process.communicate(timeout=120)


@pytest.mark.parametrize("host", ["192.168.1.0/24", "localhost/v1"])
def test_host_with_a_slash_that_is_no_path_is_not_called_a_unix_socket(tiny_bundle, host):
    result = _serve([str(tiny_bundle.path), "--host", host, "--port", "0"])
    assert result.exit_code == 2, result.output
    assert f"{host!r} holds a '/', which no address or host name does" in result.output
    assert "unix socket" not in result.output
