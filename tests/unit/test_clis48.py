"""``edgesdk run`` / ``serve`` against llama.cpp's tools (llama-cli, llama-server): a bundle given both as BUNDLE
and through --models-dir, llama-server's unix socket --host, and the prompt read from stdin with ``-f -``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.unit.test_cli import assert_ok, flat, invoke
from tests.unit.test_serve_models42 import ask, serve_in_process

pytest.importorskip("torch")


def _served_ids(args: list[str]) -> list[str]:
    return serve_in_process(args, lambda port: [card["id"] for card in ask(port, "GET", "/v1/models")[1]["data"]])


def test_a_bundle_given_and_also_in_models_dir_is_served_once(tiny_bundle, tmp_path):
    """``serve DIR/one --models-dir DIR`` (the bundle to load first, then the rest of DIR, as --models-dir's help
    offers) was refused as two bundles served under one name, with a fix (--alias NAME=DIR/one) that was refused
    too; the same bundle through a symlink, or given twice, is one model as well."""
    folder = tmp_path / "models"
    folder.mkdir()
    one = shutil.copytree(tiny_bundle.path, folder / "one")
    assert _served_ids([str(one), "--models-dir", str(folder)]) == ["tiny-llama-host"]
    os.symlink(one, tmp_path / "link")
    assert _served_ids([str(one), str(tmp_path / "link"), str(one)]) == ["tiny-llama-host"]


def test_a_bundle_given_first_is_loaded_first_beside_the_others_of_models_dir(tiny_bundle, tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copytree(tiny_bundle.path, folder / "a")
    two = shutil.copytree(tiny_bundle.path, folder / "two")
    assert _served_ids([str(two), "--models-dir", str(folder), "--alias", "second=two"]) == \
        ["second", "a"]


@pytest.mark.parametrize("host", ["/run/llama/server.sock", "llama.sock", "./here/sock"])
def test_a_unix_socket_host_is_refused_by_name_before_the_model_loads(tiny_bundle, tmp_path, host):
    """llama-server listens on a unix socket for a --host ending in .sock (tools/server/server-http.cpp); this server
    listens on TCP only. Such a host was looked up as a host name once the model had loaded: "Name or service not
    known", and a fix to pass an address, with no word of sockets."""
    broken = shutil.copytree(tiny_bundle.path, tmp_path / "b")
    (broken / "manifest.json").write_text("{")  # the bundle must not even be read: the host is refused first
    result = invoke("serve", broken, "--host", host, "--port", "0")
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--host':" in result.stderr
    said = flat(result.stderr)
    assert f"'{host}' is a unix socket path (llama-server listens on one for a --host ending in .sock); edgesdk " \
           "serve listens on TCP only: pass an address of this machine (127.0.0.1; 0.0.0.0 or :: for every " \
           "interface) and a --port" in said


def test_file_dash_reads_the_prompt_from_stdin_as_dev_stdin_does(tiny_bundle, tmp_path):
    """``-f -``: the prompt is stdin, whole (its last line end dropped, escapes read, as -f's file); it was refused as
    '-' "is not a file (nothing exists at that path)", with no word of stdin."""
    text = "The quick\\tbrown\r\nfox\n"
    (tmp_path / "prompt.txt").write_bytes(text.encode())
    from_file = invoke("run", tiny_bundle.path, "-f", tmp_path / "prompt.txt", "--raw", "-n", "6", "--stats")
    assert_ok(from_file)
    from_stdin = invoke("run", tiny_bundle.path, "-f", "-", "--raw", "-n", "6", "--stats", input=text.encode())
    assert_ok(from_stdin)
    assert from_stdin.stdout == from_file.stdout
    prompt_size = from_file.stderr.split("] prompt ")[1].split(" tok")[0]
    assert from_stdin.stderr.split("] prompt ")[1].split(" tok")[0] == prompt_size
    as_prompt = invoke("run", tiny_bundle.path, "-p", "The quick\\tbrown\nfox", "--raw", "-n", "6")
    assert_ok(as_prompt)
    assert from_stdin.stdout == as_prompt.stdout


def test_file_dash_as_a_pipe_in_a_real_process(tiny_bundle):
    """The console script's own stdin, as ``echo ... | edgesdk run BUNDLE -f -`` gives it."""
    env = {**os.environ, "EDGESDK_HUGE_PAGES": "0"}
    piped = subprocess.run([sys.executable, "-m", "edgesdk.cli", "run", str(tiny_bundle.path), "-f", "-", "--raw",
                            "-n", "4"], input=b"The quick\n", capture_output=True, env=env, timeout=120)
    assert piped.returncode == 0, piped.stderr.decode()
    typed = invoke("run", tiny_bundle.path, "-p", "The quick", "--raw", "-n", "4")
    assert_ok(typed)
    assert piped.stdout.decode() == typed.stdout


def test_file_dash_that_is_not_utf8_is_refused_with_the_fix(tiny_bundle):
    result = invoke("run", tiny_bundle.path, "-f", "-", "--raw", "-n", "4", input=b"caf\xe9 au lait\n")
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert "error: --file - (stdin) is not UTF-8 text (invalid continuation byte at byte 3)" in result.stderr
    assert "fix: convert it first, e.g. ... | iconv -f latin1 -t utf-8 | edgesdk run BUNDLE -f -" in result.stderr
    assert result.stdout == ""
