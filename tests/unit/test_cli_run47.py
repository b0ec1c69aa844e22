"""``edgesdk run`` against llama-cli's reading of its options (common/arg.cpp, tools/main/main.cpp): -n -1 and -2,
and options given that the run does not use."""

from __future__ import annotations

import re

import pytest

from tests.unit.test_cli import assert_ok, invoke


def _stats(stderr: str) -> dict:
    """The --stats line's prompt size, new tokens and stop reason."""
    match = re.search(r"\] prompt (\d+) tok.*?, (\d+) new tok,.*?stop: (\w+)", stderr)
    assert match is not None, stderr
    return {"prompt": int(match.group(1)), "new": int(match.group(2)), "stop": match.group(3)}


@pytest.mark.parametrize("limit", ["-1", "-2"])
def test_n_minus_one_and_minus_two_run_until_the_context_is_full(tiny_bundle, runtime, limit):
    """llama-cli's -n -1 ("infinity") and -2 ("until context filled") are token limits, not errors: without a
    context shift both answers end at the full context, keeping every token, as -n with a count past it does."""
    result = invoke("run", tiny_bundle.path, "-p", "The quick", "--raw", "--ignore-eos", "--stats", "-n", limit)
    assert_ok(result)
    stats = _stats(result.stderr)
    assert stats["stop"] == "max_context"
    assert stats["prompt"] + stats["new"] == runtime.backend.max_context + 1  # the last token is never fed back
    past = invoke("run", tiny_bundle.path, "-p", "The quick", "--raw", "--ignore-eos", "-n", "100000")
    assert_ok(past)
    assert result.stdout == past.stdout


def test_n_minus_two_stops_at_the_full_context_even_with_context_shift(tiny_bundle):
    """tools/main/main.cpp: "context full and n_predict == -2 => stopping", before it would shift; the
    --context-shift given is named as not used."""
    result = invoke("run", tiny_bundle.path, "-p", "The quick", "--raw", "--ignore-eos", "--stats", "-n", "-2",
                    "--context-shift")
    assert_ok(result)
    assert _stats(result.stderr)["stop"] == "max_context"
    assert "context shifted" not in result.stderr
    assert "edgesdk: --context-shift is not used: -n -2 ends the answer when the context is full" in result.stderr


def test_keep_without_context_shift_is_named_as_not_used(tiny_bundle):
    """--keep only says what a context shift keeps: given alone it changes nothing, which the run says."""
    result = invoke("run", tiny_bundle.path, "-p", "hi", "-n", "1", "--keep", "4")
    assert_ok(result)
    assert "edgesdk: --keep is not used: it is the tokens a context shift keeps, and the context does not shift " \
           "(pass --context-shift)" in result.stderr
    shifted = invoke("run", tiny_bundle.path, "-p", "hi", "-n", "1", "--keep", "4", "--context-shift")
    assert_ok(shifted)
    assert "--keep is not used" not in shifted.stderr


GRAMMAR = 'root ::= "x" <|im_start|> "user" [a-z]+'  # the answer: x, the special token, "user", then letters


@pytest.mark.parametrize(("reverse", "shown"), [("<|im_start|>user", "xuser"), ("x<|im_start|>us", "xus")])
def test_a_reverse_prompt_holding_a_special_token_stops_the_answer_as_llama_cli(tiny_bundle, reverse, shown):
    """llama-cli searches its reverse prompts in ``common_sampler_prev_str``, whose pieces render special tokens
    (``common_token_to_piece(..., special = true)``): -r '<|im_start|>user' stops a raw answer where the model
    starts a user turn, though the answer shown leaves <|im_start|> out."""
    result = invoke("run", tiny_bundle.path, "-p", "The quick", "--raw", "-n", "16", "--stats", "--grammar", GRAMMAR,
                    "-r", reverse)
    assert_ok(result)
    assert _stats(result.stderr)["stop"] == "reverse_prompt"
    assert result.stdout.startswith(shown), result.stdout
    # stopped at the token that completes the reverse prompt, not after: the same answer cut to as many tokens by -n
    # is the one shown, and a token less does not hold it yet (that token is shown whole, as llama-cli shows it: the
    # tiny model's "ru" after "use")
    new = _stats(result.stderr)["new"]
    cut = [invoke("run", tiny_bundle.path, "-p", "The quick", "--raw", "-n", str(count), "--grammar", GRAMMAR,
                  "-r", "<|im_end|>user") for count in (new, new - 1)]
    for each in cut:
        assert_ok(each)
    assert cut[0].stdout == result.stdout
    assert shown not in cut[1].stdout, cut[1].stdout
    assert "<|im_start|>" not in result.stdout  # still not shown


def test_a_reverse_prompt_not_in_the_answer_leaves_it_alone(tiny_bundle):
    """The special token's text is searched, not shown or matched where the answer does not hold it."""
    result = invoke("run", tiny_bundle.path, "-p", "The quick", "--raw", "-n", "16", "--stats", "--grammar", GRAMMAR,
                    "-r", "<|im_end|>user")
    assert_ok(result)
    assert _stats(result.stderr)["stop"] == "max_new_tokens"
    assert result.stdout.startswith("xuser")
