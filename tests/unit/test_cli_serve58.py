"""``edgesdk serve --host``: a URL, an address with a port or one with spaces around it refused by name before the
model loads, each with the --host (and --port) it meant; an address the machine cannot listen on (EINVAL) told to
pick another --host, not another --port."""

from __future__ import annotations

import errno
import json
import os
import queue
import re
import socket
import subprocess
import sys
import threading
import time
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


def _started_url(process, within_s: float = 120.0) -> str:
    """The base URL of a started ``edgesdk serve`` (its start line on stderr: '... on http://HOST:PORT/v1 ...'),
    waited for ``within_s`` seconds at most; stderr is read on (so that the server never blocks on it) until it ends."""
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        for line in process.stderr:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    deadline, said = time.monotonic() + within_s, []
    while True:
        try:
            line = lines.get(timeout=max(deadline - time.monotonic(), 0))
        except queue.Empty:
            raise AssertionError(f"edgesdk serve gave no start line in {within_s:.0f}s: {''.join(said)}") from None
        if line is None:
            raise AssertionError(f"edgesdk serve ended (exit {process.wait()}) without its start line: {''.join(said)}")
        said.append(line)
        found = re.search(r" on (http://\S+)/v1 ", line)
        if found:
            return found[1]


def test_api_key_help_names_the_routes_left_open(tiny_bundle):
    words = " ".join(CliRunner().invoke(main, ["serve", "--help"]).output.split())
    assert "on every route but /health, / and the model list GET /v1/models (/models)" in words
    env = {name: value for name, value in os.environ.items() if not name.startswith("LLAMA_")}  # none read as options
    process = subprocess.Popen([sys.executable, "-m", "edgesdk.cli", "serve", str(tiny_bundle.path), "--port", "0",
                                "--quiet"], stderr=subprocess.PIPE, text=True,
                               env={**env, "EDGESDK_API_KEY": "s3cret"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # straight to 127.0.0.1, never via a proxy
    try:
        url = _started_url(process)
        with opener.open(f"{url}/v1/models", timeout=60) as answer:  # open, as the help says
            assert json.loads(answer.read())["data"][0]["id"]
        with pytest.raises(urllib.error.HTTPError) as refused:
            opener.open(f"{url}/props", timeout=60)
        assert refused.value.code == 401
    finally:
        process.terminate()
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.mark.parametrize("host", ["192.168.1.0/24", "localhost/v1"])
def test_host_with_a_slash_that_is_no_path_is_not_called_a_unix_socket(tiny_bundle, host):
    result = _serve([str(tiny_bundle.path), "--host", host, "--port", "0"])
    assert result.exit_code == 2, result.output
    assert f"{host!r} holds a '/', which no address or host name does" in result.output
    assert "unix socket" not in result.output


@pytest.mark.parametrize("host", ["[::1", "http://[::1", "[::1:8080", "::1]:8080"])
def test_host_with_a_malformed_bracket_is_refused_naming_it(tiny_bundle, host):
    result = _serve([str(tiny_bundle.path), "--host", host, "--port", "0"])
    assert result.exit_code == 2, result.output
    assert f"{host!r} has a malformed bracket" in result.output
    assert "--host ::1" in result.output
    assert not isinstance(result.exception, ValueError)


@pytest.mark.parametrize("host", ["/run/llama:1.sock", "llama:1.sock", "./llama:1", "~/llama:8080"])
def test_socket_path_holding_a_colon_is_called_a_unix_socket(tiny_bundle, host):
    result = _serve([str(tiny_bundle.path), "--host", host, "--port", "0"])
    assert result.exit_code == 2, result.output
    assert f"{host!r} is a unix socket path" in result.output
    assert "address with a port" not in result.output


@pytest.mark.parametrize(("host", "port"), [("http:///x", ""), (":8080", " and --port 8080")])
def test_host_naming_no_address_is_not_told_one(tiny_bundle, host, port):
    result = _serve([str(tiny_bundle.path), "--host", host, "--port", "0"])
    assert result.exit_code == 2, result.output
    assert "--host 127.0.0.1" not in result.output  # no address named, none guessed
    words = " ".join(result.output.split())
    assert ("pass an address of this machine to --host (127.0.0.1 for this machine only; 0.0.0.0 or :: for every "
            f"interface){port}") in words


def test_zone_of_an_address_with_a_port_keeps_its_case(tiny_bundle):
    result = _serve([str(tiny_bundle.path), "--host", "[fe80::1%ETH0]:80", "--port", "0"])
    assert result.exit_code == 2, result.output
    assert "pass --host fe80::1%ETH0 --port 80" in result.output


@pytest.mark.parametrize("host", ["a\u2100b:80", "a\uff20b:80", "a\ufe56b:80"])
def test_host_with_characters_nfkc_makes_separators_is_not_called_a_malformed_bracket(tiny_bundle, host):
    """urlsplit refuses a netloc whose characters NFKC-normalize to '/', '?', '#', '@' or ':' ('\u2100' -> 'a/c')
    as it does a malformed bracket: such a host holds no bracket, and is refused in urlsplit's own words."""
    result = _serve([str(tiny_bundle.path), "--host", host, "--port", "0"])
    assert result.exit_code == 2, result.output
    words = " ".join(result.output.split())
    assert "'--host'" in words
    assert f"{host!r} is no address or host name" in words
    assert "invalid characters under NFKC normalization" in words
    assert "malformed bracket" not in words
    assert not isinstance(result.exception, ValueError)
