"""Ollama's /api/generate (edgesdk/serve/ollama.py) with a prompt past the context and ``truncate`` true, its default:
the input cut as Ollama's runner cuts it (runner/ollamarunner/runner.go ``NewSequence``: ``numKeep = min(numKeep,
numCtx-1)``, the first ``numKeep`` tokens kept, the ``len(inputs) - numCtx`` tokens after them dropped), here to one
token less than the window so the answer's first token has its room. It was a 400 whatever ``truncate`` said: a long
prompt, and the deprecated ``context`` a client sends back each turn once the conversation outgrew the context.

A real server over the tiny bundle (256 tokens of context); the prompt the model read is checked by its first
token's log-probabilities, which POST /completion gives for the expected token ids."""

from __future__ import annotations

import pytest

from edgesdk.serve.completion import ServeDefaults
from tests._utils.ollama_calls import post_error as _error
from tests._utils.ollama_calls import post_ok as _ok
from tests.unit.test_serve import Served

NAME = "tiny-host"
CONTEXT = 256  # the tiny bundle's
LONG = "the quick brown fox jumps over the lazy dog; " * 40  # about 600 tokens


@pytest.fixture(scope="module")
def served(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=8, prompt_cache=False))
    yield server
    server.close()


def _raw_ids(server: Served, text: str) -> list[int]:
    """A raw prompt's token ids, as the server tokenizes one (BOS in front where the tokenizer adds it)."""
    return server.completer.runtime.tokenizer.prompt_ids(text, raw=True)


def _first_token(entries: list[dict]) -> list[tuple[str, float]]:
    """The first token's alternatives (token, logprob): the prompts the tests tell apart differ in them by 1e-3 or
    more, float noise by far less."""
    return [(alt["token"], alt["logprob"]) for alt in entries[0]["top_logprobs"]]


def _same(got: list[tuple[str, float]], expected: list[tuple[str, float]]) -> None:
    assert [token for token, _ in got] == [token for token, _ in expected]
    assert [logprob for _, logprob in got] == pytest.approx([logprob for _, logprob in expected], abs=1e-5)


def _read_by_the_model(server: Served, ids: list[int]) -> list[tuple[str, float]]:
    """What the model answers first to exactly ``ids`` (POST /completion, a prompt of token ids)."""
    native = _ok(server, "/completion", {"prompt": ids, "n_predict": 1, "n_probs": 5, "temperature": 0})
    return _first_token(native["completion_probabilities"])


@pytest.mark.parametrize(("num_keep", "kept"), [(None, 4), (0, 0), (10, 10), (-1, CONTEXT - 2), (1000, CONTEXT - 2)])
def test_a_raw_prompt_past_the_context_keeps_its_first_num_keep_tokens_and_its_end(served, num_keep, kept):
    """The old answer: 400 "the prompt has N tokens; this model's context holds 256". Now the model reads the first
    ``num_keep`` tokens (Ollama's default 4; -1 and anything past the window: all but the last token's room) and
    the prompt's last tokens, ``CONTEXT - 1`` in all."""
    ids = _raw_ids(served, LONG)
    assert len(ids) > CONTEXT
    options = {"num_predict": 1, "temperature": 0, **({} if num_keep is None else {"num_keep": num_keep})}
    body = _ok(served, "/api/generate", {"model": NAME, "prompt": LONG, "raw": True, "stream": False,
                                         "logprobs": True, "top_logprobs": 5, "options": options})
    assert body["done"]
    assert body["prompt_eval_count"] == CONTEXT - 1
    expected = ids[:kept] + ids[len(ids) - (CONTEXT - 1 - kept):]
    _same(_first_token(body["logprobs"]), _read_by_the_model(served, expected))


def test_a_templated_prompt_past_num_ctx_is_cut_to_it_and_shift_false_stops_there(served):
    """The chat template's prompt is cut too, within ``num_ctx``; ``shift`` false: one token of answer, then
    "length" where the window is full, as Ollama's runner stops."""
    for shift, done_reason in ((True, "length"), (False, "length")):
        body = _ok(served, "/api/generate", {"model": NAME, "prompt": LONG, "stream": False, "shift": shift,
                                             "options": {"num_ctx": 40, "num_predict": 6, "temperature": 0}})
        assert body["prompt_eval_count"] == 39
        assert body["done_reason"] == done_reason
        assert body["eval_count"] == (6 if shift else 1)
    status, error = _error(served, "/api/generate", {"model": NAME, "prompt": LONG, "truncate": False,
                                                     "options": {"num_ctx": 40}})
    assert status == 400  # truncate false: Ollama's refusal, as before
    assert error.startswith("the input length exceeds the context length: ")


def test_a_conversation_kept_in_context_goes_on_past_the_context(served):
    """A client keeping its conversation in ``context`` (each answer's sent back with the next prompt): once it
    outgrew the context, every turn was a 400 ("send a shorter 'context'"); Ollama's runner cuts the input and the
    conversation goes on, each answer's ``context`` still the whole conversation (``Tokenize(prompt + answer)``)."""
    context: list[int] = []
    for turn in range(6):
        body = _ok(served, "/api/generate", {"model": NAME, "stream": False, "context": context,
                                             "prompt": f"Turn {turn}: {LONG[:120]}",
                                             "options": {"num_predict": 8, "temperature": 0}})
        assert body["done"]
        assert body["prompt_eval_count"] <= CONTEXT - 1
        assert len(body["context"]) > len(context)  # the whole conversation, not the cut prompt
        context = body["context"]
    assert len(context) > CONTEXT
    assert body["prompt_eval_count"] == CONTEXT - 1
