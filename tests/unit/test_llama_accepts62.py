"""llama.cpp options run refused without reason: ``-n 0`` (the prompt evaluated, nothing generated: llama-cli's way
to write only the prompt's --prompt-cache), ``--verbose-prompt`` (the prompt's tokens on stderr) and ``-lv N`` /
``--log-verbosity N`` (taken with a note, as -v and --log-disable are)."""

from __future__ import annotations

import re

import pytest

from tests.unit.test_cli import assert_ok, invoke

pytest.importorskip("torch")


def run(bundle, *args, input=None):
    return invoke("run", bundle.path, "--threads", 1, *args, input=input)


def _stats(stderr: str) -> dict[str, str]:
    line = next(line for line in stderr.splitlines() if "] prompt " in line)
    return {"prompt": re.search(r"prompt (\d+) tok", line).group(1),
            "cached": (re.search(r"\((\d+) from the cache\)", line) or [None, "0"])[1],
            "new": re.search(r"(\d+) new tok", line).group(1), "stop": re.search(r"stop: (\w+)", line).group(1)}


# --- -n 0 ---------------------------------------------------------------------------------------------------------


def test_n_zero_prefills_the_prompt_and_prints_no_answer(tiny_bundle):
    result = run(tiny_bundle, "-p", "The capital of France", "-n", 0, "--stats")
    assert_ok(result)
    assert result.stdout == ""
    stats = _stats(result.stderr)
    assert int(stats["prompt"]) > 1
    assert (stats["new"], stats["stop"]) == ("0", "max_new_tokens")


@pytest.mark.parametrize("mode", [(), ("--prompt-cache-all",)], ids=["prompt", "all"])
def test_n_zero_writes_the_prompt_cache_a_later_run_starts_from(tiny_bundle, tmp_path, mode):
    cache = tmp_path / "prompt.cache"
    prompt = "The capital of France is a city on the Seine"
    written = run(tiny_bundle, "-p", prompt, "-n", 0, "--prompt-cache", cache, *mode)
    assert_ok(written)
    assert written.stdout == ""
    assert cache.is_file()
    later = run(tiny_bundle, "-p", prompt, "-n", 4, "--temp", 0, "--prompt-cache", cache, "--stats")
    assert_ok(later)
    stats = _stats(later.stderr)
    assert int(stats["cached"]) == int(stats["prompt"]) - 1  # all but the last token, which gives the logits
    alone = run(tiny_bundle, "-p", prompt, "-n", 4, "--temp", 0)
    assert later.stdout == alone.stdout  # the cache holds the prompt alone, nothing generated after it


def test_n_zero_with_json_prints_nothing(tiny_bundle):
    result = run(tiny_bundle, "-p", "hi", "-n", 0, "--json")
    assert_ok(result)
    assert result.stdout == ""


def test_n_zero_from_the_environment_is_taken_too(tiny_bundle):
    result = invoke("run", tiny_bundle.path, "--threads", 1, "-p", "hi", env={"LLAMA_ARG_N_PREDICT": "0"})
    assert_ok(result)
    assert result.stdout == ""


@pytest.mark.parametrize("args", [(), ("-p", "hi", "-cnv"), ("-p", "hi", "-i")], ids=["stdin", "cnv", "i"])
def test_n_zero_where_prompts_come_from_stdin_is_refused_with_why(tiny_bundle, args):
    result = run(tiny_bundle, *args, "-n", 0, input="hello\n")
    assert result.exit_code == 2, result.output
    said = " ".join(result.stderr.split())
    assert "'--max-new-tokens' / '-n'" in said
    assert "prefills a prompt and generates nothing" in said
    assert "-f FILE (without -i / -cnv) for -n 0" in said
    assert result.stdout == ""


def test_serve_n_zero_is_refused_with_what_llama_server_makes_of_it():
    result = invoke("serve", "no-such-bundle", "-n", "0")
    assert result.exit_code == 2
    said = " ".join(result.output.split())
    assert "llama-server takes as its requests' default of no tokens generated" in said
    assert "below 0" in said


# --- --verbose-prompt ---------------------------------------------------------------------------------------------


def test_verbose_prompt_prints_the_templated_prompts_tokens_on_stderr(tiny_bundle):
    from edgesdk.runtime.session import open_runtime
    from edgesdk.runtime.text import pieces_text

    tokenizer = open_runtime(tiny_bundle.path, threads=1).tokenizer
    ids = tokenizer.prompt_ids("hi there", raw=False)
    result = run(tiny_bundle, "-p", "hi there", "-n", 2, "--temp", 0, "--verbose-prompt")
    assert_ok(result)
    assert f"edgesdk: number of tokens in prompt = {len(ids)}" in result.stderr
    # each piece as it is, a newline's too, as llama-cli prints them (``%6d -> '%s'``)
    listed = "\n".join(f"{token:6d} -> '{pieces_text(tokenizer, [token])}'" for token in ids)
    assert f"= {len(ids)}\n{listed}\n" in result.stderr
    assert "->" not in result.stdout
    plain = run(tiny_bundle, "-p", "hi there", "-n", 2, "--temp", 0)
    assert result.stdout == plain.stdout


def test_verbose_prompt_with_raw_lists_the_prompt_as_it_is(tiny_bundle):
    templated = run(tiny_bundle, "-p", "hi", "-n", 0, "--verbose-prompt")
    raw = run(tiny_bundle, "-p", "hi", "-n", 0, "--verbose-prompt", "--raw")
    assert_ok(templated)
    assert_ok(raw)
    count = [int(re.search(r"tokens in prompt = (\d+)", r.stderr).group(1)) for r in (templated, raw)]
    assert count[0] > count[1]  # the chat template's tokens are listed where it renders the prompt


def test_verbose_prompt_stays_refused_by_commands_that_do_not_print_it():
    result = invoke("serve", "no-such-bundle", "--verbose-prompt")
    assert result.exit_code == 2
    said = " ".join(result.output.split())
    assert "--verbose-prompt is llama.cpp's --verbose-prompt, which edgesdk serve does not have" in said
    assert "'edgesdk run --verbose-prompt'" in said


# --- -lv / --log-verbosity ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [("-lv", "3"), ("--log-verbosity", "5"), ("--verbosity=0",)])
def test_log_verbosity_is_taken_with_a_note(tiny_bundle, args):
    result = run(tiny_bundle, "-p", "hi", "-n", 1, *args)
    assert_ok(result)
    name = args[0].split("=")[0]
    assert f"edgesdk: {name} is accepted for llama.cpp's scripts and changes nothing here: edgesdk writes no " \
           "llama.cpp log" in result.stderr


def test_log_verbosity_that_is_no_number_is_refused_by_name(tiny_bundle):
    result = run(tiny_bundle, "-p", "hi", "-n", 1, "-lv", "loud")
    assert result.exit_code == 2
    said = " ".join(result.stderr.split())
    assert "'loud' is not a whole number, which llama.cpp's -lv takes" in said
