"""``edgesdk run``'s plain-text interactive mode (--raw -i, -no-cnv -i) against llama-completion's
(tools/main/main.cpp, now tools/completion/completion.cpp): each typed line goes on the same token sequence as the
prompt and the answers before it (``embd_inp``), their tokens taken from the KV cache, rather than being answered on
its own. Driven through the CLI with piped stdin on the tiny bundle; the --stats line's prompt and cached token
counts show what each answer was conditioned on and what was prefilled."""

from __future__ import annotations

import re

import pytest

from edgesdk.runtime.generate import SamplingConfig, generate
from edgesdk.runtime.session import open_runtime
from tests.unit.test_cli import assert_ok, invoke

pytest.importorskip("torch")

N = 12  # -n: one budget over the session (--ignore-eos: each answer spends all it has), as llama-completion's


def room(tokenizer, typed: str) -> int:
    """The tokens the answer to a line typed first after a spent budget has: -n less the typed text's tokens, as
    llama-completion's ``n_remain -= line_inp.size()`` (not --in-prefix's or --in-suffix's)."""
    return N - len(tokenizer.encode_plain(typed))


@pytest.fixture(scope="module")
def runtime(tiny_bundle):
    return open_runtime(tiny_bundle.path, threads=1)


def run(bundle, *args, input: str):
    return invoke("run", bundle.path, "--threads", 1, "--stats", *args, input=input)


def prompts(result) -> list[tuple[int, int]]:
    """Each answer's (prompt tokens, of them from the cache), from its --stats line."""
    found = []
    for line in result.stderr.splitlines():
        match = re.match(r"\[[\w-]+\] prompt (\d+) tok(?: \((\d+) from the cache\))?", line)
        if match:
            found.append((int(match.group(1)), int(match.group(2) or 0)))
    return found


def greedy(runtime, ids: list[int], n: int = N) -> list[int]:
    tokens, _ = generate(runtime.backend, ids, SamplingConfig(max_new_tokens=n), set())
    return tokens


def test_no_cnv_interactive_lines_continue_the_prompt_and_its_answer(tiny_bundle, runtime):
    """-no-cnv -i -p TEXT: the second line's prompt is the first prompt, its answer's tokens and the line; only the
    first answer's last token (which the cache never took) and the line are prefilled. Each line was answered on its
    own: the second prompt was the line's 2 tokens, nothing from the cache."""
    tokenizer = runtime.tokenizer
    result = run(tiny_bundle, "-no-cnv", "-i", "-p", "The quick brown fox", "-n", N, "--ignore-eos",
                 input="jumps over\nthe lazy dog\n")
    assert_ok(result)
    first_ids = tokenizer.encode("The quick brown fox")
    first = greedy(runtime, first_ids)
    second_ids = first_ids + first + tokenizer.encode_plain("jumps over")
    second = greedy(runtime, second_ids, room(tokenizer, "jumps over"))
    third_ids = second_ids + second + tokenizer.encode_plain("the lazy dog")
    assert prompts(result) == [(len(first_ids), 0), (len(second_ids), len(first_ids) + N - 1),
                               (len(third_ids), len(second_ids) + len(second) - 1)]
    assert result.stdout.splitlines()[:2] == [tokenizer.decode(first), tokenizer.decode(second)]


def test_raw_interactive_lines_with_affixes_share_one_transcript(tiny_bundle, runtime):
    """--raw -i without a prompt: the lines read from stdin, each with --in-prefix and --in-suffix (their special
    tokens' text the tokens, the typed text plain text), go on one transcript, as in llama-completion."""
    tokenizer = runtime.tokenizer
    result = run(tiny_bundle, "--raw", "-i", "--in-prefix", "<|im_start|>", "--in-suffix", "\nGo:", "-n", N,
                 "--ignore-eos", input="the fox\nthe dog\n")
    assert_ok(result)
    start = tokenizer.token_id("<|im_start|>")
    first_ids = [start, *tokenizer.encode_plain("the fox\nGo:")]
    first = greedy(runtime, first_ids, room(tokenizer, "the fox"))
    second_ids = first_ids + first + [start, *tokenizer.encode_plain("the dog\nGo:")]
    assert prompts(result) == [(len(first_ids), 0), (len(second_ids), len(first_ids) + len(first) - 1)]


def test_an_answer_that_ends_keeps_its_end_token_and_the_reverse_prompt_after_it(tiny_bundle, runtime):
    """llama-completion feeds the end-of-generation token an answer stopped at, and in interactive mode injects
    the first reverse prompt after it, before the next line."""
    tokenizer = runtime.tokenizer
    end = tokenizer.token_id("<|im_end|>")
    result = run(tiny_bundle, "-no-cnv", "-i", "-p", "The quick brown fox", "-n", N, "-r", "User:",
                 "--logit-bias", f"{end}=100", input="hello\n")
    assert_ok(result)
    first_ids = tokenizer.encode("The quick brown fox")
    reverse = tokenizer.encode("User:", add_special_tokens=False)
    second_ids = first_ids + [end] + reverse + tokenizer.encode_plain("hello")
    assert prompts(result) == [(len(first_ids), 0), (len(second_ids), len(first_ids))]


def test_clear_starts_the_transcript_over_and_regen_answers_the_last_line_again(tiny_bundle, runtime):
    tokenizer = runtime.tokenizer
    result = run(tiny_bundle, "--raw", "-i", "-n", N, "--ignore-eos",
                 input="the quick fox\n/regen\n/clear\nthe lazy dog\n")
    assert_ok(result)
    first_ids = tokenizer.encode_plain("the quick fox")
    assert "conversation cleared" in result.stderr
    # /regen: the same prompt again, all but its last token from the cache; /clear: the line alone
    counts = prompts(result)
    assert counts[:2] == [(len(first_ids), 0), (len(first_ids), len(first_ids) - 1)]
    assert counts[2][0] == len(tokenizer.encode_plain("the lazy dog"))


def test_a_transcript_that_outgrows_the_context_leaves_out_its_oldest_exchanges(tiny_bundle, runtime):
    """The tiny bundle holds 256 tokens; with room for 100 new ones a third long line does not fit after two
    exchanges (each a line and its answer, 100 tokens of -n's budget): the oldest is left out and said, as the
    chat's conversation does, and the answer still comes."""
    tokenizer = runtime.tokenizer
    line = "the quick brown fox jumps over the lazy dog " * 2
    result = run(tiny_bundle, "--raw", "-i", "-n", 100, "--ignore-eos", input=f"{line}\n{line}\n{line}\n")
    assert_ok(result)
    assert "left out its 1 oldest exchange(s)" in result.stderr
    each = len(tokenizer.encode_plain(line))
    counts = prompts(result)
    assert [total for total, _ in counts] == [each, each + 100, each + 100]
    assert result.stderr.count("left out its 1 oldest exchange(s)") == 1


def test_an_empty_line_lets_the_answer_go_on(tiny_bundle, runtime):
    """llama-completion's interactive mode: "Enter key on empty line lets the user pass control back": the model goes
    on from where the transcript stands, nothing added (no --in-prefix or --in-suffix). An empty line answered
    nothing."""
    tokenizer = runtime.tokenizer
    result = run(tiny_bundle, "--raw", "-i", "--in-prefix", "Q: ", "-n", N, "--ignore-eos", input="the fox\n\n")
    assert_ok(result)
    first_ids = tokenizer.encode_plain("Q: the fox")
    first = greedy(runtime, first_ids, room(tokenizer, "the fox"))
    assert prompts(result) == [(len(first_ids), 0), (len(first_ids) + len(first), len(first_ids) + len(first) - 1)]
    assert result.stdout.splitlines()[1] == tokenizer.decode(greedy(runtime, first_ids + first))
