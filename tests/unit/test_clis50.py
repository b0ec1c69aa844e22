"""``edgesdk serve`` (and ``run``) read llama.cpp's environment variables for their options, as llama-server and
llama-cli do (common/arg.cpp: each option's ``set_env``, read where the command line lacks the option; the command
line wins; flags read ``is_truthy`` / ``is_falsey``'s words): a Docker image or systemd unit configured through
LLAMA_ARG_* alone got the defaults, silently."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from edgesdk.cli_llama import LlamaEnvOption, unread_llama_env
from tests.unit.test_cli import invoke

pytest.importorskip("torch")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def ask(port: int, path: str, key: str | None = None) -> tuple[int, object]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request("GET", path, headers={"Authorization": f"Bearer {key}"} if key else {})
    response = connection.getresponse()
    body = response.read()
    connection.close()
    try:
        return response.status, json.loads(body)
    except ValueError:
        return response.status, body.decode()


def start_serve(args: list[str], env: dict[str, str], cwd) -> tuple[subprocess.Popen, str]:
    """``edgesdk serve ARGS`` started with ``env`` over a clean environment (no LLAMA_* of the caller's), and the
    stderr it wrote up to its start line."""
    clean = {name: value for name, value in os.environ.items() if not name.startswith(("LLAMA_", "EDGESDK_API"))}
    process = subprocess.Popen([sys.executable, "-m", "edgesdk.cli", "serve", *args, "--quiet"],
                               stderr=subprocess.PIPE, text=True, cwd=cwd,
                               env={**clean, "EDGESDK_HUGE_PAGES": "0", **env})
    lines = []
    for line in process.stderr:
        lines.append(line)
        if " on http://" in line or line.startswith(("error", "Error", "Usage")):
            break
    return process, "".join(lines)


def stop(process: subprocess.Popen) -> str:
    process.terminate()
    return process.communicate(timeout=60)[1]


def test_serve_is_configured_by_llama_server_s_environment_alone(tiny_bundle, tmp_path):
    """The Docker / systemd way: no argument at all, every setting from LLAMA_ARG_* (and LLAMA_API_KEY)."""
    port = free_port()
    process, started = start_serve([], {
        "LLAMA_ARG_MODEL": str(tiny_bundle.path), "LLAMA_ARG_HOST": "127.0.0.1", "LLAMA_ARG_PORT": str(port),
        "LLAMA_ARG_ALIAS": "edge model", "LLAMA_ARG_N_PREDICT": "7", "LLAMA_ARG_TOP_K": "5",
        "LLAMA_ARG_THREADS": "1", "LLAMA_ARG_ENDPOINT_METRICS": "enabled", "LLAMA_API_KEY": "k1",
        "LLAMA_ARG_CACHE_PROMPT": "false", "LLAMA_ARG_CTX_SIZE": "0", "LLAMA_ARG_UBATCH": "512"}, tmp_path)
    try:
        assert f"edge model on http://127.0.0.1:{port}/v1" in started, started
        assert "API key required" in started
        # -ub's variable is said as -ub is (accepted, changing nothing), not ignored silently; LLAMA_ARG_CTX_SIZE is
        # checked as -c is (0: the bundle's context), not listed
        assert "LLAMA_ARG_UBATCH (llama.cpp's --ubatch-size) is accepted" in started, started
        assert "not read" not in started, started
        assert "LLAMA_ARG_CTX_SIZE" not in started, started
        assert ask(port, "/props")[0] == 401  # /v1/models is public, as llama-server's
        status, models = ask(port, "/v1/models", key="k1")
        assert status == 200
        assert [card["id"] for card in models["data"]] == ["edge model"]  # one name, not split at the space
        status, props = ask(port, "/props", key="k1")
        params = props["default_generation_settings"]["params"]
        assert (params["n_predict"], params["top_k"], params["cache_prompt"]) == (7, 5, False)
        assert ask(port, "/metrics", key="k1")[0] == 200
    finally:
        stop(process)


def test_the_command_line_goes_over_the_environment(tiny_bundle, tmp_path):
    port, other = free_port(), free_port()
    process, started = start_serve(
        [str(tiny_bundle.path), "--port", str(port), "--alias", "from-cli", "-n", "3", "--threads", "1"],
        {"LLAMA_ARG_PORT": str(other), "LLAMA_ARG_ALIAS": "from-env", "LLAMA_ARG_N_PREDICT": "9",
         "LLAMA_ARG_MODEL": str(tmp_path / "absent"), "LLAMA_ARG_NO_CONTEXT_SHIFT": "1"}, tmp_path)
    try:
        assert f"from-cli on http://127.0.0.1:{port}/v1" in started, started
        # as llama.cpp warns: "environment variable is set, but will be overwritten by command line argument"
        assert "LLAMA_ARG_PORT is set, but --port on the command line goes over it" in started
        assert "LLAMA_ARG_MODEL is set, but the BUNDLE on the command line goes over it" in started
        props = ask(port, "/props")[1]
        assert props["default_generation_settings"]["params"]["n_predict"] == 3
    finally:
        stop(process)


def test_edgesdk_api_key_is_preferred_over_llama_api_key(tiny_bundle, tmp_path):
    port = free_port()
    process, started = start_serve([str(tiny_bundle.path), "--threads", "1"], {
        "LLAMA_ARG_PORT": str(port), "EDGESDK_API_KEY": "ours", "LLAMA_API_KEY": "theirs"}, tmp_path)
    try:
        assert "API key required" in started, started
        assert ask(port, "/props", key="ours")[0] == 200
        assert ask(port, "/props", key="theirs")[0] == 401
    finally:
        stop(process)


@pytest.mark.parametrize(("name", "value", "said"), [
    ("LLAMA_ARG_PORT", "http", "LLAMA_ARG_PORT='http'"),
    ("LLAMA_ARG_THINK_BUDGET", "512", "LLAMA_ARG_THINK_BUDGET='512'"),
    ("LLAMA_ARG_POOLING", "rank", "LLAMA_ARG_POOLING='rank'"),
    ("LLAMA_ARG_ENDPOINT_METRICS", "yes", "LLAMA_ARG_ENDPOINT_METRICS='yes' is neither on nor off"),
    ("LLAMA_ARG_CONTEXT_SHIFT", "maybe", "LLAMA_ARG_CONTEXT_SHIFT='maybe' is neither on nor off"),
    ("LLAMA_ARG_CHAT_TEMPLATE_KWARGS", "{enable_thinking: false}", "LLAMA_ARG_CHAT_TEMPLATE_KWARGS="),
])
def test_a_bad_value_in_the_environment_is_refused_naming_the_variable(tiny_bundle, name, value, said):
    """Refused before the model loads (exit 2); a serve that took the value (or ignored it) would load the model and
    then fail at the bind, on an address no machine has."""
    result = invoke("serve", tiny_bundle.path, "--host", "256.0.0.1", "--threads", 1, env={name: value})
    assert result.exit_code == 2, result.output
    assert said in result.stderr, result.stderr
    assert "Traceback" not in result.output


def flag_command():
    """A real click command with llama.cpp's flag variables, as serve declares them."""
    @click.command()
    @click.option("--context-shift/--no-context-shift", default=False, cls=LlamaEnvOption,
                  envvar="LLAMA_ARG_CONTEXT_SHIFT", negated_env="LLAMA_ARG_NO_CONTEXT_SHIFT")
    @click.option("--no-prompt-cache", is_flag=True, cls=LlamaEnvOption, envvar="LLAMA_ARG_CACHE_PROMPT",
                  negated_env="LLAMA_ARG_NO_CACHE_PROMPT", env_inverts=True)
    def command(context_shift, no_prompt_cache):
        click.echo(f"{context_shift} {no_prompt_cache}")
    return command


@pytest.mark.parametrize(("env", "shown"), [
    ({}, "False False"),
    *(({"LLAMA_ARG_CONTEXT_SHIFT": word}, "True False") for word in ("true", "1", "on", "enabled", "ON")),
    *(({"LLAMA_ARG_CONTEXT_SHIFT": word}, "False False") for word in ("false", "0", "off", "disabled")),
    ({"LLAMA_ARG_CONTEXT_SHIFT": "on", "LLAMA_ARG_NO_CONTEXT_SHIFT": "1"}, "False False"),  # NO_ read first
    ({"LLAMA_ARG_CACHE_PROMPT": "disabled"}, "False True"),
    ({"LLAMA_ARG_CACHE_PROMPT": "enabled"}, "False False"),
    ({"LLAMA_ARG_NO_CACHE_PROMPT": "1"}, "False True"),
])
def test_flags_read_llama_cpp_s_words(env, shown):
    result = CliRunner().invoke(flag_command(), [], env=env)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == shown


def test_llama_variables_serve_does_not_read_are_listed(monkeypatch):
    from edgesdk.cli_serve import MODEL_ENV, serve

    monkeypatch.setenv("LLAMA_ARG_UBATCH", "512")
    monkeypatch.setenv("LLAMA_ARG_PORT", "8081")
    monkeypatch.setenv("LLAMA_CHAT_TEMPLATE_KWARGS", "{}")
    monkeypatch.setenv("LLAMA_ARG_MODEL", "x")
    unread = unread_llama_env(serve, MODEL_ENV)
    assert "LLAMA_ARG_UBATCH" in unread
    assert not {"LLAMA_ARG_PORT", "LLAMA_CHAT_TEMPLATE_KWARGS", "LLAMA_ARG_MODEL"} & set(unread)


def test_run_reads_llama_cli_s_environment(tiny_bundle):
    """llama.cpp applies the variables to every tool, llama-cli included: the bundle (-m), -n and -t from them."""
    result = invoke("run", "-p", "Once", "--ignore-eos", "--stats",
                    env={"LLAMA_ARG_MODEL": str(tiny_bundle.path), "LLAMA_ARG_N_PREDICT": "3", "LLAMA_ARG_THREADS": "1"})
    assert result.exit_code == 0, result.output
    assert "3 new tok," in result.stderr, result.stderr
    result = invoke("run", tiny_bundle.path, "-p", "Once", "--ignore-eos", "--stats", "-n", "2", "-t", "1",
                    env={"LLAMA_ARG_N_PREDICT": "3"})
    assert result.exit_code == 0, result.output
    assert "2 new tok," in result.stderr, result.stderr
    assert "LLAMA_ARG_N_PREDICT is set, but --max-new-tokens on the command line goes over it" in result.stderr


def test_run_refuses_a_bad_value_naming_the_variable(tiny_bundle):
    result = invoke("run", tiny_bundle.path, "-p", "Once", "-t", "1", env={"LLAMA_ARG_TEMPERATURE": "warm"})
    assert result.exit_code == 2, result.output
    assert "LLAMA_ARG_TEMPERATURE='warm'" in result.stderr, result.stderr
