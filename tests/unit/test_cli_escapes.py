"""llama.cpp's -e/--escape (on by default) and --no-escape: the prompt of ``run`` (-p or -f) and the text of
``embed`` have \\n, \\t, \\xHH ... processed, as common/arg.cpp processes ``params.prompt``."""

from __future__ import annotations

import json

import pytest

from tests.unit.test_cli import assert_ok, invoke
from tests.unit.test_cli_run_interactive37 import _stats_prompts


def _prompt_size(bundle, *options) -> int:
    result = invoke("run", bundle, "--raw", "-n", "1", "--stats", *options)
    assert_ok(result)
    return _stats_prompts(result.output)[0]


def test_run_reads_the_prompts_escapes_as_llama_cli_unless_no_escape(tiny_bundle, runtime, tmp_path):
    tokens = lambda text: len(runtime.tokenizer.prompt_ids(text, raw=True))  # noqa: E731
    assert tokens("one\ntwo\tthree") != tokens("one\\ntwo\\tthree")  # the test tells them apart
    assert _prompt_size(tiny_bundle.path, "-p", "one\\ntwo\\tthree") == tokens("one\ntwo\tthree")
    assert _prompt_size(tiny_bundle.path, "-p", "one\\ntwo\\tthree", "--no-escape") == tokens("one\\ntwo\\tthree")
    text = tmp_path / "prompt.txt"
    text.write_text("one\\ntwo\\tthree", encoding="utf-8")
    assert _prompt_size(tiny_bundle.path, "-f", text) == tokens("one\ntwo\tthree")
    assert _prompt_size(tiny_bundle.path, "-f", text, "--no-escape") == tokens("one\\ntwo\\tthree")


def test_run_refuses_escapes_that_give_no_utf8_naming_the_option(tiny_bundle):
    result = invoke("run", tiny_bundle.path, "--raw", "-n", "1", "-p", "caf\\xc3")
    assert result.exit_code == 2
    assert "'--prompt' / '-p'" in result.output
    assert "not UTF-8 once its escapes are processed" in " ".join(result.output.split())


@pytest.mark.parametrize(("options", "inputs"), [((), 2), (("--no-escape",), 1), (("-e",), 2)])
def test_embed_splits_the_text_after_its_escapes_are_processed(tiny_bundle, tmp_path, options, inputs):
    """llama-embedding -p 'a cat\\na dog' embeds two inputs: the escape becomes the newline it splits at."""
    result = invoke("embed", tiny_bundle.path, "-p", "a cat\\na dog", "--embd-output-format", "json", *options)
    assert_ok(result)
    assert len(json.loads(result.stdout)["data"]) == inputs
    text = tmp_path / "passages.txt"
    text.write_text("a cat\\na dog\n", encoding="utf-8")
    result = invoke("embed", tiny_bundle.path, "-f", text, "--embd-output-format", "json", *options)
    assert_ok(result)
    assert len(json.loads(result.stdout)["data"]) == inputs
