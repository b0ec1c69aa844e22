"""llama-cli / llama-server options typed out of habit (common/arg.cpp spells them): the conversation flags (-cnv,
-no-cnv, -st, -i, -if) and -m work as run's own options; the options that change nothing here (-ngl, -fa, --jinja,
--mlock, --no-mmap, --no-warmup, --color, -np 1, -cb, -ctk/-ctv f16, -c 0) are accepted and said so; the others are
refused by their own name. None is read as another option's value any more: click read ``-ngl 99`` as ``-n gl``,
``-no-cnv`` as ``-n o-cnv``, ``-st`` as ``-s t``, ``-np 1`` as ``-n p``."""

from __future__ import annotations

import re

import pytest

from tests.unit.test_cli import assert_ok, invoke

pytest.importorskip("torch")


def stats_lines(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if re.match(r"\[[\w-]+\] prompt \d+ tok", line)]


def prompt_tokens(result) -> int:
    lines = stats_lines(result)
    assert len(lines) == 1, result.stderr
    return int(re.search(r"prompt (\d+) tok", lines[0]).group(1))


def run(bundle, *args, input=None):
    return invoke("run", bundle.path, "-n", 1, "--threads", 1, *args, input=input)


# --- the conversation flags -------------------------------------------------------------------------------------


def test_cnv_answers_the_prompt_then_goes_on_with_the_conversation(tiny_bundle):
    result = run(tiny_bundle, "-p", "hi", "-cnv", "--stats", input="again\n")
    assert_ok(result)
    first, second = (int(re.search(r"prompt (\d+) tok", line).group(1)) for line in stats_lines(result))
    assert second > first + 1  # the second prompt holds the first exchange: the history is kept


def test_conversation_long_name_works_too(tiny_bundle):
    assert_ok(run(tiny_bundle, "-p", "hi", "--conversation", input=""))


def test_no_cnv_feeds_the_prompt_as_it_is_as_raw_does(tiny_bundle):
    raw = run(tiny_bundle, "-p", "hi there", "--raw", "--stats")
    no_cnv = run(tiny_bundle, "-p", "hi there", "-no-cnv", "--stats")
    templated = run(tiny_bundle, "-p", "hi there", "--stats")
    for result in (raw, no_cnv, templated):
        assert_ok(result)
    assert prompt_tokens(no_cnv) == prompt_tokens(raw) < prompt_tokens(templated)
    assert_ok(run(tiny_bundle, "-p", "hi there", "--no-conversation"))


def test_single_turn_answers_one_prompt_from_stdin_then_exits(tiny_bundle):
    result = run(tiny_bundle, "-st", "--stats", input="one\ntwo\nthree\n")
    assert_ok(result)
    assert len(stats_lines(result)) == 1
    assert_ok(run(tiny_bundle, "--single-turn", "-p", "hi", "-cnv", input="more\n"))


def test_single_turn_with_cnv_and_a_prompt_does_not_go_on(tiny_bundle):
    result = run(tiny_bundle, "-st", "-cnv", "-p", "hi", "--stats", input="more\n")
    assert_ok(result)
    assert len(stats_lines(result)) == 1


def test_interactive_goes_on_after_the_prompt(tiny_bundle):
    result = run(tiny_bundle, "-i", "-p", "hi", "--stats", input="more\n")
    assert_ok(result)
    assert len(stats_lines(result)) == 2
    assert_ok(run(tiny_bundle, "--interactive", "-p", "hi", input=""))


def test_interactive_first_reads_stdin_and_takes_a_prompt_as_llama_cli_does(tiny_bundle):
    result = run(tiny_bundle, "-if", "--stats", input="one\n")
    assert_ok(result)
    assert len(stats_lines(result)) == 1
    assert_ok(run(tiny_bundle, "-if", "-p", "hi", input=""))  # through the chat template: -cnv -p's first turn


def test_cnv_and_raw_are_refused_together(tiny_bundle):
    result = run(tiny_bundle, "-cnv", "--raw", "-p", "hi")
    assert result.exit_code == 2
    assert "-cnv" in result.stderr
    assert "--raw" in result.stderr


def test_a_value_that_looks_like_a_llama_flag_stays_the_value(tiny_bundle):
    result = run(tiny_bundle, "-p", "-st", "--stats")
    assert_ok(result)
    assert len(stats_lines(result)) == 1


# --- options that change nothing here -----------------------------------------------------------------------------


@pytest.mark.parametrize("args", [
    ["-ngl", "99"], ["--gpu-layers", "all"], ["--n-gpu-layers", "0"], ["-fa", "on"], ["-fa"], ["--flash-attn", "auto"],
    ["--jinja"], ["--no-jinja"], ["--mlock"], ["--no-mmap"], ["--no-warmup"], ["--color"], ["-co", "off"],
    ["-np", "1"], ["-ctk", "f16", "-ctv", "f16"], ["-tb", "2"], ["-ub", "512"], ["-b", "512"],
])
def test_run_accepts_llama_options_that_change_nothing_and_says_so(tiny_bundle, args):
    result = run(tiny_bundle, "-p", "hi", *args)
    assert_ok(result)
    assert f"edgesdk: {args[0]} is accepted for llama.cpp's scripts and changes nothing here" in result.stderr


def test_the_note_comes_once_and_the_value_is_not_read_as_n(tiny_bundle):
    result = run(tiny_bundle, "-p", "hi", "-ngl", "99", "--stats", "-ngl", "99")
    assert_ok(result)
    assert result.stderr.count("-ngl is accepted") == 1
    assert ", 1 new tok," in stats_lines(result)[0]  # -n 1 kept: -ngl was not read as -n gl


@pytest.mark.parametrize("size", ["0", "256"])
def test_ctx_size_of_the_bundle_or_zero_is_accepted(tiny_bundle, size):
    assert_ok(run(tiny_bundle, "-p", "hi", "-c", size))
    assert_ok(run(tiny_bundle, "-p", "hi", "--ctx-size", size))


def test_another_ctx_size_is_refused_with_the_rebuild(tiny_bundle):
    result = run(tiny_bundle, "-p", "hi", "-c", "2048")
    assert result.exit_code == 2
    text = " ".join(result.stderr.split())
    assert "'-c' (llama.cpp's --ctx-size)" in text
    assert "256 tokens" in text
    assert "--max-context 512', the most the model's max_position_embeddings (512) allows" in text  # not 2048


@pytest.mark.parametrize(("args", "said"), [
    (["-np", "4"], "decodes one sequence at a time"),
    (["-ctk", "q8_0"], "KV cache's data type is the bundle's"),
    (["-ngl", "lots"], "not a layer count"),
    (["-c", "big"], "not a context size"),
])
def test_a_value_that_would_mislead_is_refused_naming_the_option(tiny_bundle, args, said):
    result = run(tiny_bundle, "-p", "hi", *args)
    assert result.exit_code == 2
    text = " ".join(result.stderr.split())
    assert f"'{args[0]}' (llama.cpp's" in text
    assert said in text


@pytest.mark.parametrize(("flag", "long"), [
    ("-to", "--timeout"), ("-sp", "--special"), ("-hf", "--hf-repo"), ("-ctxcp", "--ctx-checkpoints"),
    ("-ptc", "--print-token-count"), ("-ns", "--sequences"),
])
def test_other_multi_letter_llama_flags_are_refused_by_their_own_name(tiny_bundle, flag, long):
    result = run(tiny_bundle, "-p", "hi", flag, "5")
    assert result.exit_code == 2
    assert f"{flag} is llama.cpp's {long}, which edgesdk run does not have" in " ".join(result.stderr.split())


def test_a_llama_option_without_its_value_is_refused_by_name(tiny_bundle):
    result = run(tiny_bundle, "-p", "hi", "-ngl")
    assert result.exit_code == 2
    assert "-ngl (llama.cpp's --gpu-layers) needs a value" in result.stderr


# --- -m / --model -------------------------------------------------------------------------------------------------


def test_model_option_names_the_bundle(tiny_bundle):
    assert_ok(invoke("run", "-m", tiny_bundle.path, "-p", "hi", "-n", 1, "--threads", 1))
    assert_ok(invoke("run", "--model", tiny_bundle.path, "-p", "hi", "-n", 1, "--threads", 1))
    assert_ok(invoke("run", tiny_bundle.path, "-m", tiny_bundle.path, "-p", "hi", "-n", 1, "--threads", 1))


def test_model_option_and_another_bundle_are_refused(tiny_bundle, tmp_path):
    result = invoke("run", tmp_path, "-m", tiny_bundle.path, "-p", "hi")
    assert result.exit_code == 2
    assert "'--model' / '-m'" in result.stderr
    assert "give the bundle once" in " ".join(result.stderr.split())


def test_model_option_goes_over_llama_arg_model(tiny_bundle, tmp_path):
    result = invoke("run", "-m", tiny_bundle.path, "-p", "hi", "-n", 1, "--threads", 1,
                    env={"LLAMA_ARG_MODEL": str(tmp_path / "elsewhere")})
    assert_ok(result)


def test_no_bundle_at_all_is_still_a_missing_argument():
    result = invoke("run", "-p", "hi")
    assert result.exit_code == 2
    assert "Missing argument 'BUNDLE'" in result.stderr
    assert "-m BUNDLE" in result.stderr


def test_help_names_the_llama_cli_spellings():
    result = invoke("run", "--help")
    assert_ok(result)
    for name in ("-cnv", "-no-cnv", "-st", "-if", "--model", "-ngl"):
        assert name in result.output


# --- serve ----------------------------------------------------------------------------------------------------------


def test_serve_accepts_llama_server_options_that_change_nothing(tiny_bundle):
    # an empty --host is refused after the options are read and before anything loads
    result = invoke("serve", tiny_bundle.path, "-ngl", "99", "-np", "1", "-c", "0", "--jinja", "-fa", "on", "-cb",
                    "--mlock", "--host", "")
    assert result.exit_code == 2
    assert "'--host'" in result.stderr
    assert "is empty" in result.stderr
    for flag in ("-ngl", "-np", "--jinja", "-fa", "-cb", "--mlock"):
        assert f"edgesdk: {flag} is accepted for llama.cpp's scripts" in result.stderr


def test_serve_auto_slots_are_one(tiny_bundle):
    result = invoke("serve", tiny_bundle.path, "-np", "-1", "--host", "")
    assert "-np is accepted" in result.stderr
    assert "is empty" in result.stderr


@pytest.mark.parametrize(("args", "said"), [
    (["-np", "4"], "the other requests wait in the queue (--max-queue"),
    (["-c", "2048"], "--max-context 512', the most the model's"),  # the model holds 512 positions
    (["--ctx-size", "512"], "--max-context 512"),
])
def test_serve_refuses_what_would_mislead_by_name(tiny_bundle, args, said):
    result = invoke("serve", tiny_bundle.path, *args, "--host", "")
    assert result.exit_code == 2
    text = " ".join(result.stderr.split())
    assert f"'{args[0]}' (llama.cpp's" in text
    assert said in text


def test_serve_reads_cram_as_its_cache_ram(tiny_bundle):
    result = invoke("serve", tiny_bundle.path, "-cram", "-5", "--host", "")
    assert result.exit_code == 2
    assert "'--cache-ram'" in result.stderr  # -5 refused as --cache-ram's value, not "-c ram"


def test_serve_refuses_run_s_conversation_flags_by_name(tiny_bundle):
    result = invoke("serve", tiny_bundle.path, "-cnv")
    assert result.exit_code == 2
    assert "-cnv is llama.cpp's --conversation, which edgesdk serve does not have" in " ".join(result.stderr.split())


def test_serve_model_option(tiny_bundle, tmp_path):
    result = invoke("serve", "-m", tiny_bundle.path, "--host", "")
    assert result.exit_code == 2
    assert "is empty" in result.stderr
    other = invoke("serve", tmp_path, "-m", tiny_bundle.path, "--host", "127.0.0.1")
    assert other.exit_code == 2
    assert "'--model' / '-m'" in other.stderr
    assert "none of the BUNDLEs given" in " ".join(other.stderr.split())


# --- embed and eval (llama-embedding's and llama-perplexity's habits) -----------------------------------------------


def test_embed_accepts_gpu_layers_and_says_so(tiny_bundle):
    result = invoke("embed", tiny_bundle.path, "-p", "hello", "-ngl", "99", "--embd-output-format", "raw",
                    "--threads", 1)
    assert_ok(result)
    assert "edgesdk: -ngl is accepted for llama.cpp's scripts and changes nothing here" in result.stderr
    assert len(result.stdout.split()) > 1  # the vector


def test_embed_checks_the_context_size(tiny_bundle):
    assert_ok(invoke("embed", tiny_bundle.path, "-p", "hello", "-c", "256", "--threads", 1))
    result = invoke("embed", tiny_bundle.path, "-p", "hello", "-c", "512", "--threads", 1)
    assert result.exit_code == 2
    assert "--max-context 512" in " ".join(result.stderr.split())


def test_eval_reads_llama_perplexity_s_ctx_size_as_its_context(tiny_bundle, tmp_path):
    from tests._utils.tiny import CORPUS

    text = tmp_path / "text.txt"
    text.write_text("\n".join(CORPUS), encoding="utf-8")
    args = ("--text", text, "--max-chars", 2000, "--stride", 32, "--json", "--threads", 1)
    by_c = invoke("eval", tiny_bundle.path, *args, "-c", 32, "-ngl", "99")
    by_context = invoke("eval", tiny_bundle.path, *args, "--context", 32)
    assert_ok(by_c)
    assert_ok(by_context)
    assert by_c.stdout == by_context.stdout
    assert "-ngl is accepted" in by_c.stderr


# --- bench (llama-bench's habits: every test parameter takes a value) -----------------------------------------------


def test_bench_accepts_llama_bench_s_placement_parameters(tiny_bundle):
    result = invoke("bench", tiny_bundle.path, "-p", 4, "-n", 2, "-r", 1, "--json", "--threads", 1,
                    "-ngl", "99", "-fa", "1", "-mmp", "0", "-nkvo", "0", "-ctk", "f16")
    assert_ok(result)
    for flag in ("-ngl", "-fa", "-mmp", "-nkvo", "-ctk"):
        assert f"edgesdk: {flag} is accepted for llama.cpp's scripts" in result.stderr


@pytest.mark.parametrize(("args", "said"), [
    (["-embd", "1"], "edgesdk bench has no such test"),
    (["-c", "64"], "-c is llama.cpp's --ctx-size, which edgesdk bench does not have"),
    (["-ctk", "q8_0"], "KV cache's data type is the bundle's"),
])
def test_bench_refuses_what_it_has_no_test_for_by_name(tiny_bundle, args, said):
    result = invoke("bench", tiny_bundle.path, "-p", 4, "-n", 2, "-r", 1, *args)
    assert result.exit_code == 2
    assert said in " ".join(result.stderr.split())
