"""``edgesdk run``'s plain-text interactive session (--raw / -no-cnv with -i) against llama-completion
(tools/completion/completion.cpp): the --keep tokens of the -p prompt that a context shift keeps, and -n as one
token budget over the session; through the real command line with the tiny random bundle."""

from __future__ import annotations

import re

import pytest

from tests.unit.test_cli import assert_ok, invoke

pytest.importorskip("torch")

PROMPT = "Grouped-query attention shares key and value heads between query heads. " * 3


def stats(stderr: str) -> list[tuple[int, int, int]]:
    """Each answer's (prompt tokens, of them from the cache, new tokens), from --stats' lines, in order."""
    found = re.findall(r"prompt (\d+) tok(?: \((\d+) from the cache\))?, .*? (\d+) new tok", stderr)
    return [(int(prompt), int(cached or 0), int(new)) for prompt, cached, new in found]


@pytest.mark.parametrize("shift", [True, False])
def test_keep_tokens_of_the_prompt_stay_once_its_exchange_is_left_out(tiny_bundle, shift):
    """llama-completion's context shift keeps the first --keep tokens of its -p prompt; the transcript left the -p
    exchange out whole, so the prompt after it shared no token with the KV cache. Without --context-shift --keep is
    said to be unused, and keeps nothing."""
    lines = "".join(f"café {index}\n" for index in range(30))
    result = invoke("run", tiny_bundle.path, "-no-cnv", "-i", "-p", PROMPT, "-n", 8, "--ignore-eos", "--threads", 1,
                    *(["--context-shift"] if shift else []), "--keep", 3, "--stats", input=lines)
    assert_ok(result)
    assert ("--keep is not used" in result.stderr) is not shift
    _, _, after = result.stderr.partition("oldest exchange(s)")
    assert after, result.stderr  # the -p exchange was left out
    first_after = stats(after)[0]  # the answer to the line whose prompt left the -p exchange out
    # the 3 kept tokens, still in the KV cache, are not prefilled again
    assert first_after[1] == (3 if shift else 0), result.stderr


def typed_tokens(bundle, line: str) -> int:
    """The tokens of ``line`` typed in a plain-text session (plain text, no special token added)."""
    from tokenizers import Tokenizer

    return len(Tokenizer.from_file(str(bundle.path / "tokenizer.json")).encode(line, add_special_tokens=False).ids)


def test_n_is_one_budget_over_a_plain_text_session_as_llama_completion_counts_it(tiny_bundle):
    """llama-completion's ``n_remain`` starts at -n, goes down by each sampled token and each typed line's tokens,
    and starts over at -n once spent, handing control back to the user; run gave every answer -n tokens."""
    limit, short, long = 8, "café 1", "The quick brown fox"
    assert typed_tokens(tiny_bundle, short) < limit <= typed_tokens(tiny_bundle, long)
    result = invoke("run", tiny_bundle.path, "-no-cnv", "-i", "-p", PROMPT, "-n", limit, "--ignore-eos",
                    "--threads", 1, "--stats", input=f"{short}\n{long}\n\n")
    assert_ok(result)
    answered = [new for _, _, new in stats(result.stderr)]
    # -p: its -n; the short line: what its tokens left; the long line spends the rest, unanswered; Enter: -n again
    assert answered == [limit, limit - typed_tokens(tiny_bundle, short), limit], result.stderr
    assert f"no answer: the line's tokens spent what was left of -n {limit}" in result.stderr


def test_a_chat_keeps_n_per_answer_as_llama_cli_does(tiny_bundle):
    result = invoke("run", tiny_bundle.path, "-cnv", "-p", "café", "-n", 4, "--ignore-eos", "--threads", 1,
                    "--stats", input="The quick brown fox\ncafé 1\n")
    assert_ok(result)
    assert [new for _, _, new in stats(result.stderr)] == [4, 4, 4], result.stderr


def test_regen_answers_the_line_again_with_the_budget_it_had(tiny_bundle):
    """An answer that ends at its end token leaves part of the budget; /regen takes the line back and answers it
    with what was left before it, not with what the first answer left (which the line's tokens would spend)."""
    from tokenizers import Tokenizer

    end = Tokenizer.from_file(str(tiny_bundle.path / "tokenizer.json")).token_to_id("<|im_end|>")
    line = "the quick fox"
    limit = 2 * typed_tokens(tiny_bundle, line)  # room for the line and its end token, not for it twice
    result = invoke("run", tiny_bundle.path, "--raw", "-i", "-n", limit, "--logit-bias", f"{end}=100",
                    "--threads", 1, "--stats", input=f"{line}\n/regen\n")
    assert_ok(result)
    assert "no answer" not in result.stderr
    assert len(stats(result.stderr)) == 2, result.stderr


def test_keep_all_is_the_prompts_tokens_not_the_whole_transcripts(tiny_bundle):
    """llama-completion resolves --keep -1 to its initial prompt's tokens, the same tokens as --keep set to the
    prompt's own length; a line on the transcript had the whole transcript for its prompt, so a shift kept every
    earlier line and answer too: other tokens were dropped, the answer went otherwise and shifted more often."""
    prompt = "The quick brown fox"
    line = "the quick brown fox jumps over the lazy dog " * 2

    def session(keep: int) -> tuple[list[str], str]:
        """Each answer's context shifts, and the answers."""
        result = invoke("run", tiny_bundle.path, "-no-cnv", "-i", "-p", prompt, "-n", 800, "--ignore-eos",
                        "--threads", 1, "--context-shift", "--keep", keep, "--stats", input=f"{line}\n")
        assert_ok(result)
        return re.findall(r"context shifted \d+x", result.stderr), result.stdout

    every = session(-1)
    assert len(every[0]) == 2  # each answer shifted
    assert every == session(typed_tokens(tiny_bundle, prompt))
