"""serve: llama-server's own POST /completion, assistant prefill and timings, at their edges, over real HTTP
against the tiny bundle."""

from __future__ import annotations

import pytest

from edgesdk.serve.completion import ServeDefaults
from tests.unit.test_serve import Served

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def runtime(tiny_bundle):
    from edgesdk.runtime.session import open_runtime

    return open_runtime(tiny_bundle.path, threads=1)


@pytest.fixture
def served(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=16))
    yield server
    server.close()


def test_completion_takes_seed_minus_one_as_llama_server_s_random_seed(served):
    """llama-server's README: 'seed ... Default: -1, which is a random seed'; clients send its default."""
    status, body = served.post("/completion", {"prompt": PROMPT, "n_predict": 4, "seed": -1})
    assert status == 200, body
    assert body["generation_settings"]["seed"] == -1
    assert body["content"] == served.post("/completion", {"prompt": PROMPT, "n_predict": 4})[1]["content"]
    status, body = served.post("/completion", {"prompt": PROMPT, "n_predict": 4, "seed": -2})
    assert status == 400, body
    assert body["error"]["param"] == "seed"


def test_completion_reads_max_tokens_where_n_predict_is_not_given(served):
    """llama-server takes max_tokens for the limit where n_predict is absent (n_predict wins over it)."""
    status, body = served.post("/completion", {"prompt": PROMPT, "max_tokens": 3})
    assert status == 200, body
    assert (body["tokens_predicted"], body["stop_type"], body["generation_settings"]["n_predict"]) == (3, "limit", 3)
    status, body = served.post("/completion", {"prompt": PROMPT, "max_tokens": 3, "n_predict": 5})
    assert status == 200, body
    assert body["tokens_predicted"] == 5
    status, body = served.post("/completion", {"prompt": PROMPT, "max_tokens": 0})
    assert status == 400, body
    assert body["error"]["param"] == "max_tokens"
    assert "'max_tokens' must be" in body["error"]["message"]


def test_completion_takes_any_number_of_stop_strings(served):
    """llama-server's 'stop' is an array of any length; OpenAI's limit of 4 is not its own."""
    answer = served.post("/completion", {"prompt": PROMPT, "n_predict": 12})[1]["content"]
    word = answer[4:7]
    stops = ["\u2603", "\u2604", "\u2605", "\u2606", word]
    status, body = served.post("/completion", {"prompt": PROMPT, "n_predict": 12, "stop": stops})
    assert status == 200, body
    assert (body["stop_type"], body["stopping_word"]) == ("word", word)
    assert body["content"] == answer[:answer.find(word)]
    assert body["generation_settings"]["stop"] == stops
    status, body = served.post("/completion", {"prompt": PROMPT, "stop": ["a", 5]})
    assert status == 400, body
    assert body["error"]["param"] == "stop"


@pytest.mark.parametrize("begun", ["|", ">", "<|", "end"])
def test_a_prefill_that_the_end_of_turn_text_also_holds_is_cut_where_the_message_ends(runtime, begun):
    """The template writes '<|im_end|>' after each message: a begun answer of '|' (a table) or '>' (a quote) is
    the message's text, not the last '|' or '>' of the turn's end."""
    tokenizer = runtime.tokenizer
    question = [{"role": "user", "content": "Make a table of the planets."}]
    continued = tokenizer.render_chat([*question, {"role": "assistant", "content": begun}], continue_final=True)
    assert continued == tokenizer.render_chat(question) + begun
