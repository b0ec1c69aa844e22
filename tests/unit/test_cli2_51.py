"""run's --in-prefix-bos (llama-cli's), -m for embed and eval (llama-embedding's and llama-perplexity's model
option), eval's -c beside an accuracy task (llama-perplexity's n_ctx for the tasks), and run -f / /read keeping a
CRLF file's CR (llama-cli reads the file's bytes as they are)."""

from __future__ import annotations

import json

import pytest

from tests.unit.test_accuracy_files39 import HELLASWAG_TEXT
from tests.unit.test_cli import flat, invoke


def _stats_prompt_tokens(stderr: str) -> int:
    return int(stderr.split("] prompt ")[1].split(" tok")[0])


# --- 1. --in-prefix-bos -------------------------------------------------------------------------------------------


def test_in_prefix_bos_puts_the_vocabularys_bos_before_each_typed_line(tiny_bundle):
    """llama-cli's --in-prefix-bos pushes llama_vocab_bos before each interactive input; it was "No such option".
    The tiny tokenizer adds no BOS (as SmolLM2's), so the line gets one token more, and that token is the BOS."""
    from edgesdk.cli_interactive import TypedPrompt, typed_prompt_ids
    from edgesdk.runtime.session import open_runtime

    plain = invoke("run", tiny_bundle.path, "--raw", "-n", "2", "--stats", input="hello\n")
    assert plain.exit_code == 0, plain.output
    with_bos = invoke("run", tiny_bundle.path, "--raw", "-n", "2", "--stats", "--in-prefix-bos", input="hello\n")
    assert with_bos.exit_code == 0, with_bos.output
    assert _stats_prompt_tokens(with_bos.stderr) == _stats_prompt_tokens(plain.stderr) + 1

    tokenizer = open_runtime(tiny_bundle.path, threads=1).tokenizer
    assert tokenizer.added_bos() is None
    bos = tokenizer.token_id(tokenizer.bos_token)
    prompt = TypedPrompt("Q: ", (), "hello", "")
    assert typed_prompt_ids(tokenizer, prompt, bos=bos) == [bos, *typed_prompt_ids(tokenizer, prompt)]


def test_in_prefix_bos_with_the_chat_template_is_refused_with_the_fix(tiny_bundle):
    result = invoke("run", tiny_bundle.path, "-n", "2", "--in-prefix-bos", input="hello\n")
    assert result.exit_code == 2, result.output
    said = flat(result.stderr)
    assert "'--in-prefix-bos'" in said
    assert "pass --raw (or -no-cnv) with it" in said


def test_in_prefix_bos_with_a_prompt_answered_alone_is_said_unused(tiny_bundle):
    result = invoke("run", tiny_bundle.path, "-p", "hello", "-n", "2", "--in-prefix-bos")
    assert result.exit_code == 0, result.output
    assert "--in-prefix-bos is not used" in flat(result.stderr)


# --- 2. -m for embed and eval ------------------------------------------------------------------------------------


def test_embed_takes_the_bundle_as_dash_m(tiny_bundle):
    by_argument = invoke("embed", tiny_bundle.path, "-p", "hello", "--embd-output-format", "raw")
    assert by_argument.exit_code == 0, by_argument.output
    by_m = invoke("embed", "-m", tiny_bundle.path, "-p", "hello", "--embd-output-format", "raw")
    assert by_m.exit_code == 0, by_m.output
    assert by_m.stdout == by_argument.stdout
    both = invoke("embed", tiny_bundle.path, "--model", tiny_bundle.path, "-p", "hello")
    assert both.exit_code == 0, both.output


def test_embed_and_eval_refuse_a_bundle_and_another_dash_m(tmp_path):
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    text = tmp_path / "t.txt"
    text.write_text("hello\n")
    for args in (("embed", tmp_path / "one", "-m", tmp_path / "two", "-p", "x"),
                 ("eval", tmp_path / "one", "-m", tmp_path / "two", "-f", text)):
        result = invoke(*args)
        assert result.exit_code == 2, result.output
        said = flat(result.stderr)
        assert "'--model' / '-m'" in said
        assert "give the bundle once, as BUNDLE or as -m BUNDLE" in said


def test_embed_and_eval_without_a_bundle_name_dash_m(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("hello\n")
    for args, tool in ((("embed", "-p", "x"), "llama-embedding"), (("eval", "-f", text), "llama-perplexity")):
        result = invoke(*args, env={"LLAMA_ARG_MODEL": ""})
        assert result.exit_code == 2, result.output
        said = flat(result.stderr)
        assert "Missing argument 'BUNDLE'" in said
        assert f"as {tool} names its model" in said


def test_eval_takes_the_bundle_as_dash_m(tiny_bundle, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text(" ".join(["The quick brown fox jumps over the lazy dog."] * 30) + "\n")
    by_argument = invoke("eval", tiny_bundle.path, "-f", text, "--context", "32", "--json", "-t", "1")
    assert by_argument.exit_code == 0, by_argument.output
    by_m = invoke("eval", "-m", tiny_bundle.path, "-f", text, "--context", "32", "--json", "-t", "1")
    assert by_m.exit_code == 0, by_m.output
    assert json.loads(by_m.stdout) == json.loads(by_argument.stdout)


def test_dash_m_over_llama_arg_model_is_said(tiny_bundle):
    result = invoke("embed", "-m", tiny_bundle.path, "-p", "hello", "--embd-output-format", "raw",
                    env={"LLAMA_ARG_MODEL": "/no/such/bundle"})
    assert result.exit_code == 0, result.output
    assert "LLAMA_ARG_MODEL is set, but -m on the command line goes over it" in result.stderr


# --- 3. eval -c beside an accuracy task --------------------------------------------------------------------------


@pytest.fixture
def hellaswag(tmp_path):
    path = tmp_path / "hellaswag.txt"
    path.write_text(HELLASWAG_TEXT, encoding="utf-8")
    return path


def test_eval_task_takes_c_as_llama_perplexity_does(tiny_bundle, hellaswag):
    """llama-perplexity --hellaswag -c N scores the tasks in a context of N tokens; -c was refused as a
    perplexity-only option. The bundle's context (or 0) scores as without -c."""
    plain = invoke("eval", tiny_bundle.path, "--hellaswag", "-f", hellaswag, "--json", "-t", "1")
    assert plain.exit_code == 0, plain.output
    for size in ("0", "256"):
        with_c = invoke("eval", tiny_bundle.path, "--hellaswag", "-c", size, "-f", hellaswag, "--json", "-t", "1")
        assert with_c.exit_code == 0, with_c.output
        assert json.loads(with_c.stdout) == json.loads(plain.stdout)


def test_eval_task_longer_than_c_is_refused_naming_c(tiny_bundle, hellaswag):
    """A task longer than -c stops llama-perplexity ("task %zu does not fit in the context window")."""
    result = invoke("eval", tiny_bundle.path, "--hellaswag", "-c", "4", "-f", hellaswag, "-t", "1")
    assert result.exit_code == 1, result.output
    said = flat(result.stderr)
    assert "more than --context 4 (llama-perplexity's -c) lets a task have" in said
    assert "pass a larger --context (the bundle takes up to 256; 0: all of it)" in said


def test_eval_task_c_past_the_bundles_context_is_refused(tiny_bundle, hellaswag):
    result = invoke("eval", tiny_bundle.path, "--hellaswag", "-c", "4096", "-f", hellaswag, "-t", "1")
    assert result.exit_code == 2, result.output
    said = flat(result.stderr)
    assert "4096 is longer than the bundle's max_context 256" in said
    assert "pass --context 256 or less" in said


# --- 4. run -f and /read keep a CRLF file's CR --------------------------------------------------------------------


def test_run_file_keeps_crlf_as_llama_cli_reads_it(tmp_path):
    """llama-cli's -f (common/arg.cpp read_file) and -sysf read the file's bytes, CR included; run turned CRLF into
    LF (Python's text mode). -f - reads stdin likewise."""
    from edgesdk.cli_run import _one_prompt, _system_message

    path = tmp_path / "prompt.txt"
    path.write_bytes(b"one\r\ntwo\rthree\r\n")
    assert _one_prompt(None, path, escape=False) == "one\r\ntwo\rthree\r"
    assert _one_prompt(None, path, escape=True) == "one\r\ntwo\rthree\r"
    assert _system_message(None, path) == "one\r\ntwo\rthree\r"


def test_run_file_dash_keeps_crlf(tiny_bundle, tmp_path):
    path = tmp_path / "prompt.txt"
    path.write_bytes(b"The quick\r\nbrown fox\r\n")
    from_file = invoke("run", tiny_bundle.path, "-f", path, "--raw", "-n", "4", "--stats")
    assert from_file.exit_code == 0, from_file.output
    from_stdin = invoke("run", tiny_bundle.path, "-f", "-", "--raw", "-n", "4", "--stats",
                        input=b"The quick\r\nbrown fox\r\n")
    assert from_stdin.exit_code == 0, from_stdin.output
    as_prompt = invoke("run", tiny_bundle.path, "-p", "The quick\\r\\nbrown fox\\r", "--raw", "-n", "4", "--stats")
    assert as_prompt.exit_code == 0, as_prompt.output
    sizes = {_stats_prompt_tokens(result.stderr) for result in (from_file, from_stdin, as_prompt)}
    assert len(sizes) == 1, sizes
    assert from_file.stdout == from_stdin.stdout == as_prompt.stdout


def test_read_command_keeps_crlf_as_llama_cli_reads_it(tmp_path):
    """llama-cli's /read (tools/cli/cli.cpp load_input_file: std::ios::binary) keeps the CR."""
    from edgesdk.cli_interactive import read_for_prompt

    path = tmp_path / "notes.txt"
    path.write_bytes(b"a\r\nb\r\n")
    assert read_for_prompt(str(path)).endswith("---\na\r\nb\r\n")


def test_file_not_utf8_is_still_refused_by_name(tmp_path):
    from edgesdk.cli_interactive import read_utf8_as_is
    from edgesdk.errors import EdgeSDKError

    path = tmp_path / "latin.txt"
    path.write_bytes(b"caf\xe9\r\n")
    with pytest.raises(EdgeSDKError) as raised:
        read_utf8_as_is(path, "--file")
    assert "is not UTF-8 text" in raised.value.problem
    assert "iconv" in raised.value.fix
