"""Ollama's /api/chat with ``format`` on a thinking model: the thinking unconstrained, then the content held to the
format, as Ollama's ChatHandler gives it (server/routes.go, its structured outputs in two requests,
``structuredOutputsState``): the first request without the format, cancelled once content follows the thinking,
and a second with the format going on from the thinking. ``think`` false, a model that does not think, and
/api/generate (whose GenerateHandler passes the format to its one request) hold the answer to the format from its
first token, as before.

A real server over the tiny bundle, its chat template thinking as Qwen3's does (the model opens the block itself;
``enable_thinking`` false closes it empty in the prompt), the model's logits steered toward scripted answers (the
random tiny model never writes a <think> block of its own): each script's next character is raised above every
other token, the first script that the answer so far begins most, so an answer a constraint turns away from one
script follows the next one it still can."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgesdk.runtime.session import open_runtime
from edgesdk.serve.completion import ServeDefaults
from tests._utils.tiny import CHAT_TEMPLATE
from tests.unit.test_serve import Served

NAME = "tiny-host"
THINKS = CHAT_TEMPLATE.replace(
    "<|im_start|>assistant\n{% endif %}",
    "<|im_start|>assistant\n{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% endif %}{% endif %}")
ASSISTANT = "<|im_start|>assistant\n"
SCHEMA = {"type": "object", "properties": {"fox": {"type": "string"}}, "required": ["fox"],
          "additionalProperties": False}
JSON_ANSWER = '{"fox":"quick"}'
THOUGHT = "The fox is quick."
THINKING_THEN_JSON = f"<think>\n{THOUGHT}\n</think>\n\n{JSON_ANSWER}"
SCRIPTS = (THINKING_THEN_JSON, f"<think>\n\n</think>\n\n{JSON_ANSWER}", JSON_ANSWER)
ASK = [{"role": "user", "content": "Is the fox quick?"}]


class Steered:
    """The tiny model's backend with its next-token logits steered toward ``scripts``: the ids in its cache are
    tracked, the answer so far is the text after the prompt's last assistant header, and each script it begins
    gets its next character's token raised above all others (the first script most; the end-of-text token once
    the script is written out). Everything else is the real backend's."""

    def __init__(self, backend, tokenizer, scripts: tuple[str, ...]):
        self.backend, self.tokenizer, self.scripts, self.ids = backend, tokenizer, scripts, []

    def __getattr__(self, name: str):
        return getattr(self.backend, name)

    def reset(self) -> None:
        self.ids = []
        self.backend.reset()

    def rewind(self, position: int) -> None:
        self.ids = self.ids[:position]
        self.backend.rewind(position)

    def prefill(self, token_ids, keep_logits: int = 1):
        rows = np.array(self.backend.prefill(token_ids, keep_logits=keep_logits), copy=True)
        self.ids += [int(token) for token in token_ids]
        rows[-1] = self._steered(rows[-1])
        return rows

    def decode(self, token_id: int):
        logits = self.backend.decode(token_id)
        self.ids.append(int(token_id))
        return self._steered(logits)

    def _steered(self, logits):
        logits = np.array(logits, dtype=np.float32, copy=True)
        text = self.tokenizer.tokenizer.decode(self.ids, skip_special_tokens=False)
        answer = text.rsplit(ASSISTANT, 1)[-1]
        top = float(logits.max())
        for rank, script in enumerate(self.scripts):
            if not script.startswith(answer):
                continue
            rest = script[len(answer):]
            token = self.tokenizer.token_id("<|im_end|>") if not rest else \
                self.tokenizer.encode(rest[0], add_special_tokens=False)[0]
            logits[token] = max(logits[token], top + 10.0 * (len(self.scripts) - rank))
        return logits


@pytest.fixture(scope="module")
def steered(tiny_bundle):
    runtime = open_runtime(tiny_bundle.path, threads=1)
    runtime.tokenizer.template_source, runtime.tokenizer._template = THINKS, None
    backend = runtime.backend
    runtime.backend = Steered(backend, runtime.tokenizer, SCRIPTS)
    server = Served(runtime, ServeDefaults(max_tokens=64, prompt_cache=False))
    yield server
    server.close()
    runtime.backend = backend


@pytest.fixture
def scripts(steered):
    """The scripts the model follows, set back after the test."""
    backend = steered.completer.runtime.backend
    yield backend
    backend.scripts = SCRIPTS


def _chat(server: Served, **fields) -> dict:
    status, body = server.post("/api/chat", {"model": NAME, "messages": ASK, "stream": False,
                                             "options": {"temperature": 0}, **fields})
    assert status == 200, body
    return body


def _lines(server: Served, path: str = "/api/chat", **fields) -> list[dict]:
    body = {"model": NAME, "options": {"temperature": 0}, **fields}
    if path == "/api/chat":
        body["messages"] = ASK
    status, headers, payload = server.request("POST", path, body)
    assert status == 200, payload
    assert headers["Content-Type"] == "application/x-ndjson"
    return [json.loads(line) for line in payload.decode().splitlines() if line]


def test_the_model_thinks_before_the_format_holds_its_content(steered):
    """The old answer was held to the schema from its first token: the grammar refused the model's <think>, so it
    never thought (no ``thinking``) and wrote the fallback JSON. Ollama's two passes: the thinking unconstrained,
    the content held to the schema, with ``think`` left out (on for a model that thinks) or true."""
    for fields in ({}, {"think": True}):
        body = _chat(steered, format=SCHEMA, **fields)
        message = body["message"]
        assert message.get("thinking") == THOUGHT, body
        assert message["content"] == JSON_ANSWER
        assert json.loads(message["content"]) == {"fox": "quick"}
        assert body["done"] is True
        assert body["done_reason"] == "stop"


def test_format_json_lets_the_model_think_too(steered):
    message = _chat(steered, format="json")["message"]
    assert (message.get("thinking"), message["content"]) == (THOUGHT, JSON_ANSWER)


def test_a_streamed_answer_gives_the_thinking_then_the_formatted_content(steered):
    """As Ollama streams it: thinking objects as they come (the one where content began with its content
    cleared), then the second pass's content, then the last object with ``done``."""
    lines = _lines(steered, format=SCHEMA)
    assert lines[-1]["done"] is True
    assert lines[-1]["done_reason"] == "stop"
    assert all(line["done"] is False for line in lines[:-1])
    thinking = "".join(line["message"].get("thinking", "") for line in lines)
    content = "".join(line["message"]["content"] for line in lines)
    assert (thinking, content) == (THOUGHT, JSON_ANSWER)
    first_content = next(index for index, line in enumerate(lines) if line["message"]["content"])
    assert not any(line["message"].get("thinking") for line in lines[first_content:])
    assert lines[-1]["eval_count"] > 0
    assert lines[-1]["prompt_eval_count"] > 0


def test_think_false_holds_the_answer_to_the_format_from_its_first_token(steered):
    """``think`` false: no thinking parser, so Ollama applies the format to its one request; the template closes
    the block empty in the prompt and the answer is the JSON."""
    body = _chat(steered, format=SCHEMA, think=False)
    assert "thinking" not in body["message"]
    assert body["message"]["content"] == JSON_ANSWER


def test_thinking_that_runs_to_the_limit_is_the_whole_answer(steered):
    """No content came in the first pass (``num_predict`` ran out inside the block): no second pass, as in
    Ollama, and the answer is the thinking so far, cut at the limit."""
    body = _chat(steered, format=SCHEMA, options={"temperature": 0, "num_predict": 14})
    assert body["done_reason"] == "length"
    assert body["message"]["content"] == ""
    assert body["message"]["thinking"]
    assert THOUGHT.startswith(body["message"]["thinking"])
    streamed = _lines(steered, format=SCHEMA, options={"temperature": 0, "num_predict": 14})
    assert "".join(line["message"].get("thinking", "") for line in streamed) == body["message"]["thinking"]
    assert "".join(line["message"]["content"] for line in streamed) == ""


def test_content_with_no_thinking_before_it_is_still_held_to_the_format(steered, scripts):
    """The model skips its block and writes plain text: the format still holds the content (Ollama drops it
    there, a bug its issues #14645 and #15260 report)."""
    scripts.scripts = ("No JSON here.", JSON_ANSWER)
    body = _chat(steered, format=SCHEMA)
    assert "thinking" not in body["message"]
    assert body["message"]["content"] == JSON_ANSWER
    lines = _lines(steered, format=SCHEMA)
    assert "".join(line["message"]["content"] for line in lines) == JSON_ANSWER
    assert not any(line["message"].get("thinking") for line in lines)
    # without a format the same model writes its text
    assert _chat(steered)["message"]["content"] == "No JSON here."


def test_without_a_format_the_answer_is_split_as_before(steered):
    body = _chat(steered)
    assert (body["message"].get("thinking"), body["message"]["content"]) == (THOUGHT, JSON_ANSWER)


def test_api_generate_holds_the_answer_to_the_format_from_its_first_token(steered):
    """Ollama's GenerateHandler passes ``Format`` to its one request: no thinking pass there."""
    status, body = steered.post("/api/generate", {"model": NAME, "prompt": "Is the fox quick?", "stream": False,
                                                  "format": SCHEMA, "options": {"temperature": 0}})
    assert status == 200, body
    assert "thinking" not in body
    assert body["response"] == JSON_ANSWER


def test_logprobs_cover_both_passes(steered):
    body = _chat(steered, format=SCHEMA, logprobs=True)
    text = "".join(entry["token"] for entry in body["logprobs"])
    assert text.startswith("<think>")
    assert text.endswith(JSON_ANSWER)
