"""run --ignore-eos / -f FILE and serve's ignore_eos (llama.cpp's --ignore-eos, -f; llama-server's ignore_eos)."""

from __future__ import annotations

import re

import pytest

from tests.unit.test_cli import assert_ok, invoke


@pytest.fixture(scope="module")
def runtime(tiny_bundle):
    from edgesdk.runtime.session import open_runtime

    return open_runtime(tiny_bundle.path, threads=1)


def _stats(stderr: str) -> tuple[int, str]:
    found = re.search(r"(\d+) new tok, .* stop: (\w+)", stderr)
    assert found, stderr
    return int(found.group(1)), found.group(2)


def test_run_ignore_eos_generates_every_token_even_where_end_of_text_is_forced(tiny_bundle, runtime):
    eos = min(runtime.tokenizer.eos_token_ids)
    forced = ("--logit-bias", f"{eos}=100")  # end of text at once, unless it is never taken
    args = ("run", tiny_bundle.path, "--prompt", "hello", "-n", 12, "--threads", 1, "--stats", *forced)
    result = invoke(*args)
    assert_ok(result)
    assert _stats(result.stderr) == (0, "eos")
    result = invoke(*args, "--ignore-eos")
    assert_ok(result)
    assert _stats(result.stderr) == (12, "max_new_tokens")


def test_run_reads_the_prompt_from_a_file(tiny_bundle, tmp_path):
    text = "first line\nsecond line ü\n"
    path = tmp_path / "prompt.txt"
    path.write_text(text, encoding="utf-8")
    from_file = invoke("run", tiny_bundle.path, "-f", path, "--raw", "-n", 8, "--threads", 1)
    # llama-cli's -f drops the file's last newline (common/arg.cpp), and so does run
    given = invoke("run", tiny_bundle.path, "--prompt", text[:-1], "--raw", "-n", 8, "--threads", 1)
    assert_ok(from_file)
    assert from_file.stdout == given.stdout
    for args, message in ((["-f", path, "--prompt", "x"], "pass one"), (["-f", tmp_path / "none.txt"], "is not a file")):
        result = invoke("run", tiny_bundle.path, *args)
        assert result.exit_code == 2, result.output
        assert message in result.output
    path.write_bytes(b"caf\xe9")
    result = invoke("run", tiny_bundle.path, "-f", path)
    assert result.exit_code != 0
    assert "not UTF-8" in result.output


def test_serve_ignore_eos(runtime):
    from edgesdk.serve.completion import ServeDefaults
    from tests.unit.test_serve import Served

    eos = min(runtime.tokenizer.eos_token_ids)
    server = Served(runtime, ServeDefaults(max_tokens=10))
    try:
        body = {"prompt": "hello", "logit_bias": {str(eos): 100}}
        status, answer = server.post("/v1/completions", body)
        assert status == 200, answer
        # the end-of-text token is the one token sampled, counted as llama-server's n_decoded counts it
        assert (answer["choices"][0]["finish_reason"], answer["usage"]["completion_tokens"]) == ("stop", 1)
        status, answer = server.post("/v1/completions", {**body, "ignore_eos": True})
        assert status == 200, answer
        assert (answer["choices"][0]["finish_reason"], answer["usage"]["completion_tokens"]) == ("length", 10)
        status, answer = server.post("/v1/completions", {**body, "ignore_eos": "yes"})
        assert (status, answer["error"]["param"]) == (400, "ignore_eos")
    finally:
        server.close()
